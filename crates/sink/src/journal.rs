//! Deterministic batches. A checkpointing source re-reads after a crash
//! what its sinks had not confirmed, so a destination that can recognise
//! a request it already holds (ClickHouse's `insert_deduplication_token`)
//! turns the redelivery into nothing — but only if the request sent again
//! is the same request. Batches are cut by count, size and age, and age
//! depends on timing, so the re-read events would fall into different
//! batches with different names. The journal writes down each batch's
//! extent by source position *before* the batch is sent; after a restart
//! the re-read events that fall in a journalled extent are gathered into
//! that batch again and sent under its name, and those of a batch the
//! journal saw delivered are settled without being sent at all. A
//! destination then sees a crash only as a request it may drop.
//!
//! Membership is by position, not by content: per source stream the first
//! and last offsets the batch covered and how many events it took from
//! that stream, plus the sum of the events' position ids as a check. An
//! offset at a batch boundary (the parts one event was split into) goes
//! to the older batch until that batch has its count, as it did when the
//! batch was first made, since a stream's events reach a sink in order.
//! A regathered batch whose sum differs (the pipeline changed between the
//! runs, a transform is not deterministic) is sent under a new name, so
//! the destination cannot drop what it does not hold.
//!
//! The file is a line of JSON per record: `sealed` (fsynced before the
//! batch's first attempt) and `delivered` (not synced: losing one only
//! means the batch is sent again under the same name, which the
//! destination drops). It keeps the newest [`JOURNAL_BATCHES`] batches
//! and is rewritten when twice that many records have been appended; a
//! torn last line (a crash during an append) ends the reading.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::hash::Hasher;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use logbus_plugin_api::{Event, Position};
use serde::{Deserialize, Serialize};
use siphasher::sip128::{Hasher128, SipHasher13};

use crate::batch::Batch;

/// Most batches a journal remembers: a crash re-reads at most the events
/// not yet checkpointed, which the in-flight bound caps far below this
/// many batches; older extents are forgotten.
pub const JOURNAL_BATCHES: usize = 4096;

/// Entries looked at, newest first, among those of an event's stream that
/// start at or before its offset.
const SCAN: usize = 64;

/// A batch's name: the same extent of the same sources always gets the
/// same one, across restarts and releases (SipHash-1-3 with fixed keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchId(pub u128);

impl BatchId {
    /// 32 lowercase hex digits.
    pub fn hex(self) -> String {
        format!("{:032x}", self.0)
    }

    /// The name of a batch the destination knows by `name` (an object
    /// key chosen before the batch's extent was known).
    pub fn named(name: &str) -> BatchId {
        let mut h = hasher(0x6e61_6d65);
        h.write(name.as_bytes());
        BatchId(h.finish128().as_u128())
    }

    fn parse(hex: &str) -> Option<BatchId> {
        u128::from_str_radix(hex, 16).ok().map(BatchId)
    }

    /// The name of what is left of the batch when the destination took
    /// some of its items and the rest is sent again: `kept` flags the
    /// items still in it.
    pub(crate) fn narrowed(self, kept: &[bool]) -> BatchId {
        let mut h = hasher(0x6e61_7272_6f77);
        h.write_u128(self.0);
        for (i, k) in kept.iter().enumerate() {
            if *k {
                h.write_u64(i as u64);
            }
        }
        BatchId(h.finish128().as_u128())
    }
}

fn hasher(key: u64) -> SipHasher13 {
    SipHasher13::new_with_keys(0x6c6f_6762_7573, key)
}

