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

#[derive(Clone)]
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
    // Without it the memory rule below has nothing to stand on.
    let idle_rss = super::target::proc_rss(running.pid).with_context(|| {
        format!(
            "{tag}: reading the engine's idle RSS (/proc/{}/status)",
            running.pid
        )
    })?;
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

/// One pipeline file at one capacity, run by one binary.
struct Variant {
    label: String,
    binary: PathBuf,
    capacity: usize,
    file: PathBuf,
    bound: u64,
}

/// Floods every binary (the first is this build; the others are compared
/// against it) at every capacity, `reps` times, the order reversed every
/// other rep so drift on a noisy machine hits every variant alike.
pub fn sweep(
    binaries: &[(String, PathBuf)],
    pipeline: &Path,
    corpus: &Arc<feeder::Corpus>,
    capacities: &[usize],
    reps: usize,
    events: u64,
    out: &Path,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(pipeline)
        .with_context(|| format!("reading {}", pipeline.display()))?;
    let mut variants: Vec<Variant> = Vec::new();
    for &capacity in capacities {
        let file = out.join(format!("sweep-{capacity}.yml"));
        std::fs::write(&file, with_capacity(&text, capacity)?)?;
        for (label, binary) in binaries {
            let (bound, _) = validate_bound(binary, &file)?;
            variants.push(Variant {
                label: label.clone(),
                binary: binary.clone(),
                capacity,
                file: file.clone(),
                bound,
            });
        }
    }
    let compared = binaries.len() > 1;
    let mut results: Vec<Vec<Flood>> = variants.iter().map(|_| Vec::new()).collect();
    let mut jsonl = String::new();
    for rep in 1..=reps {
        let order: Vec<usize> = if rep % 2 == 1 {
            (0..variants.len()).collect()
        } else {
            (0..variants.len()).rev().collect()
        };
        for i in order {
            let v = &variants[i];
            let spec = TargetSpec::LogBus {
                binary: v.binary.clone(),
                pipeline: v.file.clone(),
                api: true,
            };
            let name = if compared {
                format!("{}-", v.label.replace(' ', "-"))
            } else {
                String::new()
            };
            let tag = format!("sweep-{name}{}-rep{rep}", v.capacity);
            let f = flood(&spec, corpus, &out.join("work"), &tag, events)?;
            if f.fed != f.committed {
                bail!(
                    "{tag}: fed {} but {} committed — the sweep stops here",
                    f.fed,
                    f.committed
                );
            }
            println!(
                "[sweep rep {rep}] {}channel_capacity {:>6} bound {:>7} events: idle {:.1} MiB, peak {:.1} MiB",
                if compared {
                    format!("{}: ", v.label)
                } else {
                    String::new()
                },
                v.capacity,
                v.bound,
                f.idle_rss as f64 / 1048576.0,
                f.peak_rss as f64 / 1048576.0
            );
            let _ = writeln!(
                jsonl,
                "{}",
                serde_json::json!({"rep": rep, "binary": v.label, "channel_capacity": v.capacity,
                    "bound_events": v.bound, "idle_rss": f.idle_rss, "peak_rss": f.peak_rss,
                    "events": f.committed})
            );
            results[i].push(f);
        }
    }
    std::fs::write(out.join("sweep.jsonl"), jsonl)?;
    // A flood's schedule starts about half a second after its clock: the
    // feeder's `t_sched` has 6 digits, 7 at most.
    let line_bytes = corpus.mean_line_bytes(7);
    let mut md = summary(binaries, &variants, &results);
    let broken = bound_rule(&variants, &results, line_bytes, &mut md);
    std::fs::write(out.join("sweep.md"), &md)?;
    println!("\n{md}\nwritten to {}", out.join("sweep.md").display());
    // Compared binaries are reported, not judged: an older build may be
    // the worse one on purpose.
    let ours = broken
        .iter()
        .filter(|label| **label == binaries[0].0)
        .count();
    if ours > 0 {
        bail!(
            "{ours} run(s) of this build used more memory than the in-flight bound allows (above)"
        );
    }
    Ok(())
}

/// Memory an engine may use beyond its idle RSS with its channels empty
/// (buffers, a batch being formatted, the allocator's slack).
const RULE_BASE_BYTES: f64 = 5.0 * 1048576.0;
/// What one event of in-flight bound may cost, in line sizes: the line
/// itself and what the engine keeps beside it.
const RULE_LINE_FACTOR: f64 = 1.5;

