//! The batching and retry options every sink shares, declared once.
//! A sink embeds [`Batching`] and [`Retrying`] with `#[serde(flatten)]`,
//! so the options stay at the top level of its YAML, its JSON Schema and
//! its docs page, while their meaning, their checks and the way they
//! become the driver's settings exist in one place: every sink says the
//! same thing about the same mistake. A sink's own defaults come from a
//! type implementing [`BatchDefaults`] / [`RetryDefaults`], because the
//! right batch for a mail server is not the right one for ClickHouse.

use std::marker::PhantomData;
use std::time::Duration;

use logbus_plugin_api::OptionError;
use serde::Deserialize;

use crate::batch::BatchLimits;
use crate::retry::RetryPolicy;

/// A sink's batch defaults (see [`Batching`]).
pub trait BatchDefaults {
    const BATCH_MAX_EVENTS: usize;
    const BATCH_MAX_BYTES: usize;
    const BATCH_TIMEOUT_MS: u64;
}

/// A sink's retry defaults (see [`Retrying`]).
pub trait RetryDefaults {
    const RETRY_INITIAL_BACKOFF_MS: u64 = 100;
    const RETRY_MAX_BACKOFF_MS: u64 = 30_000;
}

fn batch_max_events<D: BatchDefaults>() -> usize {
    D::BATCH_MAX_EVENTS
}
fn batch_max_bytes<D: BatchDefaults>() -> usize {
    D::BATCH_MAX_BYTES
}
fn batch_timeout_ms<D: BatchDefaults>() -> u64 {
    D::BATCH_TIMEOUT_MS
}
fn retry_initial_backoff_ms<D: RetryDefaults>() -> u64 {
    D::RETRY_INITIAL_BACKOFF_MS
}
fn retry_max_backoff_ms<D: RetryDefaults>() -> u64 {
    D::RETRY_MAX_BACKOFF_MS
}

/// How a sink gathers events into one request.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(bound = "")]
#[schemars(bound = "D: BatchDefaults", inline)]
pub struct Batching<D: BatchDefaults> {
    /// Most events in one request.
    #[serde(default = "batch_max_events::<D>")]
    #[schemars(range(min = 1))]
    pub batch_max_events: usize,
    /// Most bytes in one request, as encoded (before compression).
    #[serde(default = "batch_max_bytes::<D>")]
    #[schemars(range(min = 1))]
    pub batch_max_bytes: usize,
    /// A partial batch is sent once its first event has waited this long.
    #[serde(default = "batch_timeout_ms::<D>")]
    pub batch_timeout_ms: u64,
    #[serde(skip)]
    #[schemars(skip)]
    defaults: PhantomData<fn() -> D>,
}

impl<D: BatchDefaults> Batching<D> {
    pub fn new(batch_max_events: usize, batch_max_bytes: usize, batch_timeout_ms: u64) -> Self {
        Batching {
            batch_max_events,
            batch_max_bytes,
            batch_timeout_ms,
            defaults: PhantomData,
        }
    }

    /// Every problem, each at its option's name.
    pub fn check(&self) -> Vec<OptionError> {
        at_least_one(&[
            ("batch_max_events", self.batch_max_events as u64),
            ("batch_max_bytes", self.batch_max_bytes as u64),
        ])
    }

    /// The batcher's limits (the partition cap, which no option sets,
    /// keeps its default).
    pub fn limits(&self) -> BatchLimits {
        BatchLimits {
            max_events: self.batch_max_events,
            max_bytes: self.batch_max_bytes,
            max_age: Duration::from_millis(self.batch_timeout_ms),
            ..BatchLimits::default()
        }
    }
}

impl<D: BatchDefaults> Default for Batching<D> {
    fn default() -> Self {
        Batching::new(D::BATCH_MAX_EVENTS, D::BATCH_MAX_BYTES, D::BATCH_TIMEOUT_MS)
    }
}

impl<D: BatchDefaults> Clone for Batching<D> {
    fn clone(&self) -> Self {
        Batching::new(
            self.batch_max_events,
            self.batch_max_bytes,
            self.batch_timeout_ms,
        )
    }
}

impl<D: BatchDefaults> std::fmt::Debug for Batching<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batching")
            .field("batch_max_events", &self.batch_max_events)
            .field("batch_max_bytes", &self.batch_max_bytes)
            .field("batch_timeout_ms", &self.batch_timeout_ms)
            .finish()
    }
}

/// Where a sink keeps its batch journal ([`crate::journal`]): with it,
/// the batches a crash left unconfirmed are made again alike from what a
/// checkpointing source re-reads, and sent under the same names.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
pub struct Journaling {
    /// Directory of the batch journal (`<stage id>.batches`, made at
    /// start): batches are named by the source positions they cover and
    /// written down before they are sent, so that after a crash the same
    /// positions make the same batches. Unset: no journal.
    #[serde(default)]
    pub batch_journal_dir: Option<std::path::PathBuf>,
}

