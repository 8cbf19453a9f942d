//! `sink: http` against a real HTTP server on loopback (axum) that fails
//! on purpose: 503 with Retry-After, 429, 500, refused connections, a
//! response slower than the request timeout, and a 400. Every test checks
//! exactly what the server accepted.

use std::collections::VecDeque;
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use logbus_plugin_api::testing::{self, option_errors};
use logbus_plugin_api::{
    Event, Meta, Output, OutputRole, SinkContext, StageMetrics, Typed, channel,
};
use serde_json::json;

/// What the server does with the next request.
#[derive(Clone, Copy, Debug)]
enum Act {
    Ok,
    Status(u16),
    /// 503 with `Retry-After: 1`.
    RetryAfter,
    /// 503 with `Retry-After: <an HTTP date two seconds ahead>`.
    RetryAfterDate,
    /// Answers 200 only after this long (the client has given up by then).
    Slow(Duration),
    /// 400 with a 100 KB body: the reason keeps its first 512 bytes.
    Verbose,
}

#[derive(Default)]
struct Server {
    script: Mutex<VecDeque<Act>>,
    /// Bodies of the requests answered 2xx, decoded, one event per line.
    accepted: Mutex<Vec<String>>,
    requests: Mutex<Vec<Seen>>,
    /// Requests being answered now, and the most at once.
    current: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    /// How long each answer takes.
    delay: Mutex<Duration>,
    /// `Act::Slow` answers that have finished (they finish even when the
    /// client has given up and closed the connection).
    slow_finished: std::sync::atomic::AtomicUsize,
    /// The lines those answers took.
    slow_lines: Mutex<Vec<String>>,
}

/// A request as answered: status, `Authorization`, `Content-Encoding`.
type Seen = (u16, Option<String>, Option<String>);

async fn handle(State(s): State<Arc<Server>>, headers: HeaderMap, body: Bytes) -> Response {
    use std::sync::atomic::Ordering::SeqCst;
    let now = s.current.fetch_add(1, SeqCst) + 1;
    s.most.fetch_max(now, SeqCst);
    let delay = *s.delay.lock().unwrap();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let response = answer(s.clone(), headers, body).await;
    s.current.fetch_sub(1, SeqCst);
    response
}

async fn answer(s: Arc<Server>, headers: HeaderMap, body: Bytes) -> Response {
    let act = s.script.lock().unwrap().pop_front().unwrap_or(Act::Ok);
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_string());
    let encoding = header("content-encoding");
    let text = match encoding.as_deref() {
        Some("gzip") => {
            let mut out = String::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_string(&mut out)
                .unwrap();
            out
        }
        _ => String::from_utf8(body.to_vec()).unwrap(),
    };
    let status = match act {
        Act::Ok => 200,
        Act::Status(code) => code,
        Act::Verbose => 400,
        Act::RetryAfter | Act::RetryAfterDate => 503,
        Act::Slow(d) => {
            // The server takes the batch after `d` whatever the client
            // does meanwhile: a task of its own, which the connection
            // closing does not cancel (as a real server's work goes on).
            let (s, lines) = (s.clone(), text.clone());
            return tokio::spawn(async move {
                tokio::time::sleep(d).await;
                s.accepted
                    .lock()
                    .unwrap()
                    .extend(lines.lines().map(str::to_string));
                s.slow_lines
                    .lock()
                    .unwrap()
                    .extend(lines.lines().map(str::to_string));
                s.slow_finished
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                StatusCode::OK.into_response()
            })
            .await
            .unwrap();
        }
    };
    s.requests
        .lock()
        .unwrap()
        .push((status, header("authorization"), encoding));
    if status == 200 {
        s.accepted
            .lock()
            .unwrap()
            .extend(text.lines().map(str::to_string));
        return StatusCode::OK.into_response();
    }
    if matches!(act, Act::Verbose) {
        return (StatusCode::BAD_REQUEST, "why ".repeat(25_000)).into_response();
    }
    let mut r = (StatusCode::from_u16(status).unwrap(), "not now").into_response();
    if matches!(act, Act::RetryAfter) {
        r.headers_mut().insert("retry-after", "1".parse().unwrap());
    }
    if matches!(act, Act::RetryAfterDate) {
        let at = std::time::SystemTime::now() + Duration::from_secs(2);
        r.headers_mut()
            .insert("retry-after", httpdate::fmt_http_date(at).parse().unwrap());
    }
    r
}

