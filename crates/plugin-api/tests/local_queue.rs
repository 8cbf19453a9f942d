//! The local-scope queue's contract, one case at a time: admission,
//! overflow, registration, helping, ownership, wake-ups and shutdown. Every
//! test ends by reconciling the queue's counters exactly.
//!
//! Interleavings are made deterministic by polling the consumers' futures
//! by hand with counting wakers: no sleeps, no timing.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use logbus_plugin_api::{Event, Meta, Output, OutputRole, Receiver, StageMetrics};
use logbus_queue::{ChannelHandle, LocalConfig, local_channel};

fn events(n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| Event::raw(i.to_string(), Meta::at("t", 0)))
        .collect()
}

fn config(frontend_size: usize, max_frontends: usize, helper_batch: usize) -> LocalConfig {
    LocalConfig {
        frontend_size,
        max_frontends,
        helper_batch,
        min_batch: 0,
        min_batch_timeout: Duration::ZERO,
    }
}

fn output(tx: &logbus_plugin_api::Sender) -> Output {
    Output::new(
        vec![tx.clone()],
        Arc::new(StageMetrics::default()),
        OutputRole::Main,
    )
}

#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl CountingWaker {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

fn poll<F: Future>(fut: Pin<&mut F>, waker: &Arc<CountingWaker>) -> Poll<F::Output> {
    let waker = Waker::from(waker.clone());
    fut.poll(&mut Context::from_waker(&waker))
}

/// Polls a future that must complete without waiting.
fn now<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    match poll(fut.as_mut(), &Arc::new(CountingWaker::default())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("expected to complete without waiting"),
    }
}

/// Takes everything the receiver has now (it must not need to wait).
fn drain_now(rx: &mut Receiver) -> usize {
    let mut n = 0;
    while let Some(b) = rx.try_recv() {
        n += b.len();
    }
    n
}

/// The exact reconciliation every test ends with, once the queue is empty.
fn assert_reconciled(h: &ChannelHandle, sent: u64) {
    let s = h.stats();
    let local = h.local().expect("a local queue");
    assert_eq!(s.sent(), sent, "accepted = what producers submitted");
    assert_eq!(
        local.frontend_events + local.backend_events.total(),
        sent,
        "every accepted event took exactly one path: {local:?}"
    );
    assert_eq!(
        s.received() + s.abandoned(),
        sent,
        "every accepted event was handed to a consumer or abandoned"
    );
    assert_eq!(local.outstanding, 0, "nothing accepted is still pending");
    assert_eq!(h.occupancy(), 0);
    assert_eq!(
        local.help_events_taken, local.help_events_completed,
        "every borrowed event was completed against the BE"
    );
}

#[test]
fn whole_batch_goes_to_the_backend_when_it_does_not_fit_and_overflow_is_not_permanent() {
    let (tx, rx) = local_channel(100, 100, config(4, 1, 0), false);
    let h = rx.handle();
    let mut fe = rx.frontend(0).unwrap();
    let mut be = rx;
    let out = output(&tx);
    now(out.send(events(3))).unwrap();
    now(out.send(events(3))).unwrap(); // 1 slot free: all 3 to the BE
    let local = h.local().unwrap();
    assert_eq!(local.frontend_events, 3);
    assert_eq!(local.backend_events.no_fit, 3);
    assert_eq!(local.frontends[0].queued, 3);
    assert_eq!(local.frontends[0].overflowed, 3);
    assert_eq!(drain_now(&mut fe), 3);
    now(out.send(events(2))).unwrap(); // room again: back to the FE
    assert_eq!(h.local().unwrap().frontend_events, 5);
    assert_eq!(drain_now(&mut fe), 2);
    assert_eq!(drain_now(&mut be), 3);
    assert_reconciled(&h, 8);
}

#[test]
fn a_batch_larger_than_the_frontend_always_goes_to_the_backend() {
    let (tx, mut be) = local_channel(100, 100, config(4, 1, 0), false);
    let h = be.handle();
    let mut fe = be.frontend(0).unwrap();
    let out = output(&tx);
    now(out.send(events(5))).unwrap();
    let local = h.local().unwrap();
    assert_eq!(
        (local.frontend_events, local.backend_events.oversized),
        (0, 5)
    );
    assert_eq!(drain_now(&mut fe), 0);
    assert_eq!(drain_now(&mut be), 5);
    assert_reconciled(&h, 5);
}

