//! What acknowledgements cost: the reference pipeline's stages behind a
//! `tail` source, with `acknowledgements: true` (every event carries a
//! handle to its batch; the file sink settles it; the source's ordered
//! checkpoint hears each batch) against `false` (positions saved once a
//! batch is handed on). Both variants run in every round, alternating
//! which goes first; the figures are medians over the rounds and the ratio
//! is taken within each round, so a noisy machine moves both alike.
//!
//!     cargo bench -p logbus --bench acks
//!
//! `LOGBUS_BENCH_LINES` (default 300000) and `LOGBUS_BENCH_ROUNDS`
//! (default 7) change the size.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use logbus_core::{load_str, start};
use logbus_plugin_api::CancellationToken;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The reference pipeline (pipelines/reference.yml) with `tail` for stdin.
fn pipeline(dir: &Path, state: &str, acks: bool) -> String {
    format!(
        r#"
settings:
  channel_capacity: 4096
stages:
  read:
    source: tail
    paths: ["{dir}/input.ndjson"]
    state_dir: "{dir}/{state}"
    acknowledgements: {acks}
  json:  {{ parser: json, inputs: [read] }}
  stamp: {{ transform: stamp, inputs: [json] }}
  shape:
    transform: fields
    inputs: [stamp]
    set: {{ pipeline: reference }}
    delete: [debug_id]
  fmt:   {{ formatter: json, inputs: [shape] }}
  out:   {{ sink: file, inputs: [fmt], path: /dev/null }}
"#,
        dir = dir.display()
    )
}

/// Runs one variant over the whole input; events per second.
async fn run_once(dir: &Path, state: &str, acks: bool, lines: u64) -> f64 {
    let text = pipeline(dir, state, acks);
    let loaded = load_str(
        &text,
        &dir.join("bench.yml"),
        &logbus::catalog::registry(),
        &|_| None,
    );
    let pipeline = loaded.pipeline.unwrap_or_else(|| {
        panic!(
            "the bench pipeline is invalid: {:?}",
            loaded
                .diagnostics
                .iter()
                .map(|d| d.display("bench.yml").to_string())
                .collect::<Vec<_>>()
        )
    });
    let shutdown = CancellationToken::new();
    let began = Instant::now();
    let running = start(&pipeline, shutdown.clone()).unwrap_or_else(|e| panic!("{e:?}"));
    let out = running.metrics("out").expect("the sink's metrics").clone();
    while out.snapshot().events_out < lines {
        assert!(
            began.elapsed() < Duration::from_secs(600),
            "the pipeline stalled"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = began.elapsed();
    shutdown.cancel();
    let report = running.wait().await;
    assert_eq!(
        report
            .stages
            .iter()
            .find(|s| s.id == "out")
            .map(|s| s.counts.events_out),
        Some(lines),
        "every line committed once"
    );
    lines as f64 / elapsed.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let lines = env_or("LOGBUS_BENCH_LINES", 300_000) as u64;
    let rounds = env_or("LOGBUS_BENCH_ROUNDS", 7);
    let dir = tempfile::tempdir().unwrap();
    {
        let mut input = std::io::BufWriter::new(
            std::fs::File::create(dir.path().join("input.ndjson")).unwrap(),
        );
        for seq in 0..lines {
            writeln!(
                input,
                r#"{{"seq":{seq},"level":"info","debug_id":"ff{seq:x}","user":{{"id":"u{}","name":"user {seq}"}},"message":"GET /api/v1/items?page={seq} 200 in 3.2ms","host":"edge-17"}}"#,
                seq % 1000
            )
            .unwrap();
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut on, mut off, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let go = |acks: bool| {
            runtime.block_on(run_once(
                dir.path(),
                &format!("state-{round}-{acks}"),
                acks,
                lines,
            ))
        };
        let (a, b) = if round % 2 == 0 {
            let a = go(true);
            (a, go(false))
        } else {
            let b = go(false);
            (go(true), b)
        };
        eprintln!(
            "round {round}: acknowledgements on {a:.0}/s, off {b:.0}/s, on/off {:.3}",
            a / b
        );
        on.push(a);
        off.push(b);
        ratios.push(a / b);
    }
    println!(
        "{lines} lines, {rounds} rounds: acknowledgements on {:.0} events/s, off {:.0} events/s (medians); on/off median {:.3} (min {:.3}, max {:.3})",
        median(on),
        median(off),
        median(ratios.clone()),
        ratios.iter().copied().fold(f64::INFINITY, f64::min),
        ratios.iter().copied().fold(0.0, f64::max),
    );
}
