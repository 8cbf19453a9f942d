//! `sink: otlp` against real receivers on loopback: LogBus's own OTLP
//! source over both transports (the events come back field by field),
//! and the OpenTelemetry Collector (`.ci/services up otel`: OTLP receiver
//! on 127.0.0.1:4327/4328, file exporter), whose output is read back.

use std::sync::Arc;
use std::time::Duration;

use logbus_plugin_api::testing::{self, RunningSource};
use logbus_plugin_api::{Event, Meta, Typed};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use serde_json::{Value, json};

use logbus_test_ports::free_port;

async fn receiver(grpc: u16, http: u16, capacity: usize) -> RunningSource {
    let source = testing::run_source(
        testing::source(
            &Typed(logbus_otlp::source::OtlpSource),
            json!({"grpc_address": format!("127.0.0.1:{grpc}"), "http_address": format!("127.0.0.1:{http}")}),
        ),
        capacity,
    );
    for port in [grpc, http] {
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    source
}

fn sink(options: Value) -> Box<dyn logbus_plugin_api::Sink> {
    testing::sink(&Typed(logbus_otlp::sink::OtlpSink), options)
}

/// Events as `source: otlp` makes them (two resources, a trace context,
/// nested values), plus one plain event and one raw line.
fn events() -> Vec<Event> {
    let mut out = Vec::new();
    for i in 0..40u64 {
        let service = if i % 2 == 0 { "api" } else { "db" };
        let mut f = json!({
            "body": {"msg": format!("event {i}"), "n": i, "list": [1, "two", {"three": 3.5}]},
            "severity_number": 13, "severity_text": "WARN",
            "time_unix_nano": 1796168975000000000u64 + i,
            "observed_time_unix_nano": 1796168975000000500u64 + i,
            "timestamp": logbus_otlp::model::rfc3339(1796168975000000000u64 + i),
            "attributes": {"i": i, "ok": true},
            "resource": {"service.name": service},
            "scope": {"name": "lib", "version": "1.0"}
        });
        if i == 3 {
            f["trace_id"] = json!("5b8efff798038103d269b633813fc60c");
            f["span_id"] = json!("eee19b7ec3c1b174");
            f["flags"] = json!(1);
        }
        out.push(Event::fields(
            f.as_object().unwrap().clone(),
            Meta::now("t".into()),
        ));
    }
    let plain = json!({"message": "plain", "level": "error", "user": "ann"});
    out.push(Event::fields(
        plain.as_object().unwrap().clone(),
        Meta::now("t".into()),
    ));
    out.push(Event::raw("a raw line", Meta::now("t".into())));
    out
}

fn by_body(events: Vec<Event>) -> Vec<serde_json::Map<String, Value>> {
    let mut got: Vec<_> = events
        .iter()
        .filter_map(|e| e.as_fields().cloned())
        .collect();
    got.sort_by_key(|f| f.get("body").map(Value::to_string));
    got
}

async fn round_trip(protocol: &str) {
    let (grpc, http) = (free_port(), free_port());
    let mut b = receiver(grpc, http, 1000).await;
    let endpoint = match protocol {
        "grpc" => format!("http://127.0.0.1:{grpc}"),
        _ => format!("http://127.0.0.1:{http}"),
    };
    let sent = events();
    let want = by_body(sent.iter().map(|e| e.detached()).collect());
    let (result, metrics) = testing::run_sink(
        sink(
            json!({"endpoint": endpoint, "protocol": protocol, "batch_max_events": 7,
                    "headers": {"x-api-key": "secret"}}),
        ),
        vec![sent],
    )
    .await;
    result.unwrap();
    assert_eq!(metrics.snapshot().events_out, 42);
    let got = by_body(testing::take(&mut b.rx, 42).await);
    assert_eq!(got.len(), 42);
    // An event that came over OTLP comes back as it was.
    let over_otlp: Vec<_> = want.iter().filter(|w| w.contains_key("resource")).collect();
    assert_eq!(over_otlp.len(), 40);
    for w in over_otlp {
        let g = got.iter().find(|g| g["body"] == w["body"]).unwrap();
        assert_eq!(g, w, "{protocol}");
    }
    let plain = got.iter().find(|f| f["body"] == "plain").unwrap();
    assert_eq!(plain["severity_text"], "error");
    assert_eq!(plain["severity_number"], 17);
    assert_eq!(plain["attributes"], json!({"user": "ann"}));
    assert!(plain["observed_time_unix_nano"].as_u64().unwrap() > 0);
    let raw = got.iter().find(|f| f["body"] == "a raw line").unwrap();
    assert_eq!(raw["attributes"], json!({}));
    b.stop().await.unwrap();
}

/// LogBus → LogBus over OTLP/gRPC: every event back, field by field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logbus_to_logbus_over_grpc_keeps_every_field() {
    round_trip("grpc").await;
}

