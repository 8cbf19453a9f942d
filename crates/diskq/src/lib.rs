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
//! - **Damage is skipped, counted and reported, never fatal.** A torn tail,
//!   a flipped bit, a missing segment or a garbage state file costs the
//!   records it hit and nothing else; opening a damaged queue never fails
//!   for that reason, so a damaged queue cannot crash-loop its process.

mod cursor;
pub mod inspect;
pub mod record;
pub mod state;

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
    /// Opens (creating) the queue in `config.dir`, recovering what a
    /// previous process left. Damage is skipped and reported in the
    /// returned [`Recovery`]; only I/O errors (permissions, a directory that
    /// cannot be created) and a queue held by another process fail.
    pub fn open(config: Config) -> Result<(DiskQueue, Recovery), Error> {
        let dir = config.dir.clone();
        std::fs::create_dir_all(&dir).map_err(io_error(&dir, "creating the directory"))?;
        let lock_file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .map_err(io_error(&dir, "opening the lock file"))?;
        lock_queue(&lock_file, &dir)?;
        let mut recovery = Recovery::default();
        let ids = list_segments(&dir).map_err(io_error(&dir, "listing segments"))?;
        let loaded = state::load(&dir.join("state")).map_err(io_error(&dir, "reading state"))?;
        let (start, notes) = inspect::resume_point(&loaded, &ids);
        let generation = match &loaded {
            Loaded::Valid(saved) => {
                if start.segment != saved.acked.segment || (start != saved.acked && !ids.is_empty())
                {
                    recovery.missing_segments += 1;
                }
                saved.generation
            }
            Loaded::Garbage => {
                recovery.state_reset = true;
                0
            }
            Loaded::Missing => {
                recovery.state_reset = !ids.is_empty();
                0
            }
        };
        recovery.notes.extend(notes);
        // Segments wholly before the acknowledged position are done.
        for &id in ids.iter().filter(|&&id| id < start.segment) {
            let _ = std::fs::remove_file(segment_path(&dir, id));
        }
        let mut segments = BTreeMap::new();
        let mut disk_bytes = 0;
        let mut scans = Vec::new();
        for &id in ids.iter().filter(|&&id| id >= start.segment) {
            let path = segment_path(&dir, id);
            let from = if id == start.segment {
                start.offset
            } else {
                record::SEGMENT_HEADER
            };
            let scan = match inspect::scan_segment(&path, id, from) {
                Ok(scan) => scan,
                Err(e) => {
                    // Unreadable (a bad sector): counted as damage, left
                    // for the reader, which retries and then skips it.
                    recovery
                        .notes
                        .push(format!("segment {id} could not be read: {e}"));
                    recovery.damaged_regions += 1;
                    let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
                    disk_bytes += bytes;
                    segments.insert(id, SegInfo { bytes, records: 0 });
                    scans.push(inspect::SegmentScan {
                        id,
                        ..Default::default()
                    });
                    continue;
                }
            };
            for note in scan.notes(id) {
                recovery.notes.push(note);
            }
            recovery.damaged_regions += scan.damaged_regions;
            recovery.damaged_bytes += scan.damaged_bytes;
            recovery.records += scan.records;
            recovery.bytes += scan.file_bytes;
            recovery.segments += 1;
            disk_bytes += scan.file_bytes;
            segments.insert(
                id,
                SegInfo {
                    bytes: scan.file_bytes,
                    records: scan.records,
                },
            );
            scans.push(scan);
        }
        let saved_seqs = match &loaded {
            Loaded::Valid(saved) => saved.seqs,
            _ => None,
        };
        // (When the acknowledged segment is missing, reading resumes at
        // the next one, and the records between are counted as lost.)
        let accounting = inspect::account(saved_seqs, &scans, &inspect::read_reported(&dir));
        recovery.lost_records = accounting.lost;
        recovery.notes.extend(accounting.notes.iter().cloned());
        // The losses are reported now: recorded at once, so a crash before
        // the next start does not report them twice.
        inspect::write_reported(&dir, &accounting.missing)
            .map_err(io_error(&dir, "recording reported losses"))?;
        let next_seq = accounting.next_seq;
        let resume_seq = accounting.resume_seq;
        // Always write into a new segment: what an earlier process left is
        // sealed as it is, torn tail and all.
        let active = ids.last().map_or(1, |&last| last + 1).max(start.segment);
        let state = StateFile::create(
            &dir.join("state"),
            generation,
            start,
            Seqs {
                acked: resume_seq.unwrap_or(0),
                stored: next_seq,
            },
        )
        .map_err(io_error(&dir, "writing state"))?;
        let inner = Arc::new(Inner {
            _lock: lock_file,
            pending: Mutex::new(Pending {
                buf: Vec::new(),
                records: 0,
                waiters: Vec::new(),
                stop: false,
            }),
            wake_writer: Condvar::new(),
            tail: Mutex::new(Tail {
                active,
                end: FIRST_RECORD,
            }),
            segments: Mutex::new(segments),
            disk_bytes: AtomicU64::new(disk_bytes),
            unpublished: AtomicU64::new(0),
            stored: AtomicU64::new(recovery.records),
            synced_seq: AtomicU64::new(next_seq),
            missing: accounting.missing.clone(),
            reader: Mutex::new(ReadState {
                pos: start,
                seq: resume_seq,
                cursor: None,
                read_in_segment: 0,
                failures: 0,
            }),
            acks: Mutex::new(AckState {
                inflight: BTreeMap::new(),
                acked: start,
                acked_seq: resume_seq.unwrap_or(0),
                state,
            }),
            readable: Notify::new(),
            space: Notify::new(),
            counters: Counters::default(),
            recovered: recovery.records,
            closed: AtomicBool::new(false),
            consumer_failed: AtomicBool::new(false),
            config,
        });
        let file = inner
            .create_segment(active, next_seq)
            .map_err(io_error(&dir, format!("creating segment {active}")))?;
        let writer = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("logbus-diskq".into())
                .spawn(move || inner.write_loop(active, file, next_seq))
                .map_err(io_error(&dir, "starting the writer thread"))?
        };
        Ok((
            DiskQueue {
                inner,
                writer: Some(writer),
            },
            recovery,
        ))
    }

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
    /// Creates segment `id`, whose first data record will have sequence
    /// number `first_seq`.
    fn create_segment(&self, id: u64, first_seq: u64) -> io::Result<File> {
        let path = segment_path(&self.config.dir, id);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        let mut head = Vec::from(record::segment_header(id));
        record::encode_start(first_seq, &mut head);
        file.write_all_at(&head, 0)?;
        if self.config.sync != SyncMode::None {
            file.sync_data()?;
            File::open(&self.config.dir)?.sync_all()?;
        }
        lock(&self.segments).insert(
            id,
            SegInfo {
                bytes: FIRST_RECORD,
                records: 0,
            },
        );
        self.disk_bytes.fetch_add(FIRST_RECORD, Ordering::AcqRel);
        Ok(file)
    }

    fn has_room(&self, size: u64) -> bool {
        if self.consumer_failed.load(Ordering::Acquire) {
            return true;
        }
        let used = self.disk_bytes.load(Ordering::Acquire) + lock(&self.pending).buf.len() as u64;
        used + size <= self.config.max_disk_bytes || self.stored_unacked() == 0
    }

    fn stored_unacked(&self) -> u64 {
        let c = &self.counters;
        self.stored.load(Ordering::Acquire).saturating_sub(
            c.acked.load(Ordering::Acquire) + c.dropped_oldest.load(Ordering::Acquire),
        ) + self.unpublished.load(Ordering::Acquire)
    }

    fn caught_up(&self) -> bool {
        let tail = *lock(&self.tail);
        let reader = lock(&self.reader);
        // Before the first data record of a segment lie only its header
        // and start record: a reader there has nothing left to read.
        reader.pos.segment > tail.active
            || (reader.pos.segment == tail.active
                && reader.pos.offset.max(FIRST_RECORD) >= tail.end)
    }

    /// The writer thread: group commit.
    fn write_loop(self: Arc<Self>, mut active: u64, mut file: File, mut next_seq: u64) {
        let mut written = FIRST_RECORD;
        let mut last_sync = Instant::now();
        let mut dirty = false;
        let mut backoff = Duration::from_millis(10);
        loop {
            let (buf, records, waiters, stopping) = {
                let mut pending = lock(&self.pending);
                loop {
                    if !pending.buf.is_empty() || pending.stop {
                        break;
                    }
                    if self.config.sync == SyncMode::Interval && dirty {
                        let due = self
                            .config
                            .sync_interval
                            .saturating_sub(last_sync.elapsed());
                        if due.is_zero() {
                            break;
                        }
                        pending = self
                            .wake_writer
                            .wait_timeout(pending, due)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    } else {
                        pending = self
                            .wake_writer
                            .wait(pending)
                            .unwrap_or_else(|e| e.into_inner());
                    }
                }
                if pending.buf.is_empty() && pending.stop {
                    break;
                }
                (
                    std::mem::take(&mut pending.buf),
                    std::mem::take(&mut pending.records),
                    std::mem::take(&mut pending.waiters),
                    pending.stop,
                )
            };
            if !buf.is_empty() {
                // Write (and sync) until it holds: a full disk or an I/O
                // error keeps the producers waiting, which is backpressure.
                loop {
                    let result = file.write_all_at(&buf, written).and_then(|()| {
                        if self.config.sync == SyncMode::Batch {
                            self.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
                            file.sync_data()
                        } else {
                            Ok(())
                        }
                    });
                    match result {
                        Ok(()) => {
                            backoff = Duration::from_millis(10);
                            break;
                        }
                        Err(e) => {
                            self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(
                                dir = %self.config.dir.display(),
                                segment = active,
                                offset = written,
                                "queue write failed, retrying in {backoff:?}: {e}"
                            );
                            // Cut what may have been written; failing that,
                            // seal this segment and continue in a new one.
                            if file.set_len(written).is_err() {
                                match self.create_segment(active + 1, next_seq) {
                                    Ok(next) => {
                                        self.seal(active, written);
                                        (active, file, written) = (active + 1, next, FIRST_RECORD);
                                    }
                                    Err(e) => tracing::warn!("starting a new segment: {e}"),
                                }
                            }
                            if lock(&self.pending).stop && backoff > Duration::from_secs(1) {
                                let message = e.to_string();
                                for w in waiters {
                                    let _ = w.send(Err(message.clone()));
                                }
                                self.unpublished.fetch_sub(records, Ordering::AcqRel);
                                return;
                            }
                            std::thread::sleep(backoff);
                            backoff = (backoff * 2).min(Duration::from_secs(2));
                        }
                    }
                }
                written += buf.len() as u64;
                next_seq += records;
                if self.config.sync == SyncMode::Batch {
                    self.synced_seq.store(next_seq, Ordering::Release);
                }
                dirty = self.config.sync != SyncMode::Batch;
                {
                    let mut segments = lock(&self.segments);
                    let info = segments.entry(active).or_default();
                    info.bytes = written;
                    info.records += records;
                }
                self.disk_bytes
                    .fetch_add(buf.len() as u64, Ordering::AcqRel);
                self.stored.fetch_add(records, Ordering::AcqRel);
                self.counters.appended.fetch_add(records, Ordering::Relaxed);
                self.counters
                    .appended_bytes
                    .fetch_add(buf.len() as u64, Ordering::Relaxed);
                self.counters.writes.fetch_add(1, Ordering::Relaxed);
                lock(&self.tail).end = written;
                self.unpublished.fetch_sub(records, Ordering::AcqRel);
                for w in waiters {
                    let _ = w.send(Ok(()));
                }
                self.readable.notify_waiters();
            }
            if dirty
                && (self.config.sync == SyncMode::Interval
                    && last_sync.elapsed() >= self.config.sync_interval
                    || stopping)
            {
                // Counted once its effect is published: whoever sees the
                // count sees what it synced.
                match file.sync_data() {
                    Ok(()) => self.synced_seq.store(next_seq, Ordering::Release),
                    Err(e) => {
                        tracing::warn!(dir = %self.config.dir.display(), "queue sync failed: {e}")
                    }
                }
                self.counters.fsyncs.fetch_add(1, Ordering::Release);
                last_sync = Instant::now();
                dirty = false;
            }
            if written >= self.config.segment_bytes {
                match self.create_segment(active + 1, next_seq) {
                    Ok(next) => {
                        if dirty && file.sync_data().is_ok() {
                            self.synced_seq.store(next_seq, Ordering::Release);
                            dirty = false;
                        }
                        self.seal(active, written);
                        (active, file, written) = (active + 1, next, FIRST_RECORD);
                    }
                    Err(e) => {
                        self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(dir = %self.config.dir.display(), "starting a new segment: {e}");
                    }
                }
            }
        }
        if !dirty || file.sync_data().is_ok() {
            self.synced_seq.store(next_seq, Ordering::Release);
        }
        self.readable.notify_waiters();
    }

    /// The sequence numbers saved with the acknowledged position.
    fn seqs(&self, acks: &AckState) -> Seqs {
        Seqs {
            acked: acks.acked_seq,
            stored: self.synced_seq.load(Ordering::Acquire),
        }
    }

    /// Publishes that `id` ended at `len` and the writer moved to `id + 1`.
    /// The state is saved too, so what it says is stored lags the log by
    /// at most a segment even while nothing is acknowledged (a stuck
    /// consumer): a cut end of the queue is then counted, not mistaken for
    /// a torn write.
    fn seal(&self, id: u64, len: u64) {
        if let Some(info) = lock(&self.segments).get_mut(&id) {
            info.bytes = len;
        }
        {
            let mut acks = lock(&self.acks);
            let (acked, seqs) = (acks.acked, self.seqs(&acks));
            if let Err(e) = acks.state.save(acked, seqs) {
                self.counters.state_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(dir = %self.config.dir.display(), "saving the queue state: {e}");
            }
        }
        *lock(&self.tail) = Tail {
            active: id + 1,
            end: FIRST_RECORD,
        };
        self.readable.notify_waiters();
    }

    fn try_read(&self, me: &Arc<Inner>, max: usize) -> Result<Option<ReadBatch>, Error> {
        let mut reader = lock(&self.reader);
        let (start, read_before) = (reader.pos, reader.read_in_segment);
        match self.read_locked(me, &mut reader, max) {
            Ok(batch) => {
                reader.failures = 0;
                Ok(batch)
            }
            Err(e) => {
                // Nothing of this call is handed out: read it again next
                // time. An error that persists at one position is damage:
                // after a few tries the rest of that segment is skipped
                // (counted, logged), so a bad sector cannot stall the queue.
                reader.pos = start;
                reader.cursor = None;
                reader.read_in_segment = read_before;
                reader.failures += 1;
                if reader.failures >= READ_RETRIES {
                    reader.failures = 0;
                    self.skip_segment(&mut reader, &e.to_string());
                }
                Err(e)
            }
        }
    }

    /// Gives up on the rest of the reader's segment (unreadable).
    fn skip_segment(&self, reader: &mut ReadState, why: &str) {
        let tail = *lock(&self.tail);
        if reader.pos.segment >= tail.active {
            return;
        }
        let seg = reader.pos.segment;
        let records = lock(&self.segments).get(&seg).map_or(0, |s| s.records);
        let lost = records.saturating_sub(reader.read_in_segment);
        self.counters
            .damaged_regions
            .fetch_add(1, Ordering::Relaxed);
        self.counters.unreadable.fetch_add(lost, Ordering::Relaxed);
        tracing::error!(
            dir = %self.config.dir.display(),
            segment = seg,
            offset = reader.pos.offset,
            records = lost,
            "queue segment unreadable after {READ_RETRIES} tries, skipping the rest of it: {why}"
        );
        let start = reader.pos;
        let next = lock(&self.segments)
            .range(seg + 1..)
            .next()
            .map(|(&id, _)| id)
            .unwrap_or(tail.active);
        reader.pos = Position {
            segment: next,
            offset: record::SEGMENT_HEADER,
        };
        // The next segment's start record says where numbering resumes;
        // what lies between is counted above.
        reader.seq = None;
        reader.cursor = None;
        reader.read_in_segment = 0;
        let mut acks = lock(&self.acks);
        acks.inflight.insert(
            start,
            InFlight {
                end: reader.pos,
                end_seq: None,
                records: 0,
                done: true,
            },
        );
        self.advance(&mut acks);
    }

    fn read_locked(
        &self,
        me: &Arc<Inner>,
        reader: &mut MutexGuard<'_, ReadState>,
        max: usize,
    ) -> Result<Option<ReadBatch>, Error> {
        let dir = &self.config.dir;
        let start = reader.pos;
        let mut data = Vec::new();
        let mut ranges = Vec::new();
        while ranges.len() < max {
            let tail = *lock(&self.tail);
            let limit = if reader.pos.segment == tail.active {
                tail.end
            } else {
                match lock(&self.segments).get(&reader.pos.segment) {
                    Some(info) => info.bytes,
                    None => 0,
                }
            };
            if reader.cursor.is_none() && reader.pos.offset < limit {
                let path = segment_path(dir, reader.pos.segment);
                match File::open(&path) {
                    Ok(file) => reader.cursor = Some(Cursor::new(file, reader.pos.offset, limit)),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        // Removed from outside: its records are gone.
                        self.counters
                            .damaged_regions
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            dir = %dir.display(),
                            segment = reader.pos.segment,
                            "queue segment missing, skipping it"
                        );
                        reader.pos.offset = limit;
                    }
                    Err(e) => {
                        return Err(io_error(
                            dir,
                            format!("opening segment {}", reader.pos.segment),
                        )(e));
                    }
                }
            }
            let item = match reader.cursor.as_mut() {
                Some(cursor) => {
                    cursor.set_limit(limit);
                    cursor.next_item().map_err(io_error(
                        dir,
                        format!("reading segment {}", reader.pos.segment),
                    ))?
                }
                None => None,
            };
            match item {
                Some(Item::Record { body, .. })
                    if record::start_seq(
                        reader.cursor.as_ref().expect("cursor").slice(body.clone()),
                    )
                    .is_some() =>
                {
                    let cursor = reader.cursor.as_ref().expect("cursor");
                    let first = record::start_seq(cursor.slice(body)).expect("a start record");
                    // Records missing before this segment that the start did
                    // not report (a segment removed while running).
                    if let Some(at) = reader.seq
                        && first > at
                    {
                        let gone = (first - at) - inspect::overlap(at, first, &self.missing);
                        if gone > 0 {
                            self.counters.unreadable.fetch_add(gone, Ordering::Relaxed);
                            tracing::error!(dir = %dir.display(), segment = reader.pos.segment, records = gone, "queue records missing before this segment");
                        }
                    }
                    let next = cursor.position();
                    reader.seq = Some(first);
                    reader.pos.offset = next;
                }
                Some(Item::Record { body, .. }) => {
                    reader.seq = reader.seq.map(|s| s + 1);
                    let cursor = reader.cursor.as_ref().expect("cursor");
                    match record::payload(cursor.slice(body)) {
                        Ok(payload) => {
                            let at = data.len();
                            data.extend_from_slice(&payload);
                            ranges.push(at..data.len());
                        }
                        Err(why) => {
                            self.counters
                                .damaged_regions
                                .fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(dir = %dir.display(), segment = reader.pos.segment, offset = reader.pos.offset, "skipping a queue record: {why}");
                        }
                    }
                    reader.read_in_segment += 1;
                    reader.pos.offset = reader.cursor.as_ref().expect("cursor").position();
                }
                Some(Item::Damaged { offset, len }) | Some(Item::Torn { offset, len }) => {
                    self.counters
                        .damaged_regions
                        .fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .damaged_bytes
                        .fetch_add(len, Ordering::Relaxed);
                    tracing::warn!(
                        dir = %dir.display(),
                        segment = reader.pos.segment,
                        offset,
                        bytes = len,
                        "skipping damaged queue data"
                    );
                    reader.pos.offset = reader.cursor.as_ref().expect("cursor").position();
                }
                None => {
                    if reader.pos.segment >= tail.active {
                        break;
                    }
                    // A sealed segment is finished: on to the next present.
                    let next = lock(&self.segments)
                        .range(reader.pos.segment + 1..)
                        .next()
                        .map(|(&id, _)| id)
                        .unwrap_or(tail.active);
                    reader.pos = Position {
                        segment: next,
                        offset: record::SEGMENT_HEADER,
                    };
                    reader.cursor = None;
                    reader.read_in_segment = 0;
                }
            }
        }
        let end = reader.pos;
        if end == start {
            return Ok(None);
        }
        let records = ranges.len() as u64;
        self.counters.read.fetch_add(records, Ordering::Relaxed);
        lock(&self.acks).inflight.insert(
            start,
            InFlight {
                end,
                end_seq: reader.seq,
                records,
                done: false,
            },
        );
        let ack = Ack {
            inner: me.clone(),
            start,
            kept: false,
        };
        if ranges.is_empty() {
            // Only damage was passed over: nothing to hand out, but the
            // acknowledged position may move past it.
            drop(ack);
            return Ok(None);
        }
        Ok(Some(ReadBatch {
            data,
            ranges,
            ack: Some(ack),
        }))
    }

    /// `drop_oldest`: skips the reader past the oldest unread sealed
    /// segment. Returns whether anything was dropped.
    fn drop_oldest(&self) -> bool {
        let tail = *lock(&self.tail);
        let mut reader = lock(&self.reader);
        if reader.pos.segment >= tail.active {
            return false;
        }
        let seg = reader.pos.segment;
        let records = lock(&self.segments).get(&seg).map_or(0, |s| s.records);
        let dropped = records.saturating_sub(reader.read_in_segment);
        let next = lock(&self.segments)
            .range(seg + 1..)
            .next()
            .map(|(&id, _)| id)
            .unwrap_or(tail.active);
        let start = reader.pos;
        reader.pos = Position {
            segment: next,
            offset: record::SEGMENT_HEADER,
        };
        reader.seq = None;
        reader.cursor = None;
        reader.read_in_segment = 0;
        self.counters
            .dropped_oldest
            .fetch_add(dropped, Ordering::Relaxed);
        tracing::warn!(dir = %self.config.dir.display(), segment = seg, records = dropped, "queue full: dropped the oldest unread segment");
        let mut acks = lock(&self.acks);
        acks.inflight.insert(
            start,
            InFlight {
                end: reader.pos,
                end_seq: None,
                records: 0,
                done: true,
            },
        );
        drop(reader);
        self.advance(&mut acks);
        true
    }

    fn complete(&self, start: Position) {
        let mut acks = lock(&self.acks);
        if let Some(entry) = acks.inflight.get_mut(&start) {
            entry.done = true;
        }
        self.advance(&mut acks);
    }

    fn advance(&self, acks: &mut AckState) {
        let before = acks.acked;
        let mut acked_records = 0;
        while let Some(entry) = acks.inflight.first_entry() {
            if !entry.get().done {
                break;
            }
            if *entry.key() != acks.acked {
                // Batches are handed out back to back; a gap would skip
                // records that were never delivered. Never move past one.
                tracing::error!(
                    dir = %self.config.dir.display(),
                    "queue acknowledgement gap at segment {} offset {}; not advancing",
                    acks.acked.segment,
                    acks.acked.offset
                );
                break;
            }
            let done = entry.remove();
            acks.acked = done.end;
            if let Some(seq) = done.end_seq {
                acks.acked_seq = seq;
            }
            acked_records += done.records;
        }
        if acks.acked == before {
            return;
        }
        self.counters
            .acked
            .fetch_add(acked_records, Ordering::Relaxed);
        let seqs = self.seqs(acks);
        if let Err(e) = acks.state.save(acks.acked, seqs) {
            self.counters.state_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(dir = %self.config.dir.display(), "saving the queue position: {e}");
        }
        if acks.acked.segment > before.segment {
            let done: Vec<u64> = lock(&self.segments)
                .range(..acks.acked.segment)
                .map(|(&id, _)| id)
                .collect();
            if !done.is_empty() {
                if self.config.sync != SyncMode::None
                    && let Err(e) = acks.state.sync()
                {
                    tracing::warn!(dir = %self.config.dir.display(), "syncing the queue position: {e}");
                }
                let mut freed = 0;
                for id in done {
                    if let Some(info) = lock(&self.segments).remove(&id) {
                        freed += info.bytes;
                    }
                    if let Err(e) = std::fs::remove_file(segment_path(&self.config.dir, id)) {
                        tracing::warn!(dir = %self.config.dir.display(), segment = id, "removing a finished segment: {e}");
                    }
                }
                self.disk_bytes.fetch_sub(freed, Ordering::AcqRel);
                self.space.notify_waiters();
            }
        }
    }
}
