//! The queues between stages. A stage's input is one of four kinds — a
//! bounded memory channel (one consumer or a shared queue for workers), a
//! local-scope queue (per-producer frontend rings over a shared backend),
//! or a durable disk queue — and every kind keeps the same promise: the
//! events between two stages never exceed the capacity the config gave
//! them, so worst-case memory is a sum computed before anything runs.
//!
//! This crate knows events and nothing about plugins: the engine opens
//! queues, plugins only see the `Receiver` and `Output` they are given.

pub mod channel;
pub mod durable;
pub mod histogram;
pub mod local;

pub use channel::{
    ChannelHandle, InputBatch, Interrupt, PushSignal, Receiver, Registration, SendError, Sender,
    WeakSender, channel, channel_with_batch, channel_with_latency, durable_channel, local_channel,
};
pub use histogram::{HistogramSnapshot, Log2Histogram};
pub use local::{LocalConfig, LocalQueueSnapshot, Overflow};

/// Runs blocking work (a file write, an fsync) from a stage's task without
/// stalling the runtime's other tasks: on a multi-thread runtime the worker
/// hands its other tasks off first; elsewhere it runs inline.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// On a multi-thread runtime, a task waiting in `blocking` hands the
    /// worker's other tasks on: with a single worker, a task it spawned
    /// still runs while it waits for that task.
    #[test]
    fn blocking_lets_the_worker_run_other_tasks_meanwhile() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let heard = rt.block_on(async {
            tokio::spawn(async {
                let (tx, rx) = std::sync::mpsc::channel();
                tokio::spawn(async move { tx.send(7).unwrap() });
                super::blocking(|| rx.recv_timeout(Duration::from_secs(10)))
            })
            .await
            .unwrap()
        });
        assert_eq!(heard, Ok(7));
    }

    /// Where `block_in_place` would panic (a current-thread runtime) or
    /// has no runtime to tell, the work runs inline.
    #[test]
    fn blocking_runs_inline_elsewhere() {
        assert_eq!(super::blocking(|| 3), 3);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(rt.block_on(async { super::blocking(|| 4) }), 4);
    }
}
