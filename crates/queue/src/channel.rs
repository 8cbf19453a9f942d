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

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use logbus_ring::spsc;
use tokio::sync::{Notify, Semaphore};

use crate::durable::Durable;
use crate::histogram::{HistogramSnapshot, Log2Histogram};
use crate::local::{Local, LocalConfig, LocalQueueSnapshot, Overflow};
use logbus_event::Event;

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
    });
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
            frontend: None,
            disk_turn: false,
            held: HeldAcks::default(),
        },
    )
}

/// Sending half; clone it for fan-in.
pub struct Sender {
    tx: async_channel::Sender<Vec<Event>>,
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
    }
}

/// A producer's standing with one local-scope queue: its frontend, or the
/// knowledge that every slot was taken. Kept by the producer (an
/// [`Output`](crate::Output)) for as long as it sends to that queue.
pub struct Registration {
    channel: Weak<Shared>,
    frontend: Option<(usize, spsc::Producer<Event>)>,
}

impl Registration {
    /// Whether this registration is with `sender`'s queue.
    pub fn is_for(&self, sender: &Sender) -> bool {
        std::ptr::eq(self.channel.as_ptr(), Arc::as_ptr(&sender.shared))
    }

    /// The frontend slot, if the producer got one.
    pub fn slot(&self) -> Option<usize> {
        self.frontend.as_ref().map(|(slot, _)| *slot)
    }
}

impl Drop for Registration {
    /// The producer exits: its consumer is told, finishes the ring and
    /// stays on as a helper (the slot is not recycled).
    fn drop(&mut self) {
        if let Some((slot, producer)) = self.frontend.take() {
            drop(producer);
            if let Some(shared) = self.channel.upgrade()
                && let Some(local) = shared.local()
            {
                local.frontends[slot].signal.notify_one();
            }
        }
    }
}

impl Sender {
    /// Whether this is a local-scope queue, where producers register.
    pub fn is_local(&self) -> bool {
        self.shared.local().is_some()
    }

    /// Registers the calling producer with this local-scope queue: it gets
    /// a frontend if a slot is free (slots are never recycled).
    pub fn register(&self) -> Registration {
        Registration {
            channel: Arc::downgrade(&self.shared),
            frontend: self.shared.local().and_then(Local::register),
        }
    }

    /// The admission predicate: publishes the whole batch to the producer's
    /// frontend if it fits now, or gives it back with the reason it must go
    /// to the backend (see [`Sender::send_overflow`]).
    pub fn try_frontend(
        &self,
        registration: &mut Registration,
        mut batch: Vec<Event>,
    ) -> Result<(), (Vec<Event>, Overflow)> {
        let Some(local) = self.shared.local() else {
            return Err((batch, Overflow::Direct));
        };
        let Some((slot, ring)) = registration.frontend.as_mut() else {
            return Err((batch, Overflow::Exhausted));
        };
        let frontend = &local.frontends[*slot];
        let counters = &frontend.prod.0;
        let n = batch.len();
        if ring.is_consumer_gone() {
            return Err((batch, Overflow::Shutdown));
        }
        if n > ring.capacity() {
            counters.overflowed.fetch_add(n as u64, Ordering::Relaxed);
            return Err((batch, Overflow::Oversized));
        }
        if !ring.push_all(&mut batch) {
            counters.overflowed.fetch_add(n as u64, Ordering::Relaxed);
            return Err((batch, Overflow::NoFit));
        }
        counters.admitted.fetch_add(n as u64, Ordering::Relaxed);
        counters.admitted_batches.fetch_add(1, Ordering::Relaxed);
        let queued = ring.len();
        if queued > counters.max_queued.load(Ordering::Relaxed) {
            counters.max_queued.store(queued, Ordering::Relaxed);
        }
        frontend.signal.notify_one();
        Ok(())
    }

