//! `sink: kafka` — a producer on the sink core (`logbus-sink`). The core
//! batches, keeps several batches in flight, retries and dead-letters;
//! this module says how a batch becomes Kafka messages and how each
//! message's delivery report becomes that event's outcome. An event is
//! committed (and acknowledged to its source) only once the broker
//! confirmed it with the configured `acks` (all replicas by default,
//! idempotent producer): librdkafka batches and compresses underneath.
//!
//! Delivery reports are per message, so a batch can end mixed: delivered
//! messages are committed, retryable failures (a timed-out message, a
//! full local queue, a broker gone) are sent again by the core, and
//! permanent ones (larger than the broker takes, a topic that does not
//! exist, not authorised) go to `<id>.dead` with the reason.
//!
//! librdkafka can stay stuck after a broker restart: every message times
//! out locally while a fresh client would be served (seen here with a
//! single KRaft broker restarted under load, and reported upstream for
//! clusters). So a producer that delivered nothing for
//! `replace_stuck_after_ms` while its messages kept timing out is replaced
//! by a new one built from the same settings; the core sends the timed-out
//! messages again through it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, OptionError, Sink, SinkContext, StageError, StageKind,
    TypedPlugin, async_trait,
};
use logbus_sink::{
    Batch, BatchDefaults, Batching, Driver, DriverConfig, Encoder, ItemResult, OnRejected,
    Response, RetryDefaults, Retrying, Service, Template, write_json_or_raw,
};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use serde::Deserialize;
use serde_json::Value;

use crate::client::{
    KafkaTls, ReportingContext, Reports, STATISTICS_INTERVAL_MS, Sasl, apply_security,
    bootstrap_servers, check_connection, give_brokers_if_due,
};

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum KafkaCompression {
    #[default]
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl KafkaCompression {
    fn name(self) -> &'static str {
        match self {
            KafkaCompression::None => "none",
            KafkaCompression::Gzip => "gzip",
            KafkaCompression::Snappy => "snappy",
            KafkaCompression::Lz4 => "lz4",
            KafkaCompression::Zstd => "zstd",
        }
    }
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
pub enum Acks {
    /// Every in-sync replica has the message (with the idempotent
    /// producer: no duplicates from the producer's own retries).
    #[default]
    #[serde(rename = "all")]
    All,
    /// The partition leader has it.
    #[serde(rename = "1")]
    Leader,
}

/// Options of `sink: kafka`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkOptions {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The topic; `{{field}}` takes it from the event.
    pub topic: String,
    /// The message key; `{{field}}` takes it from the event. No key: the
    /// producer spreads messages over the partitions.
    #[serde(default)]
    pub key: Option<String>,
    /// Fields sent as message headers (name = field path; the value as
    /// text, or JSON for non-strings). Missing fields are left out.
    #[serde(default)]
    pub headers: Vec<String>,
    /// `none` (default), `gzip`, `snappy`, `lz4` or `zstd`.
    #[serde(default)]
    pub compression: KafkaCompression,
    /// `all` (default, with the idempotent producer) or `1`.
    #[serde(default)]
    pub acks: Acks,
    /// How long librdkafka waits to fill a batch, ms.
    #[serde(default = "default_linger")]
    #[schemars(range(max = 60000))]
    pub linger_ms: u64,
    /// How long one message may take to be delivered (librdkafka retries
    /// within it); past it, the sink core retries the message.
    #[serde(default = "default_message_timeout")]
    #[schemars(range(min = 1))]
    pub message_timeout_ms: u64,
    /// A producer that delivered nothing for this long, ms, while its
    /// messages kept timing out is replaced by a fresh one (librdkafka can
    /// stay stuck after a broker restart). `0`: never.
    #[serde(default = "default_replace_stuck_after")]
    pub replace_stuck_after_ms: u64,
    /// The broker's largest message; larger ones go to `<id>.dead`
    /// without being sent.
    #[serde(default = "default_max_message")]
    #[schemars(range(min = 1000, max = 1000000000))]
    pub max_message_bytes: usize,
    #[serde(flatten)]
    pub batching: Batching<KafkaDefaults>,
    /// Batches waiting for delivery reports at once.
    #[serde(default = "default_in_flight")]
    #[schemars(range(min = 1, max = 64))]
    pub in_flight: usize,
    #[serde(flatten)]
    pub retrying: Retrying<KafkaDefaults>,
    /// Without a stage reading `<id>.dead`: `fail` (default) or `drop`.
    #[serde(default)]
    pub on_rejected: OnRejected,
    #[serde(default)]
    pub tls: Option<KafkaTls>,
    #[serde(default)]
    pub sasl: Option<Sasl>,
    /// Further librdkafka producer properties, as librdkafka names them
    /// (they override the ones above).
    #[serde(default)]
    pub librdkafka: BTreeMap<String, String>,
}

