//! The loop of every sink that delivers batches to a service: those built
//! on `Driver::new` (http, email, syslog, kafka, opensearch, clickhouse,
//! cloudwatch_logs, otlp). S3, whose object can outgrow memory and goes up
//! in parts, runs on [`crate::ObjectDriver`]. Sinks whose unit is a local
//! write (file, stdout, blackhole: the writer loop of `logbus-io`; Avro
//! and Parquet files) answer at once and have no one to retry.
//!
//! It reads the input into the batcher, keeps up to `in_flight` requests
//! going, and settles each event by what the destination said about it:
//! delivered events are committed (and their acknowledgements released),
//! refused ones go to `<id>.dead` or the sink's `on_rejected` policy, and
//! events still held when the drain deadline passes are errored, so a
//! checkpointing source sends them again. An input batch is released only
//! when all of its events are settled: that, and reading only while no
//! closed batch waits for a request slot, keeps what the sink holds within
//! `(in_flight + 1) × max_events` plus the open partitions.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use logbus_plugin_api::{
    CancellationToken, Event, InputBatch, Outcome, SinkContext, StageError, async_trait,
};
use tokio::time::Instant;

use crate::batch::{Batch, BatchLimits, Batcher};
use crate::dead::{Unread, dead_letter};
use crate::encode::Encoder;
use crate::journal::{BatchId, BatchJournal, Claim, JOURNAL_BATCHES};
use crate::retry::RetryPolicy;

/// The destination's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Every item is stored.
    Delivered,
    /// Nothing was stored and trying again may work (connection lost,
    /// timeout, 429, 5xx); `retry_after` is the destination's own hint.
    Retry {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// Nothing was stored and trying again cannot help (a 4xx).
    Rejected { reason: String },
    /// Not sent, on purpose, by the sink's own policy (a rate limit): the
    /// events count as discarded and are acknowledged as rejected; they
    /// are neither retried nor dead-lettered.
    Discarded { reason: String },
    /// One answer per item, in request order (bulk APIs): only the items
    /// answered `Retry` are sent again.
    Items(Vec<ItemResult>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemResult {
    Delivered,
    Retry(String),
    Rejected(String),
}

/// A destination, as the driver sees it.
#[async_trait]
pub trait Service: Send + Sync + 'static {
    /// What one attempt sends: a compressed body, a message, a record set.
    type Request: Send + Sync + 'static;

    /// Builds the request for `batch`: once per batch, and again when a
    /// partial failure shrank it. An error rejects the whole batch.
    fn prepare(&self, batch: &Batch) -> Result<Self::Request, String>;

    /// One attempt.
    async fn send(&self, request: &Self::Request) -> Response;
}

/// What a sink does with events the destination refused for good, when
/// nothing reads its `<id>.dead`. Also the `on_rejected` option of the
/// sinks on this core (`fail` or `drop`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum OnRejected {
    /// Stop the stage (the pipeline drains and exits non-zero); the
    /// events count as errored, so a checkpointing source sends them again
    /// after the cause is fixed.
    #[default]
    Fail,
    /// Count them as discarded (acknowledged as rejected), log, go on.
    Drop,
}

#[derive(Debug, Clone)]
pub struct DriverConfig {
    pub limits: BatchLimits,
    pub retry: RetryPolicy,
    /// Most requests waiting for an answer at once (at least 1).
    pub in_flight: usize,
    pub on_rejected: OnRejected,
    /// Names the destination in messages, e.g. `POST http://host/path`.
    pub destination: String,
}

/// Picks the partition an event is batched in.
pub type PartitionKey = dyn Fn(&Event) -> String + Send + Sync;

/// The sink core: a [`Service`], an [`Encoder`] and, optionally, how to
/// pick an event's partition.
pub struct Driver<S: Service> {
    service: Arc<S>,
    encoder: Box<dyn Encoder>,
    partition: Option<Box<PartitionKey>>,
    config: DriverConfig,
    /// Where the batch journal is kept, when batches are to be made
    /// again alike after a crash.
    journal_dir: Option<PathBuf>,
}

/// How one batch ended: its events sorted by outcome, with their tags.
#[derive(Default)]
struct Finished {
    delivered: Vec<(Event, u64)>,
    rejected: Vec<(Event, u64, String)>,
    /// Held back by the sink's policy, with the reason.
    discarded: Vec<(Event, u64)>,
    discard_reason: String,
    /// Out of retries, with the reason.
    exhausted: Vec<(Event, u64)>,
    gave_up: Option<String>,
    /// Still held when the drain deadline passed.
    held: Vec<(Event, u64)>,
    /// The batch's journal name, when it has one.
    id: Option<BatchId>,
}