#[test]
fn producers_beyond_max_frontends_use_the_backend_and_slots_are_not_recycled() {
    let (tx, mut be) = local_channel(100, 100, config(8, 2, 0), false);
    let h = be.handle();
    let mut fes: Vec<_> = (0..2).map(|i| be.frontend(i).unwrap()).collect();
    let (a, b, c) = (output(&tx), output(&tx), output(&tx));
    for out in [&a, &b, &c] {
        now(out.send(events(2))).unwrap();
    }
    let local = h.local().unwrap();
    assert_eq!(local.registrations, 2);
    assert_eq!(local.registration_failures, 1);
    assert_eq!(local.backend_events.exhausted, 2);
    assert!(!local.slots_recycled);
    // A producer that exits keeps its slot: a new producer still finds none.
    drop(a);
    let d = output(&tx);
    now(d.send(events(1))).unwrap();
    let local = h.local().unwrap();
    assert_eq!(local.registration_failures, 2);
    assert_eq!(local.backend_events.exhausted, 3);
    assert_eq!(drain_now(&mut fes[0]) + drain_now(&mut fes[1]), 4);
    assert_eq!(drain_now(&mut be), 3);
    assert_reconciled(&h, 7);
}

#[test]
fn producer_exit_lets_its_consumer_finish_the_ring_and_the_queue_ends_with_the_last_sender() {
    let (tx, rx) = local_channel(100, 100, config(8, 1, 0), false);
    let h = rx.handle();
    let mut fe = rx.frontend(0).unwrap();
    let out = output(&tx);
    now(out.send(events(3))).unwrap();
    drop(out); // the producer exits with 3 events in its ring
    let waker = Arc::new(CountingWaker::default());
    {
        let mut first = std::pin::pin!(fe.recv());
        match poll(first.as_mut(), &waker) {
            Poll::Ready(Some(b)) => assert_eq!(b.len(), 3),
            _ => panic!("the ring's events are still delivered"),
        }
    }
    let mut end = std::pin::pin!(fe.recv());
    assert!(poll(end.as_mut(), &waker).is_pending(), "queue still open");
    let before = waker.count();
    drop(tx); // last sender: the queue closes
    assert!(waker.count() > before, "the close wakes the FE consumer");
    assert!(matches!(poll(end.as_mut(), &waker), Poll::Ready(None)));
    drop(rx);
    assert_reconciled(&h, 3);
}

#[test]
fn without_helping_an_idle_frontend_consumer_leaves_backend_work_alone() {
    let (tx, rx) = local_channel(100, 100, config(8, 1, 0), false);
    let h = rx.handle();
    let mut fe = rx.frontend(0).unwrap();
    let mut be = rx;
    let waker = Arc::new(CountingWaker::default());
    {
        let mut idle = std::pin::pin!(fe.recv());
        assert!(poll(idle.as_mut(), &waker).is_pending());
        now(tx.send(events(4))).unwrap(); // a direct (BE) send
        assert_eq!(waker.count(), 0, "not woken for BE work");
        assert!(poll(idle.as_mut(), &waker).is_pending());
    }
    assert_eq!(h.local().unwrap().help_attempts, 0);
    assert_eq!(drain_now(&mut be), 4);
    assert_reconciled(&h, 4);
}

#[test]
fn a_borrowed_batch_is_at_most_helper_batch_and_is_settled_against_the_backend() {
    let (tx, rx) = local_channel(100, 100, config(8, 1, 2), false);
    let h = rx.handle();
    let mut fe = rx.frontend(0).unwrap();
    let mut be = rx;
    now(tx.send(events(5))).unwrap(); // one BE batch of 5
    let mut borrowed = now(fe.recv()).unwrap();
    assert!(borrowed.is_borrowed());
    assert_eq!(borrowed.len(), 2, "helper_batch bounds what is borrowed");
    let taken = borrowed.take();
    let local = h.local().unwrap();
    assert_eq!(local.help_events_taken, 2);
    assert_eq!(
        local.help_events_completed, 0,
        "still in the helper's hands"
    );
    assert_eq!(
        local.backend_occupancy, 5,
        "the borrowed events still count against the BE until completed"
    );
    assert_eq!(local.frontends[0].retired, 0, "never counted as FE work");
    drop(taken);
    drop(borrowed);
    let local = h.local().unwrap();
    assert_eq!(local.help_events_completed, 2);
    assert_eq!(local.backend_occupancy, 3);
    assert_eq!(drain_now(&mut be), 3, "the rest went back to the BE");
    assert_reconciled(&h, 5);
}

