//! OTLP log records and LogBus events, both ways. One mapping serves the
//! source (records → events) and the sink (events → records), so that an
//! event that came in over OTLP goes out as the record it was: body,
//! severity, times, trace context, attributes, resource and scope.
//!
//! An event from a record (the default, `nested` layout):
//!
//! ```json
//! {"body": "GET /", "severity_number": 9, "severity_text": "INFO",
//!  "time_unix_nano": 1796168975078394997, "observed_time_unix_nano": …,
//!  "timestamp": "2026-12-01T23:49:35.078394997Z",
//!  "trace_id": "5b8efff798038103d269b633813fc60c", "span_id": "eee19b7ec3c1b174", "flags": 1,
//!  "attributes": {"http.method": "GET"},
//!  "resource": {"service.name": "api"},
//!  "scope": {"name": "app.http", "version": "1.2", "attributes": {}}}
//! ```
//!
//! `flatten` puts resource attributes at `resource.<key>` and the scope at
//! `scope.name`, `scope.version`, `scope.attributes.<key>` instead.
//! Values map the plain way: strings, booleans, integers and doubles as
//! themselves, arrays and key-value lists as arrays and objects, bytes as
//! base64 text.

use base64::Engine;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value::Value as V,
};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::resource::v1::Resource;
use serde_json::{Map, Number, Value};

/// `google.rpc.Status`, what OTLP/HTTP answers an error with (its
/// `details` left out).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// Nesting beyond this in a body or attribute is cut (the value becomes
/// its type's name): a hostile client cannot make a deep recursion.
pub const MAX_DEPTH: usize = 64;

/// Where resource and scope go in an event.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// `resource: {…}`, `scope: {name, version, attributes}`.
    #[default]
    Nested,
    /// `resource.<key>`, `scope.name`, `scope.version`, `scope.attributes.<key>`.
    Flatten,
}

pub fn any_to_json(v: &AnyValue, depth: usize) -> Value {
    match &v.value {
        None | Some(V::StringValueStrindex(_)) => Value::Null,
        Some(V::StringValue(s)) => Value::String(s.clone()),
        Some(V::BoolValue(b)) => Value::Bool(*b),
        Some(V::IntValue(i)) => Value::from(*i),
        Some(V::DoubleValue(d)) => Number::from_f64(*d).map_or_else(
            // NaN and the infinities have no JSON number.
            || Value::String(d.to_string()),
            Value::Number,
        ),
        Some(V::BytesValue(b)) => {
            Value::String(base64::engine::general_purpose::STANDARD.encode(b))
        }
        Some(V::ArrayValue(a)) if depth < MAX_DEPTH => {
            Value::Array(a.values.iter().map(|x| any_to_json(x, depth + 1)).collect())
        }
        Some(V::KvlistValue(kv)) if depth < MAX_DEPTH => {
            Value::Object(attributes_to_json(&kv.values, depth + 1))
        }
        Some(V::ArrayValue(_)) => Value::String("array".into()),
        Some(V::KvlistValue(_)) => Value::String("kvlist".into()),
    }
}

pub fn attributes_to_json(kvs: &[KeyValue], depth: usize) -> Map<String, Value> {
    kvs.iter()
        .map(|kv| {
            let v = kv
                .value
                .as_ref()
                .map_or(Value::Null, |v| any_to_json(v, depth));
            (kv.key.clone(), v)
        })
        .collect()
}

pub fn json_to_any(v: &Value, depth: usize) -> AnyValue {
    let value = match v {
        Value::Null => None,
        Value::Bool(b) => Some(V::BoolValue(*b)),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Some(V::IntValue(i)),
            None => Some(V::DoubleValue(n.as_f64().unwrap_or(f64::NAN))),
        },
        Value::String(s) => Some(V::StringValue(s.clone())),
        Value::Array(a) if depth < MAX_DEPTH => Some(V::ArrayValue(ArrayValue {
            values: a.iter().map(|x| json_to_any(x, depth + 1)).collect(),
        })),
        Value::Object(m) if depth < MAX_DEPTH => Some(V::KvlistValue(KeyValueList {
            values: json_to_attributes(m, depth + 1),
        })),
        Value::Array(_) => Some(V::StringValue("array".into())),
        Value::Object(_) => Some(V::StringValue("object".into())),
    };
    AnyValue { value }
}

