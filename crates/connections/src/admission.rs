//! What a request-serving source (HTTP, OTLP) admits, and when it answers.
//!
//! A request takes one of a fixed number of slots *before* its body is
//! read, so what requests hold in memory is bounded by the slots whatever
//! clients send; a request that waits too long for one is refused as
//! retryable (503 / UNAVAILABLE with a retry hint) having cost nothing.
//! With `ack: sink` the answer waits, still holding the slot, until every
//! event of the request is finished, and says how they ended: a client
//! that sends again whatever got no success loses nothing. Both sources
//! keep only their wire format here: what a status is called, not when.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use logbus_event::{AckReceiver, BatchAck, Event, Outcome};
use tokio::sync::{Semaphore, SemaphorePermit, oneshot};

/// When a request is answered with success.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum AckMode {
    /// Once its events are in the pipeline's queues.
    #[default]
    Queued,
    /// Once every one of its events is delivered by the sinks; a refusal
    /// for good, an error (send again) or no answer within the timeout is
    /// said instead.
    Sink,
}

/// The request slots of one source, and its acknowledgement settings.
pub struct Admission {
    slots: Semaphore,
    accept_timeout: Duration,
    ack: AckMode,
    ack_timeout: Duration,
}

/// How the events of one `ack: sink` request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Every one delivered.
    Delivered,
    /// None errored; this many refused for good (sending again will not
    /// help).
    Rejected(u64),
    /// This many not finished (a stage failed or the pipeline is
    /// stopping): the client should send the request again.
    Errored(u64),
    /// No answer within the ack timeout: they may still be delivered, so
    /// sending again may duplicate.
    TimedOut,
}

impl Admission {
    pub fn new(
        max_concurrent_requests: usize,
        accept_timeout: Duration,
        ack: AckMode,
        ack_timeout: Duration,
    ) -> Admission {
        Admission {
            slots: Semaphore::new(max_concurrent_requests),
            accept_timeout,
            ack,
            ack_timeout,
        }
    }

    /// A slot, waited for at most the accept timeout; `None`: the
    /// pipeline stays full, refuse the request as retryable.
    pub async fn slot(&self) -> Option<SemaphorePermit<'_>> {
        tokio::time::timeout(self.accept_timeout, self.slots.acquire())
            .await
            .ok()?
            .ok()
    }

    /// With `ack: sink`, gives each event an acknowledgement handle and
    /// returns what to wait on once they are sent; with `ack: queued`,
    /// the events as they are and nothing to wait on.
    pub fn track(&self, events: Vec<Event>) -> (Vec<Event>, Option<Pending>) {
        if self.ack == AckMode::Queued {
            return (events, None);
        }
        let (tx, done) = oneshot::channel();
        let tx = if events.is_empty() {
            // Nothing to wait for.
            let _ = tx.send(());
            None
        } else {
            Some(tx)
        };
        let outcomes = Arc::new(RequestOutcomes {
            remaining: AtomicU64::new(events.len() as u64),
            rejected: AtomicU64::new(0),
            errored: AtomicU64::new(0),
            done: Mutex::new(tx),
        });
        let receiver: Arc<dyn AckReceiver> = outcomes.clone();
        // One acknowledgement per event, so the answer can say how many
        // ended which way.
        let events = events
            .into_iter()
            .enumerate()
            .map(|(i, e)| e.with_ack(BatchAck::new(receiver.clone(), i as u64).handle()))
            .collect();
        let pending = Pending {
            outcomes,
            done,
            timeout: self.ack_timeout,
        };
        (events, Some(pending))
    }
}

/// The events of one `ack: sink` request, sent and not yet finished.
pub struct Pending {
    outcomes: Arc<RequestOutcomes>,
    done: oneshot::Receiver<()>,
    timeout: Duration,
}

impl Pending {
    /// Waits, at most the ack timeout, until the last event is finished.
    pub async fn settled(self) -> Settled {
        if tokio::time::timeout(self.timeout, self.done).await.is_err() {
            return Settled::TimedOut;
        }
        let errored = self.outcomes.errored.load(Ordering::Acquire);
        let rejected = self.outcomes.rejected.load(Ordering::Acquire);
        match (errored, rejected) {
            (0, 0) => Settled::Delivered,
            (0, r) => Settled::Rejected(r),
            (e, _) => Settled::Errored(e),
        }
    }
}

/// Counts a request's outcomes; tells the waiting answer at the last.
struct RequestOutcomes {
    remaining: AtomicU64,
    rejected: AtomicU64,
    errored: AtomicU64,
    done: Mutex<Option<oneshot::Sender<()>>>,
}

impl AckReceiver for RequestOutcomes {
    fn finished(&self, _token: u64, outcome: Outcome) {
        match outcome {
            Outcome::Delivered => {}
            Outcome::Rejected => {
                self.rejected.fetch_add(1, Ordering::AcqRel);
            }
            Outcome::Errored => {
                self.errored.fetch_add(1, Ordering::AcqRel);
            }
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let tx = self.done.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(tx) = tx {
                let _ = tx.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_event::Meta;

    fn events(n: usize) -> Vec<Event> {
        (0..n)
            .map(|i| Event::raw(format!("e{i}"), Meta::at("t", 0)))
            .collect()
    }

    fn admission(ack: AckMode) -> Admission {
        Admission::new(2, Duration::from_millis(100), ack, Duration::from_secs(5))
    }

    /// The slots are a bound: the third request waits out the accept
    /// timeout and is refused; a slot given back admits the next.
    #[tokio::test(start_paused = true)]
    async fn a_request_beyond_the_slots_is_refused_after_the_accept_timeout() {
        let a = admission(AckMode::Queued);
        let first = a.slot().await.expect("free");
        let _second = a.slot().await.expect("free");
        assert!(a.slot().await.is_none());
        drop(first);
        assert!(a.slot().await.is_some());
    }

    #[tokio::test]
    async fn queued_requests_carry_no_handles_and_wait_for_nothing() {
        let (events, pending) = admission(AckMode::Queued).track(events(3));
        assert!(pending.is_none());
        assert!(events.iter().all(|e| !e.ack().is_pending()));
    }

    /// The answer waits for the last event and counts each way it ended;
    /// an error outranks a refusal, and a dropped event is an error.
    #[tokio::test]
    async fn the_answer_says_how_the_requests_events_ended() {
        let a = admission(AckMode::Sink);
        let settle = |outcomes: &[Option<Outcome>]| {
            let (events, pending) = a.track(events(outcomes.len()));
            for (mut e, o) in events.into_iter().zip(outcomes) {
                if let Some(o) = o {
                    e.settle(*o);
                }
            }
            pending.expect("ack: sink")
        };
        let d = Some(Outcome::Delivered);
        let r = Some(Outcome::Rejected);
        let x = Some(Outcome::Errored);
        assert_eq!(settle(&[d, d]).settled().await, Settled::Delivered);
        assert_eq!(settle(&[d, r, r]).settled().await, Settled::Rejected(2));
        assert_eq!(settle(&[r, x, d]).settled().await, Settled::Errored(1));
        assert_eq!(settle(&[d, None]).settled().await, Settled::Errored(1));
        // Nothing to wait for: delivered at once.
        assert_eq!(settle(&[]).settled().await, Settled::Delivered);
    }

    #[tokio::test(start_paused = true)]
    async fn no_answer_within_the_ack_timeout_is_said_as_such() {
        let a = admission(AckMode::Sink);
        let (held, pending) = a.track(events(1));
        assert_eq!(pending.expect("pending").settled().await, Settled::TimedOut);
        drop(held);
    }
}
