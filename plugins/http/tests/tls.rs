//! HTTPS end to end: `sink: http` posts to `source: http` over TLS with a
//! private CA; a client that does not trust the certificate gets nothing
//! in; a missing certificate file is named at build time.

use std::sync::Arc;
use std::time::Duration;

use logbus_plugin_api::{
    BuildContext, Built, CancellationToken, Event, Meta, Output, OutputRole, Plugin, SinkContext,
    SourceContext, StageMetrics, Typed, channel,
};
use serde_json::json;

fn cx() -> BuildContext {
    BuildContext {
        stage_id: "s".into(),
        base_dir: ".".into(),
        worker: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_sink_delivers_to_the_http_source_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let source = match Typed(logbus_http::source::HttpSource).build(
        &json!({ "address": format!("127.0.0.1:{port}"), "tls": { "cert_file": cert, "key_file": key } }),
        &cx(),
    ) {
        Ok(Built::Source(s)) => s,
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("not a source"),
    };
    let (tx, mut rx) = channel(10_000);
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(source.run(SourceContext {
        id: "in".into(),
        output: Output::new(
            vec![tx],
            Arc::new(StageMetrics::default()),
            OutputRole::Main,
        ),
        shutdown: shutdown.clone(),
    }));
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A client trusting only the Mozilla roots refuses the certificate.
    let url = format!("https://localhost:{port}/");
    let refused = tokio::task::spawn_blocking({
        let url = url.clone();
        move || ureq::post(&url).send(&b"{\"x\":1}\n"[..]).is_err()
    })
    .await
    .unwrap();
    assert!(refused);
    // A client that connects and never starts its handshake must not hold
    // up the others (handshakes run concurrently; each times out at 10 s).
    let _stalled = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    // The sink with the private CA delivers.
    let sink = match Typed(logbus_http::sink::HttpSink).build(
        &json!({ "url": url, "tls": { "ca_file": cert }, "batch_timeout_ms": 1, "compression": "gzip" }),
        &cx(),
    ) {
        Ok(Built::Sink(s)) => s,
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("not a sink"),
    };
    let (stx, srx) = channel(1000);
    let metrics = Arc::new(StageMetrics::default());
    let mut scx = SinkContext {
        id: "out".into(),
        input: srx,
        metrics: metrics.clone(),
    };
    let events: Vec<Event> = (0..50)
        .map(|i| {
            Event::raw(
                format!("{{\"n\":{i}}}"),
                Meta {
                    source: "t".into(),
                    ingest_ns: 0,
                },
            )
        })
        .collect();
    stx.send(events).await.unwrap();
    drop(stx);
    tokio::time::timeout(Duration::from_secs(5), sink.run(&mut scx))
        .await
        .expect("a stalled handshake held up the listener")
        .unwrap();
    assert_eq!(metrics.snapshot().events_out, 50);
    let mut got = Vec::new();
    while got.len() < 50 {
        let mut b = rx.recv().await.unwrap();
        got.extend(
            b.take()
                .iter()
                .map(|e| String::from_utf8(e.as_raw().unwrap().to_vec()).unwrap()),
        );
    }
    assert_eq!(
        got,
        (0..50)
            .map(|i| format!("{{\"n\":{i}}}"))
            .collect::<Vec<_>>()
    );
    shutdown.cancel();
    server.await.unwrap().unwrap();
}

#[test]
fn certificate_files_are_checked_when_the_stage_is_built() {
    let err = match Typed(logbus_http::source::HttpSource).build(
        &json!({ "address": "127.0.0.1:1", "tls": { "cert_file": "/nope.pem", "key_file": "/nope.key" } }),
        &cx(),
    ) {
        Err(e) => format!("{}: {}", e[0].path.join("."), e[0].message),
        Ok(_) => panic!("built"),
    };
    assert!(err.contains("/nope.pem"), "{err}");
    let err = match Typed(logbus_http::sink::HttpSink).build(
        &json!({ "url": "https://x/", "tls": { "ca_file": "/nope-ca.pem" } }),
        &cx(),
    ) {
        Err(e) => format!("{}: {}", e[0].path.join("."), e[0].message),
        Ok(_) => panic!("built"),
    };
    assert!(
        err.starts_with("tls.ca_file: ") && err.contains("/nope-ca.pem"),
        "{err}"
    );
}
