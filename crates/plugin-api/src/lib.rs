//! The contract between the LogBus engine and its plugins.
//!
//! Plugin crates depend on this crate and never on the engine, so a plugin
//! cannot reach around the wiring: it receives events, produces events, and
//! the engine owns the channels between them. (Besides this one, a plugin
//! crate may use the helper crates: the sink core, TLS, compression,
//! framing, connection slots, conditions.) What a plugin author reads is
//! here — the stage traits and their contexts (`plugin`), a stage's output
//! (`output`), its counters (`metrics`), the registry — while the event
//! and the queues live in their own crates and are re-exported.

pub mod connect;
pub mod flow;
pub mod host;
pub mod line_buffer;
pub mod metrics;
pub mod output;
pub mod plugin;
pub mod registry;
pub mod state;
#[cfg(feature = "testing")]
pub mod testing;

pub use async_trait::async_trait;
pub use bytes::Bytes;
pub use connect::{ArrivingFields, ConnectContext, FindingLevel, Probe, ServiceFinding};
pub use flow::{FieldRead, FieldType, Flow, Needs, ReadRole, Step};
pub use host::{HostNeed, StatedNeed};
pub use line_buffer::LineBuffer;
/// The event and its acknowledgement (crate `logbus-event`).
pub use logbus_event as event;
pub use logbus_event::{
    Ack, AckCounts, AckReceiver, BatchAck, Event, EventData, FieldPath, Fields, LazyFields, Meta,
    OrderedCheckpoint, Outcome, Payload, now_ns,
};
/// The queues between stages (crate `logbus-queue`).
pub use logbus_queue::{
    ChannelHandle, HistogramSnapshot, InputBatch, Interrupt, LocalConfig, LocalQueueSnapshot,
    Log2Histogram, Overflow, Receiver, Registration, SendError, Sender, WeakSender, blocking,
    channel, channel_with_batch, channel_with_latency, durable, durable_channel, histogram, local,
    local_channel,
};
pub use metrics::{StageCounts, StageMetrics};
pub use output::{Output, OutputRole, OutputTargets, ProducerHold, Tap};
pub use plugin::{
    BuildContext, Built, BuiltAs, BuiltStage, CheckOptions, EventError, NoOptions, OptionError,
    OutputSet, Plugin, Processor, Sink, SinkContext, Source, SourceContext, StageError, StageKind,
    Typed, TypedPlugin, Verdict, attach_error, closest, panic_message, parse_options,
    path_segments,
};
pub use registry::Registry;
pub use schemars;
pub use serde_json;
pub use tokio_util::sync::{CancellationToken, DropGuard};
