//! The mapping between OTLP log records and events on its own, both ways:
//! every value type, the depth cut, each record field (present and
//! absent), both layouts, severity texts, and the sink's fallbacks
//! (`message`, `level`, `timestamp`, a mapping of its own). The source's
//! and sink's tests run it against the OpenTelemetry Collector.

use logbus_otlp::model::{
    Layout, MAX_DEPTH, Mapping, any_to_json, attributes_to_json, decode_json, fields_to_record,
    json_to_any, json_to_attributes, record_to_fields, resource_and_scope, resource_of, rfc3339,
    scope_of, severity_number_of,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use opentelemetry_proto::tonic::resource::v1::Resource;
use serde_json::{Map, Value, json};

fn any(v: V) -> AnyValue {
    AnyValue { value: Some(v) }
}

fn kv(key: &str, v: V) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(any(v)),
        ..Default::default()
    }
}

fn obj(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn text(s: &str) -> V {
    V::StringValue(s.into())
}

#[test]
fn values_become_json_the_plain_way() {
    let cases = [
        (AnyValue { value: None }, Value::Null),
        (any(V::StringValueStrindex(3)), Value::Null),
        (any(text("hé")), json!("hé")),
        (any(V::BoolValue(true)), json!(true)),
        (any(V::BoolValue(false)), json!(false)),
        (any(V::IntValue(-7)), json!(-7)),
        (any(V::DoubleValue(1.5)), json!(1.5)),
        (any(V::DoubleValue(f64::NAN)), json!("NaN")),
        (any(V::DoubleValue(f64::INFINITY)), json!("inf")),
        (any(V::BytesValue(b"hi".to_vec())), json!("aGk=")),
        (
            any(V::ArrayValue(ArrayValue {
                values: vec![
                    any(V::IntValue(1)),
                    any(text("x")),
                    AnyValue { value: None },
                ],
            })),
            json!([1, "x", null]),
        ),
        (
            any(V::KvlistValue(KeyValueList {
                values: vec![
                    kv("b", V::IntValue(2)),
                    kv("a", text("y")),
                    KeyValue {
                        key: "none".into(),
                        value: None,
                        ..Default::default()
                    },
                ],
            })),
            json!({"b": 2, "a": "y", "none": null}),
        ),
    ];
    for (value, want) in cases {
        assert_eq!(any_to_json(&value, 0), want, "{value:?}");
    }
}

/// An array of arrays `levels` deep holding `leaf`.
fn nested_any(levels: usize, leaf: AnyValue, list: bool) -> AnyValue {
    (0..levels).fold(leaf, |inner, _| {
        if list {
            any(V::KvlistValue(KeyValueList {
                values: vec![KeyValue {
                    key: "k".into(),
                    value: Some(inner),
                    ..Default::default()
                }],
            }))
        } else {
            any(V::ArrayValue(ArrayValue {
                values: vec![inner],
            }))
        }
    })
}

fn nested_json(levels: usize, leaf: Value, list: bool) -> Value {
    (0..levels).fold(leaf, |inner, _| {
        if list {
            json!({ "k": inner })
        } else {
            json!([inner])
        }
    })
}

/// Nesting is cut at `MAX_DEPTH`: the list there becomes its type's name;
/// one level less is kept whole. Both ways.
#[test]
fn nesting_is_cut_at_max_depth() {
    for list in [false, true] {
        let (name_in, name_out) = if list {
            ("kvlist", "object")
        } else {
            ("array", "array")
        };
        // MAX_DEPTH lists around a leaf: the innermost list is at depth
        // MAX_DEPTH - 1, kept.
        let kept = nested_any(MAX_DEPTH, any(V::IntValue(1)), list);
        assert_eq!(
            any_to_json(&kept, 0),
            nested_json(MAX_DEPTH, json!(1), list)
        );
        // One more: the innermost list is at depth MAX_DEPTH, cut.
        let cut = nested_any(MAX_DEPTH + 1, any(V::IntValue(1)), list);
        assert_eq!(
            any_to_json(&cut, 0),
            nested_json(MAX_DEPTH, json!(name_in), list)
        );
        // Starting deeper counts.
        assert_eq!(
            any_to_json(&nested_any(1, any(V::IntValue(1)), list), MAX_DEPTH),
            json!(name_in)
        );

        let kept = nested_json(MAX_DEPTH, json!(1), list);
        assert_eq!(
            json_to_any(&kept, 0),
            nested_any(MAX_DEPTH, any(V::IntValue(1)), list)
        );
        let cut = nested_json(MAX_DEPTH + 1, json!(1), list);
        assert_eq!(
            json_to_any(&cut, 0),
            nested_any(MAX_DEPTH, any(text(name_out)), list)
        );
        assert_eq!(
            json_to_any(&nested_json(1, json!(1), list), MAX_DEPTH),
            any(text(name_out))
        );
    }
}

#[test]
fn json_becomes_values_the_plain_way() {
    let cases = [
        (json!(null), AnyValue { value: None }),
        (json!(true), any(V::BoolValue(true))),
        (json!(-3), any(V::IntValue(-3))),
        (json!(i64::MAX), any(V::IntValue(i64::MAX))),
        // Past i64: a double.
        (json!(u64::MAX), any(V::DoubleValue(u64::MAX as f64))),
        (json!(2.5), any(V::DoubleValue(2.5))),
        (json!("s"), any(text("s"))),
        (
            json!([1, null]),
            any(V::ArrayValue(ArrayValue {
                values: vec![any(V::IntValue(1)), AnyValue { value: None }],
            })),
        ),
        (
            json!({"z": 1, "a": "b"}),
            any(V::KvlistValue(KeyValueList {
                values: vec![kv("z", V::IntValue(1)), kv("a", text("b"))],
            })),
        ),
    ];
    for (value, want) in cases {
        assert_eq!(json_to_any(&value, 0), want, "{value}");
    }
    let attrs = json_to_attributes(&obj(json!({"b": 1, "a": null})), 0);
    assert_eq!(
        attrs,
        [
            kv("b", V::IntValue(1)),
            KeyValue {
                key: "a".into(),
                value: Some(AnyValue { value: None }),
                ..Default::default()
            }
        ]
    );
    assert_eq!(
        attributes_to_json(&attrs, 0),
        obj(json!({"b": 1, "a": null}))
    );
}

#[test]
fn times_are_rfc3339_in_utc_to_the_nanosecond() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(1_500_000_000), "1970-01-01T00:00:01.500Z");
    assert_eq!(rfc3339(1_000_001_000), "1970-01-01T00:00:01.000001Z");
    assert_eq!(
        rfc3339(1_796_168_975_078_394_997),
        "2026-12-01T23:49:35.078394997Z"
    );
}

