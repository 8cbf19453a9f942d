//! The frontend ring alone: one producer thread and one consumer thread
//! passing batches of 1, 16 and 256 items.
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use logbus_ring::spsc::ring;

const ITEMS: u64 = 200_000;

fn handover(batch: usize) {
    let (mut producer, mut consumer) = ring::<u64>(1024);
    let writer = std::thread::spawn(move || {
        let mut sent = 0u64;
        let mut buf = Vec::with_capacity(batch);
        while sent < ITEMS {
            buf.extend((0..batch as u64).map(|i| sent + i));
            while !producer.push_all(&mut buf) {
                std::hint::spin_loop();
            }
            sent += batch as u64;
        }
    });
    let mut got = 0u64;
    let mut out = Vec::with_capacity(1024);
    while got < ITEMS {
        out.clear();
        got += consumer.pop_into(1024, &mut out) as u64;
    }
    writer.join().unwrap();
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("spsc_ring");
    group.throughput(Throughput::Elements(ITEMS));
    group.sample_size(20);
    for batch in [1usize, 16, 256] {
        group.bench_with_input(BenchmarkId::new("batch", batch), &batch, |b, &batch| {
            b.iter(|| handover(batch))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
