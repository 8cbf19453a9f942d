//! `source: kafka` — a consumer-group member. Several LogBus processes in
//! one group share a topic's partitions: that is how LogBus scales out
//! across machines (docs/deploy.md), with Kafka doing the coordination.
//!
//! Offsets are committed only for events the pipeline has finished: each
//! partition has its own [`OrderedCheckpoint`], every batch sent holds an
//! acknowledgement per partition it carries, and the offset committed for
//! a partition is one past the newest batch that it and every earlier
//! batch of that partition finished. Completion may come in any order
//! (fan-out, workers, retrying sinks); the committed offset never passes
//! an unfinished event, so a crash re-reads and never skips.
//!
//! One thread owns the consumer and polls it: librdkafka runs rebalance
//! callbacks inside `poll`, so the thread keeps polling (with every
//! partition paused) while the pipeline is full, which keeps the group
//! membership alive without reading more. On a revoke, what is finished
//! is committed before the partition goes; what is still in flight is let
//! go, counted as `redelivered` (the new owner reads it again, so it may
//! arrive twice).
//!
//! Memory: librdkafka prefetches at most `fetch_queue_max_kib` for the
//! whole consumer, and a partition with more than
//! `max_in_flight_per_partition` unfinished events is paused until the
//! pipeline catches up, so backpressure reaches the broker.
//!
//! librdkafka keeps a partition's pause across a revoke and a new
//! assignment of the same partition. So every assignment sets each of its
//! partitions to what the source wants at that moment (paused while the
//! pipeline is full, reading otherwise): a partition paused before a
//! rebalance (a broker restarting, a member joining) and given back after
//! it would otherwise never be read again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use logbus_plugin_api::{
    AckReceiver, BatchAck, BuildContext, Bytes, CheckOptions, Event, Fields, Meta, OptionError,
    OrderedCheckpoint, Outcome, Output, Source, SourceContext, StageError, StageKind, TypedPlugin,
    async_trait,
};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::Deserialize;
use serde_json::Value;

use crate::client::{
    KafkaTls, Reports, STATISTICS_INTERVAL_MS, Sasl, apply_security, bootstrap_servers,
    check_connection, give_brokers_if_due,
};

/// Where a group with no committed offset for a partition starts.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// The oldest message the broker still has (nothing already there is
    /// skipped).
    #[default]
    Earliest,
    /// Only messages produced from now on.
    Latest,
}

/// Options of `source: kafka`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceOptions {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The consumer group: processes with the same group share the
    /// partitions, each partition read by one of them.
    pub group_id: String,
    /// Topics to read; an entry starting with `^` is a regular expression
    /// matched against every topic (new matching topics are picked up).
    pub topics: Vec<String>,
    /// Where to start in a partition the group has no offset for:
    /// `earliest` (default) or `latest`.
    #[serde(default)]
    pub start_from: StartFrom,
    /// Messages sent downstream together (one acknowledgement per
    /// partition in the batch).
    #[serde(default = "default_batch_events")]
    #[schemars(range(min = 1, max = 100000))]
    pub batch_max_events: usize,
    /// How often finished offsets are committed, ms (they are also
    /// committed on a revoke and at shutdown).
    #[serde(default = "default_commit_interval")]
    #[schemars(range(min = 10, max = 3600000))]
    pub commit_interval_ms: u64,
    /// A partition with this many unfinished events is paused until the
    /// pipeline has finished half of them.
    #[serde(default = "default_in_flight")]
    #[schemars(range(min = 1))]
    pub max_in_flight_per_partition: u64,
    /// The most librdkafka prefetches for this consumer, KiB
    /// (`queued.max.messages.kbytes`).
    #[serde(default = "default_queue_kib")]
    #[schemars(range(min = 1, max = 2097151))]
    pub fetch_queue_max_kib: u64,
    /// The most one fetch asks a partition for, bytes
    /// (`max.partition.fetch.bytes`).
    #[serde(default = "default_partition_fetch")]
    #[schemars(range(min = 1024))]
    pub max_partition_fetch_bytes: u64,
    /// How long the group waits for a silent member before giving its
    /// partitions to others, ms.
    #[serde(default = "default_session_timeout")]
    #[schemars(range(min = 1000, max = 3600000))]
    pub session_timeout_ms: u64,
    /// How long a stopping source waits for its in-flight events to finish
    /// before committing what finished, ms.
    #[serde(default = "default_drain")]
    pub drain_timeout_ms: u64,
    #[serde(default)]
    pub tls: Option<KafkaTls>,
    #[serde(default)]
    pub sasl: Option<Sasl>,
    /// Further librdkafka consumer properties, as librdkafka names them
    /// (they override the ones above).
    #[serde(default)]
    pub librdkafka: BTreeMap<String, String>,
}

fn default_batch_events() -> usize {
    1000
}
fn default_commit_interval() -> u64 {
    1000
}
fn default_in_flight() -> u64 {
    100_000
}
fn default_queue_kib() -> u64 {
    16 * 1024
}
fn default_partition_fetch() -> u64 {
    1 << 20
}
fn default_session_timeout() -> u64 {
    10_000
}
fn default_drain() -> u64 {
    30_000
}

impl CheckOptions for KafkaSourceOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = check_connection(&self.brokers, self.tls.as_ref());
        if self.group_id.trim().is_empty() {
            errors.push(OptionError::at(&["group_id"], "must not be empty"));
        }
        if self.topics.is_empty() {
            errors.push(OptionError::at(&["topics"], "name at least one topic"));
        }
        for (i, t) in self.topics.iter().enumerate() {
            let at = ["topics".to_string(), i.to_string()];
            let at: Vec<&str> = at.iter().map(String::as_str).collect();
            if let Some(pattern) = t.strip_prefix('^') {
                if let Err(e) = regex::Regex::new(pattern) {
                    errors.push(OptionError::at(
                        &at,
                        format!("`{t}` is not a regular expression: {e}"),
                    ));
                }
            } else if t.is_empty()
                || t.len() > 249
                || !t
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            {
                errors.push(OptionError::at(
                    &at,
                    format!(
                        "`{t}` is not a topic name (1-249 of letters, digits, `.`, `_`, `-`; start with `^` for a pattern)"
                    ),
                ));
            }
        }
        if !(1..=100_000).contains(&self.batch_max_events) {
            errors.push(OptionError::at(
                &["batch_max_events"],
                "must be between 1 and 100000",
            ));
        }
        if !(10..=3_600_000).contains(&self.commit_interval_ms) {
            errors.push(OptionError::at(
                &["commit_interval_ms"],
                "must be between 10 and 3600000",
            ));
        }
        if self.max_in_flight_per_partition == 0 {
            errors.push(OptionError::at(
                &["max_in_flight_per_partition"],
                "must be at least 1",
            ));
        }
        if !(1..=2_097_151).contains(&self.fetch_queue_max_kib) {
            errors.push(OptionError::at(
                &["fetch_queue_max_kib"],
                "must be between 1 and 2097151",
            ));
        }
        if self.max_partition_fetch_bytes < 1024 {
            errors.push(OptionError::at(
                &["max_partition_fetch_bytes"],
                "must be at least 1024",
            ));
        }
        if !(1000..=3_600_000).contains(&self.session_timeout_ms) {
            errors.push(OptionError::at(
                &["session_timeout_ms"],
                "must be between 1000 and 3600000",
            ));
        }
        errors
    }
}

