//! The queue against a real filesystem: persistence, out-of-order
//! acknowledgement, damage of every kind, full-disk policies, and crashes
//! (a helper binary, `logbus-diskq-crash-child`, is the process that
//! gets killed).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use logbus_diskq::{
    Appended, Config, DiskQueue, Error, RecordBatch, Recovery, SyncMode, WhenFull, inspect,
    list_segments, segment_path,
};

mod support;

use support::records::{batch, seqs};

/// The crash child (see its module docs).
const CHILD: &str = env!("CARGO_BIN_EXE_logbus-diskq-crash-child");

fn config(dir: &Path) -> Config {
    Config {
        segment_bytes: 4096,
        ..Config::new(dir)
    }
}

/// Reads everything readable now, acknowledging as it goes.
fn drain(q: &DiskQueue) -> Vec<u64> {
    let mut all = Vec::new();
    while let Some(b) = q.try_read(7).unwrap() {
        all.extend(seqs(&b));
    }
    all
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn records_come_back_in_order_and_acked_segments_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
    assert_eq!(recovery.records, 0);
    assert!(q.caught_up());
    rt().block_on(async {
        for i in 0..20 {
            assert_eq!(q.append(batch(i * 50, 50)).await.unwrap(), Appended::Stored);
        }
    });
    assert!(!q.caught_up());
    assert!(list_segments(dir.path()).unwrap().len() > 5);
    assert_eq!(drain(&q), (0..1000).collect::<Vec<_>>());
    assert!(q.caught_up());
    let s = q.snapshot();
    assert_eq!((s.queued, s.unread, s.acked), (0, 0, 1000));
    assert!(s.fsyncs >= 1);
    // Only the active segment is left.
    assert_eq!(list_segments(dir.path()).unwrap().len(), 1);
    drop(q);
    let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
    assert_eq!(recovery.records, 0);
    assert!(drain(&q).is_empty());
}

/// Caught up means nothing is left to read, in the segment being written
/// too: a fresh queue is, one with records in it is not, until they are read.
#[test]
fn caught_up_means_nothing_is_left_to_read() {
    let dir = tempfile::tempdir().unwrap();
    let (q, _) = DiskQueue::open(config(dir.path())).unwrap();
    assert!(q.caught_up());
    rt().block_on(q.append(batch(0, 5))).unwrap();
    assert_eq!(list_segments(dir.path()).unwrap().len(), 1);
    assert!(!q.caught_up());
    let b = q.try_read(3).unwrap().unwrap();
    assert!(!q.caught_up());
    drop(b);
    assert_eq!(drain(&q), (3..5).collect::<Vec<_>>());
    assert!(q.caught_up());
}

/// A batch larger than `max_disk_bytes` is stored when nothing stored is
/// waiting (it could never fit otherwise), and refused (here: dropped, as
/// configured) while something is.
#[test]
fn a_batch_larger_than_the_queue_fits_only_when_nothing_is_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        max_disk_bytes: 4096,
        when_full: WhenFull::DropNewest,
        ..config(dir.path())
    };
    let (q, _) = DiskQueue::open(cfg).unwrap();
    let big = |from| {
        let b = batch(from, 150);
        assert!(b.bytes() > 4096 + 2048, "{}", b.bytes());
        b
    };
    rt().block_on(async {
        assert_eq!(q.append(big(0)).await.unwrap(), Appended::Stored);
        assert_eq!(q.append(batch(500, 1)).await.unwrap(), Appended::Dropped);
    });
    assert_eq!(drain(&q), (0..150).collect::<Vec<_>>());
    rt().block_on(async {
        assert_eq!(q.append(big(1000)).await.unwrap(), Appended::Stored);
    });
    assert_eq!(drain(&q), (1000..1150).collect::<Vec<_>>());
    assert_eq!(q.snapshot().dropped_newest, 1);
}

#[test]
fn unacknowledged_records_are_replayed_after_a_restart_and_acked_ones_are_not() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (q, _) = DiskQueue::open(config(dir.path())).unwrap();
        rt().block_on(q.append(batch(0, 300))).unwrap();
        let a = q.try_read(100).unwrap().unwrap();
        let b = q.try_read(100).unwrap().unwrap();
        let c = q.try_read(100).unwrap().unwrap();
        // Out of order: c and a done, b kept (its consumer failed).
        drop(c);
        drop(a);
        let (_, _, token) = b.into_parts();
        token.keep();
        assert_eq!(q.snapshot().acked, 100);
    }
    let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
    // b and c come back: c was done, but after b (at-least-once).
    assert_eq!(recovery.records, 200);
    assert_eq!(drain(&q), (100..300).collect::<Vec<_>>());
}

#[test]
fn lz4_records_round_trip_and_take_less_disk() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        lz4: true,
        ..config(dir.path())
    };
    let (q, _) = DiskQueue::open(cfg).unwrap();
    let mut b = RecordBatch::new(true);
    let line = format!("record 000007 {}", "abc".repeat(300));
    assert!(b.push(line.as_bytes()));
    let stored = b.bytes();
    rt().block_on(q.append(b)).unwrap();
    assert!(stored < line.len() / 4);
    let got = q.try_read(10).unwrap().unwrap();
    assert_eq!(got.payloads().next().unwrap(), line.as_bytes());
}

/// A lock still held is waited for (a forked child may hold a copy of the
/// descriptor for a moment), but for two seconds, not for ever. The lower
/// bound is exact: refusing earlier is the fault.
#[test]
fn a_lock_held_on_is_waited_for_two_seconds_then_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_q, _) = DiskQueue::open(config(dir.path())).unwrap();
    let started = std::time::Instant::now();
    let Err(err) = DiskQueue::open(config(dir.path())) else {
        panic!("opened twice")
    };
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(2), "refused after {waited:?}");
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "disk queue `{}` is in use by another process (it holds `{}`)",
            dir.path().display(),
            dir.path().join("lock").display()
        )
    );
}

