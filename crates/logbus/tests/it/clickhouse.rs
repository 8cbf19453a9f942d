//! `sink: clickhouse` through the `logbus` binary against the real server
//! of `.ci/services up clickhouse`: the shipped example end to end, read
//! back over the server's own HTTP interface.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::support::rss;

use logbus_test_services::clickhouse::{MODERN as URL, server, sql as sql_at};

/// `sql` on the modern server.
fn sql(sql: &str) -> String {
    sql_at(URL, sql)
}

/// The example on 2,000 lines: one in 100 is not JSON (to `not_json`), one
/// in 40 has a level the table's enum does not have (to `refused`, the
/// column named); every other line is a row, with its types.
#[ignore = "needs a ClickHouse server (.ci/services up clickhouse); run with --include-ignored"]
#[test]
fn the_example_ships_a_file_into_a_table_and_files_the_refusals() {
    server(URL);
    let dir = tempfile::tempdir().unwrap();
    let table = format!(
        "example_{}_{}",
        std::process::id(),
        logbus_plugin_api::now_ns()
    );
    sql(&format!(
        "CREATE TABLE {table} (ts DateTime64(3), service LowCardinality(String),
           level Enum8('debug' = 1, 'info' = 2, 'warn' = 3, 'error' = 4),
           status Nullable(UInt16), message String, user Map(String, String))
         ENGINE = MergeTree ORDER BY (service, ts)"
    ));
    let input = dir.path().join("app.ndjson");
    let mut f = std::fs::File::create(&input).unwrap();
    for i in 0..2000u32 {
        if i % 100 == 99 {
            writeln!(f, "not json {i}").unwrap();
            continue;
        }
        let level = if i % 40 == 3 {
            "fatal"
        } else {
            ["debug", "info", "warn", "error"][i as usize % 4]
        };
        let status = if i % 2 == 0 {
            format!("{}", 200 + i % 300)
        } else {
            "null".into()
        };
        writeln!(
            f,
            r#"{{"ts":"2026-11-30T05:00:{:02}.{:03}Z","service":"svc{}","level":"{level}","status":{status},"msg":"m{i}","user":{{"id":"u{i}"}}}}"#,
            i % 60,
            i % 1000,
            i % 3
        )
        .unwrap();
    }
    drop(f);
    let example = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/clickhouse/logs-to-clickhouse.yml");
    let refused = dir.path().join("refused.ndjson");
    let not_json = dir.path().join("not-json.ndjson");
    let o = Command::new(env!("CARGO_BIN_EXE_logbus"))
        .env("LOGBUS_LOG", "warn")
        .arg("run")
        .arg(&example)
        .env("CLICKHOUSE_URL", URL)
        .env("CLICKHOUSE_TABLE", &table)
        .env("LOGS_FILE", &input)
        .env("REFUSED_FILE", &refused)
        .env("NOT_JSON_FILE", &not_json)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lines = |p: &Path| -> Vec<Value> {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    assert_eq!(lines(&not_json).len(), 20);
    let refused: BTreeSet<String> = lines(&refused)
        .iter()
        .map(|r| {
            let reason = r["_error"]["message"].as_str().unwrap();
            assert!(
                reason.contains("column `level`: `fatal` is not one of the enum's names"),
                "{reason}"
            );
            r["msg"].as_str().unwrap().to_string()
        })
        .collect();
    let expected: BTreeSet<String> = (0..2000)
        .filter(|i| i % 40 == 3 && i % 100 != 99)
        .map(|i| format!("m{i}"))
        .collect();
    assert_eq!(refused, expected);
    let rows: Vec<Value> = sql(&format!(
        "SELECT ts, service, level, status, message, user FROM {table} ORDER BY message FORMAT JSONEachRow"
    ))
    .lines()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect();
    assert_eq!(rows.len(), 2000 - 20 - expected.len());
    let m0 = rows.iter().find(|r| r["message"] == "m0").unwrap();
    assert_eq!(
        m0,
        &serde_json::json!({"ts": "2026-11-30 05:00:00.000", "service": "svc0", "level": "debug",
                            "status": 200, "message": "m0", "user": {"id": "u0"}})
    );
    let m1 = rows.iter().find(|r| r["message"] == "m1").unwrap();
    assert_eq!(m1["status"], Value::Null);
}

