//! `source: sysinfo` — the host's vital signs as events every interval:
//! CPU, memory, load, disks, network interfaces, and the top processes by
//! CPU. One structured event per thing measured (`kind` says which), so a
//! filter or a sink can pick what it needs.

use std::sync::Arc;
use std::time::Duration;

use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, Fields, Meta, OptionError, Source, SourceContext,
    StageError, StageKind, TypedPlugin, async_trait,
};
use serde::Deserialize;
use serde_json::{Value, json};
use sysinfo::{Disks, Networks, ProcessesToUpdate, System};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Collector {
    Cpu,
    Memory,
    Load,
    Disks,
    Network,
    Processes,
}

fn all() -> Vec<Collector> {
    vec![
        Collector::Cpu,
        Collector::Memory,
        Collector::Load,
        Collector::Disks,
        Collector::Network,
        Collector::Processes,
    ]
}

/// Options of `source: sysinfo`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SysInfoOptions {
    /// How often to measure.
    #[serde(default = "default_interval")]
    #[schemars(range(min = 100))]
    pub interval_ms: u64,
    /// What to measure (default: all).
    #[serde(default = "all")]
    pub collectors: Vec<Collector>,
    /// Processes reported per interval, by CPU use.
    #[serde(default = "default_top")]
    #[schemars(range(max = 1000))]
    pub top_processes: usize,
    /// Stop after this many intervals (0: until the pipeline stops).
    #[serde(default)]
    pub count: u64,
}

fn default_interval() -> u64 {
    10_000
}
fn default_top() -> usize {
    5
}

impl CheckOptions for SysInfoOptions {
    fn check(&self) -> Vec<OptionError> {
        // `interval_ms` below 100 is refused by the schema's range.
        let mut errors = Vec::new();
        if self.collectors.is_empty() {
            errors.push(OptionError::at(&["collectors"], "name at least one"));
        }
        errors
    }
}

pub struct SysInfo;

impl TypedPlugin for SysInfo {
    type Options = SysInfoOptions;
    const NAME: &'static str = "sysinfo";
    const KIND: StageKind = StageKind::Source;

    type Stage = Box<dyn Source>;
    const DESCRIPTION: &'static str = "Host metrics as events every interval: CPU, memory, load, disks, network interfaces, top processes.";

    /// `kind`, `host` and `collected_at` on every event; the measurements
    /// differ by kind, so the rest is open.
    fn flow(&self, _o: &SysInfoOptions) -> logbus_plugin_api::Flow {
        use logbus_plugin_api::FieldType::String;
        logbus_plugin_api::Flow::open_fields(&[
            ("kind", String),
            ("host", String),
            ("collected_at", String),
        ])
    }

    fn build(
        &self,
        options: SysInfoOptions,
        _cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(Sampler { options }))
    }
}

struct Sampler {
    options: SysInfoOptions,
}

struct State {
    system: System,
    disks: Disks,
    networks: Networks,
    host: String,
    cores: usize,
}

fn event(host: &str, at: &str, kind: &str, fields: Value, source: &Arc<str>) -> Event {
    let mut f = Fields::new();
    f.insert("kind".into(), kind.into());
    f.insert("host".into(), host.into());
    f.insert("collected_at".into(), at.into());
    if let Value::Object(map) = fields {
        for (k, v) in map {
            f.insert(k, v);
        }
    }
    Event::fields(f, Meta::now(source.clone()))
}

