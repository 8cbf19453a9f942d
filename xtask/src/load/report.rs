//! What a profile leaves behind: raw JSONL per run, a provenance sidecar, a
//! Markdown summary, and an HTML replay that opens offline. The summary is
//! computed only from the JSONL's numbers and the pooled histograms, so a
//! reader can redo any figure from the raw files.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use super::{Percentiles, Plan, Run, new_histogram};
use crate::median;

pub fn write_run_jsonl(dir: &Path, run: &Run) -> anyhow::Result<()> {
    let path = dir.join(format!("{}-rep{}.jsonl", run.target, run.rep));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
    for s in &run.samples {
        let mut v = serde_json::to_value(s)?;
        v["type"] = json!("sample");
        writeln!(f, "{v}")?;
    }
    for d in &run.dwells {
        let mut v = serde_json::to_value(d)?;
        v["type"] = json!("dwell");
        writeln!(f, "{v}")?;
    }
    for d in &run.drains {
        let mut v = serde_json::to_value(d)?;
        v["type"] = json!("drain");
        writeln!(f, "{v}")?;
    }
    let mut v = serde_json::to_value(run)?;
    v["type"] = json!("run");
    // The dwells and drains are already on their own lines.
    v.as_object_mut().map(|o| o.remove("dwells"));
    v.as_object_mut().map(|o| o.remove("drains"));
    writeln!(f, "{v}")?;
    f.flush()?;
    Ok(())
}

fn sha256_file(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    match std::fs::read(path) {
        Ok(b) => format!("{:x}", Sha256::digest(&b)),
        Err(e) => format!("unreadable: {e}"),
    }
}

fn command_line(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Where the numbers came from: revision, corpus, binary, machine.
pub fn provenance(
    root: &Path,
    corpus_sha: &str,
    corpus_lines: usize,
    binary: &Path,
    plan: Option<&Plan>,
    extra: Value,
) -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let revision = command_line(
        "git",
        &["-C", &root.display().to_string(), "rev-parse", "HEAD"],
    );
    let dirty = !command_line(
        "git",
        &["-C", &root.display().to_string(), "status", "--porcelain"],
    )
    .is_empty();
    json!({
        "git_revision": revision,
        "git_dirty": dirty,
        "corpus_sha256": corpus_sha,
        "corpus_lines": corpus_lines,
        "binary": binary.display().to_string(),
        "binary_sha256": sha256_file(binary),
        // The harness builds it with `cargo build --release -p logbus`.
        "build_profile": "release",
        "rustc": command_line("rustc", &["-V"]),
        "rustflags": std::env::var("RUSTFLAGS").unwrap_or_default(),
        "machine": {
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "model": model,
            "kernel": command_line("uname", &["-r"]),
            "memory": std::fs::read_to_string("/proc/meminfo").ok()
                .and_then(|m| m.lines().next().map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))),
        },
        "date": command_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "plan": plan.and_then(|p| serde_json::to_value(p).ok()),
        "extra": extra,
    })
}

fn ms(us: u64) -> String {
    let m = us as f64 / 1000.0;
    if m >= 100.0 {
        format!("{m:.0}")
    } else if m >= 10.0 {
        format!("{m:.1}")
    } else {
        format!("{m:.2}")
    }
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / 1048576.0)
}

/// The aggregate for one target, over its runs that were not excluded.
pub struct TargetSummary {
    pub name: String,
    pub runs: usize,
    pub valid: usize,
    /// The highest rate held by at least the quorum of runs, if reached.
    pub capacity_floor: Option<f64>,
    pub capacity_hi_median: f64,
    pub overload_ratio_median: f64,
    pub p99_at_70_us: Option<u64>,
    pub recovered: usize,
    pub recovery_judged: usize,
    pub peak_rss_max: u64,
}

