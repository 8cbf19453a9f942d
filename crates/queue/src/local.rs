//! The local-scope stage queue: one logical queue with several places to
//! hold work.
//!
//! A stage with several upstream producers (fan-in, or an upstream with
//! many workers) meets them all on one shared queue, and every submission
//! and every dequeue touches the same synchronisation state. Local scope
//! gives each producer that registers a private single-producer/
//! single-consumer *frontend* (FE) ring with its own consumer worker, and
//! keeps the shared multi-producer/multi-consumer *backend* (BE) for what
//! does not fit:
//!
//! - Admission is one question: does the producer's whole submission fit in
//!   its FE now? Yes: all of it goes there. No: all of it goes to the BE,
//!   which applies backpressure. A batch larger than the FE always goes to
//!   the BE; a producer that found no free registration slot always does.
//!   Overflow is per submission, never a permanent switch.
//! - An FE consumer with an empty ring *helps*: it borrows up to
//!   `helper_batch` events from the BE. It never reads another FE (each ring
//!   keeps exactly one producer and one consumer). A borrowed batch is
//!   completed and accounted against the BE.
//! - There is no FIFO order across the two paths: a newer event admitted to
//!   an FE can overtake an older one that overflowed to the BE.
//! - Registration slots are never recycled during the queue's lifetime: a
//!   producer that exits keeps its slot (its FE consumer goes on helping).
//!
//! The in-flight bound is `B + N × (F + D)`: the BE capacity, plus for each of
//! the N frontends its ring and the batch its consumer holds
//! (`D = min(dequeue_batch, F)`).
//!
//! Wake-ups: an FE consumer sleeps on its own [`Notify`], which keeps a
//! wake-up that arrives before it parks. Its producer signals it after every
//! admission. BE work wakes one *idle helper* through [`IdleSet`], whose
//! announce/re-check/wake protocol and hand-off are model-checked in
//! `logbus-ring`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use logbus_ring::idle::{IdleSet, MAX_HELPERS};
use logbus_ring::spsc;
use serde::Serialize;
use tokio::sync::Notify;

use crate::histogram::Log2Histogram;
use logbus_event::Event;

/// Most frontends one queue may have.
pub const MAX_FRONTENDS: usize = MAX_HELPERS;

/// The `queue.local` settings, already validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalConfig {
    /// Events per frontend ring (`F`).
    pub frontend_size: usize,
    /// Registration slots (`N`); once taken, producers use the BE.
    pub max_frontends: usize,
    /// Most events an idle FE consumer borrows from the BE at once; 0: no helping.
    pub helper_batch: usize,
    /// An FE consumer that finds fewer events may wait for this many...
    pub min_batch: usize,
    /// ...at most this long.
    pub min_batch_timeout: Duration,
}

/// Why a submission went to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// The whole batch did not fit in the producer's frontend now.
    NoFit,
    /// The batch is larger than a frontend.
    Oversized,
    /// Every registration slot was taken when the producer registered.
    Exhausted,
    /// The producer's frontend consumer has stopped.
    Shutdown,
    /// Sent without a producer identity (engine-internal senders).
    Direct,
}

const REASONS: usize = 5;

impl Overflow {
    fn index(self) -> usize {
        self as usize
    }
}

#[repr(align(128))]
#[derive(Debug, Default)]
pub(crate) struct CachePadded<T>(pub(crate) T);

/// Written only by the producer of one frontend.
#[derive(Debug, Default)]
pub(crate) struct ProducerCounters {
    pub(crate) admitted: AtomicU64,
    pub(crate) admitted_batches: AtomicU64,
    pub(crate) overflowed: AtomicU64,
    pub(crate) max_queued: AtomicUsize,
}

/// Written only by the consumer of one frontend.
#[derive(Debug, Default)]
pub(crate) struct ConsumerCounters {
    pub(crate) taken: AtomicU64,
    pub(crate) retired: AtomicU64,
    /// Left in the ring when its consumer was dropped.
    pub(crate) abandoned: AtomicU64,
    pub(crate) help_attempts: AtomicU64,
    pub(crate) help_empty: AtomicU64,
    pub(crate) help_batches: AtomicU64,
    pub(crate) help_taken: AtomicU64,
    pub(crate) help_completed: AtomicU64,
    pub(crate) batch_sizes: Log2Histogram,
    pub(crate) ingest_latency_us: Option<Log2Histogram>,
}

pub(crate) struct Frontend {
    pub(crate) signal: Notify,
    producer: Mutex<Option<spsc::Producer<Event>>>,
    consumer: Mutex<Option<spsc::Consumer<Event>>>,
    registered: AtomicBool,
    pub(crate) prod: CachePadded<ProducerCounters>,
    pub(crate) cons: CachePadded<ConsumerCounters>,
}

