//! Local-scope queues: each producer that registers gets its own SPSC
//! frontend ring, read by one consumer that helps the shared backend when
//! its ring is empty. Admission is all-or-nothing per batch, so a batch is
//! never split between a frontend and the backend and order within a
//! producer's batch holds.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use logbus_event::Event;
use logbus_ring::spsc;

use super::{End, InputBatch, Origin, Receiver, SendError, Sender, Shared, WaitGuard};
use crate::local::{Local, Overflow};

/// A producer's standing with one local-scope queue: its frontend, or the
/// knowledge that every slot was taken. Kept by the producer (an
/// [`Output`](crate::Output)) for as long as it sends to that queue.
pub struct Registration {
    channel: Weak<Shared>,
    frontend: Option<(usize, spsc::Producer<Event>)>,
}

impl Registration {
    /// Whether this registration is with `sender`'s queue.
    pub fn is_for(&self, sender: &Sender) -> bool {
        std::ptr::eq(self.channel.as_ptr(), Arc::as_ptr(&sender.shared))
    }

    /// The frontend slot, if the producer got one.
    pub fn slot(&self) -> Option<usize> {
        self.frontend.as_ref().map(|(slot, _)| *slot)
    }
}

impl Drop for Registration {
    /// The producer exits: its consumer is told, finishes the ring and
    /// stays on as a helper (the slot is not recycled).
    fn drop(&mut self) {
        if let Some((slot, producer)) = self.frontend.take() {
            drop(producer);
            if let Some(shared) = self.channel.upgrade()
                && let Some(local) = shared.local()
            {
                local.frontends[slot].signal.notify_one();
            }
        }
    }
}

impl Sender {
    /// Whether this is a local-scope queue, where producers register.
    pub fn is_local(&self) -> bool {
        self.shared.local().is_some()
    }

    /// Registers the calling producer with this local-scope queue: it gets
    /// a frontend if a slot is free (slots are never recycled).
    pub fn register(&self) -> Registration {
        Registration {
            channel: Arc::downgrade(&self.shared),
            frontend: self.shared.local().and_then(Local::register),
        }
    }

    /// The admission predicate: publishes the whole batch to the producer's
    /// frontend if it fits now, or gives it back with the reason it must go
    /// to the backend (see [`Sender::send_overflow`]).
    pub fn try_frontend(
        &self,
        registration: &mut Registration,
        mut batch: Vec<Event>,
    ) -> Result<(), (Vec<Event>, Overflow)> {
        let Some(local) = self.shared.local() else {
            return Err((batch, Overflow::Direct));
        };
        let Some((slot, ring)) = registration.frontend.as_mut() else {
            return Err((batch, Overflow::Exhausted));
        };
        let frontend = &local.frontends[*slot];
        let counters = &frontend.prod.0;
        let n = batch.len();
        if ring.is_consumer_gone() {
            return Err((batch, Overflow::Shutdown));
        }
        if n > ring.capacity() {
            counters.overflowed.fetch_add(n as u64, Ordering::Relaxed);
            return Err((batch, Overflow::Oversized));
        }
        if !ring.push_all(&mut batch) {
            counters.overflowed.fetch_add(n as u64, Ordering::Relaxed);
            return Err((batch, Overflow::NoFit));
        }
        counters.admitted.fetch_add(n as u64, Ordering::Relaxed);
        counters.admitted_batches.fetch_add(1, Ordering::Relaxed);
        let queued = ring.len();
        if queued > counters.max_queued.load(Ordering::Relaxed) {
            counters.max_queued.store(queued, Ordering::Relaxed);
        }
        frontend.signal.notify_one();
        Ok(())
    }

    /// Sends to a local-scope queue's backend, counting why.
    pub async fn send_overflow(
        &self,
        batch: Vec<Event>,
        reason: Overflow,
    ) -> Result<(), SendError> {
        if let Some(local) = self.shared.local() {
            local.count_overflow(reason, batch.len());
        }
        self.send_backend(batch).await
    }
}

