//! `sink: avro` on its own: blocks of at most `block_events`, events
//! counted committed once written, events that do not fit counted as
//! errored, and an existing file continued (same schema), refused (another
//! schema, not Avro) or, when its end was cut by an interrupted write,
//! cut back to its last whole block first. Files are read back with
//! apache-avro's reader and walked block by block here; the engine's tests
//! (`crates/logbus/tests/it/compress.rs`) read them with fastavro.

use std::path::Path;

use logbus_plugin_api::testing::{option_errors, run_sink, sink};
use logbus_plugin_api::{Event, Meta, StageCounts, Typed};
use serde_json::{Value, json};

const SCHEMA: &str = r#"{"type": "record", "name": "Log", "fields": [{"name": "seq", "type": "long"}, {"name": "msg", "type": ["null", "string"]}]}"#;

fn options(path: &Path, more: Value) -> Value {
    let mut o = json!({ "path": path, "schema": serde_json::from_str::<Value>(SCHEMA).unwrap() });
    o.as_object_mut()
        .unwrap()
        .extend(more.as_object().unwrap().clone());
    o
}

fn event(seq: i64) -> Event {
    let fields = json!({ "seq": seq, "msg": format!("m{seq}") });
    Event::fields(fields.as_object().unwrap().clone(), Meta::now("t".into()))
}

fn events(seqs: std::ops::Range<i64>) -> Vec<Event> {
    seqs.map(event).collect()
}

async fn write(
    path: &Path,
    more: Value,
    batches: Vec<Vec<Event>>,
) -> (Result<(), String>, StageCounts) {
    let s = sink(&Typed(logbus_avro::sink::AvroSink), options(path, more));
    let (result, metrics) = run_sink(s, batches).await;
    (result.map_err(|e| e.to_string()), metrics.snapshot())
}

/// The `seq` of every record in the file, read with apache-avro.
fn seqs(path: &Path) -> Vec<i64> {
    let bytes = std::fs::read(path).unwrap();
    apache_avro::Reader::new(&bytes[..])
        .unwrap()
        .map(|r| match r.unwrap() {
            apache_avro::types::Value::Record(fields) => match &fields[0].1 {
                apache_avro::types::Value::Long(n) => *n,
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        })
        .collect()
}

/// Avro's zigzag varint `long` at `*at`, moving `*at` past it.
fn read_long(bytes: &[u8], at: &mut usize) -> i64 {
    let (mut n, mut shift) = (0u64, 0);
    loop {
        let b = bytes[*at];
        *at += 1;
        n |= u64::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return (n >> 1) as i64 ^ -((n & 1) as i64);
        }
    }
}

/// The number of records in each block, walking the container format by
/// hand (header map, then count, size, data, marker per block).
fn block_counts(path: &Path) -> Vec<i64> {
    let bytes = std::fs::read(path).unwrap();
    let long = |at: &mut usize| read_long(&bytes, at);
    assert_eq!(&bytes[..4], b"Obj\x01");
    let mut at = 4;
    loop {
        let count = long(&mut at);
        if count == 0 {
            break;
        }
        if count < 0 {
            long(&mut at); // the block's size in bytes
        }
        for _ in 0..count.abs() {
            let k = long(&mut at) as usize;
            at += k;
            let v = long(&mut at) as usize;
            at += v;
        }
    }
    let marker = bytes[at..at + 16].to_vec();
    at += 16;
    let mut counts = Vec::new();
    while at < bytes.len() {
        counts.push(long(&mut at));
        let size = long(&mut at) as usize;
        at += size;
        assert_eq!(
            bytes[at..at + 16],
            marker[..],
            "a block ends with the marker"
        );
        at += 16;
    }
    counts
}

#[tokio::test]
async fn blocks_hold_at_most_block_events_and_every_event_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.avro");
    // A batch of 7 with blocks of 3: cut inside the batch.
    let (result, counts) = write(
        &path,
        json!({ "block_events": 3 }),
        vec![events(0..7), events(7..9)],
    )
    .await;
    result.unwrap();
    assert_eq!(seqs(&path), (0..9).collect::<Vec<_>>());
    let blocks = block_counts(&path);
    assert!(blocks.iter().all(|&n| (1..=3).contains(&n)), "{blocks:?}");
    assert_eq!(blocks.iter().sum::<i64>(), 9);
    assert_eq!(
        (counts.events_in, counts.events_out, counts.errored),
        (9, 9, 0)
    );
    // With the default (4,096) both batches fit one block each at most.
    let (result, _) = write(&path, json!({ "append": false }), vec![events(0..7)]).await;
    result.unwrap();
    assert_eq!(block_counts(&path), [7]);
}

#[tokio::test]
async fn a_new_file_gets_its_header_even_with_no_events() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.avro");
    let (result, counts) = write(&path, json!({ "codec": "deflate", "sync": true }), vec![]).await;
    result.unwrap();
    assert!(seqs(&path).is_empty());
    assert!(block_counts(&path).is_empty());
    assert_eq!(counts.events_out, 0);
}

