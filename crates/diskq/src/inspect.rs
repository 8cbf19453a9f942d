//! Looking at a queue directory from outside the queue: what recovery
//! scans, what `logbus queue inspect` / `check` print, and what `--repair`
//! rewrites. All of it goes through the same record scanner as the reader.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::cursor::{Cursor, Item};
use crate::record::{self, SEGMENT_HEADER};
use crate::state::{self, Loaded, Position, Seqs, StateFile};
use crate::{Error, list_segments, segment_path};

/// One segment as found on disk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentScan {
    pub id: u64,
    pub file_bytes: u64,
    pub header_ok: bool,
    /// Valid data records at or after the offset the scan started from.
    pub records: u64,
    /// The sequence number of the segment's first data record, from its
    /// start record (when the scan began at the header and it was intact).
    pub first_seq: Option<u64>,
    pub record_bytes: u64,
    /// `(offset, length)` of each damaged region.
    pub damaged: Vec<(u64, u64)>,
    /// `(offset, length)` of a record cut off by the end of the file.
    pub torn: Option<(u64, u64)>,
    pub damaged_regions: u64,
    pub damaged_bytes: u64,
}

impl SegmentScan {
    pub fn is_clean(&self) -> bool {
        self.header_ok && self.damaged.is_empty() && self.torn.is_none()
    }

    /// A line per problem, naming the segment and offset.
    pub fn notes(&self, id: u64) -> Vec<String> {
        let mut notes = Vec::new();
        if !self.header_ok {
            notes.push(format!("segment {id}: bad or missing header"));
        }
        for (offset, len) in &self.damaged {
            notes.push(format!(
                "segment {id}: {len} damaged bytes at offset {offset} skipped"
            ));
        }
        if let Some((offset, len)) = self.torn {
            notes.push(format!(
                "segment {id}: torn record ({len} bytes) at offset {offset}, the end of an interrupted write"
            ));
        }
        notes
    }
}

/// Scans segment `id` at `path` from `from` to its end.
pub fn scan_segment(path: &Path, id: u64, from: u64) -> io::Result<SegmentScan> {
    let file = File::open(path)?;
    let file_bytes = file.metadata()?.len();
    let mut header = [0u8; SEGMENT_HEADER as usize];
    let header_ok = file.read_exact_at(&mut header, 0).is_ok() && record::header_ok(&header, id);
    let mut scan = SegmentScan {
        id,
        file_bytes,
        header_ok,
        ..Default::default()
    };
    let mut cursor = Cursor::new(file, from.max(SEGMENT_HEADER).min(file_bytes), file_bytes);
    while let Some(item) = cursor.next_item()? {
        match item {
            Item::Record { body, .. } => {
                if let Some(seq) = record::start_seq(cursor.slice(body.clone())) {
                    scan.first_seq = Some(seq);
                } else if record::payload(cursor.slice(body.clone())).is_ok() {
                    scan.records += 1;
                    scan.record_bytes += (body.len() + record::RECORD_HEADER) as u64;
                } else {
                    scan.damaged_regions += 1;
                    scan.damaged_bytes += body.len() as u64;
                }
            }
            Item::Damaged { offset, len } => {
                scan.damaged.push((offset, len));
                scan.damaged_regions += 1;
                scan.damaged_bytes += len;
            }
            Item::Torn { offset, len } => {
                scan.torn = Some((offset, len));
                scan.damaged_regions += 1;
                scan.damaged_bytes += len;
            }
        }
    }
    Ok(scan)
}

/// What the sequence numbers say about the unacknowledged records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accounting {
    /// Records that were stored and are gone (deleted or cut segments,
    /// damage), not reported before.
    pub lost: u64,
    /// One line per new loss, naming the records and where they were.
    pub notes: Vec<String>,
    /// Every range of sequence numbers missing now, reported before or not.
    pub missing: Vec<(u64, u64)>,
    /// The sequence number the next stored record gets.
    pub next_seq: u64,
    /// The sequence number of the first record at the resume position,
    /// when known.
    pub resume_seq: Option<u64>,
}

