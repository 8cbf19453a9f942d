//! The local-scope queue through its public face, as producers and stage
//! workers use it: the admission predicate and each reason for overflow,
//! helping and its hand-back, the in-flight bound, `min_batch`, the end of
//! the stream, and the counters the live view and `--stats-json` show.
//! Every wait is a `now_or_never` poll or the paused clock, never a sleep.

use std::time::Duration;

use futures::FutureExt;
use logbus_event::{Event, Meta};
use logbus_queue::channel::TrySendError;
use logbus_queue::{InputBatch, LocalConfig, Overflow, Receiver, Sender, local_channel};

fn events(from: usize, n: usize) -> Vec<Event> {
    (from..from + n)
        .map(|i| Event::raw(i.to_string(), Meta::at("t", 0)))
        .collect()
}

fn numbers(batch: &mut InputBatch) -> Vec<usize> {
    batch
        .take()
        .iter()
        .map(|e| {
            std::str::from_utf8(e.as_raw().unwrap())
                .unwrap()
                .parse()
                .unwrap()
        })
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

/// A batch ready now, without waiting.
fn ready(rx: &mut Receiver) -> Option<InputBatch> {
    rx.recv().now_or_never().flatten()
}

/// Sends through the producer's frontend, or to the backend with the
/// reason, as `Output` does; returns the reason it overflowed.
async fn submit(
    tx: &Sender,
    registration: &mut logbus_queue::Registration,
    batch: Vec<Event>,
) -> Option<Overflow> {
    match tx.try_frontend(registration, batch) {
        Ok(()) => None,
        Err((batch, reason)) => {
            tx.send_overflow(batch, reason).await.unwrap();
            Some(reason)
        }
    }
}

#[tokio::test]
async fn a_batch_goes_whole_to_the_frontend_or_whole_to_the_backend_with_its_reason() {
    let (tx, mut backend) = local_channel(100, 100, config(4, 1, 0), false);
    let mut fe = backend.frontend(0).unwrap();
    assert!(tx.is_local());
    let mut reg = tx.register();
    assert_eq!(reg.slot(), Some(0));
    assert!(reg.is_for(&tx));

    assert_eq!(submit(&tx, &mut reg, events(0, 3)).await, None);
    // One free place left: a batch of two does not fit, none of it goes in.
    assert_eq!(
        submit(&tx, &mut reg, events(3, 2)).await,
        Some(Overflow::NoFit)
    );
    assert_eq!(submit(&tx, &mut reg, events(5, 1)).await, None);
    // Larger than the ring: never fits.
    assert_eq!(
        submit(&tx, &mut reg, events(6, 5)).await,
        Some(Overflow::Oversized)
    );

    let before = tx.stats().local().unwrap();
    assert_eq!(before.frontends[0].queued, 4);
    assert_eq!(before.outstanding, 4 + 7);
    let mut first = ready(&mut fe).unwrap();
    assert!(first.is_from_frontend() && !first.is_borrowed());
    assert_eq!(numbers(&mut first), vec![0, 1, 2, 5]);
    let mut no_fit = ready(&mut backend).unwrap();
    assert!(!no_fit.is_from_frontend() && !no_fit.is_borrowed());
    assert_eq!(numbers(&mut no_fit), vec![3, 4]);
    let mut oversized = ready(&mut backend).unwrap();
    assert_eq!(numbers(&mut oversized), vec![6, 7, 8, 9, 10]);

    let snap = tx.stats().local().unwrap();
    assert_eq!((snap.frontend_events, snap.frontend_batches), (4, 2));
    assert_eq!(snap.backend_events.no_fit, 2);
    assert_eq!(snap.backend_events.oversized, 5);
    assert_eq!(snap.backend_events.total(), 7);
    let fe0 = &snap.frontends[0];
    assert!(fe0.registered);
    assert_eq!((fe0.admitted, fe0.overflowed, fe0.taken), (4, 7, 4));
    assert_eq!((fe0.queued, fe0.max_queued, fe0.capacity), (0, 4, 4));
    // Taken but still held by the consumer: not retired yet.
    assert_eq!(fe0.retired, 0);
    assert_eq!(snap.outstanding, 4 + 2 + 5);
    drop((first, oversized));
    let snap = tx.stats().local().unwrap();
    assert_eq!(snap.frontends[0].retired, 4);
    assert_eq!(snap.outstanding, 2, "the [3, 4] batch is still unreleased");
    drop(no_fit);
    assert_eq!(tx.stats().local().unwrap().outstanding, 0);
}

#[tokio::test]
async fn producers_past_the_last_slot_use_the_backend_and_slots_are_never_recycled() {
    let (tx, mut backend) = local_channel(100, 100, config(8, 2, 0), false);
    let a = tx.register();
    let b = tx.register();
    let mut c = tx.register();
    assert_eq!((a.slot(), b.slot(), c.slot()), (Some(0), Some(1), None));
    assert_eq!(
        submit(&tx, &mut c, events(0, 1)).await,
        Some(Overflow::Exhausted)
    );
    drop(a);
    // A slot whose producer left is not handed out again.
    let d = tx.register();
    assert_eq!(d.slot(), None);
    let snap = tx.stats().local().unwrap();
    assert_eq!(snap.registrations, 2);
    assert_eq!(snap.registration_failures, 2);
    assert!(!snap.slots_recycled);
    assert_eq!(snap.backend_events.exhausted, 1);
    assert_eq!(ready(&mut backend).unwrap().len(), 1);
    // Each frontend consumer can be taken once; there is no third.
    assert_eq!(backend.frontend_count(), 2);
    assert!(backend.frontend(0).is_some());
    assert!(backend.frontend(0).is_none());
    assert!(backend.frontend(2).is_none());
}

#[tokio::test]
async fn plain_sends_and_a_global_queue_are_direct() {
    let (tx, mut backend) = local_channel(100, 100, config(8, 1, 0), false);
    tx.send(events(0, 3)).await.unwrap();
    tx.try_send(events(3, 2)).unwrap();
    assert_eq!(tx.stats().local().unwrap().backend_events.direct, 5);
    assert_eq!(ready(&mut backend).unwrap().len(), 3);

    let (global, mut rx) = logbus_queue::channel(10);
    assert!(!global.is_local());
    assert_eq!(rx.frontend_count(), 0);
    assert!(rx.frontend(0).is_none());
    let mut reg = global.register();
    assert_eq!(reg.slot(), None);
    assert!(reg.is_for(&global));
    match global.try_frontend(&mut reg, events(0, 1)) {
        Err((batch, Overflow::Direct)) => global.try_send(batch).unwrap(),
        _ => panic!("a global queue has no frontends"),
    }
    assert!(global.stats().local().is_none());
    // Registered with one queue, not with another.
    let (other, _other_rx) = local_channel(10, 10, config(2, 1, 0), false);
    assert!(!reg.is_for(&other));
    assert_eq!(rx.try_recv().unwrap().len(), 1);
}

#[tokio::test]
async fn a_frontend_whose_consumer_is_gone_overflows_with_its_ring_counted_abandoned() {
    let (tx, mut backend) = local_channel(100, 100, config(8, 1, 0), false);
    let fe = backend.frontend(0).unwrap();
    let mut reg = tx.register();
    assert_eq!(submit(&tx, &mut reg, events(0, 3)).await, None);
    drop(fe);
    assert_eq!(
        submit(&tx, &mut reg, events(3, 2)).await,
        Some(Overflow::Shutdown)
    );
    let snap = tx.stats().local().unwrap();
    assert_eq!(snap.backend_events.shutdown, 2);
    assert_eq!(snap.frontends[0].retired, 3);
    assert_eq!(snap.frontends[0].queued, 0);
    assert_eq!(tx.stats().stats().abandoned(), 3);
    let mut b = ready(&mut backend).unwrap();
    assert_eq!(numbers(&mut b), vec![3, 4]);
}

/// A library user may never take a frontend's consumer. Once every
/// receiver is gone that ring has no reader: its producer must not go on
/// filling it, and what it held counts as abandoned.
#[tokio::test]
async fn when_every_receiver_is_gone_an_untaken_frontend_admits_nothing() {
    let (tx, backend) = local_channel(100, 100, config(8, 2, 0), false);
    let taken = backend.frontend(0).unwrap();
    let mut first = tx.register();
    let mut second = tx.register();
    assert_eq!(second.slot(), Some(1));
    assert_eq!(submit(&tx, &mut second, events(0, 3)).await, None);
    drop(taken);
    drop(backend);
    assert!(matches!(
        tx.try_frontend(&mut second, events(3, 2)),
        Err((_, Overflow::Shutdown))
    ));
    assert!(matches!(
        tx.try_frontend(&mut first, events(5, 1)),
        Err((_, Overflow::Shutdown))
    ));
    let snap = tx.stats().local().unwrap();
    assert_eq!(
        (snap.frontends[1].retired, snap.frontends[1].queued),
        (3, 0)
    );
    assert_eq!(tx.stats().stats().abandoned(), 3);
    let returned = tx
        .send_overflow(events(3, 2), Overflow::Shutdown)
        .await
        .unwrap_err();
    assert_eq!(
        returned.0.len(),
        2,
        "the closed backend gives the events back"
    );
}

#[tokio::test]
async fn an_idle_frontend_consumer_borrows_at_most_helper_batch_and_puts_the_rest_back() {
    let (tx, backend) = local_channel(100, 100, config(8, 1, 3), false);
    let mut fe = backend.frontend(0).unwrap();
    tx.send(events(0, 7)).await.unwrap();
    let mut first = ready(&mut fe).unwrap();
    assert!(first.is_borrowed() && !first.is_from_frontend());
    assert_eq!(numbers(&mut first), vec![0, 1, 2]);
    // The rest went back to the backend, still counted against it.
    assert_eq!(tx.stats().occupancy(), 7);
    let mut second = ready(&mut fe).unwrap();
    assert_eq!(numbers(&mut second), vec![3, 4, 5]);
    let mut third = ready(&mut fe).unwrap();
    assert_eq!(numbers(&mut third), vec![6]);
    assert!(ready(&mut fe).is_none(), "nothing left to help with");

    let snap = tx.stats().local().unwrap();
    assert_eq!(snap.help_batches, 3);
    assert_eq!(snap.help_events_taken, 7);
    assert_eq!(snap.help_events_completed, 0, "none released yet");
    // Three successful looks, then one that found the backend empty.
    assert_eq!((snap.help_attempts, snap.help_empty), (4, 1));
    drop((first, second));
    let snap = tx.stats().local().unwrap();
    assert_eq!(snap.help_events_completed, 6);
    assert_eq!(snap.backend_occupancy, 1);
    drop(third);
    assert_eq!(tx.stats().occupancy(), 0);
    // Help is counted against the backend's consumers, not the frontend's.
    let snap = tx.stats().local().unwrap();
    assert_eq!(snap.frontends[0].taken, 0);
    assert_eq!(tx.stats().stats().received(), 7);
}

#[tokio::test]
async fn a_backend_batch_of_exactly_helper_batch_is_borrowed_whole_with_nothing_put_back() {
    let (tx, mut backend) = local_channel(100, 100, config(8, 1, 2), false);
    let mut fe = backend.frontend(0).unwrap();
    tx.send(events(0, 2)).await.unwrap();
    let mut b = ready(&mut fe).unwrap();
    assert_eq!(numbers(&mut b), vec![0, 1]);
    assert!(backend.try_recv().is_none(), "no empty remainder queued");
}

#[tokio::test]
async fn without_helping_a_frontend_consumer_leaves_the_backend_alone() {
    let (tx, mut backend) = local_channel(100, 100, config(8, 1, 0), false);
    let mut fe = backend.frontend(0).unwrap();
    tx.send(events(0, 2)).await.unwrap();
    assert!(ready(&mut fe).is_none());
    let snap = tx.stats().local().unwrap();
    assert_eq!((snap.help_attempts, snap.help_batches), (0, 0));
    assert_eq!(ready(&mut backend).unwrap().len(), 2);
}

#[tokio::test]
async fn a_sleeping_helper_is_woken_by_backend_work() {
    let (tx, backend) = local_channel(100, 100, config(8, 1, 4), false);
    let mut fe = backend.frontend(0).unwrap();
    let mut recv = Box::pin(fe.recv());
    assert!(
        (&mut recv).now_or_never().is_none(),
        "nothing to do: asleep"
    );
    tx.send(events(0, 2)).await.unwrap();
    let mut batch = (&mut recv).now_or_never().flatten().unwrap();
    assert!(batch.is_borrowed());
    assert_eq!(numbers(&mut batch), vec![0, 1]);
}

#[tokio::test]
async fn a_helper_woken_for_backend_work_that_finds_its_own_passes_the_wake_up_on() {
    let (tx, backend) = local_channel(100, 100, config(8, 2, 4), false);
    let mut fe0 = backend.frontend(0).unwrap();
    let mut fe1 = backend.frontend(1).unwrap();
    let mut reg0 = tx.register();
    assert_eq!(reg0.slot(), Some(0));
    let mut helper0 = Box::pin(fe0.recv());
    let mut helper1 = Box::pin(fe1.recv());
    assert!((&mut helper0).now_or_never().is_none());
    assert!((&mut helper1).now_or_never().is_none());
    // Backend work wakes one idle helper (the lowest slot)...
    tx.send(events(0, 2)).await.unwrap();
    // ...whose own producer fills its ring before it runs.
    assert_eq!(submit(&tx, &mut reg0, events(10, 1)).await, None);
    let mut own = (&mut helper0).now_or_never().flatten().unwrap();
    assert!(own.is_from_frontend());
    assert_eq!(numbers(&mut own), vec![10]);
    // The wake-up was passed on: the other helper takes the backend work.
    let mut helped = (&mut helper1).now_or_never().flatten().unwrap();
    assert!(helped.is_borrowed());
    assert_eq!(numbers(&mut helped), vec![0, 1]);
}

#[tokio::test]
async fn without_helping_a_closed_queue_ends_the_frontend_consumer_despite_backend_work() {
    let (tx, mut backend) = local_channel(100, 100, config(8, 1, 0), false);
    let mut fe = backend.frontend(0).unwrap();
    tx.send(events(0, 2)).await.unwrap();
    drop(tx);
    assert!(fe.recv().now_or_never().unwrap().is_none());
    assert_eq!(ready(&mut backend).unwrap().len(), 2);
}

#[tokio::test]
async fn a_sleeping_frontend_consumer_is_woken_by_its_producer() {
    let (tx, backend) = local_channel(100, 100, config(8, 1, 0), false);
    let mut fe = backend.frontend(0).unwrap();
    let mut reg = tx.register();
    let mut recv = Box::pin(fe.recv());
    assert!((&mut recv).now_or_never().is_none());
    assert_eq!(submit(&tx, &mut reg, events(0, 2)).await, None);
    let mut batch = (&mut recv).now_or_never().flatten().unwrap();
    assert!(batch.is_from_frontend());
    assert_eq!(numbers(&mut batch), vec![0, 1]);
}

#[tokio::test]
async fn a_frontend_consumer_takes_at_most_the_dequeue_batch() {
    // max_batch 2 limits both the backend's and a frontend's dequeue.
    let (tx, backend) = local_channel(100, 2, config(8, 1, 0), false);
    let mut fe = backend.frontend(0).unwrap();
    let mut reg = tx.register();
    assert_eq!(submit(&tx, &mut reg, events(0, 5)).await, None);
    let sizes: Vec<usize> = std::iter::from_fn(|| fe.try_recv().map(|b| b.len())).collect();
    assert_eq!(sizes, vec![2, 2, 1]);
    assert!(fe.try_recv().is_none());
    let hist = tx.stats().stats().batch_size_snapshot();
    assert_eq!(hist.count, 3, "frontend dequeues are in the histogram");
}

#[tokio::test]
async fn a_batch_of_exactly_the_rings_size_fits_an_empty_ring() {
    let (tx, backend) = local_channel(100, 100, config(4, 1, 0), false);
    let mut fe = backend.frontend(0).unwrap();
    let mut reg = tx.register();
    assert_eq!(submit(&tx, &mut reg, events(0, 4)).await, None);
    assert_eq!(
        submit(&tx, &mut reg, events(4, 1)).await,
        Some(Overflow::NoFit)
    );
    assert_eq!(ready(&mut fe).unwrap().len(), 4);
    assert_eq!(tx.stats().local().unwrap().frontends[0].max_queued, 4);
}

#[test]
fn backend_routing_totals_every_reason() {
    let routing = logbus_queue::local::BackendRouting {
        no_fit: 1,
        oversized: 2,
        exhausted: 4,
        shutdown: 8,
        direct: 16,
    };
    assert_eq!(routing.total(), 31);
}

#[tokio::test]
async fn stats_print_the_local_queue_in_brief() {
    let (tx, _rx) = local_channel(10, 10, config(8, 3, 0), false);
    let printed = format!("{:?}", tx.stats().stats());
    assert!(printed.contains("frontends: 3, .."), "{printed}");
    assert!(printed.contains("frontend_size: 8"), "{printed}");
}

#[tokio::test]
async fn the_in_flight_bound_adds_each_frontends_ring_and_dequeue_batch() {
    // B + N × (F + min(D, F)).
    let (tx, _rx) = local_channel(100, 3, config(8, 2, 0), false);
    assert_eq!(tx.stats().stats().capacity(), 100 + 2 * (8 + 3));
    let (tx, _rx) = local_channel(100, 50, config(8, 4, 0), false);
    assert_eq!(tx.stats().stats().capacity(), 100 + 4 * (8 + 8));
}

#[tokio::test]
async fn counters_add_frontends_to_the_backend() {
    let (tx, mut backend) = local_channel(100, 100, config(8, 2, 0), true);
    let mut fe = backend.frontend(1).unwrap();
    let _first = tx.register();
    let mut reg = tx.register();
    assert_eq!(reg.slot(), Some(1));
    assert_eq!(submit(&tx, &mut reg, events(0, 5)).await, None);
    tx.send(events(5, 2)).await.unwrap();
    let stats = tx.stats();
    assert_eq!(stats.stats().sent(), 7);
    assert_eq!(stats.occupancy(), 7);
    assert_eq!(stats.stats().max_occupancy(), 5 + 2);
    let a = ready(&mut fe).unwrap();
    let b = ready(&mut backend).unwrap();
    assert_eq!(stats.stats().received(), 7);
    assert_eq!(stats.stats().ingest_latency_snapshot().unwrap().count, 0);
    drop((a, b));
    assert_eq!(stats.occupancy(), 0);
    // Released batches record their latency, frontend ones included.
    assert_eq!(stats.stats().ingest_latency_snapshot().unwrap().count, 2);
    assert_eq!(stats.stats().batch_size_snapshot().count, 2);
}

#[tokio::test]
async fn the_last_sender_ends_every_frontend_consumer_after_its_ring() {
    let (tx, backend) = local_channel(100, 100, config(8, 2, 2), false);
    let mut fe0 = backend.frontend(0).unwrap();
    let mut fe1 = backend.frontend(1).unwrap();
    let mut reg = tx.register();
    assert_eq!(submit(&tx, &mut reg, events(0, 2)).await, None);
    tx.send(events(2, 3)).await.unwrap();
    let second = tx.clone();
    drop(tx);
    // One sender left: still open, nothing to do for the idle one... but
    // backend work is there to help with.
    let mut got = Vec::new();
    while let Some(mut b) = ready(&mut fe1) {
        got.extend(numbers(&mut b));
    }
    assert_eq!(got, vec![2, 3, 4]);
    assert!(ready(&mut fe1).is_none(), "open: waits for more");
    drop(reg);
    drop(second);
    // Closed: each finishes its ring and helping, then ends.
    assert!(ready(&mut fe1).is_none());
    assert!(fe1.recv().now_or_never().unwrap().is_none());
    let mut b = ready(&mut fe0).unwrap();
    assert_eq!(numbers(&mut b), vec![0, 1]);
    assert!(fe0.recv().now_or_never().unwrap().is_none());
}

#[tokio::test]
async fn a_producer_leaving_wakes_its_consumer_which_stays_on_as_a_helper() {
    let (tx, backend) = local_channel(100, 100, config(8, 1, 4), false);
    let mut fe = backend.frontend(0).unwrap();
    let mut reg = tx.register();
    assert_eq!(submit(&tx, &mut reg, events(0, 1)).await, None);
    drop(reg);
    let mut b = ready(&mut fe).unwrap();
    assert_eq!(numbers(&mut b), vec![0]);
    tx.send(events(1, 2)).await.unwrap();
    let b = ready(&mut fe).unwrap();
    assert!(b.is_borrowed());
    assert_eq!(tx.stats().local().unwrap().registrations, 1);
}

#[tokio::test(start_paused = true)]
async fn min_batch_waits_for_more_until_its_timeout() {
    let local = LocalConfig {
        min_batch: 3,
        min_batch_timeout: Duration::from_millis(50),
        ..config(8, 1, 0)
    };
    let (tx, backend) = local_channel(100, 100, local, false);
    let mut fe = backend.frontend(0).unwrap();
    let mut reg = tx.register();

    // Enough arrives while it waits: one batch of three.
    assert_eq!(submit(&tx, &mut reg, events(0, 1)).await, None);
    let mut recv = Box::pin(fe.recv());
    assert!((&mut recv).now_or_never().is_none(), "waits for min_batch");
    assert_eq!(submit(&tx, &mut reg, events(1, 2)).await, None);
    let mut b = (&mut recv).now_or_never().flatten().unwrap();
    assert_eq!(numbers(&mut b), vec![0, 1, 2]);
    drop(recv);

    // Not enough: the timeout hands over what there is, not before.
    assert_eq!(submit(&tx, &mut reg, events(3, 1)).await, None);
    let started = tokio::time::Instant::now();
    let mut b = fe.recv().await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(50));
    assert_eq!(numbers(&mut b), vec![3]);

    // A producer leaving wakes a consumer waiting for more, which then
    // takes what there is at once.
    assert_eq!(submit(&tx, &mut reg, events(4, 1)).await, None);
    let started = tokio::time::Instant::now();
    let mut recv = Box::pin(fe.recv());
    assert!((&mut recv).now_or_never().is_none(), "waits for min_batch");
    drop(reg);
    let mut b = (&mut recv).now_or_never().flatten().unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(numbers(&mut b), vec![4]);
}

