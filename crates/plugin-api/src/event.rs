//! The unit of work. An event is reference-counted so that fan-out costs one
//! pointer increment per downstream; a stage that mutates an event it shares
//! gets its own copy (copy-on-write through [`Event::data_mut`]).
//!
//! Payloads start as raw bytes (a line as read) and become structured fields
//! once a parser has run. Keeping raw bytes as `Bytes` slices of the read
//! buffer means a source can frame lines without copying them.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Map, Value};

/// Structured fields of an event: a JSON object that keeps insertion order.
pub type Fields = Map<String, Value>;

#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// Bytes as a source framed them, not yet parsed.
    Raw(Bytes),
    /// Parsed, structured fields.
    Fields(Fields),
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
}

#[derive(Debug, Clone, PartialEq)]
pub struct EventData {
    pub payload: Payload,
    pub meta: Meta,
}

/// A cheaply clonable event. Clones share the data until one of them is mutated.
#[derive(Debug, Clone, PartialEq)]
pub struct Event(Arc<EventData>);

impl Event {
    pub fn new(payload: Payload, meta: Meta) -> Self {
        Event(Arc::new(EventData { payload, meta }))
    }

    pub fn raw(bytes: impl Into<Bytes>, meta: Meta) -> Self {
        Self::new(Payload::Raw(bytes.into()), meta)
    }

    pub fn fields(fields: Fields, meta: Meta) -> Self {
        Self::new(Payload::Fields(fields), meta)
    }

    pub fn payload(&self) -> &Payload {
        &self.0.payload
    }

    pub fn meta(&self) -> &Meta {
        &self.0.meta
    }

    /// Mutable access; copies the data first if another clone shares it.
    pub fn data_mut(&mut self) -> &mut EventData {
        Arc::make_mut(&mut self.0)
    }

    pub fn payload_mut(&mut self) -> &mut Payload {
        &mut self.data_mut().payload
    }

    /// The structured fields, if a parser has produced them.
    pub fn as_fields(&self) -> Option<&Fields> {
        match &self.0.payload {
            Payload::Fields(f) => Some(f),
            Payload::Raw(_) => None,
        }
    }

    pub fn fields_mut(&mut self) -> Option<&mut Fields> {
        match self.payload_mut() {
            Payload::Fields(f) => Some(f),
            Payload::Raw(_) => None,
        }
    }

    /// The raw bytes, if the event has not been parsed.
    pub fn as_raw(&self) -> Option<&Bytes> {
        match &self.0.payload {
            Payload::Raw(b) => Some(b),
            Payload::Fields(_) => None,
        }
    }

    /// Size of the payload in bytes: exact for raw events, an estimate of the
    /// serialized size for structured ones is not computed (0).
    pub fn raw_len(&self) -> usize {
        self.as_raw().map_or(0, Bytes::len)
    }

    /// Whether another clone shares this event's data (fan-out).
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.0) > 1
    }
}

impl Meta {
    pub fn now(source: Arc<str>) -> Self {
        Meta {
            source,
            ingest_ns: now_ns(),
            origin: None,
        }
    }
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A dotted field path (`http.status`), split once when a plugin is built so
/// the hot path does no string parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    segments: Vec<String>,
    text: String,
}

impl FieldPath {
    /// Parses `a.b.c`. Empty segments (`a..b`, leading or trailing dots) are rejected.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("field path is empty".into());
        }
        let segments: Vec<String> = text.split('.').map(str::to_owned).collect();
        if segments.iter().any(String::is_empty) {
            return Err(format!("field path `{text}` has an empty segment"));
        }
        Ok(FieldPath {
            segments,
            text: text.to_owned(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn get<'a>(&self, fields: &'a Fields) -> Option<&'a Value> {
        let (last, parents) = self.segments.split_last()?;
        let mut map = fields;
        for seg in parents {
            map = map.get(seg)?.as_object()?;
        }
        map.get(last)
    }

    /// Sets the value, creating intermediate objects. An intermediate that
    /// exists but is not an object is replaced by an object.
    pub fn set(&self, fields: &mut Fields, value: Value) {
        let (last, parents) = self.segments.split_last().expect("path is never empty");
        let mut map = fields;
        for seg in parents {
            let slot = map
                .entry(seg.clone())
                .or_insert_with(|| Value::Object(Fields::new()));
            if !slot.is_object() {
                *slot = Value::Object(Fields::new());
            }
            map = slot.as_object_mut().expect("just made an object");
        }
        map.insert(last.clone(), value);
    }

    /// Removes and returns the value, keeping the order of the other fields.
    pub fn remove(&self, fields: &mut Fields) -> Option<Value> {
        let (last, parents) = self.segments.split_last()?;
        let mut map = fields;
        for seg in parents {
            map = map.get_mut(seg)?.as_object_mut()?;
        }
        map.shift_remove(last)
    }
}

impl std::fmt::Display for FieldPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta() -> Meta {
        Meta {
            source: "src".into(),
            ingest_ns: 1,
            origin: None,
        }
    }

    #[test]
    fn clone_shares_until_mutated() {
        let mut a = Event::fields(Fields::new(), meta());
        let b = a.clone();
        assert!(a.is_shared());
        a.fields_mut().unwrap().insert("x".into(), json!(1));
        assert!(!a.is_shared());
        assert!(b.as_fields().unwrap().is_empty());
        assert_eq!(a.as_fields().unwrap()["x"], json!(1));
    }

    #[test]
    fn paths_get_set_remove_nested() {
        let p = FieldPath::parse("a.b.c").unwrap();
        let mut f = Fields::new();
        p.set(&mut f, json!(3));
        assert_eq!(p.get(&f), Some(&json!(3)));
        assert_eq!(Value::Object(f.clone()), json!({"a": {"b": {"c": 3}}}));
        assert_eq!(p.remove(&mut f), Some(json!(3)));
        assert_eq!(p.get(&f), None);
    }

    #[test]
    fn set_through_a_scalar_replaces_it() {
        let p = FieldPath::parse("a.b").unwrap();
        let mut f = serde_json::from_value::<Fields>(json!({"a": 1})).unwrap();
        p.set(&mut f, json!(true));
        assert_eq!(Value::Object(f), json!({"a": {"b": true}}));
    }

    #[test]
    fn bad_paths_are_rejected() {
        assert!(FieldPath::parse("").is_err());
        assert!(FieldPath::parse("a..b").is_err());
        assert!(FieldPath::parse(".a").is_err());
    }
}