/// How long a batch being made again waits for its last events (at least
/// the batch age): re-read events come at reading speed once the first
/// is back.
const REGATHER_WAIT: Duration = Duration::from_secs(10);

/// The batch journal and the batches being gathered again from re-read
/// events (keyed by their name in hex).
struct Journalled {
    journal: BatchJournal,
    gathering: Batcher,
}

impl<S: Service> Driver<S> {
    pub fn new(service: S, encoder: impl Encoder, config: DriverConfig) -> Self {
        Driver {
            service: Arc::new(service),
            encoder: Box::new(encoder),
            partition: None,
            config,
            journal_dir: None,
        }
    }

    /// Keeps a batch journal in `dir` (`<stage id>.batches`): batches are
    /// named by the source positions they cover, written down before they
    /// are sent, and made again alike from the events a checkpointing
    /// source re-reads after a crash ([`crate::journal`]). A service reads
    /// the name with [`Batch::identity`].
    pub fn journal_in(mut self, dir: Option<PathBuf>) -> Self {
        self.journal_dir = dir;
        self
    }

    /// Batches by `key(event)`: events with different keys never share a
    /// request.
    pub fn partition_by(mut self, key: impl Fn(&Event) -> String + Send + Sync + 'static) -> Self {
        self.partition = Some(Box::new(key));
        self
    }

    pub fn service(&self) -> &S {
        &self.service
    }

