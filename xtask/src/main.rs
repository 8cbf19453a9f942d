//! Developer tasks, run as `cargo xtask <task>`. Kept to a few
//! dependencies so it builds in seconds.
//!
//! - `corpus [--lines N] [--out PATH]`: the fixed benchmark corpus, ~1 KiB JSON
//!   lines from a seeded generator, printed with its SHA-256.
//! - `bench [--reps N] [--repeat K] [--pipeline FILE] [--compare label=BIN]...`:
//!   builds the release binary, feeds the corpus (repeated K times) on stdin
//!   from a file, so no feeder competes for CPU, and reports events/s, peak
//!   RSS and CPU seconds per run and the median. Compared binaries run
//!   alternately with it and are paired with it rep by rep.
//!   `--cpus LIST` pins every run with `taskset`.
//! - `dist [--profile minimal|default|full] [--plugins a,b]`: a static,
//!   LTO-optimised binary with chosen plugins in `target/dist/`, a manifest,
//!   and its size, start-up time and idle RSS.
//! - `check-features`: every plugin feature builds alone.
//! - `kafka-bench [--events N] [--reps N] [--binary PATH] [--brokers B]
//!   [--settings "channel_capacity: 16384"]`:
//!   file → Kafka and Kafka → json → Kafka against a real broker
//!   (`.ci/services up kafka`): events/s, peak RSS, LogBus's and the
//!   broker's CPU time, per run and the median.
//! - `sink-bench [--targets opensearch,clickhouse] [--events N] [--reps N]
//!   [--batches 500,2000] [--in-flight 2,4] [--sink-options "k: v"]
//!   [--compare-options "k: v"]... [--raw] [--binary PATH]`: file → json →
//!   OpenSearch / ClickHouse against the real servers (`.ci/services up
//!   opensearch clickhouse`), sweeping batch size and requests in flight:
//!   events/s, peak RSS, LogBus's and the server's CPU time, medians; each
//!   `--compare-options` adds a variant run alternately with the plain one
//!   in every round (`{run}` in it becomes a directory of that run's own),
//!   and its median ratio to the plain one is printed.
//! - `load profile|quick [--pipeline FILE] [--reps N] [--out DIR]
//!   [--peer NAME[@tcp]=COMMAND]... [--quorum Q] [--start-rate R]`: the
//!   open-loop load profile (docs/load-testing.md); `load sweep
//!   [--capacities 256,1024,...] [--reps N] [--events N] [--compare
//!   label=BIN]...`: peak RSS against the computed in-flight bound; `load
//!   flood [--events N] [--reps N] [--peer ...]`: closed-loop throughput of
//!   LogBus and peers through the same feeder and collector; `load files`
//!   (same options): each reads the same input file and writes one, with
//!   no harness thread between.
//! - `disk-bench [--reps N] [--events N] [--dir DIR]`: durable queues under
//!   each `sync` policy and a spilling disk-assisted queue, against the
//!   disk's own `dd` bandwidth measured in the same sitting.

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

