//! One retry policy for every sink, so an operator learns one set of knobs
//! and one behaviour: exponential backoff with *full* jitter (a random
//! delay between zero and the exponential step, which spreads a fleet's
//! retries after an outage instead of synchronising them), never sooner
//! than a `Retry-After` the destination sent, and an optional cap on
//! attempts or on elapsed time after which the sink gives up.

use std::future::Future;
use std::time::{Duration, SystemTime};

use logbus_plugin_api::CancellationToken;

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

/// What one attempt of a retried operation came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Attempt<T> {
    Done(T),
    /// Another try may work: why this one failed, and how long the other
    /// side asked to be left alone (`Retry-After`), if it did.
    Again {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// It failed after getting further than the attempt before (a read
    /// that delivered more): the attempts and the time count afresh.
    Further(String),
    /// Another try would fail the same way.
    Fail(String),
}

impl<T> Attempt<T> {
    /// A transient failure with no `Retry-After`.
    pub fn again(reason: impl Into<String>) -> Self {
        Attempt::Again {
            reason: reason.into(),
            retry_after: None,
        }
    }

    /// The same attempt with its value mapped.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Attempt<U> {
        self.and_then(|v| Attempt::Done(f(v)))
    }

    /// The same attempt, its value judged by `f` (an answer that arrived
    /// but says the attempt failed).
    pub fn and_then<U>(self, f: impl FnOnce(T) -> Attempt<U>) -> Attempt<U> {
        match self {
            Attempt::Done(v) => f(v),
            Attempt::Again {
                reason,
                retry_after,
            } => Attempt::Again {
                reason,
                retry_after,
            },
            Attempt::Further(reason) => Attempt::Further(reason),
            Attempt::Fail(reason) => Attempt::Fail(reason),
        }
    }
}

/// How a retried operation ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Retried<T> {
    Done(T),
    /// Refused for good: the reason.
    Failed(String),
    /// The policy's attempts or time ran out: the last reason.
    GaveUp {
        reason: String,
        attempts: u32,
    },
    /// `stop` was cancelled while waiting to try again: the last reason.
    Stopped(String),
}

impl RetryPolicy {
    /// Runs `attempt` (given its number, from 1) until it is done or
    /// refused for good, the policy gives up, or `stop` is cancelled
    /// while waiting for the next try. `waiting` hears of each retry
    /// before its wait (the reason and the delay), to log and count it.
    /// The one retry loop of every sink and source outside the
    /// [`crate::Driver`] (which retries batches partly), the
    /// [`crate::ObjectDriver`]'s among them.
    pub async fn run<T, Fut>(
        &self,
        stop: &CancellationToken,
        mut attempt: impl FnMut(u32) -> Fut,
        mut waiting: impl FnMut(&str, Duration),
    ) -> Retried<T>
    where
        Fut: Future<Output = Attempt<T>>,
    {
        let mut started = tokio::time::Instant::now();
        let mut n = 0;
        let mut tried = 0;
        loop {
            n += 1;
            tried += 1;
            let (reason, retry_after) = match attempt(tried).await {
                Attempt::Done(v) => return Retried::Done(v),
                Attempt::Fail(reason) => return Retried::Failed(reason),
                Attempt::Again {
                    reason,
                    retry_after,
                } => (reason, retry_after),
                Attempt::Further(reason) => {
                    n = 1;
                    started = tokio::time::Instant::now();
                    (reason, None)
                }
            };
            let Some(delay) = self.next_delay(n, started.elapsed(), retry_after, fastrand::f64())
            else {
                return Retried::GaveUp {
                    reason,
                    attempts: n,
                };
            };
            waiting(&reason, delay);
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stop.cancelled() => return Retried::Stopped(reason),
            }
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

    /// The attempt numbers a scripted operation was called with.
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<u32>>>;

    /// A scripted operation: the outcomes of its attempts in turn.
    fn script(
        outcomes: Vec<Attempt<u32>>,
    ) -> (Seen, impl FnMut(u32) -> std::future::Ready<Attempt<u32>>) {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let mut outcomes = outcomes.into_iter();
        let attempt = move |n| {
            log.lock().unwrap().push(n);
            std::future::ready(outcomes.next().expect("no more attempts scripted"))
        };
        (seen, attempt)
    }

    #[tokio::test(start_paused = true)]
    async fn run_retries_transient_failures_until_done() {
        let (seen, attempt) = script(vec![
            Attempt::again("down"),
            Attempt::Again {
                reason: "busy".into(),
                retry_after: Some(Duration::from_secs(1)),
            },
            Attempt::Done(7),
        ]);
        let mut waits = Vec::new();
        let got = policy()
            .run(&CancellationToken::new(), attempt, |why, d| {
                waits.push((why.to_string(), d))
            })
            .await;
        assert_eq!(got, Retried::Done(7));
        assert_eq!(*seen.lock().unwrap(), [1, 2, 3]);
        assert_eq!(waits.len(), 2);
        assert_eq!(waits[0].0, "down");
        assert!(waits[0].1 <= Duration::from_millis(100));
        // The server's Retry-After is a floor.
        assert_eq!(waits[1], ("busy".into(), Duration::from_secs(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn run_ends_at_a_refusal_at_the_cap_and_at_stop() {
        let stop = CancellationToken::new();
        let (_, attempt) = script(vec![Attempt::again("a"), Attempt::Fail("no".into())]);
        let got = policy().run(&stop, attempt, |_, _| {}).await;
        assert_eq!(got, Retried::Failed("no".into()));

        let capped = RetryPolicy {
            max_attempts: Some(2),
            ..policy()
        };
        let (seen, attempt) = script(vec![Attempt::again("a"), Attempt::again("b")]);
        let got = capped.run(&stop, attempt, |_, _| {}).await;
        assert_eq!(
            got,
            Retried::GaveUp {
                reason: "b".into(),
                attempts: 2
            }
        );
        assert_eq!(seen.lock().unwrap().len(), 2);

        // Cancelled during the wait: no further attempt.
        let (seen, attempt) = script(vec![Attempt::again("a")]);
        let stopping = stop.clone();
        let got = policy()
            .run(&stop, attempt, move |_, _| stopping.cancel())
            .await;
        assert_eq!(got, Retried::Stopped("a".into()));
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn progress_counts_the_attempts_afresh() {
        let capped = RetryPolicy {
            max_attempts: Some(2),
            ..policy()
        };
        // Without the progress in the middle, the third attempt would
        // never run (the cap is 2).
        let (seen, attempt) = script(vec![
            Attempt::again("a"),
            Attempt::Further("got further".into()),
            Attempt::again("b"),
        ]);
        let got = capped
            .run(&CancellationToken::new(), attempt, |_, _| {})
            .await;
        assert_eq!(
            got,
            Retried::GaveUp {
                reason: "b".into(),
                attempts: 2
            }
        );
        assert_eq!(*seen.lock().unwrap(), [1, 2, 3]);
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
