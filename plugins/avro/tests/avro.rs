//! Avro round trips, malformed input, and interoperation with Python's
//! fastavro (another implementation): files fastavro writes we read, and
//! single-object data we write fastavro reads.
#![cfg(all(feature = "parser-avro", feature = "formatter-avro"))]

use std::process::Command;

use apache_avro::Schema;
use logbus_avro::codec::{Encoding, decode, encode};
use logbus_plugin_api::Fields;
use proptest::prelude::*;
use serde_json::{Value, json};

const SCHEMA: &str = r#"{
  "type": "record", "name": "Log", "namespace": "logbus.test",
  "fields": [
    {"name": "seq", "type": "long"},
    {"name": "level", "type": {"type": "enum", "name": "Level", "symbols": ["debug", "info", "warn", "error"]}},
    {"name": "msg", "type": "string"},
    {"name": "latency", "type": "double"},
    {"name": "ok", "type": "boolean"},
    {"name": "user", "type": ["null", "string"], "default": null},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "counts", "type": {"type": "map", "values": "long"}},
    {"name": "host", "type": {"type": "record", "name": "Host", "fields": [
      {"name": "name", "type": "string"}, {"name": "port", "type": "int"}]}}
  ]
}"#;

fn schema() -> Schema {
    Schema::parse_str(SCHEMA).unwrap()
}

prop_compose! {
    fn record()(
        seq in any::<i64>(),
        level in prop::sample::select(vec!["debug", "info", "warn", "error"]),
        msg in any::<String>(),
        latency in any::<f64>().prop_filter("finite", |f| f.is_finite()),
        ok in any::<bool>(),
        user in prop::option::of(any::<String>()),
        tags in prop::collection::vec(any::<String>(), 0..4),
        counts in prop::collection::btree_map("[a-z]{1,6}", any::<i64>(), 0..4),
        name in "[a-z.]{1,12}",
        port in any::<i32>(),
    ) -> Fields {
        let v = json!({
            "seq": seq, "level": level, "msg": msg, "latency": latency, "ok": ok,
            "user": user, "tags": tags, "counts": counts,
            "host": {"name": name, "port": port},
        });
        v.as_object().unwrap().clone()
    }
}

proptest! {
    #[test]
    fn single_object_and_datum_round_trip(fields in record()) {
        let s = schema();
        for encoding in [Encoding::SingleObject, Encoding::Datum, Encoding::Container] {
            let mut out = Vec::new();
            let mut writer = None;
            encode(&fields, &s, encoding, &mut writer, &mut out).map_err(|e| TestCaseError::fail(e.0))?;
            let back = decode(&out, encoding, Some(&s)).map_err(|e| TestCaseError::fail(e.0))?;
            prop_assert_eq!(back, vec![fields.clone()], "{:?}", encoding);
        }
    }

    /// Garbage never panics (the errors it gets are checked below, in
    /// `errors_say_what_does_not_fit`).
    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let s = schema();
        for encoding in [Encoding::SingleObject, Encoding::Datum, Encoding::Container] {
            let _ = decode(&bytes, encoding, Some(&s));
        }
        let mut prefixed = vec![0xc3, 0x01];
        prefixed.extend(&bytes);
        let _ = decode(&prefixed, Encoding::SingleObject, Some(&s));
        let mut container = b"Obj\x01".to_vec();
        container.extend(&bytes);
        let _ = decode(&container, Encoding::Container, None);
    }
}

#[test]
fn errors_say_what_does_not_fit() {
    let s = schema();
    let mut out = Vec::new();
    let bad = json!({"seq": "x"}).as_object().unwrap().clone();
    let e = encode(&bad, &s, Encoding::SingleObject, &mut None, &mut out).unwrap_err();
    assert!(e.0.contains("does not fit the schema"), "{}", e.0);
    let e = decode(
        b"\xc3\x01\x00\x00\x00\x00\x00\x00\x00\x00\x02",
        Encoding::SingleObject,
        Some(&s),
    )
    .unwrap_err();
    assert!(e.0.contains("(at byte "), "{}", e.0);
    // A container file cut short names how far the reader got.
    let mut file = Vec::new();
    encode(
        cut_record().as_object().unwrap(),
        &s,
        Encoding::Container,
        &mut None,
        &mut file,
    )
    .unwrap();
    let e = decode(&file[..file.len() - 20], Encoding::Container, None).unwrap_err();
    assert!(e.0.contains("(at byte "), "{}", e.0);
    // A datum cut short names where it ran out.
    let cut = json!({"seq": 1, "level": "info", "msg": "message", "latency": 1.5, "ok": true, "user": null,
                     "tags": [], "counts": {}, "host": {"name": "h", "port": 1}});
    let mut whole = Vec::new();
    encode(
        cut.as_object().unwrap(),
        &s,
        Encoding::Datum,
        &mut None,
        &mut whole,
    )
    .unwrap();
    let e = decode(&whole[..5], Encoding::Datum, Some(&s)).unwrap_err();
    assert!(e.0.contains("(at byte "), "{}", e.0);
    // A datum with bytes after it.
    let ok = json!({"seq": 1, "level": "info", "msg": "m", "latency": 1.5, "ok": true, "user": null,
                    "tags": [], "counts": {}, "host": {"name": "h", "port": 1}});
    let mut datum = Vec::new();
    encode(
        ok.as_object().unwrap(),
        &s,
        Encoding::Datum,
        &mut None,
        &mut datum,
    )
    .unwrap();
    datum.push(0);
    let e = decode(&datum, Encoding::Datum, Some(&s)).unwrap_err();
    assert!(e.0.contains("1 bytes left after the datum"), "{}", e.0);
}

