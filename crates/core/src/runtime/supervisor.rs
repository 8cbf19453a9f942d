//! The supervisor: spawns every stage, hears each one end, applies
//! reloads (swap, add, remove, rewire) and drives the drain at shutdown.

use super::*;

/// How the supervisor reaches into a running stage.
pub(super) enum Control {
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
pub(super) struct ChainEnd {
    /// One permit for each chain worker that has ended.
    pub(super) ended: Arc<tokio::sync::Semaphore>,
    pub(super) workers: u32,
}

impl ChainEnd {
    pub(super) async fn wait(&self) {
        // The permits go back at once: every successor waits the same way.
        let _all = self.ended.acquire_many(self.workers).await;
    }
}

pub(super) struct AddsPermitOnDrop(Arc<tokio::sync::Semaphore>);

impl Drop for AddsPermitOnDrop {
    fn drop(&mut self) {
        self.0.add_permits(1);
    }
}

pub(super) struct Live {
    /// The tasks running the stage (its workers; during a source swap, the
    /// old source and the new). The stage is over when none is left.
    pub(super) tasks: std::collections::HashSet<u64>,
    pub(super) metrics: Arc<StageMetrics>,
    /// The stage's input channel, without keeping it open.
    pub(super) input: Option<WeakSender>,
    pub(super) main: OutputTargets,
    pub(super) errors: OutputTargets,
    /// Its named outputs, in [`StageSpec::outputs`] order.
    pub(super) named: Vec<OutputTargets>,
    pub(super) control: Option<Control>,
    /// A fused stage's own input queue, unread while its chain runs it
    /// (the first stage's is read by the chain): the stage's own workers
    /// read it if a reload splits the chain.
    pub(super) parked: Option<Receiver>,
}

impl Live {
    /// The stage is over: its readers' inputs end once their other
    /// upstreams do.
    pub(super) fn let_go(self) {
        self.main.set(Vec::new());
        self.errors.set(Vec::new());
        for named in &self.named {
            named.set(Vec::new());
        }
    }

    /// Output `k`: 0 the main one, 1 the side one, then the named ones.
    pub(super) fn output(&self, k: usize) -> Option<&OutputTargets> {
        match k {
            0 => Some(&self.main),
            1 => Some(&self.errors),
            n => self.named.get(n - 2),
        }
    }
}

pub(super) struct Supervisor {
    pub(super) shutdown: CancellationToken,
    /// Cancelled `settings.drain_timeout_ms` after `shutdown`: sinks still
    /// retrying give up then.
    pub(super) sinks_stop: CancellationToken,
    /// The configuration being run.
    pub(super) running: Pipeline,
    pub(super) live: HashMap<String, Live>,
    /// Stages removed by a reload whose tasks are still draining.
    pub(super) draining: Vec<Live>,
    /// Every stage and channel that ever ran, shared with [`StatsHandle`].
    pub(super) inventory: Arc<Mutex<Inventory>>,
    pub(super) tasks: JoinSet<(u64, Result<(), StageFailure>)>,
    /// The stages each task runs (several for a fused chain).
    pub(super) task_stage: HashMap<u64, Vec<String>>,
    pub(super) next_task: u64,
    pub(super) failures: Vec<StageFailure>,
    pub(super) started: Instant,
    /// The fused chains running, each in data order.
    pub(super) chains: Vec<Vec<String>>,
}

/// Opened channels waiting for their stage: the receiver, and a strong
/// sender that keeps the channel open until the wiring holds its own.
pub(super) type Opened = HashMap<String, (Receiver, Sender)>;

impl Supervisor {
    /// Opens the input queue of each of `specs`; the ones in `unlisted`
    /// (fused stages, whose queues stay unread) are left out of the report.
    pub(super) fn open_channels<'a>(
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
    pub(super) fn rewire(&mut self, pipeline: &Pipeline) -> Vec<String> {
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

    pub(super) fn spawn_task(
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
    pub(super) fn spawn(
        &mut self,
        spec: &StageSpec,
        built: Vec<Built>,
        mut input: Option<Receiver>,
    ) {
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
    pub(super) fn hold_outputs<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a str>,
    ) -> Vec<ProducerHold> {
        ids.into_iter()
            .filter_map(|id| self.live.get(id))
            .flat_map(|live| (0..).map_while(|k| live.output(k)))
            .map(OutputTargets::hold)
            .collect()
    }

    /// One stage in a processor worker, sending where the stage's live
    /// outputs point.
    pub(super) fn member(&self, spec: &StageSpec, processor: Box<dyn Processor>) -> Member {
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
    pub(super) fn spawn_processors(
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

    pub(super) fn spawn_source(
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

    pub(super) fn reload(&mut self, new: Pipeline) -> Result<ReloadSummary, ReloadError> {
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

    pub(super) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) -> RunReport {
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

/// Opens the durable store of every `disk` / `disk-assisted` queue among
/// `specs`, recovering what an earlier process left.
pub(super) fn open_durables<'a>(
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