async fn serve(listener: tokio::net::TcpListener, server: Arc<Server>) {
    let app = axum::Router::new()
        .route("/ingest", axum::routing::post(handle))
        .with_state(server);
    axum::serve(listener, app).await.unwrap();
}

async fn start(script: &[Act]) -> (Arc<Server>, String) {
    let server = Arc::new(Server::default());
    server.script.lock().unwrap().extend(script.iter().copied());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ingest", listener.local_addr().unwrap());
    tokio::spawn(serve(listener, server.clone()));
    (server, url)
}

fn events(from: usize, n: usize) -> Vec<Event> {
    (from..from + n)
        .map(|i| Event::raw(format!("{{\"seq\":{i}}}"), Meta::at("t", 0)))
        .collect()
}

/// Runs the sink over `n` events (sent in batches of 7); returns its result
/// and metrics.
async fn run_sink(options: serde_json::Value, n: usize) -> (Result<(), String>, Arc<StageMetrics>) {
    run_sink_with_dead(options, n, None).await
}

/// As [`run_sink`], with `ship.dead` read through `dead`.
async fn run_sink_with_dead(
    options: serde_json::Value,
    n: usize,
    dead: Option<logbus_plugin_api::Sender>,
) -> (Result<(), String>, Arc<StageMetrics>) {
    let metrics = Arc::new(StageMetrics::default());
    let result = run_sink_counting(options, n, dead, metrics.clone()).await;
    (result, metrics)
}

/// As [`run_sink_with_dead`], counting into `metrics`, which the caller
/// can watch while the sink runs.
async fn run_sink_counting(
    options: serde_json::Value,
    n: usize,
    dead: Option<logbus_plugin_api::Sender>,
    metrics: Arc<StageMetrics>,
) -> Result<(), String> {
    let sink = testing::sink(&Typed(logbus_http::sink::HttpSink), options);
    let (tx, rx) = channel(1000);
    let mut sink_cx = SinkContext::new("ship", rx, metrics.clone());
    if let Some(dead) = dead {
        sink_cx.dead = Output::new(vec![dead], metrics.clone(), OutputRole::Errors);
    }
    let feeder = tokio::spawn(async move {
        let mut i = 0;
        while i < n {
            let k = 7.min(n - i);
            if tx.send(events(i, k)).await.is_err() {
                break;
            }
            i += k;
        }
    });
    let result = testing::within(testing::RUN_SINK_DEADLINE, &metrics, sink.run(&mut sink_cx))
        .await
        .map_err(|e| e.to_string());
    drop(sink_cx);
    feeder.await.unwrap();
    result
}

