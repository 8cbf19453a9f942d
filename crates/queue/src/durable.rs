//! The durable part of a stage queue (`type: disk` or `disk-assisted`):
//! how events become records and back, and the spill/return rule of a
//! disk-assisted queue.
//!
//! A `disk` queue sends every batch through the log: the producer's `send`
//! returns once the batch is stored as `sync` says, and consumers read it
//! back. A `disk-assisted` queue is a memory queue first; once it holds
//! `high_watermark` events new batches spill to the log, and they go back to
//! memory only when the log has been read to its end and memory is down to
//! `low_watermark` (rsyslog's DA mode). Consumers of the shared queue take
//! from memory and the log in turn, so neither starves; frontend consumers
//! of a local-scope queue help from memory only and never touch the log.
//!
//! A record acknowledges when the batch that carried it is dropped, i.e.
//! once the stage has forwarded or committed it — exactly when a memory
//! queue returns the slot. A crash therefore replays what was in flight
//! (at least once), never loses what the producer was told is stored.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use logbus_diskq::{Appended, RecordBatch};
pub use logbus_diskq::{
    Config as DiskConfig, DiskQueue, Recovery, Snapshot as DiskSnapshot, SyncMode, WhenFull,
};
pub use logbus_diskq::{inspect, list_segments};

use logbus_event::{Event, Fields, Meta, Outcome, Payload, Position};

const TAG_RAW: u8 = 1;
const TAG_FIELDS: u8 = 2;
/// The same, with `origin length | origin` after the source name (records
/// of events whose source said where it found them).
const TAG_RAW_ORIGIN: u8 = 3;
const TAG_FIELDS_ORIGIN: u8 = 4;
/// The same, with the source's attributes (a Kafka message's topic,
/// partition, ...): `origin length | origin` (length 0: none) then
/// `attributes length (u32) | attributes as JSON` after the source name.
const TAG_RAW_ATTRIBUTES: u8 = 5;
const TAG_FIELDS_ATTRIBUTES: u8 = 6;
/// With a source position ([`logbus_event::Position`]): the origin and the
/// attributes are always there (empty: none), then the position's three
/// numbers, so a record replayed after a crash keeps the id a sink gives
/// its destination.
const TAG_RAW_POSITION: u8 = 7;
const TAG_FIELDS_POSITION: u8 = 8;

/// Which durable mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurableKind {
    Disk,
    DiskAssisted {
        /// Memory holds at most this many events before batches spill.
        high_watermark: usize,
        /// Spilling stops once memory is down to this and the log is read.
        low_watermark: usize,
    },
}

/// A stage queue's durable store.
pub struct Durable {
    pub(crate) queue: DiskQueue,
    pub(crate) kind: DurableKind,
    lz4: bool,
    pub(crate) spilling: AtomicBool,
    recovery: Recovery,
    pub(crate) stats: DurableCounters,
    /// Disk-assisted: on a forced stop, write the memory backlog to the log.
    pub(crate) save_on_shutdown: bool,
}

#[derive(Debug, Default)]
pub(crate) struct DurableCounters {
    /// Events that went to the log (all of them for `disk`).
    pub spilled: AtomicU64,
    /// Events a failed consumer handed back unacknowledged.
    pub returned: AtomicU64,
    /// Memory events written to the log at a forced stop.
    pub saved: AtomicU64,
    /// Records that passed their checksum but did not decode as an event.
    pub undecodable: AtomicU64,
}

/// What the engine reports about a durable queue.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DurableSnapshot {
    pub kind: &'static str,
    pub path: String,
    /// Records found at start, left by an earlier process.
    pub recovered: u64,
    /// Records stored and not acknowledged (read or not).
    pub queued: u64,
    /// Records stored and not yet read: what is left on disk for the next start.
    pub unread: u64,
    pub spilled: u64,
    pub disk_bytes: u64,
    pub segments: u64,
    pub writes: u64,
    pub fsyncs: u64,
    pub bytes_written: u64,
    pub write_errors: u64,
    pub dropped_newest: u64,
    pub dropped_oldest: u64,
    pub full_waits: u64,
    pub damaged_regions: u64,
    pub damaged_bytes: u64,
    /// Records lost while running: a segment that could not be read (I/O
    /// errors) or went missing.
    pub unreadable: u64,
    /// Records an earlier run stored that were gone when this run opened
    /// the queue (damaged, cut or deleted segments), counted exactly.
    pub lost_at_open: u64,
    pub undecodable: u64,
    pub returned: u64,
    /// Memory events written to the log at a forced stop.
    pub saved: u64,
    /// Whether a disk-assisted queue is spilling now.
    pub spilling: bool,
}

