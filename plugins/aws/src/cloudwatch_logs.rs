//! `sink: cloudwatch_logs` — `PutLogEvents` on the sink core.
//!
//! The service's limits are enforced here, before a request is sent (a
//! local test server does not enforce them, and AWS refuses a whole
//! request that breaks one): at most 10,000 events and 1,048,576 bytes per
//! request, counting 26 bytes per event besides its message — each item
//! the encoder writes *is* a 26-byte header (the timestamp, then padding)
//! and the message, so the batcher's exact byte count is the service's —;
//! every event of a request within 24 hours (events are batched per day of
//! their timestamp), and in chronological order (sorted when the request is
//! built). Events the service reports as too old, too new or past the
//! group's retention are refused for good and go to `<id>.dead`; throttling
//! and 5xx are retried.

use aws_sdk_cloudwatchlogs::Client;
use aws_sdk_cloudwatchlogs::error::ProvideErrorMetadata;
use aws_sdk_cloudwatchlogs::types::{InputLogEvent, RejectedLogEventsInfo};
use chrono::{DateTime, Utc};
use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, FieldPath, OptionError, Payload, Sink, SinkContext,
    StageError, StageKind, TypedPlugin, async_trait,
};
use logbus_sink::{
    Batch, BatchDefaults, Batching, Driver, DriverConfig, Encoder, ItemResult, OnRejected,
    Response, RetryDefaults, Retrying, Template, check_requests, event_time_ms,
};
use serde::Deserialize;

use crate::client::{AwsOptions, describe, sdk_config};

/// The service's per-request limits.
const MAX_EVENTS: usize = 10_000;
const MAX_BYTES: usize = 1_048_576;
/// Bytes the service counts per event besides its message.
const EVENT_OVERHEAD: usize = 26;
const DAY_MS: i64 = 24 * 3600 * 1000;
/// CloudWatch Logs' codes for "slow down" and "try again".
const THROTTLED: &[&str] = &[
    "ThrottlingException",
    "ServiceUnavailableException",
    "OperationAbortedException",
];

/// Options of `sink: cloudwatch_logs`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CloudWatchLogsOptions {
    /// The log group: `{{field}}` names and strftime directives.
    pub group: String,
    /// The log stream, likewise.
    pub stream: String,
    /// Create a missing group or stream (else such events are refused).
    #[serde(default = "yes")]
    pub create_missing: bool,
    /// Retention of a group this sink creates, in days (one of the values
    /// CloudWatch accepts: 1, 3, 5, 7, 14, 30, …).
    pub retention_days: Option<i32>,
    /// The field with the event's time (RFC 3339 text, or epoch seconds or
    /// milliseconds); else, or when missing, the time the event was read.
    pub timestamp_field: Option<String>,
    #[serde(flatten)]
    pub batching: Batching<CloudWatchDefaults>,
    #[serde(default = "default_in_flight")]
    pub in_flight: usize,
    #[serde(default = "default_request_timeout")]
    pub request_timeout_ms: u64,
    #[serde(flatten)]
    pub retrying: Retrying<CloudWatchDefaults>,
    #[serde(default)]
    pub on_rejected: OnRejected,
    #[serde(flatten)]
    pub aws: AwsOptions,
}

fn yes() -> bool {
    true
}
fn default_in_flight() -> usize {
    1
}
fn default_request_timeout() -> u64 {
    30_000
}

/// Retention periods CloudWatch Logs accepts.
const RETENTIONS: &[i32] = &[
    1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
    3288, 3653,
];

/// `sink: cloudwatch_logs`'s own batch and retry defaults.
pub struct CloudWatchDefaults;

impl BatchDefaults for CloudWatchDefaults {
    const BATCH_MAX_EVENTS: usize = MAX_EVENTS;
    const BATCH_MAX_BYTES: usize = MAX_BYTES;
    const BATCH_TIMEOUT_MS: u64 = 1000;
}