/// Counts what is missing, by sequence number. Each segment's start
/// record says which record it begins with; the state says where the
/// acknowledged position is in that numbering and how far records were
/// known to be on stable storage. So records missing between two
/// segments (a deleted segment, a cut or damaged one) and at the end
/// (records the last state save saw stored) are counted exactly; records
/// written after the last save that did not survive a crash are a torn
/// tail, not a loss. `scans` are the segments present from the resume
/// position on, in order, the first scanned from the resume offset;
/// `reported` are ranges an earlier start or repair already reported.
pub fn account(seqs: Option<Seqs>, scans: &[SegmentScan], reported: &[(u64, u64)]) -> Accounting {
    let mut out = Accounting::default();
    let mut expected = seqs.map(|s| s.acked);
    let mut previous: Option<u64> = None;
    let gone = |from: u64, to: u64, where_: String, out: &mut Accounting| {
        out.missing.push((from, to));
        let new = (to - from) - overlap(from, to, reported);
        if new > 0 {
            out.lost += new;
            out.notes.push(format!(
                "{new} records lost (sequence numbers {from}..{to}): {where_}"
            ));
        }
    };
    for (i, scan) in scans.iter().enumerate() {
        if let Some(first) = scan.first_seq {
            if let Some(e) = expected
                && first > e
            {
                let where_ = match previous {
                    Some(p) if scan.id > p + 1 => format!(
                        "segments {}..{} are gone, or segment {p} was cut",
                        p + 1,
                        scan.id - 1
                    ),
                    Some(p) => format!("damaged or cut in segment {p}"),
                    None => format!("segments before {} are gone", scan.id),
                };
                gone(e, first, where_, &mut out);
            }
            expected = Some(first);
        }
        if i == 0 {
            out.resume_seq = expected;
        }
        expected = expected.map(|e| e.saturating_add(scan.records));
        previous = Some(scan.id);
    }
    if let (Some(s), Some(e)) = (seqs, expected)
        && s.stored > e
    {
        let where_ = format!(
            "they were stored, and the end of the queue{} is cut or gone",
            previous
                .map(|p| format!(" (segment {p})"))
                .unwrap_or_default()
        );
        gone(e, s.stored, where_, &mut out);
    }
    out.next_seq = expected
        .unwrap_or(0)
        .max(seqs.map_or(0, |s| s.stored.max(s.acked)));
    if scans.is_empty() {
        out.resume_seq = seqs.map(|s| s.acked);
    }
    out
}

/// How many of `from..to` the ranges cover (they do not overlap each other).
pub fn overlap(from: u64, to: u64, ranges: &[(u64, u64)]) -> u64 {
    ranges
        .iter()
        .map(|&(a, b)| b.min(to).saturating_sub(a.max(from)))
        .sum()
}

/// The file listing the sequence ranges whose loss has been reported, so
/// that each loss is reported once (by the start or repair that found it).
pub fn reported_path(dir: &Path) -> PathBuf {
    dir.join("lost")
}

/// The ranges in the reported-loss file (`from to` per line); a missing or
/// damaged file reads as what it still holds, at worst nothing (a loss is
/// then reported again, never hidden).
pub fn read_reported(dir: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(reported_path(dir))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_once(' ')?;
            let (a, b) = (a.parse().ok()?, b.parse().ok()?);
            (a < b).then_some((a, b))
        })
        .collect()
}

/// Writes the ranges missing now as reported (replacing the file).
pub fn write_reported(dir: &Path, missing: &[(u64, u64)]) -> io::Result<()> {
    let text: String = missing.iter().map(|(a, b)| format!("{a} {b}\n")).collect();
    let tmp = dir.join("lost.tmp");
    std::fs::write(&tmp, text)?;
    File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, reported_path(dir))
}

/// The state file as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateReport {
    Missing,
    Garbage,
    Valid {
        generation: u64,
        acked: Position,
        seqs: Option<Seqs>,
    },
}

/// What `queue inspect` and `queue check` show.
#[derive(Debug, Clone)]
pub struct Report {
    pub dir: PathBuf,
    pub state: StateReport,
    /// Where reading resumes at the next start.
    pub resume: Position,
    /// Every segment present, scanned whole; `unacked` per segment below.
    pub segments: Vec<SegmentScan>,
    /// Records at or after `resume` in each segment (same order).
    pub unacked: Vec<u64>,
    /// Where the last segment ends (the writer's last position).
    pub writer_end: Option<Position>,
    /// Records stored and gone (see [`account`]), not reported before.
    pub lost_records: u64,
    pub problems: Vec<String>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
    pub fn unacked_records(&self) -> u64 {
        self.unacked.iter().sum()
    }
}

