//! Batching by count, size, age and partition. A partition is whatever a
//! request must not mix (an index, a topic, a stream, an object prefix);
//! each has its own open batch and its own age. The number of open
//! partitions is capped, so memory stays bounded whatever the keys.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use logbus_plugin_api::Event;
use tokio::time::Instant;

use crate::encode::{Encoder, Framing};
use crate::journal::BatchId;

/// When an open batch is closed and sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    pub max_events: usize,
    /// Exact body size, framing included. An event larger than this on its
    /// own is sent alone (the destination decides whether it fits).
    pub max_bytes: usize,
    /// A batch is sent once its first event has waited this long.
    pub max_age: Duration,
    /// Most partitions with an open batch; a new one closes the oldest.
    pub max_partitions: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits {
            max_events: 1000,
            max_bytes: 1 << 20,
            max_age: Duration::from_secs(1),
            max_partitions: 64,
        }
    }
}

/// Events of one partition and their encoded body, kept in step: item
/// `i` of the body is event `i`. `tag` is the driver's bookkeeping (which
/// input batch an event came from).
pub struct Batch {
    key: Arc<str>,
    framing: Framing,
    /// Always a complete body: prefix, items with separators, suffix.
    body: Vec<u8>,
    items: Vec<Range<usize>>,
    events: Vec<Event>,
    tags: Vec<u64>,
    opened: Instant,
    /// The name a batch journal gave it, when the driver keeps one.
    identity: Option<BatchId>,
}

impl Batch {
    fn new(key: Arc<str>, framing: Framing, opened: Instant) -> Self {
        let mut body = Vec::new();
        body.extend_from_slice(framing.prefix);
        body.extend_from_slice(framing.suffix);
        Batch {
            key,
            framing,
            body,
            items: Vec::new(),
            events: Vec::new(),
            tags: Vec::new(),
            opened,
            identity: None,
        }
    }

    /// The batch's name when the sink keeps a batch journal and every
    /// event came from a replaying source: the same after a crash and a
    /// re-read, so a destination may drop a request it already holds.
    /// What is left after a partial failure has a name of its own.
    pub fn identity(&self) -> Option<BatchId> {
        self.identity
    }

    pub(crate) fn set_identity(&mut self, id: Option<BatchId>) {
        self.identity = id;
    }

    pub(crate) fn set_key(&mut self, key: Arc<str>) {
        self.key = key;
    }

    /// The partition key ("" when the sink does not partition).
    pub fn key(&self) -> &str {
        &self.key
    }
    pub fn len(&self) -> usize {
        self.events.len()
    }
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
    /// The request body, exactly as sized.
    pub fn body(&self) -> &[u8] {
        &self.body
    }
    /// Byte range of each event's item in [`Batch::body`].
    pub fn items(&self) -> &[Range<usize>] {
        &self.items
    }
    /// Item `i`'s bytes.
    pub fn item(&self, i: usize) -> &[u8] {
        &self.body[self.items[i].clone()]
    }
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Body size after appending an item of `item_len` bytes.
    fn size_with(&self, item_len: usize) -> usize {
        let sep = if self.items.is_empty() {
            0
        } else {
            self.framing.separator.len()
        };
        self.body.len() + sep + item_len
    }

    fn push(&mut self, item: &[u8], event: Event, tag: u64) {
        self.body
            .truncate(self.body.len() - self.framing.suffix.len());
        if !self.items.is_empty() {
            self.body.extend_from_slice(self.framing.separator);
        }
        let start = self.body.len();
        self.body.extend_from_slice(item);
        self.items.push(start..self.body.len());
        self.body.extend_from_slice(self.framing.suffix);
        self.events.push(event);
        self.tags.push(tag);
    }

    /// Keeps the items whose `keep` is true (the body is rebuilt from their
    /// bytes, not encoded again) and returns the others, in order, with
    /// their index before the split.
    pub fn retain(&mut self, keep: &[bool]) -> Vec<(usize, Event, u64)> {
        assert_eq!(keep.len(), self.len(), "one flag per item");
        self.identity = self.identity.map(|id| id.narrowed(keep));
        let old_body = std::mem::take(&mut self.body);
        let old_items = std::mem::take(&mut self.items);
        let events = std::mem::take(&mut self.events);
        let tags = std::mem::take(&mut self.tags);
        self.body.extend_from_slice(self.framing.prefix);
        self.body.extend_from_slice(self.framing.suffix);
        let mut removed = Vec::new();
        for (i, ((event, tag), range)) in events.into_iter().zip(tags).zip(old_items).enumerate() {
            if keep[i] {
                self.push(&old_body[range], event, tag);
            } else {
                removed.push((i, event, tag));
            }
        }
        removed
    }

