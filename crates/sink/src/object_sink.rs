//! The loop of sinks whose unit is an object that can outgrow memory (S3).
//! A [`crate::Driver`] holds a batch's events until the destination
//! answers; an object of gigabytes cannot be held, so here the events are
//! encoded as they come and their bytes uploaded in parts whenever
//! `part_size_bytes` are ready. What is held is one part per open object
//! and, per source batch, one acknowledgement handle: the handles are
//! settled delivered only when the object is complete, so a checkpointing
//! source never moves past an event whose object does not exist yet. An
//! object that cannot be finished (refused for good, out of retries, the
//! drain deadline passed) has its upload aborted and its events settled
//! errored, and the stage ends with the reason.
//!
//! A plugin supplies the [`ObjectStore`] (one attempt per call, no
//! retrying of its own), the [`ObjectFormat`] and how an event picks its
//! object's prefix; retries, limits, ageing, dead letters and shutdown are
//! this module's.
//!
//! Memory: at most `max_open_objects` × `part_size_bytes` of encoded
//! bytes, plus the formats' own buffers (compressor windows, a Parquet
//! row group).
//!
//! With a batch journal ([`crate::journal`]) an object's key and extent
//! are written down before the object is made to exist; after a crash the
//! events re-read from that extent are written into an object of the same
//! key again, which replaces the first, and those of objects known to
//! exist are settled without being written.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use logbus_plugin_api::{
    Ack, CancellationToken, Event, Outcome, SinkContext, StageError, StageMetrics, async_trait,
};
use tokio::time::Instant;

use crate::dead::{Unread, dead_letter};
use crate::driver::{PartitionKey, sleep_until};
use crate::journal::{BatchId, BatchJournal, Claim, Extent, JOURNAL_BATCHES};
use crate::object::{Misfit, ObjectFormat, ObjectWriter};
use crate::retry::{Attempt, Retried, RetryPolicy};

/// Where objects are stored. Every call is one attempt; the driver
/// retries what comes back [`Attempt::Again`] under the sink's policy and
/// a per-attempt timeout, so a store holds no retry loop.
#[async_trait]
pub trait ObjectStore: Send + Sync + 'static {
    /// A multipart upload under way (S3: its upload id).
    type Upload: Send + Sync;
    /// The receipt of one stored part (S3: its number and ETag).
    type Part: Send + Sync;

    /// The most parts one upload takes.
    const MAX_PARTS: usize;

    /// The key of a new object whose prefix is `prefix`.
    fn key(&self, prefix: &str) -> String;

    /// Stores a whole object at once (one that never needed parts).
    async fn put(&self, key: &str, body: &Bytes) -> Attempt<()>;

    /// Starts a multipart upload of `key`.
    async fn start(&self, key: &str) -> Attempt<Self::Upload>;

    /// Stores part `number` (from 1) of `upload`.
    async fn put_part(
        &self,
        key: &str,
        upload: &Self::Upload,
        number: usize,
        body: &Bytes,
    ) -> Attempt<Self::Part>;

    /// Makes the object of `parts` exist.
    async fn complete(&self, key: &str, upload: &Self::Upload, parts: &[Self::Part])
    -> Attempt<()>;

    /// Drops an unfinished upload; once, best effort (`Err` is logged).
    async fn abort(&self, key: &str, upload: &Self::Upload) -> Result<(), String>;
}

/// When an object is finished, and how much is open at once.
#[derive(Debug, Clone)]
pub struct ObjectConfig {
    /// An object is finished once its format measures this many bytes.
    pub max_object_bytes: u64,
    /// ... or once it is this old ...
    pub max_object_age: Duration,
    /// ... or holds this many events.
    pub max_object_events: Option<u64>,
    /// Encoded bytes that make a part.
    pub part_size_bytes: usize,
    /// Objects open at once; a new prefix beyond it finishes the oldest.
    pub max_open_objects: usize,
    pub retry: RetryPolicy,
    /// One attempt's limit; past it the attempt is retried.
    pub request_timeout: Duration,
    /// Names the destination in messages, e.g. `s3://bucket`.
    pub destination: String,
}

