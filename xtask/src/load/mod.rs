//! `cargo xtask load`: open-loop load profiles of a pipeline, and of peer
//! shippers on the same corpus, dwells and machine.
//!
//! Why open-loop: a feeder that waits for the engine measures the feeder.
//! Here events are offered at a scheduled rate whatever the engine does, each
//! stamped with its scheduled arrival, and the controller only ever holds a
//! fixed rate for a dwell (never a ramp), so "held" and "tripped" mean the
//! same thing at every rung. Capacity comes out as an interval from
//! bisection, not as the rung of a grid; latency as pooled HDR histograms;
//! and a run whose counts do not reconcile, or whose feeder fell behind on
//! its own, is reported as failed instead of being averaged in.
//!
//! Threads per run: the feeder (writes the schedule), the collector (reads
//! the output, charges latency), the sampler (RSS, CPU, queue depth ten
//! times a second) and the controller (this module, choosing dwells).
//!
//! Why this module is long: the controller is one state machine (hold a
//! rate for a dwell, judge the dwell, bisect, stop on overload, recover)
//! whose steps read each other's measurements; feeding, collecting,
//! sampling, reporting and the peers' targets are already modules of
//! their own.

mod collector;
mod feeder;
mod files;
mod flood;
mod report;
mod sweep;
mod target;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

pub use target::TargetSpec;

/// State shared by the threads of one run.
pub struct Shared {
    origin: Instant,
    pub fed: AtomicU64,
    pub received: AtomicU64,
    /// Set when a run is abandoned: the feeder stops even mid-batch.
    pub stop_feeding: AtomicBool,
    /// Scheduled start (µs) of every dwell so far, in order.
    dwell_starts: Mutex<Vec<u64>>,
    /// How many dwell starts there are: the collector reads this for every
    /// chunk and takes the lock only when a dwell was added.
    dwell_count: AtomicUsize,
    pub schedules: Mutex<Vec<feeder::Schedule>>,
}

impl Shared {
    pub fn new() -> Shared {
        Shared {
            origin: Instant::now(),
            fed: AtomicU64::new(0),
            received: AtomicU64::new(0),
            stop_feeding: AtomicBool::new(false),
            dwell_starts: Mutex::new(Vec::new()),
            dwell_count: AtomicUsize::new(0),
            schedules: Mutex::new(Vec::new()),
        }
    }

    /// Records that a dwell's schedule starts at `start_us`.
    pub fn add_dwell_start(&self, start_us: u64) {
        self.dwell_starts
            .lock()
            .expect("dwell starts lock")
            .push(start_us);
        self.dwell_count.fetch_add(1, Ordering::Release);
    }

    /// `local` brought up to date with every dwell start so far.
    pub fn refresh_dwell_starts(&self, local: &mut Vec<u64>) {
        if local.len() != self.dwell_count.load(Ordering::Acquire) {
            local.clone_from(&self.dwell_starts.lock().expect("dwell starts lock"));
        }
    }

    pub fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    /// Events whose scheduled arrival is at or before `at_us`.
    pub fn scheduled_by(&self, at_us: u64) -> u64 {
        let schedules = self.schedules.lock().expect("schedules lock");
        schedules.iter().map(|s| s.due_by(at_us)).sum()
    }

    /// Events scheduled so far and not yet committed.
    pub fn backlog_at(&self, at_us: u64) -> u64 {
        self.scheduled_by(at_us)
            .saturating_sub(self.received.load(Ordering::Relaxed))
    }
}

/// Microsecond latencies from 1 µs up, three significant figures; grows as
/// needed so a minutes-long stall is recorded, not clipped.
pub fn new_histogram() -> Histogram<u64> {
    let mut h = Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    h.auto(true);
    h
}

/// Dwell lengths and the controller's rules; `full` and `quick` presets.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    pub start_rate: f64,
    pub grid_factor: f64,
    /// Bisection stops when hi/lo ≤ 1 + resolution.
    pub resolution: f64,
    pub grid_secs: f64,
    pub hold_secs: f64,
    pub overload_factor: f64,
    pub overload_secs: f64,
    pub latency_secs: f64,
    pub drain_timeout_secs: f64,
    /// A dwell holds when its backlog grew by at most this share of the
    /// events it offered (or 500 events, whichever is more: batches in
    /// flight), so long and short dwells are judged alike.
    pub held_backlog_share: f64,
    /// The feeder's own lag above this (while the engine was not pushing
    /// back) makes a dwell feeder-late.
    pub max_feeder_lag_ms: f64,
    /// Share of a dwell's events that may be feeder-late before the run is
    /// refused.
    pub max_feeder_late_share: f64,
    /// Step-downs allowed when the hold at the bisection floor trips.
    #[serde(default)]
    pub hold_retries: u32,
    /// The target runs under `nice -n` this much, so the feeder and
    /// collector (light, but timing-critical) are not starved when the
    /// target saturates the cores they share; 0 runs it as is.
    #[serde(default)]
    pub target_nice: u32,
}

impl Plan {
    /// Refuses plans the controller could never finish.
    pub fn check(&self) -> anyhow::Result<()> {
        // NaN fails every comparison: `above` is false for it.
        let above = |v: f64, floor: f64| v.is_finite() && v > floor;
        if !above(self.start_rate, 0.0) {
            bail!("the start rate must be above 0, got {}", self.start_rate);
        }
        if !above(self.grid_factor, 1.0) {
            bail!("the grid factor must be above 1, got {}", self.grid_factor);
        }
        if !above(self.resolution, 0.0) {
            bail!("the resolution must be above 0, got {}", self.resolution);
        }
        if !above(self.overload_factor, 1.0) {
            bail!(
                "the overload factor must be above 1, got {}",
                self.overload_factor
            );
        }
        for (name, secs) in [
            ("grid", self.grid_secs),
            ("hold", self.hold_secs),
            ("overload", self.overload_secs),
            ("latency", self.latency_secs),
            ("drain timeout", self.drain_timeout_secs),
        ] {
            if !above(secs, 0.0) {
                bail!("the {name} duration must be above 0 s, got {secs}");
            }
        }
        Ok(())
    }

    pub fn full() -> Plan {
        Plan {
            start_rate: 20_000.0,
            grid_factor: 1.25,
            resolution: 0.03,
            grid_secs: 5.0,
            hold_secs: 10.0,
            overload_factor: 1.5,
            overload_secs: 4.0,
            latency_secs: 10.0,
            drain_timeout_secs: 60.0,
            held_backlog_share: 0.01,
            max_feeder_lag_ms: 5.0,
            max_feeder_late_share: 0.01,
            hold_retries: 2,
            target_nice: 5,
        }
    }

    pub fn quick() -> Plan {
        Plan {
            start_rate: 25_000.0,
            grid_factor: 1.6,
            resolution: 0.1,
            grid_secs: 2.0,
            hold_secs: 3.0,
            overload_secs: 2.0,
            latency_secs: 3.0,
            drain_timeout_secs: 30.0,
            ..Plan::full()
        }
    }
}

/// Percentiles of one histogram, in microseconds.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

impl Percentiles {
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: h.len(),
            p50_us: h.value_at_quantile(0.50),
            p90_us: h.value_at_quantile(0.90),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    }
}

/// One fixed-rate dwell and what happened in it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Dwell {
    pub index: usize,
    pub kind: String,
    pub rate: f64,
    /// Seconds from the start of the run.
    pub start_s: f64,
    pub secs: f64,
    pub offered: u64,
    /// Events committed during the dwell's time window (whenever scheduled).
    pub delivered: u64,
    pub delivered_rate: f64,
    pub backlog_start: u64,
    /// The backlog a quarter into the dwell, where judging starts.
    pub backlog_settled: u64,
    pub backlog_end: u64,
    pub held: bool,
    /// Events of this dwell the feeder wrote late by its own fault
    /// (filled at run end).
    pub feeder_late: u64,
    /// Latency of the events scheduled in this dwell (filled at run end).
    pub latency: Percentiles,
    /// Why this dwell is left out of the pooled figures (its run stays in).
    #[serde(default)]
    pub left_out: Option<String>,
    /// The same histogram in full: HDR V2 deflate, base64 (what the
    /// summary pools, so any figure can be recomputed from the raw file).
    pub latency_hdr: String,
    pub feeder_own_lag: Percentiles,
}

