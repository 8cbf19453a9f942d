//! Bounded stage-to-stage channel whose capacity is counted in events, not
//! in batches, so that the in-flight bound promised by the config is a sum of
//! capacities no matter how sources batch.
//!
//! A batch takes one permit per event when it is sent. The permits return to
//! the channel only when the consumer drops the [`InputBatch`], i.e. after it
//! has forwarded or committed those events. An event that a stage is working
//! on is therefore still counted against the channel it arrived on, and the
//! number of events anywhere between two sources and sinks never exceeds the
//! sum of the capacities of the channels in between.
//!
//! # Disconnection
//! The receiver sees the end of the stream when every sender has been dropped
//! (fan-in closes on the last upstream). A sender whose receiver is gone gets
//! its events back in [`SendError`], never loses them silently.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::{Notify, Semaphore};

use crate::event::Event;
use crate::histogram::Log2Histogram;

/// Counters of one channel, readable while the pipeline runs.
#[derive(Debug)]
pub struct ChannelStats {
    /// Events per dequeue.
    pub batch_sizes: Log2Histogram,
    /// Microseconds from the source reading a batch's first event to the
    /// consumer taking the batch (recorded only where enabled: sink inputs).
    pub ingest_latency_us: Option<Log2Histogram>,
    /// Nanoseconds consumers spent in finished waits in `recv`.
    wait_ns: AtomicU64,
    /// Consumers waiting now, and the sum of their start times (ns since
    /// [`epoch`]), so a snapshot can add the waits still in progress.
    waiters: AtomicU64,
    waiting_since_sum: AtomicU64,
    capacity: usize,
    max_occupancy: AtomicUsize,
    sent: AtomicU64,
    received: AtomicU64,
    abandoned: AtomicU64,
}

impl ChannelStats {
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Highest occupancy seen, in events.
    pub fn max_occupancy(&self) -> usize {
        self.max_occupancy.load(Ordering::Relaxed)
    }
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
    /// Events still queued when the receiver was dropped.
    pub fn abandoned(&self) -> u64 {
        self.abandoned.load(Ordering::Relaxed)
    }
    /// Total time consumers waited for input, in seconds, including waits
    /// in progress.
    pub fn wait_seconds(&self) -> f64 {
        let done = self.wait_ns.load(Ordering::Relaxed);
        let waiters = self.waiters.load(Ordering::Relaxed);
        let since = self.waiting_since_sum.load(Ordering::Relaxed);
        let ongoing = (waiters * since_epoch_ns()).saturating_sub(since);
        (done + ongoing) as f64 / 1e9
    }
}

struct Shared {
    permits: Semaphore,
    stats: ChannelStats,
    /// Largest batch a consumer takes in one dequeue.
    max_batch: usize,
    /// Live `Receiver` clones; the last one to go closes the channel.
    receivers: AtomicUsize,
}

impl Shared {
    fn occupancy(&self) -> usize {
        self.stats
            .capacity
            .saturating_sub(self.permits.available_permits())
    }
}

/// The events came back because the receiving stage has stopped.
#[derive(Debug, thiserror::Error)]
#[error("downstream stopped; {} events were not delivered", .0.len())]
pub struct SendError(pub Vec<Event>);

/// Creates a channel holding at most `capacity` events (queued plus in the
/// consumer's hands). `capacity` must be at least 1.
pub fn channel(capacity: usize) -> (Sender, Receiver) {
    channel_with_batch(capacity, capacity)
}

/// Like [`channel_with_batch`], also recording ingest-to-dequeue latency
/// (for the inputs of sinks, where it approximates end-to-end latency).
pub fn channel_with_latency(capacity: usize, max_batch: usize) -> (Sender, Receiver) {
    make_channel(capacity, max_batch, true)
}

/// A channel whose consumers take at most `max_batch` events per dequeue
/// (larger batches are split when sent). The receiver may be cloned: each
/// batch goes to one of the clones (multi-consumer, for stage workers).
pub fn channel_with_batch(capacity: usize, max_batch: usize) -> (Sender, Receiver) {
    make_channel(capacity, max_batch, false)
}