/// A frontend consumer's end of its ring.
pub(super) struct FrontendEnd {
    slot: usize,
    ring: spsc::Consumer<Event>,
    /// Woken by a producer for BE work: if local work is found instead,
    /// the wake-up is passed on (see `logbus_ring::idle`).
    picked: bool,
}

impl FrontendEnd {
    /// The consumer end of frontend `slot`.
    pub(super) fn new(slot: usize, ring: spsc::Consumer<Event>) -> Self {
        FrontendEnd {
            slot,
            ring,
            picked: false,
        }
    }

    /// The consumer goes away: what is left in its ring is counted as
    /// abandoned (its producer then overflows to the backend).
    pub(super) fn abandon(mut self, shared: &Shared) {
        let mut left = Vec::new();
        while self.ring.pop_into(usize::MAX, &mut left) > 0 {}
        let n = left.len() as u64;
        if n > 0
            && let Some(local) = shared.local()
        {
            let counters = &local.frontends[self.slot].cons.0;
            counters.abandoned.fetch_add(n, Ordering::Relaxed);
            counters.retired.fetch_add(n, Ordering::Relaxed);
            shared.stats.abandoned.fetch_add(n, Ordering::Relaxed);
        }
    }
}

impl Receiver {
    /// The consumer of frontend `slot` of a local-scope queue; `None` if
    /// this is not a local queue, the slot does not exist or was taken.
    pub fn frontend(&self, slot: usize) -> Option<Receiver> {
        let ring = self.shared.local()?.take_consumer(slot)?;
        let mut consumer = self.clone();
        consumer.end = End::Frontend(FrontendEnd::new(slot, ring));
        Some(consumer)
    }

    /// Frontends of this queue (0 for a global queue).
    pub fn frontend_count(&self) -> usize {
        self.shared.local().map_or(0, |l| l.frontends.len())
    }

    fn frontend_end(&mut self) -> &mut FrontendEnd {
        match &mut self.end {
            End::Frontend(fe) => fe,
            _ => unreachable!("only a frontend consumer reads a frontend"),
        }
    }

    fn frontend_slot(&self) -> usize {
        match &self.end {
            End::Frontend(fe) => fe.slot,
            _ => unreachable!("only a frontend consumer reads a frontend"),
        }
    }

    pub(super) fn try_recv_frontend(&mut self) -> Option<InputBatch> {
        let shared = self.shared.clone();
        let local = shared.local().expect("a frontend belongs to a local queue");
        let mut events = Vec::new();
        if self
            .frontend_end()
            .ring
            .pop_into(local.frontend_dequeue(), &mut events)
            > 0
        {
            return Some(self.accept_frontend(events));
        }
        None
    }

