//! Durable queues (`type: disk` and `disk-assisted`): the sender stores a
//! batch in the log (or, for a disk-assisted queue with room, in memory)
//! and returns once it is stored; consumers read the log and acknowledge
//! a record only when the batch holding it is finished, so a crash
//! delivers it again instead of losing it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use logbus_event::Event;

use super::{End, InputBatch, Origin, Receiver, SendError, Sender, WaitGuard, rejoin};
use crate::durable::Durable;

/// Released log batches: their acknowledgement and event count.
pub(super) type HeldAcks = Arc<std::sync::Mutex<Vec<(logbus_diskq::AckToken, u64)>>>;

fn take_held(held: &HeldAcks) -> Vec<(logbus_diskq::AckToken, u64)> {
    std::mem::take(&mut *held.lock().unwrap_or_else(|e| e.into_inner()))
}

/// A durable queue consumer's state.
#[derive(Default)]
pub(super) struct LogEnd {
    /// A disk-assisted queue's consumer alternates memory and log.
    disk_turn: bool,
    /// Acknowledgements of log batches this consumer released, settled at
    /// its next `recv` (or when it ends normally): a consumer that fails
    /// before asking again returns them to the log instead.
    held: HeldAcks,
}

impl LogEnd {
    /// The consumer asked for more (or ended normally): the log batches it
    /// released are done.
    pub(super) fn settle_held(&self) {
        drop(take_held(&self.held));
    }
}

impl Sender {
    /// A durable queue: memory while a disk-assisted queue admits the
    /// batch, the log otherwise. Returns once the batch is stored.
    pub(super) async fn send_durable(&self, mut batch: Vec<Event>) -> Result<(), SendError> {
        let durable = self.shared.durable.as_ref().expect("a durable channel");
        while !batch.is_empty() {
            let n = batch.len().min(self.shared.max_batch);
            if !durable.memory_admits(self.shared.occupancy(), n) {
                break;
            }
            let Ok(permit) = self.shared.permits.try_acquire_many(n as u32) else {
                break;
            };
            permit.forget();
            let rest = batch.split_off(n);
            let chunk = std::mem::replace(&mut batch, rest);
            self.shared
                .stats
                .max_occupancy
                .fetch_max(self.shared.occupancy(), Ordering::Relaxed);
            if let Err(e) = self.tx().try_send(chunk) {
                self.shared.permits.add_permits(n);
                return Err(SendError(rejoin(e.into_inner(), batch)));
            }
            self.shared
                .stats
                .sent
                .fetch_add(n as u64, Ordering::Relaxed);
            if let Some(local) = self.shared.local() {
                local.wake_helper();
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        if self.tx().is_closed() {
            return Err(SendError(batch));
        }
        let mut batch = batch;
        match durable.append(&mut batch).await {
            Ok(()) => {
                self.shared
                    .stats
                    .sent
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                tracing::error!("{e}");
                Err(SendError(batch))
            }
        }
    }
}

impl Receiver {
    fn log_end(&mut self) -> &mut LogEnd {
        match &mut self.end {
            End::Log(end) => end,
            _ => unreachable!("only a durable queue's consumer reads the log"),
        }
    }

    pub(super) fn try_recv_log(&mut self) -> Option<InputBatch> {
        self.log_end().settle_held();
        let shared = self.shared.clone();
        let durable = shared.durable.as_ref().expect("a durable channel");
        if durable.is_assisted()
            && let Ok(events) = self.rx.try_recv()
        {
            return Some(self.accept(events, Origin::Backend));
        }
        self.read_log(durable).ok().flatten()
    }

    /// A durable queue's consumer: memory and log in turn (a `disk` queue
    /// has only the log), until every sender is gone and both are empty.
    pub(super) async fn recv_log(&mut self) -> Option<InputBatch> {
        self.log_end().settle_held();
        let shared = self.shared.clone();
        let durable = shared.durable.as_ref().expect("a durable channel");
        let mut wait = None;
        let interrupt = self.interrupt.clone();
        loop {
            // Register for every wake-up before looking, so none is missed.
            let mut raised = interrupt.as_ref().map(|i| Box::pin(i.notify.notified()));
            if let Some(r) = raised.as_mut() {
                r.as_mut().enable();
            }
            if self.is_interrupted() {
                return None;
            }
            let readable = durable.queue.readable();
            tokio::pin!(readable);
            readable.as_mut().enable();
            let end = self.log_end();
            end.disk_turn = !end.disk_turn;
            let disk_first = end.disk_turn || !durable.is_assisted();
            if !disk_first && let Ok(events) = self.rx.try_recv() {
                return Some(self.accept(events, Origin::Backend));
            }
            let read_failed = match self.read_log(durable) {
                Ok(Some(batch)) => return Some(batch),
                Ok(None) => false,
                Err(()) => true,
            };
            if let Ok(events) = self.rx.try_recv() {
                return Some(self.accept(events, Origin::Backend));
            }
            let senders_gone = self.rx.is_closed();
            if senders_gone {
                durable.queue.close();
                if !read_failed && durable.queue.is_drained() && self.rx.is_empty() {
                    return None;
                }
            }
            // A failed read is retried after a pause (the queue skips a
            // segment that keeps failing), not only when new data comes.
            let retry = async {
                if read_failed {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await
                } else {
                    std::future::pending().await
                }
            };
            if wait.is_none() {
                wait = Some(WaitGuard::start(&shared));
            }
            let interrupted = async {
                match raised.as_mut() {
                    Some(r) => r.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut readable => {}
                _ = interrupted => {}
                _ = retry => {}
                events = self.rx.recv(), if !senders_gone => {
                    if let Ok(events) = events {
                        return Some(self.accept(events, Origin::Backend));
                    }
                }
            }
        }
    }

    /// One batch from the log, if any is readable now; `Err` after a read
    /// error (logged).
    fn read_log(&mut self, durable: &Durable) -> Result<Option<InputBatch>, ()> {
        let max = self.shared.max_batch;
        loop {
            let read = crate::blocking(|| durable.queue.try_read(max));
            let batch = match read {
                Ok(Some(batch)) => batch,
                Ok(None) => return Ok(None),
                Err(e) => {
                    tracing::error!("{e}");
                    return Err(());
                }
            };
            let (data, ranges, ack) = batch.into_parts();
            let data = bytes::Bytes::from(data);
            let mut source = None;
            let mut events = Vec::with_capacity(ranges.len());
            for range in ranges {
                match crate::durable::decode_event(&data, range.clone(), &mut source) {
                    Ok(event) => events.push(event),
                    Err(why) => {
                        durable.stats.undecodable.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            queue = %durable.queue.config().dir.display(),
                            "skipping a queue record that is not an event: {why}"
                        );
                    }
                }
            }
            if events.is_empty() {
                continue;
            }
            let mut batch = self.accept(events, Origin::Disk);
            batch.ack = Some((ack, self.log_end().held.clone()));
            return Ok(Some(batch));
        }
    }

    /// The consumer failed: the log batches it released but whose
    /// acknowledgement is not settled yet (it may have failed while
    /// finishing them) go back to the log for the next start. Returns how
    /// many events that was.
    pub fn return_held(&mut self) -> u64 {
        let Some(durable) = &self.shared.durable else {
            return 0;
        };
        durable.queue.consumer_failed();
        let mut n = 0;
        let held = match &self.end {
            End::Log(end) => take_held(&end.held),
            _ => Vec::new(),
        };
        for (ack, count) in held {
            ack.keep();
            n += count;
        }
        durable.stats.returned.fetch_add(n, Ordering::Relaxed);
        n
    }
    // ----
}
