//! The reconciliation at exit: every event a source emitted is committed,
//! discarded on purpose, or errored, and anything else is `lost` — which must
//! be zero. Printed on stderr and written as JSON by `--stats-json`.
//!
//! The arithmetic: per stage, what came in plus what the stage created
//! equals what went out, was discarded, errored or routed; per channel,
//! what was sent was received (a durable queue adds what it recovered from
//! an earlier run and takes off what it keeps for the next). `lost` sums
//! every imbalance, so one number says whether anything vanished and the
//! per-stage table says where. `StatsHandle` (in `runtime/stats.rs`) builds the
//! same report while the pipeline runs, for the API.

use std::fmt;
use std::time::Duration;

use logbus_plugin_api::{StageCounts, StageKind};
use logbus_queue::durable::DurableSnapshot;
use logbus_queue::{HistogramSnapshot, LocalQueueSnapshot};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct StageReport {
    pub id: String,
    pub kind: StageKind,
    #[serde(flatten)]
    pub counts: StageCounts,
    /// Time spent waiting for room downstream (backpressure), seconds.
    pub blocked_seconds: f64,
    /// Raw payload bytes sent on (what a source read, a formatter produced).
    pub bytes_out: u64,
    /// A stage with named outputs (`route`): events sent to each.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub outputs: std::collections::BTreeMap<String, u64>,
    /// Run fused with the stages after or before it, in one task per
    /// worker (`settings.fuse`): the chain's first stage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fused_into: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChannelReport {
    /// The stage this channel feeds.
    pub stage: String,
    pub capacity: usize,
    /// Events in the channel or its consumer's hands when the report was taken.
    pub occupancy: usize,
    pub max_occupancy: usize,
    pub sent: u64,
    pub received: u64,
    pub abandoned: u64,
    /// Events per dequeue.
    pub batch_sizes: HistogramSnapshot,
    /// Time the consumer(s) waited for input, seconds.
    pub wait_seconds: f64,
    /// Microseconds from ingest to the sink committing and releasing the
    /// batch (sink inputs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingest_latency_us: Option<HistogramSnapshot>,
    /// Frontend/backend routing, helping and per-frontend counters of a
    /// local-scope queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local: Option<LocalQueueSnapshot>,
    /// The log of a `disk` or `disk-assisted` queue: what it recovered at
    /// start, holds now, dropped by policy, and its I/O.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<DurableSnapshot>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StageFailure {
    pub stage: String,
    pub message: String,
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Totals {
    /// Events sent by sources.
    pub emitted: u64,
    /// Events written by sinks.
    pub committed: u64,
    pub discarded: u64,
    pub errored: u64,
    /// Events made by splitting stages (one input, several outputs).
    pub created: u64,
    /// Events that vanished: the sum of every stage's and channel's
    /// imbalance. For a linear pipeline without splits this is
    /// `emitted - committed - discarded - errored`.
    pub lost: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub totals: Totals,
    pub stages: Vec<StageReport>,
    pub channels: Vec<ChannelReport>,
    pub failures: Vec<StageFailure>,
    pub elapsed_seconds: f64,
    /// Peak resident memory of the process, when the OS reports it.
    pub peak_rss_bytes: Option<u64>,
    /// CPU time (user + system) the process used, seconds.
    pub cpu_seconds: Option<f64>,
    /// Worker threads of the runtime that ran the stages
    /// (`settings.threads`, `--threads`, or one per core).
    pub worker_threads: Option<usize>,
}

impl RunReport {
    pub fn new(
        stages: Vec<StageReport>,
        channels: Vec<ChannelReport>,
        failures: Vec<StageFailure>,
        elapsed: Duration,
    ) -> Self {
        let mut t = Totals::default();
        for s in &stages {
            let c = &s.counts;
            match s.kind {
                StageKind::Source => t.emitted += c.events_out,
                StageKind::Sink => t.committed += c.events_out,
                _ => {}
            }
            t.discarded += c.discarded;
            t.errored += c.errored;
            t.created += c.created;
            if s.kind != StageKind::Source {
                t.lost += c.unaccounted();
            }
        }
        for ch in &channels {
            // A durable queue also delivers what an earlier process left,
            // and keeps for the next one what it did not deliver.
            let (recovered, kept, lost_at_open) = ch.disk.as_ref().map_or((0, 0, 0), |d| {
                (d.recovered, d.not_received(), d.lost_at_open)
            });
            t.lost += (ch.sent + recovered) as i64 - (ch.received + kept) as i64;
            // Stored by an earlier run and gone from the log since.
            t.lost += lost_at_open as i64;
        }
        RunReport {
            totals: t,
            stages,
            channels,
            failures,
            elapsed_seconds: elapsed.as_secs_f64(),
            peak_rss_bytes: peak_rss_bytes(),
            cpu_seconds: process_cpu_seconds(),
            worker_threads: tokio::runtime::Handle::try_current()
                .ok()
                .map(|h| h.metrics().num_workers()),
        }
    }

    /// Clean means no stage failed and nothing was lost.
    pub fn is_clean(&self) -> bool {
        self.failures.is_empty() && self.totals.lost == 0
    }
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.totals;
        writeln!(
            f,
            "logbus: emitted={} committed={} discarded={} errored={} created={} lost={} in {:.3}s",
            t.emitted, t.committed, t.discarded, t.errored, t.created, t.lost, self.elapsed_seconds
        )?;
        writeln!(
            f,
            "  {:<20} {:<10} {:>12} {:>12} {:>10} {:>10} {:>10}",
            "stage", "kind", "in", "out", "discarded", "errored", "routed"
        )?;
        for s in &self.stages {
            let c = &s.counts;
            writeln!(
                f,
                "  {:<20} {:<10} {:>12} {:>12} {:>10} {:>10} {:>10}",
                s.id, s.kind, c.events_in, c.events_out, c.discarded, c.errored, c.routed
            )?;
        }
        for s in self.stages.iter().filter(|s| s.counts.retried > 0) {
            writeln!(
                f,
                "  retried {}: {} events sent again after a failed attempt",
                s.id, s.counts.retried
            )?;
        }
        for s in &self.stages {
            let c = &s.counts;
            if !c.has_acks() {
                continue;
            }
            writeln!(
                f,
                "  acknowledged {}: delivered={} rejected={} errored={} oldest-unacknowledged={}ms{}",
                s.id,
                c.acked_delivered,
                c.acked_rejected,
                c.acked_errored,
                c.oldest_unacked_ms,
                if c.redelivered > 0 {
                    format!(" redelivered={} (may arrive twice)", c.redelivered)
                } else {
                    String::new()
                }
            )?;
        }
        for c in &self.channels {
            let Some(d) = &c.disk else { continue };
            writeln!(
                f,
                "  queue {} ({}): recovered {}, to disk {}, kept on disk {}, dropped {}, damaged {} regions ({} bytes), lost to damage {}; {} writes, {} fsyncs, {:.1} MiB written",
                c.stage,
                d.kind,
                d.recovered,
                d.spilled,
                d.queued,
                d.dropped_newest + d.dropped_oldest,
                d.damaged_regions,
                d.damaged_bytes,
                d.lost_at_open + d.unreadable,
                d.writes,
                d.fsyncs,
                d.bytes_written as f64 / (1024.0 * 1024.0)
            )?;
        }
        for c in &self.channels {
            let Some(l) = &c.local else { continue };
            let b = &l.backend_events;
            writeln!(
                f,
                "  queue {} (local): frontends {} events, backend {} (no_fit {}, oversized {}, exhausted {}, shutdown {}, direct {}); helped {}; frontends registered {}/{}, refused {}",
                c.stage,
                l.frontend_events,
                b.total(),
                b.no_fit,
                b.oversized,
                b.exhausted,
                b.shutdown,
                b.direct,
                l.help_events_completed,
                l.registrations,
                l.max_frontends,
                l.registration_failures
            )?;
        }
        if let Some(rss) = self.peak_rss_bytes {
            writeln!(f, "  peak RSS {:.1} MiB", rss as f64 / (1024.0 * 1024.0))?;
        }
        for failure in &self.failures {
            writeln!(f, "  FAILED stage `{}`: {}", failure.stage, failure.message)?;
        }
        if t.lost != 0 {
            writeln!(
                f,
                "  RECONCILIATION FAILED: {} events unaccounted for",
                t.lost
            )?;
        }
        Ok(())
    }
}

