//! Looking at a queue directory from outside the queue: what recovery
//! scans, what `logbus queue inspect` / `check` print, and what `--repair`
//! rewrites. All of it goes through the same record scanner as the reader.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::cursor::{Cursor, Item};
use crate::record::{self, SEGMENT_HEADER};
use crate::state::{self, Loaded, Position, StateFile};
use crate::{Error, list_segments, segment_path};

/// One segment as found on disk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentScan {
    pub id: u64,
    pub file_bytes: u64,
    pub header_ok: bool,
    /// Valid records at or after the offset the scan started from.
    pub records: u64,
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
                if record::payload(cursor.slice(body.clone())).is_ok() {
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

/// The state file as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateReport {
    Missing,
    Garbage,
    Valid { generation: u64, acked: Position },
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
            } else if !ids.iter().any(|&id| id > saved.acked.segment) {
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
                (saved.acked, Vec::new())
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
    for &id in &ids {
        let path = segment_path(dir, id);
        let whole = scan_segment(&path, id, SEGMENT_HEADER)?;
        problems.extend(whole.notes(id));
        let after = if id < resume.segment {
            0
        } else if id == resume.segment && resume.offset > SEGMENT_HEADER {
            scan_segment(&path, id, resume.offset)?.records
        } else {
            whole.records
        };
        unacked.push(after);
        segments.push(whole);
    }
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
            },
        },
        resume,
        segments,
        unacked,
        writer_end,
        problems,
    })
}

/// What `--repair` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Repaired {
    pub segments_rewritten: u64,
    pub segments_removed: u64,
    pub records_kept: u64,
    pub bytes_dropped: u64,
    pub state_rewritten: bool,
}

/// Rewrites the queue so that it checks clean: damaged segments are
/// rewritten with only their valid unacknowledged records, acknowledged
/// segments are removed, and the state is rewritten to point at the first
/// unacknowledged record. Takes the queue's lock (fails if it is in use).
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
        ..Default::default()
    };
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
        let scan = scan_segment(&path, id, from).map_err(err("reading a segment"))?;
        if scan.is_clean() {
            repaired.records_kept += scan.records;
            continue;
        }
        // Copy the valid records into a fresh file, then swap it in.
        let tmp = dir.join(format!("{id:020}.seg.repair"));
        let file = File::open(&path).map_err(err("reading a segment"))?;
        let len = file.metadata().map_err(err("reading a segment"))?.len();
        let mut out = Vec::from(record::segment_header(id));
        let mut cursor = Cursor::new(file, from.max(SEGMENT_HEADER).min(len), len);
        while let Some(item) = cursor.next_item().map_err(err("reading a segment"))? {
            if let Item::Record { body, .. } = item {
                let body = cursor.slice(body);
                if record::payload(body).is_ok() {
                    // Re-frame the body as it was (flags and all).
                    let len = body.len() as u32;
                    out.extend_from_slice(&record::RECORD_MAGIC);
                    out.extend_from_slice(&len.to_le_bytes());
                    let crc = crc32c::crc32c_append(crc32c::crc32c(&len.to_le_bytes()), body);
                    out.extend_from_slice(&crc.to_le_bytes());
                    out.extend_from_slice(body);
                    repaired.records_kept += 1;
                }
            }
        }
        repaired.bytes_dropped += scan.damaged_bytes;
        std::fs::write(&tmp, &out).map_err(err("writing a repaired segment"))?;
        File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(err("syncing a repaired segment"))?;
        std::fs::rename(&tmp, &path).map_err(err("replacing a segment"))?;
        repaired.segments_rewritten += 1;
        if id == resume.segment {
            resume.offset = SEGMENT_HEADER;
            repaired.state_rewritten = true;
        }
    }
    let generation = match loaded {
        Loaded::Valid(s) => s.generation,
        _ => 0,
    };
    let state =
        StateFile::create(&dir.join("state"), generation, resume).map_err(err("writing state"))?;
    state.sync().map_err(err("syncing state"))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err("syncing the directory"))?;
    Ok(repaired)
}
