//! HTTPS end to end: `sink: http` posts to `source: http` over TLS with a
//! private CA; a client that does not trust the certificate gets nothing
//! in; a missing certificate file is named at build time.

use std::time::Duration;

use logbus_plugin_api::testing::{self, build_errors};
use logbus_plugin_api::{Event, Meta, Typed};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_sink_delivers_to_the_http_source_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let port = logbus_test_ports::free_port();
    let mut server = testing::run_source(
        testing::source(
            &Typed(logbus_http::source::HttpSource),
            json!({ "address": format!("127.0.0.1:{port}"), "tls": { "cert_file": cert, "key_file": key } }),
        ),
        10_000,
    );
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
    let sink = testing::sink(
        &Typed(logbus_http::sink::HttpSink),
        json!({ "url": url, "tls": { "ca_file": cert }, "batch_timeout_ms": 1, "compression": "gzip" }),
    );
    let events: Vec<Event> = (0..50)
        .map(|i| Event::raw(format!("{{\"n\":{i}}}"), Meta::at("t", 0)))
        .collect();
    let (result, metrics) = tokio::time::timeout(
        Duration::from_secs(5),
        testing::run_sink(sink, vec![events]),
    )
    .await
    .expect("a stalled handshake held up the listener");
    result.unwrap();
    assert_eq!(metrics.snapshot().events_out, 50);
    // Requests in flight at once may arrive in either order.
    let mut got = testing::take_text(&mut server.rx, 50).await;
    got.sort_by_key(|t| serde_json::from_str::<serde_json::Value>(t).unwrap()["n"].as_u64());
    assert_eq!(
        got,
        (0..50)
            .map(|i| format!("{{\"n\":{i}}}"))
            .collect::<Vec<_>>()
    );
    server.stop().await.unwrap();
}

#[test]
fn certificate_files_are_checked_when_the_stage_is_built() {
    let err = build_errors(
        &Typed(logbus_http::source::HttpSource),
        json!({ "address": "127.0.0.1:1", "tls": { "cert_file": "/nope.pem", "key_file": "/nope.key" } }),
    );
    assert!(err.contains("/nope.pem"), "{err}");
    let err = build_errors(
        &Typed(logbus_http::sink::HttpSink),
        json!({ "url": "https://x/", "tls": { "ca_file": "/nope-ca.pem" } }),
    );
    assert!(
        err.starts_with("tls.ca_file: ") && err.contains("/nope-ca.pem"),
        "{err}"
    );
}
