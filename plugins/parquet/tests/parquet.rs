//! Parquet files written by pyarrow (another implementation), in every
//! compression it offers, read back row by row; garbage is an error.
#![cfg(feature = "parser-parquet")]

use std::process::Command;

use bytes::Bytes;
use logbus_parquet::reader::{Limits, decode};

const MAX: Limits = Limits {
    bytes: logbus_parquet::reader::DEFAULT_MAX_DECODED_BYTES,
    rows: logbus_parquet::reader::DEFAULT_MAX_ROWS,
};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Fails the test unless python3 can import pyarrow.
fn require_pyarrow() {
    let ok = Command::new("python3")
        .args(["-c", "import pyarrow"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "python3 with pyarrow is required here (pip install pyarrow)"
    );
}

#[ignore = "needs python3 with pyarrow (pip install pyarrow); run with --include-ignored"]
#[test]
fn files_written_by_pyarrow_read_back() {
    require_pyarrow();
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import sys, datetime
import pyarrow as pa, pyarrow.parquet as pq
table = pa.table({
    "seq": pa.array([1, 2, None], pa.int64()),
    "msg": ["héllo", "", None],
    "latency": [1.5, -0.25, 3.0],
    "ok": [True, False, None],
    "tags": [["a", "b"], [], None],
    "host": [{"name": "n1", "port": 514}, {"name": "n2", "port": 1}, None],
    "at": pa.array([datetime.datetime(2026, 11, 30, 6, 51, 54), None, None], pa.timestamp("ms")),
})
for codec in ["NONE", "SNAPPY", "GZIP", "ZSTD", "LZ4"]:
    pq.write_table(table, f"{sys.argv[1]}/{codec}.parquet", compression=codec, row_group_size=2)
"#;
    let o = Command::new("python3")
        .args(["-c", script])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = vec![
        json!({"seq": 1, "msg": "héllo", "latency": 1.5, "ok": true, "tags": ["a", "b"],
               "host": {"name": "n1", "port": 514}, "at": "2026-11-30T06:51:54"}),
        json!({"seq": 2, "msg": "", "latency": -0.25, "ok": false, "tags": [],
               "host": {"name": "n2", "port": 1}, "at": null}),
        json!({"seq": null, "msg": null, "latency": 3.0, "ok": null, "tags": null,
               "host": null, "at": null}),
    ];
    for codec in ["NONE", "SNAPPY", "GZIP", "ZSTD", "LZ4"] {
        let bytes = std::fs::read(dir.path().join(format!("{codec}.parquet"))).unwrap();
        let got: Vec<Value> = decode(Bytes::from(bytes), MAX)
            .unwrap_or_else(|e| panic!("{codec}: {e}"))
            .into_iter()
            .map(Value::Object)
            .collect();
        assert_eq!(got, want, "{codec}");
    }
}

proptest! {
    /// The property is the absence of a panic (a panic fails the case).
    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode(Bytes::from(bytes.clone()), MAX);
        // With the magic at both ends, the footer parser is reached.
        let mut framed = b"PAR1".to_vec();
        framed.extend(&bytes);
        framed.extend(b"PAR1");
        let _ = decode(Bytes::from(framed), MAX);
    }
}

/// A page header whose skipped field claims far more bytes than the file
/// has left is an error, found before the crate reads it; the crate used
/// to skip it element by element for minutes (a 3 KiB file found by
/// fuzzing).
#[test]
fn a_page_header_running_past_the_end_of_the_file_is_an_error() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/slow/list-of-2e31-doubles-at-the-end.parquet");
    let err = decode(Bytes::from(std::fs::read(path).unwrap()), MAX).unwrap_err();
    assert!(
        err.starts_with(
            "refused: row group 0, column 0: the page header at byte 34 declares a list of "
        ) && err.ends_with(" bytes remain"),
        "{err}"
    );
}

#[test]
fn not_parquet_says_so() {
    let e = decode(Bytes::from_static(b"{\"a\":1}\n"), MAX).unwrap_err();
    assert!(e.starts_with("not a Parquet file"), "{e}");
    assert!(e.contains("(reading at byte "), "{e}");
}

#[cfg(feature = "sink-parquet")]
mod round_trip {
    use super::*;
    use logbus_parquet::writer::{PageCompression, encode_file};

    prop_compose! {
        fn row()(
            seq in any::<i64>(),
            lat in any::<f64>().prop_filter("finite", |f| f.is_finite()),
            msg in any::<String>(),
            ok in any::<bool>(),
            user in prop::option::of("[a-z]{1,8}"),
            tags in prop::collection::vec("[a-z]{0,5}", 0..3),
        ) -> Value {
            json!({"seq": seq, "lat": lat, "msg": msg, "ok": ok, "user": user, "tags": tags})
        }
    }

