//! The HTTP API against a real `logbus run` process on loopback: metrics,
//! stats, graph, server-sent stats, reload, bearer tokens — and a client
//! that never reads cannot slow the pipeline.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::free_port;

/// One HTTP/1.1 request; returns (status, body).
pub(crate) fn http(port: u16, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    request(port, method, path, &format!("Host: 127.0.0.1\r\n{auth}"))
}

/// One request with the given head lines; the status and body.
fn request(port: u16, method: &str, path: &str, headers: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A `logbus run` child process that is killed if the test fails before
/// stopping it, so a failing test never leaves an engine running (holding
/// the test runner's output pipes open).
pub(crate) struct Engine(Option<Child>);

impl Engine {
    pub(crate) fn from_child(child: Child) -> Engine {
        Engine(Some(child))
    }
    pub(crate) fn id(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }
    pub(crate) fn into_child(mut self) -> Child {
        self.0.take().expect("running")
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `logbus run` on `yml` with the API on a free loopback port, and
/// waits until the API answers.
pub(crate) fn start(dir: &Path, yml: &str, args: &[&str]) -> (Engine, u16) {
    let p = dir.join("p.yml");
    std::fs::write(&p, yml).unwrap();
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_logbus"))
        .env("LOGBUS_LOG", "warn")
        .arg("run")
        .arg(&p)
        .arg("--api")
        .arg(format!("127.0.0.1:{port}"))
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Engine(Some(child));
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the API never came up"
        );
        // An engine that could not start (its port taken) says why.
        if let Some(status) = child.0.as_mut().expect("running").try_wait().unwrap() {
            let mut err = String::new();
            let _ = child
                .0
                .take()
                .unwrap()
                .stderr
                .unwrap()
                .read_to_string(&mut err);
            panic!("logbus exited ({status}) before its API came up: {err}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (child, port)
}

fn stop(engine: Engine) -> String {
    Command::new("kill")
        .args(["-TERM", &engine.id().to_string()])
        .status()
        .unwrap();
    let o = engine.into_child().wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const PIPELINE: &str = "settings: { channel_capacity: 256 }\nstages:
  gen: { source: generator, rate: 5000 }
  json: { parser: json, inputs: [gen], on_error: route }
  out: { sink: blackhole, inputs: [json] }
  bad: { sink: blackhole, inputs: [json.errors] }
";

/// `PIPELINE` with its parser run by two workers that keep order, for the
/// graph's `workers` and `ordered` (the other tests keep one worker: two
/// at an unlimited rate take both cores from the API).
fn ordered_pipeline() -> String {
    PIPELINE.replace(
        "on_error: route }",
        "on_error: route, workers: 2, ordered: true }",
    )
}

fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .unwrap_or_else(|| panic!("no `{line_start}` in\n{text}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn metrics_stats_graph_stream_and_reload() {
    let dir = tempfile::tempdir().unwrap();
    let (child, port) = start(dir.path(), &ordered_pipeline(), &[]);

    let (status, text) = http(port, "GET", "/metrics", None);
    assert_eq!(status, 200);
    for family in [
        "logbus_events_in_total{stage=\"json\"}",
        "logbus_events_out_total{stage=\"gen\"}",
        "logbus_sink_retried_total{stage=\"out\"} 0",
        "logbus_channel_capacity{stage=\"out\"} 256",
        "logbus_inflight_bound_events 768",
        "logbus_process_resident_memory_bytes",
    ] {
        assert!(text.contains(family), "missing {family} in\n{text}");
    }
    let busy = metric(&text, "logbus_stage_busy_ratio{stage=\"json\"}");
    assert!((0.0..=1.0).contains(&busy), "{busy}");
    assert!(
        text.contains("logbus_batch_size_bucket{le=\"+Inf\",stage=\"json\"}"),
        "{text}"
    );
    assert!(
        text.contains("logbus_sink_latency_seconds_count{stage=\"out\"}"),
        "{text}"
    );
    assert!(
        text.contains("logbus_stage_blocked_seconds_total{stage=\"gen\"}"),
        "{text}"
    );
    let first = metric(&text, "logbus_events_out_total{stage=\"out\"}");
    let start = Instant::now();
    loop {
        let (_, text) = http(port, "GET", "/metrics", None);
        if metric(&text, "logbus_events_out_total{stage=\"out\"}") > first {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "counters never advanced"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let (status, body) = http(port, "GET", "/api/stats", None);
    assert_eq!(status, 200);
    let stats: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(stats["stages"].as_array().unwrap().len(), 4);
    assert_eq!(stats["inflight_bound"]["events"], 768);

    let (_, body) = http(port, "GET", "/api/graph", None);
    let graph: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(graph["stages"].as_array().unwrap().len(), 4);
    // Each stage says how many workers run it and whether they keep order.
    let json_stage = &graph["stages"][1];
    assert_eq!(json_stage["id"], "json", "{graph}");
    assert_eq!(json_stage["workers"], 2, "{graph}");
    assert_eq!(json_stage["ordered"], true, "{graph}");
    assert_eq!(graph["stages"][0]["ordered"], false, "{graph}");
    assert!(
        graph["edges"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["from"] == "json" && e["to"] == "bad" && e["errors"] == true)
    );

    // Server-sent stats: the first event comes at once.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /api/stats/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    .unwrap();
    let mut buf = vec![0u8; 8192];
    let mut got = String::new();
    while !got.contains("data: {") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(
        got.contains("text/event-stream") && got.contains("event: stats"),
        "{got}"
    );
    drop(s);

    // `logbus top --once`: one frame of the terminal view, with real rates.
    let o = Command::new(env!("CARGO_BIN_EXE_logbus"))
        .args(["top", "--once", "--api", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let frame = String::from_utf8_lossy(&o.stdout);
    for stage in ["gen", "json", "out", "bad"] {
        assert!(frame.contains(&format!("│{stage} ")), "{frame}");
    }
    let gen_rate: f64 = frame
        .lines()
        .find(|l| l.starts_with("│gen "))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|r| r.parse().ok())
        .unwrap();
    assert!(gen_rate > 1000.0, "the generator runs at 5000/s: {frame}");
    let o = Command::new(env!("CARGO_BIN_EXE_logbus"))
        .arg("top")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));

    // Tap: a live sample of what leaves a stage.
    let (status, body) = http(port, "GET", "/api/tap?stage=json&limit=5", None);
    assert_eq!(status, 200, "{body}");
    let sample: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(sample["events"].as_array().unwrap().len(), 5, "{sample}");
    assert!(sample["events"][0]["seq"].is_u64(), "{sample}");
    assert_eq!(http(port, "GET", "/api/tap?stage=out", None).0, 404);

    // Reload: a valid change applies, an invalid file is refused.
    std::fs::write(
        dir.path().join("p.yml"),
        ordered_pipeline().replace("rate: 5000", "rate: 4000"),
    )
    .unwrap();
    let (status, body) = http(port, "POST", "/api/reload", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["changed"][0],
        "gen"
    );
    std::fs::write(
        dir.path().join("p.yml"),
        "stages:\n  gen: { source: nope }\n",
    )
    .unwrap();
    let (status, body) = http(port, "POST", "/api/reload", None);
    assert_eq!(status, 422);
    assert!(body.contains("unknown source plugin `nope`"), "{body}");
    let (status, _) = http(port, "GET", "/api/stats", None);
    assert_eq!(status, 200, "still serving after a refused reload");
    stop(child);
}

#[test]
fn a_client_that_never_reads_does_not_slow_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let (child, port) = start(dir.path(), &PIPELINE.replace("rate: 5000", "rate: 0"), &[]);
    // As many stream subscribers as there are slots. Each reads its
    // response head, so it is known to hold a slot before the next one
    // asks, and then never reads another byte.
    let stuck: Vec<TcpStream> = (0..64)
        .map(|_| {
            let (s, head) = open_stats_stream(port);
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            s
        })
        .collect();
    let committed = |port| {
        let (_, text) = http(port, "GET", "/metrics", None);
        metric(&text, "logbus_events_out_total{stage=\"out\"}")
    };
    let before = committed(port);
    // One more is told to come back later: every slot is held.
    let (_refused, head) = open_stats_stream(port);
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert!(head.contains("retry-after: 1"), "{head}");
    let start = Instant::now();
    while committed(port) < before + 200_000.0 {
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "the pipeline stalled behind stuck clients"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stuck);
    let err = stop(child);
    assert!(err.contains("lost=0"), "{err}");
}

/// Asks for the stats stream and reads the answer's head (the body of a
/// stream that got a slot never ends), keeping the connection open.
fn open_stats_stream(port: u16) -> (TcpStream, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "GET /api/stats/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    .unwrap();
    let head = read_head(&mut s);
    (s, head)
}

/// Reads until the end of a response's head (a stream's body never ends).
fn read_head(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(1) => got.push(buf[0]),
            other => panic!("reading a response head: {other:?} after {got:?}"),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn bearer_token_and_address_rules() {
    let dir = tempfile::tempdir().unwrap();
    let (child, port) = start(
        dir.path(),
        &PIPELINE.replace(
            "settings: { channel_capacity: 256 }",
            "settings: { channel_capacity: 256, api: { listen: '127.0.0.1:1', token: s3cret-0123456789abcdef } }",
        ),
        &[],
    );
    assert_eq!(http(port, "GET", "/metrics", None).0, 401);
    assert_eq!(http(port, "GET", "/metrics", Some("wrong")).0, 401);
    // The page alone is served without the token (docs/api.md: a browser
    // cannot send one when it opens it, and it holds no data); what it
    // fetches is not.
    let (status, page) = http(port, "GET", "/", None);
    assert_eq!(status, 200);
    assert_eq!(
        page,
        include_str!("../../../api/src/ui.html"),
        "the page is the static file"
    );
    for path in ["/api/stats", "/api/graph", "/api/tap?stage=a"] {
        assert_eq!(http(port, "GET", path, None).0, 401, "{path}");
    }
    assert_eq!(
        http(port, "GET", "/metrics", Some("s3cret-0123456789abcdef")).0,
        200
    );
    stop(child);

    // Listening beyond loopback without a token is refused before start.
    let p = dir.path().join("open.yml");
    std::fs::write(&p, PIPELINE).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_logbus"))
        .args(["run"])
        .arg(&p)
        .args(["--api", "0.0.0.0:18999"])
        .env_remove("LOGBUS_API_TOKEN")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("set `api.token`"));
    let v = crate::support::load(
        "settings:\n  api: { listen: '0.0.0.0:8686' }\nstages:\n  a: { source: stdin }\n  o: { sink: stdout, inputs: [a] }\n",
    );
    let d = v
        .diagnostics
        .iter()
        .find(|d| d.code == "settings")
        .expect("refused in validate too");
    assert_eq!((d.line, d.col), (Some(2), Some(10)), "points at `listen`");

    // A token that cannot protect anything is refused, in the file and
    // from the environment.
    for token in ["' '", "short", "'sixteen chars but spaces'"] {
        let v = crate::support::load(&format!(
            "settings:\n  api: {{ listen: '127.0.0.1:8686', token: {token} }}\nstages:\n  a: {{ source: stdin }}\n  o: {{ sink: stdout, inputs: [a] }}\n"
        ));
        let d = v
            .diagnostics
            .iter()
            .find(|d| d.code == "settings")
            .unwrap_or_else(|| panic!("token {token} accepted"));
        assert!(d.message.contains("token"), "{}", d.message);
    }
    let o = Command::new(env!("CARGO_BIN_EXE_logbus"))
        .args(["run"])
        .arg(&p)
        .args(["--api", "127.0.0.1:18999"])
        .env("LOGBUS_API_TOKEN", " ")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("api.token: must be at least 16 characters"),
        "{err}"
    );
}

/// A local-scope queue's routing and helping counters reach `/metrics`
/// and `/api/stats` from the same snapshot.
#[test]
fn local_queue_counters_are_exported() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = "stages:
  gen: { source: generator, rate: 5000 }
  out: { sink: blackhole, inputs: [gen], queue: { scope: local, local: { max_frontends: 2 } } }
";
    let (child, port) = start(dir.path(), pipeline, &[]);
    let fe = "logbus_queue_routed_events_total{stage=\"out\",path=\"frontend\",reason=\"fit\"}";
    let started = Instant::now();
    loop {
        let (status, text) = http(port, "GET", "/metrics", None);
        assert_eq!(status, 200);
        if text.contains(fe) && metric(&text, fe) > 0.0 {
            assert!(
                text.contains("logbus_queue_registrations_total{stage=\"out\"} 1"),
                "{text}"
            );
            assert!(
                text.contains("logbus_queue_frontend_queued{stage=\"out\",slot=\"0\"}"),
                "{text}"
            );
            assert!(
                text.contains("logbus_queue_outstanding{stage=\"out\"}"),
                "{text}"
            );
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, body) = http(port, "GET", "/api/stats", None);
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    let local = &stats["channels"][0]["local"];
    assert_eq!(local["max_frontends"], 2, "{stats}");
    assert_eq!(local["slots_recycled"], false);
    stop(child);
}

/// `logbus top` shows, per acknowledging source, what its sinks confirmed
/// and the age of the oldest unconfirmed batch; `/metrics` has the same.
#[test]
fn top_and_metrics_show_a_sources_acknowledgements() {
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (0..300).map(|i| format!("line {i}\n")).collect();
    std::fs::write(dir.path().join("in.log"), lines).unwrap();
    let (engine, port) = start(
        dir.path(),
        &format!(
            "stages:
  logs: {{ source: tail, paths: [\"{dir}/in.log\"], state_dir: \"{dir}/state\", checkpoint_interval_ms: 50 }}
  out: {{ sink: blackhole, inputs: [logs] }}
",
            dir = dir.path().display()
        ),
        &[],
    );
    let began = Instant::now();
    loop {
        let (_, text) = http(port, "GET", "/metrics", None);
        if text.contains("logbus_source_acked_delivered_total{stage=\"logs\"} 300") {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "the acknowledgements never reached /metrics: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = Command::new(env!("CARGO_BIN_EXE_logbus"))
        .args(["top", "--once", "--api", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    let frame = String::from_utf8_lossy(&o.stdout);
    assert!(
        frame.contains(
            "acknowledgements logs: delivered 300  rejected 0  errored 0  oldest unacknowledged 0 ms"
        ),
        "{frame}"
    );
    assert!(!frame.contains("acknowledgements out:"), "{frame}");
    stop(engine);
}

/// DNS rebinding and cross-site forgery against a token-less API on
/// loopback: a request naming a host the API does not answer to is
/// refused, and so is a state change from another origin or shaped as a
/// form; the API's own addresses, `localhost` and configured names work.
#[test]
fn host_and_origin_checks_stop_other_sites() {
    let dir = tempfile::tempdir().unwrap();
    let yml = format!(
        "settings: {{ api: {{ listen: '127.0.0.1:1', allowed_hosts: [logs.internal] }} }}\n{}",
        PIPELINE.trim_start_matches("settings: { channel_capacity: 256 }\n")
    );
    let (child, port) = start(dir.path(), &yml, &[]);
    for path in [
        "/api/tap?stage=json&wait_ms=10",
        "/api/stats",
        "/metrics",
        "/",
    ] {
        let (status, body) = request(port, "GET", path, "Host: evil.example\r\n");
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("Host `evil.example`"), "{body}");
        let (status, _) = request(port, "GET", path, &format!("Host: evil.example:{port}\r\n"));
        assert_eq!(status, 403, "{path} with a port");
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "localhost".to_string(),
        format!("[::1]:{port}"),
        format!("LOGS.internal:{port}"),
    ] {
        let (status, body) = request(port, "GET", "/api/stats", &format!("Host: {host}\r\n"));
        assert_eq!(status, 200, "{host}: {body}");
    }
    let host = format!("Host: 127.0.0.1:{port}\r\n");
    let (status, body) = request(
        port,
        "POST",
        "/api/reload",
        &format!("{host}Origin: http://evil.example\r\n"),
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("origin `http://evil.example`"), "{body}");
    for form in [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "text/plain",
    ] {
        let (status, body) = request(
            port,
            "POST",
            "/api/reload",
            &format!("{host}Content-Type: {form}\r\n"),
        );
        assert_eq!(status, 403, "{form}: {body}");
    }
    // The same origin, and a client that sends no Origin (curl), may.
    let (status, body) = request(
        port,
        "POST",
        "/api/reload",
        &format!("{host}Origin: http://127.0.0.1:{port}\r\nContent-Type: application/json\r\n"),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = request(port, "POST", "/api/reload", &host);
    assert_eq!(status, 200, "{body}");
    stop(child);
}

/// Taps hold events per client: at most 16 run at once and the 17th is
/// told to come back (429, Retry-After); a slot comes free when a tap ends.
#[test]
fn taps_have_a_fixed_number_of_slots() {
    let dir = tempfile::tempdir().unwrap();
    // One event a second: a tap of 10 waits its full wait_ms.
    let yml = "stages:\n  gen: { source: generator, rate: 1 }\n  out: { sink: blackhole, inputs: [gen] }\n";
    let (child, port) = start(dir.path(), yml, &[]);
    let (status, body) = http(port, "GET", "/api/tap?stage=gen&wait_ms=1", None);
    assert_eq!(status, 200, "{body}");
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let holders: Vec<_> = (0..16)
        .map(|_| {
            let started_tx = started_tx.clone();
            std::thread::spawn(move || {
                started_tx.send(()).unwrap();
                // The prober below may hold a slot for a moment: retry.
                loop {
                    let (status, _) = http(port, "GET", "/api/tap?stage=gen&wait_ms=3000", None);
                    if status != 429 {
                        return status;
                    }
                }
            })
        })
        .collect();
    for _ in 0..16 {
        started_rx.recv().unwrap();
    }
    // Until the server holds all 16 slots, a short tap still gets one.
    let began = Instant::now();
    let (status, body) = loop {
        let (status, body) = http(port, "GET", "/api/tap?stage=gen&wait_ms=1", None);
        if status == 429 || began.elapsed() > Duration::from_secs(2) {
            break (status, body);
        }
    };
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("16 taps are open already"), "{body}");
    let codes: Vec<u16> = holders.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(codes.iter().all(|&c| c == 200), "{codes:?}");
    let (status, body) = http(port, "GET", "/api/tap?stage=gen&wait_ms=1", None);
    assert_eq!(status, 200, "a slot is free again: {body}");
    stop(child);
}

/// A tap answer stops collecting at 4 MiB of events (as JSON) even when
/// its `limit` is not reached, and says so.
#[test]
fn a_tap_answer_stops_at_four_mebibytes() {
    let dir = tempfile::tempdir().unwrap();
    let yml = format!(
        "stages:\n  gen: {{ source: generator, template: '{{{{\"seq\":{{{{seq}}}},\"pad\":\"{}\"}}}}' }}\n  out: {{ sink: blackhole, inputs: [gen] }}\n",
        "x".repeat(20_000)
    );
    let (child, port) = start(dir.path(), &yml, &[]);
    let (status, body) = http(
        port,
        "GET",
        "/api/tap?stage=gen&limit=1000&wait_ms=20000",
        None,
    );
    assert_eq!(status, 200);
    let answer: Value = serde_json::from_str(&body).unwrap();
    let events = answer["events"].as_array().unwrap();
    assert_eq!(answer["truncated"], true, "{} events", events.len());
    // Each event is ~20 KB: the answer stops just past 4 MiB, far below 1000.
    assert!(
        (200..=220).contains(&events.len()),
        "{} events",
        events.len()
    );
    assert!(body.len() < (4 << 20) + 64 * 1024, "{} bytes", body.len());
    stop(child);
}

/// A route's outputs: counted each in `/metrics` and `/api/stats`, drawn
/// as labelled (not dashed) edges in `/api/graph`.
#[test]
fn a_routes_outputs_are_counted_and_drawn() {
    let dir = tempfile::tempdir().unwrap();
    let (child, port) = start(
        dir.path(),
        "stages:
  gen: { source: generator, rate: 5000 }
  json: { parser: json, inputs: [gen] }
  split: { transform: route, inputs: [json], routes: { odd: 'seq >= 0 && ends_with(message, \"logbus\")', none: 'seq < 0' } }
  a: { sink: blackhole, inputs: [split.odd] }
  b: { sink: blackhole, inputs: [split.none, split._unmatched] }
",
        &[],
    );
    let start = Instant::now();
    let odd = loop {
        let (_, text) = http(port, "GET", "/metrics", None);
        let odd = metric(
            &text,
            "logbus_stage_output_events_total{stage=\"split\",output=\"odd\"}",
        );
        assert!(
            text.contains("logbus_stage_output_events_total{stage=\"split\",output=\"none\"} 0")
        );
        if odd > 0.0 {
            break odd;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never counted");
        std::thread::sleep(Duration::from_millis(20));
    };
    let (_, body) = http(port, "GET", "/api/stats", None);
    let stats: Value = serde_json::from_str(&body).unwrap();
    let split = stats["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "split")
        .unwrap();
    assert!(split["outputs"]["odd"].as_f64().unwrap() >= odd, "{split}");
    assert_eq!(split["outputs"]["_unmatched"], 0, "{split}");
    let (_, body) = http(port, "GET", "/api/graph", None);
    let graph: Value = serde_json::from_str(&body).unwrap();
    let edge = |to: &str, side: &str| {
        graph["edges"].as_array().unwrap().iter().any(|e| {
            e["from"] == "split" && e["to"] == to && e["side"] == side && e["errors"] == false
        })
    };
    assert!(
        edge("a", "odd") && edge("b", "none") && edge("b", "_unmatched"),
        "{graph}"
    );
    // A tap of the route stage sees what leaves it by its routes.
    let (status, body) = http(
        port,
        "GET",
        "/api/tap?stage=split&limit=5&wait_ms=5000",
        None,
    );
    assert_eq!(status, 200, "{body}");
    let tap: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(tap["events"].as_array().unwrap().len(), 5, "{tap}");
    assert!(tap["events"][0]["seq"].is_u64(), "{tap}");
    stop(child);
}
