//! `kafka-bench`: LogBus against a real broker on loopback (`.ci/services
//! up kafka`), both ways, with the corpus's ~1 KiB JSON lines:
//!
//! - file → Kafka: `source: file` to `sink: kafka`; the process ends at
//!   the end of the file once every message is confirmed, so its own
//!   elapsed time is the measure.
//! - Kafka → json → Kafka: `source: kafka` (codec json) to `sink: kafka`,
//!   reading what the first run produced. The process runs until stopped,
//!   so one long-lived kafka-python process watches the output topic's end
//!   offsets and reports when 10% and 100% of the events are there; the
//!   rate is taken between the two (start-up and the group join excluded).
//!
//! The broker shares the two cores: its CPU time over each run is read
//! from /proc and reported beside LogBus's.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// `settings:` for both pipelines (`--settings "channel_capacity: 16384"`).
static SETTINGS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn settings_line() -> String {
    match SETTINGS.get() {
        Some(s) if !s.is_empty() => format!("settings: {{ {s} }}\n"),
        _ => String::new(),
    }
}

struct Figures {
    rate: f64,
    peak_rss_mib: f64,
    logbus_cpu_s: f64,
    broker_cpu_s: f64,
    seconds: f64,
}

fn python(brokers: &str, script: &str, args: &[&str]) -> anyhow::Result<String> {
    let o = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import sys, json, time\nBROKERS = {brokers:?}\nARGS = sys.argv[1:]\n{script}"
        ))
        .args(args)
        .output()
        .context("running python3 (kafka-python is needed)")?;
    if !o.status.success() {
        bail!("python: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn create_topic(brokers: &str, name: &str, partitions: u32) -> anyhow::Result<()> {
    python(
        brokers,
        "from kafka.admin import KafkaAdminClient, NewTopic\n\
         a = KafkaAdminClient(bootstrap_servers=BROKERS)\n\
         a.create_topics([NewTopic(ARGS[0], num_partitions=int(ARGS[1]), replication_factor=1)])",
        &[name, &partitions.to_string()],
    )
    .map(drop)
}

/// The broker's CPU seconds so far (utime + stime of its JVM).
fn broker_cpu(services: &Path) -> f64 {
    let pid = std::fs::read_to_string(services.join("run/kafka/pid")).unwrap_or_default();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
    // Fields after the command name (which may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after `)`.
    (ticks(11) + ticks(12)) / 100.0
}

fn stats(path: &Path) -> anyhow::Result<(f64, f64, f64)> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    Ok((
        v["elapsed_seconds"].as_f64().unwrap_or(0.0),
        v["peak_rss_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
        v["cpu_seconds"].as_f64().unwrap_or(0.0),
    ))
}

fn file_to_kafka(
    binary: &Path,
    dir: &Path,
    corpus: &Path,
    brokers: &str,
    topic: &str,
    events: usize,
    services: &Path,
) -> anyhow::Result<Figures> {
    let pipeline = dir.join("file-to-kafka.yml");
    std::fs::write(
        &pipeline,
        format!(
            "{}stages:
  read: {{ source: file, path: {corpus:?} }}
  ship: {{ sink: kafka, inputs: [read], brokers: {brokers:?}, topic: {topic:?}, linger_ms: 20 }}
",
            settings_line(),
            corpus = corpus.display().to_string()
        ),
    )?;
    let stats_file = dir.join("file-to-kafka.json");
    let cpu0 = broker_cpu(services);
    let began = Instant::now();
    let o = Command::new(binary)
        .env("LOGBUS_LOG", "warn")
        .arg("run")
        .arg(&pipeline)
        .arg("--stats-json")
        .arg(&stats_file)
        .output()?;
    let wall = began.elapsed().as_secs_f64();
    if !o.status.success() {
        bail!(
            "file → kafka failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let (elapsed, rss, cpu) = stats(&stats_file)?;
    Ok(Figures {
        rate: events as f64 / elapsed,
        peak_rss_mib: rss,
        logbus_cpu_s: cpu,
        broker_cpu_s: broker_cpu(services) - cpu0,
        seconds: wall,
    })
}

#[allow(clippy::too_many_arguments)]
fn kafka_to_kafka(
    binary: &Path,
    dir: &Path,
    brokers: &str,
    input: &str,
    output: &str,
    group: &str,
    events: usize,
    services: &Path,
) -> anyhow::Result<Figures> {
    let pipeline = dir.join("kafka-to-kafka.yml");
    std::fs::write(
        &pipeline,
        format!(
            "{}stages:
  consume: {{ source: kafka, brokers: {brokers:?}, group_id: {group:?}, topics: [{input:?}], codec: json }}
  ship: {{ sink: kafka, inputs: [consume], brokers: {brokers:?}, topic: {output:?}, linger_ms: 20 }}
",
            settings_line()
        ),
    )?;
    // The watcher: prints the time at 10% and at 100% of the events.
    let mut watcher = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import sys, time\nfrom kafka import KafkaConsumer, TopicPartition\n\
             c = KafkaConsumer(bootstrap_servers={brokers:?})\n\
             parts = [TopicPartition({output:?}, p) for p in c.partitions_for_topic({output:?})]\n\
             n = {events}\n\
             first = None\n\
             print('ready', flush=True)\n\
             while True:\n\
             \x20   done = sum(c.end_offsets(parts).values())\n\
             \x20   if first is None and done >= n // 10:\n\
             \x20       first = time.time(); print('t10', first, done, flush=True)\n\
             \x20   if done >= n:\n\
             \x20       print('t100', time.time(), done, flush=True); break\n\
             \x20   time.sleep(0.1)\n"
        ))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(watcher.stdout.take().expect("piped")).lines();
    let ready = lines.next().transpose()?;
    if ready.as_deref() != Some("ready") {
        bail!("the watcher did not start");
    }
    let stats_file = dir.join("kafka-to-kafka.json");
    let cpu0 = broker_cpu(services);
    let began = Instant::now();
    let mut child = Command::new(binary)
        .env("LOGBUS_LOG", "warn")
        .arg("run")
        .arg(&pipeline)
        .arg("--stats-json")
        .arg(&stats_file)
        .stderr(Stdio::piped())
        .spawn()?;
    let mut t10 = None;
    let mut t100 = None;
    for line in lines {
        let line = line?;
        let mut f = line.split_whitespace();
        match (f.next(), f.next().and_then(|t| t.parse::<f64>().ok())) {
            (Some("t10"), Some(t)) => t10 = Some(t),
            (Some("t100"), Some(t)) => {
                t100 = Some(t);
                break;
            }
            _ => {}
        }
        if began.elapsed() > Duration::from_secs(600) {
            break;
        }
    }
    let _ = watcher.wait();
    let broker_cpu_s = broker_cpu(services) - cpu0;
    let seconds = began.elapsed().as_secs_f64();
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    let status = child.wait()?;
    if !status.success() {
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().expect("piped"), &mut err)?;
        bail!("kafka → kafka ended with {status}: {err}");
    }
    let (Some(t10), Some(t100)) = (t10, t100) else {
        bail!("the output never reached {events} events");
    };
    let (_, rss, cpu) = stats(&stats_file)?;
    Ok(Figures {
        rate: (events - events / 10) as f64 / (t100 - t10),
        peak_rss_mib: rss,
        logbus_cpu_s: cpu,
        broker_cpu_s,
        seconds,
    })
}

