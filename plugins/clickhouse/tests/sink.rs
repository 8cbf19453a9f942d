//! `sink: clickhouse` against real ClickHouse servers started by
//! `.ci/services up clickhouse clickhouse-old`: a modern one (24.10 on
//! 127.0.0.1:8123) and Debian's 18.16 (on 127.0.0.1:8124). Tables are
//! made and rows read back over the servers' own HTTP interface (Python's
//! urllib, JSONEachRow), not through LogBus. The tests that need a server
//! are ignored unless run with `--include-ignored` (CI does); then a
//! missing server fails them.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Arc;

use logbus_plugin_api::testing;
use logbus_plugin_api::{
    Event, Meta, Output, OutputRole, SinkContext, StageMetrics, Typed, channel,
};
use serde_json::{Value, json};

use logbus_test_services::clickhouse::{MODERN, OLD, count, rows, server, sql, table};

/// The test that restarts the modern server runs alone (writing); the
/// others share it (reading).
static SERVER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn event(v: Value) -> Event {
    Event::fields(v.as_object().unwrap().clone(), Meta::now("t".into()))
}

/// Runs the sink over `batches`; with `dead`, a stage reads `ship.dead`.
async fn run(
    options: Value,
    batches: Vec<Vec<Event>>,
    dead: bool,
) -> (Result<(), String>, Arc<StageMetrics>, Vec<Event>) {
    let sink = testing::sink(&Typed(logbus_clickhouse::sink::ClickHouseSink), options);
    let (tx, rx) = channel(100_000);
    let metrics = Arc::new(StageMetrics::default());
    let mut cx = SinkContext::new("ship", rx, metrics.clone());
    let (dead_tx, mut dead_rx) = channel(100_000);
    if dead {
        cx.dead = Output::new(vec![dead_tx], metrics.clone(), OutputRole::Errors);
    } else {
        drop(dead_tx);
    }
    let feeding = tokio::spawn(async move {
        for b in batches {
            if tx.send(b).await.is_err() {
                break;
            }
        }
    });
    let result = sink.run(&mut cx).await.map_err(|e| e.to_string());
    drop(cx);
    feeding.await.unwrap();
    let mut refused = Vec::new();
    while let Some(mut b) = dead_rx.recv().await {
        refused.extend(b.take());
    }
    (result, metrics, refused)
}

