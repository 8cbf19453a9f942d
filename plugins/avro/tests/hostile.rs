//! Hostile counts, inflation and nesting are refused before the decoder
//! runs (issue 54: each of these aborted the process or overflowed its
//! stack), with an error naming the budget and the byte; honest input
//! of the same shapes still decodes.
#![cfg(feature = "parser-avro")]

mod common;

use apache_avro::Schema;
use common::*;
use logbus_avro::codec::{AvroParserOptions, CodecError, Encoding, decode, decode_within};
use logbus_plugin_api::CheckOptions;

fn schema(text: &str) -> Schema {
    Schema::parse_str(text).unwrap()
}

fn refused(result: Result<Vec<logbus_plugin_api::Fields>, CodecError>) -> String {
    match result {
        Ok(records) => panic!("decoded {} records", records.len()),
        Err(e) => e.0,
    }
}

#[test]
fn an_array_of_nulls_declaring_millions_is_refused_from_its_count() {
    let nulls = schema(NULLS);
    let bomb = null_array(16_777_215);
    assert_eq!(bomb.len(), 5);
    let message = refused(decode(&bomb, Encoding::Datum, Some(&nulls)));
    assert!(message.contains("declares 16777215 items"), "{message}");
    assert!(
        message.contains("max_decoded_bytes (268435456 bytes)"),
        "{message}"
    );
    assert!(message.contains("byte 4"), "{message}");
    // The same in a container file (the 205-byte file of the report).
    let file = container(NULLS, "null", 1, &bomb);
    assert!(file.len() < 256, "{}", file.len());
    let message = refused(decode(&file, Encoding::Container, None));
    assert!(message.contains("declares 16777215 items"), "{message}");
    // And in single-object encoding, after the header.
    let mut single = vec![0xc3, 0x01];
    single.extend(nulls.fingerprint::<apache_avro::rabin::Rabin>().bytes);
    single.extend(&bomb);
    let message = refused(decode(&single, Encoding::SingleObject, Some(&nulls)));
    assert!(message.contains("declares 16777215 items"), "{message}");
}

#[test]
fn honest_arrays_of_nulls_and_empty_records_still_decode() {
    let nulls = schema(NULLS);
    let records = decode(&null_array(1000), Encoding::Datum, Some(&nulls)).unwrap();
    assert_eq!(records[0]["value"].as_array().unwrap().len(), 1000);
    // A budget that holds exactly what they cost, and one byte less.
    let cost = logbus_avro::bounds::VALUE_COST * 1001;
    assert!(decode_within(&null_array(1000), Encoding::Datum, Some(&nulls), cost).is_ok());
    let message = refused(decode_within(
        &null_array(1000),
        Encoding::Datum,
        Some(&nulls),
        cost - 1,
    ));
    assert!(
        message.contains(&format!("max_decoded_bytes ({} bytes)", cost - 1)),
        "{message}"
    );
    let map = schema(EMPTY_RECORDS);
    let records = decode(&map_count(1), Encoding::Datum, Some(&map)).unwrap();
    assert_eq!(records[0]["k"], serde_json::json!({}));
}

#[test]
fn a_map_declaring_more_entries_than_bytes_is_refused() {
    let map = schema(EMPTY_RECORDS);
    let message = refused(decode(&map_count(16_000_000), Encoding::Datum, Some(&map)));
    assert!(message.contains("declares 16000000 items"), "{message}");
    // Within the budget but past the bytes: the decoder's own error.
    let message = refused(decode(&map_count(1000), Encoding::Datum, Some(&map)));
    assert!(message.contains("(at byte "), "{message}");
}

#[test]
fn a_list_nested_past_the_limit_is_refused_before_the_recursive_decoder() {
    let list = schema(LIST);
    let deep = deep_list(100_000);
    let message = refused(decode(&deep, Encoding::Datum, Some(&list)));
    assert!(message.contains("nested more than 64 deep"), "{message}");
    // A short list decodes. (The decoder recurses three frames a record;
    // in a debug build each is large enough that a 2 MiB test thread
    // holds about a dozen records, so the test stays short. Engine
    // workers have 32 MiB, and release frames are far smaller.)
    let records = decode(&deep_list(10), Encoding::Datum, Some(&list)).unwrap();
    let mut node = &records[0]["next"];
    let mut length = 0;
    while !node.is_null() {
        length += 1;
        node = &node["next"];
    }
    assert_eq!(length, 10);
    // At the limit, on a thread with an engine worker's 32 MiB of stack:
    // 64 nested records decode, 65 are refused.
    std::thread::Builder::new()
        .stack_size(32 << 20)
        .spawn(move || {
            let max = logbus_avro::bounds::MAX_DEPTH;
            assert!(decode(&deep_list(max), Encoding::Datum, Some(&list)).is_ok());
            let message = refused(decode(&deep_list(max + 1), Encoding::Datum, Some(&list)));
            assert!(message.contains("nested more than 64 deep"), "{message}");
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn a_deflate_block_inflating_past_the_budget_is_refused_while_inflating() {
    let nulls = schema(NULLS);
    // 16 MiB of zeros in about 16 KB; the budget is 4 MiB.
    let block = deflated_zeros(16 << 20);
    assert!(block.len() < 64 << 10, "{}", block.len());
    let file = container(NULLS, "deflate", 1, &block);
    let message = refused(decode_within(
        &file,
        Encoding::Container,
        Some(&nulls),
        4 << 20,
    ));
    assert!(
        message.contains("inflates past max_decoded_bytes"),
        "{message}"
    );
    // An honest deflate block decodes.
    let mut honest = Vec::new();
    {
        use std::io::Write;
        let mut e = flate2::write::DeflateEncoder::new(&mut honest, flate2::Compression::fast());
        e.write_all(&null_array(3)).unwrap();
        e.finish().unwrap();
    }
    let records = decode(
        &container(NULLS, "deflate", 1, &honest),
        Encoding::Container,
        None,
    )
    .unwrap();
    assert_eq!(records[0]["value"].as_array().unwrap().len(), 3);
}

#[test]
fn a_container_declaring_millions_of_records_is_refused_from_its_count() {
    let file = container(r#""null""#, "null", 50_000_000, &[]);
    let message = refused(decode(&file, Encoding::Container, None));
    assert!(message.contains("declares 50000000 records"), "{message}");
}

#[test]
fn max_decoded_bytes_must_be_at_least_one() {
    let options: AvroParserOptions =
        serde_json::from_value(serde_json::json!({"max_decoded_bytes": 0})).unwrap();
    let errors = options.check();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, ["max_decoded_bytes"]);
    assert!(
        errors[0].message.contains("at least 1, got 0"),
        "{}",
        errors[0].message
    );
    let default: AvroParserOptions = serde_json::from_value(serde_json::json!({})).unwrap();
    assert_eq!(default.max_decoded_bytes, 256 << 20);
    assert!(default.check().is_empty());
}