/// Writes 1000 records over several segments and closes the queue.
fn filled(dir: &Path) {
    let (q, _) = DiskQueue::open(config(dir)).unwrap();
    rt().block_on(async {
        for i in 0..10 {
            q.append(batch(i * 100, 100)).await.unwrap();
        }
    });
}

/// The sequence numbers the state file holds now.
fn saved_seqs(dir: &Path) -> logbus_diskq::Seqs {
    match logbus_diskq::state::load(&dir.join("state")).unwrap() {
        logbus_diskq::state::Loaded::Valid(saved) => saved.seqs.unwrap(),
        other => panic!("state: {other:?}"),
    }
}

/// What the state says is stored is what has been synced, so a later start
/// counts a cut end as lost and a torn unsynced tail as not: under `batch`
/// every append is synced before it returns; under `interval` a sync
/// follows within the interval, not each write; under `none` only the
/// close syncs.
#[test]
fn the_state_says_stored_only_what_each_sync_mode_has_synced() {
    let appended = |sync: SyncMode, interval_ms: u64| {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            sync,
            sync_interval: Duration::from_millis(interval_ms),
            ..config(dir.path())
        };
        let (q, _) = DiskQueue::open(cfg).unwrap();
        rt().block_on(async {
            for i in 0..3 {
                q.append(batch(i * 10, 10)).await.unwrap();
            }
        });
        (dir, q)
    };
    let ack_one = |q: &DiskQueue| drop(q.try_read(10).unwrap().unwrap());

    // batch: each append synced.
    let (dir, q) = appended(SyncMode::Batch, 3_600_000);
    ack_one(&q);
    assert_eq!(saved_seqs(dir.path()).stored, 30);
    assert_eq!(q.snapshot().fsyncs, 3);

    // interval, an hour: nothing synced while it runs; closing syncs.
    let (dir, q) = appended(SyncMode::Interval, 3_600_000);
    ack_one(&q);
    assert_eq!(
        saved_seqs(dir.path()),
        logbus_diskq::Seqs {
            acked: 10,
            stored: 0
        }
    );
    assert_eq!(q.snapshot().fsyncs, 0);
    drop(q);
    assert_eq!(saved_seqs(dir.path()).stored, 30);

    // none, however short its interval: the same.
    let (dir, q) = appended(SyncMode::None, 1);
    std::thread::sleep(Duration::from_millis(5));
    rt().block_on(q.append(batch(30, 10))).unwrap();
    ack_one(&q);
    assert_eq!(saved_seqs(dir.path()).stored, 0);
    assert_eq!(q.snapshot().fsyncs, 0);
    drop(q);
    assert_eq!(saved_seqs(dir.path()).stored, 40);

    // interval, 20 ms: a sync comes without another append (one append,
    // so one write for it to cover).
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        sync: SyncMode::Interval,
        sync_interval: Duration::from_millis(20),
        ..config(dir.path())
    };
    let (q, _) = DiskQueue::open(cfg).unwrap();
    rt().block_on(q.append(batch(0, 30))).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while q.snapshot().fsyncs == 0 {
        assert!(std::time::Instant::now() < deadline, "no sync in 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(q.snapshot().fsyncs, 1);
    ack_one(&q);
    assert_eq!(saved_seqs(dir.path()).stored, 30);
}

/// The bytes of every segment file now in `dir` (a directory standing in
/// for one counts its own length).
fn segment_files_bytes(dir: &Path) -> u64 {
    list_segments(dir)
        .unwrap()
        .iter()
        .map(|&id| std::fs::metadata(segment_path(dir, id)).unwrap().len())
        .sum()
}

/// What opening reports is the sum of what it found in each segment and
/// nothing more: nothing at a first start; on a restart with damage in two
/// segments, every segment's records, bytes and damage, no segment missing,
/// no state reset; and the disk use it starts from is every file present.
#[test]
fn opening_reports_exactly_what_each_segment_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
    assert_eq!(recovery, Recovery::default());
    drop(q);
    filled(dir.path());
    let ids = list_segments(dir.path()).unwrap();
    assert!(ids.len() >= 4, "{ids:?}");
    for &id in &ids[1..3] {
        let path = segment_path(dir.path(), id);
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
    }
    let scans: Vec<inspect::SegmentScan> = ids
        .iter()
        .map(|&id| {
            let from = logbus_diskq::record::SEGMENT_HEADER;
            inspect::scan_segment(&segment_path(dir.path(), id), id, from).unwrap()
        })
        .collect();
    let sum = |f: fn(&inspect::SegmentScan) -> u64| scans.iter().map(f).sum::<u64>();
    let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
    assert_eq!(recovery.segments, ids.len() as u64);
    assert_eq!(recovery.records, sum(|s| s.records));
    assert_eq!(recovery.bytes, sum(|s| s.file_bytes));
    assert_eq!(recovery.damaged_regions, 2, "{:?}", recovery.notes);
    assert_eq!(recovery.damaged_bytes, sum(|s| s.damaged_bytes));
    assert!(recovery.damaged_bytes > 0);
    assert_eq!(
        (recovery.missing_segments, recovery.state_reset),
        (0, false)
    );
    let snapshot = q.snapshot();
    assert_eq!(snapshot.disk_bytes, segment_files_bytes(dir.path()));
    assert_eq!(snapshot.segments, ids.len() as u64 + 1);
}

