//! `source: s3` — the objects under a bucket's prefix, listed in key order,
//! each read as a stream (decompressed by its magic bytes, cut into
//! messages), several at once; with `poll_interval_ms`, listed again for
//! new keys.
//!
//! The checkpoint is a key and a set: every listed key up to `after` is
//! finished, and so are the keys in `done` (finished out of order, since
//! objects are read concurrently); an object partly delivered has the count
//! of its first messages that are (`partial`), so a restart skips them. An
//! object counts as finished once it was read to its end and every batch
//! of it was acknowledged delivered; the checkpoint never passes an
//! unfinished or errored batch, so a restart neither re-reads what was
//! delivered nor skips what was not (a crash re-reads what was in flight).
//! A transient failure (a timeout, a dropped connection, a 5xx answer)
//! is retried with the sink core's backoff: a listing is asked again, an
//! object is read again from its start and the messages already sent in
//! this run are skipped, so nothing is sent twice for it.
//! S3 lists keys in UTF-8 binary order: a key that appears later but sorts
//! before `after` is not read (name objects so that new ones sort last, as
//! dated prefixes do).
//!
//! Why one module: the listing, the concurrent reads and the checkpoint
//! (`after`, `done`, `partial`) change together, since what is finished
//! is decided by all three.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_s3::Client;
use logbus_compress::ReadCompression;
use logbus_framing::Deframer;
use logbus_plugin_api::{
    AckReceiver, BatchAck, BuildContext, CheckOptions, Event, Meta, OptionError, OrderedCheckpoint,
    Outcome, Output, Source, SourceContext, StageError, StageKind, TypedPlugin, async_trait,
    now_ns,
};
use serde::{Deserialize, Serialize};

use crate::client::{AwsOptions, describe, s3_client};
use logbus_sink::{Attempt, Retried, RetryDefaults, RetryPolicy, Retrying};

/// Read size from an object's (decompressed) stream.
const READ_CHUNK: usize = 128 * 1024;
/// How long a source that read everything waits for its last events to be
/// delivered before it saves what it has and ends.
const FINAL_ACK_WAIT: Duration = Duration::from_secs(30);
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// Options of `source: s3`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct S3SourceOptions {
    pub bucket: String,
    /// Only keys starting with this.
    #[serde(default)]
    pub prefix: String,
    /// Glob patterns a key must match (any of them; all keys if empty).
    #[serde(default)]
    pub include: Vec<String>,
    /// Glob patterns of keys to leave out.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Only keys after this one (in S3's key order).
    pub start_after: Option<String>,
    /// List again this often for new keys; unset: one pass, then the
    /// source ends once what it read is delivered.
    pub poll_interval_ms: Option<u64>,
    /// Objects read at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// `auto` detects each object's format from its first bytes.
    #[serde(default)]
    pub compression: ReadCompression,
    #[serde(default)]
    pub framing: logbus_framing::Framing,
    /// A longer message is cut (newline framing) or ends the object with
    /// an error (counted framings).
    #[serde(default = "default_max_line")]
    pub max_line_bytes: usize,
    /// Where the checkpoint (`<stage>.s3.json`) is kept; unset: none (a
    /// restart reads everything again).
    pub state_dir: Option<PathBuf>,
    #[serde(flatten)]
    pub aws: AwsOptions,
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    #[serde(flatten)]
    pub retrying: Retrying<S3SourceDefaults>,
}

/// `source: s3`'s own retry defaults.
pub struct S3SourceDefaults;

impl RetryDefaults for S3SourceDefaults {}

fn default_concurrency() -> usize {
    4
}
fn default_max_line() -> usize {
    1 << 20
}
fn default_request_timeout_ms() -> u64 {
    60_000
}

impl CheckOptions for S3SourceOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = self.aws.check();
        if self.bucket.is_empty() {
            errors.push(OptionError::at(&["bucket"], "must not be empty"));
        }
        for (key, list) in [("include", &self.include), ("exclude", &self.exclude)] {
            for (i, g) in list.iter().enumerate() {
                if let Err(e) = glob::Pattern::new(g) {
                    errors.push(OptionError::at(
                        &[key, &i.to_string()],
                        format!("`{g}` is not a glob: {e}"),
                    ));
                }
            }
        }
        if !(1..=64).contains(&self.concurrency) {
            errors.push(OptionError::at(
                &["concurrency"],
                format!("must be between 1 and 64, got {}", self.concurrency),
            ));
        }
        for (key, value) in [
            ("max_line_bytes", self.max_line_bytes as u64),
            ("request_timeout_ms", self.request_timeout_ms),
        ] {
            if value == 0 {
                errors.push(OptionError::at(&[key], "must be at least 1"));
            }
        }
        errors.extend(self.retrying.check());
        if self.poll_interval_ms == Some(0) {
            errors.push(OptionError::at(&["poll_interval_ms"], "must be at least 1"));
        }
        errors
    }
}