#[tokio::test]
async fn an_interrupt_ends_a_waiting_frontend_consumer() {
    let (tx, mut backend) = local_channel(100, 100, config(8, 1, 2), false);
    let interrupt = backend.interruptible();
    let mut fe = backend.frontend(0).unwrap();
    let mut recv = Box::pin(fe.recv());
    assert!((&mut recv).now_or_never().is_none());
    interrupt.raise();
    assert!((&mut recv).now_or_never().unwrap().is_none());
    drop(recv);
    // Until it resumes, it delivers nothing, even with work waiting.
    let mut reg = tx.register();
    assert_eq!(submit(&tx, &mut reg, events(0, 1)).await, None);
    assert!(fe.recv().now_or_never().unwrap().is_none());
    assert!(fe.try_recv().is_none());
    fe.resume();
    assert_eq!(fe.try_recv().unwrap().len(), 1);
}

#[tokio::test]
async fn a_weak_sender_revives_a_local_queue_only_while_a_sender_keeps_it_open() {
    let (tx, backend) = local_channel(100, 100, config(8, 1, 2), false);
    let mut fe = backend.frontend(0).unwrap();
    let weak = tx.downgrade();
    let revived = weak.upgrade().unwrap();
    drop(tx);
    // The revived sender keeps the queue open.
    assert!(fe.recv().now_or_never().is_none());
    revived.send(events(0, 1)).await.unwrap();
    assert!(ready(&mut fe).unwrap().is_borrowed());
    drop(revived);
    assert!(weak.upgrade().is_none());
    assert!(fe.recv().now_or_never().unwrap().is_none(), "closed");
}

#[tokio::test]
async fn a_full_backend_refuses_try_send_and_a_closed_one_returns_the_events() {
    let (tx, backend) = local_channel(4, 4, config(8, 1, 0), false);
    let fe = backend.frontend(0).unwrap();
    tx.try_send(events(0, 4)).unwrap();
    assert!(matches!(
        tx.try_send(events(4, 1)),
        Err(TrySendError::Full(b)) if b.len() == 1
    ));
    drop(backend);
    drop(fe);
    assert!(matches!(
        tx.try_send(events(4, 1)),
        Err(TrySendError::Closed(b)) if b.len() == 1
    ));
    let mut reg = tx.register();
    match tx.try_frontend(&mut reg, events(5, 1)) {
        Err((batch, Overflow::Shutdown)) => {
            let err = tx
                .send_overflow(batch, Overflow::Shutdown)
                .await
                .unwrap_err();
            assert_eq!(err.0.len(), 1);
        }
        other => panic!(
            "expected a shutdown overflow, got {:?}",
            other.err().map(|e| e.1)
        ),
    }
}