/// Where a queue resumes, given its state and the segments present, and
/// what about that is worth saying. The same rule as opening the queue.
pub(crate) fn resume_point(loaded: &Loaded, ids: &[u64]) -> (Position, Vec<String>) {
    let first = Position {
        segment: ids.first().copied().unwrap_or(1),
        offset: SEGMENT_HEADER,
    };
    match loaded {
        Loaded::Valid(saved) => {
            if ids.contains(&saved.acked.segment) {
                (saved.acked, Vec::new())
            } else if ids.is_empty() {
                // Everything was acknowledged (and the segments removed):
                // the writer starts that segment afresh.
                (
                    Position {
                        segment: saved.acked.segment.max(1),
                        offset: SEGMENT_HEADER,
                    },
                    Vec::new(),
                )
            } else if let Some(&next) = ids.iter().find(|&&id| id > saved.acked.segment) {
                (
                    Position {
                        segment: next,
                        offset: SEGMENT_HEADER,
                    },
                    vec![format!(
                        "segment {} (where the acknowledged position was) is missing; resuming at segment {next}",
                        saved.acked.segment
                    )],
                )
            } else {
                // Everything up to a segment that is gone was acknowledged
                // and nothing after it exists: start afresh there.
                (
                    Position {
                        segment: saved.acked.segment,
                        offset: SEGMENT_HEADER,
                    },
                    vec![format!(
                        "segment {} (where the acknowledged position was) is missing and nothing follows it; starting a new segment there",
                        saved.acked.segment
                    )],
                )
            }
        }
        Loaded::Garbage => (
            first,
            vec!["the state file is damaged; every record present will be replayed".into()],
        ),
        Loaded::Missing if !ids.is_empty() => (
            first,
            vec!["the state file is missing; every record present will be replayed".into()],
        ),
        Loaded::Missing => (first, Vec::new()),
    }
}

/// Reads a queue directory without changing it (safe while the queue runs;
/// a running queue's active segment may show a torn tail mid-write).
pub fn check(dir: &Path) -> io::Result<Report> {
    if !dir.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("`{}` is not a queue directory", dir.display()),
        ));
    }
    let ids = list_segments(dir)?;
    let loaded = state::load(&dir.join("state"))?;
    let (resume, mut problems) = resume_point(&loaded, &ids);
    let mut segments = Vec::new();
    let mut unacked = Vec::new();
    let mut from_resume = Vec::new();
    for &id in &ids {
        let path = segment_path(dir, id);
        let whole = scan_segment(&path, id, SEGMENT_HEADER)?;
        problems.extend(whole.notes(id));
        let after = if id < resume.segment {
            None
        } else if id == resume.segment && resume.offset != SEGMENT_HEADER {
            Some(scan_segment(&path, id, resume.offset)?)
        } else {
            Some(whole.clone())
        };
        unacked.push(after.as_ref().map_or(0, |s| s.records));
        from_resume.extend(after);
        segments.push(whole);
    }
    let seqs = match &loaded {
        Loaded::Valid(saved) => saved.seqs,
        _ => None,
    };
    let accounting = account(seqs, &from_resume, &read_reported(dir));
    problems.extend(accounting.notes);
    // Gaps in the numbering inside the unacknowledged range.
    for pair in ids.windows(2) {
        if pair[1] > pair[0] + 1 && pair[1] > resume.segment {
            problems.push(format!(
                "segments {}..{} are missing",
                pair[0] + 1,
                pair[1] - 1
            ));
        }
    }
    let writer_end = segments.last().map(|s| Position {
        segment: s.id,
        offset: s.file_bytes,
    });
    Ok(Report {
        dir: dir.to_owned(),
        state: match loaded {
            Loaded::Missing => StateReport::Missing,
            Loaded::Garbage => StateReport::Garbage,
            Loaded::Valid(s) => StateReport::Valid {
                generation: s.generation,
                acked: s.acked,
                seqs: s.seqs,
            },
        },
        resume,
        segments,
        unacked,
        writer_end,
        lost_records: accounting.lost,
        problems,
    })
}

/// What `--repair` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Repaired {
    pub segments_rewritten: u64,
    /// Acknowledged segments deleted.
    pub segments_removed: u64,
    /// Segments given new numbers to close a gap left by missing ones.
    pub segments_renumbered: u64,
    pub records_kept: u64,
    /// Records that were stored and are gone for good (see [`account`]);
    /// reported here once, and not again at the next start.
    pub records_lost: u64,
    pub bytes_dropped: u64,
    pub state_rewritten: bool,
    /// One line per thing dropped or changed.
    pub notes: Vec<String>,
}

