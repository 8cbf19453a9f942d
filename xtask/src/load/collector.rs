//! Reads what the target commits and charges each event its latency from
//! the scheduled arrival stamp to the moment the line reached the harness.
//! The same reader serves LogBus and peers, so both are timed the same way.
//!
//! Latency goes into HDR histograms with microsecond resolution: one per
//! dwell (the dwell the event was *scheduled* in, so an event born into a
//! backlog is charged to the dwell that created it) and a short window the
//! sampler swaps out ten times a second for the replay's latency trace.

use std::io::Read;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use hdrhistogram::Histogram;

use super::{Shared, new_histogram};

pub struct Collected {
    /// Latency (µs) of events by the dwell they were scheduled in.
    pub by_dwell: Vec<Histogram<u64>>,
    pub lines: u64,
    /// Lines that carried no `t_sched` stamp (a target that rewrote it).
    pub unstamped: u64,
}

/// Reads `input` to its end.
pub fn run(
    mut input: impl Read,
    shared: Arc<Shared>,
    window: Arc<Mutex<Histogram<u64>>>,
) -> Collected {
    let mut out = Collected {
        by_dwell: Vec::new(),
        lines: 0,
        unstamped: 0,
    };
    let mut buf = vec![0u8; 1 << 20];
    let mut filled = 0usize;
    let mut starts: Vec<u64> = Vec::new();
    loop {
        if filled == buf.len() {
            // A line longer than the buffer: grow rather than split it.
            buf.resize(buf.len() * 2, 0);
        }
        let n = match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        filled += n;
        let now = shared.now_us();
        let mut consumed = 0;
        let mut lines = 0u64;
        let mut win = window.lock().expect("window lock");
        while let Some(end) = memchr(b'\n', &buf[consumed..filled]) {
            let line = &buf[consumed..consumed + end];
            consumed += end + 1;
            lines += 1;
            match stamp(line) {
                Some(t) => {
                    let lat = now.saturating_sub(t).max(1);
                    let _ = win.record(lat);
                    let dwell = dwell_of(t, &mut starts, &shared);
                    while out.by_dwell.len() <= dwell {
                        out.by_dwell.push(new_histogram());
                    }
                    let _ = out.by_dwell[dwell].record(lat);
                }
                None => out.unstamped += 1,
            }
        }
        drop(win);
        buf.copy_within(consumed..filled, 0);
        filled -= consumed;
        out.lines += lines;
        shared.received.fetch_add(lines, Ordering::Relaxed);
    }
    out
}

/// The dwell whose schedule began last at or before `t` (µs).
fn dwell_of(t: u64, starts: &mut Vec<u64>, shared: &Shared) -> usize {
    if starts.last().is_none_or(|&last| t >= last) {
        // Maybe a newer dwell began.
        shared.refresh_dwell_starts(starts);
    }
    starts.partition_point(|&s| s <= t).saturating_sub(1)
}

/// The value of the first `"t_sched":` in a line, quoted or not, with or
/// without a space after the colon (peers format JSON their own way).
pub fn stamp(line: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"t_sched\":";
    let at = line.windows(KEY.len()).position(|w| w == KEY)?;
    let mut rest = &line[at + KEY.len()..];
    while let [b' ' | b'"', tail @ ..] = rest {
        rest = tail;
    }
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_is_found_however_the_target_formats_it() {
        assert_eq!(stamp(br#"{"t_sched":123,"a":1}"#), Some(123));
        assert_eq!(stamp(br#"{"a":1, "t_sched": 45}"#), Some(45));
        assert_eq!(stamp(br#"{"t_sched":"678","a":1}"#), Some(678));
        assert_eq!(stamp(br#"{"a":1}"#), None);
        assert_eq!(stamp(br#"{"t_sched":null}"#), None);
    }

    #[test]
    fn events_are_charged_to_the_dwell_they_were_scheduled_in() {
        let shared = Shared::new();
        for start in [0, 1_000, 5_000] {
            shared.add_dwell_start(start);
        }
        let mut local = Vec::new();
        assert_eq!(dwell_of(10, &mut local, &shared), 0);
        assert_eq!(dwell_of(1_000, &mut local, &shared), 1);
        assert_eq!(dwell_of(4_999, &mut local, &shared), 1);
        assert_eq!(dwell_of(7_000, &mut local, &shared), 2);
    }

    #[test]
    fn lines_split_across_reads_are_counted_once() {
        struct Chunks(Vec<&'static [u8]>);
        impl Read for Chunks {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.0.is_empty() {
                    return Ok(0);
                }
                let c = self.0.remove(0);
                buf[..c.len()].copy_from_slice(c);
                Ok(c.len())
            }
        }
        let shared = Arc::new(Shared::new());
        shared.add_dwell_start(0);
        let window = Arc::new(Mutex::new(new_histogram()));
        let got = run(
            Chunks(vec![
                b"{\"t_sched\":1,\"a\"",
                b":1}\n{\"b\":2}\n{\"t_sc",
                b"hed\":2}\n",
            ]),
            shared.clone(),
            window,
        );
        assert_eq!(got.lines, 3);
        assert_eq!(got.unstamped, 1);
        assert_eq!(got.by_dwell[0].len(), 2);
        assert_eq!(shared.received.load(Ordering::Relaxed), 3);
    }
}