pub fn json_to_attributes(m: &Map<String, Value>, depth: usize) -> Vec<KeyValue> {
    m.iter()
        .map(|(k, v)| KeyValue {
            key: k.clone(),
            value: Some(json_to_any(v, depth)),
            ..Default::default()
        })
        .collect()
}

/// RFC 3339 in UTC with nanoseconds.
pub fn rfc3339(ns: u64) -> String {
    let secs = (ns / 1_000_000_000) as i64;
    let nanos = (ns % 1_000_000_000) as u32;
    chrono::DateTime::from_timestamp(secs, nanos)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// The event fields of one record.
pub fn record_to_fields(
    resource: Option<&Resource>,
    scope: Option<&InstrumentationScope>,
    record: &LogRecord,
    layout: Layout,
) -> Map<String, Value> {
    let mut f = Map::new();
    f.insert(
        "body".into(),
        record
            .body
            .as_ref()
            .map_or(Value::Null, |b| any_to_json(b, 0)),
    );
    if record.severity_number != 0 {
        f.insert("severity_number".into(), record.severity_number.into());
    }
    if !record.severity_text.is_empty() {
        f.insert("severity_text".into(), record.severity_text.clone().into());
    }
    if record.time_unix_nano != 0 {
        f.insert("time_unix_nano".into(), record.time_unix_nano.into());
    }
    if record.observed_time_unix_nano != 0 {
        f.insert(
            "observed_time_unix_nano".into(),
            record.observed_time_unix_nano.into(),
        );
    }
    let at = match record.time_unix_nano {
        0 => record.observed_time_unix_nano,
        t => t,
    };
    if at != 0 {
        f.insert("timestamp".into(), rfc3339(at).into());
    }
    if !record.trace_id.is_empty() {
        f.insert("trace_id".into(), hex::encode(&record.trace_id).into());
    }
    if !record.span_id.is_empty() {
        f.insert("span_id".into(), hex::encode(&record.span_id).into());
    }
    if record.flags != 0 {
        f.insert("flags".into(), record.flags.into());
    }
    if !record.event_name.is_empty() {
        f.insert("event_name".into(), record.event_name.clone().into());
    }
    f.insert(
        "attributes".into(),
        Value::Object(attributes_to_json(&record.attributes, 0)),
    );
    if record.dropped_attributes_count != 0 {
        f.insert(
            "dropped_attributes_count".into(),
            record.dropped_attributes_count.into(),
        );
    }
    let resource_attributes =
        resource.map_or_else(Map::new, |r| attributes_to_json(&r.attributes, 0));
    let mut scope_fields = Map::new();
    if let Some(s) = scope {
        if !s.name.is_empty() {
            scope_fields.insert("name".into(), s.name.clone().into());
        }
        if !s.version.is_empty() {
            scope_fields.insert("version".into(), s.version.clone().into());
        }
        if !s.attributes.is_empty() {
            scope_fields.insert(
                "attributes".into(),
                Value::Object(attributes_to_json(&s.attributes, 0)),
            );
        }
    }
    match layout {
        Layout::Nested => {
            f.insert("resource".into(), Value::Object(resource_attributes));
            f.insert("scope".into(), Value::Object(scope_fields));
        }
        Layout::Flatten => {
            for (k, v) in resource_attributes {
                f.insert(format!("resource.{k}"), v);
            }
            for (k, v) in scope_fields {
                match (k.as_str(), v) {
                    ("attributes", Value::Object(attrs)) => {
                        for (ak, av) in attrs {
                            f.insert(format!("scope.attributes.{ak}"), av);
                        }
                    }
                    (_, v) => {
                        f.insert(format!("scope.{k}"), v);
                    }
                }
            }
        }
    }
    f
}

/// The severity number a text names (`INFO`, `warn`, `Error2`, …), per
/// the OpenTelemetry log data model's ranges; 0 when it names none.
pub fn severity_number_of(text: &str) -> i32 {
    let lower = text.trim().to_ascii_lowercase();
    let (name, n) = match lower.find(|c: char| c.is_ascii_digit()) {
        Some(i) => (&lower[..i], lower[i..].parse::<i32>().unwrap_or(1)),
        None => (lower.as_str(), 1),
    };
    let base = match name {
        "trace" => 1,
        "debug" => 5,
        "info" | "information" | "notice" => 9,
        "warn" | "warning" => 13,
        "error" | "err" => 17,
        "fatal" | "critical" | "crit" | "alert" | "emerg" | "emergency" | "panic" => 21,
        _ => return 0,
    };
    base + (n.clamp(1, 4) - 1)
}

/// The fields of an event that `record_to_fields` writes; everything else
/// an event holds goes into the record's attributes.
const KNOWN: &[&str] = &[
    "body",
    "severity_number",
    "severity_text",
    "time_unix_nano",
    "observed_time_unix_nano",
    "timestamp",
    "trace_id",
    "span_id",
    "flags",
    "event_name",
    "attributes",
    "dropped_attributes_count",
    "resource",
    "scope",
];

/// An event's resource attributes and scope, in either layout.
pub fn resource_and_scope(f: &Map<String, Value>) -> (Map<String, Value>, Map<String, Value>) {
    let mut resource = match f.get("resource") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    let mut scope = match f.get("scope") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    for (k, v) in f {
        if let Some(key) = k.strip_prefix("resource.") {
            resource.insert(key.to_string(), v.clone());
        } else if let Some(key) = k.strip_prefix("scope.attributes.") {
            if let Value::Object(attrs) = scope
                .entry("attributes")
                .or_insert_with(|| Value::Object(Map::new()))
            {
                attrs.insert(key.to_string(), v.clone());
            }
        } else if let Some(key @ ("name" | "version")) = k.strip_prefix("scope.") {
            scope.insert(key.to_string(), v.clone());
        }
    }
    (resource, scope)
}

pub fn resource_of(attributes: &Map<String, Value>) -> Resource {
    Resource {
        attributes: json_to_attributes(attributes, 0),
        ..Default::default()
    }
}

pub fn scope_of(scope: &Map<String, Value>) -> InstrumentationScope {
    let text = |k: &str| {
        scope
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    InstrumentationScope {
        name: text("name"),
        version: text("version"),
        attributes: match scope.get("attributes") {
            Some(Value::Object(a)) => json_to_attributes(a, 0),
            _ => Vec::new(),
        },
        ..Default::default()
    }
}

/// An OTLP/HTTP protobuf body (after decompression).
pub fn decode_protobuf(body: &[u8]) -> Result<ExportLogsServiceRequest, String> {
    use prost::Message;
    ExportLogsServiceRequest::decode(body)
        .map_err(|e| format!("the body is not an OTLP logs request: {e}"))
}

/// An OTLP/JSON body. Read through `serde_json::Value` first, to accept
/// what canonical protobuf JSON writes and `opentelemetry-proto`'s serde
/// mapping does not: `{"arrayValue": {}}` and `{"kvlistValue": {}}` for
/// empty lists. Nesting is bounded by serde_json's recursion limit (128).
pub fn decode_json(body: &[u8]) -> Result<ExportLogsServiceRequest, String> {
    let bad = |e: serde_json::Error| format!("the body is not OTLP/JSON: {e}");
    let mut value: Value = serde_json::from_slice(body).map_err(bad)?;
    fill_empty_lists(&mut value);
    serde_json::from_value(value).map_err(bad)
}

fn fill_empty_lists(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for key in ["arrayValue", "kvlistValue"] {
                if let Some(Value::Object(list)) = m.get_mut(key)
                    && !list.contains_key("values")
                {
                    list.insert("values".into(), Value::Array(Vec::new()));
                }
            }
            m.values_mut().for_each(fill_empty_lists);
        }
        Value::Array(a) => a.iter_mut().for_each(fill_empty_lists),
        _ => {}
    }
}

