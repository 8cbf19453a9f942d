//! The API's router in-process, against a running pipeline: who it
//! answers (Host, bearer token, origin, form posts) and what each route
//! returns. The end-to-end tests in `crates/logbus/tests/it/api.rs` run
//! the same routes through `logbus run --api`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use logbus_api::{ApiState, ReloadFn, router};
use logbus_core::{RunningPipeline, load_str, start};
use logbus_plugin_api::{CancellationToken, Registry};
use serde_json::{Value, json};
use tower::ServiceExt;

const TOKEN: &str = "s3cret";

struct Api {
    state: ApiState,
    reloads: Arc<AtomicUsize>,
    running: Option<RunningPipeline>,
    stop: CancellationToken,
}

impl Api {
    fn start() -> Api {
        Api::start_with(
            "stages:
  gen: { source: generator, count: 100000000, rate: 1000, template: '{\"seq\":{{seq}}}' }
  out: { sink: blackhole, inputs: [gen] }
",
        )
    }

    fn start_with(text: &str) -> Api {
        let mut registry = Registry::new();
        logbus_io::register(&mut registry);
        let loaded = load_str(text, Path::new("api.yml"), &registry, &|_| None);
        let pipeline = loaded.pipeline.expect("a valid pipeline");
        let stop = CancellationToken::new();
        let running = start(&pipeline, stop.clone()).expect("it starts");
        let reloads = Arc::new(AtomicUsize::new(0));
        let reload: ReloadFn = {
            let reloads = reloads.clone();
            Arc::new(move || {
                let n = reloads.fetch_add(1, Ordering::SeqCst);
                Box::pin(async move {
                    match n {
                        0 => Ok(json!({ "changed": [] })),
                        _ => Err("stage `out`: bad option".to_string()),
                    }
                })
            })
        };
        let state = ApiState::new(
            running.stats(),
            reload,
            Some(TOKEN.into()),
            vec!["logbus.internal".into()],
        );
        Api {
            state,
            reloads,
            running: Some(running),
            stop,
        }
    }

