//! A durable queue: an append-only log of checksummed records in segment
//! files, read back in order by any number of consumers, with records
//! acknowledged out of order and segments deleted once everything in them
//! is acknowledged.
//!
//! Why it is shaped this way:
//! - **Group commit.** Producers hand encoded records to one writer thread
//!   and wait; the writer writes everything that queued up while it was
//!   busy with one `write` and (with [`SyncMode::Batch`]) one `fdatasync`,
//!   then answers all of them. The cost of an fsync is shared by every batch
//!   that arrived during the previous one, which is what lets a queue that
//!   acknowledges nothing before it is on stable storage run at memory-like
//!   rates instead of one fsync per message.
//! - **The queue's identity is its directory**, never a worker: any number
//!   of consumers read it, and a restart with a different number replays
//!   whatever was not acknowledged.
//! - **Acknowledged position, saved on every advance.** Consumers finish
//!   batches out of order; the position moves past a batch only when every
//!   earlier one is done, and it is written (two alternating checksummed
//!   slots, see `state.rs`) each time it moves, so a crash replays at most
//!   the batches that were in flight.
//! - **One job per file:** opening and recovery (`recover.rs`), the writer
//!   thread (`writer.rs`), reading back (`reader.rs`), acknowledgements and
//!   the saved position (`acks.rs`); the types they share stay here.
//! - **Damage is skipped, counted and reported, never fatal.** A torn tail,
//!   a flipped bit, a missing segment or a garbage state file costs the
//!   records it hit and nothing else; opening a damaged queue never fails
//!   for that reason, so a damaged queue cannot crash-loop its process.

mod acks;
mod cursor;
pub mod inspect;
mod reader;
pub mod record;
mod recover;
pub mod state;
mod writer;

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use crate::cursor::{Cursor, Item};
use crate::state::{Loaded, StateFile};
pub use crate::state::{Position, Seqs};

/// Where the first data record of a new segment starts: after the header
/// and the record holding the segment's first sequence number.
const FIRST_RECORD: u64 = record::SEGMENT_HEADER + record::START_RECORD;

/// When a batch counts as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// `fdatasync` before the batch is acknowledged to its producer.
    Batch,
    /// Acknowledged once written; `fdatasync` every interval.
    Interval,
    /// Acknowledged once written; the OS decides when it reaches the disk.
    None,
}

/// What a producer meets when the queue holds `max_disk_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Wait until consumers free space.
    Backpressure,
    /// Discard the oldest unread segment (counted).
    DropOldest,
    /// Discard the batch being added (counted).
    DropNewest,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The queue's own directory: segments, state and lock live here.
    pub dir: PathBuf,
    /// A segment is sealed, and a new one started, once it holds this much.
    pub segment_bytes: u64,
    pub max_disk_bytes: u64,
    pub when_full: WhenFull,
    pub sync: SyncMode,
    pub sync_interval: Duration,
    /// Compress each record with lz4 (kept uncompressed when that is smaller).
    pub lz4: bool,
}

impl Config {
    pub fn new(dir: impl Into<PathBuf>) -> Config {
        Config {
            dir: dir.into(),
            segment_bytes: 64 << 20,
            max_disk_bytes: 10 << 30,
            when_full: WhenFull::Backpressure,
            sync: SyncMode::Batch,
            sync_interval: Duration::from_millis(100),
            lz4: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("disk queue `{}`: {action}: {source}", dir.display())]
    Io {
        dir: PathBuf,
        action: String,
        source: io::Error,
    },
    #[error(
        "disk queue `{}` is in use by another process (it holds `{}`)",
        dir.display(),
        dir.join("lock").display()
    )]
    Locked { dir: PathBuf },
    #[error("disk queue `{}` is closed", dir.display())]
    Closed { dir: PathBuf },
    #[error("disk queue `{}`: writing failed: {message}", dir.display())]
    Write { dir: PathBuf, message: String },
    #[error(
        "disk queue `{}`: an event of {bytes} bytes is larger than a record may be ({} bytes)",
        dir.display(),
        record::MAX_RECORD - 1
    )]
    TooLarge { dir: PathBuf, bytes: usize },
}

fn io_error(dir: &Path, action: impl Into<String>) -> impl FnOnce(io::Error) -> Error + '_ {
    let action = action.into();
    move |source| Error::Io {
        dir: dir.to_owned(),
        action,
        source,
    }
}

/// Takes the queue's lock. A lock still held for a moment is waited for:
/// a child process forked by any thread holds a copy of the descriptor
/// until it execs, which can outlive the holder's own close by a little.
pub(crate) fn lock_queue(lock_file: &File, dir: &Path) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match lock_file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Locked {
                    dir: dir.to_owned(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io_error(dir, "locking")(e)),
        }
    }
}

