//! Ordered checkpoints: batches finish in any order (fan-out, workers,
//! retries), but a source may only save a position once everything read
//! before it is finished. One type serves every source that checkpoints —
//! a file offset, a journal cursor, a partition offset — because it never
//! looks inside the position.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

use crate::ack::{AckReceiver, Outcome};

/// Counts of finished batches, and of the events in them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AckCounts {
    pub delivered: u64,
    pub rejected: u64,
    pub errored: u64,
}

struct Pending<P> {
    position: P,
    events: u64,
    opened: Instant,
    outcome: Option<Outcome>,
}

/// Positions in the order they were read, each waiting for its batch.
///
/// [`begin`](Self::begin) hands out consecutive tokens; [`finish`](Self::finish)
/// records a batch's outcome; [`committed`](Self::committed) is the position
/// of the newest batch such that it and every batch before it finished
/// delivered or rejected. An errored batch stops the checkpoint there for
/// the rest of the run: a restart resumes before it.
pub struct OrderedCheckpoint<P> {
    /// Token of `pending[0]`.
    base: u64,
    pending: VecDeque<Pending<P>>,
    committed: Option<P>,
    /// Events per outcome.
    counts: AckCounts,
}

impl<P> Default for OrderedCheckpoint<P> {
    fn default() -> Self {
        OrderedCheckpoint {
            base: 0,
            pending: VecDeque::new(),
            committed: None,
            counts: AckCounts::default(),
        }
    }
}

impl<P> OrderedCheckpoint<P> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a batch of `events` events that ends at `position`;
    /// returns the token its [`BatchAck`](crate::BatchAck) reports with.
    pub fn begin(&mut self, position: P, events: u64) -> u64 {
        let token = self.base + self.pending.len() as u64;
        self.pending.push_back(Pending {
            position,
            events,
            opened: Instant::now(),
            outcome: None,
        });
        token
    }

    /// Records the outcome of batch `token`. Unknown tokens are ignored.
    pub fn finish(&mut self, token: u64, outcome: Outcome) {
        let Some(i) = token.checked_sub(self.base) else {
            return;
        };
        let Some(entry) = self.pending.get_mut(i as usize) else {
            return;
        };
        if entry.outcome.is_some() {
            return;
        }
        entry.outcome = Some(outcome);
        let n = entry.events;
        match outcome {
            Outcome::Delivered => self.counts.delivered += n,
            Outcome::Rejected => self.counts.rejected += n,
            Outcome::Errored => self.counts.errored += n,
        }
        while let Some(front) = self.pending.front() {
            match front.outcome {
                Some(Outcome::Delivered | Outcome::Rejected) => {
                    let done = self.pending.pop_front().expect("front exists");
                    self.base += 1;
                    self.committed = Some(done.position);
                }
                // Errored holds the line; unfinished waits.
                Some(Outcome::Errored) | None => break,
            }
        }
    }

    /// The newest position that is safe to save.
    pub fn committed(&self) -> Option<&P> {
        self.committed.as_ref()
    }

    /// Batches begun and not yet passed by the checkpoint.
    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// Whether an errored batch holds the checkpoint back.
    pub fn is_held(&self) -> bool {
        self.pending
            .front()
            .is_some_and(|p| p.outcome == Some(Outcome::Errored))
    }

    /// For a stopping source: whether waiting longer can still move the
    /// checkpoint (batches are open and no errored one holds it).
    pub fn worth_waiting(&self) -> bool {
        self.outstanding() > 0 && !self.is_held()
    }

    /// When the oldest batch that is not yet passed was opened.
    pub fn oldest_open(&self) -> Option<Instant> {
        self.pending.front().map(|p| p.opened)
    }

    pub fn counts(&self) -> AckCounts {
        self.counts
    }
}

/// A shared checkpoint is what batches report to.
impl<P: Send + 'static> AckReceiver for Mutex<OrderedCheckpoint<P>> {
    fn finished(&self, token: u64, outcome: Outcome) {
        self.lock()
            .unwrap_or_else(|p| p.into_inner())
            .finish(token, outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkpoint_never_passes_an_unfinished_batch() {
        let mut c = OrderedCheckpoint::new();
        let a = c.begin(10, 1);
        let b = c.begin(20, 1);
        let d = c.begin(30, 1);
        c.finish(d, Outcome::Delivered);
        assert_eq!(c.committed(), None, "a and b are open");
        c.finish(a, Outcome::Delivered);
        assert_eq!(c.committed(), Some(&10));
        c.finish(b, Outcome::Rejected);
        assert_eq!(c.committed(), Some(&30), "rejected is finished too");
        assert_eq!(c.outstanding(), 0);
        assert_eq!(
            c.counts(),
            AckCounts {
                delivered: 2,
                rejected: 1,
                errored: 0
            }
        );
    }

    #[test]
    fn an_errored_batch_holds_the_checkpoint_for_the_rest_of_the_run() {
        let mut c = OrderedCheckpoint::new();
        let a = c.begin(1, 5);
        let b = c.begin(2, 5);
        let d = c.begin(3, 5);
        c.finish(a, Outcome::Delivered);
        assert!(c.worth_waiting(), "b is still open");
        c.finish(b, Outcome::Errored);
        c.finish(d, Outcome::Delivered);
        assert_eq!(c.committed(), Some(&1));
        assert!(c.is_held());
        assert!(!c.worth_waiting(), "nothing can move it now");
        assert_eq!(c.counts().errored, 5);
        assert_eq!(c.outstanding(), 2);
    }

    #[test]
    fn nothing_open_is_not_worth_waiting_for_and_the_oldest_open_batch_is_the_first() {
        let mut c = OrderedCheckpoint::new();
        assert!(!c.worth_waiting());
        assert_eq!(c.oldest_open(), None);
        let before = Instant::now();
        let a = c.begin(1, 1);
        let after_a = Instant::now();
        let b = c.begin(2, 1);
        assert!(c.worth_waiting());
        let oldest = c.oldest_open().unwrap();
        assert!(before <= oldest && oldest <= after_a);
        c.finish(a, Outcome::Delivered);
        assert!(c.oldest_open().unwrap() >= after_a, "b is the oldest now");
        c.finish(b, Outcome::Delivered);
        assert_eq!(c.oldest_open(), None);
        assert!(!c.worth_waiting());
    }

    #[test]
    fn stale_and_unknown_tokens_are_ignored() {
        let mut c = OrderedCheckpoint::new();
        let a = c.begin("x", 1);
        assert_eq!(c.committed(), None);
        c.finish(a, Outcome::Delivered);
        c.finish(a, Outcome::Errored);
        c.finish(99, Outcome::Delivered);
        assert_eq!(c.committed(), Some(&"x"));
        assert!(!c.is_held());
        assert_eq!(c.counts().errored, 0);
    }

    #[test]
    fn out_of_order_completion_over_many_batches_commits_the_last() {
        let mut c = OrderedCheckpoint::new();
        let tokens: Vec<u64> = (0..100).map(|i| c.begin(i, 1)).collect();
        // Finish in a scrambled but deterministic order.
        for k in 0..100u64 {
            c.finish(tokens[((k * 37) % 100) as usize], Outcome::Delivered);
        }
        assert_eq!(c.committed(), Some(&99));
        assert_eq!(c.counts().delivered, 100);
    }
}
