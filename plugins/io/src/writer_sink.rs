//! The write loop shared by the stdout and file sinks: encode events into
//! one buffer, write it when it is large or when no more input is ready,
//! and only then count the events committed, tell their sources they are
//! delivered (written to the kernel; synced too with `sync: true`), and
//! release their channel slots.
//!
//! The writes happen on a thread of the sink's own. A write (and an fsync)
//! blocks; done in place through `block_in_place`, every flush handed the
//! worker's other tasks to another thread, so one busy sink cycled through
//! a dozen threads, each keeping its own allocator heap (about 10 MiB of
//! the reference pipeline's peak RSS, docs/benchmarks.md). On its own
//! thread the write also overlaps the encoding of the next buffer: two
//! buffers take turns, and at most one write is in flight.

use std::io::Write;

use logbus_framing::Framing;
use logbus_plugin_api::{Event, InputBatch, Outcome, Payload, SinkContext, StageError};
use tokio::sync::{mpsc, oneshot};

/// A process killed in the middle of a write can leave a file ending in
/// part of a line. Appending to it as it is would glue the next event onto
/// that fragment, and a reader would lose both; the events of the fragment
/// were never confirmed, so they come again anyway. Before appending
/// newline-framed text, end such a fragment with a newline of its own.
/// Returns whether it did.
/// (`file` is the file opened for appending; `path` is read, since an
/// append-only handle cannot be.)
pub fn close_torn_line(path: &std::path::Path, file: &mut std::fs::File) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(false);
    }
    let mut last = [0u8; 1];
    std::fs::File::open(path)?.read_exact_at(&mut last, len - 1)?;
    if last[0] == b'\n' {
        return Ok(false);
    }
    file.write_all(b"\n")?;
    Ok(true)
}

/// Buffer size at which a write is issued even if more input is ready.
pub const FLUSH_BYTES: usize = 256 * 1024;

/// Writes one event as a framed message (a line by default): raw bytes as
/// they are, structured fields as JSON.
pub fn encode_message(event: &Event, framing: Framing, buf: &mut Vec<u8>) {
    match (event.payload(), framing) {
        (Payload::Raw(bytes), _) => logbus_framing::encode(framing, bytes, buf),
        (Payload::Fields(fields), Framing::Newline) => {
            serde_json::to_writer(&mut *buf, fields).expect("writing JSON to a Vec cannot fail");
            buf.push(b'\n');
        }
        (Payload::Fields(fields), _) => {
            let json = serde_json::to_vec(fields).expect("writing JSON to a Vec cannot fail");
            logbus_framing::encode(framing, &json, buf);
        }
        (Payload::Lazy(fields), Framing::Newline) => {
            fields.write_json(buf);
            buf.push(b'\n');
        }
        (Payload::Lazy(fields), _) => {
            let mut json = Vec::new();
            fields.write_json(&mut json);
            logbus_framing::encode(framing, &json, buf);
        }
    }
}

/// Capacity of each of the two buffers: a flush's worth plus 64 KiB of room
/// for the event that crosses [`FLUSH_BYTES`]. (A literal: arithmetic here
/// would only change an allocation's size, which no test can tell.)
const BUFFER_CAPACITY: usize = 327_680;
const _: () = assert!(BUFFER_CAPACITY == FLUSH_BYTES + 64 * 1024);

/// Writes every event of `cx.input` to `writer` (see the module docs) and
/// returns the writer when the input has ended, for the caller to finish
/// (a compressed stream's trailer, a last sync).
pub async fn run_writer<W, S>(
    writer: W,
    what: &str,
    framing: Framing,
    sync: S,
    cx: &mut SinkContext,
) -> Result<W, StageError>
where
    W: Write + Send + 'static,
    S: FnMut(&mut W) -> std::io::Result<()> + Send + 'static,
{
    let mut thread = WriterThread::start(writer, sync, what, &cx.id)?;
    let mut buf = Vec::with_capacity(BUFFER_CAPACITY);
    let mut held: Vec<InputBatch> = Vec::new();
    loop {
        let next = match cx.input.try_recv() {
            Some(batch) => Some(batch),
            None => {
                // Nothing more is ready: write what is encoded and wait for
                // it, so nothing taken waits for more input to be committed.
                thread.hand_off(&mut buf, &mut held, cx).await?;
                thread.wait(cx).await?;
                cx.input.recv().await
            }
        };
        let Some(batch) = next else { break };
        cx.metrics.add_in(batch.len() as u64);
        // Checked after each event, not each batch: a batch of twenty
        // 60 MiB events (a script's results) would otherwise become one
        // 1.2 GiB buffer. A batch whose events span several buffers is
        // settled with the buffer holding its last event; buffers are
        // written in order, so that is when all of it is written.
        let last = batch.len().saturating_sub(1);
        let mut open = Some(batch);
        for i in 0..=last {
            let Some(batch) = open.as_ref() else { break };
            let Some(event) = batch.events().get(i) else {
                break;
            };
            encode_message(event, framing, &mut buf);
            if buf.len() >= FLUSH_BYTES {
                if i == last {
                    held.extend(open.take());
                }
                thread.hand_off(&mut buf, &mut held, cx).await?;
            }
        }
        held.extend(open);
    }
    thread.hand_off(&mut buf, &mut held, cx).await?;
    thread.finish(cx).await
}