/// Which top-level fields a sink takes the body, severity text and time
/// from, besides the fields `record_to_fields` writes; `None`: the
/// defaults (`body` else `message`, `severity_text` else `level`,
/// `time_unix_nano` else `timestamp`).
#[derive(Debug, Clone, Default)]
pub struct Mapping {
    pub body: Option<String>,
    pub severity_text: Option<String>,
    pub time: Option<String>,
}

impl Mapping {
    fn mapped(&self, key: &str) -> bool {
        [&self.body, &self.severity_text, &self.time]
            .into_iter()
            .any(|f| f.as_deref() == Some(key))
    }
}

/// Nanoseconds since the epoch from an RFC 3339 text or an integer of
/// nanoseconds.
fn time_of(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(t) => chrono::DateTime::parse_from_rfc3339(t)
            .ok()
            .and_then(|t| t.timestamp_nanos_opt())
            .map(|n| n.max(0) as u64),
        _ => None,
    }
}

/// The record of an event: the fields `record_to_fields` writes go back
/// where they came from, `message` is the body when there is no `body`,
/// `level` the severity text when there is no `severity_text` (the number
/// then follows from the text), `timestamp` (RFC 3339) the time when
/// there is no `time_unix_nano`, the ingest time the observed time when
/// there is none; every other field becomes an attribute. A raw event is
/// its text as the body.
pub fn fields_to_record(
    f: Option<&Map<String, Value>>,
    raw: &[u8],
    ingest_ns: u64,
    mapping: &Mapping,
) -> LogRecord {
    let mut r = LogRecord {
        observed_time_unix_nano: ingest_ns,
        ..Default::default()
    };
    let Some(f) = f else {
        r.body = Some(AnyValue {
            value: Some(V::StringValue(String::from_utf8_lossy(raw).into_owned())),
        });
        return r;
    };
    let body = match &mapping.body {
        Some(field) => f.get(field),
        None => f.get("body").or_else(|| f.get("message")),
    };
    // `body: null` is how the source writes a record without one.
    r.body = body.filter(|b| !b.is_null()).map(|b| json_to_any(b, 0));
    let text = match &mapping.severity_text {
        Some(field) => f.get(field),
        None => f.get("severity_text").or_else(|| f.get("level")),
    }
    .and_then(Value::as_str);
    r.severity_text = text.unwrap_or("").to_string();
    r.severity_number = match f.get("severity_number").and_then(Value::as_i64) {
        Some(n) => n.clamp(0, 24) as i32,
        None => text.map_or(0, severity_number_of),
    };
    let u64_of = |k: &str| f.get(k).and_then(Value::as_u64);
    r.time_unix_nano = match &mapping.time {
        Some(field) => f.get(field).and_then(time_of),
        None => u64_of("time_unix_nano").or_else(|| f.get("timestamp").and_then(time_of)),
    }
    .unwrap_or(0);
    if let Some(o) = u64_of("observed_time_unix_nano") {
        r.observed_time_unix_nano = o;
    }
    let id = |k: &str, len: usize| {
        f.get(k)
            .and_then(Value::as_str)
            .and_then(|h| hex::decode(h).ok())
            .filter(|b| b.len() == len)
            .unwrap_or_default()
    };
    r.trace_id = id("trace_id", 16);
    r.span_id = id("span_id", 8);
    r.flags = u64_of("flags").map_or(0, |n| n as u32);
    r.event_name = f
        .get("event_name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    r.dropped_attributes_count = u64_of("dropped_attributes_count").map_or(0, |n| n as u32);
    let mut attributes = match f.get("attributes") {
        Some(Value::Object(a)) => json_to_attributes(a, 0),
        _ => Vec::new(),
    };
    for (k, v) in f {
        let mapped = KNOWN.contains(&k.as_str())
            || mapping.mapped(k)
            || (k == "message" && mapping.body.is_none() && !f.contains_key("body"))
            || (k == "level"
                && mapping.severity_text.is_none()
                && !f.contains_key("severity_text"))
            || k.starts_with("resource.")
            || k.starts_with("scope.");
        if !mapped {
            attributes.push(KeyValue {
                key: k.clone(),
                value: Some(json_to_any(v, 0)),
                ..Default::default()
            });
        }
    }
    r.attributes = attributes;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `otlp` fuzz target: a record without a body came back
    /// from its event with an empty body (an `AnyValue` with no value),
    /// which a receiver reads as a body that is there.
    #[test]
    fn a_record_without_a_body_goes_back_without_one() {
        let record = LogRecord {
            severity_number: 9,
            ..Default::default()
        };
        let fields = record_to_fields(None, None, &record, Layout::Nested);
        assert_eq!(fields["body"], Value::Null);
        let again = fields_to_record(Some(&fields), b"", 1, &Mapping::default());
        assert_eq!(again.body, None);
        assert_eq!(again.severity_number, 9);
    }

    #[test]
    fn decoders_name_what_is_wrong() {
        let e = decode_protobuf(b"\xff\xff").unwrap_err();
        assert!(e.starts_with("the body is not an OTLP logs request"), "{e}");
        let e = decode_json(b"{\"resourceLogs\": 3}").unwrap_err();
        assert!(e.starts_with("the body is not OTLP/JSON"), "{e}");
        let empty = decode_json(
            br#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"body":{"kvlistValue":{}}}]}]}]}"#,
        )
        .unwrap();
        let body = &empty.resource_logs[0].scope_logs[0].log_records[0].body;
        assert!(
            matches!(body.as_ref().and_then(|b| b.value.as_ref()), Some(V::KvlistValue(l)) if l.values.is_empty())
        );
    }
}