pub struct KafkaSource;

impl TypedPlugin for KafkaSource {
    type Options = KafkaSourceOptions;
    const NAME: &'static str = "kafka";
    const KIND: StageKind = StageKind::Source;

    type Stage = Box<dyn Source>;
    const ACKNOWLEDGEMENTS: Option<&'static str> = Some(
        "end to end: each partition's committed offset never passes an event the sinks have not confirmed, so a restart or a rebalance re-reads, never skips",
    );
    const DESCRIPTION: &'static str = "Kafka consumer-group member (librdkafka): topics by name or pattern, offsets committed only for finished events, rebalances, bounded prefetch; topic, partition, offset, key, headers and timestamp as attributes.";

    /// The TLS files librdkafka reads.
    fn host_needs(
        &self,
        o: &Self::Options,
        cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        crate::client::tls_needs(o.tls.as_ref(), cx)
    }

    /// Raw events (one per line or message); a `codec:` parses them.
    /// The brokers reached with the stage's security settings; each topic
    /// named (not a pattern) looked up ([`crate::probe`]).
    fn connect(
        &self,
        o: &KafkaSourceOptions,
        cx: logbus_plugin_api::ConnectContext,
    ) -> Option<logbus_plugin_api::Probe> {
        let topics = o
            .topics
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.starts_with('^'))
            .map(|(i, t)| (t.clone(), vec!["topics".to_string(), i.to_string()]))
            .collect();
        let spec = crate::probe::ProbeSpec {
            topics,
            reader: true,
            ..crate::probe::ProbeSpec::new(&o.brokers, &o.tls, &o.sasl, &o.librdkafka)
        };
        Some(crate::probe::probe(spec, &cx.build_context(), cx.timeout))
    }

    fn flow(&self, _options: &KafkaSourceOptions) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::raw()
    }

    fn build(
        &self,
        options: KafkaSourceOptions,
        cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let config = options.client_config(cx);
        Ok(Box::new(KafkaConsumerSource {
            brokers: bootstrap_servers(&config),
            config,
            topics: options.topics,
            batch_max_events: options.batch_max_events,
            commit_interval: Duration::from_millis(options.commit_interval_ms),
            max_in_flight: options.max_in_flight_per_partition,
            drain: Duration::from_millis(options.drain_timeout_ms),
        }))
    }
}

impl KafkaSourceOptions {
    /// The consumer's librdkafka properties.
    fn client_config(&self, cx: &BuildContext) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", &self.group_id)
            .set("client.id", format!("logbus-{}", cx.stage_id))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set(
                "auto.offset.reset",
                match self.start_from {
                    StartFrom::Earliest => "earliest",
                    StartFrom::Latest => "latest",
                },
            )
            .set(
                "queued.max.messages.kbytes",
                self.fetch_queue_max_kib.to_string(),
            )
            .set(
                "max.partition.fetch.bytes",
                self.max_partition_fetch_bytes.to_string(),
            )
            // Once the prefetch queue is full, librdkafka waits this long
            // before fetching again (1 s by default): a pipeline that
            // drains the queue in less would idle in one-second steps
            // (measured: 25k events/s instead of 140k+).
            .set("fetch.queue.backoff.ms", "10")
            // A topic that does not exist yet (or a new one matching a
            // pattern) is found at the next metadata refresh: 10 s, not
            // librdkafka's 5 minutes.
            .set("topic.metadata.refresh.interval.ms", "10000")
            .set("session.timeout.ms", self.session_timeout_ms.to_string())
            .set(
                "heartbeat.interval.ms",
                (self.session_timeout_ms / 4).max(250).to_string(),
            )
            // The brokers' states, for the watch that gives a consumer
            // left without any broker the configured ones again.
            .set("statistics.interval.ms", STATISTICS_INTERVAL_MS.to_string());
        apply_security(&mut config, self.tls.as_ref(), self.sasl.as_ref(), cx);
        for (k, v) in &self.librdkafka {
            config.set(k, v);
        }
        config
    }
}

struct KafkaConsumerSource {
    config: ClientConfig,
    brokers: String,
    topics: Vec<String>,
    batch_max_events: usize,
    commit_interval: Duration,
    max_in_flight: u64,
    drain: Duration,
}

/// One assigned partition: its checkpoint (what the acknowledgements
/// report to) and what was last committed.
struct Track {
    checkpoint: Mutex<OrderedCheckpoint<i64>>,
    /// Events sent downstream.
    sent: AtomicU64,
    /// The offset last committed (the next one to read), -1: none yet.
    committed: Mutex<i64>,
}