pub struct S3Source;

impl TypedPlugin for S3Source {
    type Options = S3SourceOptions;
    const NAME: &'static str = "s3";
    const KIND: StageKind = StageKind::Source;

    type Stage = Box<dyn Source>;
    const DESCRIPTION: &'static str = "The objects under an S3 prefix (or any S3-compatible store), listed in key order and optionally polled for new ones, read as streams (decompressed by magic bytes), with a checkpoint of finished keys and of the messages delivered from a partly read object.";
    const ACKNOWLEDGEMENTS: Option<&'static str> = Some(
        "with state_dir: an object's key enters the checkpoint once the sinks confirmed every event of it, and a partly confirmed object resumes after its confirmed messages, so a restart re-sends, never skips (without it, every run reads every object)",
    );

    /// The prefix listed (one key) with the stage's credentials.
    fn connect(
        &self,
        o: &Self::Options,
        _cx: logbus_plugin_api::ConnectContext,
    ) -> Option<logbus_plugin_api::Probe> {
        let (aws, bucket, prefix) = (o.aws.clone(), o.bucket.clone(), o.prefix.clone());
        Some(Box::pin(async move {
            let client = s3_client(&aws).await;
            let listed = client
                .list_objects_v2()
                .bucket(&bucket)
                .prefix(&prefix)
                .max_keys(1)
                .send()
                .await;
            match listed {
                Ok(_) => Vec::new(),
                Err(e) => vec![crate::client::probe_finding(
                    &e,
                    &format!("S3 bucket `{bucket}`"),
                    &["NoSuchBucket"],
                    &["bucket"],
                    false,
                )],
            }
        }))
    }

    /// `state_dir` is made at start.
    fn host_needs(
        &self,
        o: &Self::Options,
        cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        use logbus_plugin_api::{HostNeed, StatedNeed};
        o.state_dir
            .iter()
            .map(|dir| {
                StatedNeed::new(
                    HostNeed::WriteDir {
                        path: cx.resolve(dir),
                        create: true,
                    },
                    &["state_dir"],
                )
            })
            .collect()
    }

    /// Raw events (one per line or message); a `codec:` parses them.
    /// An object's records are re-read after a crash until the
    /// checkpoint passes them.
    fn flow(&self, _options: &Self::Options) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::raw().then(logbus_plugin_api::Step::Replay(
            logbus_plugin_api::Replay {
                rereads: true,
                positions: false,
            },
        ))
    }

    fn build(&self, options: Self::Options, cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        let globs = |list: &[String]| -> Vec<glob::Pattern> {
            list.iter()
                .filter_map(|g| glob::Pattern::new(g).ok())
                .collect()
        };
        Ok(Box::new(S3Reader {
            include: globs(&options.include),
            exclude: globs(&options.exclude),
            state: options
                .state_dir
                .as_ref()
                .map(|d| cx.resolve(d).join(format!("{}.s3.json", cx.stage_id))),
            options,
        }))
    }
}

struct S3Reader {
    options: S3SourceOptions,
    include: Vec<glob::Pattern>,
    exclude: Vec<glob::Pattern>,
    state: Option<PathBuf>,
}

/// What the checkpoint file holds.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct Saved {
    /// Every key up to this one is finished.
    after: Option<String>,
    /// Keys after `after` that are finished.
    done: BTreeSet<String>,
    /// Keys partly delivered: how many of their first messages.
    partial: BTreeMap<String, u64>,
}

/// One object being read: the acknowledgements of its batches, by the
/// count of messages each ends at.
struct Track {
    checkpoint: Mutex<OrderedCheckpoint<u64>>,
    /// Messages skipped at the start (delivered by an earlier run).
    skipped: u64,
    /// `skipped`, then the count of the object's first messages sent in
    /// this run: a reading attempt after a failure skips them.
    sent: std::sync::atomic::AtomicU64,
    /// Read to its end (every batch begun).
    read_all: std::sync::atomic::AtomicBool,
}