fn full_record() -> LogRecord {
    LogRecord {
        time_unix_nano: 1_796_168_975_078_394_997,
        observed_time_unix_nano: 1_796_168_975_100_000_000,
        severity_number: 10,
        severity_text: "INFO2".into(),
        body: Some(any(text("GET /"))),
        attributes: vec![kv("http.method", text("GET")), kv("n", V::IntValue(3))],
        dropped_attributes_count: 2,
        flags: 1,
        trace_id: (0..16).collect(),
        span_id: (0..8).rev().collect(),
        event_name: "request".into(),
    }
}

fn resource() -> Resource {
    Resource {
        attributes: vec![kv("service.name", text("api")), kv("host", text("h1"))],
        ..Default::default()
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "app.http".into(),
        version: "1.2".into(),
        attributes: vec![kv("lib", V::BoolValue(true))],
        ..Default::default()
    }
}

#[test]
fn a_record_becomes_an_event_nested_or_flattened() {
    let nested = record_to_fields(
        Some(&resource()),
        Some(&scope()),
        &full_record(),
        Layout::Nested,
    );
    let want = json!({
        "body": "GET /",
        "severity_number": 10,
        "severity_text": "INFO2",
        "time_unix_nano": 1_796_168_975_078_394_997u64,
        "observed_time_unix_nano": 1_796_168_975_100_000_000u64,
        "timestamp": "2026-12-01T23:49:35.078394997Z",
        "trace_id": "000102030405060708090a0b0c0d0e0f",
        "span_id": "0706050403020100",
        "flags": 1,
        "event_name": "request",
        "attributes": {"http.method": "GET", "n": 3},
        "dropped_attributes_count": 2,
        "resource": {"service.name": "api", "host": "h1"},
        "scope": {"name": "app.http", "version": "1.2", "attributes": {"lib": true}},
    });
    assert_eq!(Value::Object(nested.clone()), want);
    // Field order is the record's.
    let keys: Vec<&str> = nested.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
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
            "scope"
        ]
    );

    let flat = record_to_fields(
        Some(&resource()),
        Some(&scope()),
        &full_record(),
        Layout::Flatten,
    );
    let mut want_flat = obj(want);
    want_flat.remove("resource");
    want_flat.remove("scope");
    for (k, v) in [
        ("resource.service.name", json!("api")),
        ("resource.host", json!("h1")),
        ("scope.name", json!("app.http")),
        ("scope.version", json!("1.2")),
        ("scope.attributes.lib", json!(true)),
    ] {
        want_flat.insert(k.into(), v);
    }
    assert_eq!(flat, want_flat);
}