impl RetryDefaults for CloudWatchDefaults {
    const RETRY_INITIAL_BACKOFF_MS: u64 = 200;
    const RETRY_MAX_BACKOFF_MS: u64 = 30_000;
}

impl CheckOptions for CloudWatchLogsOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = self.aws.check();
        errors.extend(self.batching.check());
        errors.extend(self.retrying.check());
        // Requests to one stream are not ordered with each other by the
        // service, so a few at most.
        errors.extend(check_requests(self.request_timeout_ms, self.in_flight, 16));
        for (key, text) in [("group", &self.group), ("stream", &self.stream)] {
            if text.is_empty() {
                errors.push(OptionError::at(&[key], "must not be empty"));
            } else if let Err(e) = Template::parse_timed(text) {
                errors.push(OptionError::at(&[key], e));
            }
        }
        if self.batching.batch_max_events > MAX_EVENTS {
            errors.push(OptionError::at(
                &["batch_max_events"],
                format!("at most {MAX_EVENTS} (the service's limit per request)"),
            ));
        }
        if self.batching.batch_max_bytes > MAX_BYTES {
            errors.push(OptionError::at(
                &["batch_max_bytes"],
                format!("at most {MAX_BYTES} (the service's limit per request, 26 bytes per event included)"),
            ));
        }
        if let Some(days) = self.retention_days
            && !RETENTIONS.contains(&days)
        {
            errors.push(OptionError::at(
                &["retention_days"],
                format!("{days} is not a retention CloudWatch accepts ({RETENTIONS:?})"),
            ));
        }
        if let Some(f) = &self.timestamp_field
            && let Err(e) = FieldPath::parse(f)
        {
            errors.push(OptionError::at(&["timestamp_field"], e.to_string()));
        }
        errors
    }
}

pub struct CloudWatchLogsSink;

impl TypedPlugin for CloudWatchLogsSink {
    type Options = CloudWatchLogsOptions;
    const NAME: &'static str = "cloudwatch_logs";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "Amazon CloudWatch Logs: PutLogEvents batches within the service's limits (10,000 events, 1 MiB counting 26 bytes per event, 24 hours, sorted), group and stream from templates and created if missing; events refused as too old, too new or expired to <id>.dead.";

    /// The credentials tried on the group (listed by its name), and a
    /// fixed group and stream looked up unless `create_missing` makes
    /// them at the first batch.
    fn connect(
        &self,
        o: &Self::Options,
        _cx: logbus_plugin_api::ConnectContext,
    ) -> Option<logbus_plugin_api::Probe> {
        let fixed = |t: &str| !t.contains("{{") && !t.contains('%');
        let group = fixed(&o.group).then(|| o.group.clone());
        let stream = fixed(&o.stream).then(|| o.stream.clone());
        let (aws, create) = (o.aws.clone(), o.create_missing);
        Some(Box::pin(async move {
            let client = Client::new(&sdk_config(&aws).await);
            probe_group(&client, group, stream, create).await
        }))
    }

    /// The group and stream templates' fields.
    fn flow(&self, o: &Self::Options) -> logbus_plugin_api::Flow {
        use logbus_plugin_api::flow::template_reads;
        let mut reads = template_reads(&o.group, &["group"]);
        reads.extend(template_reads(&o.stream, &["stream"]));
        reads.into_iter().fold(
            logbus_plugin_api::Flow::pass(),
            logbus_plugin_api::Flow::read,
        )
    }

    fn build(
        &self,
        options: Self::Options,
        _cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let group =
            Template::parse_timed(&options.group).map_err(|e| OptionError::at(&["group"], e))?;
        let stream =
            Template::parse_timed(&options.stream).map_err(|e| OptionError::at(&["stream"], e))?;
        let time = options
            .timestamp_field
            .as_deref()
            .map(FieldPath::parse)
            .transpose()
            .map_err(|e| OptionError::at(&["timestamp_field"], e.to_string()))?;
        Ok(Box::new(CloudWatchWriter {
            encoder: Some(LogEventEncoder { time: time.clone() }),
            group,
            stream,
            time,
            options,
        }))
    }
}

