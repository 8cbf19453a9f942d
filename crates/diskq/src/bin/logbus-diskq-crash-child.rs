//! A test helper, not a tool: the process that the crash and full-disk
//! tests of `tests/queue.rs` start and kill. It appends numbered records
//! to a queue (printing `acked N` once record N is acknowledged) while
//! consumers write what they read to a file before acknowledging it.
//!
//! Usage: `logbus-diskq-crash-child DIR FROM COUNT CONSUMERS DELIVERED [hold|abandon]`
//! (`hold`: consume only once the disk has been full for two seconds,
//! longer than the writer's retry pause grows to; `abandon`: append until
//! the disk is full, give up waiting for an append, and drop the queue
//! while the disk is still full).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use logbus_diskq::{Config, DiskQueue};

#[path = "../../tests/support/records.rs"]
mod records;

use records::{batch, seqs};

/// How long `hold` keeps the disk full: past the point where the writer's
/// pause between retries (10 ms, doubling) exceeds a second.
const HOLD_FULL: Duration = Duration::from_secs(2);

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() < 5 {
        eprintln!(
            "usage: logbus-diskq-crash-child DIR FROM COUNT CONSUMERS DELIVERED [hold|abandon]"
        );
        std::process::exit(2);
    }
    if a.get(5).map(String::as_str) == Some("abandon") {
        abandon(Path::new(&a[0]), a[1].parse().expect("FROM"));
        return;
    }
    child_main(
        Path::new(&a[0]),
        a[1].parse().expect("FROM"),
        a[2].parse().expect("COUNT"),
        a[3].parse().expect("CONSUMERS"),
        Path::new(&a[4]),
        a.get(5).map(String::as_str) == Some("hold"),
    );
}

/// The child: a producer appending numbered records from `from` (printing
/// `acked N` once record N is acknowledged) and `consumers` tasks writing
/// what they read to `delivered` before acknowledging it.
fn child_main(
    dir: &Path,
    from: u64,
    count: u64,
    consumers: usize,
    delivered: &Path,
    hold_until_full: bool,
) {
    let cfg = Config {
        segment_bytes: 64 << 10,
        ..Config::new(dir)
    };
    let (q, _) = DiskQueue::open(cfg).unwrap();
    let q = Arc::new(q);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..consumers {
            let q = q.clone();
            let delivered = delivered.to_owned();
            tasks.push(tokio::spawn(async move {
                let mut out = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(delivered)
                    .unwrap();
                let mut spin = c as u64;
                // The disk-full test: consume only once the disk is full,
                // and keep it full a while (the outage the test is about).
                if hold_until_full {
                    while q
                        .counters()
                        .write_errors
                        .load(std::sync::atomic::Ordering::Relaxed)
                        == 0
                    {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    tokio::time::sleep(HOLD_FULL).await;
                }
                loop {
                    let readable = q.readable();
                    tokio::pin!(readable);
                    readable.as_mut().enable();
                    if let Some(b) = q.try_read(1 + c * 13).unwrap() {
                        let text: String = seqs(&b).iter().map(|s| format!("{s}\n")).collect();
                        out.write_all(text.as_bytes()).unwrap();
                        spin = spin.wrapping_mul(31).wrapping_add(7);
                        if spin.is_multiple_of(3) {
                            tokio::task::yield_now().await;
                        }
                        continue;
                    }
                    if q.is_drained() {
                        break;
                    }
                    readable.await;
                }
            }));
        }
        let mut stdout = std::io::stdout();
        let mut next = from;
        while next < from + count {
            let n = (1 + next % 37).min(from + count - next);
            q.append(batch(next, n)).await.unwrap();
            next += n;
            writeln!(stdout, "acked {}", next - 1).unwrap();
            stdout.flush().unwrap();
        }
        q.close();
        for t in tasks {
            t.await.unwrap();
        }
    });
    println!(
        "done write_errors={}",
        q.counters()
            .write_errors
            .load(std::sync::atomic::Ordering::Relaxed)
    );
}

/// Appends from `from` until an append cannot be stored in half a second
/// (the disk is full), waits for the writer to fail that write again
/// (printing `retrying=true` when it has), and drops the queue with that
/// append's records unwritten: the drop must end (the writer stops
/// retrying once told to stop), not hang on a disk that stays full.
/// Prints `dropped write_errors=N` when it has.
fn abandon(dir: &Path, from: u64) {
    let cfg = Config {
        segment_bytes: 64 << 10,
        ..Config::new(dir)
    };
    let (q, _) = DiskQueue::open(cfg).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let errors = || {
        q.counters()
            .write_errors
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    rt.block_on(async {
        let mut next = from;
        loop {
            let append = q.append(batch(next, 37));
            match tokio::time::timeout(Duration::from_millis(500), append).await {
                Ok(stored) => stored.unwrap(),
                Err(_) => break,
            };
            next += 37;
        }
        // The write is being retried: the error count goes on rising
        // (the pause between tries is 2 s at most).
        let (failed, deadline) = (errors(), Instant::now() + Duration::from_secs(10));
        while errors() == failed && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!("retrying={}", errors() > failed);
    });
    let errors = errors();
    drop(q);
    println!("dropped write_errors={errors}");
}