/// Checks every run against the rule docs/benchmarks.md sizes memory by,
/// peak ≤ idle + 5 MiB + 1.5 × bound × mean line size, and says so in
/// `md`; returns the binary of each run that broke it. This is what makes
/// the bound a bound on memory and not only on events.
fn bound_rule<'a>(
    variants: &'a [Variant],
    results: &[Vec<Flood>],
    line_bytes: f64,
    md: &mut String,
) -> Vec<&'a str> {
    let mib = |b: f64| b / 1048576.0;
    let mut broken = Vec::new();
    let _ = writeln!(
        md,
        "\nThe bound as memory: every run's peak ≤ idle + {:.0} MiB + {RULE_LINE_FACTOR} × bound × {line_bytes:.0} bytes (the mean line as fed):",
        mib(RULE_BASE_BYTES)
    );
    for (v, fs) in variants.iter().zip(results) {
        for (rep, f) in fs.iter().enumerate() {
            let allowed = f.idle_rss as f64
                + RULE_BASE_BYTES
                + RULE_LINE_FACTOR * v.bound as f64 * line_bytes;
            if f.peak_rss as f64 > allowed {
                broken.push(v.label.as_str());
                let _ = writeln!(
                    md,
                    "- **broken**: {} at channel_capacity {}, rep {}: peak {:.1} MiB > {:.1} MiB allowed",
                    v.label,
                    v.capacity,
                    rep + 1,
                    mib(f.peak_rss as f64),
                    mib(allowed)
                );
            }
        }
    }
    if broken.is_empty() {
        let _ = writeln!(
            md,
            "- held by all {} runs.",
            results.iter().map(Vec::len).sum::<usize>()
        );
    }
    broken
}

/// The sweep's table per binary, the slope of peak RSS over the bound, and
/// each compared binary's peaks paired rep by rep against this build's.
fn summary(binaries: &[(String, PathBuf)], variants: &[Variant], results: &[Vec<Flood>]) -> String {
    let compared = binaries.len() > 1;
    let mut md = String::new();
    if compared {
        md.push_str("| binary ");
    }
    md.push_str(
        "| channel_capacity | in-flight bound (events) | bound × 1 KiB (MiB) | idle RSS (MiB) | peak RSS, median (min–max) MiB | peak − idle (MiB) | (peak − idle) / bound (bytes per event) |\n",
    );
    if compared {
        md.push_str("|---");
    }
    md.push_str("|---|---|---|---|---|---|---|\n");
    let mib = |b: f64| b / 1048576.0;
    for (v, fs) in variants.iter().zip(results) {
        let peaks: Vec<f64> = fs.iter().map(|f| f.peak_rss as f64).collect();
        let idle = crate::median(fs.iter().map(|f| f.idle_rss as f64).collect());
        let peak = crate::median(peaks.clone());
        if compared {
            let _ = write!(md, "| {} ", v.label);
        }
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.1} | {:.1} ({:.1}–{:.1}) | {:.1} | {:.0} |",
            v.capacity,
            v.bound,
            mib(v.bound as f64 * 1024.0),
            mib(idle),
            mib(peak),
            mib(peaks.iter().copied().fold(f64::INFINITY, f64::min)),
            mib(peaks.iter().copied().fold(0.0, f64::max)),
            mib(peak - idle),
            (peak - idle) / v.bound as f64,
        );
    }
    for (label, _) in binaries {
        // Least-squares slope of peak RSS over the bound: memory per in-flight event.
        let points: Vec<(f64, f64)> = variants
            .iter()
            .zip(results)
            .filter(|(v, _)| &v.label == label)
            .map(|(v, fs)| {
                let peak = crate::median(fs.iter().map(|f| f.peak_rss as f64).collect());
                (v.bound as f64, peak)
            })
            .collect();
        if let Some((slope, intercept)) = least_squares(&points) {
            let whose = if compared {
                format!("{label}: peak")
            } else {
                "Peak".into()
            };
            let _ = writeln!(
                md,
                "\n{whose} RSS grows by {slope:.0} bytes per event of in-flight bound (least squares over the medians); the intercept, {:.1} MiB, is the engine with empty channels.",
                mib(intercept)
            );
        }
    }
    for (label, _) in binaries.iter().skip(1) {
        for base in variants
            .iter()
            .zip(results)
            .filter(|(v, _)| v.label == binaries[0].0)
        {
            let (base, base_runs) = base;
            let Some((_, runs)) = variants
                .iter()
                .zip(results)
                .find(|(v, _)| &v.label == label && v.capacity == base.capacity)
            else {
                continue;
            };
            let ratios: Vec<f64> = runs
                .iter()
                .zip(base_runs)
                .map(|(c, b)| c.peak_rss as f64 / b.peak_rss.max(1) as f64)
                .collect();
            if ratios.is_empty() {
                continue;
            }
            let (lo, hi) = ratios.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), r| {
                (lo.min(*r), hi.max(*r))
            });
            let _ = writeln!(
                md,
                "\n{label} against {} at channel_capacity {}: peak RSS {:.3}× (paired by rep, median; {lo:.3}–{hi:.3})",
                binaries[0].0,
                base.capacity,
                crate::median(ratios.clone()),
            );
        }
    }
    md
}