/// Each item: the timestamp (8 bytes, little endian), 18 bytes of padding
/// (so the item is as long as the service counts it), the message.
struct LogEventEncoder {
    time: Option<FieldPath>,
}

impl Encoder for LogEventEncoder {
    fn encode(&self, event: &Event, out: &mut Vec<u8>) -> Result<(), String> {
        out.extend_from_slice(&event_time_ms(event, self.time.as_ref()).to_le_bytes());
        out.extend_from_slice(&[0u8; EVENT_OVERHEAD - 8]);
        match event.payload() {
            Payload::Raw(b) => {
                std::str::from_utf8(b).map_err(|e| {
                    format!("CloudWatch Logs takes UTF-8 messages; this one is not ({e})")
                })?;
                out.extend_from_slice(b);
            }
            Payload::Fields(f) => {
                serde_json::to_writer(&mut *out, f).map_err(|e| format!("encoding as JSON: {e}"))?
            }
            Payload::Lazy(f) => f.write_json(out),
        }
        Ok(())
    }
}

struct CloudWatchWriter {
    encoder: Option<LogEventEncoder>,
    group: Template,
    stream: Template,
    time: Option<FieldPath>,
    options: CloudWatchLogsOptions,
}

/// One request: the destination and the events sorted by time, with the
/// batch index of each.
struct PutRequest {
    group: String,
    stream: String,
    events: Vec<InputLogEvent>,
    order: Vec<usize>,
}

struct CloudWatchService {
    client: Client,
    create_missing: bool,
    retention_days: Option<i32>,
}

/// The partition key: group, stream and the day of the timestamp, joined
/// by a byte no template renders.
const SEP: char = '\u{1}';

/// The batch an event goes to: its group, its stream and the UTC day of
/// its time, so that no request spans more than the 24 hours the service
/// allows.
fn partition_key(group: &str, stream: &str, ts_ms: i64) -> String {
    format!("{group}{SEP}{stream}{SEP}{}", ts_ms.div_euclid(DAY_MS))
}

impl CloudWatchService {
    async fn create(&self, group: &str, stream: &str) -> Result<(), (String, bool)> {
        let made = self
            .client
            .create_log_group()
            .log_group_name(group)
            .send()
            .await;
        match made {
            Ok(_) => {
                if let Some(days) = self.retention_days {
                    self.client
                        .put_retention_policy()
                        .log_group_name(group)
                        .retention_in_days(days)
                        .send()
                        .await
                        .map_err(|e| describe(&e, THROTTLED))?;
                }
            }
            Err(e) if e.code() == Some("ResourceAlreadyExistsException") => {}
            Err(e) => return Err(describe(&e, THROTTLED)),
        }
        match self
            .client
            .create_log_stream()
            .log_group_name(group)
            .log_stream_name(stream)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("ResourceAlreadyExistsException") => Ok(()),
            Err(e) => Err(describe(&e, THROTTLED)),
        }
    }

    async fn put(&self, r: &PutRequest) -> Result<Response, (String, bool)> {
        let out = self
            .client
            .put_log_events()
            .log_group_name(&r.group)
            .log_stream_name(&r.stream)
            .set_log_events(Some(r.events.clone()))
            .send()
            .await
            .map_err(|e| {
                if e.code() == Some("ResourceNotFoundException") {
                    (String::from("missing"), true)
                } else {
                    describe(&e, THROTTLED)
                }
            })?;
        Ok(match out.rejected_log_events_info() {
            Some(info) => Response::Items(r.outcomes(info)),
            None => Response::Delivered,
        })
    }
}