/// The same over OTLP/HTTP (protobuf, gzip).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logbus_to_logbus_over_http_keeps_every_field() {
    round_trip("http").await;
}

/// A receiver that is down when the sink starts, then comes up, then is
/// stopped and started again mid-run: the sink retries and every event
/// arrives (at least once: a request cut by the stop may be sent again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_at_start_and_restarted_mid_run_loses_nothing() {
    for protocol in ["grpc", "http"] {
        let (grpc, http) = (free_port(), free_port());
        let endpoint = match protocol {
            "grpc" => format!("http://127.0.0.1:{grpc}"),
            _ => format!("http://127.0.0.1:{http}"),
        };
        let s = sink(
            json!({"endpoint": endpoint, "protocol": protocol, "batch_max_events": 10,
                            "batch_timeout_ms": 10, "in_flight": 1,
                            "request_timeout_ms": 500,
                            "retry_initial_backoff_ms": 20, "retry_max_backoff_ms": 200}),
        );
        let (tx, rx) = logbus_plugin_api::channel(1000);
        let metrics = Arc::new(logbus_plugin_api::StageMetrics::default());
        let mut cx = logbus_plugin_api::SinkContext::new("otlp", rx, metrics.clone());
        let run = tokio::spawn(async move { s.run(&mut cx).await });
        let batch = |range: std::ops::Range<u64>| -> Vec<Event> {
            range
                .map(|i| {
                    let f = json!({"body": format!("{i:04}")});
                    Event::fields(f.as_object().unwrap().clone(), Meta::now("t".into()))
                })
                .collect()
        };
        tx.send(batch(0..100)).await.unwrap();
        // Nobody listens yet: the sink retries.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            metrics.snapshot().retried > 0,
            "{protocol}: retried while down"
        );
        let mut b = receiver(grpc, http, 10_000).await;
        let mut seen = std::collections::BTreeSet::new();
        while seen.len() < 100 {
            for e in testing::take(&mut b.rx, 1).await {
                seen.insert(e.as_fields().unwrap()["body"].as_str().unwrap().to_string());
            }
        }
        b.stop().await.unwrap();
        tx.send(batch(100..200)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut b = receiver(grpc, http, 10_000).await;
        drop(tx);
        while seen.len() < 200 {
            for e in testing::take(&mut b.rx, 1).await {
                seen.insert(e.as_fields().unwrap()["body"].as_str().unwrap().to_string());
            }
        }
        run.await.unwrap().unwrap();
        assert_eq!(metrics.snapshot().events_out, 200, "{protocol}");
        let want: std::collections::BTreeSet<String> =
            (0..200).map(|i| format!("{i:04}")).collect();
        assert_eq!(seen, want, "{protocol}");
        b.stop().await.unwrap();
    }
}

/// A request the receiver refuses for good (more records than it takes)
/// is not retried: with `on_rejected: fail` the stage ends naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_is_not_retried() {
    let grpc = free_port();
    let b = testing::run_source(
        testing::source(
            &Typed(logbus_otlp::source::OtlpSource),
            json!({"grpc_address": format!("127.0.0.1:{grpc}"), "max_records_per_request": 5}),
        ),
        100,
    );
    while std::net::TcpStream::connect(("127.0.0.1", grpc)).is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (result, metrics) = testing::run_sink(
        sink(json!({"endpoint": format!("http://127.0.0.1:{grpc}"), "batch_max_events": 10})),
        vec![events()],
    )
    .await;
    let e = result.unwrap_err().to_string();
    assert!(
        e.contains("ResourceExhausted") && e.contains("max_records_per_request"),
        "{e}"
    );
    assert_eq!(metrics.snapshot().retried, 0);
    b.stop().await.unwrap();
}

