//! `sink-bench`: file → json → OpenSearch and file → json → ClickHouse
//! against the real servers of `.ci/services up opensearch clickhouse`, on
//! the corpus's ~1 KiB JSON lines, sweeping batch size and requests in
//! flight. Each run is one `logbus run` that ends at the end of the file
//! once every event is committed, so its own elapsed time is the measure;
//! peak RSS from its `--stats-json`, the server's CPU time from /proc over
//! the run. Configurations alternate within each round (rounds × the
//! sweep), and medians are reported per configuration.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

struct Run {
    rate: f64,
    peak_rss_mib: f64,
    logbus_cpu_s: f64,
    server_cpu_s: f64,
}

/// The CPU seconds so far (utime + stime) of the process in `pid_file`.
fn cpu_of(pid_file: &Path) -> f64 {
    let pid = std::fs::read_to_string(pid_file).unwrap_or_default();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn http(url: &str, body: &str) -> anyhow::Result<String> {
    let o = Command::new("curl")
        .args([
            "-sS",
            "--fail-with-body",
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "--data-binary",
            body,
            url,
        ])
        .output()
        .context("running curl")?;
    if !o.status.success() {
        bail!(
            "{url}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn run_pipeline(
    binary: &Path,
    dir: &Path,
    yml: &str,
    events: usize,
    server_pid: &Path,
) -> anyhow::Result<Run> {
    let pipeline = dir.join("sink-bench.yml");
    std::fs::write(&pipeline, yml)?;
    let stats_file = dir.join("sink-bench.json");
    let cpu0 = cpu_of(server_pid);
    let o = Command::new(binary)
        .env("LOGBUS_LOG", "warn")
        .arg("run")
        .arg(&pipeline)
        .arg("--stats-json")
        .arg(&stats_file)
        .output()?;
    if !o.status.success() {
        bail!("the run failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats_file)?)?;
    let committed = v["totals"]["committed"].as_u64().unwrap_or(0) as usize;
    if committed != events {
        bail!("committed {committed} of {events} events");
    }
    Ok(Run {
        rate: events as f64 / v["elapsed_seconds"].as_f64().unwrap_or(f64::NAN),
        peak_rss_mib: v["peak_rss_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
        logbus_cpu_s: v["cpu_seconds"].as_f64().unwrap_or(0.0),
        server_cpu_s: cpu_of(server_pid) - cpu0,
    })
}

#[allow(clippy::too_many_arguments)]
pub fn sink_bench(
    root: &Path,
    binary: Option<PathBuf>,
    targets: &[String],
    events: usize,
    reps: usize,
    batches: &[usize],
    in_flights: &[usize],
    extra: &str,
    compare: &[String],
    parse: bool,
) -> anyhow::Result<()> {
    let binary = match binary {
        Some(b) => b,
        None => {
            let status = Command::new(env!("CARGO"))
                .args(["build", "--release", "-p", "logbus"])
                .current_dir(root)
                .status()?;
            if !status.success() {
                bail!("building logbus failed");
            }
            std::env::var("CARGO_TARGET_DIR")
                .map_or_else(|_| root.join("target"), PathBuf::from)
                .join("release/logbus")
        }
    };
    let services = PathBuf::from(
        std::env::var("LOGBUS_SERVICES").unwrap_or_else(|_| "/var/tmp/logbus-services".into()),
    );
    let dir = root.join("target/bench/sinks");
    std::fs::create_dir_all(&dir)?;
    let corpus = dir.join(format!("corpus-{events}.ndjson"));
    let sha = crate::write_corpus(&corpus, events)?;
    println!(
        "sink-bench: {events} events of the corpus (sha256 {sha}), {reps} rounds, binary {}",
        binary.display()
    );
    // The plain run, then each variant: alternating within every round.
    let variants: Vec<&str> = std::iter::once("")
        .chain(compare.iter().map(String::as_str))
        .collect();
    let mut configs = Vec::new();
    for target in targets {
        for &batch in batches {
            for &in_flight in in_flights {
                for &variant in &variants {
                    configs.push((target.clone(), batch, in_flight, variant));
                }
            }
        }
    }
    // The table is the same for every variant: with a deduplication
    // window when any variant sends tokens.
    let window = std::iter::once(extra)
        .chain(compare.iter().map(String::as_str))
        .any(|o| o.contains("deduplicate"));
    let mut results: Vec<Vec<Run>> = configs.iter().map(|_| Vec::new()).collect();
    for round in 0..reps {
        for (i, (target, batch, in_flight, variant)) in configs.iter().enumerate() {
            let tag = format!("bench_{}_{round}_{i}", std::process::id());
            let corpus_path = corpus.display().to_string();
            // Extra sink options (`compression: none`), and whether the
            // lines are parsed (a raw JSON line is an OpenSearch document
            // as it is; ClickHouse needs fields).
            let run_dir = dir.join(&tag);
            let extra = [extra, variant]
                .iter()
                .filter(|o| !o.is_empty())
                .map(|o| format!(", {}", o.replace("{run}", &run_dir.display().to_string())))
                .collect::<String>();
            let codec = if parse || target == "clickhouse" {
                ", codec: json"
            } else {
                ""
            };
            let (yml, pid_file) = match target.as_str() {
                "opensearch" => (
                    format!(
                        "stages:
  read: {{ source: file, path: {corpus_path:?}{codec} }}
  ship: {{ sink: opensearch, inputs: [read], endpoints: [\"http://127.0.0.1:9200\"], index: {tag}, batch_max_events: {batch}, in_flight: {in_flight}{extra} }}
"
                    ),
                    services.join("run/opensearch/pid"),
                ),
                "clickhouse" => {
                    // The corpus's fields, as a log table would hold them.
                    http(
                        "http://127.0.0.1:8123/",
                        &format!(
                            "CREATE TABLE {tag} (seq UInt64, ts DateTime64(6), level LowCardinality(String), service LowCardinality(String), host String, path String, status UInt16, latency_ms Float64, user Map(String, String), debug_id String, tags Array(String), msg String) ENGINE = MergeTree ORDER BY tuple(){}",
                            if window {
                                " SETTINGS non_replicated_deduplication_window = 1000"
                            } else {
                                ""
                            }
                        ),
                    )?;
                    (
                        format!(
                            "stages:
  read: {{ source: file, path: {corpus_path:?}{codec} }}
  ship: {{ sink: clickhouse, inputs: [read], url: \"http://127.0.0.1:8123\", table: {tag}, batch_max_events: {batch}, in_flight: {in_flight}{extra} }}
"
                        ),
                        services.join("run/clickhouse/pid"),
                    )
                }
                other => bail!("unknown target `{other}`: opensearch or clickhouse"),
            };
            let r = run_pipeline(&binary, &dir, &yml, events, &pid_file)?;
            let _ = std::fs::remove_dir_all(&run_dir);
            println!(
                "round {round}: {target:<10} batch {batch:>5} in_flight {in_flight:>2} {variant:?}: {:>9.0} events/s, peak RSS {:>6.1} MiB, logbus CPU {:>5.1} s, server CPU {:>5.1} s",
                r.rate, r.peak_rss_mib, r.logbus_cpu_s, r.server_cpu_s
            );
            results[i].push(r);
            // Leave the servers as they were.
            match target.as_str() {
                "opensearch" => {
                    let _ = Command::new("curl")
                        .args([
                            "-sS",
                            "-X",
                            "DELETE",
                            &format!("http://127.0.0.1:9200/{tag}"),
                        ])
                        .output();
                }
                _ => {
                    let _ = http("http://127.0.0.1:8123/", &format!("DROP TABLE {tag}"));
                }
            }
        }
    }
    println!(
        "| sink | batch_max_events | in_flight | options | events/s, median (range) | × plain, median of rounds | peak RSS | LogBus CPU | server CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (i, ((target, batch, in_flight, variant), runs)) in configs.iter().zip(&results).enumerate()
    {
        let m = |f: &dyn Fn(&Run) -> f64| crate::median(runs.iter().map(f).collect());
        let lo = runs.iter().map(|r| r.rate).fold(f64::INFINITY, f64::min);
        let hi = runs.iter().map(|r| r.rate).fold(0.0, f64::max);
        // The plain run of the same configuration, in the same rounds.
        let plain = &results[i - variants.iter().position(|v| v == variant).unwrap_or(0)];
        let ratio = crate::median(
            runs.iter()
                .zip(plain)
                .map(|(r, p)| r.rate / p.rate)
                .collect(),
        );
        println!(
            "| {target} | {batch} | {in_flight} | {} | {:.0} ({lo:.0}–{hi:.0}) | {ratio:.2} | {:.0} MiB | {:.1} s | {:.1} s |",
            if variant.is_empty() { "—" } else { variant },
            m(&|r| r.rate),
            m(&|r| r.peak_rss_mib),
            m(&|r| r.logbus_cpu_s),
            m(&|r| r.server_cpu_s),
        );
    }
    Ok(())
}