type Written = (Vec<u8>, std::io::Result<()>);

/// The sink's writing thread and the one buffer it may be writing.
struct WriterThread<W> {
    what: String,
    requests: std::sync::mpsc::SyncSender<Vec<u8>>,
    replies: mpsc::Receiver<Written>,
    writer: oneshot::Receiver<W>,
    /// The batches encoded in the buffer being written; settled when the
    /// thread says it is written.
    in_flight: Option<Vec<InputBatch>>,
    /// The buffer the thread gave back, to encode the next one into.
    spare: Option<Vec<u8>>,
}

impl<W: Write + Send + 'static> WriterThread<W> {
    fn start<S>(mut writer: W, mut sync: S, what: &str, stage: &str) -> Result<Self, StageError>
    where
        S: FnMut(&mut W) -> std::io::Result<()> + Send + 'static,
    {
        let (requests, incoming) = std::sync::mpsc::sync_channel::<Vec<u8>>(1);
        let (answer, replies) = mpsc::channel::<Written>(1);
        let (give_back, returned) = oneshot::channel();
        std::thread::Builder::new()
            .name(format!("logbus-write-{stage}"))
            .spawn(move || {
                while let Ok(mut buf) = incoming.recv() {
                    let result = writer
                        .write_all(&buf)
                        .and_then(|()| writer.flush())
                        .and_then(|()| sync(&mut writer));
                    buf.clear();
                    if answer.blocking_send((buf, result)).is_err() {
                        return;
                    }
                }
                let _ = give_back.send(writer);
            })
            .map_err(|e| StageError::io(format!("starting the thread that writes {what}"), e))?;
        Ok(WriterThread {
            what: what.to_string(),
            requests,
            replies,
            writer: returned,
            in_flight: None,
            spare: None,
        })
    }

    fn stopped(&self) -> StageError {
        StageError::io(
            format!("writing {}", self.what),
            std::io::Error::other("the writing thread stopped"),
        )
    }

    /// Waits for the buffer in flight, if any, then settles its batches
    /// delivered and counts them committed.
    async fn wait(&mut self, cx: &SinkContext) -> Result<(), StageError> {
        let Some(batches) = self.in_flight.take() else {
            return Ok(());
        };
        let (buf, result) = self.replies.recv().await.ok_or_else(|| self.stopped())?;
        result.map_err(|e| StageError::io(format!("writing {}", self.what), e))?;
        // A buffer that grew around one huge event does not keep its size.
        let mut buf = buf;
        buf.shrink_to(BUFFER_CAPACITY);
        self.spare = Some(buf);
        settle(batches, cx);
        Ok(())
    }

    /// Hands `buf`, with the batches encoded in it, to the thread once the
    /// previous write has finished; `buf` becomes the buffer it gave back.
    async fn hand_off(
        &mut self,
        buf: &mut Vec<u8>,
        held: &mut Vec<InputBatch>,
        cx: &SinkContext,
    ) -> Result<(), StageError> {
        self.wait(cx).await?;
        if buf.is_empty() {
            // Batches with no events: nothing to write.
            settle(std::mem::take(held), cx);
            return Ok(());
        }
        let next = self
            .spare
            .take()
            .unwrap_or_else(|| Vec::with_capacity(BUFFER_CAPACITY));
        let full = std::mem::replace(buf, next);
        self.requests.send(full).map_err(|_| self.stopped())?;
        self.in_flight = Some(std::mem::take(held));
        Ok(())
    }

    /// Waits for the last write and takes the writer back.
    async fn finish(mut self, cx: &SinkContext) -> Result<W, StageError> {
        self.wait(cx).await?;
        let stopped = self.stopped();
        let WriterThread {
            requests, writer, ..
        } = self;
        drop(requests);
        writer.await.map_err(|_| stopped)
    }
}

