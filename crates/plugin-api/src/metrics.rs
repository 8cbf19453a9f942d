//! Per-stage counters. They are the single source of truth for the exit
//! summary, `--stats-json`, the API's `/metrics` and `/api/stats`, and
//! `logbus top`, so those can never disagree.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

#[derive(Debug, Default)]
pub struct StageMetrics {
    events_in: AtomicU64,
    events_out: AtomicU64,
    discarded: AtomicU64,
    errored: AtomicU64,
    routed: AtomicU64,
    created: AtomicU64,
    /// Nanoseconds spent waiting for room downstream (backpressure).
    blocked_ns: AtomicU64,
    /// Bytes of raw payloads sent on (structured events count 0).
    bytes_out: AtomicU64,
    /// Sources that checkpoint: events finished per outcome, as their
    /// acknowledgements reported (docs/reliability.md).
    acked_delivered: AtomicU64,
    acked_rejected: AtomicU64,
    acked_errored: AtomicU64,
    /// When the oldest batch not yet acknowledged was sent (ns since the
    /// epoch; 0: none outstanding).
    oldest_unacked_ns: AtomicU64,
    /// Events a source let go of unfinished, knowing another reader takes
    /// them over (a Kafka partition revoked in a rebalance).
    redelivered: AtomicU64,
    /// Events a sink sent again after a failed attempt.
    retried: AtomicU64,
    /// A stage with named outputs: each one's name and events sent.
    named: std::sync::OnceLock<Vec<(String, AtomicU64)>>,
}

/// A point-in-time copy of [`StageMetrics`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StageCounts {
    /// Events received from the stage's input channel.
    pub events_in: u64,
    /// Events sent downstream (sources: emitted; sinks: committed).
    pub events_out: u64,
    /// Events removed on purpose (a filter said no).
    pub discarded: u64,
    /// Events that ended in an error (`on_error: drop`/`fail`, or a failed stage).
    pub errored: u64,
    /// Events sent to the stage's `<id>.errors` output.
    pub routed: u64,
    /// Events a stage made beyond those it received (one input line split in three: 2).
    pub created: u64,
    /// Sources that checkpoint: events their acknowledgements reported
    /// delivered, rejected and errored (0 for every other stage).
    pub acked_delivered: u64,
    pub acked_rejected: u64,
    pub acked_errored: u64,
    /// Age of the oldest batch sent and not yet acknowledged, in
    /// milliseconds (0: none).
    pub oldest_unacked_ms: u64,
    /// Events this source let go of unfinished, knowing another reader
    /// reads them again: each may arrive twice downstream (a Kafka
    /// partition revoked in a rebalance while its events were in flight).
    pub redelivered: u64,
    /// Sinks: events sent again after a failed attempt, once per retry
    /// (a batch of 100 retried twice counts 200).
    pub retried: u64,
}

impl StageCounts {
    /// Whether this stage is a source that reported acknowledgements.
    pub fn has_acks(&self) -> bool {
        self.acked_delivered + self.acked_rejected + self.acked_errored > 0
            || self.oldest_unacked_ms > 0
    }

    /// Events that entered the stage and are accounted for nowhere.
    /// Zero for every stage after a clean drain; sources have no input.
    pub fn unaccounted(&self) -> i64 {
        (self.events_in + self.created) as i64
            - (self.events_out + self.discarded + self.errored + self.routed) as i64
    }
}

macro_rules! counter {
    ($add:ident, $field:ident) => {
        pub fn $add(&self, n: u64) {
            self.$field.fetch_add(n, Ordering::Relaxed);
        }
    };
}

impl StageMetrics {
    counter!(add_in, events_in);
    counter!(add_out, events_out);
    counter!(add_discarded, discarded);
    counter!(add_errored, errored);
    counter!(add_routed, routed);
    counter!(add_created, created);
    counter!(add_blocked_ns, blocked_ns);
    counter!(add_bytes_out, bytes_out);
    counter!(add_redelivered, redelivered);
    counter!(add_retried, retried);

    /// Names the stage's named outputs (once; [`StageMetrics::add_named`]
    /// counts by index).
    pub fn name_outputs(&self, names: &[String]) {
        let _ = self.named.set(
            names
                .iter()
                .map(|n| (n.clone(), AtomicU64::new(0)))
                .collect(),
        );
    }