fn reason(e: &Event) -> String {
    e.as_fields().unwrap()["_error"]["message"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Every supported type through a modern server, read back as the server
/// shows it; columns the mapping leaves out get their defaults.
#[ignore = "needs a ClickHouse server (.ci/services up clickhouse); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_every_type_land_on_a_modern_server() {
    let url = server(MODERN);
    let _shared = SERVER.read().await;
    let t = table("types");
    sql(
        &url,
        &format!(
            "CREATE TABLE {t} (id UInt64, s String, lc LowCardinality(String), fs FixedString(4),
               i8 Int8, u16 UInt16, i64 Int64, f32 Float32, f64 Float64, b Bool,
               d Date, d32 Date32, dt DateTime, dt64 DateTime64(3), u UUID, ip4 IPv4, ip6 IPv6,
               e Enum8('info' = 1, 'warn' = 2), n Nullable(Int32), a Array(String),
               m Map(String, UInt32), nested Array(Nullable(UInt8)),
               defaulted String DEFAULT 'dflt', computed UInt64 MATERIALIZED id * 2)
             ENGINE = MergeTree ORDER BY id"
        ),
    );
    let n = 3000;
    let events: Vec<Event> = (0..n)
        .map(|i| {
            event(json!({
                "id": i, "msg": format!("message {i}"), "service": format!("svc{}", i % 4),
                "code": "ab", "small": -(i as i64 % 100), "port": 8000 + i % 1000,
                "big": -9_000_000_000_000i64 - i as i64, "ratio": 0.5, "precise": i as f64 / 8.0,
                "ok": i % 2 == 0, "day": "2026-05-01", "old_day": "1950-01-02",
                "at": "2026-05-01T10:00:00Z", "at_ms": 1_777_629_600_123u64 + i as u64,
                "uuid": "00112233-4455-6677-8899-aabbccddeeff", "ip": "10.0.0.1", "ip6": "::1",
                "level": if i % 3 == 0 { "warn" } else { "info" },
                "maybe": if i % 5 == 0 { Value::Null } else { json!(i) },
                "tags": ["a", format!("t{i}")], "counts": {"x": i, "y": 1},
                "holes": [1, null, 3],
            }))
        })
        .collect();
    let (result, metrics, _) = run(
        json!({"url": url, "table": t, "batch_max_events": 500, "columns": {
            "id": "id", "s": "msg", "lc": "service", "fs": "code", "i8": "small", "u16": "port",
            "i64": "big", "f32": "ratio", "f64": "precise", "b": "ok", "d": "day", "d32": "old_day",
            "dt": {"field": "at", "type": "DateTime"}, "dt64": {"field": "at_ms", "type": "DateTime64(3)"},
            "u": "uuid", "ip4": "ip", "ip6": "ip6", "e": "level", "n": "maybe", "a": "tags",
            "m": "counts", "nested": "holes",
        }}),
        events.chunks(700).map(|c| c.to_vec()).collect(),
        false,
    )
    .await;
    result.unwrap();
    assert_eq!(metrics.snapshot().events_out, n as u64);
    let back = rows(&url, &format!("SELECT *, computed FROM {t} ORDER BY id"));
    assert_eq!(back.len(), n);
    let r = &back[7];
    let expect = json!({
        "id": 7, "s": "message 7", "lc": "svc3", "fs": "ab\u{0}\u{0}", "i8": -7, "u16": 8007,
        "i64": -9_000_000_000_007i64, "f32": 0.5, "f64": 0.875, "b": false, "d": "2026-05-01",
        "d32": "1950-01-02", "dt": "2026-05-01 10:00:00", "dt64": "2026-05-01 10:00:00.130",
        "u": "00112233-4455-6677-8899-aabbccddeeff", "ip4": "10.0.0.1", "ip6": "::1",
        "e": "info", "n": 7, "a": ["a", "t7"], "m": {"x": 7, "y": 1}, "nested": [1, null, 3],
        "defaulted": "dflt", "computed": 14,
    });
    // UInt64 and Int64 come back as JSON strings by default.
    let norm = |v: &Value| -> Value {
        let mut v = v.clone();
        for k in ["id", "i64", "computed"] {
            if let Some(s) = v[k].as_str() {
                v[k] = json!(s.parse::<i64>().unwrap());
            }
        }
        v
    };
    assert_eq!(norm(r), expect);
    assert_eq!(back[5]["n"], Value::Null);
}

/// The old server (18.16, types it has), rows and a refused value.
#[ignore = "needs the old ClickHouse server (.ci/services up clickhouse-old); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_land_on_an_old_server() {
    let url = server(OLD);
    let t = table("old");
    sql(
        &url,
        &format!(
            "CREATE TABLE {t} (id UInt64, s String, dt DateTime, d Date, n Nullable(Int32),
               a Array(String), e Enum8('info' = 1, 'warn' = 2), small UInt8)
             ENGINE = MergeTree ORDER BY id"
        ),
    );
    let events: Vec<Event> = (0..2000)
        .map(|i| {
            event(json!({
                "id": i, "s": format!("m{i}"), "dt": "2026-05-01T10:00:00Z", "d": "2026-05-01",
                "n": if i % 2 == 0 { Value::Null } else { json!(i) }, "a": ["x"],
                "e": "warn", "small": if i % 100 == 3 { json!(999) } else { json!(i % 200) },
            }))
        })
        .collect();
    let (result, metrics, refused) = run(json!({"url": url, "table": t}), vec![events], true).await;
    result.unwrap();
    assert_eq!(refused.len(), 20);
    assert!(
        reason(&refused[0]).contains("column `small`: 999 does not fit UInt8"),
        "{}",
        reason(&refused[0])
    );
    assert_eq!(metrics.snapshot().events_out, 1980);
    let back = rows(
        &url,
        &format!("SELECT id, s, dt, n, e FROM {t} ORDER BY id"),
    );
    assert_eq!(back.len(), 1980);
    assert_eq!(
        back[1],
        json!({"id": "1", "s": "m1", "dt": "2026-05-01 10:00:00", "n": 1, "e": "warn"})
    );
}