impl Journaling {
    pub fn check(&self) -> Vec<OptionError> {
        match &self.batch_journal_dir {
            Some(dir) if dir.as_os_str().is_empty() => {
                vec![OptionError::at(&["batch_journal_dir"], "must not be empty")]
            }
            _ => Vec::new(),
        }
    }

    /// The directory, resolved against the pipeline file's.
    pub fn dir(&self, cx: &logbus_plugin_api::BuildContext) -> Option<std::path::PathBuf> {
        self.batch_journal_dir.as_deref().map(|d| cx.resolve(d))
    }

    /// What `validate --preflight` checks: a directory the stage may
    /// create and write.
    pub fn host_need(
        &self,
        cx: &logbus_plugin_api::BuildContext,
    ) -> Option<logbus_plugin_api::StatedNeed> {
        self.dir(cx).map(|path| {
            logbus_plugin_api::StatedNeed::new(
                logbus_plugin_api::HostNeed::WriteDir { path, create: true },
                &["batch_journal_dir"],
            )
        })
    }
}

/// How a sink (or a source reading a service) retries what failed.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(bound = "")]
#[schemars(bound = "D: RetryDefaults", inline)]
pub struct Retrying<D: RetryDefaults> {
    /// First retry delay; doubles per attempt (with full jitter).
    #[serde(default = "retry_initial_backoff_ms::<D>")]
    #[schemars(range(min = 1))]
    pub retry_initial_backoff_ms: u64,
    /// Longest retry delay (also caps a server's `Retry-After`).
    #[serde(default = "retry_max_backoff_ms::<D>")]
    #[schemars(range(min = 1))]
    pub retry_max_backoff_ms: u64,
    /// Give up after this many attempts; unset: retry until the service
    /// is back, holding the pipeline. A sink sends what it gives up on to
    /// `<id>.dead` when a stage reads it; otherwise the stage fails.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub retry_max_attempts: Option<u32>,
    /// Give up once a batch has been retried for this long (as above).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub retry_max_elapsed_ms: Option<u64>,
    #[serde(skip)]
    #[schemars(skip)]
    defaults: PhantomData<fn() -> D>,
}

impl<D: RetryDefaults> Retrying<D> {
    pub fn new(
        retry_initial_backoff_ms: u64,
        retry_max_backoff_ms: u64,
        retry_max_attempts: Option<u32>,
        retry_max_elapsed_ms: Option<u64>,
    ) -> Self {
        Retrying {
            retry_initial_backoff_ms,
            retry_max_backoff_ms,
            retry_max_attempts,
            retry_max_elapsed_ms,
            defaults: PhantomData,
        }
    }

    /// Every problem, each at its option's name.
    pub fn check(&self) -> Vec<OptionError> {
        let mut errors = at_least_one(&[
            ("retry_initial_backoff_ms", self.retry_initial_backoff_ms),
            ("retry_max_backoff_ms", self.retry_max_backoff_ms),
        ]);
        if self.retry_max_backoff_ms < self.retry_initial_backoff_ms {
            errors.push(OptionError::at(
                &["retry_max_backoff_ms"],
                "must not be below `retry_initial_backoff_ms`",
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

    /// The one retry policy these options describe.
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            initial_backoff: Duration::from_millis(self.retry_initial_backoff_ms),
            max_backoff: Duration::from_millis(self.retry_max_backoff_ms),
            max_attempts: self.retry_max_attempts,
            max_elapsed: self.retry_max_elapsed_ms.map(Duration::from_millis),
        }
    }
}

impl<D: RetryDefaults> Default for Retrying<D> {
    fn default() -> Self {
        Retrying::new(
            D::RETRY_INITIAL_BACKOFF_MS,
            D::RETRY_MAX_BACKOFF_MS,
            None,
            None,
        )
    }
}

impl<D: RetryDefaults> Clone for Retrying<D> {
    fn clone(&self) -> Self {
        Retrying::new(
            self.retry_initial_backoff_ms,
            self.retry_max_backoff_ms,
            self.retry_max_attempts,
            self.retry_max_elapsed_ms,
        )
    }
}

impl<D: RetryDefaults> std::fmt::Debug for Retrying<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retrying")
            .field("retry_initial_backoff_ms", &self.retry_initial_backoff_ms)
            .field("retry_max_backoff_ms", &self.retry_max_backoff_ms)
            .field("retry_max_attempts", &self.retry_max_attempts)
            .field("retry_max_elapsed_ms", &self.retry_max_elapsed_ms)
            .finish()
    }
}

/// The request options a sink declares itself (their defaults and
/// ranges differ too much to share a block): a timeout of at least 1 ms
/// and between 1 and `max_in_flight` requests at once.
pub fn check_requests(
    request_timeout_ms: u64,
    in_flight: usize,
    max_in_flight: usize,
) -> Vec<OptionError> {
    let mut errors = at_least_one(&[("request_timeout_ms", request_timeout_ms)]);
    if !(1..=max_in_flight).contains(&in_flight) {
        errors.push(OptionError::at(
            &["in_flight"],
            format!("must be between 1 and {max_in_flight}, got {in_flight}"),
        ));
    }
    errors
}