#[tokio::test]
async fn raw_events_and_events_that_do_not_fit_are_counted_as_errored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.avro");
    let misfit = Event::fields(
        json!({ "seq": "not a number" })
            .as_object()
            .unwrap()
            .clone(),
        Meta::now("t".into()),
    );
    let raw = Event::raw(b"{\"seq\":1}".to_vec(), Meta::now("t".into()));
    let (result, counts) = write(
        &path,
        json!({}),
        vec![vec![event(0), misfit, event(1), raw, event(2)]],
    )
    .await;
    result.unwrap();
    assert_eq!(seqs(&path), [0, 1, 2]);
    assert_eq!(
        (counts.events_in, counts.events_out, counts.errored),
        (5, 3, 2)
    );
}

#[tokio::test]
async fn an_existing_file_is_continued_or_replaced_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.avro");
    write(&path, json!({ "codec": "deflate" }), vec![events(0..3)])
        .await
        .0
        .unwrap();
    write(&path, json!({ "codec": "deflate" }), vec![events(3..5)])
        .await
        .0
        .unwrap();
    assert_eq!(seqs(&path), [0, 1, 2, 3, 4]);
    assert_eq!(block_counts(&path), [3, 2]);
    // `append: false` starts over.
    write(&path, json!({ "append": false }), vec![events(7..8)])
        .await
        .0
        .unwrap();
    assert_eq!(seqs(&path), [7]);
    // An empty file is a new one.
    std::fs::write(&path, b"").unwrap();
    write(&path, json!({}), vec![events(1..2)]).await.0.unwrap();
    assert_eq!(seqs(&path), [1]);
    // Another schema: refused, the file untouched.
    let before = std::fs::read(&path).unwrap();
    let other = SCHEMA.replace("\"Log\"", "\"Other\"");
    let mut o = options(&path, json!({}));
    o["schema"] = serde_json::from_str(&other).unwrap();
    let (result, _) = run_sink(
        sink(&Typed(logbus_avro::sink::AvroSink), o),
        vec![events(0..1)],
    )
    .await;
    let err = result.unwrap_err().to_string();
    assert!(err.contains("was written with another schema"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    // Not Avro at all: refused, untouched.
    std::fs::write(&path, b"{\"seq\":1}\n").unwrap();
    let (result, _) = write(&path, json!({}), vec![events(0..1)]).await;
    let err = result.unwrap_err();
    assert!(err.contains("is not an Avro container file"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"{\"seq\":1}\n");
}

/// A write interrupted inside a block leaves part of it at the end of the
/// file; its events were never counted committed (they come again), so the
/// next run cuts the file back to its last whole block and continues.
#[tokio::test]
async fn a_torn_last_block_is_cut_off_before_appending() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.avro");
    write(&path, json!({}), vec![events(0..3)]).await.0.unwrap();
    let whole = std::fs::read(&path).unwrap();
    write(&path, json!({}), vec![events(3..6)]).await.0.unwrap();
    let two = std::fs::read(&path).unwrap();
    // Every cut inside the second block, from its first byte to one short
    // of its marker's end.
    for cut in whole.len() + 1..two.len() {
        std::fs::write(&path, &two[..cut]).unwrap();
        write(&path, json!({}), vec![events(3..6)]).await.0.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), two, "cut at {cut}");
    }
    // A header cut short is not continued, at any length.
    let header_only = dir.path().join("header.avro");
    write(&header_only, json!({}), vec![]).await.0.unwrap();
    let header = std::fs::read(&header_only).unwrap();
    // Magic, metadata (schema and codec), marker.
    assert!(
        header.starts_with(b"Obj\x01") && header.len() > 100,
        "{header:?}"
    );
    for cut in 1..header.len() {
        std::fs::write(&path, &header[..cut]).unwrap();
        let err = write(&path, json!({}), vec![events(0..1)])
            .await
            .0
            .unwrap_err();
        assert!(
            err.contains("is not an Avro container file"),
            "cut at {cut}: {err}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), header[..cut], "untouched");
    }
}

#[test]
fn bad_options_name_the_key() {
    let errors = |o: Value| option_errors(&Typed(logbus_avro::sink::AvroSink), o);
    let path = Path::new("out.avro");
    assert_eq!(errors(options(path, json!({}))), "");
    assert!(errors(options(Path::new(""), json!({}))).starts_with("path: must not be empty"));
    assert_eq!(
        errors(options(path, json!({ "block_events": 0 }))),
        "block_events: must be at least 1, got 0"
    );
    assert_eq!(errors(options(path, json!({ "block_events": 1 }))), "");
    assert!(errors(options(path, json!({ "schema": { "type": "nope" } }))).starts_with("schema: "));
}

