//! `source: http` with a real HTTP client (ureq) on loopback: NDJSON,
//! plain lines, JSON arrays, gzip and zstd bodies, the bearer token, the
//! size limit, the health endpoint, and 503 + Retry-After while the
//! pipeline stays full — after which every accepted event is there once.

use std::io::Write;
use std::time::Duration;

use logbus_plugin_api::testing::{self, RunningSource, option_errors};
use logbus_plugin_api::{CancellationToken, Receiver, Typed};
use serde_json::json;

struct Running {
    url: String,
    rx: Receiver,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), logbus_plugin_api::StageError>>,
    _stop_on_drop: logbus_plugin_api::DropGuard,
}

async fn start(options: serde_json::Value, capacity: usize) -> Running {
    let port = logbus_test_ports::free_port();
    let mut options = options;
    options["address"] = json!(format!("127.0.0.1:{port}"));
    let RunningSource {
        rx,
        shutdown,
        task,
        stop_on_drop,
        ..
    } = testing::run_source(
        testing::source(&Typed(logbus_http::source::HttpSource), options),
        capacity,
    );
    let url = format!("http://127.0.0.1:{port}");
    // Wait until it listens.
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Running {
        url,
        rx,
        shutdown,
        task,
        _stop_on_drop: stop_on_drop,
    }
}

/// A blocking request on the blocking pool: (status, Retry-After, body).
async fn post(
    url: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
) -> (u16, Option<String>, String) {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut r = agent.post(&url);
        for (k, v) in headers {
            r = r.header(k, v);
        }
        let mut resp = r.send(&body[..]).unwrap();
        let retry = resp
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        (
            resp.status().as_u16(),
            retry,
            resp.body_mut().read_to_string().unwrap(),
        )
    })
    .await
    .unwrap()
}