/// Zeros and empties are absent, not written as zeros; the time falls back
/// to the observed time; no resource or scope gives empty ones (nested)
/// or nothing (flattened).
#[test]
fn a_sparse_record_has_only_what_it_holds() {
    let record = LogRecord {
        observed_time_unix_nano: 1_000_000_000,
        ..Default::default()
    };
    let f = record_to_fields(None, None, &record, Layout::Nested);
    assert_eq!(
        Value::Object(f),
        json!({
            "body": null,
            "observed_time_unix_nano": 1_000_000_000u64,
            "timestamp": "1970-01-01T00:00:01Z",
            "attributes": {},
            "resource": {},
            "scope": {},
        })
    );
    let f = record_to_fields(
        None,
        Some(&InstrumentationScope::default()),
        &LogRecord::default(),
        Layout::Flatten,
    );
    assert_eq!(Value::Object(f), json!({ "body": null, "attributes": {} }));
    // A scope with only a name.
    let named = InstrumentationScope {
        name: "n".into(),
        ..Default::default()
    };
    let f = record_to_fields(None, Some(&named), &LogRecord::default(), Layout::Nested);
    assert_eq!(f["scope"], json!({ "name": "n" }));
    let versioned = InstrumentationScope {
        version: "v".into(),
        ..Default::default()
    };
    let f = record_to_fields(
        None,
        Some(&versioned),
        &LogRecord::default(),
        Layout::Flatten,
    );
    assert_eq!(f.get("scope.version"), Some(&json!("v")));
    assert_eq!(f.get("scope.name"), None);
}

#[test]
fn severity_texts_name_their_numbers() {
    for (text, n) in [
        ("trace", 1),
        ("TRACE4", 4),
        ("debug", 5),
        ("Debug3", 7),
        ("info", 9),
        ("INFO2", 10),
        ("information", 9),
        ("notice", 9),
        ("warn", 13),
        ("warning", 13),
        ("Warning4", 16),
        ("error", 17),
        ("err", 17),
        ("ERROR3", 19),
        ("fatal", 21),
        ("critical", 21),
        ("crit", 21),
        ("alert", 21),
        ("emerg", 21),
        ("emergency", 21),
        ("panic", 21),
        (" info ", 9),
        ("info9", 12),
        ("info0", 9),
        ("info99999999999", 9),
        ("verbose", 0),
        ("", 0),
        ("2", 0),
    ] {
        assert_eq!(severity_number_of(text), n, "{text:?}");
    }
}