fn cut_record() -> Value {
    json!({"seq": 1, "level": "info", "msg": "message", "latency": 1.5, "ok": true, "user": null,
           "tags": [], "counts": {}, "host": {"name": "h", "port": 1}})
}

/// Fails the test unless python3 can import fastavro.
fn require_fastavro() {
    let ok = Command::new("python3")
        .args(["-c", "import fastavro"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "python3 with fastavro is required here (pip install fastavro)"
    );
}

const RECORDS: &str = r#"[
 {"seq": 1, "level": "info", "msg": "héllo", "latency": 1.25, "ok": true, "user": "u1",
  "tags": ["a", "b"], "counts": {"x": 3}, "host": {"name": "n1", "port": 514}},
 {"seq": -9007199254740993, "level": "error", "msg": "", "latency": -0.5, "ok": false, "user": null,
  "tags": [], "counts": {}, "host": {"name": "n2", "port": -1}}
]"#;

/// fastavro writes container files (null and deflate codecs) and we read
/// every record back.
#[ignore = "needs python3 with fastavro (pip install fastavro); run with --include-ignored"]
#[test]
fn container_files_written_by_fastavro_read_back() {
    require_fastavro();
    let dir = tempfile::tempdir().unwrap();
    for codec in ["null", "deflate"] {
        let path = dir.path().join(format!("{codec}.avro"));
        let script = format!(
            "import fastavro, json, sys\nschema = fastavro.parse_schema(json.loads(sys.argv[1]))\nrecords = json.loads(sys.argv[2])\nwith open(sys.argv[3], 'wb') as f:\n    fastavro.writer(f, schema, records, codec='{codec}')\n"
        );
        let o = Command::new("python3")
            .args(["-c", &script, SCHEMA, RECORDS])
            .arg(&path)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let bytes = std::fs::read(&path).unwrap();
        let got: Vec<Value> = decode(&bytes, Encoding::Container, None)
            .unwrap_or_else(|e| panic!("{codec}: {}", e.0))
            .into_iter()
            .map(Value::Object)
            .collect();
        let want: Vec<Value> = serde_json::from_str(RECORDS).unwrap();
        assert_eq!(got, want, "{codec}");
    }
}

/// What we write in single-object encoding, fastavro reads: the header's
/// fingerprint is the schema's CRC-64-AVRO fingerprint as fastavro computes
/// it, and the datum after it decodes with fastavro's schemaless reader.
#[ignore = "needs python3 with fastavro (pip install fastavro); run with --include-ignored"]
#[test]
fn single_object_data_we_write_reads_in_fastavro() {
    require_fastavro();
    let s = schema();
    let records: Vec<Value> = serde_json::from_str(RECORDS).unwrap();
    let mut writer = None;
    let mut hex = Vec::new();
    for r in &records {
        let mut out = Vec::new();
        encode(
            r.as_object().unwrap(),
            &s,
            Encoding::SingleObject,
            &mut writer,
            &mut out,
        )
        .unwrap();
        hex.push(out.iter().map(|b| format!("{b:02x}")).collect::<String>());
    }
    let script = r#"
import fastavro, io, json, sys
from fastavro.schema import fingerprint, to_parsing_canonical_form
schema = fastavro.parse_schema(json.loads(sys.argv[1]))
fp = fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO")
out = []
for h in sys.argv[2].split(","):
    data = bytes.fromhex(h)
    assert data[:2] == b"\xc3\x01", data[:2]
    assert data[2:10] == bytes.fromhex(fp), (data[2:10].hex(), fp)
    out.append(fastavro.schemaless_reader(io.BytesIO(data[10:]), schema))
print(json.dumps(out))
"#;
    let o = Command::new("python3")
        .args(["-c", script, SCHEMA, &hex.join(",")])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(got, records);
}

/// Found by fuzzing: a datum declaring an array block of ~2^31 items made
/// apache-avro reserve tens of GiB and abort. Now an error.
#[test]
fn a_forged_block_count_is_an_error_not_an_abort() {
    let s = Schema::parse_str(
        r#"{"type": "record", "name": "R", "fields": [
      {"name": "a", "type": "long"}, {"name": "b", "type": ["null", "string"]},
      {"name": "c", "type": {"type": "array", "items": "double"}},
      {"name": "d", "type": {"type": "map", "values": "boolean"}}]}"#,
    )
    .unwrap();
    let input = [0u8, 0, 0, 254, 255, 255, 255, 2, 10, 5, 0];
    assert!(decode(&input[1..], Encoding::Datum, Some(&s)).is_err());
    assert!(decode(&input, Encoding::Datum, Some(&s)).is_err());
}

