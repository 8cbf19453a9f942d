//! The edge agent example end to end: it tails JSON logs and ships them to
//! a collector (a small real HTTP server on loopback). The collector is
//! down at first, the agent is killed with SIGKILL while it holds a backlog,
//! then the collector comes back and the restarted agent delivers
//! everything, at least once, while new lines keep arriving.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An HTTP/1.1 collector: answers 503 while `down`, else 200, and keeps
/// the events of every request it accepted.
struct Collector {
    down: AtomicBool,
    accepted: Mutex<Vec<serde_json::Value>>,
    refused: Mutex<u64>,
}

fn serve(listener: TcpListener, c: Arc<Collector>) {
    for stream in listener.incoming().map_while(Result::ok) {
        let c = c.clone();
        std::thread::spawn(move || {
            let _ = connection(stream, &c);
        });
    }
}

fn connection(stream: TcpStream, c: &Collector) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        // Request line and headers.
        let mut length = 0usize;
        let mut gzip = false;
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let lower = h.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            if lower.starts_with("content-encoding:") && lower.contains("gzip") {
                gzip = true;
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body)?;
        if c.down.load(Ordering::SeqCst) {
            *c.refused.lock().unwrap() += 1;
            out.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\ndown")?;
            continue;
        }
        let mut text = String::new();
        if gzip {
            logbus_compress::open(&body[..], logbus_compress::ReadCompression::Gzip)?
                .read_to_string(&mut text)?;
        } else {
            text = String::from_utf8(body).unwrap();
        }
        c.accepted
            .lock()
            .unwrap()
            .extend(text.lines().map(|l| serde_json::from_str(l).unwrap()));
        out.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")?;
    }
}

fn agent(dir: &Path, url: &str) -> Child {
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/edge-agent/pipeline.yml");
    Command::new(env!("CARGO_BIN_EXE_logbus"))
        .env("LOGBUS_LOG", "error")
        .arg("run")
        .arg(example)
        .env("AGENT_LOGS", dir.join("app/*.log"))
        .env("AGENT_STATE", dir.join("state"))
        .env("AGENT_URL", url)
        .env("AGENT_REJECTS", dir.join("rejects.ndjson"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn write_lines(path: &Path, seqs: std::ops::Range<u64>) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    for i in seqs {
        // Every other line is informational and filtered out.
        let priority = if i % 2 == 0 { "3" } else { "6" };
        writeln!(
            f,
            r#"{{"seq":{i},"PRIORITY":"{priority}","MESSAGE":"event {i}"}}"#
        )
        .unwrap();
    }
}

fn unacked(queue: &Path) -> u64 {
    let o = Command::new(env!("CARGO_BIN_EXE_logbus"))
        .args(["queue", "inspect"])
        .arg(queue)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    text.split("unacknowledged records: ")
        .nth(1)
        .and_then(|s| s.lines().next()?.trim().parse().ok())
        .unwrap_or(0)
}

fn wait(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn the_edge_agent_rides_out_a_collector_outage_and_a_crash_without_losing_an_event() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("app")).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/ingest", listener.local_addr().unwrap());
    let collector = Arc::new(Collector {
        down: AtomicBool::new(true),
        accepted: Mutex::new(Vec::new()),
        refused: Mutex::new(0),
    });
    std::thread::spawn({
        let c = collector.clone();
        move || serve(listener, c)
    });

    // The collector is down: the agent queues the kept half on disk.
    let log = dir.path().join("app/service.log");
    write_lines(&log, 0..4000);
    let mut first = agent(dir.path(), &url);
    let queue = dir.path().join("state/queues/ship");
    wait("the backlog to reach the disk queue", || {
        unacked(&queue) >= 2000
    });
    // ...and the tail to have saved its position past all of it.
    let positions = dir.path().join("state/tail/logs.tail.json");
    let len = std::fs::metadata(&log).unwrap().len();
    wait("the tail position to be saved", || {
        std::fs::read(&positions)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v["files"][0]["offset"].as_u64() == Some(len))
    });
    assert!(*collector.refused.lock().unwrap() > 0);
    // Crash.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(collector.accepted.lock().unwrap().is_empty());

    // The collector is back; the agent restarts; more lines arrive.
    collector.down.store(false, Ordering::SeqCst);
    let second = agent(dir.path(), &url);
    write_lines(&log, 4000..4100);
    let expected: Vec<u64> = (0..4100).filter(|i| i % 2 == 0).collect();
    wait("every kept event at the collector", || {
        let got = collector.accepted.lock().unwrap();
        let mut seqs: Vec<u64> = got.iter().map(|v| v["seq"].as_u64().unwrap()).collect();
        seqs.sort_unstable();
        seqs.dedup();
        seqs == expected
    });
    Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status()
        .unwrap();
    let o = second.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let got = collector.accepted.lock().unwrap();
    // Nothing was accepted before the crash and the tail had saved its
    // position: every event arrives exactly once.
    assert_eq!(got.len(), expected.len());
    assert!(
        got.iter()
            .all(|v| v["PRIORITY"] == "3" && v["agent_received_at"].is_string())
    );
    assert_eq!(unacked(&queue), 0);
}