/// The wake-up protocol with two frontends. Both FE consumers are idle;
/// BE work arrives and wakes one of them (slot 0). Before it runs, its own
/// producer publishes local work, so it turns to that; it must pass the
/// wake-up on to the other idle helper, which then takes the BE work.
#[test]
fn a_picked_helper_that_turns_to_local_work_hands_the_wakeup_to_another() {
    let (tx, rx) = local_channel(100, 1, config(8, 2, 1), false);
    let h = rx.handle();
    let mut fe0 = rx.frontend(0).unwrap();
    let mut fe1 = rx.frontend(1).unwrap();
    let (w0, w1) = (
        Arc::new(CountingWaker::default()),
        Arc::new(CountingWaker::default()),
    );
    let producer0 = output(&tx);
    now(producer0.send(events(1))).unwrap(); // registers slot 0
    assert_eq!(now(fe0.recv()).unwrap().len(), 1);
    {
        let mut r0 = std::pin::pin!(fe0.recv());
        let mut r1 = std::pin::pin!(fe1.recv());
        assert!(poll(r0.as_mut(), &w0).is_pending());
        assert!(poll(r1.as_mut(), &w1).is_pending());
        now(tx.send(events(1))).unwrap(); // BE work
        assert_eq!(
            (w0.count(), w1.count()),
            (1, 0),
            "one idle helper is picked"
        );
        now(producer0.send(events(1))).unwrap(); // local work for slot 0
        match poll(r0.as_mut(), &w0) {
            Poll::Ready(Some(b)) => assert!(b.is_from_frontend(), "local work first"),
            other => panic!("expected the local batch, got {:?}", other.is_ready()),
        }
        assert_eq!(
            w1.count(),
            1,
            "the wake-up was handed on to the other helper"
        );
        match poll(r1.as_mut(), &w1) {
            Poll::Ready(Some(b)) => assert!(b.is_borrowed()),
            other => panic!("expected a borrowed batch, got {:?}", other.is_ready()),
        }
    }
    drop(producer0);
    drop(tx);
    assert!(now(fe0.recv()).is_none());
    assert!(now(fe1.recv()).is_none());
    drop((fe0, fe1, rx));
    assert_reconciled(&h, 3);
}

/// An idle helper notices BE work that arrives while it sleeps.
#[test]
fn an_idle_helper_is_woken_by_backend_work() {
    let (tx, rx) = local_channel(100, 100, config(8, 1, 4), false);
    let h = rx.handle();
    let mut fe = rx.frontend(0).unwrap();
    let waker = Arc::new(CountingWaker::default());
    {
        let mut r = std::pin::pin!(fe.recv());
        assert!(poll(r.as_mut(), &waker).is_pending());
        now(tx.send(events(3))).unwrap();
        assert_eq!(waker.count(), 1);
        match poll(r.as_mut(), &waker) {
            Poll::Ready(Some(b)) => assert_eq!((b.is_borrowed(), b.len()), (true, 3)),
            _ => panic!("the woken helper takes the BE work"),
        }
    }
    drop(tx);
    assert!(now(fe.recv()).is_none());
    drop((fe, rx));
    assert_reconciled(&h, 3);
}

/// Shutdown with work in every place: a frontend ring, a frontend batch in
/// a consumer's hands, a borrowed batch in a helper's hands, and the BE.
/// The last sender goes; every consumer drains what it can reach and ends;
/// nothing is lost.
#[test]
fn shutdown_drains_rings_held_batches_borrowed_batches_and_the_backend() {
    let (tx, rx) = local_channel(100, 100, config(4, 2, 2), false);
    let h = rx.handle();
    let mut fe0 = rx.frontend(0).unwrap();
    let mut fe1 = rx.frontend(1).unwrap();
    let mut be = rx;
    let p0 = output(&tx);
    let p1 = output(&tx);
    now(p0.send(events(2))).unwrap(); // FE 0
    now(p1.send(events(1))).unwrap(); // FE 1
    let held_fe = now(fe1.recv()).unwrap(); // FE batch in hand
    assert!(held_fe.is_from_frontend());
    now(tx.send(events(3))).unwrap(); // BE
    let held_borrowed = now(fe1.recv()).unwrap(); // borrowed batch in hand
    assert!(held_borrowed.is_borrowed());
    now(p0.send(events(2))).unwrap(); // FE 0 ring now holds 4
    let local = h.local().unwrap();
    assert_eq!(
        local.outstanding, 8,
        "4 in FE 0, 1 held from FE 1, 3 in the BE (2 borrowed)"
    );
    assert_eq!(h.occupancy(), 8);
    // Stop admission: every producer and sender goes.
    drop((p0, p1, tx));
    let mut drained = 0;
    while let Some(b) = now(fe0.recv()) {
        drained += b.len();
    }
    assert_eq!(
        drained, 5,
        "FE 0 drained its ring (4), helped with the BE's last event, then ended"
    );
    drop(held_fe);
    drop(held_borrowed);
    let mut rest = 0;
    while let Some(b) = now(be.recv()) {
        rest += b.len();
    }
    assert_eq!(rest, 0, "nothing left for the BE worker");
    assert!(now(fe1.recv()).is_none());
    drop((fe0, fe1, be));
    assert_reconciled(&h, 8);
}