/// A pause with nothing offered until everything scheduled is committed.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Drain {
    pub after_dwell: usize,
    pub start_s: f64,
    pub secs: f64,
    pub events: u64,
    pub rate: f64,
    pub complete: bool,
}

/// Ten times a second.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    pub t: f64,
    pub offered: u64,
    pub fed: u64,
    pub committed: u64,
    pub backlog: u64,
    pub out_rate: f64,
    pub rss: u64,
    pub cpu: f64,
    /// Occupancy of each stage's input channel (LogBus only).
    pub queues: Vec<(String, u64)>,
    pub lat_p50_us: u64,
    pub lat_p99_us: u64,
    pub lat_max_us: u64,
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Reconciliation {
    pub fed: u64,
    pub committed: u64,
    pub unstamped: u64,
    /// The engine's own totals and per-stage counts (LogBus only).
    pub engine_totals: Option<Value>,
    pub stage_counts: Vec<(String, u64)>,
    pub ok: bool,
    pub problems: Vec<String>,
}

/// Everything one repetition of one target produced.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Run {
    pub target: String,
    pub rep: usize,
    /// In the JSONL these are records of their own.
    #[serde(default)]
    pub dwells: Vec<Dwell>,
    #[serde(default)]
    pub drains: Vec<Drain>,
    #[serde(skip)]
    pub samples: Vec<Sample>,
    /// Why the controller could not finish the plan, if it could not.
    #[serde(default)]
    pub failure: Option<String>,
    /// Capacity: the highest rate held, and the lowest tripped above it.
    pub capacity_lo: f64,
    pub capacity_hi: Option<f64>,
    pub hold_confirmed: bool,
    pub recovered: bool,
    pub overload_delivered_rate: f64,
    pub hold_delivered_rate: f64,
    pub idle_rss: u64,
    pub peak_rss: u64,
    pub cpu_seconds: f64,
    /// The engine's runtime worker threads, from its own report (LogBus
    /// only).
    #[serde(default)]
    pub worker_threads: Option<u64>,
    pub elapsed_secs: f64,
    pub reconciliation: Reconciliation,
    /// Why this run is left out of the aggregate (empty: it is in).
    pub excluded_because: Vec<String>,
    #[serde(skip)]
    pub latency: Vec<Histogram<u64>>,
}

struct Controller<'a> {
    shared: Arc<Shared>,
    feed: Option<Sender<feeder::Schedule>>,
    plan: &'a Plan,
    pid: u32,
    label: String,
    dwells: Vec<Dwell>,
    drains: Vec<Drain>,
}