pub fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.seg"))
}

/// Segment ids present in `dir`, ascending.
pub fn list_segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if let Some(stem) = name.strip_suffix(".seg")
            && stem.len() == 20
            && let Ok(id) = stem.parse::<u64>()
        {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// What opening found and did; logged by the caller and kept in the stats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Unacknowledged records found, to be delivered again.
    pub records: u64,
    pub bytes: u64,
    pub segments: u64,
    /// Damaged regions skipped (each may have held one or more records).
    pub damaged_regions: u64,
    pub damaged_bytes: u64,
    /// Segments the state pointed at (or before the first present one)
    /// that were missing.
    pub missing_segments: u64,
    /// The state file was unreadable: everything present is replayed.
    pub state_reset: bool,
    /// Records that were stored and are gone (deleted or cut segments,
    /// damage), counted by sequence number and reported once: this start
    /// reports them, the next one does not again.
    pub lost_records: u64,
    /// Human-readable notes, one per thing worth a log line.
    pub notes: Vec<String>,
}

/// Counters, readable while the queue runs.
#[derive(Debug, Default)]
pub struct Counters {
    pub appended: AtomicU64,
    pub appended_bytes: AtomicU64,
    pub read: AtomicU64,
    pub acked: AtomicU64,
    pub fsyncs: AtomicU64,
    pub writes: AtomicU64,
    pub write_errors: AtomicU64,
    pub damaged_regions: AtomicU64,
    pub damaged_bytes: AtomicU64,
    pub dropped_newest: AtomicU64,
    pub dropped_oldest: AtomicU64,
    pub full_waits: AtomicU64,
    pub state_errors: AtomicU64,
    /// Records lost with a segment that could not be read.
    pub unreadable: AtomicU64,
}

/// A snapshot for reports and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Records stored and not yet acknowledged (read or not).
    pub queued: u64,
    /// Records stored and not yet read.
    pub unread: u64,
    pub disk_bytes: u64,
    pub segments: u64,
    pub appended: u64,
    pub appended_bytes: u64,
    pub read: u64,
    pub acked: u64,
    pub fsyncs: u64,
    pub writes: u64,
    pub write_errors: u64,
    pub damaged_regions: u64,
    pub damaged_bytes: u64,
    pub dropped_newest: u64,
    pub dropped_oldest: u64,
    pub full_waits: u64,
    pub recovered: u64,
    /// Records lost with a segment that could not be read.
    pub unreadable: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct SegInfo {
    /// Bytes written and published (the file's length for a sealed segment).
    bytes: u64,
    records: u64,
}

/// The writer's published end: readers read up to here.
#[derive(Debug, Clone, Copy)]
struct Tail {
    active: u64,
    end: u64,
}

struct Pending {
    buf: Vec<u8>,
    records: u64,
    waiters: Vec<oneshot::Sender<Result<(), String>>>,
    /// The queue is being dropped: write what is pending, then end. Kept
    /// under the lock the writer waits with, not in an atomic of its own:
    /// a flag set outside that lock could land between the writer's check
    /// and its wait, and the wake-up be lost (dropping a queue hung so in
    /// CI once); here setting it needs the lock, so it cannot.
    stop: bool,
}

struct ReadState {
    pos: Position,
    /// The sequence number of the next data record at `pos`; `None` until
    /// a segment's start record says (after a skipped segment, or in a
    /// queue from before sequence numbers).
    seq: Option<u64>,
    cursor: Option<Cursor>,
    /// Records read from the current segment (for `drop_oldest`).
    read_in_segment: u64,
    /// Consecutive failed reads at `pos`.
    failures: u32,
}

/// Failed reads at one position before the rest of its segment is skipped.
const READ_RETRIES: u32 = 10;

struct InFlight {
    end: Position,
    end_seq: Option<u64>,
    records: u64,
    done: bool,
}

struct AckState {
    inflight: BTreeMap<Position, InFlight>,
    acked: Position,
    acked_seq: u64,
    state: StateFile,
}

