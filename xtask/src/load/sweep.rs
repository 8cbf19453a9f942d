//! The memory-bound check: the same pipeline at several channel capacities,
//! each flooded until every channel is full, with peak RSS set against the
//! in-flight bound `logbus validate` computes. The bound is in events; the
//! sweep's slope says what one in-flight event costs in memory, which is
//! what an operator needs to turn the bound into bytes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};

use super::target::{Running, TargetSpec};
use super::{Shared, collector, feeder, new_histogram, sample_loop};

/// `settings.channel_capacity` rewritten to `capacity`, as text, so comments
/// and layout stay as the author wrote them.
pub fn with_capacity(pipeline: &str, capacity: usize) -> anyhow::Result<String> {
    let mut found = false;
    let out: Vec<String> = pipeline
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            if let Some(rest) = trimmed.strip_prefix("channel_capacity:")
                && rest.trim().chars().all(|c| c.is_ascii_digit())
                && !found
            {
                found = true;
                let indent = &line[..line.len() - trimmed.len()];
                format!("{indent}channel_capacity: {capacity}")
            } else {
                line.to_string()
            }
        })
        .collect();
    if !found {
        bail!("the pipeline sets no `channel_capacity: N` line to sweep");
    }
    Ok(out.join("\n") + "\n")
}

/// The in-flight bound, in events, as `logbus validate` reports it.
pub fn validate_bound(binary: &Path, pipeline: &Path) -> anyhow::Result<(u64, usize)> {
    let out = Command::new(binary)
        .arg("validate")
        .arg(pipeline)
        .args(["--format", "json"])
        .output()
        .with_context(|| format!("running {} validate", binary.display()))?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("validate output for {}", pipeline.display()))?;
    if v["valid"].as_bool() != Some(true) {
        bail!(
            "{} does not validate: {}",
            pipeline.display(),
            v["diagnostics"]
        );
    }
    let events = v["inflight_bound"]["events"]
        .as_u64()
        .context("validate reports no inflight_bound.events")?;
    let capacity = v["inflight_bound"]["channel_capacity"]
        .as_u64()
        .unwrap_or(0) as usize;
    Ok((events, capacity))
}

struct Flood {
    idle_rss: u64,
    peak_rss: u64,
    fed: u64,
    committed: u64,
}

/// Offers `events` as fast as the engine takes them, so every channel
/// fills and stays full, then closes the input and lets the engine drain.
fn flood(
    spec: &TargetSpec,
    corpus: &Arc<feeder::Corpus>,
    work: &Path,
    tag: &str,
    events: u64,
) -> anyhow::Result<Flood> {
    let mut running = Running::start(spec, work, tag, 0)?;
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
    std::thread::sleep(Duration::from_millis(500));
    let idle_rss = super::target::proc_rss(running.pid).unwrap_or(0);
    let (tx, rx) = std::sync::mpsc::channel();
    let schedule = feeder::Schedule {
        dwell: 0,
        start_us: shared.now_us(),
        rate: 1e12,
        count: events,
    };
    shared.add_dwell_start(schedule.start_us);
    tx.send(schedule)?;
    drop(tx);
    let report = feeder::run(input, corpus.clone(), shared.clone(), rx, u64::MAX);
    let status = running.child.wait()?;
    let collected = collector.join().expect("collector thread");
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().expect("sampler thread");
    if !status.success() {
        bail!(
            "{tag}: the engine failed ({status}): {}",
            running.stderr_tail()
        );
    }
    let stats_peak = running
        .stats_json
        .as_deref()
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["peak_rss_bytes"].as_u64())
        .unwrap_or(0);
    Ok(Flood {
        idle_rss,
        peak_rss: samples
            .iter()
            .map(|s| s.rss)
            .max()
            .unwrap_or(0)
            .max(stats_peak),
        fed: report.events,
        committed: collected.lines,
    })
}

