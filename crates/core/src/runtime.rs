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
use logbus_plugin_api::durable::Durable;
use logbus_plugin_api::{
    BuildContext, Built, CancellationToken, ChannelHandle, Event, EventError, InputBatch,
    Interrupt, Outcome, Output, OutputRole, OutputTargets, Processor, ProducerHold, Receiver,
    Sender, Sink, SinkContext, Source, SourceContext, StageError, StageKind, StageMetrics, Verdict,
    WeakSender, attach_error, channel_with_batch, channel_with_latency, durable_channel,
    local_channel, panic_message,
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

/// Every stage and channel that ever ran, and the configuration running now.
struct Inventory {
    stages: Vec<(String, StageKind, Arc<StageMetrics>)>,
    channels: Vec<(String, ChannelHandle)>,
    /// Main output of every stage that has one, for taps.
    outputs: HashMap<String, OutputTargets>,
    /// Stages running fused: the chain's first stage.
    fused: HashMap<String, String>,
    pipeline: Pipeline,
}

fn inventory_push_stage(
    inventory: &Mutex<Inventory>,
    spec: &StageSpec,
    metrics: &Arc<StageMetrics>,
) {
    inventory.lock().expect("inventory lock").stages.push((
        spec.id.clone(),
        spec.kind,
        metrics.clone(),
    ));
}

fn report_parts(inv: &Inventory) -> (Vec<StageReport>, Vec<ChannelReport>) {
    (
        inv.stages
            .iter()
            .map(|(id, kind, m)| StageReport {
                id: id.clone(),
                kind: *kind,
                counts: m.snapshot(),
                blocked_seconds: m.blocked_seconds(),
                bytes_out: m.bytes_out(),
                outputs: m.named_outputs().into_iter().collect(),
                fused_into: inv.fused.get(id).cloned(),
            })
            .collect(),
        inv.channels
            .iter()
            .map(|(id, c)| ChannelReport {
                stage: id.clone(),
                capacity: c.stats().capacity(),
                occupancy: c.occupancy(),
                max_occupancy: c.stats().max_occupancy(),
                sent: c.stats().sent(),
                received: c.stats().received(),
                abandoned: c.stats().abandoned(),
                batch_sizes: c.stats().batch_size_snapshot(),
                wait_seconds: c.stats().wait_seconds(),
                ingest_latency_us: c.stats().ingest_latency_snapshot(),
                local: c.local(),
                disk: c.durable(),
            })
            .collect(),
    )
}

/// Reads a running pipeline's counters (the same ones the exit summary
/// uses) and its current configuration, without touching the data path.
#[derive(Clone)]
pub struct StatsHandle {
    inventory: Arc<Mutex<Inventory>>,
    started: Instant,
}

impl StatsHandle {
    /// A report as of now. While events are in flight, `totals.lost`
    /// counts them (it is 0 only once the pipeline has drained).
    pub fn snapshot(&self) -> RunReport {
        let (stages, channels) = report_parts(&self.inventory.lock().expect("inventory lock"));
        RunReport::new(stages, channels, Vec::new(), self.started.elapsed())
    }

    /// A live sample of the events leaving `stage` (see [`Tap`]); `None`
    /// for an unknown stage or a sink (which has no output).
    pub fn tap(&self, stage: &str, capacity: usize) -> Option<logbus_plugin_api::Tap> {
        let inv = self.inventory.lock().expect("inventory lock");
        inv.outputs.get(stage).map(|o| o.tap(capacity))
    }

    /// A forced stop: writes the memory backlog of every disk-assisted
    /// queue with `save_on_shutdown` to its log. Returns events saved.
    pub async fn save_queue_backlogs(&self) -> u64 {
        let channels: Vec<(String, ChannelHandle)> = self
            .inventory
            .lock()
            .expect("inventory lock")
            .channels
            .clone();
        let mut total = 0;
        for (stage, handle) in channels {
            let saved = handle.save_backlog().await;
            if saved > 0 {
                tracing::warn!(stage = %stage, "saved {saved} queued events to the disk queue");
            }
            total += saved;
        }
        total
    }

    /// The configuration running now (after any reload).
    pub fn pipeline(&self) -> Pipeline {
        self.inventory
            .lock()
            .expect("inventory lock")
            .pipeline
            .clone()
    }
}

/// How the supervisor reaches into a running stage.
enum Control {
    Source {
        stop: CancellationToken,
    },
    /// One replacement channel per worker.
    Processor {
        swaps: Vec<mpsc::UnboundedSender<(Box<dyn Processor>, OnError)>>,
    },
    /// The workers share the input, so one interrupt pauses them all.
    Sink {
        interrupt: Arc<Interrupt>,
        swaps: Vec<mpsc::UnboundedSender<Box<dyn Sink>>>,
    },
    /// The workers of a fused chain (on its first stage's [`Live`]).
    Fused {
        /// Ends them after the batch in hand, for a reload that splits the chain.
        split: CancellationToken,
        end: ChainEnd,
    },
}

/// How the workers that take over from a split chain wait for it to end.
#[derive(Clone)]
struct ChainEnd {
    /// One permit for each chain worker that has ended.
    ended: Arc<tokio::sync::Semaphore>,
    workers: u32,
}

impl ChainEnd {
    async fn wait(&self) {
        // The permits go back at once: every successor waits the same way.
        let _all = self.ended.acquire_many(self.workers).await;
    }
}

struct AddsPermitOnDrop(Arc<tokio::sync::Semaphore>);

impl Drop for AddsPermitOnDrop {
    fn drop(&mut self) {
        self.0.add_permits(1);
    }
}

struct Live {
    /// The tasks running the stage (its workers; during a source swap, the
    /// old source and the new). The stage is over when none is left.
    tasks: std::collections::HashSet<u64>,
    metrics: Arc<StageMetrics>,
    /// The stage's input channel, without keeping it open.
    input: Option<WeakSender>,
    main: OutputTargets,
    errors: OutputTargets,
    /// Its named outputs, in [`StageSpec::outputs`] order.
    named: Vec<OutputTargets>,
    control: Option<Control>,
    /// A fused stage's own input queue, unread while its chain runs it
    /// (the first stage's is read by the chain): the stage's own workers
    /// read it if a reload splits the chain.
    parked: Option<Receiver>,
}

impl Live {
    /// The stage is over: its readers' inputs end once their other
    /// upstreams do.
    fn let_go(self) {
        self.main.set(Vec::new());
        self.errors.set(Vec::new());
        for named in &self.named {
            named.set(Vec::new());
        }
    }

    /// Output `k`: 0 the main one, 1 the side one, then the named ones.
    fn output(&self, k: usize) -> Option<&OutputTargets> {
        match k {
            0 => Some(&self.main),
            1 => Some(&self.errors),
            n => self.named.get(n - 2),
        }
    }
}

struct Supervisor {
    shutdown: CancellationToken,
    /// Cancelled `settings.drain_timeout_ms` after `shutdown`: sinks still
    /// retrying give up then.
    sinks_stop: CancellationToken,
    /// The configuration being run.
    running: Pipeline,
    live: HashMap<String, Live>,
    /// Stages removed by a reload whose tasks are still draining.
    draining: Vec<Live>,
    /// Every stage and channel that ever ran, shared with [`StatsHandle`].
    inventory: Arc<Mutex<Inventory>>,
    tasks: JoinSet<(u64, Result<(), StageFailure>)>,
    /// The stages each task runs (several for a fused chain).
    task_stage: HashMap<u64, Vec<String>>,
    next_task: u64,
    failures: Vec<StageFailure>,
    started: Instant,
    /// The fused chains running, each in data order.
    chains: Vec<Vec<String>>,
}

/// Opened channels waiting for their stage: the receiver, and a strong
/// sender that keeps the channel open until the wiring holds its own.
type Opened = HashMap<String, (Receiver, Sender)>;

impl Supervisor {
    /// Opens the input queue of each of `specs`; the ones in `unlisted`
    /// (fused stages, whose queues stay unread) are left out of the report.
    fn open_channels<'a>(
        &mut self,
        specs: impl Iterator<Item = &'a StageSpec>,
        durables: &mut HashMap<String, Durable>,
        unlisted: &BTreeSet<&str>,
    ) -> Opened {
        let settings = self.running.settings.clone();
        let mut opened = HashMap::new();
        for spec in specs {
            let metrics = Arc::new(StageMetrics::default());
            metrics.name_outputs(&spec.outputs);
            inventory_push_stage(&self.inventory, spec, &metrics);
            let mut input = None;
            if spec.kind != StageKind::Source {
                let (capacity, batch) = (spec.capacity(&settings), spec.dequeue_batch(&settings));
                let latency = spec.kind == StageKind::Sink;
                let local = spec.local_config(&settings);
                let (tx, rx) = match (durables.remove(&spec.id), local) {
                    (Some(durable), local) => {
                        durable_channel(capacity, batch, latency, local, durable)
                    }
                    (None, Some(local)) => local_channel(capacity, batch, local, latency),
                    (None, None) if latency => channel_with_latency(capacity, batch),
                    (None, None) => channel_with_batch(capacity, batch),
                };
                if !unlisted.contains(spec.id.as_str()) {
                    self.inventory
                        .lock()
                        .expect("inventory lock")
                        .channels
                        .push((spec.id.clone(), rx.handle()));
                }
                input = Some(tx.downgrade());
                opened.insert(spec.id.clone(), (rx, tx));
            }
            let main = OutputTargets::default();
            if spec.kind != StageKind::Sink {
                self.inventory
                    .lock()
                    .expect("inventory lock")
                    .outputs
                    .insert(spec.id.clone(), main.clone());
            }
            self.live.insert(
                spec.id.clone(),
                Live {
                    tasks: Default::default(),
                    metrics,
                    input,
                    main,
                    errors: OutputTargets::default(),
                    named: spec
                        .outputs
                        .iter()
                        .map(|_| OutputTargets::default())
                        .collect(),
                    control: None,
                    parked: None,
                },
            );
        }
        opened
    }

    /// Points every live stage's outputs at the readers `pipeline` gives
    /// them. Returns the stages whose set of readers changed.
    fn rewire(&mut self, pipeline: &Pipeline) -> Vec<String> {
        let readers = |name: &str| -> BTreeSet<String> {
            pipeline.readers_of(name).map(|r| r.id.clone()).collect()
        };
        let senders = |live: &HashMap<String, Live>, ids: &BTreeSet<String>| -> Vec<Sender> {
            ids.iter()
                .filter_map(|id| live.get(id)?.input.as_ref()?.upgrade())
                .collect()
        };
        let mut changed = Vec::new();
        for spec in &pipeline.stages {
            // Every output in `Live`'s order: main, side, then named.
            let names = [spec.id.clone(), spec.side_output()]
                .into_iter()
                .chain(spec.outputs.iter().map(|o| format!("{}.{o}", spec.id)));
            let mut rewired = false;
            for (k, name) in names.enumerate() {
                let ids = readers(&name);
                let before: BTreeSet<String> = self
                    .running
                    .readers_of(&name)
                    .map(|r| r.id.clone())
                    .collect();
                rewired |= before != ids;
                let targets = senders(&self.live, &ids);
                if let Some(live) = self.live.get(&spec.id)
                    && let Some(output) = live.output(k)
                {
                    output.set(targets);
                }
            }
            if rewired {
                changed.push(spec.id.clone());
            }
        }
        changed
    }

    fn spawn_task(
        &mut self,
        ids: &[String],
        fut: impl Future<Output = Result<(), StageFailure>> + Send + 'static,
    ) -> u64 {
        let task = self.next_task;
        self.next_task += 1;
        self.task_stage.insert(task, ids.to_vec());
        let span = tracing::info_span!("stage", id = %ids.join("+"));
        self.tasks.spawn(tracing::Instrument::instrument(
            async move { (task, fut.await) },
            span,
        ));
        for id in ids {
            if let Some(live) = self.live.get_mut(id) {
                live.tasks.insert(task);
            }
        }
        task
    }

    /// Starts a built stage (one instance per worker); non-sources take
    /// their input.
    fn spawn(&mut self, spec: &StageSpec, built: Vec<Built>, mut input: Option<Receiver>) {
        if !matches!(spec.kind, StageKind::Source | StageKind::Sink) {
            let input = input.expect("a processor has an input");
            return self.spawn_processors(&[spec], vec![built], input, None);
        }
        let live = self.live.get(&spec.id).expect("opened before spawned");
        let (metrics, main, errors) =
            (live.metrics.clone(), live.main.clone(), live.errors.clone());
        let id: Arc<str> = spec.id.as_str().into();
        let mut control = None;
        let interrupt = match (&mut input, spec.kind) {
            (Some(rx), StageKind::Sink) => Some(rx.interruptible()),
            _ => None,
        };
        let workers = spec.workers.max(1);
        let _spawning = self.hold_outputs([spec.id.as_str()]);
        let crew = Crew::new(vec![metrics.clone()]);
        for (index, built) in built.into_iter().enumerate() {
            let global = self.shutdown.clone();
            match built {
                Built::Source(source) => {
                    control = Some(Control::Source {
                        stop: self.spawn_source(id.clone(), source, metrics.clone(), main.clone()),
                    });
                }
                Built::Processor(_) => unreachable!("processors are spawned above"),
                Built::Sink(sink) => {
                    let input = worker_input(input.as_ref(), index, workers);
                    let (swap_tx, swap_rx) = mpsc::unbounded_channel::<Box<dyn Sink>>();
                    let (id, metrics, errors) = (id.clone(), metrics.clone(), errors.clone());
                    let sinks_stop = self.sinks_stop.clone();
                    let mut cx = SinkContext::new(id, input, metrics.clone());
                    cx.dead = Output::with_targets(errors, metrics, OutputRole::Errors);
                    cx.stop = sinks_stop;
                    cx.shutdown = self.shutdown.clone();
                    let stage = SinkStage {
                        cx,
                        sink,
                        swaps: swap_rx,
                    };
                    let stage_id = spec.id.clone();
                    let place = crew.join();
                    self.spawn_task(std::slice::from_ref(&spec.id), async move {
                        stage
                            .run(global, &place)
                            .await
                            .map_err(|message| StageFailure {
                                stage: stage_id,
                                message,
                            })
                    });
                    match &mut control {
                        Some(Control::Sink { swaps, .. }) => swaps.push(swap_tx),
                        _ => {
                            control = Some(Control::Sink {
                                interrupt: interrupt
                                    .clone()
                                    .expect("sink inputs are interruptible"),
                                swaps: vec![swap_tx],
                            })
                        }
                    }
                }
            }
        }
        if let Some(live) = self.live.get_mut(&spec.id) {
            live.control = control;
        }
    }

    /// Keeps the readers of every output of `ids` open while their
    /// instances are made and spawned. An instance spawned first may end
    /// before the next one's outputs exist (a short-lived upstream already
    /// closed the input); were it the last producer then, the readers' list
    /// would be emptied, and a later instance with events of its own (a
    /// local queue's frontend consumer, whose ring was filled before it
    /// started) would count them as discarded.
    fn hold_outputs<'a>(&self, ids: impl IntoIterator<Item = &'a str>) -> Vec<ProducerHold> {
        ids.into_iter()
            .filter_map(|id| self.live.get(id))
            .flat_map(|live| (0..).map_while(|k| live.output(k)))
            .map(OutputTargets::hold)
            .collect()
    }

    /// One stage in a processor worker, sending where the stage's live
    /// outputs point.
    fn member(&self, spec: &StageSpec, processor: Box<dyn Processor>) -> Member {
        let live = self.live.get(&spec.id).expect("opened before spawned");
        let metrics = live.metrics.clone();
        let output = |targets: &OutputTargets, role| {
            Output::with_targets(targets.clone(), metrics.clone(), role)
        };
        Member {
            id: spec.id.as_str().into(),
            processor,
            output: output(&live.main, OutputRole::Main),
            errors: output(&live.errors, OutputRole::Errors),
            named: live
                .named
                .iter()
                .enumerate()
                .map(|(i, targets)| {
                    output(targets, OutputRole::Named(i)).tapped_as(live.main.clone())
                })
                .collect(),
            on_error: spec.on_error,
            metrics: metrics.clone(),
            warn: WarnLimiter::default(),
        }
    }

    /// Starts the workers of a processor stage, or of a fused chain
    /// (`specs` in data order, `built[k]` the instances of `specs[k]`),
    /// reading `input`, the first stage's queue. `after`: the workers of a
    /// split chain, which these wait for, so the order of events and the
    /// hand-over of what the old instances held are kept.
    fn spawn_processors(
        &mut self,
        specs: &[&StageSpec],
        built: Vec<Vec<Built>>,
        input: Receiver,
        after: Option<ChainEnd>,
    ) {
        let head = specs[0];
        let ids: Vec<String> = specs.iter().map(|s| s.id.clone()).collect();
        let workers = head.workers.max(1);
        let _spawning = self.hold_outputs(specs.iter().map(|s| s.id.as_str()));
        let split = CancellationToken::new();
        let end = ChainEnd {
            ended: Arc::new(tokio::sync::Semaphore::new(0)),
            workers: workers as u32,
        };
        let mut instances: Vec<_> = built.into_iter().map(Vec::into_iter).collect();
        let mut swaps = Vec::new();
        // One turn for all the workers (a chain fuses only ordered stages
        // with ordered stages, so the head speaks for it).
        let order = (head.ordered && workers > 1).then(|| {
            input.watch_pushes();
            Order::new()
        });
        let crew = Crew::new(
            specs
                .iter()
                .map(|s| self.live[&s.id].metrics.clone())
                .collect(),
        );
        for index in 0.. {
            let mut members = Vec::with_capacity(specs.len());
            for (spec, built) in specs.iter().zip(instances.iter_mut()) {
                match built.next() {
                    Some(Built::Processor(p)) => members.push(self.member(spec, p)),
                    Some(_) => unreachable!("a processor stage builds processors"),
                    None => break,
                }
            }
            if members.len() < specs.len() {
                break;
            }
            let (swap_tx, swap_rx) = mpsc::unbounded_channel();
            swaps.push(swap_tx);
            let mut stage = ProcessorStage {
                input: worker_input(Some(&input), index, workers),
                members,
                swaps: swap_rx,
                split: split.clone(),
                failing: None,
                order: order.clone(),
            };
            let global = self.shutdown.clone();
            let (after, ended) = (after.clone(), end.ended.clone());
            let fused = specs.len() > 1;
            let place = crew.join();
            self.spawn_task(&ids, async move {
                if let Some(after) = after {
                    after.wait().await;
                }
                // A fused worker tells a split's successors it has ended,
                // however it ends.
                let _ended = fused.then(|| AddsPermitOnDrop(ended));
                let result = guard(stage.run()).await;
                let Err(message) = result else {
                    return Ok(());
                };
                let failing = stage
                    .failing
                    .clone()
                    .unwrap_or_else(|| stage.members[0].id.clone());
                fail_fast(&failing, &message, &global);
                // As if apart: the stages after the failed one end normally,
                // handing on what they hold; what the ones before it hold
                // (like the failed one's input) is errored.
                let k = stage
                    .members
                    .iter()
                    .position(|m| m.id == failing)
                    .unwrap_or(0);
                let _ = guard(stage.finish_from(k + 1)).await;
                place.failed();
                drain_as_errored(&mut stage.input, &stage.members[0].metrics).await;
                Err(StageFailure {
                    stage: failing.to_string(),
                    message,
                })
            });
        }
        let live = self.live.get_mut(&head.id).expect("opened before spawned");
        if specs.len() > 1 {
            live.control = Some(Control::Fused { split, end });
            live.parked = Some(input);
            let mut inventory = self.inventory.lock().expect("inventory lock");
            for id in &ids {
                inventory.fused.insert(id.clone(), head.id.clone());
            }
        } else {
            live.control = Some(Control::Processor { swaps });
        }
    }

    fn spawn_source(
        &mut self,
        id: Arc<str>,
        source: Box<dyn Source>,
        metrics: Arc<StageMetrics>,
        targets: OutputTargets,
    ) -> CancellationToken {
        let stop = self.shutdown.child_token();
        let cx = SourceContext {
            id: id.clone(),
            output: Output::with_targets(targets, metrics, OutputRole::Main),
            shutdown: stop.clone(),
        };
        let global = self.shutdown.clone();
        let name = id.clone();
        self.spawn_task(&[name.to_string()], async move {
            let result = guard(source.run(cx)).await;
            if let Err(message) = &result {
                fail_fast(&id, message, &global);
            }
            result.map_err(|message| StageFailure {
                stage: id.to_string(),
                message,
            })
        });
        stop
    }

    fn reload(&mut self, new: Pipeline) -> Result<ReloadSummary, ReloadError> {
        if self.shutdown.is_cancelled() {
            return Err(ReloadError::Stopped);
        }
        if serde_json::to_value(&new.settings).ok()
            != serde_json::to_value(&self.running.settings).ok()
        {
            return Err(ReloadError::SettingsChanged);
        }
        let mut summary = ReloadSummary::default();
        let mut to_build = Vec::new();
        for spec in &new.stages {
            match self.running.stage(&spec.id) {
                None => {
                    summary.added.push(spec.id.clone());
                    to_build.push(spec);
                }
                Some(old) if old.kind != spec.kind => {
                    return Err(ReloadError::KindChanged(spec.id.clone()));
                }
                Some(old)
                    if old.workers != spec.workers
                        || old.ordered != spec.ordered
                        || old.queue != spec.queue =>
                {
                    return Err(ReloadError::QueueChanged(spec.id.clone()));
                }
                Some(old) if old.outputs != spec.outputs => {
                    return Err(ReloadError::OutputsChanged(spec.id.clone()));
                }
                Some(old)
                    if old.plugin_name != spec.plugin_name
                        || old.options != spec.options
                        || old.on_error != spec.on_error =>
                {
                    summary.changed.push(spec.id.clone());
                    to_build.push(spec);
                }
                Some(_) => {}
            }
        }
        for old in &self.running.stages {
            if new.stage(&old.id).is_none() {
                summary.removed.push(old.id.clone());
            }
        }
        // A fused chain runs on only while the new configuration fuses the
        // same stages and changes none of them. Any other is split: its
        // stages' own workers, built afresh, take over its queues.
        let new_chains: Vec<Vec<String>> = new
            .fused_chains()
            .iter()
            .map(|c| c.iter().map(|s| s.id.clone()).collect())
            .collect();
        let touched = |id: &String| summary.changed.contains(id) || summary.removed.contains(id);
        let (kept, split): (Vec<_>, Vec<_>) = self
            .chains
            .iter()
            .cloned()
            .partition(|c| new_chains.contains(c) && !c.iter().any(touched));
        for id in split.iter().flatten() {
            if !summary.changed.contains(id)
                && let Some(spec) = new.stage(id)
            {
                to_build.push(spec);
            }
        }
        // Build everything first: a plugin that cannot be built leaves the
        // running pipeline exactly as it was.
        let mut built = build_all(&new, to_build.into_iter()).map_err(ReloadError::Build)?;

        let added: Vec<StageSpec> = new
            .stages
            .iter()
            .filter(|s| summary.added.contains(&s.id))
            .cloned()
            .collect();
        let mut durables = open_durables(&new, added.iter()).map_err(ReloadError::Build)?;
        let mut opened = self.open_channels(added.iter(), &mut durables, &BTreeSet::new());
        let rewired = self.rewire(&new);
        summary.rewired = rewired
            .into_iter()
            .filter(|id| !summary.added.contains(id))
            .collect();

        for chain in &split {
            let control = self.live.get_mut(&chain[0]).and_then(|l| l.control.take());
            let Some(Control::Fused { split, end }) = control else {
                continue; // it has ended
            };
            // The first stage removed: nobody takes over its queue, so the
            // chain drains it to the end, as a removed stage does, while the
            // stages after it run on their own (as apart, what the removed
            // stage drains may interleave with what their new upstreams
            // send; waiting could deadlock on a queue of theirs it feeds).
            let head_removed = new.stage(&chain[0]).is_none();
            let after = (!head_removed).then(|| end.clone());
            {
                let mut inventory = self.inventory.lock().expect("inventory lock");
                inventory.fused.retain(|stage, _| !chain.contains(stage));
                // The queues the chain left unread are read from now on.
                for id in &chain[1..] {
                    if let Some(rx) = self.live.get(id).and_then(|l| l.parked.as_ref()) {
                        inventory.channels.push((id.clone(), rx.handle()));
                    }
                }
            }
            for id in chain {
                // A removed stage drains with the chain's workers.
                let Some(spec) = new.stage(id) else { continue };
                let Some(input) = self.live.get_mut(id).and_then(|l| l.parked.take()) else {
                    continue;
                };
                let b = built.remove(id).expect("split stages were built");
                self.spawn_processors(&[spec], vec![b], input, after.clone());
            }
            // Only now: the successors' outputs hold the targets, so the old
            // workers ending cannot close their readers' inputs.
            if !head_removed {
                split.cancel();
            }
            tracing::info!("stages {} no longer run fused", chain.join(", "));
        }
        self.chains = kept;
        // Removed stages stop receiving (rewire left them out), drain what
        // they hold to their old readers, and end. Sources are told to stop.
        for id in &summary.removed {
            self.inventory
                .lock()
                .expect("inventory lock")
                .outputs
                .remove(id);
            if let Some(mut live) = self.live.remove(id) {
                if let Some(Control::Source { stop }) = live.control.take() {
                    stop.cancel();
                }
                self.draining.push(live);
            }
        }
        for id in summary.changed.clone() {
            let spec = new.stage(&id).expect("changed stages exist").clone();
            // (A stage of a split chain was started above.)
            let Some(b) = built.remove(&id) else { continue };
            // A stage that already ended (its input closed) has nothing to swap.
            let Some(live) = self.live.get_mut(&id) else {
                continue;
            };
            match (live.control.take(), b) {
                (Some(Control::Source { stop }), mut instances) => {
                    // The successor's output is made below; until then the
                    // old one ending must not close the readers.
                    let _handing_over = live.main.hold();
                    stop.cancel();
                    let Some(Built::Source(source)) = instances.pop() else {
                        unreachable!("a source builds a source")
                    };
                    let (metrics, main) = (live.metrics.clone(), live.main.clone());
                    let stop = self.spawn_source(id.as_str().into(), source, metrics, main);
                    self.live.get_mut(&id).expect("live").control = Some(Control::Source { stop });
                }
                (Some(Control::Processor { swaps }), instances) => {
                    for (swap, built) in swaps.iter().zip(instances) {
                        if let Built::Processor(p) = built {
                            let _ = swap.send((p, spec.on_error));
                        }
                    }
                    live.control = Some(Control::Processor { swaps });
                }
                (Some(Control::Sink { interrupt, swaps }), instances) => {
                    for (swap, built) in swaps.iter().zip(instances) {
                        if let Built::Sink(s) = built {
                            let _ = swap.send(s);
                        }
                    }
                    interrupt.raise();
                    live.control = Some(Control::Sink { interrupt, swaps });
                }
                // (A fused chain's stage that changed was split above.)
                (other, _) => live.control = other,
            }
        }
        for spec in &added {
            let b = built.remove(&spec.id).expect("added stages were built");
            let channel = opened.remove(&spec.id);
            self.spawn(spec, b, channel.map(|(rx, _)| rx));
        }
        drop(opened);
        summary.unchanged = new.stages.len() - summary.added.len() - summary.changed.len();
        self.inventory.lock().expect("inventory lock").pipeline = new.clone();
        self.running = new;
        Ok(summary)
    }

    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) -> RunReport {
        loop {
            tokio::select! {
                joined = self.tasks.join_next() => {
                    let Some(joined) = joined else { break };
                    let (task, result) = joined.expect("stage tasks catch their own panics");
                    for stage in self.task_stage.remove(&task).unwrap_or_default() {
                        // A stage that is over lets go of its readers' channels, so
                        // they end once their other upstreams do. (A source replaced
                        // by a reload ended too, but its successor uses the outputs.)
                        let over = self.live.get_mut(&stage).is_some_and(|l| {
                            l.tasks.remove(&task);
                            l.tasks.is_empty()
                        });
                        if over && let Some(live) = self.live.remove(&stage) {
                            live.let_go();
                        }
                    }
                    // A removed stage whose last task ended lets go the same way.
                    while let Some(i) = self.draining.iter_mut().position(|l| {
                        l.tasks.remove(&task) && l.tasks.is_empty()
                    }) {
                        self.draining.swap_remove(i).let_go();
                    }
                    if let Err(failure) = result {
                        self.failures.push(failure);
                    }
                }
                Some(command) = commands.recv() => match command {
                    Command::Reload(pipeline, reply) => {
                        let result = self.reload(*pipeline);
                        match &result {
                            Ok(summary) => tracing::info!("reloaded: {summary}"),
                            Err(e) => tracing::warn!("reload refused, pipeline unchanged: {e}"),
                        }
                        let _ = reply.send(result);
                    }
                },
            }
        }
        // Everything ended: the drain deadline has nothing left to stop.
        self.sinks_stop.cancel();
        let (stages, channels) = report_parts(&self.inventory.lock().expect("inventory lock"));
        RunReport::new(stages, channels, self.failures, self.started.elapsed())
    }
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
        Err(panic) => Err(format!("panicked: {}", panic_message(panic.as_ref()))),
    }
}