impl Track {
    fn new() -> Self {
        Track {
            checkpoint: Mutex::new(OrderedCheckpoint::new()),
            sent: AtomicU64::new(0),
            committed: Mutex::new(-1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OrderedCheckpoint<i64>> {
        self.checkpoint.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Events sent and not finished.
    fn unfinished(&self) -> u64 {
        let c = self.lock().counts();
        self.sent
            .load(Ordering::Relaxed)
            .saturating_sub(c.delivered + c.rejected + c.errored)
    }

    /// The offset to commit when it moved since the last commit.
    fn to_commit(&self) -> Option<i64> {
        let next = self.lock().committed().map(|o| o + 1)?;
        let last = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        (next > *last).then_some(next)
    }

    /// For a revoke: the offset to commit, the events still unfinished
    /// and the counts, read under one lock so an event finishing meanwhile
    /// is either committed or counted unfinished, never neither.
    fn release(&self) -> (Option<i64>, u64, logbus_plugin_api::AckCounts) {
        let checkpoint = self.lock();
        let c = checkpoint.counts();
        let unfinished = self
            .sent
            .load(Ordering::Relaxed)
            .saturating_sub(c.delivered + c.rejected + c.errored);
        let next = checkpoint.committed().map(|o| o + 1);
        let last = *self.committed.lock().unwrap_or_else(|p| p.into_inner());
        (next.filter(|n| *n > last), unfinished, c)
    }

    fn committed_at(&self, next: i64) {
        let mut last = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        *last = (*last).max(next);
    }
}

impl AckReceiver for Track {
    fn finished(&self, token: u64, outcome: Outcome) {
        self.lock().finish(token, outcome);
    }
}

type PartitionKey = (Arc<str>, i32);

/// What the consumer thread and librdkafka's callbacks (which run on it,
/// inside `poll`) share.
struct Shared {
    stage: Arc<str>,
    tracks: Mutex<HashMap<PartitionKey, Arc<Track>>>,
    /// Acknowledgement counts of partitions no longer assigned.
    gone: Mutex<logbus_plugin_api::AckCounts>,
    redelivered: AtomicU64,
    /// Partitions paused because too many of their events are unfinished.
    paused: Mutex<HashSet<PartitionKey>>,
    /// Every partition is paused: the pipeline is full.
    full: AtomicBool,
    /// librdkafka's reports, an error retrying cannot fix (the brokers
    /// refused our credentials), and whether the consumer has been without
    /// any broker for a while.
    reports: Reports,
}

impl Shared {
    fn new(stage: Arc<str>, reports: Reports) -> Self {
        Shared {
            stage,
            reports,
            tracks: Mutex::default(),
            gone: Mutex::default(),
            redelivered: AtomicU64::new(0),
            paused: Mutex::default(),
            full: AtomicBool::new(false),
        }
    }

    fn tracks(&self) -> std::sync::MutexGuard<'_, HashMap<PartitionKey, Arc<Track>>> {
        self.tracks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn paused(&self) -> std::sync::MutexGuard<'_, HashSet<PartitionKey>> {
        self.paused.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Commits what each track finished. (A revoke commits its partitions
    /// itself, with `Track::release`.)
    fn commit(&self, consumer: &BaseConsumer<GroupContext>, mode: CommitMode) {
        let mut list = TopicPartitionList::new();
        let mut moved = Vec::new();
        for (key, track) in self.tracks().iter() {
            if let Some(next) = track.to_commit()
                && list
                    .add_partition_offset(&key.0, key.1, Offset::Offset(next))
                    .is_ok()
            {
                moved.push((track.clone(), next));
            }
        }
        if moved.is_empty() {
            return;
        }
        match consumer.commit(&list, mode) {
            Ok(()) => {
                for (track, next) in moved {
                    track.committed_at(next);
                }
            }
            Err(e) => {
                tracing::warn!(stage = %self.stage, "committing offsets failed (retried at the next commit): {e}")
            }
        }
    }

    fn publish(&self, metrics: &logbus_plugin_api::StageMetrics) {
        let mut counts = *self.gone.lock().unwrap_or_else(|p| p.into_inner());
        let mut oldest: Option<Instant> = None;
        for track in self.tracks().values() {
            let c = track.lock();
            let t = c.counts();
            counts.delivered += t.delivered;
            counts.rejected += t.rejected;
            counts.errored += t.errored;
            if let Some(o) = c.oldest_open() {
                oldest = Some(oldest.map_or(o, |x| x.min(o)));
            }
        }
        let oldest = oldest.map(|o| SystemTime::now() - o.elapsed());
        metrics.set_acks(counts, oldest);
    }
}

/// librdkafka's callbacks: rebalances, errors and its log, in our log.
struct GroupContext {
    shared: Arc<Shared>,
}

impl ClientContext for GroupContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        self.shared.reports.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.shared.reports.error(error, reason);
    }

    fn stats_raw(&self, report: &[u8]) {
        self.shared.reports.watch.observe(report, Instant::now());
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(list) = rebalance else {
            return;
        };
        let keys: Vec<PartitionKey> = list
            .elements()
            .iter()
            .map(|e| (Arc::from(e.topic()), e.partition()))
            .collect();
        // Stop tracking first (nothing else commits for these partitions
        // from now on), then commit what is finished while the partitions
        // are still ours.
        let mut let_go = 0;
        let mut list = TopicPartitionList::new();
        let released: Vec<(&PartitionKey, Arc<Track>)> = {
            let mut paused = self.shared.paused();
            for k in &keys {
                paused.remove(k);
            }
            let mut tracks = self.shared.tracks();
            keys.iter()
                .filter_map(|k| tracks.remove(k).map(|t| (k, t)))
                .collect()
        };
        for (key, track) in released {
            let (next, unfinished, c) = track.release();
            let_go += unfinished;
            if let Some(next) = next {
                let _ = list.add_partition_offset(&key.0, key.1, Offset::Offset(next));
            }
            let mut gone = self.shared.gone.lock().unwrap_or_else(|p| p.into_inner());
            gone.delivered += c.delivered;
            gone.rejected += c.rejected;
            gone.errored += c.errored;
        }
        if list.count() > 0
            && let Err(e) = consumer.commit(&list, CommitMode::Sync)
        {
            tracing::warn!(stage = %self.shared.stage, "committing the revoked partitions' offsets failed (the next owner re-reads from the last commit): {e}");
        }
        self.shared.redelivered.fetch_add(let_go, Ordering::Relaxed);
        tracing::info!(
            stage = %self.shared.stage,
            partitions = keys.len(),
            "partitions revoked; {let_go} events still in flight may be read again by the next owner"
        );
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(list) => {
                {
                    let mut tracks = self.shared.tracks();
                    let mut paused = self.shared.paused();
                    for e in list.elements() {
                        let key = (Arc::from(e.topic()), e.partition());
                        // A new track has nothing unfinished.
                        paused.remove(&key);
                        tracks.entry(key).or_insert_with(|| Arc::new(Track::new()));
                    }
                }
                // Whatever pause librdkafka kept from before the revoke.
                let set = if self.shared.full.load(Ordering::Relaxed) {
                    consumer.pause(list)
                } else {
                    consumer.resume(list)
                };
                if let Err(e) = set {
                    tracing::warn!(stage = %self.shared.stage, "cannot pause or resume the assigned partitions: {e}");
                }
                tracing::info!(stage = %self.shared.stage, partitions = list.count(), "partitions assigned");
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => {
                tracing::warn!(stage = %self.shared.stage, "rebalance failed: {e}")
            }
        }
    }
}

/// A message taken from the consumer, not yet sent downstream.
struct Polled {
    key: PartitionKey,
    offset: i64,
    payload: Bytes,
    attributes: Arc<Fields>,
}

/// The consumer thread's state.
struct Reader<'a> {
    id: Arc<str>,
    /// The configured brokers, given again to a consumer that lost them.
    brokers: &'a str,
    consumer: BaseConsumer<GroupContext>,
    shared: Arc<Shared>,
    handle: &'a tokio::runtime::Handle,
    topics: HashMap<String, Arc<str>>,
    max_in_flight: u64,
    commit_interval: Duration,
    last_commit: Instant,
    /// Each consumption error is logged once a minute at most.
    warned: HashMap<String, Instant>,
}

impl KafkaConsumerSource {
    fn consume(self, handle: &tokio::runtime::Handle, cx: SourceContext) -> Result<(), StageError> {
        let shared = Arc::new(Shared::new(cx.id.clone(), Reports::new(cx.id.clone())));
        let consumer: BaseConsumer<GroupContext> = self
            .config
            .create_with_context(GroupContext {
                shared: shared.clone(),
            })
            .map_err(|e| StageError::Other(format!("cannot create a Kafka consumer: {e}")))?;
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics).map_err(|e| {
            StageError::Other(format!(
                "cannot subscribe to {}: {e}",
                self.topics.join(", ")
            ))
        })?;
        let mut reader = Reader {
            id: cx.id.clone(),
            brokers: &self.brokers,
            consumer,
            shared,
            handle,
            topics: HashMap::new(),
            max_in_flight: self.max_in_flight,
            commit_interval: self.commit_interval,
            last_commit: Instant::now(),
            warned: HashMap::new(),
        };
        let metrics = cx.output.metrics().clone();
        let mut carried: Vec<Polled> = Vec::new();
        let outcome = loop {
            if let Some(fatal) = reader.fatal() {
                break Err(StageError::Other(format!(
                    "Kafka brokers {} refused this consumer: {fatal}",
                    self.brokers
                )));
            }
            if cx.shutdown.is_cancelled() {
                break Ok(());
            }
            let mut batch = std::mem::take(&mut carried);
            let wait = if batch.is_empty() {
                Duration::from_millis(100)
            } else {
                Duration::ZERO
            };
            reader.poll_into(&mut batch, self.batch_max_events, wait);
            if !batch.is_empty() {
                match reader.send(batch, &cx.output) {
                    Ok(rest) => carried = rest,
                    Err(e) => break Err(e),
                }
            }
            reader.maintain(&metrics);
        };
        // Let downstream drain (its input ends once this output is gone),
        // keep the group membership while waiting, then commit.
        drop(cx.output);
        let deadline = Instant::now() + self.drain;
        while Instant::now() < deadline && reader.worth_waiting() {
            let _ = reader.consumer.poll(Duration::from_millis(5));
            reader.maintain(&metrics);
        }
        reader.shared.commit(&reader.consumer, CommitMode::Sync);
        reader.shared.publish(&metrics);
        let open: u64 = reader
            .shared
            .tracks()
            .values()
            .map(|t| t.unfinished())
            .sum();
        if open > 0 {
            tracing::warn!(
                stage = %reader.id,
                "{open} events were not finished; their offsets stay uncommitted and the group reads them again"
            );
        }
        metrics.add_redelivered(reader.shared.redelivered.swap(0, Ordering::Relaxed));
        reader.consumer.unsubscribe();
        let Reader { consumer, id, .. } = reader;
        close_within(consumer, &id, CLOSE_WAIT);
        outcome
    }
}

/// How long a stopping source waits for its consumer to close.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Drops (closes) the consumer, waiting at most `wait`. librdkafka's close
/// waits until the group coordinator lets the consumer go, and after a
/// broker restart it was seen to wait forever (a CI run hung in the drop,
/// polling), which hung the whole stop. The offsets are committed by then;
/// a consumer still closing after `wait` is left to the process's exit.
/// (Generic so that a test can hand it a value whose drop is slow or
/// never ends.)
fn close_within<C: Send + 'static>(consumer: C, stage: &str, wait: Duration) {
    let (closed_tx, closed) = std::sync::mpsc::channel::<()>();
    let closing = std::thread::Builder::new()
        .name("kafka-close".into())
        .spawn(move || {
            drop(consumer);
            let _ = closed_tx.send(());
        });
    // (Had the thread not started, the consumer was dropped with it.)
    if closing.is_ok() && closed.recv_timeout(wait).is_err() {
        tracing::warn!(
            stage,
            "the Kafka consumer did not close within {wait:?}; stopping without it"
        );
    }
}