mod diskbench;
mod dist;
mod kafkabench;
mod load;
mod screen;
mod sinkbench;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(task) = args.first() else {
        bail!(
            "usage: cargo xtask <corpus|bench|load|screen|disk-bench|dist|check-features|kafka-bench|sink-bench> [options]"
        );
    };
    let opt = |name: &str| -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let root = project_root();
    match task.as_str() {
        "corpus" => {
            let lines: usize = opt("--lines").map_or(Ok(100_000), |v| v.parse())?;
            let out =
                opt("--out").map_or_else(|| root.join("target/bench/corpus.ndjson"), PathBuf::from);
            let sha = write_corpus(&out, lines)?;
            println!("{} lines -> {} sha256 {sha}", lines, out.display());
        }
        "bench" => {
            let reps: usize = opt("--reps").map_or(Ok(5), |v| v.parse())?;
            let repeat: usize = opt("--repeat").map_or(Ok(10), |v| v.parse())?;
            let pipeline = opt("--pipeline")
                .map_or_else(|| root.join("pipelines/reference.yml"), PathBuf::from);
            // `--compare label=PATH` (repeatable): other binaries, run
            // alternately with this build so noise hits every variant alike.
            let compare = labelled(&args, "--compare")?;
            // `--compare-pipeline label=FILE` (repeatable): other pipelines
            // run by this build, alternately with the main one.
            let compare_pipelines = labelled(&args, "--compare-pipeline")?;
            // `--cpus LIST`: every run pinned with `taskset -c LIST`, so a
            // watcher (xtask/watched-run.sh, WATCHER_CPUS) can have the others.
            let cpus = opt("--cpus");
            bench(
                &root,
                &pipeline,
                reps,
                repeat,
                compare,
                compare_pipelines,
                cpus.as_deref(),
            )?;
        }
        "dist" => {
            let profile = opt("--profile").unwrap_or_else(|| "default".into());
            let plugins = opt("--plugins");
            dist::dist(&root, &profile, plugins.as_deref())?;
        }
        "check-features" => dist::check_features(&root)?,
        "kafka-bench" => {
            let events: usize = opt("--events").map_or(Ok(500_000), |v| v.parse())?;
            let reps: usize = opt("--reps").map_or(Ok(3), |v| v.parse())?;
            let brokers = opt("--brokers").unwrap_or_else(|| "127.0.0.1:9092".into());
            kafkabench::kafka_bench(
                &root,
                opt("--binary").map(PathBuf::from),
                events,
                reps,
                &brokers,
                &opt("--settings").unwrap_or_default(),
            )?;
        }
        "sink-bench" => {
            let list = |name: &str, default: &str| -> anyhow::Result<Vec<usize>> {
                opt(name)
                    .unwrap_or_else(|| default.into())
                    .split(',')
                    .map(|v| v.trim().parse().with_context(|| format!("{name}: `{v}`")))
                    .collect()
            };
            let targets: Vec<String> = opt("--targets")
                .unwrap_or_else(|| "opensearch,clickhouse".into())
                .split(',')
                .map(str::to_string)
                .collect();
            sinkbench::sink_bench(
                &root,
                opt("--binary").map(PathBuf::from),
                &targets,
                opt("--events").map_or(Ok(300_000), |v| v.parse())?,
                opt("--reps").map_or(Ok(3), |v| v.parse())?,
                &list("--batches", "500,2000")?,
                &list("--in-flight", "2,4")?,
                &opt("--sink-options").unwrap_or_default(),
                &args
                    .windows(2)
                    .filter(|w| w[0] == "--compare-options")
                    .map(|w| w[1].clone())
                    .collect::<Vec<_>>(),
                !args.iter().any(|a| a == "--raw"),
            )?;
        }
        "disk-bench" => {
            let reps: usize = opt("--reps").map_or(Ok(5), |v| v.parse())?;
            let events: u64 = opt("--events").map_or(Ok(1_000_000), |v| v.parse())?;
            diskbench::disk_bench(&root, reps, events, opt("--dir").map(PathBuf::from))?;
        }
        "load" => {
            let sub = args.get(1).map(String::as_str).unwrap_or("");
            let pipeline = opt("--pipeline")
                .map_or_else(|| root.join("pipelines/reference.yml"), PathBuf::from);
            let out = opt("--out").map(PathBuf::from);
            let peers = args
                .windows(2)
                .filter(|w| w[0] == "--peer")
                .map(|w| load::TargetSpec::parse_peer(&w[1]))
                .collect::<anyhow::Result<Vec<_>>>()?;
            match sub {
                "profile" | "quick" => {
                    let quick = sub == "quick";
                    let mut plan = if quick {
                        load::Plan::quick()
                    } else {
                        load::Plan::full()
                    };
                    if let Some(r) = opt("--start-rate") {
                        plan.start_rate = r.parse().context("--start-rate")?;
                    }
                    if let Some(r) = opt("--resolution") {
                        plan.resolution = r.parse().context("--resolution")?;
                    }
                    if let Some(n) = opt("--target-nice") {
                        plan.target_nice = n.parse().context("--target-nice")?;
                    }
                    let reps: usize =
                        opt("--reps").map_or(Ok(if quick { 2 } else { 10 }), |v| v.parse())?;
                    let quorum: f64 = opt("--quorum").map_or(Ok(0.8), |v| v.parse())?;
                    if reps == 0 || !(0.0..=1.0).contains(&quorum) {
                        bail!("--reps must be at least 1 and --quorum within 0..1");
                    }
                    load::profile(
                        &root,
                        load::Options {
                            pipeline,
                            reps,
                            out,
                            peers,
                            quorum,
                            corpus_lines: opt("--lines").map_or(Ok(100_000), |v| v.parse())?,
                            plan,
                        },
                    )?;
                }
                "dwell" => {
                    let rate: f64 = opt("--rate")
                        .context("load dwell needs --rate EVENTS_PER_SEC")?
                        .parse()
                        .context("--rate")?;
                    let secs: f64 = opt("--secs").map_or(Ok(10.0), |v| v.parse())?;
                    let reps: usize = opt("--reps").map_or(Ok(3), |v| v.parse())?;
                    if !(rate > 0.0 && secs > 0.0 && reps > 0) {
                        bail!("load dwell needs --rate, --secs and --reps above 0");
                    }
                    let nice: u32 = opt("--target-nice").map_or(Ok(5), |v| v.parse())?;
                    load::dwell_task(
                        &root,
                        load::DwellOptions {
                            pipeline,
                            rate,
                            secs,
                            reps,
                            out,
                            target_nice: nice,
                            peers,
                        },
                    )?;
                }
                "report" => {
                    let Some(dir) = args.get(2).filter(|a| !a.starts_with("--")) else {
                        bail!("usage: cargo xtask load report DIR [--quorum Q]");
                    };
                    let quorum = opt("--quorum").map(|q| q.parse()).transpose()?;
                    load::report_task(Path::new(dir), quorum)?;
                }
                "sweep" => {
                    let capacities: Vec<usize> = opt("--capacities")
                        .unwrap_or_else(|| "256,1024,4096,16384".into())
                        .split(',')
                        .map(|c| c.trim().parse().context("--capacities takes N,N,..."))
                        .collect::<anyhow::Result<_>>()?;
                    let reps: usize = opt("--reps").map_or(Ok(3), |v| v.parse())?;
                    let events: u64 = opt("--events").map_or(Ok(1_000_000), |v| v.parse())?;
                    // `--compare label=PATH`: other binaries flooded alternately
                    // with this build, their peaks paired against its peaks.
                    let compare = labelled(&args, "--compare")?;
                    load::sweep_task(&root, &pipeline, &capacities, reps, events, &compare, out)?;
                }
                "flood" => {
                    let events: u64 = opt("--events").map_or(Ok(1_000_000), |v| v.parse())?;
                    let reps: usize = opt("--reps").map_or(Ok(3), |v| v.parse())?;
                    let nice: u32 = opt("--target-nice").map_or(Ok(5), |v| v.parse())?;
                    if events == 0 || reps == 0 {
                        bail!("load flood needs --events and --reps above 0");
                    }
                    load::flood_cmd(&root, &pipeline, events, reps, nice, peers, out)?;
                }
                "files" => {
                    let events: u64 = opt("--events").map_or(Ok(1_000_000), |v| v.parse())?;
                    let reps: usize = opt("--reps").map_or(Ok(3), |v| v.parse())?;
                    let nice: u32 = opt("--target-nice").map_or(Ok(5), |v| v.parse())?;
                    if events == 0 || reps == 0 {
                        bail!("load files needs --events and --reps above 0");
                    }
                    load::files_cmd(&root, &pipeline, events, reps, nice, peers, out)?;
                }
                other => bail!(
                    "usage: cargo xtask load <profile|quick|dwell|flood|files|sweep|report> [options], not `{other}` (see docs/load-testing.md)"
                ),
            }
        }
        "screen" => {
            let pairs: usize = opt("--pairs").map_or(Ok(5), |v| v.parse())?;
            let events: u64 = opt("--events").map_or(Ok(4_000_000), |v| v.parse())?;
            screen::screen(&root, pairs, events)?;
        }
        other => {
            bail!(
                "unknown task `{other}`; tasks: corpus, bench, load, screen, disk-bench, dist, check-features"
            )
        }
    }
    Ok(())
}