/// `sink: kafka`'s own batch and retry defaults.
pub struct KafkaDefaults;

impl BatchDefaults for KafkaDefaults {
    const BATCH_MAX_EVENTS: usize = 1000;
    // Messages go one by one to librdkafka, which batches for the wire
    // itself: here the bytes bound a batch's memory, not a request body.
    const BATCH_MAX_BYTES: usize = 64 << 20;
    const BATCH_TIMEOUT_MS: u64 = 50;
}

impl RetryDefaults for KafkaDefaults {
    const RETRY_INITIAL_BACKOFF_MS: u64 = 100;
    const RETRY_MAX_BACKOFF_MS: u64 = 10_000;
}

fn default_linger() -> u64 {
    5
}
fn default_message_timeout() -> u64 {
    30_000
}
fn default_replace_stuck_after() -> u64 {
    60_000
}
fn default_max_message() -> usize {
    1_000_000
}
fn default_in_flight() -> usize {
    16
}

impl CheckOptions for KafkaSinkOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        errors.extend(check_connection(&self.brokers, self.tls.as_ref()));
        for (name, text) in [("topic", Some(&self.topic)), ("key", self.key.as_ref())] {
            if let Some(text) = text {
                if let Err(e) = Template::parse(text) {
                    errors.push(OptionError::at(&[name], e));
                } else if text.is_empty() {
                    errors.push(OptionError::at(&[name], "must not be empty"));
                }
            }
        }
        for (i, h) in self.headers.iter().enumerate() {
            if logbus_plugin_api::FieldPath::parse(h).is_err() {
                errors.push(OptionError::at(
                    &["headers", &i.to_string()],
                    format!("`{h}` is not a field path"),
                ));
            }
        }
        if self.message_timeout_ms == 0 {
            errors.push(OptionError::at(
                &["message_timeout_ms"],
                "must be at least 1",
            ));
        }
        if !(1000..=1_000_000_000).contains(&self.max_message_bytes) {
            errors.push(OptionError::at(
                &["max_message_bytes"],
                "must be between 1000 and 1000000000",
            ));
        }
        if !(1..=64).contains(&self.in_flight) {
            errors.push(OptionError::at(&["in_flight"], "must be between 1 and 64"));
        }
        errors.extend(self.batching.check());
        errors.extend(self.retrying.check());
        errors
    }
}

pub struct KafkaSink;

impl KafkaSinkOptions {
    /// The producer's librdkafka properties.
    fn client_config(&self, cx: &BuildContext) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("compression.type", self.compression.name())
            .set("linger.ms", self.linger_ms.to_string())
            .set("message.timeout.ms", self.message_timeout_ms.to_string())
            .set("message.max.bytes", self.max_message_bytes.to_string())
            .set("client.id", format!("logbus-{}", cx.stage_id))
            // The brokers' states, for the watch that gives a producer
            // left without any broker the configured ones again.
            .set("statistics.interval.ms", STATISTICS_INTERVAL_MS.to_string());
        match self.acks {
            Acks::All => c.set("acks", "all").set("enable.idempotence", "true"),
            Acks::Leader => c.set("acks", "1").set("enable.idempotence", "false"),
        };
        apply_security(&mut c, self.tls.as_ref(), self.sasl.as_ref(), cx);
        for (k, v) in &self.librdkafka {
            c.set(k, v);
        }
        c
    }
}

