//! Runs a validated pipeline: one tokio task per stage, joined by bounded
//! channels, so a slow sink stalls its upstream stage by stage until the
//! sources stop reading. Nothing here knows any concrete plugin.
//!
//! # Clean shutdown
//! Cancelling the shutdown token stops the sources only. Every other stage
//! ends when its input ends, i.e. after it has processed everything its
//! upstreams sent, so a shutdown drains the pipeline instead of dropping it.
//!
//! # Failure
//! A stage that fails is reported by id; the engine then stops the sources
//! and keeps reading the failed stage's input, counting those events as
//! errored, so its upstreams can drain and the summary still adds up.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use logbus_plugin_api::{
    Built, CancellationToken, ChannelHandle, Event, EventError, Fields, Output, OutputRole,
    Payload, Processor, Receiver, Sender, SinkContext, SourceContext, StageError, StageKind,
    StageMetrics, Verdict, channel,
};
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::config::{ERRORS_SUFFIX, OnError, Pipeline};
use crate::report::{ChannelReport, RunReport, StageFailure, StageReport};

/// A stage could not be built from its validated options.
#[derive(Debug, thiserror::Error)]
#[error("stage `{stage}`: {message}")]
pub struct BuildError {
    pub stage: String,
    pub message: String,
}

/// Live view of a started pipeline, for tests and monitoring.
pub struct RunningPipeline {
    pub stages: Vec<(String, StageKind, Arc<StageMetrics>)>,
    /// Input channel of each non-source stage, by stage id.
    pub channels: Vec<(String, ChannelHandle)>,
    shutdown: CancellationToken,
    done: tokio::task::JoinHandle<RunReport>,
}

impl RunningPipeline {
    /// Stops the sources; the rest drains.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    pub fn metrics(&self, id: &str) -> Option<&Arc<StageMetrics>> {
        self.stages
            .iter()
            .find(|(s, _, _)| s == id)
            .map(|(_, _, m)| m)
    }

    pub fn channel(&self, id: &str) -> Option<&ChannelHandle> {
        self.channels.iter().find(|(s, _)| s == id).map(|(_, c)| c)
    }

    /// Waits until every stage has finished.
    pub async fn wait(self) -> RunReport {
        self.done.await.expect("the supervisor task does not panic")
    }
}