fn texts(rx: &mut Receiver) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(mut b) = rx.try_recv() {
        out.extend(
            b.take()
                .iter()
                .map(|e| String::from_utf8(e.as_raw().unwrap().to_vec()).unwrap()),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_of_every_kind_become_events_and_the_answer_counts_them() {
    let mut s = start(json!({ "path": "/ingest" }), 1000).await;
    let url = format!("{}/ingest", s.url);
    let (status, _, body) = post(
        url.clone(),
        vec![],
        b"{\"a\":1}\n\n{\"a\":2}\r\nplain line".to_vec(),
    )
    .await;
    assert_eq!((status, body.trim()), (200, "{\"accepted\":3}"));
    assert_eq!(texts(&mut s.rx), ["{\"a\":1}", "{\"a\":2}", "plain line"]);

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(b"zipped 1\nzipped 2\n").unwrap();
    let (status, _, _) = post(
        url.clone(),
        vec![("Content-Encoding", "gzip".into())],
        gz.finish().unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(texts(&mut s.rx), ["zipped 1", "zipped 2"]);

    let zst = zstd::encode_all(&b"z\n"[..], 1).unwrap();
    let (status, _, _) = post(url.clone(), vec![("Content-Encoding", "zstd".into())], zst).await;
    assert_eq!(status, 200);
    assert_eq!(texts(&mut s.rx), ["z"]);

    // Wrong path, unsupported encoding, bad gzip.
    let (status, _, _) = post(format!("{}/other", s.url), vec![], b"x".to_vec()).await;
    assert_eq!(status, 404);
    let (status, _, body) = post(
        url.clone(),
        vec![("Content-Encoding", "br".into())],
        b"x".to_vec(),
    )
    .await;
    assert_eq!(status, 415, "{body}");
    let (status, _, body) = post(
        url.clone(),
        vec![("Content-Encoding", "gzip".into())],
        b"not gzip".to_vec(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(texts(&mut s.rx).is_empty());

    // Health.
    let health = tokio::task::spawn_blocking({
        let u = format!("{}/health", s.url);
        move || {
            ureq::get(&u)
                .call()
                .unwrap()
                .body_mut()
                .read_to_string()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert_eq!(health.trim(), "ok");
    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_arrays_tokens_and_size_limits() {
    let mut s = start(
        json!({ "body": "json_array", "bearer_token": "t0k", "max_body_bytes": 100 }),
        1000,
    )
    .await;
    let auth = || vec![("Authorization", "Bearer t0k".to_string())];
    let (status, _, _) = post(
        s.url.clone(),
        auth(),
        br#"[{"a":1}, {"b":[2,3]}, "s"]"#.to_vec(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(texts(&mut s.rx), [r#"{"a":1}"#, r#"{"b":[2,3]}"#, r#""s""#]);
    let (status, _, _) = post(s.url.clone(), vec![], b"[]".to_vec()).await;
    assert_eq!(status, 401);
    let (status, _, _) = post(
        s.url.clone(),
        vec![("Authorization", "Bearer nope".into())],
        b"[]".to_vec(),
    )
    .await;
    assert_eq!(status, 401);
    let (status, _, body) = post(s.url.clone(), auth(), b"{\"not\":\"an array\"}".to_vec()).await;
    assert_eq!(status, 400, "{body}");
    let (status, _, _) = post(s.url.clone(), auth(), vec![b' '; 101]).await;
    assert_eq!(status, 413);
    // A small gzip body that inflates past the limit (a zip bomb) too.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&[b' '; 10_000]).unwrap();
    let mut headers = auth();
    headers.push(("Content-Encoding", "gzip".into()));
    let (status, _, _) = post(s.url.clone(), headers, gz.finish().unwrap()).await;
    assert_eq!(status, 413);
    assert!(texts(&mut s.rx).is_empty());
    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_events_than_max_events_per_request_is_413_and_sends_nothing() {
    let mut s = start(json!({ "max_events_per_request": 3 }), 1000).await;
    let (status, _, _) = post(s.url.clone(), vec![], b"a\nb\n\nc\n".to_vec()).await;
    assert_eq!(status, 200, "blank lines are not events");
    assert_eq!(texts(&mut s.rx), ["a", "b", "c"]);
    let (status, _, body) = post(s.url.clone(), vec![], b"a\nb\nc\nd".to_vec()).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("max_events_per_request"), "{body}");
    assert!(
        texts(&mut s.rx).is_empty(),
        "nothing of a refused body is sent"
    );
    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_that_stays_full_gets_503_with_retry_after_and_loses_nothing() {
    // A 5-event pipeline nobody reads, one request slot, a short wait.
    let mut s = start(
        json!({ "max_concurrent_requests": 1, "accept_timeout_ms": 200, "retry_after_secs": 7 }),
        5,
    )
    .await;
    let lines = |from: usize| -> Vec<u8> {
        (from..from + 10)
            .map(|i| format!("e{i}\n"))
            .collect::<String>()
            .into_bytes()
    };
    // Ten events into room for five: half go in, the request holds the
    // only slot and waits for the rest (no answer yet).
    let waiting = tokio::spawn(post(s.url.clone(), vec![], lines(0)));
    while s.rx.handle().occupancy() < 5 {
        tokio::task::yield_now().await;
    }
    // The pipeline stays full: the next request is turned away.
    let (status, retry, _) = post(s.url.clone(), vec![], lines(10)).await;
    assert_eq!((status, retry.as_deref()), (503, Some("7")));
    // Drain: the waiting request completes; exactly its 10 events are in.
    let mut got = Vec::new();
    while got.len() < 10 {
        let mut b = s.rx.recv().await.unwrap();
        got.extend(
            b.take()
                .iter()
                .map(|e| String::from_utf8(e.as_raw().unwrap().to_vec()).unwrap()),
        );
    }
    assert_eq!(waiting.await.unwrap().0, 200);
    assert_eq!(got, (0..10).map(|i| format!("e{i}")).collect::<Vec<_>>());
    assert!(
        texts(&mut s.rx).is_empty(),
        "the refused request sent nothing"
    );
    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();
}

#[test]
fn bad_options_name_the_key() {
    let errors = |o: serde_json::Value| option_errors(&Typed(logbus_http::source::HttpSource), o);
    assert!(errors(json!({ "address": "nowhere" })).starts_with("address: "));
    assert!(errors(json!({ "address": "127.0.0.1:1", "path": "/health" })).starts_with("path: "));
    assert!(
        errors(json!({ "address": "127.0.0.1:1", "max_concurrent_requests": 0 }))
            .contains("max_concurrent_requests")
    );
    assert!(
        errors(json!({ "address": "127.0.0.1:1", "max_events_per_request": 0 }))
            .starts_with("max_events_per_request: ")
    );
    assert!(
        errors(json!({ "address": "127.0.0.1:1", "body_timeout_ms": 0 }))
            .starts_with("body_timeout_ms: ")
    );
}

/// Receives one request's events (as one batch) and settles them all with
/// `outcome` (`None`: keeps them unsettled until returned).
async fn settle_next(
    rx: &mut Receiver,
    outcome: Option<logbus_plugin_api::Outcome>,
) -> Vec<logbus_plugin_api::Event> {
    let mut batch = rx.recv().await.expect("a request's events");
    let mut events = batch.take();
    if let Some(o) = outcome {
        logbus_plugin_api::Event::settle_all(&mut events, o);
        return Vec::new();
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_ack_sink_the_answer_waits_for_delivery_and_says_what_happened() {
    use logbus_plugin_api::Outcome;
    let mut s = start(json!({ "ack": "sink", "ack_timeout_ms": 300 }), 100).await;
    let body = || b"{\"a\":1}\n{\"a\":2}\n".to_vec();

    // Delivered: 200 only after the sink settled the events.
    let request = tokio::spawn(post(s.url.clone(), vec![], body()));
    let held = settle_next(&mut s.rx, None).await;
    assert!(!request.is_finished(), "answered before delivery");
    drop(settle_all_delivered(held));
    let (status, _, text) = request.await.unwrap();
    assert_eq!((status, text.as_str()), (200, "{\"delivered\":2}\n"));

    // Rejected for good: 500, and the reason says a resend will not help.
    let request = tokio::spawn(post(s.url.clone(), vec![], body()));
    settle_next(&mut s.rx, Some(Outcome::Rejected)).await;
    let (status, _, text) = request.await.unwrap();
    assert_eq!(status, 500, "{text}");
    assert!(
        text.starts_with("rejected: ") && text.contains("will not help"),
        "{text}"
    );

    // Errored (here: dropped unsettled, as when a stage fails): 503 with
    // Retry-After, send again.
    let request = tokio::spawn(post(s.url.clone(), vec![], body()));
    drop(settle_next(&mut s.rx, None).await);
    let (status, retry, text) = request.await.unwrap();
    assert_eq!((status, retry.as_deref()), (503, Some("1")), "{text}");
    assert!(text.starts_with("errored: "), "{text}");

    // Not confirmed in time: 504, which says a resend may duplicate.
    let request = tokio::spawn(post(s.url.clone(), vec![], body()));
    let held = settle_next(&mut s.rx, None).await;
    let (status, _, text) = request.await.unwrap();
    assert_eq!(status, 504, "{text}");
    assert!(text.contains("may duplicate"), "{text}");
    drop(held);

    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();
}

fn settle_all_delivered(
    mut events: Vec<logbus_plugin_api::Event>,
) -> Vec<logbus_plugin_api::Event> {
    logbus_plugin_api::Event::settle_all(&mut events, logbus_plugin_api::Outcome::Delivered);
    events
}

/// `validate --preflight` learns of the listen address, the connections
/// it may hold and the TLS files.
#[test]
fn the_address_connections_and_tls_files_are_stated() {
    let needs = testing::host_needs(
        &Typed(logbus_http::source::HttpSource),
        json!({
            "address": "127.0.0.1:8080",
            "max_connections": 64,
            "tls": { "cert_file": "c.pem", "key_file": "k.pem" },
        }),
    );
    assert_eq!(
        needs,
        [
            "address: Listen 127.0.0.1:8080/tcp",
            "max_connections: OpenFiles 64",
            "tls.cert_file: Pem ./c.pem",
            "tls.key_file: PemKey ./k.pem",
            "tls.key_file: TlsIdentity ./c.pem ./k.pem",
        ]
    );
}

/// What validate says a crash costs follows `ack`: with `ack: sink` a
/// client that resends what got no 200 loses nothing; with `ack: queued`
/// what was in memory is lost. No positions either way.
#[test]
fn only_ack_sink_reads_again_what_a_crash_took() {
    use logbus_plugin_api::Replay;
    let replay = |options: serde_json::Value| {
        testing::replay(&Typed(logbus_http::source::HttpSource), options)
    };
    let replay_of = |rereads| {
        Some(Replay {
            rereads,
            positions: false,
        })
    };
    assert_eq!(
        replay(json!({ "address": "127.0.0.1:1", "ack": "sink" })),
        replay_of(true)
    );
    assert_eq!(
        replay(json!({ "address": "127.0.0.1:1", "ack": "queued" })),
        replay_of(false)
    );
    assert_eq!(
        replay(json!({ "address": "127.0.0.1:1" })),
        replay_of(false)
    );
}
