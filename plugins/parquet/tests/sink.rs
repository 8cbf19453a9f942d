//! `sink: parquet` on its own: a file per burst of input, closed before a
//! batch would take it past `max_rows`, numbered after the highest file
//! already there, written to a temporary name and renamed; every written
//! event committed and its source batch told it was delivered, events that
//! cannot be rows (raw, or outside a configured schema) counted as errored
//! and rejected. Files are read back with the crate's own reader and their
//! metadata with the parquet crate; the engine's tests
//! (`crates/logbus/tests/it/compress.rs`) read them with pyarrow.
#![cfg(all(feature = "sink-parquet", feature = "parser-parquet"))]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use logbus_parquet::reader::{Limits, decode};
use logbus_parquet::writer::{ParquetSink, ParquetSinkOptions};
use logbus_plugin_api::testing::{option_errors, run_sink, sink};
use logbus_plugin_api::{
    AckReceiver, BatchAck, CheckOptions, Event, Meta, Outcome, SinkContext, StageCounts,
    StageMetrics, Typed, channel,
};
use parquet::basic::Compression;
use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::{Value, json};

/// The outcome each source batch reported, by its token.
#[derive(Default)]
struct Heard {
    outcomes: Mutex<BTreeMap<u64, Outcome>>,
    changed: tokio::sync::Notify,
}

impl AckReceiver for Heard {
    fn finished(&self, token: u64, outcome: Outcome) {
        assert!(
            self.outcomes
                .lock()
                .unwrap()
                .insert(token, outcome)
                .is_none()
        );
        self.changed.notify_one();
    }
}

impl Heard {
    fn outcomes(&self) -> Vec<(u64, Outcome)> {
        self.outcomes.lock().unwrap().clone().into_iter().collect()
    }

