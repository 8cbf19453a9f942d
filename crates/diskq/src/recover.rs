//! Opening a queue: taking its lock, reading the state file, and
//! scanning the segments after the saved position, so what was written
//! but not acknowledged is read again and a torn tail is cut off.

use super::*;

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
}
