//! A request whose events would carry one large resource each is refused
//! from its counts, measured: this binary holds one test, so the
//! process's peak resident size is this test's (issue 54: 80 KB of
//! OTLP/JSON grew the process to 11 GB and aborted it).
#![cfg(feature = "source-otlp")]

use std::time::Duration;

use logbus_plugin_api::Typed;
use logbus_plugin_api::testing;
use serde_json::{Value, json};

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusing_a_fanned_out_resource_costs_next_to_nothing() {
    let http = logbus_test_ports::free_port();
    let source = testing::run_source(
        testing::source(
            &Typed(logbus_otlp::source::OtlpSource),
            json!({"http_address": format!("127.0.0.1:{http}")}),
        ),
        100,
    );
    while std::net::TcpStream::connect(("127.0.0.1", http)).is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let attributes: Vec<Value> = (0..2000)
        .map(|i| json!({"key": format!("k{i}"), "value": {"stringValue": "v"}}))
        .collect();
    let records: Vec<Value> = (0..50_000).map(|_| json!({})).collect();
    let body = json!({"resourceLogs": [{"resource": {"attributes": attributes},
                                        "scopeLogs": [{"logRecords": records}]}]})
    .to_string()
    .into_bytes();
    let before = peak_rss_kib();
    let url = format!("http://127.0.0.1:{http}/v1/logs");
    let (status, answer) = tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut r = agent
            .post(&url)
            .header("content-type", "application/json")
            .send(&body[..])
            .unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    })
    .await
    .unwrap();
    assert_eq!(status, 413, "{answer}");
    assert!(answer.contains("max_decoded_bytes"), "{answer}");
    let grown = peak_rss_kib().saturating_sub(before);
    assert!(grown < 64 * 1024, "peak RSS grew by {grown} KiB");
    source.stop().await.unwrap();
}
