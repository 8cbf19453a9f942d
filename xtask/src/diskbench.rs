//! The durable-queue benchmark: 1 KiB events through a `disk` queue to a
//! blackhole under each `sync` policy, a disk-assisted queue under a
//! producer faster than its consumer, and the disk's own sequential write
//! bandwidth (`dd ... conv=fdatasync`) measured in the same sitting.
//! Variants run alternately, one rep at a time, so noise hits them alike;
//! the summary is medians, and ratios are medians of per-rep ratios.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

struct Variant {
    label: &'static str,
    yaml: String,
    /// Events the pipeline must commit.
    events: u64,
}

fn message() -> String {
    // ~1 KiB per event once the sequence number is in.
    "m".repeat(1000)
}

fn variants(events: u64, dir: &Path) -> Vec<Variant> {
    let q = dir.join("queues");
    let gen_ = |id: &str, count: u64| {
        format!(
            "  {id}:\n    source: generator\n    count: {count}\n    batch_size: 512\n    template: '{{\"seq\":{{{{seq}}}},\"message\":\"{}\"}}'\n",
            message()
        )
    };
    let disk = |sync: &str| {
        format!(
            "settings: {{ channel_capacity: 4096 }}\nstages:\n{}  out:\n    sink: blackhole\n    inputs: [gen]\n    queue: {{ type: disk, path: {}, sync: {sync} }}\n",
            gen_("gen", events),
            q.display()
        )
    };
    let four = (0..4)
        .map(|i| gen_(&format!("gen{i}"), events / 4))
        .collect::<String>();
    // A consumer slower than the producer: a JS transform (~150k events/s
    // on this machine) behind the queue.
    let slow = |queue: &str| {
        format!(
            "settings: {{ channel_capacity: 4096 }}\nstages:\n{}  slow:\n    transform: js\n    inputs: [gen]\n    queue: {queue}\n    script: |\n      function process(e) {{ e.n = e.message.length; return e; }}\n  out: {{ sink: blackhole, inputs: [slow] }}\n",
            gen_("gen", events / 4),
        )
    };
    vec![
        Variant {
            label: "memory",
            yaml: format!(
                "settings: {{ channel_capacity: 4096 }}\nstages:\n{}  out: {{ sink: blackhole, inputs: [gen] }}\n",
                gen_("gen", events)
            ),
            events,
        },
        Variant {
            label: "disk sync=batch",
            yaml: disk("batch"),
            events,
        },
        Variant {
            label: "disk sync=batch, 4 producers",
            yaml: format!(
                "settings: {{ channel_capacity: 4096 }}\nstages:\n{four}  out:\n    sink: blackhole\n    inputs: [gen0, gen1, gen2, gen3]\n    queue: {{ type: disk, path: {}, sync: batch }}\n",
                q.display()
            ),
            events: events / 4 * 4,
        },
        Variant {
            label: "disk sync=interval",
            yaml: disk("interval"),
            events,
        },
        Variant {
            label: "disk sync=none",
            yaml: disk("none"),
            events,
        },
        Variant {
            label: "slow consumer, memory",
            yaml: slow("{ size: 4096 }"),
            events: events / 4,
        },
        Variant {
            label: "slow consumer, disk-assisted",
            yaml: slow(&format!(
                "{{ type: disk-assisted, size: 4096, path: {} }}",
                q.display()
            )),
            events: events / 4,
        },
    ]
}

#[derive(Default, Clone)]
struct Run {
    secs: f64,
    events: u64,
    bytes_written: u64,
    fsyncs: u64,
    to_disk: u64,
}

