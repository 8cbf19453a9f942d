//! Runs a validated pipeline: one tokio task per stage, joined by bounded
//! channels, so a slow sink stalls its upstream stage by stage until the
//! sources stop reading. Nothing here knows any concrete plugin.
//!
//! A supervisor task owns the wiring. It hears about every stage task that
//! ends, and applies reloads: a reload swaps only the stages whose config
//! changed, adds and removes stages, and rewires outputs in place, so the
//! channels and in-flight events of unchanged stages are never touched.
//! None of it needs the plugins' cooperation: outputs deliver to a target
//! list the supervisor replaces, a sink's receiver is interrupted at a
//! batch boundary and handed, with what is queued, to its replacement, and
//! a processor worker takes its replacement between batches. The
//! supervisor keeps only weak senders to the channels, so a channel still
//! closes when its last real upstream ends.
//!
//! # Clean shutdown
//! Cancelling the shutdown token stops the sources only. Every other stage
//! ends when its input ends, i.e. after it has processed everything its
//! upstreams sent, so a shutdown drains the pipeline instead of dropping it.
//! Sinks get `settings.drain_timeout_ms` for it; then the supervisor cancels
//! every sink's `SinkContext::stop`, and what a sink still holds is errored
//! (by the sink core), so a checkpointing source reads it again.
//!
//! # Failure
//! A stage that fails is reported by id; the engine then stops the sources
//! and keeps reading the failed stage's input, counting those events as
//! errored, so its upstreams can drain and the summary still adds up.

use std::collections::{BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use logbus_plugin_api::engine::{OutputTargets, ProducerHold};
use logbus_plugin_api::{
    BuildContext, Built, CancellationToken, Event, EventError, InputBatch, Outcome, Output,
    OutputRole, Processor, Receiver, Sender, Sink, SinkContext, Source, SourceContext, StageError,
    StageKind, StageMetrics, Verdict, attach_error, panic_message,
};
use logbus_queue::durable::Durable;
use logbus_queue::{
    ChannelHandle, Interrupt, WeakSender, channel_with_batch, channel_with_latency,
    durable_channel, local_channel,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::config::{OnError, Pipeline, StageSpec};
use crate::order::{Order, Ticket};
use crate::report::{ChannelReport, RunReport, StageFailure, StageReport};

/// A stage could not be built from its validated options.
#[derive(Debug, thiserror::Error)]
#[error("stage `{stage}`: {message}")]
pub struct BuildError {
    pub stage: String,
    pub message: String,
}

/// Why a reload was refused. The running pipeline is untouched.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Build(Vec<BuildError>),
    #[error("`settings` changed; settings apply at start, so restart to change them")]
    SettingsChanged,
    #[error("stage `{0}` changed kind; give the new stage another id, or restart")]
    KindChanged(String),
    #[error(
        "stage `{0}` changed `workers`, `ordered` or `queue`; its queue is kept across a reload, so restart to change them"
    )]
    QueueChanged(String),
    #[error(
        "stage `{0}` changed its named outputs (routes added, removed or reordered); restart to change them"
    )]
    OutputsChanged(String),
    #[error("the pipeline is shutting down")]
    Stopped,
}

/// What a reload did, by stage id.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReloadSummary {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Rebuilt with new options; their input channel and queued events stay.
    pub changed: Vec<String>,
    /// Same stage, different readers of its output.
    pub rewired: Vec<String>,
    pub unchanged: usize,
}

impl std::fmt::Display for ReloadSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "added [{}], removed [{}], changed [{}], rewired [{}], {} unchanged",
            self.added.join(", "),
            self.removed.join(", "),
            self.changed.join(", "),
            self.rewired.join(", "),
            self.unchanged
        )
    }
}

enum Command {
    Reload(
        Box<Pipeline>,
        oneshot::Sender<Result<ReloadSummary, ReloadError>>,
    ),
}

/// Sends reloads to a running pipeline; clonable, usable from a signal handler.
#[derive(Clone)]
pub struct Reloader(mpsc::UnboundedSender<Command>);

impl Reloader {
    /// Applies `pipeline` (already validated) to the running one.
    pub async fn reload(&self, pipeline: Pipeline) -> Result<ReloadSummary, ReloadError> {
        let (tx, rx) = oneshot::channel();
        self.0
            .send(Command::Reload(Box::new(pipeline), tx))
            .map_err(|_| ReloadError::Stopped)?;
        rx.await.map_err(|_| ReloadError::Stopped)?
    }
}