impl Frontend {
    fn queued(&self) -> u64 {
        let gone = self.cons.0.taken.load(Ordering::Relaxed)
            + self.cons.0.abandoned.load(Ordering::Relaxed);
        self.prod
            .0
            .admitted
            .load(Ordering::Relaxed)
            .saturating_sub(gone)
    }
}

/// The frontends and routing state of a local-scope queue (the BE is the
/// channel it belongs to).
pub(crate) struct Local {
    pub(crate) config: LocalConfig,
    pub(crate) frontends: Box<[Frontend]>,
    next_slot: AtomicUsize,
    registration_failures: AtomicU64,
    pub(crate) idle: IdleSet,
    /// Live `Sender`s; the last one to go closes the queue.
    pub(crate) senders: AtomicUsize,
    pub(crate) closed: AtomicBool,
    routed: [AtomicU64; REASONS],
    pub(crate) dequeue_batch: usize,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local")
            .field("config", &self.config)
            .field("frontends", &self.frontends.len())
            .finish_non_exhaustive()
    }
}

impl Local {
    pub(crate) fn new(config: LocalConfig, dequeue_batch: usize, latency: bool) -> Local {
        assert!(
            (1..=MAX_FRONTENDS).contains(&config.max_frontends),
            "max_frontends must be 1..={MAX_FRONTENDS}"
        );
        let frontends = (0..config.max_frontends)
            .map(|_| {
                let (producer, consumer) = spsc::ring(config.frontend_size.max(1));
                Frontend {
                    signal: Notify::new(),
                    producer: Mutex::new(Some(producer)),
                    consumer: Mutex::new(Some(consumer)),
                    registered: AtomicBool::new(false),
                    prod: CachePadded::default(),
                    cons: CachePadded(ConsumerCounters {
                        ingest_latency_us: latency.then(Log2Histogram::default),
                        ..Default::default()
                    }),
                }
            })
            .collect();
        Local {
            config,
            frontends,
            next_slot: AtomicUsize::new(0),
            registration_failures: AtomicU64::new(0),
            idle: IdleSet::new(),
            senders: AtomicUsize::new(1),
            closed: AtomicBool::new(false),
            routed: Default::default(),
            dequeue_batch,
        }
    }

    /// `D`: the most events an FE consumer takes from its ring at once.
    pub(crate) fn frontend_dequeue(&self) -> usize {
        self.dequeue_batch.min(self.config.frontend_size).max(1)
    }

    /// The in-flight bound's local part, `N × (F + D)`.
    pub(crate) fn frontend_bound(&self) -> usize {
        self.config.max_frontends * (self.config.frontend_size + self.frontend_dequeue())
    }

    pub(crate) fn register(&self) -> Option<(usize, spsc::Producer<Event>)> {
        // Slots are handed out once and never recycled.
        let slot = self.next_slot.fetch_add(1, Ordering::Relaxed);
        if slot >= self.frontends.len() {
            self.next_slot
                .store(self.frontends.len(), Ordering::Relaxed);
            self.registration_failures.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let frontend = &self.frontends[slot];
        let producer = frontend
            .producer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()?;
        frontend.registered.store(true, Ordering::Release);
        Some((slot, producer))
    }

    pub(crate) fn take_consumer(&self, slot: usize) -> Option<spsc::Consumer<Event>> {
        self.frontends
            .get(slot)?
            .consumer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    pub(crate) fn count_overflow(&self, reason: Overflow, events: usize) {
        self.routed[reason.index()].fetch_add(events as u64, Ordering::Relaxed);
    }

    /// After BE work was published: wake one idle helper, if any.
    pub(crate) fn wake_helper(&self) {
        if self.config.helper_batch > 0 {
            self.idle
                .wake_one(|slot| self.frontends[slot].signal.notify_one());
        }
    }

    /// The last sender is gone: every FE consumer finishes its ring (and
    /// its help) and ends.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        for frontend in self.frontends.iter() {
            frontend.signal.notify_one();
        }
    }

    pub(crate) fn frontend_admitted(&self) -> u64 {
        self.frontends
            .iter()
            .map(|f| f.prod.0.admitted.load(Ordering::Relaxed))
            .sum()
    }

    pub(crate) fn frontend_taken(&self) -> u64 {
        self.frontends
            .iter()
            .map(|f| f.cons.0.taken.load(Ordering::Relaxed))
            .sum()
    }

    /// Events admitted to frontends and not yet retired (queued or in a
    /// consumer's hands).
    pub(crate) fn frontend_outstanding(&self) -> u64 {
        self.frontends
            .iter()
            .map(|f| {
                f.prod
                    .0
                    .admitted
                    .load(Ordering::Relaxed)
                    .saturating_sub(f.cons.0.retired.load(Ordering::Relaxed))
            })
            .sum()
    }