/// The events a batch took from one source stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Span {
    source: String,
    stream: u64,
    first: u64,
    last: u64,
    count: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Record {
    Sealed(Sealed),
    Delivered { id: String },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Sealed {
    id: String,
    /// The destination's name for the batch, when the sink chose it
    /// before it knew the extent (an object key): a batch made again
    /// takes it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    /// Hash of the partition key: batches of different partitions never
    /// share an event, though their extents may overlap.
    key: u64,
    count: u64,
    /// Wrapping sum of the events' position ids, as hex.
    sum: String,
    spans: Vec<Span>,
}

/// The positions a batch covers, gathered event by event.
#[derive(Debug, Default, Clone)]
pub struct Extent {
    spans: Vec<Span>,
    sum: u128,
    count: u64,
    /// An event without a position was added: the batch cannot be made
    /// again.
    unplaced: bool,
}

impl Extent {
    pub fn of<'a>(events: impl IntoIterator<Item = &'a Event>) -> Extent {
        let mut extent = Extent::default();
        for event in events {
            extent.add(event);
        }
        extent
    }

    pub fn add(&mut self, event: &Event) {
        self.count += 1;
        let meta = event.meta();
        let Some(position) = meta.position else {
            self.unplaced = true;
            return;
        };
        self.sum = self.sum.wrapping_add(position.id(&meta.source));
        let offset = position.offset;
        match self
            .spans
            .iter_mut()
            .find(|s| s.stream == position.stream && s.source == *meta.source)
        {
            Some(s) => {
                s.first = s.first.min(offset);
                s.last = s.last.max(offset);
                s.count += 1;
            }
            None => self.spans.push(Span {
                source: meta.source.to_string(),
                stream: position.stream,
                first: offset,
                last: offset,
                count: 1,
            }),
        }
    }

    /// Whether a restart can make the batch again: it has events, each
    /// with a position.
    pub fn is_replayable(&self) -> bool {
        self.count > 0 && !self.unplaced
    }

    /// The name of a batch of partition `key` covering this extent.
    fn id(&self, key: u64) -> BatchId {
        let mut h = hasher(0x0062_6174_6368);
        h.write_u64(key);
        for s in &self.spans {
            h.write_u64(s.source.len() as u64);
            h.write(s.source.as_bytes());
            for n in [s.stream, s.first, s.last, s.count] {
                h.write_u64(n);
            }
        }
        h.write_u128(self.sum);
        BatchId(h.finish128().as_u128())
    }
}

/// A journalled batch, as a restart matches re-read events against it.
struct Expected {
    id: BatchId,
    name: Option<String>,
    key: u64,
    delivered: bool,
    /// Events still to come, per span (same order as `spans`).
    spans: Vec<(Span, u64)>,
    left: u64,
    sum: u128,
    seen: u128,
}

/// What to do with one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Not in any journalled batch: batch it as usual.
    Fresh,
    /// In a batch the destination already took: settle it as delivered.
    Delivered,
    /// In batch `id`, sent before the crash and not known delivered:
    /// gather it there. `complete` once the batch has all its events;
    /// `same` says whether they are the ones it had (by position ids).
    Regather {
        id: BatchId,
        complete: bool,
        same: bool,
    },
}

/// A sink's batch journal (see the module docs).
pub struct BatchJournal {
    path: PathBuf,
    file: File,
    capacity: usize,
    /// The newest batches, oldest first, and whether each was delivered.
    kept: VecDeque<(Sealed, bool)>,
    /// Records in the file.
    written: usize,
    expected: Vec<Expected>,
    /// Per (source, stream): indexes into `expected`, by first offset.
    index: HashMap<(String, u64), Vec<(u64, usize)>>,
    /// Events claimed as already delivered.
    already_delivered: u64,
}

