//! The batching and retry options the request-sending sinks share. serde
//! cannot flatten a shared struct under `deny_unknown_fields`, so each
//! sink still declares the fields (with its own defaults); they meet here
//! for one set of checks and one way to become the driver's settings, so
//! every sink says the same thing about the same mistake.

use std::time::Duration;

use logbus_plugin_api::OptionError;

use crate::batch::BatchLimits;
use crate::retry::RetryPolicy;

/// A sink's batching and retry options, by value.
#[derive(Debug, Clone, Copy)]
pub struct DeliveryOptions {
    pub batch_max_events: usize,
    pub batch_max_bytes: usize,
    pub batch_timeout_ms: u64,
    pub request_timeout_ms: u64,
    pub retry_initial_backoff_ms: u64,
    pub retry_max_backoff_ms: u64,
    pub retry_max_attempts: Option<u32>,
    pub retry_max_elapsed_ms: Option<u64>,
    pub in_flight: usize,
    /// The most `in_flight` the sink allows.
    pub max_in_flight: usize,
}

impl DeliveryOptions {
    /// Every problem, each at its option's name.
    pub fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        for (key, value) in [
            ("batch_max_events", self.batch_max_events as u64),
            ("batch_max_bytes", self.batch_max_bytes as u64),
            ("request_timeout_ms", self.request_timeout_ms),
            ("retry_initial_backoff_ms", self.retry_initial_backoff_ms),
            ("retry_max_backoff_ms", self.retry_max_backoff_ms),
        ] {
            if value == 0 {
                errors.push(OptionError::at(&[key], "must be at least 1"));
            }
        }
        errors.extend(check_backoff(
            self.retry_initial_backoff_ms,
            self.retry_max_backoff_ms,
        ));
        if !(1..=self.max_in_flight).contains(&self.in_flight) {
            errors.push(OptionError::at(
                &["in_flight"],
                format!(
                    "must be between 1 and {}, got {}",
                    self.max_in_flight, self.in_flight
                ),
            ));
        }
        if self.retry_max_elapsed_ms == Some(0) {
            errors.push(OptionError::at(
                &["retry_max_elapsed_ms"],
                "must be at least 1",
            ));
        }
        if self.retry_max_attempts == Some(0) {
            errors.push(OptionError::at(
                &["retry_max_attempts"],
                "must be at least 1",
            ));
        }
        errors
    }

    pub fn limits(&self) -> BatchLimits {
        BatchLimits {
            max_events: self.batch_max_events,
            max_bytes: self.batch_max_bytes,
            max_age: Duration::from_millis(self.batch_timeout_ms),
            ..BatchLimits::default()
        }
    }

    pub fn retry(&self) -> RetryPolicy {
        RetryPolicy {
            initial_backoff: Duration::from_millis(self.retry_initial_backoff_ms),
            max_backoff: Duration::from_millis(self.retry_max_backoff_ms),
            max_attempts: self.retry_max_attempts,
            max_elapsed: self.retry_max_elapsed_ms.map(Duration::from_millis),
        }
    }
}

/// The one check of `retry_max_backoff_ms` against
/// `retry_initial_backoff_ms`, for every sink and source that retries,
/// whether or not it runs on the [`crate::Driver`].
pub fn check_backoff(initial_ms: u64, max_ms: u64) -> Option<OptionError> {
    (max_ms < initial_ms).then(|| {
        OptionError::at(
            &["retry_max_backoff_ms"],
            "must not be below `retry_initial_backoff_ms`",
        )
    })
}

/// An error with its causes ("error sending request: connection refused").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each option lands in the driver's setting of the same meaning;
    /// the partition cap, which no option sets, keeps its default.
    #[test]
    fn limits_and_retry_take_each_option() {
        let o = DeliveryOptions {
            batch_max_events: 7,
            batch_max_bytes: 4096,
            batch_timeout_ms: 250,
            retry_initial_backoff_ms: 20,
            retry_max_backoff_ms: 900,
            retry_max_attempts: Some(4),
            retry_max_elapsed_ms: Some(60_000),
            ..options()
        };
        assert_eq!(
            o.limits(),
            BatchLimits {
                max_events: 7,
                max_bytes: 4096,
                max_age: Duration::from_millis(250),
                max_partitions: BatchLimits::default().max_partitions,
            }
        );
        assert_eq!(
            o.retry(),
            RetryPolicy {
                initial_backoff: Duration::from_millis(20),
                max_backoff: Duration::from_millis(900),
                max_attempts: Some(4),
                max_elapsed: Some(Duration::from_secs(60)),
            }
        );
    }

    fn options() -> DeliveryOptions {
        DeliveryOptions {
            batch_max_events: 10,
            batch_max_bytes: 10,
            batch_timeout_ms: 10,
            request_timeout_ms: 10,
            retry_initial_backoff_ms: 10,
            retry_max_backoff_ms: 10,
            retry_max_attempts: None,
            retry_max_elapsed_ms: None,
            in_flight: 4,
            max_in_flight: 4,
        }
    }

    #[test]
    fn each_problem_names_its_option() {
        assert!(options().check().is_empty());
        let bad = DeliveryOptions {
            batch_max_events: 0,
            retry_initial_backoff_ms: 20,
            in_flight: 5,
            retry_max_attempts: Some(0),
            retry_max_elapsed_ms: Some(0),
            ..options()
        };
        let found: Vec<String> = bad
            .check()
            .iter()
            .map(|e| format!("{}: {}", e.path.join("."), e.message))
            .collect();
        assert_eq!(
            found,
            [
                "batch_max_events: must be at least 1",
                "retry_max_backoff_ms: must not be below `retry_initial_backoff_ms`",
                "in_flight: must be between 1 and 4, got 5",
                "retry_max_elapsed_ms: must be at least 1",
                "retry_max_attempts: must be at least 1",
            ]
        );
        let ok = DeliveryOptions {
            in_flight: 1,
            ..options()
        };
        assert!(ok.check().is_empty());
    }

    #[derive(Debug)]
    struct Sending(std::io::Error);

    impl std::fmt::Display for Sending {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("error sending request")
        }
    }

    impl std::error::Error for Sending {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn causes_are_chained() {
        let e = Sending(std::io::Error::other("connection refused"));
        assert_eq!(error_chain(&e), "error sending request: connection refused");
    }
}