impl Controller<'_> {
    fn alive(&self) -> bool {
        target::proc_alive(self.pid)
    }

    fn dwell(&mut self, kind: &str, rate: f64, secs: f64) -> anyhow::Result<bool> {
        let index = self.dwells.len();
        let shared = self.shared.clone();
        let start = shared.now_us() + 2_000;
        let count = ((rate * secs).round() as u64).max(1);
        let schedule = feeder::Schedule {
            dwell: index,
            start_us: start,
            rate,
            count,
        };
        shared.add_dwell_start(start);
        shared.schedules.lock().expect("lock").push(schedule);
        let backlog_start = shared.backlog_at(start);
        let received0 = shared.received.load(Ordering::Relaxed);
        // The backlog is judged from a quarter into the dwell, once the
        // pipeline has filled to its working depth (rate × latency), so a
        // dwell after a drain is not charged for filling it.
        let settle = start + (secs * 0.25e6) as u64;
        let mut backlog_settled: Option<u64> = None;
        self.feed
            .as_ref()
            .expect("feeding")
            .send(schedule)
            .context("the feeder stopped")?;
        let end = start + (secs * 1e6) as u64;
        let bar = ProgressBar::new((secs * 10.0) as u64);
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {msg}")
                .expect("template")
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("{} {kind:<10} {:>9.0}/s", self.label, rate));
        loop {
            let now = shared.now_us();
            if now >= end {
                break;
            }
            if !self.alive() {
                bar.abandon();
                bail!("the target exited during dwell {index} ({kind} at {rate:.0}/s)");
            }
            if backlog_settled.is_none() && now >= settle {
                backlog_settled = Some(shared.backlog_at(now));
            }
            bar.set_position(now.saturating_sub(start) / 100_000);
            bar.set_message(format!("backlog {}", shared.backlog_at(now)));
            let next = if now < settle { settle } else { end };
            std::thread::sleep(Duration::from_millis(100).min(Duration::from_micros(next - now)));
        }
        let received1 = shared.received.load(Ordering::Relaxed);
        let backlog_end = shared.backlog_at(end);
        // Held: the backlog stayed flat after settling. What a dwell
        // inherited is not its fault; what it added beyond a little jitter is.
        let settled = backlog_settled.unwrap_or(backlog_start);
        let grew = backlog_end.saturating_sub(settled);
        let judged = count as f64 * 0.75;
        let held = grew as f64 <= (judged * self.plan.held_backlog_share).max(500.0);
        let delivered = received1 - received0;
        bar.finish_and_clear();
        let d = Dwell {
            index,
            kind: kind.to_string(),
            rate,
            start_s: start as f64 / 1e6,
            secs,
            offered: count,
            delivered,
            delivered_rate: delivered as f64 / secs,
            backlog_start,
            backlog_settled: settled,
            backlog_end,
            held,
            feeder_late: 0,
            latency: Percentiles::default(),
            left_out: None,
            latency_hdr: String::new(),
            feeder_own_lag: Percentiles::default(),
        };
        println!(
            "{} {kind:<10} {:>9.0}/s  delivered {:>9.0}/s  backlog {:>7} -> {:>7}  {}",
            self.label,
            rate,
            d.delivered_rate,
            backlog_start,
            backlog_end,
            if held { "held" } else { "TRIPPED" }
        );
        self.dwells.push(d);
        Ok(held)
    }

    /// Offers nothing until everything scheduled so far is committed.
    fn drain(&mut self) -> anyhow::Result<()> {
        let shared = self.shared.clone();
        let start = shared.now_us();
        let target = shared.scheduled_by(u64::MAX);
        let received0 = shared.received.load(Ordering::Relaxed);
        let deadline = start + (self.plan.drain_timeout_secs * 1e6) as u64;
        let mut complete = true;
        while shared.received.load(Ordering::Relaxed) < target {
            if shared.now_us() > deadline {
                complete = false;
                break;
            }
            if !self.alive() {
                bail!("the target exited while draining");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let secs = (shared.now_us() - start) as f64 / 1e6;
        let events = shared.received.load(Ordering::Relaxed) - received0;
        self.drains.push(Drain {
            after_dwell: self.dwells.len().saturating_sub(1),
            start_s: start as f64 / 1e6,
            secs,
            events,
            rate: if secs > 0.0 {
                events as f64 / secs
            } else {
                0.0
            },
            complete,
        });
        if !complete {
            bail!(
                "a drain did not finish within {} s ({} events still not committed): the target stopped keeping up or stopped reading",
                self.plan.drain_timeout_secs,
                target.saturating_sub(shared.received.load(Ordering::Relaxed))
            );
        }
        Ok(())
    }

    /// One dwell at a chosen rate, then a drain (`load dwell`).
    fn fixed(&mut self, rate: f64, secs: f64) -> anyhow::Result<(f64, Option<f64>)> {
        self.dwell("fixed", rate, secs)?;
        self.drain()?;
        Ok((rate, None))
    }

    /// The controller's fixed sequence; returns the capacity interval.
    fn profile(&mut self) -> anyhow::Result<(f64, Option<f64>)> {
        let plan = self.plan;
        // Walk up the grid until a dwell trips.
        let mut rate = plan.start_rate;
        let mut lo: Option<f64> = None;
        let hi: Option<f64>;
        loop {
            if self.dwell("grid", rate, plan.grid_secs)? {
                lo = Some(rate);
                rate *= plan.grid_factor;
                if rate > 50e6 {
                    bail!("no trip below 50M events/s: is the output really read?");
                }
            } else {
                hi = Some(rate);
                self.drain()?;
                break;
            }
        }
        // The first rung tripped: walk down instead.
        let mut hi = hi.expect("set when the loop ends");
        if lo.is_none() {
            let mut down = hi;
            for _ in 0..12 {
                down /= plan.grid_factor;
                if self.dwell("grid-down", down, plan.grid_secs)? {
                    lo = Some(down);
                    break;
                }
                hi = down;
                self.drain()?;
            }
        }
        let Some(mut lo) = lo else {
            bail!("no rate held, down to {hi:.0}/s");
        };
        // Narrow the interval by geometric bisection.
        while hi / lo > 1.0 + plan.resolution {
            let mid = (lo * hi).sqrt();
            if self.dwell("bisect", mid, plan.grid_secs)? {
                lo = mid;
            } else {
                hi = mid;
                self.drain()?;
            }
        }
        self.drain()?;
        // Capacity is what holds for a whole hold dwell. A bisection floor
        // found by short dwells can sit on the knife edge, so a tripped hold
        // steps down by the resolution and tries again, `hold_retries`
        // times, before the run is called hold-unconfirmed.
        for attempt in 0..=plan.hold_retries {
            if self.dwell("hold", lo, plan.hold_secs)? {
                break;
            }
            if let Some(d) = self.dwells.last_mut() {
                d.kind = "hold-tripped".to_string();
            }
            self.drain()?;
            if attempt < plan.hold_retries {
                hi = lo;
                lo /= 1.0 + plan.resolution;
            }
        }
        // The control for recovery: the same rate held once more, with no
        // overload in between. A floor near the knife edge (or a machine
        // that slows) can fail a second hold on its own; the re-hold after
        // the overload is read against this.
        if !self.dwell("control", lo, plan.hold_secs)? {
            self.drain()?;
        }
        self.dwell("overload", lo * plan.overload_factor, plan.overload_secs)?;
        self.drain()?;
        if !self.dwell("probe-90", lo * 0.9, plan.hold_secs)? {
            self.drain()?;
        }
        self.dwell("rehold", lo, plan.hold_secs)?;
        self.drain()?;
        for pct in [50, 70, 90] {
            self.dwell(
                &format!("latency-{pct}"),
                lo * pct as f64 / 100.0,
                plan.latency_secs,
            )?;
            self.drain()?;
        }
        Ok((lo, Some(hi)))
    }
}

/// Samples RSS, CPU, committed count, queue depth and the latency window.
fn sample_loop(
    shared: Arc<Shared>,
    pid: u32,
    api: Option<String>,
    window: Arc<Mutex<Histogram<u64>>>,
    stop: Arc<AtomicBool>,
) -> Vec<Sample> {
    // Queue depths come over HTTP on their own thread, so a slow answer
    // never delays the RSS and CPU samples.
    let depths: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let poller = api.map(|addr| {
        let (depths, stop) = (depths.clone(), stop.clone());
        std::thread::spawn(move || {
            let agent = ureq::Agent::new_with_config(
                ureq::Agent::config_builder()
                    .timeout_global(Some(Duration::from_millis(500)))
                    .build(),
            );
            while !stop.load(Ordering::Relaxed) {
                let began = Instant::now();
                if let Some(d) = channel_depths(&agent, &addr) {
                    *depths.lock().expect("depths lock") = d;
                }
                std::thread::sleep(Duration::from_millis(100).saturating_sub(began.elapsed()));
            }
        })
    });
    let mut samples = Vec::new();
    let mut last_committed = 0u64;
    let mut last_t = 0.0f64;
    while !stop.load(Ordering::Relaxed) {
        let now = shared.now_us();
        let rss = target::proc_rss(pid).unwrap_or(0);
        let cpu = target::proc_cpu(pid).unwrap_or(0.0);
        let queues = depths.lock().expect("depths lock").clone();
        let lat = {
            let mut w = window.lock().expect("window lock");
            let p = Percentiles::of(&w);
            w.reset();
            p
        };
        let committed = shared.received.load(Ordering::Relaxed);
        let t = now as f64 / 1e6;
        let offered = shared.scheduled_by(now);
        samples.push(Sample {
            t,
            offered,
            fed: shared.fed.load(Ordering::Relaxed),
            committed,
            backlog: offered.saturating_sub(committed),
            out_rate: if t > last_t {
                (committed - last_committed) as f64 / (t - last_t)
            } else {
                0.0
            },
            rss,
            cpu,
            queues,
            lat_p50_us: lat.p50_us,
            lat_p99_us: lat.p99_us,
            lat_max_us: lat.max_us,
        });
        last_committed = committed;
        last_t = t;
        let next = now + 100_000;
        let after = shared.now_us();
        if next > after {
            std::thread::sleep(Duration::from_micros(next - after));
        }
    }
    if let Some(p) = poller {
        let _ = p.join();
    }
    samples
}

fn channel_depths(agent: &ureq::Agent, addr: &str) -> Option<Vec<(String, u64)>> {
    let body = agent
        .get(format!("http://{addr}/api/stats"))
        .call()
        .ok()?
        .body_mut()
        .read_to_string()
        .ok()?;
    let v: Value = serde_json::from_str(&body).ok()?;
    Some(
        v["channels"]
            .as_array()?
            .iter()
            .filter_map(|c| Some((c["stage"].as_str()?.to_string(), c["occupancy"].as_u64()?)))
            .collect(),
    )
}

/// Whether the feeder's own lateness in a dwell could have decided its
/// outcome. Late writes add backlog, so a dwell that held despite them
/// stands for capacity; a trip stands when the backlog grew by more than
/// the late events plus the usual slack. Dwells timed for latency (and the
/// hold and re-hold) are strict either way: late writes are charged to the
/// target's latency.
fn feeder_late_matters(d: &Dwell, plan: &Plan) -> bool {
    if d.feeder_late as f64 <= plan.max_feeder_late_share * d.offered as f64 {
        return false;
    }
    let timed = matches!(d.kind.as_str(), "hold" | "control" | "rehold" | "probe-90")
        || d.kind.starts_with("latency-");
    if timed {
        return true;
    }
    if d.held {
        return false;
    }
    let grew = d.backlog_end.saturating_sub(d.backlog_settled) as f64;
    let slack = (d.offered as f64 * 0.75 * plan.held_backlog_share).max(500.0);
    grew <= d.feeder_late as f64 + slack
}

/// One repetition of one target: a fresh process taken through the plan.
pub fn run_one(
    spec: &TargetSpec,
    plan: &Plan,
    corpus: &Arc<feeder::Corpus>,
    work: &Path,
    rep: usize,
) -> anyhow::Result<Run> {
    run_script(spec, plan, corpus, work, rep, None)
}

/// A run of the whole plan, or (`fixed`) of one dwell at a given rate.
fn run_script(
    spec: &TargetSpec,
    plan: &Plan,
    corpus: &Arc<feeder::Corpus>,
    work: &Path,
    rep: usize,
    fixed: Option<(f64, f64)>,
) -> anyhow::Result<Run> {
    let tag = format!("{}-rep{rep}", spec.name());
    let label = format!("[{} rep {rep}]", spec.name());
    let mut running = target::Running::start(spec, work, &tag, plan.target_nice)?;
    let shared = Arc::new(Shared::new());
    let window = Arc::new(Mutex::new(new_histogram()));
    let (tx, rx) = std::sync::mpsc::channel();
    let input = running.input.take().expect("input");
    let output = running.output.take().expect("output");
    let max_lag = (plan.max_feeder_lag_ms * 1000.0) as u64;
    let feeder = {
        let (corpus, shared) = (corpus.clone(), shared.clone());
        std::thread::spawn(move || feeder::run(input, corpus, shared, rx, max_lag))
    };
    let collector = {
        let (shared, window) = (shared.clone(), window.clone());
        std::thread::spawn(move || collector::run(output, shared, window))
    };
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (shared, window, stop, api) = (
            shared.clone(),
            window.clone(),
            stop.clone(),
            running.api.clone(),
        );
        let pid = running.pid;
        std::thread::spawn(move || sample_loop(shared, pid, api, window, stop))
    };
    std::thread::sleep(Duration::from_millis(500));
    let idle_rss = target::proc_rss(running.pid).unwrap_or(0);
    let mut controller = Controller {
        shared: shared.clone(),
        feed: Some(tx),
        plan,
        pid: running.pid,
        label: label.clone(),
        dwells: Vec::new(),
        drains: Vec::new(),
    };
    let outcome = match fixed {
        Some((rate, secs)) => controller.fixed(rate, secs),
        None => controller.profile(),
    };
    if outcome.is_err() {
        // The target may be wedged with the feeder waiting on it.
        shared.stop_feeding.store(true, Ordering::Relaxed);
        let _ = running.child.kill();
    }
    // Stop feeding: the feeder finishes what is scheduled and closes the
    // target's input, which is how LogBus is told to drain and exit.
    controller.feed = None;
    let feed_report = feeder.join().expect("feeder thread");
    // Peers do not exit at end of input: wait for their output to catch up,
    // then stop them.
    let deadline = Instant::now() + Duration::from_secs_f64(plan.drain_timeout_secs);
    let exited = loop {
        if let Some(status) = running.child.try_wait()? {
            break Some(status);
        }
        let caught_up = shared.received.load(Ordering::Relaxed) >= feed_report.events;
        if (matches!(spec, TargetSpec::Peer { .. }) && caught_up) || Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if exited.is_none() {
        running.terminate()?;
    }
    // A file-reading collector stops at end of file once the target is gone.
    if let Some(done) = &running.output_done {
        done.store(true, Ordering::Relaxed);
    }
    let collected = collector.join().expect("collector thread");
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().expect("sampler thread");
    // CPU: the engine's own figure at exit where it gives one (it includes
    // the final drain), else the last sample taken while it ran.
    let cpu_seconds = stats_f64(running.stats_json.as_deref(), "cpu_seconds")
        .unwrap_or(0.0)
        .max(samples.iter().map(|s| s.cpu).fold(0.0, f64::max));
    let (capacity_lo, capacity_hi) = match &outcome {
        Ok(c) => *c,
        Err(_) => (0.0, None),
    };
    let mut dwells = controller.dwells;
    for d in &mut dwells {
        if let Some(h) = collected.by_dwell.get(d.index) {
            d.latency = Percentiles::of(h);
            d.latency_hdr = encode_histogram(h);
        }
        if let Some(h) = feed_report.own_lag.get(d.index) {
            d.feeder_own_lag = Percentiles::of(h);
        }
        d.feeder_late = feed_report.late.get(d.index).copied().unwrap_or(0);
    }
    let find = |kind: &str| dwells.iter().find(|d| d.kind == kind);
    // Tripped attempts are renamed `hold-tripped`: a `hold` dwell held.
    let hold_confirmed = find("hold").is_some_and(|d| d.held);
    let reconciliation = reconcile(
        feed_report.events,
        &collected,
        running.stats_json.as_deref(),
        exited.is_some(),
    );
    if !reconciliation.ok {
        println!(
            "{label} RECONCILIATION FAILED: {}",
            reconciliation.problems.join("; ")
        );
    }
    let peak_rss = samples.iter().map(|s| s.rss).max().unwrap_or(0).max(
        reconciliation
            .engine_totals
            .as_ref()
            .and_then(|_| stats_value(running.stats_json.as_deref(), "peak_rss_bytes"))
            .unwrap_or(0),
    );
    if !reconciliation.ok || exited.is_some_and(|s| !s.success()) {
        println!("{label} stderr: {}", running.stderr_tail());
    }
    let mut run = Run {
        target: spec.name().to_string(),
        rep,
        failure: outcome.as_ref().err().map(|e| format!("{e:#}")),
        capacity_lo,
        capacity_hi,
        hold_confirmed,
        recovered: find("rehold").is_some_and(|d| d.held),
        overload_delivered_rate: find("overload").map_or(0.0, |d| d.delivered_rate),
        hold_delivered_rate: find("hold").map_or(0.0, |d| d.delivered_rate),
        dwells,
        drains: controller.drains,
        samples,
        idle_rss,
        peak_rss,
        cpu_seconds,
        worker_threads: stats_value(running.stats_json.as_deref(), "worker_threads"),
        elapsed_secs: shared.now_us() as f64 / 1e6,
        reconciliation,
        excluded_because: Vec::new(),
        latency: collected.by_dwell,
    };
    judge(&mut run, plan);
    Ok(run)
}

/// Dwells whose outcome decides the capacity figure.
fn decides_capacity(kind: &str) -> bool {
    matches!(
        kind,
        "grid" | "grid-down" | "bisect" | "hold" | "hold-tripped"
    )
}

/// The rules, in one place for a live profile and for `load report`:
/// why a run is left out of the aggregate, and which of its dwells are
/// left out of the pooled figures while the run stays in.
pub fn judge(run: &mut Run, plan: &Plan) {
    let mut excluded = Vec::new();
    let has_hold = run.dwells.iter().any(|d| d.kind.starts_with("hold"));
    if let Some(failure) = &run.failure {
        excluded.push(format!("the profile did not finish: {failure}"));
    } else if has_hold && !run.hold_confirmed {
        let tries = run
            .dwells
            .iter()
            .filter(|d| d.kind.starts_with("hold") && !d.held)
            .count();
        excluded.push(format!(
            "hold-unconfirmed: {tries} hold dwell(s) tripped, the last at {:.0}/s",
            run.capacity_lo
        ));
    }
    for d in &mut run.dwells {
        d.left_out = None;
        if !feeder_late_matters(d, plan) {
            continue;
        }
        let why = format!(
            "feeder-late: {} of {} events written more than {} ms late by the feeder's own fault",
            d.feeder_late, d.offered, plan.max_feeder_lag_ms
        );
        if decides_capacity(&d.kind) {
            excluded.push(format!(
                "{why} in dwell {} ({} at {:.0}/s), which decided capacity",
                d.index, d.kind, d.rate
            ));
        } else {
            d.left_out = Some(why);
        }
    }
    if !run.reconciliation.ok {
        excluded.push(format!(
            "reconciliation failed: {}",
            run.reconciliation.problems.join("; ")
        ));
    }
    run.excluded_because = excluded;
}

/// Reads back every run of a profile from its JSONL files.
pub fn load_runs(dir: &Path) -> anyhow::Result<Vec<Run>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("runs"))
        .with_context(|| format!("reading {}", dir.join("runs").display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    let mut runs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let (mut samples, mut dwells, mut drains, mut run) =
            (Vec::new(), Vec::new(), Vec::new(), None);
        for (n, line) in text.lines().enumerate() {
            let at = || format!("{}:{}", file.display(), n + 1);
            let v: Value = serde_json::from_str(line).with_context(at)?;
            match v["type"].as_str() {
                Some("sample") => {
                    samples.push(serde_json::from_value::<Sample>(v).with_context(at)?)
                }
                Some("dwell") => dwells.push(serde_json::from_value::<Dwell>(v).with_context(at)?),
                Some("drain") => drains.push(serde_json::from_value::<Drain>(v).with_context(at)?),
                Some("run") => run = Some(serde_json::from_value::<Run>(v).with_context(at)?),
                other => bail!("{}: unknown record type {other:?}", at()),
            }
        }
        let mut run = run.with_context(|| format!("{}: no run record", file.display()))?;
        dwells.sort_by_key(|d: &Dwell| d.index);
        run.latency = vec![new_histogram(); dwells.last().map_or(0, |d| d.index + 1)];
        for d in &dwells {
            run.latency[d.index] = decode_histogram(&d.latency_hdr)
                .with_context(|| format!("{}: dwell {} histogram", file.display(), d.index))?;
        }
        run.samples = samples;
        run.dwells = dwells;
        run.drains = drains;
        runs.push(run);
    }
    if runs.is_empty() {
        bail!("no runs in {}", dir.join("runs").display());
    }
    runs.sort_by_key(|r| r.rep);
    Ok(runs)
}