    /// Runs until the input ends and everything is settled, the stage
    /// fails, or the drain deadline passes.
    pub async fn run(&self, cx: &mut SinkContext) -> Result<(), StageError> {
        let c = &self.config;
        // The sink holds the events of open and in-flight batches against
        // its input channel's capacity: a batch larger than half of it could
        // only ever close by age (with the channel full behind it), so it
        // is capped there.
        let mut limits = c.limits;
        // (A channel holds at least one event.)
        let capacity = cx.input.handle().stats().capacity();
        let capped = limits.max_events.min((capacity / 2).max(1));
        if capped != limits.max_events {
            tracing::debug!(
                stage = %cx.id,
                "batches capped at {capped} events (half the input channel's {capacity})"
            );
            limits.max_events = capped;
        }
        let mut batcher = Batcher::new(limits, self.encoder.framing());
        let mut journalled = match &self.journal_dir {
            None => None,
            Some(dir) => {
                let path = dir.join(format!("{}.batches", cx.id));
                let journal = std::fs::create_dir_all(dir)
                    .and_then(|()| BatchJournal::open(&path, JOURNAL_BATCHES))
                    .map_err(|e| {
                        StageError::Other(format!("batch journal {}: {e}", path.display()))
                    })?;
                if let awaiting @ 1.. = journal.awaiting() {
                    tracing::info!(
                        stage = %cx.id,
                        "{awaiting} batches of an earlier run are made again from what the sources re-read"
                    );
                }
                // Gathered batches are as large as they were; one that
                // waits long for its last events is sent as it is.
                let gathering = BatchLimits {
                    max_events: usize::MAX,
                    max_bytes: usize::MAX,
                    max_age: limits.max_age.max(REGATHER_WAIT),
                    max_partitions: usize::MAX,
                };
                Some(Journalled {
                    journal,
                    gathering: Batcher::new(gathering, self.encoder.framing()),
                })
            }
        };
        let mut sealed: VecDeque<Batch> = VecDeque::new();
        let mut in_flight = FuturesUnordered::new();
        let mut inputs = Inputs::default();
        let mut ended = false;
        let mut failure: Option<String> = None;
        let stop = cx.stop.clone();
        loop {
            while failure.is_none() && in_flight.len() < c.in_flight.max(1) {
                let Some(mut batch) = sealed.pop_front() else {
                    break;
                };
                if let Some(j) = journalled.as_mut()
                    && batch.identity().is_none()
                {
                    match j.journal.seal(&batch) {
                        Ok(id) => batch.set_identity(id),
                        Err(e) => {
                            failure =
                                Some(format!("batch journal {}: {e}", j.journal.path().display()));
                            sealed.push_front(batch);
                            break;
                        }
                    }
                }
                in_flight.push(deliver(
                    self.service.clone(),
                    c.retry,
                    batch,
                    stop.clone(),
                    c.destination.clone(),
                    cx.metrics.clone(),
                ));
            }
            if in_flight.is_empty() && (failure.is_some() || stop.is_cancelled()) {
                break;
            }
            let gathering = journalled.as_ref().is_some_and(|j| !j.gathering.is_empty());
            if ended
                && in_flight.is_empty()
                && sealed.is_empty()
                && batcher.is_empty()
                && !gathering
            {
                break;
            }
            let reading = !ended && sealed.is_empty() && failure.is_none() && !stop.is_cancelled();
            let deadline = match journalled
                .as_ref()
                .and_then(|j| j.gathering.next_deadline())
            {
                Some(g) => Some(batcher.next_deadline().map_or(g, |d| d.min(g))),
                None => batcher.next_deadline(),
            };
            tokio::select! {
                biased;
                Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                    if let Err(why) = self.settle(done, cx, &mut inputs, &mut journalled).await {
                        failure.get_or_insert(why);
                    }
                }
                _ = stop.cancelled(), if !stop.is_cancelled() => {}
                _ = sleep_until(deadline), if deadline.is_some() && !ended => {
                    batcher.seal_due(Instant::now(), &mut sealed);
                    if let Some(j) = journalled.as_mut() {
                        let mut due = VecDeque::new();
                        j.gathering.seal_due(Instant::now(), &mut due);
                        self.regathered_incomplete(due, &mut sealed, &mut j.journal, cx);
                    }
                }
                next = cx.input.recv(), if reading => match next {
                    None => {
                        ended = true;
                        batcher.seal_all(&mut sealed);
                        if let Some(j) = journalled.as_mut() {
                            let mut left = VecDeque::new();
                            j.gathering.seal_all(&mut left);
                            self.regathered_incomplete(left, &mut sealed, &mut j.journal, cx);
                        }
                    }
                    Some(batch) => {
                        let rejected = self.take(batch, &mut batcher, &mut sealed, &mut inputs, &mut journalled, cx);
                        if !rejected.is_empty() {
                            let done = Finished { rejected, ..Finished::default() };
                            if let Err(why) = self.settle(done, cx, &mut inputs, &mut journalled).await {
                                failure.get_or_insert(why);
                            }
                        }
                    }
                },
            }
        }
        // Whatever was not sent is errored: the stage failed, or the drain
        // deadline passed.
        batcher.seal_all(&mut sealed);
        if let Some(j) = journalled.as_mut() {
            j.gathering.seal_all(&mut sealed);
            if let skipped @ 1.. = j.journal.already_delivered() {
                tracing::info!(
                    stage = %cx.id,
                    "{skipped} events read again after a restart were in batches already delivered: not sent again"
                );
            }
        }
        let mut held = 0usize;
        for mut batch in sealed.drain(..) {
            for (mut event, tag) in batch.drain() {
                event.settle(Outcome::Errored);
                inputs.release(tag, 1);
                held += 1;
            }
        }
        cx.metrics.add_errored(held as u64);
        if let Some(why) = failure {
            return Err(StageError::Other(why));
        }
        if stop.is_cancelled() && held + inputs.errored_at_stop > 0 {
            return Err(StageError::Other(format!(
                "the drain deadline passed with {} events not delivered to {} (errored: a checkpointing source sends them again after a restart)",
                held + inputs.errored_at_stop,
                c.destination
            )));
        }
        Ok(())
    }

    /// Encodes a new input batch into the batcher; returns the events that
    /// could not be encoded.
    fn take(
        &self,
        mut batch: InputBatch,
        batcher: &mut Batcher,
        sealed: &mut VecDeque<Batch>,
        inputs: &mut Inputs,
        journalled: &mut Option<Journalled>,
        cx: &SinkContext,
    ) -> Vec<(Event, u64, String)> {
        cx.metrics.add_in(batch.len() as u64);
        let events = batch.take();
        let tag = inputs.hold(batch, events.len());
        let now = Instant::now();
        let mut rejected = Vec::new();
        for event in events {
            let key = self
                .partition
                .as_ref()
                .map(|f| f(&event))
                .unwrap_or_default();
            let claim = match journalled.as_mut() {
                Some(j) => j.journal.claim(&key, &event),
                None => Claim::Fresh,
            };
            let pushed = match claim {
                Claim::Fresh => batcher.push(&key, event, tag, self.encoder.as_ref(), now, sealed),
                Claim::Delivered => {
                    let mut event = event;
                    event.settle(Outcome::Delivered);
                    inputs.release(tag, 1);
                    cx.committed(1);
                    Ok(())
                }
                Claim::Regather { id, complete, same } => {
                    let j = journalled.as_mut().expect("claimed by the journal");
                    let name = id.hex();
                    let pushed =
                        j.gathering
                            .push(&name, event, tag, self.encoder.as_ref(), now, sealed);
                    if complete && let Some(mut batch) = j.gathering.close(&name) {
                        batch.set_key(key.as_str().into());
                        let identity = match same {
                            true => Some(id),
                            false => {
                                tracing::warn!(
                                    stage = %cx.id,
                                    "batch {name} was made again from other events than before (the pipeline changed, or a transform is not deterministic): sent under a new name"
                                );
                                None
                            }
                        };
                        batch.set_identity(identity);
                        sealed.push_back(batch);
                    }
                    pushed
                }
            };
            if let Err((event, tag, why)) = pushed {
                rejected.push((event, tag, format!("cannot encode the event: {why}")));
            }
        }
        rejected
    }

    /// Queues gathered batches that did not get all their events (they
    /// waited too long, or the input ended) under their earlier names:
    /// the events missing were not read again because the source's
    /// checkpoint had passed them, so the destination holds the batch.
    /// Events of their extents that come later are batched anew.
    fn regathered_incomplete(
        &self,
        batches: VecDeque<Batch>,
        sealed: &mut VecDeque<Batch>,
        journal: &mut BatchJournal,
        cx: &SinkContext,
    ) {
        for mut batch in batches {
            let id = u128::from_str_radix(batch.key(), 16).ok().map(BatchId);
            if let Some(id) = id {
                journal.forget(id);
            }
            let key = match (&self.partition, batch.events().first()) {
                (Some(f), Some(event)) => f(event),
                _ => String::new(),
            };
            tracing::warn!(
                stage = %cx.id,
                "batch {} made again with {} events only: sent under its name",
                batch.key(),
                batch.len()
            );
            batch.set_key(key.into());
            batch.set_identity(id);
            sealed.push_back(batch);
        }
    }

    /// Commits, dead-letters or drops a finished batch's events. An error
    /// is the reason the stage fails.
    async fn settle(
        &self,
        done: Finished,
        cx: &SinkContext,
        inputs: &mut Inputs,
        journalled: &mut Option<Journalled>,
    ) -> Result<(), String> {
        let c = &self.config;
        let mut failure = None;
        if let (Some(j), Some(id)) = (journalled.as_mut(), done.id)
            && done.rejected.is_empty()
            && done.discarded.is_empty()
            && done.exhausted.is_empty()
            && done.held.is_empty()
            && let Err(e) = j.journal.delivered(id)
        {
            // Costs only a resend under the same name after a crash.
            tracing::warn!(
                stage = %cx.id,
                "batch journal {}: {e}",
                j.journal.path().display()
            );
        }
        if !done.delivered.is_empty() {
            cx.committed(done.delivered.len());
            for (mut event, tag) in done.delivered {
                event.settle(Outcome::Delivered);
                inputs.release(tag, 1);
            }
        }
        if !done.discarded.is_empty() {
            tracing::warn!(
                destination = %c.destination,
                "{} events not sent: {}",
                done.discarded.len(),
                done.discard_reason
            );
            cx.metrics.add_discarded(done.discarded.len() as u64);
            for (mut event, tag) in done.discarded {
                event.settle(Outcome::Rejected);
                inputs.release(tag, 1);
            }
        }
        let mut dead: Vec<(Event, u64, String)> = done.rejected;
        if let Some(why) = &done.gave_up {
            let reason = format!("gave up: {why}");
            dead.extend(
                done.exhausted
                    .into_iter()
                    .map(|(e, t)| (e, t, reason.clone())),
            );
        }
        if !dead.is_empty() {
            let unread = if done.gave_up.is_some() || c.on_rejected == OnRejected::Fail {
                Unread::Fail
            } else {
                Unread::Discard
            };
            let mut tags = Vec::with_capacity(dead.len());
            let mut events = Vec::with_capacity(dead.len());
            for (event, tag, why) in dead {
                tags.push(tag);
                events.push((event, why));
            }
            let warned = &mut inputs.warned_dropping;
            if let Err(why) = dead_letter(cx, events, &c.destination, unread, warned).await {
                failure = Some(why);
            }
            // Released once sent on: until then they hold their input's
            // room in the channel.
            for tag in tags {
                inputs.release(tag, 1);
            }
        }
        if !done.held.is_empty() {
            cx.metrics.add_errored(done.held.len() as u64);
            inputs.errored_at_stop += done.held.len();
            for (mut event, tag) in done.held {
                event.settle(Outcome::Errored);
                inputs.release(tag, 1);
            }
        }
        match failure {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }
}