/// A value that does not fit its column is that event's error, naming
/// the column; a row the server refuses (a constraint) is found by
/// splitting the batch: exactly the refused rows go to `ship.dead` with
/// the server's message, every other row is stored.
#[ignore = "needs a ClickHouse server (.ci/services up clickhouse); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_values_and_rows_go_to_dead_and_the_rest_is_stored() {
    let url = server(MODERN);
    let _shared = SERVER.read().await;
    let t = table("refused");
    sql(
        &url,
        &format!(
            "CREATE TABLE {t} (id UInt64, small UInt8, n Int64, CONSTRAINT below CHECK n < 1000000)
             ENGINE = MergeTree ORDER BY id"
        ),
    );
    let n = 2000u64;
    let bad_value = |i: u64| i % 250 == 11;
    let bad_row = |i: u64| [5, 777, 1999].contains(&i);
    let events: Vec<Event> = (0..n)
        .map(|i| {
            event(json!({
                "id": i,
                "small": if bad_value(i) { json!("lots") } else { json!(i % 256) },
                "n": if bad_row(i) { 5_000_000 } else { i as i64 },
            }))
        })
        .collect();
    let (result, metrics, refused) = run(
        json!({"url": url, "table": t, "batch_max_events": 1000}),
        vec![events],
        true,
    )
    .await;
    result.unwrap();
    let mut by_value = BTreeSet::new();
    let mut by_server = BTreeSet::new();
    for e in &refused {
        let id = e.as_fields().unwrap()["id"].as_u64().unwrap();
        let why = reason(e);
        if why.contains("column `small`") {
            assert!(why.contains("\"lots\" is not an unsigned integer"), "{why}");
            by_value.insert(id);
        } else {
            assert!(why.contains("Code: 469") && why.contains("below"), "{why}");
            by_server.insert(id);
        }
    }
    assert_eq!(by_value, (0..n).filter(|&i| bad_value(i)).collect());
    assert_eq!(by_server, (0..n).filter(|&i| bad_row(i)).collect());
    let stored: BTreeSet<u64> = rows(&url, &format!("SELECT id FROM {t}"))
        .iter()
        .map(|r| r["id"].as_str().unwrap().parse().unwrap())
        .collect();
    let expected: BTreeSet<u64> = (0..n).filter(|&i| !bad_value(i) && !bad_row(i)).collect();
    assert_eq!(stored, expected);
    assert_eq!(metrics.snapshot().events_out, expected.len() as u64);
}

/// The mapping is checked against `DESCRIBE TABLE` before anything is
/// sent: each disagreement fails the stage naming the column.
#[ignore = "needs a ClickHouse server (.ci/services up clickhouse); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mapping_is_checked_against_the_table_at_start() {
    let url = server(MODERN);
    let _shared = SERVER.read().await;
    let t = table("checked");
    sql(
        &url,
        &format!(
            "CREATE TABLE {t} (id UInt64, message String, price Decimal(10, 2), c UInt64 MATERIALIZED id)
             ENGINE = MergeTree ORDER BY id"
        ),
    );
    for (columns, expected) in [
        (
            json!({"id": "id", "mesage": "msg"}),
            "column `mesage` is not in the table (its columns: id, message, price, c); did you mean `message`?",
        ),
        (
            json!({"id": {"type": "UInt32"}}),
            "column `id`: the mapping says UInt32, the table has UInt64",
        ),
        (
            json!({"price": "p"}),
            "column `price`: type `Decimal(10, 2)` is not supported",
        ),
        (json!({"c": "x"}), "column `c` is MATERIALIZED"),
    ] {
        let (result, metrics, _) = run(
            json!({"url": url, "table": t, "columns": columns}),
            vec![vec![event(json!({"id": 1}))]],
            false,
        )
        .await;
        let err = result.unwrap_err();
        assert!(err.contains(expected), "{expected}\n{err}");
        assert!(err.contains(&format!("table default.{t}")), "{err}");
        assert_eq!(metrics.snapshot().events_out, 0);
    }
    // Without a mapping, every column is taken — and one LogBus cannot
    // write is named.
    let (result, ..) = run(json!({"url": url, "table": t}), vec![], false).await;
    assert!(result.unwrap_err().contains("column `price`"));
    // A table that does not exist is named with the server's message.
    let (result, ..) = run(json!({"url": url, "table": "no_such_table"}), vec![], false).await;
    let err = result.unwrap_err();
    assert!(
        err.contains("no_such_table") && err.contains("DESCRIBE TABLE failed"),
        "{err}"
    );
}