/// A segment that cannot be read at all when the queue opens is one
/// damaged region, named in a note; its bytes still count as disk in use,
/// and the records of the other segments are found.
#[test]
fn a_segment_unreadable_at_opening_is_counted_and_its_disk_kept_in_the_sum() {
    let dir = tempfile::tempdir().unwrap();
    filled(dir.path());
    let ids = list_segments(dir.path()).unwrap();
    let bad = ids[1];
    let in_bad = inspect::scan_segment(
        &segment_path(dir.path(), bad),
        bad,
        logbus_diskq::record::SEGMENT_HEADER,
    )
    .unwrap()
    .records;
    let _aside = make_unreadable(dir.path(), bad);
    let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
    assert_eq!(recovery.damaged_regions, 1, "{:?}", recovery.notes);
    assert_eq!(recovery.segments, ids.len() as u64 - 1);
    assert_eq!(recovery.records, 1000 - in_bad);
    assert!(
        recovery
            .notes
            .iter()
            .any(|n| n.starts_with(&format!("segment {bad} could not be read: "))),
        "{:?}",
        recovery.notes
    );
    // Its records are reported lost, as being in that segment.
    assert_eq!(recovery.lost_records, in_bad);
    assert!(
        recovery
            .notes
            .iter()
            .any(|n| n.ends_with(&format!(": damaged or cut in segment {bad}"))),
        "{:?}",
        recovery.notes
    );
    assert_eq!(q.snapshot().disk_bytes, segment_files_bytes(dir.path()));
    assert_eq!(q.snapshot().segments, ids.len() as u64 + 1);
}

/// The segment the acknowledged position was in is gone, and only older
/// segments (put back from elsewhere) remain: the queue starts a new
/// segment there, says so, and counts the segment as missing.
#[test]
fn an_acknowledged_segment_gone_with_only_older_ones_left_is_counted_missing() {
    let dir = tempfile::tempdir().unwrap();
    filled(dir.path());
    let ids = list_segments(dir.path()).unwrap();
    let first = std::fs::read(segment_path(dir.path(), ids[0])).unwrap();
    {
        // Read into the middle of the last segment holding records.
        let (q, _) = DiskQueue::open(config(dir.path())).unwrap();
        assert_eq!(drain(&q).len(), 1000);
    }
    let left = list_segments(dir.path()).unwrap();
    for &id in &left {
        std::fs::remove_file(segment_path(dir.path(), id)).unwrap();
    }
    std::fs::write(segment_path(dir.path(), ids[0]), first).unwrap();
    let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
    assert_eq!(recovery.missing_segments, 1, "{:?}", recovery.notes);
    assert!(
        recovery
            .notes
            .iter()
            .any(|n| n.contains("is missing and nothing follows it")),
        "{:?}",
        recovery.notes
    );
    assert!(drain(&q).is_empty());
}

/// A tiny deterministic generator, so a failing case can be replayed.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

#[test]
fn bit_flips_and_truncation_cost_only_the_records_they_hit() {
    let mut rng = Lcg(7);
    for case in 0..30u64 {
        let dir = tempfile::tempdir().unwrap();
        filled(dir.path());
        let ids = list_segments(dir.path()).unwrap();
        let id = ids[rng.next(ids.len() as u64 - 1) as usize];
        let path = segment_path(dir.path(), id);
        let mut bytes = std::fs::read(&path).unwrap();
        let flips = 1 + rng.next(3);
        let truncate = case.is_multiple_of(3);
        if truncate {
            let at = rng.next(bytes.len() as u64) as usize;
            bytes.truncate(at);
        } else {
            for _ in 0..flips {
                let at = rng.next(bytes.len() as u64) as usize;
                bytes[at] ^= 1 << rng.next(8);
            }
        }
        std::fs::write(&path, &bytes).unwrap();
        let report = inspect::check(dir.path()).unwrap();
        let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
        let got = drain(&q);
        drop(q);
        let lost = 1000 - got.len() as u64;
        // In order, no duplicates, nothing invented.
        assert!(got.windows(2).all(|w| w[0] < w[1]), "case {case}");
        if truncate {
            assert!(lost <= 120, "case {case}: truncation lost {lost}");
        } else {
            // A flip costs the record it hits (or nothing: the header's id).
            assert!(lost <= flips, "case {case}: {flips} flips lost {lost}");
        }
        if lost > 0 {
            assert!(!report.is_clean(), "case {case}: check missed damage");
            assert!(recovery.damaged_regions > 0, "case {case}");
        }
    }
}

#[test]
fn random_damage_to_the_state_file_replays_or_resumes_but_never_fails() {
    let mut rng = Lcg(11);
    for case in 0..30u64 {
        let dir = tempfile::tempdir().unwrap();
        filled(dir.path());
        // Acknowledge the first 300 records.
        {
            let (q, _) = DiskQueue::open(config(dir.path())).unwrap();
            let mut n = 0;
            while n < 300 {
                n += q.try_read(300 - n).unwrap().unwrap().len();
            }
        }
        let path = dir.path().join("state");
        let mut bytes = std::fs::read(&path).unwrap();
        match case % 3 {
            0 => bytes.truncate(rng.next(bytes.len() as u64) as usize),
            _ => {
                for _ in 0..1 + rng.next(4) {
                    let at = rng.next(bytes.len() as u64) as usize;
                    bytes[at] ^= 1 << rng.next(8);
                }
            }
        }
        std::fs::write(&path, &bytes).unwrap();
        let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
        let got = drain(&q);
        // Either the surviving slot resumes after the acknowledged 300, or
        // (both slots damaged) everything still present is replayed; never
        // less than the unacknowledged 700, never out of order.
        assert!(got.len() >= 700, "case {case}: {} records", got.len());
        assert_eq!(*got.last().unwrap(), 999, "case {case}");
        // A contiguous run up to the end: replay starts at a record
        // boundary and skips nothing after it.
        let first = 1000 - got.len() as u64;
        assert_eq!(
            got,
            (first..1000).collect::<Vec<_>>(),
            "case {case}: {recovery:?}"
        );
    }
}