impl BatchJournal {
    /// Opens (or creates) the journal at `path`, remembering at most
    /// `capacity` batches: those in it are expected to be read again.
    pub fn open(path: &Path, capacity: usize) -> std::io::Result<Self> {
        let mut kept: VecDeque<(Sealed, bool)> = VecDeque::new();
        match File::open(path) {
            Ok(f) => {
                for line in BufReader::new(f).split(b'\n') {
                    let Ok(record) = serde_json::from_slice::<Record>(&line?) else {
                        break; // torn by a crash: nothing after it was written
                    };
                    match record {
                        Record::Sealed(s) => {
                            kept.push_back((s, false));
                            if kept.len() > capacity {
                                kept.pop_front();
                            }
                        }
                        Record::Delivered { id } => {
                            if let Some(k) = kept.iter_mut().rev().find(|(s, _)| s.id == id) {
                                k.1 = true;
                            }
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut journal = BatchJournal {
            path: path.to_path_buf(),
            file: rewrite(path, &kept)?,
            capacity: capacity.max(1),
            kept: VecDeque::new(),
            written: 0,
            expected: Vec::new(),
            index: HashMap::new(),
            already_delivered: 0,
        };
        journal.written = records(&kept);
        for (sealed, delivered) in &kept {
            journal.expect(sealed, *delivered);
        }
        journal.kept = kept;
        Ok(journal)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Events read again that were claimed as delivered already.
    pub fn already_delivered(&self) -> u64 {
        self.already_delivered
    }

    /// Batches of an earlier run whose events have not all been read again.
    pub fn awaiting(&self) -> usize {
        self.expected.iter().filter(|e| e.left > 0).count()
    }

    fn expect(&mut self, sealed: &Sealed, delivered: bool) {
        let (Some(id), Ok(sum)) = (
            BatchId::parse(&sealed.id),
            u128::from_str_radix(&sealed.sum, 16),
        ) else {
            return;
        };
        let at = self.expected.len();
        for span in &sealed.spans {
            let list = self
                .index
                .entry((span.source.clone(), span.stream))
                .or_default();
            let i = list.partition_point(|(first, _)| *first <= span.first);
            list.insert(i, (span.first, at));
        }
        self.expected.push(Expected {
            id,
            name: sealed.name.clone(),
            key: sealed.key,
            delivered,
            spans: sealed.spans.iter().map(|s| (s.clone(), s.count)).collect(),
            left: sealed.count,
            sum,
            seen: 0,
        });
    }

    /// Where `event`, batched under partition `key`, belongs.
    pub fn claim(&mut self, key: &str, event: &Event) -> Claim {
        if self.expected.is_empty() {
            return Claim::Fresh;
        }
        let meta = event.meta();
        let Some(position) = meta.position else {
            return Claim::Fresh;
        };
        let Some(list) = self.index.get(&(meta.source.to_string(), position.stream)) else {
            return Claim::Fresh;
        };
        let key = key_hash(key);
        let upto = list.partition_point(|(first, _)| *first <= position.offset);
        // The oldest batch that still lacks this stream's events wins a
        // boundary offset, as it did when the batches were made.
        let found = list[upto.saturating_sub(SCAN)..upto]
            .iter()
            .filter_map(|&(_, at)| {
                let e = &self.expected[at];
                if e.key != key {
                    return None;
                }
                let s = e.spans.iter().position(|(s, left)| {
                    *left > 0
                        && s.source == *meta.source
                        && s.stream == position.stream
                        && s.first <= position.offset
                        && position.offset <= s.last
                })?;
                Some((at, s))
            })
            .min_by_key(|&(at, _)| at);
        let Some((at, s)) = found else {
            return Claim::Fresh;
        };
        let e = &mut self.expected[at];
        e.spans[s].1 -= 1;
        e.left -= 1;
        e.seen = e.seen.wrapping_add(position.id(&meta.source));
        if e.delivered {
            self.already_delivered += 1;
            return Claim::Delivered;
        }
        Claim::Regather {
            id: e.id,
            complete: e.left == 0,
            same: e.left == 0 && e.seen == e.sum,
        }
    }

    /// Names `batch` by the positions of its events and writes that down
    /// (synced) before it is sent. `None`, and nothing written, when an
    /// event has no position: such a batch cannot be made again.
    pub fn seal(&mut self, batch: &Batch) -> std::io::Result<Option<BatchId>> {
        let extent = Extent::of(batch.events());
        if !extent.is_replayable() {
            return Ok(None);
        }
        let id = extent.id(key_hash(batch.key()));
        self.record(id, batch.key(), &extent, None)?;
        Ok(Some(id))
    }

    /// Writes down (synced) that batch `id` of partition `key`, called
    /// `name` at the destination, covers `extent`: to be done before the
    /// batch can reach the destination. Nothing is written for an extent
    /// that cannot be made again.
    pub fn record(
        &mut self,
        id: BatchId,
        key: &str,
        extent: &Extent,
        name: Option<&str>,
    ) -> std::io::Result<()> {
        if !extent.is_replayable() {
            return Ok(());
        }
        let sealed = Sealed {
            id: id.hex(),
            name: name.map(str::to_string),
            key: key_hash(key),
            count: extent.count,
            sum: format!("{:x}", extent.sum),
            spans: extent.spans.clone(),
        };
        self.append(&Record::Sealed(sealed.clone()), true)?;
        self.kept.push_back((sealed, false));
        if self.kept.len() > self.capacity {
            self.kept.pop_front();
        }
        Ok(())
    }

    /// The destination's name for journalled batch `id`, if it had one.
    pub fn name_of(&self, id: BatchId) -> Option<&str> {
        self.expected
            .iter()
            .find(|e| e.id == id)
            .and_then(|e| e.name.as_deref())
    }

    /// Stops matching events to batch `id`: it was made again with fewer
    /// events than before, and a later event of its extent must not make
    /// it a second time (under its name, that would replace the first).
    pub fn forget(&mut self, id: BatchId) {
        for e in self.expected.iter_mut().filter(|e| e.id == id) {
            e.left = 0;
            for span in &mut e.spans {
                span.1 = 0;
            }
        }
    }

    /// Writes down that the destination took every event of batch `id`.
    pub fn delivered(&mut self, id: BatchId) -> std::io::Result<()> {
        let hex = id.hex();
        if let Some(k) = self.kept.iter_mut().rev().find(|(s, _)| s.id == hex) {
            k.1 = true;
        }
        self.append(&Record::Delivered { id: hex }, false)
    }

    fn append(&mut self, record: &Record, sync: bool) -> std::io::Result<()> {
        if self.written >= 2 * self.capacity + 16 {
            self.file = rewrite(&self.path, &self.kept)?;
            self.written = records(&self.kept);
        }
        let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        if sync {
            self.file.sync_data()?;
        }
        self.written += 1;
        Ok(())
    }
}

fn key_hash(key: &str) -> u64 {
    Position::stream_of(&[key.as_bytes()])
}

fn records(kept: &VecDeque<(Sealed, bool)>) -> usize {
    kept.iter().map(|(_, d)| 1 + usize::from(*d)).sum()
}

/// Replaces the file with `kept` (atomically) and opens it for appending.
fn rewrite(path: &Path, kept: &VecDeque<(Sealed, bool)>) -> std::io::Result<File> {
    let mut body = Vec::new();
    for (sealed, delivered) in kept {
        serde_json::to_writer(&mut body, &Record::Sealed(sealed.clone()))
            .map_err(std::io::Error::other)?;
        body.push(b'\n');
        if *delivered {
            serde_json::to_writer(
                &mut body,
                &Record::Delivered {
                    id: sealed.id.clone(),
                },
            )
            .map_err(std::io::Error::other)?;
            body.push(b'\n');
        }
    }
    logbus_plugin_api::state::replace_file(path, &body)?;
    OpenOptions::new().append(true).open(path)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Duration;

    use logbus_plugin_api::Meta;
    use tokio::time::Instant;

    use super::*;
    use crate::batch::{BatchLimits, Batcher};
    use crate::encode::{Encoder, JsonLines};

    fn event(source: &str, stream: u64, offset: u64) -> Event {
        let mut meta = Meta::at(source, 0);
        meta.position = Some(Position::new(stream, offset));
        Event::raw(format!("{stream}:{offset}"), meta)
    }

    /// Batches of `events` events cut from `input`, as the driver makes
    /// them.
    fn batches(input: Vec<Event>, events: usize) -> Vec<Batch> {
        let limits = BatchLimits {
            max_events: events,
            max_bytes: 1 << 20,
            max_age: Duration::from_secs(1),
            max_partitions: 4,
        };
        let mut b = Batcher::new(limits, JsonLines.framing());
        let mut sealed = VecDeque::new();
        for e in input {
            b.push("", e, 0, &JsonLines, Instant::now(), &mut sealed)
                .unwrap();
        }
        b.seal_all(&mut sealed);
        sealed.into()
    }

    fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(String::from)
            .collect()
    }

    /// After a restart the same positions re-read make the same batches
    /// under the same names, though the run cut them differently, and
    /// those delivered are recognised as such.
    #[test]
    fn positions_read_again_regather_into_the_batches_they_were_in() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.batches");
        let mut journal = BatchJournal::open(&path, 16).unwrap();
        let first: Vec<Event> = (0..10).map(|o| event("logs", 7, o * 10)).collect();
        let sent = batches(first, 4); // 0..40, 40..80, 80..100
        let ids: Vec<BatchId> = sent
            .iter()
            .map(|b| journal.seal(b).unwrap().unwrap())
            .collect();
        assert_eq!(ids.len(), 3);
        assert_ne!(ids[0], ids[1]);
        journal.delivered(ids[0]).unwrap();
        drop(journal);

        // Killed; read again from the start (the checkpoint was behind).
        let mut journal = BatchJournal::open(&path, 16).unwrap();
        assert_eq!(journal.awaiting(), 3);
        let mut claims = Vec::new();
        for o in 0..12 {
            claims.push(journal.claim("", &event("logs", 7, o * 10)));
        }
        assert!(claims[..4].iter().all(|c| *c == Claim::Delivered));
        assert_eq!(journal.already_delivered(), 4);
        let regather = |id, complete| Claim::Regather {
            id,
            complete,
            same: complete,
        };
        assert_eq!(
            claims[4..10],
            [
                regather(ids[1], false),
                regather(ids[1], false),
                regather(ids[1], false),
                regather(ids[1], true),
                regather(ids[2], false),
                regather(ids[2], true),
            ]
        );
        // Beyond the journal's extents: new batches.
        assert_eq!(claims[10..], [Claim::Fresh, Claim::Fresh]);
        assert_eq!(journal.awaiting(), 0);
        // Another source, another stream, another partition: not claimed.
        let mut journal = BatchJournal::open(&path, 16).unwrap();
        assert_eq!(journal.claim("", &event("other", 7, 50)), Claim::Fresh);
        assert_eq!(journal.claim("", &event("logs", 8, 50)), Claim::Fresh);
        assert_eq!(journal.claim("p", &event("logs", 7, 50)), Claim::Fresh);
        let mut unplaced = Event::raw("x".to_string(), Meta::at("logs", 0));
        unplaced.meta_mut().position = None;
        assert_eq!(journal.claim("", &unplaced), Claim::Fresh);
    }

    /// The same extent is the same name in any run; the name is fixed
    /// across releases (it reaches destinations, and an upgrade between a
    /// crash and its restart must not rename a batch).
    #[test]
    fn a_batch_name_depends_on_its_extent_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = BatchJournal::open(&dir.path().join("a"), 4).unwrap();
        let mut b = BatchJournal::open(&dir.path().join("b"), 4).unwrap();
        let make = || batches((0..3).map(|o| event("logs", 1, o)).collect(), 3);
        let id = a.seal(&make()[0]).unwrap().unwrap();
        assert_eq!(b.seal(&make()[0]).unwrap(), Some(id));
        assert_eq!(id.hex(), "f1f35b62b25d2ed9d7a38bafc7e058f8");
        let other = batches((1..4).map(|o| event("logs", 1, o)).collect(), 3);
        assert_ne!(a.seal(&other[0]).unwrap(), Some(id));
    }

    /// Events split from one (same offset, distinct parts) that straddle a
    /// boundary fill the older batch first; a regathered batch of other
    /// events than before is told apart by its position ids.
    #[test]
    fn a_boundary_offset_fills_the_older_batch_first_and_a_changed_batch_is_told() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let split = |i: usize| {
            let mut e = event("logs", 3, 100);
            e.meta_mut().position = Some(Position::new(3, 100).part(i));
            e
        };
        let mut journal = BatchJournal::open(&path, 8).unwrap();
        let sent = batches((0..4).map(split).collect(), 2);
        let ids: Vec<BatchId> = sent
            .iter()
            .map(|b| journal.seal(b).unwrap().unwrap())
            .collect();
        drop(journal);
        let mut journal = BatchJournal::open(&path, 8).unwrap();
        let claims: Vec<Claim> = (0..4).map(|i| journal.claim("", &split(i))).collect();
        assert_eq!(
            claims,
            [
                Claim::Regather {
                    id: ids[0],
                    complete: false,
                    same: false
                },
                Claim::Regather {
                    id: ids[0],
                    complete: true,
                    same: true
                },
                Claim::Regather {
                    id: ids[1],
                    complete: false,
                    same: false
                },
                Claim::Regather {
                    id: ids[1],
                    complete: true,
                    same: true
                },
            ]
        );
        // The pipeline changed: the first batch now gets other parts.
        let mut journal = BatchJournal::open(&path, 8).unwrap();
        journal.claim("", &split(0));
        let last = journal.claim("", &split(3));
        assert_eq!(
            last,
            Claim::Regather {
                id: ids[0],
                complete: true,
                same: false
            }
        );
    }

    /// A batch with an event of no position has no name and is not
    /// written down; nor is an empty one.
    #[test]
    fn a_batch_that_cannot_be_made_again_is_not_journalled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut journal = BatchJournal::open(&path, 8).unwrap();
        let mut input: Vec<Event> = (0..2).map(|o| event("logs", 1, o)).collect();
        input[1].meta_mut().position = None;
        assert_eq!(journal.seal(&batches(input, 2)[0]).unwrap(), None);
        assert!(lines(&path).is_empty());
    }

    /// The file keeps the newest batches only: appends past twice the
    /// capacity rewrite it, and a reopened journal expects only those.
    #[test]
    fn the_journal_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut journal = BatchJournal::open(&path, 4).unwrap();
        for o in 0..100 {
            let b = &batches(vec![event("logs", 1, o)], 1)[0];
            let id = journal.seal(b).unwrap().unwrap();
            journal.delivered(id).unwrap();
        }
        assert!(
            lines(&path).len() <= 2 * 4 + 16 + 1,
            "{}",
            lines(&path).len()
        );
        drop(journal);
        let mut journal = BatchJournal::open(&path, 4).unwrap();
        assert_eq!(
            lines(&path).len(),
            8,
            "4 batches, each sealed and delivered"
        );
        assert_eq!(journal.claim("", &event("logs", 1, 95)), Claim::Fresh);
        assert_eq!(journal.claim("", &event("logs", 1, 96)), Claim::Delivered);
    }

