//! The unit of work. An event is reference-counted so that fan-out costs one
//! pointer increment per downstream; a stage that mutates an event it shares
//! gets its own copy (copy-on-write through [`Event::data_mut`]).
//!
//! Beside the shared data an event carries its [`Ack`]: the handle that
//! tells its source when it is finished ([`ack`] says how). The handle is
//! not part of the data, so copy-on-write never duplicates it, and it is
//! not part of [`Meta`], so nothing that stores events can store it.
//!
//! Payloads start as raw bytes (a line as read) and become structured fields
//! once a parser has run. Keeping raw bytes as `Bytes` slices of the read
//! buffer means a source can frame lines without copying them. Parsed JSON
//! may stay text for as long as no stage changes a nested field or needs
//! the whole map ([`lazy`] says why); [`Event::field`] reads one path either
//! way and [`Event::as_fields`] hides the difference.

pub mod ack;
pub mod checkpoint;
pub mod lazy;
pub mod path;
pub mod position;
pub mod spelling;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Map, Value};

pub use ack::{Ack, AckReceiver, BatchAck, Outcome};
pub use checkpoint::{AckCounts, OrderedCheckpoint};
pub use lazy::LazyFields;
pub use path::FieldPath;
pub use position::Position;
pub use spelling::closest;

/// Structured fields of an event: a JSON object that keeps insertion order.
pub type Fields = Map<String, Value>;

#[derive(Debug, Clone)]
pub enum Payload {
    /// Bytes as a source framed them, not yet parsed.
    Raw(Bytes),
    /// Parsed, structured fields.
    Fields(Fields),
    /// Parsed fields still held as their JSON text, with top-level edits
    /// ([`LazyFields`]); equal to the [`Payload::Fields`] they stand for.
    Lazy(LazyFields),
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Payload::Raw(a), Payload::Raw(b)) => a == b,
            (Payload::Raw(_), _) | (_, Payload::Raw(_)) => false,
            (a, b) => a.as_fields() == b.as_fields(),
        }
    }
}

impl Payload {
    /// The structured fields, if parsed (lazy ones are built on first use).
    pub fn as_fields(&self) -> Option<&Fields> {
        match self {
            Payload::Fields(f) => Some(f),
            Payload::Lazy(l) => Some(l.fields()),
            Payload::Raw(_) => None,
        }
    }

    /// Turns lazy fields into ordinary ones, for a stage about to change
    /// them through `&mut Fields`.
    pub fn materialize(&mut self) {
        if let Payload::Lazy(_) = self
            && let Payload::Lazy(l) = std::mem::replace(self, Payload::Raw(Bytes::new()))
        {
            *self = Payload::Fields(l.into_fields());
        }
    }

    /// Writes parsed fields as one compact JSON object; `false` (nothing
    /// written) for a raw payload. Lazy fields are spliced, not rebuilt.
    pub fn write_json(&self, out: &mut Vec<u8>) -> bool {
        match self {
            Payload::Fields(f) => {
                sonic_rs::to_writer(&mut *out, f).expect("fields serialise into a Vec");
                true
            }
            Payload::Lazy(l) => {
                l.write_json(out);
                true
            }
            Payload::Raw(_) => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    /// Id of the source stage that emitted the event.
    pub source: Arc<str>,
    /// When the source read the event, nanoseconds since the Unix epoch.
    pub ingest_ns: u64,
    /// Where the source found the event, when it knows and says: the path
    /// of the file `source: tail` read it from. Parsers keep it (they only
    /// replace the payload), so a later `transform: fields` can write it
    /// into a field (`from_meta`).
    pub origin: Option<Arc<str>>,
    /// What the source knows about the event beyond its origin, by name:
    /// a Kafka message's topic, partition, offset, key, headers and
    /// timestamp. Shared, never copied per stage; readable by
    /// `transform: fields` (`from_meta`) and the JS transform, and kept
    /// by a durable queue.
    pub attributes: Option<Arc<Fields>>,
    /// Where a replaying source found the event ([`position`]): the same
    /// input read again after a crash has the same position, which lets
    /// a sink give a destination an id that makes the redelivery harmless.
    /// `None` from sources that cannot read anything twice.
    pub position: Option<Position>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EventData {
    pub payload: Payload,
    pub meta: Meta,
}

/// A cheaply clonable event. Clones share the data until one of them is
/// mutated; each clone has its own handle on the source's acknowledgement.
#[derive(Debug, Clone)]
pub struct Event {
    data: Arc<EventData>,
    ack: Ack,
}

/// Events are equal when their data is: the acknowledgement is bookkeeping.
impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.data == other.data
    }
}

impl Event {
    pub fn new(payload: Payload, meta: Meta) -> Self {
        Event {
            data: Arc::new(EventData { payload, meta }),
            ack: Ack::none(),
        }
    }