fn make_channel(capacity: usize, max_batch: usize, latency: bool) -> (Sender, Receiver) {
    assert!(capacity >= 1, "channel capacity must be at least 1");
    assert!(max_batch >= 1, "max batch must be at least 1");
    assert!(capacity <= u32::MAX as usize, "channel capacity too large");
    let shared = Arc::new(Shared {
        permits: Semaphore::new(capacity),
        stats: ChannelStats {
            batch_sizes: Log2Histogram::default(),
            ingest_latency_us: latency.then(Log2Histogram::default),
            wait_ns: AtomicU64::new(0),
            waiters: AtomicU64::new(0),
            waiting_since_sum: AtomicU64::new(0),
            capacity,
            max_occupancy: AtomicUsize::new(0),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
        },
        max_batch: max_batch.min(capacity),
        receivers: AtomicUsize::new(1),
    });
    let (tx, rx) = async_channel::unbounded();
    (
        Sender {
            tx,
            shared: shared.clone(),
        },
        Receiver {
            rx,
            shared,
            interrupt: None,
            seen: 0,
        },
    )
}

/// Sending half; clone it for fan-in.
#[derive(Clone)]
pub struct Sender {
    tx: async_channel::Sender<Vec<Event>>,
    shared: Arc<Shared>,
}