/// The input of a stage's `index`th instance: the first `workers` read the
/// shared queue (a local queue's backend); each further one consumes one
/// frontend of a local-scope queue.
fn worker_input(input: Option<&Receiver>, index: usize, workers: usize) -> Receiver {
    let input = input.expect("a processor or sink has an input");
    if index < workers {
        input.clone()
    } else {
        input
            .frontend(index - workers)
            .expect("one instance per frontend")
    }
}

/// After a failure: keep the input flowing so upstreams can finish,
/// counting every event that still arrives as errored. (What the stage
/// held is errored by its [`Crew`] when its last worker ends.)
///
/// A durable queue's batches are not errored: they go back to its log,
/// unacknowledged, and are delivered at the next start.
async fn drain_as_errored(input: &mut Receiver, metrics: &StageMetrics) {
    // Events it held are errored by the crew, and (from a durable queue)
    // also stay in the log: this run counts them as failed, the next
    // delivers them again.
    input.return_held();
    while let Some(batch) = input.recv().await {
        let n = batch.len() as u64;
        if !batch.return_to_store() {
            metrics.add_in(n);
            metrics.add_errored(n);
        }
    }
}

/// The workers of one stage, or of one fused chain, while they run. A
/// stage's counters are shared by its workers, so what a failed stage
/// still held (received, never forwarded, committed or errored: events
/// inside its instances) can only be told once every worker has ended;
/// before that, another worker's batch in hand would look the same. The
/// last worker to end after a failure counts it as errored. A stage that
/// did not fail is left as it is: an imbalance there is a loss to report.
struct Crew {
    alive: std::sync::atomic::AtomicUsize,
    failed: std::sync::atomic::AtomicBool,
    metrics: Vec<Arc<StageMetrics>>,
}

