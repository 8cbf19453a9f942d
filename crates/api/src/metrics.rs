//! `/metrics`: the stage and channel counters as Prometheus families with a
//! `stage` label, encoded by prometheus-client from a snapshot taken at
//! scrape time.

use logbus_core::StatsHandle;
use logbus_core::report::process_cpu_seconds;
use logbus_queue::LocalQueueSnapshot;
use logbus_queue::durable::DurableSnapshot;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

#[derive(Debug)]
struct Snapshot {
    report: logbus_core::RunReport,
    bound: usize,
    /// Workers per stage, for the busy ratio.
    workers: std::collections::HashMap<String, usize>,
}

/// A power-of-two histogram snapshot as a Prometheus histogram; `scale`
/// converts recorded units to the metric's (microseconds -> seconds).
#[derive(Debug)]
struct Hist<'a>(&'a logbus_queue::HistogramSnapshot, f64);

impl EncodeMetric for Hist<'_> {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = self
            .0
            .buckets
            .iter()
            .map(|(bound, n)| (*bound as f64 * self.1, *n))
            .chain(std::iter::once((f64::INFINITY, 0)))
            .collect();
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            self.0.sum as f64 * self.1,
            self.0.count,
            &buckets,
            None,
        )
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

type Labels = Vec<(String, String)>;
/// A counter family: name, help, and how to read it from a stage's counts.
type StageFamily = (
    &'static str,
    &'static str,
    fn(&logbus_plugin_api::StageCounts) -> u64,
);
/// A gauge family read from a channel.
type ChannelFamily = (
    &'static str,
    &'static str,
    fn(&logbus_core::report::ChannelReport) -> i64,
);

type LocalFamily = (&'static str, &'static str, fn(&LocalQueueSnapshot) -> u64);

fn stage(id: &str) -> Labels {
    vec![("stage".to_string(), id.to_string())]
}