/// A driver is the sink: a plugin's `build` returns `Box::new(driver)`.
#[async_trait]
impl<S: Service> logbus_plugin_api::Sink for Driver<S> {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        Driver::run(&self, cx).await
    }
}

/// Sleeps until `deadline`, or for ever when there is none (a `select!`
/// branch that never fires).
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Input batches kept until every event taken from them is settled: their
/// drop is what frees room in the channel.
#[derive(Default)]
struct Inputs {
    next: u64,
    held: BTreeMap<u64, (InputBatch, usize)>,
    errored_at_stop: usize,
    /// A drop of refused events was logged as a warning.
    warned_dropping: bool,
}

impl Inputs {
    fn hold(&mut self, batch: InputBatch, events: usize) -> u64 {
        let tag = self.next;
        self.next += 1;
        if events > 0 {
            self.held.insert(tag, (batch, events));
        }
        tag
    }

    fn release(&mut self, tag: u64, n: usize) {
        if let Some((_, left)) = self.held.get_mut(&tag) {
            *left = left.saturating_sub(n);
            if *left == 0 {
                self.held.remove(&tag);
            }
        }
    }
}

/// Sends one batch until the destination has answered for every event,
/// the retry policy is spent, or the drain deadline passes.
async fn deliver<S: Service>(
    service: Arc<S>,
    retry: RetryPolicy,
    mut batch: Batch,
    stop: CancellationToken,
    destination: String,
    metrics: Arc<logbus_plugin_api::StageMetrics>,
) -> Finished {
    let mut done = Finished {
        id: batch.identity(),
        ..Finished::default()
    };
    let started = Instant::now();
    let mut request = match service.prepare(&batch) {
        Ok(r) => r,
        Err(why) => {
            done.rejected = reject_all(&mut batch, &why);
            return done;
        }
    };
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let response = tokio::select! {
            biased;
            _ = stop.cancelled() => {
                done.held = batch.drain();
                return done;
            }
            r = service.send(&request) => r,
        };
        let (reason, retry_after) = match response {
            Response::Delivered => {
                done.delivered.extend(batch.drain());
                return done;
            }
            Response::Rejected { reason } => {
                done.rejected.extend(reject_all(&mut batch, &reason));
                return done;
            }
            Response::Discarded { reason } => {
                done.discarded = batch.drain();
                done.discard_reason = reason;
                return done;
            }
            Response::Retry {
                reason,
                retry_after,
            } => (reason, retry_after),
            Response::Items(results) if results.len() != batch.len() => (
                format!(
                    "the destination answered for {} items of {}",
                    results.len(),
                    batch.len()
                ),
                None,
            ),
            Response::Items(results) => {
                let keep: Vec<bool> = results
                    .iter()
                    .map(|r| matches!(r, ItemResult::Retry(_)))
                    .collect();
                let first_retry = results.iter().find_map(|r| match r {
                    ItemResult::Retry(why) => Some(why.clone()),
                    _ => None,
                });
                for (i, event, tag) in batch.retain(&keep) {
                    match &results[i] {
                        ItemResult::Rejected(why) => done.rejected.push((event, tag, why.clone())),
                        _ => done.delivered.push((event, tag)),
                    }
                }
                let Some(reason) = first_retry else {
                    return done;
                };
                request = match service.prepare(&batch) {
                    Ok(r) => r,
                    Err(why) => {
                        done.rejected.extend(reject_all(&mut batch, &why));
                        return done;
                    }
                };
                (format!("{} items: {reason}", batch.len()), None)
            }
        };
        let Some(delay) =
            retry.next_delay(attempt, started.elapsed(), retry_after, fastrand::f64())
        else {
            done.gave_up = Some(format!(
                "{attempt} attempts over {:.1?}, the last: {reason}",
                started.elapsed()
            ));
            done.exhausted = batch.drain();
            return done;
        };
        tracing::warn!(
            destination = %destination,
            attempt,
            "{} events not delivered, retrying in {delay:.1?}: {reason}",
            batch.len()
        );
        // Counted now, not when the batch ends: a batch that retries for
        // an hour shows in /metrics meanwhile.
        metrics.add_retried(batch.len() as u64);
        tokio::select! {
            biased;
            _ = stop.cancelled() => {
                done.held = batch.drain();
                return done;
            }
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

fn reject_all(batch: &mut Batch, why: &str) -> Vec<(Event, u64, String)> {
    batch
        .drain()
        .into_iter()
        .map(|(e, t)| (e, t, why.to_string()))
        .collect()
}