/// One worker's place in its [`Crew`], given up when it is dropped.
struct CrewPlace(Arc<Crew>);

impl Crew {
    fn new(metrics: Vec<Arc<StageMetrics>>) -> Arc<Crew> {
        Arc::new(Crew {
            alive: 0.into(),
            failed: false.into(),
            metrics,
        })
    }

    fn join(self: &Arc<Self>) -> CrewPlace {
        self.alive.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        CrewPlace(self.clone())
    }
}

impl CrewPlace {
    fn failed(&self) {
        self.0
            .failed
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for CrewPlace {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::SeqCst;
        let crew = &self.0;
        if crew.alive.fetch_sub(1, SeqCst) != 1 || !crew.failed.load(SeqCst) {
            return;
        }
        for metrics in &crew.metrics {
            let held = metrics.snapshot().unaccounted();
            if held > 0 {
                metrics.add_errored(held as u64);
            }
        }
    }
}

/// Opens the durable store of every `disk` / `disk-assisted` queue among
/// `specs`, recovering what an earlier process left.
fn open_durables<'a>(
    pipeline: &Pipeline,
    specs: impl Iterator<Item = &'a StageSpec>,
) -> Result<HashMap<String, Durable>, Vec<BuildError>> {
    let mut opened = HashMap::new();
    let mut errors = Vec::new();
    for spec in specs {
        let base = pipeline
            .path
            .parent()
            .unwrap_or_else(|| std::path::Path::new("."));
        let Some(d) = spec.durable(&pipeline.settings, base) else {
            continue;
        };
        let dir = d.config.dir.display().to_string();
        match Durable::open(d.config, d.kind) {
            Ok((durable, recovery)) => {
                let durable = durable.with_save_on_shutdown(d.save_on_shutdown);
                for note in &recovery.notes {
                    tracing::warn!(stage = %spec.id, queue = %dir, "{note}");
                }
                if recovery.lost_records > 0 {
                    tracing::error!(
                        stage = %spec.id,
                        queue = %dir,
                        "{} events stored by an earlier run are gone from the queue (damage); counted as lost",
                        recovery.lost_records
                    );
                }
                if recovery.records > 0 {
                    tracing::info!(
                        stage = %spec.id,
                        queue = %dir,
                        "recovered {} events ({} bytes in {} segments) left by an earlier run",
                        recovery.records,
                        recovery.bytes,
                        recovery.segments
                    );
                }
                opened.insert(spec.id.clone(), durable);
            }
            Err(e) => errors.push(BuildError {
                stage: spec.id.clone(),
                message: format!("queue: {e}"),
            }),
        }
    }
    if errors.is_empty() {
        Ok(opened)
    } else {
        Err(errors)
    }
}