/// The workspace this run is for. Found at run time (`cargo run` sets
/// `CARGO_MANIFEST_DIR`; else the nearest workspace manifest above the
/// current directory), not baked in at compile time: checkouts that share
/// one target directory share the xtask binary too.
fn project_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR")
        && let Some(root) = Path::new(&dir).parent()
        && root.join("Cargo.toml").is_file()
    {
        return root.to_path_buf();
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            let manifest = dir.join("Cargo.toml");
            if std::fs::read_to_string(&manifest).is_ok_and(|m| m.contains("[workspace]")) {
                return dir.to_path_buf();
            }
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// SplitMix64: a tiny seeded generator, so the corpus is the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

/// Every `FLAG label=PATH` pair of the command line, in order.
fn labelled(args: &[String], flag: &str) -> anyhow::Result<Vec<(String, PathBuf)>> {
    args.windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| match w[1].split_once('=') {
            Some((label, path)) if !label.is_empty() && !path.is_empty() => {
                Ok((label.to_string(), PathBuf::from(path)))
            }
            _ => Err(anyhow::anyhow!("{flag} takes label=PATH, got `{}`", w[1])),
        })
        .collect()
}

/// One ~1 KiB JSON object per line.
fn corpus_line(rng: &mut Rng, seq: usize) -> String {
    const LEVELS: &[&str] = &["debug", "info", "info", "info", "warn", "error"];
    const SERVICES: &[&str] = &["checkout", "search", "auth", "billing", "inventory"];
    const PATHS: &[&str] = &[
        "/api/v1/orders",
        "/api/v1/search",
        "/login",
        "/api/v1/cart",
        "/healthz",
    ];
    let mut line = String::with_capacity(1100);
    let _ = write!(
        line,
        r#"{{"seq":{seq},"ts":"2026-11-30T05:{:02}:{:02}.{:06}Z","level":"{}","service":"{}","host":"node-{:03}","path":"{}","status":{},"latency_ms":{}.{:03},"user":{{"id":"u{}","plan":"{}"}},"debug_id":"{:016x}","tags":["edge","{}"],"msg":""#,
        (seq / 60) % 60,
        seq % 60,
        rng.next() % 1_000_000,
        rng.pick(LEVELS),
        rng.pick(SERVICES),
        rng.next() % 200,
        rng.pick(PATHS),
        [200, 200, 200, 201, 404, 500][(rng.next() % 6) as usize],
        rng.next() % 900,
        rng.next() % 1000,
        rng.next() % 100_000,
        rng.pick(&["free", "pro", "enterprise"]),
        rng.next(),
        rng.pick(&["blue", "green"]),
    );
    const WORDS: &[&str] = &[
        "request", "served", "cache", "miss", "upstream", "retry", "ok", "slow", "user", "token",
    ];
    while line.len() < 1000 {
        line.push_str(rng.pick(WORDS));
        line.push(' ');
    }
    line.push_str(r#""}"#);
    line
}

fn write_corpus(out: &Path, lines: usize) -> anyhow::Result<String> {
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut rng = Rng(0x10_6B05);
    let mut hash = Sha256::new();
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?,
    );
    for seq in 0..lines {
        let mut line = corpus_line(&mut rng, seq);
        line.push('\n');
        hash.update(line.as_bytes());
        file.write_all(line.as_bytes())?;
    }
    file.flush()?;
    Ok(format!("{:x}", hash.finalize()))
}