/// The object-sink core: an [`ObjectStore`], an [`ObjectFormat`] and the
/// prefix each event's object has.
pub struct ObjectDriver<S: ObjectStore> {
    store: S,
    format: Box<dyn ObjectFormat>,
    prefix: Box<PartitionKey>,
    config: ObjectConfig,
    journal_dir: Option<PathBuf>,
    /// Open while the stage runs with a journal; locked only between
    /// awaits.
    journal: Mutex<Option<BatchJournal>>,
}

/// An object being written.
struct OpenObject<S: ObjectStore> {
    key: String,
    prefix: String,
    /// The positions its events came from: kept only for a new object
    /// of a journalled sink (no per-event work otherwise).
    extent: Option<Extent>,
    /// Made again from a journalled object's re-read events: its name.
    regathered: Option<BatchId>,
    opened: Instant,
    events: u64,
    /// The format's writer; its ready bytes are not yet stored.
    body: Box<dyn ObjectWriter>,
    upload: Option<S::Upload>,
    parts: Vec<S::Part>,
    acks: HeldAcks,
}

/// One handle per source batch of an object's events, settled when the
/// object is complete.
#[derive(Default)]
struct HeldAcks(Vec<Ack>);

impl HeldAcks {
    fn hold(&mut self, mut ack: Ack) {
        if !ack.is_pending() {
            return;
        }
        if self.0.last().is_some_and(|last| last.same_batch(&ack)) {
            // The held handle keeps the batch open; the worst outcome wins.
            ack.settle(Outcome::Delivered);
        } else {
            self.0.push(ack);
        }
    }

    fn settle(&mut self, outcome: Outcome) {
        for mut ack in self.0.drain(..) {
            ack.settle(outcome);
        }
    }
}

/// What the store calls need of the stage (its input stays the loop's).
struct Scope {
    id: Arc<str>,
    metrics: Arc<StageMetrics>,
    stop: CancellationToken,
}

impl<S: ObjectStore> ObjectDriver<S> {
    pub fn new(
        store: S,
        format: Box<dyn ObjectFormat>,
        prefix: impl Fn(&Event) -> String + Send + Sync + 'static,
        config: ObjectConfig,
    ) -> Self {
        ObjectDriver {
            store,
            format,
            prefix: Box::new(prefix),
            config,
            journal_dir: None,
            journal: Mutex::new(None),
        }
    }

    /// Keeps a batch journal of objects in `dir` (`<stage id>.batches`).
    pub fn journal_in(mut self, dir: Option<PathBuf>) -> Self {
        self.journal_dir = dir;
        self
    }