impl PutRequest {
    /// What became of each event of the batch when the service took the
    /// request but refused some of it: its answer gives index ranges into the
    /// sorted request, which `order` maps back to the batch.
    fn outcomes(&self, info: &RejectedLogEventsInfo) -> Vec<ItemResult> {
        let n = self.events.len();
        let mut items = vec![ItemResult::Delivered; n];
        let mut mark = |sorted: std::ops::Range<usize>, why: &str| {
            for i in sorted {
                if let Some(at) = self.order.get(i) {
                    items[*at] = ItemResult::Rejected(format!(
                        "CloudWatch Logs refused the event: {why} (log group {}, stream {})",
                        self.group, self.stream
                    ));
                }
            }
        };
        // The answer's indices, kept inside the request: an end below 0
        // covers nothing, a start below 0 everything.
        let through = |end: i32| 0..usize::try_from(end).map_or(0, |e| e.saturating_add(1).min(n));
        if let Some(end) = info.too_old_log_event_end_index() {
            mark(
                through(end),
                "too old (more than 14 days before now, or before the group's retention)",
            );
        }
        if let Some(end) = info.expired_log_event_end_index() {
            mark(through(end), "expired (older than the group's retention)");
        }
        if let Some(start) = info.too_new_log_event_start_index() {
            mark(
                usize::try_from(start).map_or(0, |s| s.min(n))..n,
                "too new (more than 2 hours after now)",
            );
        }
        items
    }
}

#[async_trait]
impl logbus_sink::Service for CloudWatchService {
    type Request = PutRequest;