#[test]
fn check_reports_damage_and_repair_makes_the_queue_clean_without_losing_more() {
    let dir = tempfile::tempdir().unwrap();
    filled(dir.path());
    let ids = list_segments(dir.path()).unwrap();
    let path = segment_path(dir.path(), ids[1]);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 0x08;
    let n = bytes.len();
    bytes.truncate(n - 5);
    std::fs::write(&path, &bytes).unwrap();
    let report = inspect::check(dir.path()).unwrap();
    assert!(!report.is_clean());
    let text = report.problems.join("\n");
    assert!(text.contains(&format!("segment {}", ids[1])), "{text}");
    assert!(text.contains("offset"), "{text}");
    let before = report.unacked_records();
    let repaired = inspect::repair(dir.path()).unwrap();
    assert_eq!(repaired.segments_rewritten, 1);
    let report = inspect::check(dir.path()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.unacked_records(), before);
    let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
    assert_eq!(recovery.damaged_regions, 0);
    assert_eq!(drain(&q).len() as u64, before);
}

#[test]
fn a_missing_segment_or_a_garbage_state_file_never_stops_the_queue() {
    // Missing segment in the middle: the others are read.
    let dir = tempfile::tempdir().unwrap();
    filled(dir.path());
    let ids = list_segments(dir.path()).unwrap();
    let gone = ids[2];
    let gone_records = inspect::scan_segment(&segment_path(dir.path(), gone), gone, 16)
        .unwrap()
        .records;
    std::fs::remove_file(segment_path(dir.path(), gone)).unwrap();
    let report = inspect::check(dir.path()).unwrap();
    assert!(
        report.problems.iter().any(|p| p.contains("missing")),
        "{:?}",
        report.problems
    );
    let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
    assert_eq!(recovery.lost_records, gone_records);
    assert_eq!(drain(&q).len() as u64, 1000 - gone_records);
    // Reported once, at the start: reading past the gap counts nothing more.
    assert_eq!(q.snapshot().unreadable, 0);
    drop(q);

    // The segment the state points at is missing: resume at the next one.
    let dir = tempfile::tempdir().unwrap();
    filled(dir.path());
    let first = list_segments(dir.path()).unwrap()[0];
    std::fs::remove_file(segment_path(dir.path(), first)).unwrap();
    let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
    assert_eq!(recovery.missing_segments, 1, "{:?}", recovery.notes);
    assert!(!drain(&q).is_empty());
    drop(q);

    // Garbage state: everything present is replayed.
    let dir = tempfile::tempdir().unwrap();
    filled(dir.path());
    {
        let (q, _) = DiskQueue::open(config(dir.path())).unwrap();
        assert_eq!(drain(&q).len(), 1000);
    }
    rt().block_on(async {
        let (q, _) = DiskQueue::open(config(dir.path())).unwrap();
        q.append(batch(5000, 10)).await.unwrap();
    });
    std::fs::write(dir.path().join("state"), b"\x00garbage\xff".repeat(20)).unwrap();
    let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
    assert!(recovery.state_reset);
    assert_eq!(drain(&q), (5000..5010).collect::<Vec<_>>());
}

#[test]
fn a_full_queue_drops_newest_or_oldest_as_configured_and_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        max_disk_bytes: 3 * 4096,
        when_full: WhenFull::DropNewest,
        ..config(dir.path())
    };
    let (q, _) = DiskQueue::open(cfg).unwrap();
    let mut outcomes = BTreeMap::new();
    rt().block_on(async {
        for i in 0..40 {
            *outcomes
                .entry(format!("{:?}", q.append(batch(i * 10, 10)).await.unwrap()))
                .or_insert(0) += 1;
        }
    });
    let s = q.snapshot();
    assert!(outcomes["Dropped"] > 0, "{outcomes:?}");
    assert_eq!(s.dropped_newest, outcomes["Dropped"] * 10);
    assert_eq!(drain(&q).len() as u64 + s.dropped_newest, 400);
    assert!(q.snapshot().disk_bytes <= 3 * 4096 + 4096);
    drop(q);

    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        max_disk_bytes: 3 * 4096,
        when_full: WhenFull::DropOldest,
        ..config(dir.path())
    };
    let (q, _) = DiskQueue::open(cfg).unwrap();
    rt().block_on(async {
        for i in 0..40 {
            q.append(batch(i * 10, 10)).await.unwrap();
        }
    });
    let s = q.snapshot();
    assert!(s.dropped_oldest > 0);
    let got = drain(&q);
    assert_eq!(got.len() as u64 + s.dropped_oldest, 400);
    // What is kept is the newest.
    assert_eq!(*got.last().unwrap(), 399);
}

/// `drop_oldest` drops one unread segment, then waits: while a batch read
/// from the oldest segment is not acknowledged, dropping frees no disk, and
/// dropping every other segment would lose records for nothing. Once the
/// batch is acknowledged the append goes through.
#[test]
fn drop_oldest_drops_one_segment_per_wait_for_space() {
    let dir = tempfile::tempdir().unwrap();
    let max = 8 * 4096;
    let cfg = Config {
        max_disk_bytes: max,
        when_full: WhenFull::DropOldest,
        ..config(dir.path())
    };
    let (q, _) = DiskQueue::open(cfg).unwrap();
    let q = Arc::new(q);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut i = 0;
        while q.snapshot().disk_bytes < 4 * 4096 {
            q.append(batch(i * 10, 10)).await.unwrap();
            i += 1;
        }
        let ids = list_segments(dir.path()).unwrap();
        assert!(ids.len() >= 4, "{ids:?}");
        // A batch that does not fit, and would once the first segment goes.
        let room = max - q.snapshot().disk_bytes;
        let first_bytes = std::fs::metadata(segment_path(dir.path(), ids[0]))
            .unwrap()
            .len();
        let mut n = 1;
        while batch(9000, n).bytes() as u64 <= room {
            n += 1;
        }
        assert!(batch(9000, n).bytes() as u64 <= room + first_bytes);
        let header = logbus_diskq::record::SEGMENT_HEADER;
        let in_first = inspect::scan_segment(&segment_path(dir.path(), ids[0]), ids[0], header)
            .unwrap()
            .records;
        let held = q.try_read(7).unwrap().unwrap();
        assert_eq!(seqs(&held), (0..7).collect::<Vec<_>>());
        let waiting = {
            let q = q.clone();
            tokio::spawn(async move { q.append(batch(9000, n)).await })
        };
        while q.snapshot().full_waits == 0 {
            tokio::task::yield_now().await;
        }
        // The rest of the first segment went; nothing else did.
        assert_eq!(q.snapshot().dropped_oldest, in_first - 7);
        assert!(!waiting.is_finished());
        drop(held);
        assert_eq!(waiting.await.unwrap().unwrap(), Appended::Stored);
        let got = drain(&q);
        assert_eq!(got.first(), Some(&in_first));
        assert_eq!(
            got[got.len() - n as usize..],
            (9000..9000 + n).collect::<Vec<_>>()
        );
    });
}

