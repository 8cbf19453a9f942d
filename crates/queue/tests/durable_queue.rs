//! Stage queues with a durable store: a `disk` queue, a disk-assisted
//! queue's spill and return, persistence across a reopen, a failed
//! consumer's batches staying on disk, a segment that cannot be read, and
//! local-scope helpers never touching the log.

use std::path::Path;
use std::time::Duration;

use futures::FutureExt;
use logbus_event::{Event, Meta};
use logbus_queue::durable::{DiskConfig, Durable, DurableKind};
use logbus_queue::{LocalConfig, Receiver, durable_channel};

fn events(from: usize, n: usize) -> Vec<Event> {
    (from..from + n)
        .map(|i| Event::raw(format!("{i:06}"), Meta::at("t", i as u64)))
        .collect()
}

fn numbers(batch: &[Event]) -> Vec<usize> {
    batch
        .iter()
        .map(|e| {
            std::str::from_utf8(e.as_raw().unwrap())
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

fn open(dir: &Path, kind: DurableKind) -> Durable {
    let config = DiskConfig {
        segment_bytes: 8192,
        ..DiskConfig::new(dir)
    };
    Durable::open(config, kind).unwrap().0
}

/// A disk-assisted queue that spills above `high` events in memory and
/// returns to memory below `low`.
fn assisted(high: usize, low: usize) -> DurableKind {
    DurableKind::DiskAssisted {
        high_watermark: high,
        low_watermark: low,
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn receive_all(rx: &mut Receiver) -> Vec<usize> {
    let mut got = Vec::new();
    while let Some(mut batch) = rx.recv().await {
        got.extend(numbers(&batch.take()));
    }
    got
}

#[test]
fn a_disk_queue_delivers_everything_in_order_and_ends_when_senders_go() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = durable_channel(64, 16, false, None, open(dir.path(), DurableKind::Disk));
    let handle = rx.handle();
    let got = rt().block_on(async move {
        for i in 0..50 {
            tx.send(events(i * 10, 10)).await.unwrap();
        }
        drop(tx);
        receive_all(&mut rx).await
    });
    assert_eq!(got, (0..500).collect::<Vec<_>>());
    let d = handle.durable().unwrap();
    assert_eq!((d.spilled, d.queued, d.unread), (500, 0, 0));
    assert_eq!(handle.stats().sent(), 500);
    assert_eq!(handle.stats().received(), 500);
    // Nothing waited in memory: a disk queue's memory part stays empty.
    assert_eq!(handle.stats().max_occupancy(), 0);
}

#[test]
fn events_survive_a_restart_and_a_failed_consumers_batches_come_back() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (tx, mut rx) =
            durable_channel(64, 16, false, None, open(dir.path(), DurableKind::Disk));
        rt().block_on(async {
            tx.send(events(0, 100)).await.unwrap();
            // One batch done, the next returned by a failing consumer.
            let done = rx.recv().await.unwrap();
            assert_eq!(done.len(), 16);
            drop(done);
            let failed = rx.recv().await.unwrap();
            assert!(failed.return_to_store());
        });
        let d = rx.handle().durable().unwrap();
        assert_eq!(d.returned, 16);
        assert_eq!(d.unread, 100 - 32);
    }
    let durable = open(dir.path(), DurableKind::Disk);
    assert_eq!(durable.recovery().records, 100 - 16);
    let (tx, mut rx) = durable_channel(64, 16, false, None, durable);
    drop(tx);
    let got = rt().block_on(receive_all(&mut rx));
    assert_eq!(got, (16..100).collect::<Vec<_>>());
}

#[test]
fn a_consumer_retries_a_failing_segment_then_goes_on_past_it_with_the_loss_counted() {
    let dir = tempfile::tempdir().unwrap();
    {
        // Written by an earlier run, so that no writer thread is still
        // publishing (and waking the consumer in real time) while the
        // retries below run on the paused clock.
        let (tx, rx) = durable_channel(64, 16, false, None, open(dir.path(), DurableKind::Disk));
        rt().block_on(async move {
            for i in 0..50 {
                tx.send(events(i * 10, 10)).await.unwrap();
            }
        });
        drop(rx);
    }
    let durable = open(dir.path(), DurableKind::Disk);
    assert_eq!(durable.recovery().records, 500);
    let (tx, mut rx) = durable_channel(64, 16, false, None, durable);
    drop(tx);
    let handle = rx.handle();
    // A directory where the first segment was: it opens, and every read of
    // it fails (EISDIR) — an I/O error, not damage.
    let first = logbus_diskq::list_segments(dir.path()).unwrap()[0];
    let path = logbus_diskq::segment_path(dir.path(), first);
    std::fs::rename(&path, dir.path().join("aside")).unwrap();
    std::fs::create_dir(&path).unwrap();
    // A paused clock: the pauses between retries take no real time, and
    // their sum is exact.
    let paused = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let (got, waited) = paused.block_on(async move {
        // The consumer retries the read every 100 ms; the queue gives up on
        // that segment after ten tries, and the stream goes on and ends.
        let start = tokio::time::Instant::now();
        let got = receive_all(&mut rx).await;
        (got, start.elapsed())
    });
    // Nine 100 ms pauses between ten failed reads, nothing waking the
    // consumer early. Without the pauses the ten tries pass in no time.
    assert_eq!(waited, Duration::from_millis(900));
    let lost = 500 - got.len() as u64;
    assert!(lost > 0 && lost < 500, "lost {lost}");
    assert_eq!(got, (lost as usize..500).collect::<Vec<_>>());
    let d = handle.durable().unwrap();
    assert_eq!((d.unreadable, d.damaged_regions, d.unread), (lost, 1, 0));
}

#[test]
fn a_disk_assisted_queue_spills_beyond_the_high_watermark_and_returns_to_memory() {
    let dir = tempfile::tempdir().unwrap();
    let kind = assisted(20, 10);
    let (tx, mut rx) = durable_channel(32, 10, false, None, open(dir.path(), kind));
    let handle = rx.handle();
    rt().block_on(async {
        // No consumer yet: 20 fit in memory, the rest spill.
        for i in 0..10 {
            tx.send(events(i * 10, 10)).await.unwrap();
        }
        let d = handle.durable().unwrap();
        assert_eq!(d.spilled, 80);
        assert!(d.spilling);
        assert_eq!(handle.occupancy(), 20);
        // Drain everything: memory and log in turn.
        let mut got = Vec::new();
        while got.len() < 100 {
            let mut batch = rx.recv().await.unwrap();
            got.extend(numbers(&batch.take()));
        }
        got.sort_unstable();
        assert_eq!(got, (0..100).collect::<Vec<_>>());
        // The log is read and memory is empty: the next batch stays in memory.
        tx.send(events(100, 5)).await.unwrap();
        let d = handle.durable().unwrap();
        assert!(!d.spilling);
        assert_eq!(d.spilled, 80);
        assert_eq!(handle.occupancy(), 5);
        drop(tx);
        assert_eq!(receive_all(&mut rx).await, (100..105).collect::<Vec<_>>());
    });
}

#[test]
fn local_scope_helpers_borrow_from_memory_only_never_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let kind = assisted(8, 4);
    let local = LocalConfig {
        frontend_size: 16,
        max_frontends: 1,
        helper_batch: 4,
        min_batch: 0,
        min_batch_timeout: Duration::ZERO,
    };
    let (tx, mut rx) = durable_channel(8, 8, false, Some(local), open(dir.path(), kind));
    let mut helper = rx.frontend(0).unwrap();
    rt().block_on(async {
        // Sent to the backend directly: 8 to memory, 32 spill to the log.
        tx.send(events(0, 40)).await.unwrap();
        assert_eq!(rx.handle().durable().unwrap().spilled, 32);
        // The frontend's consumer helps with memory work, 4 at a time...
        let mut helped = Vec::new();
        while let Some(Some(mut batch)) = helper.recv().now_or_never() {
            assert!(batch.is_borrowed());
            helped.extend(numbers(&batch.take()));
        }
        assert_eq!(helped, (0..8).collect::<Vec<_>>());
        // ...and then sleeps although 32 events wait in the log.
        assert!(helper.recv().now_or_never().is_none());
        let d = rx.handle().durable().unwrap();
        assert_eq!(d.unread, 32);
        // The shared queue's consumer reads the log.
        drop(tx);
        let mut rest = Vec::new();
        while let Some(mut batch) = rx.recv().await {
            assert!(!batch.is_borrowed());
            rest.extend(numbers(&batch.take()));
        }
        assert_eq!(rest, (8..40).collect::<Vec<_>>());
    });
}

#[test]
fn a_sender_gets_its_events_back_once_the_consumer_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = durable_channel(8, 8, false, None, open(dir.path(), DurableKind::Disk));
    drop(rx);
    let err = rt().block_on(tx.send(events(0, 3))).unwrap_err();
    assert_eq!(err.0.len(), 3);
}

