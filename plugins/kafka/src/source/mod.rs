//! `source: kafka` — a consumer-group member. Several LogBus processes in
//! one group share a topic's partitions: that is how LogBus scales out
//! across machines (docs/deploy.md), with Kafka doing the coordination.
//! This module is the options and the plugin; the consumer, its offset
//! tracking and its rebalances are `consumer`.

use std::collections::BTreeMap;
use std::time::Duration;

use logbus_plugin_api::{BuildContext, CheckOptions, OptionError, Source, StageKind, TypedPlugin};
use rdkafka::ClientConfig;
use serde::Deserialize;

use crate::client::{
    KafkaTls, STATISTICS_INTERVAL_MS, Sasl, apply_security, bootstrap_servers, check_connection,
};

mod consumer;

use consumer::KafkaConsumerSource;

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

    /// Raw messages, each with its partition and offset as its position;
    /// offsets are committed once finished, so a crash re-reads.
    fn flow(&self, _options: &KafkaSourceOptions) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::raw().then(logbus_plugin_api::Step::Replay(
            logbus_plugin_api::Replay {
                rereads: true,
                positions: true,
            },
        ))
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use logbus_plugin_api::AckReceiver;
    use logbus_plugin_api::{Bytes, Event, Fields, Meta, Outcome, Output};
    use rdkafka::TopicPartitionList;
    use rdkafka::client::ClientContext;
    use rdkafka::config::RDKafkaLogLevel;
    use rdkafka::consumer::{BaseConsumer, Rebalance};
    use rdkafka::consumer::{Consumer, ConsumerContext};
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use serde_json::Value;

    use super::consumer::*;
    use super::*;
    use crate::client::BrokerWatch;
    use crate::client::Reports;
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
