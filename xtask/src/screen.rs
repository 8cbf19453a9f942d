//! The contention screen for stage queues (after the rsyslog local-queue
//! study): many producers meet at one queue consumed by many workers, with
//! one-event dequeues so that every event pays the queue's coordination
//! cost. Variants run alternately in one sitting; the result is the median
//! of the paired ratios.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

/// One queue configuration under test.
pub struct Variant {
    pub label: &'static str,
    pub queue_yaml: String,
    pub workers: usize,
}

pub struct Screen {
    pub producers: usize,
    pub events: u64,
    pub submission: usize,
    pub backend: usize,
    pub frontend: usize,
}

impl Screen {
    /// Global (the baseline), local with the same backend and workers (the
    /// seed's fixed-backend comparison), and global with the local
    /// variant's total workers and in-flight bound (equal resources).
    pub fn variants(&self) -> Vec<Variant> {
        let be_workers = 16;
        let d = 1;
        let local_bound = self.backend + self.producers * (self.frontend + d);
        vec![
            Variant {
                label: "global",
                queue_yaml: format!("{{ size: {}, dequeue_batch: 1 }}", self.backend),
                workers: be_workers,
            },
            Variant {
                label: "local",
                queue_yaml: format!(
                    "{{ scope: local, size: {}, dequeue_batch: 1, local: {{ frontend_size: {}, max_frontends: {}, helper_batch: 1 }} }}",
                    self.backend, self.frontend, self.producers
                ),
                workers: be_workers,
            },
            Variant {
                label: "global-equal",
                queue_yaml: format!("{{ size: {local_bound}, dequeue_batch: 1 }}"),
                workers: be_workers + self.producers,
            },
        ]
    }

    pub fn pipeline(&self, v: &Variant) -> String {
        let per = self.events / self.producers as u64;
        let mut y = String::from("settings: { channel_capacity: 1024 }\nstages:\n");
        let mut inputs = Vec::new();
        for p in 0..self.producers {
            y.push_str(&format!(
                "  p{p}: {{ source: generator, count: {per}, batch_size: {}, template: '{{\"seq\":{{{{seq}}}},\"p\":{p},\"pad\":\"{}\"}}' }}\n",
                self.submission,
                "x".repeat(64)
            ));
            inputs.push(format!("p{p}"));
        }
        y.push_str(&format!(
            "  sink: {{ sink: blackhole, inputs: [{}], workers: {}, queue: {} }}\n",
            inputs.join(", "),
            v.workers,
            v.queue_yaml
        ));
        y
    }
}

pub struct Outcome {
    pub rate: f64,
    pub cpu: f64,
    pub rss_mib: f64,
    pub frontend_share: Option<f64>,
    pub help_events: u64,
}

pub fn run_once(
    binary: &Path,
    pipeline: &Path,
    stats: &Path,
    expected: u64,
) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let out = Command::new(binary)
        .arg("run")
        .arg(pipeline)
        .arg("--stats-json")
        .arg(stats)
        .env("LOGBUS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    let secs = started.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("run failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(stats)?)?;
    let committed = v["totals"]["committed"].as_u64().unwrap_or(0);
    let lost = v["totals"]["lost"].as_i64().unwrap_or(-1);
    if committed != expected || lost != 0 {
        bail!("did not reconcile: committed {committed} of {expected}, lost {lost}");
    }
    let local = &v["channels"][0]["local"];
    let frontend_share = local["frontend_events"]
        .as_u64()
        .map(|fe| fe as f64 / expected as f64);
    if !local.is_null() && local["outstanding"].as_u64() != Some(0) {
        bail!("local queue did not settle: {local}");
    }
    Ok(Outcome {
        rate: committed as f64 / secs,
        cpu: v["cpu_seconds"].as_f64().unwrap_or(0.0),
        rss_mib: v["peak_rss_bytes"].as_u64().unwrap_or(0) as f64 / 1048576.0,
        frontend_share,
        help_events: local["help_events_completed"].as_u64().unwrap_or(0),
    })
}

pub fn screen(root: &Path, pairs: usize, events: u64) -> anyhow::Result<()> {
    let (target, binary) = crate::build_release(root)?;
    let dir = target.join("bench/screen");
    std::fs::create_dir_all(&dir)?;
    let screen = Screen {
        producers: 8,
        events,
        submission: 64,
        backend: 200_000,
        frontend: 10_000,
    };
    let variants = screen.variants();
    let mut files = Vec::new();
    for v in &variants {
        let path = dir.join(format!("{}.yml", v.label));
        std::fs::write(&path, screen.pipeline(v)).with_context(|| path.display().to_string())?;
        files.push(path);
    }
    println!(
        "contention screen: {} producers (submissions of {}), {} events, blackhole with dequeue_batch 1; pipelines in {}",
        screen.producers,
        screen.submission,
        events,
        dir.display()
    );
    let mut results: Vec<Vec<Outcome>> = variants.iter().map(|_| Vec::new()).collect();
    for pair in 0..pairs {
        // Alternate the order within each pair so warm-up and drift hit
        // every variant alike.
        let order: Vec<usize> = if pair % 2 == 0 {
            (0..variants.len()).collect()
        } else {
            (0..variants.len()).rev().collect()
        };
        for i in order {
            let o = run_once(&binary, &files[i], &dir.join("stats.json"), events)?;
            println!(
                "pair {pair} {:<13} {:>10.0} events/s  cpu {:>5.2} s  rss {:>6.1} MiB{}",
                variants[i].label,
                o.rate,
                o.cpu,
                o.rss_mib,
                o.frontend_share.map_or(String::new(), |s| format!(
                    "  FE share {:.1}%  helped {}",
                    s * 100.0,
                    o.help_events
                )),
            );
            results[i].push(o);
        }
    }
    for (i, v) in variants.iter().enumerate().skip(1) {
        let ratios: Vec<f64> = results[i]
            .iter()
            .zip(&results[0])
            .map(|(a, b)| a.rate / b.rate)
            .collect();
        println!(
            "{} / global: median paired ratio {:.2}x (pairs: {})",
            v.label,
            crate::median(ratios.clone()),
            ratios
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let local_vs_equal: Vec<f64> = results[1]
        .iter()
        .zip(&results[2])
        .map(|(a, b)| a.rate / b.rate)
        .collect();
    println!(
        "local / global-equal (same total workers and in-flight bound): median paired ratio {:.2}x",
        crate::median(local_vs_equal)
    );
    for (i, v) in variants.iter().enumerate() {
        println!(
            "{:<13} median {:.0} events/s, cpu median {:.2} s, rss median {:.1} MiB",
            v.label,
            crate::median(results[i].iter().map(|o| o.rate).collect()),
            crate::median(results[i].iter().map(|o| o.cpu).collect()),
            crate::median(results[i].iter().map(|o| o.rss_mib).collect()),
        );
    }
    Ok(())
}