    /// Waits until batch `token` has reported (20 s at most).
    async fn wait_for(&self, token: u64) {
        let wait = async {
            while !self.outcomes.lock().unwrap().contains_key(&token) {
                self.changed.notified().await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(20), wait)
            .await
            .unwrap_or_else(|_| panic!("batch {token} was never acknowledged"));
    }
}

fn row(seq: u64) -> Value {
    json!({ "seq": seq, "msg": format!("m{seq}") })
}

/// Events `row(seq)` for `seqs`, one source batch (`token`) for them all.
fn batch(heard: &Arc<Heard>, token: u64, seqs: std::ops::Range<u64>) -> Vec<Event> {
    let ack = BatchAck::new(heard.clone(), token);
    seqs.map(|s| {
        Event::fields(row(s).as_object().unwrap().clone(), Meta::now("t".into()))
            .with_ack(ack.handle())
    })
    .collect()
}

fn options(dir: &Path, more: Value) -> Value {
    let mut o = json!({ "path": dir.join("part-{n}.parquet") });
    for (k, v) in more.as_object().unwrap() {
        o[k] = v.clone();
    }
    o
}

/// Runs `sink: parquet` into `dir` (with the options in `more`) over
/// `batches`: how it ended, and its counters.
async fn write(
    dir: &Path,
    more: Value,
    batches: Vec<Vec<Event>>,
) -> (Result<(), String>, StageCounts) {
    let s = sink(&Typed(ParquetSink), options(dir, more));
    let (result, metrics) = run_sink(s, batches).await;
    (result.map_err(|e| e.to_string()), metrics.snapshot())
}

/// The files in `dir`, by name.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// The `seq` of each row of a file.
fn seqs(path: &Path) -> Vec<u64> {
    decode(Bytes::from(std::fs::read(path).unwrap()), Limits::default())
        .unwrap()
        .iter()
        .map(|r| r["seq"].as_u64().unwrap())
        .collect()
}

fn metadata(path: &Path) -> parquet::file::metadata::ParquetMetaData {
    let bytes = Bytes::from(std::fs::read(path).unwrap());
    SerializedFileReader::new(bytes).unwrap().metadata().clone()
}

#[test]
fn options_are_checked_with_what_is_wrong() {
    let p = Typed(ParquetSink);
    let e = |o: Value| option_errors(&p, o);
    assert_eq!(e(json!({ "path": "a-{n}.parquet" })), "");
    assert_eq!(
        e(json!({ "path": "a.parquet" })),
        "path: must contain `{n}` once (each file gets its own number)"
    );
    assert_eq!(
        e(json!({ "path": "{n}/a-{n}.parquet" })),
        "path: must contain `{n}` once (each file gets its own number)"
    );
    assert_eq!(
        e(json!({ "path": "a-{n}", "schema": { "a": "int64", "b": "uint8" } })),
        "schema.b: must be one of int64, int32, float64, float32, boolean, string"
    );
    assert_eq!(
        e(json!({ "path": "a-{n}", "schema": {} })),
        "schema: must name at least one column"
    );
    assert_eq!(
        e(json!({ "path": "a-{n}", "schema": { "a": 1 } })),
        "schema.a: must be one of int64, int32, float64, float32, boolean, string"
    );
    // The check itself, as the engine runs it after the schema's ranges.
    let o = |max_rows| ParquetSinkOptions {
        path: "a-{n}".into(),
        compression: Default::default(),
        max_rows,
        schema: None,
    };
    assert!(o(1).check().is_empty());
    let errors = o(0).check();
    assert_eq!(errors.len(), 1);
    assert_eq!(
        (errors[0].path.clone(), errors[0].message.as_str()),
        (vec!["max_rows".to_string()], "must be at least 1")
    );
    assert!(e(json!({ "path": "a-{n}", "max_rows": 0 })).starts_with("max_rows: "));
}

/// Batches of 3, 2, 3 and 3 events with `max_rows: 5`, all ready at once:
/// 3 + 2 fill a file exactly (no more input is taken once it is full); the
/// next 3 start a file that the last 3 would overfill, so it is closed
/// first; the input's end closes the last.
#[tokio::test]
async fn a_file_holds_at_most_max_rows_and_is_closed_before_a_batch_overfills_it() {
    let dir = tempfile::tempdir().unwrap();
    let heard = Arc::new(Heard::default());
    let batches = vec![
        batch(&heard, 0, 0..3),
        batch(&heard, 1, 3..5),
        batch(&heard, 2, 5..8),
        batch(&heard, 3, 8..11),
    ];
    let (result, counts) = write(dir.path(), json!({ "max_rows": 5 }), batches).await;
    result.unwrap();
    assert_eq!(
        files(dir.path()),
        [
            "part-000000.parquet",
            "part-000001.parquet",
            "part-000002.parquet"
        ]
    );
    assert_eq!(
        seqs(&dir.path().join("part-000000.parquet")),
        [0, 1, 2, 3, 4]
    );
    assert_eq!(seqs(&dir.path().join("part-000001.parquet")), [5, 6, 7]);
    assert_eq!(seqs(&dir.path().join("part-000002.parquet")), [8, 9, 10]);
    assert_eq!(
        (counts.events_in, counts.events_out, counts.errored),
        (11, 11, 0)
    );
    assert_eq!(
        heard.outcomes(),
        (0..4).map(|t| (t, Outcome::Delivered)).collect::<Vec<_>>()
    );
}

/// One batch larger than `max_rows` is still one file (a batch is never
/// split), and a batch of one after a full file starts the next.
#[tokio::test]
async fn a_batch_larger_than_max_rows_is_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let heard = Arc::new(Heard::default());
    let batches = vec![batch(&heard, 0, 0..7), batch(&heard, 1, 7..8)];
    let (result, counts) = write(dir.path(), json!({ "max_rows": 5 }), batches).await;
    result.unwrap();
    assert_eq!(
        files(dir.path()),
        ["part-000000.parquet", "part-000001.parquet"]
    );
    assert_eq!(
        seqs(&dir.path().join("part-000000.parquet")),
        [0, 1, 2, 3, 4, 5, 6]
    );
    assert_eq!(seqs(&dir.path().join("part-000001.parquet")), [7]);
    assert_eq!(counts.events_out, 8);
}