/// Writes summary.md and returns the aggregates (for the replay and the
/// console).
pub fn summary(
    out: &Path,
    runs: &[Run],
    targets: &[String],
    quorum: f64,
    plan: &Plan,
    provenance: &Value,
    bound: Option<(u64, usize)>,
) -> anyhow::Result<Vec<TargetSummary>> {
    let mut md = String::new();
    let _ = writeln!(md, "# Load profile\n");
    let _ = writeln!(
        md,
        "Revision `{}`{}, corpus sha256 `{}` ({} lines), binary sha256 `{}` ({}), {} cores ({}), kernel {}, {}.\n",
        provenance["git_revision"].as_str().unwrap_or("?"),
        if provenance["git_dirty"].as_bool() == Some(true) {
            " (with uncommitted changes)"
        } else {
            ""
        },
        provenance["corpus_sha256"].as_str().unwrap_or("?"),
        provenance["corpus_lines"],
        &provenance["binary_sha256"].as_str().unwrap_or("?")
            [..12.min(provenance["binary_sha256"].as_str().unwrap_or("?").len())],
        provenance["build_profile"].as_str().unwrap_or("?"),
        provenance["machine"]["cores"],
        provenance["machine"]["model"].as_str().unwrap_or("?"),
        provenance["machine"]["kernel"].as_str().unwrap_or("?"),
        provenance["date"].as_str().unwrap_or("?"),
    );
    let _ = writeln!(
        md,
        "Command: `{}`\n",
        provenance["command"].as_str().unwrap_or("?")
    );
    if let Some(feeder) = provenance["extra"]["feeder_max_rate"].as_f64() {
        let _ = writeln!(
            md,
            "The feeder alone offers up to {feeder:.0} events/s into a discarding reader.\n"
        );
    }
    let mut summaries = Vec::new();
    for name in targets {
        let all: Vec<&Run> = runs.iter().filter(|r| &r.target == name).collect();
        let valid: Vec<&Run> = all
            .iter()
            .copied()
            .filter(|r| r.excluded_because.is_empty())
            .collect();
        let needed = ((quorum * all.len() as f64).ceil() as usize).max(1);
        let mut los: Vec<f64> = valid.iter().map(|r| r.capacity_lo).collect();
        los.sort_by(|a, b| b.total_cmp(a));
        let capacity_floor = (los.len() >= needed).then(|| los[needed - 1]);
        // The upper end: the median first trip of the runs that held the
        // floor (each tripped above its own floor, so above this one).
        let hi_median = median(
            valid
                .iter()
                .filter(|r| capacity_floor.is_some_and(|c| r.capacity_lo >= c))
                .filter_map(|r| r.capacity_hi)
                .collect(),
        );
        let _ = writeln!(md, "## {name}\n");
        let _ = writeln!(
            md,
            "{} runs, {} valid. Capacity rule: the highest rate held by at least {needed} runs (quorum {:.0} %).\n",
            all.len(),
            valid.len(),
            quorum * 100.0
        );
        match capacity_floor {
            Some(c) => {
                let _ = writeln!(
                    md,
                    "**Capacity: [{c:.0}, {hi_median:.0}) events/s** — the floor is held by the quorum; the upper end is the median first trip of the runs that held it.\n"
                );
            }
            None => {
                let _ = writeln!(
                    md,
                    "**Capacity: not reported** — only {} valid runs, the quorum needs {needed}.\n",
                    valid.len()
                );
            }
        }
        let _ = writeln!(
            md,
            "| rep | capacity interval (events/s) | hold | overload delivered / hold delivered | recovered | peak RSS (MiB) | idle RSS (MiB) | CPU s | status |\n|---|---|---|---|---|---|---|---|---|"
        );
        for r in &all {
            let _ = writeln!(
                md,
                "| {} | [{:.0}, {}) | {} | {:.3} | {} | {} | {} | {:.1} | {} |",
                r.rep,
                r.capacity_lo,
                r.capacity_hi.map_or("?".into(), |h| format!("{h:.0}")),
                if r.hold_confirmed {
                    "confirmed"
                } else {
                    "unconfirmed"
                },
                if r.hold_delivered_rate > 0.0 {
                    r.overload_delivered_rate / r.hold_delivered_rate
                } else {
                    0.0
                },
                if r.recovered { "yes" } else { "no" },
                mib(r.peak_rss),
                mib(r.idle_rss),
                r.cpu_seconds,
                if r.excluded_because.is_empty() {
                    "ok".to_string()
                } else {
                    format!("excluded: {}", r.excluded_because.join("; "))
                }
            );
        }
        // Latency pooled over the valid runs, never averaged percentiles.
        let _ = writeln!(
            md,
            "\nLatency from scheduled arrival to commit, pooled over the valid runs (ms):\n\n| dwell | offered (median events/s) | events | p50 | p90 | p99 | p99.9 | max | held |\n|---|---|---|---|---|---|---|---|---|"
        );
        let mut p99_at_70 = None;
        for kind in [
            "hold",
            "hold-tripped",
            "control",
            "overload",
            "probe-90",
            "rehold",
            "latency-50",
            "latency-70",
            "latency-90",
        ] {
            let mut pooled: Histogram<u64> = new_histogram();
            let mut rates = Vec::new();
            let mut held = 0;
            let mut n = 0;
            let mut left_out = 0;
            for r in &valid {
                for d in r.dwells.iter().filter(|d| d.kind == kind) {
                    if d.left_out.is_some() {
                        left_out += 1;
                        continue;
                    }
                    if let Some(h) = r.latency.get(d.index) {
                        let _ = pooled.add(h);
                    }
                    rates.push(d.rate);
                    held += usize::from(d.held);
                    n += 1;
                }
            }
            if n == 0 && left_out == 0 {
                continue;
            }
            let p = Percentiles::of(&pooled);
            if kind == "latency-70" {
                p99_at_70 = Some(p.p99_us);
            }
            let _ = writeln!(
                md,
                "| {kind} | {:.0} | {} | {} | {} | {} | {} | {} | {held}/{n}{} |",
                median(rates),
                p.count,
                ms(p.p50_us),
                ms(p.p90_us),
                ms(p.p99_us),
                ms(p.p999_us),
                ms(p.max_us),
                if left_out > 0 {
                    format!(" ({left_out} left out: feeder-late)")
                } else {
                    String::new()
                }
            );
        }
        let ratios: Vec<f64> = valid
            .iter()
            .filter(|r| r.hold_delivered_rate > 0.0)
            .map(|r| r.overload_delivered_rate / r.hold_delivered_rate)
            .collect();
        let overload_ratio_median = median(ratios.clone());
        // A re-hold the feeder was late for says nothing either way.
        let rehold_judged: Vec<&&Run> = valid
            .iter()
            .filter(|r| {
                r.dwells
                    .iter()
                    .any(|d| d.kind == "rehold" && d.left_out.is_none())
            })
            .collect();
        let recovered = rehold_judged.iter().filter(|r| r.recovered).count();
        // The control: of the runs whose hold rate held twice before the
        // overload, how many held it again after. (Runs recorded before the
        // control dwell existed have none.)
        let control = |r: &Run| {
            r.dwells
                .iter()
                .find(|d| d.kind == "control" && d.left_out.is_none())
                .map(|d| d.held)
        };
        let with_control = rehold_judged
            .iter()
            .filter(|r| control(r).is_some())
            .count();
        let control_held: Vec<&&&Run> = rehold_judged
            .iter()
            .filter(|r| control(r) == Some(true))
            .collect();
        let recovered_after_control = control_held.iter().filter(|r| r.recovered).count();
        // Memory is a fact of every run, excluded or not.
        let peak_rss_max = all.iter().map(|r| r.peak_rss).max().unwrap_or(0);
        if ratios.is_empty() {
            let _ = writeln!(md, "\nOverload and recovery: no valid runs.\n");
        } else {
            let _ = writeln!(
                md,
                "\nOverload ({}× capacity): delivered {:.3}× the hold dwell's rate (median; {:.3}–{:.3}). Recovery: {recovered} of {} valid runs re-held capacity after the overload{}.{}\n",
                plan.overload_factor,
                overload_ratio_median,
                ratios.iter().copied().fold(f64::INFINITY, f64::min),
                ratios.iter().copied().fold(0.0, f64::max),
                rehold_judged.len(),
                if rehold_judged.len() < valid.len() {
                    format!(
                        " ({} re-holds left out: feeder-late)",
                        valid.len() - rehold_judged.len()
                    )
                } else {
                    String::new()
                },
                if with_control > 0 {
                    format!(
                        " Control: without an overload, the hold rate held a second time in {} of {with_control}; of those, {recovered_after_control} re-held it after the overload.",
                        control_held.len()
                    )
                } else {
                    String::new()
                },
            );
        }
        let peaks: Vec<f64> = all.iter().map(|r| r.peak_rss as f64).collect();
        let _ = write!(
            md,
            "Peak RSS over all runs: median {} MiB, max {} MiB",
            mib(median(peaks) as u64),
            mib(peak_rss_max)
        );
        if name == "logbus"
            && let Some((events, capacity)) = bound
        {
            let _ = write!(
                md,
                "; `logbus validate` computes an in-flight bound of {events} events{}, {} MiB of 1 KiB corpus lines",
                if capacity > 0 {
                    format!(" (channel capacity {capacity})")
                } else {
                    String::new()
                },
                mib(events * 1024)
            );
        }
        let _ = writeln!(md, ".\n");
        let fed: u64 = all.iter().map(|r| r.reconciliation.fed).sum();
        let committed: u64 = all.iter().map(|r| r.reconciliation.committed).sum();
        let failed: Vec<String> = all
            .iter()
            .filter(|r| !r.reconciliation.ok)
            .map(|r| format!("rep {}: {}", r.rep, r.reconciliation.problems.join("; ")))
            .collect();
        let _ = writeln!(
            md,
            "Reconciliation over all {} runs (excluded ones too): {fed} events fed, {committed} committed{}.\n",
            all.len(),
            if failed.is_empty() {
                if name == "logbus" {
                    ", every stage passed every event in every run".to_string()
                } else {
                    String::new()
                }
            } else {
                format!(" — **FAILED**: {}", failed.join(" | "))
            }
        );
        if let Some(first) = all.first() {
            let order: Vec<String> = first
                .dwells
                .iter()
                .map(|d| {
                    format!(
                        "{} {:.0}{}",
                        d.kind,
                        d.rate,
                        if d.held { "" } else { " (tripped)" }
                    )
                })
                .collect();
            let _ = writeln!(
                md,
                "Dwell order (rep {}): {}. A drain (nothing offered until all is committed) follows every trip and the overload, and precedes each latency dwell.\n",
                first.rep,
                order.join(" → ")
            );
        }
        summaries.push(TargetSummary {
            name: name.clone(),
            runs: all.len(),
            valid: valid.len(),
            capacity_floor,
            capacity_hi_median: hi_median,
            overload_ratio_median,
            p99_at_70_us: p99_at_70,
            recovered,
            recovery_judged: rehold_judged.len(),
            peak_rss_max,
        });
    }
    // Side by side: the same repetition's runs of two targets ran minutes
    // apart, so their ratio cancels most of the machine's drift.
    if let Some(first) = targets.first() {
        for other in targets.iter().skip(1) {
            let mut ratios = Vec::new();
            for a in runs
                .iter()
                .filter(|r| &r.target == first && r.excluded_because.is_empty())
            {
                if let Some(b) = runs
                    .iter()
                    .find(|r| &r.target == other && r.rep == a.rep && r.excluded_because.is_empty())
                    && b.capacity_lo > 0.0
                {
                    ratios.push((a.rep, a.capacity_lo / b.capacity_lo));
                }
            }
            if ratios.is_empty() {
                continue;
            }
            let values: Vec<f64> = ratios.iter().map(|r| r.1).collect();
            let _ = writeln!(
                md,
                "## {first} against {other}, paired by repetition

Capacity of {first} ÷ capacity of {other} in the same repetition (both valid), {} pairs: median **{:.2}×** ({:.2}–{:.2}). Per pair: {}.
",
                values.len(),
                median(values.clone()),
                values.iter().copied().fold(f64::INFINITY, f64::min),
                values.iter().copied().fold(0.0, f64::max),
                ratios
                    .iter()
                    .map(|(rep, r)| format!("rep {rep} {r:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    std::fs::write(out.join("summary.md"), md)?;
    Ok(summaries)
}

/// A self-contained HTML page: every run's traces on one time axis.
pub fn replay(out: &Path, runs: &[Run]) -> anyhow::Result<()> {
    let data: Vec<Value> = runs
        .iter()
        .map(|r| {
            let col = |f: &dyn Fn(&super::Sample) -> f64| -> Vec<f64> {
                r.samples.iter().map(f).collect()
            };
            json!({
                "target": r.target,
                "rep": r.rep,
                "excluded": r.excluded_because,
                "capacity": r.capacity_lo,
                "t": col(&|s| (s.t * 100.0).round() / 100.0),
                "out_rate": col(&|s| s.out_rate.round()),
                "backlog": col(&|s| s.backlog as f64),
                "queued": col(&|s| s.queues.iter().map(|q| q.1).sum::<u64>() as f64),
                "rss_mib": col(&|s| (s.rss as f64 / 1048576.0 * 10.0).round() / 10.0),
                "p99_ms": col(&|s| s.lat_p99_us as f64 / 1000.0),
                "dwells": r.dwells.iter().map(|d| json!({
                    "kind": d.kind, "start": d.start_s, "secs": d.secs,
                    "rate": d.rate.round(), "held": d.held,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let json = serde_json::to_string(&data)?.replace("</", "<\\/");
    let page = include_str!("replay.html").replace("/*DATA*/[]", &json);
    std::fs::write(out.join("replay.html"), page)?;
    Ok(())
}

/// A folder name from the current UTC time.
pub fn now_stamp() -> String {
    let s = command_line("date", &["-u", "+%Y%m%dT%H%M%SZ"]);
    if s.is_empty() {
        "latest".to_string()
    } else {
        s
    }
}