    fn prepare(&self, batch: &Batch) -> Result<PutRequest, String> {
        let mut parts = batch.key().split(SEP);
        let group = parts.next().unwrap_or_default().to_string();
        let stream = parts.next().unwrap_or_default().to_string();
        let mut events: Vec<(i64, usize, String)> = (0..batch.len())
            .map(|i| {
                let item = batch.item(i);
                let ts = i64::from_le_bytes(item[..8].try_into().expect("8 bytes"));
                let message = String::from_utf8_lossy(&item[EVENT_OVERHEAD..]).into_owned();
                (ts, i, message)
            })
            .collect();
        // Chronological, as the service requires; stable for equal times.
        events.sort_by_key(|(ts, i, _)| (*ts, *i));
        let order = events.iter().map(|(_, i, _)| *i).collect();
        let events = events
            .into_iter()
            .map(|(ts, _, message)| {
                InputLogEvent::builder()
                    .timestamp(ts)
                    .message(message)
                    .build()
                    .map_err(|e| format!("building a log event: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(PutRequest {
            group,
            stream,
            events,
            order,
        })
    }

    async fn send(&self, r: &PutRequest) -> Response {
        let first = self.put(r).await;
        let outcome = match first {
            Err((what, true)) if what == "missing" => {
                if !self.create_missing {
                    return Response::Rejected {
                        reason: format!(
                            "the log group {} or its stream {} does not exist (create_missing is off)",
                            r.group, r.stream
                        ),
                    };
                }
                match self.create(&r.group, &r.stream).await {
                    Ok(()) => {
                        tracing::info!(group = %r.group, stream = %r.stream, "created the log group and stream");
                        self.put(r).await
                    }
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        match outcome {
            Ok(response) => response,
            Err((reason, true)) => Response::Retry {
                reason: format!("log group {}: {reason}", r.group),
                retry_after: None,
            },
            Err((reason, false)) => Response::Rejected {
                reason: format!("log group {}: {reason}", r.group),
            },
        }
    }
}

#[async_trait]
impl Sink for CloudWatchWriter {
    async fn run(mut self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        let o = &self.options;
        let config = sdk_config(&o.aws).await;
        let client = Client::new(&config);
        let driver = Driver::new(
            CloudWatchService {
                client,
                create_missing: o.create_missing,
                retention_days: o.retention_days,
            },
            self.encoder.take().expect("run once"),
            DriverConfig {
                limits: o.batching.limits(),
                retry: o.retrying.policy(),
                in_flight: o.in_flight,
                on_rejected: o.on_rejected,
                destination: format!("CloudWatch Logs {}", o.group),
            },
        );
        let (group, stream, time) = (self.group.clone(), self.stream.clone(), self.time.clone());
        let driver = driver.partition_by(move |event| {
            let ts = event_time_ms(event, time.as_ref());
            let at = || DateTime::<Utc>::from_timestamp_millis(ts).unwrap_or_default();
            partition_key(
                &group.render_at(event, at),
                &stream.render_at(event, at),
                ts,
            )
        });
        driver.run(cx).await
    }
}

/// `validate --connect`: a group listed by its name (which any valid
/// credentials may do), then its stream.
async fn probe_group(
    client: &Client,
    group: Option<String>,
    stream: Option<String>,
    create: bool,
) -> Vec<logbus_plugin_api::ServiceFinding> {
    use crate::client::probe_finding;
    use logbus_plugin_api::ServiceFinding;
    use logbus_plugin_api::connect::MISSING;
    let prefix = group.clone().unwrap_or_default();
    let listed = client
        .describe_log_groups()
        .log_group_name_prefix(&prefix)
        .limit(50)
        .send()
        .await;
    let groups = match listed {
        Ok(l) => l,
        Err(e) => return vec![probe_finding(&e, "CloudWatch Logs", &[], &["group"], false)],
    };
    let Some(group) = group else {
        return Vec::new();
    };
    let exists = groups
        .log_groups()
        .iter()
        .any(|g| g.log_group_name() == Some(group.as_str()));
    if !exists {
        return match create {
            true => Vec::new(),
            false => vec![ServiceFinding::error(
                MISSING,
                &["group"],
                format!(
                    "log group `{group}` does not exist, and `create_missing: false`: every event would be refused"
                ),
            )],
        };
    }
    let Some(stream) = stream else {
        return Vec::new();
    };
    let streams = client
        .describe_log_streams()
        .log_group_name(&group)
        .log_stream_name_prefix(&stream)
        .limit(50)
        .send()
        .await;
    match streams {
        Err(e) => vec![probe_finding(
            &e,
            "CloudWatch Logs",
            &["ResourceNotFoundException"],
            &["stream"],
            false,
        )],
        Ok(s)
            if create
                || s.log_streams()
                    .iter()
                    .any(|s| s.log_stream_name() == Some(stream.as_str())) =>
        {
            Vec::new()
        }
        Ok(_) => vec![ServiceFinding::error(
            MISSING,
            &["stream"],
            format!(
                "log stream `{stream}` does not exist in `{group}`, and `create_missing: false`: every event would be refused"
            ),
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::Meta;
    use logbus_sink::Service;

    /// A batch never spans two UTC days: the service refuses a request
    /// whose events are more than 24 hours apart.
    #[test]
    fn a_batch_holds_one_utc_day_of_one_stream() {
        let key = |ts| partition_key("g", "s", ts);
        // 2024-12-06T00:00:00Z
        let midnight = 1_733_443_200_000;
        assert_eq!(key(midnight), key(midnight + DAY_MS - 1));
        assert_ne!(key(midnight - 1), key(midnight));
        assert_ne!(key(midnight + DAY_MS - 1), key(midnight + DAY_MS));
        assert_eq!(key(-1), key(-DAY_MS), "before 1970, whole days too");
        assert_ne!(key(-1), key(0));
        assert_ne!(partition_key("g", "s", 0), partition_key("g", "t", 0));
        assert_ne!(partition_key("g", "s", 0), partition_key("h", "s", 0));
    }

    fn request(order: Vec<usize>) -> PutRequest {
        let events = order
            .iter()
            .map(|&i| {
                InputLogEvent::builder()
                    .timestamp(i as i64)
                    .message("m")
                    .build()
                    .unwrap()
            })
            .collect();
        PutRequest {
            group: "g".into(),
            stream: "s".into(),
            events,
            order,
        }
    }

    /// Each event's outcome as a letter: delivered, too old, expired, too new.
    fn letters(items: &[ItemResult]) -> String {
        items
            .iter()
            .map(|item| match item {
                ItemResult::Delivered => 'd',
                ItemResult::Rejected(why) if why.contains("too old") => 'o',
                ItemResult::Rejected(why) if why.contains("expired") => 'x',
                ItemResult::Rejected(why) if why.contains("too new") => 'n',
                other => panic!("{other:?}"),
            })
            .collect()
    }

    /// The service names the refused events by index ranges of the sorted
    /// request (the last too old one, the last expired one, the first too
    /// new one); each maps back to its place in the batch, the reason names
    /// the group and the stream, and indices outside the request (which no
    /// answer should hold) cover what is inside.
    #[test]
    fn refused_ranges_map_back_to_the_batch() {
        use aws_sdk_cloudwatchlogs::types::RejectedLogEventsInfo as Info;
        // Sorted position k holds batch event order[k].
        let r = request(vec![2, 0, 4, 1, 3]);
        let outcomes = |info: Info| letters(&r.outcomes(&info));
        let info = Info::builder()
            .too_old_log_event_end_index(1)
            .too_new_log_event_start_index(4)
            .build();
        assert_eq!(outcomes(info), "odond");
        let info = Info::builder()
            .expired_log_event_end_index(0)
            .too_new_log_event_start_index(3)
            .build();
        assert_eq!(outcomes(info), "dnxnd");
        let info = Info::builder()
            .too_old_log_event_end_index(0)
            .expired_log_event_end_index(2)
            .build();
        assert_eq!(outcomes(info), "xdxdx", "expired is marked after too old");
        let info = Info::builder()
            .too_old_log_event_end_index(99)
            .too_new_log_event_start_index(99)
            .build();
        assert_eq!(outcomes(info), "ooooo");
        let info = Info::builder()
            .too_old_log_event_end_index(-1)
            .expired_log_event_end_index(-7)
            .build();
        assert_eq!(outcomes(info), "ddddd");
        let info = Info::builder().too_new_log_event_start_index(-2).build();
        assert_eq!(outcomes(info), "nnnnn");
        assert_eq!(outcomes(Info::builder().build()), "ddddd");
        let ItemResult::Rejected(why) =
            &r.outcomes(&Info::builder().too_old_log_event_end_index(0).build())[2]
        else {
            panic!("the first sorted event is the batch's third");
        };
        assert_eq!(
            why,
            "CloudWatch Logs refused the event: too old (more than 14 days before now, or before the group's retention) (log group g, stream s)"
        );
    }

    /// Two requests for a new stream may both find it missing and both
    /// create it: whichever comes second finds the group, then the stream,
    /// there already, and goes on.
    #[ignore = "needs a CloudWatch Logs server (.ci/services up cloudwatch); run with --include-ignored"]
    #[tokio::test]
    async fn creating_a_group_and_stream_that_exist_is_not_an_error() {
        let url = std::env::var("LOGBUS_CLOUDWATCH_ENDPOINT")
            .unwrap_or_else(|_| "http://127.0.0.1:4566".into());
        let aws = AwsOptions {
            endpoint: Some(url.clone()),
            region: Some("us-east-1".into()),
            access_key_id: Some("test".into()),
            secret_access_key: Some("test".into()),
            ..AwsOptions::default()
        };
        let service = CloudWatchService {
            client: Client::new(&sdk_config(&aws).await),
            create_missing: true,
            retention_days: None,
        };
        let group = format!(
            "twice-{}-{}",
            std::process::id(),
            logbus_plugin_api::now_ns()
        );
        let first = service.create(&group, "a").await;
        assert_eq!(first, Ok(()), "is a CloudWatch Logs server at {url}?");
        assert_eq!(
            service.create(&group, "b").await,
            Ok(()),
            "the group exists"
        );
        assert_eq!(service.create(&group, "b").await, Ok(()), "both exist");
    }

    #[test]
    fn an_item_is_as_long_as_the_service_counts_it() {
        let e = Event::raw("hello", Meta::now("t".into()));
        let mut out = Vec::new();
        LogEventEncoder { time: None }.encode(&e, &mut out).unwrap();
        assert_eq!(out.len(), EVENT_OVERHEAD + 5);
        assert_eq!(&out[EVENT_OVERHEAD..], b"hello");
    }

    #[test]
    fn a_message_that_is_not_utf8_is_refused_naming_why() {
        let e = Event::raw(vec![0xff, 0xfe], Meta::now("t".into()));
        let err = LogEventEncoder { time: None }
            .encode(&e, &mut Vec::new())
            .unwrap_err();
        assert!(err.contains("UTF-8"), "{err}");
    }

    /// The batcher, with the sink's default limits, never makes a request
    /// the service would refuse: 10,000 events at most, and 1,048,576
    /// bytes counting 26 per event.
    #[test]
    fn a_request_holds_at_most_what_the_service_takes() {
        use logbus_sink::{Batcher, Framing};
        let o: CloudWatchLogsOptions =
            serde_json::from_value(serde_json::json!({"group": "g", "stream": "s"})).unwrap();
        let encoder = LogEventEncoder { time: None };
        for (events, size) in [(10_001usize, 10usize), (2_000, 1_000)] {
            let mut batcher = Batcher::new(o.batching.limits(), Framing::CONCAT);
            let mut sealed = std::collections::VecDeque::new();
            for _ in 0..events {
                let e = Event::raw("x".repeat(size), Meta::now("t".into()));
                assert!(
                    batcher
                        .push(
                            "k",
                            e,
                            0,
                            &encoder,
                            tokio::time::Instant::now(),
                            &mut sealed
                        )
                        .is_ok()
                );
            }
            batcher.seal_all(&mut sealed);
            let counted: Vec<(usize, usize)> = sealed
                .iter()
                .map(|b| (b.len(), (0..b.len()).map(|i| b.item(i).len()).sum()))
                .collect();
            assert_eq!(counted.iter().map(|(n, _)| n).sum::<usize>(), events);
            for (n, bytes) in &counted {
                assert!(*n <= MAX_EVENTS && *bytes <= MAX_BYTES, "{counted:?}");
                assert_eq!(*bytes, n * (size + EVENT_OVERHEAD));
            }
            assert!(counted.len() >= 2, "{counted:?}");
        }
    }

    #[tokio::test]
    async fn a_request_is_sorted_by_time_and_remembers_each_event_s_place() {
        use logbus_sink::{BatchLimits, Batcher, Framing};
        let encoder = LogEventEncoder {
            time: Some(FieldPath::parse("t").unwrap()),
        };
        let mut batcher = Batcher::new(BatchLimits::default(), Framing::CONCAT);
        let mut sealed = std::collections::VecDeque::new();
        let key = format!("g{SEP}s{SEP}0");
        for t in [3000, 1000, 2000] {
            let v = serde_json::json!({"t": t});
            let e = Event::fields(v.as_object().unwrap().clone(), Meta::now("t".into()));
            assert!(
                batcher
                    .push(
                        &key,
                        e,
                        0,
                        &encoder,
                        tokio::time::Instant::now(),
                        &mut sealed
                    )
                    .is_ok()
            );
        }
        batcher.seal_all(&mut sealed);
        let batch = sealed.pop_front().unwrap();
        let config = aws_sdk_cloudwatchlogs::Config::builder()
            .behavior_version(aws_sdk_cloudwatchlogs::config::BehaviorVersion::latest())
            .build();
        let service = CloudWatchService {
            client: Client::from_conf(config),
            create_missing: true,
            retention_days: None,
        };
        let r = service.prepare(&batch).unwrap();
        assert_eq!((r.group.as_str(), r.stream.as_str()), ("g", "s"));
        let times: Vec<i64> = r.events.iter().map(|e| e.timestamp()).collect();
        assert_eq!(times, [1_000_000, 2_000_000, 3_000_000]);
        assert_eq!(r.order, [1, 2, 0]);
    }
}