/// While input keeps coming the file stays open; when none is ready the
/// held events are written as one file, committed and acknowledged before
/// the sink waits for more. The test sends the next batch only once the
/// first file is there and its batch has been told it was delivered.
#[tokio::test]
async fn a_file_is_closed_and_its_events_acknowledged_when_input_pauses() {
    let dir = tempfile::tempdir().unwrap();
    let heard = Arc::new(Heard::default());
    let s = sink(&Typed(ParquetSink), options(dir.path(), json!({})));
    let (tx, rx) = channel(16);
    let metrics = Arc::new(StageMetrics::default());
    let mut cx = SinkContext::new("s", rx, metrics.clone());
    let run = tokio::spawn(async move { s.run(&mut cx).await });
    tx.send(batch(&heard, 0, 0..2)).await.unwrap();
    heard.wait_for(0).await;
    // Acknowledged only once its file is complete and in place.
    assert_eq!(heard.outcomes(), [(0, Outcome::Delivered)]);
    assert_eq!(files(dir.path()), ["part-000000.parquet"]);
    assert_eq!(seqs(&dir.path().join("part-000000.parquet")), [0, 1]);
    assert_eq!(metrics.snapshot().events_out, 2);
    tx.send(batch(&heard, 1, 2..5)).await.unwrap();
    drop(tx);
    run.await.unwrap().unwrap();
    assert_eq!(
        files(dir.path()),
        ["part-000000.parquet", "part-000001.parquet"]
    );
    assert_eq!(seqs(&dir.path().join("part-000001.parquet")), [2, 3, 4]);
    assert_eq!(
        heard.outcomes(),
        [(0, Outcome::Delivered), (1, Outcome::Delivered)]
    );
    assert_eq!(metrics.snapshot().events_out, 5);
}

/// A raw event, and with `schema` an event outside it, is not a row: it
/// is counted as errored and its source batch hears it was rejected; the
/// batch's other events are written.
#[tokio::test]
async fn events_that_cannot_be_rows_are_errored_and_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let heard = Arc::new(Heard::default());
    let raw_ack = BatchAck::new(heard.clone(), 1);
    let raw = Event::raw(&b"not parsed"[..], Meta::now("t".into())).with_ack(raw_ack.handle());
    drop(raw_ack);
    let misfit_ack = BatchAck::new(heard.clone(), 2);
    let mut mixed = batch(&heard, 3, 0..2);
    mixed.push(
        Event::fields(
            json!({ "seq": "not a number" })
                .as_object()
                .unwrap()
                .clone(),
            Meta::now("t".into()),
        )
        .with_ack(misfit_ack.handle()),
    );
    mixed.push(
        Event::fields(
            json!({ "seq": 9, "other": 1 }).as_object().unwrap().clone(),
            Meta::now("t".into()),
        )
        .with_ack(misfit_ack.handle()),
    );
    drop(misfit_ack);
    let schema = json!({ "schema": { "seq": "int64", "msg": "string" } });
    let (result, counts) = write(dir.path(), schema, vec![vec![raw], mixed]).await;
    result.unwrap();
    assert_eq!(
        (counts.events_in, counts.events_out, counts.errored),
        (5, 2, 3)
    );
    assert_eq!(
        heard.outcomes(),
        [
            (1, Outcome::Rejected),
            (2, Outcome::Rejected),
            (3, Outcome::Delivered)
        ]
    );
    assert_eq!(files(dir.path()), ["part-000000.parquet"]);
    let rows = decode(
        Bytes::from(std::fs::read(dir.path().join("part-000000.parquet")).unwrap()),
        Limits::default(),
    )
    .unwrap();
    assert_eq!(
        rows.into_iter().map(Value::Object).collect::<Vec<_>>(),
        [
            json!({ "seq": 0, "msg": "m0" }),
            json!({ "seq": 1, "msg": "m1" })
        ]
    );
}

/// Without a schema, raw events only: nothing to write, no file.
#[tokio::test]
async fn no_rows_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let raw = Event::raw(&b"x"[..], Meta::now("t".into()));
    let (result, counts) = write(dir.path(), json!({}), vec![vec![raw]]).await;
    result.unwrap();
    assert!(files(dir.path()).is_empty());
    assert_eq!(counts.errored, 1);
}

/// Numbering continues after the highest file of this template: files of
/// another prefix, another suffix, a temporary file or a name that is not
/// a number do not count.
#[tokio::test]
async fn numbering_continues_after_the_highest_existing_file() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "part-000003.parquet",
        "part-000010.parquet.tmp",
        "part-x.parquet",
        "other-000020.parquet",
        "part-000030.csv",
        "part-000001.parquet",
    ] {
        std::fs::write(dir.path().join(name), b"").unwrap();
    }
    let heard = Arc::new(Heard::default());
    let (result, _) = write(dir.path(), json!({}), vec![batch(&heard, 0, 0..1)]).await;
    result.unwrap();
    assert_eq!(seqs(&dir.path().join("part-000004.parquet")), [0]);
    assert!(!dir.path().join("part-000004.parquet.tmp").exists());
    // A folder that does not exist yet numbers from 0 (and then fails to
    // create the file: nothing is created on the sink's behalf).
    let missing = dir.path().join("missing");
    let (result, _) = write(&missing, json!({}), vec![batch(&heard, 1, 0..1)]).await;
    let err = result.unwrap_err();
    let tmp: PathBuf = missing.join("part-000000.parquet.tmp");
    assert!(
        err.contains(&format!("creating {}", tmp.display())),
        "{err}"
    );
    assert_eq!(heard.outcomes()[1], (1, Outcome::Errored));
}