impl AckReceiver for Track {
    fn finished(&self, token: u64, outcome: Outcome) {
        self.lock().finish(token, outcome);
    }
}

impl Track {
    /// An object whose first `skipped` messages an earlier run delivered.
    fn new(skipped: u64) -> Self {
        Track {
            checkpoint: Mutex::new(OrderedCheckpoint::new()),
            skipped,
            sent: std::sync::atomic::AtomicU64::new(skipped),
            read_all: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OrderedCheckpoint<u64>> {
        self.checkpoint.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finished(&self) -> bool {
        self.read_all.load(std::sync::atomic::Ordering::Acquire) && self.lock().outstanding() == 0
    }

    /// Messages delivered from the start.
    fn delivered(&self) -> u64 {
        self.lock().committed().copied().unwrap_or(self.skipped)
    }
}

/// The keys of the current and earlier passes and how far each got.
#[derive(Default)]
struct Progress {
    saved: Saved,
    /// Keys of this pass, in order, with their tracks once reading began.
    pass: BTreeMap<String, Option<Arc<Track>>>,
}

impl Progress {
    /// The checkpoint as it stands: `after` moves over every finished key
    /// in order; finished ones beyond go to `done`.
    fn checkpoint(&self) -> Saved {
        let mut saved = self.saved.clone();
        let mut contiguous = true;
        for (key, track) in &self.pass {
            let finished = track.as_ref().is_some_and(|t| t.finished());
            if finished && contiguous {
                // (Its own entries go with the others at or before `after`.)
                saved.after = Some(key.clone());
                continue;
            }
            contiguous = false;
            if finished {
                saved.done.insert(key.clone());
                saved.partial.remove(key);
            } else if let Some(t) = track {
                let n = t.delivered();
                if n > 0 {
                    saved.partial.insert(key.clone(), n);
                }
            }
        }
        // Keys at or before `after` need no entry of their own.
        if let Some(after) = &saved.after {
            saved.done.retain(|k| k > after);
            saved.partial.retain(|k, _| k > after);
        }
        saved
    }

    fn worth_waiting(&self) -> bool {
        self.pass
            .values()
            .flatten()
            .any(|t| t.lock().worth_waiting())
    }
}

fn save(path: &Option<PathBuf>, saved: &Saved, stage: &str) {
    let Some(path) = path else { return };
    let body = serde_json::to_vec_pretty(saved).expect("plain data");
    if let Err(e) = logbus_plugin_api::state::replace_file(path, &body) {
        tracing::warn!(stage, "cannot save the checkpoint {}: {e}", path.display());
    }
}

fn load(path: &Option<PathBuf>, stage: &str) -> Result<Saved, StageError> {
    let Some(path) = path else {
        return Ok(Saved::default());
    };
    match std::fs::read(path) {
        Ok(body) => serde_json::from_slice(&body).map_err(|e| {
            StageError::Other(format!(
                "the checkpoint {} is damaged ({e}); move it away to read the bucket from the start",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    StageError::io(format!("creating the state directory {}", dir.display()), e)
                })?;
            }
            tracing::debug!(stage, "no checkpoint yet at {}", path.display());
            Ok(Saved::default())
        }
        Err(e) => Err(StageError::io(
            format!("reading the checkpoint {}", path.display()),
            e,
        )),
    }
}

impl S3Reader {
    fn wanted(&self, key: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|g| g.matches(key)))
            && !self.exclude.iter().any(|g| g.matches(key))
    }

    /// Every wanted key after `after`, in order, not yet finished.
    fn retry_policy(&self) -> RetryPolicy {
        let o = &self.options;
        o.retrying.policy()
    }

    /// [`Self::list`], retried while it fails transiently; `None` at a
    /// shutdown.
    async fn list_retrying(
        &self,
        client: &Client,
        saved: &Saved,
        cx: &SourceContext,
    ) -> Option<Result<Vec<String>, StageError>> {
        let o = &self.options;
        let what = format!("listing s3://{}/{}", o.bucket, o.prefix);
        let retried = self
            .retry_policy()
            .run(
                &cx.shutdown,
                |_| async {
                    match self.list(client, saved).await {
                        Ok(keys) => Attempt::Done(keys),
                        Err((message, true)) => Attempt::again(message),
                        Err((message, false)) => Attempt::Fail(message),
                    }
                },
                |message, delay| {
                    tracing::warn!(stage = %cx.id, "{what}: {message}; retrying in {delay:?}");
                    cx.output.metrics().add_retried(1);
                },
            )
            .await;
        match retried {
            Retried::Done(keys) => Some(Ok(keys)),
            Retried::Failed(message) => Some(Err(StageError::Other(format!("{what}: {message}")))),
            Retried::GaveUp { reason, attempts } => Some(Err(StageError::Other(format!(
                "{what}: {reason} (gave up after {attempts} attempts)"
            )))),
            Retried::Stopped(_) => None,
        }
    }

    async fn list(&self, client: &Client, saved: &Saved) -> Result<Vec<String>, (String, bool)> {
        let o = &self.options;
        let after = match (&saved.after, &o.start_after) {
            (Some(a), Some(b)) => Some(a.max(b).clone()),
            (a, b) => a.clone().or_else(|| b.clone()),
        };
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut r = client.list_objects_v2().bucket(&o.bucket).prefix(&o.prefix);
            if let Some(a) = &after {
                r = r.start_after(a);
            }
            if let Some(t) = &token {
                r = r.continuation_token(t);
            }
            let page = tokio::time::timeout(Duration::from_millis(o.request_timeout_ms), r.send())
                .await
                .map_err(|_| ("no answer in time".to_string(), true))?
                .map_err(|e| describe(&e, RETRYABLE))?;
            for object in page.contents() {
                if let Some(k) = object.key()
                    && self.wanted(k)
                    && !saved.done.contains(k)
                {
                    keys.push(k.to_string());
                }
            }
            match page.next_continuation_token() {
                Some(t) if page.is_truncated() == Some(true) => token = Some(t.to_string()),
                _ => break,
            }
        }
        Ok(keys)
    }
}