/// One worker of a sink stage: runs the sink over its input, drains the
/// input as errored if it fails, and hands the same input (with what is
/// queued in it) to a replacement when a reload interrupts it.
struct SinkStage {
    cx: SinkContext,
    sink: Box<dyn Sink>,
    /// Replacements sent by reloads, before the input's interrupt is raised.
    swaps: mpsc::UnboundedReceiver<Box<dyn Sink>>,
}

impl SinkStage {
    async fn run(mut self, global: CancellationToken, place: &CrewPlace) -> Result<(), String> {
        let cx = &mut self.cx;
        loop {
            let result = guard(self.sink.run(cx)).await;
            if let Err(message) = &result {
                fail_fast(&cx.id, message, &global);
                place.failed();
                cx.input.resume();
                drain_as_errored(&mut cx.input, &cx.metrics).await;
                return result;
            }
            if !cx.input.is_interrupted() {
                return result;
            }
            // Interrupted for a reload: the newest replacement takes over
            // the same input, with its queued events.
            cx.input.resume();
            let Some(mut next) = self.swaps.recv().await else {
                return result;
            };
            while let Ok(newer) = self.swaps.try_recv() {
                next = newer;
            }
            self.sink = next;
        }
    }
}

/// One stage in a processor task: its plugin instance and its outputs.
struct Member {
    id: Arc<str>,
    processor: Box<dyn Processor>,
    output: Output,
    errors: Output,
    /// Its named outputs, which [`Verdict::To`] indexes.
    named: Vec<Output>,
    on_error: OnError,
    metrics: Arc<StageMetrics>,
    warn: WarnLimiter,
}

