//! What `ack: sink` costs per event since the HTTP and OTLP sources share
//! one admission: each event gets an acknowledgement of its own (so the
//! answer can count how many ended which way), where the HTTP source
//! used to give a whole request one. Both ways below, per 1,000-event
//! request: handles attached, every event settled, the answer read.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use logbus_connections::admission::{AckMode, Admission, Settled};
use logbus_event::{AckReceiver, BatchAck, Event, Meta, Outcome};
use tokio::sync::oneshot;

const EVENTS: usize = 1000;

fn request() -> Vec<Event> {
    (0..EVENTS)
        .map(|i| Event::raw(format!("line {i}"), Meta::at("b", 0)))
        .collect()
}

/// The HTTP source's former way: one handle per request, one outcome.
struct RequestAck(Mutex<Option<oneshot::Sender<Outcome>>>);

impl AckReceiver for RequestAck {
    fn finished(&self, _token: u64, outcome: Outcome) {
        if let Some(tx) = self.0.lock().unwrap().take() {
            let _ = tx.send(outcome);
        }
    }
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let admission = Admission::new(
        4,
        Duration::from_secs(1),
        AckMode::Sink,
        Duration::from_secs(10),
    );
    let mut group = c.benchmark_group("ack_sink_1000_events");
    group.sample_size(30);
    group.bench_function("one_handle_per_event_counted", |b| {
        b.iter_batched(
            request,
            |events| {
                let (events, pending) = admission.track(events);
                for mut e in events {
                    e.settle(Outcome::Delivered);
                }
                let settled = runtime.block_on(pending.expect("sink").settled());
                assert_eq!(settled, Settled::Delivered);
            },
            criterion::BatchSize::SmallInput,
        )
    });
    group.bench_function("one_handle_per_request", |b| {
        b.iter_batched(
            request,
            |events| {
                let (tx, rx) = oneshot::channel();
                let batch = BatchAck::new(Arc::new(RequestAck(Mutex::new(Some(tx)))), 0);
                let events: Vec<Event> = events
                    .into_iter()
                    .map(|e| e.with_ack(batch.handle()))
                    .collect();
                drop(batch);
                for mut e in events {
                    e.settle(Outcome::Delivered);
                }
                let outcome = runtime.block_on(rx).expect("told");
                assert_eq!(outcome, Outcome::Delivered);
            },
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