/// The OpenTelemetry Collector's OTLP receiver takes what the sink sends
/// over both transports; its file exporter's output holds each record
/// with resource, scope, severity, attributes and trace context.
#[ignore = "needs an OpenTelemetry Collector (.ci/services up otel); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collector_receives_every_record() {
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", 4327)).is_ok(),
        "an OpenTelemetry Collector on 127.0.0.1:4327 is required (.ci/services up otel)"
    );
    let services =
        std::env::var("LOGBUS_SERVICES").unwrap_or_else(|_| "/var/tmp/logbus-services".into());
    let file = format!("{services}/run/otel/logs.jsonl");
    let run_id = format!("{}-{}", std::process::id(), logbus_plugin_api::now_ns());
    for (protocol, endpoint) in [
        ("grpc", "http://127.0.0.1:4327"),
        ("http", "http://127.0.0.1:4328"),
    ] {
        let events: Vec<Event> = (0..25)
            .map(|i| {
                let mut f = json!({"body": format!("{run_id} {protocol} {i}"), "severity_text": "INFO",
                    "attributes": {"i": i}, "resource": {"service.name": "logbus-test"},
                    "scope": {"name": "t"}});
                if i == 0 {
                    f["trace_id"] = json!("5b8efff798038103d269b633813fc60c");
                    f["span_id"] = json!("eee19b7ec3c1b174");
                }
                Event::fields(f.as_object().unwrap().clone(), Meta::now("t".into()))
            })
            .collect();
        let (result, _) = testing::run_sink(
            sink(json!({"endpoint": endpoint, "protocol": protocol, "batch_max_events": 10})),
            vec![events],
        )
        .await;
        result.unwrap();
    }
    // The exporter flushes every 100 ms.
    let mut records: Vec<Value> = Vec::new();
    for _ in 0..100 {
        records.clear();
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            for rl in v["resourceLogs"].as_array().into_iter().flatten() {
                for sl in rl["scopeLogs"].as_array().into_iter().flatten() {
                    for r in sl["logRecords"].as_array().into_iter().flatten() {
                        if r["body"]["stringValue"]
                            .as_str()
                            .is_some_and(|b| b.starts_with(&run_id))
                        {
                            let mut r = r.clone();
                            r["_resource"] = rl["resource"].clone();
                            r["_scope"] = sl["scope"].clone();
                            records.push(r);
                        }
                    }
                }
            }
        }
        if records.len() >= 50 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(records.len(), 50, "{file}");
    for protocol in ["grpc", "http"] {
        let first = records
            .iter()
            .find(|r| r["body"]["stringValue"] == format!("{run_id} {protocol} 0"))
            .unwrap();
        assert_eq!(first["severityText"], "INFO");
        assert_eq!(first["severityNumber"], 9);
        assert_eq!(first["traceId"], "5b8efff798038103d269b633813fc60c");
        assert_eq!(first["spanId"], "eee19b7ec3c1b174");
        assert_eq!(first["attributes"][0]["key"], "i");
        assert_eq!(
            first["_resource"]["attributes"][0]["value"]["stringValue"],
            "logbus-test"
        );
        assert_eq!(first["_scope"]["name"], "t");
    }
}

/// UNAVAILABLE with a RetryInfo delay (the receiving LogBus is full) is
/// retried, not before the delay the receiver asked for, and then
/// delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_with_retry_info_is_retried_after_its_delay() {
    let grpc = free_port();
    let mut b = testing::run_source(
        testing::source(
            &Typed(logbus_otlp::source::OtlpSource),
            json!({"grpc_address": format!("127.0.0.1:{grpc}"), "max_concurrent_requests": 1,
                   "accept_timeout_ms": 50, "retry_after_secs": 1}),
        ),
        // Room for one batch: the second waits in the pipeline holding the
        // only slot, the third is refused.
        5,
    );
    while std::net::TcpStream::connect(("127.0.0.1", grpc)).is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let events: Vec<Event> = (0..15)
        .map(|i| {
            let f = json!({"body": format!("{i:02}")});
            Event::fields(f.as_object().unwrap().clone(), Meta::now("t".into()))
        })
        .collect();
    let began = std::time::Instant::now();
    let sending = tokio::spawn(testing::run_sink(
        sink(
            json!({"endpoint": format!("http://127.0.0.1:{grpc}"), "batch_max_events": 5,
                    "batch_timeout_ms": 10, "in_flight": 2, "retry_initial_backoff_ms": 10,
                    "retry_max_backoff_ms": 5000}),
        ),
        vec![events],
    ));
    // Nothing is read for a while: the first batch fills the channel, the
    // second waits in the pipeline holding the only slot, the third is
    // refused with RetryInfo.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = testing::take(&mut b.rx, 15).await;
    let (result, metrics) = sending.await.unwrap();
    result.unwrap();
    assert!(
        metrics.snapshot().retried >= 1,
        "the refused batch was retried"
    );
    assert!(
        began.elapsed() >= Duration::from_secs(1),
        "the retry waited the receiver's RetryInfo delay (1 s), not its own ~10 ms backoff"
    );
    let mut bodies: Vec<String> = got
        .iter()
        .map(|e| e.as_fields().unwrap()["body"].as_str().unwrap().to_string())
        .collect();
    bodies.sort();
    assert_eq!(
        bodies,
        (0..15).map(|i| format!("{i:02}")).collect::<Vec<_>>()
    );
    b.stop().await.unwrap();
}

