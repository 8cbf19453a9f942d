//! Parquet as an object format on its own (what `sink: s3` with
//! `object_format: parquet` writes through; its tests against MinIO are in
//! `plugins/aws/tests/s3_sink.rs`): row groups handed out as they close,
//! the first row group's schema widened as its rows come and then fixed,
//! what does not fit refused for good or moved to the next object. Objects
//! are read back with the crate's reader and their metadata with the
//! parquet crate.
#![cfg(all(feature = "object-parquet", feature = "parser-parquet"))]

use bytes::Bytes;
use logbus_parquet::object::{ParquetObjectOptions, ParquetObjects};
use logbus_parquet::reader::{Limits, decode};
use logbus_parquet::writer::PageCompression;
use logbus_plugin_api::{Event, Meta};
use logbus_sink::{Misfit, ObjectFormat};
use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::{Value, json};

fn event(v: Value) -> Event {
    Event::fields(v.as_object().unwrap().clone(), Meta::now("t".into()))
}

fn format(row_group_rows: usize, schema: Option<Value>) -> ParquetObjects {
    let options = ParquetObjectOptions {
        compression: PageCompression::Zstd,
        row_group_rows,
        schema: schema.map(|s| s.as_object().unwrap().clone()),
    };
    ParquetObjects::new(&options, "parquet").unwrap()
}

/// Writes `rows` into a new object of `format`, taking the ready bytes
/// after each; returns the object's bytes and how many bytes were ready
/// after each row.
fn write_all(format: &ParquetObjects, rows: &[Value]) -> (Vec<u8>, Vec<usize>) {
    let mut object = format.open().unwrap();
    let mut bytes = Vec::new();
    let mut ready = Vec::new();
    for row in rows {
        object.write(&event(row.clone())).unwrap();
        let part = std::mem::take(object.ready());
        ready.push(part.len());
        bytes.extend(part);
    }
    bytes.extend(object.finish().unwrap());
    (bytes, ready)
}

fn rows_of(bytes: &[u8]) -> Vec<Value> {
    decode(Bytes::copy_from_slice(bytes), Limits::default())
        .unwrap()
        .into_iter()
        .map(Value::Object)
        .collect()
}

/// The names of an object's columns, from its footer.
fn column_names(bytes: &[u8]) -> Vec<String> {
    let reader = SerializedFileReader::new(Bytes::copy_from_slice(bytes)).unwrap();
    let schema = reader.metadata().file_metadata().schema_descr();
    schema
        .columns()
        .iter()
        .map(|c| c.name().to_string())
        .collect()
}

fn row_group_sizes(bytes: &[u8]) -> Vec<i64> {
    let reader = SerializedFileReader::new(Bytes::copy_from_slice(bytes)).unwrap();
    reader
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows())
        .collect()
}

#[test]
fn row_groups_are_handed_out_as_they_close() {
    let rows: Vec<Value> = (0..7)
        .map(|i| json!({ "seq": i, "msg": format!("m{i}") }))
        .collect();
    let format = format(3, None);
    let mut object = format.open().unwrap();
    let mut bytes = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        object.write(&event(row.clone())).unwrap();
        let part = std::mem::take(object.ready());
        // A row group's bytes are there once its third row is written,
        // not before; the first also carries the file's magic.
        match i {
            0 | 1 | 3 | 4 | 6 => assert!(part.is_empty(), "row {i}: {} bytes", part.len()),
            2 => {
                assert!(part.starts_with(b"PAR1"));
                assert!(part.len() > 4);
            }
            _ => assert!(!part.is_empty(), "row {i}"),
        }
        // The size counts every byte encoded (handed out or not; once a
        // row group is closed, all of them are handed out).
        let handed_out = bytes.len() + part.len();
        if i < 2 {
            assert_eq!(object.size(), 0, "row {i}");
        } else {
            assert_eq!(object.size() as usize, handed_out, "row {i}");
        }
        bytes.extend(part);
    }
    let size_before = object.size() as usize;
    assert_eq!(size_before, bytes.len());
    let tail = object.finish().unwrap();
    assert!(tail.ends_with(b"PAR1"));
    bytes.extend(tail);
    assert_eq!(row_group_sizes(&bytes), [3, 3, 1]);
    assert_eq!(rows_of(&bytes), rows);
}

