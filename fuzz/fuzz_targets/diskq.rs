#![no_main]
//! Any bytes as durable-queue data: the record scanner over a buffer, a
//! whole segment file, and a state file. Damage is found inside the input
//! and never panics; what is counted lost is what is missing.
use libfuzzer_sys::fuzz_target;
use logbus_diskq::{inspect, record, state};

fuzz_target!(|data: &[u8]| {
    let mut at = 0;
    while at < data.len() {
        match record::scan(data, at) {
            record::Scan::Record { body, next } => {
                assert!(body.end <= data.len() && next > at);
                let _ = record::payload(&data[body.clone()]);
                let _ = record::start_seq(&data[body]);
                at = next;
            }
            record::Scan::Damaged { resume } => {
                assert!(resume > at && resume <= data.len());
                at = resume;
            }
            record::Scan::Incomplete => break,
        }
    }
    let dir = std::env::temp_dir().join(format!("logbus-fuzz-diskq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let segment = dir.join("segment");
    std::fs::write(&segment, data).unwrap();
    let scan = inspect::scan_segment(&segment, 1, 0).unwrap();
    assert!(scan.damaged_bytes <= data.len() as u64);
    for (offset, len) in &scan.damaged {
        assert!(offset + len <= data.len() as u64);
    }
    let state_file = dir.join("state");
    std::fs::write(&state_file, data).unwrap();
    let loaded = state::load(&state_file).unwrap();
    let seqs = match loaded {
        state::Loaded::Valid(saved) => saved.seqs,
        _ => None,
    };
    let accounting = inspect::account(seqs, std::slice::from_ref(&scan), &[]);
    let missing: u64 = accounting.missing.iter().map(|(a, b)| b - a).sum();
    assert_eq!(accounting.lost, missing, "nothing reported before");
});