/// `body_field`, `severity_field`, `time_field` pick the record's body,
/// severity and time from other fields; those fields are not repeated as
/// attributes, the rest are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mapping_fields_can_be_named() {
    let (grpc, http) = (free_port(), free_port());
    let mut b = receiver(grpc, http, 100).await;
    let f = json!({"text": "disk full", "sev": "warning", "when": "2026-12-01T10:00:00.5Z",
                   "message": "kept as an attribute", "host": "n1"});
    let (result, _) = testing::run_sink(
        sink(
            json!({"endpoint": format!("http://127.0.0.1:{grpc}"), "body_field": "text",
                    "severity_field": "sev", "time_field": "when"}),
        ),
        vec![vec![Event::fields(
            f.as_object().unwrap().clone(),
            Meta::now("t".into()),
        )]],
    )
    .await;
    result.unwrap();
    let got = testing::take(&mut b.rx, 1).await;
    let g = got[0].as_fields().unwrap();
    assert_eq!(g["body"], "disk full");
    assert_eq!(g["severity_text"], "warning");
    assert_eq!(g["severity_number"], 13);
    assert_eq!(g["timestamp"], "2026-12-01T10:00:00.500Z");
    assert_eq!(
        g["attributes"],
        json!({"message": "kept as an attribute", "host": "n1"})
    );
    b.stop().await.unwrap();
}

/// A certificate for `localhost` (self-signed: it is its own CA) in `dir`.
fn localhost_cert(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    (cert, key)
}

/// OTLP over TLS, both transports: the source serves both listeners with
/// a certificate of a private CA (gRPC by ALPN `h2`); the sink trusting
/// that CA delivers; one trusting only the Mozilla roots fails the
/// handshake and, out of attempts, names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_over_tls_with_a_private_ca_on_both_transports() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = localhost_cert(dir.path());
    let (grpc, http) = (free_port(), free_port());
    let mut b = testing::run_source(
        testing::source(
            &Typed(logbus_otlp::source::OtlpSource),
            json!({"grpc_address": format!("127.0.0.1:{grpc}"),
                   "http_address": format!("127.0.0.1:{http}"),
                   "tls": {"cert_file": cert, "key_file": key}}),
        ),
        100,
    );
    for port in [grpc, http] {
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    for (protocol, port) in [("grpc", grpc), ("http", http)] {
        let endpoint = format!("https://localhost:{port}");
        let one = || {
            let f = json!({"body": format!("over tls by {protocol}"), "resource": {"service.name": "s"}});
            vec![vec![Event::fields(
                f.as_object().unwrap().clone(),
                Meta::now("t".into()),
            )]]
        };
        let (result, _) = testing::run_sink(
            sink(json!({"endpoint": endpoint, "protocol": protocol, "tls": {"ca_file": cert}})),
            one(),
        )
        .await;
        result.unwrap();
        let got = testing::take(&mut b.rx, 1).await;
        let got = got[0].as_fields().unwrap();
        assert_eq!(got["body"], format!("over tls by {protocol}"));
        assert_eq!(got["resource"]["service.name"], "s");
        let (result, _) = testing::run_sink(
            sink(
                json!({"endpoint": endpoint, "protocol": protocol, "retry_max_attempts": 2,
                        "retry_initial_backoff_ms": 10}),
            ),
            one(),
        )
        .await;
        let e = result.unwrap_err().to_string();
        assert!(e.to_lowercase().contains("certificate"), "{protocol}: {e}");
        // Plain text to a TLS listener is no answer either.
        let (result, _) = testing::run_sink(
            sink(
                json!({"endpoint": format!("http://127.0.0.1:{port}"), "protocol": protocol,
                        "retry_max_attempts": 2, "retry_initial_backoff_ms": 10,
                        "request_timeout_ms": 2000}),
            ),
            one(),
        )
        .await;
        assert!(result.is_err(), "{protocol}: plain text to TLS");
    }
    b.stop().await.unwrap();
}

