//! Compressed files end to end: the file source reads what `gzip` wrote,
//! the file sink writes what `zstd` and `lz4` read, and an appended
//! compressed file reads back whole.

use std::process::Command;

use logbus_core::start;
use logbus_plugin_api::CancellationToken;

use crate::support::valid;

/// Fails the test unless the command-line tool `name` runs.
fn require_tool(name: &str) {
    let ok = Command::new(name)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "`{name}` is required here (apt install {name})");
}

/// Fails the test unless python3 can import `module`.
fn require_python(module: &str) {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "python3 with {module} is required here (pip install {module})"
    );
}

async fn run(text: &str) {
    let p = valid(text, &logbus::catalog::registry());
    let report = start(&p, CancellationToken::new()).unwrap().wait().await;
    assert!(report.is_clean(), "{report}");
}

#[ignore = "needs gzip, zstd and lz4 (apt install gzip zstd lz4); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_in_zstd_and_lz4_out_and_appends_read_back() {
    require_tool("gzip");
    require_tool("zstd");
    require_tool("lz4");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let lines: String = (0..5000).map(|i| format!("{{\"seq\":{i}}}\n")).collect();
    std::fs::write(dir.path().join("in.ndjson"), &lines).unwrap();
    assert!(
        Command::new("gzip")
            .arg(dir.path().join("in.ndjson"))
            .status()
            .unwrap()
            .success()
    );
    for (format, tool_name, ext) in [("zstd", "zstd", "zst"), ("lz4", "lz4", "lz4")] {
        run(&format!(
            "stages:
  read: {{ source: file, path: {d}/in.ndjson.gz }}
  out: {{ sink: file, inputs: [read], path: {d}/out.{ext}, append: false, compression: {format} }}
"
        ))
        .await;
        let o = Command::new(tool_name)
            .args(["-d", "-c"])
            .arg(dir.path().join(format!("out.{ext}")))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(
            String::from_utf8(o.stdout).unwrap(),
            lines,
            "{tool_name} reads our output"
        );
    }
    // Two runs appending to one gzip file: two streams, read back whole by
    // our source (and by gzip).
    for _ in 0..2 {
        run(&format!(
            "stages:
  read: {{ source: file, path: {d}/in.ndjson.gz }}
  out: {{ sink: file, inputs: [read], path: {d}/twice.gz, compression: gzip }}
"
        ))
        .await;
    }
    run(&format!(
        "stages:
  read: {{ source: file, path: {d}/twice.gz }}
  out: {{ sink: file, inputs: [read], path: {d}/twice.ndjson, append: false }}
"
    ))
    .await;
    let back = std::fs::read_to_string(dir.path().join("twice.ndjson")).unwrap();
    assert_eq!(back, format!("{lines}{lines}"));
}

/// Octet-counted and length-prefixed files written by the file sink read
/// back through the file source (messages may hold newlines); a broken
/// frame stops the source with an error naming the offset, after the
/// messages before it were delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framed_files_round_trip_and_a_broken_frame_stops_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    std::fs::write(dir.path().join("in.txt"), "one\ntwo\nthree\n").unwrap();
    for framing in ["octet-counting", "length-prefixed"] {
        run(&format!(
            "stages:
  read: {{ source: file, path: {d}/in.txt }}
  out: {{ sink: file, inputs: [read], path: {d}/{framing}.bin, append: false, framing: {framing}, compression: gzip }}
"
        ))
        .await;
        run(&format!(
            "stages:
  read: {{ source: file, path: {d}/{framing}.bin, framing: {framing} }}
  out: {{ sink: file, inputs: [read], path: {d}/{framing}.txt, append: false }}
"
        ))
        .await;
        assert_eq!(
            std::fs::read_to_string(dir.path().join(format!("{framing}.txt"))).unwrap(),
            "one\ntwo\nthree\n"
        );
    }
    std::fs::write(dir.path().join("broken.bin"), "3 one3 two05 three").unwrap();
    let p = valid(
        &format!(
            "stages:
  read: {{ source: file, path: {d}/broken.bin, framing: octet-counting }}
  out: {{ sink: file, inputs: [read], path: {d}/broken.txt, append: false }}
"
        ),
        &logbus::catalog::registry(),
    );
    let report = start(&p, CancellationToken::new()).unwrap().wait().await;
    assert_eq!(report.failures.len(), 1, "{report}");
    let message = &report.failures[0].message;
    assert!(
        message.contains("broken.bin")
            && message.contains("leading zero")
            && message.contains("byte 10"),
        "{message}"
    );
    assert_eq!(report.totals.lost, 0);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("broken.txt")).unwrap(),
        "one\ntwo\n"
    );
}