fn at_least_one(options: &[(&str, u64)]) -> Vec<OptionError> {
    options
        .iter()
        .filter(|(_, value)| *value == 0)
        .map(|(key, _)| OptionError::at(&[key], "must be at least 1"))
        .collect()
}

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

    struct Small;
    impl BatchDefaults for Small {
        const BATCH_MAX_EVENTS: usize = 10;
        const BATCH_MAX_BYTES: usize = 10;
        const BATCH_TIMEOUT_MS: u64 = 10;
    }
    impl RetryDefaults for Small {
        const RETRY_INITIAL_BACKOFF_MS: u64 = 10;
        const RETRY_MAX_BACKOFF_MS: u64 = 10;
    }
    struct Usual;
    impl RetryDefaults for Usual {}

    /// Each option lands in the driver's setting of the same meaning;
    /// the partition cap, which no option sets, keeps its default.
    #[test]
    fn limits_and_retry_take_each_option() {
        assert_eq!(
            Batching::<Small>::new(7, 4096, 250).limits(),
            BatchLimits {
                max_events: 7,
                max_bytes: 4096,
                max_age: Duration::from_millis(250),
                max_partitions: BatchLimits::default().max_partitions,
            }
        );
        assert_eq!(
            Retrying::<Small>::new(20, 900, Some(4), Some(60_000)).policy(),
            RetryPolicy {
                initial_backoff: Duration::from_millis(20),
                max_backoff: Duration::from_millis(900),
                max_attempts: Some(4),
                max_elapsed: Some(Duration::from_secs(60)),
            }
        );
    }

    /// A missing option takes the sink's default, in the parsed value and
    /// in the schema (which docs pages and `logbus plugins` show).
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Options {
        #[serde(flatten)]
        batching: Batching<Small>,
        #[serde(flatten)]
        retrying: Retrying<Usual>,
    }

    #[test]
    fn defaults_are_the_sinks_own_and_options_stay_at_the_top() {
        let o: Options =
            serde_json::from_value(serde_json::json!({ "batch_max_bytes": 5 })).expect("valid");
        assert_eq!(
            (o.batching.batch_max_events, o.batching.batch_max_bytes),
            (10, 5)
        );
        assert_eq!(
            (
                o.retrying.retry_initial_backoff_ms,
                o.retrying.retry_max_backoff_ms
            ),
            (100, 30_000)
        );
        let schema = schemars::schema_for!(Options).to_value();
        let properties = schema["properties"].as_object().expect("properties");
        let defaults: Vec<String> = properties
            .iter()
            .map(|(k, v)| format!("{k}={}", v["default"]))
            .collect();
        assert_eq!(
            defaults,
            [
                "batch_max_events=10",
                "batch_max_bytes=10",
                "batch_timeout_ms=10",
                "retry_initial_backoff_ms=100",
                "retry_max_backoff_ms=30000",
                "retry_max_attempts=null",
                "retry_max_elapsed_ms=null",
            ]
        );
        assert_eq!(properties["batch_max_events"]["minimum"], 1);
        assert_eq!(schema["additionalProperties"], false);
        let unknown = serde_json::from_value::<Options>(serde_json::json!({ "retry_max": 1 }));
        assert!(unknown.is_err());
    }

    fn found(errors: Vec<OptionError>) -> Vec<String> {
        errors
            .iter()
            .map(|e| format!("{}: {}", e.path.join("."), e.message))
            .collect()
    }

    #[test]
    fn each_problem_names_its_option() {
        assert!(Batching::<Small>::default().check().is_empty());
        assert!(Retrying::<Small>::default().check().is_empty());
        assert!(check_requests(10, 4, 4).is_empty());
        assert_eq!(
            found(Batching::<Small>::new(0, 0, 0).check()),
            [
                "batch_max_events: must be at least 1",
                "batch_max_bytes: must be at least 1",
            ]
        );
        assert_eq!(
            found(Retrying::<Small>::new(20, 10, Some(0), Some(0)).check()),
            [
                "retry_max_backoff_ms: must not be below `retry_initial_backoff_ms`",
                "retry_max_elapsed_ms: must be at least 1",
                "retry_max_attempts: must be at least 1",
            ]
        );
        assert_eq!(
            found(Retrying::<Small>::new(0, 0, None, None).check()),
            [
                "retry_initial_backoff_ms: must be at least 1",
                "retry_max_backoff_ms: must be at least 1",
            ]
        );
        assert_eq!(
            found(check_requests(0, 5, 4)),
            [
                "request_timeout_ms: must be at least 1",
                "in_flight: must be between 1 and 4, got 5",
            ]
        );
        assert!(check_requests(1, 1, 4).is_empty());
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