/// S3's codes for "try again".
const RETRYABLE: &[&str] = &["SlowDown", "RequestTimeout", "InternalError"];

/// Why reading an object failed, and whether reading it again could
/// succeed (the connection failed, not the object's content).
struct ReadFailure {
    error: StageError,
    transient: bool,
}

impl ReadFailure {
    fn of_content(error: StageError) -> ReadFailure {
        ReadFailure {
            error,
            transient: false,
        }
    }
}

/// The object's body, noting whether a read of it failed (as opposed to
/// the decompressor or the deframer above it).
struct Watched<R> {
    inner: R,
    failed: Arc<std::sync::atomic::AtomicBool>,
}

impl<R: Read> Read for Watched<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf).inspect_err(|e| {
            if e.kind() != std::io::ErrorKind::Interrupted {
                self.failed
                    .store(true, std::sync::atomic::Ordering::Release);
            }
        })
    }
}

/// Reads one object into the output: the first `track.sent` messages are
/// left out. Runs on a blocking thread (decompression and framing are
/// synchronous); sends through `handle`.
#[allow(clippy::too_many_arguments)]
fn read_object(
    reader: impl Read,
    what: &str,
    options: &S3SourceOptions,
    track: &Arc<Track>,
    output: &Output,
    handle: &tokio::runtime::Handle,
    shutdown: &logbus_plugin_api::CancellationToken,
    template: &Meta,
) -> Result<bool, ReadFailure> {
    let body_failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = Watched {
        inner: reader,
        failed: body_failed.clone(),
    };
    let failure = |error: StageError| ReadFailure {
        error,
        transient: body_failed.load(std::sync::atomic::Ordering::Acquire),
    };
    let mut reader = logbus_compress::open(reader, options.compression)
        .map_err(|e| failure(StageError::io(format!("reading {what}"), e)))?;
    let mut deframer = Deframer::new(options.framing, options.max_line_bytes);
    let mut scratch = vec![0u8; READ_CHUNK];
    let mut messages = Vec::new();
    let mut count = 0u64;
    let send = |messages: &mut Vec<logbus_plugin_api::Bytes>, count: &mut u64| {
        let first = *count;
        *count += messages.len() as u64;
        let sent = track.sent.load(std::sync::atomic::Ordering::Acquire);
        let fresh: Vec<_> = messages
            .drain(..)
            .enumerate()
            .filter(|(i, _)| first + *i as u64 >= sent)
            .map(|(_, m)| m)
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        let token = track.lock().begin(*count, fresh.len() as u64);
        let receiver: Arc<dyn AckReceiver> = track.clone();
        let ack = BatchAck::new(receiver, token);
        let meta = Meta {
            ingest_ns: now_ns(),
            ..template.clone()
        };
        let events: Vec<Event> = fresh
            .into_iter()
            .map(|m| Event::raw(m, meta.clone()).with_ack(ack.handle()))
            .collect();
        drop(ack);
        handle
            .block_on(output.send(events))
            .map_err(|_| ReadFailure::of_content(StageError::OutputClosed))?;
        track
            .sent
            .fetch_max(*count, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    };
    loop {
        if shutdown.is_cancelled() {
            return Ok(false);
        }
        let n = match reader.read(&mut scratch) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(failure(StageError::io(format!("reading {what}"), e))),
        };
        deframer
            .push(&scratch[..n], &mut messages)
            .map_err(|e| ReadFailure::of_content(StageError::Other(format!("{what}: {e}"))))?;
        if !messages.is_empty() {
            send(&mut messages, &mut count)?;
        }
    }
    if let Some(last) = deframer
        .finish()
        .map_err(|e| ReadFailure::of_content(StageError::Other(format!("{what}: {e}"))))?
    {
        messages.push(last);
        send(&mut messages, &mut count)?;
    }
    Ok(true)
}

