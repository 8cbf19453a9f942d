#![no_main]
//! Any bytes as a container file, a single-object datum and a bare datum:
//! an error or records, never a panic; decoded records re-encode and decode
//! the same. A second schema has the shapes hostile counts aim at (an
//! array of nulls, a map of empty records, a recursive list): against it
//! any input decodes within its budget (libFuzzer's RSS limit is 2 GiB)
//! or is refused.
use apache_avro::Schema;
use libfuzzer_sys::fuzz_target;
use logbus_avro::codec::{Encoding, decode, decode_within, encode};

const HOSTILE: &str = r#"{"type": "record", "name": "H", "fields": [
  {"name": "nulls", "type": {"type": "array", "items": "null"}},
  {"name": "empties", "type": {"type": "map", "values": {"type": "record", "name": "E", "fields": []}}},
  {"name": "list", "type": ["null", {"type": "record", "name": "L", "fields": [
     {"name": "v", "type": "null"}, {"name": "next", "type": ["null", "L"]}]}]},
  {"name": "blob", "type": "bytes"}]}"#;

const SCHEMA: &str = r#"{"type": "record", "name": "R", "fields": [
  {"name": "a", "type": "long"}, {"name": "b", "type": ["null", "string"]},
  {"name": "c", "type": {"type": "array", "items": "double"}},
  {"name": "d", "type": {"type": "map", "values": "boolean"}}]}"#;

fuzz_target!(|data: &[u8]| {
    let hostile = Schema::parse_str(HOSTILE).unwrap();
    for encoding in [Encoding::Container, Encoding::Datum] {
        let _ = decode_within(data, encoding, Some(&hostile), 64 << 20);
    }
    let schema = Schema::parse_str(SCHEMA).unwrap();
    for encoding in [Encoding::Container, Encoding::SingleObject, Encoding::Datum] {
        let mut input = data.to_vec();
        if encoding == Encoding::SingleObject && data.first() == Some(&0) {
            // Give the fuzzer a valid header to get past.
            let mut w = None;
            let mut header = Vec::new();
            let sample = serde_json::json!({"a": 1, "b": null, "c": [], "d": {}});
            encode(
                sample.as_object().unwrap(),
                &schema,
                encoding,
                &mut w,
                &mut header,
            )
            .unwrap();
            input = header[..10].to_vec();
            input.extend_from_slice(&data[1..]);
        }
        if let Ok(records) = decode(&input, encoding, Some(&schema)) {
            if encoding == Encoding::Container {
                continue;
            }
            for r in records {
                // JSON has no NaN or infinity: such doubles come out as
                // null and cannot go back; everything else must.
                let mut out = Vec::new();
                match encode(&r, &schema, encoding, &mut None, &mut out) {
                    Ok(()) => assert_eq!(decode(&out, encoding, Some(&schema)).unwrap(), vec![r]),
                    Err(e) => assert!(e.0.contains("Double expected, got Null"), "{}", e.0),
                }
            }
        }
    }
});
