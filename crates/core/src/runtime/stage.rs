//! The stage loops: a sink's, and a processor chain's per-event loop
//! (fused stages run as members of one task), with their error handling;
//! and what every stage task shares: a panic caught as the stage's failure,
//! failing fast, a worker's share of its stage's input, the crew that ends
//! a stage when its last worker ends, a failed stage's input drained as
//! errored.

use super::*;

/// One worker of a sink stage: runs the sink over its input, drains the
/// input as errored if it fails, and hands the same input (with what is
/// queued in it) to a replacement when a reload interrupts it.
pub(super) struct SinkStage {
    pub(super) cx: SinkContext,
    pub(super) sink: Box<dyn Sink>,
    /// Replacements sent by reloads, before the input's interrupt is raised.
    pub(super) swaps: mpsc::UnboundedReceiver<Box<dyn Sink>>,
}

impl SinkStage {
    pub(super) async fn run(
        mut self,
        global: CancellationToken,
        place: &CrewPlace,
    ) -> Result<(), String> {
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
pub(super) struct Member {
    pub(super) id: Arc<str>,
    pub(super) processor: Box<dyn Processor>,
    pub(super) output: Output,
    pub(super) errors: Output,
    /// Its named outputs, which [`Verdict::To`] indexes.
    pub(super) named: Vec<Output>,
    pub(super) on_error: OnError,
    pub(super) metrics: Arc<StageMetrics>,
    pub(super) warn: WarnLimiter,
}

/// One worker of a processor stage, or of a fused chain of them: the
/// members run in data order over each batch, each passing its main output
/// straight to the next; the last one sends it. The input batch (and so
/// its channel permits) is held until the last member has sent, so a
/// chain holds no more events than its first stage's queue admits.
pub(super) struct ProcessorStage {
    pub(super) input: Receiver,
    pub(super) members: Vec<Member>,
    /// A reload's replacement processor and `on_error` (an unfused stage).
    pub(super) swaps: mpsc::UnboundedReceiver<(Box<dyn Processor>, OnError)>,
    /// Cancelled when a reload splits the chain: the worker ends after
    /// the batch in hand, and the stages' own tasks take over its input.
    pub(super) split: CancellationToken,
    /// The member whose failure ended the worker.
    pub(super) failing: Option<Arc<str>>,
    /// `ordered: true` with several workers: the turn they share.
    pub(super) order: Option<Arc<Order<Parked>>>,
}

/// Where a member sends a batch.
#[derive(Clone, Copy)]
pub(super) enum Port {
    Main,
    Errors,
    Named(usize),
}

/// What one batch sends, by member and port, in the order it is sent.
pub(super) type Sends = Vec<(usize, Port, Vec<Event>)>;

/// An ordered worker's finished batch waiting for its turn, with the input
/// batch whose permits it still holds.
pub(super) struct Parked {
    pub(super) sends: Sends,
    pub(super) _input: Option<InputBatch>,
}

impl ProcessorStage {
    pub(super) async fn run(&mut self) -> Result<(), StageError> {
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
    pub(super) async fn finish(&mut self) -> Result<(), StageError> {
        self.finish_from(0).await
    }

    /// [`finish`](Self::finish) of the members from `from` on.
    pub(super) async fn finish_from(&mut self, from: usize) -> Result<(), StageError> {
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
    pub(super) async fn forward(
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
    pub(super) async fn deliver(
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
    pub(super) async fn send_due(&mut self) -> Result<(), StageError> {
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
    pub(super) async fn settle(&mut self) -> Result<(), StageError> {
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

    pub(super) async fn send(&mut self, sends: Sends) -> Result<(), StageError> {
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
pub(super) async fn take(
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
pub(super) struct Processed {
    /// For its main output.
    pub(super) kept: Vec<Event>,
    /// For `<id>.errors` (`on_error: route`).
    pub(super) routed: Vec<Event>,
    /// For each named output.
    pub(super) named: Vec<Vec<Event>>,
    /// The `on_error: fail` error that stopped it.
    pub(super) failure: Option<EventError>,
}

/// Gives the events a processor made from `parent` their source position:
/// the parent's for a one-for-one replacement, a distinct part of it each
/// when one event became several (a sink naming events by position must
/// not see two share a name).
fn place_children(parent: &Event, children: &mut [Event]) {
    let Some(position) = parent.meta().position else {
        return;
    };
    if let [child] = children {
        if child.meta().position != Some(position) {
            child.meta_mut().position = Some(position);
        }
        return;
    }
    for (i, child) in children.iter_mut().enumerate() {
        child.meta_mut().position = Some(position.part(i));
    }
}

impl Member {
    /// Runs the plugin over a batch and sorts the events by where they go.
    pub(super) fn process(&mut self, events: Vec<Event>) -> Processed {
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
                    place_children(&event, &mut replacement);
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
pub(super) struct WarnLimiter {
    pub(super) window_start: Option<Instant>,
    pub(super) logged: u32,
    pub(super) suppressed: u64,
}

/// What one more error at a given moment calls for.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct WarnTurn {
    /// Errors kept quiet in the window that just ended, to be reported.
    pub(super) quiet_before: u64,
    /// Whether this error is logged.
    pub(super) log: bool,
}

impl WarnLimiter {
    const PER_WINDOW: u32 = 5;
    const WINDOW: Duration = Duration::from_secs(10);

    pub(super) fn turn(&mut self, now: Instant) -> WarnTurn {
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

    pub(super) fn warn(&mut self, stage: &str, error: &EventError) {
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
    pub(super) fn flush(&mut self, stage: &str) {
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

/// A stage failed: say so now and stop the sources, so the pipeline drains
/// and ends instead of feeding a stage that can no longer deliver.
pub(super) fn fail_fast(stage: &str, message: &str, stop: &CancellationToken) {
    tracing::error!(
        stage,
        "stage failed: {message}; stopping sources and draining"
    );
    stop.cancel();
}

/// Turns a panic inside a plugin into a stage failure.
pub(super) async fn guard(fut: impl Future<Output = Result<(), StageError>>) -> Result<(), String> {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => Err(format!("panicked: {}", panic_message(panic.as_ref()))),
    }
}

/// The input of a stage's `index`th instance: the first `workers` read the
/// shared queue (a local queue's backend); each further one consumes one
/// frontend of a local-scope queue.
pub(super) fn worker_input(input: Option<&Receiver>, index: usize, workers: usize) -> Receiver {
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
pub(super) async fn drain_as_errored(input: &mut Receiver, metrics: &StageMetrics) {
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
pub(super) struct Crew {
    pub(super) alive: std::sync::atomic::AtomicUsize,
    pub(super) failed: std::sync::atomic::AtomicBool,
    pub(super) metrics: Vec<Arc<StageMetrics>>,
}

/// One worker's place in its [`Crew`], given up when it is dropped.
pub(super) struct CrewPlace(Arc<Crew>);

impl Crew {
    pub(super) fn new(metrics: Vec<Arc<StageMetrics>>) -> Arc<Crew> {
        Arc::new(Crew {
            alive: 0.into(),
            failed: false.into(),
            metrics,
        })
    }

    pub(super) fn join(self: &Arc<Self>) -> CrewPlace {
        self.alive.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        CrewPlace(self.clone())
    }
}

impl CrewPlace {
    pub(super) fn failed(&self) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::{Meta, Position};

    fn placed(position: Option<Position>) -> Event {
        Event::raw(
            &b"x"[..],
            Meta {
                position,
                ..Meta::at("src", 1)
            },
        )
    }

    /// One for one, the child takes the parent's position (whatever the
    /// plugin gave it); one into several, each child a distinct part; a
    /// parent without a position leaves the children as they are.
    #[test]
    fn children_take_their_parents_position_and_splits_get_parts() {
        let at = Position::new(3, 40);
        let mut one = vec![placed(None)];
        place_children(&placed(Some(at)), &mut one);
        assert_eq!(one[0].meta().position, Some(at));

        let mut three = vec![placed(Some(at)), placed(None), placed(Some(at))];
        place_children(&placed(Some(at)), &mut three);
        let parts: Vec<Option<Position>> = three.iter().map(|e| e.meta().position).collect();
        assert_eq!(
            parts,
            [Some(at.part(0)), Some(at.part(1)), Some(at.part(2))]
        );

        let mut unplaced = vec![placed(None), placed(Some(at))];
        place_children(&placed(None), &mut unplaced);
        assert_eq!(unplaced[0].meta().position, None);
        assert_eq!(unplaced[1].meta().position, Some(at));
    }
}