    /// The event with `ack` as its acknowledgement handle.
    pub fn with_ack(mut self, ack: Ack) -> Self {
        self.ack = ack;
        self
    }

    pub fn ack(&self) -> &Ack {
        &self.ack
    }

    /// Moves the acknowledgement handle out (the event keeps none), for a
    /// sink that lets go of the event's data before the destination has
    /// confirmed it (an object uploaded in parts).
    pub fn take_ack(&mut self) -> Ack {
        std::mem::take(&mut self.ack)
    }

    /// Gives the event `ack` unless it already has a pending one.
    pub fn inherit_ack(&mut self, ack: &Ack) {
        if !self.ack.is_pending() {
            self.ack = ack.clone();
        }
    }

    /// Records what happened to this event for its source.
    pub fn settle(&mut self, outcome: Outcome) {
        self.ack.settle(outcome);
    }

    /// Settles every event of a batch alike.
    pub fn settle_all<'a>(events: impl IntoIterator<Item = &'a mut Event>, outcome: Outcome) {
        for event in events {
            event.settle(outcome);
        }
    }

    /// A copy sharing the data but not the acknowledgement, for observers
    /// (taps, previews) whose copies finish nothing.
    pub fn detached(&self) -> Event {
        Event {
            data: self.data.clone(),
            ack: Ack::none(),
        }
    }

    pub fn raw(bytes: impl Into<Bytes>, meta: Meta) -> Self {
        Self::new(Payload::Raw(bytes.into()), meta)
    }

    pub fn fields(fields: Fields, meta: Meta) -> Self {
        Self::new(Payload::Fields(fields), meta)
    }

    pub fn payload(&self) -> &Payload {
        &self.data.payload
    }

    pub fn meta(&self) -> &Meta {
        &self.data.meta
    }

    /// The metadata to change; copies the data first if another clone
    /// shares it.
    pub fn meta_mut(&mut self) -> &mut Meta {
        &mut self.data_mut().meta
    }

    /// Mutable access; copies the data first if another clone shares it.
    pub fn data_mut(&mut self) -> &mut EventData {
        Arc::make_mut(&mut self.data)
    }

    pub fn payload_mut(&mut self) -> &mut Payload {
        &mut self.data_mut().payload
    }

    /// The structured fields, if a parser has produced them.
    pub fn as_fields(&self) -> Option<&Fields> {
        self.data.payload.as_fields()
    }

    /// Whether a parser has produced fields.
    pub fn is_parsed(&self) -> bool {
        !matches!(self.data.payload, Payload::Raw(_))
    }

    /// The fields to change in place (lazy ones become ordinary fields).
    pub fn fields_mut(&mut self) -> Option<&mut Fields> {
        let payload = self.payload_mut();
        payload.materialize();
        match payload {
            Payload::Fields(f) => Some(f),
            Payload::Raw(_) | Payload::Lazy(_) => None,
        }
    }

    /// Sets the field at `path`, creating intermediate objects
    /// ([`FieldPath::set`]); on lazy fields a top-level path is an edit
    /// beside the text. `false` (nothing set) if the event is raw.
    pub fn set_field(&mut self, path: &FieldPath, value: serde_json::Value) -> bool {
        let payload = self.payload_mut();
        match (payload, path.segments()) {
            (Payload::Lazy(l), [key]) if !l.is_built() => {
                l.set(key, value);
                true
            }
            (payload, _) => {
                payload.materialize();
                match payload {
                    Payload::Fields(f) => {
                        path.set(f, value);
                        true
                    }
                    _ => false,
                }
            }
        }
    }