pub fn kafka_bench(
    root: &Path,
    binary: Option<PathBuf>,
    events: usize,
    reps: usize,
    brokers: &str,
    settings: &str,
) -> anyhow::Result<()> {
    let _ = SETTINGS.set(settings.to_string());
    let binary = match binary {
        Some(b) => b,
        None => {
            let status = Command::new(env!("CARGO"))
                .args(["build", "--release", "-p", "logbus", "--features", "full"])
                .current_dir(root)
                .status()?;
            if !status.success() {
                bail!("building logbus --features full failed");
            }
            let target = std::env::var("CARGO_TARGET_DIR")
                .map_or_else(|_| root.join("target"), PathBuf::from);
            target.join("release/logbus")
        }
    };
    let services = PathBuf::from(
        std::env::var("LOGBUS_SERVICES").unwrap_or_else(|_| "/var/tmp/logbus-services".into()),
    );
    let dir = root.join("target/bench/kafka");
    std::fs::create_dir_all(&dir)?;
    let corpus = dir.join(format!("corpus-{events}.ndjson"));
    let sha = crate::write_corpus(&corpus, events)?;
    println!(
        "kafka-bench: {events} events of the corpus (sha256 {sha}), {reps} reps, binary {}",
        binary.display()
    );
    let mut out: Vec<Figures> = Vec::new();
    let mut back: Vec<Figures> = Vec::new();
    for rep in 0..reps {
        let tag = format!("bench-{}-{rep}", std::process::id());
        let (raw, parsed) = (format!("{tag}-raw"), format!("{tag}-parsed"));
        create_topic(brokers, &raw, 6)?;
        create_topic(brokers, &parsed, 6)?;
        let a = file_to_kafka(&binary, &dir, &corpus, brokers, &raw, events, &services)?;
        println!(
            "rep {rep}: file → kafka   {:>9.0} events/s, peak RSS {:>6.1} MiB, logbus CPU {:>5.1} s, broker CPU {:>5.1} s, {:.1} s",
            a.rate, a.peak_rss_mib, a.logbus_cpu_s, a.broker_cpu_s, a.seconds
        );
        let b = kafka_to_kafka(
            &binary,
            &dir,
            brokers,
            &raw,
            &parsed,
            &format!("{tag}-group"),
            events,
            &services,
        )?;
        println!(
            "rep {rep}: kafka → json → kafka {:>9.0} events/s, peak RSS {:>6.1} MiB, logbus CPU {:>5.1} s, broker CPU {:>5.1} s, {:.1} s",
            b.rate, b.peak_rss_mib, b.logbus_cpu_s, b.broker_cpu_s, b.seconds
        );
        out.push(a);
        back.push(b);
        python(
            brokers,
            "from kafka.admin import KafkaAdminClient\n\
             KafkaAdminClient(bootstrap_servers=BROKERS).delete_topics(ARGS)",
            &[&raw, &parsed],
        )?;
    }
    for (label, runs) in [("file → kafka", &out), ("kafka → json → kafka", &back)] {
        let m = |f: &dyn Fn(&Figures) -> f64| crate::median(runs.iter().map(f).collect());
        println!(
            "median {label}: {:.0} events/s, peak RSS {:.1} MiB, logbus CPU {:.1} s, broker CPU {:.1} s",
            m(&|f| f.rate),
            m(&|f| f.peak_rss_mib),
            m(&|f| f.logbus_cpu_s),
            m(&|f| f.broker_cpu_s)
        );
    }
    Ok(())
}