    proptest! {
        /// What the parquet sink writes, the parquet parser reads back the
        /// same, in every page compression.
        #[test]
        fn rows_round_trip(mut rows in prop::collection::vec(row(), 1..20)) {
            // A column must have one non-null value to have a type.
            rows[0]["user"] = json!("first");
            for compression in [PageCompression::None, PageCompression::Snappy, PageCompression::Gzip, PageCompression::Lz4, PageCompression::Zstd] {
                let bytes = encode_file(&rows, compression, None).map_err(TestCaseError::fail)?;
                let back: Vec<Value> = decode(Bytes::from(bytes), MAX)
                    .map_err(TestCaseError::fail)?
                    .into_iter()
                    .map(Value::Object)
                    .collect();
                // Doubles come back within an ulp or two: arrow-json's
                // float conversion is not always exact (found by this test;
                // docs/plugins/parquet.md). Everything else is exact.
                prop_assert_eq!(back.len(), rows.len());
                for (b, r) in back.iter().zip(&rows) {
                    let (bl, rl) = (b["lat"].as_f64().unwrap(), r["lat"].as_f64().unwrap());
                    let ulps = 4.0 * f64::EPSILON * rl.abs().max(f64::MIN_POSITIVE);
                    prop_assert!((bl - rl).abs() <= ulps, "{bl} vs {rl}");
                    let (mut b, mut r) = (b.clone(), r.clone());
                    b["lat"] = Value::Null;
                    r["lat"] = Value::Null;
                    prop_assert_eq!(b, r, "{:?}", compression);
                }
            }
        }
    }
}

#[cfg(feature = "sink-parquet")]
#[test]
fn a_given_schema_types_the_columns_and_refuses_misfits() {
    use logbus_parquet::writer::{GivenSchema, PageCompression, encode_file};
    let map = json!({"seq": "int64", "lat": "float64", "msg": "string", "ok": "boolean"});
    let given = GivenSchema::parse(map.as_object().unwrap()).unwrap();
    let rows = vec![
        json!({"seq": 1, "lat": 2, "msg": "a"}),
        json!({"seq": 2, "ok": true}),
    ];
    let bytes = encode_file(&rows, PageCompression::Zstd, Some(&given)).unwrap();
    let back: Vec<Value> = decode(Bytes::from(bytes), MAX)
        .unwrap()
        .into_iter()
        .map(Value::Object)
        .collect();
    assert_eq!(
        back,
        vec![
            json!({"seq": 1, "lat": 2.0, "msg": "a", "ok": null}),
            json!({"seq": 2, "lat": null, "msg": null, "ok": true}),
        ],
        "columns in schema order, typed as given, missing ones null"
    );
    assert!(!given.fits(json!({"seq": "x"}).as_object().unwrap()));
    assert!(!given.fits(json!({"other": 1}).as_object().unwrap()));
    assert!(given.fits(json!({"seq": null}).as_object().unwrap()));
    let bad = json!({"seq": "int128"});
    assert!(GivenSchema::parse(bad.as_object().unwrap()).is_err());
}

/// Files on which the parquet/arrow crates panicked (one of each kind
/// found by mutating pyarrow's output): each is an error naming where it
/// was reading, not a panic that would take the stage down. Parquet 60
/// reports some of them itself; some stop earlier, at the walk of their
/// page headers; the rest still panic and are caught.
#[test]
fn files_that_make_the_library_panic_are_errors() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/panics");
    let (mut caught, mut refused, mut reported) = (0, 0, 0);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = Bytes::from(std::fs::read(&path).unwrap());
        let err = decode(bytes, MAX).expect_err("a damaged file is an error");
        if err.starts_with("refused: row group ") && err.contains("the page header at byte ") {
            refused += 1;
            continue;
        }
        assert!(
            err.contains("(reading at byte "),
            "{}: {err}",
            path.display()
        );
        if err.starts_with("the Parquet reader failed on this file: ") {
            caught += 1;
        } else {
            reported += 1;
        }
    }
    assert_eq!((caught, refused, reported), (2, 2, 8));
}