/// One worker of a processor stage, or of a fused chain of them: the
/// members run in data order over each batch, each passing its main output
/// straight to the next; the last one sends it. The input batch (and so
/// its channel permits) is held until the last member has sent, so a
/// chain holds no more events than its first stage's queue admits.
struct ProcessorStage {
    input: Receiver,
    members: Vec<Member>,
    /// A reload's replacement processor and `on_error` (an unfused stage).
    swaps: mpsc::UnboundedReceiver<(Box<dyn Processor>, OnError)>,
    /// Cancelled when a reload splits the chain: the worker ends after
    /// the batch in hand, and the stages' own tasks take over its input.
    split: CancellationToken,
    /// The member whose failure ended the worker.
    failing: Option<Arc<str>>,
    /// `ordered: true` with several workers: the turn they share.
    order: Option<Arc<Order<Parked>>>,
}

/// Where a member sends a batch.
#[derive(Clone, Copy)]
enum Port {
    Main,
    Errors,
    Named(usize),
}

/// What one batch sends, by member and port, in the order it is sent.
type Sends = Vec<(usize, Port, Vec<Event>)>;

/// An ordered worker's finished batch waiting for its turn, with the input
/// batch whose permits it still holds.
struct Parked {
    sends: Sends,
    _input: Option<InputBatch>,
}

