//! Model checks: every interleaving (and every allowed reordering of the
//! relaxed/acquire/release operations) of small scenarios, explored by loom.
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p logbus-ring --release --test loom`.
#![cfg(loom)]

use logbus_ring::idle::IdleSet;
use logbus_ring::spsc::ring;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::{Arc, Notify};
use loom::thread;

/// Batches published by one thread arrive whole, in order, exactly once,
/// through a ring small enough that the producer must see the consumer's
/// progress (the cached position refresh) to make room.
#[test]
fn ring_hands_over_batches_in_order() {
    loom::model(|| {
        let (mut producer, mut consumer) = ring::<u32>(2);
        let writer = thread::spawn(move || {
            for batch in [vec![1], vec![2, 3]] {
                let mut batch = batch;
                while !producer.push_all(&mut batch) {
                    thread::yield_now();
                }
            }
        });
        let mut seen = Vec::new();
        while seen.len() < 3 {
            if consumer.pop_into(2, &mut seen) == 0 {
                thread::yield_now();
            }
        }
        writer.join().unwrap();
        assert_eq!(seen, vec![1, 2, 3]);
    });
}

/// A refused batch is never partly published.
#[test]
fn ring_refusal_is_all_or_nothing() {
    loom::model(|| {
        let (mut producer, mut consumer) = ring::<u32>(2);
        let mut first = vec![1];
        assert!(producer.push_all(&mut first));
        let reader = thread::spawn(move || {
            let mut out = Vec::new();
            consumer.pop_into(1, &mut out);
            let mut more = Vec::new();
            consumer.pop_into(2, &mut more);
            (out, more)
        });
        let mut pair = vec![2, 3];
        let accepted = producer.push_all(&mut pair);
        assert_eq!(pair.is_empty(), accepted);
        let (out, more) = reader.join().unwrap();
        assert_eq!(out, vec![1]);
        assert!(more.is_empty() || more == vec![2, 3], "got {more:?}");
    });
}

/// Two helpers that sleep when the backend looks empty, one producer that
/// pushes two items: every item is taken and nobody sleeps forever (loom
/// reports a deadlock if a wake-up is lost).
#[test]
fn no_lost_wakeup_for_idle_helpers() {
    const ITEMS: usize = 2;
    loom::model(|| {
        let backend = Arc::new(AtomicUsize::new(0));
        let taken = Arc::new(AtomicUsize::new(0));
        let idle = Arc::new(IdleSet::new());
        let notify: Arc<[Notify; 2]> = Arc::new([Notify::new(), Notify::new()]);
        let done = Arc::new(AtomicBool::new(false));
        let helpers: Vec<_> = (0..2)
            .map(|slot| {
                let (backend, taken, idle, notify, done) = (
                    backend.clone(),
                    taken.clone(),
                    idle.clone(),
                    notify.clone(),
                    done.clone(),
                );
                thread::spawn(move || {
                    loop {
                        if try_take(&backend) {
                            taken.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                        if done.load(Ordering::SeqCst) && backend.load(Ordering::SeqCst) == 0 {
                            return;
                        }
                        idle.announce(slot);
                        if backend.load(Ordering::SeqCst) > 0 || done.load(Ordering::SeqCst) {
                            idle.withdraw(slot);
                            continue;
                        }
                        notify[slot].wait();
                        idle.withdraw(slot);
                    }
                })
            })
            .collect();
        for _ in 0..ITEMS {
            backend.fetch_add(1, Ordering::SeqCst);
            idle.wake_one(|slot| notify[slot].notify());
        }
        // The end of the stream wakes everyone (the queue closing).
        done.store(true, Ordering::SeqCst);
        notify[0].notify();
        notify[1].notify();
        for h in helpers {
            h.join().unwrap();
        }
        assert_eq!(taken.load(Ordering::SeqCst), ITEMS);
    });
}

/// The two-frontend hand-off, written as the frontend consumer's loop is.
/// Helper 0 is woken for backend work but finds local work first and turns
/// to it; that local job cannot finish until the backend item is processed
/// (standing for a long local job). Unless helper 0 passes the wake-up on,
/// helper 1 may sleep through it and loom reports the deadlock. (loom's
/// `Notify` also wakes spuriously, so every wait is in a re-checking loop.)
#[test]
fn a_helper_turning_to_local_work_hands_the_wakeup_on() {
    loom::model(|| {
        let backend = Arc::new(AtomicUsize::new(0));
        let local0 = Arc::new(AtomicUsize::new(0));
        let backend_done = Arc::new(AtomicBool::new(false));
        let done_signal = Arc::new(Notify::new());
        let stop = Arc::new(AtomicBool::new(false));
        let idle = Arc::new(IdleSet::new());
        let notify: Arc<[Notify; 2]> = Arc::new([Notify::new(), Notify::new()]);
        let helper1 = {
            let (backend, backend_done, done_signal, stop, idle, notify) = (
                backend.clone(),
                backend_done.clone(),
                done_signal.clone(),
                stop.clone(),
                idle.clone(),
                notify.clone(),
            );
            thread::spawn(move || {
                loop {
                    if try_take(&backend) {
                        backend_done.store(true, Ordering::SeqCst);
                        done_signal.notify();
                        continue;
                    }
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    idle.announce(1);
                    if backend.load(Ordering::SeqCst) > 0 || stop.load(Ordering::SeqCst) {
                        idle.withdraw(1);
                        continue;
                    }
                    notify[1].wait();
                    idle.withdraw(1);
                }
            })
        };
        let helper0 = {
            let (backend, local0, backend_done, done_signal, idle, notify) = (
                backend.clone(),
                local0.clone(),
                backend_done.clone(),
                done_signal.clone(),
                idle.clone(),
                notify.clone(),
            );
            thread::spawn(move || {
                let mut picked = false;
                loop {
                    if try_take(&local0) {
                        // Turning to local work: pass the wake-up on if it
                        // was meant for BE work that still waits.
                        if std::mem::take(&mut picked) && backend.load(Ordering::SeqCst) > 0 {
                            idle.wake_one(|slot| notify[slot].notify());
                        }
                        // The long local job: ends once the BE item is done.
                        while !backend_done.load(Ordering::SeqCst) {
                            done_signal.wait();
                        }
                        return;
                    }
                    if try_take(&backend) {
                        backend_done.store(true, Ordering::SeqCst);
                        continue;
                    }
                    idle.announce(0);
                    if local0.load(Ordering::SeqCst) > 0 || backend.load(Ordering::SeqCst) > 0 {
                        // A producer may have picked us between the
                        // announce and here: that wake-up is ours to pass on.
                        if !idle.withdraw(0) {
                            picked = true;
                        }
                        continue;
                    }
                    notify[0].wait();
                    if !idle.withdraw(0) {
                        picked = true;
                    }
                }
            })
        };
        // Helper 0's local work arrives (its producer always signals it),
        // then the BE item, which wakes one idle helper.
        local0.fetch_add(1, Ordering::SeqCst);
        notify[0].notify();
        backend.fetch_add(1, Ordering::SeqCst);
        idle.wake_one(|slot| notify[slot].notify());
        helper0.join().unwrap();
        stop.store(true, Ordering::SeqCst);
        notify[1].notify();
        helper1.join().unwrap();
        assert!(backend_done.load(Ordering::SeqCst));
    });
}

fn try_take(counter: &AtomicUsize) -> bool {
    let mut n = counter.load(Ordering::SeqCst);
    while n > 0 {
        match counter.compare_exchange(n, n - 1, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return true,
            Err(now) => n = now,
        }
    }
    false
}
