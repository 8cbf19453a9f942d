//! `/metrics`: the stage and channel counters as Prometheus families with a
//! `stage` label, encoded by prometheus-client from a snapshot taken at
//! scrape time.

use logbus_core::StatsHandle;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

#[derive(Debug)]
struct Snapshot(logbus_core::RunReport, usize);

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

fn stage(id: &str) -> Labels {
    vec![("stage".to_string(), id.to_string())]
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let report = &self.0;
        let counters: [StageFamily; 5] = [
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
        let bound = encoder.encode_descriptor(
            "logbus_inflight_bound_events",
            "Worst-case events in flight, computed from the config.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(self.1 as i64).encode(bound)?;
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
    let bound = stats.pipeline().inflight_bound().events;
    registry.register_collector(Box::new(Snapshot(stats.snapshot(), bound)));
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

/// utime + stime from /proc/self/stat, at the usual 100 ticks per second.
fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}