/// One attempt at an object: its download started and its messages read
/// (those already sent skipped).
#[allow(clippy::too_many_arguments)]
async fn read_attempt(
    client: &Client,
    this: &Arc<S3Reader>,
    key: &str,
    what: &str,
    track: &Arc<Track>,
    output: &Output,
    handle: &tokio::runtime::Handle,
    shutdown: &logbus_plugin_api::CancellationToken,
    template: &Meta,
) -> Result<(), ReadFailure> {
    let o = &this.options;
    let object = match tokio::time::timeout(
        Duration::from_millis(o.request_timeout_ms),
        client.get_object().bucket(&o.bucket).key(key).send(),
    )
    .await
    {
        Err(_) => {
            return Err(ReadFailure {
                error: StageError::Other(format!("reading {what}: no answer in time")),
                transient: true,
            });
        }
        Ok(Err(e)) => {
            let (message, transient) = describe(&e, RETRYABLE);
            return Err(ReadFailure {
                error: StageError::Other(format!("reading {what}: {message}")),
                transient,
            });
        }
        Ok(Ok(object)) => object,
    };
    let body = object.body.into_async_read();
    let (this, what, track, output, handle, shutdown, template) = (
        this.clone(),
        what.to_string(),
        track.clone(),
        output.clone(),
        handle.clone(),
        shutdown.clone(),
        template.clone(),
    );
    tokio::task::spawn_blocking(move || {
        let reader = tokio_util::io::SyncIoBridge::new_with_handle(body, handle.clone());
        let complete = read_object(
            reader,
            &what,
            &this.options,
            &track,
            &output,
            &handle,
            &shutdown,
            &template,
        )?;
        if complete {
            track
                .read_all
                .store(true, std::sync::atomic::Ordering::Release);
        }
        Ok(())
    })
    .await
    .map_err(|e| {
        ReadFailure::of_content(StageError::Other(format!("an object reader failed: {e}")))
    })?
}

