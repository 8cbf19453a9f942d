//! The engine in process, with real plugins and test plugins: backpressure
//! without loss, fan-in and fan-out, error routing, workers, fused chains,
//! reloads and shutdown. (The `logbus` binary's own tests, which run it as
//! a process, are in `crates/logbus/tests/it`.)

mod attached;
mod fuse;
mod js;
mod reload;
mod route;
mod runtime;
mod support;
mod workers;