    /// A frontend consumer's loop: its own ring first, then (when helping
    /// is on) a borrowed BE batch, then sleep until its producer, a BE
    /// producer, the end of the stream or an interrupt wakes it.
    pub(super) async fn recv_frontend(&mut self) -> Option<InputBatch> {
        let shared = self.shared.clone();
        let local = shared.local().expect("a frontend belongs to a local queue");
        let helping = local.config.helper_batch > 0;
        let mut wait = None;
        loop {
            if self.is_interrupted() {
                return None;
            }
            let fe = self.frontend_end();
            let frontend = &local.frontends[fe.slot];
            if !fe.ring.is_empty() {
                self.wait_for_min_batch(local).await;
                let fe = self.frontend_end();
                let mut events = Vec::new();
                fe.ring.pop_into(local.frontend_dequeue(), &mut events);
                if std::mem::take(&mut fe.picked) && !self.rx.is_empty() {
                    // Picked for BE work but turning to local work: pass
                    // the wake-up on so BE work is not left unattended.
                    local.wake_helper();
                }
                return Some(self.accept_frontend(events));
            }
            if helping {
                let counters = &frontend.cons.0;
                counters.help_attempts.fetch_add(1, Ordering::Relaxed);
                if let Some(batch) = self.borrow(local) {
                    return Some(batch);
                }
                counters.help_empty.fetch_add(1, Ordering::Relaxed);
            }
            let End::Frontend(fe) = &mut self.end else {
                unreachable!("only a frontend consumer reads a frontend")
            };
            let frontend = &local.frontends[fe.slot];
            if local.closed.load(Ordering::SeqCst)
                && fe.ring.is_empty()
                && (!helping || self.rx.is_empty())
            {
                return None;
            }
            // Going to sleep: register for the wake-up, announce, re-check.
            let notified = frontend.signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if helping {
                local.idle.announce(fe.slot);
            }
            let work = !fe.ring.is_empty()
                || (helping && !self.rx.is_empty())
                || local.closed.load(Ordering::SeqCst);
            if work {
                // A producer may have picked this helper between the
                // announce and the re-check: that wake-up is ours to pass
                // on if we turn to local work (found by the loom model).
                if helping && !local.idle.withdraw(fe.slot) {
                    fe.picked = true;
                }
                continue;
            }
            if wait.is_none() {
                wait = Some(WaitGuard::start(&shared));
            }
            match self.interrupt.clone() {
                Some(interrupt) => {
                    let raised = interrupt.notify.notified();
                    tokio::pin!(raised);
                    raised.as_mut().enable();
                    if !self.is_interrupted() {
                        tokio::select! {
                            _ = &mut notified => {}
                            _ = &mut raised => {}
                        }
                    }
                }
                None => notified.await,
            }
            let fe = self.frontend_end();
            if helping && !local.idle.withdraw(fe.slot) {
                fe.picked = true;
            }
        }
    }

    /// `min_batch`: with fewer events queued, wait (bounded by the timeout)
    /// for the producer to add more.
    async fn wait_for_min_batch(&mut self, local: &Local) {
        let (min, timeout) = (
            local.config.min_batch.min(local.frontend_dequeue()),
            local.config.min_batch_timeout,
        );
        if min <= 1 || timeout.is_zero() {
            return;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let fe = self.frontend_end();
        let frontend = &local.frontends[fe.slot];
        while fe.ring.len() < min && !fe.ring.is_producer_gone() {
            let notified = frontend.signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if fe.ring.len() >= min {
                break;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        // A wake-up consumed here may have been for BE work: look again.
        frontend.signal.notify_one();
    }

    /// Takes up to `helper_batch` events from the backend; the rest of a
    /// larger BE batch goes back (still counted against the BE).
    fn borrow(&mut self, local: &Local) -> Option<InputBatch> {
        let mut events = self.rx.try_recv().ok()?;
        let limit = local.config.helper_batch;
        if events.len() > limit {
            let rest = events.split_off(limit);
            let back = self.shared.backend.as_ref().and_then(|b| b.upgrade());
            match back {
                Some(tx) => {
                    if let Err(e) = tx.try_send(rest) {
                        events.extend(e.into_inner());
                    } else {
                        local.wake_helper();
                    }
                }
                // The queue is closing: finish the whole batch here.
                None => events.extend(rest),
            }
        }
        let slot = self.frontend_slot();
        let counters = &local.frontends[slot].cons.0;
        counters.help_batches.fetch_add(1, Ordering::Relaxed);
        counters
            .help_taken
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        Some(self.accept(events, Origin::Borrowed(slot)))
    }

    /// Frontend batches touch only the frontend's own counters.
    fn accept_frontend(&self, events: Vec<Event>) -> InputBatch {
        let slot = self.frontend_slot();
        let local = self
            .shared
            .local()
            .expect("a frontend belongs to a local queue");
        let counters = &local.frontends[slot].cons.0;
        self.counted(
            events,
            Origin::Frontend(slot),
            &counters.taken,
            &counters.batch_sizes,
            counters.ingest_latency_us.as_ref(),
        )
    }

    // ----
}
