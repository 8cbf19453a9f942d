//! Reading back what was written: records in order from the segments,
//! skipping a segment that cannot be read (counted), and dropping the
//! oldest when full with `when_full: drop_oldest`.

use super::*;

impl Inner {
    pub(crate) fn try_read(&self, me: &Arc<Inner>, max: usize) -> Result<Option<ReadBatch>, Error> {
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
    pub(crate) fn skip_segment(&self, reader: &mut ReadState, why: &str) {
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
        reader.start_segment(self.segment_after(seg, tail.active));
        // The next segment's start record says where numbering resumes;
        // what lies between is counted above.
        reader.seq = None;
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

    pub(crate) fn read_locked(
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
                    let next = self.segment_after(reader.pos.segment, tail.active);
                    reader.start_segment(next);
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
    pub(crate) fn drop_oldest(&self) -> bool {
        let tail = *lock(&self.tail);
        let mut reader = lock(&self.reader);
        if reader.pos.segment >= tail.active {
            return false;
        }
        let seg = reader.pos.segment;
        let records = lock(&self.segments).get(&seg).map_or(0, |s| s.records);
        let dropped = records.saturating_sub(reader.read_in_segment);
        let start = reader.pos;
        reader.start_segment(self.segment_after(seg, tail.active));
        reader.seq = None;
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
}

impl Inner {
    /// The first segment present after `segment`, else the active one.
    fn segment_after(&self, segment: u64, active: u64) -> u64 {
        lock(&self.segments)
            .range(segment + 1..)
            .next()
            .map_or(active, |(&id, _)| id)
    }
}

impl ReadState {
    /// Puts the reader at the start of `segment`'s records (its sequence
    /// number is the caller's to keep or forget).
    fn start_segment(&mut self, segment: u64) {
        self.pos = Position {
            segment,
            offset: record::SEGMENT_HEADER,
        };
        self.cursor = None;
        self.read_in_segment = 0;
    }
}
