//! The open-loop feeder. Each event is written with the time it was
//! *scheduled* to arrive (`"t_sched":µs`), so an event held back by a full
//! pipe is charged for the wait: a closed-loop feeder would slow down with
//! the engine and hide exactly the latency this harness exists to show.
//!
//! The pipe is non-blocking so the feeder knows why it is late. Lag while
//! the engine pushes back (EAGAIN) is the engine's; lag while the pipe
//! accepts everything is the feeder's own, and a dwell with too much of it
//! is refused rather than reported.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::{Shared, new_histogram};

/// One fixed-rate dwell: `count` events at `rate`/s from `start_us`.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub dwell: usize,
    pub start_us: u64,
    pub rate: f64,
    pub count: u64,
}

impl Schedule {
    pub fn at(&self, i: u64) -> u64 {
        self.start_us + (i as f64 * 1e6 / self.rate) as u64
    }

    /// Events due by `now_us` (the first is due at `start_us`).
    pub fn due_by(&self, now_us: u64) -> u64 {
        if now_us < self.start_us {
            return 0;
        }
        let due = ((now_us - self.start_us) as f64 * self.rate / 1e6) as u64 + 1;
        due.min(self.count)
    }
}

/// What the feeder learned about its own timeliness, per dwell.
pub struct FeedReport {
    /// The feeder's own lag per batch (µs): write time − scheduled time,
    /// less the time it spent waiting on a full pipe since it was last on
    /// schedule (that part is the target's doing).
    pub own_lag: Vec<Histogram<u64>>,
    /// Events written more than the allowed own lag late, per dwell.
    pub late: Vec<u64>,
    /// Events written in full (and lines of a batch cut short by the target
    /// closing its input, which it may have read).
    pub events: u64,
}

/// The corpus as lines without their leading `{`, ready to be prefixed.
pub struct Corpus {
    tails: Vec<Vec<u8>>,
}

impl Corpus {
    pub fn load(body: &[u8]) -> anyhow::Result<Corpus> {
        let mut tails = Vec::new();
        for (n, line) in body.split(|&b| b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let Some(rest) = line.strip_prefix(b"{") else {
                anyhow::bail!("corpus line {} is not a JSON object", n + 1);
            };
            let mut tail = rest.to_vec();
            tail.push(b'\n');
            tails.push(tail);
        }
        if tails.is_empty() {
            anyhow::bail!("the corpus is empty");
        }
        Ok(Corpus { tails })
    }

    /// The mean size of a line as the feeder writes it: `{"t_sched":N,`
    /// with an N of `sched_digits` digits, then its tail, newline included.
    pub fn mean_line_bytes(&self, sched_digits: usize) -> f64 {
        let prefix = r#"{"t_sched":,"#.len() + sched_digits;
        let total: usize = self.tails.iter().map(|t| t.len() + prefix).sum();
        total as f64 / self.tails.len() as f64
    }
}

