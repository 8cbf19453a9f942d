//! Durable stage queues through the `logbus` binary: events survive a
//! failed sink and a forced stop, come back at the next start (with another
//! worker count), and `logbus queue inspect|check|--repair` see and fix a
//! damaged queue.

use std::io::{BufRead, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::api::{Engine, http};

use crate::support::logbus;

fn pipeline(dir: &Path, queue: &str) -> std::path::PathBuf {
    let p = dir.join("p.yml");
    std::fs::write(
        &p,
        format!(
            "stages:\n  in: {{ source: stdin }}\n  out:\n    sink: file\n    inputs: [in]\n    path: ${{OUT}}\n    workers: ${{W:-1}}\n    queue: {queue}\n"
        ),
    )
    .unwrap();
    p
}

fn numbered(dir: &Path, n: usize) -> std::path::PathBuf {
    numbered_of(dir, n, 90)
}

fn numbered_of(dir: &Path, n: usize, pad: usize) -> std::path::PathBuf {
    let p = dir.join("input.txt");
    let text: String = (0..n)
        .map(|i| format!("line {i:06} {}\n", "x".repeat(pad)))
        .collect();
    std::fs::write(&p, text).unwrap();
    p
}

/// The numbers of `line NNNNNN` anywhere in each line, sorted.
fn line_numbers(text: &str) -> Vec<usize> {
    let mut v: Vec<usize> = text
        .lines()
        .map(|l| {
            let at = l.find("line ").expect("a numbered line") + 5;
            l[at..at + 6].parse().unwrap()
        })
        .collect();
    v.sort_unstable();
    v
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

use crate::support::free_port;

/// A FIFO and our read end of it, opened without blocking (O_NONBLOCK) and
/// not read until the test says: a sink writing to it fills the pipe and
/// then blocks in `write`, holding its batch.
fn stuck_destination(dir: &Path) -> (std::path::PathBuf, std::fs::File) {
    use std::os::unix::fs::OpenOptionsExt;
    let fifo = dir.join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(0o4000)
        .open(&fifo)
        .unwrap();
    (fifo, reader)
}

/// Starts `logbus run p` (API on `port`, stdin from `input`, sink to
/// `out`), and waits until its source has emitted `n` events.
fn run_until_emitted(
    p: &Path,
    input: &Path,
    out: &Path,
    port: u16,
    n: u64,
) -> (Engine, std::sync::mpsc::Receiver<String>) {
    let mut child = logbus()
        .env("LOGBUS_LOG", "info")
        .arg("run")
        .arg(p)
        .arg("--api")
        .arg(format!("127.0.0.1:{port}"))
        .env("OUT", out)
        .stdin(std::fs::File::open(input).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let engine = Engine::from_child(child);
    let (tx, log) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the source never finished"
        );
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            let (_, body) = http(port, "GET", "/api/stats", None);
            let stats: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if stats["totals"]["emitted"].as_u64() == Some(n) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (engine, log)
}

/// Reads what is in the pipe now.
fn drain_pipe(reader: &mut std::fs::File) -> String {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    String::from_utf8(bytes).unwrap()
}

#[test]
fn a_failed_stages_events_stay_on_disk_and_the_next_run_delivers_them_with_more_workers() {
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("queues");
    let p = dir.path().join("p.yml");
    std::fs::write(
        &p,
        format!(
            r#"stages:
  in: {{ source: stdin }}
  gate:
    transform: js
    inputs: [in]
    on_error: fail
    workers: ${{W:-1}}
    queue: {{ type: disk, path: {q}, segment_bytes: 64KiB, dequeue_batch: 100 }}
    script: |
      function process(event) {{
        if (event.message.startsWith("line ${{FAIL_AT:-never}}")) throw new Error("boom");
        return event;
      }}
  fmt: {{ formatter: json, inputs: [gate] }}
  out:
    sink: file
    inputs: [fmt]
    path: ${{OUT}}
"#,
            q = queue.display()
        ),
    )
    .unwrap();
    let input = numbered(dir.path(), 5000);
    // Run 1: the transform fails at line 3000.
    let first_out = dir.path().join("out1.txt");
    let o = logbus()
        .arg("run")
        .arg(&p)
        .env("OUT", &first_out)
        .env("FAIL_AT", "003000")
        .arg("--stats-json")
        .arg(dir.path().join("stats1.json"))
        .stdin(std::fs::File::open(&input).unwrap())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("lost=0"), "{err}");
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("stats1.json")).unwrap()).unwrap();
    let emitted = stats["totals"]["emitted"].as_u64().unwrap() as usize;
    assert!(emitted > 3000, "{emitted}");
    let kept = stats["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["stage"] == "gate")
        .unwrap()["disk"]["queued"]
        .as_u64()
        .unwrap();
    assert!(kept > 0);
    // The queue holds them, and checks clean.
    let o = logbus()
        .args(["queue", "inspect"])
        .arg(queue.join("gate"))
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(
        stdout(&o).contains(&format!("unacknowledged records: {kept}")),
        "{}",
        stdout(&o)
    );
    let o = logbus()
        .args(["queue", "check"])
        .arg(queue.join("gate"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    // The stage's `queue.path` holds one queue per stage: checked each.
    let o = logbus()
        .args(["queue", "check"])
        .arg(&queue)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("holds no queue itself; the 1 queue(s) below it")
            && stdout(&o).contains(&format!("queue {}", queue.join("gate").display())),
        "{}",
        stdout(&o)
    );
    // A directory with no queue at all is an error, not "ok".
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = logbus()
        .args(["queue", "check"])
        .arg(&empty)
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no queue in"), "{err}");
    // Run 2: nothing new, no failure, three workers: the rest comes out.
    let second_out = dir.path().join("out2.txt");
    let o = logbus()
        .arg("run")
        .arg(&p)
        .env("OUT", &second_out)
        .env("W", "3")
        .env("LOGBUS_LOG", "info")
        .stdin(Stdio::null())
        .arg("--stats-json")
        .arg(dir.path().join("stats2.json"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{said}");
    assert!(
        said.contains(&format!("recovered {kept} events (")),
        "the start says what it recovered: {said}"
    );
    let first = line_numbers(&std::fs::read_to_string(&first_out).unwrap());
    let second = line_numbers(&std::fs::read_to_string(&second_out).unwrap());
    assert_eq!(second.len() as u64, kept);
    let mut all: Vec<usize> = first.iter().chain(&second).copied().collect();
    all.sort_unstable();
    let total = all.len();
    all.dedup();
    assert_eq!(all, (0..emitted).collect::<Vec<_>>());
    // Duplicates: at most the failing batch (dequeue_batch 100).
    assert!(total - all.len() <= 100, "{} duplicates", total - all.len());
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("stats2.json")).unwrap()).unwrap();
    assert_eq!(stats["totals"]["lost"], 0);
    // Run 3: the queue is empty; nothing is delivered again.
    let third_out = dir.path().join("out3.txt");
    let o = logbus()
        .arg("run")
        .arg(&p)
        .env("OUT", &third_out)
        .env("LOGBUS_LOG", "info")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{said}");
    assert!(
        !said.contains("left by an earlier run"),
        "nothing to recover: {said}"
    );
    assert_eq!(std::fs::read_to_string(&third_out).unwrap(), "");
}

#[test]
fn kill_9_with_a_stuck_sink_loses_nothing_and_check_and_repair_handle_damage() {
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("queues");
    let p = pipeline(
        dir.path(),
        &format!(
            "{{ type: disk, path: {}, segment_bytes: 64KiB, dequeue_batch: 50 }}",
            queue.display()
        ),
    );
    let n = 3000;
    let input = numbered(dir.path(), n);
    let (fifo, mut reader) = stuck_destination(dir.path());
    let (engine, _log) = run_until_emitted(&p, &input, &fifo, free_port(), n as u64);
    // Crash.
    let mut child = engine.into_child();
    child.kill().unwrap();
    child.wait().unwrap();
    let piped = line_numbers(&drain_pipe(&mut reader));
    // Everything the source sent is in the pipe or still queued.
    let qdir = queue.join("out");
    let o = logbus()
        .args(["queue", "inspect"])
        .arg(&qdir)
        .output()
        .unwrap();
    let text = stdout(&o);
    let unacked: usize = text
        .split("unacknowledged records: ")
        .nth(1)
        .and_then(|s| s.lines().next()?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        piped.len() + unacked >= n,
        "{} piped + {unacked} queued",
        piped.len()
    );
    // Damage a record in the middle of the second segment.
    let mut segments: Vec<_> = std::fs::read_dir(&qdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segments.sort();
    assert!(segments.len() >= 3, "{segments:?}");
    let victim = &segments[1];
    let mut bytes = std::fs::read(victim).unwrap();
    bytes[1000] ^= 0x20;
    std::fs::write(victim, &bytes).unwrap();
    let o = logbus()
        .args(["queue", "check"])
        .arg(&qdir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let text = stdout(&o);
    assert!(
        text.contains("problem: segment 2:") && text.contains("offset"),
        "{text}"
    );
    let o = logbus()
        .args(["queue", "check", "--repair"])
        .arg(&qdir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("checks clean now"), "{}", stdout(&o));
    // The next run delivers the queue but the one damaged record.
    let out = dir.path().join("out.txt");
    let o = logbus()
        .arg("run")
        .arg(&p)
        .env("OUT", &out)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let after = line_numbers(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(after.len(), unacked - 1);
    let mut all: Vec<usize> = piped.iter().chain(&after).copied().collect();
    all.sort_unstable();
    all.dedup();
    assert!(all.len() >= n - 1, "{} of {n}", all.len());
    // `check` of something that is not a queue says so.
    let o = logbus()
        .args(["queue", "check"])
        .arg(dir.path().join("not-a-queue"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a queue directory"));
}

/// Damage to a queue's unacknowledged records between runs — a flipped
/// record, a segment cut in half, a deleted segment — is counted exactly:
/// the next run's summary says `lost=` the number of records that did not
/// come out, names it in the log, exits 1, and the run after reports no
/// more.
#[test]
fn damage_between_runs_is_reported_as_exactly_the_events_lost() {
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("queues");
    let p = pipeline(
        dir.path(),
        &format!(
            "{{ type: disk, path: {}, segment_bytes: 64KiB, dequeue_batch: 50 }}",
            queue.display()
        ),
    );
    let n = 6000;
    let input = numbered(dir.path(), n);
    let (fifo, mut reader) = stuck_destination(dir.path());
    let (engine, _log) = run_until_emitted(&p, &input, &fifo, free_port(), n as u64);
    let mut child = engine.into_child();
    child.kill().unwrap();
    child.wait().unwrap();
    let piped = line_numbers(&drain_pipe(&mut reader));
    let qdir = queue.join("out");
    let mut segments: Vec<_> = std::fs::read_dir(&qdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segments.sort();
    assert!(segments.len() >= 6, "{segments:?}");
    let mut bytes = std::fs::read(&segments[1]).unwrap();
    bytes[2000] ^= 0x20;
    std::fs::write(&segments[1], &bytes).unwrap();
    let bytes = std::fs::read(&segments[2]).unwrap();
    std::fs::write(&segments[2], &bytes[..bytes.len() / 2]).unwrap();
    std::fs::remove_file(&segments[3]).unwrap();

    let out = dir.path().join("out.txt");
    let o = logbus()
        .arg("run")
        .arg(&p)
        .env("OUT", &out)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let after = line_numbers(&std::fs::read_to_string(&out).unwrap());
    let mut all: Vec<usize> = piped.iter().chain(&after).copied().collect();
    all.sort_unstable();
    all.dedup();
    let missing = n - all.len();
    assert!(missing > 100, "the damage cost records: {missing}");
    assert!(
        stderr.contains(&format!("lost={missing} ")),
        "{missing} missing: {stderr}"
    );
    assert!(stderr.contains("gone from the queue"), "{stderr}");
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    // Reported once: the next run (nothing left) is clean.
    let o = logbus()
        .arg("run")
        .arg(&p)
        .env("OUT", &out)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("lost=0 "), "{stderr}");
    assert!(
        !stderr.contains("gone from the queue"),
        "no damage, no report: {stderr}"
    );
    assert_eq!(o.status.code(), Some(0), "{stderr}");
}

#[test]
fn a_forced_stop_saves_the_memory_backlog_and_the_next_run_delivers_it() {
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("queues");
    let p = pipeline(
        dir.path(),
        &format!(
            "{{ type: disk-assisted, path: {}, size: 1000, dequeue_batch: 10 }}",
            queue.display()
        ),
    );
    // 1 KiB lines: the file sink takes 256 of them into its write buffer
    // and blocks writing them; the rest waits in memory or on disk.
    let n = 5000;
    let input = numbered_of(dir.path(), n, 1000);
    let (fifo, mut reader) = stuck_destination(dir.path());
    let port = free_port();
    let (engine, log) = run_until_emitted(&p, &input, &fifo, port, n as u64);
    // The spill shows in /metrics.
    let (_, metrics) = http(port, "GET", "/metrics", None);
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{stage=\"out\"}} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("logbus_queue_disk_spilling"), 1.0);
    assert!(value("logbus_queue_disk_unread_events") > 3000.0);
    assert!(value("logbus_queue_disk_fsyncs_total") >= 1.0);
    let pid = engine.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    // The first signal is handled (the drain starts, and stalls) ...
    let start = Instant::now();
    loop {
        let line = log
            .recv_timeout(Duration::from_secs(30).saturating_sub(start.elapsed()))
            .expect("no shutdown log line");
        if line.contains("shutdown requested") {
            break;
        }
    }
    // ... and the second saves the memory backlog and exits.
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let status = engine.into_child().wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let rest: Vec<String> = log.iter().collect();
    let saved: usize = rest
        .iter()
        .find_map(|l| {
            let at = l.find("saved ")? + 6;
            l[at..].split(' ').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no `saved` line in {rest:#?}"));
    assert!(saved > 500, "saved {saved}");
    // The one queue's count is the total the exit reports.
    let total = format!("logbus: {saved} queued events saved to disk queues for the next run");
    assert!(rest.iter().any(|l| l.contains(&total)), "{rest:#?}");
    let first = line_numbers(&drain_pipe(&mut reader));
    let out = dir.path().join("out.txt");
    let o = logbus()
        .arg("run")
        .arg(&p)
        .env("OUT", &out)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let second = line_numbers(&std::fs::read_to_string(&out).unwrap());
    let mut all: Vec<usize> = first.iter().chain(&second).copied().collect();
    all.sort_unstable();
    all.dedup();
    // Only what the stuck sink held in its write buffer (≤ 256 KiB + one
    // batch) may be missing: it was neither written nor queued.
    let missing = n - all.len();
    assert!(
        missing <= 266,
        "{missing} missing; first run {} second {}",
        first.len(),
        second.len()
    );
}