/// Builds every stage and starts the pipeline. Must be called inside a
/// tokio runtime. `shutdown` stops the sources when cancelled.
pub fn start(
    pipeline: &Pipeline,
    shutdown: CancellationToken,
) -> Result<RunningPipeline, Vec<BuildError>> {
    let mut built = Vec::new();
    let mut errors = Vec::new();
    for spec in &pipeline.stages {
        match spec
            .plugin
            .build(&spec.options, &pipeline.build_context(spec))
        {
            Ok(b) => built.push(b),
            Err(errs) => errors.extend(errs.into_iter().map(|e| BuildError {
                stage: spec.id.clone(),
                message: if e.path.is_empty() {
                    e.message
                } else {
                    format!("option `{}`: {}", e.path.join("."), e.message)
                },
            })),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }

    let capacity = pipeline.settings.channel_capacity;
    let mut senders: HashMap<&str, Sender> = HashMap::new();
    let mut receivers: HashMap<&str, Receiver> = HashMap::new();
    let mut channels = Vec::new();
    for spec in &pipeline.stages {
        if spec.kind != StageKind::Source {
            let (tx, rx) = channel(capacity);
            channels.push((spec.id.clone(), rx.handle()));
            senders.insert(&spec.id, tx);
            receivers.insert(&spec.id, rx);
        }
    }
    let outputs_to = |name: &str| -> Vec<Sender> {
        pipeline
            .readers_of(name)
            .map(|reader| senders[reader.id.as_str()].clone())
            .collect()
    };

    let started = Instant::now();
    let mut tasks = JoinSet::new();
    let mut stages = Vec::new();
    for (index, (spec, built)) in pipeline.stages.iter().zip(built).enumerate() {
        let id: Arc<str> = spec.id.as_str().into();
        let metrics = Arc::new(StageMetrics::default());
        stages.push((spec.id.clone(), spec.kind, metrics.clone()));
        let output = Output::new(outputs_to(&spec.id), metrics.clone(), OutputRole::Main);
        let span = tracing::info_span!("stage", id = %spec.id);
        let stop = shutdown.clone();
        match built {
            Built::Source(source) => {
                let spec_id = id.clone();
                let cx = SourceContext {
                    id,
                    output,
                    shutdown: shutdown.clone(),
                };
                tasks.spawn(tracing::Instrument::instrument(
                    async move {
                        let result = guard(source.run(cx)).await;
                        if let Err(message) = &result {
                            fail_fast(&spec_id, message, &stop);
                        }
                        (index, result)
                    },
                    span,
                ));
            }
            Built::Processor(processor) => {
                let errors = Output::new(
                    outputs_to(&format!("{}{ERRORS_SUFFIX}", spec.id)),
                    metrics.clone(),
                    OutputRole::Errors,
                );
                let input = receivers
                    .remove(spec.id.as_str())
                    .expect("non-source has a channel");
                let on_error = spec.on_error;
                tasks.spawn(tracing::Instrument::instrument(
                    async move {
                        let mut stage = ProcessorStage {
                            id,
                            processor,
                            input,
                            output,
                            errors,
                            on_error,
                            metrics,
                            warn: WarnLimiter::default(),
                        };
                        let result = guard(stage.run()).await;
                        if let Err(message) = &result {
                            fail_fast(&stage.id, message, &stop);
                            drain_as_errored(&mut stage.input, &stage.metrics).await;
                        }
                        (index, result)
                    },
                    span,
                ));
            }
            Built::Sink(sink) => {
                let input = receivers
                    .remove(spec.id.as_str())
                    .expect("non-source has a channel");
                tasks.spawn(tracing::Instrument::instrument(
                    async move {
                        let mut cx = SinkContext { id, input, metrics };
                        let result = guard(sink.run(&mut cx)).await;
                        if let Err(message) = &result {
                            fail_fast(&cx.id, message, &stop);
                            drain_as_errored(&mut cx.input, &cx.metrics).await;
                        }
                        (index, result)
                    },
                    span,
                ));
            }
        }
    }
    // Only the stages hold senders now: a channel closes when its last upstream ends.
    drop(senders);

    let ids: Vec<String> = pipeline.stages.iter().map(|s| s.id.clone()).collect();
    let report_stages = stages.clone();
    let report_channels = channels.clone();
    let done = tokio::spawn(async move {
        let mut failures = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let (index, result) = joined.expect("stage tasks catch their own panics");
            if let Err(message) = result {
                failures.push(StageFailure {
                    stage: ids[index].clone(),
                    message,
                });
            }
        }
        RunReport::new(
            report_stages
                .iter()
                .map(|(id, kind, m)| StageReport {
                    id: id.clone(),
                    kind: *kind,
                    counts: m.snapshot(),
                })
                .collect(),
            report_channels
                .iter()
                .map(|(id, c)| ChannelReport {
                    stage: id.clone(),
                    capacity: c.stats().capacity(),
                    max_occupancy: c.stats().max_occupancy(),
                    sent: c.stats().sent(),
                    received: c.stats().received(),
                    abandoned: c.stats().abandoned(),
                })
                .collect(),
            failures,
            started.elapsed(),
        )
    });

    Ok(RunningPipeline {
        stages,
        channels,
        shutdown,
        done,
    })
}

/// A stage failed: say so now and stop the sources, so the pipeline drains
/// and ends instead of feeding a stage that can no longer deliver.
fn fail_fast(stage: &str, message: &str, stop: &CancellationToken) {
    tracing::error!(
        stage,
        "stage failed: {message}; stopping sources and draining"
    );
    stop.cancel();
}

/// Turns a panic inside a plugin into a stage failure.
async fn guard(fut: impl Future<Output = Result<(), StageError>>) -> Result<(), String> {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => Err(format!(
            "panicked: {}",
            panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into())
        )),
    }
}

/// After a failure: the events the stage held (received, never forwarded or
/// committed) are errored; then keep the input flowing so upstreams can
/// finish, counting every event that still arrives as errored.
async fn drain_as_errored(input: &mut Receiver, metrics: &StageMetrics) {
    let held = metrics.snapshot().unaccounted();
    if held > 0 {
        metrics.add_errored(held as u64);
    }
    while let Some(batch) = input.recv().await {
        metrics.add_in(batch.len() as u64);
        metrics.add_errored(batch.len() as u64);
    }
}

