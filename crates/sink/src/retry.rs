//! One retry policy for every sink, so an operator learns one set of knobs
//! and one behaviour: exponential backoff with *full* jitter (a random
//! delay between zero and the exponential step, which spreads a fleet's
//! retries after an outage instead of synchronising them), never sooner
//! than a `Retry-After` the destination sent, and an optional cap on
//! attempts or on elapsed time after which the sink gives up.

use std::time::{Duration, SystemTime};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Step of the first retry; doubles per attempt.
    pub initial_backoff: Duration,
    /// Largest step; also caps how long a `Retry-After` can make us wait.
    pub max_backoff: Duration,
    /// Give up after this many attempts (the first one included).
    pub max_attempts: Option<u32>,
    /// Give up once this long has passed since the first attempt.
    pub max_elapsed: Option<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
            max_attempts: None,
            max_elapsed: None,
        }
    }
}

impl RetryPolicy {
    /// The exponential step before retry `attempt` (1-based, the attempt
    /// that just failed): `initial × 2^(attempt-1)`, at most `max_backoff`.
    pub fn step(&self, attempt: u32) -> Duration {
        self.initial_backoff
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
            .min(self.max_backoff)
    }

    /// How long to wait after attempt number `attempt` failed, `elapsed`
    /// after the first one started; `None` once the policy is spent.
    /// `jitter` is a uniform draw from `[0, 1)`; `retry_after` is what the
    /// destination asked for, if anything.
    pub fn next_delay(
        &self,
        attempt: u32,
        elapsed: Duration,
        retry_after: Option<Duration>,
        jitter: f64,
    ) -> Option<Duration> {
        if self.max_attempts.is_some_and(|max| attempt >= max) {
            return None;
        }
        let jittered = self.step(attempt).mul_f64(jitter.clamp(0.0, 1.0));
        let delay = match retry_after {
            Some(asked) => asked.min(self.max_backoff).max(jittered),
            None => jittered,
        };
        match self.max_elapsed {
            Some(max) if elapsed.saturating_add(delay) > max => None,
            _ => Some(delay),
        }
    }
}

/// Reads a `Retry-After` header value in either of its forms (RFC 9110
/// §10.2.3): a number of seconds, or an HTTP date (a date already past
/// means "now"). Anything else is ignored.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            max_attempts: None,
            max_elapsed: None,
        }
    }

    #[test]
    fn the_step_doubles_up_to_the_cap_and_never_overflows() {
        let p = policy();
        let steps: Vec<u64> = (1..=7).map(|a| p.step(a).as_millis() as u64).collect();
        assert_eq!(steps, [100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(p.step(u32::MAX), Duration::from_secs(2));
    }

    #[test]
    fn full_jitter_spans_zero_to_the_step() {
        let p = policy();
        assert_eq!(
            p.next_delay(3, Duration::ZERO, None, 0.0),
            Some(Duration::ZERO)
        );
        assert_eq!(
            p.next_delay(3, Duration::ZERO, None, 0.5),
            Some(Duration::from_millis(200))
        );
        assert_eq!(
            p.next_delay(3, Duration::ZERO, None, 0.999_999),
            Some(Duration::from_millis(400).mul_f64(0.999_999))
        );
    }

    #[test]
    fn retry_after_is_a_floor_capped_by_the_largest_step() {
        let p = policy();
        let one = Some(Duration::from_secs(1));
        assert_eq!(p.next_delay(1, Duration::ZERO, one, 0.0), one);
        // A server asking for an hour waits the cap, not an hour.
        let hour = Some(Duration::from_secs(3600));
        assert_eq!(
            p.next_delay(1, Duration::ZERO, hour, 0.0),
            Some(Duration::from_secs(2))
        );
        // The jittered step wins when it is longer than what was asked.
        let short = Some(Duration::from_millis(1));
        assert_eq!(
            p.next_delay(5, Duration::ZERO, short, 0.5),
            Some(Duration::from_millis(800))
        );
    }

    #[test]
    fn the_attempt_and_elapsed_caps_end_the_retries() {
        let p = RetryPolicy {
            max_attempts: Some(3),
            ..policy()
        };
        assert!(p.next_delay(2, Duration::ZERO, None, 0.5).is_some());
        assert_eq!(p.next_delay(3, Duration::ZERO, None, 0.5), None);
        let p = RetryPolicy {
            max_elapsed: Some(Duration::from_secs(10)),
            ..policy()
        };
        assert!(p.next_delay(9, Duration::from_secs(8), None, 0.5).is_some());
        assert_eq!(
            p.next_delay(9, Duration::from_millis(9500), None, 0.5),
            None
        );
        // A retry that would start exactly at the cap still goes.
        let delay = p.next_delay(1, Duration::ZERO, None, 1.0).unwrap();
        assert_eq!(
            p.next_delay(1, Duration::from_secs(10) - delay, None, 1.0),
            Some(delay)
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = httpdate::parse_http_date("Tue, 01 Dec 2026 10:00:00 GMT").unwrap();
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Tue, 01 Dec 2026 10:00:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Tue, 01 Dec 2026 09:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }
}