fn settle(batches: Vec<InputBatch>, cx: &SinkContext) {
    let mut events = 0;
    for mut batch in batches {
        events += batch.len();
        batch.settle(Outcome::Delivered);
    }
    cx.committed(events);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use logbus_plugin_api::{Meta, StageMetrics, channel};

    /// A raw event of `text` (the io crate's tests share it).
    pub(crate) fn line(text: &str) -> Event {
        Event::raw(text.as_bytes().to_vec(), Meta::at("t", 0))
    }

    /// A destination whose every write waits for the test to release it.
    struct Gated {
        started: mpsc::UnboundedSender<usize>,
        release: std::sync::mpsc::Receiver<()>,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gated {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let _ = self.started.send(bytes.len());
            // A write done on the runtime's only thread would wait here
            // for a release that thread can never send: fail, not hang.
            self.release
                .recv_timeout(Duration::from_secs(20))
                .map_err(|_| std::io::Error::other("never released"))?;
            self.written.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    struct Running {
        tx: logbus_plugin_api::Sender,
        metrics: Arc<StageMetrics>,
        started: mpsc::UnboundedReceiver<usize>,
        release: std::sync::mpsc::Sender<()>,
        written: Arc<Mutex<Vec<u8>>>,
        task: tokio::task::JoinHandle<Result<(), StageError>>,
    }

    fn run_gated() -> Running {
        let (started_tx, started) = mpsc::unbounded_channel();
        let (release, gate) = std::sync::mpsc::channel();
        let written = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = channel(16);
        let metrics = Arc::new(StageMetrics::default());
        let mut cx = SinkContext::new("out", rx, metrics.clone());
        let gated = Gated {
            started: started_tx,
            release: gate,
            written: written.clone(),
        };
        let task = tokio::spawn(async move {
            run_writer(gated, "gated", Framing::Newline, |_| Ok(()), &mut cx)
                .await
                .map(drop)
        });
        Running {
            tx,
            metrics,
            started,
            release,
            written,
            task,
        }
    }

    /// On a one-thread runtime (what `blocking` used to run inline), the
    /// test's own task runs while a write is held, and the events of that
    /// write are committed only once it is done.
    #[tokio::test]
    async fn a_held_write_stalls_neither_the_runtime_nor_commits_early() {
        let mut run = run_gated();
        run.tx.send(vec![line("one"), line("two")]).await.unwrap();
        assert_eq!(run.started.recv().await, Some(8), "one write of both lines");
        assert_eq!(
            run.metrics.snapshot().events_out,
            0,
            "committed before written"
        );
        run.release.send(()).unwrap();
        drop(run.tx);
        run.task.await.unwrap().unwrap();
        assert_eq!(run.metrics.snapshot().events_out, 2);
        assert_eq!(*run.written.lock().unwrap(), b"one\ntwo\n");
    }

    /// While one full buffer is written the sink takes and encodes the
    /// next input; that input is written, and committed, only after the
    /// first write is done.
    #[tokio::test]
    async fn the_next_buffer_is_encoded_while_one_is_written() {
        let mut run = run_gated();
        let big = "x".repeat(FLUSH_BYTES);
        run.tx.send(vec![line(&big)]).await.unwrap();
        run.tx.send(vec![line("small")]).await.unwrap();
        assert_eq!(run.started.recv().await, Some(FLUSH_BYTES + 1));
        let start = std::time::Instant::now();
        while run.metrics.snapshot().events_in < 2 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the second batch was never taken"
            );
            tokio::task::yield_now().await;
        }
        assert_eq!(run.metrics.snapshot().events_out, 0);
        run.release.send(()).unwrap();
        assert_eq!(run.started.recv().await, Some(6), "the second buffer");
        assert_eq!(
            run.metrics.snapshot().events_out,
            1,
            "the first buffer's event"
        );
        run.release.send(()).unwrap();
        drop(run.tx);
        run.task.await.unwrap().unwrap();
        assert_eq!(run.metrics.snapshot().events_out, 2);
        let written = run.written.lock().unwrap();
        assert_eq!(written.len(), FLUSH_BYTES + 1 + 6);
        assert!(written.ends_with(b"x\nsmall\n"));
    }

    /// Issue 54: twenty 60 MiB script results in one batch were encoded
    /// into one 1.2 GiB buffer, and the allocation aborted the process.
    /// A buffer is handed off as soon as it passes the flush size, so no
    /// write holds more than that plus one event; every byte still
    /// arrives, and the batch is committed once, whole.
    #[tokio::test]
    async fn a_batch_of_huge_events_is_written_an_event_or_so_at_a_time() {
        let (tx, rx) = channel(64);
        let metrics = Arc::new(StageMetrics::default());
        let mut cx = SinkContext::new("out", rx, metrics.clone());
        let event_bytes = 3 * FLUSH_BYTES;
        let huge: Vec<Event> = (0..20).map(|_| line(&"y".repeat(event_bytes))).collect();
        tx.send(huge).await.unwrap();
        tx.send(vec![line("tail")]).await.unwrap();
        drop(tx);
        let sizes = run_writer(
            Sizes::default(),
            "sizes",
            Framing::Newline,
            |_| Ok(()),
            &mut cx,
        )
        .await
        .unwrap()
        .0;
        assert_eq!(sizes.iter().sum::<usize>(), 20 * (event_bytes + 1) + 5);
        let largest = sizes.iter().copied().max().unwrap();
        assert!(
            largest < FLUSH_BYTES + event_bytes + 1,
            "a write of {largest} bytes: more than one buffer's worth of events was encoded at once ({sizes:?})"
        );
        assert!(sizes.len() >= 20, "{sizes:?}");
        assert_eq!(metrics.snapshot().events_out, 21);
    }

    #[derive(Debug)]
    struct Failing;

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk on fire"))
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_failed_write_is_an_error_naming_the_target_and_commits_nothing() {
        let (tx, rx) = channel(4);
        let metrics = Arc::new(StageMetrics::default());
        let mut cx = SinkContext::new("out", rx, metrics.clone());
        tx.send(vec![line("one")]).await.unwrap();
        drop(tx);
        let err = run_writer(Failing, "the target", Framing::Newline, |_| Ok(()), &mut cx)
            .await
            .expect_err("the write failed");
        let message = err.to_string();
        assert!(message.contains("writing the target"), "{message}");
        assert!(message.contains("disk on fire"), "{message}");
        assert_eq!(metrics.snapshot().events_out, 0);
    }

    #[tokio::test]
    async fn a_failed_sync_is_an_error_too() {
        let (tx, rx) = channel(4);
        let mut cx = SinkContext::new("out", rx, Arc::new(StageMetrics::default()));
        tx.send(vec![line("one")]).await.unwrap();
        drop(tx);
        let err = run_writer(
            Vec::new(),
            "the target",
            Framing::Newline,
            |_| Err(std::io::Error::other("sync refused")),
            &mut cx,
        )
        .await
        .expect_err("the sync failed");
        assert!(err.to_string().contains("sync refused"), "{err}");
    }

    /// Records the size of each write.
    #[derive(Default)]
    struct Sizes(Vec<usize>);

    impl Write for Sizes {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.push(bytes.len());
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// With input always ready, a write goes out once the buffer holds
    /// 256 KiB (docs/configuration.md), not sooner, and the rest at the end.
    #[tokio::test]
    async fn with_input_ready_each_write_is_a_full_buffer() {
        let (tx, rx) = channel(2048);
        let line_of_1k = "y".repeat(1023);
        for _ in 0..1000 {
            tx.send(vec![line(&line_of_1k)]).await.unwrap();
        }
        drop(tx);
        let mut cx = SinkContext::new("out", rx, Arc::new(StageMetrics::default()));
        let sizes = run_writer(
            Sizes::default(),
            "memory",
            Framing::Newline,
            |_| Ok(()),
            &mut cx,
        )
        .await
        .unwrap()
        .0;
        assert_eq!(sizes.iter().sum::<usize>(), 1000 * 1024);
        let (last, full) = sizes.split_last().unwrap();
        assert_eq!(full, [256 * 1024; 3], "{sizes:?}");
        assert_eq!(*last, 1000 * 1024 - 3 * 256 * 1024);
    }

    #[tokio::test]
    async fn the_writer_comes_back_with_everything_written_in_order() {
        let (tx, rx) = channel(1024);
        let mut cx = SinkContext::new("out", rx, Arc::new(StageMetrics::default()));
        let sender = tokio::spawn(async move {
            for i in 0..1000 {
                tx.send(vec![line(&format!("{i:0>300}"))]).await.unwrap();
            }
        });
        let out = run_writer(Vec::new(), "memory", Framing::Newline, |_| Ok(()), &mut cx)
            .await
            .unwrap();
        sender.await.unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1000);
        for (i, l) in lines.iter().enumerate() {
            assert_eq!(*l, format!("{i:0>300}"));
        }
    }

    #[test]
    fn a_torn_last_line_is_closed_once_and_whole_files_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap()
        };
        assert!(!close_torn_line(&path, &mut open()).unwrap(), "empty file");
        std::fs::write(&path, "{\"id\":1}\n{\"id\":2,\"x").unwrap();
        assert!(close_torn_line(&path, &mut open()).unwrap());
        assert!(
            !close_torn_line(&path, &mut open()).unwrap(),
            "already closed"
        );
        open().write_all(b"{\"id\":3}\n").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "{\"id\":1}\n{\"id\":2,\"x\n{\"id\":3}\n");
    }
}
