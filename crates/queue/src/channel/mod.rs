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
//!
//! # Kinds
//! One `Sender`/`Receiver` pair serves every queue kind, because producers
//! and the engine must not care which kind a stage was given. What differs
//! is where a consumer reads, fixed when the consumer is made ([`End`]): the
//! shared memory queue (this module), one frontend ring of a local-scope
//! queue ([`frontend`]), or a durable queue's log ([`log`]).
//!
//! # Why one module of this size
//! The sender, the receiver, the handle and `Shared` keep one invariant
//! between them: a permit per event is taken at send and returned when
//! the batch is dropped, and each side's wakeup follows from the other's
//! change. Split across files, that invariant could not be read in one
//! place; the kinds that differ (a frontend ring, a durable log) already
//! live in their own modules.

mod frontend;
mod log;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::{Notify, Semaphore};

use crate::durable::Durable;
use crate::histogram::{HistogramSnapshot, Log2Histogram};
use crate::local::{Local, LocalConfig, LocalQueueSnapshot, Overflow};
use frontend::FrontendEnd;
use log::HeldAcks;
use log::LogEnd;
use logbus_event::Event;

pub use frontend::Registration;

/// Counters of one channel, readable while the pipeline runs.
#[derive(Debug)]
pub struct ChannelStats {
    /// Events per dequeue.
    pub(crate) batch_sizes: Log2Histogram,
    /// Microseconds from the source reading a batch's first event to the
    /// consumer releasing the batch after committing it (recorded only
    /// where enabled: sink inputs).
    pub(crate) ingest_latency_us: Option<Log2Histogram>,
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
    /// Frontends, for a local-scope queue (this channel is then its BE).
    local: Option<Local>,
}