impl Reader<'_> {
    fn fatal(&self) -> Option<String> {
        self.shared.reports.fatal()
    }

    /// Takes up to `max` messages, waiting at most `wait` for the first.
    fn poll_into(&mut self, batch: &mut Vec<Polled>, max: usize, wait: Duration) {
        let mut wait = wait;
        let mut errors = Vec::new();
        while batch.len() < max {
            match self.consumer.poll(wait) {
                None => break,
                Some(Ok(message)) => batch.push(take(&mut self.topics, &message)),
                Some(Err(e)) => errors.push(e),
            }
            wait = Duration::ZERO;
        }
        for e in errors {
            self.warn_once(&e);
        }
    }

    fn warn_once(&mut self, error: &KafkaError) {
        if matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::PartitionEOF)
        ) {
            return;
        }
        self.shared.reports.note(error, "while consuming");
        let text = error.to_string();
        let now = Instant::now();
        if self
            .warned
            .get(&text)
            .is_some_and(|at| now.duration_since(*at) < Duration::from_secs(60))
        {
            return;
        }
        self.warned.insert(text.clone(), now);
        tracing::warn!(stage = %self.id, "consuming: {text}");
    }

    /// Sends a batch downstream, one acknowledgement per partition in it.
    /// While the pipeline is full, every partition is paused and the
    /// consumer keeps being polled (rebalances, heartbeats, commits); what
    /// that polling returns comes back to be sent next.
    fn send(&mut self, batch: Vec<Polled>, output: &Output) -> Result<Vec<Polled>, StageError> {
        let tracks: HashMap<PartitionKey, Arc<Track>> = self.shared.tracks().clone();
        // Per partition: (track, last offset, events) in the order met.
        let mut parts: Vec<(PartitionKey, Arc<Track>, i64, u64)> = Vec::new();
        let mut kept = Vec::with_capacity(batch.len());
        for p in batch {
            let Some(track) = tracks.get(&p.key) else {
                // Revoked between being polled and being sent: the next
                // owner reads it; it never entered the pipeline here.
                continue;
            };
            match parts.iter_mut().find(|(k, ..)| *k == p.key) {
                Some(part) => {
                    part.2 = part.2.max(p.offset);
                    part.3 += 1;
                }
                None => parts.push((p.key.clone(), track.clone(), p.offset, 1)),
            }
            kept.push(p);
        }
        if kept.is_empty() {
            return Ok(Vec::new());
        }
        let acks: Vec<(PartitionKey, BatchAck)> = parts
            .iter()
            .map(|(key, track, last, n)| {
                track.sent.fetch_add(*n, Ordering::Relaxed);
                let token = track.lock().begin(*last, *n);
                let receiver: Arc<dyn AckReceiver> = track.clone();
                (key.clone(), BatchAck::new(receiver, token))
            })
            .collect();
        let meta = Meta::now(self.id.clone());
        let events: Vec<Event> = kept
            .into_iter()
            .map(|p| {
                let ack = &acks
                    .iter()
                    .find(|(k, _)| *k == p.key)
                    .expect("begun above")
                    .1;
                Event::raw(
                    p.payload,
                    Meta {
                        attributes: Some(p.attributes),
                        ..meta.clone()
                    },
                )
                .with_ack(ack.handle())
            })
            .collect();
        drop(acks);
        let mut carried = Vec::new();
        let mut paused_all = false;
        let mut sending = std::pin::pin!(output.send(events));
        let sent = loop {
            match self.handle.block_on(async {
                tokio::time::timeout(Duration::from_millis(200), sending.as_mut()).await
            }) {
                Ok(sent) => break sent,
                Err(_) => {
                    // The pipeline is full: stop fetching, stay in the group.
                    if !paused_all {
                        tracing::debug!(stage = %self.id, "the pipeline is full: partitions paused");
                        self.shared.full.store(true, Ordering::Relaxed);
                        if let Ok(assigned) = self.consumer.assignment() {
                            let _ = self.consumer.pause(&assigned);
                        }
                        paused_all = true;
                    }
                    self.poll_into(&mut carried, usize::MAX, Duration::ZERO);
                    self.commit_if_due();
                }
            }
        };
        self.shared.full.store(false, Ordering::Relaxed);
        if paused_all && let Ok(assigned) = self.consumer.assignment() {
            let paused = self.shared.paused().clone();
            let mut resume = TopicPartitionList::new();
            for e in assigned.elements() {
                let key: PartitionKey = (Arc::from(e.topic()), e.partition());
                if !paused.contains(&key) {
                    resume.add_partition(e.topic(), e.partition());
                }
            }
            let _ = self.consumer.resume(&resume);
        }
        sent.map_err(|_| StageError::OutputClosed)?;
        Ok(carried)
    }

    fn commit_if_due(&mut self) {
        if self.last_commit.elapsed() >= self.commit_interval {
            self.shared.commit(&self.consumer, CommitMode::Async);
            self.last_commit = Instant::now();
        }
    }

    /// Periodic work: commit, publish the counts, pause partitions with too
    /// much in flight and resume those that caught up.
    fn maintain(&mut self, metrics: &logbus_plugin_api::StageMetrics) {
        self.commit_if_due();
        give_brokers_if_due(self.consumer.client(), &self.shared.reports, self.brokers);
        self.shared.publish(metrics);
        metrics.add_redelivered(self.shared.redelivered.swap(0, Ordering::Relaxed));
        let tracks = self.shared.tracks().clone();
        let mut pause = TopicPartitionList::new();
        let mut resume = TopicPartitionList::new();
        {
            let mut paused = self.shared.paused();
            for (key, track) in &tracks {
                let was = paused.contains(key);
                match (
                    was,
                    paused_after(was, track.unfinished(), self.max_in_flight),
                ) {
                    (false, true) => {
                        pause.add_partition(&key.0, key.1);
                        paused.insert(key.clone());
                    }
                    (true, false) => {
                        resume.add_partition(&key.0, key.1);
                        paused.remove(key);
                    }
                    _ => {}
                }
            }
        }
        if pause.count() > 0 {
            let _ = self.consumer.pause(&pause);
        }
        if resume.count() > 0 {
            let _ = self.consumer.resume(&resume);
        }
    }

    /// Whether a stopping source can still see its checkpoints move.
    fn worth_waiting(&self) -> bool {
        self.shared
            .tracks()
            .values()
            .any(|t| t.lock().worth_waiting())
    }
}