/// Builds the release binary; returns the target directory and the binary.
fn build_release(root: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let target =
        std::env::var("CARGO_TARGET_DIR").map_or_else(|_| root.join("target"), PathBuf::from);
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "logbus"])
        .current_dir(root)
        .status()?;
    if !status.success() {
        bail!("release build failed");
    }
    let binary = target.join("release/logbus");
    Ok((target, binary))
}

/// The median (0 for no values).
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

struct RunResult {
    rate: f64,
    rss_mib: f64,
    /// User + system CPU seconds of the run (its waited-for process tree);
    /// less disturbed by a noisy neighbour than the wall clock.
    cpu_s: f64,
}

/// User + system CPU seconds of this process's waited-for children so far,
/// from `/proc/self/stat` (`cutime`, `cstime`, in the 100 Hz ticks `/proc`
/// always counts in); 0 where there is no `/proc`.
fn children_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| children_cpu_from_stat(&stat))
        .unwrap_or(0.0)
}

/// `cutime + cstime` of a `/proc/PID/stat` line, in seconds. The command
/// name (field 2) is in parentheses and may hold spaces, so fields are
/// counted from the last `)`.
fn children_cpu_from_stat(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: state is field 3; cutime and cstime are 16 and 17.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some((ticks(16)? + ticks(17)?) as f64 / 100.0)
}