impl Sender {
    /// Sends a batch, waiting while the channel is full. A batch larger than
    /// the capacity is sent in capacity-sized pieces, in order.
    pub async fn send(&self, mut batch: Vec<Event>) -> Result<(), SendError> {
        let capacity = self.shared.max_batch;
        while !batch.is_empty() {
            let chunk = if batch.len() <= capacity {
                std::mem::take(&mut batch)
            } else {
                let rest = batch.split_off(capacity);
                std::mem::replace(&mut batch, rest)
            };
            let n = chunk.len();
            let Ok(permit) = self.shared.permits.acquire_many(n as u32).await else {
                return Err(SendError(rejoin(chunk, batch)));
            };
            permit.forget();
            self.shared
                .stats
                .max_occupancy
                .fetch_max(self.shared.occupancy(), Ordering::Relaxed);
            if let Err(
                async_channel::TrySendError::Closed(chunk)
                | async_channel::TrySendError::Full(chunk),
            ) = self.tx.try_send(chunk)
            {
                return Err(SendError(rejoin(chunk, batch)));
            }
            self.shared
                .stats
                .sent
                .fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Sends without waiting, or gives the batch back when it does not fit now.
    pub fn try_send(&self, batch: Vec<Event>) -> Result<(), TrySendError> {
        let n = batch.len();
        if n == 0 {
            return Ok(());
        }
        if n > self.shared.max_batch {
            return Err(TrySendError::Full(batch));
        }
        match self.shared.permits.try_acquire_many(n as u32) {
            Ok(permit) => permit.forget(),
            Err(tokio::sync::TryAcquireError::NoPermits) => return Err(TrySendError::Full(batch)),
            Err(tokio::sync::TryAcquireError::Closed) => return Err(TrySendError::Closed(batch)),
        }
        self.shared
            .stats
            .max_occupancy
            .fetch_max(self.shared.occupancy(), Ordering::Relaxed);
        self.tx
            .try_send(batch)
            .map_err(|e| TrySendError::Closed(e.into_inner()))?;
        self.shared
            .stats
            .sent
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(())
    }

    pub fn stats(&self) -> ChannelHandle {
        ChannelHandle(self.shared.clone())
    }

    /// A handle that does not keep the channel open: the engine keeps one per
    /// channel to wire new upstreams at a reload, without delaying the end of
    /// the stream when the real upstreams finish.
    pub fn downgrade(&self) -> WeakSender {
        WeakSender {
            tx: self.tx.downgrade(),
            shared: self.shared.clone(),
        }
    }
}

/// See [`Sender::downgrade`].
#[derive(Clone)]
pub struct WeakSender {
    tx: async_channel::WeakSender<Vec<Event>>,
    shared: Arc<Shared>,
}

impl WeakSender {
    /// A sender, if some sender still keeps the channel open.
    pub fn upgrade(&self) -> Option<Sender> {
        Some(Sender {
            tx: self.tx.upgrade()?,
            shared: self.shared.clone(),
        })
    }
}

/// Nanoseconds since the first call in this process: a monotonic clock
/// that fits in an atomic.
fn since_epoch_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// Runs a closure when dropped.
struct Settle<F: FnMut()>(F);

impl<F: FnMut()> Drop for Settle<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

fn rejoin(mut first: Vec<Event>, rest: Vec<Event>) -> Vec<Event> {
    first.extend(rest);
    first
}

#[derive(Debug, thiserror::Error)]
pub enum TrySendError {
    #[error("channel is full")]
    Full(Vec<Event>),
    #[error("channel is closed")]
    Closed(Vec<Event>),
}

/// A read-only view of a channel for metrics and tests.
#[derive(Clone)]
pub struct ChannelHandle(Arc<Shared>);

impl ChannelHandle {
    /// Events queued or in the consumer's hands right now.
    pub fn occupancy(&self) -> usize {
        self.0.occupancy()
    }
    pub fn stats(&self) -> &ChannelStats {
        &self.0.stats
    }
}

/// Lets the engine end consumers' streams early (at a batch boundary)
/// without closing the channel, so sinks can be replaced at a reload while
/// their queued events wait for the new ones.
///
/// Each raise starts a new generation. A receiver ends its stream when the
/// generation has moved past the one it last resumed at, so every clone
/// (every worker) sees each raise exactly once, with no flag to reset.
#[derive(Default)]
pub struct Interrupt {
    generation: AtomicU64,
    notify: Notify,
}

impl Interrupt {
    /// Ends the stream of every receiver sharing this interrupt.
    pub fn raise(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

/// Receiving half, owned by the consuming stage. Clones share the queue:
/// each batch goes to exactly one of them.
pub struct Receiver {
    rx: async_channel::Receiver<Vec<Event>>,
    shared: Arc<Shared>,
    interrupt: Option<Arc<Interrupt>>,
    /// The interrupt generation this receiver last resumed at.
    seen: u64,
}

impl Receiver {
    /// The next batch, or `None` once every sender is gone and the queue is
    /// empty (or the engine interrupted this consumer).
    pub async fn recv(&mut self) -> Option<InputBatch> {
        // Only a recv that has to wait is timed: the clock is read once per
        // batch when input is ready.
        if self.is_interrupted() {
            return None;
        }
        if let Ok(events) = self.rx.try_recv() {
            return Some(self.accept(events));
        }
        let stats = &self.shared.stats;
        let started = since_epoch_ns();
        stats
            .waiting_since_sum
            .fetch_add(started, Ordering::Relaxed);
        stats.waiters.fetch_add(1, Ordering::Relaxed);
        let shared = self.shared.clone();
        // Settled on every exit, including when the future is dropped.
        let _settle = Settle(move || {
            let stats = &shared.stats;
            stats.waiters.fetch_sub(1, Ordering::Relaxed);
            stats
                .waiting_since_sum
                .fetch_sub(started, Ordering::Relaxed);
            stats
                .wait_ns
                .fetch_add(since_epoch_ns().saturating_sub(started), Ordering::Relaxed);
        });
        self.recv_waiting().await
    }

    async fn recv_waiting(&mut self) -> Option<InputBatch> {
        let Some(interrupt) = self.interrupt.clone() else {
            let events = self.rx.recv().await.ok()?;
            return Some(self.accept(events));
        };
        loop {
            // Register for the wake-up before looking at the flag, so a
            // raise between the two cannot be missed.
            let notified = interrupt.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if interrupt.generation() > self.seen {
                return None;
            }
            tokio::select! {
                biased;
                _ = &mut notified => continue,
                events = self.rx.recv() => return Some(self.accept(events.ok()?)),
            }
        }
    }

    /// The next batch if one is queued now.
    pub fn try_recv(&mut self) -> Option<InputBatch> {
        if self.is_interrupted() {
            return None;
        }
        let events = self.rx.try_recv().ok()?;
        Some(self.accept(events))
    }

    /// Makes this receiver (and clones made after) interruptible; returns
    /// the handle that interrupts them.
    pub fn interruptible(&mut self) -> Arc<Interrupt> {
        let interrupt = self.interrupt.get_or_insert_with(Default::default).clone();
        self.seen = interrupt.generation();
        interrupt
    }

    /// Whether the stream was ended by an interrupt this receiver has not resumed from.
    pub fn is_interrupted(&self) -> bool {
        self.interrupt
            .as_ref()
            .is_some_and(|i| i.generation() > self.seen)
    }

    /// Delivers again after an interrupt.
    pub fn resume(&mut self) {
        if let Some(i) = &self.interrupt {
            self.seen = i.generation();
        }
    }

    fn accept(&self, events: Vec<Event>) -> InputBatch {
        let stats = &self.shared.stats;
        stats
            .received
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        stats.batch_sizes.record(events.len() as u64);
        if let (Some(h), Some(first)) = (&stats.ingest_latency_us, events.first()) {
            h.record(crate::event::now_ns().saturating_sub(first.meta().ingest_ns) / 1000);
        }
        InputBatch {
            permits: events.len(),
            events,
            shared: self.shared.clone(),
        }
    }

    pub fn handle(&self) -> ChannelHandle {
        ChannelHandle(self.shared.clone())
    }
}

impl Clone for Receiver {
    fn clone(&self) -> Self {
        self.shared.receivers.fetch_add(1, Ordering::AcqRel);
        Receiver {
            rx: self.rx.clone(),
            shared: self.shared.clone(),
            interrupt: self.interrupt.clone(),
            seen: self.seen,
        }
    }
}

impl Drop for Receiver {
    /// The last receiver closes the channel: blocked senders get their
    /// events back, and whatever was still queued is counted as abandoned.
    fn drop(&mut self) {
        if self.shared.receivers.fetch_sub(1, Ordering::AcqRel) > 1 {
            return;
        }
        self.shared.permits.close();
        self.rx.close();
        while let Ok(batch) = self.rx.try_recv() {
            self.shared
                .stats
                .abandoned
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
    }
}

/// A received batch. Its events stay counted against the channel until this
/// value is dropped; take the events with [`InputBatch::take`] and drop the
/// batch once they are forwarded or committed.
pub struct InputBatch {
    events: Vec<Event>,
    permits: usize,
    shared: Arc<Shared>,
}

impl InputBatch {
    pub fn len(&self) -> usize {
        self.permits
    }
    pub fn is_empty(&self) -> bool {
        self.permits == 0
    }
    pub fn events(&self) -> &[Event] {
        &self.events
    }
    /// Moves the events out; the permits stay held until `self` is dropped.
    pub fn take(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }
}

impl Drop for InputBatch {
    fn drop(&mut self) {
        self.shared.permits.add_permits(self.permits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Meta;

    fn events(n: usize) -> Vec<Event> {
        (0..n)
            .map(|i| {
                Event::raw(
                    i.to_string(),
                    Meta {
                        source: "t".into(),
                        ingest_ns: 0,
                    },
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn capacity_counts_events_and_held_batches() {
        let (tx, mut rx) = channel(4);
        tx.send(events(3)).await.unwrap();
        assert!(matches!(tx.try_send(events(2)), Err(TrySendError::Full(_))));
        let batch = rx.recv().await.unwrap();
        assert_eq!(batch.len(), 3);
        // Still held by the consumer: the channel stays full for 2 events.
        assert!(matches!(tx.try_send(events(2)), Err(TrySendError::Full(_))));
        drop(batch);
        tx.try_send(events(2)).unwrap();
        assert_eq!(tx.stats().stats().max_occupancy(), 3);
    }

    #[tokio::test]
    async fn oversized_batch_is_split_in_order() {
        let (tx, mut rx) = channel(2);
        let sender = tokio::spawn(async move { tx.send(events(5)).await });
        let mut seen = Vec::new();
        while let Some(mut b) = rx.recv().await {
            assert!(b.len() <= 2);
            seen.extend(b.take().into_iter().map(|e| e.as_raw().unwrap().clone()));
        }
        sender.await.unwrap().unwrap();
        let expected: Vec<_> = (0..5).map(|i| bytes::Bytes::from(i.to_string())).collect();
        assert_eq!(seen, expected);
    }

    #[tokio::test]
    async fn send_to_a_dropped_receiver_returns_the_events() {
        let (tx, rx) = channel(2);
        drop(rx);
        let err = tx.send(events(3)).await.unwrap_err();
        assert_eq!(err.0.len(), 3);
    }

    #[tokio::test]
    async fn blocked_sender_wakes_with_events_when_receiver_drops() {
        let (tx, mut rx) = channel(1);
        tx.send(events(1)).await.unwrap();
        let held = rx.recv().await.unwrap();
        let blocked = tokio::spawn(async move { tx.send(events(1)).await });
        tokio::task::yield_now().await;
        drop(held);
        drop(rx);
        // Either delivered before the drop (then abandoned) or returned: never both, never neither.
        match blocked.await.unwrap() {
            Ok(()) => {}
            Err(e) => assert_eq!(e.0.len(), 1),
        }
    }

    #[tokio::test]
    async fn interrupt_ends_every_clones_stream_once_without_closing_the_channel() {
        let (tx, mut rx) = channel(8);
        let interrupt = rx.interruptible();
        let mut other = rx.clone();
        tx.send(events(2)).await.unwrap();
        // A consumer blocked in recv wakes up with None when interrupted.
        let waiter = tokio::spawn(async move {
            let first = rx.recv().await.map(|b| b.len());
            let second = rx.recv().await.map(|b| b.len());
            (rx, first, second)
        });
        tokio::task::yield_now().await;
        interrupt.raise();
        let (mut rx, first, second) = waiter.await.unwrap();
        assert_eq!((first, second), (Some(2), None));
        // Every clone sees the raise, until it resumes.
        assert!(other.is_interrupted());
        assert!(other.recv().await.is_none());
        rx.resume();
        other.resume();
        tx.send(events(1)).await.unwrap();
        assert_eq!(rx.recv().await.map(|b| b.len()), Some(1));
        assert!(!other.is_interrupted());
    }

    #[tokio::test]
    async fn weak_sender_does_not_keep_the_channel_open() {
        let (tx, mut rx) = channel(8);
        let weak = tx.downgrade();
        let strong = weak.upgrade().unwrap();
        strong.send(events(1)).await.unwrap();
        drop(strong);
        drop(tx);
        assert!(weak.upgrade().is_none());
        assert_eq!(rx.recv().await.map(|b| b.len()), Some(1));
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn clones_share_the_queue_and_the_last_one_closes_it() {
        let (tx, mut rx1) = channel_with_batch(100, 3);
        let mut rx2 = rx1.clone();
        tx.send(events(7)).await.unwrap();
        // Split into dequeues of at most 3, each taken by exactly one clone.
        let a = rx1.recv().await.unwrap();
        let b = rx2.recv().await.unwrap();
        let c = rx1.recv().await.unwrap();
        assert_eq!((a.len(), b.len(), c.len()), (3, 3, 1));
        drop((a, b, c));
        drop(rx1);
        // One clone left: the channel is open.
        tx.send(events(1)).await.unwrap();
        drop(rx2);
        assert!(
            tx.send(events(1)).await.is_err(),
            "closed after the last receiver"
        );
    }

    #[tokio::test]
    async fn fan_in_closes_after_last_sender() {
        let (tx, mut rx) = channel(8);
        let tx2 = tx.clone();
        tx.send(events(1)).await.unwrap();
        drop(tx);
        tx2.send(events(1)).await.unwrap();
        drop(tx2);
        let mut total = 0;
        while let Some(b) = rx.recv().await {
            total += b.len();
        }
        assert_eq!(total, 2);
    }
}