    /// `n` events sent to named output `index`.
    pub fn add_named(&self, index: usize, n: u64) {
        if let Some((_, count)) = self.named.get().and_then(|v| v.get(index)) {
            count.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Events sent to each named output so far, in their order.
    pub fn named_outputs(&self) -> Vec<(String, u64)> {
        self.named.get().map_or_else(Vec::new, |v| {
            v.iter()
                .map(|(name, n)| (name.clone(), n.load(Ordering::Relaxed)))
                .collect()
        })
    }

    /// Bytes of raw payloads this stage sent on: what a source read, what a
    /// formatter produced.
    pub fn bytes_out(&self) -> u64 {
        self.bytes_out.load(Ordering::Relaxed)
    }

    /// Time spent waiting for room downstream, in seconds.
    pub fn blocked_seconds(&self) -> f64 {
        self.blocked_ns.load(Ordering::Relaxed) as f64 / 1e9
    }

    /// A source that checkpoints publishes its acknowledgement counts (as
    /// totals) and when its oldest open batch was sent (`None`: none open).
    pub fn set_acks(&self, counts: crate::AckCounts, oldest_open: Option<std::time::SystemTime>) {
        self.acked_delivered
            .store(counts.delivered, Ordering::Relaxed);
        self.acked_rejected
            .store(counts.rejected, Ordering::Relaxed);
        self.acked_errored.store(counts.errored, Ordering::Relaxed);
        let ns = oldest_open
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64);
        self.oldest_unacked_ns.store(ns, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> StageCounts {
        let oldest = self.oldest_unacked_ns.load(Ordering::Relaxed);
        StageCounts {
            acked_delivered: self.acked_delivered.load(Ordering::Relaxed),
            acked_rejected: self.acked_rejected.load(Ordering::Relaxed),
            acked_errored: self.acked_errored.load(Ordering::Relaxed),
            oldest_unacked_ms: if oldest == 0 {
                0
            } else {
                crate::now_ns().saturating_sub(oldest) / 1_000_000
            },
            redelivered: self.redelivered.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            events_in: self.events_in.load(Ordering::Relaxed),
            events_out: self.events_out.load(Ordering::Relaxed),
            discarded: self.discarded.load(Ordering::Relaxed),
            errored: self.errored.load(Ordering::Relaxed),
            routed: self.routed.load(Ordering::Relaxed),
            created: self.created.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each counter adds to its own field of the snapshot and no other.
    #[test]
    fn each_counter_lands_in_its_own_field() {
        let m = StageMetrics::default();
        m.add_in(1);
        m.add_out(2);
        m.add_discarded(3);
        m.add_errored(4);
        m.add_routed(5);
        m.add_created(6);
        m.add_redelivered(7);
        m.add_retried(8);
        m.add_bytes_out(9);
        m.add_blocked_ns(1_500_000_000);
        m.add_in(10);
        let s = m.snapshot();
        assert_eq!(
            s,
            StageCounts {
                events_in: 11,
                events_out: 2,
                discarded: 3,
                errored: 4,
                routed: 5,
                created: 6,
                redelivered: 7,
                retried: 8,
                ..StageCounts::default()
            }
        );
        assert_eq!(m.bytes_out(), 9);
        assert_eq!(m.blocked_seconds(), 1.5);
        assert!(!s.has_acks());
    }

    /// In + created = out + discarded + errored + routed when everything
    /// is accounted for; a shortfall is positive, a surplus negative.
    #[test]
    fn unaccounted_is_what_came_in_less_what_went_anywhere() {
        let counts = |events_in, created, events_out, discarded, errored, routed| StageCounts {
            events_in,
            created,
            events_out,
            discarded,
            errored,
            routed,
            ..StageCounts::default()
        };
        assert_eq!(counts(10, 2, 5, 3, 2, 2).unaccounted(), 0);
        assert_eq!(counts(10, 2, 5, 3, 2, 1).unaccounted(), 1);
        assert_eq!(counts(10, 0, 5, 3, 2, 1).unaccounted(), -1);
        assert_eq!(counts(0, 4, 4, 0, 0, 0).unaccounted(), 0);
    }

    /// Acknowledgement totals replace (not add to) the last ones; the
    /// oldest open batch is reported by its age, 0 once none is open.
    #[test]
    fn acknowledgements_are_totals_and_the_oldest_open_batch_an_age() {
        let m = StageMetrics::default();
        let counts = |delivered, rejected, errored| crate::AckCounts {
            delivered,
            rejected,
            errored,
        };
        m.set_acks(counts(1, 1, 1), None);
        let sent = std::time::SystemTime::now() - std::time::Duration::from_secs(3);
        m.set_acks(counts(5, 2, 1), Some(sent));
        let s = m.snapshot();
        assert_eq!(
            (s.acked_delivered, s.acked_rejected, s.acked_errored),
            (5, 2, 1)
        );
        assert!(
            (3_000..10_000).contains(&s.oldest_unacked_ms),
            "{}",
            s.oldest_unacked_ms
        );
        assert!(s.has_acks());
        m.set_acks(counts(0, 0, 0), None);
        assert_eq!(m.snapshot().oldest_unacked_ms, 0);
        assert!(!m.snapshot().has_acks());
        // Any one count, or an open batch alone, makes a source with acks.
        for s in [
            StageCounts {
                acked_delivered: 1,
                ..StageCounts::default()
            },
            StageCounts {
                acked_rejected: 1,
                ..StageCounts::default()
            },
            StageCounts {
                acked_errored: 1,
                ..StageCounts::default()
            },
            StageCounts {
                oldest_unacked_ms: 1,
                ..StageCounts::default()
            },
        ] {
            assert!(s.has_acks(), "{s:?}");
        }
    }

    /// Named outputs count by index once named; before that, and past the
    /// last name, a count goes nowhere; naming twice keeps the first names.
    #[test]
    fn named_outputs_count_by_index() {
        let m = StageMetrics::default();
        m.add_named(0, 5);
        assert!(m.named_outputs().is_empty());
        m.name_outputs(&["high".into(), "low".into()]);
        m.name_outputs(&["other".into()]);
        m.add_named(1, 2);
        m.add_named(1, 3);
        m.add_named(0, 1);
        m.add_named(2, 9);
        assert_eq!(
            m.named_outputs(),
            [("high".to_string(), 1), ("low".to_string(), 5)]
        );
    }
}