/// Rewrites the queue so that it opens and checks clean, keeping every
/// valid unacknowledged record and saying what it dropped: damaged or cut
/// segments are rewritten with only their valid records, acknowledged
/// segments are removed, segments after a gap are renumbered to close it,
/// and the state is rewritten to point at the first unacknowledged record
/// (its sequence numbers marking the losses as reported). Takes the
/// queue's lock (fails if it is in use).
pub fn repair(dir: &Path) -> Result<Repaired, Error> {
    let err = |action: &str| {
        let action = action.to_owned();
        move |source| Error::Io {
            dir: dir.to_owned(),
            action,
            source,
        }
    };
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))
        .map_err(err("opening the lock file"))?;
    crate::lock_queue(&lock_file, dir)?;
    let ids = list_segments(dir).map_err(err("listing segments"))?;
    let loaded = state::load(&dir.join("state")).map_err(err("reading state"))?;
    let (mut resume, notes) = resume_point(&loaded, &ids);
    let mut repaired = Repaired {
        state_rewritten: !notes.is_empty() || !matches!(loaded, Loaded::Valid(_)),
        notes,
        ..Default::default()
    };
    // What stays: every segment from the resume position on, scanned whole
    // (to see damage anywhere) and from where reading resumes.
    let mut kept = Vec::new();
    for &id in &ids {
        let path = segment_path(dir, id);
        if id < resume.segment {
            std::fs::remove_file(&path).map_err(err("removing an acknowledged segment"))?;
            repaired.segments_removed += 1;
            continue;
        }
        let from = if id == resume.segment {
            resume.offset
        } else {
            SEGMENT_HEADER
        };
        let whole = scan_segment(&path, id, SEGMENT_HEADER).map_err(err("reading a segment"))?;
        let unacked = if from != SEGMENT_HEADER {
            scan_segment(&path, id, from).map_err(err("reading a segment"))?
        } else {
            whole.clone()
        };
        kept.push((id, from, whole, unacked));
    }
    let seqs = match &loaded {
        Loaded::Valid(saved) => saved.seqs,
        _ => None,
    };
    let scans: Vec<SegmentScan> = kept.iter().map(|(.., s)| s.clone()).collect();
    let accounting = account(seqs, &scans, &read_reported(dir));
    repaired.records_lost = accounting.lost;
    repaired.notes.extend(accounting.notes.iter().cloned());
    // Rewrite what is damaged, cut or misnumbered, in order; numbers close
    // up from the resume segment on.
    let mut expected = accounting.resume_seq;
    for (k, (id, from, whole, unacked)) in kept.into_iter().enumerate() {
        let new_id = resume.segment + k as u64;
        let first_seq = if k == 0 {
            accounting.resume_seq
        } else {
            unacked.first_seq.or(expected)
        };
        expected = first_seq.map(|f| f + unacked.records);
        let path = segment_path(dir, id);
        repaired.records_kept += unacked.records;
        if whole.is_clean() && new_id == id {
            continue;
        }
        let file = File::open(&path).map_err(err("reading a segment"))?;
        let len = file.metadata().map_err(err("reading a segment"))?.len();
        let mut out = Vec::from(record::segment_header(new_id));
        if let Some(seq) = first_seq {
            record::encode_start(seq, &mut out);
        }
        let mut cursor = Cursor::new(file, from.max(SEGMENT_HEADER).min(len), len);
        while let Some(item) = cursor.next_item().map_err(err("reading a segment"))? {
            if let Item::Record { body, .. } = item {
                let body = cursor.slice(body);
                if record::start_seq(body).is_none() && record::payload(body).is_ok() {
                    // Re-frame the body as it was (flags and all).
                    let len = body.len() as u32;
                    out.extend_from_slice(&record::RECORD_MAGIC);
                    out.extend_from_slice(&len.to_le_bytes());
                    let crc = crc32c::crc32c_append(crc32c::crc32c(&len.to_le_bytes()), body);
                    out.extend_from_slice(&crc.to_le_bytes());
                    out.extend_from_slice(body);
                }
            }
        }
        repaired.bytes_dropped += whole.damaged_bytes;
        let tmp = dir.join(format!("{new_id:020}.seg.repair"));
        std::fs::write(&tmp, &out).map_err(err("writing a repaired segment"))?;
        File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(err("syncing a repaired segment"))?;
        std::fs::rename(&tmp, segment_path(dir, new_id)).map_err(err("replacing a segment"))?;
        if new_id != id {
            std::fs::remove_file(&path).map_err(err("removing a renumbered segment"))?;
            repaired.segments_renumbered += 1;
            repaired
                .notes
                .push(format!("segment {id} is now segment {new_id}"));
        }
        if !whole.is_clean() {
            repaired.notes.extend(whole.notes(id));
        }
        repaired.segments_rewritten += 1;
        if k == 0 {
            resume.offset = SEGMENT_HEADER;
            repaired.state_rewritten = true;
        }
    }
    let generation = match loaded {
        Loaded::Valid(s) => s.generation,
        _ => 0,
    };
    let seqs = Seqs {
        acked: accounting.resume_seq.unwrap_or(0),
        stored: accounting.next_seq,
    };
    write_reported(dir, &accounting.missing).map_err(err("writing the reported losses"))?;
    let state = StateFile::create(&dir.join("state"), generation, resume, seqs)
        .map_err(err("writing state"))?;
    state.sync().map_err(err("syncing state"))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err("syncing the directory"))?;
    Ok(repaired)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Saved;

    fn scan(id: u64, first_seq: Option<u64>, records: u64) -> SegmentScan {
        SegmentScan {
            id,
            header_ok: true,
            first_seq,
            records,
            ..Default::default()
        }
    }

    fn seqs(acked: u64, stored: u64) -> Option<Seqs> {
        Some(Seqs { acked, stored })
    }

    #[test]
    fn overlap_counts_only_what_the_ranges_cover_inside() {
        let ranges = [(0, 10), (20, 30)];
        assert_eq!(overlap(5, 25, &ranges), 10);
        assert_eq!(overlap(10, 20, &ranges), 0);
        assert_eq!(overlap(0, 30, &ranges), 20);
        assert_eq!(overlap(9, 21, &ranges), 2);
        assert_eq!(overlap(30, 40, &ranges), 0);
    }

    #[test]
    fn reported_ranges_round_trip_and_damaged_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_reported(dir.path()).is_empty(), "no file: nothing");
        write_reported(dir.path(), &[(1, 5), (10, 12)]).unwrap();
        assert_eq!(read_reported(dir.path()), [(1, 5), (10, 12)]);
        assert!(!dir.path().join("lost.tmp").exists());
        std::fs::write(reported_path(dir.path()), "1 5\nx y\n7 7\n9 3\n4\n10 12\n").unwrap();
        assert_eq!(read_reported(dir.path()), [(1, 5), (10, 12)]);
    }

    #[test]
    fn nothing_missing_counts_nothing() {
        let scans = [scan(1, Some(0), 10), scan(2, Some(10), 5)];
        let a = account(seqs(0, 15), &scans, &[]);
        assert_eq!(a.lost, 0);
        assert!(a.missing.is_empty() && a.notes.is_empty());
        assert_eq!((a.next_seq, a.resume_seq), (15, Some(0)));
        // Records stored after the last save that survived: counted on.
        let a = account(seqs(0, 12), &scans, &[]);
        assert_eq!((a.lost, a.next_seq), (0, 15));
        // No sequence numbers saved (a format-1 state): no accounting, the
        // numbering taken from the segments.
        let a = account(None, &scans, &[]);
        assert_eq!((a.lost, a.next_seq, a.resume_seq), (0, 15, Some(0)));
        // A segment without a start record continues the count.
        let a = account(seqs(0, 15), &[scan(1, Some(0), 10), scan(2, None, 5)], &[]);
        assert_eq!((a.lost, a.next_seq), (0, 15));
    }

    #[test]
    fn losses_are_counted_exactly_and_say_where() {
        // A segment gone between two.
        let a = account(
            seqs(0, 30),
            &[scan(1, Some(0), 10), scan(3, Some(20), 10)],
            &[],
        );
        assert_eq!(a.lost, 10);
        assert_eq!(a.missing, [(10, 20)]);
        assert_eq!(
            a.notes,
            [
                "10 records lost (sequence numbers 10..20): segments 2..2 are gone, or segment 1 was cut"
            ]
        );
        // Records missing at the end of a segment followed by the next.
        let a = account(
            seqs(0, 30),
            &[scan(1, Some(0), 8), scan(2, Some(10), 20)],
            &[],
        );
        assert_eq!(
            a.notes,
            ["2 records lost (sequence numbers 8..10): damaged or cut in segment 1"]
        );
        // Segments before the first present, after the acknowledged position.
        let a = account(seqs(5, 30), &[scan(4, Some(12), 18)], &[]);
        assert_eq!(
            a.notes,
            ["7 records lost (sequence numbers 5..12): segments before 4 are gone"]
        );
        assert_eq!(a.resume_seq, Some(12));
        // The end, stored and gone.
        let a = account(
            seqs(0, 40),
            &[scan(1, Some(0), 10), scan(2, Some(10), 20)],
            &[],
        );
        assert_eq!(
            a.notes,
            [
                "10 records lost (sequence numbers 30..40): they were stored, and the end of the queue (segment 2) is cut or gone"
            ]
        );
        assert_eq!(a.next_seq, 40);
        // Every segment gone: the position's numbering, the end lost.
        let a = account(seqs(7, 9), &[], &[]);
        assert_eq!((a.lost, a.resume_seq, a.next_seq), (2, Some(7), 9));
        assert_eq!(
            a.notes,
            [
                "2 records lost (sequence numbers 7..9): they were stored, and the end of the queue is cut or gone"
            ]
        );
    }

    #[test]
    fn a_loss_reported_before_is_missing_but_not_counted_again() {
        let scans = [scan(1, Some(0), 10), scan(3, Some(20), 10)];
        let a = account(seqs(0, 30), &scans, &[(10, 20)]);
        assert_eq!((a.lost, a.missing.as_slice()), (0, &[(10, 20)][..]));
        assert!(a.notes.is_empty());
        // Partly reported: only the rest is new.
        let a = account(seqs(0, 30), &scans, &[(10, 14)]);
        assert_eq!(a.lost, 6);
        assert!(a.notes[0].starts_with("6 records lost (sequence numbers 10..20)"));
    }

    fn saved(segment: u64, offset: u64) -> Loaded {
        Loaded::Valid(Saved {
            generation: 3,
            acked: Position { segment, offset },
            seqs: None,
        })
    }

    fn at(segment: u64, offset: u64) -> Position {
        Position { segment, offset }
    }

    #[test]
    fn the_resume_point_follows_the_state_and_says_what_it_could_not() {
        let h = SEGMENT_HEADER;
        assert_eq!(
            resume_point(&saved(2, 100), &[1, 2, 3]),
            (at(2, 100), vec![])
        );
        // Every segment acknowledged and removed.
        assert_eq!(resume_point(&saved(4, 100), &[]), (at(4, h), vec![]));
        assert_eq!(resume_point(&saved(0, 100), &[]), (at(1, h), vec![]));
        // The acknowledged segment gone, nothing after it.
        assert_eq!(
            resume_point(&saved(5, 100), &[2, 3]),
            (
                at(5, h),
                vec!["segment 5 (where the acknowledged position was) is missing and nothing follows it; starting a new segment there".to_string()]
            )
        );
        // The acknowledged segment gone: the next one present.
        assert_eq!(
            resume_point(&saved(5, 100), &[4, 7, 9]),
            (
                at(7, h),
                vec!["segment 5 (where the acknowledged position was) is missing; resuming at segment 7".to_string()]
            )
        );
        assert_eq!(
            resume_point(&Loaded::Garbage, &[3, 4]),
            (
                at(3, h),
                vec![
                    "the state file is damaged; every record present will be replayed".to_string()
                ]
            )
        );
        assert_eq!(
            resume_point(&Loaded::Missing, &[3, 4]),
            (
                at(3, h),
                vec![
                    "the state file is missing; every record present will be replayed".to_string()
                ]
            )
        );
        assert_eq!(resume_point(&Loaded::Missing, &[]), (at(1, h), vec![]));
    }

    #[test]
    fn a_scan_notes_each_problem_by_segment_and_offset() {
        let clean = scan(4, Some(0), 3);
        assert!(clean.is_clean() && clean.notes(4).is_empty());
        let bad = SegmentScan {
            header_ok: false,
            damaged: vec![(100, 7), (300, 9)],
            torn: Some((500, 12)),
            ..clean.clone()
        };
        assert!(!bad.is_clean());
        assert_eq!(
            bad.notes(4),
            [
                "segment 4: bad or missing header",
                "segment 4: 7 damaged bytes at offset 100 skipped",
                "segment 4: 9 damaged bytes at offset 300 skipped",
                "segment 4: torn record (12 bytes) at offset 500, the end of an interrupted write",
            ]
        );
        for one in [
            SegmentScan {
                header_ok: false,
                ..clean.clone()
            },
            SegmentScan {
                damaged: vec![(1, 1)],
                ..clean.clone()
            },
            SegmentScan {
                torn: Some((1, 1)),
                ..clean.clone()
            },
        ] {
            assert!(!one.is_clean(), "{one:?}");
        }
    }
    /// A record framed around `body` as the writer frames it (valid CRC),
    /// whatever the body holds.
    fn frame(body: &[u8], out: &mut Vec<u8>) {
        let len = (body.len() as u32).to_le_bytes();
        out.extend_from_slice(&record::RECORD_MAGIC);
        out.extend_from_slice(&len);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&len), body);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(body);
    }

    #[test]
    fn a_segment_scan_counts_records_and_every_damaged_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg");
        let mut seg = record::segment_header(7).to_vec();
        record::encode_start(100, &mut seg);
        let first_data = seg.len() as u64;
        for payload in [&b"a"[..], b"bb", b"ccc"] {
            record::encode(payload, false, &mut seg);
        }
        let after_three = seg.len() as u64;
        // A record whose frame is whole but whose body is not a payload
        // (flagged LZ4, not LZ4): damaged, by its body's length.
        frame(&[record::FLAG_LZ4, 0xff, 0xff, 0xff, 0xff, 1, 2], &mut seg);
        // Ten bytes of garbage between records.
        let garbage_at = seg.len() as u64;
        seg.extend_from_slice(&[0u8; 10]);
        record::encode(b"dddd", false, &mut seg);
        // A record cut by the end of the file.
        let torn_at = seg.len() as u64;
        let mut cut = Vec::new();
        record::encode(b"eeeeeeeeee", false, &mut cut);
        seg.extend_from_slice(&cut[..15]);
        std::fs::write(&path, &seg).unwrap();

        let scan = scan_segment(&path, 7, SEGMENT_HEADER).unwrap();
        assert_eq!(scan.id, 7);
        assert_eq!(scan.file_bytes, seg.len() as u64);
        assert!(scan.header_ok);
        assert_eq!(scan.first_seq, Some(100));
        assert_eq!(scan.records, 4);
        // Each data record: the 12-byte header, the flags byte, the payload.
        assert_eq!(scan.record_bytes, (13 + 1) + (13 + 2) + (13 + 3) + (13 + 4));
        assert_eq!(scan.damaged, [(garbage_at, 10)]);
        assert_eq!(scan.torn, Some((torn_at, 15)));
        assert_eq!(scan.damaged_regions, 3);
        assert_eq!(scan.damaged_bytes, 7 + 10 + 15);
        assert!(!scan.is_clean());

        // From an offset: only what follows (no start record seen).
        let scan = scan_segment(&path, 7, after_three).unwrap();
        assert_eq!((scan.records, scan.first_seq), (1, None));
        let scan = scan_segment(&path, 7, first_data).unwrap();
        assert_eq!(scan.records, 4);
        // Another segment's number in the header: not this segment's.
        assert!(!scan_segment(&path, 8, SEGMENT_HEADER).unwrap().header_ok);
        // A file shorter than a header.
        std::fs::write(&path, &seg[..10]).unwrap();
        let scan = scan_segment(&path, 7, SEGMENT_HEADER).unwrap();
        assert!(!scan.header_ok);
        assert_eq!((scan.records, scan.file_bytes), (0, 10));
    }
    /// Segment `id` starting at sequence number `first_seq`, holding
    /// `payloads` (and `garbage` zero bytes after the first); returns the
    /// offset of each data record and the file's bytes.
    fn write_segment(
        dir: &Path,
        id: u64,
        first_seq: u64,
        payloads: &[&[u8]],
        garbage: usize,
    ) -> (Vec<u64>, Vec<u8>) {
        let mut seg = record::segment_header(id).to_vec();
        record::encode_start(first_seq, &mut seg);
        let mut offsets = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            offsets.push(seg.len() as u64);
            record::encode(p, false, &mut seg);
            if i == 0 {
                seg.extend(std::iter::repeat_n(0u8, garbage));
            }
        }
        std::fs::write(segment_path(dir, id), &seg).unwrap();
        (offsets, seg)
    }

    fn write_state(dir: &Path, acked: Position, acked_seq: u64, stored: u64) {
        let state = StateFile::create(
            &dir.join("state"),
            5,
            acked,
            Seqs {
                acked: acked_seq,
                stored,
            },
        )
        .unwrap();
        state.sync().unwrap();
    }

    /// Segment 1 acknowledged, segment 2 acknowledged up to its second
    /// record, segment 3 gone (records 5 and 6), segment 4 with ten bytes
    /// of damage: check reports it all exactly, repair removes, renumbers
    /// and rewrites, and the queue then checks clean.
    #[test]
    fn check_and_repair_say_exactly_what_they_found_and_did() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_segment(d, 1, 0, &[b"r0", b"r1"], 0);
        let (offsets, _) = write_segment(d, 2, 2, &[b"r2", b"r3", b"r4"], 0);
        let (seg4_offsets, mut seg4) = write_segment(d, 4, 7, &[b"r7", b"r8"], 10);
        // And a whole frame whose body is not a record, at its end.
        frame(&[record::FLAG_LZ4, 0xff, 0xff, 0xff, 0xff], &mut seg4);
        std::fs::write(segment_path(d, 4), &seg4).unwrap();
        let resume = at(2, offsets[1]);
        write_state(d, resume, 3, 9);

        let report = check(d).unwrap();
        assert_eq!(report.resume, resume);
        assert_eq!(report.unacked, [0, 2, 2]);
        assert_eq!(report.unacked_records(), 4);
        let damage_at = seg4_offsets[0] + 12 + 1 + 2;
        assert_eq!(
            report.problems,
            [
                format!("segment 4: 10 damaged bytes at offset {damage_at} skipped"),
                "2 records lost (sequence numbers 5..7): segments 3..3 are gone, or segment 2 was cut".into(),
                "segments 3..3 are missing".into(),
            ]
        );
        assert_eq!(report.lost_records, 2);
        assert_eq!(report.writer_end, Some(at(4, seg4.len() as u64)));
        let StateReport::Valid {
            acked,
            seqs: s,
            generation: generation_before,
        } = report.state
        else {
            panic!("{:?}", report.state)
        };
        assert_eq!((acked, s), (resume, seqs(3, 9)));

        let repaired = repair(d).unwrap();
        assert_eq!(
            repaired,
            Repaired {
                segments_rewritten: 1,
                segments_removed: 1,
                segments_renumbered: 1,
                records_kept: 4,
                records_lost: 2,
                // The garbage and the bad frame's body.
                bytes_dropped: 10 + 5,
                state_rewritten: false,
                notes: vec![
                    "2 records lost (sequence numbers 5..7): segments 3..3 are gone, or segment 2 was cut".into(),
                    "segment 4 is now segment 3".into(),
                    format!("segment 4: 10 damaged bytes at offset {damage_at} skipped"),
                ],
            }
        );
        assert_eq!(list_segments(d).unwrap(), [2, 3]);
        // Segment 3 is segment 4's records under a new header, nothing else.
        std::fs::create_dir(d.join("x")).unwrap();
        let (_, expected) = write_segment(&d.join("x"), 3, 7, &[b"r7", b"r8"], 0);
        assert_eq!(std::fs::read(segment_path(d, 3)).unwrap(), expected);
        let report = check(d).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
        assert_eq!((report.resume, report.unacked_records()), (resume, 4));
        // The state was written anew with a later generation.
        let StateReport::Valid { generation, .. } = report.state else {
            panic!("{:?}", report.state)
        };
        assert!(
            generation > generation_before,
            "{generation} <= {generation_before}"
        );
        // The loss was reported once: not again.
        assert_eq!(report.lost_records, 0);
        assert_eq!(read_reported(d), [(5, 7)]);
    }

    /// The acknowledged segment is gone: the queue resumes at the next one
    /// present, which check says once (not also as a gap), and repair
    /// rewrites the state.
    #[test]
    fn a_missing_acknowledged_segment_is_said_once_and_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_segment(d, 1, 0, &[b"r0", b"r1"], 0);
        write_segment(d, 3, 4, &[b"r4", b"r5"], 0);
        write_state(d, at(2, SEGMENT_HEADER), 2, 6);
        let resumed =
            "segment 2 (where the acknowledged position was) is missing; resuming at segment 3";
        let lost = "2 records lost (sequence numbers 2..4): segments before 3 are gone";
        let report = check(d).unwrap();
        assert_eq!(report.resume, at(3, SEGMENT_HEADER));
        assert_eq!(report.problems, [resumed, lost]);
        assert_eq!(report.unacked, [0, 2]);
        let repaired = repair(d).unwrap();
        assert_eq!(
            repaired,
            Repaired {
                segments_removed: 1,
                records_kept: 2,
                records_lost: 2,
                state_rewritten: true,
                notes: vec![resumed.into(), lost.into()],
                ..Default::default()
            }
        );
        let report = check(d).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
        assert_eq!(report.resume, at(3, SEGMENT_HEADER));
    }
}