impl KafkaSinkOptions {
    /// The sink core's settings from these options.
    fn driver_config(&self) -> DriverConfig {
        DriverConfig {
            limits: self.batching.limits(),
            retry: self.retrying.policy(),
            in_flight: self.in_flight,
            on_rejected: self.on_rejected,
            destination: format!("kafka {} topic {}", self.brokers, self.topic),
        }
    }
}

impl TypedPlugin for KafkaSink {
    type Options = KafkaSinkOptions;
    const NAME: &'static str = "kafka";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "Kafka producer (librdkafka): topic and key from templates, headers from fields, gzip/snappy/lz4/zstd, idempotent acks=all; commits each event on its delivery report, refused ones to <id>.dead.";

    /// The TLS files librdkafka reads.
    fn host_needs(
        &self,
        o: &Self::Options,
        cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        crate::client::tls_needs(o.tls.as_ref(), cx)
    }

    /// The brokers reached with the stage's security settings; a fixed
    /// topic looked up ([`crate::probe`]).
    fn connect(
        &self,
        o: &KafkaSinkOptions,
        cx: logbus_plugin_api::ConnectContext,
    ) -> Option<logbus_plugin_api::Probe> {
        let topics = match o.topic.contains("{{") {
            true => Vec::new(),
            false => vec![(o.topic.clone(), vec!["topic".to_string()])],
        };
        let spec = crate::probe::ProbeSpec {
            topics,
            reader: false,
            ..crate::probe::ProbeSpec::new(&o.brokers, &o.tls, &o.sasl, &o.librdkafka)
        };
        Some(crate::probe::probe(spec, &cx.build_context(), cx.timeout))
    }

    /// The topic and key templates' fields, and the header fields (a
    /// missing header is left out).
    fn flow(&self, o: &KafkaSinkOptions) -> logbus_plugin_api::Flow {
        use logbus_plugin_api::flow::template_reads;
        use logbus_plugin_api::{FieldRead, Flow, ReadRole};
        let mut reads = template_reads(&o.topic, &["topic"]);
        reads.extend(o.key.iter().flat_map(|k| template_reads(k, &["key"])));
        reads.extend(o.headers.iter().enumerate().map(|(i, h)| {
            FieldRead::new(h.clone(), &["headers", &i.to_string()], ReadRole::Optional)
        }));
        reads.into_iter().fold(Flow::pass(), Flow::read)
    }