fn run_once(
    binary: &Path,
    pipeline: &Path,
    input: &Path,
    stats: &Path,
    expected: u64,
    cpus: Option<&str>,
) -> anyhow::Result<RunResult> {
    let started = Instant::now();
    let cpu_before = children_cpu_seconds();
    let mut command = match cpus {
        Some(list) => {
            let mut c = Command::new("taskset");
            c.args(["-c", list]).arg(binary);
            c
        }
        None => Command::new(binary),
    };
    let out = command
        .arg("run")
        .arg(pipeline)
        .arg("--stats-json")
        .arg(stats)
        .env("LOGBUS_LOG", "warn")
        .stdin(std::fs::File::open(input)?)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    let secs = started.elapsed().as_secs_f64();
    let cpu_s = children_cpu_seconds() - cpu_before;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(stats)?)?;
    let committed = v["totals"]["committed"].as_u64().unwrap_or(0);
    let discarded = v["totals"]["discarded"].as_u64().unwrap_or(0);
    let emitted = v["totals"]["emitted"].as_u64().unwrap_or(0);
    let lost = v["totals"]["lost"].as_i64().unwrap_or(-1);
    // Every input event is committed or (a filtering pipeline) discarded.
    if emitted != expected || committed + discarded != expected || lost != 0 {
        bail!(
            "{} did not reconcile: emitted {emitted}, committed {committed} + discarded {discarded} of {expected}, lost {lost}",
            binary.display()
        );
    }
    Ok(RunResult {
        // Input events per second: what the pipeline consumed.
        rate: emitted as f64 / secs,
        rss_mib: v["peak_rss_bytes"].as_u64().unwrap_or(0) as f64 / 1048576.0,
        cpu_s,
    })
}

fn bench(
    root: &Path,
    pipeline: &Path,
    reps: usize,
    repeat: usize,
    compare: Vec<(String, PathBuf)>,
    compare_pipelines: Vec<(String, PathBuf)>,
    cpus: Option<&str>,
) -> anyhow::Result<()> {
    let (target, this) = crate::build_release(root)?;
    let mut variants = vec![(
        "this build".to_string(),
        this.clone(),
        pipeline.to_path_buf(),
    )];
    variants.extend(
        compare
            .into_iter()
            .map(|(label, binary)| (label, binary, pipeline.to_path_buf())),
    );
    variants.extend(
        compare_pipelines
            .into_iter()
            .map(|(label, file)| (label, this.clone(), file)),
    );
    let bench_dir = target.join("bench");
    let corpus = bench_dir.join("corpus.ndjson");
    let sha = write_corpus(&corpus, 100_000)?;
    // The input file: the corpus repeated, read by the engine from the page cache.
    let input = bench_dir.join(format!("input-x{repeat}.ndjson"));
    {
        let body = std::fs::read(&corpus)?;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&input)?);
        for _ in 0..repeat {
            f.write_all(&body)?;
        }
        f.flush()?;
    }
    let bytes = std::fs::metadata(&input)?.len();
    let expected = (100_000 * repeat) as u64;
    println!(
        "corpus sha256 {sha}; input {expected} events, {:.1} MiB; pipeline {}",
        bytes as f64 / 1048576.0,
        pipeline.display()
    );
    let mut results: Vec<Vec<RunResult>> = variants.iter().map(|_| Vec::new()).collect();
    for rep in 0..reps {
        for (i, (label, binary, pipeline)) in variants.iter().enumerate() {
            let r = run_once(
                binary,
                pipeline,
                &input,
                &bench_dir.join("stats.json"),
                expected,
                cpus,
            )?;
            println!(
                "rep {rep} {label}: {:.0} events/s, {:.1} MiB/s, peak RSS {:.1} MiB, CPU {:.2} s",
                r.rate,
                r.rate * bytes as f64 / expected as f64 / 1048576.0,
                r.rss_mib,
                r.cpu_s
            );
            results[i].push(r);
        }
    }
    let base = median(results[0].iter().map(|r| r.rate).collect());
    for ((label, _, _), rs) in variants.iter().zip(&results) {
        let rates: Vec<f64> = rs.iter().map(|r| r.rate).collect();
        let m = median(rates.clone());
        println!(
            "{label}: median {m:.0} events/s (min {:.0}, max {:.0}; {:.2}x this build) over {reps} runs; peak RSS median {:.1} MiB, max {:.1} MiB",
            rates.iter().copied().fold(f64::INFINITY, f64::min),
            rates.iter().copied().fold(0.0, f64::max),
            m / base,
            median(rs.iter().map(|r| r.rss_mib).collect()),
            rs.iter().map(|r| r.rss_mib).fold(0.0, f64::max)
        );
        if !std::ptr::eq(rs, &results[0]) {
            println!("  {}", paired_line(&results[0], rs));
        }
    }
    Ok(())
}