/// A footer that declares more list elements than it has bytes (here two
/// billion row groups in a 2.5 KB file, found by the fuzz target) made
/// the parquet crate allocate ~150 GB and abort the process; it is now
/// refused before the crate reads it, naming the footer.
#[test]
fn a_footer_that_claims_more_than_it_holds_is_refused() {
    for name in [
        "row-group-count-2g.parquet",
        "schema-count-under-another-type.parquet",
    ] {
        let err = decode(hostile(name), MAX).unwrap_err();
        assert!(
            err.starts_with("not a Parquet file: its footer ") && err.contains("-byte footer)"),
            "{name}: {err}"
        );
    }
    // A list inside a row group, which the walk does not mirror: parquet 60
    // checks every list's count against the bytes left itself (57 asked
    // for 152 GB).
    let err = decode(hostile("list-in-a-row-group-152gb.parquet"), MAX).unwrap_err();
    assert!(err.starts_with("not a Parquet file: "), "{err}");
    // A footer whose row-group list claims 2^31 entries, written by hand:
    // `FileMetaData { 4: list<struct> of 0x7fffffff }` then the length and
    // the magic.
    let mut footer = vec![0x49, 0x0c]; // field 4 (delta 4), list, then: 15 << 4 | struct
    footer[1] = 0xfc;
    footer.extend([0xff, 0xff, 0xff, 0xff, 0x07]); // the count, a varint
    let mut file = b"PAR1".to_vec();
    file.extend(&footer);
    file.extend((footer.len() as u32).to_le_bytes());
    file.extend(b"PAR1");
    let err = decode(Bytes::from(file), MAX).unwrap_err();
    assert!(
        err.starts_with(
            "not a Parquet file: its footer declares a list of 2147483647 elements where 0 bytes remain"
        ),
        "{err}"
    );
}

fn hostile(name: &str) -> Bytes {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile");
    Bytes::from(std::fs::read(dir.join(name)).unwrap())
}

/// Small files that declare far more than they hold (written by pyarrow,
/// `page-inflates-past-its-header` then edited): each is refused from its
/// headers, before the parquet crate decodes anything, naming the limit.
#[test]
fn files_that_would_decode_past_the_limits_are_refused_from_their_headers() {
    // 23 KB of run-length-encoded nulls: ten million rows.
    let err = decode(hostile("ten-million-null-rows.parquet"), MAX).unwrap_err();
    assert_eq!(
        err,
        "refused: its row groups declare 10000000 rows, more than max_rows (1000000)"
    );
    let err = decode(
        hostile("ten-million-null-rows.parquet"),
        Limits {
            bytes: 16 << 20,
            rows: u64::MAX,
        },
    )
    .unwrap_err();
    assert!(
        err.starts_with("refused: row group ")
            && err.ends_with(
                " declares 1048576 rows, so its rows would come to more than max_decoded_bytes (16777216 bytes)"
            ),
        "{err}"
    );
    // 442 bytes: one 64 KiB string that 20,000 values repeat (1.3 GB).
    let err = decode(hostile("dictionary-entry-repeated.parquet"), MAX).unwrap_err();
    assert!(
        err.starts_with("refused: row group 0, column 0: the page at byte ")
            && err.ends_with(
                "values of up to 65544 bytes, so its rows would come to more than max_decoded_bytes (268435456 bytes)"
            ),
        "{err}"
    );
    // A gzip page that inflates to 2 MB where its header says 200 bytes.
    let err = decode(hostile("page-inflates-past-its-header.parquet"), MAX).unwrap_err();
    assert!(
        err.starts_with("refused: row group 0, column 0: the page at byte ")
            && err.ends_with("inflates past the 200 bytes its header declares"),
        "{err}"
    );
}

/// What the headers cannot tell (JSON escapes a control character in six
/// bytes) is counted as rows are decoded.
#[test]
fn rows_that_come_to_more_than_the_limit_are_refused_as_they_are_decoded() {
    let file = hostile("control-characters.parquet"); // 1000 rows of 100 × \x01
    let all = decode(file.clone(), MAX).unwrap();
    assert_eq!(all.len(), 1000);
    assert_eq!(all[0]["msg"], "\u{1}".repeat(100));
    let err = decode(
        file,
        Limits {
            bytes: 300_000,
            rows: 1000,
        },
    )
    .unwrap_err();
    assert!(
        err.starts_with(
            "refused: the file's rows come to more than max_decoded_bytes (300000 bytes) by row "
        ),
        "{err}"
    );
    let err = decode(
        hostile("control-characters.parquet"),
        Limits {
            bytes: 1 << 20,
            rows: 999,
        },
    )
    .unwrap_err();
    assert_eq!(
        err,
        "refused: its row groups declare 1000 rows, more than max_rows (999)"
    );
}

