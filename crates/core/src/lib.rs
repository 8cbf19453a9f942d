//! The LogBus engine: reads a pipeline file, validates it without doing any
//! I/O, and runs it as a DAG of stage tasks joined by bounded channels.
//!
//! This crate never names a concrete plugin; plugins arrive through the
//! [`Registry`](logbus_plugin_api::Registry) the caller fills.

pub mod config;
pub mod connect;
pub mod diagnostic;
pub mod flow;
pub mod fmt;
pub mod graph;
mod order;
pub mod preflight;
pub mod report;
pub mod runtime;
pub mod schema;
pub mod yaml;

pub use config::{
    ApiSettings, LoadOptions, Loaded, MAX_THREADS, OnError, Pipeline, QueueScope, QueueSpec,
    Settings, StageSpec, load_file, load_file_with, load_str, load_str_with,
};
pub use diagnostic::{Diagnostic, Severity};
pub use report::RunReport;
pub use runtime::{ReloadError, ReloadSummary, Reloader, RunningPipeline, StatsHandle, start};