#[test]
fn a_stopped_frontend_consumer_sends_its_producer_to_the_backend() {
    let (tx, rx) = local_channel(100, 100, config(4, 1, 0), false);
    let h = rx.handle();
    let fe = rx.frontend(0).unwrap();
    let mut be = rx;
    let out = output(&tx);
    now(out.send(events(2))).unwrap();
    drop(fe); // abandons 2
    now(out.send(events(1))).unwrap();
    let local = h.local().unwrap();
    assert_eq!(local.backend_events.shutdown, 1);
    assert_eq!(h.stats().abandoned(), 2);
    assert_eq!(drain_now(&mut be), 1);
    assert_reconciled(&h, 3);
}

/// `min_batch`: a frontend consumer waits (bounded) for a fuller batch.
#[tokio::test(start_paused = true)]
async fn min_batch_waits_for_more_events_at_most_the_timeout() {
    let mut cfg = config(16, 1, 0);
    cfg.min_batch = 4;
    cfg.min_batch_timeout = Duration::from_millis(50);
    let (tx, rx) = local_channel(100, 100, cfg, false);
    let h = rx.handle();
    let mut fe = rx.frontend(0).unwrap();
    let out = output(&tx);
    out.send(events(1)).await.unwrap();
    let consumer = tokio::spawn(async move {
        let first = fe.recv().await.unwrap().len();
        (fe, first)
    });
    tokio::task::yield_now().await; // the consumer waits for 3 more
    out.send(events(3)).await.unwrap();
    let (mut fe, first) = consumer.await.unwrap();
    assert_eq!(first, 4, "waited for min_batch");
    out.send(events(2)).await.unwrap();
    let started = tokio::time::Instant::now();
    let second = fe.recv().await.unwrap().len();
    assert_eq!(second, 2, "released by the timeout with fewer");
    assert!(started.elapsed() >= Duration::from_millis(50));
    drop((out, tx, fe, rx));
    assert_reconciled(&h, 6);
}

/// A reload that takes a local-scope queue off an output makes the output
/// let go of its frontend there at its next send. The old queue's frontend
/// consumer, holding fewer than `min_batch` events, then hands them on at
/// once (its producer is gone) instead of waiting out the hour-long
/// `min_batch_timeout` for a producer that will never send again.
#[tokio::test]
async fn an_output_rewired_away_from_a_local_queue_lets_go_of_its_frontend() {
    let waiting = LocalConfig {
        min_batch: 4,
        min_batch_timeout: Duration::from_secs(3600),
        ..config(8, 1, 0)
    };
    let (old_tx, old_rx) = local_channel(100, 100, waiting, false);
    let h = old_rx.handle();
    let mut fe = old_rx.frontend(0).unwrap();
    let targets = logbus_plugin_api::engine::OutputTargets::new(vec![old_tx]);
    let out = Output::with_targets(
        targets.clone(),
        Arc::new(StageMetrics::default()),
        OutputRole::Main,
    );
    now(out.send(events(3))).unwrap();
    assert_eq!(h.local().unwrap().frontend_events, 3);
    {
        let mut first = std::pin::pin!(fe.recv());
        assert!(
            poll(first.as_mut(), &Arc::new(CountingWaker::default())).is_pending(),
            "3 < min_batch while the producer may still send"
        );
    }

    let (new_tx, new_rx) = local_channel(100, 100, config(8, 1, 0), false);
    let mut new_fe = new_rx.frontend(0).unwrap();
    targets.set(vec![new_tx]);
    now(out.send(events(2))).unwrap();
    assert_eq!(drain_now(&mut new_fe), 2, "the new queue's frontend");

    let batch = now(fe.recv()).expect("the old ring's events");
    assert_eq!(batch.len(), 3);
    drop(batch);
    assert!(now(fe.recv()).is_none(), "the old queue ended");
    drop(old_rx);
    assert_reconciled(&h, 3);
}