impl ProcessorStage {
    async fn run(&mut self) -> Result<(), StageError> {
        loop {
            tokio::select! {
                biased;
                Some((processor, on_error)) = self.swaps.recv() => {
                    // Between batches: the old instance hands over what it holds.
                    self.finish().await?;
                    self.members[0].processor = processor;
                    self.members[0].on_error = on_error;
                }
                _ = self.split.cancelled() => {
                    // What the instances hold goes on now; the tasks taking
                    // over start after this one (and, ordered, every batch
                    // taken before) has ended.
                    self.finish().await?;
                    return self.settle().await;
                }
                batch = take(&mut self.input, self.order.as_ref()) => match batch {
                    Some((ticket, mut batch)) => {
                        let events = batch.take();
                        self.forward(0, events, ticket, Some(batch)).await?;
                    }
                    None => break,
                },
            }
        }
        self.finish().await?;
        self.settle().await
    }

    /// Every member's held events (`Processor::finish`), each through the
    /// members after it.
    async fn finish(&mut self) -> Result<(), StageError> {
        self.finish_from(0).await
    }

    /// [`finish`](Self::finish) of the members from `from` on.
    async fn finish_from(&mut self, from: usize) -> Result<(), StageError> {
        let count = self.members.len();
        for i in from..count {
            let member = &mut self.members[i];
            member.warn.flush(&member.id);
            // A panic in `finish` is this member's failure.
            self.failing = Some(member.id.clone());
            let tail = member.processor.finish();
            self.failing = None;
            member.metrics.add_created(tail.len() as u64);
            let ticket = self.order.as_ref().map(Order::ticket);
            if i + 1 == count {
                self.deliver(ticket, vec![(i, Port::Main, tail)], None)
                    .await?;
            } else {
                member.output.pass_on(&tail);
                self.forward(i + 1, tail, ticket, None).await?;
            }
        }
        Ok(())
    }

