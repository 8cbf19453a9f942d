//! What naming an event by its position costs a sink: the 128-bit id of
//! (source stage, stream, offset, part) written as 32 hex digits into a
//! request buffer, as `sink: opensearch` does with `id_from_position`,
//! against writing nothing — per event, alternating in one run.
//!
//!     cargo bench -p logbus-event --bench position

use std::io::Write;

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use logbus_event::Position;

fn positions() -> Vec<Position> {
    let stream = Position::stream_of(&[b"dev", b"ino", b"first bytes of the file"]);
    (0..1000u64)
        .map(|i| Position::new(stream, i * 173))
        .collect()
}

fn bench(c: &mut Criterion) {
    let positions = positions();
    let mut group = c.benchmark_group("position id");
    group.throughput(Throughput::Elements(positions.len() as u64));
    let mut out = Vec::with_capacity(64 * 1024);
    group.bench_function("none", |b| {
        b.iter(|| {
            out.clear();
            for p in &positions {
                out.extend_from_slice(b"{\"create\":{\"_index\":\"logs\"}}\n");
                black_box(p);
            }
            black_box(out.len())
        })
    });
    group.bench_function("id_from_position", |b| {
        b.iter(|| {
            out.clear();
            for p in &positions {
                out.extend_from_slice(b"{\"create\":{\"_index\":\"logs\"");
                let id = p.id(black_box("logs"));
                write!(out, ",\"_id\":\"{id:032x}\"").unwrap();
                out.extend_from_slice(b"}}\n");
            }
            black_box(out.len())
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
