//! A condition's cost per event, against the same test written by hand
//! in Rust (what a native one-field `filter` does), on an event shaped
//! like the benchmark corpus's; and on lazy events (a compact JSON line),
//! read entry by entry against building the fields first (what `filter`
//! and `route` did before they read through the event).
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use logbus_condition::Condition;
use logbus_event::{Event, FieldPath, Fields, LazyFields, Meta, Payload};
use serde_json::json;

fn event(i: u64) -> Fields {
    let level = ["debug", "info", "warn", "error"][i as usize % 4];
    let service = ["auth", "billing", "web", "search"][(i / 4) as usize % 4];
    serde_json::from_value(json!({
        "ts": "2026-12-02T04:20:00.123Z", "level": level, "service": service,
        "host": "node-17", "status": 200 + (i % 4) * 100, "latency_ms": i % 997,
        "msg": if i.is_multiple_of(7) { "upstream timeout after 30s" } else { "request served" },
        "user": {"id": i, "name": "ann"}, "path": "/api/v1/orders", "bytes": 5120,
        "trace_id": "5b8efff798038103d269b633813fc60c", "region": "eu-west-1"
    }))
    .unwrap()
}

fn bench(c: &mut Criterion) {
    let events: Vec<Fields> = (0..1024).map(event).collect();
    let mut group = c.benchmark_group("condition_1024_events");
    group.sample_size(30);
    let level = FieldPath::parse("level").unwrap();
    group.bench_function("by_hand/level_eq", |b| {
        b.iter(|| {
            events
                .iter()
                .filter(|e| level.get(e).and_then(|v| v.as_str()) == Some("error"))
                .count()
        })
    });
    for (name, text) in [
        ("level_eq", r#"level == "error""#),
        (
            "issue_example",
            r#"level != "debug" && (service in ["auth", "billing"] && status >= 500)"#,
        ),
        ("regex", r#"msg =~ "timeout|refused""#),
        ("lower", r#"lower(level) == "error""#),
        (
            "nested_or",
            r#"user.id > 1000 || exists(panic) || starts_with(path, "/admin")"#,
        ),
    ] {
        let condition = Condition::compile(text).unwrap();
        group.bench_with_input(BenchmarkId::new("condition", name), &condition, |b, c| {
            b.iter(|| events.iter().filter(|e| c.matches(*e)).count())
        });
    }
    group.finish();

    let lazy: Vec<LazyFields> = events
        .iter()
        .map(|e| LazyFields::parse(serde_json::to_vec(e).unwrap().into()).unwrap())
        .collect();
    let mut group = c.benchmark_group("condition_1024_lazy_events");
    group.sample_size(30);
    let condition = Condition::compile(
        r#"level != "debug" && (service in ["auth", "billing"] && status >= 500)"#,
    )
    .unwrap();
    // Each iteration starts from events as the parser made them (a clone
    // of the text's handle and its span list), as a stage meets them.
    let fresh = || {
        lazy.iter()
            .map(|l| Event::new(Payload::Lazy(l.clone()), Meta::at("bench", 0)))
            .collect::<Vec<_>>()
    };
    group.bench_function("read_entries", |b| {
        b.iter_batched(
            fresh,
            |events| events.iter().filter(|e| condition.matches(*e)).count(),
            criterion::BatchSize::LargeInput,
        )
    });
    group.bench_function("build_fields", |b| {
        b.iter_batched(
            fresh,
            |events| {
                events
                    .iter()
                    .filter(|e| condition.matches(e.as_fields().unwrap()))
                    .count()
            },
            criterion::BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
