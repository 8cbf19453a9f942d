//! The writer thread: appends records to the active segment, rolls to a
//! new one, syncs as configured, and makes room when the queue is full.

use super::*;

impl Inner {
    /// Creates segment `id`, whose first data record will have sequence
    /// number `first_seq`.
    pub(crate) fn create_segment(&self, id: u64, first_seq: u64) -> io::Result<File> {
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

    pub(crate) fn has_room(&self, size: u64) -> bool {
        if self.consumer_failed.load(Ordering::Acquire) {
            return true;
        }
        let used = self.disk_bytes.load(Ordering::Acquire) + lock(&self.pending).buf.len() as u64;
        used + size <= self.config.max_disk_bytes || self.stored_unacked() == 0
    }

    pub(crate) fn stored_unacked(&self) -> u64 {
        let c = &self.counters;
        self.stored.load(Ordering::Acquire).saturating_sub(
            c.acked.load(Ordering::Acquire) + c.dropped_oldest.load(Ordering::Acquire),
        ) + self.unpublished.load(Ordering::Acquire)
    }

    /// The writer thread: group commit.
    pub(crate) fn write_loop(self: Arc<Self>, mut active: u64, mut file: File, mut next_seq: u64) {
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

    /// Publishes that `id` ended at `len` and the writer moved to `id + 1`.
    /// The state is saved too, so what it says is stored lags the log by
    /// at most a segment even while nothing is acknowledged (a stuck
    /// consumer): a cut end of the queue is then counted, not mistaken for
    /// a torn write.
    pub(crate) fn seal(&self, id: u64, len: u64) {
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
}