fn seqs(lines: &[String]) -> Vec<usize> {
    lines
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap() as usize
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_until_accepted_and_every_event_arrives_once_in_order() {
    let (server, url) = start(&[
        Act::Status(503),
        Act::Status(429),
        Act::Status(500),
        Act::Ok,
        Act::Status(502),
    ])
    .await;
    let (result, metrics) = run_sink(
        json!({
            "url": url,
            "compression": "gzip",
            "bearer_token": "s3cret",
            "batch_max_events": 10,
            "batch_timeout_ms": 5,
            "retry_initial_backoff_ms": 1,
            "retry_max_backoff_ms": 20,
            "in_flight": 1,
        }),
        100,
    )
    .await;
    result.unwrap();
    assert_eq!(
        seqs(&server.accepted.lock().unwrap()),
        (0..100).collect::<Vec<_>>()
    );
    let requests = server.requests.lock().unwrap();
    let failed = requests.iter().filter(|r| r.0 != 200).count();
    assert_eq!(failed, 4);
    assert!(
        requests
            .iter()
            .all(|r| r.1.as_deref() == Some("Bearer s3cret") && r.2.as_deref() == Some("gzip"))
    );
    let m = metrics.snapshot();
    assert_eq!((m.events_in, m.events_out, m.discarded), (100, 100, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured() {
    let (server, url) = start(&[Act::RetryAfter]).await;
    let started = std::time::Instant::now();
    let (result, _) = run_sink(
        json!({ "url": url, "retry_initial_backoff_ms": 1, "retry_max_backoff_ms": 5000, "batch_timeout_ms": 1 }),
        3,
    )
    .await;
    result.unwrap();
    // The server said one second; the 1 ms backoff did not win.
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(seqs(&server.accepted.lock().unwrap()), [0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_is_down_holds_the_batch_until_it_comes_up() {
    // A port nothing listens on yet: connections are refused.
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], logbus_test_ports::free_port()));
    let server = Arc::new(Server::default());
    let url = format!("http://{addr}/ingest");
    let metrics = Arc::new(StageMetrics::default());
    // The destination comes up once the sink has been refused and has
    // retried twice: what the sink did, not how long it had.
    let up = {
        let (server, metrics) = (server.clone(), metrics.clone());
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while metrics.snapshot().retried < 2 {
                assert!(tokio::time::Instant::now() < deadline, "no retry in 30 s");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
            serve(listener, server).await;
        })
    };
    run_sink_counting(
        json!({ "url": url, "retry_initial_backoff_ms": 5, "retry_max_backoff_ms": 50, "batch_timeout_ms": 1 }),
        20,
        None,
        metrics.clone(),
    )
    .await
    .unwrap();
    assert_eq!(
        seqs(&server.accepted.lock().unwrap()),
        (0..20).collect::<Vec<_>>()
    );
    let counts = metrics.snapshot();
    assert_eq!(counts.events_out, 20);
    assert!(counts.retried >= 2, "retried {}", counts.retried);
    up.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_slower_than_the_timeout_is_retried_at_least_once_delivery() {
    let (server, url) = start(&[Act::Slow(Duration::from_millis(600))]).await;
    let (result, _) = run_sink(
        json!({ "url": url, "request_timeout_ms": 200, "retry_initial_backoff_ms": 1, "batch_timeout_ms": 1, "batch_max_events": 5 }),
        5,
    )
    .await;
    result.unwrap();
    // The retry was answered at once; the slow answer finishes later and
    // takes its batch a second time (the client could not know it would):
    // every event at least once, and those of the slow batch exactly twice.
    // Wait for that answer, not for a time.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while server
        .slow_finished
        .load(std::sync::atomic::Ordering::SeqCst)
        < 1
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow answer never finished"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut got = seqs(&server.accepted.lock().unwrap());
    got.sort();
    let slow = seqs(&server.slow_lines.lock().unwrap());
    assert!(!slow.is_empty(), "the slow answer took no events");
    let mut expected: Vec<usize> = (0..5).chain(slow).collect();
    expected.sort();
    assert_eq!(got, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_fails_the_stage_or_is_dropped_and_counted() {
    let (_server, url) = start(&[Act::Status(400)]).await;
    let (result, _) = run_sink(json!({ "url": url, "batch_timeout_ms": 1 }), 3).await;
    let err = result.unwrap_err();
    assert!(err.contains("HTTP 400") && err.contains(&url), "{err}");

    let (server, url) = start(&[Act::Status(413)]).await;
    let (result, metrics) = run_sink(
        json!({ "url": url, "batch_timeout_ms": 1, "batch_max_events": 5, "on_rejected": "drop", "in_flight": 1 }),
        10,
    )
    .await;
    result.unwrap();
    let m = metrics.snapshot();
    assert_eq!(m.discarded, 5);
    assert_eq!(m.events_out, 5);
    assert_eq!(seqs(&server.accepted.lock().unwrap()), [5, 6, 7, 8, 9]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_max_attempts_gives_up_with_the_reason() {
    let (_server, url) = start(&[Act::Status(503); 10]).await;
    let (result, metrics) = run_sink(
        json!({ "url": url, "batch_timeout_ms": 1, "retry_initial_backoff_ms": 1, "retry_max_attempts": 3 }),
        2,
    )
    .await;
    let err = result.unwrap_err();
    assert!(
        err.contains("gave up: 3 attempts") && err.contains("HTTP 503") && err.contains(&url),
        "{err}"
    );
    assert_eq!(metrics.snapshot().events_out, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_as_an_http_date_is_honoured() {
    let (server, url) = start(&[Act::RetryAfterDate]).await;
    let started = std::time::Instant::now();
    let (result, _) = run_sink(
        json!({ "url": url, "retry_initial_backoff_ms": 1, "retry_max_backoff_ms": 5000, "batch_timeout_ms": 1 }),
        2,
    )
    .await;
    result.unwrap();
    // The date is two seconds ahead at whole-second precision: at least one
    // second of it is left when the client reads it.
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(seqs(&server.accepted.lock().unwrap()), [0, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_requests_in_flight_deliver_every_event_exactly_once() {
    let (server, url) = start(&[Act::Status(503), Act::Ok, Act::Status(500)]).await;
    *server.delay.lock().unwrap() = Duration::from_millis(20);
    let (result, metrics) = run_sink(
        json!({
            "url": url,
            "batch_max_events": 20,
            "batch_timeout_ms": 5,
            "retry_initial_backoff_ms": 1,
            "in_flight": 4,
        }),
        600,
    )
    .await;
    result.unwrap();
    let mut got = seqs(&server.accepted.lock().unwrap());
    got.sort();
    assert_eq!(got, (0..600).collect::<Vec<_>>(), "once each");
    let most = server.most.load(std::sync::atomic::Ordering::SeqCst);
    assert!((2..=4).contains(&most), "{most} requests at once");
    assert_eq!(metrics.snapshot().events_out, 600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_events_go_to_the_dead_letter_output_with_the_reason() {
    let (server, url) = start(&[Act::Status(400)]).await;
    let (dead_tx, mut dead_rx) = channel(100);
    let (result, metrics) = run_sink_with_dead(
        json!({ "url": url, "batch_timeout_ms": 1, "batch_max_events": 5, "in_flight": 1 }),
        10,
        Some(dead_tx),
    )
    .await;
    result.unwrap();
    assert_eq!(seqs(&server.accepted.lock().unwrap()), [5, 6, 7, 8, 9]);
    let dead = testing::take(&mut dead_rx, 5).await;
    let dead: Vec<(String, String)> = dead
        .iter()
        .map(|e| {
            let f = e.as_fields().unwrap();
            (
                f["message"].as_str().unwrap().to_string(),
                f["_error"]["message"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(dead[0].0, "{\"seq\":0}");
    assert!(
        dead.iter().all(|(_, why)| why == "HTTP 400: not now"),
        "the status and the answer's text: {dead:?}"
    );
    let m = metrics.snapshot();
    assert_eq!((m.events_out, m.routed, m.discarded), (5, 5, 0));
}

#[test]
fn bad_options_name_the_key() {
    let errors = |o: serde_json::Value| option_errors(&Typed(logbus_http::sink::HttpSink), o);
    assert!(errors(json!({ "url": "ftp://x" })).starts_with("url: "));
    assert!(
        errors(
            json!({ "url": "http://x", "retry_initial_backoff_ms": 10, "retry_max_backoff_ms": 5 })
        )
        .contains("retry_max_backoff_ms")
    );
    assert!(
        errors(json!({ "url": "http://x", "headers": { "bad header": "v" } }))
            .contains("headers.bad header")
    );
    assert!(errors(json!({ "url": "http://x", "method": "GET" })).contains("method"));
    assert!(errors(json!({ "url": "http://" })).starts_with("url: "));
    assert_eq!(
        errors(json!({ "url": "https://x", "headers": { "X-Api_Key-2": "v" } })),
        ""
    );
    for bad in ["", "a b", "ä"] {
        assert!(
            errors(json!({ "url": "http://x", "headers": { bad: "v" } }))
                .contains(&format!("headers.{bad}: not a valid header name")),
            "{bad:?}"
        );
    }
}

/// A refusal's reason quotes the answer's first 512 bytes, not all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_is_quoted_in_part() {
    let (_server, url) = start(&[Act::Verbose]).await;
    let (result, _) = run_sink(json!({ "url": url, "batch_timeout_ms": 1 }), 1).await;
    let err = result.unwrap_err();
    let quoted = format!("HTTP 400: {}", "why ".repeat(128).trim());
    assert!(err.contains(&quoted), "{err}");
    assert!(
        !err.contains(&format!("{quoted} why")),
        "more than 512 bytes: {err}"
    );
}

/// `validate --preflight` learns of the CA file.
#[test]
fn the_ca_file_is_stated() {
    let needs = testing::host_needs(
        &Typed(logbus_http::sink::HttpSink),
        json!({ "url": "https://h/", "tls": { "ca_file": "ca.pem" } }),
    );
    assert_eq!(needs, ["tls.ca_file: Pem ./ca.pem"]);
}
