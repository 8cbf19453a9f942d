//! The numbered records the queue tests write and read back, shared by
//! the tests and the crash child (`src/bin/logbus-diskq-crash-child.rs`).

use logbus_diskq::{ReadBatch, RecordBatch};

/// Records `from..from + n`: `record NNNNNN` and up to 49 bytes of padding.
pub fn batch(from: u64, n: u64) -> RecordBatch {
    let mut b = RecordBatch::new(false);
    for i in from..from + n {
        assert!(b.push(format!("record {i:06} {}", "x".repeat((i % 50) as usize)).as_bytes()));
    }
    b
}

/// The numbers of the records in `b`.
pub fn seqs(b: &ReadBatch) -> Vec<u64> {
    b.payloads()
        .map(|p| std::str::from_utf8(&p[7..13]).unwrap().parse().unwrap())
        .collect()
}