#[test]
fn an_object_smaller_than_a_row_group_is_one_row_group() {
    let rows: Vec<Value> = (0..2).map(|i| json!({ "seq": i })).collect();
    let (bytes, ready) = write_all(&format(10, None), &rows);
    assert_eq!(ready, [0, 0]);
    assert_eq!(row_group_sizes(&bytes), [2]);
    assert_eq!(rows_of(&bytes), rows);
}

/// The first row group's rows widen the schema as they come: an integer
/// column that meets a float becomes a float, scalars of other kinds make a
/// string column, lists and structs widen inside, new fields are added.
#[test]
fn the_first_row_group_widens_its_schema() {
    // `k` has the same type in every row that widens: it stays an integer.
    let rows = [
        json!({ "k": 1, "n": 1, "s": 1, "l": [1], "o": { "x": 1 } }),
        json!({ "k": 2, "n": 2.5, "s": true, "l": [2.5], "o": { "y": "a" } }),
        json!({ "k": 3, "s": "t", "extra": null }),
        json!({ "extra": "e" }),
    ];
    let (bytes, _) = write_all(&format(10, None), &rows);
    assert_eq!(
        rows_of(&bytes),
        [
            json!({ "k": 1, "n": 1.0, "s": "1", "l": [1.0], "o": { "x": 1, "y": null }, "extra": null }),
            json!({ "k": 2, "n": 2.5, "s": "true", "l": [2.5], "o": { "x": null, "y": "a" }, "extra": null }),
            json!({ "k": 3, "n": null, "s": "t", "l": null, "o": null, "extra": null }),
            json!({ "k": null, "n": null, "s": null, "l": null, "o": null, "extra": "e" }),
        ]
    );
}

/// Fields that cannot be reconciled (an object where a scalar was, a list
/// where a scalar was, inside a struct too) do not fit the object: the
/// event starts the next one, and the object so far is kept as it was.
#[test]
fn a_clash_in_the_first_row_group_moves_the_event_to_the_next_object() {
    let clash = Misfit::NextObject("the event's fields clash with this object's schema".into());
    for (first, second) in [
        (json!({ "a": 1 }), json!({ "a": { "x": 1 } })),
        (json!({ "a": { "x": 1 } }), json!({ "a": 1 })),
        (json!({ "a": [1] }), json!({ "a": "x" })),
        (json!({ "a": [1] }), json!({ "a": [{ "x": 1 }] })),
        (json!({ "a": { "x": 1 } }), json!({ "a": { "x": [1] } })),
    ] {
        let format = format(10, None);
        let mut object = format.open().unwrap();
        object.write(&event(first.clone())).unwrap();
        assert_eq!(
            object.write(&event(second.clone())),
            Err(clash.clone()),
            "{second}"
        );
        let bytes = object.finish().unwrap();
        assert_eq!(rows_of(&bytes), [first], "{second}");
    }
}

/// Once the first row group is closed the schema is fixed: a row fits
/// where every field is in it with a value of its type (or null; numbers
/// and booleans go into string columns), inside lists and structs too;
/// anything else starts the next object.
#[test]
fn after_the_first_row_group_a_row_must_fit_the_fixed_schema() {
    let next = Misfit::NextObject("the event does not fit this object's schema".into());
    let first = [
        json!({ "i": 1, "f": 1.5, "b": true, "s": "x", "l": [1], "o": { "x": 1 } }),
        json!({ "i": 2, "f": 2.5, "b": false, "s": "y", "l": [], "o": { "x": 2 } }),
    ];
    let fitting = [
        json!({ "i": null, "f": 3, "s": 7, "l": [2, 3], "o": { "x": null } }),
        json!({ "s": false, "b": true, "o": {} }),
        json!({}),
    ];
    let misfits = [
        json!({ "i": 1.5 }),
        json!({ "i": "1" }),
        json!({ "f": "1.5" }),
        json!({ "b": 1 }),
        json!({ "s": [1] }),
        json!({ "l": [1.5] }),
        json!({ "l": 1 }),
        json!({ "o": { "x": "1" } }),
        json!({ "o": { "z": 1 } }),
        json!({ "o": [1] }),
        json!({ "other": 1 }),
    ];
    let format = format(2, None);
    let mut object = format.open().unwrap();
    for row in &first {
        object.write(&event(row.clone())).unwrap();
    }
    for row in &misfits {
        assert_eq!(
            object.write(&event(row.clone())),
            Err(next.clone()),
            "{row}"
        );
    }
    for row in &fitting {
        object.write(&event(row.clone())).unwrap();
    }
    let mut bytes = std::mem::take(object.ready());
    bytes.extend(object.finish().unwrap());
    let back = rows_of(&bytes);
    assert_eq!(back.len(), 5);
    assert_eq!(back[2]["s"], "7");
    assert_eq!(back[2]["f"], 3.0);
    assert_eq!(back[2]["l"], json!([2, 3]));
    assert_eq!(back[3]["s"], "false");
    assert_eq!(back[3]["b"], true);
    assert_eq!(row_group_sizes(&bytes), [2, 2, 1]);
}