/// The gRPC listener has the HTTP one's connection table: silent
/// connections are closed after the idle timeout, and when the table is
/// full the longest-idle one makes room for a client that sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_listener_caps_connections_and_closes_idle_ones() {
    let grpc = free_port();
    let mut b = testing::run_source(
        testing::source(
            &Typed(logbus_otlp::source::OtlpSource),
            json!({"grpc_address": format!("127.0.0.1:{grpc}"),
                   "max_connections": 2, "idle_timeout_ms": 60000}),
        ),
        100,
    );
    while std::net::TcpStream::connect(("127.0.0.1", grpc)).is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Three silent clients, one after the other: each newcomer past two
    // closes the longest-idle connection (the probe above, if hyper has
    // not seen it go yet, then the first silent one, ...).
    let silent: Vec<_> = (0..3)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", grpc)).unwrap())
        .collect();
    let one = |body: &str| {
        let f = json!({"body": body});
        vec![vec![Event::fields(
            f.as_object().unwrap().clone(),
            Meta::now("t".into()),
        )]]
    };
    let (result, _) = testing::run_sink(
        sink(json!({"endpoint": format!("http://127.0.0.1:{grpc}"), "protocol": "grpc"})),
        one("past the silent ones"),
    )
    .await;
    result.unwrap();
    let got = testing::take(&mut b.rx, 1).await;
    assert_eq!(got[0].as_fields().unwrap()["body"], "past the silent ones");
    // With the sink's connection that is four newcomers for two places,
    // so at least two of the three silent clients are closed, whatever the
    // probe did (which two depends on when each was last written to).
    let (closed_tx, closed_rx) = std::sync::mpsc::channel();
    for s in silent {
        let closed_tx = closed_tx.clone();
        std::thread::spawn(move || closed_tx.send(closed_by_server(&s)));
    }
    for i in 0..2 {
        let closed = closed_rx.recv_timeout(Duration::from_secs(15)).unwrap();
        assert!(closed, "silent client {i} of the two evicted was closed");
    }
    b.stop().await.unwrap();

    // With a short idle timeout a silent connection is closed by itself.
    let grpc = free_port();
    let b = testing::run_source(
        testing::source(
            &Typed(logbus_otlp::source::OtlpSource),
            json!({"grpc_address": format!("127.0.0.1:{grpc}"), "idle_timeout_ms": 100}),
        ),
        100,
    );
    while std::net::TcpStream::connect(("127.0.0.1", grpc)).is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let s = std::net::TcpStream::connect(("127.0.0.1", grpc)).unwrap();
    assert!(closed_by_server(&s), "an idle gRPC connection is closed");
    b.stop().await.unwrap();
}

/// Reads what the server sends (its HTTP/2 SETTINGS, a GOAWAY) until it
/// closes the connection: true then, false if it stays open for 10 s (a
/// bound, so that a failure fails rather than hangs).
fn closed_by_server(mut s: &std::net::TcpStream) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// The Collector's OTLP/gRPC receiver over TLS (a collector this test
/// starts, with its own certificate): the sink verifies the certificate
/// against the private CA and negotiates `h2`, as grpc-go insists.
#[ignore = "needs the OpenTelemetry Collector binary (.ci/services up otel builds it); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collector_receives_over_grpc_with_tls() {
    let services =
        std::env::var("LOGBUS_SERVICES").unwrap_or_else(|_| "/var/tmp/logbus-services".into());
    let bin = std::path::Path::new(&services).join("go/bin/otelcol-logbus");
    assert!(
        bin.exists(),
        "the OpenTelemetry Collector is required at {} (.ci/services up otel builds it)",
        bin.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = localhost_cert(dir.path());
    let port = free_port();
    let out = dir.path().join("logs.jsonl");
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:{port}\n        tls:\n          cert_file: {}\n          key_file: {}\n\
             exporters:\n  file:\n    path: {}\n    flush_interval: 100ms\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    logs:\n      receivers: [otlp]\n      exporters: [file]\n",
            cert.display(),
            key.display(),
            out.display()
        ),
    )
    .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _collector = Kill(
        std::process::Command::new(&bin)
            .arg("--config")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("collector.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    for _ in 0..600 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events: Vec<Event> = (0..20)
        .map(|i| {
            let f = json!({"body": format!("tls {i}"), "attributes": {"i": i},
                           "resource": {"service.name": "logbus-tls"}});
            Event::fields(f.as_object().unwrap().clone(), Meta::now("t".into()))
        })
        .collect();
    let (result, _) = testing::run_sink(
        sink(
            json!({"endpoint": format!("https://localhost:{port}"), "protocol": "grpc",
                    "tls": {"ca_file": cert}, "batch_max_events": 8}),
        ),
        vec![events],
    )
    .await;
    result.unwrap_or_else(|e| {
        panic!(
            "{e}\n{}",
            std::fs::read_to_string(dir.path().join("collector.log")).unwrap_or_default()
        )
    });
    let mut bodies = Vec::new();
    for _ in 0..100 {
        bodies.clear();
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            for rl in v["resourceLogs"].as_array().into_iter().flatten() {
                assert_eq!(
                    rl["resource"]["attributes"][0]["value"]["stringValue"],
                    "logbus-tls"
                );
                for sl in rl["scopeLogs"].as_array().into_iter().flatten() {
                    for r in sl["logRecords"].as_array().into_iter().flatten() {
                        bodies.push(r["body"]["stringValue"].as_str().unwrap().to_string());
                    }
                }
            }
        }
        if bodies.len() >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bodies.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("tls {i}")).collect();
    want.sort();
    assert_eq!(bodies, want);
}