#[test]
fn a_full_queue_under_backpressure_waits_for_consumers() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        max_disk_bytes: 3 * 4096,
        ..config(dir.path())
    };
    let (q, _) = DiskQueue::open(cfg).unwrap();
    let q = Arc::new(q);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let got = rt.block_on(async {
        let producer = {
            let q = q.clone();
            tokio::spawn(async move {
                for i in 0..100 {
                    q.append(batch(i * 10, 10)).await.unwrap();
                }
                q.close();
            })
        };
        // Wait (by state, not time) until the producer is held back.
        while q
            .counters()
            .full_waits
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
        {
            tokio::task::yield_now().await;
        }
        let mut got = Vec::new();
        loop {
            let readable = q.readable();
            tokio::pin!(readable);
            readable.as_mut().enable();
            if let Some(b) = q.try_read(16).unwrap() {
                got.extend(seqs(&b));
                continue;
            }
            if q.is_drained() {
                break;
            }
            readable.await;
        }
        producer.await.unwrap();
        got
    });
    assert_eq!(got, (0..1000).collect::<Vec<_>>());
    assert_eq!(q.snapshot().dropped_newest + q.snapshot().dropped_oldest, 0);
}

// ---- crashes and a full disk: a helper binary is the child ----

fn spawn_child(
    dir: &Path,
    from: u64,
    count: u64,
    consumers: usize,
    delivered: &Path,
) -> std::process::Child {
    std::process::Command::new(CHILD)
        .arg(dir)
        .args([from.to_string(), count.to_string(), consumers.to_string()])
        .arg(delivered)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn kill_9_at_random_points_loses_nothing_acknowledged_and_duplicates_are_bounded() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("q");
    let delivered = dir.path().join("delivered");
    let mut rng = Lcg(2026);
    let mut acked_upto: Option<u64> = None;
    let mut kills = 0;
    for round in 0..20 {
        let from = acked_upto.map_or(0, |a| a + 1);
        let consumers = 1 + (round % 4);
        let mut child = spawn_child(&queue, from, 1_000_000, consumers, &delivered);
        let stdout = child.stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(stdout).lines();
        // Let it acknowledge a random number of batches, then kill it.
        let wait_for = 1 + rng.next(400);
        for _ in 0..wait_for {
            let Some(Ok(line)) = lines.next() else { break };
            if let Some(n) = line.strip_prefix("acked ") {
                acked_upto = Some(n.parse().unwrap());
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Anything printed before the kill landed was acknowledged too.
        for line in lines.map_while(Result::ok) {
            if let Some(n) = line.strip_prefix("acked ") {
                acked_upto = Some(n.parse().unwrap());
            }
        }
        kills += 1;
    }
    // A last run appends nothing and drains.
    let mut child = spawn_child(&queue, 0, 0, 3, &delivered);
    let status = child.wait().unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&delivered).unwrap();
    let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        *seen.entry(line.parse().unwrap()).or_default() += 1;
    }
    let acked = acked_upto.expect("some batches were acknowledged");
    let missing: Vec<u64> = (0..=acked).filter(|s| !seen.contains_key(s)).collect();
    assert!(
        missing.is_empty(),
        "acknowledged but never delivered: {missing:?}"
    );
    let duplicates: u32 = seen.values().map(|&n| n - 1).sum();
    // Per crash: what the consumers held (≤ 4 consumers × 40 records) and
    // the producer's unacknowledged batch (≤ 37) may come again.
    let bound = kills * (4 * 40 + 37);
    assert!(duplicates <= bound, "{duplicates} duplicates > {bound}");
    eprintln!(
        "{kills} kills, {} records acknowledged, {duplicates} duplicates",
        acked + 1
    );
}