fn one_record() -> Fields {
    json!({"seq": 1, "level": "info", "msg": "m", "latency": 1.5, "ok": true, "user": null,
           "tags": ["a"], "counts": {"x": 2}, "host": {"name": "h", "port": 1}})
    .as_object()
    .unwrap()
    .clone()
}

fn parser(options: Value) -> Box<dyn logbus_plugin_api::Processor> {
    use logbus_plugin_api::{Built, Plugin, Typed, testing::context};
    match Typed(logbus_avro::codec::AvroParser).build(&options, &context()) {
        Ok(Built::Processor(p)) => p,
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("not a processor"),
    }
}

fn raw(bytes: Vec<u8>) -> logbus_plugin_api::Event {
    logbus_plugin_api::Event::raw(bytes, logbus_plugin_api::Meta::now("t".into()))
}

/// A single-object or datum event becomes the record in place; a container
/// file becomes one event per record (also for one record); an event
/// already parsed is an error naming why.
#[test]
fn the_parser_turns_raw_events_into_records() {
    use logbus_plugin_api::Verdict;
    let s = schema();
    let schema_json: Value = serde_json::from_str(SCHEMA).unwrap();
    for encoding in [Encoding::SingleObject, Encoding::Datum] {
        let mut bytes = Vec::new();
        encode(&one_record(), &s, encoding, &mut None, &mut bytes).unwrap();
        let name = match encoding {
            Encoding::SingleObject => "single-object",
            _ => "datum",
        };
        let mut p = parser(json!({ "encoding": name, "schema": schema_json }));
        let mut event = raw(bytes);
        assert!(
            matches!(p.process(&mut event).unwrap(), Verdict::Keep),
            "{name}"
        );
        assert_eq!(event.as_fields().unwrap(), &one_record(), "{name}");
        // Parsed already: refused, the event as it was.
        let err = p.process(&mut event).unwrap_err();
        assert!(err.to_string().contains("needs a raw event"), "{err}");
    }
    let mut p = parser(json!({}));
    let mut file = Vec::new();
    encode(&one_record(), &s, Encoding::Container, &mut None, &mut file).unwrap();
    let mut event = raw(file);
    match p.process(&mut event).unwrap() {
        Verdict::Replace(events) => {
            assert_eq!(events.len(), 1);
            assert_eq!(events[0].as_fields().unwrap(), &one_record());
        }
        _ => panic!("a container file is replaced by its records"),
    }
    let err = p.process(&mut raw(b"not avro".to_vec())).unwrap_err();
    assert!(err.to_string().starts_with("not Avro: "), "{err}");
}

#[test]
fn parser_and_formatter_options_name_the_key() {
    use logbus_plugin_api::Typed;
    use logbus_plugin_api::testing::option_errors;
    let parser = |o: Value| option_errors(&Typed(logbus_avro::codec::AvroParser), o);
    let formatter = |o: Value| option_errors(&Typed(logbus_avro::codec::AvroFormatter), o);
    let schema: Value = serde_json::from_str(SCHEMA).unwrap();
    assert_eq!(parser(json!({})), "");
    for encoding in ["single-object", "datum"] {
        assert_eq!(
            parser(json!({ "encoding": encoding })),
            "schema: `single-object` and `datum` need the schema"
        );
        assert_eq!(
            parser(json!({ "encoding": encoding, "schema": schema })),
            ""
        );
    }
    assert!(
        parser(json!({ "schema": { "type": "nope" } })).starts_with("schema: not an Avro schema"),
    );
    for encoding in ["single-object", "datum", "container"] {
        assert_eq!(
            formatter(json!({ "encoding": encoding, "schema": schema })),
            ""
        );
        assert!(
            formatter(json!({ "encoding": encoding, "schema": "{" }))
                .starts_with("schema: not an Avro schema")
        );
    }
    // A schema given as text works as well as one given as YAML.
    assert_eq!(formatter(json!({ "schema": SCHEMA })), "");
    // `logbus validate` checks options without building the stage: the
    // same errors come from the check alone.
    let checked = |plugin: &dyn logbus_plugin_api::Plugin, o: Value| -> Vec<String> {
        plugin
            .check(&o, &logbus_plugin_api::testing::context())
            .into_iter()
            .map(|e| format!("{}: {}", e.path.join("."), e.message))
            .collect()
    };
    for plugin in [
        &Typed(logbus_avro::codec::AvroParser) as &dyn logbus_plugin_api::Plugin,
        &Typed(logbus_avro::codec::AvroFormatter),
    ] {
        let errors = checked(plugin, json!({ "schema": "{" }));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("schema: not an Avro schema"),
            "{errors:?}"
        );
        assert!(checked(plugin, json!({ "schema": schema })).is_empty());
    }
}