    /// The field at `path`. On lazy fields only the top-level entry the
    /// path starts with is parsed, from its text alone (nothing is built
    /// for the rest of the line), so the value is owned; on ordinary
    /// fields it is borrowed. `None` if absent or the event is raw.
    pub fn field(&self, path: &FieldPath) -> Option<Cow<'_, serde_json::Value>> {
        match &self.data.payload {
            Payload::Lazy(l) if !l.is_built() => {
                let (first, rest) = path.segments().split_first()?;
                let mut value = l.get(first)?;
                for segment in rest {
                    value = match value {
                        Value::Object(mut map) => map.remove(segment)?,
                        _ => return None,
                    };
                }
                Some(Cow::Owned(value))
            }
            payload => path.get(payload.as_fields()?).map(Cow::Borrowed),
        }
    }

    /// Removes the field at `path` and returns it ([`FieldPath::remove`]);
    /// on lazy fields a top-level path is a delete beside the text. `None`
    /// if absent or the event is raw.
    pub fn take_field(&mut self, path: &FieldPath) -> Option<serde_json::Value> {
        let payload = self.payload_mut();
        match (payload, path.segments()) {
            (Payload::Lazy(l), [key]) if !l.is_built() => {
                let value = l.get(key);
                l.delete(key);
                value
            }
            (payload, _) => {
                payload.materialize();
                match payload {
                    Payload::Fields(f) => path.remove(f),
                    _ => None,
                }
            }
        }
    }

    /// Deletes the field at `path` ([`FieldPath::remove`]) without
    /// returning it, so lazy fields need not build the value. `false` if
    /// the event is raw.
    pub fn delete_field(&mut self, path: &FieldPath) -> bool {
        let payload = self.payload_mut();
        match (payload, path.segments()) {
            (Payload::Lazy(l), [key]) if !l.is_built() => {
                l.delete(key);
                true
            }
            (payload, _) => {
                payload.materialize();
                match payload {
                    Payload::Fields(f) => {
                        path.remove(f);
                        true
                    }
                    _ => false,
                }
            }
        }
    }

    /// The raw bytes, if the event has not been parsed.
    pub fn as_raw(&self) -> Option<&Bytes> {
        match &self.data.payload {
            Payload::Raw(b) => Some(b),
            Payload::Fields(_) | Payload::Lazy(_) => None,
        }
    }

    /// Size of the payload in bytes: exact for raw events, an estimate of the
    /// serialized size for structured ones is not computed (0).
    pub fn raw_len(&self) -> usize {
        self.as_raw().map_or(0, Bytes::len)
    }
}

impl Meta {
    /// Read now, from `source`, with no origin or attributes.
    pub fn now(source: Arc<str>) -> Self {
        Meta::at(source, now_ns())
    }

    /// Read at `ingest_ns` from `source`, with no origin or attributes:
    /// replays, tests and sources that know when an event was read.
    pub fn at(source: impl Into<Arc<str>>, ingest_ns: u64) -> Self {
        Meta {
            source: source.into(),
            ingest_ns,
            origin: None,
            attributes: None,
            position: None,
        }
    }
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_are_equal_by_their_data_not_their_acknowledgement() {
        struct Ignore;
        impl AckReceiver for Ignore {
            fn finished(&self, _: u64, _: Outcome) {}
        }
        let batch = BatchAck::new(Arc::new(Ignore), 1);
        let plain = Event::raw("a", meta());
        let acked = Event::raw("a", meta()).with_ack(batch.handle());
        assert_eq!(plain, acked);
        assert_ne!(plain, Event::raw("b", meta()));
        let mut later = meta();
        later.ingest_ns = 2;
        assert_ne!(plain, Event::raw("a", later));
    }

    /// Whether another clone shares this event's data (fan-out).
    fn is_shared(event: &Event) -> bool {
        Arc::strong_count(&event.data) > 1
    }

    fn meta() -> Meta {
        Meta::at("src", 1)
    }

    #[test]
    fn mutating_a_shared_event_keeps_each_clone_its_own_handle() {
        use std::sync::Mutex;
        let checkpoint = Arc::new(Mutex::new(OrderedCheckpoint::new()));
        let token = checkpoint.lock().unwrap().begin(42u64, 2);
        let batch = BatchAck::new(checkpoint.clone(), token);
        let mut a = Event::fields(Fields::new(), meta()).with_ack(batch.handle());
        drop(batch);
        let mut b = a.clone();
        a.fields_mut().unwrap().insert("x".into(), json!(1));
        let tap = a.detached();
        assert!(!tap.ack().is_pending(), "observers' copies carry no handle");
        drop(tap);
        a.settle(Outcome::Delivered);
        drop(a);
        assert_eq!(checkpoint.lock().unwrap().committed(), None, "b is open");
        b.settle(Outcome::Delivered);
        drop(b);
        assert_eq!(checkpoint.lock().unwrap().committed(), Some(&42));
    }

    #[test]
    fn clone_shares_until_mutated() {
        let mut a = Event::fields(Fields::new(), meta());
        let b = a.clone();
        assert!(is_shared(&a));
        a.fields_mut().unwrap().insert("x".into(), json!(1));
        assert!(!is_shared(&a));
        assert!(b.as_fields().unwrap().is_empty());
        assert_eq!(a.as_fields().unwrap()["x"], json!(1));
    }