    /// Sends `request` (a valid Host and the token unless it names its
    /// own); returns the status and the body.
    async fn send(&self, request: axum::http::request::Builder) -> (StatusCode, String) {
        let response = self.respond(request).await;
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// The response to `request` (as `send` fills it in), body unread.
    async fn respond(&self, request: axum::http::request::Builder) -> axum::response::Response {
        let mut request = request.body(Body::empty()).unwrap();
        let headers = request.headers_mut();
        if !headers.contains_key(header::HOST) {
            headers.insert(header::HOST, "127.0.0.1:9000".parse().unwrap());
        }
        if !headers.contains_key(header::AUTHORIZATION) {
            headers.insert(
                header::AUTHORIZATION,
                format!("Bearer {TOKEN}").parse().unwrap(),
            );
        }
        router(self.state.clone()).oneshot(request).await.unwrap()
    }

    async fn stop(mut self) {
        self.stop.cancel();
        let report = self.running.take().unwrap().wait().await;
        assert!(report.is_clean(), "{report}");
    }
}

fn get(path: &str) -> axum::http::request::Builder {
    Request::builder().uri(path)
}

fn post(path: &str) -> axum::http::request::Builder {
    Request::builder().method("POST").uri(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_hosts_it_answers_to_get_an_answer() {
    let api = Api::start();
    for host in [
        "127.0.0.1:9000",
        "127.0.0.1",
        "[::1]:9000",
        "[::1]",
        "localhost:9000",
        "LOCALHOST.",
        "ui.localhost",
        "logbus.internal:9000",
        "LogBus.Internal.",
    ] {
        let (status, body) = api.send(get("/api/stats").header(header::HOST, host)).await;
        assert_eq!(status, StatusCode::OK, "Host {host}: {body}");
    }
    for host in [
        "evil.example",
        "evil.example:9000",
        "localhost.evil.example",
        "127.0.0.1.evil.example",
        "logbus.internal.evil.example",
        "[evil]:9000",
        "localhost:http",
    ] {
        let (status, body) = api.send(get("/api/stats").header(header::HOST, host)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "Host {host}");
        assert_eq!(
            body,
            format!(
                "this API does not answer to Host `{host}`; name it in settings.api.allowed_hosts if it is yours\n"
            )
        );
    }
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_but_the_page_needs_the_token() {
    let api = Api::start();
    for path in ["/metrics", "/api/stats", "/api/graph", "/api/tap?stage=gen"] {
        for auth in ["", "Bearer wrong", "Basic czNjcmV0", "bearer s3cret"] {
            let (status, body) = api
                .send(get(path).header(header::AUTHORIZATION, auth))
                .await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path} with `{auth}`");
            assert_eq!(body, "missing or wrong bearer token\n");
        }
    }
    let (status, _) = api
        .send(post("/api/reload").header(header::AUTHORIZATION, ""))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        api.reloads.load(Ordering::SeqCst),
        0,
        "refused before reloading"
    );
    // The page holds no data: it loads without the token.
    let (status, page) = api.send(get("/").header(header::AUTHORIZATION, "")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("<html"), "{page}");
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_from_another_origin_or_a_form_is_refused() {
    let api = Api::start();
    let (status, body) = api
        .send(post("/api/reload").header(header::ORIGIN, "http://evil.example"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        body,
        "a request from origin `http://evil.example` cannot change this pipeline\n"
    );
    for form in [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "Text/Plain;charset=utf-8",
    ] {
        let (status, body) = api
            .send(post("/api/reload").header(header::CONTENT_TYPE, form))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{form}");
        assert_eq!(
            body,
            "a form post cannot change this pipeline; send no body or application/json\n"
        );
    }
    assert_eq!(api.reloads.load(Ordering::SeqCst), 0, "nothing reloaded");
    // The same origin, as the page sends it: reloaded, the summary back.
    let (status, body) = api
        .send(
            post("/api/reload")
                .header(header::ORIGIN, "http://127.0.0.1:9000")
                .header(header::CONTENT_TYPE, "application/json"),
        )
        .await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, r#"{"changed":[]}"#)
    );
    // A refused reload says why, as 422.
    let (status, body) = api.send(post("/api/reload")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body, r#"{"error":"stage `out`: bad option"}"#);
    assert_eq!(api.reloads.load(Ordering::SeqCst), 2);
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_graph_and_metrics_describe_the_running_pipeline() {
    let api = Api::start();
    let (status, body) = api.send(get("/api/stats")).await;
    assert_eq!(status, StatusCode::OK);
    let stats: Value = serde_json::from_str(&body).unwrap();
    // One queue (out's input) of the default capacity.
    assert_eq!(stats["inflight_bound"]["events"], json!(4096));
    assert!(stats["rss_bytes"].as_u64().unwrap() > 0, "{stats}");
    let ids: Vec<&str> = stats["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["gen", "out"]);

    let (status, body) = api.send(get("/api/graph")).await;
    assert_eq!(status, StatusCode::OK);
    let graph: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(graph["stages"][0]["id"], "gen");
    assert_eq!(graph["stages"][1]["inputs"], json!(["gen"]));
    assert_eq!(graph["edges"].as_array().unwrap().len(), 1, "{graph}");

    let response = api.respond(get("/metrics")).await;
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("logbus_events_in_total{stage=\"out\"")),
        "{text}"
    );
    api.stop().await;
}

/// A tap answers with the events leaving a stage, up to its limit, and
/// says it was not cut short by the byte cap; an unknown stage is a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_returns_the_events_leaving_a_stage() {
    let api = Api::start();
    let (status, body) = api
        .send(get("/api/tap?stage=gen&limit=3&wait_ms=10000"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let tap: Value = serde_json::from_str(&body).unwrap();
    let events = tap["events"].as_array().unwrap();
    assert_eq!(events.len(), 3, "{tap}");
    // The generator's events are raw lines: the tap shows them as text.
    assert!(
        events
            .iter()
            .all(|e| e.as_str().is_some_and(|t| t.starts_with("{\"seq\":"))),
        "{tap}"
    );
    assert_eq!(tap["truncated"], json!(false));
    let (status, body) = api.send(get("/api/tap?stage=nope")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("no stage `nope`"), "{body}");
    api.stop().await;
}

/// `serve` answers on its listener until the task is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_on_its_listener() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let api = Api::start();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(logbus_api::serve(listener, api.state.clone()));
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("text/html"), "{answer}");
    assert!(!server.is_finished(), "serve returned: {:?}", server.await);
    server.abort();
    api.stop().await;
}

/// Without `limit` a tap returns 10 events, waiting up to 2 s for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_without_options_returns_ten_events() {
    let api = Api::start();
    let (status, body) = api.send(get("/api/tap?stage=gen")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let tap: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(tap["events"].as_array().unwrap().len(), 10, "{tap}");
    api.stop().await;
}

/// With every slot taken, a tap and a stats stream get 429 and say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taps_and_streams_past_their_slots_are_told_to_come_back() {
    let api = Api::start();
    let taps = api
        .state
        .taps
        .clone()
        .try_acquire_many_owned(logbus_api::MAX_TAPS as u32)
        .unwrap();
    let streams = api
        .state
        .streams
        .clone()
        .try_acquire_many_owned(logbus_api::MAX_STREAMS as u32)
        .unwrap();
    let (status, body) = api.send(get("/api/tap?stage=gen")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains("16 taps are open already"), "{body}");
    let (status, body) = api.send(get("/api/stats/stream")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains("64 stats streams are open already"), "{body}");
    drop((taps, streams));
    let (status, _) = api.send(get("/api/tap?stage=gen&limit=1")).await;
    assert_eq!(status, StatusCode::OK);
    api.stop().await;
}

/// A stats stream sends its first snapshot at once (then one a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stats_stream_starts_with_a_snapshot_at_once() {
    use futures::FutureExt;
    let api = Api::start();
    let response = api.respond(get("/api/stats/stream")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    let mut body = response.into_body();
    let frame = body
        .frame()
        .now_or_never()
        .expect("the first snapshot is ready without waiting")
        .unwrap()
        .unwrap();
    let text = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
    assert!(text.starts_with("event: stats\ndata: {"), "{text}");
    assert!(text.contains("\"inflight_bound\""), "{text}");
    drop(body);
    api.stop().await;
}

/// Reading is allowed from any origin (a browser cannot read the answer
/// without CORS); only state changes are held to the same origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_from_another_origin_is_answered() {
    let api = Api::start();
    for method in ["GET", "HEAD"] {
        let (status, _) = api
            .send(
                Request::builder()
                    .method(method)
                    .uri("/api/stats")
                    .header(header::ORIGIN, "http://evil.example")
                    .header(header::CONTENT_TYPE, "text/plain"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{method}");
    }
    api.stop().await;
}

/// A tap answer holds at most 4 MiB of events, and says it was cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_answer_stops_at_its_byte_cap() {
    let pad = "x".repeat(8000);
    let api = Api::start_with(&format!(
        "stages:
  gen: {{ source: generator, count: 100000000, rate: 20000, template: '{{\"seq\":{{{{seq}}}},\"pad\":\"{pad}\"}}' }}
  out: {{ sink: blackhole, inputs: [gen] }}
"
    ));
    let (status, body) = api
        .send(get("/api/tap?stage=gen&limit=1000&wait_ms=30000"))
        .await;
    assert_eq!(status, StatusCode::OK);
    let tap: Value = serde_json::from_str(&body).unwrap();
    let events = tap["events"].as_array().unwrap();
    assert_eq!(tap["truncated"], json!(true));
    // Each event is about 8 KB as JSON: the cap falls within the 524th.
    let cap = logbus_api::TAP_MAX_BYTES;
    let each = serde_json::to_string(&events[0]).unwrap().len();
    assert_eq!(events.len(), cap.div_ceil(each), "{each} bytes each");
    api.stop().await;
}