    /// A crash in the middle of an append leaves a torn line: what came
    /// before it is read, the line dropped.
    #[test]
    fn a_torn_last_record_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut journal = BatchJournal::open(&path, 8).unwrap();
        let b = batches((0..2).map(|o| event("logs", 1, o)).collect(), 2);
        let id = journal.seal(&b[0]).unwrap().unwrap();
        drop(journal);
        let mut text = std::fs::read(&path).unwrap();
        text.extend_from_slice(b"{\"delivered\":{\"id\":\"");
        std::fs::write(&path, text).unwrap();
        let mut journal = BatchJournal::open(&path, 8).unwrap();
        assert_eq!(
            journal.claim("", &event("logs", 1, 0)),
            Claim::Regather {
                id,
                complete: false,
                same: false
            }
        );
        assert_eq!(lines(&path).len(), 1, "rewritten without the torn line");
    }

    /// A journal that cannot be written is an error naming nothing but
    /// the I/O failure: the driver adds the path.
    #[test]
    fn a_journal_in_a_missing_directory_cannot_be_opened() {
        let dir = tempfile::tempdir().unwrap();
        assert!(BatchJournal::open(&dir.path().join("no/such/j"), 8).is_err());
    }

    /// An object keyed before its extent was known: the key comes back
    /// with the batch; once forgotten (made again short), its extent's
    /// later events are new.
    #[test]
    fn a_recorded_name_comes_back_and_a_forgotten_batch_claims_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut journal = BatchJournal::open(&path, 8).unwrap();
        let extent = Extent::of(&(0..3).map(|o| event("logs", 1, o)).collect::<Vec<_>>());
        assert!(extent.is_replayable());
        let id = BatchId::named("p/2026/obj-1.log.gz");
        assert_ne!(id, BatchId::named("p/2026/obj-2.log.gz"));
        journal
            .record(id, "p/2026/", &extent, Some("p/2026/obj-1.log.gz"))
            .unwrap();
        // Nothing to make again: not written.
        journal
            .record(BatchId(1), "p", &Extent::default(), None)
            .unwrap();
        assert_eq!(lines(&path).len(), 1);
        drop(journal);
        let mut journal = BatchJournal::open(&path, 8).unwrap();
        assert_eq!(journal.name_of(id), Some("p/2026/obj-1.log.gz"));
        assert_eq!(journal.name_of(BatchId(1)), None);
        assert_eq!(
            journal.claim("p/2026/", &event("logs", 1, 0)),
            Claim::Regather {
                id,
                complete: false,
                same: false
            }
        );
        journal.forget(id);
        assert_eq!(journal.awaiting(), 0);
        assert_eq!(journal.claim("p/2026/", &event("logs", 1, 1)), Claim::Fresh);
    }

    #[test]
    fn a_narrowed_batch_gets_a_name_of_its_own_from_what_is_left() {
        let id = BatchId(42);
        assert_eq!(id.narrowed(&[true, false]), id.narrowed(&[true, false]));
        assert_ne!(id.narrowed(&[true, false]), id.narrowed(&[false, true]));
        assert_ne!(id.narrowed(&[true, true]), id);
    }
}
