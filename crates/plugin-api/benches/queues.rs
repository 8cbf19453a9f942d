//! The stage queues under producer fan-in: P producer tasks (each its own
//! `Output`, so each is a registered producer) submit batches of 16 events
//! to one queue drained by 4 workers (local scope: plus one frontend
//! consumer per producer), on a 2-thread runtime like the engine's default.
//! Dequeues take one event, as in the contention screen.
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use logbus_plugin_api::{Event, Meta, Output, OutputRole, Receiver, Sender, StageMetrics};
use logbus_queue::{LocalConfig, channel_with_batch, local_channel};

const EVENTS: usize = 64_000;
const SUBMISSION: usize = 16;
const WORKERS: usize = 4;

fn batch() -> Vec<Event> {
    (0..SUBMISSION)
        .map(|i| Event::raw(i.to_string(), Meta::at("bench", 0)))
        .collect()
}

async fn run(tx: Sender, rx: Receiver, producers: usize) {
    let mut consumers = Vec::new();
    for i in 0..WORKERS + rx.frontend_count() {
        let mut input = if i < WORKERS {
            rx.clone()
        } else {
            rx.frontend(i - WORKERS).unwrap()
        };
        consumers.push(tokio::spawn(async move {
            let mut n = 0;
            while let Some(b) = input.recv().await {
                n += b.len();
            }
            n
        }));
    }
    drop(rx);
    let template = batch();
    let mut tasks = Vec::new();
    for _ in 0..producers {
        let out = Output::new(
            vec![tx.clone()],
            Arc::new(StageMetrics::default()),
            OutputRole::Main,
        );
        let template = template.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..EVENTS / producers / SUBMISSION {
                out.send(template.clone()).await.unwrap();
            }
        }));
    }
    drop(tx);
    for t in tasks {
        t.await.unwrap();
    }
    let mut total = 0;
    for c in consumers {
        total += c.await.unwrap();
    }
    assert_eq!(
        total,
        EVENTS / producers / SUBMISSION * producers * SUBMISSION
    );
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let mut group = c.benchmark_group("stage_queue");
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.sample_size(15);
    group.measurement_time(Duration::from_secs(4));
    for producers in [1usize, 2, 4, 8] {
        group.bench_with_input(
            BenchmarkId::new("global", producers),
            &producers,
            |b, &p| {
                b.iter(|| {
                    let (tx, rx) = channel_with_batch(4096, 1);
                    rt.block_on(run(tx, rx, p))
                })
            },
        );
        group.bench_with_input(BenchmarkId::new("local", producers), &producers, |b, &p| {
            b.iter(|| {
                let config = LocalConfig {
                    frontend_size: 1024,
                    max_frontends: p,
                    helper_batch: 1,
                    min_batch: 0,
                    min_batch_timeout: Duration::ZERO,
                };
                let (tx, rx) = local_channel(4096, 1, config, false);
                rt.block_on(run(tx, rx, p))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