impl ChannelStats {
    /// The in-flight bound of this queue: the capacity, plus `N × (F + D)`
    /// for a local-scope queue's frontends.
    pub fn capacity(&self) -> usize {
        self.capacity + self.local.as_ref().map_or(0, Local::frontend_bound)
    }
    /// Highest occupancy seen, in events (local scope: the BE's peak plus
    /// each frontend's).
    pub fn max_occupancy(&self) -> usize {
        self.max_occupancy.load(Ordering::Relaxed)
            + self.local.as_ref().map_or(0, Local::frontend_max_queued)
    }
    /// Events accepted, on every path.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed) + self.local.as_ref().map_or(0, Local::frontend_admitted)
    }
    /// Events handed to consumers, on every path.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed) + self.local.as_ref().map_or(0, Local::frontend_taken)
    }
    /// Events per dequeue, frontends included.
    pub fn batch_size_snapshot(&self) -> HistogramSnapshot {
        let mut all = self.batch_sizes.snapshot();
        for fe in self.local.iter().flat_map(|l| l.frontends.iter()) {
            all.merge(&fe.cons.0.batch_sizes.snapshot());
        }
        all
    }
    /// Ingest-to-dequeue latency, frontends included (where recorded).
    pub fn ingest_latency_snapshot(&self) -> Option<HistogramSnapshot> {
        let mut all = self.ingest_latency_us.as_ref()?.snapshot();
        for fe in self.local.iter().flat_map(|l| l.frontends.iter()) {
            if let Some(h) = &fe.cons.0.ingest_latency_us {
                all.merge(&h.snapshot());
            }
        }
        Some(all)
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
    /// For a local-scope queue: a BE sender that does not keep it open,
    /// for helpers putting back the part of a batch they do not borrow.
    backend: Option<async_channel::WeakSender<Vec<Event>>>,
    /// `type: disk` or `disk-assisted`: the log behind (or instead of)
    /// the memory queue.
    durable: Option<Durable>,
    /// A disk-assisted queue's memory, readable by the engine at a forced
    /// stop (to save its backlog); never used to receive otherwise.
    backlog: Option<async_channel::Receiver<Vec<Event>>>,
    /// Told of every batch queued and of every sender gone, once a
    /// consumer asked ([`Receiver::watch_pushes`]).
    pushed: Notify,
    watched: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// Events in the (back-end) queue or its consumers' hands.
    fn occupancy(&self) -> usize {
        self.stats
            .capacity
            .saturating_sub(self.permits.available_permits())
    }

    fn local(&self) -> Option<&Local> {
        self.stats.local.as_ref()
    }

    /// Whether this channel's memory queue takes events at all (a `disk`
    /// queue's does not).
    fn uses_memory(&self) -> bool {
        self.durable.as_ref().is_none_or(Durable::is_assisted)
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

/// A local-scope queue: `capacity` and `max_batch` describe its backend;
/// `config` its frontends. The receiver returned reads the backend (clone
/// it for each BE worker); [`Receiver::frontend`] gives each frontend's
/// consumer.
pub fn local_channel(
    capacity: usize,
    max_batch: usize,
    config: LocalConfig,
    latency: bool,
) -> (Sender, Receiver) {
    make_channel_with(capacity, max_batch, latency, Some(config))
}

/// A queue with a durable store (see [`crate::durable`]): `capacity` is
/// the memory part of a disk-assisted queue (a `disk` queue keeps no
/// events in memory but the batches in its consumers' hands).
pub fn durable_channel(
    capacity: usize,
    max_batch: usize,
    latency: bool,
    local: Option<LocalConfig>,
    durable: Durable,
) -> (Sender, Receiver) {
    make_channel_full(capacity, max_batch, latency, local, Some(durable))
}

fn make_channel(capacity: usize, max_batch: usize, latency: bool) -> (Sender, Receiver) {
    make_channel_with(capacity, max_batch, latency, None)
}

fn make_channel_with(
    capacity: usize,
    max_batch: usize,
    latency: bool,
    local: Option<LocalConfig>,
) -> (Sender, Receiver) {
    make_channel_full(capacity, max_batch, latency, local, None)
}

fn make_channel_full(
    capacity: usize,
    max_batch: usize,
    latency: bool,
    local: Option<LocalConfig>,
    durable: Option<Durable>,
) -> (Sender, Receiver) {
    assert!(capacity >= 1, "channel capacity must be at least 1");
    assert!(max_batch >= 1, "max batch must be at least 1");
    assert!(capacity <= u32::MAX as usize, "channel capacity too large");
    let (tx, rx) = async_channel::unbounded();
    let max_batch = max_batch.min(capacity);
    let backend = local.is_some().then(|| tx.downgrade());
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
            local: local.map(|config| Local::new(config, max_batch, latency)),
        },
        max_batch,
        receivers: AtomicUsize::new(1),
        backend,
        backlog: durable
            .as_ref()
            .filter(|d| d.is_assisted() && d.save_on_shutdown)
            .map(|_| rx.clone()),
        durable,
        pushed: Notify::new(),
        watched: false.into(),
    });
    let end = if shared.durable.is_some() {
        End::Log(LogEnd::default())
    } else {
        End::Queue
    };
    (
        Sender {
            tx: Some(tx),
            shared: shared.clone(),
        },
        Receiver {
            rx,
            shared,
            interrupt: None,
            seen: 0,
            end,
        },
    )
}

/// Sending half; clone it for fan-in.
pub struct Sender {
    /// Taken at drop, so that watchers hear of it after the channel may
    /// have closed; always present before.
    tx: Option<async_channel::Sender<Vec<Event>>>,
    shared: Arc<Shared>,
}

impl Clone for Sender {
    fn clone(&self) -> Self {
        if let Some(local) = self.shared.local() {
            local.senders.fetch_add(1, Ordering::Relaxed);
        }
        Sender {
            tx: self.tx.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if let Some(local) = self.shared.local()
            && local.senders.fetch_sub(1, Ordering::AcqRel) == 1
        {
            local.close();
        }
        drop(self.tx.take());
        if self.shared.watched.load(Ordering::Acquire) {
            // Perhaps the last: the channel may have closed.
            self.shared.pushed.notify_waiters();
        }
    }
}

impl Sender {
    /// Sends a batch, waiting while the channel is full. A batch larger than
    /// the capacity is sent in capacity-sized pieces, in order. (To a
    /// local-scope queue this goes to the backend: producers that want a
    /// frontend use [`Sender::register`] and [`Sender::try_frontend`].)
    pub async fn send(&self, batch: Vec<Event>) -> Result<(), SendError> {
        if let Some(local) = self.shared.local() {
            local.count_overflow(Overflow::Direct, batch.len());
        }
        self.send_backend(batch).await
    }

