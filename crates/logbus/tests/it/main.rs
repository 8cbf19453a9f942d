//! Integration tests of the engine with the plugins of this build: the
//! validator's every error, the runtime's backpressure, fan-in/fan-out,
//! error routing, shutdown, and the `logbus` command itself.

mod api;
mod cli;
#[cfg(feature = "sink-clickhouse")]
mod clickhouse;
mod compress;
mod connect;
mod crash;
mod durable;
mod edge_agent;
mod flow;
mod hostile;
mod js;
#[cfg(feature = "source-kafka")]
mod kafka;
#[cfg(feature = "sink-opensearch")]
mod opensearch;
mod preflight;
#[cfg(feature = "sink-s3")]
mod s3;
mod schema;
mod support;
mod tail;
mod ui;
mod validate;