#[test]
fn a_disk_queue_never_takes_a_try_send_into_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = durable_channel(8, 8, false, None, open(dir.path(), DurableKind::Disk));
    match tx.try_send(events(0, 2)) {
        Err(logbus_queue::channel::TrySendError::Full(back)) => assert_eq!(numbers(&back), [0, 1]),
        _ => panic!("a disk queue stores through send, never try_send"),
    }
    assert_eq!(rx.handle().occupancy(), 0);
    drop(tx);
    assert!(rt().block_on(receive_all(&mut rx)).is_empty());
}

#[test]
fn a_forced_stop_saves_what_waits_in_memory_only_when_asked_to() {
    let kind = assisted(100, 10);
    for save in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        {
            let durable = open(dir.path(), kind).with_save_on_shutdown(save);
            let (tx, mut rx) = durable_channel(100, 4, false, None, durable);
            let handle = rx.handle();
            rt().block_on(async {
                tx.send(events(0, 10)).await.unwrap();
                // One batch in the consumer's hands is not part of the backlog.
                let held = rx.recv().await.unwrap();
                assert_eq!(held.len(), 4);
                assert_eq!(handle.occupancy(), 10);
                let saved = handle.save_backlog().await;
                assert_eq!(saved, if save { 6 } else { 0 }, "save: {save}");
                assert_eq!(handle.durable().unwrap().saved, saved);
                // Saved events leave memory and give their room back.
                assert_eq!(handle.occupancy(), 10 - saved as usize);
                drop(held);
            });
        }
        let durable = open(dir.path(), kind);
        assert_eq!(durable.recovery().records, if save { 6 } else { 0 });
        let (tx, mut rx) = durable_channel(100, 4, false, None, durable);
        drop(tx);
        let got = rt().block_on(receive_all(&mut rx));
        let expected: Vec<usize> = if save { (4..10).collect() } else { Vec::new() };
        assert_eq!(got, expected);
    }
}

