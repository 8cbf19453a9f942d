//! A bounded single-producer/single-consumer ring.
//!
//! This is the frontend of a local-scope queue: one upstream task writes,
//! one consumer task reads, and nobody else touches it, so no
//! read-modify-write is needed on the data path. The producer publishes a
//! whole batch or nothing ([`Producer::push_all`]): the admission predicate
//! ("does the whole submission fit now?") is answered by the same call that
//! publishes it, never by a separate look that could go stale.
//!
//! Memory ordering, the standard pattern: the producer writes the slots,
//! then stores its position with `Release`; the consumer loads it with
//! `Acquire` before reading the slots, moves the values out, and only then
//! stores its own position with `Release`, which the producer `Acquire`s
//! before reusing those slots. Each side keeps a cached copy of the other's
//! position and refreshes it only when the cache cannot satisfy the call
//! (producer: "no room for this batch"; consumer: "fewer than asked for"),
//! so a stale cache can never cause a false "full" or a short batch.
//!
//! The two positions live on separate cache lines (128-byte aligned, the
//! adjacent-line prefetcher's unit on x86), so the producer's stores do not
//! invalidate the line the consumer polls and vice versa.

// The slots are `MaybeUninit` cells written by one side and read by the
// other; the unsafe blocks below are the whole of it, each with its reason.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use crate::sync::{Arc, AtomicBool, AtomicUsize, Ordering, UnsafeCell};

#[repr(align(128))]
#[derive(Debug)]
struct CachePadded<T>(T);

struct Shared<T> {
    /// Next position the consumer reads; written only by the consumer.
    head: CachePadded<AtomicUsize>,
    /// Next position the producer writes; written only by the producer.
    tail: CachePadded<AtomicUsize>,
    producer_gone: AtomicBool,
    consumer_gone: AtomicBool,
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
}

// SAFETY: a slot is written only by the producer while it lies in
// [tail, head + capacity) and read only by the consumer while it lies in
// [head, tail); the Release/Acquire pairs on the positions order those
// accesses, so no slot is ever accessed from two threads at once. Values
// cross threads, hence `T: Send`.
unsafe impl<T: Send> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Shared<T> {
    fn capacity(&self) -> usize {
        self.slots.len()
    }
    fn slot(&self, position: usize) -> &UnsafeCell<MaybeUninit<T>> {
        &self.slots[position % self.slots.len()]
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        // Both handles are gone: no concurrent access is possible.
        let head = self.head.0.load(Ordering::Acquire);
        let tail = self.tail.0.load(Ordering::Acquire);
        let mut position = head;
        while position != tail {
            // SAFETY: positions in [head, tail) hold initialised values that
            // the consumer never moved out.
            self.slot(position)
                .with_mut(|slot| unsafe { (*slot).assume_init_drop() });
            position = position.wrapping_add(1);
        }
    }
}

/// Creates a ring of `capacity` slots (at least 1).
pub fn ring<T: Send>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    assert!(capacity >= 1, "ring capacity must be at least 1");
    let slots = (0..capacity)
        .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
        .collect();
    let shared = Arc::new(Shared {
        head: CachePadded(AtomicUsize::new(0)),
        tail: CachePadded(AtomicUsize::new(0)),
        producer_gone: AtomicBool::new(false),
        consumer_gone: AtomicBool::new(false),
        slots,
    });
    (
        Producer {
            shared: shared.clone(),
            tail: 0,
            cached_head: 0,
        },
        Consumer {
            shared,
            head: 0,
            cached_tail: 0,
        },
    )
}

/// The writing end. Not `Clone`: there is exactly one.
pub struct Producer<T> {
    shared: Arc<Shared<T>>,
    tail: usize,
    cached_head: usize,
}

