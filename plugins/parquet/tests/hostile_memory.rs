//! The hostile files cost what their limits allow, measured: this binary
//! holds one test, so the process's peak resident size is this test's.
#![cfg(feature = "parser-parquet")]

use bytes::Bytes;
use logbus_parquet::reader::{Limits, decode};

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Undefended, the first would take ~2 GB (ten million rows), the
/// second 1.3 GB (a 64 KiB string repeated 20,000 times), the third its
/// inflated page; refused from their headers they take next to nothing.
#[test]
fn refusing_a_hostile_file_costs_next_to_nothing() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile");
    let before = peak_rss_kib();
    for name in [
        "ten-million-null-rows.parquet",
        "dictionary-entry-repeated.parquet",
        "page-inflates-past-its-header.parquet",
    ] {
        let file = Bytes::from(std::fs::read(dir.join(name)).unwrap());
        for limits in [
            Limits::default(),
            Limits {
                bytes: 64 << 20,
                rows: u64::MAX,
            },
        ] {
            assert!(decode(file.clone(), limits).is_err(), "{name}");
        }
    }
    let grown = peak_rss_kib().saturating_sub(before);
    assert!(grown < 32 * 1024, "peak RSS grew by {grown} KiB");
}
