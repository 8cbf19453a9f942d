//! Hostile Avro inputs (issue 54), built here rather than kept as
//! fixtures so each says what it is made of.
#![allow(dead_code)]

use std::io::Write;

/// Avro's zig-zag varint of `n`.
pub fn long(n: i64, out: &mut Vec<u8>) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    loop {
        let byte = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

pub const NULLS: &str = r#"{"type": "array", "items": "null"}"#;

/// A datum of `NULLS` declaring `count` items that take no bytes: five
/// bytes in all for 16,777,215 of them.
pub fn null_array(count: i64) -> Vec<u8> {
    let mut datum = Vec::new();
    long(count, &mut datum);
    long(0, &mut datum);
    datum
}

pub const EMPTY_RECORDS: &str =
    r#"{"type": "map", "values": {"type": "record", "name": "E", "fields": []}}"#;

/// A map declaring `count` entries, with one entry's bytes present (the
/// key `k`, an empty record) and the end of the map.
pub fn map_count(count: i64) -> Vec<u8> {
    let mut datum = Vec::new();
    long(count, &mut datum);
    long(1, &mut datum);
    datum.push(b'k');
    long(0, &mut datum);
    datum
}

pub const LIST: &str = r#"{"type": "record", "name": "L", "fields": [
  {"name": "next", "type": ["null", "L"]}]}"#;

/// A linked list `depth` records long: one byte each (the union's branch).
pub fn deep_list(depth: usize) -> Vec<u8> {
    let mut datum = vec![2u8; depth];
    datum.push(0);
    datum
}

/// An object container file of `schema` holding one block of `records`
/// whose data is `block` (already compressed with `codec`).
pub fn container(schema: &str, codec: &str, records: i64, block: &[u8]) -> Vec<u8> {
    let mut file = b"Obj\x01".to_vec();
    long(2, &mut file);
    for (key, value) in [
        ("avro.schema", schema.as_bytes()),
        ("avro.codec", codec.as_bytes()),
    ] {
        long(key.len() as i64, &mut file);
        file.extend_from_slice(key.as_bytes());
        long(value.len() as i64, &mut file);
        file.extend_from_slice(value);
    }
    long(0, &mut file);
    let sync = [7u8; 16];
    file.extend_from_slice(&sync);
    long(records, &mut file);
    long(block.len() as i64, &mut file);
    file.extend_from_slice(block);
    file.extend_from_slice(&sync);
    file
}

/// Raw deflate of `n` zero bytes (about a thousandth of `n`).
pub fn deflated_zeros(n: usize) -> Vec<u8> {
    let mut encoder = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    let chunk = vec![0u8; 1 << 20];
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len());
        encoder.write_all(&chunk[..k]).unwrap();
        left -= k;
    }
    encoder.finish().unwrap()
}