/// The server restarted mid-run: inserts fail while it is down and are
/// retried; every row is stored (exactly once here: an insert either
/// landed whole or not at all).
#[ignore = "needs a ClickHouse server (.ci/services up clickhouse); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_mid_run_loses_nothing() {
    let url = server(MODERN);
    let _alone = SERVER.write().await;
    let t = table("restart");
    sql(
        &url,
        &format!("CREATE TABLE {t} (id UInt64, s String) ENGINE = MergeTree ORDER BY id"),
    );
    let n = 200_000u64;
    let batches: Vec<Vec<Event>> = (0..n / 1000)
        .map(|b| {
            (b * 1000..(b + 1) * 1000)
                .map(|i| event(json!({"id": i, "s": "x".repeat(200)})))
                .collect()
        })
        .collect();
    let sending = tokio::spawn(run(
        json!({"url": url, "table": t, "batch_max_events": 1000, "batch_timeout_ms": 50,
               "retry_initial_backoff_ms": 50, "retry_max_backoff_ms": 500}),
        batches,
        false,
    ));
    // Restart once some rows are in.
    loop {
        let stored = count(&url, &t);
        if stored > 0 {
            assert!(stored < n, "finished before the restart");
            break;
        }
    }
    let services = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.ci/services");
    let o = Command::new(&services)
        .args(["restart", "clickhouse"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (result, metrics, _) = sending.await.unwrap();
    result.unwrap();
    assert_eq!(metrics.snapshot().events_out, n);
    let retried = metrics.snapshot().retried;
    eprintln!("events retried across the restart: {retried}");
    assert!(retried > 0, "the restart must have failed some inserts");
    let counted = rows(
        &url,
        &format!("SELECT count() AS rows, uniqExact(id) AS ids FROM {t}"),
    );
    eprintln!("after a restart mid-run: {}", counted[0]);
    assert_eq!(
        counted[0]["ids"]
            .as_str()
            .map(|s| s.parse::<u64>().unwrap()),
        Some(n)
    );
    assert_eq!(
        counted[0]["rows"]
            .as_str()
            .map(|s| s.parse::<u64>().unwrap()),
        Some(n)
    );
}

/// Nothing listening where the options say: the stage retries the
/// table's description, then fails naming the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_named() {
    let (result, ..) = run(
        json!({"url": "http://127.0.0.1:1", "table": "t", "retry_max_attempts": 2,
               "retry_initial_backoff_ms": 10}),
        vec![vec![event(json!({"id": 1}))]],
        false,
    )
    .await;
    let err = result.unwrap_err();
    assert!(err.contains("http://127.0.0.1:1"), "{err}");
    assert!(err.contains("DESCRIBE TABLE failed"), "{err}");
}