    /// Sends to a local-scope queue's backend, counting why.
    pub async fn send_overflow(
        &self,
        batch: Vec<Event>,
        reason: Overflow,
    ) -> Result<(), SendError> {
        if let Some(local) = self.shared.local() {
            local.count_overflow(reason, batch.len());
        }
        self.send_backend(batch).await
    }

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
            ) = self.tx.try_send(chunk)
            {
                return Err(SendError(rejoin(chunk, batch)));
            }
            self.shared
                .stats
                .sent
                .fetch_add(n as u64, Ordering::Relaxed);
            if let Some(local) = self.shared.local() {
                local.wake_helper();
            }
        }
        Ok(())
    }

    /// A durable queue: memory while a disk-assisted queue admits the
    /// batch, the log otherwise. Returns once the batch is stored.
    async fn send_durable(&self, mut batch: Vec<Event>) -> Result<(), SendError> {
        let durable = self.shared.durable.as_ref().expect("a durable channel");
        while !batch.is_empty() {
            let n = batch.len().min(self.shared.max_batch);
            if !durable.memory_admits(self.shared.occupancy(), n) {
                break;
            }
            let Ok(permit) = self.shared.permits.try_acquire_many(n as u32) else {
                break;
            };
            permit.forget();
            let rest = batch.split_off(n);
            let chunk = std::mem::replace(&mut batch, rest);
            self.shared
                .stats
                .max_occupancy
                .fetch_max(self.shared.occupancy(), Ordering::Relaxed);
            if let Err(e) = self.tx.try_send(chunk) {
                self.shared.permits.add_permits(n);
                return Err(SendError(rejoin(e.into_inner(), batch)));
            }
            self.shared
                .stats
                .sent
                .fetch_add(n as u64, Ordering::Relaxed);
            if let Some(local) = self.shared.local() {
                local.wake_helper();
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        if self.tx.is_closed() {
            return Err(SendError(batch));
        }
        let mut batch = batch;
        match durable.append(&mut batch).await {
            Ok(()) => {
                self.shared
                    .stats
                    .sent
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                tracing::error!("{e}");
                Err(SendError(batch))
            }
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
        self.tx
            .try_send(batch)
            .map_err(|e| TrySendError::Closed(e.into_inner()))?;
        self.shared
            .stats
            .sent
            .fetch_add(n as u64, Ordering::Relaxed);
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
            Some(tx) => Some(Sender { tx, shared }),
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
    /// Set for a frontend's consumer: its slot and its end of the ring.
    frontend: Option<FrontendEnd>,
    /// A disk-assisted queue's consumer alternates memory and log.
    disk_turn: bool,
    /// Acknowledgements of log batches this consumer released, settled at
    /// its next `recv` (or when it ends normally): a consumer that fails
    /// before asking again returns them to the log instead.
    held: HeldAcks,
}

/// Released log batches: their acknowledgement and event count.
type HeldAcks = Arc<std::sync::Mutex<Vec<(logbus_diskq::AckToken, u64)>>>;

fn take_held(held: &HeldAcks) -> Vec<(logbus_diskq::AckToken, u64)> {
    std::mem::take(&mut *held.lock().unwrap_or_else(|e| e.into_inner()))
}

struct FrontendEnd {
    slot: usize,
    ring: spsc::Consumer<Event>,
    /// Woken by a producer for BE work: if local work is found instead,
    /// the wake-up is passed on (see `logbus_ring::idle`).
    picked: bool,
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
        if self.frontend.is_some() {
            return self.recv_frontend().await;
        }
        if self.shared.durable.is_some() {
            drop(take_held(&self.held));
            return self.recv_durable().await;
        }
        if let Ok(events) = self.rx.try_recv() {
            return Some(self.accept(events, Origin::Backend));
        }
        let _wait = WaitGuard::start(&self.shared);
        self.recv_waiting().await
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

    /// A frontend consumer's loop: its own ring first, then (when helping
    /// is on) a borrowed BE batch, then sleep until its producer, a BE
    /// producer, the end of the stream or an interrupt wakes it.
    async fn recv_frontend(&mut self) -> Option<InputBatch> {
        let shared = self.shared.clone();
        let local = shared.local().expect("a frontend belongs to a local queue");
        let helping = local.config.helper_batch > 0;
        let mut wait = None;
        loop {
            if self.is_interrupted() {
                return None;
            }
            let fe = self.frontend.as_mut().expect("frontend receiver");
            let frontend = &local.frontends[fe.slot];
            if !fe.ring.is_empty() {
                self.wait_for_min_batch(local).await;
                let fe = self.frontend.as_mut().expect("frontend receiver");
                let mut events = Vec::new();
                fe.ring.pop_into(local.frontend_dequeue(), &mut events);
                if std::mem::take(&mut fe.picked) && !self.rx.is_empty() {
                    // Picked for BE work but turning to local work: pass
                    // the wake-up on so BE work is not left unattended.
                    local.wake_helper();
                }
                return Some(self.accept_frontend(events));
            }
            if helping {
                let counters = &frontend.cons.0;
                counters.help_attempts.fetch_add(1, Ordering::Relaxed);
                if let Some(batch) = self.borrow(local) {
                    return Some(batch);
                }
                counters.help_empty.fetch_add(1, Ordering::Relaxed);
            }
            let fe = self.frontend.as_mut().expect("frontend receiver");
            let frontend = &local.frontends[fe.slot];
            if local.closed.load(Ordering::SeqCst)
                && fe.ring.is_empty()
                && (!helping || self.rx.is_empty())
            {
                return None;
            }
            // Going to sleep: register for the wake-up, announce, re-check.
            let notified = frontend.signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if helping {
                local.idle.announce(fe.slot);
            }
            let work = !fe.ring.is_empty()
                || (helping && !self.rx.is_empty())
                || local.closed.load(Ordering::SeqCst);
            if work {
                // A producer may have picked this helper between the
                // announce and the re-check: that wake-up is ours to pass
                // on if we turn to local work (found by the loom model).
                if helping && !local.idle.withdraw(fe.slot) {
                    fe.picked = true;
                }
                continue;
            }
            if wait.is_none() {
                wait = Some(WaitGuard::start(&shared));
            }
            match self.interrupt.clone() {
                Some(interrupt) => {
                    let raised = interrupt.notify.notified();
                    tokio::pin!(raised);
                    raised.as_mut().enable();
                    if !self.is_interrupted() {
                        tokio::select! {
                            _ = &mut notified => {}
                            _ = &mut raised => {}
                        }
                    }
                }
                None => notified.await,
            }
            let fe = self.frontend.as_mut().expect("frontend receiver");
            if helping && !local.idle.withdraw(fe.slot) {
                fe.picked = true;
            }
        }
    }

    /// A durable queue's consumer: memory and log in turn (a `disk` queue
    /// has only the log), until every sender is gone and both are empty.
    async fn recv_durable(&mut self) -> Option<InputBatch> {
        let shared = self.shared.clone();
        let durable = shared.durable.as_ref().expect("a durable channel");
        let mut wait = None;
        let interrupt = self.interrupt.clone();
        loop {
            // Register for every wake-up before looking, so none is missed.
            let mut raised = interrupt.as_ref().map(|i| Box::pin(i.notify.notified()));
            if let Some(r) = raised.as_mut() {
                r.as_mut().enable();
            }
            if self.is_interrupted() {
                return None;
            }
            let readable = durable.queue.readable();
            tokio::pin!(readable);
            readable.as_mut().enable();
            self.disk_turn = !self.disk_turn;
            let disk_first = self.disk_turn || !durable.is_assisted();
            if !disk_first && let Ok(events) = self.rx.try_recv() {
                return Some(self.accept(events, Origin::Backend));
            }
            let read_failed = match self.read_log(durable) {
                Ok(Some(batch)) => return Some(batch),
                Ok(None) => false,
                Err(()) => true,
            };
            if let Ok(events) = self.rx.try_recv() {
                return Some(self.accept(events, Origin::Backend));
            }
            let senders_gone = self.rx.is_closed();
            if senders_gone {
                durable.queue.close();
                if !read_failed && durable.queue.is_drained() && self.rx.is_empty() {
                    return None;
                }
            }
            // A failed read is retried after a pause (the queue skips a
            // segment that keeps failing), not only when new data comes.
            let retry = async {
                if read_failed {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await
                } else {
                    std::future::pending().await
                }
            };
            if wait.is_none() {
                wait = Some(WaitGuard::start(&shared));
            }
            let interrupted = async {
                match raised.as_mut() {
                    Some(r) => r.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut readable => {}
                _ = interrupted => {}
                _ = retry => {}
                events = self.rx.recv(), if !senders_gone => {
                    if let Ok(events) = events {
                        return Some(self.accept(events, Origin::Backend));
                    }
                }
            }
        }
    }

    /// One batch from the log, if any is readable now; `Err` after a read
    /// error (logged).
    fn read_log(&mut self, durable: &Durable) -> Result<Option<InputBatch>, ()> {
        let max = self.shared.max_batch;
        loop {
            let read = crate::blocking(|| durable.queue.try_read(max));
            let batch = match read {
                Ok(Some(batch)) => batch,
                Ok(None) => return Ok(None),
                Err(e) => {
                    tracing::error!("{e}");
                    return Err(());
                }
            };
            let (data, ranges, ack) = batch.into_parts();
            let data = bytes::Bytes::from(data);
            let mut source = None;
            let mut events = Vec::with_capacity(ranges.len());
            for range in ranges {
                match crate::durable::decode_event(&data, range.clone(), &mut source) {
                    Ok(event) => events.push(event),
                    Err(why) => {
                        durable.stats.undecodable.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            queue = %durable.queue.config().dir.display(),
                            "skipping a queue record that is not an event: {why}"
                        );
                    }
                }
            }
            if events.is_empty() {
                continue;
            }
            let mut batch = self.accept(events, Origin::Disk);
            batch.ack = Some((ack, self.held.clone()));
            return Ok(Some(batch));
        }
    }

    /// `min_batch`: with fewer events queued, wait (bounded by the timeout)
    /// for the producer to add more.
    async fn wait_for_min_batch(&mut self, local: &Local) {
        let (min, timeout) = (
            local.config.min_batch.min(local.frontend_dequeue()),
            local.config.min_batch_timeout,
        );
        if min <= 1 || timeout.is_zero() {
            return;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let fe = self.frontend.as_mut().expect("frontend receiver");
        let frontend = &local.frontends[fe.slot];
        while fe.ring.len() < min && !fe.ring.is_producer_gone() {
            let notified = frontend.signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if fe.ring.len() >= min {
                break;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        // A wake-up consumed here may have been for BE work: look again.
        frontend.signal.notify_one();
    }

    /// Takes up to `helper_batch` events from the backend; the rest of a
    /// larger BE batch goes back (still counted against the BE).
    fn borrow(&mut self, local: &Local) -> Option<InputBatch> {
        let mut events = self.rx.try_recv().ok()?;
        let limit = local.config.helper_batch;
        if events.len() > limit {
            let rest = events.split_off(limit);
            let back = self.shared.backend.as_ref().and_then(|b| b.upgrade());
            match back {
                Some(tx) => {
                    if let Err(e) = tx.try_send(rest) {
                        events.extend(e.into_inner());
                    } else {
                        local.wake_helper();
                    }
                }
                // The queue is closing: finish the whole batch here.
                None => events.extend(rest),
            }
        }
        let slot = self.frontend.as_ref().expect("frontend receiver").slot;
        let counters = &local.frontends[slot].cons.0;
        counters.help_batches.fetch_add(1, Ordering::Relaxed);
        counters
            .help_taken
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        Some(self.accept(events, Origin::Borrowed(slot)))
    }

    /// The next batch if one is queued now.
    pub fn try_recv(&mut self) -> Option<InputBatch> {
        if self.is_interrupted() {
            return None;
        }
        if let Some(fe) = self.frontend.as_mut() {
            let local = self
                .shared
                .local()
                .expect("a frontend belongs to a local queue");
            let mut events = Vec::new();
            if fe.ring.pop_into(local.frontend_dequeue(), &mut events) > 0 {
                return Some(self.accept_frontend(events));
            }
            return None;
        }
        if let Some(durable) = self.shared.durable.as_ref() {
            let shared = self.shared.clone();
            drop(take_held(&self.held));
            if durable.is_assisted()
                && let Ok(events) = self.rx.try_recv()
            {
                return Some(self.accept(events, Origin::Backend));
            }
            return self
                .read_log(shared.durable.as_ref().expect("durable"))
                .ok()
                .flatten();
        }
        let events = self.rx.try_recv().ok()?;
        Some(self.accept(events, Origin::Backend))
    }

    /// The consumer of frontend `slot` of a local-scope queue; `None` if
    /// this is not a local queue, the slot does not exist or was taken.
    pub fn frontend(&self, slot: usize) -> Option<Receiver> {
        let ring = self.shared.local()?.take_consumer(slot)?;
        let mut consumer = self.clone();
        consumer.frontend = Some(FrontendEnd {
            slot,
            ring,
            picked: false,
        });
        Some(consumer)
    }

    /// Frontends of this queue (0 for a global queue).
    pub fn frontend_count(&self) -> usize {
        self.shared.local().map_or(0, |l| l.frontends.len())
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

    /// Frontend batches touch only the frontend's own counters.
    fn accept_frontend(&self, events: Vec<Event>) -> InputBatch {
        let slot = self.frontend.as_ref().expect("frontend receiver").slot;
        let local = self
            .shared
            .local()
            .expect("a frontend belongs to a local queue");
        let counters = &local.frontends[slot].cons.0;
        self.counted(
            events,
            Origin::Frontend(slot),
            &counters.taken,
            &counters.batch_sizes,
            counters.ingest_latency_us.as_ref(),
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

    /// The consumer failed: the log batches it released but whose
    /// acknowledgement is not settled yet (it may have failed while
    /// finishing them) go back to the log for the next start. Returns how
    /// many events that was.
    pub fn return_held(&mut self) -> u64 {
        let Some(durable) = &self.shared.durable else {
            return 0;
        };
        durable.queue.consumer_failed();
        let mut n = 0;
        for (ack, count) in take_held(&self.held) {
            ack.keep();
            n += count;
        }
        durable.stats.returned.fetch_add(n, Ordering::Relaxed);
        n
    }
}

impl Clone for Receiver {
    /// A clone reads the shared queue (the backend of a local queue).
    fn clone(&self) -> Self {
        self.shared.receivers.fetch_add(1, Ordering::AcqRel);
        Receiver {
            rx: self.rx.clone(),
            shared: self.shared.clone(),
            interrupt: self.interrupt.clone(),
            seen: self.seen,
            frontend: None,
            disk_turn: false,
            held: HeldAcks::default(),
        }
    }
}

impl Drop for Receiver {
    /// A frontend consumer that goes away counts what is left in its ring as
    /// abandoned (its producer then overflows to the backend). The last
    /// receiver closes the channel: blocked senders get their events back,
    /// and whatever was still queued is counted as abandoned.
    fn drop(&mut self) {
        // Ending normally: what this consumer released is done.
        drop(take_held(&self.held));
        if let Some(mut fe) = self.frontend.take() {
            let mut left = Vec::new();
            while fe.ring.pop_into(usize::MAX, &mut left) > 0 {}
            let n = left.len() as u64;
            if n > 0
                && let Some(local) = self.shared.local()
            {
                let counters = &local.frontends[fe.slot].cons.0;
                counters.abandoned.fetch_add(n, Ordering::Relaxed);
                counters.retired.fetch_add(n, Ordering::Relaxed);
                self.shared.stats.abandoned.fetch_add(n, Ordering::Relaxed);
            }
        }
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
            .map(|i| {
                Event::raw(
                    i.to_string(),
                    Meta {
                        source: "t".into(),
                        ingest_ns: 0,
                        origin: None,
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
    async fn sink_latency_is_recorded_when_the_batch_is_released() {
        let (tx, mut rx) = channel_with_latency(8, 8);
        let old = logbus_event::now_ns().saturating_sub(5_000_000);
        let event = Event::raw(
            "x",
            Meta {
                source: "t".into(),
                ingest_ns: old,
                origin: None,
            },
        );
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