impl Snapshot {
    /// Local-scope queues: where events went and why, helping, and what is
    /// outstanding on each path.
    fn encode_local_queues(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let locals: Vec<_> = self
            .report
            .channels
            .iter()
            .filter_map(|c| Some((c.stage.as_str(), c.local.as_ref()?)))
            .collect();
        if locals.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            "logbus_queue_routed_events",
            "Events a local-scope queue admitted, by path (frontend/backend) and, for the backend, why.",
            None,
            MetricType::Counter,
        )?;
        for (id, l) in &locals {
            let b = &l.backend_events;
            for (path, reason, n) in [
                ("frontend", "fit", l.frontend_events),
                ("backend", "no_fit", b.no_fit),
                ("backend", "oversized", b.oversized),
                ("backend", "exhausted", b.exhausted),
                ("backend", "shutdown", b.shutdown),
                ("backend", "direct", b.direct),
            ] {
                let mut labels = stage(id);
                labels.push(("path".into(), path.into()));
                labels.push(("reason".into(), reason.into()));
                ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
            }
        }
        let counters: [LocalFamily; 5] = [
            (
                "logbus_queue_help_attempts",
                "Times an idle frontend consumer looked for backend work.",
                |l| l.help_attempts,
            ),
            (
                "logbus_queue_help_empty",
                "Help attempts that found the backend empty.",
                |l| l.help_empty,
            ),
            (
                "logbus_queue_help_events",
                "Backend events frontend consumers borrowed and completed.",
                |l| l.help_events_completed,
            ),
            (
                "logbus_queue_registration_failures",
                "Producers that found every frontend slot taken (they use the backend).",
                |l| l.registration_failures,
            ),
            (
                "logbus_queue_registrations",
                "Producers holding a frontend (slots are never recycled).",
                |l| l.registrations,
            ),
        ];
        for (name, help, get) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (id, l) in &locals {
                ConstCounter::new(get(l)).encode(family.encode_family(&stage(id))?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "logbus_queue_outstanding",
            "Events a local-scope queue accepted that are not yet finished, on every path.",
            None,
            MetricType::Gauge,
        )?;
        for (id, l) in &locals {
            ConstGauge::new(l.outstanding as i64).encode(family.encode_family(&stage(id))?)?;
        }
        let mut family = encoder.encode_descriptor(
            "logbus_queue_frontend_queued",
            "Events in one frontend ring now.",
            None,
            MetricType::Gauge,
        )?;
        for (id, l) in &locals {
            for fe in l.frontends.iter().filter(|f| f.registered) {
                let mut labels = stage(id);
                labels.push(("slot".into(), fe.slot.to_string()));
                ConstGauge::new(fe.queued as i64).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

type DiskFamily = (&'static str, &'static str, fn(&DurableSnapshot) -> u64);

impl Snapshot {
    /// Durable (`disk`, `disk-assisted`) queues: backlog on disk, I/O,
    /// damage and policy drops.
    fn encode_disk_queues(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let disks: Vec<(&str, &DurableSnapshot)> = self
            .report
            .channels
            .iter()
            .filter_map(|c| Some((c.stage.as_str(), c.disk.as_ref()?)))
            .collect();
        if disks.is_empty() {
            return Ok(());
        }
        let gauges: [DiskFamily; 4] = [
            (
                "logbus_queue_disk_queued_events",
                "Events stored in a durable queue and not yet acknowledged.",
                |d| d.queued,
            ),
            (
                "logbus_queue_disk_unread_events",
                "Events stored in a durable queue and not yet read.",
                |d| d.unread,
            ),
            (
                "logbus_queue_disk_bytes",
                "Bytes of a durable queue's segment files.",
                |d| d.disk_bytes,
            ),
            (
                "logbus_queue_disk_spilling",
                "1 while a disk-assisted queue sends new events to disk.",
                |d| d.spilling as u64,
            ),
        ];
        for (name, help, get) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (id, d) in &disks {
                ConstGauge::new(get(d) as i64).encode(family.encode_family(&stage(id))?)?;
            }
        }
        let counters: [DiskFamily; 10] = [
            (
                "logbus_queue_disk_written_events",
                "Events written to a durable queue's log.",
                |d| d.spilled,
            ),
            (
                "logbus_queue_disk_recovered_events",
                "Events found in the log at start, left by an earlier run.",
                |d| d.recovered,
            ),
            (
                "logbus_queue_disk_written_bytes",
                "Bytes appended to the log.",
                |d| d.bytes_written,
            ),
            (
                "logbus_queue_disk_fsyncs",
                "fdatasync calls on the log.",
                |d| d.fsyncs,
            ),
            (
                "logbus_queue_disk_write_errors",
                "Failed log writes (retried; producers wait meanwhile).",
                |d| d.write_errors,
            ),
            (
                "logbus_queue_disk_dropped_events",
                "Events dropped by `when_full: drop_oldest|drop_newest`.",
                |d| d.dropped_newest + d.dropped_oldest,
            ),
            (
                "logbus_queue_disk_damaged_regions",
                "Damaged log regions skipped (each may have held records).",
                |d| d.damaged_regions,
            ),
            (
                "logbus_queue_disk_damaged_bytes",
                "Bytes of damaged log regions skipped.",
                |d| d.damaged_bytes,
            ),
            (
                "logbus_queue_disk_lost_events",
                "Events stored in the log and gone: damaged, cut or deleted segments found at open, and segments unreadable or missing while running. Counted in the summary's lost.",
                |d| d.lost_at_open + d.unreadable,
            ),
            (
                "logbus_queue_disk_returned_events",
                "Events a failed consumer left in the log for the next start.",
                |d| d.returned,
            ),
        ];
        for (name, help, get) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (id, d) in &disks {
                ConstCounter::new(get(d)).encode(family.encode_family(&stage(id))?)?;
            }
        }
        Ok(())
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let report = &self.report;
        let counters: [StageFamily; 6] = [
            (
                "logbus_events_in",
                "Events a stage received from its input.",
                |c| c.events_in,
            ),
            (
                "logbus_events_out",
                "Events a stage sent on (sources: emitted; sinks: committed).",
                |c| c.events_out,
            ),
            (
                "logbus_events_discarded",
                "Events a stage dropped on purpose (filters).",
                |c| c.discarded,
            ),
            (
                "logbus_events_errored",
                "Events that ended in an error.",
                |c| c.errored,
            ),
            (
                "logbus_events_routed",
                "Events sent to a stage's <id>.errors output.",
                |c| c.routed,
            ),
            (
                "logbus_sink_retried",
                "Events a sink sent again after a failed attempt, once per retry.",
                |c| c.retried,
            ),
        ];
        for (name, help, get) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for s in &report.stages {
                ConstCounter::new(get(&s.counts)).encode(family.encode_family(&stage(&s.id))?)?;
            }
        }
        let gauges: [ChannelFamily; 3] = [
            (
                "logbus_channel_occupancy",
                "Events in a stage's input channel or its hands now.",
                |c| c.occupancy as i64,
            ),
            (
                "logbus_channel_capacity",
                "Capacity of a stage's input channel, in events.",
                |c| c.capacity as i64,
            ),
            (
                "logbus_channel_max_occupancy",
                "Highest occupancy seen since start.",
                |c| c.max_occupancy as i64,
            ),
        ];
        for (name, help, get) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for c in &report.channels {
                ConstGauge::new(get(c)).encode(family.encode_family(&stage(&c.stage))?)?;
            }
        }
        // Acknowledgements of the sources that checkpoint.
        let acked: [StageFamily; 4] = [
            (
                "logbus_source_acked_delivered",
                "Events a checkpointing source heard were delivered.",
                |c| c.acked_delivered,
            ),
            (
                "logbus_source_acked_rejected",
                "Events a checkpointing source heard were rejected (counted, not retried).",
                |c| c.acked_rejected,
            ),
            (
                "logbus_source_acked_errored",
                "Events a checkpointing source heard were not finished (its position waits before them).",
                |c| c.acked_errored,
            ),
            (
                "logbus_source_redelivered",
                "Events a source let go of unfinished for another reader to read again (a Kafka rebalance): possible duplicates.",
                |c| c.redelivered,
            ),
        ];
        let checkpointing: Vec<_> = report
            .stages
            .iter()
            .filter(|s| s.counts.has_acks())
            .collect();
        for (name, help, get) in acked {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for s in &checkpointing {
                ConstCounter::new(get(&s.counts)).encode(family.encode_family(&stage(&s.id))?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "logbus_source_oldest_unacked_seconds",
            "Age of the oldest batch a checkpointing source sent that is not yet acknowledged (0: none).",
            None,
            MetricType::Gauge,
        )?;
        for s in &checkpointing {
            ConstGauge::new(s.counts.oldest_unacked_ms as f64 / 1000.0)
                .encode(family.encode_family(&stage(&s.id))?)?;
        }

        let bound = encoder.encode_descriptor(
            "logbus_inflight_bound_events",
            "Worst-case events in flight, computed from the config.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(self.bound as i64).encode(bound)?;

        let mut family = encoder.encode_descriptor(
            "logbus_bytes_out",
            "Raw payload bytes a stage sent on: what a source read, what a formatter produced.",
            None,
            MetricType::Counter,
        )?;
        for st in &report.stages {
            ConstCounter::new(st.bytes_out).encode(family.encode_family(&stage(&st.id))?)?;
        }

        let mut family = encoder.encode_descriptor(
            "logbus_stage_output_events",
            "Events a stage with named outputs (route) sent to each.",
            None,
            MetricType::Counter,
        )?;
        for st in &report.stages {
            for (output, n) in &st.outputs {
                let mut labels = stage(&st.id);
                labels.push(("output".to_string(), output.clone()));
                ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
            }
        }

        let elapsed = report.elapsed_seconds.max(1e-9);
        let waits: std::collections::HashMap<&str, f64> = report
            .channels
            .iter()
            .map(|c| (c.stage.as_str(), c.wait_seconds))
            .collect();
        let mut family = encoder.encode_descriptor(
            "logbus_stage_blocked_seconds",
            "Time a stage waited for room downstream (backpressure).",
            None,
            MetricType::Counter,
        )?;
        for st in &report.stages {
            ConstCounter::new(st.blocked_seconds).encode(family.encode_family(&stage(&st.id))?)?;
        }
        let mut family = encoder.encode_descriptor(
            "logbus_stage_wait_seconds",
            "Time a stage's workers waited for input.",
            None,
            MetricType::Counter,
        )?;
        for c in &report.channels {
            ConstCounter::new(c.wait_seconds).encode(family.encode_family(&stage(&c.stage))?)?;
        }
        let mut family = encoder.encode_descriptor(
            "logbus_stage_busy_ratio",
            "Share of a stage's worker time spent working: not waiting for input nor for room downstream.",
            None,
            MetricType::Gauge,
        )?;
        // Stages with an input only: a source's waiting happens inside its plugin.
        for st in report
            .stages
            .iter()
            .filter(|st| waits.contains_key(st.id.as_str()))
        {
            let workers = *self.workers.get(&st.id).unwrap_or(&1) as f64;
            let idle = waits[st.id.as_str()] + st.blocked_seconds;
            let busy = (1.0 - idle / (elapsed * workers)).clamp(0.0, 1.0);
            ConstGauge::new(busy).encode(family.encode_family(&stage(&st.id))?)?;
        }
        let mut family = encoder.encode_descriptor(
            "logbus_batch_size",
            "Events per dequeue, per stage input (power-of-two buckets).",
            None,
            MetricType::Histogram,
        )?;
        for c in &report.channels {
            Hist(&c.batch_sizes, 1.0).encode(family.encode_family(&stage(&c.stage))?)?;
        }
        let mut family = encoder.encode_descriptor(
            "logbus_sink_latency_seconds",
            "From the source reading an event to the sink releasing its batch after committing it (power-of-two buckets).",
            None,
            MetricType::Histogram,
        )?;
        for c in &report.channels {
            if let Some(h) = &c.ingest_latency_us {
                Hist(h, 1e-6).encode(family.encode_family(&stage(&c.stage))?)?;
            }
        }
        self.encode_local_queues(&mut encoder)?;
        self.encode_disk_queues(&mut encoder)?;
        if let Some(rss) = process_rss_bytes() {
            let family = encoder.encode_descriptor(
                "logbus_process_resident_memory_bytes",
                "Resident memory of the process.",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(rss as i64).encode(family)?;
        }
        if let Some(cpu) = process_cpu_seconds() {
            let family = encoder.encode_descriptor(
                "logbus_process_cpu_seconds",
                "CPU time (user + system) of the process.",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(cpu).encode(family)?;
        }
        Ok(())
    }
}

pub fn render(stats: &StatsHandle) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    let pipeline = stats.pipeline();
    registry.register_collector(Box::new(Snapshot {
        report: stats.snapshot(),
        bound: pipeline.inflight_bound().events,
        workers: pipeline
            .stages
            .iter()
            .map(|s| (s.id.clone(), s.instances(&pipeline.settings)))
            .collect(),
    }));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// VmRSS from /proc/self/status (Linux).
pub fn process_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_core::report::{ChannelReport, StageReport};
    use logbus_plugin_api::{StageCounts, StageKind};
    use logbus_queue::HistogramSnapshot;

    fn stage_report(id: &str, kind: StageKind, counts: StageCounts) -> StageReport {
        StageReport {
            id: id.into(),
            kind,
            counts,
            blocked_seconds: 1.0,
            bytes_out: 0,
            outputs: Default::default(),
            fused_into: None,
        }
    }

    /// Every number distinct, so that a wrong sum or scale shows.
    fn snapshot() -> Snapshot {
        let source = StageCounts {
            events_out: 100,
            acked_delivered: 90,
            acked_rejected: 2,
            acked_errored: 3,
            oldest_unacked_ms: 2500,
            ..StageCounts::default()
        };
        let sink = StageCounts {
            events_in: 100,
            events_out: 97,
            ..StageCounts::default()
        };
        let local = LocalQueueSnapshot {
            registrations: 2,
            frontend_events: 70,
            backend_events: logbus_queue::local::BackendRouting {
                no_fit: 11,
                oversized: 12,
                exhausted: 13,
                shutdown: 14,
                direct: 15,
            },
            help_attempts: 21,
            help_empty: 22,
            help_events_completed: 23,
            outstanding: 24,
            frontends: vec![
                logbus_queue::local::FrontendSnapshot {
                    slot: 0,
                    registered: true,
                    queued: 5,
                    ..Default::default()
                },
                logbus_queue::local::FrontendSnapshot {
                    slot: 1,
                    registered: false,
                    queued: 6,
                    ..Default::default()
                },
            ],
            ..LocalQueueSnapshot::default()
        };
        let disk = DurableSnapshot {
            queued: 31,
            unread: 32,
            disk_bytes: 33,
            spilling: true,
            spilled: 34,
            dropped_newest: 3,
            dropped_oldest: 4,
            lost_at_open: 5,
            unreadable: 6,
            ..DurableSnapshot::default()
        };
        let channel = ChannelReport {
            stage: "out".into(),
            capacity: 4096,
            occupancy: 7,
            max_occupancy: 8,
            sent: 100,
            received: 100,
            abandoned: 0,
            batch_sizes: HistogramSnapshot {
                buckets: vec![(1, 2), (4, 3)],
                count: 5,
                sum: 14,
            },
            wait_seconds: 2.0,
            ingest_latency_us: Some(HistogramSnapshot {
                buckets: vec![(1024, 1)],
                count: 1,
                sum: 1500,
            }),
            local: Some(local),
            disk: Some(disk),
        };
        Snapshot {
            report: logbus_core::RunReport::new(
                vec![
                    stage_report("in", StageKind::Source, source),
                    stage_report("out", StageKind::Sink, sink),
                ],
                vec![channel],
                Vec::new(),
                std::time::Duration::from_secs(10),
            ),
            bound: 4096,
            workers: [("out".to_string(), 2)].into(),
        }
    }

    fn text() -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(snapshot()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn every_family_carries_the_snapshots_numbers() {
        let text = text();
        for line in [
            "logbus_events_out_total{stage=\"out\"} 97",
            "logbus_source_acked_rejected_total{stage=\"in\"} 2",
            "logbus_source_oldest_unacked_seconds{stage=\"in\"} 2.5",
            "logbus_inflight_bound_events 4096",
            // 1 - (waited 2 s + blocked 1 s) / (10 s × 2 workers)
            "logbus_stage_busy_ratio{stage=\"out\"} 0.85",
            "logbus_batch_size_sum{stage=\"out\"} 14.0",
            "logbus_batch_size_bucket{le=\"4.0\",stage=\"out\"} 5",
            "logbus_sink_latency_seconds_sum{stage=\"out\"} 0.0015",
            "logbus_sink_latency_seconds_bucket{le=\"0.001024\",stage=\"out\"} 1",
            "logbus_queue_routed_events_total{stage=\"out\",path=\"frontend\",reason=\"fit\"} 70",
            "logbus_queue_routed_events_total{stage=\"out\",path=\"backend\",reason=\"no_fit\"} 11",
            "logbus_queue_routed_events_total{stage=\"out\",path=\"backend\",reason=\"oversized\"} 12",
            "logbus_queue_routed_events_total{stage=\"out\",path=\"backend\",reason=\"exhausted\"} 13",
            "logbus_queue_routed_events_total{stage=\"out\",path=\"backend\",reason=\"shutdown\"} 14",
            "logbus_queue_routed_events_total{stage=\"out\",path=\"backend\",reason=\"direct\"} 15",
            "logbus_queue_help_attempts_total{stage=\"out\"} 21",
            "logbus_queue_help_empty_total{stage=\"out\"} 22",
            "logbus_queue_help_events_total{stage=\"out\"} 23",
            "logbus_queue_registrations_total{stage=\"out\"} 2",
            "logbus_queue_outstanding{stage=\"out\"} 24",
            "logbus_queue_frontend_queued{stage=\"out\",slot=\"0\"} 5",
            "logbus_queue_disk_queued_events{stage=\"out\"} 31",
            "logbus_queue_disk_unread_events{stage=\"out\"} 32",
            "logbus_queue_disk_bytes{stage=\"out\"} 33",
            "logbus_queue_disk_spilling{stage=\"out\"} 1",
            "logbus_queue_disk_written_events_total{stage=\"out\"} 34",
            "logbus_queue_disk_dropped_events_total{stage=\"out\"} 7",
            "logbus_queue_disk_lost_events_total{stage=\"out\"} 11",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        // A slot no producer holds has no ring to report.
        assert!(!text.contains("slot=\"1\""), "{text}");
        // Sources only acknowledge: the sink has no acknowledgement lines.
        assert!(!text.contains("logbus_source_acked_delivered_total{stage=\"out\"}"));
    }

    #[test]
    fn resident_memory_is_reported_in_bytes() {
        let rss = process_rss_bytes().unwrap();
        // statm's second field: resident pages (4 KiB here).
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        let from_statm = pages * 4096;
        assert!(
            rss / 2 < from_statm && from_statm < rss * 2,
            "VmRSS {rss} bytes against statm {from_statm}"
        );
    }
}
