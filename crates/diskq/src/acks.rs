//! Acknowledgements: what the consumer finished, and the saved position
//! moving past it (only past a run with nothing left open before it).

use super::*;

impl Inner {
    /// The sequence numbers saved with the acknowledged position.
    pub(crate) fn seqs(&self, acks: &AckState) -> Seqs {
        Seqs {
            acked: acks.acked_seq,
            stored: self.synced_seq.load(Ordering::Acquire),
        }
    }

    pub(crate) fn complete(&self, start: Position) {
        let mut acks = lock(&self.acks);
        if let Some(entry) = acks.inflight.get_mut(&start) {
            entry.done = true;
        }
        self.advance(&mut acks);
    }

    pub(crate) fn advance(&self, acks: &mut AckState) {
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