    /// Runs `events` through the members from `from` on and sends what the
    /// last keeps, with what each member routes elsewhere (in `ticket`'s
    /// turn when ordered). A member failing with `on_error: fail` still
    /// passes on what it kept before the failing event.
    async fn forward(
        &mut self,
        from: usize,
        mut events: Vec<Event>,
        ticket: Option<Ticket<Parked>>,
        input: Option<InputBatch>,
    ) -> Result<(), StageError> {
        let last = self.members.len() - 1;
        let mut failure = None;
        let mut sends = Sends::new();
        for i in from..=last {
            let member = &mut self.members[i];
            let processed = member.process(events);
            if let Some(error) = processed.failure {
                failure.get_or_insert((member.id.clone(), error));
            }
            sends.push((i, Port::Errors, processed.routed));
            sends.extend(
                (processed.named.into_iter().enumerate()).map(|(k, e)| (i, Port::Named(k), e)),
            );
            if i == last {
                sends.push((i, Port::Main, processed.kept));
                events = Vec::new();
            } else {
                member.output.pass_on(&processed.kept);
                events = processed.kept;
            }
        }
        debug_assert!(events.is_empty());
        self.deliver(ticket, sends, input).await?;
        match failure {
            None => Ok(()),
            Some((id, error)) => {
                self.failing = Some(id);
                Err(StageError::Other(format!(
                    "event failed with `on_error: fail`: {error}"
                )))
            }
        }
    }

    /// Sends a batch's output now, or parks it for its turn and sends
    /// whatever is due.
    async fn deliver(
        &mut self,
        ticket: Option<Ticket<Parked>>,
        sends: Sends,
        input: Option<InputBatch>,
    ) -> Result<(), StageError> {
        match ticket {
            None => {
                let sent = self.send(sends).await;
                drop(input);
                sent
            }
            Some(ticket) => {
                ticket.park(Parked {
                    sends,
                    _input: input,
                });
                self.send_due().await
            }
        }
    }

    /// Sends the parked batches whose turn it is, this worker's or not.
    async fn send_due(&mut self) -> Result<(), StageError> {
        let Some(order) = self.order.clone() else {
            return Ok(());
        };
        while let Some((parked, _turn)) = order.claim() {
            self.send(parked.sends).await?;
        }
        Ok(())
    }

    /// Ordered: waits, sending what is due meanwhile, until every batch
    /// taken by any worker has been sent, so that nothing this stage took
    /// is still unsent when one of its workers ends.
    async fn settle(&mut self) -> Result<(), StageError> {
        let Some(order) = self.order.clone() else {
            return Ok(());
        };
        loop {
            let changed = order.changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            self.send_due().await?;
            if order.settled() {
                return Ok(());
            }
            changed.await;
        }
    }

    async fn send(&mut self, sends: Sends) -> Result<(), StageError> {
        for (i, port, events) in sends {
            let member = &mut self.members[i];
            let output = match port {
                Port::Main => &mut member.output,
                Port::Errors => &mut member.errors,
                Port::Named(k) => &mut member.named[k],
            };
            if let Err(e) = output.send(events).await {
                // A side output that cannot send is this member's failure.
                if !matches!(port, Port::Main) {
                    self.failing = Some(self.members[i].id.clone());
                }
                return Err(e.into());
            }
        }
        Ok(())
    }
}