/// Live view of a started pipeline, for tests and monitoring.
pub struct RunningPipeline {
    /// The stages as started (a reload adds to the final report, not here).
    pub stages: Vec<(String, StageKind, Arc<StageMetrics>)>,
    /// Input channel of each non-source stage, by stage id, as started.
    pub channels: Vec<(String, ChannelHandle)>,
    stats: StatsHandle,
    shutdown: CancellationToken,
    reloader: Reloader,
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

    pub fn reloader(&self) -> Reloader {
        self.reloader.clone()
    }

    /// Live counters and the running configuration, for the API.
    pub fn stats(&self) -> StatsHandle {
        self.stats.clone()
    }

    /// See [`Reloader::reload`].
    pub async fn reload(&self, pipeline: Pipeline) -> Result<ReloadSummary, ReloadError> {
        self.reloader.reload(pipeline).await
    }

    /// Waits until every stage has finished.
    pub async fn wait(self) -> RunReport {
        self.done.await.expect("the supervisor task does not panic")
    }
}

/// Builds one plugin instance per worker (sources: one).
fn build_all<'a>(
    pipeline: &Pipeline,
    specs: impl Iterator<Item = &'a StageSpec>,
) -> Result<HashMap<String, Vec<Built>>, Vec<BuildError>> {
    let mut built = HashMap::new();
    let mut errors = Vec::new();
    for spec in specs {
        let instances = spec.instances(&pipeline.settings);
        let mut workers = Vec::with_capacity(instances);
        for worker in 0..instances {
            let cx = BuildContext {
                worker,
                ..pipeline.build_context(spec)
            };
            match spec.plugin.build(&spec.options, &cx) {
                // A `Typed` plugin cannot get this wrong (it does not
                // compile); one implementing `Plugin` by hand can, and the
                // stage loops below rely on the kind.
                Ok(b) if b.built_as() != spec.kind.built_as() => {
                    errors.push(BuildError {
                        stage: spec.id.clone(),
                        message: format!(
                            "plugin `{}` is a {} but built a {:?} (a bug in the plugin)",
                            spec.plugin.name(),
                            spec.kind.key(),
                            b.built_as()
                        ),
                    });
                    break;
                }
                Ok(b) => workers.push(b),
                Err(errs) => {
                    errors.extend(errs.into_iter().map(|e| BuildError {
                        stage: spec.id.clone(),
                        message: if e.path.is_empty() {
                            e.message
                        } else {
                            format!("option `{}`: {}", e.path.join("."), e.message)
                        },
                    }));
                    break;
                }
            }
        }
        built.insert(spec.id.clone(), workers);
    }
    if errors.is_empty() {
        Ok(built)
    } else {
        Err(errors)
    }
}