struct ProcessorStage {
    id: Arc<str>,
    processor: Box<dyn Processor>,
    input: Receiver,
    output: Output,
    errors: Output,
    on_error: OnError,
    metrics: Arc<StageMetrics>,
    warn: WarnLimiter,
}

impl ProcessorStage {
    async fn run(&mut self) -> Result<(), StageError> {
        while let Some(mut batch) = self.input.recv().await {
            let events = batch.take();
            let n = events.len();
            self.metrics.add_in(n as u64);
            let mut out = Vec::with_capacity(n);
            let mut routed = Vec::new();
            let mut failure = None;
            let mut events = events.into_iter();
            for mut event in events.by_ref() {
                match self.processor.process(&mut event) {
                    Ok(Verdict::Keep) => out.push(event),
                    Ok(Verdict::Discard) => self.metrics.add_discarded(1),
                    Ok(Verdict::Replace(replacement)) => match replacement.len() {
                        0 => self.metrics.add_discarded(1),
                        k => {
                            self.metrics.add_created(k as u64 - 1);
                            out.extend(replacement);
                        }
                    },
                    Err(error) => match self.on_error {
                        OnError::Drop => {
                            self.metrics.add_errored(1);
                            self.warn.warn(&self.id, &error);
                        }
                        OnError::Route => routed.push(attach_error(event, &self.id, &error)),
                        OnError::Fail => {
                            self.metrics.add_errored(1);
                            failure = Some(error);
                            break;
                        }
                    },
                }
            }
            if failure.is_some() {
                // The rest of the batch is not processed.
                self.metrics.add_errored(events.len() as u64);
            }
            self.output.send(out).await?;
            self.errors.send(routed).await?;
            drop(batch);
            if let Some(error) = failure {
                return Err(StageError::Other(format!(
                    "event failed with `on_error: fail`: {error}"
                )));
            }
        }
        self.warn.flush(&self.id);
        let tail = self.processor.finish();
        self.metrics.add_created(tail.len() as u64);
        self.output.send(tail).await?;
        Ok(())
    }
}

/// The event as routed to `<id>.errors`: its fields (a raw event becomes
/// `{"message": "<text>"}`) plus `_error: {stage, message}`.
pub fn attach_error(mut event: Event, stage: &str, error: &EventError) -> Event {
    let info = json!({ "stage": stage, "message": error.0 });
    let payload = event.payload_mut();
    let fields: &mut Fields = match payload {
        Payload::Fields(f) => f,
        Payload::Raw(bytes) => {
            let mut f = Fields::new();
            f.insert(
                "message".into(),
                Value::String(String::from_utf8_lossy(bytes).into_owned()),
            );
            *payload = Payload::Fields(f);
            match payload {
                Payload::Fields(f) => f,
                Payload::Raw(_) => unreachable!(),
            }
        }
    };
    fields.insert("_error".into(), info);
    event
}

/// Logs the first few errors of each 10-second window and then a count of
/// the ones it kept quiet, so a flood of bad lines cannot flood the log.
#[derive(Default)]
struct WarnLimiter {
    window_start: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

impl WarnLimiter {
    const PER_WINDOW: u32 = 5;
    const WINDOW: Duration = Duration::from_secs(10);

    fn warn(&mut self, stage: &str, error: &EventError) {
        let now = Instant::now();
        if self
            .window_start
            .is_none_or(|s| now.duration_since(s) >= Self::WINDOW)
        {
            if self.suppressed > 0 {
                tracing::warn!(
                    stage,
                    suppressed = self.suppressed,
                    "{} similar event errors were not logged",
                    self.suppressed
                );
            }
            self.window_start = Some(now);
            self.logged = 0;
            self.suppressed = 0;
        }
        if self.logged < Self::PER_WINDOW {
            self.logged += 1;
            tracing::warn!(stage, "dropped an event: {error}");
        } else {
            self.suppressed += 1;
        }
    }

    /// Logs how many were kept quiet, if any (at a window's end and at exit).
    fn flush(&mut self, stage: &str) {
        if self.suppressed > 0 {
            tracing::warn!(
                stage,
                suppressed = self.suppressed,
                "{} more dropped events were not logged",
                self.suppressed
            );
            self.suppressed = 0;
        }
    }
}