    fn journal(&self) -> std::sync::MutexGuard<'_, Option<BatchJournal>> {
        self.journal.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// Runs until the input ends and every object is finished, an object
    /// fails, or the drain deadline passes.
    pub async fn run(&self, cx: &mut SinkContext) -> Result<(), StageError> {
        let c = &self.config;
        let scope = Scope {
            id: cx.id.clone(),
            metrics: cx.metrics.clone(),
            stop: cx.stop.clone(),
        };
        if let Some(dir) = &self.journal_dir {
            let path = dir.join(format!("{}.batches", cx.id));
            let journal = std::fs::create_dir_all(dir)
                .and_then(|()| BatchJournal::open(&path, JOURNAL_BATCHES))
                .map_err(|e| StageError::Other(format!("batch journal {}: {e}", path.display())))?;
            *self.journal() = Some(journal);
        }
        // Objects by prefix; those being made again by "\0" and their
        // name.
        let mut open: HashMap<String, OpenObject<S>> = HashMap::new();
        let mut warned = false;
        // Once a shutdown is requested, every object is finished as soon
        // as no more input is ready (the sources wait for these events'
        // acknowledgements before they end).
        let mut draining = false;
        let failure = 'run: loop {
            let ready = if draining && !open.is_empty() {
                match cx.input.try_recv() {
                    Some(batch) => Some(batch),
                    None => {
                        let mut objects = open.drain().collect::<Vec<_>>().into_iter();
                        while let Some((_, object)) = objects.next() {
                            match self.finish(object, &scope).await {
                                Ok(n) => cx.committed(n as usize),
                                Err(e) => {
                                    // The rest are given up below.
                                    open.extend(objects);
                                    break 'run Some(e);
                                }
                            }
                        }
                        continue;
                    }
                }
            } else {
                None
            };
            // The next object to age out bounds the wait for input.
            let next_due = open.values().map(|x| x.opened + c.max_object_age).min();
            let batch = match ready {
                Some(batch) => Some(batch),
                None => tokio::select! {
                    b = cx.input.recv() => b,
                    () = cx.shutdown.cancelled(), if !draining => {
                        draining = true;
                        continue;
                    }
                    () = sleep_until(next_due) => {
                        let due: Vec<String> = open
                            .iter()
                            .filter(|(_, x)| x.opened.elapsed() >= c.max_object_age)
                            .map(|(k, _)| k.clone())
                            .collect();
                        for prefix in due {
                            let object = open.remove(&prefix).expect("listed");
                            match self.finish(object, &scope).await {
                                Ok(n) => cx.committed(n as usize),
                                Err(e) => break 'run Some(e),
                            }
                        }
                        continue;
                    }
                },
            };
            let Some(mut batch) = batch else { break None };
            cx.metrics.add_in(batch.len() as u64);
            let mut refused = Vec::new();
            for event in batch.take() {
                match self.write(event, &mut open, &scope, cx).await {
                    Ok(None) => {}
                    Ok(Some(misfit)) => refused.push(misfit),
                    Err(e) => break 'run Some(e),
                }
            }
            if let Err(e) =
                dead_letter(cx, refused, &c.destination, Unread::Error, &mut warned).await
            {
                break Some(e);
            }
            // The batch's events are encoded: its channel slots return.
            drop(batch);
        };
        let failure = match failure {
            Some(e) => Some(e),
            None => {
                // The input ended: every open object is finished.
                let mut failed = None;
                for (_, object) in open.drain() {
                    if failed.is_some() {
                        self.give_up(object, &scope).await;
                        continue;
                    }
                    match self.finish(object, &scope).await {
                        Ok(n) => cx.committed(n as usize),
                        Err(e) => failed = Some(e),
                    }
                }
                failed
            }
        };
        let Some(failure) = failure else {
            return Ok(());
        };
        let mut held = 0;
        for (_, object) in open.drain() {
            held += self.give_up(object, &scope).await;
        }
        Err(StageError::Other(if held > 0 {
            format!(
                "{failure}; {held} events of unfinished objects were not written (a checkpointing source sends them again)"
            )
        } else {
            failure
        }))
    }

    /// Writes one event into its prefix's object, opening, finishing and
    /// uploading as the limits say. `Ok(Some)` is the event refused with
    /// the reason; `Err` fails the stage.
    async fn write(
        &self,
        mut event: Event,
        open: &mut HashMap<String, OpenObject<S>>,
        scope: &Scope,
        cx: &SinkContext,
    ) -> Result<Option<(Event, String)>, String> {
        let prefix = (self.prefix)(&event);
        let claim = match self.journal().as_mut() {
            Some(j) => j.claim(&prefix, &event),
            None => Claim::Fresh,
        };
        match claim {
            Claim::Fresh => {}
            Claim::Delivered => {
                event.settle(Outcome::Delivered);
                cx.committed(1);
                return Ok(None);
            }
            Claim::Regather { id, complete, .. } => {
                let slot = format!("\0{}", id.hex());
                if !open.contains_key(&slot) {
                    let name = self
                        .journal()
                        .as_ref()
                        .and_then(|j| j.name_of(id).map(str::to_string));
                    let key = name.unwrap_or_else(|| self.store.key(&prefix));
                    open.insert(
                        slot.clone(),
                        self.open_object(key, prefix.clone(), Some(id))?,
                    );
                }
                let object = open.get_mut(&slot).expect("opened above");
                match object.body.write(&event) {
                    Ok(()) => {}
                    Err(Misfit::Never(why)) => return Ok(Some((event, why))),
                    // Not as it was: written as a new event below.
                    Err(Misfit::NextObject(_)) => {
                        return self.write_fresh(event, prefix, open, scope, cx).await;
                    }
                }
                self.written(&mut event, &slot, open, scope, cx, |_| complete)
                    .await?;
                return Ok(None);
            }
        }
        self.write_fresh(event, prefix, open, scope, cx).await
    }

    /// Counts `event`, just written into the object at `slot`, and holds
    /// its acknowledgement; then finishes the object when `full` says so,
    /// or stores a part when one is ready.
    async fn written(
        &self,
        event: &mut Event,
        slot: &str,
        open: &mut HashMap<String, OpenObject<S>>,
        scope: &Scope,
        cx: &SinkContext,
        full: impl FnOnce(&OpenObject<S>) -> bool,
    ) -> Result<(), String> {
        let object = open.get_mut(slot).expect("just written");
        object.events += 1;
        if let Some(extent) = &mut object.extent {
            extent.add(event);
        }
        object.acks.hold(event.take_ack());
        if full(object) {
            let object = open.remove(slot).expect("just written");
            let n = self.finish(object, scope).await?;
            cx.committed(n as usize);
        } else if object.body.ready().len() >= self.config.part_size_bytes {
            self.flush_part(object, scope).await?;
        }
        Ok(())
    }

    fn open_object(
        &self,
        key: String,
        prefix: String,
        regathered: Option<BatchId>,
    ) -> Result<OpenObject<S>, String> {
        Ok(OpenObject {
            key,
            prefix,
            extent: match (&self.journal_dir, regathered) {
                (Some(_), None) => Some(Extent::default()),
                _ => None,
            },
            regathered,
            opened: Instant::now(),
            events: 0,
            body: self.format.open()?,
            upload: None,
            parts: Vec::new(),
            acks: HeldAcks::default(),
        })
    }

    /// [`ObjectDriver::write`] for an event no journalled object claims.
    async fn write_fresh(
        &self,
        mut event: Event,
        prefix: String,
        open: &mut HashMap<String, OpenObject<S>>,
        scope: &Scope,
        cx: &SinkContext,
    ) -> Result<Option<(Event, String)>, String> {
        let c = &self.config;
        // At most twice: an event that does not fit its prefix's open
        // object (a Parquet schema) finishes it and starts the next.
        let mut tries = 0;
        loop {
            tries += 1;
            // Objects being made again are not finished early: they close
            // when their last event comes.
            let oldest = open
                .iter()
                .filter(|(_, x)| x.regathered.is_none())
                .min_by_key(|(_, x)| x.opened)
                .map(|(k, _)| k.clone());
            if !open.contains_key(&prefix)
                && open.len() >= c.max_open_objects
                && let Some(oldest) = oldest
            {
                let object = open.remove(&oldest).expect("listed");
                match self.finish(object, scope).await {
                    Ok(n) => cx.committed(n as usize),
                    Err(e) => {
                        event.settle(Outcome::Errored);
                        return Err(e);
                    }
                }
            }
            let object = match open.entry(prefix.clone()) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let key = self.store.key(e.key());
                    e.insert(self.open_object(key, prefix.clone(), None)?)
                }
            };
            match object.body.write(&event) {
                Ok(()) => {}
                Err(Misfit::NextObject(_)) if tries == 1 && object.events > 0 => {
                    let object = open.remove(&prefix).expect("just written");
                    match self.finish(object, scope).await {
                        Ok(n) => cx.committed(n as usize),
                        Err(e) => {
                            event.settle(Outcome::Errored);
                            return Err(e);
                        }
                    }
                    continue;
                }
                Err(Misfit::NextObject(why) | Misfit::Never(why)) => {
                    return Ok(Some((event, why)));
                }
            }
            self.written(&mut event, &prefix, open, scope, cx, |object| {
                object.body.size() >= c.max_object_bytes
                    || c.max_object_events.is_some_and(|m| object.events >= m)
            })
            .await?;
            return Ok(None);
        }
    }

    /// Runs one store call under the retry policy and the per-attempt
    /// timeout; `Err` once it is refused for good, retries run out or the
    /// drain deadline passes.
    async fn retrying<T, Fut>(
        &self,
        scope: &Scope,
        what: &str,
        mut attempt: impl FnMut() -> Fut,
    ) -> Result<T, String>
    where
        Fut: Future<Output = Attempt<T>>,
    {
        let timeout = self.config.request_timeout;
        let stop = &scope.stop;
        let retried = self
            .config
            .retry
            .run(
                stop,
                |_| {
                    let sent = attempt();
                    async move {
                        tokio::select! {
                            r = tokio::time::timeout(timeout, sent) => r.unwrap_or_else(|_| {
                                Attempt::again(format!("no answer within {timeout:?}"))
                            }),
                            () = stop.cancelled() => {
                                Attempt::Fail("stopped at the drain deadline while retrying".into())
                            }
                        }
                    }
                },
                |message, delay| {
                    tracing::warn!(stage = %scope.id, "{what}: {message}; retrying in {delay:?}");
                    scope.metrics.add_retried(1);
                },
            )
            .await;
        match retried {
            Retried::Done(v) => Ok(v),
            Retried::Failed(message) => Err(format!("{what}: {message}")),
            Retried::GaveUp { reason, attempts } => Err(format!(
                "{what}: {reason} (gave up after {attempts} attempts)"
            )),
            Retried::Stopped(reason) => Err(format!(
                "{what}: {reason} (stopped at the drain deadline while retrying)"
            )),
        }
    }

    fn name(&self, key: &str) -> String {
        format!("{}/{key}", self.config.destination)
    }

    /// The number of the object's next part, if the store takes one more.
    fn next_part(&self, key: &str, done: usize) -> Result<usize, String> {
        next_part_number(done, S::MAX_PARTS).ok_or_else(|| {
            format!(
                "{}: more than {} parts (raise part_size_bytes or lower max_object_bytes)",
                self.name(key),
                S::MAX_PARTS
            )
        })
    }

    async fn upload_part(
        &self,
        scope: &Scope,
        key: &str,
        upload: &S::Upload,
        number: usize,
        body: Bytes,
    ) -> Result<S::Part, String> {
        self.retrying(
            scope,
            &format!("uploading part {number} of {}", self.name(key)),
            || self.store.put_part(key, upload, number, &body),
        )
        .await
    }

    /// Stores the bytes encoded so far as the object's next part.
    async fn flush_part(&self, object: &mut OpenObject<S>, scope: &Scope) -> Result<(), String> {
        if object.upload.is_none() {
            let key = &object.key;
            let upload = self
                .retrying(
                    scope,
                    &format!("starting the upload of {}", self.name(key)),
                    || self.store.start(key),
                )
                .await?;
            object.upload = Some(upload);
        }
        let number = self.next_part(&object.key, object.parts.len())?;
        let body = Bytes::from(std::mem::take(object.body.ready()));
        let upload = object.upload.as_ref().expect("started above");
        let part = self
            .upload_part(scope, &object.key, upload, number, body)
            .await?;
        object.parts.push(part);
        Ok(())
    }

    /// Finishes the object: the last part and the completion (or one put
    /// for an object that never needed parts), then its events are
    /// delivered. Returns how many.
    async fn finish(&self, mut object: OpenObject<S>, scope: &Scope) -> Result<u64, String> {
        if object.events == 0 && object.upload.is_none() {
            // Every event was refused: no object.
            return Ok(0);
        }
        // A journal forgets an object made again once it is finished, so
        // that no later event of its extent makes it a third time (under
        // its key, that would replace this one).
        let id = match object.regathered {
            Some(id) => {
                if let Some(j) = self.journal().as_mut() {
                    j.forget(id);
                }
                id
            }
            None => BatchId::named(&object.key),
        };
        // (An object made again keeps no extent: it is journalled already.)
        let recorded = match (self.journal().as_mut(), &object.extent) {
            (Some(j), Some(extent)) => j
                .record(id, &object.prefix, extent, Some(&object.key))
                .map_err(|e| format!("batch journal {}: {e}", j.path().display())),
            _ => Ok(()),
        };
        let result = match object.body.finish() {
            Err(e) => Err(format!("encoding {}: {e}", self.name(&object.key))),
            Ok(_) if recorded.is_err() => recorded,
            Ok(body) => {
                self.store_last(
                    &object.key,
                    object.upload.as_ref(),
                    &mut object.parts,
                    body,
                    scope,
                )
                .await
            }
        };
        match result {
            Ok(()) => {
                if let Some(j) = self.journal().as_mut()
                    && (object.extent.as_ref().is_some_and(Extent::is_replayable)
                        || object.regathered.is_some())
                    && let Err(e) = j.delivered(id)
                {
                    tracing::warn!(stage = %scope.id, "batch journal {}: {e}", j.path().display());
                }
                object.acks.settle(Outcome::Delivered);
                tracing::debug!(stage = %scope.id, key = %object.key, events = object.events, "object written");
                Ok(object.events)
            }
            Err(e) => {
                object.acks.settle(Outcome::Errored);
                scope.metrics.add_errored(object.events);
                Err(e)
            }
        }
    }

    /// Stores the object's last bytes: one put, or the last part and the
    /// completion (the upload aborted if either fails).
    async fn store_last(
        &self,
        key: &str,
        upload: Option<&S::Upload>,
        parts: &mut Vec<S::Part>,
        body: Vec<u8>,
        scope: &Scope,
    ) -> Result<(), String> {
        let body = Bytes::from(body);
        let Some(upload) = upload else {
            return self
                .retrying(scope, &format!("writing {}", self.name(key)), || {
                    self.store.put(key, &body)
                })
                .await;
        };
        let stored = async {
            let number = self.next_part(key, parts.len())?;
            let part = self.upload_part(scope, key, upload, number, body).await?;
            parts.push(part);
            let parts = &*parts;
            self.retrying(scope, &format!("completing {}", self.name(key)), || {
                self.store.complete(key, upload, parts)
            })
            .await
        }
        .await;
        if stored.is_err() {
            self.abort(key, upload, scope).await;
        }
        stored
    }

    /// Best effort: an upload left behind costs storage until the
    /// destination's own clean-up (an S3 lifecycle rule) removes it.
    async fn abort(&self, key: &str, upload: &S::Upload, scope: &Scope) {
        let r =
            tokio::time::timeout(self.config.request_timeout, self.store.abort(key, upload)).await;
        let why = match r {
            Ok(Ok(())) => return,
            Ok(Err(why)) => why,
            Err(_) => format!("no answer within {:?}", self.config.request_timeout),
        };
        tracing::warn!(stage = %scope.id, "could not abort the unfinished upload of {} ({why}); a lifecycle rule for incomplete multipart uploads removes it", self.name(key));
    }

    /// Gives an object up: its upload aborted, its events errored.
    /// Returns how many.
    async fn give_up(&self, mut object: OpenObject<S>, scope: &Scope) -> u64 {
        if let Some(upload) = &object.upload {
            self.abort(&object.key, upload, scope).await;
        }
        object.acks.settle(Outcome::Errored);
        scope.metrics.add_errored(object.events);
        object.events
    }
}

/// A driver is the sink, for a store made at build time.
#[async_trait]
impl<S: ObjectStore> logbus_plugin_api::Sink for ObjectDriver<S> {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        ObjectDriver::run(&self, cx).await
    }
}

/// The number of the part after `done` parts, if a store taking at most
/// `max` parts takes one more: parts are numbered from 1.
fn next_part_number(done: usize, max: usize) -> Option<usize> {
    done.checked_add(1).filter(|n| *n <= max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts are numbered from 1 to the store's most; the part after the
    /// last is refused before it is sent.
    #[test]
    fn parts_are_numbered_from_one_to_the_stores_most() {
        assert_eq!(next_part_number(0, 10_000), Some(1));
        assert_eq!(next_part_number(9_998, 10_000), Some(9_999));
        assert_eq!(next_part_number(9_999, 10_000), Some(10_000));
        assert_eq!(next_part_number(10_000, 10_000), None);
        assert_eq!(next_part_number(usize::MAX, 10_000), None);
    }
}