    async fn send_backend(&self, mut batch: Vec<Event>) -> Result<(), SendError> {
        if self.shared.durable.is_some() {
            return self.send_durable(batch).await;
        }
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
            ) = self.tx().try_send(chunk)
            {
                return Err(SendError(rejoin(chunk, batch)));
            }
            self.shared
                .stats
                .sent
                .fetch_add(n as u64, Ordering::Relaxed);
            self.tell_watchers();
            if let Some(local) = self.shared.local() {
                local.wake_helper();
            }
        }
        Ok(())
    }

    fn tx(&self) -> &async_channel::Sender<Vec<Event>> {
        self.tx.as_ref().expect("taken only at drop")
    }

    fn tell_watchers(&self) {
        if self.shared.watched.load(Ordering::Acquire) {
            self.shared.pushed.notify_one();
        }
    }

    /// Sends without waiting, or gives the batch back when it does not fit now.
    pub fn try_send(&self, batch: Vec<Event>) -> Result<(), TrySendError> {
        let n = batch.len();
        if n == 0 {
            return Ok(());
        }
        if n > self.shared.max_batch || !self.shared.uses_memory() {
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
        self.tx()
            .try_send(batch)
            .map_err(|e| TrySendError::Closed(e.into_inner()))?;
        self.shared
            .stats
            .sent
            .fetch_add(n as u64, Ordering::Relaxed);
        self.tell_watchers();
        if let Some(local) = self.shared.local() {
            local.count_overflow(Overflow::Direct, n);
            local.wake_helper();
        }
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
            tx: self.tx().downgrade(),
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
        if let Some(local) = self.shared.local() {
            // Count the new sender only while the queue is open.
            let mut n = local.senders.load(Ordering::Acquire);
            loop {
                if n == 0 {
                    return None;
                }
                match local
                    .senders
                    .compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => break,
                    Err(now) => n = now,
                }
            }
        }
        let shared = self.shared.clone();
        match self.tx.upgrade() {
            Some(tx) => Some(Sender {
                tx: Some(tx),
                shared,
            }),
            None => {
                if let Some(local) = shared.local()
                    && local.senders.fetch_sub(1, Ordering::AcqRel) == 1
                {
                    local.close();
                }
                None
            }
        }
    }
}

/// See [`Receiver::push_signal`].
pub struct PushSignal(Arc<Shared>);

impl PushSignal {
    /// Resolves when a batch is queued (or a sender goes) after the
    /// returned future was enabled.
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.0.pushed.notified()
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
    /// Events queued or in the consumers' hands right now (local scope:
    /// backend and frontends).
    pub fn occupancy(&self) -> usize {
        self.0.occupancy()
            + self
                .0
                .local()
                .map_or(0, |l| l.frontend_outstanding() as usize)
    }
    pub fn stats(&self) -> &ChannelStats {
        &self.0.stats
    }
    /// A local-scope queue's counters.
    pub fn local(&self) -> Option<LocalQueueSnapshot> {
        Some(self.0.local()?.snapshot(self.0.occupancy()))
    }
    /// A durable queue's counters.
    pub fn durable(&self) -> Option<crate::durable::DurableSnapshot> {
        Some(self.0.durable.as_ref()?.snapshot())
    }