/// An Avro container file written by fastavro, read whole by the file
/// source and split into records by the avro parser, comes out as JSON
/// lines.
#[ignore = "needs python3 with fastavro (pip install fastavro); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_avro_file_from_fastavro_becomes_json_lines() {
    require_python("fastavro");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let script = r#"
import fastavro, sys
schema = {"type": "record", "name": "R", "fields": [{"name": "seq", "type": "long"}, {"name": "msg", "type": "string"}]}
with open(sys.argv[1], "wb") as f:
    fastavro.writer(f, schema, [{"seq": i, "msg": "m%d" % i} for i in range(1000)], codec="deflate")
"#;
    let o = Command::new("python3")
        .args(["-c", script])
        .arg(dir.path().join("in.avro"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    run(&format!(
        "stages:
  read: {{ source: file, path: {d}/in.avro, framing: whole, compression: none }}
  avro: {{ parser: avro, inputs: [read] }}
  out: {{ sink: file, inputs: [avro], path: {d}/out.ndjson, append: false }}
"
    ))
    .await;
    let out = std::fs::read_to_string(dir.path().join("out.ndjson")).unwrap();
    let want: String = (0..1000)
        .map(|i| format!("{{\"seq\":{i},\"msg\":\"m{i}\"}}\n"))
        .collect();
    assert_eq!(out, want);
}

/// `sink: avro` writes a container file that fastavro reads; a second run
/// appends to it; a file with another schema is refused; events that do
/// not fit the schema are counted as errored, not lost.
#[ignore = "needs python3 with fastavro (pip install fastavro); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_container_files_we_write_read_in_fastavro() {
    require_python("fastavro");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let pipeline = |codec: &str, template: &str| {
        format!(
            "stages:
  gen: {{ source: generator, count: 3000, template: '{template}' }}
  json: {{ parser: json, inputs: [gen] }}
  out:
    sink: avro
    inputs: [json]
    path: {d}/out.avro
    codec: {codec}
    block_events: 500
    sync: true
    schema: {{ type: record, name: Log, fields: [ {{ name: seq, type: long }}, {{ name: msg, type: [\"null\", \"string\"] }} ] }}
"
        )
    };
    run(&pipeline("deflate", r#"{"seq":{{seq}},"msg":"m{{seq}}"}"#)).await;
    run(&pipeline("deflate", r#"{"seq":{{seq}},"msg":null}"#)).await;
    let o = Command::new("python3")
        .args([
            "-c",
            "import fastavro, json, sys\nwith open(sys.argv[1], 'rb') as f:\n    rs = list(fastavro.reader(f))\nprint(json.dumps([len(rs), rs[0], rs[2999], rs[3000], rs[-1]]))",
        ])
        .arg(dir.path().join("out.avro"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        got,
        serde_json::json!([6000, {"seq": 0, "msg": "m0"}, {"seq": 2999, "msg": "m2999"},
                           {"seq": 0, "msg": null}, {"seq": 2999, "msg": null}])
    );

    // Another schema: refused, the file untouched.
    let before = std::fs::read(dir.path().join("out.avro")).unwrap();
    let p = valid(
        &pipeline("null", r#"{"seq":{{seq}}}"#).replace("name: Log,", "name: Other,"),
        &logbus::catalog::registry(),
    );
    let report = start(&p, CancellationToken::new()).unwrap().wait().await;
    assert_eq!(report.failures.len(), 1, "{report}");
    assert!(
        report.failures[0].message.contains("another schema"),
        "{report}"
    );
    assert_eq!(std::fs::read(dir.path().join("out.avro")).unwrap(), before);

    // Events that do not fit: errored, counted, the rest written.
    let p = valid(
        &pipeline("null", r#"{"seq":"not a number {{seq}}"}"#).replace("out.avro", "bad.avro"),
        &logbus::catalog::registry(),
    );
    let report = start(&p, CancellationToken::new()).unwrap().wait().await;
    assert_eq!(report.totals.lost, 0, "{report}");
    assert_eq!(report.totals.errored, 3000, "{report}");
}

/// A Parquet file written by pyarrow, read whole by the file source and
/// split into rows by the parquet parser, comes out as JSON lines.
#[ignore = "needs python3 with pyarrow (pip install pyarrow); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parquet_file_from_pyarrow_becomes_json_lines() {
    require_python("pyarrow");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let script = "import sys, pyarrow as pa, pyarrow.parquet as pq\npq.write_table(pa.table({'seq': list(range(5000)), 'msg': ['m%d' % i for i in range(5000)]}), sys.argv[1], compression='ZSTD', row_group_size=1000)\n";
    let o = Command::new("python3")
        .args(["-c", script])
        .arg(dir.path().join("in.parquet"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    run(&format!(
        "stages:
  read: {{ source: file, path: {d}/in.parquet, framing: whole, compression: none }}
  rows: {{ parser: parquet, inputs: [read] }}
  out: {{ sink: file, inputs: [rows], path: {d}/out.ndjson, append: false }}
"
    ))
    .await;
    let out = std::fs::read_to_string(dir.path().join("out.ndjson")).unwrap();
    let want: String = (0..5000)
        .map(|i| format!("{{\"seq\":{i},\"msg\":\"m{i}\"}}\n"))
        .collect();
    assert_eq!(out, want);

    // Over `max_rows`: the file is one error, for `on_error`, and none of
    // its rows goes out.
    let p = valid(
        &format!(
            "stages:
  read: {{ source: file, path: {d}/in.parquet, framing: whole, compression: none }}
  rows: {{ parser: parquet, inputs: [read], max_rows: 4999, on_error: route }}
  out: {{ sink: file, inputs: [rows], path: {d}/none.ndjson, append: false }}
  bad: {{ sink: file, inputs: [rows.errors], path: {d}/errors.ndjson, append: false }}
"
        ),
        &logbus::catalog::registry(),
    );
    let report = start(&p, CancellationToken::new()).unwrap().wait().await;
    assert_eq!(report.totals.lost, 0, "{report}");
    let rows = report.stages.iter().find(|s| s.id == "rows").unwrap();
    assert_eq!(
        (rows.counts.routed, rows.counts.events_out),
        (1, 0),
        "{report}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("none.ndjson")).unwrap(),
        ""
    );
    let errors = std::fs::read_to_string(dir.path().join("errors.ndjson")).unwrap();
    let error: serde_json::Value = serde_json::from_str(errors.trim_end()).unwrap();
    assert_eq!(
        error["_error"]["message"],
        "refused: its row groups declare 5000 rows, more than max_rows (4999)"
    );
}

/// `sink: parquet` writes files that pyarrow reads (every event, with its
/// types and nulls); a second run numbers its files after the first's; raw
/// events are counted as errored.
#[ignore = "needs python3 with pyarrow (pip install pyarrow); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_files_we_write_read_in_pyarrow() {
    require_python("pyarrow");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let pipeline = |count: u64| {
        format!(
            "settings: {{ channel_capacity: 1024 }}
stages:
  gen: {{ source: generator, count: {count}, template: '{{\"seq\":{{{{seq}}}},\"msg\":\"m{{{{seq}}}}\",\"ok\":true,\"lat\":1.5,\"tags\":[\"a\"]}}' }}
  json: {{ parser: json, inputs: [gen] }}
  out: {{ sink: parquet, inputs: [json], path: '{d}/part-{{n}}.parquet', max_rows: 700 }}
"
        )
    };
    run(&pipeline(5000)).await;
    run(&pipeline(100)).await;
    let script = r#"
import glob, json, sys, pyarrow.parquet as pq
files = sorted(glob.glob(sys.argv[1] + "/part-*.parquet"))
rows = []
for f in files:
    rows.extend(pq.read_table(f).to_pylist())
print(json.dumps({"files": len(files), "rows": len(rows), "seqs": sorted(r["seq"] for r in rows)[:3],
                  "first": rows[0], "max_rows": max(pq.read_metadata(f).num_rows for f in files),
                  "tmp": len(glob.glob(sys.argv[1] + "/*.tmp"))}))
"#;
    let o = Command::new("python3")
        .args(["-c", script])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(got["rows"], 5100, "{got}");
    assert_eq!(got["seqs"], serde_json::json!([0, 0, 1]));
    assert_eq!(
        got["first"],
        serde_json::json!({"seq": 0, "msg": "m0", "ok": true, "lat": 1.5, "tags": ["a"]})
    );
    assert!(got["max_rows"].as_u64().unwrap() <= 700, "{got}");
    assert!(got["files"].as_u64().unwrap() >= 9, "{got}");
    assert_eq!(got["tmp"], 0);

    // Raw events cannot be rows: errored, counted, nothing lost.
    let p = valid(
        &format!(
            "stages:
  gen: {{ source: generator, count: 10 }}
  out: {{ sink: parquet, inputs: [gen], path: '{d}/raw-{{n}}.parquet' }}
"
        ),
        &logbus::catalog::registry(),
    );
    let report = start(&p, CancellationToken::new()).unwrap().wait().await;
    assert_eq!(
        (report.totals.errored, report.totals.lost),
        (10, 0),
        "{report}"
    );
}