impl DurableSnapshot {
    /// Events this channel accounts for besides `received`: dropped by
    /// policy, or still on disk for the next start. Records lost to damage
    /// are not among them: they count as lost.
    pub fn not_received(&self) -> u64 {
        self.dropped_newest + self.dropped_oldest + self.unread + self.undecodable
    }
}

impl Durable {
    /// Opens the store (recovering what an earlier process left).
    pub fn open(
        config: DiskConfig,
        kind: DurableKind,
    ) -> Result<(Durable, Recovery), logbus_diskq::Error> {
        let lz4 = config.lz4;
        let (queue, recovery) = DiskQueue::open(config)?;
        Ok((
            Durable {
                queue,
                kind,
                lz4,
                spilling: AtomicBool::new(false),
                recovery: recovery.clone(),
                stats: DurableCounters::default(),
                save_on_shutdown: true,
            },
            recovery,
        ))
    }

    /// Disk-assisted: whether a forced stop writes the memory backlog to
    /// the log (default true).
    pub fn with_save_on_shutdown(mut self, save: bool) -> Durable {
        self.save_on_shutdown = save;
        self
    }

    pub fn is_assisted(&self) -> bool {
        matches!(self.kind, DurableKind::DiskAssisted { .. })
    }

    /// Whether a batch of `n` may go to memory with `occupancy` queued
    /// there (disk-assisted only); flips the spill state as the rule says.
    pub(crate) fn memory_admits(&self, occupancy: usize, n: usize) -> bool {
        let DurableKind::DiskAssisted {
            high_watermark,
            low_watermark,
        } = self.kind
        else {
            return false;
        };
        if self.spilling.load(Ordering::Acquire) {
            if occupancy <= low_watermark && self.queue.caught_up() {
                self.spilling.store(false, Ordering::Release);
            } else {
                return false;
            }
        }
        if occupancy + n <= high_watermark {
            return true;
        }
        self.spilling.store(true, Ordering::Release);
        false
    }

