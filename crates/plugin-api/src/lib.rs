//! The contract between the LogBus engine and its plugins.
//!
//! Plugin crates depend on this crate and never on the engine, so a plugin
//! cannot reach around the wiring: it receives events, produces events, and
//! the engine owns the channels between them. (Besides this one, a plugin
//! crate may use the helper crates: the sink core, TLS, compression,
//! framing, connection slots, conditions.) The crate's root is what a
//! plugin author reads — the stage traits and their contexts (`plugin`), a
//! stage's output (`output`), its counters (`metrics`), option checking,
//! flow and host statements, the registry — and every name there is used
//! by a plugin (`tests/contract.rs` holds it to that). What only the
//! engine uses to wire stages together sits under [`engine`]; the queues
//! themselves are the engine's to name from `logbus-queue`.

pub mod connect;
pub mod flow;
pub mod host;
pub mod line_buffer;
pub mod metrics;
pub mod options;
pub mod output;
pub mod plugin;
pub mod registry;
pub mod state;
#[cfg(feature = "testing")]
pub mod testing;

pub use async_trait::async_trait;
pub use bytes::Bytes;
pub use connect::{ArrivingFields, ConnectContext, FindingLevel, Probe, ServiceFinding};
pub use flow::{FieldRead, FieldType, Flow, Needs, ReadRole, Replay, Step};
pub use host::{HostNeed, StatedNeed};
pub use line_buffer::LineBuffer;
/// The event and its acknowledgement (crate `logbus-event`).
pub use logbus_event as event;
pub use logbus_event::{
    Ack, AckCounts, AckReceiver, BatchAck, Event, FieldPath, Fields, LazyFields, Meta,
    OrderedCheckpoint, Outcome, Payload, Position, now_ns,
};
/// The channel between stages, as a stage sees it (crate `logbus-queue`).
pub use logbus_queue::{InputBatch, Receiver, Sender, blocking, channel};
pub use metrics::{StageCounts, StageMetrics};
pub use options::{CheckOptions, NoOptions, OptionError, closest};
pub use output::{Output, OutputRole};
pub use plugin::{
    BuildContext, Built, EventError, OutputSet, Plugin, Processor, Sink, SinkContext, Source,
    SourceContext, StageError, StageKind, Typed, TypedPlugin, Verdict, attach_error, panic_message,
};
pub use registry::Registry;
pub use schemars;
pub use serde_json;
pub use tokio_util::sync::{CancellationToken, DropGuard};

/// What the engine uses to wire stages together: output targets and taps,
/// the hold a producer keeps on its consumers, built stages as the runtime
/// stores them, options parsed without a plugin. No plugin needs these;
/// they change with the engine.
pub mod engine {
    pub use crate::options::{parse_options, path_segments};
    pub use crate::output::{OutputTargets, ProducerHold, Tap};
    pub use crate::plugin::{BuiltAs, BuiltStage};
}
