//! Acknowledgements: how a source learns that the events it read are
//! finished, so it can move its saved position past them.
//!
//! A source that checkpoints opens one [`BatchAck`] per batch it sends and
//! gives every event of the batch an [`Ack`] handle to it. Handles travel
//! with their events, beside the copy-on-write data rather than inside it:
//! mutating an event never copies its handle, and a disk queue never
//! encodes one. Each fan-out clone is a handle of its own, so the batch is
//! finished only when every path has settled every handle.
//!
//! A handle is settled exactly once: explicitly, by whoever finished the
//! event (a sink on confirmation, a filter that discards it, a durable
//! queue that stored it), or implicitly when it is dropped unsettled —
//! which counts as [`Outcome::Errored`]. Losing track of an event
//! therefore holds the source's checkpoint back (a restart re-reads,
//! duplicates are possible) instead of moving it past data nobody
//! delivered (loss).
//!
//! The batch's outcome is the worst of its handles' outcomes
//! (`Delivered < Rejected < Errored`); the source hears it once, when the
//! last handle is gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// What happened to an event, from its source's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Outcome {
    /// The destination confirmed it (or a stage dropped it on purpose).
    Delivered = 1,
    /// Refused for good (`on_error: drop`, a destination's permanent
    /// refusal): counted, not retried.
    Rejected = 2,
    /// Not finished: the source must not move its checkpoint past it.
    Errored = 3,
}

impl Outcome {
    fn from_u8(v: u8) -> Outcome {
        match v {
            // No handle ever settled: a batch of no events.
            0 | 1 => Outcome::Delivered,
            2 => Outcome::Rejected,
            _ => Outcome::Errored,
        }
    }
}

/// Hears the outcome of each batch a source opened.
pub trait AckReceiver: Send + Sync + 'static {
    /// Batch `token` is finished. Called once per batch, from whichever
    /// thread dropped its last handle: keep it short.
    fn finished(&self, token: u64, outcome: Outcome);
}

struct Batch {
    outcome: AtomicU8,
    token: u64,
    receiver: Arc<dyn AckReceiver>,
}

impl Drop for Batch {
    fn drop(&mut self) {
        let outcome = Outcome::from_u8(self.outcome.load(Ordering::Acquire));
        self.receiver.finished(self.token, outcome);
    }
}

/// One batch of a source, opened before its events are sent.
pub struct BatchAck(Arc<Batch>);

impl BatchAck {
    pub fn new(receiver: Arc<dyn AckReceiver>, token: u64) -> BatchAck {
        BatchAck(Arc::new(Batch {
            outcome: AtomicU8::new(0),
            token,
            receiver,
        }))
    }

    /// A handle for one event of the batch.
    pub fn handle(&self) -> Ack {
        Ack(Some(self.0.clone()))
    }
}

/// An event's share of its source batch's acknowledgement; `Ack::none()`
/// for events whose source does not checkpoint. Cloning makes a new,
/// unsettled handle to the same batch.
#[derive(Default)]
pub struct Ack(Option<Arc<Batch>>);

impl Ack {
    pub const fn none() -> Ack {
        Ack(None)
    }

    /// Whether this handle still has a batch to report to.
    pub fn is_pending(&self) -> bool {
        self.0.is_some()
    }

    /// Whether both handles report to the same source batch (a sink that
    /// holds handles for a long time keeps one per batch: the batch reports
    /// once its last handle is gone, and the worst outcome wins).
    pub fn same_batch(&self, other: &Ack) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Records the outcome for this handle; later calls do nothing.
    pub fn settle(&mut self, outcome: Outcome) {
        if let Some(batch) = self.0.take() {
            batch.outcome.fetch_max(outcome as u8, Ordering::AcqRel);
        }
    }
}

impl Clone for Ack {
    fn clone(&self) -> Ack {
        Ack(self.0.clone())
    }
}

impl Drop for Ack {
    fn drop(&mut self) {
        self.settle(Outcome::Errored);
    }
}

impl std::fmt::Debug for Ack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(b) => write!(f, "Ack(batch {})", b.token),
            None => f.write_str("Ack(none)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Heard(Mutex<Vec<(u64, Outcome)>>);
    impl AckReceiver for Heard {
        fn finished(&self, token: u64, outcome: Outcome) {
            self.0.lock().unwrap().push((token, outcome));
        }
    }

    fn open(token: u64) -> (Arc<Heard>, BatchAck) {
        let heard = Arc::new(Heard::default());
        let batch = BatchAck::new(heard.clone(), token);
        (heard, batch)
    }

    #[test]
    fn a_handle_prints_its_batch() {
        let (_heard, batch) = open(42);
        let mut handle = batch.handle();
        assert_eq!(format!("{handle:?}"), "Ack(batch 42)");
        assert_eq!(format!("{:?}", Ack::none()), "Ack(none)");
        handle.settle(Outcome::Delivered);
    }

    #[test]
    fn the_source_hears_once_when_the_last_handle_settles() {
        let (heard, batch) = open(7);
        let mut a = batch.handle();
        let mut b = a.clone();
        drop(batch);
        a.settle(Outcome::Delivered);
        drop(a);
        assert!(heard.0.lock().unwrap().is_empty(), "b is still out");
        b.settle(Outcome::Delivered);
        assert_eq!(*heard.0.lock().unwrap(), vec![(7, Outcome::Delivered)]);
        drop(b);
        assert_eq!(heard.0.lock().unwrap().len(), 1, "heard once");
    }

    #[test]
    fn a_handle_dropped_unsettled_makes_the_batch_errored() {
        let (heard, batch) = open(1);
        let mut a = batch.handle();
        let b = batch.handle();
        drop(batch);
        a.settle(Outcome::Delivered);
        drop(b);
        assert_eq!(*heard.0.lock().unwrap(), vec![(1, Outcome::Errored)]);
    }

    #[test]
    fn the_worst_outcome_wins_and_rejected_is_not_errored() {
        let (heard, batch) = open(2);
        let mut a = batch.handle();
        let mut b = batch.handle();
        drop(batch);
        a.settle(Outcome::Rejected);
        b.settle(Outcome::Delivered);
        assert_eq!(*heard.0.lock().unwrap(), vec![(2, Outcome::Rejected)]);
    }

    #[test]
    fn settling_twice_keeps_the_first_outcome() {
        let (heard, batch) = open(3);
        let mut a = batch.handle();
        drop(batch);
        a.settle(Outcome::Delivered);
        a.settle(Outcome::Errored);
        drop(a);
        assert_eq!(*heard.0.lock().unwrap(), vec![(3, Outcome::Delivered)]);
    }

    #[test]
    fn a_batch_nobody_took_a_handle_of_is_delivered() {
        let (heard, batch) = open(4);
        drop(batch);
        assert_eq!(*heard.0.lock().unwrap(), vec![(4, Outcome::Delivered)]);
    }

    #[test]
    fn handles_settle_from_other_threads() {
        let (heard, batch) = open(5);
        let handles: Vec<Ack> = (0..8).map(|_| batch.handle()).collect();
        drop(batch);
        let threads: Vec<_> = handles
            .into_iter()
            .map(|mut h| std::thread::spawn(move || h.settle(Outcome::Delivered)))
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*heard.0.lock().unwrap(), vec![(5, Outcome::Delivered)]);
    }
}