impl Sampler {
    fn collect(&self, s: &mut State, elapsed: Duration, source: &Arc<str>) -> Vec<Event> {
        let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let secs = elapsed.as_secs_f64().max(1e-3);
        let host = s.host.clone();
        let mut out = Vec::new();
        let mut push =
            |kind: &str, fields: Value| out.push(event(&host, &at, kind, fields, source));
        for c in &self.options.collectors {
            match c {
                Collector::Cpu => {
                    s.system.refresh_cpu_usage();
                    let per_core: Vec<f64> = s
                        .system
                        .cpus()
                        .iter()
                        .map(|c| round(c.cpu_usage() as f64))
                        .collect();
                    push(
                        "cpu",
                        json!({
                            "usage_percent": round(s.system.global_cpu_usage() as f64),
                            "cores": s.cores,
                            "per_core_percent": per_core,
                        }),
                    );
                }
                Collector::Memory => {
                    s.system.refresh_memory();
                    let m = &s.system;
                    push(
                        "memory",
                        json!({
                            "total_bytes": m.total_memory(),
                            "used_bytes": m.used_memory(),
                            "available_bytes": m.available_memory(),
                            "swap_total_bytes": m.total_swap(),
                            "swap_used_bytes": m.used_swap(),
                        }),
                    );
                }
                Collector::Load => {
                    let l = System::load_average();
                    push(
                        "load",
                        json!({ "one": l.one, "five": l.five, "fifteen": l.fifteen }),
                    );
                }
                Collector::Disks => {
                    s.disks.refresh(true);
                    for d in s.disks.list() {
                        push(
                            "disk",
                            json!({
                                "mount_point": d.mount_point().display().to_string(),
                                "device": d.name().to_string_lossy(),
                                "file_system": d.file_system().to_string_lossy(),
                                "total_bytes": d.total_space(),
                                "available_bytes": d.available_space(),
                            }),
                        );
                    }
                }
                Collector::Network => {
                    s.networks.refresh(true);
                    let mut names: Vec<_> = s.networks.iter().collect();
                    names.sort_by(|a, b| a.0.cmp(b.0));
                    for (name, n) in names {
                        push(
                            "network",
                            json!({
                                "interface": name,
                                "received_bytes_total": n.total_received(),
                                "transmitted_bytes_total": n.total_transmitted(),
                                "received_bytes_per_second": round(n.received() as f64 / secs),
                                "transmitted_bytes_per_second": round(n.transmitted() as f64 / secs),
                            }),
                        );
                    }
                }
                Collector::Processes => {
                    s.system.refresh_processes(ProcessesToUpdate::All, true);
                    let mut procs: Vec<_> = s.system.processes().values().collect();
                    procs.sort_by(|a, b| b.cpu_usage().total_cmp(&a.cpu_usage()));
                    for p in procs.into_iter().take(self.options.top_processes) {
                        push(
                            "process",
                            json!({
                                "pid": p.pid().as_u32(),
                                "name": p.name().to_string_lossy(),
                                "cpu_percent": round(p.cpu_usage() as f64),
                                "memory_bytes": p.memory(),
                            }),
                        );
                    }
                }
            }
        }
        out
    }
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[async_trait]
impl Source for Sampler {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        let mut state = tokio::task::spawn_blocking(|| {
            let mut system = System::new();
            // A first reading, so the first interval's CPU figures are rates.
            system.refresh_cpu_usage();
            system.refresh_processes(ProcessesToUpdate::All, true);
            let cores = system.cpus().len();
            State {
                system,
                disks: Disks::new_with_refreshed_list(),
                networks: Networks::new_with_refreshed_list(),
                host: System::host_name().unwrap_or_else(|| "unknown".into()),
                cores,
            }
        })
        .await
        .map_err(|e| StageError::Other(format!("reading host information: {e}")))?;
        let mut interval = tokio::time::interval(Duration::from_millis(self.options.interval_ms));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        interval.tick().await;
        let mut last = tokio::time::Instant::now();
        let mut n = 0;
        while self.options.count == 0 || n < self.options.count {
            tokio::select! {
                _ = cx.shutdown.cancelled() => return Ok(()),
                _ = interval.tick() => {}
            }
            let elapsed = last.elapsed();
            last = tokio::time::Instant::now();
            let events = logbus_plugin_api::blocking(|| self.collect(&mut state, elapsed, &cx.id));
            if cx.output.send(events).await.is_err() {
                return Ok(());
            }
            n += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn figures_are_rounded_to_two_decimals() {
        assert_eq!(super::round(1.234_567), 1.23);
        assert_eq!(super::round(99.999), 100.0);
        assert_eq!(super::round(-0.126), -0.13);
        assert_eq!(super::round(20_971_520.0 / 0.5), 41_943_040.0);
    }
}
