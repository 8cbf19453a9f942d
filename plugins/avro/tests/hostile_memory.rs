//! The hostile inputs cost what their budget allows, measured: this
//! binary holds one test, so the process's peak resident size is this
//! test's. Undefended, the first asked for 3.7 GB and aborted the
//! process; refused from their counts they take next to nothing.
#![cfg(feature = "parser-avro")]

mod common;

use apache_avro::Schema;
use common::*;
use logbus_avro::codec::{Encoding, decode, decode_within};

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn refusing_hostile_avro_costs_next_to_nothing() {
    let nulls = Schema::parse_str(NULLS).unwrap();
    let map = Schema::parse_str(EMPTY_RECORDS).unwrap();
    let list = Schema::parse_str(LIST).unwrap();
    let deflated = container(NULLS, "deflate", 1, &deflated_zeros(64 << 20));
    let before = peak_rss_kib();
    for count in [16_777_215, 1 << 40, i64::MAX] {
        assert!(decode(&null_array(count), Encoding::Datum, Some(&nulls)).is_err());
        let file = container(NULLS, "null", 1, &null_array(count));
        assert!(decode(&file, Encoding::Container, None).is_err());
        assert!(decode(&map_count(count), Encoding::Datum, Some(&map)).is_err());
    }
    assert!(decode(&deep_list(1_000_000), Encoding::Datum, Some(&list)).is_err());
    assert!(decode_within(&deflated, Encoding::Container, None, 8 << 20).is_err());
    let grown = peak_rss_kib().saturating_sub(before);
    assert!(grown < 32 * 1024, "peak RSS grew by {grown} KiB");
}