pub fn decode_histogram(text: &str) -> anyhow::Result<Histogram<u64>> {
    use base64::Engine as _;
    if text.is_empty() {
        return Ok(new_histogram());
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(text)?;
    let mut h: Histogram<u64> = hdrhistogram::serialization::Deserializer::new()
        .deserialize(&mut std::io::Cursor::new(bytes))
        .map_err(|e| anyhow::anyhow!("not an HDR histogram: {e:?}"))?;
    h.auto(true);
    Ok(h)
}

/// `cargo xtask load report DIR`: the summary and replay rebuilt from a
/// profile's raw files, with the rules of this build.
pub fn report_task(dir: &Path, quorum: Option<f64>) -> anyhow::Result<()> {
    let provenance: Value = serde_json::from_slice(
        &std::fs::read(dir.join("provenance.json"))
            .with_context(|| format!("reading {}", dir.join("provenance.json").display()))?,
    )?;
    let plan: Plan = serde_json::from_value(provenance["plan"].clone())
        .context("provenance.json has no plan (a sweep folder?)")?;
    let extra = &provenance["extra"];
    let quorum = quorum.or(extra["quorum"].as_f64()).unwrap_or(0.8);
    let mut runs = load_runs(dir)?;
    for run in &mut runs {
        judge(run, &plan);
    }
    let names: Vec<String> = match extra["targets"].as_array() {
        Some(t) => t
            .iter()
            .filter_map(|n| n.as_str().map(String::from))
            .collect(),
        None => {
            let mut n: Vec<String> = runs.iter().map(|r| r.target.clone()).collect();
            n.dedup();
            n
        }
    };
    let bound = extra["inflight_bound_events"].as_u64().map(|events| {
        let capacity = extra["inflight_bound_channel_capacity"]
            .as_u64()
            .unwrap_or(0);
        (events, capacity as usize)
    });
    report::summary(dir, &runs, &names, quorum, &plan, &provenance, bound)?;
    report::replay(dir, &runs)?;
    println!(
        "rebuilt {} and {} from {} runs",
        dir.join("summary.md").display(),
        dir.join("replay.html").display(),
        runs.len()
    );
    Ok(())
}

/// A histogram as HDR V2 deflate bytes in base64 (readable by every HDR
/// implementation's decoder).
pub fn encode_histogram(h: &Histogram<u64>) -> String {
    use base64::Engine as _;
    use hdrhistogram::serialization::Serializer as _;
    let mut bytes = Vec::new();
    match hdrhistogram::serialization::V2DeflateSerializer::new().serialize(h, &mut bytes) {
        Ok(_) => base64::engine::general_purpose::STANDARD.encode(bytes),
        Err(_) => String::new(),
    }
}

fn stats_f64(path: Option<&Path>, key: &str) -> Option<f64> {
    let v: Value = serde_json::from_slice(&std::fs::read(path?).ok()?).ok()?;
    v[key].as_f64()
}

fn stats_value(path: Option<&Path>, key: &str) -> Option<u64> {
    let v: Value = serde_json::from_slice(&std::fs::read(path?).ok()?).ok()?;
    v[key].as_u64()
}

/// Emitted = committed, end to end and (for LogBus) at every stage.
fn reconcile(
    fed: u64,
    collected: &collector::Collected,
    stats_json: Option<&Path>,
    exited: bool,
) -> Reconciliation {
    let mut r = Reconciliation {
        fed,
        committed: collected.lines,
        unstamped: collected.unstamped,
        ..Reconciliation::default()
    };
    if collected.lines != fed {
        r.problems.push(format!(
            "the feeder wrote {fed} events and {} came out",
            collected.lines
        ));
    }
    if collected.unstamped > 0 {
        r.problems.push(format!(
            "{} lines came out without their t_sched stamp",
            collected.unstamped
        ));
    }
    if let Some(path) = stats_json {
        if !exited {
            r.problems
                .push("LogBus did not exit by itself at end of input".to_string());
        }
        match std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        {
            None => r
                .problems
                .push(format!("no engine stats at {}", path.display())),
            Some(v) => {
                let totals = v["totals"].clone();
                for key in ["emitted", "committed"] {
                    if totals[key].as_u64() != Some(fed) {
                        r.problems.push(format!(
                            "the engine counted {key} = {} against {fed} fed",
                            totals[key]
                        ));
                    }
                }
                if totals["lost"].as_i64() != Some(0) {
                    r.problems
                        .push(format!("the engine reports lost = {}", totals["lost"]));
                }
                // The tripwire: every stage accounts for every event.
                for s in v["stages"].as_array().into_iter().flatten() {
                    let id = s["id"].as_str().unwrap_or("?").to_string();
                    let passed = s["events_out"].as_u64().unwrap_or(0)
                        + s["discarded"].as_u64().unwrap_or(0)
                        + s["errored"].as_u64().unwrap_or(0);
                    if passed != fed {
                        r.problems
                            .push(format!("stage `{id}` passed {passed} events, not {fed}"));
                    }
                    r.stage_counts.push((id, passed));
                }
                r.engine_totals = Some(totals);
            }
        }
    }
    r.ok = r.problems.is_empty();
    r
}

/// Options of `cargo xtask load profile|quick|sweep`.
pub struct Options {
    pub pipeline: PathBuf,
    pub reps: usize,
    pub out: Option<PathBuf>,
    pub peers: Vec<TargetSpec>,
    pub quorum: f64,
    pub corpus_lines: usize,
    pub plan: Plan,
}

/// The release binary, the output folder and the corpus every task shares.
struct Setup {
    binary: PathBuf,
    out: PathBuf,
    corpus: Arc<feeder::Corpus>,
    corpus_path: PathBuf,
    corpus_sha: String,
}

fn setup(root: &Path, out: Option<PathBuf>, corpus_lines: usize) -> anyhow::Result<Setup> {
    let (_, binary) = crate::build_release(root)?;
    let out = match out {
        Some(o) => o,
        None => {
            let stamp = report::now_stamp();
            root.join("target/load").join(stamp)
        }
    };
    std::fs::create_dir_all(out.join("runs"))?;
    std::fs::create_dir_all(out.join("work"))?;
    let corpus_path = root
        .join("target/bench")
        .join(format!("corpus-{corpus_lines}.ndjson"));
    let corpus_sha = crate::write_corpus(&corpus_path, corpus_lines)?;
    let corpus = Arc::new(feeder::Corpus::load(&std::fs::read(&corpus_path)?)?);
    println!(
        "corpus {} ({corpus_lines} lines) sha256 {corpus_sha}; results in {}",
        corpus_path.display(),
        out.display()
    );
    Ok(Setup {
        binary,
        out,
        corpus,
        corpus_path,
        corpus_sha,
    })
}

/// How fast the feeder alone can offer the corpus, into a reader that
/// discards it: the ceiling on any rate this harness can claim to offer.
fn feeder_ceiling(corpus: &Arc<feeder::Corpus>, events: u64) -> anyhow::Result<f64> {
    let (mut reader, writer) = std::io::pipe()?;
    let sink = std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    let shared = Arc::new(Shared::new());
    let (tx, rx) = std::sync::mpsc::channel();
    let start = shared.now_us();
    shared.add_dwell_start(start);
    tx.send(feeder::Schedule {
        dwell: 0,
        start_us: start,
        rate: 1e12,
        count: events,
    })?;
    drop(tx);
    let began = Instant::now();
    let file = std::fs::File::from(std::os::fd::OwnedFd::from(writer));
    let report = feeder::run(file, corpus.clone(), shared, rx, u64::MAX);
    let secs = began.elapsed().as_secs_f64();
    let _ = sink.join();
    Ok(report.events as f64 / secs)
}

/// `cargo xtask load profile` and `quick`.
pub fn profile(root: &Path, opts: Options) -> anyhow::Result<()> {
    opts.plan.check()?;
    let setup = setup(root, opts.out.clone(), opts.corpus_lines)?;
    let ceiling = feeder_ceiling(&setup.corpus, 1_000_000)?;
    println!("feeder ceiling: {ceiling:.0} events/s into a discarding reader");
    let pipeline = std::fs::canonicalize(&opts.pipeline)
        .with_context(|| format!("pipeline {}", opts.pipeline.display()))?;
    let bound = sweep::validate_bound(&setup.binary, &pipeline)?;
    let mut targets = vec![TargetSpec::LogBus {
        binary: setup.binary.clone(),
        pipeline,
        api: true,
    }];
    targets.extend(opts.peers.iter().cloned());
    let names: Vec<String> = targets.iter().map(|t| t.name().to_string()).collect();
    let provenance_of = |extra: Value| {
        report::provenance(
            root,
            &setup.corpus_sha,
            opts.corpus_lines,
            &setup.binary,
            Some(&opts.plan),
            extra,
        )
    };
    let extra = json!({
        "feeder_max_rate": ceiling,
        "reps": opts.reps,
        "quorum": opts.quorum,
        "targets": names,
        "peers": opts.peers.iter().map(|p| format!("{p:?}")).collect::<Vec<_>>(),
        "inflight_bound_events": bound.0,
        "inflight_bound_channel_capacity": bound.1,
    });
    // Written first, so raw files from a run that aborts are never orphans.
    let provenance = provenance_of(extra);
    std::fs::write(
        setup.out.join("provenance.json"),
        serde_json::to_string_pretty(&provenance)?,
    )?;
    let mut runs = Vec::new();
    for rep in 1..=opts.reps {
        // Alternate which target goes first, so drift hits them alike.
        let order: Vec<&TargetSpec> = if rep % 2 == 1 {
            targets.iter().collect()
        } else {
            targets.iter().rev().collect()
        };
        for spec in order {
            let run = run_one(
                spec,
                &opts.plan,
                &setup.corpus,
                &setup.out.join("work"),
                rep,
            )?;
            report::write_run_jsonl(&setup.out.join("runs"), &run)?;
            println!(
                "[{} rep {rep}] capacity [{:.0}, {}) events/s, {}",
                run.target,
                run.capacity_lo,
                run.capacity_hi.map_or("?".into(), |h| format!("{h:.0}")),
                if run.excluded_because.is_empty() {
                    "valid".to_string()
                } else {
                    format!("EXCLUDED: {}", run.excluded_because.join("; "))
                }
            );
            runs.push(run);
        }
    }
    let summaries = report::summary(
        &setup.out,
        &runs,
        &names,
        opts.quorum,
        &opts.plan,
        &provenance,
        Some(bound),
    )?;
    report::replay(&setup.out, &runs)?;
    println!();
    for s in &summaries {
        println!(
            "{}: {} of {} runs valid; capacity {}; overload {:.3}× of hold; p99 at 70 %: {}; recovered {}/{}; peak RSS {:.1} MiB",
            s.name,
            s.valid,
            s.runs,
            s.capacity_floor
                .map_or("not reported (no quorum)".to_string(), |c| format!(
                    "[{c:.0}, {:.0})",
                    s.capacity_hi_median
                )),
            s.overload_ratio_median,
            s.p99_at_70_us
                .map_or("-".into(), |u| format!("{:.2} ms", u as f64 / 1000.0)),
            s.recovered,
            s.recovery_judged,
            s.peak_rss_max as f64 / 1048576.0
        );
        if let Some(c) = s.capacity_floor
            && ceiling < 2.0 * c
        {
            println!(
                "WARNING: the feeder's ceiling ({ceiling:.0}/s) is under twice {}'s capacity: the overload dwell may measure the feeder",
                s.name
            );
        }
    }
    println!(
        "\nsummary: {}\nreplay:  {}\nraw:     {}",
        setup.out.join("summary.md").display(),
        setup.out.join("replay.html").display(),
        setup.out.join("runs").display()
    );
    let failed: Vec<String> = runs
        .iter()
        .filter(|r| !r.reconciliation.ok)
        .map(|r| format!("{} rep {}", r.target, r.rep))
        .collect();
    if !failed.is_empty() {
        bail!("reconciliation FAILED for {}", failed.join(", "));
    }
    Ok(())
}

/// `cargo xtask load dwell`: one dwell at a chosen rate, `reps` times,
/// with the API on and off alternately, for latency questions that need no
/// capacity search.
/// What `cargo xtask load dwell` runs: one dwell per run at `rate`.
pub struct DwellOptions {
    pub pipeline: PathBuf,
    pub rate: f64,
    pub secs: f64,
    pub reps: usize,
    pub out: Option<PathBuf>,
    pub target_nice: u32,
    pub peers: Vec<TargetSpec>,
}

pub fn dwell_task(root: &Path, options: DwellOptions) -> anyhow::Result<()> {
    let DwellOptions {
        pipeline,
        rate,
        secs,
        reps,
        out,
        target_nice,
        peers,
    } = options;
    let setup = setup(root, out, 100_000)?;
    let pipeline = std::fs::canonicalize(&pipeline)
        .with_context(|| format!("pipeline {}", pipeline.display()))?;
    let plan = Plan {
        target_nice,
        ..Plan::full()
    };
    let logbus = |api: bool| TargetSpec::LogBus {
        binary: setup.binary.clone(),
        pipeline: pipeline.clone(),
        api,
    };
    // Without peers the question is what the API costs; with peers, how
    // they compare with LogBus as the profile runs it (API off).
    let mut targets: Vec<(String, TargetSpec)> = vec![("logbus".into(), logbus(false))];
    if peers.is_empty() {
        targets.push(("logbus-api".into(), logbus(true)));
    }
    targets.extend(peers.into_iter().map(|p| (p.name().to_string(), p)));
    let mut pooled: Vec<Histogram<u64>> = targets.iter().map(|_| new_histogram()).collect();
    for rep in 1..=reps {
        // Rotate the order so no target always runs first (or last).
        for k in 0..targets.len() {
            let i = (k + rep - 1) % targets.len();
            let (label, spec) = &targets[i];
            let run = run_script(
                spec,
                &plan,
                &setup.corpus,
                &setup.out.join("work"),
                rep,
                Some((rate, secs)),
            )?;
            if let Some(f) = &run.failure {
                bail!("rep {rep} ({label}): {f}");
            }
            let d = &run.dwells[0];
            println!(
                "rep {rep} {label}: delivered {:.0}/s, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, cpu {:.2} s, feeder own lag p99 {:.2} ms{}",
                d.delivered_rate,
                d.latency.p50_us as f64 / 1000.0,
                d.latency.p99_us as f64 / 1000.0,
                d.latency.max_us as f64 / 1000.0,
                run.cpu_seconds,
                d.feeder_own_lag.p99_us as f64 / 1000.0,
                if run.excluded_because.is_empty() {
                    String::new()
                } else {
                    format!(" EXCLUDED: {}", run.excluded_because.join("; "))
                }
            );
            if run.excluded_because.is_empty() {
                let _ = pooled[i].add(&run.latency[0]);
            }
        }
    }
    for ((label, _), h) in targets.iter().zip(&pooled) {
        let p = Percentiles::of(h);
        println!(
            "{label}: pooled over valid reps at {rate:.0}/s: {} events, p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
            p.count,
            p.p50_us as f64 / 1000.0,
            p.p90_us as f64 / 1000.0,
            p.p99_us as f64 / 1000.0,
            p.p999_us as f64 / 1000.0,
            p.max_us as f64 / 1000.0
        );
    }
    Ok(())
}

/// LogBus (API off) running `pipeline`, then the peers, labelled; and the
/// pipeline's full path.
fn logbus_and_peers(
    setup: &Setup,
    pipeline: &Path,
    peers: Vec<TargetSpec>,
) -> anyhow::Result<(PathBuf, Vec<(String, TargetSpec)>)> {
    let pipeline = std::fs::canonicalize(pipeline)
        .with_context(|| format!("pipeline {}", pipeline.display()))?;
    let mut targets = vec![(
        "logbus".to_string(),
        TargetSpec::LogBus {
            binary: setup.binary.clone(),
            pipeline: pipeline.clone(),
            api: false,
        },
    )];
    targets.extend(peers.into_iter().map(|p| (p.name().to_string(), p)));
    Ok((pipeline, targets))
}

/// `cargo xtask load flood`: LogBus and each peer flooded alternately.
pub fn flood_cmd(
    root: &Path,
    pipeline: &Path,
    events: u64,
    reps: usize,
    target_nice: u32,
    peers: Vec<TargetSpec>,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    let setup = setup(root, out, 100_000)?;
    let (pipeline, targets) = logbus_and_peers(&setup, pipeline, peers)?;
    let md = flood::flood_task(
        &targets,
        &setup.corpus,
        &setup.out.join("work"),
        events,
        reps,
        target_nice,
    )?;
    let header = format!(
        "# Flood: {events} events per run, {reps} reps, pipeline {}, targets at nice {target_nice}\n\ncorpus sha256 {}\n\n",
        pipeline.display(),
        setup.corpus_sha
    );
    std::fs::write(setup.out.join("flood.md"), format!("{header}{md}"))?;
    println!("\n{md}");
    Ok(())
}

/// `cargo xtask load files`: LogBus and each peer read the same file and
/// write one, alternately.
pub fn files_cmd(
    root: &Path,
    pipeline: &Path,
    events: u64,
    reps: usize,
    target_nice: u32,
    peers: Vec<TargetSpec>,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    let setup = setup(root, out, 100_000)?;
    let (pipeline, targets) = logbus_and_peers(&setup, pipeline, peers)?;
    let work = setup.out.join("work");
    let input = work.join("input.ndjson");
    let corpus = std::fs::read(&setup.corpus_path)?;
    files::write_input(&corpus, events, &input)?;
    let md = files::files_task(&targets, &input, &work, events, reps, target_nice);
    let _ = std::fs::remove_file(&input);
    let md = md?;
    let header = format!(
        "# Files: {events} events per run, {reps} reps, pipeline {}, targets at nice {target_nice}\n\ncorpus sha256 {}\n\n",
        pipeline.display(),
        setup.corpus_sha
    );
    std::fs::write(setup.out.join("files.md"), format!("{header}{md}"))?;
    println!("\n{md}");
    Ok(())
}

/// `cargo xtask load sweep`.
pub fn sweep_task(
    root: &Path,
    pipeline: &Path,
    capacities: &[usize],
    reps: usize,
    events: u64,
    compare: &[(String, PathBuf)],
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    let setup = setup(root, out, 100_000)?;
    let pipeline = std::fs::canonicalize(pipeline)
        .with_context(|| format!("pipeline {}", pipeline.display()))?;
    let provenance = report::provenance(
        root,
        &setup.corpus_sha,
        100_000,
        &setup.binary,
        None,
        json!({
            "task": "sweep",
            "pipeline": pipeline.display().to_string(),
            "capacities": capacities,
            "reps": reps,
            "events_per_run": events,
            "compare": compare.iter().map(|(l, b)| json!({"label": l, "binary": b})).collect::<Vec<_>>(),
        }),
    );
    std::fs::write(
        setup.out.join("provenance.json"),
        serde_json::to_string_pretty(&provenance)?,
    )?;
    let mut binaries = vec![("this build".to_string(), setup.binary.clone())];
    binaries.extend(compare.iter().cloned());
    sweep::sweep(
        &binaries,
        &pipeline,
        &setup.corpus,
        capacities,
        reps,
        events,
        &setup.out,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that forwards lines at most `limit` per second, dropping
    /// every `drop`-th when `drop` > 0. It speaks whichever transport the
    /// harness set up: stdio, TCP (LOAD_IN_PORT/LOAD_OUT_PORT) or a file
    /// (LOAD_OUT_FILE).
    const PEER: &str = r#"
import os, socket, sys, time
limit = float(sys.argv[1]); drop = int(sys.argv[2])
read = lambda: os.read(0, 1 << 16)
class Out:
    def __init__(self, f): self.f = f
    def send(self, b): self.f.write(b); self.f.flush()
out = Out(sys.stdout.buffer)
if os.environ.get("LOAD_IN_PORT"):
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", int(os.environ["LOAD_IN_PORT"]))); srv.listen(1)
    conn, _ = srv.accept()
    read = lambda: conn.recv(1 << 16)
    o = socket.create_connection(("127.0.0.1", int(os.environ["LOAD_OUT_PORT"])))
    class Sock:
        def send(self, b): o.sendall(b)
    out = Sock()
elif os.environ.get("LOAD_OUT_FILE"):
    out = Out(open(os.environ["LOAD_OUT_FILE"], "ab"))
n = 0; rest = b""; nxt = time.monotonic()
while True:
    chunk = read()
    if not chunk:
        break
    lines = (rest + chunk).split(b"\n"); rest = lines.pop()
    lines_out = []
    for l in lines:
        n += 1
        if drop and n % drop == 0:
            continue
        lines_out.append(l + b"\n")
    nxt = max(nxt, time.monotonic() - 0.005) + len(lines) / limit
    d = nxt - time.monotonic()
    if d > 0:
        time.sleep(d)
    out.send(b"".join(lines_out))
"#;

    fn tiny_plan() -> Plan {
        Plan {
            start_rate: 4_000.0,
            grid_factor: 2.0,
            resolution: 0.25,
            grid_secs: 0.6,
            hold_secs: 0.6,
            overload_factor: 1.5,
            overload_secs: 0.5,
            latency_secs: 0.5,
            drain_timeout_secs: 10.0,
            held_backlog_share: 0.03,
            max_feeder_lag_ms: 50.0,
            max_feeder_late_share: 0.05,
            hold_retries: 2,
            target_nice: 5,
        }
    }

    fn corpus() -> Arc<feeder::Corpus> {
        let mut rng = crate::Rng(7);
        let body: String = (0..200)
            .map(|i| crate::corpus_line(&mut rng, i) + "\n")
            .collect();
        Arc::new(feeder::Corpus::load(body.as_bytes()).unwrap())
    }

    fn peer(dir: &Path, limit: u32, drop: u32) -> TargetSpec {
        peer_over(dir, limit, drop, target::Io::Stdio)
    }

    fn peer_over(dir: &Path, limit: u32, drop: u32, io: target::Io) -> TargetSpec {
        let script = dir.join("peer.py");
        std::fs::write(&script, PEER).unwrap();
        TargetSpec::Peer {
            name: "limited".into(),
            command: format!("python3 {} {limit} {drop}", script.display()),
            io,
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-load-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_controller_brackets_a_peer_with_a_known_limit_and_reconciles() {
        let dir = scratch("limit");
        let run = run_one(&peer(&dir, 16_000, 0), &tiny_plan(), &corpus(), &dir, 1).unwrap();
        let kinds: Vec<&str> = run.dwells.iter().map(|d| d.kind.as_str()).collect();
        assert_eq!(kinds.first(), Some(&"grid"));
        for kind in [
            "bisect",
            "hold",
            "control",
            "overload",
            "probe-90",
            "rehold",
            "latency-70",
        ] {
            assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
        }
        let hi = run.capacity_hi.unwrap();
        assert!(
            hi / run.capacity_lo <= 1.25 + 1e-9,
            "{} {hi}",
            run.capacity_lo
        );
        // Loose on purpose: the point is the bracket, not this machine's speed.
        assert!(
            (4_000.0..=17_600.0).contains(&run.capacity_lo),
            "capacity {} for a 16,000/s peer",
            run.capacity_lo
        );
        assert!(run.reconciliation.ok, "{:?}", run.reconciliation.problems);
        assert_eq!(run.reconciliation.fed, run.reconciliation.committed);
        let l50 = &run
            .dwells
            .iter()
            .find(|d| d.kind == "latency-50")
            .unwrap()
            .latency;
        assert!(l50.count > 0 && l50.p50_us > 0);
        assert!(run.samples.len() >= 10 && run.samples.iter().any(|s| s.rss > 0));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn peers_over_tcp_and_through_a_file_are_driven_and_reconciled() {
        for io in [target::Io::Tcp, target::Io::File] {
            let dir = scratch(&format!("{io:?}"));
            let run = run_one(
                &peer_over(&dir, 16_000, 0, io.clone()),
                &tiny_plan(),
                &corpus(),
                &dir,
                1,
            )
            .unwrap();
            assert!(
                run.excluded_because.is_empty()
                    || run
                        .excluded_because
                        .iter()
                        .all(|e| e.starts_with("hold-unconfirmed")),
                "{io:?}: {:?}",
                run.excluded_because
            );
            assert!(
                run.reconciliation.ok,
                "{io:?}: {:?}",
                run.reconciliation.problems
            );
            assert!(
                run.capacity_lo >= 4_000.0 && run.capacity_lo <= 17_600.0,
                "{io:?}: {}",
                run.capacity_lo
            );
            let l50 = &run.dwells.iter().find(|d| d.kind == "latency-50").unwrap();
            assert!(l50.latency.count > 0, "{io:?}");
            assert!(!l50.latency_hdr.is_empty());
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn a_peer_that_never_starts_listening_is_reported_not_waited_for() {
        let dir = scratch("silent");
        let spec = TargetSpec::Peer {
            name: "silent".into(),
            command: "sleep 1".into(),
            io: target::Io::Tcp,
        };
        let err = run_one(&spec, &tiny_plan(), &corpus(), &dir, 1)
            .err()
            .unwrap();
        assert!(
            format!("{err:#}").contains("exited before it was ready"),
            "{err:#}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_profile_is_rebuilt_from_its_raw_files_with_the_same_figures() {
        let dir = scratch("raw");
        let run = run_one(&peer(&dir, 16_000, 0), &tiny_plan(), &corpus(), &dir, 1).unwrap();
        std::fs::create_dir_all(dir.join("runs")).unwrap();
        report::write_run_jsonl(&dir.join("runs"), &run).unwrap();
        let mut back = load_runs(&dir).unwrap();
        assert_eq!(back.len(), 1);
        let back = &mut back[0];
        judge(back, &tiny_plan());
        assert_eq!(back.dwells.len(), run.dwells.len());
        assert_eq!(back.samples.len(), run.samples.len());
        assert_eq!(back.capacity_lo, run.capacity_lo);
        assert_eq!(back.excluded_because, run.excluded_because);
        for d in &run.dwells {
            let (a, b) = (&run.latency[d.index], &back.latency[d.index]);
            assert_eq!(
                (a.len(), a.value_at_quantile(0.99), a.max()),
                (b.len(), b.value_at_quantile(0.99), b.max())
            );
        }
        // The replay is one file that needs no network.
        report::replay(&dir, std::slice::from_ref(back)).unwrap();
        let page = std::fs::read_to_string(dir.join("replay.html")).unwrap();
        assert!(!page.contains("http://") && !page.contains("https://"));
        let data = page.split("type=\"application/json\">").nth(1).unwrap();
        let data = data
            .split("</script>")
            .next()
            .unwrap()
            .replace("<\\/", "</");
        let runs: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(
            runs[0]["dwells"].as_array().unwrap().len(),
            back.dwells.len()
        );
        // A damaged line is named by file and line.
        let file = dir.join("runs/limited-rep1.jsonl");
        let mut text = std::fs::read_to_string(&file).unwrap();
        text.push_str("{not json\n");
        std::fs::write(&file, text).unwrap();
        let err = format!("{:#}", load_runs(&dir).err().unwrap());
        assert!(err.contains("limited-rep1.jsonl:"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn plans_the_controller_could_not_finish_are_refused() {
        for broken in [
            Plan {
                resolution: 0.0,
                ..tiny_plan()
            },
            Plan {
                start_rate: -1.0,
                ..tiny_plan()
            },
            Plan {
                grid_factor: 1.0,
                ..tiny_plan()
            },
            Plan {
                hold_secs: f64::NAN,
                ..tiny_plan()
            },
        ] {
            assert!(broken.check().is_err(), "{broken:?}");
        }
        assert!(tiny_plan().check().is_ok() && Plan::quick().check().is_ok());
    }

    #[test]
    fn a_target_that_loses_events_fails_reconciliation_loudly() {
        let dir = scratch("drop");
        // Drains wait for events that never come: keep them short.
        let plan = Plan {
            drain_timeout_secs: 0.5,
            ..tiny_plan()
        };
        let run = run_one(&peer(&dir, 16_000, 1_000), &plan, &corpus(), &dir, 1).unwrap();
        assert!(!run.reconciliation.ok);
        assert!(
            run.reconciliation.problems[0].contains("came out"),
            "{:?}",
            run.reconciliation.problems
        );
        assert!(
            run.excluded_because
                .iter()
                .any(|e| e.starts_with("reconciliation failed"))
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn engine_counts_that_disagree_with_the_feeder_are_named() {
        let dir = scratch("stats");
        let stats = dir.join("stats.json");
        std::fs::write(
            &stats,
            r#"{"totals":{"emitted":10,"committed":9,"lost":1},
               "stages":[{"id":"read","events_out":10,"discarded":0,"errored":0},
                         {"id":"shape","events_out":9,"discarded":0,"errored":0}]}"#,
        )
        .unwrap();
        let collected = collector::Collected {
            by_dwell: Vec::new(),
            lines: 10,
            unstamped: 0,
        };
        let r = reconcile(10, &collected, Some(&stats), true);
        assert!(!r.ok);
        let all = r.problems.join("\n");
        assert!(all.contains("committed = 9"), "{all}");
        assert!(all.contains("lost = 1"), "{all}");
        assert!(all.contains("stage `shape` passed 9"), "{all}");
        assert!(!all.contains("stage `read`"), "{all}");
        let r = reconcile(10, &collected, Some(&dir.join("missing.json")), false);
        assert!(r.problems.iter().any(|p| p.contains("did not exit")));
        assert!(r.problems.iter().any(|p| p.contains("no engine stats")));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn feeder_lateness_counts_only_where_it_could_decide_the_dwell() {
        let plan = Plan::full();
        let dwell = |kind: &str, held: bool, late: u64, grew: u64| Dwell {
            index: 0,
            kind: kind.into(),
            rate: 100_000.0,
            start_s: 0.0,
            secs: 5.0,
            offered: 500_000,
            delivered: 0,
            delivered_rate: 0.0,
            backlog_start: 0,
            backlog_settled: 0,
            backlog_end: grew,
            held,
            feeder_late: late,
            latency: Percentiles::default(),
            left_out: None,
            latency_hdr: String::new(),
            feeder_own_lag: Percentiles::default(),
        };
        // Under the share: never.
        assert!(!feeder_late_matters(
            &dwell("latency-70", true, 4_000, 0),
            &plan
        ));
        // Timed dwells: always over the share.
        assert!(feeder_late_matters(
            &dwell("latency-70", true, 10_000, 0),
            &plan
        ));
        // A held grid dwell held anyway.
        assert!(!feeder_late_matters(&dwell("grid", true, 10_000, 0), &plan));
        // A trip far beyond the late events stands; one within them does not.
        assert!(!feeder_late_matters(
            &dwell("grid", false, 10_000, 100_000),
            &plan
        ));
        assert!(feeder_late_matters(
            &dwell("grid", false, 10_000, 12_000),
            &plan
        ));
    }
}
