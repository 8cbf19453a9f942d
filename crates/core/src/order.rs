//! Ordered workers (`ordered: true`): several workers of one stage take
//! batches from its queue in turn, process them side by side, and hand
//! them on in the order they took them.
//!
//! Why a ticket at the take and parking at the end, rather than a
//! sequence number stamped by the sender: with several senders, a number
//! stamped before the push can reach the queue after a higher one, and
//! workers waiting for their turn would then hold every slot while the
//! missing batch sits in the queue. Here a worker takes its batch and its
//! number under one lock, so every number issued is in some worker's
//! hands, never in the queue.
//!
//! A worker that finishes out of turn does not wait: it parks what it
//! would send and goes on to the next batch. Whoever holds the turn sends
//! the parked batches that follow it. Parked batches keep their input
//! batch, and so their queue permits, until they are sent: the queue's
//! capacity still bounds what the stage holds, as without ordering.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The turn shared by the workers of one ordered stage (or fused chain).
/// `T` is what a worker parks: everything one batch sends.
pub(crate) struct Order<T> {
    /// Held from taking a batch to numbering it.
    take: Mutex<()>,
    issued: AtomicU64,
    state: Mutex<State<T>>,
    /// Told when something is parked or a turn ends.
    changed: Notify,
}

struct State<T> {
    /// The number whose turn it is.
    next: u64,
    /// Finished out of turn. `None`: a ticket dropped unused (its worker
    /// failed), which only passes the turn on.
    parked: BTreeMap<u64, Option<T>>,
    /// Someone is sending `next`.
    sending: bool,
}

/// A place in the order: parked once, or passed over when dropped unparked.
pub(crate) struct Ticket<T> {
    seq: u64,
    order: Arc<Order<T>>,
    parked: bool,
}

/// The turn, held while its batch is sent; dropping it passes the turn on
/// (also when the send failed or was abandoned).
pub(crate) struct Turn<'a, T> {
    order: &'a Order<T>,
}

impl<T> Order<T> {
    pub fn new() -> Arc<Order<T>> {
        Arc::new(Order {
            take: Mutex::new(()),
            issued: AtomicU64::new(0),
            state: Mutex::new(State {
                next: 0,
                parked: BTreeMap::new(),
                sending: false,
            }),
            changed: Notify::new(),
        })
    }

    /// Runs `take` alone among the workers and numbers what it returns.
    /// Nothing here waits: a worker that finds nothing waits for the queue
    /// to tell it of a batch and tries again. (Waiting for a batch while
    /// holding an async lock was tried: the lock's next holder was woken
    /// onto the releasing thread's next-task slot, which tokio's other
    /// threads cannot take, and the workers ran one at a time.)
    pub fn try_take<R>(
        self: &Arc<Self>,
        take: impl FnOnce() -> Option<R>,
    ) -> Option<(Ticket<T>, R)> {
        let _alone = self.take.lock().expect("take lock");
        let got = take()?;
        Some((self.ticket(), got))
    }

    /// A number for what a worker sends without taking a batch (what its
    /// instances release at the end): after everything taken so far.
    pub fn ticket(self: &Arc<Self>) -> Ticket<T> {
        Ticket {
            seq: self.issued.fetch_add(1, Ordering::SeqCst),
            order: self.clone(),
            parked: false,
        }
    }

    /// The next batch to send, with the turn, if it is parked and nobody is
    /// sending. Tickets dropped unparked are passed over here.
    pub fn claim(&self) -> Option<(T, Turn<'_, T>)> {
        let mut state = self.state.lock().expect("order lock");
        loop {
            if state.sending {
                return None;
            }
            let next = state.next;
            match state.parked.remove(&next)? {
                Some(item) => {
                    state.sending = true;
                    return Some((item, Turn { order: self }));
                }
                None => state.next += 1,
            }
        }
    }

    /// Every number issued has been sent or passed over.
    pub fn settled(&self) -> bool {
        let state = self.state.lock().expect("order lock");
        !state.sending && state.next == self.issued.load(Ordering::SeqCst)
    }

    /// Resolves after the next [`park`](Ticket::park) or end of a turn that
    /// follows the call to `enable` on the returned future.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    fn put(&self, seq: u64, item: Option<T>) {
        self.state
            .lock()
            .expect("order lock")
            .parked
            .insert(seq, item);
        self.changed.notify_waiters();
    }
}

impl<T> Ticket<T> {
    /// Leaves what this batch sends for its turn.
    pub fn park(mut self, item: T) {
        self.parked = true;
        self.order.put(self.seq, Some(item));
    }
}

impl<T> Drop for Ticket<T> {
    fn drop(&mut self) {
        if !self.parked {
            self.order.put(self.seq, None);
        }
    }
}

impl<T> Drop for Turn<'_, T> {
    fn drop(&mut self) {
        let mut state = self.order.state.lock().expect("order lock");
        state.next += 1;
        state.sending = false;
        drop(state);
        self.order.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_all(order: &Order<&'static str>) -> Vec<&'static str> {
        let mut sent = Vec::new();
        while let Some((item, _turn)) = order.claim() {
            sent.push(item);
        }
        sent
    }

    #[tokio::test]
    async fn batches_are_sent_in_the_order_they_were_taken() {
        let order = Order::new();
        let mut queue = vec!["a", "b", "c"].into_iter();
        let (ta, a) = order.try_take(|| queue.next()).unwrap();
        let (tb, b) = order.try_take(|| queue.next()).unwrap();
        let (tc, c) = order.try_take(|| queue.next()).unwrap();
        // Nothing taken: no number is issued.
        assert!(order.try_take(|| queue.next()).is_none());
        // Finished out of turn: c, then b; neither goes before a.
        tc.park(c);
        tb.park(b);
        assert!(claim_all(&order).is_empty());
        assert!(!order.settled());
        ta.park(a);
        assert_eq!(claim_all(&order), ["a", "b", "c"]);
        assert!(order.settled());
    }

    #[tokio::test]
    async fn one_sender_at_a_time_and_the_turn_passes_when_it_ends() {
        let order = Order::new();
        let (t0, t1) = (order.ticket(), order.ticket());
        t0.park("zero");
        t1.park("one");
        let (first, turn) = order.claim().unwrap();
        assert_eq!(first, "zero");
        // While "zero" is being sent, "one" waits even though it is next.
        assert!(order.claim().is_none());
        assert!(!order.settled());
        drop(turn);
        assert_eq!(claim_all(&order), ["one"]);
        assert!(order.settled());
    }

    #[tokio::test]
    async fn a_ticket_dropped_unparked_is_passed_over() {
        let order = Order::new();
        let (t0, t1, t2) = (order.ticket(), order.ticket(), order.ticket());
        t2.park("two");
        drop(t1);
        assert!(claim_all(&order).is_empty());
        t0.park("zero");
        assert_eq!(claim_all(&order), ["zero", "two"]);
        assert!(order.settled());
    }

    /// A waiter registered before a park hears of it; one registered after
    /// the last change does not resolve by itself.
    #[tokio::test]
    async fn parking_and_turn_ends_wake_a_waiter() {
        let order = Order::new();
        let t = order.ticket();
        let woken = order.changed();
        tokio::pin!(woken);
        woken.as_mut().enable();
        t.park("p");
        woken.await;
        let later = order.changed();
        tokio::pin!(later);
        later.as_mut().enable();
        let (_, turn) = order.claim().unwrap();
        drop(turn);
        later.await;
        assert!(order.settled());
        let idle = order.changed();
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(1), idle)
                .await
                .is_err()
        );
    }
}