impl<T> Producer<T> {
    /// Publishes every item of `items` (leaving it empty) if they all fit
    /// now; otherwise leaves `items` untouched and returns `false`. A batch
    /// larger than the capacity never fits.
    pub fn push_all(&mut self, items: &mut Vec<T>) -> bool {
        let n = items.len();
        let capacity = self.shared.capacity();
        if n > capacity {
            return false;
        }
        if capacity - self.tail.wrapping_sub(self.cached_head) < n {
            // The cache says full: look at the consumer's real position
            // before declaring it.
            self.cached_head = self.shared.head.0.load(Ordering::Acquire);
            if capacity - self.tail.wrapping_sub(self.cached_head) < n {
                return false;
            }
        }
        for (i, item) in items.drain(..).enumerate() {
            let position = self.tail.wrapping_add(i);
            // SAFETY: `position` is in [tail, head + capacity): the consumer
            // has moved this slot's previous value out (its Release store of
            // `head` was Acquired above) and will not read it before our
            // Release store of `tail` below.
            self.shared
                .slot(position)
                .with_mut(|slot| unsafe { (*slot).write(item) });
        }
        self.tail = self.tail.wrapping_add(n);
        self.shared.tail.0.store(self.tail, Ordering::Release);
        true
    }

    /// Events queued now (exact for the producer's own writes; the consumer
    /// may have taken more since).
    pub fn len(&self) -> usize {
        len(&self.shared)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.shared.capacity()
    }

    /// Whether the consumer has been dropped (nothing will drain the ring).
    pub fn is_consumer_gone(&self) -> bool {
        self.shared.consumer_gone.load(Ordering::Acquire)
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        self.shared.producer_gone.store(true, Ordering::Release);
    }
}

/// The reading end. Not `Clone`: there is exactly one.
pub struct Consumer<T> {
    shared: Arc<Shared<T>>,
    head: usize,
    cached_tail: usize,
}

impl<T> Consumer<T> {
    /// Moves up to `max` items, oldest first, to the end of `out`; returns
    /// how many.
    pub fn pop_into(&mut self, max: usize, out: &mut Vec<T>) -> usize {
        let mut available = self.cached_tail.wrapping_sub(self.head);
        if available < max {
            // The cache cannot fill the request: look at what the producer
            // has published since (a batching consumer wants all of it).
            self.cached_tail = self.shared.tail.0.load(Ordering::Acquire);
            available = self.cached_tail.wrapping_sub(self.head);
            if available == 0 {
                return 0;
            }
        }
        let k = available.min(max);
        out.reserve(k);
        for i in 0..k {
            let position = self.head.wrapping_add(i);
            // SAFETY: `position` is in [head, tail): the producer initialised
            // it before its Release store of `tail`, which we Acquired, and
            // will not touch it again before our Release store of `head`.
            out.push(
                self.shared
                    .slot(position)
                    .with_mut(|slot| unsafe { (*slot).assume_init_read() }),
            );
        }
        self.head = self.head.wrapping_add(k);
        self.shared.head.0.store(self.head, Ordering::Release);
        k
    }

    /// Items queued now (at least this many: the producer may have added
    /// more since).
    pub fn len(&self) -> usize {
        len(&self.shared)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.shared.capacity()
    }

    /// Whether the producer has been dropped: once the ring is also empty,
    /// nothing more will arrive.
    pub fn is_producer_gone(&self) -> bool {
        self.shared.producer_gone.load(Ordering::Acquire)
    }
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        self.shared.consumer_gone.store(true, Ordering::Release);
    }
}