    fn lazy(text: &'static str) -> Payload {
        Payload::Lazy(LazyFields::parse(Bytes::from_static(text.as_bytes())).unwrap())
    }

    fn fields(value: Value) -> Fields {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn payloads_are_equal_by_content_lazy_or_not() {
        let raw = |t: &'static str| Payload::Raw(Bytes::from_static(t.as_bytes()));
        assert_eq!(raw("a"), raw("a"));
        assert_ne!(raw("a"), raw("b"));
        assert_ne!(raw("{}"), Payload::Fields(Fields::new()));
        assert_ne!(Payload::Fields(Fields::new()), raw("{}"));
        assert_eq!(lazy(r#"{"a":1}"#), Payload::Fields(fields(json!({"a": 1}))));
        assert_eq!(Payload::Fields(fields(json!({"a": 1}))), lazy(r#"{"a":1}"#));
        assert_ne!(lazy(r#"{"a":1}"#), lazy(r#"{"a":2}"#));
    }

    #[test]
    fn json_is_written_for_parsed_payloads_only() {
        let mut out = Vec::new();
        assert!(!Payload::Raw(Bytes::from_static(b"x")).write_json(&mut out));
        assert!(out.is_empty());
        assert!(Payload::Fields(fields(json!({"a": 1, "b": "x"}))).write_json(&mut out));
        out.push(b'|');
        let mut edited = lazy(r#"{"a":1,"b":"x"}"#);
        if let Payload::Lazy(l) = &mut edited {
            l.set("c", json!(true));
            l.delete("a");
        }
        assert!(edited.write_json(&mut out));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":1,"b":"x"}|{"b":"x","c":true}"#
        );
    }

    #[test]
    fn materialize_turns_lazy_fields_into_ordinary_ones_only() {
        let mut p = lazy(r#"{"a":1}"#);
        p.materialize();
        assert!(matches!(&p, Payload::Fields(f) if f["a"] == json!(1)));
        let mut raw = Payload::Raw(Bytes::from_static(b"x"));
        raw.materialize();
        assert_eq!(raw, Payload::Raw(Bytes::from_static(b"x")));
    }

    #[test]
    fn top_level_edits_keep_lazy_fields_lazy_and_deeper_ones_build_them() {
        let event = || Event::new(lazy(r#"{"a":1,"b":{"c":2}}"#), meta());
        let top = FieldPath::parse("z").unwrap();
        let deep = FieldPath::parse("b.c").unwrap();
        let mut e = event();
        assert!(e.set_field(&top, json!(3)));
        assert!(e.delete_field(&FieldPath::parse("a").unwrap()));
        assert!(matches!(e.payload(), Payload::Lazy(_)));
        assert_eq!(
            e.as_fields().unwrap(),
            &fields(json!({"b": {"c": 2}, "z": 3}))
        );
        let mut e = event();
        assert!(e.set_field(&deep, json!(4)));
        assert!(matches!(e.payload(), Payload::Fields(_)));
        assert_eq!(e.as_fields().unwrap()["b"], json!({"c": 4}));
        let mut e = event();
        assert!(e.delete_field(&deep));
        assert!(matches!(e.payload(), Payload::Fields(_)));
        assert_eq!(e.as_fields().unwrap()["b"], json!({}));
        // Raw events have no fields to edit.
        let mut raw = Event::raw("line", meta());
        assert!(!raw.set_field(&top, json!(1)));
        assert!(!raw.delete_field(&top));
        assert!(raw.fields_mut().is_none());
        assert_eq!(raw.as_raw().map(|b| &b[..]), Some(&b"line"[..]));
    }

    #[test]
    fn reads_and_takes_keep_lazy_fields_lazy_and_agree_with_ordinary_ones() {
        let text = r#"{"a":1,"b":{"c":[2]},"s":"x"}"#;
        let path = |p: &str| FieldPath::parse(p).unwrap();
        let lazy_event = || Event::new(lazy(text), meta());
        let eager = Event::fields(serde_json::from_str(text).unwrap(), meta());
        let e = lazy_event();
        for p in ["a", "b", "b.c", "s", "z", "b.z", "a.z", "s.x"] {
            assert_eq!(
                e.field(&path(p)).as_deref(),
                eager.field(&path(p)).as_deref(),
                "{p}"
            );
        }
        assert_eq!(e.field(&path("b.c")).as_deref(), Some(&json!([2])));
        assert!(matches!(e.field(&path("a")), Some(Cow::Owned(_))));
        assert!(matches!(eager.field(&path("a")), Some(Cow::Borrowed(_))));
        // Reading built nothing.
        assert!(matches!(e.payload(), Payload::Lazy(l) if !l.is_built()));

        // A top-level take is a delete beside the text.
        let mut e = lazy_event();
        assert_eq!(e.take_field(&path("s")), Some(json!("x")));
        assert_eq!(e.take_field(&path("s")), None);
        assert_eq!(e.take_field(&path("z")), None);
        assert!(matches!(e.payload(), Payload::Lazy(l) if !l.is_built()));
        assert_eq!(
            e.as_fields().unwrap(),
            &fields(json!({"a": 1, "b": {"c": [2]}}))
        );
        // A nested take builds the fields.
        let mut e = lazy_event();
        assert_eq!(e.take_field(&path("b.c")), Some(json!([2])));
        assert!(matches!(e.payload(), Payload::Fields(_)));
        assert_eq!(e.as_fields().unwrap()["b"], json!({}));
        // Once a stage built them, reads come from the built fields.
        let mut e = lazy_event();
        e.as_fields();
        assert!(matches!(e.field(&path("a")), Some(Cow::Borrowed(_))));
        assert_eq!(e.take_field(&path("a")), Some(json!(1)));
        assert!(matches!(e.payload(), Payload::Fields(_)));
        // Raw events have no fields to read or take.
        let mut raw = Event::raw("line", meta());
        assert!(raw.field(&path("a")).is_none());
        assert!(raw.take_field(&path("a")).is_none());
        assert_eq!(raw.as_raw().map(|b| &b[..]), Some(&b"line"[..]));
    }

    #[test]
    fn raw_length_and_parsed_say_what_the_payload_is() {
        let raw = Event::raw("four", meta());
        assert_eq!((raw.raw_len(), raw.is_parsed()), (4, false));
        let parsed = Event::new(lazy("{}"), meta());
        assert_eq!((parsed.raw_len(), parsed.is_parsed()), (0, true));
        assert!(parsed.as_raw().is_none());
        assert!(Event::fields(Fields::new(), meta()).is_parsed());
    }

    #[test]
    fn acknowledgement_handles_move_inherit_and_settle() {
        use std::sync::Mutex;
        let checkpoint = Arc::new(Mutex::new(OrderedCheckpoint::new()));
        let open = |events| {
            let token = checkpoint.lock().unwrap().begin(events, events);
            BatchAck::new(checkpoint.clone(), token)
        };
        let first = open(1);
        let second = open(2);
        // A probe handle, settled so that it does not count as failed.
        let of = |batch: &BatchAck| {
            let mut probe = batch.handle();
            let ack = probe.clone();
            probe.settle(Outcome::Delivered);
            ack
        };
        let mut offered = second.handle();
        let mut a = Event::raw("a", meta()).with_ack(first.handle());
        // A pending handle is kept; an event without one takes it.
        a.inherit_ack(&offered);
        let mut probe = of(&first);
        assert!(a.ack().same_batch(&probe));
        probe.settle(Outcome::Delivered);
        let mut b = Event::raw("b", meta());
        b.inherit_ack(&offered);
        offered.settle(Outcome::Delivered);
        let mut probe = of(&second);
        assert!(b.ack().same_batch(&probe) && !a.ack().same_batch(&probe));
        probe.settle(Outcome::Delivered);
        // Taking the handle leaves the event without one.
        let mut taken = a.take_ack();
        assert!(!a.ack().is_pending() && taken.is_pending());
        drop((first, second));
        taken.settle(Outcome::Delivered);
        drop(taken);
        let mut c = Event::raw("c", meta());
        c.inherit_ack(b.ack());
        Event::settle_all([&mut b, &mut c], Outcome::Rejected);
        drop((a, b, c));
        let counts = checkpoint.lock().unwrap().counts();
        assert_eq!(
            (counts.delivered, counts.rejected, counts.errored),
            (1, 2, 0)
        );
    }

    #[test]
    fn a_new_meta_is_stamped_now() {
        let before = now_ns();
        let meta = Meta::now("s".into());
        assert!(before > 1_600_000_000_000_000_000, "{before}");
        assert!((before..=now_ns()).contains(&meta.ingest_ns));
        assert_eq!((&*meta.source, meta.origin.is_none()), ("s", true));
    }
}