#[test]
fn resource_and_scope_are_read_from_either_layout() {
    let f = obj(json!({
        "resource": {"a": 1},
        "resource.b": 2,
        "scope": {"name": "n", "attributes": {"x": 1}},
        "scope.version": "v",
        "scope.attributes.y": 2,
        "scope.other": 3,
        "body": "b",
    }));
    let (resource, scope) = resource_and_scope(&f);
    assert_eq!(Value::Object(resource), json!({"a": 1, "b": 2}));
    assert_eq!(
        Value::Object(scope),
        json!({"name": "n", "attributes": {"x": 1, "y": 2}, "version": "v"})
    );
    // Flattened only; `resource` and `scope` that are not objects count as none.
    let f = obj(json!({"resource": 1, "scope": "s", "scope.attributes.y": 2, "scope.name": "n"}));
    let (resource, scope) = resource_and_scope(&f);
    assert!(resource.is_empty());
    assert_eq!(
        Value::Object(scope),
        json!({"attributes": {"y": 2}, "name": "n"})
    );

    assert_eq!(
        resource_of(&obj(json!({"service.name": "api"}))).attributes,
        [kv("service.name", text("api"))]
    );
    let s = scope_of(&obj(
        json!({"name": "n", "version": 2, "attributes": {"a": true}}),
    ));
    assert_eq!((s.name.as_str(), s.version.as_str()), ("n", ""));
    assert_eq!(s.attributes, [kv("a", V::BoolValue(true))]);
    assert!(
        scope_of(&obj(json!({"attributes": 1})))
            .attributes
            .is_empty()
    );
}

/// What the source makes of a record, the sink makes back into the same
/// record (the observed time included).
#[test]
fn an_event_from_a_record_goes_back_as_that_record() {
    let f = record_to_fields(
        Some(&resource()),
        Some(&scope()),
        &full_record(),
        Layout::Nested,
    );
    assert_eq!(
        fields_to_record(Some(&f), b"", 5, &Mapping::default()),
        full_record()
    );
    let (r, s) = resource_and_scope(&f);
    assert_eq!(resource_of(&r), resource());
    assert_eq!(scope_of(&s), scope());
    let flat = record_to_fields(
        Some(&resource()),
        Some(&scope()),
        &full_record(),
        Layout::Flatten,
    );
    assert_eq!(
        fields_to_record(Some(&flat), b"", 5, &Mapping::default()),
        full_record()
    );
    let (r, s) = resource_and_scope(&flat);
    assert_eq!(resource_of(&r), resource());
    assert_eq!(scope_of(&s), scope());
}

#[test]
fn a_raw_event_is_its_text_as_the_body() {
    let r = fields_to_record(None, b"a line \xff", 42, &Mapping::default());
    assert_eq!(
        r,
        LogRecord {
            observed_time_unix_nano: 42,
            body: Some(any(text("a line \u{fffd}"))),
            ..Default::default()
        }
    );
}