    /// A forced stop: writes what waits in a disk-assisted queue's memory
    /// (with `save_on_shutdown`) to its log, so the next start delivers it.
    /// Batches already in consumers' hands are not included. Returns the
    /// number of events saved.
    pub async fn save_backlog(&self) -> u64 {
        let (Some(durable), Some(backlog)) = (&self.0.durable, &self.0.backlog) else {
            return 0;
        };
        let mut saved = 0;
        while let Ok(mut batch) = backlog.try_recv() {
            let n = batch.len();
            if let Err(e) = durable.append(&mut batch).await {
                tracing::error!("saving the queue backlog: {e}");
                break;
            }
            self.0.permits.add_permits(n);
            saved += n as u64;
        }
        durable.stats.saved.fetch_add(saved, Ordering::Relaxed);
        saved
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
/// each batch goes to exactly one of them. For a local-scope queue, clones
/// read the backend and [`Receiver::frontend`] gives each frontend's
/// consumer.
pub struct Receiver {
    rx: async_channel::Receiver<Vec<Event>>,
    shared: Arc<Shared>,
    interrupt: Option<Arc<Interrupt>>,
    /// The interrupt generation this receiver last resumed at.
    seen: u64,
    end: End,
}

/// Where one consumer reads.
enum End {
    /// The shared memory queue: a global queue, or a local-scope queue's
    /// backend.
    Queue,
    /// One frontend ring of a local-scope queue (helping the backend
    /// when idle).
    Frontend(FrontendEnd),
    /// A durable queue: its log, and a disk-assisted queue's memory.
    Log(LogEnd),
}

/// Where a batch came from, so that finishing it settles the right account.
#[derive(Clone, Copy)]
enum Origin {
    Backend,
    /// Borrowed from the BE by the consumer of this frontend: settled
    /// against the BE, counted as help.
    Borrowed(usize),
    Frontend(usize),
    /// Read from a durable queue's log: acknowledged when released.
    Disk,
}

/// Keeps the wait counters of a receiver that is waiting; settled on
/// every exit, including when the future is dropped.
struct WaitGuard(Arc<Shared>, u64);

impl WaitGuard {
    fn start(shared: &Arc<Shared>) -> WaitGuard {
        let started = since_epoch_ns();
        let stats = &shared.stats;
        stats
            .waiting_since_sum
            .fetch_add(started, Ordering::Relaxed);
        stats.waiters.fetch_add(1, Ordering::Relaxed);
        WaitGuard(shared.clone(), started)
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        let (stats, started) = (&self.0.stats, self.1);
        stats.waiters.fetch_sub(1, Ordering::Relaxed);
        stats
            .waiting_since_sum
            .fetch_sub(started, Ordering::Relaxed);
        stats
            .wait_ns
            .fetch_add(since_epoch_ns().saturating_sub(started), Ordering::Relaxed);
    }
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
        // A stage whose input is never empty would otherwise never give its
        // thread back: every `recv` spends from the task's cooperative
        // budget, and an exhausted budget yields once.
        tokio::task::consume_budget().await;
        match &self.end {
            End::Frontend(_) => self.recv_frontend().await,
            End::Log(_) => self.recv_log().await,
            End::Queue => {
                if let Ok(events) = self.rx.try_recv() {
                    return Some(self.accept(events, Origin::Backend));
                }
                let _wait = WaitGuard::start(&self.shared);
                self.recv_waiting().await
            }
        }
    }

    async fn recv_waiting(&mut self) -> Option<InputBatch> {
        let Some(interrupt) = self.interrupt.clone() else {
            let events = self.rx.recv().await.ok()?;
            return Some(self.accept(events, Origin::Backend));
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
                events = self.rx.recv() => return Some(self.accept(events.ok()?, Origin::Backend)),
            }
        }
    }

    /// From now on every batch queued, and every sender gone, tells the
    /// waiters of [`pushed`](Self::pushed): for consumers that must take
    /// a batch and do something else in one step, and so wait for one
    /// without taking it. Costs the senders one check per batch.
    pub fn watch_pushes(&self) {
        self.shared.watched.store(true, Ordering::Release);
    }

    /// What tells of batches queued (see [`watch_pushes`](Self::watch_pushes)).
    pub fn push_signal(&self) -> PushSignal {
        PushSignal(self.shared.clone())
    }