#[async_trait]
impl Source for S3Reader {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        let o = &self.options;
        let client = s3_client(&o.aws).await;
        let progress = Arc::new(Mutex::new(Progress {
            saved: load(&self.state, &cx.id)?,
            pass: BTreeMap::new(),
        }));
        let lock = || progress.lock().unwrap_or_else(|p| p.into_inner());
        let handle = tokio::runtime::Handle::current();
        let this = Arc::new(*self);
        let mut last_save = Instant::now();
        let outcome: Result<(), StageError> = 'passes: loop {
            let saved = lock().checkpoint();
            let keys = match this.list_retrying(&client, &saved, &cx).await {
                Some(Ok(keys)) => keys,
                Some(Err(e)) => break 'passes Err(e),
                None => break 'passes Ok(()),
            };
            let to_read: Vec<String> = {
                let mut p = lock();
                p.saved = saved;
                // An object read to its end in an earlier pass whose events
                // are still in flight keeps its track and is not read again.
                let earlier = std::mem::take(&mut p.pass);
                p.pass =
                    keys.iter()
                        .map(|k| {
                            let carried =
                                earlier.get(k).cloned().flatten().filter(|t| {
                                    t.read_all.load(std::sync::atomic::Ordering::Acquire)
                                });
                            (k.clone(), carried)
                        })
                        .collect();
                keys.into_iter()
                    .filter(|k| p.pass.get(k).is_some_and(|t| t.is_none()))
                    .collect()
            };
            let mut readers = tokio::task::JoinSet::new();
            let mut next = to_read.into_iter();
            let mut failed = None;
            loop {
                while readers.len() < this.options.concurrency && !cx.shutdown.is_cancelled() {
                    let Some(key) = next.next() else { break };
                    let skip = lock().saved.partial.get(&key).copied().unwrap_or(0);
                    let track = Arc::new(Track::new(skip));
                    lock().pass.insert(key.clone(), Some(track.clone()));
                    let (client, this, output, shutdown, handle) = (
                        client.clone(),
                        this.clone(),
                        cx.output.clone(),
                        cx.shutdown.clone(),
                        handle.clone(),
                    );
                    let source = cx.id.clone();
                    let source_id = cx.id.clone();
                    readers.spawn(async move {
                        let o = &this.options;
                        let what = format!("s3://{}/{key}", o.bucket);
                        let template = Meta {
                            source,
                            ingest_ns: 0,
                            origin: Some(Arc::from(what.as_str())),
                            attributes: None,
                            position: None,
                        };
                        let retried = this
                            .retry_policy()
                            .run(
                                &shutdown,
                                |_| async {
                                    let sent_before =
                                        track.sent.load(std::sync::atomic::Ordering::Acquire);
                                    let failure = match read_attempt(
                                        &client, &this, &key, &what, &track, &output, &handle,
                                        &shutdown, &template,
                                    )
                                    .await
                                    {
                                        Ok(()) => return Attempt::Done(Ok(())),
                                        Err(f) if !f.transient => return Attempt::Done(Err(f.error)),
                                        Err(f) => f,
                                    };
                                    let reason = failure.error.to_string();
                                    // It got further: the attempts count afresh.
                                    if track.sent.load(std::sync::atomic::Ordering::Acquire)
                                        > sent_before
                                    {
                                        Attempt::Further(reason)
                                    } else {
                                        Attempt::again(reason)
                                    }
                                },
                                |reason, delay| {
                                    tracing::warn!(stage = %source_id, "{reason}; reading it again in {delay:?}");
                                    output.metrics().add_retried(1);
                                },
                            )
                            .await;
                        match retried {
                            Retried::Done(read) => read,
                            Retried::Failed(reason) => Err(StageError::Other(reason)),
                            Retried::GaveUp { reason, attempts } => Err(StageError::Other(
                                format!("{reason} (gave up after {attempts} attempts)"),
                            )),
                            Retried::Stopped(_) => Ok(()),
                        }
                    });
                }
                if readers.is_empty() {
                    break;
                }
                tokio::select! {
                    joined = readers.join_next() => {
                        if let Some(Ok(Err(e))) = joined {
                            failed = Some(e);
                            break;
                        }
                    }
                    () = tokio::time::sleep(SAVE_EVERY) => {}
                }
                if last_save.elapsed() >= SAVE_EVERY {
                    save(&this.state, &lock().checkpoint(), &cx.id);
                    last_save = Instant::now();
                }
            }
            if let Some(e) = failed {
                readers.abort_all();
                break 'passes Err(e);
            }
            save(&this.state, &lock().checkpoint(), &cx.id);
            if cx.shutdown.is_cancelled() {
                break 'passes Ok(());
            }
            let Some(every) = this.options.poll_interval_ms else {
                break 'passes Ok(());
            };
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(every)) => {}
                () = cx.shutdown.cancelled() => break 'passes Ok(()),
            }
        };
        // Let downstream drain (the readers' input ends once the last output
        // is gone), then save what it finished.
        let SourceContext { id, output, .. } = cx;
        drop(output);
        let deadline = Instant::now() + FINAL_ACK_WAIT;
        while lock().worth_waiting() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        save(&this.state, &lock().checkpoint(), &id);
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An object's track that skipped `skipped` messages delivered by an
    /// earlier run, with batches begun ending at `ends`; their tokens.
    fn track(skipped: u64, ends: &[u64]) -> (Arc<Track>, Vec<u64>) {
        let t = Arc::new(Track::new(skipped));
        let tokens = ends.iter().map(|end| t.lock().begin(*end, 1)).collect();
        (t, tokens)
    }

    fn read_all(t: &Track) {
        t.read_all.store(true, std::sync::atomic::Ordering::Release);
    }

    fn saved(after: Option<&str>, done: &[&str], partial: &[(&str, u64)]) -> Saved {
        Saved {
            after: after.map(str::to_string),
            done: done.iter().map(|k| k.to_string()).collect(),
            partial: partial.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
        }
    }

    /// `after` moves over the finished keys at the front of the pass; a
    /// finished key behind an unfinished one is `done`; an unfinished one
    /// keeps how many of its first messages are delivered (none: no
    /// entry); entries at or before `after` go.
    #[test]
    fn the_checkpoint_moves_over_finished_keys_in_order() {
        // a: finished. b: three batches, the first and last delivered.
        // c: finished (refused counts as finished). d: not begun yet.
        // e: 7 messages skipped, one batch open. f: begun, none delivered.
        // g: every batch delivered but not read to its end.
        let (a, ta) = track(0, &[5]);
        read_all(&a);
        AckReceiver::finished(&*a, ta[0], Outcome::Delivered);
        let (b, tb) = track(0, &[2, 4, 6]);
        read_all(&b);
        AckReceiver::finished(&*b, tb[0], Outcome::Delivered);
        AckReceiver::finished(&*b, tb[2], Outcome::Delivered);
        let (c, tc) = track(0, &[3]);
        read_all(&c);
        AckReceiver::finished(&*c, tc[0], Outcome::Rejected);
        let (e, _) = track(7, &[9]);
        let (f, _) = track(0, &[1]);
        let (g, tg) = track(0, &[4]);
        AckReceiver::finished(&*g, tg[0], Outcome::Delivered);
        let mut progress = Progress::default();
        for (key, t) in [
            ("a", Some(&a)),
            ("b", Some(&b)),
            ("c", Some(&c)),
            ("d", None),
            ("e", Some(&e)),
            ("f", Some(&f)),
            ("g", Some(&g)),
        ] {
            progress.pass.insert(key.into(), t.cloned());
        }
        let first = progress.checkpoint();
        assert_eq!(
            first,
            saved(Some("a"), &["c"], &[("b", 2), ("e", 7), ("g", 4)])
        );
        // b's middle batch: a, b and c are finished in a row.
        AckReceiver::finished(&*b, tb[1], Outcome::Delivered);
        progress.saved = first;
        assert_eq!(
            progress.checkpoint(),
            saved(Some("c"), &[], &[("e", 7), ("g", 4)])
        );
        // g read to its end: finished, but behind d.
        read_all(&g);
        assert_eq!(progress.checkpoint(), saved(Some("c"), &["g"], &[("e", 7)]));
    }

    /// A new pass starts from what was saved: entries the pass does not
    /// reach stay, those at or before the new `after` go, and an errored
    /// batch holds its key where it was.
    #[test]
    fn a_pass_keeps_what_was_saved_and_an_errored_batch_holds_its_key() {
        let (k, tk) = track(0, &[2, 4]);
        read_all(&k);
        AckReceiver::finished(&*k, tk[0], Outcome::Delivered);
        AckReceiver::finished(&*k, tk[1], Outcome::Errored);
        let (m, tm) = track(0, &[1]);
        read_all(&m);
        AckReceiver::finished(&*m, tm[0], Outcome::Delivered);
        let mut progress = Progress {
            saved: saved(Some("b"), &["j", "z"], &[("c", 3), ("m", 1), ("y", 1)]),
            pass: BTreeMap::new(),
        };
        progress.pass.insert("m".into(), Some(m));
        assert_eq!(
            progress.checkpoint(),
            saved(Some("m"), &["z"], &[("y", 1)]),
            "j, c and m's own entry are at or before m"
        );
        progress.pass.insert("k".into(), Some(k));
        assert_eq!(
            progress.checkpoint(),
            saved(Some("b"), &["j", "m", "z"], &[("c", 3), ("k", 2), ("y", 1)]),
            "k is held at 2 by its errored batch"
        );
        assert!(!progress.worth_waiting(), "an errored batch holds k");
    }
}