#[test]
fn spilling_goes_on_until_the_log_is_read_even_when_memory_is_low() {
    let dir = tempfile::tempdir().unwrap();
    let kind = assisted(20, 10);
    let (tx, mut rx) = durable_channel(32, 10, false, None, open(dir.path(), kind));
    let handle = rx.handle();
    rt().block_on(async {
        tx.send(events(0, 50)).await.unwrap();
        assert_eq!(handle.durable().unwrap().spilled, 30);
        // Memory drained (a ready memory batch is taken first), the log not.
        for _ in 0..2 {
            assert_eq!(rx.try_recv().unwrap().len(), 10);
        }
        assert_eq!(handle.occupancy(), 0);
        tx.send(events(50, 5)).await.unwrap();
        let d = handle.durable().unwrap();
        assert!(d.spilling, "30 events wait in the log");
        assert_eq!(d.spilled, 35);
        assert_eq!(handle.occupancy(), 0);
    });
}

#[test]
fn a_released_log_batch_is_acknowledged_when_the_consumer_asks_again_not_before() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = durable_channel(64, 10, false, None, open(dir.path(), DurableKind::Disk));
    let handle = rx.handle();
    rt().block_on(async {
        tx.send(events(0, 30)).await.unwrap();
        // Ready now, without waiting: try_recv reads the log too.
        let first = rx.try_recv().unwrap();
        assert_eq!(numbers(first.events()), (0..10).collect::<Vec<_>>());
        drop(first);
        // Released, but a consumer that fails now gives it back: still queued.
        assert_eq!(handle.durable().unwrap().queued, 30);
        let second = rx.recv().await.unwrap();
        assert_eq!(handle.durable().unwrap().queued, 20);
        drop(second);
        // A failing consumer returns what it released and did not settle.
        assert_eq!(rx.return_held(), 10);
        assert_eq!(handle.durable().unwrap().returned, 10);
    });
}

#[test]
fn a_disk_assisted_consumer_takes_memory_and_log_in_turn() {
    let dir = tempfile::tempdir().unwrap();
    let kind = assisted(10, 5);
    let (tx, mut rx) = durable_channel(32, 5, false, None, open(dir.path(), kind));
    rt().block_on(async {
        // 10 in memory (0..10), 20 in the log (10..30).
        tx.send(events(0, 30)).await.unwrap();
        let mut from_log = Vec::new();
        for _ in 0..4 {
            let batch = rx.recv().await.unwrap();
            from_log.push(numbers(batch.events())[0] >= 10);
        }
        assert_eq!(from_log, [true, false, true, false]);
    });
}