/// Without `body`, `severity_text` and `time_unix_nano` the sink takes
/// `message`, `level` and `timestamp`; the number follows from the text;
/// other fields become attributes after the event's own `attributes`.
#[test]
fn an_ordinary_event_becomes_a_record_by_the_defaults() {
    let f = obj(json!({
        "attributes": {"a": 1},
        "message": "hello",
        "level": "warn",
        "timestamp": "2026-12-01T21:49:35.5Z",
        "user": "u1",
        "resource.service.name": "api",
        "scope.name": "s",
    }));
    let r = fields_to_record(Some(&f), b"", 7, &Mapping::default());
    assert_eq!(
        r,
        LogRecord {
            observed_time_unix_nano: 7,
            time_unix_nano: 1_796_161_775_500_000_000,
            severity_text: "warn".into(),
            severity_number: 13,
            body: Some(any(text("hello"))),
            attributes: vec![kv("a", V::IntValue(1)), kv("user", text("u1"))],
            ..Default::default()
        }
    );
    // With `body` and `severity_text` there, `message` and `level` are
    // attributes like any other field; `time_unix_nano` wins over
    // `timestamp`; a number of severity wins over the text, within 0-24.
    let f = obj(json!({
        "body": {"k": [1]},
        "message": "m",
        "severity_text": "info",
        "severity_number": 30,
        "level": "error",
        "time_unix_nano": 5,
        "timestamp": "2026-12-01T21:49:35Z",
        "observed_time_unix_nano": 6,
        "trace_id": "00",
        "span_id": "not hex",
        "flags": 257,
        "event_name": 3,
        "dropped_attributes_count": 4,
        "attributes": "not an object",
    }));
    let r = fields_to_record(Some(&f), b"", 7, &Mapping::default());
    assert_eq!(
        r,
        LogRecord {
            observed_time_unix_nano: 6,
            time_unix_nano: 5,
            severity_text: "info".into(),
            severity_number: 24,
            body: Some(json_to_any(&json!({"k": [1]}), 0)),
            flags: 257,
            dropped_attributes_count: 4,
            attributes: vec![kv("message", text("m")), kv("level", text("error"))],
            ..Default::default()
        }
    );
    let low = obj(json!({"severity_number": -3, "severity_text": "error"}));
    assert_eq!(
        fields_to_record(Some(&low), b"", 0, &Mapping::default()).severity_number,
        0
    );
    // A time before 1970, or not a time, is none.
    let old = obj(json!({"timestamp": "1969-12-31T23:59:59Z"}));
    assert_eq!(
        fields_to_record(Some(&old), b"", 0, &Mapping::default()).time_unix_nano,
        0
    );
    let bad = obj(json!({"timestamp": "yesterday", "time_unix_nano": -1}));
    assert_eq!(
        fields_to_record(Some(&bad), b"", 0, &Mapping::default()).time_unix_nano,
        0
    );
    let wrong = obj(json!({"timestamp": true}));
    assert_eq!(
        fields_to_record(Some(&wrong), b"", 0, &Mapping::default()).time_unix_nano,
        0
    );
    // Ids of the wrong length are left out; of the right one, kept.
    let ids = obj(json!({"trace_id": "0011", "span_id": "0001020304050607"}));
    let r = fields_to_record(Some(&ids), b"", 0, &Mapping::default());
    assert_eq!(
        (r.trace_id.len(), r.span_id),
        (0, (0..8).collect::<Vec<u8>>())
    );
}

/// A mapping of its own names the body, severity text and time fields;
/// those are not attributes, and the defaults are not consulted.
#[test]
fn a_mapping_names_the_body_severity_and_time_fields() {
    let mapping = Mapping {
        body: Some("msg".into()),
        severity_text: Some("lvl".into()),
        time: Some("at".into()),
    };
    let f = obj(json!({
        "msg": "the body",
        "lvl": "ERROR",
        "at": 1_000,
        "message": "not the body",
        "level": "debug",
        "timestamp": "2026-12-01T21:49:35Z",
        "time_unix_nano": 5,
    }));
    let r = fields_to_record(Some(&f), b"", 0, &mapping);
    assert_eq!(
        r,
        LogRecord {
            time_unix_nano: 1_000,
            severity_text: "ERROR".into(),
            severity_number: 17,
            body: Some(any(text("the body"))),
            attributes: vec![
                kv("message", text("not the body")),
                kv("level", text("debug")),
            ],
            ..Default::default()
        }
    );
    // The mapped time may be RFC 3339 text too; a mapped field that is
    // absent gives nothing, whatever the defaults hold.
    let f = obj(json!({"at": "1970-01-01T00:00:02Z", "body": "b", "severity_text": "info"}));
    let r = fields_to_record(Some(&f), b"", 0, &mapping);
    assert_eq!(
        (
            r.time_unix_nano,
            r.body,
            r.severity_text.as_str(),
            r.severity_number
        ),
        (2_000_000_000, None, "", 0)
    );
}

#[test]
fn empty_lists_in_otlp_json_are_filled_in_wherever_they_are() {
    let req = decode_json(
        br#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[
            {"body":{"arrayValue":{}}},
            {"body":{"kvlistValue":{"values":[{"key":"k","value":{"arrayValue":{}}}]}}}
        ]}]}]}"#,
    )
    .unwrap();
    let records = &req.resource_logs[0].scope_logs[0].log_records;
    assert_eq!(
        records[0].body,
        Some(any(V::ArrayValue(ArrayValue { values: vec![] })))
    );
    assert_eq!(
        records[1].body,
        Some(any(V::KvlistValue(KeyValueList {
            values: vec![kv("k", V::ArrayValue(ArrayValue { values: vec![] }))]
        })))
    );
}