    fn build(
        &self,
        options: KafkaSinkOptions,
        cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let topic = Template::parse(&options.topic).map_err(|e| OptionError::at(&["topic"], e))?;
        let key = options
            .key
            .as_deref()
            .map(Template::parse)
            .transpose()
            .map_err(|e| OptionError::at(&["key"], e))?;
        let headers = options
            .headers
            .iter()
            .map(|h| {
                logbus_plugin_api::FieldPath::parse(h)
                    .map(|p| (h.clone(), p))
                    .map_err(|e| OptionError::at(&["headers"], e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let reports = Arc::new(Reports::new(cx.stage_id.clone().into()));
        let producers = Producers::new(
            options.client_config(cx),
            reports.clone(),
            Duration::from_millis(options.replace_stuck_after_ms),
        )
        .map_err(|e| OptionError::at(&["librdkafka"], format!("creating the producer: {e}")))?;
        let config = options.driver_config();
        let service = KafkaService {
            producers,
            topic,
            key,
            headers,
            max_message_bytes: options.max_message_bytes,
        };
        let driver = Driver::new(service, Unframed, config);
        Ok(Box::new(KafkaWriter {
            driver,
            reports,
            brokers: options.brokers,
        }))
    }
}

/// One message per event: structured events as JSON, raw ones as they are.
struct Unframed;

impl Encoder for Unframed {
    fn encode(&self, event: &Event, out: &mut Vec<u8>) -> Result<(), String> {
        write_json_or_raw(event, out)
    }
}

struct KafkaWriter {
    driver: Driver<KafkaService>,
    reports: Arc<Reports>,
    brokers: String,
}

#[async_trait]
impl Sink for KafkaWriter {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        // Wrong credentials or a refused authorisation end the stage with
        // the brokers' reason instead of retrying forever; what it held is
        // settled errored (a checkpointing source sends it again).
        let ran = tokio::select! {
            ran = self.driver.run(cx) => ran,
            why = self.reports.fatal_error() => Err(StageError::Other(format!(
                "Kafka brokers {} refused this producer: {why}",
                self.brokers
            ))),
        };
        // Every batch waited for its delivery reports; this only settles
        // librdkafka's own bookkeeping before the producer is dropped.
        let producer = self.driver.service().producers.current().1;
        let _ = tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(5))).await;
        ran
    }
}

/// The producer in use, and what it takes to replace it.
struct Producers {
    config: ClientConfig,
    /// The configured brokers, given again to a producer that lost them.
    brokers: String,
    reports: Arc<Reports>,
    /// `Duration::ZERO`: never replace.
    stuck_after: Duration,
    /// The producer and its generation (how many replaced it).
    current: RwLock<(u64, FutureProducer<ReportingContext>)>,
    /// When the current producer was made or last delivered a message.
    progress: Mutex<Instant>,
    replaced: AtomicU64,
}

impl Producers {
    fn new(
        config: ClientConfig,
        reports: Arc<Reports>,
        stuck_after: Duration,
    ) -> Result<Self, KafkaError> {
        let producer = config.create_with_context(ReportingContext(reports.clone()))?;
        Ok(Producers {
            brokers: bootstrap_servers(&config),
            config,
            reports,
            stuck_after,
            current: RwLock::new((0, producer)),
            progress: Mutex::new(Instant::now()),
            replaced: AtomicU64::new(0),
        })
    }

    fn current(&self) -> (u64, FutureProducer<ReportingContext>) {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// What a send through generation `generation` came to: some message
    /// delivered, or none delivered and some timed out locally. The
    /// producer is replaced when it made no progress for `stuck_after`.
    fn sent(&self, generation: u64, delivered: bool, timed_out: bool) {
        if delivered {
            // The common case: a read lock, released before the clock's
            // (the replacing path below takes them the other way round).
            let now_current = self.current.read().unwrap_or_else(|p| p.into_inner()).0;
            if now_current == generation {
                *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
            }
            return;
        }
        if !timed_out || self.stuck_after.is_zero() {
            return;
        }
        let mut progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        if current.0 != generation || progress.elapsed() < self.stuck_after {
            return; // sent through a producer already replaced, or not yet stuck
        }
        match self
            .config
            .create_with_context(ReportingContext(self.reports.clone()))
        {
            Ok(fresh) => {
                let stale = std::mem::replace(&mut *current, (generation + 1, fresh)).1;
                *progress = Instant::now();
                self.replaced.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    stage = %self.reports.stage,
                    "the Kafka producer delivered nothing for {:?} while its messages timed out: replaced by a fresh one",
                    self.stuck_after
                );
                // Dropping a producer purges its queues and may wait on
                // its threads: not on a runtime worker.
                drop(tokio::task::spawn_blocking(move || drop(stale)));
            }
            Err(e) => tracing::warn!(
                stage = %self.reports.stage,
                "the Kafka producer looks stuck, and a fresh one could not be made: {e}"
            ),
        }
    }
}

struct KafkaService {
    producers: Producers,
    topic: Template,
    key: Option<Template>,
    headers: Vec<(String, logbus_plugin_api::FieldPath)>,
    max_message_bytes: usize,
}

/// One message, ready to hand to the producer.
struct Message {
    topic: String,
    key: Option<String>,
    payload: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
}

#[async_trait]
impl Service for KafkaService {
    type Request = Vec<Message>;