struct Inner {
    config: Config,
    _lock: File,
    pending: Mutex<Pending>,
    wake_writer: Condvar,
    tail: Mutex<Tail>,
    segments: Mutex<BTreeMap<u64, SegInfo>>,
    disk_bytes: AtomicU64,
    /// Records accepted but not yet published by the writer.
    unpublished: AtomicU64,
    /// Records stored: recovered + appended.
    stored: AtomicU64,
    /// Every record before this sequence number is on stable storage.
    synced_seq: AtomicU64,
    /// Sequence ranges known missing when the queue was opened (reported
    /// then); a gap the reader meets outside them is a new loss.
    missing: Vec<(u64, u64)>,
    reader: Mutex<ReadState>,
    acks: Mutex<AckState>,
    readable: Notify,
    space: Notify,
    counters: Counters,
    recovered: u64,
    closed: AtomicBool,
    /// The consumer failed: nothing will free space in this process, so
    /// appends no longer wait for it (the upstream is being stopped; what
    /// it still sends is bounded by its channels).
    consumer_failed: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind,
    // never a broken invariant worth refusing service for.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The queue. Dropping it flushes what producers handed over and stops the
/// writer thread.
pub struct DiskQueue {
    inner: Arc<Inner>,
    writer: Option<std::thread::JoinHandle<()>>,
}

/// Records encoded for one append.
#[derive(Default)]
pub struct RecordBatch {
    buf: Vec<u8>,
    records: u64,
    lz4: bool,
}

impl RecordBatch {
    pub fn new(lz4: bool) -> RecordBatch {
        RecordBatch {
            lz4,
            ..Default::default()
        }
    }
    /// Adds a record; refuses (returns `false`) a payload larger than a
    /// record may be, which the reader would take for damage.
    pub fn push(&mut self, payload: &[u8]) -> bool {
        if payload.len() + 1 > record::MAX_RECORD {
            return false;
        }
        record::encode(payload, self.lz4, &mut self.buf);
        self.records += 1;
        true
    }
    pub fn len(&self) -> u64 {
        self.records
    }
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }
}

/// How an append ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Stored (durably, under `SyncMode::Batch`).
    Stored,
    /// Discarded by `WhenFull::DropNewest`.
    Dropped,
}

/// Records read together; acknowledge by dropping, keep for the next start
/// with [`ReadBatch::keep`].
pub struct ReadBatch {
    /// The payloads, back to back; `ranges` cut them apart.
    pub data: Vec<u8>,
    pub ranges: Vec<std::ops::Range<usize>>,
    ack: Option<Ack>,
}

struct Ack {
    inner: Arc<Inner>,
    start: Position,
    /// Left for the next start: never marked done in this process.
    kept: bool,
}

impl Drop for Ack {
    fn drop(&mut self) {
        if !self.kept {
            self.inner.complete(self.start);
        }
    }
}

impl ReadBatch {
    pub fn len(&self) -> usize {
        self.ranges.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
    pub fn payloads(&self) -> impl Iterator<Item = &[u8]> {
        self.ranges.iter().map(|r| &self.data[r.clone()])
    }
    /// Splits off the acknowledgement, to be dropped once the records are
    /// done with.
    pub fn into_parts(mut self) -> (Vec<u8>, Vec<std::ops::Range<usize>>, AckToken) {
        let ack = self.ack.take();
        (
            std::mem::take(&mut self.data),
            std::mem::take(&mut self.ranges),
            AckToken(ack),
        )
    }
}

/// The acknowledgement of a [`ReadBatch`]: dropping it acknowledges;
/// [`AckToken::keep`] leaves the records for the next start instead.
pub struct AckToken(Option<Ack>);

impl AckToken {
    /// Never acknowledge these records in this process: they (and all
    /// later records) are replayed at the next start. For a consumer that
    /// failed before finishing them.
    pub fn keep(mut self) {
        if let Some(ack) = self.0.as_mut() {
            ack.kept = true;
        }
    }
}

impl DiskQueue {
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// Stores `batch`; returns once it is stored as `config.sync` says, or
    /// when the full-queue policy has dropped it.
    pub async fn append(&self, batch: RecordBatch) -> Result<Appended, Error> {
        if batch.is_empty() {
            return Ok(Appended::Stored);
        }
        let inner = &self.inner;
        let size = batch.buf.len() as u64;
        // `drop_oldest` drops one segment per wait: space comes back only
        // once the batches before it are acknowledged.
        let mut dropped = false;
        loop {
            if inner.closed.load(Ordering::Acquire) {
                return Err(Error::Closed {
                    dir: inner.config.dir.clone(),
                });
            }
            let space = inner.space.notified();
            tokio::pin!(space);
            space.as_mut().enable();
            if inner.has_room(size) {
                break;
            }
            match inner.config.when_full {
                WhenFull::DropNewest => {
                    inner
                        .counters
                        .dropped_newest
                        .fetch_add(batch.records, Ordering::Relaxed);
                    return Ok(Appended::Dropped);
                }
                WhenFull::DropOldest => {
                    if !dropped && inner.drop_oldest() {
                        dropped = true;
                        continue;
                    }
                }
                WhenFull::Backpressure => {}
            }
            inner.counters.full_waits.fetch_add(1, Ordering::Relaxed);
            space.await;
            dropped = false;
        }
        let rx = {
            let mut pending = lock(&inner.pending);
            pending.buf.extend_from_slice(&batch.buf);
            pending.records += batch.records;
            inner.unpublished.fetch_add(batch.records, Ordering::AcqRel);
            let (tx, rx) = oneshot::channel();
            pending.waiters.push(tx);
            rx
        };
        inner.wake_writer.notify_one();
        match rx.await {
            Ok(Ok(())) => Ok(Appended::Stored),
            Ok(Err(message)) => Err(Error::Write {
                dir: inner.config.dir.clone(),
                message,
            }),
            Err(_) => Err(Error::Closed {
                dir: inner.config.dir.clone(),
            }),
        }
    }