/// Each file's pages are compressed as configured (zstd by default), and a
/// file is one row group.
#[tokio::test]
async fn pages_are_compressed_as_configured() {
    for (name, want) in [
        (None, "ZSTD"),
        (Some("none"), "UNCOMPRESSED"),
        (Some("snappy"), "SNAPPY"),
        (Some("gzip"), "GZIP"),
        (Some("lz4"), "LZ4_RAW"),
        (Some("zstd"), "ZSTD"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let heard = Arc::new(Heard::default());
        let more = match name {
            Some(n) => json!({ "compression": n }),
            None => json!({}),
        };
        let (result, _) = write(dir.path(), more, vec![batch(&heard, 0, 0..50)]).await;
        result.unwrap();
        let path = dir.path().join("part-000000.parquet");
        let meta = metadata(&path);
        assert_eq!(meta.num_row_groups(), 1, "{name:?}");
        assert_eq!(meta.file_metadata().num_rows(), 50);
        let codec = meta.row_group(0).column(0).compression();
        let shown = match codec {
            Compression::UNCOMPRESSED => "UNCOMPRESSED",
            Compression::SNAPPY => "SNAPPY",
            Compression::GZIP(_) => "GZIP",
            Compression::LZ4_RAW => "LZ4_RAW",
            Compression::ZSTD(_) => "ZSTD",
            other => panic!("{other:?}"),
        };
        assert_eq!(shown, want, "{name:?}");
        assert_eq!(seqs(&path), (0..50).collect::<Vec<_>>());
    }
}

/// A configured schema fixes the columns' order and types, whatever the
/// events hold: an integer written to a `float64` column reads back as a
/// float, a missing field as null. A value its column's type cannot hold
/// (an integer past `int32`, text in a `boolean` column) is an event that
/// does not fit: errored, not written.
#[tokio::test]
async fn a_configured_schema_types_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let events = [
        json!({ "b": 2, "a": "x", "c": -5, "d": 1.5, "e": true, "f": 1_i64 << 40 }),
        json!({ "a": "y", "c": i32::MAX, "e": false }),
        json!({ "c": i64::from(i32::MAX) + 1 }),
        json!({ "c": 1.5 }),
        json!({ "e": "yes" }),
        json!({ "d": "1.5" }),
    ]
    .into_iter()
    .map(|v| Event::fields(v.as_object().unwrap().clone(), Meta::now("t".into())))
    .collect();
    let schema = json!({ "schema": {
        "a": "string", "b": "float64", "c": "int32", "d": "float32", "e": "boolean", "f": "int64"
    } });
    let (result, counts) = write(dir.path(), schema, vec![events]).await;
    result.unwrap();
    assert_eq!(counts.errored, 4);
    let path = dir.path().join("part-000000.parquet");
    let rows = decode(
        Bytes::from(std::fs::read(&path).unwrap()),
        Limits::default(),
    )
    .unwrap();
    assert_eq!(
        rows.into_iter().map(Value::Object).collect::<Vec<_>>(),
        [
            json!({ "a": "x", "b": 2.0, "c": -5, "d": 1.5, "e": true, "f": 1_i64 << 40 }),
            json!({ "a": "y", "b": null, "c": i32::MAX, "d": null, "e": false, "f": null })
        ]
    );
    let meta = metadata(&path);
    let types: Vec<_> = meta
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .map(|c| format!("{}:{}", c.name(), c.physical_type()))
        .collect();
    assert_eq!(
        types,
        [
            "a:BYTE_ARRAY",
            "b:DOUBLE",
            "c:INT32",
            "d:FLOAT",
            "e:BOOLEAN",
            "f:INT64"
        ]
    );
}