/// Builds every stage and starts the pipeline. Must be called inside a
/// tokio runtime. `shutdown` stops the sources when cancelled.
pub fn start(
    pipeline: &Pipeline,
    shutdown: CancellationToken,
) -> Result<RunningPipeline, Vec<BuildError>> {
    let mut built = build_all(pipeline, pipeline.stages.iter())?;
    let mut durables = open_durables(pipeline, pipeline.stages.iter())?;
    let sinks_stop = CancellationToken::new();
    {
        let (shutdown, sinks_stop) = (shutdown.clone(), sinks_stop.clone());
        let drain = Duration::from_millis(pipeline.settings.drain_timeout_ms);
        tokio::spawn(async move {
            tokio::select! {
                _ = sinks_stop.cancelled() => return,
                _ = shutdown.cancelled() => {}
            }
            tokio::select! {
                _ = sinks_stop.cancelled() => {}
                _ = tokio::time::sleep(drain) => {
                    tracing::warn!("the drain deadline ({drain:?}) passed: sinks still retrying give up");
                    sinks_stop.cancel();
                }
            }
        });
    }
    let mut sup = Supervisor {
        shutdown: shutdown.clone(),
        sinks_stop,
        running: pipeline.clone(),
        live: HashMap::new(),
        draining: Vec::new(),
        inventory: Arc::new(Mutex::new(Inventory {
            stages: Vec::new(),
            channels: Vec::new(),
            outputs: HashMap::new(),
            fused: HashMap::new(),
            pipeline: pipeline.clone(),
        })),
        tasks: JoinSet::new(),
        task_stage: HashMap::new(),
        next_task: 0,
        failures: Vec::new(),
        started: Instant::now(),
        chains: Vec::new(),
    };
    // Channels first, so every output can be wired before any stage runs.
    let chains = pipeline.fused_chains();
    let unread: BTreeSet<&str> = chains
        .iter()
        .flat_map(|c| c[1..].iter().map(|s| s.id.as_str()))
        .collect();
    let mut receivers = sup.open_channels(pipeline.stages.iter(), &mut durables, &unread);
    sup.rewire(pipeline);
    let mut take = |id: &str| built.remove(id).expect("every stage was built, once");
    for chain in chains {
        let instances = chain.iter().map(|s| take(&s.id)).collect();
        let (input, _) = receivers
            .remove(&chain[0].id)
            .expect("a processor has an input");
        for spec in &chain[1..] {
            let (parked, _) = receivers
                .remove(&spec.id)
                .expect("a processor has an input");
            sup.live.get_mut(&spec.id).expect("opened").parked = Some(parked);
        }
        sup.spawn_processors(&chain, instances, input, None);
        sup.chains
            .push(chain.iter().map(|s| s.id.clone()).collect());
    }
    for spec in &pipeline.stages {
        if sup
            .live
            .get(&spec.id)
            .is_some_and(|l| l.control.is_some() || l.parked.is_some())
        {
            continue; // fused
        }
        let b = take(&spec.id);
        sup.spawn(spec, b, receivers.remove(&spec.id).map(|(rx, _)| rx));
    }
    // From here on only the stages hold senders: a channel closes when its
    // last upstream ends.
    drop(receivers);
    let (stages, channels) = {
        let inv = sup.inventory.lock().expect("inventory lock");
        (inv.stages.clone(), inv.channels.clone())
    };
    let stats = StatsHandle {
        inventory: sup.inventory.clone(),
        started: sup.started,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let done = tokio::spawn(sup.run(rx));
    Ok(RunningPipeline {
        stages,
        channels,
        stats,
        shutdown,
        reloader: Reloader(tx),
        done,
    })
}

mod stage;
mod stats;
mod supervisor;

use stage::*;
use stats::*;
use supervisor::*;

pub use stats::StatsHandle;

#[cfg(test)]
mod tests {
    use super::*;

    /// The line the supervisor logs after a reload.
    #[test]
    fn a_reload_summary_reads_as_one_line() {
        let summary = ReloadSummary {
            added: vec!["a".into(), "b".into()],
            removed: vec!["c".into()],
            changed: vec![],
            rewired: vec!["d".into()],
            unchanged: 3,
        };
        assert_eq!(
            summary.to_string(),
            "added [a, b], removed [c], changed [], rewired [d], 3 unchanged"
        );
    }

    /// Five errors a window are logged, the rest counted and reported
    /// when the next window starts (ten seconds after the last one began)
    /// or at a flush, which starts the count again.
    #[test]
    fn five_errors_a_window_are_logged_and_the_rest_counted() {
        let mut limiter = WarnLimiter::default();
        let t0 = Instant::now();
        let turn = |log, quiet_before| WarnTurn { quiet_before, log };
        for _ in 0..5 {
            assert_eq!(limiter.turn(t0), turn(true, 0));
        }
        assert_eq!(limiter.turn(t0), turn(false, 0));
        assert_eq!(
            limiter.turn(t0 + Duration::from_millis(9_999)),
            turn(false, 0)
        );
        assert_eq!(limiter.turn(t0 + Duration::from_secs(10)), turn(true, 2));
        for _ in 0..4 {
            assert_eq!(limiter.turn(t0 + Duration::from_secs(10)), turn(true, 0));
        }
        assert_eq!(limiter.turn(t0 + Duration::from_secs(11)), turn(false, 0));
        assert_eq!(limiter.suppressed, 1);
        limiter.flush("stage");
        assert_eq!(limiter.suppressed, 0);
        assert_eq!(limiter.turn(t0 + Duration::from_secs(20)), turn(true, 0));
    }
}