/// Each wrong option is named with what is wrong.
#[test]
fn option_errors_name_the_option() {
    let e = |o: Value| testing::option_errors(&Typed(logbus_otlp::sink::OtlpSink), o);
    assert_eq!(e(json!({"endpoint": "https://otlp.example.com:4317"})), "");
    assert_eq!(
        e(json!({"endpoint": "collector:4317"})),
        "endpoint: `collector:4317` is not an http:// or https:// URL"
    );
    assert_eq!(
        e(json!({"endpoint": "http://c:4317", "tls": {"ca_file": "ca.pem"}})),
        "tls: applies to an https:// endpoint only"
    );
    assert_eq!(
        e(json!({"endpoint": "http://c:4317", "compression_level": 1})),
        "compression_level: applies to `protocol: http` only (gRPC's gzip level is fixed at 6 by tonic)"
    );
    assert_eq!(
        e(
            json!({"endpoint": "http://c:4318", "protocol": "http", "compression": "none",
                 "compression_level": 1})
        ),
        "compression_level: needs `compression: gzip`"
    );
    assert!(
        e(json!({"endpoint": "http://c:4318", "protocol": "http", "compression_level": 10}))
            .starts_with("compression_level:"),
        "{}",
        e(json!({"endpoint": "http://c:4318", "protocol": "http", "compression_level": 10}))
    );
    // Read when the stage is built, where it runs: validation cannot know.
    let missing_ca = testing::build_errors(
        &Typed(logbus_otlp::sink::OtlpSink),
        json!({"endpoint": "https://c:4317", "tls": {"ca_file": "/nonexistent/ca.pem"}}),
    );
    assert!(
        missing_ca.starts_with("tls: reading /nonexistent/ca.pem"),
        "{missing_ca}"
    );
    assert_eq!(
        e(json!({"endpoint": "http://c:4317", "headers": {"bad header": "v"}})),
        "headers.bad header: not a valid header name"
    );
    assert_eq!(
        e(json!({"endpoint": "http://c:4317", "body_field": ""})),
        "body_field: must not be empty"
    );
    assert_eq!(
        e(json!({"endpoint": "http://"})),
        "endpoint: `http://` is not an http:// or https:// URL"
    );
}

/// `protocol: http` posts to OTLP's `/v1/logs` under an endpoint without
/// a path, and to the endpoint as given when it has one (a collector
/// behind a proxy's path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_endpoint_with_a_path_is_posted_to_as_given() {
    for (path, expected) in [
        ("", "/v1/logs"),
        ("/", "/v1/logs"),
        ("/ingest/otlp", "/ingest/otlp"),
    ] {
        let (port, server) = serve_once(vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
                .to_vec(),
        ]);
        let (result, metrics) = testing::run_sink(
            sink(json!({"endpoint": format!("http://127.0.0.1:{port}{path}"), "protocol": "http"})),
            vec![events()[..1].to_vec()],
        )
        .await;
        result.unwrap();
        assert_eq!(metrics.snapshot().events_out, 1);
        let request_line = server.join().unwrap();
        assert_eq!(
            request_line.split(' ').take(2).collect::<Vec<_>>(),
            ["POST", expected],
            "endpoint path {path:?}"
        );
    }
}

/// A one-request HTTP server on loopback: reads the request, writes
/// `answer`'s parts one `write` each (so a chunked body's chunks reach the
/// client as separate reads), and returns the request line.
fn serve_once(answer: Vec<Vec<u8>>) -> (u16, std::thread::JoinHandle<String>) {
    let listener = std::net::TcpListener::bind(("127.0.0.1", free_port())).unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Read, Write};
        let (conn, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut request_line = String::new();
        reader.read_line(&mut request_line).unwrap();
        let mut length = 0;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).unwrap();
            if header == "\r\n" {
                break;
            }
            if let Some(v) = header.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        for part in answer {
            (&conn).write_all(&part).unwrap();
            (&conn).flush().unwrap();
        }
        request_line
    });
    (port, server)
}

/// An HTTP answer with `status` and a chunked body of `chunks`, as the
/// parts [`serve_once`] writes one by one.
fn chunked(status: &str, content_type: &str, chunks: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut parts = vec![
        format!("HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n")
            .into_bytes(),
    ];
    for chunk in chunks {
        let mut part = format!("{:x}\r\n", chunk.len()).into_bytes();
        part.extend_from_slice(chunk);
        part.extend_from_slice(b"\r\n");
        parts.push(part);
    }
    parts.push(b"0\r\n\r\n".to_vec());
    parts
}

/// What this test binary logged at `warn` and above, for the tests that
/// check what the sink says; each looks for its own port in it.
fn logged() -> String {
    use std::sync::{Mutex, OnceLock};
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    let logs = LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let writer = logs.clone();
        tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::WARN)
                .with_ansi(false)
                .with_writer(move || Buffer(writer.clone()))
                .finish(),
        )
        .expect("no other subscriber in this test binary");
        logs
    });
    String::from_utf8_lossy(&logs.lock().unwrap()).into_owned()
}