/// Whether a partition is paused after a look at its `open` unfinished
/// events: paused at the cap, resumed only once half of it is left, so a
/// partition near its cap does not flap with every event finishing.
fn paused_after(was_paused: bool, open: u64, cap: u64) -> bool {
    if was_paused {
        open > cap / 2
    } else {
        open >= cap
    }
}

/// Copies a message out of librdkafka's buffer, with its attributes.
fn take(topics: &mut HashMap<String, Arc<str>>, message: &BorrowedMessage<'_>) -> Polled {
    let topic = match topics.get(message.topic()) {
        Some(t) => t.clone(),
        None => {
            let t: Arc<str> = Arc::from(message.topic());
            topics.insert(message.topic().to_string(), t.clone());
            t
        }
    };
    let mut attributes = Fields::new();
    attributes.insert("topic".into(), Value::String(topic.to_string()));
    attributes.insert("partition".into(), Value::from(message.partition()));
    attributes.insert("offset".into(), Value::from(message.offset()));
    if let Some(key) = message.key() {
        attributes.insert(
            "key".into(),
            Value::String(String::from_utf8_lossy(key).into_owned()),
        );
    }
    if let Some(ms) = message.timestamp().to_millis() {
        attributes.insert("timestamp".into(), Value::from(ms));
    }
    if let Some(headers) = message.headers() {
        let mut map = Fields::new();
        for h in headers.iter() {
            let value = h.value.map_or(Value::Null, |v| {
                Value::String(String::from_utf8_lossy(v).into_owned())
            });
            map.insert(h.key.to_string(), value);
        }
        attributes.insert("headers".into(), Value::Object(map));
    }
    Polled {
        key: (topic, message.partition()),
        offset: message.offset(),
        payload: Bytes::copy_from_slice(message.payload().unwrap_or_default()),
        attributes: Arc::new(attributes),
    }
}