#[test]
fn bad_options_are_named() {
    let plugin = Typed(logbus_clickhouse::sink::ClickHouseSink);
    let err = testing::option_errors(
        &plugin,
        json!({"url": "localhost:8123", "table": "t", "in_flight": 0,
               "columns": {"a": {"field": "x..y"}, "b": {"type": "Decimal(1,2)"}}}),
    );
    for expected in ["url", "in_flight", "columns.a", "columns.b.type"] {
        assert!(err.contains(expected), "{expected}: {err}");
    }
    // A scheme with nothing after it names no server.
    let err = testing::option_errors(&plugin, json!({"url": "http://", "table": "t"}));
    assert!(
        err.contains("`http://` is not an http:// or https:// URL"),
        "{err}"
    );
    // Read when the stage is built, where it runs: validation cannot know.
    let err = testing::build_errors(
        &plugin,
        json!({"url": "http://h:8123", "table": "t", "username": "u",
               "password_env": "LOGBUS_TEST_SURELY_UNSET"}),
    );
    assert!(
        err.contains("`LOGBUS_TEST_SURELY_UNSET` is not set"),
        "{err}"
    );
}

/// A loopback proxy in front of the real server that loses the answer to
/// the first insert: it forwards the request, and when the server's answer
/// starts (the server has stored the rows by then) it closes both sides.
/// Every later connection is forwarded whole. Returns its port.
fn proxy_losing_the_first_answer(upstream: &str) -> u16 {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let upstream = upstream.trim_start_matches("http://").to_string();
    let lost = Arc::new(AtomicBool::new(false));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let Ok(mut server) = TcpStream::connect(&upstream) else {
                return;
            };
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            // Whether the request in flight on this connection is an insert.
            let inserting = Arc::new(AtomicBool::new(false));
            let noted = inserting.clone();
            // Client → server, as it comes.
            std::thread::spawn(move || {
                let mut buf = [0u8; 64 * 1024];
                loop {
                    let n = match c2.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if buf[..n].starts_with(b"POST ") {
                        let head = String::from_utf8_lossy(&buf[..n.min(2048)]).to_uppercase();
                        noted.store(head.contains("INSERT"), Ordering::SeqCst);
                    }
                    if s2.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = s2.shutdown(std::net::Shutdown::Write);
            });
            let lost = lost.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 64 * 1024];
                while let Ok(n) = server.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let is_insert_answer =
                        buf[..n].starts_with(b"HTTP/1.1 200") && inserting.load(Ordering::SeqCst);
                    if is_insert_answer && !lost.swap(true, Ordering::SeqCst) {
                        let _ = client.shutdown(std::net::Shutdown::Both);
                        let _ = server.shutdown(std::net::Shutdown::Both);
                        break;
                    }
                    if client.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// The answer to an insert is lost after the server stored it, and the
/// insert is sent again; the same 100 events then come a second time (a
/// legitimate repeat, as identical heartbeat lines would be). Without
/// `deduplicate` the lost answer stores the first batch twice (300 rows).
/// With it, on a table with a deduplication window, the retry is dropped
/// by its token while the repeat, under its own token, is kept (200 rows)
/// — a window without tokens would drop the repeat too, by its checksum.
#[ignore = "needs a ClickHouse server (.ci/services up clickhouse); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_duplicates_unless_inserts_carry_a_deduplication_token() {
    let url = server(MODERN);
    let _shared = SERVER.read().await;
    for (deduplicate, expected) in [(false, 300), (true, 200)] {
        let t = table("lost_answer");
        let window = if deduplicate {
            "SETTINGS non_replicated_deduplication_window = 100"
        } else {
            ""
        };
        sql(
            &url,
            &format!("CREATE TABLE {t} (id UInt64) ENGINE = MergeTree ORDER BY id {window}"),
        );
        let port = proxy_losing_the_first_answer(&url);
        let batch: Vec<Event> = (0..100).map(|i| event(json!({"id": i}))).collect();
        let (result, metrics, _) = run(
            json!({"url": format!("http://127.0.0.1:{port}"), "table": t,
                   "deduplicate": deduplicate, "retry_initial_backoff_ms": 10,
                   "batch_max_events": 100, "in_flight": 1}),
            vec![batch.clone(), batch],
            false,
        )
        .await;
        result.unwrap();
        assert_eq!(metrics.snapshot().events_out, 200);
        assert!(
            metrics.snapshot().retried >= 100,
            "the insert was sent again"
        );
        let counted = rows(
            &url,
            &format!("SELECT count() AS rows, uniqExact(id) AS ids FROM {t}"),
        );
        let n = |k: &str| counted[0][k].as_str().unwrap().parse::<u64>().unwrap();
        assert_eq!(n("ids"), 100, "deduplicate: {deduplicate}");
        assert_eq!(n("rows"), expected, "deduplicate: {deduplicate}");
    }
}