    /// Every sender is gone and nothing is left to take.
    pub fn is_ended(&self) -> bool {
        self.rx.is_closed() && self.rx.is_empty()
    }

    /// The next batch if one is queued now.
    pub fn try_recv(&mut self) -> Option<InputBatch> {
        if self.is_interrupted() {
            return None;
        }
        match &self.end {
            End::Frontend(_) => self.try_recv_frontend(),
            End::Log(_) => self.try_recv_log(),
            End::Queue => {
                let events = self.rx.try_recv().ok()?;
                Some(self.accept(events, Origin::Backend))
            }
        }
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

    fn accept(&self, events: Vec<Event>, origin: Origin) -> InputBatch {
        let stats = &self.shared.stats;
        self.counted(
            events,
            origin,
            &stats.received,
            &stats.batch_sizes,
            stats.ingest_latency_us.as_ref(),
        )
    }

    /// Counts `events` as taken on the given counters and wraps them.
    fn counted(
        &self,
        events: Vec<Event>,
        origin: Origin,
        taken: &AtomicU64,
        batch_sizes: &Log2Histogram,
        ingest_latency_us: Option<&Log2Histogram>,
    ) -> InputBatch {
        taken.fetch_add(events.len() as u64, Ordering::Relaxed);
        batch_sizes.record(events.len() as u64);
        let ingest_ns = ingest_latency_us
            .and(events.first())
            .map(|e| e.meta().ingest_ns);
        InputBatch {
            count: events.len(),
            events,
            origin,
            ingest_ns,
            shared: self.shared.clone(),
            ack: None,
        }
    }

    pub fn handle(&self) -> ChannelHandle {
        ChannelHandle(self.shared.clone())
    }
}

impl Clone for Receiver {
    /// A clone reads the shared queue (the backend of a local queue) or,
    /// for a durable queue, the log.
    fn clone(&self) -> Self {
        self.shared.receivers.fetch_add(1, Ordering::AcqRel);
        let end = if self.shared.durable.is_some() {
            End::Log(LogEnd::default())
        } else {
            End::Queue
        };
        Receiver {
            rx: self.rx.clone(),
            shared: self.shared.clone(),
            interrupt: self.interrupt.clone(),
            seen: self.seen,
            end,
        }
    }
}

impl Drop for Receiver {
    /// A frontend consumer that goes away counts what is left in its ring as
    /// abandoned (its producer then overflows to the backend). The last
    /// receiver closes the channel: blocked senders get their events back,
    /// and whatever was still queued is counted as abandoned — in the
    /// backend and in any frontend whose consumer nobody took, whose
    /// producer would otherwise go on filling a ring no one reads.
    fn drop(&mut self) {
        match std::mem::replace(&mut self.end, End::Queue) {
            // Ending normally: what this consumer released is done.
            End::Log(end) => end.settle_held(),
            End::Frontend(fe) => fe.abandon(&self.shared),
            End::Queue => {}
        }
        if self.shared.receivers.fetch_sub(1, Ordering::AcqRel) > 1 {
            return;
        }
        if let Some(local) = self.shared.local() {
            for slot in 0..local.frontends.len() {
                if let Some(ring) = local.take_consumer(slot) {
                    frontend::FrontendEnd::new(slot, ring).abandon(&self.shared);
                }
            }
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

/// A received batch. Its events stay counted against the queue until this
/// value is dropped; take the events with [`InputBatch::take`] and drop the
/// batch once they are forwarded or committed.
pub struct InputBatch {
    events: Vec<Event>,
    count: usize,
    origin: Origin,
    /// Where latency is recorded (sink inputs): the ingest time of the
    /// batch's first event, measured against the moment the batch is
    /// released, i.e. after the sink committed it.
    ingest_ns: Option<u64>,
    shared: Arc<Shared>,
    /// For a batch read from a durable queue's log: dropping it
    /// acknowledges the records.
    ack: Option<(logbus_diskq::AckToken, HeldAcks)>,
}

impl InputBatch {
    /// The consumer failed before finishing this batch: a batch read from
    /// a durable queue's log is left there, unacknowledged, for the next
    /// start (returns `true`); any other batch is simply released.
    pub fn return_to_store(mut self) -> bool {
        match self.ack.take() {
            Some((ack, _)) => {
                ack.keep();
                if let Some(d) = &self.shared.durable {
                    d.stats
                        .returned
                        .fetch_add(self.count as u64, Ordering::Relaxed);
                }
                true
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub fn events(&self) -> &[Event] {
        &self.events
    }
    /// The events, to settle some of them one by one.
    pub fn events_mut(&mut self) -> &mut [Event] {
        &mut self.events
    }
    /// Tells the sources of the events still in this batch what happened
    /// to them (a sink calls it with `Delivered` once the destination
    /// confirmed; see [`logbus_event::ack`]). Events already settled keep
    /// their first outcome.
    pub fn settle(&mut self, outcome: logbus_event::Outcome) {
        Event::settle_all(self.events.iter_mut(), outcome);
    }
    /// Moves the events out; they stay counted until `self` is dropped.
    pub fn take(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }
    /// Whether a frontend consumer borrowed this batch from the backend.
    pub fn is_borrowed(&self) -> bool {
        matches!(self.origin, Origin::Borrowed(_))
    }
    /// Whether this batch came from a frontend ring.
    pub fn is_from_frontend(&self) -> bool {
        matches!(self.origin, Origin::Frontend(_))
    }
}

impl Drop for InputBatch {
    fn drop(&mut self) {
        if let Some((ack, held)) = self.ack.take() {
            held.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((ack, self.count as u64));
        }
        let n = self.count;
        if let Some(ingest) = self.ingest_ns {
            let micros = logbus_event::now_ns().saturating_sub(ingest) / 1000;
            let histogram = match (self.origin, self.shared.local()) {
                (Origin::Frontend(slot), Some(local)) => {
                    local.frontends[slot].cons.0.ingest_latency_us.as_ref()
                }
                _ => self.shared.stats.ingest_latency_us.as_ref(),
            };
            if let Some(h) = histogram {
                h.record(micros);
            }
        }
        match self.origin {
            Origin::Backend => self.shared.permits.add_permits(n),
            Origin::Borrowed(slot) => {
                self.shared.permits.add_permits(n);
                if let Some(local) = self.shared.local() {
                    local.frontends[slot]
                        .cons
                        .0
                        .help_completed
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
            }
            Origin::Disk => {}
            Origin::Frontend(slot) => {
                if let Some(local) = self.shared.local() {
                    local.frontends[slot]
                        .cons
                        .0
                        .retired
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
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
            .map(|i| Event::raw(i.to_string(), Meta::at("t", 0)))
            .collect()
    }

    /// A watcher hears of every batch queued (by `send` and `try_send`) and
    /// of the last sender going, each only after it enabled its wait; a
    /// channel nobody watches tells nobody.
    #[tokio::test]
    async fn watchers_hear_of_pushes_and_of_the_end() {
        let (tx, mut rx) = channel(8);
        let signal = rx.push_signal();
        let mut unwatched = Box::pin(signal.notified());
        unwatched.as_mut().enable();
        tx.try_send(events(1)).unwrap();
        assert!(futures::poll!(unwatched.as_mut()).is_pending());
        // (Still waiting, it would take the next signal.)
        drop(unwatched);
        rx.watch_pushes();
        for via_send in [true, false] {
            let pushed = signal.notified();
            tokio::pin!(pushed);
            pushed.as_mut().enable();
            assert!(futures::poll!(pushed.as_mut()).is_pending());
            if via_send {
                tx.send(events(2)).await.unwrap();
            } else {
                tx.try_send(events(2)).unwrap();
            }
            assert!(futures::poll!(pushed.as_mut()).is_ready());
        }
        let other = tx.clone();
        let ended = signal.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        drop(other);
        assert!(futures::poll!(ended.as_mut()).is_ready());
        let ended = signal.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        drop(tx);
        assert!(futures::poll!(ended.as_mut()).is_ready());
        // Closed, but not ended while batches are left.
        assert!(!rx.is_ended());
        for _ in 0..3 {
            drop(rx.try_recv().unwrap());
        }
        assert!(rx.is_ended());
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

    /// A consumer that always finds input must still let the other tasks of
    /// its thread run: a task woken onto its thread's next-task slot cannot be
    /// taken by another thread, and waits there as long as the consumer runs
    /// (an API connection waited over a minute behind a busy sink).
    #[tokio::test]
    async fn a_consumer_that_always_finds_input_lets_other_tasks_run() {
        const BATCHES: usize = 1000;
        let (tx, mut rx) = channel(BATCHES);
        for _ in 0..BATCHES {
            tx.try_send(events(1)).unwrap();
        }
        let taken = Arc::new(AtomicUsize::new(0));
        let seen_by_other = {
            let taken = taken.clone();
            tokio::spawn(async move { taken.load(Ordering::SeqCst) })
        };
        for _ in 0..BATCHES {
            drop(rx.recv().await.unwrap());
            taken.fetch_add(1, Ordering::SeqCst);
        }
        let seen = seen_by_other.await.unwrap();
        // One thread: the other task ran only if a `recv` gave way.
        assert!(
            seen < BATCHES,
            "the other task waited for all {seen} batches"
        );
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
    async fn an_interruptible_receiver_waits_for_input_like_any_other() {
        let (tx, mut rx) = channel(8);
        let _interrupt = rx.interruptible();
        let mut recv = Box::pin(rx.recv());
        assert!(futures_poll_once(&mut recv).is_none(), "nothing sent yet");
        tx.send(events(2)).await.unwrap();
        let batch = futures_poll_once(&mut recv)
            .expect("woken")
            .expect("a batch");
        assert_eq!(batch.len(), 2);
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
    async fn sink_latency_is_recorded_when_the_batch_is_released() {
        let (tx, mut rx) = channel_with_latency(8, 8);
        let old = logbus_event::now_ns().saturating_sub(5_000_000);
        let event = Event::raw("x", Meta::at("t", old));
        tx.send(vec![event]).await.unwrap();
        let batch = rx.recv().await.unwrap();
        let stats = rx.handle();
        let count = |h: &ChannelHandle| h.stats().ingest_latency_snapshot().unwrap().count;
        assert_eq!(count(&stats), 0, "taking the batch is not committing it");
        drop(batch);
        let snap = stats.stats().ingest_latency_snapshot().unwrap();
        assert_eq!(snap.count, 1);
        assert!(
            snap.sum >= 5_000,
            "at least the 5 ms the event waited: {snap:?}"
        );
    }

    #[tokio::test]
    async fn try_send_takes_nothing_for_nothing_and_refuses_more_than_a_dequeue() {
        let (tx, mut rx) = channel_with_batch(10, 3);
        tx.try_send(Vec::new()).unwrap();
        assert_eq!(tx.stats().stats().sent(), 0);
        assert!(rx.try_recv().is_none(), "an empty batch is not queued");
        // Room for ten, but a try_send is one dequeue at most.
        assert!(matches!(tx.try_send(events(4)), Err(TrySendError::Full(b)) if b.len() == 4));
        tx.try_send(events(3)).unwrap();
        assert_eq!(tx.stats().stats().sent(), 3);
        assert_eq!(tx.stats().stats().max_occupancy(), 3);
        drop(rx);
        assert!(matches!(tx.try_send(events(1)), Err(TrySendError::Closed(b)) if b.len() == 1));
    }

    #[tokio::test]
    async fn a_dequeue_is_at_most_the_capacity_even_when_max_batch_is_larger() {
        let (tx, mut rx) = channel_with_batch(3, 10);
        let sender = tokio::spawn(async move { tx.send(events(5)).await });
        let first = rx.recv().await.unwrap().len();
        let second = rx.recv().await.unwrap().len();
        sender.await.unwrap().unwrap();
        assert_eq!((first, second), (3, 2));
    }

    #[test]
    #[should_panic(expected = "channel capacity must be at least 1")]
    fn a_channel_of_no_capacity_is_refused() {
        let _ = channel(0);
    }

    #[test]
    #[should_panic(expected = "max batch must be at least 1")]
    fn a_dequeue_of_nothing_is_refused() {
        let _ = channel_with_batch(4, 0);
    }

    #[tokio::test]
    async fn counters_sent_received_and_what_the_last_receiver_abandoned() {
        let (tx, mut rx) = channel_with_batch(10, 2);
        tx.send(events(5)).await.unwrap();
        let handle = rx.handle();
        assert_eq!(handle.occupancy(), 5);
        let batch = rx.recv().await.unwrap();
        assert_eq!(handle.stats().received(), 2);
        assert_eq!(handle.stats().capacity(), 10);
        assert!(handle.local().is_none() && handle.durable().is_none());
        let clone = rx.clone();
        drop(rx);
        assert_eq!(handle.stats().abandoned(), 0, "a clone still reads");
        drop(clone);
        assert_eq!(handle.stats().abandoned(), 3);
        assert_eq!(handle.stats().sent(), 5);
        // The batch in hand still counts until it is released.
        assert_eq!(handle.occupancy(), 5);
        drop(batch);
        assert_eq!(handle.occupancy(), 3);
        assert_eq!(handle.save_backlog().await, 0, "not a durable queue");
    }

    #[tokio::test]
    async fn a_wait_in_progress_counts_and_a_finished_one_stays_counted() {
        let (tx, mut rx) = channel(4);
        let handle = rx.handle();
        assert_eq!(handle.stats().wait_seconds(), 0.0);
        let started = std::time::Instant::now();
        {
            let mut recv = Box::pin(rx.recv());
            assert!(futures_poll_once(&mut recv).is_none());
            std::thread::sleep(std::time::Duration::from_millis(5));
            // Still waiting: counted up to now.
            assert!(handle.stats().wait_seconds() >= 0.005);
        }
        // Given up: the wait is settled, and no longer grows.
        let settled = handle.stats().wait_seconds();
        assert!(settled >= 0.005);
        // In seconds: no more than the time that passed.
        assert!(settled <= started.elapsed().as_secs_f64(), "{settled}");
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(handle.stats().wait_seconds(), settled);
        // A ready batch is taken without waiting.
        tx.send(events(1)).await.unwrap();
        assert!(rx.recv().await.is_some());
        assert_eq!(handle.stats().wait_seconds(), settled);
    }

    fn futures_poll_once<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    struct Heard(std::sync::Mutex<Vec<logbus_event::Outcome>>);

    impl logbus_event::AckReceiver for Heard {
        fn finished(&self, _token: u64, outcome: logbus_event::Outcome) {
            self.0.lock().unwrap().push(outcome);
        }
    }

    #[tokio::test]
    async fn a_batch_settles_its_events_and_a_memory_batch_has_no_store_to_return_to() {
        let heard = Arc::new(Heard(Default::default()));
        let (tx, mut rx) = channel(4);
        let ack = logbus_event::BatchAck::new(heard.clone(), 7);
        let batch: Vec<Event> = events(2)
            .into_iter()
            .map(|e| e.with_ack(ack.handle()))
            .collect();
        drop(ack);
        tx.send(batch).await.unwrap();
        let mut batch = rx.recv().await.unwrap();
        assert!(!batch.is_empty());
        assert_eq!(batch.events().len(), 2);
        assert_eq!(batch.events_mut().len(), 2);
        batch.settle(logbus_event::Outcome::Rejected);
        drop(batch.take());
        assert_eq!(
            *heard.0.lock().unwrap(),
            vec![logbus_event::Outcome::Rejected]
        );
        assert_eq!(batch.len(), 2, "taken events still count");
        assert!(!batch.return_to_store());
        assert_eq!(rx.handle().occupancy(), 0);
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