/// With `schema` every object has it from the start; an event outside it,
/// or a raw event, fits no object and is refused for good.
#[test]
fn a_configured_schema_refuses_for_good() {
    let format = format(10, Some(json!({ "seq": "int64", "msg": "string" })));
    let mut object = format.open().unwrap();
    assert_eq!(
        object.write(&event(json!({ "seq": "x" }))),
        Err(Misfit::Never(
            "the event does not fit the configured Parquet schema".into()
        ))
    );
    assert_eq!(
        object.write(&event(json!({ "seq": 1, "other": 1 }))),
        Err(Misfit::Never(
            "the event does not fit the configured Parquet schema".into()
        ))
    );
    let raw = Event::raw(&b"line"[..], Meta::now("t".into()));
    assert_eq!(
        object.write(&raw),
        Err(Misfit::Never(
            "a raw event cannot be a Parquet row; parse it first".into()
        ))
    );
    object.write(&event(json!({ "msg": "m" }))).unwrap();
    object.write(&event(json!({ "seq": 2 }))).unwrap();
    let bytes = object.finish().unwrap();
    assert_eq!(
        rows_of(&bytes),
        [
            json!({ "seq": null, "msg": "m" }),
            json!({ "seq": 2, "msg": null })
        ]
    );
    // Without a schema, a raw event is refused as well.
    let mut object = self::format(10, None).open().unwrap();
    assert!(matches!(object.write(&raw), Err(Misfit::Never(_))));
}

/// An object with no rows is still a Parquet file: with a configured
/// schema its footer names the columns, without one it has none.
#[test]
fn an_empty_object() {
    let bytes = format(10, Some(json!({ "seq": "int64" })))
        .open()
        .unwrap()
        .finish()
        .unwrap();
    assert!(rows_of(&bytes).is_empty());
    assert_eq!(column_names(&bytes), ["seq"]);
    let bytes = format(10, None).open().unwrap().finish().unwrap();
    assert!(rows_of(&bytes).is_empty());
    assert!(column_names(&bytes).is_empty());
}

#[test]
fn options_are_checked_under_the_sinks_key() {
    let options = ParquetObjectOptions {
        compression: PageCompression::default(),
        row_group_rows: 0,
        schema: Some(json!({ "a": "uint8" }).as_object().unwrap().clone()),
    };
    let errors: Vec<_> = options
        .check("parquet")
        .into_iter()
        .map(|e| format!("{}: {}", e.path.join("."), e.message))
        .collect();
    assert_eq!(
        errors,
        [
            "parquet.row_group_rows: must be at least 1",
            "parquet.schema.a: must be one of int64, int32, float64, float32, boolean, string"
        ]
    );
    assert!(ParquetObjectOptions::default().check("parquet").is_empty());
    assert_eq!(ParquetObjectOptions::default().row_group_rows, 10_000);
    assert_eq!(
        ParquetObjectOptions::default().compression,
        PageCompression::Zstd
    );
    let e = ParquetObjects::new(&options, "p").err().unwrap();
    assert_eq!(e.path, ["p", "schema", "a"]);
}