    /// Empties the batch, handing back its events and their tags.
    pub fn drain(&mut self) -> Vec<(Event, u64)> {
        self.items.clear();
        self.body.clear();
        self.body.extend_from_slice(self.framing.prefix);
        self.body.extend_from_slice(self.framing.suffix);
        std::mem::take(&mut self.events)
            .into_iter()
            .zip(std::mem::take(&mut self.tags))
            .collect()
    }
}

/// The open batches, one per partition. Closed ("sealed") batches are
/// appended to the caller's queue, oldest first.
pub struct Batcher {
    limits: BatchLimits,
    framing: Framing,
    open: HashMap<Arc<str>, Batch>,
    scratch: Vec<u8>,
}

impl Batcher {
    pub fn new(limits: BatchLimits, framing: Framing) -> Self {
        Batcher {
            limits,
            framing,
            open: HashMap::new(),
            scratch: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Encodes `event` into the open batch of `key`, closing batches that
    /// reach a limit. An event that cannot be encoded comes back with the
    /// reason, and nothing was added.
    #[allow(clippy::result_large_err)]
    pub fn push(
        &mut self,
        key: &str,
        event: Event,
        tag: u64,
        encoder: &dyn Encoder,
        now: Instant,
        sealed: &mut VecDeque<Batch>,
    ) -> Result<(), (Event, u64, String)> {
        self.scratch.clear();
        if let Err(reason) = encoder.encode(&event, &mut self.scratch) {
            return Err((event, tag, reason));
        }
        let item_len = self.scratch.len();
        if let Some(open) = self.open.get(key)
            && !open.is_empty()
            && open.size_with(item_len) > self.limits.max_bytes
        {
            sealed.extend(self.open.remove(key));
        }
        if !self.open.contains_key(key) {
            if self.open.len() >= self.limits.max_partitions.max(1) {
                let oldest = self
                    .open
                    .iter()
                    .min_by_key(|(_, b)| b.opened)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    sealed.extend(self.open.remove(&k));
                }
            }
            let key: Arc<str> = key.into();
            self.open
                .insert(key.clone(), Batch::new(key, self.framing, now));
        }
        let batch = self.open.get_mut(key).expect("opened above");
        batch.push(&self.scratch, event, tag);
        if batch.len() >= self.limits.max_events || batch.body.len() >= self.limits.max_bytes {
            sealed.extend(self.open.remove(key));
        }
        Ok(())
    }

    /// Closes the open batch of `key`, if there is one.
    pub fn close(&mut self, key: &str) -> Option<Batch> {
        self.open.remove(key)
    }

    /// When the oldest open batch is due.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.open
            .values()
            .map(|b| b.opened + self.limits.max_age)
            .min()
    }

    /// Closes the batches that are due at `now`, oldest first.
    pub fn seal_due(&mut self, now: Instant, sealed: &mut VecDeque<Batch>) {
        let max_age = self.limits.max_age;
        let mut due: Vec<Arc<str>> = self
            .open
            .iter()
            .filter(|(_, b)| b.opened + max_age <= now)
            .map(|(k, _)| k.clone())
            .collect();
        due.sort_by_key(|k| self.open[k].opened);
        for k in due {
            sealed.extend(self.open.remove(&k));
        }
    }

