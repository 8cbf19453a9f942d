//! The plugin catalog of the `logbus` binary, as a library so that tests
//! and tools build the same registry the binary runs with.

pub mod catalog;