#[ignore = "needs unshare and unprivileged user namespaces (apt install util-linux); run with --include-ignored"]
#[test]
fn a_full_filesystem_holds_producers_back_until_space_returns() {
    // A 1 MiB tmpfs in a private mount namespace (unprivileged via a user
    // namespace); the test fails where the kernel does not allow that.
    let probe = std::process::Command::new("unshare")
        .args(["-Urm", "true"])
        .status();
    assert!(
        matches!(probe, Ok(s) if s.success()),
        "`unshare -Urm` is required for the disk-full test (apt install util-linux; \
         the kernel must allow unprivileged user namespaces)"
    );
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("tmpfs");
    std::fs::create_dir(&mount).unwrap();
    let delivered = dir.path().join("delivered");
    // 30,000 records of ~60 bytes: ~2 MiB through a 1 MiB filesystem.
    let script = format!(
        "mount -t tmpfs -o size=1m none {m} && exec {CHILD} {m}/q 0 30000 2 {d} hold",
        m = mount.display(),
        d = delivered.display(),
    );
    let out = std::process::Command::new("unshare")
        .args(["-Urm", "sh", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let errors: u64 = stdout
        .split("write_errors=")
        .nth(1)
        .and_then(|s| s.lines().next()?.trim().parse().ok())
        .expect("the child reports");
    // The consumers started two seconds after the disk filled: the
    // producers were held back all along, not failed.
    assert!(errors > 0, "the filesystem never filled: {stdout}");
    let text = std::fs::read_to_string(&delivered).unwrap();
    let mut got: Vec<u64> = text.lines().map(|l| l.parse().unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, (0..30000).collect::<Vec<_>>());
}

/// Dropping the queue while the disk is still full ends: the writer stops
/// retrying once told to stop (after its pause passed a second), instead
/// of holding the process on a disk that never frees up.
#[ignore = "needs unshare and unprivileged user namespaces (apt install util-linux); run with --include-ignored"]
#[test]
fn a_queue_dropped_while_the_disk_stays_full_stops_retrying() {
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("tmpfs");
    std::fs::create_dir(&mount).unwrap();
    let script = format!(
        "mount -t tmpfs -o size=1m none {m} && exec {CHILD} {m}/q 0 0 0 - abandon",
        m = mount.display(),
    );
    let mut child = std::process::Command::new("unshare")
        .args(["-Urm", "sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A writer that never gives up holds the child for ever: wait a
    // minute, which is twenty times what giving up takes, then fail.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the queue's drop did not end while the disk stayed full");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("retrying=true\ndropped write_errors="),
        "{stdout}"
    );
}

#[test]
fn a_state_pointing_past_every_remaining_segment_reads_what_comes_next() {
    // All segments removed from outside after the position moved on.
    let dir = tempfile::tempdir().unwrap();
    filled(dir.path());
    {
        let (q, _) = DiskQueue::open(config(dir.path())).unwrap();
        let mut n = 0;
        while n < 550 {
            n += q.try_read(550 - n).unwrap().unwrap().len();
        }
    }
    for id in list_segments(dir.path()).unwrap() {
        std::fs::remove_file(segment_path(dir.path(), id)).unwrap();
    }
    let (q, _) = DiskQueue::open(config(dir.path())).unwrap();
    rt().block_on(q.append(batch(7000, 5))).unwrap();
    assert_eq!(drain(&q), (7000..7005).collect::<Vec<_>>());
    drop(q);

    // Only a segment *before* the acknowledged one is left.
    let dir = tempfile::tempdir().unwrap();
    filled(dir.path());
    {
        let (q, _) = DiskQueue::open(config(dir.path())).unwrap();
        let mut n = 0;
        while n < 550 {
            n += q.try_read(550 - n).unwrap().unwrap().len();
        }
    }
    let ids = list_segments(dir.path()).unwrap();
    let acked = ids[0];
    for &id in &ids[1..] {
        std::fs::remove_file(segment_path(dir.path(), id)).unwrap();
    }
    std::fs::rename(
        segment_path(dir.path(), acked),
        segment_path(dir.path(), acked - 1),
    )
    .unwrap();
    let (q, _) = DiskQueue::open(config(dir.path())).unwrap();
    rt().block_on(q.append(batch(8000, 5))).unwrap();
    assert_eq!(drain(&q), (8000..8005).collect::<Vec<_>>());
}

#[test]
fn a_record_larger_than_the_limit_is_refused_not_stored() {
    let mut b = RecordBatch::new(false);
    assert!(!b.push(&vec![0u8; logbus_diskq::record::MAX_RECORD]));
    assert!(b.is_empty());
    assert!(b.push(&vec![0u8; 1024]));
    assert_eq!(b.len(), 1);
}

/// The largest payload a record holds (the length field counts one more
/// byte) is accepted and read back whole; one byte more is refused.
#[test]
fn the_largest_record_is_stored_and_read_back() {
    let largest = logbus_diskq::record::MAX_RECORD - 1;
    let mut b = RecordBatch::new(false);
    assert!(!b.push(&vec![7u8; largest + 1]));
    assert!(b.push(&vec![7u8; largest]));
    assert!(b.push(b"after"));
    assert_eq!(b.len(), 2);
    assert!(!b.is_empty());
    assert!(b.bytes() > largest, "{} bytes encoded", b.bytes());
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.segment_bytes = 128 << 20;
    c.max_disk_bytes = 1 << 30;
    let (q, _) = DiskQueue::open(c).unwrap();
    rt().block_on(q.append(b)).unwrap();
    let got = q.try_read(10).unwrap().unwrap();
    assert_eq!(got.len(), 2);
    assert!(!got.is_empty());
    let payloads: Vec<&[u8]> = got.payloads().collect();
    assert_eq!(payloads[0].len(), largest);
    assert!(payloads[0].iter().all(|&b| b == 7));
    assert_eq!(payloads[1], b"after");
}

#[test]
fn after_its_consumer_failed_a_full_queue_stops_holding_producers_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        max_disk_bytes: 3 * 4096,
        ..config(dir.path())
    };
    let (q, _) = DiskQueue::open(cfg).unwrap();
    let q = Arc::new(q);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // Fill it while there is room (these appends do not wait)...
        let mut i = 0;
        while q.snapshot().disk_bytes + batch(0, 10).bytes() as u64 <= 3 * 4096 {
            q.append(batch(i * 10, 10)).await.unwrap();
            i += 1;
        }
        // ...then one append waits for space nobody will free...
        let waiting = {
            let q = q.clone();
            tokio::spawn(async move { q.append(batch(9000, 10)).await })
        };
        while q.snapshot().full_waits == 0 {
            tokio::task::yield_now().await;
        }
        // ...until the consumer is declared failed.
        q.consumer_failed();
        assert_eq!(waiting.await.unwrap().unwrap(), Appended::Stored);
    });
    assert!(q.snapshot().disk_bytes > 3 * 4096);
}

