//! Turns a pipeline file into a validated [`Pipeline`], or into the full list
//! of what is wrong with it. Nothing here does I/O beyond reading the file,
//! so `logbus validate` in CI checks exactly what `logbus run` would refuse.
//!
//! `settings` holds what a file may say (engine settings, queue types),
//! `model` the validated pipeline the runtime is built from, and `check`
//! the checker that reads YAML into the model and reports every problem
//! with its stage and position.

mod check;
mod model;
mod settings;

pub use check::{
    LoadOptions, Loaded, UnreadableFile, load_file, load_file_with, load_str, load_str_with,
    read_text,
};
pub use model::{InflightBound, Pipeline, StageSpec};
pub use settings::*;

/// Suffix of the output that carries a stage's failed events (`on_error: route`).
pub const ERRORS_SUFFIX: &str = ".errors";

/// Suffix of the output that carries what a sink could not deliver: events
/// its destination refused for good, or that ran out of retries.
pub const DEAD_SUFFIX: &str = ".dead";

/// Keys every stage may have besides its plugin's options.
const COMMON_KEYS: [&str; 5] = ["inputs", "on_error", "workers", "ordered", "queue"];

/// Most workers one stage may have.
pub const MAX_WORKERS: usize = 256;

#[cfg(test)]
pub(crate) mod tests;
