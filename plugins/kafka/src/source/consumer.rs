//! The consumer behind `source: kafka`.
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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use logbus_plugin_api::{
    AckReceiver, BatchAck, Bytes, Event, Fields, Meta, OrderedCheckpoint, Outcome, Output,
    Position, Source, SourceContext, StageError, async_trait,
};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;

use crate::client::{Reports, give_brokers_if_due};

pub(super) struct KafkaConsumerSource {
    pub(super) config: ClientConfig,
    pub(super) brokers: String,
    pub(super) topics: Vec<String>,
    pub(super) batch_max_events: usize,
    pub(super) commit_interval: Duration,
    pub(super) max_in_flight: u64,
    pub(super) drain: Duration,
}

/// One assigned partition: its checkpoint (what the acknowledgements
/// report to) and what was last committed.
pub(super) struct Track {
    pub(super) checkpoint: Mutex<OrderedCheckpoint<i64>>,
    /// Events sent downstream.
    pub(super) sent: AtomicU64,
    /// The offset last committed (the next one to read), -1: none yet.
    pub(super) committed: Mutex<i64>,
}

impl Track {
    pub(super) fn new() -> Self {
        Track {
            checkpoint: Mutex::new(OrderedCheckpoint::new()),
            sent: AtomicU64::new(0),
            committed: Mutex::new(-1),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, OrderedCheckpoint<i64>> {
        self.checkpoint.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Events sent and not finished.
    pub(super) fn unfinished(&self) -> u64 {
        let c = self.lock().counts();
        self.sent
            .load(Ordering::Relaxed)
            .saturating_sub(c.delivered + c.rejected + c.errored)
    }

    /// The offset to commit when it moved since the last commit.
    pub(super) fn to_commit(&self) -> Option<i64> {
        let next = self.lock().committed().map(|o| o + 1)?;
        let last = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        (next > *last).then_some(next)
    }

    /// For a revoke: the offset to commit, the events still unfinished
    /// and the counts, read under one lock so an event finishing meanwhile
    /// is either committed or counted unfinished, never neither.
    pub(super) fn release(&self) -> (Option<i64>, u64, logbus_plugin_api::AckCounts) {
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

    pub(super) fn committed_at(&self, next: i64) {
        let mut last = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        *last = (*last).max(next);
    }
}

impl AckReceiver for Track {
    fn finished(&self, token: u64, outcome: Outcome) {
        self.lock().finish(token, outcome);
    }
}

pub(super) type PartitionKey = (Arc<str>, i32);

/// What the consumer thread and librdkafka's callbacks (which run on it,
/// inside `poll`) share.
pub(super) struct Shared {
    pub(super) stage: Arc<str>,
    pub(super) tracks: Mutex<HashMap<PartitionKey, Arc<Track>>>,
    /// Acknowledgement counts of partitions no longer assigned.
    pub(super) gone: Mutex<logbus_plugin_api::AckCounts>,
    pub(super) redelivered: AtomicU64,
    /// Partitions paused because too many of their events are unfinished.
    pub(super) paused: Mutex<HashSet<PartitionKey>>,
    /// Every partition is paused: the pipeline is full.
    pub(super) full: AtomicBool,
    /// librdkafka's reports, an error retrying cannot fix (the brokers
    /// refused our credentials), and whether the consumer has been without
    /// any broker for a while.
    pub(super) reports: Reports,
}

impl Shared {
    pub(super) fn new(stage: Arc<str>, reports: Reports) -> Self {
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

    pub(super) fn tracks(&self) -> std::sync::MutexGuard<'_, HashMap<PartitionKey, Arc<Track>>> {
        self.tracks.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn paused(&self) -> std::sync::MutexGuard<'_, HashSet<PartitionKey>> {
        self.paused.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Commits what each track finished. (A revoke commits its partitions
    /// itself, with `Track::release`.)
    pub(super) fn commit(&self, consumer: &BaseConsumer<GroupContext>, mode: CommitMode) {
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

    pub(super) fn publish(&self, metrics: &logbus_plugin_api::StageMetrics) {
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
pub(super) struct GroupContext {
    pub(super) shared: Arc<Shared>,
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
pub(super) struct Polled {
    pub(super) key: PartitionKey,
    pub(super) offset: i64,
    pub(super) payload: Bytes,
    pub(super) attributes: Arc<Fields>,
}

/// The consumer thread's state.
pub(super) struct Reader<'a> {
    pub(super) id: Arc<str>,
    /// The configured brokers, given again to a consumer that lost them.
    pub(super) brokers: &'a str,
    pub(super) consumer: BaseConsumer<GroupContext>,
    pub(super) shared: Arc<Shared>,
    pub(super) handle: &'a tokio::runtime::Handle,
    pub(super) topics: HashMap<String, Arc<str>>,
    pub(super) max_in_flight: u64,
    pub(super) commit_interval: Duration,
    pub(super) last_commit: Instant,
    /// Each consumption error is logged once a minute at most.
    pub(super) warned: HashMap<String, Instant>,
}

impl KafkaConsumerSource {
    pub(super) fn consume(
        self,
        handle: &tokio::runtime::Handle,
        cx: SourceContext,
    ) -> Result<(), StageError> {
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
pub(super) const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Drops (closes) the consumer, waiting at most `wait`. librdkafka's close
/// waits until the group coordinator lets the consumer go, and after a
/// broker restart it was seen to wait forever (a CI run hung in the drop,
/// polling), which hung the whole stop. The offsets are committed by then;
/// a consumer still closing after `wait` is left to the process's exit.
/// (Generic so that a test can hand it a value whose drop is slow or
/// never ends.)
pub(super) fn close_within<C: Send + 'static>(consumer: C, stage: &str, wait: Duration) {
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
    pub(super) fn fatal(&self) -> Option<String> {
        self.shared.reports.fatal()
    }

    /// Takes up to `max` messages, waiting at most `wait` for the first.
    pub(super) fn poll_into(&mut self, batch: &mut Vec<Polled>, max: usize, wait: Duration) {
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

    pub(super) fn warn_once(&mut self, error: &KafkaError) {
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
    pub(super) fn send(
        &mut self,
        batch: Vec<Polled>,
        output: &Output,
    ) -> Result<Vec<Polled>, StageError> {
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
        // A partition's events are named by (topic, partition) and offset:
        // what the consumer reads again after a crash names itself alike.
        let streams: Vec<u64> = acks
            .iter()
            .map(|((topic, partition), _)| {
                Position::stream_of(&[topic.as_bytes(), &partition.to_le_bytes()])
            })
            .collect();
        let meta = Meta::now(self.id.clone());
        let events: Vec<Event> = kept
            .into_iter()
            .map(|p| {
                let at = acks
                    .iter()
                    .position(|(k, _)| *k == p.key)
                    .expect("begun above");
                Event::raw(
                    p.payload,
                    Meta {
                        attributes: Some(p.attributes),
                        position: Some(Position::new(streams[at], p.offset as u64)),
                        ..meta.clone()
                    },
                )
                .with_ack(acks[at].1.handle())
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

    pub(super) fn commit_if_due(&mut self) {
        if self.last_commit.elapsed() >= self.commit_interval {
            self.shared.commit(&self.consumer, CommitMode::Async);
            self.last_commit = Instant::now();
        }
    }

    /// Periodic work: commit, publish the counts, pause partitions with too
    /// much in flight and resume those that caught up.
    pub(super) fn maintain(&mut self, metrics: &logbus_plugin_api::StageMetrics) {
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
    pub(super) fn worth_waiting(&self) -> bool {
        self.shared
            .tracks()
            .values()
            .any(|t| t.lock().worth_waiting())
    }
}

/// Whether a partition is paused after a look at its `open` unfinished
/// events: paused at the cap, resumed only once half of it is left, so a
/// partition near its cap does not flap with every event finishing.
pub(super) fn paused_after(was_paused: bool, open: u64, cap: u64) -> bool {
    if was_paused {
        open > cap / 2
    } else {
        open >= cap
    }
}

/// Copies a message out of librdkafka's buffer, with its attributes.
pub(super) fn take(
    topics: &mut HashMap<String, Arc<str>>,
    message: &BorrowedMessage<'_>,
) -> Polled {
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
