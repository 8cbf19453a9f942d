//! Joining the lines of one logical event (a stack trace, a wrapped
//! message) before it leaves the tailer. Pure: lines and the clock come in,
//! events come out, so every rule is tested without files or time.

use std::time::{Duration, Instant};

use regex::bytes::Regex;

/// How lines join.
#[derive(Debug, Clone)]
pub enum Rule {
    /// A line matching `start` begins an event; other lines continue it.
    Start(Regex),
    /// A line matching `continuation` continues the previous event.
    Continuation(Regex),
}

#[derive(Debug, Clone)]
pub struct MultilineConfig {
    pub rule: Rule,
    /// An event waiting this long for its next line is emitted as it is.
    pub timeout: Duration,
    pub max_lines: usize,
    pub max_bytes: usize,
}

/// One file's event being assembled.
#[derive(Debug, Default)]
pub struct Joiner {
    buf: Vec<u8>,
    lines: usize,
    /// File bytes consumed into `buf` (lines plus their newlines): the
    /// checkpoint must not move past them until the event is emitted.
    pub pending_bytes: u64,
    last: Option<Instant>,
}

impl Joiner {
    /// Adds one line (without its newline; `consumed` is the bytes it took
    /// in the file). Returns the event this line completed, if any.
    pub fn push(
        &mut self,
        config: &MultilineConfig,
        line: &[u8],
        consumed: u64,
        now: Instant,
    ) -> Option<Vec<u8>> {
        let continues = match &config.rule {
            Rule::Start(re) => !re.is_match(line),
            Rule::Continuation(re) => re.is_match(line),
        };
        let mut out = None;
        if self.lines > 0
            && (!continues
                || self.lines >= config.max_lines
                || self.buf.len() + 1 + line.len() > config.max_bytes)
        {
            out = self.take();
        }
        if self.lines > 0 {
            self.buf.push(b'\n');
        }
        let room = config.max_bytes.saturating_sub(self.buf.len());
        self.buf.extend_from_slice(&line[..line.len().min(room)]);
        self.lines += 1;
        self.pending_bytes += consumed;
        self.last = Some(now);
        out
    }

    /// The event waiting, if its last line is older than the timeout.
    pub fn flush_stale(&mut self, config: &MultilineConfig, now: Instant) -> Option<Vec<u8>> {
        match self.last {
            Some(last) if now.duration_since(last) >= config.timeout => self.take(),
            _ => None,
        }
    }

    /// Whatever is waiting, now.
    pub fn take(&mut self) -> Option<Vec<u8>> {
        if self.lines == 0 {
            return None;
        }
        self.lines = 0;
        self.pending_bytes = 0;
        self.last = None;
        Some(std::mem::take(&mut self.buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rule: Rule) -> MultilineConfig {
        MultilineConfig {
            rule,
            timeout: Duration::from_millis(500),
            max_lines: 4,
            max_bytes: 1000,
        }
    }

    fn feed(c: &MultilineConfig, lines: &[&str]) -> (Vec<String>, Joiner) {
        let mut j = Joiner::default();
        let now = Instant::now();
        let out = lines
            .iter()
            .filter_map(|l| j.push(c, l.as_bytes(), l.len() as u64 + 1, now))
            .map(|e| String::from_utf8(e).unwrap())
            .collect();
        (out, j)
    }

    #[test]
    fn a_start_pattern_joins_a_stack_trace() {
        let c = config(Rule::Start(Regex::new(r"^\d{4}-").unwrap()));
        let (out, mut j) = feed(
            &c,
            &[
                "2026-11-30 ERROR boom",
                "  at a()",
                "  at b()",
                "2026-11-30 INFO next",
            ],
        );
        assert_eq!(out, ["2026-11-30 ERROR boom\n  at a()\n  at b()"]);
        assert_eq!(j.pending_bytes, "2026-11-30 INFO next\n".len() as u64);
        assert_eq!(j.take().unwrap(), b"2026-11-30 INFO next");
    }

    #[test]
    fn a_continuation_pattern_appends_indented_lines() {
        let c = config(Rule::Continuation(Regex::new(r"^\s").unwrap()));
        let (out, _) = feed(&c, &["one", " two", "three", "four"]);
        assert_eq!(out, ["one\n two", "three"]);
    }

    /// `max_bytes` counts the joining newline: an event of exactly the
    /// limit is kept whole, one byte more starts a new event.
    #[test]
    fn an_event_of_exactly_max_bytes_is_kept_whole() {
        let mut c = config(Rule::Continuation(Regex::new(r"^\s").unwrap()));
        c.max_bytes = 10;
        let (out, mut j) = feed(&c, &["abcd", " efgh", " i"]);
        assert_eq!(out, ["abcd\n efgh"]);
        assert_eq!(j.take().unwrap(), b" i");
        let (out, mut j) = feed(&c, &["abcd", " efghi"]);
        assert_eq!(out, ["abcd"]);
        assert_eq!(j.take().unwrap(), b" efghi");
    }

    #[test]
    fn limits_and_the_timeout_cut_events() {
        let c = config(Rule::Continuation(Regex::new(r"^\s").unwrap()));
        let (out, _) = feed(&c, &["a", " 1", " 2", " 3", " 4", " 5"]);
        assert_eq!(out, ["a\n 1\n 2\n 3"]);
        let mut j = Joiner::default();
        let t0 = Instant::now();
        assert!(j.push(&c, b"alone", 6, t0).is_none());
        assert!(j.flush_stale(&c, t0 + Duration::from_millis(499)).is_none());
        assert_eq!(
            j.flush_stale(&c, t0 + Duration::from_millis(500)).unwrap(),
            b"alone"
        );
        assert_eq!(j.pending_bytes, 0);
    }
}