/// The lines [`logged`] holds about the receiver on `port` (ports are
/// five digits and unique within this binary, so no other test's match).
fn logged_about(port: u16) -> Vec<String> {
    logged()
        .lines()
        .filter(|l| l.contains(&format!("127.0.0.1:{port}")))
        .map(String::from)
        .collect()
}

/// A 2xx answer with a partial success is delivery, and the records the
/// receiver refused are logged with their count and its message: the
/// whole body is read (its first chunk alone is over the 512 bytes read
/// of an error's body), and a partial success refusing nothing (a
/// warning) logs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_success_is_logged_with_what_the_receiver_refused() {
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsPartialSuccess;
    use prost::Message;
    logged();
    for (rejected, message) in [(2, "m".repeat(900)), (0, "w".repeat(900))] {
        let body = ExportLogsServiceResponse {
            partial_success: Some(ExportLogsPartialSuccess {
                rejected_log_records: rejected,
                error_message: message.clone(),
            }),
        }
        .encode_to_vec();
        assert!(body.len() > 700);
        let (first, rest) = body.split_at(600);
        let (port, server) =
            serve_once(chunked("200 OK", "application/x-protobuf", &[first, rest]));
        let (result, metrics) = testing::run_sink(
            sink(json!({"endpoint": format!("http://127.0.0.1:{port}"), "protocol": "http"})),
            vec![events()[..1].to_vec()],
        )
        .await;
        result.unwrap();
        server.join().unwrap();
        assert_eq!(metrics.snapshot().events_out, 1);
        let said = logged_about(port);
        if rejected > 0 {
            assert_eq!(said.len(), 1, "{said:?}");
            assert!(
                said[0].contains(&format!(
                    "refused {rejected} log records for good: {message}"
                )),
                "{said:?}"
            );
        } else {
            assert!(
                said.is_empty(),
                "a partial success refusing nothing: {said:?}"
            );
        }
    }
}

/// An HTTP error's reason is the receiver's: the message of a
/// `google.rpc.Status` body, or a text body read whole across chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_error_carries_the_receivers_message() {
    // google.rpc.Status { code: 3, message: "attribute too long" }, by hand.
    let message = b"attribute too long";
    let mut status = vec![0x08, 3, 0x12, message.len() as u8];
    status.extend_from_slice(message);
    for (answer, reason) in [
        (
            chunked("400 Bad Request", "application/x-protobuf", &[&status]),
            "HTTP 400: attribute too long",
        ),
        (
            chunked(
                "400 Bad Request",
                "text/plain",
                &[b"first half, ", b"second half"],
            ),
            "HTTP 400: first half, second half",
        ),
    ] {
        let (port, server) = serve_once(answer);
        let (result, _) = testing::run_sink(
            sink(json!({"endpoint": format!("http://127.0.0.1:{port}"), "protocol": "http"})),
            vec![events()[..1].to_vec()],
        )
        .await;
        server.join().unwrap();
        let e = result.unwrap_err().to_string();
        assert!(e.contains(reason), "{e}");
    }
}

/// An OTLP/gRPC receiver that answers each export with the next of
/// `answers` (then plain success); returns its port, a count of the
/// exports it answered, and the token that stops it.
async fn scripted_grpc(
    answers: Vec<Result<ExportLogsServiceResponse, tonic::Status>>,
) -> (
    u16,
    Arc<std::sync::atomic::AtomicUsize>,
    logbus_plugin_api::CancellationToken,
) {
    use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
        LogsService, LogsServiceServer,
    };
    type Script = std::sync::Mutex<
        std::collections::VecDeque<Result<ExportLogsServiceResponse, tonic::Status>>,
    >;
    struct Scripted(Script, Arc<std::sync::atomic::AtomicUsize>);
    #[tonic::async_trait]
    impl LogsService for Scripted {
        async fn export(
            &self,
            _: tonic::Request<ExportLogsServiceRequest>,
        ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let next = self.0.lock().unwrap().pop_front();
            next.unwrap_or_else(|| Ok(ExportLogsServiceResponse::default()))
                .map(tonic::Response::new)
        }
    }
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let service = Scripted(std::sync::Mutex::new(answers.into()), answered.clone());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", free_port()))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let shutdown = logbus_plugin_api::CancellationToken::new();
    let server = logbus_connections::http::HttpConnections {
        app: tonic::service::Routes::new(
            LogsServiceServer::new(service)
                .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
        )
        .into_axum_router(),
        version: logbus_connections::http::HttpVersion::Http2,
        tls: None,
        table: logbus_connections::ConnectionTable::new(logbus_connections::Limits {
            max_connections: 16,
            idle_timeout: Duration::from_secs(60),
        }),
        header_timeout: Duration::from_secs(10),
        body_timeout: None,
        shutdown: shutdown.clone(),
    };
    tokio::spawn(server.serve(listener));
    (port, answered, shutdown)
}