/// `parser: parquet` as the engine builds it: a raw event holding a whole
/// file becomes one event per row, each with the file event's meta (its
/// source, ingest time and origin); the options' limits are the reader's;
/// an event that is already parsed is an error for `on_error`.
#[cfg(feature = "sink-parquet")]
#[test]
fn the_parser_replaces_a_file_with_its_rows_keeping_the_meta() {
    use logbus_parquet::reader::ParquetParser;
    use logbus_parquet::writer::{PageCompression, encode_file};
    use logbus_plugin_api::testing::context;
    use logbus_plugin_api::{Built, Event, Meta, Plugin, Processor, Typed, Verdict};

    let parser = |options: Value| -> Box<dyn Processor> {
        match Typed(ParquetParser).build(&options, &context()) {
            Ok(Built::Processor(p)) => p,
            _ => panic!("the parser does not build"),
        }
    };
    let rows = vec![json!({"seq": 1, "msg": "a"}), json!({"seq": 2, "msg": "b"})];
    let file = encode_file(&rows, PageCompression::Zstd, None).unwrap();
    let mut meta = Meta::at("read", 42);
    meta.origin = Some("/data/in.parquet".into());
    let mut event = Event::raw(file.clone(), meta.clone());
    let Ok(Verdict::Replace(out)) = parser(json!({})).process(&mut event) else {
        panic!("the rows replace the file");
    };
    assert_eq!(out.len(), 2);
    for (e, want) in out.iter().zip(&rows) {
        assert_eq!(e.meta(), &meta);
        assert_eq!(&Value::Object(e.as_fields().unwrap().clone()), want);
    }

    let mut event = Event::raw(file.clone(), meta.clone());
    let err = parser(json!({"max_rows": 1}))
        .process(&mut event)
        .err()
        .unwrap();
    assert_eq!(
        err.0,
        "refused: its row groups declare 2 rows, more than max_rows (1)"
    );
    let mut event = Event::raw(file.clone(), meta.clone());
    let err = parser(json!({"max_decoded_bytes": 10}))
        .process(&mut event)
        .err()
        .unwrap();
    assert!(
        err.0.starts_with("refused: ") && err.0.contains("max_decoded_bytes (10 bytes)"),
        "{}",
        err.0
    );
    // The defaults are the reader's.
    let mut event = Event::raw(file, meta.clone());
    assert!(
        matches!(parser(json!({"max_rows": 2, "max_decoded_bytes": 1000})).process(&mut event), Ok(Verdict::Replace(v)) if v.len() == 2)
    );

    let mut parsed = Event::fields(rows[0].as_object().unwrap().clone(), meta);
    let err = parser(json!({})).process(&mut parsed).err().unwrap();
    assert_eq!(
        err.0,
        "the parquet parser needs a raw event (a whole file); this one is already parsed"
    );
}

/// The parser's options default to the reader's limits and refuse 0.
#[test]
fn the_parsers_options_default_to_the_readers_limits() {
    use logbus_parquet::reader::{
        DEFAULT_MAX_DECODED_BYTES, DEFAULT_MAX_ROWS, ParquetParserOptions,
    };
    let o = ParquetParserOptions::default();
    assert_eq!((o.max_decoded_bytes, o.max_rows), (256 << 20, 1_000_000));
    assert_eq!(
        (DEFAULT_MAX_DECODED_BYTES, DEFAULT_MAX_ROWS),
        (256 << 20, 1_000_000)
    );
    let d = logbus_parquet::reader::Limits::default();
    assert_eq!((d.bytes, d.rows), (256 << 20, 1_000_000));
    let p = logbus_plugin_api::Typed(logbus_parquet::reader::ParquetParser);
    let e = logbus_plugin_api::testing::option_errors(&p, json!({"max_rows": 0}));
    assert!(e.starts_with("max_rows: "), "{e}");
}

/// The rows' own size is held to `max_decoded_bytes` as they are decoded,
/// to the byte: 1000 rows of `{"msg":"\u0001…"}` (100 escapes) and a line
/// end come to 611,000 bytes.
#[test]
fn decoded_rows_may_come_to_exactly_the_limit() {
    let file = hostile("control-characters.parquet");
    let limits = |bytes| Limits { bytes, rows: 1000 };
    assert_eq!(decode(file.clone(), limits(611_000)).unwrap().len(), 1000);
    assert_eq!(
        decode(file, limits(610_999)).unwrap_err(),
        "refused: the file's rows come to more than max_decoded_bytes (610999 bytes) by row 1000"
    );
}