    /// Stores `events` in the log. A durable queue is an acknowledgement
    /// boundary: once the log holds an event under the queue's `sync`
    /// policy, its source may move past it (delivered); an event the
    /// full-disk policy dropped is rejected. On error nothing is settled.
    pub(crate) async fn append(&self, events: &mut [Event]) -> Result<(), logbus_diskq::Error> {
        let mut records = RecordBatch::new(self.lz4);
        let mut scratch = Vec::new();
        for event in events.iter() {
            scratch.clear();
            encode_event(event, &mut scratch);
            if !records.push(&scratch) {
                return Err(logbus_diskq::Error::TooLarge {
                    dir: self.queue.config().dir.clone(),
                    bytes: scratch.len(),
                });
            }
        }
        let outcome = match self.queue.append(records).await? {
            Appended::Stored => Outcome::Delivered,
            Appended::Dropped => Outcome::Rejected,
        };
        Event::settle_all(events.iter_mut(), outcome);
        self.stats
            .spilled
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    pub fn snapshot(&self) -> DurableSnapshot {
        let s = self.queue.snapshot();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DurableSnapshot {
            kind: match self.kind {
                DurableKind::Disk => "disk",
                DurableKind::DiskAssisted { .. } => "disk-assisted",
            },
            path: self.queue.config().dir.display().to_string(),
            recovered: s.recovered,
            queued: s.queued,
            unread: s.unread,
            spilled: get(&self.stats.spilled),
            disk_bytes: s.disk_bytes,
            segments: s.segments,
            writes: s.writes,
            fsyncs: s.fsyncs,
            bytes_written: s.appended_bytes,
            write_errors: s.write_errors,
            dropped_newest: s.dropped_newest,
            dropped_oldest: s.dropped_oldest,
            full_waits: s.full_waits,
            damaged_regions: s.damaged_regions,
            damaged_bytes: s.damaged_bytes,
            unreadable: s.unreadable,
            lost_at_open: self.recovery.lost_records,
            undecodable: get(&self.stats.undecodable),
            returned: get(&self.stats.returned),
            saved: get(&self.stats.saved),
            spilling: self.spilling.load(Ordering::Relaxed),
        }
    }

    /// What opening found.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }
}

/// `tag | ingest_ns | source length | source | [origin length | origin] |
/// [attributes length | attributes] | payload`, where the payload is the
/// raw bytes or the fields as JSON; the origin is there under the
/// `*_ORIGIN` and `*_ATTRIBUTES` tags, the attributes (JSON, u32 length)
/// only under `*_ATTRIBUTES`. Events without attributes keep the older
/// tags, so records written before attributes existed (or origins: tags 1
/// and 2) read back unchanged.
pub fn encode_event(event: &Event, out: &mut Vec<u8>) {
    let meta = event.meta();
    let source = clip(meta.source.as_bytes());
    let origin = meta.origin.as_deref().map(|o| clip(o.as_bytes()));
    let fields = event.is_parsed();
    let position = meta.position;
    out.push(
        match (fields, origin.is_some(), meta.attributes.is_some()) {
            _ if position.is_some() => {
                if fields {
                    TAG_FIELDS_POSITION
                } else {
                    TAG_RAW_POSITION
                }
            }
            (false, _, true) => TAG_RAW_ATTRIBUTES,
            (true, _, true) => TAG_FIELDS_ATTRIBUTES,
            (false, false, false) => TAG_RAW,
            (true, false, false) => TAG_FIELDS,
            (false, true, false) => TAG_RAW_ORIGIN,
            (true, true, false) => TAG_FIELDS_ORIGIN,
        },
    );
    out.extend_from_slice(&meta.ingest_ns.to_le_bytes());
    out.extend_from_slice(&(source.len() as u16).to_le_bytes());
    out.extend_from_slice(source);
    if origin.is_some() || meta.attributes.is_some() || position.is_some() {
        let origin = origin.unwrap_or_default();
        out.extend_from_slice(&(origin.len() as u16).to_le_bytes());
        out.extend_from_slice(origin);
    }
    match &meta.attributes {
        Some(attributes) => {
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            serde_json::to_writer(&mut *out, &**attributes)
                .expect("writing JSON to a Vec cannot fail");
            let len = (out.len() - at - 4) as u32;
            out[at..at + 4].copy_from_slice(&len.to_le_bytes());
        }
        // Under the position tags a length of 0 says "no attributes".
        None if position.is_some() => out.extend_from_slice(&[0; 4]),
        None => {}
    }
    if let Some(p) = position {
        for n in [p.stream, p.offset, p.part] {
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
    match event.payload() {
        Payload::Raw(bytes) => out.extend_from_slice(bytes),
        Payload::Fields(fields) => {
            serde_json::to_writer(&mut *out, fields).expect("writing JSON to a Vec cannot fail")
        }
        Payload::Lazy(fields) => fields.write_json(out),
    }
}

/// Decodes the record at `data[range]`; raw payloads are slices of `data`.
/// `source` caches the last source name so a batch shares one `Arc`.
pub fn decode_event(
    data: &Bytes,
    range: std::ops::Range<usize>,
    source: &mut Option<Arc<str>>,
) -> Result<Event, String> {
    let b = &data[range.clone()];
    if b.len() < 11 {
        return Err(format!("record of {} bytes is too short", b.len()));
    }
    let tag = b[0];
    let ingest_ns = u64::from_le_bytes(b[1..9].try_into().expect("8 bytes"));
    let source_len = u16::from_le_bytes(b[9..11].try_into().expect("2 bytes")) as usize;
    let payload_at = 11 + source_len;
    if b.len() < payload_at {
        return Err("record ends inside the source name".into());
    }
    let name = std::str::from_utf8(&b[11..payload_at])
        .map_err(|_| "source name is not UTF-8".to_string())?;
    let source = match source {
        Some(s) if &**s == name => s.clone(),
        _ => {
            let s: Arc<str> = Arc::from(name);
            *source = Some(s.clone());
            s
        }
    };
    let (raw, with_origin, with_attributes, with_position) = match tag {
        TAG_RAW => (true, false, false, false),
        TAG_FIELDS => (false, false, false, false),
        TAG_RAW_ORIGIN => (true, true, false, false),
        TAG_FIELDS_ORIGIN => (false, true, false, false),
        TAG_RAW_ATTRIBUTES => (true, true, true, false),
        TAG_FIELDS_ATTRIBUTES => (false, true, true, false),
        TAG_RAW_POSITION => (true, true, true, true),
        TAG_FIELDS_POSITION => (false, true, true, true),
        other => return Err(format!("unknown event tag {other}")),
    };
    let (origin, payload_at) = if with_origin {
        if b.len() < payload_at + 2 {
            return Err("record ends before the origin".into());
        }
        let len = u16::from_le_bytes(b[payload_at..payload_at + 2].try_into().expect("2 bytes"));
        let end = payload_at + 2 + len as usize;
        if b.len() < end {
            return Err("record ends inside the origin".into());
        }
        let origin = std::str::from_utf8(&b[payload_at + 2..end])
            .map_err(|_| "origin is not UTF-8".to_string())?;
        // An empty origin under the attribute tags means none.
        (
            (!origin.is_empty() || !with_attributes).then(|| Arc::from(origin)),
            end,
        )
    } else {
        (None, payload_at)
    };
    let (attributes, payload_at) = if with_attributes {
        if b.len() < payload_at + 4 {
            return Err("record ends before the attributes".into());
        }
        let len = u32::from_le_bytes(b[payload_at..payload_at + 4].try_into().expect("4 bytes"));
        let end = (payload_at + 4).saturating_add(len as usize);
        if b.len() < end {
            return Err("record ends inside the attributes".into());
        }
        if len == 0 && with_position {
            (None, end)
        } else {
            let attributes = serde_json::from_slice::<Fields>(&b[payload_at + 4..end])
                .map_err(|e| format!("attributes do not decode: {e}"))?;
            (Some(Arc::new(attributes)), end)
        }
    } else {
        (None, payload_at)
    };
    let (position, payload_at) = if with_position {
        let Some(bytes) = b.get(payload_at..payload_at + 24) else {
            return Err("record ends inside the position".into());
        };
        let n = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let position = Position {
            stream: n(0),
            offset: n(8),
            part: n(16),
        };
        (Some(position), payload_at + 24)
    } else {
        (None, payload_at)
    };
    let meta = Meta {
        source,
        ingest_ns,
        origin,
        attributes,
        position,
    };
    let payload = &b[payload_at..];
    if raw {
        Ok(Event::raw(
            data.slice(range.start + payload_at..range.end),
            meta,
        ))
    } else {
        serde_json::from_slice::<Fields>(payload)
            .map(|f| Event::fields(f, meta))
            .map_err(|e| format!("fields do not decode: {e}"))
    }
}

/// At most `u16::MAX` bytes, cut at a character boundary so what is kept
/// stays UTF-8.
fn clip(s: &[u8]) -> &[u8] {
    let mut n = s.len().min(u16::MAX as usize);
    while n < s.len() && n > 0 && (s[n] & 0xC0) == 0x80 {
        n -= 1;
    }
    &s[..n]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Encodes the events one after another into one buffer, as a log
    /// batch holds them, and decodes them back with one source cache.
    fn round_trip(events: &[&Event]) -> Vec<Event> {
        let mut data = Vec::new();
        let mut ranges = Vec::new();
        for e in events {
            let at = data.len();
            encode_event(e, &mut data);
            ranges.push(at..data.len());
        }
        let data = Bytes::from(data);
        let mut cache = None;
        ranges
            .into_iter()
            .map(|r| decode_event(&data, r, &mut cache).unwrap())
            .collect()
    }

    #[test]
    fn events_round_trip_raw_and_fields() {
        let meta = Meta::at("src-1", 123_456_789);
        let raw = Event::raw(&b"a line \xff with bytes"[..], meta.clone());
        let fields = Event::fields(
            serde_json::from_value(json!({"z": 1, "a": {"b": [true, null, "x"]}})).unwrap(),
            meta.clone(),
        );
        let from_file = Meta {
            origin: Some("/var/log/app/é.log".into()),
            ..meta.clone()
        };
        let raw_from_file = Event::raw(&b"tailed"[..], from_file.clone());
        let fields_from_file = Event::fields(
            serde_json::from_value(json!({"msg": "parsed"})).unwrap(),
            from_file.clone(),
        );
        let attributes: Fields =
            serde_json::from_value(json!({"topic": "logs", "partition": 3, "offset": 17})).unwrap();
        let with_attributes = Meta {
            attributes: Some(Arc::new(attributes)),
            ..meta.clone()
        };
        let raw_from_kafka = Event::raw(&b"consumed"[..], with_attributes.clone());
        let fields_from_both = Event::fields(
            serde_json::from_value(json!({"msg": "parsed"})).unwrap(),
            Meta {
                origin: from_file.origin.clone(),
                ..with_attributes
            },
        );
        let placed = |meta: &Meta| Meta {
            position: Some(Position::new(u64::MAX, 1 << 40).part(3)),
            ..meta.clone()
        };
        let raw_placed = Event::raw(&b"at a position"[..], placed(&meta));
        let fields_placed = Event::fields(
            serde_json::from_value(json!({"msg": "placed"})).unwrap(),
            placed(&from_file),
        );
        let raw_placed_everything = Event::raw(&b""[..], placed(fields_from_both.meta()));
        let back = round_trip(&[
            &raw,
            &fields,
            &raw_from_file,
            &fields_from_file,
            &raw_from_kafka,
            &fields_from_both,
            &raw_placed,
            &fields_placed,
            &raw_placed_everything,
        ]);
        assert_eq!(
            back,
            vec![
                raw,
                fields,
                raw_from_file,
                fields_from_file,
                raw_from_kafka,
                fields_from_both,
                raw_placed,
                fields_placed,
                raw_placed_everything,
            ]
        );
        assert_eq!(back[6].meta().origin, None);
        assert_eq!(back[6].meta().attributes, None);
        assert_eq!(
            back[8].meta().position,
            Some(Position::new(u64::MAX, 1 << 40).part(3))
        );
        assert_eq!(back[2].meta().origin.as_deref(), Some("/var/log/app/é.log"));
        assert_eq!(back[4].meta().origin, None);
        assert_eq!(back[4].meta().attributes.as_ref().unwrap()["partition"], 3);
        assert_eq!(back[5].meta().origin.as_deref(), Some("/var/log/app/é.log"));
        // Field order survives.
        let keys: Vec<&String> = back[1].as_fields().unwrap().keys().collect();
        assert_eq!(keys, ["z", "a"]);
    }

    /// A record cut anywhere before its payload (a damaged segment that
    /// still passed its checksum, a format bug) is an error naming the
    /// part it ends in, never a panic or a wrong event.
    #[test]
    fn a_record_cut_before_its_payload_is_an_error() {
        let attributes: Fields = serde_json::from_value(json!({"partition": 1})).unwrap();
        let event = Event::raw(
            &b""[..],
            Meta {
                origin: Some("/var/log/a.log".into()),
                attributes: Some(Arc::new(attributes)),
                position: Some(Position::new(1, 2)),
                ..Meta::at("src", 5)
            },
        );
        let mut whole = Vec::new();
        encode_event(&event, &mut whole);
        let mut cache = None;
        for len in 0..whole.len() {
            let data = Bytes::copy_from_slice(&whole[..len]);
            let err = decode_event(&data, 0..len, &mut cache).unwrap_err();
            assert!(
                err.contains("short") || err.contains("ends"),
                "cut at {len}: {err}"
            );
        }
        let data = Bytes::from(whole);
        let back = decode_event(&data, 0..data.len(), &mut cache).unwrap();
        assert_eq!(back, event);
    }

    /// Records that end exactly where their source name, origin or
    /// attributes end (an empty raw payload) are whole, not short.
    #[test]
    fn records_ending_exactly_at_a_part_decode_and_sources_are_cached_by_name() {
        let meta = |source: &str, origin: Option<&str>, attributes: bool| Meta {
            source: source.into(),
            ingest_ns: 9,
            origin: origin.map(Arc::from),
            attributes: attributes.then(|| Arc::new(Fields::default())),
            position: None,
        };
        let events = [
            Event::raw(&b""[..], meta("", None, false)),
            Event::raw(&b""[..], meta("a", None, false)),
            Event::raw(&b""[..], meta("a", Some(""), false)),
            Event::raw(&b""[..], meta("b", Some("/o"), false)),
            Event::raw(&b""[..], meta("b", None, true)),
            Event::raw(&b"x"[..], meta("a", Some("/p"), true)),
        ];
        let back = round_trip(&events.iter().collect::<Vec<_>>());
        assert_eq!(back, events);
        let sources: Vec<&str> = back.iter().map(|e| &*e.meta().source).collect();
        assert_eq!(sources, ["", "a", "a", "b", "b", "a"]);
        // One name, one `Arc`, while the name repeats.
        assert!(Arc::ptr_eq(&back[1].meta().source, &back[2].meta().source));
        assert_eq!(back[2].meta().origin.as_deref(), Some(""));
    }

    #[test]
    fn long_names_are_clipped_at_a_character_boundary() {
        assert_eq!(clip(b"short"), b"short");
        assert_eq!(clip(b""), b"");
        let ascii = vec![b'a'; 70_000];
        assert_eq!(clip(&ascii).len(), 65_535);
        let exact = vec![b'a'; 65_535];
        assert_eq!(clip(&exact).len(), 65_535);
        // Two-byte characters: 65,535 would cut one in half.
        let accents = "é".repeat(40_000);
        let clipped = clip(accents.as_bytes());
        assert_eq!(clipped.len(), 65_534);
        assert!(std::str::from_utf8(clipped).is_ok());
        // Three-byte characters: back to the start of the one cut.
        let euros = "€".repeat(30_000);
        assert_eq!(clip(euros.as_bytes()).len(), 65_535 / 3 * 3);
        let shifted = format!("a{}", "€".repeat(30_000));
        assert_eq!(clip(shifted.as_bytes()).len(), 1 + (65_534 / 3) * 3);
        // A long source survives a round trip, clipped.
        let event = Event::raw(&b"x"[..], Meta::at(accents.as_str(), 0));
        let mut data = Vec::new();
        encode_event(&event, &mut data);
        let data = Bytes::from(data);
        let back = decode_event(&data, 0..data.len(), &mut None).unwrap();
        assert_eq!(back.meta().source.len(), 65_534);
    }

    #[test]
    fn not_received_adds_what_was_dropped_left_on_disk_or_undecodable() {
        let snapshot = DurableSnapshot {
            dropped_newest: 1,
            dropped_oldest: 2,
            unread: 4,
            undecodable: 8,
            // Lost records are not accounted for here: they count as lost.
            unreadable: 16,
            lost_at_open: 32,
            ..Default::default()
        };
        assert_eq!(snapshot.not_received(), 15);
    }

    #[test]
    fn malformed_records_are_errors_not_panics() {
        let mut cache = None;
        for bad in [
            &b""[..],
            b"\x01short",
            // A source name longer than the record.
            b"\x01\0\0\0\0\0\0\0\0\x05\0ab",
            b"\x09\0\0\0\0\0\0\0\0\0\0",
            b"\x02\0\0\0\0\0\0\0\0\x01\0s{oops",
            // An origin cut short, its length, and one that is not UTF-8.
            b"\x03\0\0\0\0\0\0\0\0\x01\0s\x09\0/var",
            b"\x03\0\0\0\0\0\0\0\0\x01\0s\x09",
            b"\x04\0\0\0\0\0\0\0\0\x01\0s\x01\0\xff{}",
            // Attributes cut short, longer than the record, not JSON.
            b"\x05\0\0\0\0\0\0\0\0\x01\0s\0\0\x02",
            b"\x05\0\0\0\0\0\0\0\0\x01\0s\0\0\xff\xff\xff\xff{}",
            b"\x06\0\0\0\0\0\0\0\0\x01\0s\0\0\x02\0\0\0[]{}",
        ] {
            let data = Bytes::copy_from_slice(bad);
            assert!(
                decode_event(&data, 0..data.len(), &mut cache).is_err(),
                "{bad:?}"
            );
        }
    }
}