    fn prepare(&self, batch: &Batch) -> Result<Vec<Message>, String> {
        Ok(batch
            .events()
            .iter()
            .enumerate()
            .map(|(i, event)| Message {
                topic: self.topic.render(event),
                key: self.key.as_ref().map(|k| k.render(event)),
                payload: batch.item(i).to_vec(),
                headers: self.headers_of(event),
            })
            .collect())
    }

    async fn send(&self, messages: &Vec<Message>) -> Response {
        let (generation, producer) = self.producers.current();
        let producers = &self.producers;
        give_brokers_if_due(producer.client(), &producers.reports, &producers.brokers);
        let mut waiting = Vec::with_capacity(messages.len());
        for m in messages {
            if m.payload.len() > self.max_message_bytes {
                waiting.push(Err(ItemResult::Rejected(format!(
                    "a message of {} bytes is larger than max_message_bytes ({})",
                    m.payload.len(),
                    self.max_message_bytes
                ))));
                continue;
            }
            let mut record = FutureRecord::to(&m.topic).payload(&m.payload[..]);
            if let Some(key) = &m.key {
                record = record.key(key.as_str());
            }
            if !m.headers.is_empty() {
                let mut headers = OwnedHeaders::new_with_capacity(m.headers.len());
                for (name, value) in &m.headers {
                    headers = headers.insert(Header {
                        key: name,
                        value: Some(&value[..]),
                    });
                }
                record = record.headers(headers);
            }
            waiting.push(match producer.send_result(record) {
                Ok(delivery) => Ok(delivery),
                Err((e, _)) => Err(outcome(&e, &m.topic)),
            });
        }
        let mut results = Vec::with_capacity(waiting.len());
        let mut timed_out = false;
        for (w, m) in waiting.into_iter().zip(messages) {
            results.push(match w {
                Err(result) => result,
                Ok(delivery) => match delivery.await {
                    Ok(Ok(_)) => ItemResult::Delivered,
                    Ok(Err((e, _))) => {
                        timed_out |=
                            e.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageTimedOut);
                        outcome(&e, &m.topic)
                    }
                    Err(_) => ItemResult::Retry("the producer went away".into()),
                },
            });
        }
        drop(producer);
        let delivered = results.contains(&ItemResult::Delivered);
        self.producers.sent(generation, delivered, timed_out);
        if results.iter().all(|r| *r == ItemResult::Delivered) {
            Response::Delivered
        } else {
            Response::Items(results)
        }
    }
}

impl KafkaService {
    fn headers_of(&self, event: &Event) -> Vec<(String, Vec<u8>)> {
        // Through the event: lazy fields parse only the entries named.
        self.headers
            .iter()
            .filter_map(|(name, path)| {
                let value = match &*event.field(path)? {
                    Value::String(s) => s.clone().into_bytes(),
                    Value::Null => return None,
                    other => other.to_string().into_bytes(),
                };
                Some((name.clone(), value))
            })
            .collect()
    }
}