pub fn sweep(
    binary: &Path,
    pipeline: &Path,
    corpus: &Arc<feeder::Corpus>,
    capacities: &[usize],
    reps: usize,
    events: u64,
    out: &Path,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(pipeline)
        .with_context(|| format!("reading {}", pipeline.display()))?;
    let mut variants: Vec<(usize, PathBuf, u64)> = Vec::new();
    for &capacity in capacities {
        let file = out.join(format!("sweep-{capacity}.yml"));
        std::fs::write(&file, with_capacity(&text, capacity)?)?;
        let (bound, _) = validate_bound(binary, &file)?;
        variants.push((capacity, file, bound));
    }
    let mut results: Vec<Vec<Flood>> = variants.iter().map(|_| Vec::new()).collect();
    let mut jsonl = String::new();
    for rep in 1..=reps {
        // Alternate the order so drift on a noisy machine hits every size.
        let order: Vec<usize> = if rep % 2 == 1 {
            (0..variants.len()).collect()
        } else {
            (0..variants.len()).rev().collect()
        };
        for i in order {
            let (capacity, file, bound) = &variants[i];
            let spec = TargetSpec::LogBus {
                binary: binary.to_path_buf(),
                pipeline: file.clone(),
                api: true,
            };
            let tag = format!("sweep-{capacity}-rep{rep}");
            let f = flood(&spec, corpus, &out.join("work"), &tag, events)?;
            if f.fed != f.committed {
                bail!(
                    "{tag}: fed {} but {} committed — the sweep stops here",
                    f.fed,
                    f.committed
                );
            }
            println!(
                "[sweep rep {rep}] channel_capacity {capacity:>6} bound {bound:>7} events: idle {:.1} MiB, peak {:.1} MiB",
                f.idle_rss as f64 / 1048576.0,
                f.peak_rss as f64 / 1048576.0
            );
            let _ = writeln!(
                jsonl,
                "{}",
                serde_json::json!({"rep": rep, "channel_capacity": capacity, "bound_events": bound,
                    "idle_rss": f.idle_rss, "peak_rss": f.peak_rss, "events": f.committed})
            );
            results[i].push(f);
        }
    }
    std::fs::write(out.join("sweep.jsonl"), jsonl)?;
    let mut md = String::from(
        "| channel_capacity | in-flight bound (events) | bound × 1 KiB (MiB) | idle RSS (MiB) | peak RSS, median (min–max) MiB | peak − idle (MiB) | (peak − idle) / bound (bytes per event) |\n|---|---|---|---|---|---|---|\n",
    );
    let mib = |b: f64| b / 1048576.0;
    let mut points = Vec::new();
    for ((capacity, _, bound), fs) in variants.iter().zip(&results) {
        let peaks: Vec<f64> = fs.iter().map(|f| f.peak_rss as f64).collect();
        let idle = crate::median(fs.iter().map(|f| f.idle_rss as f64).collect());
        let peak = crate::median(peaks.clone());
        points.push((*bound as f64, peak));
        let _ = writeln!(
            md,
            "| {capacity} | {bound} | {:.1} | {:.1} | {:.1} ({:.1}–{:.1}) | {:.1} | {:.0} |",
            mib(*bound as f64 * 1024.0),
            mib(idle),
            mib(peak),
            mib(peaks.iter().copied().fold(f64::INFINITY, f64::min)),
            mib(peaks.iter().copied().fold(0.0, f64::max)),
            mib(peak - idle),
            (peak - idle) / *bound as f64,
        );
    }
    // Least-squares slope of peak RSS over the bound: memory per in-flight event.
    let n = points.len() as f64;
    if n >= 2.0 {
        let (sx, sy) = points
            .iter()
            .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
        let (mx, my) = (sx / n, sy / n);
        let num: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
        let den: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
        if den > 0.0 {
            let slope = num / den;
            let _ = writeln!(
                md,
                "\nPeak RSS grows by {slope:.0} bytes per event of in-flight bound (least squares over the medians); the intercept, {:.1} MiB, is the engine with empty channels.",
                mib(my - slope * mx)
            );
        }
    }
    std::fs::write(out.join("sweep.md"), &md)?;
    println!("\n{md}\nwritten to {}", out.join("sweep.md").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capacity_line_is_rewritten_and_nothing_else() {
        let text = "# c\nsettings:\n  channel_capacity: 4096 \nstages: {}\n";
        let got = with_capacity(text, 256).unwrap();
        assert_eq!(got, "# c\nsettings:\n  channel_capacity: 256\nstages: {}\n");
        assert!(with_capacity("stages: {}\n", 256).is_err());
    }
}
