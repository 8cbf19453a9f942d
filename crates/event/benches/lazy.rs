//! The reference pipeline's per-event work without the engine around it:
//! parse a ~1 KiB JSON log line, stamp it, set one field, delete one, write
//! JSON — on lazy fields (`LazyFields`) and on the ordered map they stand
//! for, alternating in one run.
//!
//!     cargo bench -p logbus-event --bench lazy

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, black_box, criterion_group, criterion_main};
use logbus_event::{Fields, LazyFields};
use serde_json::Value;

/// Lines shaped like `cargo xtask bench`'s corpus (a tenth of them with a
/// float the serialiser rewrites, e.g. `12.340`, so they are parsed
/// eagerly either way).
fn lines() -> Vec<Bytes> {
    (0..1000u64)
        .map(|seq| {
            let mut line = format!(
                r#"{{"seq":{seq},"ts":"2026-11-30T05:00:{:02}.{:06}Z","level":"info","service":"checkout","host":"node-{:03}","path":"/api/v1/orders","status":200,"latency_ms":{}.{:03},"user":{{"id":"u{}","plan":"pro"}},"debug_id":"{:016x}","tags":["edge","blue"],"msg":""#,
                seq % 60,
                seq * 7919 % 1_000_000,
                seq % 200,
                seq % 900,
                seq * 31 % 1000,
                seq * 131 % 100_000,
                seq * 0x9E37_79B9_7F4A_7C15,
            );
            while line.len() < 1000 {
                line.push_str("request served cache miss ");
            }
            line.push_str(r#""}"#);
            Bytes::from(line)
        })
        .collect()
}

fn eager(line: &Bytes, out: &mut Vec<u8>) {
    let mut f: Fields = sonic_rs::from_slice(line).unwrap();
    f.insert(
        "ingest_ts".into(),
        Value::String("2026-12-02T17:00:00.000000Z".into()),
    );
    f.insert("pipeline".into(), Value::String("reference".into()));
    f.shift_remove("debug_id");
    sonic_rs::to_writer(&mut *out, &f).unwrap();
}

fn lazy(line: &Bytes, out: &mut Vec<u8>) {
    match LazyFields::parse(line.clone()) {
        Some(mut l) => {
            l.set(
                "ingest_ts",
                Value::String("2026-12-02T17:00:00.000000Z".into()),
            );
            l.set("pipeline", Value::String("reference".into()));
            l.delete("debug_id");
            l.write_json(out);
        }
        None => eager(line, out),
    }
}

fn bench(c: &mut Criterion) {
    let lines = lines();
    let bytes: usize = lines.iter().map(Bytes::len).sum();
    let mut group = c.benchmark_group("parse-stamp-shape-format");
    group.throughput(Throughput::Bytes(bytes as u64));
    for (name, f) in [("eager", eager as fn(&Bytes, &mut Vec<u8>)), ("lazy", lazy)] {
        group.bench_function(name, |b| {
            b.iter_batched_ref(
                || Vec::with_capacity(1200),
                |out| {
                    for line in &lines {
                        out.clear();
                        f(black_box(line), out);
                    }
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