    /// Closes every open batch, oldest first.
    pub fn seal_all(&mut self, sealed: &mut VecDeque<Batch>) {
        let mut all: Vec<Batch> = self.open.drain().map(|(_, b)| b).collect();
        all.sort_by_key(|b| b.opened);
        sealed.extend(all);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::{JsonArray, JsonLines};
    use logbus_plugin_api::Meta;

    /// Events in open batches.
    fn open_events(b: &Batcher) -> usize {
        b.open.values().map(Batch::len).sum()
    }

    fn ev(text: &str) -> Event {
        Event::raw(text.to_string(), Meta::at("t", 0))
    }

    fn limits(max_events: usize, max_bytes: usize) -> BatchLimits {
        BatchLimits {
            max_events,
            max_bytes,
            max_age: Duration::from_secs(1),
            max_partitions: 2,
        }
    }

    fn bodies(sealed: &VecDeque<Batch>) -> Vec<String> {
        sealed
            .iter()
            .map(|b| String::from_utf8(b.body().to_vec()).unwrap())
            .collect()
    }

    /// What a service reads of a sealed batch: its events, each item's
    /// range in the body; a batch with every item taken out is empty, and
    /// the batcher is empty exactly when nothing is open.
    #[test]
    fn a_sealed_batch_lists_its_events_and_where_each_item_is() {
        let mut b = Batcher::new(limits(100, 1000), JsonArray.framing());
        let mut sealed = VecDeque::new();
        assert!(b.is_empty());
        let now = Instant::now();
        for t in ["aa", "b"] {
            b.push("", ev(t), 0, &JsonArray, now, &mut sealed).unwrap();
        }
        assert!(!b.is_empty(), "a batch is open");
        b.seal_all(&mut sealed);
        assert!(b.is_empty());
        let mut batch = sealed.pop_front().unwrap();
        assert_eq!(batch.body(), b"[aa,b]");
        assert_eq!(batch.items(), [1..3, 4..5]);
        let texts: Vec<&[u8]> = batch
            .events()
            .iter()
            .map(|e| e.as_raw().unwrap().as_ref())
            .collect();
        assert_eq!(texts, [b"aa".as_slice(), b"b"]);
        assert!(!batch.is_empty());
        batch.retain(&[false, false]);
        assert!(batch.is_empty());
        assert!(batch.events().is_empty());
    }

    #[test]
    fn a_batch_closes_at_the_event_limit() {
        let mut b = Batcher::new(limits(2, 1000), JsonLines.framing());
        let mut sealed = VecDeque::new();
        let now = Instant::now();
        for t in ["a", "b", "c"] {
            b.push("", ev(t), 0, &JsonLines, now, &mut sealed).unwrap();
        }
        assert_eq!(bodies(&sealed), ["a\nb\n"]);
        assert_eq!(open_events(&b), 1);
    }

    #[test]
    fn the_byte_limit_is_the_exact_body_size_framing_included() {
        // `[aaa,bbb]` is 9 bytes; a third item would make it 13.
        let mut b = Batcher::new(limits(100, 12), JsonArray.framing());
        let mut sealed = VecDeque::new();
        let now = Instant::now();
        for t in ["aaa", "bbb", "ccc"] {
            b.push("", ev(t), 0, &JsonArray, now, &mut sealed).unwrap();
        }
        assert_eq!(bodies(&sealed), ["[aaa,bbb]"]);
        assert!(sealed.iter().all(|s| s.body().len() <= 12));
        b.seal_all(&mut sealed);
        assert_eq!(bodies(&sealed), ["[aaa,bbb]", "[ccc]"]);
        // Exactly at the limit closes at once.
        let mut b = Batcher::new(limits(100, 9), JsonArray.framing());
        let mut sealed = VecDeque::new();
        for t in ["aaa", "bbb"] {
            b.push("", ev(t), 0, &JsonArray, now, &mut sealed).unwrap();
        }
        assert_eq!(bodies(&sealed), ["[aaa,bbb]"]);
        assert!(b.is_empty());
    }

    #[test]
    fn an_event_larger_than_the_limit_goes_alone() {
        let mut b = Batcher::new(limits(100, 4), JsonLines.framing());
        let mut sealed = VecDeque::new();
        let now = Instant::now();
        for t in ["a", "toolong", "b"] {
            b.push("", ev(t), 0, &JsonLines, now, &mut sealed).unwrap();
        }
        b.seal_all(&mut sealed);
        assert_eq!(bodies(&sealed), ["a\n", "toolong\n", "b\n"]);
    }

    #[test]
    fn partitions_batch_apart_and_the_oldest_closes_when_too_many_are_open() {
        let mut b = Batcher::new(limits(100, 1000), JsonLines.framing());
        let mut sealed = VecDeque::new();
        let t0 = Instant::now();
        b.push("x", ev("1"), 0, &JsonLines, t0, &mut sealed)
            .unwrap();
        b.push(
            "y",
            ev("2"),
            0,
            &JsonLines,
            t0 + Duration::from_millis(1),
            &mut sealed,
        )
        .unwrap();
        b.push(
            "x",
            ev("3"),
            0,
            &JsonLines,
            t0 + Duration::from_millis(2),
            &mut sealed,
        )
        .unwrap();
        assert!(sealed.is_empty());
        // A third partition with max_partitions = 2 closes `x`, the oldest.
        b.push(
            "z",
            ev("4"),
            0,
            &JsonLines,
            t0 + Duration::from_millis(3),
            &mut sealed,
        )
        .unwrap();
        assert_eq!(bodies(&sealed), ["1\n3\n"]);
        assert_eq!(sealed[0].key(), "x");
    }

    #[test]
    fn batches_close_by_age_oldest_first() {
        let mut b = Batcher::new(limits(100, 1000), JsonLines.framing());
        let mut sealed = VecDeque::new();
        let t0 = Instant::now();
        b.push("y", ev("1"), 0, &JsonLines, t0, &mut sealed)
            .unwrap();
        b.push(
            "x",
            ev("2"),
            0,
            &JsonLines,
            t0 + Duration::from_millis(500),
            &mut sealed,
        )
        .unwrap();
        assert_eq!(b.next_deadline(), Some(t0 + Duration::from_secs(1)));
        b.seal_due(t0 + Duration::from_millis(999), &mut sealed);
        assert!(sealed.is_empty());
        b.seal_due(t0 + Duration::from_secs(2), &mut sealed);
        assert_eq!(bodies(&sealed), ["1\n", "2\n"]);
        assert_eq!(b.next_deadline(), None);
    }

    struct Refuses;
    impl Encoder for Refuses {
        fn encode(&self, event: &Event, out: &mut Vec<u8>) -> Result<(), String> {
            out.extend_from_slice(b"partial");
            match event.as_raw().map(|b| &b[..]) {
                Some(b"bad") => Err("cannot encode `bad`".into()),
                _ => JsonLines.encode(event, out),
            }
        }
    }

    #[test]
    fn an_event_that_cannot_be_encoded_comes_back_and_leaves_no_bytes() {
        let mut b = Batcher::new(limits(100, 1000), Framing::CONCAT);
        let mut sealed = VecDeque::new();
        let now = Instant::now();
        b.push("", ev("ok"), 1, &Refuses, now, &mut sealed).unwrap();
        let (event, tag, reason) = b
            .push("", ev("bad"), 2, &Refuses, now, &mut sealed)
            .unwrap_err();
        assert_eq!(
            (event.as_raw().map(|b| &b[..]), tag, reason.as_str()),
            (Some(&b"bad"[..]), 2, "cannot encode `bad`")
        );
        b.seal_all(&mut sealed);
        assert_eq!(bodies(&sealed), ["partialok\n"]);
    }

    #[test]
    fn retain_rebuilds_the_body_from_the_kept_items() {
        let mut b = Batcher::new(limits(100, 1000), JsonArray.framing());
        let mut sealed = VecDeque::new();
        let now = Instant::now();
        for (i, t) in ["1", "2", "3", "4"].into_iter().enumerate() {
            b.push("", ev(t), i as u64, &JsonArray, now, &mut sealed)
                .unwrap();
        }
        b.seal_all(&mut sealed);
        let mut batch = sealed.pop_front().unwrap();
        let removed = batch.retain(&[false, true, false, true]);
        assert_eq!(String::from_utf8(batch.body().to_vec()).unwrap(), "[2,4]");
        assert_eq!(batch.item(1), b"4");
        let removed: Vec<(usize, u64)> = removed.iter().map(|(i, _, t)| (*i, *t)).collect();
        assert_eq!(removed, [(0, 0), (2, 2)]);
        let drained: Vec<u64> = batch.drain().into_iter().map(|(_, t)| t).collect();
        assert_eq!(drained, [1, 3]);
        assert_eq!(batch.body(), b"[]");
    }
}