/// RESOURCE_EXHAUSTED is retried when the receiver says when to come back
/// (RetryInfo, as OTLP asks), after that delay, and then delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_exhausted_with_retry_info_is_retried_after_its_delay() {
    use tonic_types::{ErrorDetails, StatusExt};
    let full = tonic::Status::with_error_details(
        tonic::Code::ResourceExhausted,
        "the receiver is full",
        ErrorDetails::with_retry_info(Some(Duration::from_millis(300))),
    );
    let (port, answered, shutdown) = scripted_grpc(vec![Err(full)]).await;
    let began = std::time::Instant::now();
    let (result, metrics) = testing::run_sink(
        sink(
            json!({"endpoint": format!("http://127.0.0.1:{port}"), "retry_initial_backoff_ms": 1}),
        ),
        vec![events()[..1].to_vec()],
    )
    .await;
    result.unwrap();
    assert_eq!(answered.load(std::sync::atomic::Ordering::SeqCst), 2);
    let m = metrics.snapshot();
    assert_eq!((m.events_out, m.retried), (1, 1));
    assert!(
        began.elapsed() >= Duration::from_millis(300),
        "{:?}",
        began.elapsed()
    );
    shutdown.cancel();
}

/// Over gRPC too, a partial success is delivery and what the receiver
/// refused is logged (the answer's body is decoded, not assumed empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_success_over_grpc_is_logged() {
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsPartialSuccess;
    logged();
    let partial = ExportLogsServiceResponse {
        partial_success: Some(ExportLogsPartialSuccess {
            rejected_log_records: 3,
            error_message: "records too old".into(),
        }),
    };
    let (port, answered, shutdown) = scripted_grpc(vec![Ok(partial)]).await;
    let (result, metrics) = testing::run_sink(
        sink(json!({"endpoint": format!("http://127.0.0.1:{port}")})),
        vec![events()[..1].to_vec()],
    )
    .await;
    result.unwrap();
    assert_eq!(answered.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(metrics.snapshot().events_out, 1);
    let said = logged_about(port);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("refused 3 log records for good: records too old"),
        "{said:?}"
    );
    shutdown.cancel();
}

/// `validate --preflight` learns of the CA file.
#[test]
fn the_ca_file_is_stated() {
    let needs = testing::host_needs(
        &Typed(logbus_otlp::sink::OtlpSink),
        json!({ "endpoint": "https://h:4318", "protocol": "http", "tls": { "ca_file": "ca.pem" } }),
    );
    assert_eq!(needs, ["tls.ca_file: Pem ./ca.pem"]);
}

/// `validate --connect` sends an empty export as the stage would: a
/// receiver that is not there is unreachable, at `endpoint`; one that is
/// accepts it and nothing is found.
#[tokio::test]
async fn the_probe_sends_an_empty_export() {
    use logbus_plugin_api::{ArrivingFields, ConnectContext, Plugin};
    let cx = || ConnectContext {
        stage_id: "s".into(),
        base_dir: ".".into(),
        timeout: Duration::from_secs(5),
        arriving: ArrivingFields::default(),
    };
    let closed = free_port();
    let probe = Typed(logbus_otlp::sink::OtlpSink)
        .connect(
            &json!({ "endpoint": format!("http://127.0.0.1:{closed}"), "protocol": "http" }),
            cx(),
        )
        .expect("a probe");
    let found = probe.await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].code, "service-unreachable");
    assert_eq!(found[0].option, ["endpoint"]);

    let (grpc, http) = (free_port(), free_port());
    let receiver = receiver(grpc, http, 16).await;
    for (protocol, port) in [("grpc", grpc), ("http", http)] {
        let probe = Typed(logbus_otlp::sink::OtlpSink)
            .connect(
                &json!({ "endpoint": format!("http://127.0.0.1:{port}"), "protocol": protocol }),
                cx(),
            )
            .expect("a probe");
        let found = probe.await;
        assert!(found.is_empty(), "{protocol}: {found:?}");
    }
    drop(receiver);
}

/// A server on loopback that answers every request with `status` and an
/// empty body (the test node has no security plugin, so it never refuses
/// credentials itself).
fn answering(status: &'static str) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    port
}

/// `validate --connect`: an export refused for its credentials is found
/// at `headers`, one refused otherwise at `endpoint`.
#[tokio::test]
async fn the_probe_names_a_refused_export() {
    let plugin = Typed(logbus_otlp::sink::OtlpSink);
    for (status, at) in [
        ("401 Unauthorized", "headers"),
        ("400 Bad Request", "endpoint"),
    ] {
        let port = answering(status);
        let found = testing::probe(
            &plugin,
            json!({ "endpoint": format!("http://127.0.0.1:{port}"), "protocol": "http" }),
            None,
        )
        .await;
        assert_eq!(found, [format!("{at} service-refused")], "{status}");
    }
}