    pub(crate) fn frontend_max_queued(&self) -> usize {
        self.frontends
            .iter()
            .map(|f| f.prod.0.max_queued.load(Ordering::Relaxed))
            .sum()
    }

    pub(crate) fn snapshot(&self, backend_occupancy: usize) -> LocalQueueSnapshot {
        let sum = |f: fn(&Frontend) -> &AtomicU64| -> u64 {
            self.frontends
                .iter()
                .map(|fe| f(fe).load(Ordering::Relaxed))
                .sum()
        };
        let routed = |r: Overflow| self.routed[r.index()].load(Ordering::Relaxed);
        let registrations = self
            .frontends
            .iter()
            .filter(|f| f.registered.load(Ordering::Relaxed))
            .count();
        LocalQueueSnapshot {
            frontend_size: self.config.frontend_size,
            max_frontends: self.config.max_frontends,
            helper_batch: self.config.helper_batch,
            registrations: registrations as u64,
            registration_failures: self.registration_failures.load(Ordering::Relaxed),
            slots_recycled: false,
            frontend_events: sum(|f| &f.prod.0.admitted),
            frontend_batches: sum(|f| &f.prod.0.admitted_batches),
            backend_events: BackendRouting {
                no_fit: routed(Overflow::NoFit),
                oversized: routed(Overflow::Oversized),
                exhausted: routed(Overflow::Exhausted),
                shutdown: routed(Overflow::Shutdown),
                direct: routed(Overflow::Direct),
            },
            help_attempts: sum(|f| &f.cons.0.help_attempts),
            help_empty: sum(|f| &f.cons.0.help_empty),
            help_batches: sum(|f| &f.cons.0.help_batches),
            help_events_taken: sum(|f| &f.cons.0.help_taken),
            help_events_completed: sum(|f| &f.cons.0.help_completed),
            backend_occupancy,
            outstanding: backend_occupancy as u64 + self.frontend_outstanding(),
            frontends: self
                .frontends
                .iter()
                .enumerate()
                .map(|(slot, f)| FrontendSnapshot {
                    slot,
                    registered: f.registered.load(Ordering::Relaxed),
                    queued: f.queued(),
                    capacity: self.config.frontend_size,
                    admitted: f.prod.0.admitted.load(Ordering::Relaxed),
                    overflowed: f.prod.0.overflowed.load(Ordering::Relaxed),
                    taken: f.cons.0.taken.load(Ordering::Relaxed),
                    retired: f.cons.0.retired.load(Ordering::Relaxed),
                    max_queued: f.prod.0.max_queued.load(Ordering::Relaxed),
                })
                .collect(),
        }
    }
}

/// Events routed to the backend, by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BackendRouting {
    /// The whole submission did not fit in the producer's frontend.
    pub no_fit: u64,
    /// The submission was larger than a frontend.
    pub oversized: u64,
    /// The producer found every registration slot taken.
    pub exhausted: u64,
    /// The producer's frontend consumer had stopped.
    pub shutdown: u64,
    /// Sent by the engine without a producer identity.
    pub direct: u64,
}

impl BackendRouting {
    pub fn total(&self) -> u64 {
        self.no_fit + self.oversized + self.exhausted + self.shutdown + self.direct
    }
}

/// One frontend's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FrontendSnapshot {
    pub slot: usize,
    pub registered: bool,
    /// Events in the ring now.
    pub queued: u64,
    pub capacity: usize,
    /// Events its producer published to it.
    pub admitted: u64,
    /// Events its producer sent to the BE because they did not fit.
    pub overflowed: u64,
    /// Events its consumer took from the ring.
    pub taken: u64,
    /// Events its consumer finished (forwarded, committed, or dropped with
    /// an abandoned ring).
    pub retired: u64,
    pub max_queued: usize,
}

/// A local-scope queue's counters, in `--stats-json` and `/api/stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LocalQueueSnapshot {
    pub frontend_size: usize,
    pub max_frontends: usize,
    pub helper_batch: usize,
    /// Producers holding a frontend.
    pub registrations: u64,
    /// Registration attempts that found every slot taken.
    pub registration_failures: u64,
    /// Always `false`: a slot stays with its producer for the queue's life.
    pub slots_recycled: bool,
    /// Events (and submissions) admitted to frontends.
    pub frontend_events: u64,
    pub frontend_batches: u64,
    pub backend_events: BackendRouting,
    /// Times an idle FE consumer looked at the BE, found it empty, or
    /// borrowed a batch; events it borrowed and completed.
    pub help_attempts: u64,
    pub help_empty: u64,
    pub help_batches: u64,
    pub help_events_taken: u64,
    pub help_events_completed: u64,
    /// Events in the BE or its workers' hands.
    pub backend_occupancy: usize,
    /// Accepted and not yet terminal, on every path.
    pub outstanding: u64,
    pub frontends: Vec<FrontendSnapshot>,
}