/// `deduplicate` on a table that keeps no tokens (a plain MergeTree
/// without `non_replicated_deduplication_window`) fails the stage at start
/// naming the setting, before a row is written; with the window it runs.
#[ignore = "needs a ClickHouse server (.ci/services up clickhouse); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deduplicate_on_a_table_that_keeps_no_tokens_is_refused_at_start() {
    let url = server(MODERN);
    let _shared = SERVER.read().await;
    let t = table("no_window");
    sql(
        &url,
        &format!("CREATE TABLE {t} (id UInt64) ENGINE = MergeTree ORDER BY id"),
    );
    let batch: Vec<Event> = (0..10).map(|i| event(json!({"id": i}))).collect();
    let (result, metrics, _) = run(
        json!({"url": url, "table": t, "deduplicate": true}),
        vec![batch.clone()],
        false,
    )
    .await;
    let err = result.unwrap_err();
    assert!(
        err.contains("non_replicated_deduplication_window") && err.contains(&t),
        "{err}"
    );
    assert_eq!(metrics.snapshot().events_out, 0);
    assert_eq!(count(&url, &t), 0);
    sql(
        &url,
        &format!("ALTER TABLE {t} MODIFY SETTING non_replicated_deduplication_window = 100"),
    );
    let (result, metrics, _) = run(
        json!({"url": url, "table": t, "deduplicate": true}),
        vec![batch],
        false,
    )
    .await;
    result.unwrap();
    assert_eq!(metrics.snapshot().events_out, 10);
    assert_eq!(count(&url, &t), 10);
}

/// `https://` to the server's TLS port (a private CA made by
/// `.ci/services up clickhouse`): rows land with `tls.ca_file`; without
/// it the certificate is refused and the stage fails saying so.
#[ignore = "needs a ClickHouse server (.ci/services up clickhouse); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_private_ca() {
    let url = server(MODERN);
    let _shared = SERVER.read().await;
    let services = std::env::var("LOGBUS_SERVICES").unwrap_or("/var/tmp/logbus-services".into());
    let ca = format!("{services}/run/clickhouse/tls/ca.pem");
    let t = table("tls");
    sql(
        &url,
        &format!("CREATE TABLE {t} (id UInt64, s String) ENGINE = MergeTree ORDER BY id"),
    );
    let events = || -> Vec<Event> {
        (0..500)
            .map(|i| event(json!({"id": i, "s": format!("over tls {i}")})))
            .collect()
    };
    let (result, metrics, _) = run(
        json!({"url": "https://localhost:8443", "table": t, "tls": {"ca_file": ca}}),
        vec![events()],
        false,
    )
    .await;
    result.unwrap();
    assert_eq!(metrics.snapshot().events_out, 500);
    let counted = rows(&url, &format!("SELECT count() AS n FROM {t}"));
    assert_eq!(counted[0]["n"], "500");
    let (result, ..) = run(
        json!({"url": "https://localhost:8443", "table": t,
               "retry_max_attempts": 1, "retry_initial_backoff_ms": 10}),
        vec![events()],
        false,
    )
    .await;
    let err = result.unwrap_err();
    assert!(err.to_lowercase().contains("certificate"), "{err}");
}