/// The object format (`format: avro` of the S3 sink): its options'
/// defaults and check, and an object's blocks and size as it fills.
#[cfg(feature = "object-avro")]
#[test]
fn objects_are_container_files_in_blocks_of_block_events() {
    use logbus_avro::object::{AvroObjectOptions, AvroObjects};
    use logbus_sink::ObjectFormat;
    let schema: Value = serde_json::from_str(SCHEMA).unwrap();
    let defaults: AvroObjectOptions = serde_json::from_value(json!({ "schema": schema })).unwrap();
    assert_eq!(defaults.block_events, 4096);
    assert!(defaults.check("avro").is_empty());
    let zero: AvroObjectOptions =
        serde_json::from_value(json!({ "schema": schema, "block_events": 0 })).unwrap();
    let errors: Vec<String> = zero
        .check("avro")
        .iter()
        .map(|e| format!("{}: {}", e.path.join("."), e.message))
        .collect();
    assert_eq!(errors, ["avro.block_events: must be at least 1"]);
    let bad: AvroObjectOptions = serde_json::from_value(json!({ "schema": "{" })).unwrap();
    assert_eq!(bad.check("avro")[0].path, ["avro", "schema"]);

    let options: AvroObjectOptions =
        serde_json::from_value(json!({ "schema": schema, "block_events": 2, "codec": "deflate" }))
            .unwrap();
    let format = AvroObjects::new(&options, "avro").unwrap();
    let mut object = format.open().unwrap();
    let header = object.size();
    assert_eq!(header, object.ready().len() as u64);
    let mut taken = std::mem::take(object.ready());
    for seq in 0..5 {
        object.write(&event(seq)).unwrap();
        // A block is encoded (and counted in the size) every second record.
        let blocks = (seq + 1) / 2;
        assert_eq!(object.size() > header, blocks > 0, "after {}", seq + 1);
        taken.extend_from_slice(&std::mem::take(object.ready()));
        assert_eq!(object.size(), taken.len() as u64, "after {}", seq + 1);
    }
    let raw = Event::raw(b"x".to_vec(), Meta::now("t".into()));
    assert!(object.write(&raw).is_err());
    taken.extend_from_slice(&object.finish().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("object.avro");
    std::fs::write(&path, &taken).unwrap();
    assert_eq!(seqs(&path), [0, 1, 2, 3, 4]);
    assert_eq!(block_counts(&path), [2, 2, 1]);
}

/// Avro's zigzag varint encoding of a `long`.
fn put_long(out: &mut Vec<u8>, v: i64) {
    let mut n = ((v << 1) ^ (v >> 63)) as u64;
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// The header's metadata map may come in blocks with a negative count
/// followed by the block's size (as the specification allows, and other
/// writers may do), and may hold user entries with any bytes (zeros
/// included): such a file is continued all the same.
#[tokio::test]
async fn a_header_with_binary_metadata_or_a_negative_count_is_continued() {
    for negative in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.avro");
        write(&path, json!({}), vec![events(0..3)]).await.0.unwrap();
        let bytes = std::fs::read(&path).unwrap();
        // Take the entries out of the header as written (one block,
        // positive count) and write them back with one more entry.
        let long = |at: &mut usize| read_long(&bytes, at);
        let mut at = 4;
        let count = long(&mut at);
        assert!(count > 0);
        let entries_start = at;
        for _ in 0..count {
            let k = long(&mut at) as usize;
            at += k;
            let v = long(&mut at) as usize;
            at += v;
        }
        let mut entries = bytes[entries_start..at].to_vec();
        assert_eq!(long(&mut at), 0);
        put_long(&mut entries, 5);
        entries.extend_from_slice(b"x.bin");
        put_long(&mut entries, 6);
        entries.extend_from_slice(&[0, 0, 1, 0, 0x80, 0]);
        let mut rewritten = b"Obj\x01".to_vec();
        if negative {
            put_long(&mut rewritten, -(count + 1));
            put_long(&mut rewritten, entries.len() as i64);
        } else {
            put_long(&mut rewritten, count + 1);
        }
        rewritten.extend_from_slice(&entries);
        put_long(&mut rewritten, 0);
        rewritten.extend_from_slice(&bytes[at..]);
        std::fs::write(&path, &rewritten).unwrap();
        assert_eq!(seqs(&path), [0, 1, 2], "apache-avro reads it");
        write(&path, json!({}), vec![events(3..5)]).await.0.unwrap();
        assert_eq!(seqs(&path), [0, 1, 2, 3, 4], "negative: {negative}");
        assert_eq!(block_counts(&path), [3, 2]);
        // Torn after the rewritten header: cut back to it and continued.
        let whole = std::fs::read(&path).unwrap();
        std::fs::write(&path, &whole[..whole.len() - 5]).unwrap();
        write(&path, json!({}), vec![events(3..5)]).await.0.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), whole, "negative: {negative}");
    }
}
