//! The reconciliation at exit: every event a source emitted is committed,
//! discarded on purpose, or errored, and anything else is `lost` — which must
//! be zero. Printed on stderr and written as JSON by `--stats-json`.

use std::fmt;
use std::time::Duration;

use logbus_plugin_api::durable::DurableSnapshot;
use logbus_plugin_api::{HistogramSnapshot, LocalQueueSnapshot, StageCounts, StageKind};
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