    /// Up to `max` records, in order, or `None` when nothing is readable
    /// now. Blocking file I/O: call it where blocking is allowed.
    pub fn try_read(&self, max: usize) -> Result<Option<ReadBatch>, Error> {
        self.inner.try_read(&self.inner, max)
    }

    /// A future that completes when records may have become readable (or
    /// the queue drained); enable it before `try_read` to miss nothing.
    pub fn readable(&self) -> tokio::sync::futures::Notified<'_> {
        self.inner.readable.notified()
    }

    /// The consuming stage failed: stop holding producers back at
    /// `max_disk_bytes` (no acknowledgement will free space before the
    /// next start).
    pub fn consumer_failed(&self) {
        self.inner.consumer_failed.store(true, Ordering::Release);
        self.inner.space.notify_waiters();
    }

    /// No more appends will come: readers see the end once they catch up.
    /// Closing again does nothing: a consumer that closes on every turn of
    /// its loop must not wake itself up each time.
    pub fn close(&self) {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.inner.wake_writer.notify_one();
        self.inner.readable.notify_waiters();
        self.inner.space.notify_waiters();
    }

    /// Closed, everything published, and everything read.
    pub fn is_drained(&self) -> bool {
        let inner = &self.inner;
        inner.closed.load(Ordering::Acquire)
            && inner.unpublished.load(Ordering::Acquire) == 0
            && inner.caught_up()
    }

    /// Whether every record has been read (nothing waits on disk).
    pub fn caught_up(&self) -> bool {
        self.inner.unpublished.load(Ordering::Acquire) == 0 && self.inner.caught_up()
    }

    pub fn snapshot(&self) -> Snapshot {
        let inner = &self.inner;
        let c = &inner.counters;
        // Acquire: a count read here comes with what it counts (`fsyncs`).
        let get = |a: &AtomicU64| a.load(Ordering::Acquire);
        let stored = get(&inner.stored);
        let gone = get(&c.acked) + get(&c.dropped_oldest);
        Snapshot {
            queued: stored.saturating_sub(gone),
            unread: stored
                .saturating_sub(get(&c.read) + get(&c.dropped_oldest) + get(&c.unreadable)),
            disk_bytes: get(&inner.disk_bytes),
            segments: lock(&inner.segments).len() as u64,
            appended: get(&c.appended),
            appended_bytes: get(&c.appended_bytes),
            read: get(&c.read),
            acked: get(&c.acked),
            fsyncs: get(&c.fsyncs),
            writes: get(&c.writes),
            write_errors: get(&c.write_errors),
            damaged_regions: get(&c.damaged_regions),
            damaged_bytes: get(&c.damaged_bytes),
            dropped_newest: get(&c.dropped_newest),
            dropped_oldest: get(&c.dropped_oldest),
            full_waits: get(&c.full_waits),
            recovered: inner.recovered,
            unreadable: get(&c.unreadable),
        }
    }
}

impl Drop for DiskQueue {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::Release);
        lock(&self.inner.pending).stop = true;
        self.inner.wake_writer.notify_one();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        // The last word on what is stored, so a later start can tell a cut
        // or removed end of the queue from a torn last write.
        let mut acks = lock(&self.inner.acks);
        let (acked, seqs) = (acks.acked, self.inner.seqs(&acks));
        if let Err(e) = acks.state.save(acked, seqs) {
            tracing::warn!(dir = %self.inner.config.dir.display(), "saving queue state: {e}");
        }
        if let Err(e) = acks.state.sync() {
            tracing::warn!(dir = %self.inner.config.dir.display(), "syncing queue state: {e}");
        }
    }
}

impl Inner {
    fn caught_up(&self) -> bool {
        let tail = *lock(&self.tail);
        let reader = lock(&self.reader);
        // Before the first data record of a segment lie only its header
        // and start record: a reader there has nothing left to read.
        reader.pos.segment > tail.active
            || (reader.pos.segment == tail.active
                && reader.pos.offset.max(FIRST_RECORD) >= tail.end)
    }
}