fn run_once(binary: &Path, yml: &Path, stats: &Path, v: &Variant) -> anyhow::Result<Run> {
    let started = Instant::now();
    let out = Command::new(binary)
        .arg("run")
        .arg(yml)
        .arg("--stats-json")
        .arg(stats)
        .env("LOGBUS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    let secs = started.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            v.label,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(stats)?)?;
    let committed = s["totals"]["committed"].as_u64().unwrap_or(0);
    let lost = s["totals"]["lost"].as_i64().unwrap_or(-1);
    if committed != v.events || lost != 0 {
        bail!(
            "{} did not reconcile: committed {committed} of {}, lost {lost}",
            v.label,
            v.events
        );
    }
    let mut run = Run {
        secs,
        events: committed,
        ..Run::default()
    };
    for c in s["channels"].as_array().into_iter().flatten() {
        let d = &c["disk"];
        run.bytes_written += d["bytes_written"].as_u64().unwrap_or(0);
        run.fsyncs += d["fsyncs"].as_u64().unwrap_or(0);
        run.to_disk += d["spilled"].as_u64().unwrap_or(0);
    }
    Ok(run)
}

/// Sequential write bandwidth of the queue's filesystem, MiB/s.
fn dd(dir: &Path) -> anyhow::Result<f64> {
    let file = dir.join("dd.bin");
    let started = Instant::now();
    let status = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=1024", "conv=fdatasync"])
        .arg(format!("of={}", file.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running dd")?;
    let secs = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&file);
    if !status.success() {
        bail!("dd failed");
    }
    Ok(1024.0 / secs)
}

pub fn disk_bench(
    root: &Path,
    reps: usize,
    events: u64,
    dir: Option<PathBuf>,
) -> anyhow::Result<()> {
    let (target, binary) = crate::build_release(root)?;
    let dir = dir.unwrap_or_else(|| target.join("disk-bench"));
    std::fs::create_dir_all(&dir)?;
    let variants = variants(events, &dir);
    let mut runs: Vec<Vec<Run>> = variants.iter().map(|_| Vec::new()).collect();
    let mut dd_rates = Vec::new();
    println!(
        "{events} events of ~1 KiB per run, {reps} reps, queue directory {}",
        dir.display()
    );
    for rep in 0..reps {
        for (i, v) in variants.iter().enumerate() {
            let _ = std::fs::remove_dir_all(dir.join("queues"));
            let yml = dir.join("bench.yml");
            std::fs::write(&yml, &v.yaml)?;
            let r = run_once(&binary, &yml, &dir.join("stats.json"), v)?;
            println!(
                "rep {rep} {:<32} {:>10.0} events/s {:>8.1} MiB/s {:>8.0} fsyncs/s",
                v.label,
                r.events as f64 / r.secs,
                r.bytes_written as f64 / 1048576.0 / r.secs,
                r.fsyncs as f64 / r.secs
            );
            runs[i].push(r);
        }
        let rate = dd(&dir)?;
        println!(
            "rep {rep} {:<32} {:>10} {:>8.1} MiB/s",
            "dd conv=fdatasync", "", rate
        );
        dd_rates.push(rate);
    }
    let _ = std::fs::remove_dir_all(dir.join("queues"));
    println!();
    println!(
        "| variant | events/s | MiB/s written | fsyncs/s | bytes/event on disk | events to disk |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (v, rs) in variants.iter().zip(&runs) {
        let med = |f: &dyn Fn(&Run) -> f64| crate::median(rs.iter().map(f).collect());
        println!(
            "| {} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} |",
            v.label,
            med(&|r| r.events as f64 / r.secs),
            med(&|r| r.bytes_written as f64 / 1048576.0 / r.secs),
            med(&|r| r.fsyncs as f64 / r.secs),
            med(&|r| if r.to_disk == 0 {
                0.0
            } else {
                r.bytes_written as f64 / r.to_disk as f64
            }),
            med(&|r| r.to_disk as f64),
        );
    }
    println!(
        "| dd bs=1M conv=fdatasync | | {:.1} | | | |",
        crate::median(dd_rates.clone())
    );
    let none = variants
        .iter()
        .position(|v| v.label == "disk sync=none")
        .expect("variant");
    let ratios: Vec<f64> = runs[none]
        .iter()
        .zip(&dd_rates)
        .map(|(r, dd)| (r.bytes_written as f64 / 1048576.0 / r.secs) / dd)
        .collect();
    println!(
        "\nsync=none write rate / dd rate, median of per-rep ratios: {:.2}",
        crate::median(ratios)
    );
    let memory = &runs[0];
    for (i, v) in variants.iter().enumerate().skip(1).take(4) {
        let ratios: Vec<f64> = runs[i]
            .iter()
            .zip(memory)
            .map(|(r, m)| (r.events as f64 / r.secs) / (m.events as f64 / m.secs))
            .collect();
        println!(
            "{} / memory events/s: {:.2}",
            v.label,
            crate::median(ratios)
        );
    }
    Ok(())
}