/// Writes the scheduled events to `out` until the command channel closes
/// and every scheduled event is written (or the reader side goes away).
pub fn run(
    out: File,
    corpus: Arc<Corpus>,
    shared: Arc<Shared>,
    commands: Receiver<Schedule>,
    max_own_lag_us: u64,
) -> FeedReport {
    set_nonblocking(&out);
    let mut report = FeedReport {
        own_lag: Vec::new(),
        late: Vec::new(),
        events: 0,
    };
    let mut out = out;
    let mut buf: Vec<u8> = Vec::with_capacity(512 * 1024);
    let mut pending: &[u8];
    let mut seq: u64 = 0;
    let mut current: Option<Schedule> = None;
    let mut sent_in_dwell: u64 = 0;
    // Time spent waiting on a full pipe since the feeder was last on
    // schedule: lag up to this much is the target's doing.
    let mut blocked_us: u64 = 0;
    let mut closed = false;
    'outer: loop {
        if current.is_none() {
            let next = if closed {
                None
            } else {
                match commands.try_recv() {
                    Ok(s) => Some(s),
                    Err(TryRecvError::Empty) => {
                        match commands.recv_timeout(Duration::from_millis(5)) {
                            Ok(s) => Some(s),
                            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                                closed = true;
                                None
                            }
                        }
                    }
                    Err(TryRecvError::Disconnected) => {
                        closed = true;
                        None
                    }
                }
            };
            match next {
                Some(s) => {
                    while report.own_lag.len() <= s.dwell {
                        report.own_lag.push(new_histogram());
                        report.late.push(0);
                    }
                    current = Some(s);
                    sent_in_dwell = 0;
                }
                None => break,
            }
        }
        let s = current.expect("set above");
        let now = shared.now_us();
        let due = s.due_by(now);
        if due <= sent_in_dwell {
            // Nothing due yet: sleep until the next event, in short steps so
            // batches stay small and the added delay stays well under 1 ms.
            let next_at = s.at(sent_in_dwell);
            let wait = next_at.saturating_sub(now).clamp(20, 200);
            std::thread::sleep(Duration::from_micros(wait));
            continue;
        }
        // Build one batch: at most 256 events, each with its own stamp.
        let upto = due.min(sent_in_dwell + 256);
        let first_sched = s.at(sent_in_dwell);
        buf.clear();
        for i in sent_in_dwell..upto {
            let tail = &corpus.tails[(seq % corpus.tails.len() as u64) as usize];
            seq += 1;
            let _ = write!(buf, "{{\"t_sched\":{},", s.at(i));
            buf.extend_from_slice(tail);
        }
        let own_lag = now.saturating_sub(first_sched).saturating_sub(blocked_us);
        let _ = report.own_lag[s.dwell].record(own_lag.max(1));
        if own_lag > max_own_lag_us {
            report.late[s.dwell] += upto - sent_in_dwell;
        }
        pending = &buf;
        while !pending.is_empty() {
            if shared.stop_feeding.load(Ordering::Relaxed) {
                count_partial(&buf, pending.len(), &mut report, &shared);
                break 'outer;
            }
            match out.write(pending) {
                Ok(0) => {
                    count_partial(&buf, pending.len(), &mut report, &shared);
                    break 'outer;
                }
                Ok(n) => pending = &pending[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let waited = shared.now_us();
                    wait_writable(&out, 20);
                    blocked_us += shared.now_us() - waited;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // The target closed its input (it exited): stop feeding.
                Err(_) => {
                    count_partial(&buf, pending.len(), &mut report, &shared);
                    break 'outer;
                }
            }
        }
        let written = upto - sent_in_dwell;
        sent_in_dwell = upto;
        report.events += written;
        shared.fed.fetch_add(written, Ordering::Relaxed);
        if sent_in_dwell >= s.due_by(shared.now_us()) {
            // On schedule again.
            blocked_us = 0;
        }
        if sent_in_dwell == s.count {
            current = None;
        }
    }
    report
}

/// A batch cut short: its complete lines may have been read, so they
/// count as fed (reconciliation compares them with what came out).
fn count_partial(buf: &[u8], unwritten: usize, report: &mut FeedReport, shared: &Shared) {
    let written = &buf[..buf.len() - unwritten];
    let lines = written.iter().filter(|&&b| b == b'\n').count() as u64;
    report.events += lines;
    shared.fed.fetch_add(lines, Ordering::Relaxed);
}

fn set_nonblocking(f: &File) {
    if let Ok(flags) = rustix::fs::fcntl_getfl(f) {
        let _ = rustix::fs::fcntl_setfl(f, flags | rustix::fs::OFlags::NONBLOCK);
    }
}

fn wait_writable(f: &File, timeout_ms: i32) {
    let mut fds = [rustix::event::PollFd::new(f, rustix::event::PollFlags::OUT)];
    let timeout = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: i64::from(timeout_ms) * 1_000_000,
    };
    let _ = rustix::event::poll(&mut fds, Some(&timeout));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_line_is_as_the_feeder_writes_it() {
        let corpus = Corpus::load(b"{\"a\":1}\n{\"bb\":2}\n").unwrap();
        // `{"t_sched":123456,` + `"a":1}\n` is 25 bytes, the other 26.
        assert_eq!(corpus.mean_line_bytes(6), 25.5);
    }

    #[test]
    fn schedule_spaces_events_by_the_rate_and_caps_at_the_count() {
        let s = Schedule {
            dwell: 0,
            start_us: 1_000,
            rate: 1_000.0,
            count: 5,
        };
        assert_eq!(s.at(0), 1_000);
        assert_eq!(s.at(3), 4_000);
        assert_eq!(s.due_by(999), 0);
        assert_eq!(s.due_by(1_000), 1);
        assert_eq!(s.due_by(2_500), 2);
        assert_eq!(s.due_by(1_000_000), 5);
    }

    #[test]
    fn corpus_lines_must_be_objects() {
        assert!(Corpus::load(b"{\"a\":1}\n[1]\n").is_err());
        assert!(Corpus::load(b"\n").is_err());
        let c = Corpus::load(b"{\"a\":1}\n").unwrap();
        assert_eq!(c.tails[0], b"\"a\":1}\n");
    }
}
