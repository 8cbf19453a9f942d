//! A stage's output: every downstream gets every event (fan-out). Events are
//! reference-counted, so each extra downstream costs a pointer increment per
//! event, not a copy.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::mpsc;

use crate::channel::{Registration, SendError, Sender};
use crate::event::Event;
use crate::metrics::StageMetrics;

/// What a send counts as in the stage's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputRole {
    /// The stage's main output: counted as `events_out`.
    Main,
    /// The `<id>.errors` output: counted as `routed`.
    Errors,
    /// Named output `n` (`<id>.<name>`): counted as `events_out`, and as
    /// that output's own count.
    Named(usize),
}

/// The channels an output delivers to, and its taps. The engine replaces
/// the channel list when a reload adds or removes readers; a send in
/// progress finishes on the list it started with.
///
/// The list holds the readers' senders, and the engine keeps the targets
/// for rewiring; so that a producer that is done closes its readers' input
/// (a source that waits for its events' acknowledgements after its last
/// send, while its sinks finish what they hold once their input ends), the
/// list is emptied when the last [`Output`] on it is dropped. The engine
/// [`hold`](OutputTargets::hold)s the targets while it hands them from a
/// replaced stage to its successor.
#[derive(Clone, Default)]
pub struct OutputTargets(Arc<TargetsInner>);

#[derive(Default)]
struct TargetsInner {
    senders: RwLock<Arc<Vec<Sender>>>,
    taps: Mutex<Vec<TapSlot>>,
    /// Whether any tap is open: the only cost of taps on the data path
    /// when nobody watches.
    tapped: AtomicBool,
    /// Live `Output`s and holds on these targets.
    producers: AtomicUsize,
    /// The list was emptied because its last producer went, not because
    /// nobody reads this output: a send now is an engine bug (a producer
    /// made after the others ended), refused rather than counted as
    /// discarded, so it fails loudly instead of losing events quietly.
    closed: AtomicBool,
}

/// Keeps an output's readers open while it lives (see [`OutputTargets`]).
pub struct ProducerHold(OutputTargets);

impl Drop for ProducerHold {
    fn drop(&mut self) {
        if self.0.0.producers.fetch_sub(1, Ordering::AcqRel) == 1 {
            let mut senders = self.0.0.senders.write().unwrap_or_else(|p| p.into_inner());
            *senders = Arc::new(Vec::new());
            self.0.0.closed.store(true, Ordering::Release);
        }
    }
}

struct TapSlot {
    tx: mpsc::Sender<Event>,
    dropped: Arc<AtomicU64>,
}

/// A live sample of the events leaving a stage. The data path offers each
/// event with a non-blocking send and drops it (counted) when the tap is
/// full: a tap nobody reads can never slow the pipeline.
pub struct Tap {
    pub events: mpsc::Receiver<Event>,
    dropped: Arc<AtomicU64>,
}

impl Tap {
    /// Events the tap had no room for.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl OutputTargets {
    pub fn new(senders: Vec<Sender>) -> Self {
        let targets = OutputTargets::default();
        targets.set(senders);
        targets
    }

    /// Counts as a producer until dropped: the readers stay open even if
    /// every `Output` on these targets is gone meanwhile.
    pub fn hold(&self) -> ProducerHold {
        self.0.producers.fetch_add(1, Ordering::AcqRel);
        ProducerHold(self.clone())
    }

    pub fn set(&self, senders: Vec<Sender>) {
        let mut current = self.0.senders.write().unwrap_or_else(|p| p.into_inner());
        *current = Arc::new(senders);
        self.0.closed.store(false, Ordering::Release);
    }

    fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
    }

    fn current(&self) -> Arc<Vec<Sender>> {
        self.0
            .senders
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Opens a tap holding at most `capacity` undelivered events; it closes
    /// when the returned [`Tap`] is dropped.
    pub fn tap(&self, capacity: usize) -> Tap {
        let (tx, events) = mpsc::channel(capacity.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        self.0
            .taps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(TapSlot {
                tx,
                dropped: dropped.clone(),
            });
        self.0.tapped.store(true, Ordering::Release);
        Tap { events, dropped }
    }

    fn feed_taps(&self, batch: &[Event]) {
        if !self.0.tapped.load(Ordering::Acquire) {
            return;
        }
        let mut taps = self.0.taps.lock().unwrap_or_else(|p| p.into_inner());
        taps.retain(|t| !t.tx.is_closed());
        for tap in taps.iter() {
            for (i, event) in batch.iter().enumerate() {
                // A tap's copy finishes nothing: it carries no acknowledgement.
                if tap.tx.try_send(event.detached()).is_err() {
                    tap.dropped
                        .fetch_add((batch.len() - i) as u64, Ordering::Relaxed);
                    break;
                }
            }
        }
        if taps.is_empty() {
            self.0.tapped.store(false, Ordering::Release);
        }
    }
}

/// A stage's output. Each `Output` value is one *producer*: the engine
/// gives every worker and every source its own, and a clone is a new
/// producer. Towards a local-scope queue a producer registers once and keeps
/// its frontend (or its "slots exhausted" answer) while it sends there.
pub struct Output {
    targets: OutputTargets,
    _producer: ProducerHold,
    metrics: Arc<StageMetrics>,
    role: OutputRole,
    registrations: Mutex<Registrations>,
    /// A named output's events also feed the taps of the stage's main
    /// output (which a stage with named outputs never sends on), so a tap
    /// of the stage sees what leaves it.
    taps_of: Option<OutputTargets>,
}

/// This producer's standing with the local-scope queues it sends to.
#[derive(Default)]
struct Registrations {
    /// The target list the entries were last checked against.
    targets: usize,
    entries: Vec<Registration>,
}

impl Clone for Output {
    fn clone(&self) -> Self {
        Output {
            taps_of: self.taps_of.clone(),
            ..Output::with_targets(self.targets.clone(), self.metrics.clone(), self.role)
        }
    }
}

impl Output {
    pub fn new(senders: Vec<Sender>, metrics: Arc<StageMetrics>, role: OutputRole) -> Self {
        Self::with_targets(OutputTargets::new(senders), metrics, role)
    }

    pub fn with_targets(
        targets: OutputTargets,
        metrics: Arc<StageMetrics>,
        role: OutputRole,
    ) -> Self {
        Output {
            _producer: targets.hold(),
            targets,
            metrics,
            role,
            registrations: Mutex::default(),
            taps_of: None,
        }
    }

    /// Feeds `main`'s taps too (see [`Output`]'s `taps_of`).
    pub fn tapped_as(mut self, main: OutputTargets) -> Self {
        self.taps_of = Some(main);
        self
    }

    /// Whether any stage reads this output.
    pub fn is_connected(&self) -> bool {
        !self.targets.current().is_empty()
    }

    /// Delivers the batch to every downstream, waiting while any is full.
    /// An output nobody reads counts its events as discarded (the validator
    /// warns about such stages).
    pub async fn send(&self, mut batch: Vec<Event>) -> Result<(), SendError> {
        let n = batch.len() as u64;
        if n == 0 {
            return Ok(());
        }
        if self.role == OutputRole::Main {
            self.targets.feed_taps(&batch);
            let bytes: usize = batch.iter().map(Event::raw_len).sum();
            self.metrics.add_bytes_out(bytes as u64);
        } else if let Some(main) = &self.taps_of {
            main.feed_taps(&batch);
        }
        let senders = self.targets.current();
        let started = std::time::Instant::now();
        match senders.as_slice() {
            [] if self.targets.is_closed() => {
                tracing::error!(
                    "a stage sent {n} events on an output its other producers had already closed: refused (an engine bug)"
                );
                return Err(SendError(batch));
            }
            [] => {
                // Nobody reads this output: dropped on purpose, finished.
                Event::settle_all(&mut batch, crate::Outcome::Delivered);
                self.metrics.add_discarded(n);
                return Ok(());
            }
            [only] => self.deliver(only, batch, &senders).await?,
            [rest @ .., last] => {
                for sender in rest {
                    self.deliver(sender, batch.clone(), &senders).await?;
                }
                self.deliver(last, batch, &senders).await?;
            }
        }
        self.metrics
            .add_blocked_ns(started.elapsed().as_nanos() as u64);
        match self.role {
            OutputRole::Main => self.metrics.add_out(n),
            OutputRole::Errors => self.metrics.add_routed(n),
            OutputRole::Named(i) => {
                self.metrics.add_out(n);
                self.metrics.add_named(i, n);
            }
        }
        Ok(())
    }

    /// Counts a batch as sent on the main output without sending it: the
    /// engine hands it to the next stage of a fused chain itself. Taps,
    /// `events_out` and `bytes_out` see it as they would a send.
    pub fn pass_on(&self, batch: &[Event]) {
        if batch.is_empty() {
            return;
        }
        self.targets.feed_taps(batch);
        let bytes: usize = batch.iter().map(Event::raw_len).sum();
        self.metrics.add_bytes_out(bytes as u64);
        self.metrics.add_out(batch.len() as u64);
    }

    pub fn metrics(&self) -> &Arc<StageMetrics> {
        &self.metrics
    }

    /// One target: a global queue takes the batch as it is; a local-scope
    /// queue gets it through this producer's frontend when it fits, else
    /// through its backend.
    async fn deliver(
        &self,
        sender: &Sender,
        batch: Vec<Event>,
        all: &Arc<Vec<Sender>>,
    ) -> Result<(), SendError> {
        if !sender.is_local() {
            return sender.send(batch).await;
        }
        let refused = {
            let mut regs = self.registrations.lock().unwrap_or_else(|p| p.into_inner());
            let list = Arc::as_ptr(all) as usize;
            if regs.targets != list {
                // A reload changed the readers: let go of frontends of
                // queues this output no longer feeds.
                regs.targets = list;
                regs.entries.retain(|r| all.iter().any(|s| r.is_for(s)));
            }
            let i = match regs.entries.iter().position(|r| r.is_for(sender)) {
                Some(i) => i,
                None => {
                    regs.entries.push(sender.register());
                    regs.entries.len() - 1
                }
            };
            sender.try_frontend(&mut regs.entries[i], batch).err()
        };
        match refused {
            None => Ok(()),
            Some((batch, reason)) => sender.send_overflow(batch, reason).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::channel;
    use crate::event::Meta;

    /// The readers' input ends when the last producer on the targets is
    /// gone, though the engine still has the targets; a hold keeps it open
    /// across a hand-over.
    #[tokio::test]
    async fn the_last_producer_gone_ends_the_readers_input() {
        let (tx, mut rx) = channel(10);
        let targets = OutputTargets::new(vec![tx]);
        let metrics = Arc::new(StageMetrics::default());
        let first = Output::with_targets(targets.clone(), metrics.clone(), OutputRole::Main);
        let second = first.clone();
        first.send(events(1)).await.unwrap();
        drop(first);
        second.send(events(1)).await.unwrap();
        let hold = targets.hold();
        drop(second);
        assert_eq!(rx.recv().await.unwrap().len(), 1);
        assert_eq!(rx.recv().await.unwrap().len(), 1);
        assert!(rx.try_recv().is_none());
        let successor = Output::with_targets(targets.clone(), metrics, OutputRole::Main);
        drop(hold);
        successor.send(events(2)).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().len(), 2);
        drop(successor);
        assert!(
            rx.recv().await.is_none(),
            "closed, with `targets` still held"
        );
        drop(targets);
    }

    /// A producer made after the last one ended finds its readers gone:
    /// its send is refused (the stage fails, loudly), never counted as
    /// discarded; an output nobody was given readers for still discards.
    #[tokio::test]
    async fn a_producer_made_after_the_output_closed_is_refused_not_discarded() {
        let (tx, mut rx) = channel(10);
        let targets = OutputTargets::new(vec![tx]);
        let metrics = Arc::new(StageMetrics::default());
        drop(Output::with_targets(
            targets.clone(),
            metrics.clone(),
            OutputRole::Main,
        ));
        assert!(rx.recv().await.is_none(), "the last producer closed it");
        let late = Output::with_targets(targets.clone(), metrics.clone(), OutputRole::Main);
        let refused = late.send(events(3)).await.unwrap_err();
        assert_eq!(refused.0.len(), 3, "the events come back to the stage");
        let snap = metrics.snapshot();
        assert_eq!((snap.discarded, snap.events_out), (0, 0));

        let unread = Output::new(Vec::new(), metrics.clone(), OutputRole::Main);
        unread.send(events(2)).await.unwrap();
        assert_eq!(metrics.snapshot().discarded, 2);

        // Rewired (a reload gives it readers again): sends are delivered.
        let (tx, mut rx) = channel(10);
        targets.set(vec![tx]);
        late.send(events(1)).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().len(), 1);
    }

    fn events(n: usize) -> Vec<Event> {
        (0..n)
            .map(|i| Event::raw(i.to_string(), Meta::at("t", 0)))
            .collect()
    }

    #[tokio::test]
    async fn a_full_tap_drops_and_counts_while_the_data_path_delivers_everything() {
        let (tx, mut rx) = channel(1000);
        let out = Output::new(
            vec![tx],
            Arc::new(StageMetrics::default()),
            OutputRole::Main,
        );
        let tap = out.targets.tap(3);
        out.send(events(10)).await.unwrap();
        out.send(events(5)).await.unwrap();
        let mut delivered = 0;
        while let Some(b) = rx.try_recv() {
            delivered += b.len();
        }
        assert_eq!(delivered, 15, "the data path lost nothing");
        assert_eq!(tap.dropped(), 12, "the tap kept 3 and counted the rest");
        drop(tap);
        out.send(events(1)).await.unwrap();
        assert!(
            !out.targets.0.tapped.load(Ordering::Relaxed),
            "a dropped tap is removed"
        );
    }

    /// Every reader gets every event; the stage counts each event once,
    /// with the raw bytes it sent.
    #[tokio::test]
    async fn each_reader_gets_the_batch_and_the_stage_counts_it_once() {
        let (a, mut a_rx) = channel(20);
        let (b, mut b_rx) = channel(20);
        let (c, mut c_rx) = channel(20);
        let metrics = Arc::new(StageMetrics::default());
        let out = Output::new(vec![a, b, c], metrics.clone(), OutputRole::Main);
        assert!(out.is_connected());
        assert!(
            Arc::ptr_eq(out.metrics(), &metrics),
            "the stage's own counters"
        );
        out.send(events(12)).await.unwrap();
        out.send(Vec::new()).await.unwrap();
        for rx in [&mut a_rx, &mut b_rx, &mut c_rx] {
            let batch = rx.recv().await.unwrap();
            assert_eq!(batch.len(), 12);
            assert_eq!(batch.events()[11].as_raw().unwrap().as_ref(), b"11");
            assert!(rx.try_recv().is_none(), "an empty batch is not sent");
        }
        let snap = metrics.snapshot();
        assert_eq!((snap.events_out, snap.routed, snap.discarded), (12, 0, 0));
        // "0" … "9" are one byte, "10" and "11" two.
        assert_eq!(metrics.bytes_out(), 14);
        assert!(!Output::new(Vec::new(), metrics, OutputRole::Main).is_connected());
    }

    /// The errors output counts as routed; a named output as sent and as
    /// its own count, and it feeds the taps of the stage's main output.
    #[tokio::test]
    async fn each_role_counts_where_it_should_and_named_outputs_feed_the_main_taps() {
        let metrics = Arc::new(StageMetrics::default());
        metrics.name_outputs(&["high".into(), "low".into()]);
        let main = OutputTargets::new(Vec::new());
        let tap = main.tap(100);
        let (tx, mut rx) = channel(100);
        let errors = Output::new(vec![tx.clone()], metrics.clone(), OutputRole::Errors);
        errors.send(events(2)).await.unwrap();
        let low =
            Output::new(vec![tx], metrics.clone(), OutputRole::Named(1)).tapped_as(main.clone());
        // A clone (another worker's producer) feeds the same taps.
        low.clone().send(events(3)).await.unwrap();
        let snap = metrics.snapshot();
        assert_eq!((snap.routed, snap.events_out), (2, 3));
        assert_eq!(
            metrics.named_outputs(),
            [("high".to_string(), 0), ("low".to_string(), 3)]
        );
        // The errors output's events are not the stage's output: no tap,
        // no bytes.
        let mut tap = tap;
        let mut tapped = 0;
        while tap.events.try_recv().is_ok() {
            tapped += 1;
        }
        assert_eq!((tapped, tap.dropped()), (3, 0));
        assert_eq!(metrics.bytes_out(), 0);
        assert_eq!(rx.recv().await.unwrap().len(), 2);
        assert_eq!(rx.recv().await.unwrap().len(), 3);
    }

    /// An output nobody reads finishes its events as delivered (they were
    /// dropped on purpose) and counts them discarded.
    #[tokio::test]
    async fn an_unread_output_finishes_its_events_as_discarded() {
        use std::sync::Mutex;
        let checkpoint = Arc::new(Mutex::new(crate::OrderedCheckpoint::new()));
        let token = checkpoint.lock().unwrap().begin(7u64, 2);
        let batch = crate::BatchAck::new(checkpoint.clone(), token);
        let sent: Vec<Event> = events(2)
            .into_iter()
            .map(|e| e.with_ack(batch.handle()))
            .collect();
        drop(batch);
        let metrics = Arc::new(StageMetrics::default());
        Output::new(Vec::new(), metrics.clone(), OutputRole::Main)
            .send(sent)
            .await
            .unwrap();
        assert_eq!(metrics.snapshot().discarded, 2);
        let counts = checkpoint.lock().unwrap().counts();
        assert_eq!((counts.delivered, counts.errored), (2, 0));
        assert_eq!(checkpoint.lock().unwrap().committed(), Some(&7));
    }

    /// A fused chain's hand-over counts and taps like a send, and sends
    /// nothing.
    #[tokio::test]
    async fn pass_on_counts_and_taps_like_a_send() {
        let (tx, mut rx) = channel(20);
        let metrics = Arc::new(StageMetrics::default());
        let out = Output::new(vec![tx], metrics.clone(), OutputRole::Main);
        let mut tap = out.targets.tap(10);
        out.pass_on(&events(11));
        out.pass_on(&[]);
        assert_eq!(metrics.snapshot().events_out, 11);
        assert_eq!(metrics.bytes_out(), 12);
        let mut tapped = 0;
        while tap.events.try_recv().is_ok() {
            tapped += 1;
        }
        assert_eq!((tapped, tap.dropped()), (10, 1));
        assert!(rx.try_recv().is_none());
    }
}
