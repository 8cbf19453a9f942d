//! A lock-free histogram with power-of-two buckets: one atomic add per
//! observation, cheap enough for once-per-batch use on the data path.
//! Resolution is a factor of two, which is what a batch-size or latency
//! distribution needs at a glance; the load harness keeps exact HDR
//! histograms of its own.

use std::sync::atomic::{AtomicU64, Ordering};

const BUCKETS: usize = 40;

#[derive(Debug)]
pub struct Log2Histogram {
    /// Bucket `i` counts values `v` with `2^(i-1) < v <= 2^i` (bucket 0: `v <= 1`).
    counts: [AtomicU64; BUCKETS],
    sum: AtomicU64,
}

impl Default for Log2Histogram {
    fn default() -> Self {
        Log2Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum: AtomicU64::new(0),
        }
    }
}

/// A copy of a histogram: `(upper bound, count)` per non-cumulative bucket.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct HistogramSnapshot {
    pub buckets: Vec<(u64, u64)>,
    pub count: u64,
    pub sum: u64,
}

impl HistogramSnapshot {
    /// Adds another snapshot's counts (same bucket bounds) to this one.
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        for (i, (bound, n)) in other.buckets.iter().enumerate() {
            match self.buckets.get_mut(i) {
                Some(mine) => mine.1 += n,
                None => self.buckets.push((*bound, *n)),
            }
        }
        self.count += other.count;
        self.sum += other.sum;
    }
}

impl Log2Histogram {
    pub fn record(&self, value: u64) {
        let i = if value <= 1 {
            0
        } else {
            (64 - (value - 1).leading_zeros()) as usize
        };
        self.counts[i.min(BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    /// Buckets up to the highest non-empty one.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let last = counts.iter().rposition(|c| *c > 0).map_or(0, |i| i + 1);
        HistogramSnapshot {
            buckets: (0..last).map(|i| (1u64 << i, counts[i])).collect(),
            count: counts.iter().sum(),
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two() {
        let h = Log2Histogram::default();
        for v in [0, 1, 2, 3, 4, 5, 1000, 1024, 1025] {
            h.record(v);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 9);
        assert_eq!(s.sum, 3064);
        let get = |bound: u64| {
            s.buckets
                .iter()
                .find(|(b, _)| *b == bound)
                .map_or(0, |(_, n)| *n)
        };
        assert_eq!((get(1), get(2), get(4), get(8)), (2, 1, 2, 1));
        assert_eq!((get(1024), get(2048)), (2, 1));
    }

    #[test]
    fn a_snapshot_ends_at_the_highest_non_empty_bucket_and_merges_add() {
        let empty = Log2Histogram::default().snapshot();
        assert_eq!(empty, HistogramSnapshot::default());
        let a = Log2Histogram::default();
        a.record(3);
        a.record(3);
        let b = Log2Histogram::default();
        b.record(1);
        b.record(20);
        let (sa, sb) = (a.snapshot(), b.snapshot());
        // Up to the bucket of 4 (values 3), and of 32 (value 20).
        assert_eq!(sa.buckets, vec![(1, 0), (2, 0), (4, 2)]);
        assert_eq!(sb.buckets.len(), 6);
        let mut merged = sa.clone();
        merged.merge(&sb);
        assert_eq!(
            merged.buckets,
            vec![(1, 1), (2, 0), (4, 2), (8, 0), (16, 0), (32, 1)]
        );
        assert_eq!((merged.count, merged.sum), (4, 27));
        // Merging into an empty snapshot copies.
        let mut copy = HistogramSnapshot::default();
        copy.merge(&merged);
        assert_eq!(copy, merged);
    }
}
