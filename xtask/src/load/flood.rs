//! `cargo xtask load flood`: closed-loop throughput of LogBus and peers,
//! through the same feeder, transport and collector.
//!
//! Why a second comparison beside the profile: the profile's capacity is an
//! open-loop figure in which the harness's own threads take a large share
//! of two cores, and `cargo xtask bench` reads a file, which a peer such as
//! rsyslog cannot. Here every target gets the corpus as fast as it takes
//! it, over its usual transport, and the figure is events committed per
//! second of wall time from the first byte offered to the last line back,
//! with the target's CPU seconds beside it. Targets alternate within each
//! repetition (the order rotated), so drift on a noisy machine hits all of
//! them alike, and each peer is paired with LogBus rep by rep.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::target::{self, Running, TargetSpec};
use super::{Shared, collector, feeder, new_histogram, sample_loop};
use crate::median;

/// One target flooded once.
pub struct Flooded {
    pub events: u64,
    /// From the first event offered to the last line committed.
    pub secs: f64,
    /// The target's CPU seconds over the same span.
    pub cpu: f64,
    pub peak_rss: u64,
}

impl Flooded {
    pub fn rate(&self) -> f64 {
        self.events as f64 / self.secs
    }
}

/// Offers `events` as fast as the target takes them and waits until every
/// one has come back (at most `limit`), then ends the target: LogBus by
/// closing its input, a peer with SIGTERM.
pub fn flood_one(
    spec: &TargetSpec,
    corpus: &Arc<feeder::Corpus>,
    work: &Path,
    tag: &str,
    events: u64,
    nice: u32,
    limit: Duration,
) -> anyhow::Result<Flooded> {
    let mut running = Running::start(spec, work, tag, nice)?;
    let shared = Arc::new(Shared::new());
    let window = Arc::new(Mutex::new(new_histogram()));
    let stop = Arc::new(AtomicBool::new(false));
    let output = running.output.take().expect("output");
    let input = running.input.take().expect("input");
    let collector = {
        let (shared, window) = (shared.clone(), window.clone());
        std::thread::spawn(move || collector::run(output, shared, window))
    };
    let sampler = {
        let (shared, window, stop) = (shared.clone(), window.clone(), stop.clone());
        let (pid, api) = (running.pid, running.api.clone());
        std::thread::spawn(move || sample_loop(shared, pid, api, window, stop))
    };
    // Started and idle before the clock starts.
    std::thread::sleep(Duration::from_millis(500));
    let cpu_before = target::proc_cpu(running.pid).unwrap_or(0.0);
    let (tx, rx) = std::sync::mpsc::channel();
    let start_us = shared.now_us();
    shared.add_dwell_start(start_us);
    tx.send(feeder::Schedule {
        dwell: 0,
        start_us,
        rate: 1e12,
        count: events,
    })?;
    drop(tx);
    let feeder = {
        let (corpus, shared) = (corpus.clone(), shared.clone());
        std::thread::spawn(move || feeder::run(input, corpus, shared, rx, u64::MAX))
    };
    let began = Instant::now();
    // Until every line is back, the limit passes, or the target ends by
    // itself (LogBus at the end of its input, or a peer that does the
    // same): then what it wrote is still in the pipe, and the collector
    // reads it to the end.
    let mut exited = None;
    // The target's CPU time as last read: once it has exited and been
    // reaped, /proc has nothing more to say.
    let mut cpu_seen = cpu_before;
    let within_limit = loop {
        if shared.received.load(Ordering::Relaxed) >= events {
            break true;
        }
        cpu_seen = target::proc_cpu(running.pid).unwrap_or(cpu_seen);
        if began.elapsed() > limit {
            break false;
        }
        if let Some(status) = running.child.try_wait()? {
            exited = Some(status);
            break true;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let mut collector = Some(collector);
    let mut collected = None;
    if exited.is_some() {
        if let Some(done) = &running.output_done {
            done.store(true, Ordering::Relaxed);
        }
        collected = collector
            .take()
            .map(|c| c.join().expect("collector thread"));
    }
    let secs = (shared.now_us() - start_us) as f64 / 1e6;
    // LogBus reports its own total at exit (`--stats-json`), which
    // includes what it did after the last read of /proc.
    let cpu = match exited {
        None => target::proc_cpu(running.pid).unwrap_or(cpu_seen),
        Some(_) => super::stats_f64(running.stats_json.as_deref(), "cpu_seconds")
            .unwrap_or(0.0)
            .max(cpu_seen),
    } - cpu_before;
    if !within_limit {
        shared.stop_feeding.store(true, Ordering::Relaxed);
    }
    let report = feeder.join().expect("feeder thread");
    // A target still running is told to stop (LogBus is, by the end of its
    // input; a peer listening on TCP never ends by itself).
    let deadline = Instant::now() + Duration::from_secs(30);
    while exited.is_none() && running.child.try_wait()?.is_none() {
        if matches!(spec, TargetSpec::Peer { .. }) || !within_limit || Instant::now() > deadline {
            running.terminate()?;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(done) = &running.output_done {
        done.store(true, Ordering::Relaxed);
    }
    let collected = match (collected, collector) {
        (Some(c), _) => c,
        (None, Some(c)) => c.join().expect("collector thread"),
        (None, None) => unreachable!("the collector is joined once"),
    };
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().expect("sampler thread");
    if !within_limit {
        bail!(
            "{tag}: {} of {events} events back after {limit:?}; stderr: {}",
            collected.lines,
            running.stderr_tail()
        );
    }
    if report.events != events || collected.lines != events {
        bail!(
            "{tag}: {events} to offer, {} offered, {} committed{}; stderr: {}",
            report.events,
            collected.lines,
            exited.map_or(String::new(), |s| format!(" (the target ended: {s})")),
            running.stderr_tail()
        );
    }
    Ok(Flooded {
        events,
        secs,
        cpu,
        peak_rss: samples.iter().map(|s| s.rss).max().unwrap_or(0),
    })
}

/// `cargo xtask load flood`: every target `reps` times, rotated; per-run
/// lines, then medians and each peer's paired ratio.
pub fn flood_task(
    targets: &[(String, TargetSpec)],
    corpus: &Arc<feeder::Corpus>,
    work: &Path,
    events: u64,
    reps: usize,
    nice: u32,
) -> anyhow::Result<String> {
    let limit = Duration::from_secs(600);
    let results = rotated(targets, reps, "flood", |spec, tag| {
        flood_one(spec, corpus, work, tag, events, nice, limit)
    })?;
    Ok(summary(targets, &results))
}

/// Runs every target `reps` times, the order rotated each repetition, and
/// prints each run; the results by target, in `targets`' order.
pub fn rotated(
    targets: &[(String, TargetSpec)],
    reps: usize,
    kind: &str,
    mut run: impl FnMut(&TargetSpec, &str) -> anyhow::Result<Flooded>,
) -> anyhow::Result<Vec<Vec<Flooded>>> {
    let mut results: Vec<Vec<Flooded>> = targets.iter().map(|_| Vec::new()).collect();
    for rep in 1..=reps {
        for k in 0..targets.len() {
            let i = (k + rep - 1) % targets.len();
            let (label, spec) = &targets[i];
            let f = run(spec, &format!("{kind}-{label}-rep{rep}"))
                .with_context(|| format!("rep {rep}, {label}"))?;
            println!(
                "rep {rep} {label}: {:.0} events/s ({} in {:.2} s), cpu {:.2} s ({:.2} µs/event), peak RSS {:.1} MiB",
                f.rate(),
                f.events,
                f.secs,
                f.cpu,
                f.cpu * 1e6 / f.events as f64,
                f.peak_rss as f64 / 1048576.0
            );
            results[i].push(f);
        }
    }
    Ok(results)
}

/// The results as a table, then each peer's paired ratio against LogBus
/// (the first target).
pub fn summary(targets: &[(String, TargetSpec)], results: &[Vec<Flooded>]) -> String {
    let mut md = String::from(
        "| target | events/s per rep | median | CPU µs/event (median) | peak RSS (median) |\n|---|---|---|---|---|\n",
    );
    for ((label, _), runs) in targets.iter().zip(results) {
        let rates: Vec<String> = runs.iter().map(|f| format!("{:.0}", f.rate())).collect();
        md.push_str(&format!(
            "| {label} | {} | {:.0} | {:.2} | {:.1} MiB |\n",
            rates.join(" · "),
            median(runs.iter().map(Flooded::rate).collect()),
            median(runs.iter().map(|f| f.cpu * 1e6 / f.events as f64).collect()),
            median(runs.iter().map(|f| f.peak_rss as f64).collect()) / 1048576.0
        ));
    }
    for ((label, _), runs) in targets.iter().zip(results).skip(1) {
        let paired: Vec<f64> = results[0]
            .iter()
            .zip(runs)
            .map(|(l, p)| l.rate() / p.rate())
            .collect();
        let cpu: Vec<f64> = results[0]
            .iter()
            .zip(runs)
            .map(|(l, p)| (p.cpu / p.events as f64) / (l.cpu / l.events as f64))
            .collect();
        let shown: Vec<String> = paired.iter().map(|r| format!("{r:.2}×")).collect();
        md.push_str(&format!(
            "\nLogBus ÷ {label}, paired by rep: {} (median **{:.2}×**); by medians {:.2}×; CPU per event, {label} ÷ LogBus, paired: median {:.2}×\n",
            shown.join(", "),
            median(paired.clone()),
            median(results[0].iter().map(Flooded::rate).collect())
                / median(runs.iter().map(Flooded::rate).collect()),
            median(cpu)
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> Arc<feeder::Corpus> {
        Arc::new(feeder::Corpus::load(b"{\"a\":1}\n{\"b\":2}\n").unwrap())
    }

    /// A peer that gives back every line (`cat`, which also ends at the end
    /// of its input, as LogBus does) is measured; one that loses lines
    /// fails the run with the count, whether it ends by itself or not.
    #[test]
    fn every_line_back_is_a_figure_and_a_line_lost_is_an_error() {
        let work = std::env::temp_dir().join(format!("xtask-flood-{}", std::process::id()));
        let limit = Duration::from_secs(30);
        let cat = TargetSpec::parse_peer("cat=cat").unwrap();
        let f = flood_one(&cat, &corpus(), &work, "cat", 20_000, 0, limit).unwrap();
        assert_eq!(f.events, 20_000);
        assert!(f.secs > 0.0 && f.rate() > 0.0);
        // Read before it ended (in clock ticks: `cat` may use less than one).
        assert!(f.cpu >= 0.0, "{}", f.cpu);
        let half = TargetSpec::parse_peer("half=awk 'NR % 2'").unwrap();
        let err = flood_one(&half, &corpus(), &work, "half", 1_000, 0, limit)
            .err()
            .expect("half the lines lost");
        assert!(
            format!("{err:#}").contains("1000 to offer, 1000 offered, 500 committed"),
            "{err:#}"
        );
        // Never ends and gives nothing back: the limit ends it.
        let mute = TargetSpec::parse_peer("mute=sleep 600").unwrap();
        let err = flood_one(
            &mute,
            &corpus(),
            &work,
            "mute",
            10,
            0,
            Duration::from_secs(1),
        )
        .err()
        .expect("nothing back");
        assert!(
            format!("{err:#}").contains("0 of 10 events back after 1s"),
            "{err:#}"
        );
        let _ = std::fs::remove_dir_all(&work);
    }
}