/// Slope and intercept of the least-squares line through `points`; `None`
/// for fewer than two distinct x.
fn least_squares(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    if n < 2.0 {
        return None;
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let num: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let den: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    (den > 0.0).then(|| {
        let slope = num / den;
        (slope, my - slope * mx)
    })
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

    #[test]
    fn a_run_over_the_rule_is_named_and_counted() {
        let variant = |capacity| Variant {
            label: "this build".into(),
            binary: PathBuf::new(),
            capacity,
            file: PathBuf::new(),
            bound: capacity as u64 * 6,
        };
        let m = 1u64 << 20;
        // 4096 × 6 events × 1,000 bytes × 1.5 = 35.2 MiB, + 5 MiB + 20 MiB idle.
        let at = |peak| Flood {
            idle_rss: 20 * m,
            peak_rss: peak,
            fed: 1,
            committed: 1,
        };
        let variants = [variant(4096)];
        let mut md = String::new();
        assert_eq!(
            bound_rule(&variants, &[vec![at(58 * m), at(60 * m)]], 1000.0, &mut md),
            Vec::<&str>::new()
        );
        assert!(md.contains("held by all 2 runs"), "{md}");
        let mut md = String::new();
        assert_eq!(
            bound_rule(
                &variants,
                &[vec![at(60 * m), at(61 * m), at(50 * m)]],
                1000.0,
                &mut md
            ),
            ["this build"]
        );
        assert!(md.contains("**broken**: this build at channel_capacity 4096, rep 2: peak 61.0 MiB > 60.2 MiB allowed"), "{md}");
    }

    #[test]
    fn the_slope_is_the_least_squares_line_and_needs_two_distinct_points() {
        let (slope, intercept) = least_squares(&[(1.0, 3.0), (2.0, 5.0), (3.0, 7.0)]).unwrap();
        assert!((slope - 2.0).abs() < 1e-9 && (intercept - 1.0).abs() < 1e-9);
        assert!(least_squares(&[(1.0, 3.0)]).is_none());
        assert!(least_squares(&[(1.0, 3.0), (1.0, 4.0)]).is_none());
    }

    fn flood(peak: u64) -> Flood {
        Flood {
            idle_rss: 1 << 20,
            peak_rss: peak,
            fed: 1,
            committed: 1,
        }
    }

    #[test]
    fn a_compared_binary_is_paired_rep_by_rep_at_each_capacity() {
        let binaries = [
            ("this build".to_string(), PathBuf::from("/a")),
            ("old".to_string(), PathBuf::from("/b")),
        ];
        let variant = |label: &str, capacity| Variant {
            label: label.into(),
            binary: PathBuf::new(),
            capacity,
            file: PathBuf::new(),
            bound: capacity as u64 * 6,
        };
        let variants = [
            variant("this build", 256),
            variant("old", 256),
            variant("this build", 4096),
            variant("old", 4096),
        ];
        let m = 1u64 << 20;
        let results = vec![
            vec![flood(10 * m), flood(20 * m), flood(10 * m)],
            vec![flood(12 * m), flood(22 * m), flood(13 * m)],
            vec![flood(40 * m), flood(50 * m), flood(44 * m)],
            vec![flood(50 * m), flood(55 * m), flood(44 * m)],
        ];
        let md = summary(&binaries, &variants, &results);
        assert!(md.contains("| old | 4096 | 24576 |"), "{md}");
        assert!(md.contains("old against this build at channel_capacity 256: peak RSS 1.200× (paired by rep, median; 1.100–1.300)"), "{md}");
        assert!(md.contains("old against this build at channel_capacity 4096: peak RSS 1.100× (paired by rep, median; 1.000–1.250)"), "{md}");
        assert!(md.contains("this build: peak RSS grows by"), "{md}");
        let alone = summary(&binaries[..1], &variants[..1], &results[..1]);
        assert!(
            !alone.contains("| binary |") && !alone.contains("against"),
            "{alone}"
        );
        let two = [variant("this build", 256), variant("this build", 4096)];
        let alone = summary(
            &binaries[..1],
            &two,
            &[results[0].clone(), results[2].clone()],
        );
        assert!(alone.contains("\nPeak RSS grows by"), "{alone}");
    }
}
