//! The sink core. Every sink that sends batches to a remote destination
//! (HTTP endpoints, mail servers, syslog receivers, the service sinks)
//! has the same hard parts: sizing batches, retrying without hammering,
//! keeping several requests going without losing track of which event
//! was confirmed, dead-lettering what cannot be delivered, and stopping
//! at a shutdown deadline without pretending. They live here once; a
//! sink plugin supplies an [`Encoder`] (event → bytes) and a [`Service`]
//! (bytes → one attempt, and what the destination said), or, when its
//! unit is an object larger than memory, an [`ObjectFormat`] and an
//! [`ObjectStore`] (one attempt per upload call).

pub mod batch;
mod dead;
pub mod driver;
pub mod encode;
pub mod journal;
pub mod object;
pub mod object_sink;
pub mod options;
pub mod retry;
pub mod template;
pub mod time;

pub use batch::{Batch, BatchLimits, Batcher};
pub use driver::{Driver, DriverConfig, ItemResult, OnRejected, Response, Service};
pub use encode::{Encoder, Framing, JsonArray, JsonLines, write_json_or_raw};
pub use journal::{BatchId, BatchJournal, Claim, Extent, JOURNAL_BATCHES};
pub use object::{Misfit, ObjectFormat, ObjectWriter};
pub use object_sink::{ObjectConfig, ObjectDriver, ObjectStore};
pub use options::{
    BatchDefaults, Batching, Journaling, RetryDefaults, Retrying, check_requests, error_chain,
};
pub use retry::{Attempt, Retried, RetryPolicy, parse_retry_after};
pub use template::Template;
pub use time::event_time_ms;

/// `docs/plugins/writing-a-plugin.md`, compiled here (the crate its sink
/// example builds on) so that both worked examples are built and run as
/// doctests: `cargo test -p logbus-sink --doc`.
#[doc = include_str!("../../../docs/plugins/writing-a-plugin.md")]
pub mod writing_a_plugin {}