/// VmHWM from /proc/self/status (Linux); `None` elsewhere.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// utime + stime from /proc/self/stat, at the usual 100 ticks per second
/// (Linux); `None` elsewhere.
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_queue::LocalQueueSnapshot;

    fn stage(id: &str, kind: StageKind, counts: StageCounts) -> StageReport {
        StageReport {
            id: id.into(),
            kind,
            counts,
            blocked_seconds: 0.0,
            bytes_out: 0,
            outputs: Default::default(),
            fused_into: None,
        }
    }

    fn channel(stage: &str, sent: u64, received: u64) -> ChannelReport {
        ChannelReport {
            stage: stage.into(),
            capacity: 8,
            occupancy: 0,
            max_occupancy: 0,
            sent,
            received,
            abandoned: 0,
            batch_sizes: Default::default(),
            wait_seconds: 0.0,
            ingest_latency_us: None,
            local: None,
            disk: None,
        }
    }

    /// Sources' output is what was emitted, sinks' what was committed;
    /// every stage's discards, errors and splits add up; what a stage or
    /// a channel cannot account for is lost.
    #[test]
    fn the_totals_add_up_every_stage_and_channel() {
        let counts = |events_in, events_out, discarded, errored, routed, created| StageCounts {
            events_in,
            events_out,
            discarded,
            errored,
            routed,
            created,
            ..Default::default()
        };
        let stages = vec![
            // A source's own counts never make it lose anything.
            stage("in", StageKind::Source, counts(0, 100, 1, 2, 0, 0)),
            stage("t", StageKind::Transform, counts(100, 90, 3, 4, 5, 2)),
            stage("s", StageKind::Sink, counts(90, 85, 0, 6, 0, 0)),
        ];
        let channels = vec![channel("t", 100, 100), channel("s", 90, 89)];
        let r = RunReport::new(stages, channels, vec![], Duration::from_millis(1500));
        assert_eq!(
            r.totals,
            Totals {
                emitted: 100,
                committed: 85,
                discarded: 4,
                errored: 12,
                created: 2,
                // t: 102 in, 102 out; s: 90 in, 91 out (-1); channel s: 1.
                lost: 0,
            }
        );
        assert!(r.is_clean());
        assert_eq!(r.elapsed_seconds, 1.5);
        assert!(r.peak_rss_bytes.is_some_and(|b| b > 0));
        assert!(r.cpu_seconds.is_some_and(|s| s >= 0.0));
        assert_eq!(r.worker_threads, None, "outside a runtime");

        let stages = vec![
            stage("in", StageKind::Source, counts(0, 10, 0, 0, 0, 0)),
            stage("s", StageKind::Sink, counts(10, 7, 0, 0, 0, 0)),
        ];
        let r = RunReport::new(stages, vec![channel("s", 10, 9)], vec![], Duration::ZERO);
        assert_eq!(r.totals.lost, 3 + 1);
        assert!(!r.is_clean());
        // Nothing lost, but a stage failed.
        let r = RunReport::new(
            vec![],
            vec![],
            vec![StageFailure {
                stage: "s".into(),
                message: "boom".into(),
            }],
            Duration::ZERO,
        );
        assert!(!r.is_clean());
    }

    #[test]
    fn a_durable_queue_accounts_for_what_it_recovered_kept_and_lost_at_open() {
        let mut ch = channel("s", 10, 12);
        ch.disk = Some(DurableSnapshot {
            recovered: 5,
            unread: 1,
            dropped_newest: 1,
            dropped_oldest: 1,
            undecodable: 0,
            lost_at_open: 2,
            ..Default::default()
        });
        // (10 sent + 5 recovered) - (12 received + 3 kept) + 2 gone at open.
        let r = RunReport::new(vec![], vec![ch], vec![], Duration::ZERO);
        assert_eq!(r.totals.lost, 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 3)]
    async fn the_report_names_the_runtimes_worker_threads() {
        let r = RunReport::new(vec![], vec![], vec![], Duration::ZERO);
        assert_eq!(r.worker_threads, Some(3));
    }

    #[test]
    fn the_printed_report_says_everything_that_happened() {
        let sink = StageCounts {
            events_in: 9,
            events_out: 7,
            errored: 1,
            routed: 1,
            retried: 4,
            ..Default::default()
        };
        let source = StageCounts {
            events_out: 10,
            acked_delivered: 7,
            acked_rejected: 1,
            acked_errored: 2,
            oldest_unacked_ms: 30,
            redelivered: 3,
            ..Default::default()
        };
        let quiet_source = StageCounts {
            acked_delivered: 1,
            ..Default::default()
        };
        let mut disk = channel("s", 9, 9);
        disk.disk = Some(DurableSnapshot {
            kind: "disk",
            recovered: 1,
            spilled: 2,
            queued: 3,
            dropped_newest: 4,
            dropped_oldest: 5,
            damaged_regions: 6,
            damaged_bytes: 7,
            lost_at_open: 8,
            unreadable: 9,
            writes: 10,
            fsyncs: 11,
            bytes_written: 3 << 19,
            ..Default::default()
        });
        let mut local = channel("t", 0, 0);
        local.local = Some(LocalQueueSnapshot {
            frontend_events: 20,
            backend_events: logbus_queue::local::BackendRouting {
                no_fit: 1,
                oversized: 2,
                exhausted: 3,
                shutdown: 4,
                direct: 5,
            },
            help_events_completed: 6,
            registrations: 2,
            max_frontends: 8,
            registration_failures: 1,
            ..Default::default()
        });
        let mut r = RunReport::new(
            vec![
                stage("in", StageKind::Source, source),
                stage("in2", StageKind::Source, quiet_source),
                stage("s", StageKind::Sink, sink),
            ],
            vec![disk, local, channel("u", 0, 0)],
            vec![StageFailure {
                stage: "s".into(),
                message: "refused".into(),
            }],
            Duration::from_millis(2500),
        );
        r.peak_rss_bytes = Some(3 << 20);
        r.totals.lost = -2;
        let text = r.to_string();
        let expected = "\
logbus: emitted=10 committed=7 discarded=0 errored=1 created=0 lost=-2 in 2.500s
  stage                kind                 in          out  discarded    errored     routed
  in                   source                0           10          0          0          0
  in2                  source                0            0          0          0          0
  s                    sink                  9            7          0          1          1
  retried s: 4 events sent again after a failed attempt
  acknowledged in: delivered=7 rejected=1 errored=2 oldest-unacknowledged=30ms redelivered=3 (may arrive twice)
  acknowledged in2: delivered=1 rejected=0 errored=0 oldest-unacknowledged=0ms
  queue s (disk): recovered 1, to disk 2, kept on disk 3, dropped 9, damaged 6 regions (7 bytes), lost to damage 17; 10 writes, 11 fsyncs, 1.5 MiB written
  queue t (local): frontends 20 events, backend 15 (no_fit 1, oversized 2, exhausted 3, shutdown 4, direct 5); helped 6; frontends registered 2/8, refused 1
  peak RSS 3.0 MiB
  FAILED stage `s`: refused
  RECONCILIATION FAILED: -2 events unaccounted for
";
        assert_eq!(text, expected);
        // A clean run says none of the optional lines.
        r.totals.lost = 0;
        r.failures.clear();
        r.peak_rss_bytes = None;
        let text = r.to_string();
        assert!(!text.contains("RECONCILIATION"), "{text}");
        assert!(!text.contains("FAILED"), "{text}");
        assert!(!text.contains("peak RSS"), "{text}");
    }

    /// The process's CPU time (every thread's, user and system) as the
    /// kernel counts it for getrusage.
    #[allow(unsafe_code)]
    fn rusage_seconds() -> (f64, f64) {
        // SAFETY: getrusage fills the struct it is given, nothing else.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0);
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        (secs(usage.ru_utime), secs(usage.ru_stime))
    }

    #[test]
    fn the_process_reports_its_memory_and_time() {
        let rss = peak_rss_bytes().unwrap();
        // This test process has at least its own binary mapped.
        assert!(rss > 1 << 20, "{rss}");
        assert_eq!(rss % 1024, 0);
        // Spend at least 0.2 s in the kernel and as much in user space
        // (reading /proc in a loop does both), however busy the machine.
        let start = std::time::Instant::now();
        while rusage_seconds().1 < 0.2 || rusage_seconds().0 < 0.2 {
            assert!(process_cpu_seconds().is_some());
            assert!(start.elapsed() < Duration::from_secs(60));
        }
        // /proc counts whole ticks (10 ms) and is read a moment apart
        // from getrusage, on a process whose other threads may be busy.
        let (user, system) = rusage_seconds();
        let from_proc = process_cpu_seconds().unwrap();
        let (user2, system2) = rusage_seconds();
        assert!(
            from_proc > user + system - 0.05 && from_proc < user2 + system2 + 0.05,
            "/proc says {from_proc} s, getrusage {user} + {system} s"
        );
    }
}