/// Puts a directory where segment `id` was, so opening it works and reading
/// it fails (EISDIR) — a read error root cannot be kept out of by
/// permissions. Returns where the real file was moved.
fn make_unreadable(dir: &Path, id: u64) -> std::path::PathBuf {
    let path = segment_path(dir, id);
    let aside = dir.join("aside.seg");
    std::fs::rename(&path, &aside).unwrap();
    std::fs::create_dir(&path).unwrap();
    aside
}

/// An open queue holding records 0..500 over several segments.
fn open_with_500(dir: &Path) -> DiskQueue {
    let (q, _) = DiskQueue::open(config(dir)).unwrap();
    rt().block_on(async {
        for i in 0..10 {
            q.append(batch(i * 50, 50)).await.unwrap();
        }
    });
    q
}

#[test]
fn a_read_error_hands_out_nothing_and_the_same_records_come_back_once_it_clears() {
    let dir = tempfile::tempdir().unwrap();
    let q = open_with_500(dir.path());
    let first = list_segments(dir.path()).unwrap()[0];
    let aside = make_unreadable(dir.path(), first);
    for _ in 0..3 {
        match q.try_read(7) {
            Err(e) => assert!(e.to_string().contains("segment"), "{e}"),
            Ok(b) => panic!("read {:?} from an unreadable segment", b.map(|b| seqs(&b))),
        }
    }
    // The fault clears (the disk answers again): nothing was skipped or
    // handed out twice.
    std::fs::remove_dir(segment_path(dir.path(), first)).unwrap();
    std::fs::rename(&aside, segment_path(dir.path(), first)).unwrap();
    assert_eq!(drain(&q), (0..500).collect::<Vec<_>>());
    let s = q.snapshot();
    assert_eq!((s.unreadable, s.damaged_regions, s.unread), (0, 0, 0));
}

/// A segment that cannot even be opened (a symbolic link to itself here)
/// is an error of the read, retried, not a segment gone: once it clears,
/// every record comes, none counted as lost.
#[test]
fn a_segment_that_cannot_be_opened_is_an_error_not_a_missing_segment() {
    let dir = tempfile::tempdir().unwrap();
    let q = open_with_500(dir.path());
    let first = list_segments(dir.path()).unwrap()[0];
    let path = segment_path(dir.path(), first);
    let aside = dir.path().join("aside.seg");
    std::fs::rename(&path, &aside).unwrap();
    std::os::unix::fs::symlink(&path, &path).unwrap();
    for _ in 0..3 {
        match q.try_read(7) {
            Err(e) => assert!(
                e.to_string()
                    .contains(&format!("opening segment {first}: ")),
                "{e}"
            ),
            Ok(b) => panic!(
                "read {:?} from a segment that cannot be opened",
                b.map(|b| seqs(&b))
            ),
        }
    }
    std::fs::remove_file(&path).unwrap();
    std::fs::rename(&aside, &path).unwrap();
    assert_eq!(drain(&q), (0..500).collect::<Vec<_>>());
    let s = q.snapshot();
    assert_eq!((s.unreadable, s.damaged_regions), (0, 0));
}

/// A segment removed from outside while the queue runs: the reader skips
/// it as one damaged region and counts exactly the records it held as
/// unreadable (from the next segment's start record); the rest arrive.
#[test]
fn a_segment_removed_while_running_is_skipped_and_its_records_counted() {
    let dir = tempfile::tempdir().unwrap();
    let q = open_with_500(dir.path());
    let ids = list_segments(dir.path()).unwrap();
    assert!(ids.len() >= 4, "{ids:?}");
    let held = q.try_read(7).unwrap().unwrap();
    assert_eq!(seqs(&held), (0..7).collect::<Vec<_>>());
    drop(held);
    let gone = ids[1];
    let scan = inspect::scan_segment(
        &segment_path(dir.path(), gone),
        gone,
        logbus_diskq::record::SEGMENT_HEADER,
    )
    .unwrap();
    let from = scan.first_seq.unwrap();
    std::fs::remove_file(segment_path(dir.path(), gone)).unwrap();
    let want: Vec<u64> = (7..500)
        .filter(|n| !(from..from + scan.records).contains(n))
        .collect();
    assert_eq!(drain(&q), want);
    let s = q.snapshot();
    assert_eq!((s.damaged_regions, s.unreadable), (1, scan.records));
}

#[test]
fn a_segment_that_keeps_failing_is_skipped_and_counted_so_the_queue_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let q = open_with_500(dir.path());
    let segments = list_segments(dir.path()).unwrap();
    assert!(segments.len() >= 3, "{segments:?}");
    // How many records the first segment holds, from a copy read whole.
    let in_first = {
        let copy = tempfile::tempdir().unwrap();
        std::fs::copy(
            segment_path(dir.path(), segments[0]),
            segment_path(copy.path(), segments[0]),
        )
        .unwrap();
        let (c, _) = DiskQueue::open(config(copy.path())).unwrap();
        drain(&c).len() as u64
    };
    assert!(in_first > 0);
    let _aside = make_unreadable(dir.path(), segments[0]);
    // Ten failed tries at the same place, then the rest of the segment is
    // given up: the next read goes on with the next segment.
    let mut failures = 0;
    let rest = loop {
        match q.try_read(7) {
            Err(_) => failures += 1,
            Ok(Some(b)) => break seqs(&b),
            Ok(None) => panic!("nothing readable after {failures} failures"),
        }
        assert!(failures <= 10, "still failing after {failures} tries");
    };
    assert_eq!(failures, 10);
    assert_eq!(
        rest[0], in_first,
        "the next segment starts where the lost one ended"
    );
    let mut got = rest;
    got.extend(drain(&q));
    assert_eq!(got, (in_first..500).collect::<Vec<_>>());
    let s = q.snapshot();
    assert_eq!(
        (s.unreadable, s.damaged_regions, s.unread),
        (in_first, 1, 0)
    );
}