/// `runs` against `base`, rep by rep (the runs of one rep ran back to
/// back, so they share the machine's mood): the medians of the ratios.
fn paired_line(base: &[RunResult], runs: &[RunResult]) -> String {
    let spread = |ratios: Vec<f64>| {
        let (lo, hi) = ratios.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), r| {
            (lo.min(*r), hi.max(*r))
        });
        format!("{:.3}x ({lo:.3}-{hi:.3})", median(ratios))
    };
    let pairs = || runs.iter().zip(base);
    format!(
        "paired by rep against this build, median (min-max): events/s {}, CPU per run {}",
        spread(pairs().map(|(r, b)| r.rate / b.rate).collect()),
        spread(pairs().map(|(r, b)| r.cpu_s / b.cpu_s.max(0.01)).collect()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_cpu_is_read_after_a_name_with_spaces_and_parentheses() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
        // majflt cmajflt utime stime cutime cstime ...
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 10 20 0 0 7 8 150 25 20 0 1 0";
        assert_eq!(children_cpu_from_stat(stat), Some(1.75));
        assert_eq!(children_cpu_from_stat("42 (x) S 1 2"), None);
        assert_eq!(children_cpu_from_stat("no name"), None);
        // This process's own file parses.
        let before = children_cpu_seconds();
        let spin = Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(spin.success());
        assert!(
            children_cpu_seconds() > before,
            "a waited-for child's CPU is counted"
        );
    }

    #[test]
    fn pairs_are_taken_rep_by_rep() {
        let run = |rate, cpu_s| RunResult {
            rate,
            rss_mib: 0.0,
            cpu_s,
        };
        let base = [run(100.0, 1.0), run(200.0, 2.0), run(50.0, 1.0)];
        let runs = [run(110.0, 1.0), run(180.0, 2.2), run(60.0, 0.5)];
        assert_eq!(
            paired_line(&base, &runs),
            "paired by rep against this build, median (min-max): events/s 1.100x (0.900-1.200), CPU per run 1.000x (0.500-1.100)"
        );
    }

    #[test]
    fn labelled_options_are_read_in_order_and_malformed_ones_refused() {
        let args: Vec<String> = [
            "bench",
            "--compare",
            "a=/x",
            "--reps",
            "3",
            "--compare",
            "b=/y",
        ]
        .map(String::from)
        .into();
        let got = labelled(&args, "--compare").unwrap();
        assert_eq!(
            got,
            [
                ("a".into(), PathBuf::from("/x")),
                ("b".into(), PathBuf::from("/y"))
            ]
        );
        assert!(labelled(&args, "--compare-pipeline").unwrap().is_empty());
        for bad in ["a", "=/x", "a="] {
            let args = vec!["--compare".to_string(), bad.to_string()];
            let e = labelled(&args, "--compare").unwrap_err().to_string();
            assert!(
                e.contains("--compare takes label=PATH") && e.contains(bad),
                "{e}"
            );
        }
    }

    #[test]
    fn corpus_lines_are_about_one_kib_of_valid_json_and_deterministic() {
        let mut a = Rng(1);
        let mut b = Rng(1);
        for seq in 0..200 {
            let line = corpus_line(&mut a, seq);
            assert_eq!(line, corpus_line(&mut b, seq));
            assert!((1000..1100).contains(&line.len()), "{}", line.len());
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["seq"], seq);
        }
    }
}
