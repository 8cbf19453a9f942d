//! Syslog over TCP and UDP on loopback: the system `logger` as a real
//! client (octet counting, newline, UDP), LogBus's own sink into its own
//! source, a receiver that is down at first, TCP flow control as
//! backpressure, and a connection that breaks the framing.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use logbus_plugin_api::testing::{
    self, RunningSource, build_errors, option_errors, run_sink_counting, run_source, take_text,
};
use logbus_plugin_api::{Event, Meta, Plugin, StageMetrics, Typed};
use serde_json::json;

use logbus_test_ports::free_port;

/// The syslog source running, once it listens.
async fn source(options: serde_json::Value, capacity: usize) -> RunningSource {
    let running = run_source(
        testing::source(&Typed(logbus_net::source::SyslogSource), options.clone()),
        capacity,
    );
    // Wait until it listens (TCP: it accepts; UDP: the kernel lists its
    // socket bound to the port).
    let address: std::net::SocketAddr = options["address"].as_str().unwrap().parse().unwrap();
    if options["mode"] == "udp" {
        while !udp_bound(address.port()) {
            assert!(!running.task.is_finished(), "the source did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    } else {
        while tokio::net::TcpStream::connect(address).await.is_err() {
            assert!(!running.task.is_finished(), "the source did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    running
}

/// Whether a UDP socket is bound to `port` on this host (Linux's
/// `/proc/net/udp`, local address column `ADDR:PORT` in hex).
fn udp_bound(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/udp").expect("/proc/net/udp");
    let wanted = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(1))
        .any(|local| local.ends_with(&wanted))
}

/// Fails the test unless util-linux `logger` (with `--octet-count`) runs.
fn require_logger() {
    let ok = std::process::Command::new("logger")
        .arg("--help")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--octet-count"));
    assert!(
        ok,
        "util-linux `logger` (with --octet-count) is required here (apt install bsdutils)"
    );
}

fn logger(args: &[&str]) {
    let status = std::process::Command::new("logger")
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "logger {args:?}");
}

#[ignore = "needs util-linux logger (apt install bsdutils); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logger_over_tcp_both_framings_and_udp() {
    require_logger();
    let port = free_port().to_string();
    let mut s = source(json!({ "address": format!("127.0.0.1:{port}") }), 100).await;
    logger(&[
        "--server",
        "127.0.0.1",
        "--port",
        &port,
        "--tcp",
        "--octet-count",
        "--rfc5424",
        "-t",
        "app",
        "counted message",
    ]);
    logger(&[
        "--server",
        "127.0.0.1",
        "--port",
        &port,
        "--tcp",
        "--rfc3164",
        "-t",
        "app",
        "newline message",
    ]);
    let got = take_text(&mut s.rx, 2).await;
    assert!(
        got.iter()
            .any(|m| m.starts_with('<') && m.contains(" app ") && m.ends_with("counted message")),
        "{got:?}"
    );
    assert!(
        got.iter()
            .any(|m| m.starts_with('<') && m.contains("app:") && m.ends_with("newline message")),
        "{got:?}"
    );
    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();

    let port = free_port().to_string();
    let mut s = source(
        json!({ "mode": "udp", "address": format!("127.0.0.1:{port}") }),
        100,
    )
    .await;
    // UDP may lose a datagram sent before the socket was bound: resend.
    let got = loop {
        logger(&[
            "--server",
            "127.0.0.1",
            "--port",
            &port,
            "--udp",
            "--rfc5424",
            "-t",
            "app",
            "over udp",
        ]);
        if let Ok(got) = tokio::time::timeout(Duration::from_secs(1), take_text(&mut s.rx, 1)).await
        {
            break got;
        }
    };
    assert!(got[0].ends_with("over udp"), "{got:?}");
    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();
}

async fn forward(options: serde_json::Value, n: usize) -> Arc<StageMetrics> {
    forward_counting(options, n, Arc::new(StageMetrics::default())).await
}

/// [`forward`], counting into `metrics` (watched while it runs).
async fn forward_counting(
    options: serde_json::Value,
    n: usize,
    metrics: Arc<StageMetrics>,
) -> Arc<StageMetrics> {
    let batches = (0..n)
        .collect::<Vec<_>>()
        .chunks(50)
        .map(|chunk| {
            chunk
                .iter()
                .map(|i| {
                    Event::raw(
                        format!("<14>1 2026-11-30T10:00:00Z host app - - - message {i}"),
                        Meta::at("t", 0),
                    )
                })
                .collect()
        })
        .collect();
    let (result, metrics) = run_sink_counting(
        testing::sink(&Typed(logbus_net::sink::SyslogSink), options),
        batches,
        metrics,
    )
    .await;
    result.unwrap();
    metrics
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logbus_to_logbus_over_tcp_and_udp_with_the_receiver_down_at_first() {
    // TCP, octet counting; the receiver starts once the sender has failed
    // and retried (its counter says so).
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let counted = Arc::new(StageMetrics::default());
    let sender = tokio::spawn(forward_counting(
        json!({ "address": address, "retry_initial_backoff_ms": 10, "retry_max_backoff_ms": 50 }),
        500,
        counted.clone(),
    ));
    let began = std::time::Instant::now();
    while counted.snapshot().retried == 0 {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "no retry within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut s = source(
        json!({ "address": address, "framing": "octet-counting" }),
        1000,
    )
    .await;
    let got = take_text(&mut s.rx, 500).await;
    assert_eq!(sender.await.unwrap().snapshot().events_out, 500);
    let want: Vec<String> = (0..500)
        .map(|i| format!("<14>1 2026-11-30T10:00:00Z host app - - - message {i}"))
        .collect();
    assert_eq!(got, want);
    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();

    // UDP.
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let mut s = source(json!({ "mode": "udp", "address": address }), 1000).await;
    let metrics = forward(json!({ "mode": "udp", "address": address }), 100).await;
    assert_eq!(metrics.snapshot().events_out, 100);
    let got = take_text(&mut s.rx, 100).await;
    assert_eq!(got.len(), 100);
    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pipeline_stops_reading_the_socket_so_the_sender_blocks() {
    let port = free_port();
    let mut s = source(json!({ "address": format!("127.0.0.1:{port}") }), 10).await;
    let line = format!("<14>{}\n", "x".repeat(1000));
    let total = 20_000; // ~20 MB: far beyond any socket buffer
    let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    client.set_nonblocking(true).unwrap();
    let bytes = line.repeat(total).into_bytes();
    let mut written = 0;
    // Nobody reads the pipeline: the source stops reading, the kernel
    // buffers fill, and the sender is told to wait.
    let blocked = loop {
        match client.write(&bytes[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break true,
            Err(e) => panic!("{e}"),
        }
        if written == bytes.len() {
            break false;
        }
    };
    assert!(
        blocked,
        "all {written} bytes were taken without backpressure"
    );
    assert!(written < bytes.len());
    // Drain it all while the rest is written: nothing is lost.
    client.set_nonblocking(false).unwrap();
    let writer = std::thread::spawn(move || {
        client.write_all(&bytes[written..]).unwrap();
    });
    let got = take_text(&mut s.rx, total).await;
    writer.join().unwrap();
    assert_eq!(got.len(), total);
    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_breaks_the_framing_is_closed_and_others_go_on() {
    let port = free_port();
    let mut s = source(
        json!({ "address": format!("127.0.0.1:{port}"), "framing": "octet-counting" }),
        100,
    )
    .await;
    let mut bad = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    bad.write_all(b"5 hellox3 bad").unwrap();
    let mut good = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    good.write_all(b"2 ok").unwrap();
    drop(good);
    let mut got = take_text(&mut s.rx, 2).await;
    got.sort();
    assert_eq!(got, ["hello", "ok"]);
    // The bad connection was closed by the source.
    bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(std::io::Read::read(&mut bad, &mut buf).unwrap_or(0), 0);
    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();
}

/// Whether the source has closed `stream` (a read sees the end).
fn closed_by_source(stream: &mut std::net::TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let read = std::io::Read::read(stream, &mut [0u8; 1]);
    stream.set_nonblocking(false).unwrap();
    match read {
        Ok(n) => n == 0,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// Issue 54: clients that dribble bytes and never finish a message made a
/// quiet sender the longest idle, and it was closed to admit them; its
/// next message was lost. Now the dribblers go first, and the sender's
/// next message arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dribbling_connections_are_closed_before_a_quiet_sender() {
    let port = free_port();
    let mut s = source(
        json!({ "address": format!("127.0.0.1:{port}"), "framing": "newline", "max_connections": 4 }),
        100,
    )
    .await;
    let mut sender = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    sender.write_all(b"first\n").unwrap();
    assert_eq!(take_text(&mut s.rx, 1).await, ["first"]);
    let mut dribblers: Vec<std::net::TcpStream> = Vec::new();
    for _ in 0..3 {
        let mut d = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        d.write_all(b"x").unwrap();
        dribblers.push(d);
    }
    // Each newcomer finds the table full: one dribbler is closed for it.
    for newcomer in 0..3 {
        let mut d = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        d.write_all(b"x").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(i) = dribblers.iter_mut().position(closed_by_source) {
                dribblers.remove(i);
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "newcomer {newcomer}: no dribbler was closed (the sender was, instead: {})",
                closed_by_source(&mut sender)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        dribblers.push(d);
    }
    assert!(!closed_by_source(&mut sender));
    sender.write_all(b"second\n").unwrap();
    // A closed dribbler's unfinished message, if its byte was read, is
    // passed on as it was (not lost either); then the sender's.
    let mut before = Vec::new();
    loop {
        let got = take_text(&mut s.rx, 1).await;
        if got == ["second"] {
            break;
        }
        before.extend(got);
        assert!(
            before.len() <= 3 && before.iter().all(|m| m == "x"),
            "{before:?}"
        );
    }
    s.shutdown.cancel();
    drop(dribblers);
    s.task.await.unwrap().unwrap();
}

#[test]
fn bad_options_name_the_key() {
    let errors = |p: &dyn Plugin, o: serde_json::Value| option_errors(p, o);
    let src = Typed(logbus_net::source::SyslogSource);
    let sink = Typed(logbus_net::sink::SyslogSink);
    assert!(errors(&src, json!({ "address": "x" })).starts_with("address: "));
    assert!(
        errors(
            &src,
            json!({ "address": "127.0.0.1:1", "mode": "udp", "framing": "newline" })
        )
        .starts_with("framing: ")
    );
    assert!(errors(&sink, json!({ "address": "nohost" })).starts_with("address: "));
    assert!(
        errors(
            &sink,
            json!({ "address": "h:1", "mode": "udp", "framing": "newline" })
        )
        .starts_with("framing: ")
    );
    // Every rule, each named at its key.
    assert_eq!(
        errors(
            &src,
            json!({ "address": "127.0.0.1:1", "mode": "udp", "tls": { "cert_file": "c", "key_file": "k" } })
        ),
        "tls: applies only with `mode: tcp`"
    );
    assert_eq!(
        errors(&sink, json!({ "address": "h:1", "mode": "udp", "tls": {} })),
        "tls: applies only with `mode: tcp`"
    );
    assert_eq!(
        errors(
            &sink,
            json!({ "address": "h:1", "retry_initial_backoff_ms": 500, "retry_max_backoff_ms": 499 })
        ),
        "retry_max_backoff_ms: must not be below `retry_initial_backoff_ms`"
    );
    assert_eq!(
        errors(
            &sink,
            json!({ "address": "h:1", "retry_initial_backoff_ms": 500, "retry_max_backoff_ms": 500 })
        ),
        ""
    );
    assert_eq!(
        errors(&sink, json!({ "address": ":1" })),
        "address: `:1` is not host:port"
    );
    assert_eq!(
        errors(&sink, json!({ "address": "h:port" })),
        "address: `h:port` is not host:port"
    );
    assert_eq!(
        errors(
            &src,
            json!({ "address": "127.0.0.1:1", "max_connections": 0, "idle_timeout_ms": 86400001, "max_message_bytes": 0 })
        ),
        "max_connections: must be between 1 and 65536, got 0; \
         idle_timeout_ms: must be between 1 and 86400000, got 86400001; \
         max_message_bytes: must be between 1 and 16777216, got 0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_from_logbus_to_logbus_and_a_plaintext_client_is_turned_away() {
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let mut s = source(
        json!({ "address": address, "tls": { "cert_file": cert, "key_file": key } }),
        1000,
    )
    .await;
    // A client speaking plaintext fails the handshake and delivers nothing.
    let mut plain = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain.write_all(b"5 hello").unwrap();
    drop(plain);
    let metrics = forward(
        json!({ "address": address, "tls": { "ca_file": cert, "server_name": "localhost" } }),
        200,
    )
    .await;
    assert_eq!(metrics.snapshot().events_out, 200);
    let got = take_text(&mut s.rx, 200).await;
    let want: Vec<String> = (0..200)
        .map(|i| format!("<14>1 2026-11-30T10:00:00Z host app - - - message {i}"))
        .collect();
    assert_eq!(got, want);
    assert!(
        s.rx.try_recv().is_none(),
        "the plaintext client got nothing in"
    );
    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();
}

#[test]
fn a_missing_certificate_is_a_build_error_naming_the_file() {
    let err = build_errors(
        &Typed(logbus_net::source::SyslogSource),
        json!({ "address": "127.0.0.1:1", "tls": { "cert_file": "/nope/cert.pem", "key_file": "/nope/key.pem" } }),
    );
    assert!(
        err.starts_with("tls: ") && err.contains("/nope/cert.pem"),
        "{err}"
    );
}

/// What an option left out means: the defaults the page documents.
#[test]
fn options_left_out_take_the_documented_defaults() {
    use logbus_net::Mode;
    use logbus_net::sink::{SinkFraming, SyslogSinkOptions};
    use logbus_net::source::{SyslogSourceOptions, TcpFraming};
    let source: SyslogSourceOptions =
        serde_json::from_value(json!({ "address": "127.0.0.1:5140" })).unwrap();
    assert_eq!(source.mode, Mode::Tcp);
    assert_eq!(source.framing, TcpFraming::Auto);
    assert_eq!(
        (
            source.max_message_bytes,
            source.max_connections,
            source.idle_timeout_ms
        ),
        (65536, 256, 3_600_000)
    );
    assert!(source.tls.is_none());
    let sink: SyslogSinkOptions = serde_json::from_value(json!({ "address": "h:1" })).unwrap();
    assert_eq!(sink.mode, Mode::Tcp);
    assert_eq!(sink.framing, SinkFraming::OctetCounting);
    assert_eq!(
        (
            sink.connect_timeout_ms,
            sink.retrying.retry_initial_backoff_ms,
            sink.retrying.retry_max_backoff_ms
        ),
        (5000, 100, 10_000)
    );
    assert!(sink.tls.is_none());
}

/// Datagrams already waiting in the socket when the source reads join one
/// batch. The test runs on one thread and sends synchronously, so all ten
/// are queued before the source's task runs again.
#[tokio::test(flavor = "current_thread")]
async fn waiting_datagrams_join_one_batch() {
    let port = free_port();
    let mut s = source(
        json!({ "address": format!("127.0.0.1:{port}"), "mode": "udp" }),
        100,
    )
    .await;
    let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sender.connect(("127.0.0.1", port)).unwrap();
    sender.send(b"<13>first").unwrap();
    assert_eq!(s.rx.recv().await.unwrap().len(), 1);
    for i in 0..10 {
        sender.send(format!("<13>m{i}").as_bytes()).unwrap();
    }
    let batch = s.rx.recv().await.unwrap();
    assert_eq!(batch.len(), 10, "one batch of everything that was waiting");
    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();
}

/// A TCP message's trailing `\r`, `\n` and NULs are not part of it (rsyslog
/// templates end in a newline inside the frame); a frame of nothing else
/// is no message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_messages_trailing_line_ends_and_nuls_are_trimmed() {
    let port = free_port();
    let mut s = source(
        json!({ "address": format!("127.0.0.1:{port}"), "framing": "octet-counting" }),
        100,
    )
    .await;
    let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    client
        .write_all(b"8 <13>a\r\n\x002 \r\n7 <13>b c2 \n\x00")
        .unwrap();
    drop(client);
    assert_eq!(take_text(&mut s.rx, 2).await, ["<13>a", "<13>b c"]);
    s.shutdown.cancel();
    s.task.await.unwrap().unwrap();
    let mut rest = 0;
    while let Some(b) = s.rx.try_recv() {
        rest += b.len();
    }
    assert_eq!(rest, 0, "the empty frames made no events");
}

/// `validate --preflight` learns of the CA file.
#[test]
fn the_sink_states_its_ca_file() {
    let needs = logbus_plugin_api::testing::host_needs(
        &Typed(logbus_net::sink::SyslogSink),
        json!({ "address": "h:6514", "tls": { "ca_file": "ca.pem" } }),
    );
    assert_eq!(needs, ["tls.ca_file: Pem ./ca.pem"]);
}

/// `retry_max_attempts` (the sink core's shared retry block): with the
/// receiver gone, the sink gives up after that many attempts instead of
/// holding the pipeline, and its events are errored, not lost silently.
#[tokio::test]
async fn a_receiver_that_stays_down_is_given_up_on_after_the_attempts_allowed() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let events = (0..3)
        .map(|i| Event::raw(format!("message {i}"), Meta::at("t", 0)))
        .collect();
    let (result, metrics) = run_sink_counting(
        testing::sink(
            &Typed(logbus_net::sink::SyslogSink),
            json!({
                "address": format!("127.0.0.1:{port}"),
                "retry_initial_backoff_ms": 1,
                "retry_max_backoff_ms": 5,
                "retry_max_attempts": 3,
            }),
        ),
        vec![events],
        Arc::new(StageMetrics::default()),
    )
    .await;
    let err = result.expect_err("gave up").to_string();
    assert!(err.contains("3 attempts"), "{err}");
    assert_eq!(metrics.snapshot().errored, 3);
}