/// The service examples have unit tests that pass and validate without a
/// warning (their runs need the servers: this file and opensearch.rs).
#[test]
fn the_service_examples_validate_and_pass_their_tests() {
    for example in [
        "clickhouse/logs-to-clickhouse.yml",
        "opensearch/logs-to-opensearch.yml",
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(example);
        for args in [&["test"][..], &["validate", "--deny-warnings"][..]] {
            let o = Command::new(env!("CARGO_BIN_EXE_logbus"))
                .args(args)
                .arg(&path)
                .output()
                .unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "{example} {args:?}: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}

/// The server frozen with SIGSTOP for a few seconds mid-run: inserts time
/// out and are retried, the generator is held back (the run cannot finish
/// meanwhile), resident memory stays within the in-flight bound, and once
/// the server resumes every row is there. Without `deduplicate`, an
/// insert the frozen server had taken before its answer timed out may be
/// stored twice (seen once: 4,096 extra rows; counted and printed); with
/// it, exactly once.
#[ignore = "needs a ClickHouse server (.ci/services up clickhouse); run with --include-ignored"]
#[test]
fn a_frozen_server_holds_the_pipeline_back_within_its_memory_bound() {
    for deduplicate in [false, true] {
        frozen_server_run(deduplicate);
    }
}

fn frozen_server_run(deduplicate: bool) {
    server(URL);
    let services = std::env::var("LOGBUS_SERVICES").unwrap_or("/var/tmp/logbus-services".into());
    let server_pid: i32 = std::fs::read_to_string(format!("{services}/run/clickhouse/pid"))
        .expect("the server's pid file (.ci/services up clickhouse)")
        .trim()
        .parse()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let table = format!(
        "frozen_{}_{}",
        std::process::id(),
        logbus_plugin_api::now_ns()
    );
    let window = if deduplicate {
        "SETTINGS non_replicated_deduplication_window = 1000"
    } else {
        ""
    };
    sql(&format!(
        "CREATE TABLE {table} (seq UInt64, pad String) ENGINE = MergeTree ORDER BY seq {window}"
    ));
    let n = 300_000u64;
    let pipeline = dir.path().join("p.yml");
    std::fs::write(
        &pipeline,
        format!(
            "settings: {{ channel_capacity: 1024 }}
stages:
  gen: {{ source: generator, count: {n}, template: '{{\"seq\":{{{{seq}}}},\"pad\":\"{pad}\"}}' }}
  json: {{ parser: json, inputs: [gen] }}
  ship:
    sink: clickhouse
    inputs: [json]
    url: {URL}
    table: {table}
    request_timeout_ms: 1000
    retry_initial_backoff_ms: 50
    retry_max_backoff_ms: 500
    deduplicate: {deduplicate}
",
            pad = "p".repeat(200)
        ),
    )
    .unwrap();
    let mut child = crate::support::Spawned::spawn(
        Command::new(env!("CARGO_BIN_EXE_logbus"))
            .env("LOGBUS_LOG", "warn")
            .arg("run")
            .arg(&pipeline)
            .stdout(std::process::Stdio::null()),
    );
    let pid = child.child.id();
    let began = std::time::Instant::now();
    while sql(&format!("SELECT count() FROM {table}")).trim() == "0" {
        assert!(began.elapsed().as_secs() < 60, "nothing stored");
    }
    let signal = |sig: &str| {
        assert!(
            Command::new("kill")
                .args([sig, &server_pid.to_string()])
                .status()
                .unwrap()
                .success()
        );
    };
    // No `validate --connect` probe runs against the server while it is frozen.
    let paused = logbus_test_services::pausing("clickhouse");
    signal("-STOP");
    let frozen = std::time::Instant::now();
    let mut peak = 0;
    while frozen.elapsed() < std::time::Duration::from_secs(5) {
        peak = peak.max(rss(pid));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let still_running = child.try_wait().is_none();
    signal("-CONT");
    drop(paused);
    assert!(
        still_running,
        "the run finished while the server was frozen"
    );
    let (status, err) = child.wait();
    assert!(status.success(), "{err}");
    assert!(
        err.contains("retrying"),
        "the frozen server was retried: {err}"
    );
    eprintln!("peak RSS while the server was frozen: {} MiB", peak >> 20);
    assert!(peak < 150 << 20, "peak RSS {} MiB", peak >> 20);
    let counted: Value = serde_json::from_str(&sql(&format!(
        "SELECT count() AS rows, uniqExact(seq) AS ids FROM {table} FORMAT JSONEachRow"
    )))
    .unwrap();
    // Every row is there. An insert the frozen server had taken before its
    // answer timed out is sent again, so a row may be there twice: counted,
    // not hidden.
    let ids: u64 = counted["ids"].as_str().unwrap().parse().unwrap();
    let rows: u64 = counted["rows"].as_str().unwrap().parse().unwrap();
    eprintln!("after the freeze (deduplicate: {deduplicate}): {rows} rows, {ids} distinct of {n}");
    assert_eq!(ids, n, "every event stored");
    if deduplicate {
        assert_eq!(rows, n, "each once");
    }
}