/// What a failed produce or delivery means for the event.
fn outcome(e: &KafkaError, topic: &str) -> ItemResult {
    use RDKafkaErrorCode as C;
    match e.rdkafka_error_code() {
        Some(
            C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::InvalidRecord
            | C::MessageBatchTooLarge
            | C::InvalidTopic,
        ) => ItemResult::Rejected(format!("kafka refused the message: {e}")),
        Some(C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition) => {
            ItemResult::Rejected(format!("topic `{topic}` does not exist: {e}"))
        }
        Some(C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed) => {
            ItemResult::Rejected(format!("not authorised to write to `{topic}`: {e}"))
        }
        _ => ItemResult::Retry(format!("kafka: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_sink::{BatchLimits, RetryPolicy};

    /// A service whose brokers are not there: every message times out.
    fn unserved(stuck_after: Duration) -> KafkaService {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("message.timeout.ms", "50");
        KafkaService {
            producers: Producers::new(config, Arc::new(Reports::new("k".into())), stuck_after)
                .unwrap(),
            topic: Template::parse("t").unwrap(),
            key: None,
            headers: Vec::new(),
            max_message_bytes: 1000,
        }
    }

    fn one_message() -> Vec<Message> {
        vec![Message {
            topic: "t".into(),
            key: None,
            payload: b"x".to_vec(),
            headers: Vec::new(),
        }]
    }

    fn replaced(service: &KafkaService) -> (u64, u64) {
        let p = &service.producers;
        (p.replaced.load(Ordering::Relaxed), p.current().0)
    }

    /// What a failed produce means: refused for good (the message, a
    /// topic that does not exist, an authorisation) or retried.
    #[test]
    fn each_kind_of_failure_is_refused_or_retried() {
        use RDKafkaErrorCode as C;
        let of = |code| outcome(&KafkaError::MessageProduction(code), "logs");
        let refused = |why: &ItemResult, prefix: &str| matches!(why, ItemResult::Rejected(w) if w.starts_with(prefix));
        let retried = |why: &ItemResult, prefix: &str| matches!(why, ItemResult::Retry(w) if w.starts_with(prefix));
        type Check = fn(&ItemResult, &str) -> bool;
        let cases: [(&[C], Check, &str); 4] = [
            (
                &[
                    C::MessageSizeTooLarge,
                    C::InvalidMessageSize,
                    C::InvalidMessage,
                    C::InvalidRecord,
                    C::MessageBatchTooLarge,
                    C::InvalidTopic,
                ],
                refused,
                "kafka refused the message: ",
            ),
            (
                &[
                    C::UnknownTopicOrPartition,
                    C::UnknownTopic,
                    C::UnknownPartition,
                ],
                refused,
                "topic `logs` does not exist: ",
            ),
            (
                &[C::TopicAuthorizationFailed, C::ClusterAuthorizationFailed],
                refused,
                "not authorised to write to `logs`: ",
            ),
            (
                &[
                    C::MessageTimedOut,
                    C::QueueFull,
                    C::AllBrokersDown,
                    C::NotLeaderForPartition,
                ],
                retried,
                "kafka: ",
            ),
        ];
        for (codes, expected, prefix) in cases {
            for &code in codes {
                assert!(expected(&of(code), prefix), "{code:?}: {:?}", of(code));
            }
        }
    }

    /// A maximum backoff below the initial one is refused, as by every
    /// other sink (it was accepted here once).
    #[test]
    fn a_max_backoff_below_the_initial_one_is_refused() {
        let options: KafkaSinkOptions = serde_json::from_value(serde_json::json!({
            "brokers": "b:9092", "topic": "t",
            "retry_initial_backoff_ms": 5000, "retry_max_backoff_ms": 100,
        }))
        .unwrap();
        let found: Vec<String> = options
            .check()
            .iter()
            .map(|e| format!("{}: {}", e.path.join("."), e.message))
            .collect();
        assert_eq!(
            found,
            ["retry_max_backoff_ms: must not be below `retry_initial_backoff_ms`"]
        );
    }

    /// Every batching, retry and flow option reaches the sink core.
    #[test]
    fn the_options_set_the_sink_core() {
        let options: KafkaSinkOptions = serde_json::from_value(serde_json::json!({
            "brokers": "b:9092", "topic": "t",
            "batch_max_events": 17, "batch_timeout_ms": 23,
            "retry_initial_backoff_ms": 5, "retry_max_backoff_ms": 700, "retry_max_attempts": 9,
            "in_flight": 3, "on_rejected": "drop",
        }))
        .unwrap();
        let config = options.driver_config();
        assert_eq!(
            config.limits,
            BatchLimits {
                max_events: 17,
                max_bytes: 64 << 20,
                max_age: Duration::from_millis(23),
                ..BatchLimits::default()
            }
        );
        assert_ne!(
            BatchLimits::default().max_bytes,
            64 << 20,
            "the test tells them apart"
        );
        assert_eq!(
            config.retry,
            RetryPolicy {
                initial_backoff: Duration::from_millis(5),
                max_backoff: Duration::from_millis(700),
                max_attempts: Some(9),
                max_elapsed: None,
            }
        );
        assert_eq!(config.in_flight, 3);
        assert_eq!(config.on_rejected, OnRejected::Drop);
        assert_eq!(config.destination, "kafka b:9092 topic t");
    }

    /// A message of exactly `max_message_bytes` is sent (here it times
    /// out: no broker); one byte more is refused without being sent.
    #[tokio::test]
    async fn the_message_size_limit_is_inclusive() {
        let service = unserved(Duration::ZERO);
        let sized = |n: usize| {
            vec![Message {
                topic: "t".into(),
                key: None,
                payload: vec![b'x'; n],
                headers: Vec::new(),
            }]
        };
        match service.send(&sized(1000)).await {
            Response::Items(items) => assert!(
                matches!(&items[0], ItemResult::Retry(why) if why.contains("timed out")),
                "{items:?}"
            ),
            other => panic!("{other:?}"),
        }
        match service.send(&sized(1001)).await {
            Response::Items(items) => assert_eq!(
                items,
                [ItemResult::Rejected(
                    "a message of 1001 bytes is larger than max_message_bytes (1000)".into()
                )]
            ),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_producer_whose_messages_keep_timing_out_is_replaced_each_time() {
        let service = unserved(Duration::from_millis(1));
        for round in 1..=3 {
            match service.send(&one_message()).await {
                Response::Items(items) => assert!(
                    matches!(&items[0], ItemResult::Retry(why) if why.contains("timed out")),
                    "{items:?}"
                ),
                other => panic!("{other:?}"),
            }
            assert_eq!(replaced(&service), (round, round));
        }
    }

    #[tokio::test]
    async fn a_producer_is_kept_until_it_made_no_progress_for_the_whole_time_or_when_told_never() {
        for stuck_after in [Duration::ZERO, Duration::from_secs(3600)] {
            let service = unserved(stuck_after);
            for _ in 0..2 {
                service.send(&one_message()).await;
            }
            assert_eq!(replaced(&service), (0, 0), "{stuck_after:?}");
        }
    }

    #[tokio::test]
    async fn only_a_send_through_the_current_producer_that_timed_out_without_a_delivery_counts() {
        let service = unserved(Duration::from_secs(3600));
        let p = &service.producers;
        let stalled_long_ago = || {
            *p.progress.lock().unwrap() = Instant::now()
                .checked_sub(Duration::from_secs(7200))
                .unwrap();
        };
        // A delivery is progress: a timeout right after it is no reason.
        stalled_long_ago();
        p.sent(0, true, false);
        p.sent(0, false, true);
        assert_eq!(replaced(&service), (0, 0));
        // Failed without a timeout (refused, say): not stuck.
        stalled_long_ago();
        p.sent(0, false, false);
        assert_eq!(replaced(&service), (0, 0));
        // Timed out, nothing delivered for longer than the limit: replaced.
        p.sent(0, false, true);
        assert_eq!(replaced(&service), (1, 1));
        // The fresh producer gets the whole time before it is judged.
        p.sent(1, false, true);
        assert_eq!(replaced(&service), (1, 1));
        // A send through the replaced producer says nothing of the new one.
        stalled_long_ago();
        p.sent(0, false, true);
        assert_eq!(replaced(&service), (1, 1));
        p.sent(1, false, true);
        assert_eq!(replaced(&service), (2, 2));
    }
}
