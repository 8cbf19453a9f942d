//! The contract between the LogBus engine and its plugins.
//!
//! Plugin crates depend on this crate only, never on the engine, so a plugin
//! cannot reach around the wiring: it receives events, produces events, and
//! the engine owns the channels between them.

pub mod channel;
pub mod durable;
pub mod event;
pub mod histogram;
pub mod local;
pub mod metrics;
pub mod output;
pub mod plugin;
pub mod registry;
#[cfg(feature = "testing")]
pub mod testing;

/// Runs blocking work (a file write, an fsync) from a stage's task without
/// stalling the runtime's other tasks: on a multi-thread runtime the worker
/// hands its other tasks off first; elsewhere it runs inline.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The delay before retry number `attempt` (1-based) of a destination
/// that failed: `initial × 2^(attempt-1)`, capped at `max`. Sinks add
/// their own jitter on top.
pub fn retry_delay(
    initial: std::time::Duration,
    max: std::time::Duration,
    attempt: u32,
) -> std::time::Duration {
    initial
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
        .min(max)
}

pub use async_trait::async_trait;
pub use bytes::Bytes;
pub use channel::{
    ChannelHandle, InputBatch, Interrupt, Receiver, Registration, SendError, Sender, WeakSender,
    channel, channel_with_batch, channel_with_latency, durable_channel, local_channel,
};
pub use event::{Event, EventData, FieldPath, Fields, Meta, Payload, now_ns};
pub use histogram::{HistogramSnapshot, Log2Histogram};
pub use local::{LocalConfig, LocalQueueSnapshot, Overflow};
pub use metrics::{StageCounts, StageMetrics};
pub use output::{Output, OutputRole, OutputTargets, Tap};
pub use plugin::{
    BuildContext, Built, CheckOptions, EventError, NoOptions, OptionError, Plugin, Processor, Sink,
    SinkContext, Source, SourceContext, StageError, StageKind, Typed, TypedPlugin, Verdict,
    closest, parse_options, path_segments,
};
pub use registry::Registry;
pub use schemars;
pub use serde_json;
pub use tokio_util::sync::CancellationToken;