/// One kind of damage done to a closed queue of 1000 records.
fn damage(dir: &Path, kind: u64, rng: &mut Lcg) -> String {
    let ids = list_segments(dir).unwrap();
    let pick = |rng: &mut Lcg| ids[rng.next(ids.len() as u64) as usize];
    match kind {
        0 => {
            // Flipped bytes here and there.
            let mut what = Vec::new();
            for _ in 0..1 + rng.next(4) {
                let id = pick(rng);
                let path = segment_path(dir, id);
                let mut bytes = std::fs::read(&path).unwrap();
                let at = rng.next(bytes.len() as u64) as usize;
                bytes[at] ^= 1 << rng.next(8);
                std::fs::write(&path, &bytes).unwrap();
                what.push(format!("flip {id}@{at}"));
            }
            what.join(", ")
        }
        1 => {
            // A segment cut (the last one too).
            let id = pick(rng);
            let path = segment_path(dir, id);
            let mut bytes = std::fs::read(&path).unwrap();
            let at = rng.next(bytes.len() as u64) as usize;
            bytes.truncate(at);
            std::fs::write(&path, &bytes).unwrap();
            format!("cut {id} at {at}")
        }
        2 => {
            // A segment deleted (the last one too).
            let id = pick(rng);
            std::fs::remove_file(segment_path(dir, id)).unwrap();
            format!("deleted {id}")
        }
        _ => {
            // All of it: a flip, a cut and a deletion.
            let a = damage(dir, 0, rng);
            let b = damage(dir, 1, rng);
            let ids = list_segments(dir).unwrap();
            if ids.len() > 2 {
                let id = ids[1 + rng.next(ids.len() as u64 - 2) as usize];
                std::fs::remove_file(segment_path(dir, id)).unwrap();
                format!("{a}; {b}; deleted {id}")
            } else {
                format!("{a}; {b}")
            }
        }
    }
}

/// Every record of a damaged queue is either delivered or counted as lost,
/// exactly: flipped records, cut segments (the last one included) and
/// deleted segments, alone and together. The count is reported once: the
/// next start reports nothing more.
#[test]
fn damage_to_unacknowledged_records_is_counted_exactly_as_lost() {
    let mut rng = Lcg(23);
    for case in 0..80u64 {
        let dir = tempfile::tempdir().unwrap();
        filled(dir.path());
        let what = damage(dir.path(), case % 4, &mut rng);
        let report = inspect::check(dir.path()).unwrap();
        let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
        let mut got = Vec::new();
        while let Some(b) = q.try_read(7).unwrap() {
            got.extend(seqs(&b));
            b.into_parts().2.keep();
        }
        drop(q);
        assert!(got.windows(2).all(|w| w[0] < w[1]), "case {case} ({what})");
        assert_eq!(
            got.len() as u64 + recovery.lost_records,
            1000,
            "case {case} ({what}): {} delivered, {} counted lost; {:?}",
            got.len(),
            recovery.lost_records,
            recovery.notes
        );
        assert_eq!(
            report.lost_records, recovery.lost_records,
            "case {case} ({what})"
        );
        if recovery.lost_records > 0 {
            assert!(!report.is_clean(), "case {case} ({what})");
            assert!(
                recovery.notes.iter().any(|n| n.contains("lost")),
                "case {case}: {:?}",
                recovery.notes
            );
        }
        // Nothing was acknowledged: a second start replays the same
        // records and reports no new loss.
        let (q, again) = DiskQueue::open(config(dir.path())).unwrap();
        assert_eq!(
            again.lost_records, 0,
            "case {case} ({what}): {:?}",
            again.notes
        );
        assert_eq!(drain(&q), got, "case {case} ({what})");
    }
}

/// `--repair` always leaves a queue that checks clean and opens without
/// further loss, keeps every valid record and says what it lost.
#[test]
fn repair_always_leaves_a_clean_queue_and_says_what_it_lost() {
    let mut rng = Lcg(31);
    for case in 0..60u64 {
        let dir = tempfile::tempdir().unwrap();
        filled(dir.path());
        // Some acknowledged first, so the resume point is mid-segment.
        if case % 2 == 1 {
            let (q, _) = DiskQueue::open(config(dir.path())).unwrap();
            let mut n = 0;
            while n < 150 {
                n += q.try_read(150 - n).unwrap().unwrap().len();
            }
        }
        let acked = if case % 2 == 1 { 150 } else { 0 };
        let what = damage(dir.path(), case % 4, &mut rng);
        if case % 5 == 0 {
            std::fs::write(dir.path().join("state"), b"garbage").unwrap();
        }
        let repaired = inspect::repair(dir.path()).unwrap();
        let report = inspect::check(dir.path()).unwrap();
        assert!(
            report.is_clean(),
            "case {case} ({what}): {:?} after {repaired:?}",
            report.problems
        );
        let (q, recovery) = DiskQueue::open(config(dir.path())).unwrap();
        assert_eq!(
            recovery.lost_records, 0,
            "case {case} ({what}): {:?}",
            recovery.notes
        );
        assert_eq!(recovery.damaged_regions, 0, "case {case} ({what})");
        let got = drain(&q);
        assert!(got.windows(2).all(|w| w[0] < w[1]), "case {case} ({what})");
        assert_eq!(
            got.len() as u64,
            repaired.records_kept,
            "case {case} ({what})"
        );
        if case % 5 != 0 {
            assert_eq!(
                repaired.records_kept + repaired.records_lost,
                1000 - acked,
                "case {case} ({what}): {repaired:?}"
            );
        }
    }
}