/// An insert the server refuses for a reason that is not the rows' (here
/// the table is gone: `UNKNOWN_TABLE`) is retried, not sent to `dead`:
/// once the table is back, the rows land.
#[ignore = "needs a ClickHouse server (.ci/services up clickhouse); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_refused_for_a_reason_not_in_the_rows_is_retried() {
    let url = server(MODERN);
    let _shared = SERVER.read().await;
    let t = table("dropped");
    let create = format!("CREATE TABLE {t} (id UInt64) ENGINE = MergeTree ORDER BY id");
    sql(&url, &create);
    let sink = testing::sink(
        &Typed(logbus_clickhouse::sink::ClickHouseSink),
        json!({"url": url, "table": t, "batch_max_events": 10, "batch_timeout_ms": 10,
               "retry_initial_backoff_ms": 20, "retry_max_backoff_ms": 100}),
    );
    let (tx, rx) = channel(100);
    let metrics = Arc::new(StageMetrics::default());
    let mut cx = SinkContext::new("ship", rx, metrics.clone());
    let (dead_tx, mut dead_rx) = channel(100);
    cx.dead = Output::new(vec![dead_tx], metrics.clone(), OutputRole::Errors);
    let running = tokio::spawn(async move {
        let result = sink.run(&mut cx).await.map_err(|e| e.to_string());
        drop(cx);
        result
    });
    let batch = |ids: std::ops::Range<u64>| -> Vec<Event> {
        ids.map(|i| event(json!({ "id": i }))).collect()
    };
    tx.send(batch(0..10)).await.unwrap();
    let began = std::time::Instant::now();
    while count(&url, &t) < 10 {
        assert!(
            began.elapsed().as_secs() < 30,
            "the first rows never landed"
        );
    }
    sql(&url, &format!("DROP TABLE {t} SYNC"));
    tx.send(batch(10..20)).await.unwrap();
    while metrics.snapshot().retried == 0 {
        assert_eq!(metrics.snapshot().routed, 0, "the rows were sent to dead");
        assert!(
            began.elapsed().as_secs() < 30,
            "the refused insert was not retried: {:?}",
            metrics.snapshot()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    sql(&url, &create);
    drop(tx);
    running.await.unwrap().unwrap();
    let mut refused = Vec::new();
    while let Some(mut b) = dead_rx.recv().await {
        refused.extend(b.take());
    }
    assert!(refused.is_empty(), "sent to dead: {}", refused.len());
    let ids = rows(
        &url,
        &format!("SELECT min(id) AS lo, max(id) AS hi, count() AS n FROM {t}"),
    );
    assert_eq!(ids[0]["lo"], "10", "{ids:?}");
    assert_eq!(ids[0]["hi"], "19", "{ids:?}");
    assert_eq!(ids[0]["n"], "10", "{ids:?}");
    assert_eq!(metrics.snapshot().events_out, 20);
}

/// `validate --connect`: a missing table is found at `table`; on a real
/// one, the columns no arriving field fills and the arriving fields no
/// column stores are found.
#[ignore = "needs a ClickHouse server (.ci/services up clickhouse); run with --include-ignored"]
#[tokio::test]
async fn the_probe_describes_the_table_against_the_arriving_fields() {
    let url = server(MODERN);
    let name = table("probe");
    sql(
        &url,
        &format!(
            "CREATE TABLE {name} (level String, msg String) ENGINE = MergeTree ORDER BY level"
        ),
    );
    let plugin = Typed(logbus_clickhouse::sink::ClickHouseSink);
    let missing = testing::probe(
        &plugin,
        json!({ "url": url, "table": "no_such_table_here" }),
        None,
    )
    .await;
    assert_eq!(missing, ["table service-missing"]);
    let arriving = logbus_plugin_api::ArrivingFields {
        fields: [
            ("level".to_string(), logbus_plugin_api::FieldType::String),
            ("code".to_string(), logbus_plugin_api::FieldType::String),
        ]
        .into(),
        open: false,
        known: true,
    };
    let found = testing::probe(
        &plugin,
        json!({ "url": url, "table": name }),
        Some(arriving.clone()),
    )
    .await;
    assert_eq!(
        found,
        ["table column-not-produced", "table field-not-stored"]
    );
    let unknown = testing::probe(&plugin, json!({ "url": url, "table": name }), None).await;
    assert!(unknown.is_empty(), "{unknown:?}");
}
