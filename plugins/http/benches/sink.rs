//! `sink: http` throughput against a local server that accepts everything:
//! the sink on the sink core (pooled async client, `in_flight` 1 and 4)
//! against the sink it replaced (one blocking `ureq` request at a time on
//! the blocking pool, reproduced here as it was: same batching, same body).
//! Variants alternate within each round; the figures are medians, and the
//! ratio is taken within a round, so a noisy machine moves all of them
//! alike. `LOGBUS_BENCH_LATENCY_MS` adds a server-side delay per request
//! (a collector that takes time to answer).
//!
//!     cargo bench -p logbus-http --features sink-http --bench sink

use std::sync::Arc;
use std::time::{Duration, Instant};

use logbus_plugin_api::testing;
use logbus_plugin_api::{Event, Meta, SinkContext, StageMetrics, Typed, channel};
use serde_json::json;

const EVENTS: usize = 100_000;
const BATCH: usize = 500;
const ROUNDS: usize = 5;

fn events(n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| {
            Event::raw(
                format!(
                    "{{\"seq\":{i},\"host\":\"edge-17\",\"level\":\"info\",\"message\":\"GET /api/v1/items?page={i} 200 in 3.2ms\",\"user\":\"u-{i}\",\"pad\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}}"
                ),
                Meta::at("bench", 0),
            )
        })
        .collect()
}

async fn server(latency: Duration) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ingest", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/ingest",
        axum::routing::post(move |body: axum::body::Bytes| async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            std::hint::black_box(body.len());
            axum::http::StatusCode::OK
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// The sink on the core, over `input` events; returns events per second.
async fn core_sink(url: &str, in_flight: usize, input: &[Event]) -> f64 {
    let sink = testing::sink(
        &Typed(logbus_http::sink::HttpSink),
        json!({ "url": url, "batch_max_events": BATCH, "batch_max_bytes": 16 << 20, "in_flight": in_flight }),
    );
    let (tx, rx) = channel(BATCH * (in_flight + 2));
    let mut cx = SinkContext::new("bench", rx, Arc::new(StageMetrics::default()));
    let input = input.to_vec();
    let started = Instant::now();
    let feeder = tokio::spawn(async move {
        for chunk in input.chunks(BATCH) {
            tx.send(chunk.to_vec()).await.unwrap();
        }
    });
    sink.run(&mut cx).await.unwrap();
    feeder.await.unwrap();
    assert_eq!(cx.metrics.snapshot().events_out, EVENTS as u64);
    EVENTS as f64 / started.elapsed().as_secs_f64()
}

/// The sink the core replaced, as it sent: a batch's body built, then one
/// blocking request at a time on the blocking pool.
async fn blocking_sink(url: &str, input: &[Event]) -> f64 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into();
    let (tx, mut rx) = channel(BATCH * 2);
    let input = input.to_vec();
    let started = Instant::now();
    let feeder = tokio::spawn(async move {
        for chunk in input.chunks(BATCH) {
            tx.send(chunk.to_vec()).await.unwrap();
        }
    });
    let mut sent = 0;
    while let Some(mut batch) = rx.recv().await {
        let events = batch.take();
        let mut body = Vec::new();
        for e in &events {
            body.extend_from_slice(e.as_raw().unwrap());
            body.push(b'\n');
        }
        let (agent, url) = (agent.clone(), url.to_string());
        let status = tokio::task::spawn_blocking(move || {
            agent
                .post(&url)
                .header("Content-Type", "application/x-ndjson")
                .send(&body[..])
                .unwrap()
                .status()
                .as_u16()
        })
        .await
        .unwrap();
        assert_eq!(status, 200);
        sent += events.len();
    }
    feeder.await.unwrap();
    assert_eq!(sent, EVENTS);
    EVENTS as f64 / started.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let latency = Duration::from_millis(
        std::env::var("LOGBUS_BENCH_LATENCY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let url = server(latency).await;
        let input = events(EVENTS);
        // Warm up connections and allocators once.
        core_sink(&url, 4, &input).await;
        blocking_sink(&url, &input).await;
        let (mut old, mut one, mut four, mut ratio) = (vec![], vec![], vec![], vec![]);
        for _ in 0..ROUNDS {
            let o = blocking_sink(&url, &input).await;
            let f = core_sink(&url, 4, &input).await;
            let s = core_sink(&url, 1, &input).await;
            old.push(o);
            four.push(f);
            one.push(s);
            ratio.push(f / o);
        }
        println!(
            "http sink, {EVENTS} events of ~200 bytes, {BATCH} per request, server latency {latency:?}, {ROUNDS} rounds (medians):"
        );
        println!("  blocking ureq, 1 at a time : {:>10.0} events/s", median(old));
        println!("  core, in_flight 1          : {:>10.0} events/s", median(one));
        println!("  core, in_flight 4          : {:>10.0} events/s", median(four));
        println!("  core 4 / blocking (per round, median): {:.2}x", median(ratio));
    });
}