#[async_trait]
impl Source for KafkaConsumerSource {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        let handle = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || self.consume(&handle, cx))
            .await
            .map_err(|e| StageError::Other(format!("the Kafka consumer thread panicked: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::BrokerWatch;
    use logbus_plugin_api::AckCounts;

    fn options(extra: Value) -> KafkaSourceOptions {
        let mut o = serde_json::json!({ "brokers": "b:9092", "group_id": "g", "topics": ["t"] });
        o.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(o).unwrap()
    }

    fn property(options: &KafkaSourceOptions, key: &str) -> Option<String> {
        let config = options.client_config(&logbus_plugin_api::testing::context());
        config.get(key).map(str::to_string)
    }

    /// The heartbeat is a quarter of the session (at least 250 ms), and
    /// librdkafka reports its brokers' states every 5 s unless told not
    /// to.
    #[test]
    fn the_consumer_properties() {
        for (session, heartbeat) in [
            (1000, "250"),
            (6000, "1500"),
            (10_000, "2500"),
            (60_001, "15000"),
        ] {
            let o = options(serde_json::json!({ "session_timeout_ms": session }));
            assert_eq!(
                property(&o, "session.timeout.ms"),
                Some(session.to_string())
            );
            assert_eq!(
                property(&o, "heartbeat.interval.ms").as_deref(),
                Some(heartbeat),
                "{session}"
            );
        }
        let o = options(serde_json::json!({}));
        assert_eq!(
            property(&o, "statistics.interval.ms").as_deref(),
            Some("5000")
        );
        let o = options(serde_json::json!({ "librdkafka": { "statistics.interval.ms": "0" } }));
        assert_eq!(property(&o, "statistics.interval.ms").as_deref(), Some("0"));
    }

    /// The brokers a stranded consumer is given are the ones it was
    /// configured with: the `brokers` option, or a `librdkafka:` entry
    /// overriding it.
    #[test]
    fn the_brokers_given_again_are_the_configured_ones() {
        let cx = logbus_plugin_api::testing::context();
        let o = options(serde_json::json!({}));
        assert_eq!(bootstrap_servers(&o.client_config(&cx)), "b:9092");
        let o = options(serde_json::json!({ "librdkafka": { "bootstrap.servers": "c:1,d:2" } }));
        assert_eq!(bootstrap_servers(&o.client_config(&cx)), "c:1,d:2");
    }

    /// A track's books: events sent and not finished, the offset to commit
    /// (past every finished batch, and only once it moved), and a revoke's
    /// view of both.
    #[test]
    fn a_track_commits_only_past_finished_batches_and_only_once() {
        let track = Track::new();
        let begin = |last: i64, n: u64| {
            track.sent.fetch_add(n, Ordering::Relaxed);
            track.lock().begin(last, n)
        };
        assert_eq!(track.to_commit(), None);
        // Three batches: offsets 9..=10, 11..=13 and 14 (sizes that add
        // and multiply differently).
        let (a, b, c) = (begin(10, 2), begin(13, 3), begin(14, 1));
        assert_eq!(track.unfinished(), 6);
        assert_eq!(track.release(), (None, 6, AckCounts::default()));
        // A later batch finishing first commits nothing.
        track.finished(b, Outcome::Delivered);
        assert_eq!(track.unfinished(), 3);
        assert_eq!(track.to_commit(), None);
        // A refused event is finished: the offset moves past both.
        track.finished(a, Outcome::Rejected);
        assert_eq!(track.unfinished(), 1);
        assert_eq!(track.to_commit(), Some(14), "the next offset to read");
        let finished = AckCounts {
            delivered: 3,
            rejected: 2,
            errored: 0,
        };
        assert_eq!(track.release(), (Some(14), 1, finished));
        track.committed_at(14);
        assert_eq!(track.to_commit(), None, "committed already");
        assert_eq!(track.release().0, None);
        // An older commit confirmed late does not move it back.
        track.committed_at(11);
        assert_eq!(track.to_commit(), None);
        // An errored batch is finished but holds the offset before it.
        track.finished(c, Outcome::Errored);
        let (next, unfinished, counts) = track.release();
        assert_eq!((next, unfinished), (None, 0));
        assert_eq!(track.unfinished(), 0);
        assert_eq!(
            counts,
            AckCounts {
                delivered: 3,
                rejected: 2,
                errored: 1
            }
        );
        assert_eq!(track.to_commit(), None);
    }

    /// The stage's acknowledgement counts add up every assigned partition
    /// and the ones no longer assigned.
    #[test]
    fn published_counts_add_up_every_partition() {
        let shared = Shared::new("s".into(), Reports::new("s".into()));
        *shared.gone.lock().unwrap() = AckCounts {
            delivered: 100,
            rejected: 10,
            errored: 1,
        };
        let metrics = logbus_plugin_api::StageMetrics::default();
        shared.publish(&metrics);
        let acked = |m: &logbus_plugin_api::StageMetrics| {
            let a = m.snapshot();
            (a.acked_delivered, a.acked_rejected, a.acked_errored)
        };
        assert_eq!(acked(&metrics), (100, 10, 1));
        for (p, outcome) in [
            (0, Outcome::Delivered),
            (1, Outcome::Errored),
            (2, Outcome::Rejected),
        ] {
            let track = Arc::new(Track::new());
            let done = track.lock().begin(5, 3);
            track.finished(done, outcome);
            track.lock().begin(6, 1);
            shared.tracks().insert(("t".into(), p), track);
        }
        // The open batches' age: at least the time that passed since.
        std::thread::sleep(Duration::from_millis(30));
        shared.publish(&metrics);
        assert_eq!(acked(&metrics), (103, 13, 4));
        let age = metrics.snapshot().oldest_unacked_ms;
        assert!((30..10_000).contains(&age), "{age} ms");
    }

    /// Every bound holds at its edges (the value on each side), topic names
    /// at theirs, and the defaults are valid.
    #[test]
    fn every_bound_is_checked_at_its_edges() {
        let errors = |name: &str, value: Value| -> Vec<(String, String)> {
            let mut extra = serde_json::Map::new();
            extra.insert(name.to_string(), value);
            options(Value::Object(extra))
                .check()
                .into_iter()
                .map(|e| (e.path.join("."), e.message))
                .collect()
        };
        assert_eq!(errors("topics", serde_json::json!(["t"])), []);
        for (name, inside, outside) in [
            ("batch_max_events", vec![1, 100_000], vec![0, 100_001]),
            (
                "commit_interval_ms",
                vec![10, 3_600_000],
                vec![9, 3_600_001],
            ),
            ("max_in_flight_per_partition", vec![1], vec![0]),
            (
                "fetch_queue_max_kib",
                vec![1, 2_097_151],
                vec![0, 2_097_152],
            ),
            ("max_partition_fetch_bytes", vec![1024], vec![1023]),
            (
                "session_timeout_ms",
                vec![1000, 3_600_000],
                vec![999, 3_600_001],
            ),
        ] {
            for v in inside {
                assert_eq!(errors(name, v.into()), [], "{name}: {v}");
            }
            for v in outside {
                let e = errors(name, v.into());
                assert!(e.len() == 1 && e[0].0 == name, "{name}: {v}: {e:?}");
            }
        }
        let topic = |t: &str| errors("topics", serde_json::json!([t]));
        for good in ["a.b_c-D9", &"t".repeat(249), "^logs-.*"] {
            assert_eq!(topic(good), [], "{good:?}");
        }
        for bad in ["", &"t".repeat(250), "a/b", "a b", "t\u{e9}"] {
            let e = topic(bad);
            assert!(
                e.len() == 1 && e[0].0 == "topics.0" && e[0].1.contains("is not a topic name"),
                "{bad:?}: {e:?}"
            );
        }
        let e = errors("group_id", " ".into());
        assert_eq!(e, [("group_id".into(), "must not be empty".into())]);
    }

    /// A partition pauses at its cap and resumes at half of it, not before.
    #[test]
    fn a_partition_pauses_at_its_cap_and_resumes_at_half() {
        for (was, open, cap, after) in [
            (false, 9, 10, false),
            (false, 10, 10, true),
            (false, 11, 10, true),
            (true, 6, 10, true),
            (true, 5, 10, false),
            (true, 0, 10, false),
            (false, 1, 1, true),
            (true, 1, 1, true),
            (true, 0, 1, false),
            (true, 2, 3, true),
            (true, 1, 3, false),
        ] {
            assert_eq!(paused_after(was, open, cap), after, "{was} {open} {cap}");
        }
    }

    /// The consumer's context hands librdkafka's log and errors to the
    /// stage's reports: a log line under the stage's id, and an error that
    /// retrying cannot fix, remembered (the source ends with it).
    #[test]
    fn librdkafka_log_and_errors_reach_the_stages_reports() {
        let context = GroupContext {
            shared: Arc::new(Shared::new(
                "from_kafka".into(),
                Reports::new("from_kafka".into()),
            )),
        };
        let lines = crate::client::tests::logged_by(|| {
            ClientContext::log(&context, RDKafkaLogLevel::Warning, "FAC", "a message");
            context.error(
                KafkaError::Global(RDKafkaErrorCode::Authentication),
                "credentials refused",
            );
        });
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(
            lines[0].trim_start().starts_with("WARN")
                && lines[0].contains("stage=\"from_kafka\"")
                && lines[0].contains("librdkafka FAC: a message"),
            "{}",
            lines[0]
        );
        assert!(lines[1].contains("credentials refused"), "{}", lines[1]);
        let fatal = context.shared.reports.fatal().expect("remembered as fatal");
        assert!(fatal.contains("credentials refused"), "{fatal}");
    }

    /// A consumer of group `g` whose broker never answers: enough for the
    /// code that only books, logs or pauses.
    fn consumer_without_a_broker() -> BaseConsumer<GroupContext> {
        ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("group.id", "g")
            .create_with_context(GroupContext {
                shared: Arc::new(Shared::new("s".into(), Reports::new("s".into()))),
            })
            .unwrap()
    }

    /// A revoke stops tracking the partitions it takes: their finished
    /// counts join those of partitions let go before, their unfinished
    /// events are counted redelivered (the next owner reads them again),
    /// and their pauses are forgotten. Nothing here is committable (an
    /// earlier batch of each is open), so no broker is asked.
    #[test]
    fn a_revoke_books_what_its_partitions_finished_and_let_go() {
        let consumer = consumer_without_a_broker();
        let shared = consumer.context().shared.clone();
        *shared.gone.lock().unwrap() = AckCounts {
            delivered: 100,
            rejected: 10,
            errored: 1,
        };
        // Partition p: an open batch of 2, then a finished one of 3.
        for (p, outcome) in [
            (0, Outcome::Delivered),
            (1, Outcome::Rejected),
            (2, Outcome::Errored),
            (3, Outcome::Delivered),
        ] {
            let track = Arc::new(Track::new());
            track.sent.store(5, Ordering::Relaxed);
            track.lock().begin(1, 2);
            let later = track.lock().begin(4, 3);
            track.finished(later, outcome);
            shared.tracks().insert(("t".into(), p), track);
            shared.paused().insert(("t".into(), p));
        }
        let mut list = TopicPartitionList::new();
        for p in 0..3 {
            list.add_partition("t", p);
        }
        consumer
            .context()
            .pre_rebalance(&consumer, &Rebalance::Revoke(&list));
        assert_eq!(
            *shared.gone.lock().unwrap(),
            AckCounts {
                delivered: 103,
                rejected: 13,
                errored: 4
            }
        );
        assert_eq!(shared.redelivered.load(Ordering::Relaxed), 6);
        let kept: Vec<_> = shared.tracks().keys().cloned().collect();
        assert_eq!(kept, [("t".into(), 3)]);
        assert_eq!(*shared.paused(), [("t".into(), 3)].into());
    }

    /// A value whose drop takes `slow`, or until `release` says so.
    struct SlowClose {
        slow: Duration,
        release: Option<std::sync::mpsc::Receiver<()>>,
        closed: Arc<AtomicBool>,
    }

    impl Drop for SlowClose {
        fn drop(&mut self) {
            std::thread::sleep(self.slow);
            if let Some(release) = self.release.take() {
                let _ = release.recv();
            }
            self.closed.store(true, Ordering::Release);
        }
    }

    /// Closing waits for a consumer that closes (here in 50 ms), and gives
    /// up on one that does not close within the wait, leaving it behind.
    #[test]
    fn closing_waits_for_the_consumer_but_not_for_ever() {
        let closed = Arc::new(AtomicBool::new(false));
        let slow = SlowClose {
            slow: Duration::from_millis(50),
            release: None,
            closed: closed.clone(),
        };
        close_within(slow, "s", Duration::from_secs(30));
        assert!(closed.load(Ordering::Acquire), "returned before the close");
        let (release, held) = std::sync::mpsc::channel();
        let stuck = Arc::new(AtomicBool::new(false));
        let began = Instant::now();
        close_within(
            SlowClose {
                slow: Duration::ZERO,
                release: Some(held),
                closed: stuck.clone(),
            },
            "s",
            Duration::from_millis(100),
        );
        assert!(began.elapsed() < Duration::from_secs(20));
        assert!(!stuck.load(Ordering::Acquire), "still closing, left behind");
        release.send(()).unwrap();
    }

    /// Consumption errors reach the log once a minute at most (the same
    /// text again within the minute does not), one that retrying cannot fix
    /// is noted as fatal (the source ends with it), and the end of a
    /// partition, which is no error, is neither logged nor noted.
    #[test]
    fn consumption_errors_are_logged_once_a_minute_and_fatal_ones_noted() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let consumer = consumer_without_a_broker();
        let shared = consumer.context().shared.clone();
        let mut reader = Reader {
            id: "from_kafka".into(),
            brokers: "127.0.0.1:1",
            consumer,
            shared: shared.clone(),
            handle: runtime.handle(),
            topics: HashMap::new(),
            max_in_flight: 1,
            commit_interval: Duration::from_secs(1),
            last_commit: Instant::now(),
            warned: HashMap::new(),
        };
        let eof = KafkaError::Global(RDKafkaErrorCode::PartitionEOF);
        let transient = KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure);
        let refused = KafkaError::Global(RDKafkaErrorCode::Authentication);
        let lines = crate::client::tests::logged_by(|| {
            reader.warn_once(&eof);
            reader.warn_once(&transient);
            reader.warn_once(&transient);
        });
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(
            lines[0].contains("stage=from_kafka") && lines[0].contains("consuming: "),
            "{}",
            lines[0]
        );
        assert_eq!(shared.reports.fatal(), None);
        // A minute later the same error is logged again.
        let logged_at = reader.warned[&transient.to_string()];
        reader
            .warned
            .insert(transient.to_string(), logged_at - Duration::from_secs(61));
        let lines = crate::client::tests::logged_by(|| reader.warn_once(&transient));
        assert_eq!(lines.len(), 1, "{lines:#?}");
        let lines = crate::client::tests::logged_by(|| reader.warn_once(&refused));
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(
            shared
                .reports
                .fatal()
                .is_some_and(|f| f.contains("while consuming"))
        );
    }

    /// While the pipeline is full, `send` pauses the assignment and says
    /// so (`full`, which a rebalance in the meantime reads to pause what it
    /// assigns), so the consumer stops fetching into memory; once the
    /// batch is in, the flag is down again. Here the output's one slot is
    /// taken, `send` runs on a thread of its own, and the slot is freed only
    /// once the flag is up.
    #[test]
    fn a_full_pipeline_pauses_the_consumer_until_the_batch_is_in() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let consumer = consumer_without_a_broker();
        let shared = consumer.context().shared.clone();
        let key: PartitionKey = ("t".into(), 0);
        shared.tracks().insert(key.clone(), Arc::new(Track::new()));
        let mut reader = Reader {
            id: "s".into(),
            brokers: "127.0.0.1:1",
            consumer,
            shared: shared.clone(),
            handle: runtime.handle(),
            topics: HashMap::new(),
            max_in_flight: 1_000,
            commit_interval: Duration::from_secs(3600),
            last_commit: Instant::now(),
            warned: HashMap::new(),
        };
        let (tx, mut rx) = logbus_plugin_api::channel(1);
        let output = Output::new(
            vec![tx],
            Arc::new(logbus_plugin_api::StageMetrics::default()),
            logbus_plugin_api::OutputRole::Main,
        );
        let event = || Event::raw(Bytes::from_static(b"x"), Meta::now("s".into()));
        runtime.block_on(output.send(vec![event()])).unwrap();
        let polled = Polled {
            key,
            offset: 7,
            payload: Bytes::from_static(b"m"),
            attributes: Arc::new(Fields::new()),
        };
        std::thread::scope(|scope| {
            let sending = scope.spawn(|| reader.send(vec![polled], &output));
            let deadline = Instant::now() + Duration::from_secs(10);
            let paused = loop {
                if shared.full.load(Ordering::Relaxed) {
                    break true;
                }
                if Instant::now() > deadline || sending.is_finished() {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            // Free the slot whatever happened, or a failure would leave
            // the sending thread (and the test) waiting for ever.
            let first = runtime.block_on(rx.recv()).unwrap();
            assert_eq!(first.len(), 1);
            drop(first);
            let rest = sending.join().unwrap().unwrap();
            assert!(paused, "never paused while the pipeline was full");
            assert!(
                rest.is_empty(),
                "nothing polled from a consumer with no broker"
            );
        });
        assert!(
            !shared.full.load(Ordering::Relaxed),
            "the flag is down once sent"
        );
        let sent = runtime.block_on(rx.recv()).unwrap();
        assert_eq!(sent.events()[0].as_raw().unwrap(), b"m".as_slice());
    }

    /// The consumer's statistics reach its watch.
    #[test]
    fn statistics_reach_the_watch() {
        let mut reports = Reports::new("s".into());
        reports.watch = BrokerWatch::new(Duration::ZERO);
        let context = GroupContext {
            shared: Arc::new(Shared::new("s".into(), reports)),
        };
        context.stats_raw(br#"{"brokers": {"b:9092/1": {"source": "learned", "state": "UP"}}}"#);
        assert!(!context.shared.reports.watch.take_due());
        context.stats_raw(br#"{"brokers": {"b:9092/1": {"source": "learned", "state": "DOWN"}}}"#);
        assert!(context.shared.reports.watch.take_due());
    }
}