fn len<T>(shared: &Shared<T>) -> usize {
    // Read head first: tail only grows, so tail - head never underflows.
    let head = shared.head.0.load(Ordering::Acquire);
    let tail = shared.tail.0.load(Ordering::Acquire);
    tail.wrapping_sub(head)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn whole_batch_or_nothing() {
        let (mut p, mut c) = ring::<u32>(4);
        let mut batch = vec![1, 2, 3];
        assert!(p.push_all(&mut batch));
        assert!(batch.is_empty());
        let mut too_big = vec![4, 5];
        assert!(!p.push_all(&mut too_big), "2 do not fit in the 1 free slot");
        assert_eq!(too_big, vec![4, 5], "a refused batch is left untouched");
        let mut out = Vec::new();
        assert_eq!(c.pop_into(2, &mut out), 2);
        assert!(p.push_all(&mut too_big), "fits once the consumer moved on");
        assert_eq!(c.pop_into(10, &mut out), 3);
        assert_eq!(out, vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_batch_larger_than_the_ring_never_fits() {
        let (mut p, _c) = ring::<u32>(2);
        let mut batch = vec![1, 2, 3];
        assert!(!p.push_all(&mut batch));
        assert_eq!(batch.len(), 3);
    }

    #[test]
    fn wraps_around_many_times_in_order() {
        let (mut p, mut c) = ring::<u64>(3);
        let mut out = Vec::new();
        let mut next = 0;
        for round in 0..1000u64 {
            let mut batch: Vec<u64> = (0..(round % 3 + 1))
                .map(|_| {
                    next += 1;
                    next
                })
                .collect();
            let n = batch.len();
            assert!(p.push_all(&mut batch));
            assert_eq!(c.pop_into(n, &mut out), n);
        }
        assert_eq!(out, (1..=next).collect::<Vec<_>>());
    }

    #[test]
    fn dropping_the_ring_drops_what_is_left() {
        let counter = std::sync::Arc::new(());
        let (mut p, mut c) = ring(4);
        let mut batch = vec![counter.clone(), counter.clone(), counter.clone()];
        assert!(p.push_all(&mut batch));
        let mut out = Vec::new();
        c.pop_into(1, &mut out);
        drop(out);
        assert_eq!(std::sync::Arc::strong_count(&counter), 3);
        drop((p, c));
        assert_eq!(std::sync::Arc::strong_count(&counter), 1);
    }

    /// Both ends see the same length (what was published and not yet
    /// taken) and the same capacity.
    #[test]
    fn both_ends_see_the_length_and_the_capacity() {
        let (mut p, mut c) = ring::<u8>(4);
        assert_eq!((p.capacity(), c.capacity()), (4, 4));
        assert!(p.is_empty() && c.is_empty());
        assert!(p.push_all(&mut vec![1, 2, 3]));
        assert_eq!((p.len(), c.len()), (3, 3));
        assert!(!p.is_empty() && !c.is_empty());
        let mut out = Vec::new();
        assert_eq!(c.pop_into(2, &mut out), 2);
        assert_eq!((p.len(), c.len()), (1, 1));
        assert_eq!(c.pop_into(2, &mut out), 1);
        assert!(p.is_empty() && c.is_empty());
        assert_eq!(out, [1, 2, 3]);
    }

    #[test]
    fn each_side_sees_the_other_leave() {
        let (p, c) = ring::<u8>(1);
        assert!(!c.is_producer_gone());
        assert!(!p.is_consumer_gone());
        drop(p);
        assert!(c.is_producer_gone());
        let (p, c) = ring::<u8>(1);
        drop(c);
        assert!(p.is_consumer_gone());
    }

    #[test]
    fn threads_hand_over_a_million_items_in_order() {
        let (mut p, mut c) = ring::<u64>(64);
        const N: u64 = 1_000_000;
        let producer = std::thread::spawn(move || {
            let mut next = 0;
            while next < N {
                let mut batch: Vec<u64> = (next..(next + 7).min(N)).collect();
                let n = batch.len() as u64;
                while !p.push_all(&mut batch) {
                    std::hint::spin_loop();
                }
                next += n;
            }
        });
        let mut expected = 0;
        let mut out = Vec::new();
        while expected < N {
            out.clear();
            c.pop_into(16, &mut out);
            for v in &out {
                assert_eq!(*v, expected);
                expected += 1;
            }
        }
        producer.join().unwrap();
    }
}