/// The next batch, numbered among the workers when they are ordered.
/// Cancel-safe: a batch is taken and numbered in one step that does not
/// wait.
async fn take(
    input: &mut Receiver,
    order: Option<&Arc<Order<Parked>>>,
) -> Option<(Option<Ticket<Parked>>, InputBatch)> {
    let Some(order) = order else {
        return Some((None, input.recv().await?));
    };
    // As `recv` does: a worker whose input never runs dry gives its
    // thread back now and then.
    tokio::task::consume_budget().await;
    let signal = input.push_signal();
    loop {
        let pushed = signal.notified();
        tokio::pin!(pushed);
        pushed.as_mut().enable();
        if let Some((ticket, batch)) = order.try_take(|| input.try_recv()) {
            return Some((Some(ticket), batch));
        }
        if input.is_ended() {
            return None;
        }
        pushed.await;
    }
}

/// What a member made of a batch.
struct Processed {
    /// For its main output.
    kept: Vec<Event>,
    /// For `<id>.errors` (`on_error: route`).
    routed: Vec<Event>,
    /// For each named output.
    named: Vec<Vec<Event>>,
    /// The `on_error: fail` error that stopped it.
    failure: Option<EventError>,
}

impl Member {
    /// Runs the plugin over a batch and sorts the events by where they go.
    fn process(&mut self, events: Vec<Event>) -> Processed {
        let n = events.len();
        self.metrics.add_in(n as u64);
        let mut out = Vec::with_capacity(n);
        let mut routed = Vec::new();
        let mut named: Vec<Vec<Event>> = self.named.iter().map(|_| Vec::new()).collect();
        let mut failure = None;
        let mut events = events.into_iter();
        // Acknowledgements: a kept or routed event carries its handle
        // on; a replacement inherits the handle of the event it came
        // from; a discard is finished (delivered), `on_error: drop` is
        // rejected. An event dropped any other way (`on_error: fail`
        // leaves the rest of the batch) counts as errored.
        for mut event in events.by_ref() {
            // A panic on one event (often inside a third-party decoder
            // meeting input it never expected) is that event's error,
            // handled by `on_error`, not the end of the stage.
            let verdict =
                std::panic::catch_unwind(AssertUnwindSafe(|| self.processor.process(&mut event)))
                    .unwrap_or_else(|panic| {
                        Err(EventError::new(format!(
                            "panicked on this event: {}",
                            panic_message(panic.as_ref())
                        )))
                    });
            match verdict {
                Ok(Verdict::Keep) => out.push(event),
                Ok(Verdict::Discard) => {
                    event.settle(Outcome::Delivered);
                    self.metrics.add_discarded(1);
                }
                Ok(Verdict::Replace(mut replacement)) => {
                    for child in &mut replacement {
                        child.inherit_ack(event.ack());
                    }
                    event.settle(Outcome::Delivered);
                    match replacement.len() {
                        0 => self.metrics.add_discarded(1),
                        k => {
                            self.metrics.add_created(k as u64 - 1);
                            out.extend(replacement);
                        }
                    }
                }
                Ok(Verdict::To(set)) => {
                    // A copy to each output but the last, which takes
                    // the event; copies share its acknowledgement.
                    let count = named.len();
                    let known = move |i: &usize| *i < count;
                    match set.iter().filter(known).last() {
                        None => {
                            event.settle(Outcome::Delivered);
                            self.metrics.add_discarded(1);
                        }
                        Some(last) => {
                            for i in set.iter().filter(known).filter(|&i| i != last) {
                                let mut copy = event.detached();
                                copy.inherit_ack(event.ack());
                                self.metrics.add_created(1);
                                named[i].push(copy);
                            }
                            named[last].push(event);
                        }
                    }
                }
                Err(error) => match self.on_error {
                    OnError::Drop => {
                        event.settle(Outcome::Rejected);
                        self.metrics.add_errored(1);
                        self.warn.warn(&self.id, &error);
                    }
                    OnError::Route => routed.push(attach_error(event, &self.id, &error.0)),
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
        Processed {
            kept: out,
            routed,
            named,
            failure,
        }
    }
}

/// Logs the first few errors of each 10-second window and then a count of
/// the ones it kept quiet, so a flood of bad lines cannot flood the log.
#[derive(Default)]
struct WarnLimiter {
    window_start: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

/// What one more error at a given moment calls for.
#[derive(Debug, PartialEq, Eq)]
struct WarnTurn {
    /// Errors kept quiet in the window that just ended, to be reported.
    quiet_before: u64,
    /// Whether this error is logged.
    log: bool,
}

impl WarnLimiter {
    const PER_WINDOW: u32 = 5;
    const WINDOW: Duration = Duration::from_secs(10);

    fn turn(&mut self, now: Instant) -> WarnTurn {
        let mut quiet_before = 0;
        if self
            .window_start
            .is_none_or(|s| now.duration_since(s) >= Self::WINDOW)
        {
            quiet_before = std::mem::take(&mut self.suppressed);
            self.window_start = Some(now);
            self.logged = 0;
        }
        let log = self.logged < Self::PER_WINDOW;
        if log {
            self.logged += 1;
        } else {
            self.suppressed += 1;
        }
        WarnTurn { quiet_before, log }
    }

    fn warn(&mut self, stage: &str, error: &EventError) {
        let turn = self.turn(Instant::now());
        if turn.quiet_before > 0 {
            tracing::warn!(
                stage,
                suppressed = turn.quiet_before,
                "{} similar event errors were not logged",
                turn.quiet_before
            );
        }
        if turn.log {
            tracing::warn!(stage, "dropped an event: {error}");
        }
    }

    /// Logs how many were kept quiet, if any (at a window's end and at exit).
    fn flush(&mut self, stage: &str) {
        let suppressed = std::mem::take(&mut self.suppressed);
        if suppressed > 0 {
            tracing::warn!(
                stage,
                suppressed,
                "{suppressed} more dropped events were not logged"
            );
        }
    }
}

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
