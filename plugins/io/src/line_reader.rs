//! Frames a byte stream into events on a dedicated thread, so blocking
//! reads (stdin, regular files) never stall the async workers.
//!
//! The thread reads a chunk, cuts it into messages (lines by default;
//! `logbus-framing` for octet counting and length prefixes) that share the
//! chunk's buffer (no per-message copy), and hands the batch to the async side through a
//! one-slot channel. When the pipeline is full the async side stops taking
//! batches, the hand-off fills, and the thread stops reading: backpressure
//! reaches the file descriptor.
//!
//! # Clean shutdown
//! On shutdown the async side raises a stop flag and keeps accepting batches
//! until the thread has seen it (it checks before every read) or no data has
//! come for the grace period — a read blocked on an idle terminal holds no
//! data. Every line read before that point is emitted.
//!
//! # Positions
//! A reader that can resume (a regular file) passes [`Positions`]: each
//! batch then carries an acknowledgement and ends at a stream offset, and
//! the offset saved is the newest one before which every batch finished, so
//! a crash re-reads what was in flight and never skips it.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use logbus_framing::{Deframer, Framing};
use logbus_plugin_api::{
    BatchAck, Event, Meta, OrderedCheckpoint, Position, SourceContext, StageError, now_ns,
};
use tokio::sync::mpsc;

/// Read size; also the bound on data a source holds beyond its output channel.
pub const READ_CHUNK: usize = 128 * 1024;
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);
/// How long a finished reader waits for its last batches to be delivered
/// before it saves what it has and ends.
const FINAL_ACK_WAIT: Duration = Duration::from_secs(30);

/// Where a resumable reader keeps its position.
pub trait PositionStore: Send {
    /// Every message before stream offset `offset` is finished.
    fn save(&mut self, offset: u64) -> std::io::Result<()>;
    /// For log messages.
    fn describe(&self) -> String;
}

/// Acknowledged reading: batches carry acknowledgements and `store` gets
/// the newest offset before which everything finished.
pub struct Positions {
    /// Stream offset of the first byte the reader will read.
    pub start: u64,
    pub store: Box<dyn PositionStore>,
    /// How often the position is saved (and always at the end).
    pub save_every: Duration,
}

pub struct LineReaderOptions {
    /// Longer lines are cut into pieces of this size (and a warning is
    /// logged); with a counted framing, a longer message stops the source.
    pub max_line_bytes: usize,
    pub framing: Framing,
    /// Every event's `Meta::origin` (a file's path; none for stdin).
    pub origin: Option<Arc<str>>,
    /// For a reader that reads the same bytes again after a restart (a
    /// file): the input's name in each event's `Meta::position`, whose
    /// offset is where the message starts in the (decompressed) stream.
    /// `None` (stdin): no positions.
    pub stream: Option<u64>,
}

enum Chunk {
    /// Messages, and the stream offset (from where reading began) just past
    /// the last of them.
    Lines(Vec<Event>, u64),
    Failed(std::io::Error),
}

type Acks = Arc<Mutex<OrderedCheckpoint<u64>>>;

/// The async side's acknowledgement bookkeeping for a resumable reader.
struct Tracker {
    positions: Positions,
    acks: Acks,
    last_save: Instant,
    metrics: Arc<logbus_plugin_api::metrics::StageMetrics>,
}

impl Tracker {
    /// Opens an acknowledged batch for `events` ending at `end`.
    fn attach(&self, events: Vec<Event>, end: u64) -> Vec<Event> {
        let token = self
            .lock()
            .begin(self.positions.start + end, events.len() as u64);
        let batch = BatchAck::new(self.acks.clone(), token);
        events
            .into_iter()
            .map(|e| e.with_ack(batch.handle()))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OrderedCheckpoint<u64>> {
        self.acks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn save_if_due(&mut self) {
        if self.last_save.elapsed() >= self.positions.save_every {
            self.save();
        }
    }

    fn save(&mut self) {
        self.last_save = Instant::now();
        let committed = {
            let acks = self.lock();
            let oldest = acks
                .oldest_open()
                .map(|opened| std::time::SystemTime::now() - opened.elapsed());
            self.metrics.set_acks(acks.counts(), oldest);
            acks.committed().copied()
        };
        if let Some(offset) = committed {
            let store = &mut self.positions.store;
            if let Err(e) = logbus_plugin_api::blocking(|| store.save(offset)) {
                tracing::warn!("saving the read position to {}: {e}", store.describe());
            }
        }
    }

    /// The reader is done: waits (bounded) for the batches still in the
    /// pipeline, then saves what finished.
    async fn finish(mut self, stage: &str) {
        let deadline = Instant::now() + FINAL_ACK_WAIT;
        while self.lock().worth_waiting() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let open = self.lock().outstanding();
        if open > 0 {
            tracing::warn!(
                stage,
                "{open} batches were not finished; a restart reads them again"
            );
        }
        self.save();
    }
}

/// Reads `reader` to EOF (or shutdown), sending one event per line.
pub async fn run_line_source<R: Read + Send + 'static>(
    reader: R,
    what: String,
    opts: LineReaderOptions,
    cx: SourceContext,
    positions: Option<Positions>,
) -> Result<(), StageError> {
    let mut tracker = positions.map(|positions| Tracker {
        positions,
        acks: Acks::default(),
        last_save: Instant::now(),
        metrics: cx.output.metrics().clone(),
    });
    let start = tracker.as_ref().map_or(0, |t| t.positions.start);
    let result = read_all(reader, what, opts, start, &cx, &mut tracker).await;
    // Let downstream drain (its input ends once this output is gone), then
    // save what it finished — also after a read error.
    let SourceContext { id, output, .. } = cx;
    drop(output);
    if let Some(tracker) = tracker {
        tracker.finish(&id).await;
    }
    result
}

async fn read_all<R: Read + Send + 'static>(
    reader: R,
    what: String,
    opts: LineReaderOptions,
    // Stream offset of the reader's first byte.
    start: u64,
    cx: &SourceContext,
    tracker: &mut Option<Tracker>,
) -> Result<(), StageError> {
    let send = async |events: Vec<Event>, end: u64, tracker: &mut Option<Tracker>| {
        let events = match tracker.as_ref() {
            Some(t) => t.attach(events, end),
            None => events,
        };
        cx.output.send(events).await?;
        if let Some(t) = tracker.as_mut() {
            t.save_if_due();
        }
        Ok::<(), StageError>(())
    };
    let (tx, mut rx) = mpsc::channel::<Chunk>(1);
    let stop = Arc::new(AtomicBool::new(false));
    let source: Arc<str> = cx.id.clone();
    let thread_stop = stop.clone();
    let max_line = opts.max_line_bytes.max(1);
    let thread_what = what.clone();
    let framing = opts.framing;
    let origin = opts.origin;
    // Named events: the stream, and the offset of the reader's first byte
    // (each event adds where it starts).
    let position = opts.stream.map(|stream| Position::new(stream, start));

    std::thread::Builder::new()
        .name(format!("logbus-read-{}", cx.id))
        .spawn(move || {
            read_lines(
                reader,
                &thread_what,
                framing,
                max_line,
                Meta {
                    source,
                    ingest_ns: 0,
                    origin,
                    attributes: None,
                    position,
                },
                &tx,
                &thread_stop,
            )
        })
        .map_err(|e| StageError::io("cannot start reader thread", e))?;

    loop {
        tokio::select! {
            // Shutdown first: with input always ready, a fair pick could
            // keep reading for a long time after the signal.
            biased;
            _ = cx.shutdown.cancelled() => break,
            chunk = rx.recv() => match chunk {
                Some(Chunk::Lines(events, end)) => send(events, end, tracker).await?,
                Some(Chunk::Failed(e)) => return Err(StageError::io(format!("reading {what}"), e)),
                None => return Ok(()),
            },
        }
    }
    stop.store(true, Ordering::Release);
    loop {
        match tokio::time::timeout(SHUTDOWN_GRACE, rx.recv()).await {
            Ok(Some(Chunk::Lines(events, end))) => send(events, end, tracker).await?,
            Ok(Some(Chunk::Failed(_))) | Ok(None) | Err(_) => return Ok(()),
        }
    }
}

fn read_lines<R: Read>(
    mut reader: R,
    what: &str,
    framing: Framing,
    max_line: usize,
    // Source and origin of every event; the read time is set per read. Its
    // position, if any, names the stream and holds the offset of the
    // reader's first byte: each event's is that plus where it starts.
    template: Meta,
    tx: &mpsc::Sender<Chunk>,
    stop: &AtomicBool,
) {
    let mut scratch = vec![0u8; READ_CHUNK];
    let mut deframer = Deframer::new(framing, max_line);
    let mut warned_long = false;
    let mut messages = Vec::new();
    let mut starts = Vec::new();
    let placed = template.position;
    // The event of a message that starts `at` into what this reader read.
    let event = |message, meta: &Meta, at: u64| match placed {
        Some(base) => Event::raw(
            message,
            Meta {
                position: Some(Position::new(base.stream, base.offset + at)),
                ..meta.clone()
            },
        ),
        None => Event::raw(message, meta.clone()),
    };
    let finish = |deframer: &mut Deframer, template: &Meta| -> Option<Chunk> {
        let meta = Meta {
            ingest_ns: now_ns(),
            ..template.clone()
        };
        match deframer.finish_placed() {
            // Bytes already read belong to an event, even without their newline.
            Ok(Some((at, last))) => Some(Chunk::Lines(
                vec![event(last, &meta, at)],
                deframer.consumed(),
            )),
            Ok(None) => None,
            Err(e) => Some(Chunk::Failed(std::io::Error::other(e))),
        }
    };
    loop {
        if stop.load(Ordering::Acquire) {
            if let Some(chunk) = finish(&mut deframer, &template) {
                let _ = tx.blocking_send(chunk);
            }
            return;
        }
        let n = match reader.read(&mut scratch) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = tx.blocking_send(Chunk::Failed(e));
                return;
            }
        };
        if n == 0 {
            if let Some(chunk) = finish(&mut deframer, &template) {
                let _ = tx.blocking_send(chunk);
            }
            return;
        }
        let meta = Meta {
            ingest_ns: now_ns(),
            ..template.clone()
        };
        let cut_before = deframer.cut;
        let pushed = match placed {
            Some(_) => deframer.push_placed(&scratch[..n], &mut messages, &mut starts),
            None => deframer.push(&scratch[..n], &mut messages),
        };
        let at = |i: usize| starts.get(i).copied().unwrap_or(0);
        if let Err(e) = pushed {
            // Send what was complete, then stop: past a framing error the
            // stream cannot be trusted to be in step.
            let events = messages
                .drain(..)
                .enumerate()
                .map(|(i, m)| event(m, &meta, at(i)))
                .collect();
            let _ = tx.blocking_send(Chunk::Lines(events, deframer.consumed()));
            let _ = tx.blocking_send(Chunk::Failed(std::io::Error::other(e)));
            return;
        }
        if deframer.cut > cut_before {
            warn_long(&mut warned_long, what, max_line);
        }
        if messages.is_empty() {
            continue;
        }
        let events: Vec<Event> = messages
            .drain(..)
            .enumerate()
            .map(|(i, m)| event(m, &meta, at(i)))
            .collect();
        if tx
            .blocking_send(Chunk::Lines(events, deframer.consumed()))
            .is_err()
        {
            return;
        }
    }
}

fn warn_long(warned: &mut bool, what: &str, max: usize) {
    if !*warned {
        *warned = true;
        tracing::warn!(
            "{what}: a line is longer than max_line_bytes ({max}); it is split into pieces (further occurrences not logged)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::{CancellationToken, Output, OutputRole, StageMetrics, channel};

    /// Hands out its reads one at a time, as given (an error of the kind
    /// given where the list has one), then the end of the stream.
    struct Reads(std::collections::VecDeque<Result<&'static str, std::io::ErrorKind>>);

    impl Read for Reads {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            match self.0.pop_front() {
                None => Ok(0),
                Some(Err(kind)) => Err(kind.into()),
                Some(Ok(text)) => {
                    buf[..text.len()].copy_from_slice(text.as_bytes());
                    Ok(text.len())
                }
            }
        }
    }

    const INTERRUPTED: Result<&str, std::io::ErrorKind> = Err(std::io::ErrorKind::Interrupted);

    /// Remembers every offset saved.
    struct Saved(Arc<Mutex<Vec<u64>>>);

    impl PositionStore for Saved {
        fn save(&mut self, offset: u64) -> std::io::Result<()> {
            self.0.lock().unwrap().push(offset);
            Ok(())
        }
        fn describe(&self) -> String {
            "test".into()
        }
    }

    fn options() -> LineReaderOptions {
        LineReaderOptions {
            max_line_bytes: 100,
            framing: Framing::Newline,
            origin: None,
            stream: None,
        }
    }

    fn context(capacity: usize) -> (SourceContext, logbus_plugin_api::Receiver) {
        let (tx, rx) = channel(capacity);
        let cx = SourceContext {
            id: "r".into(),
            output: Output::new(
                vec![tx],
                Arc::new(StageMetrics::default()),
                OutputRole::Main,
            ),
            shutdown: CancellationToken::new(),
        };
        (cx, rx)
    }

    /// A read interrupted by a signal is tried again, not an error.
    #[tokio::test]
    async fn an_interrupted_read_is_retried() {
        let (cx, mut rx) = context(10);
        let reads = Reads([INTERRUPTED, Ok("a\nb"), INTERRUPTED, Ok("\n")].into());
        let task = tokio::spawn(run_line_source(reads, "test".into(), options(), cx, None));
        let got = logbus_plugin_api::testing::take_text(&mut rx, 2).await;
        assert_eq!(got, ["a", "b"]);
        task.await.unwrap().unwrap();
    }

    /// A read takes up to `READ_CHUNK` bytes: with the input all there,
    /// the first batch holds the lines of one full read (the channel holds
    /// exactly that many, so nothing joins them before they are taken).
    #[tokio::test]
    async fn a_read_is_a_chunk_of_read_chunk_bytes() {
        let (cx, mut rx) = context(READ_CHUNK / 16);
        let input: Vec<u8> = b"0123456789abcde\n".repeat(3 * READ_CHUNK / 16);
        let reader = std::io::Cursor::new(input);
        let task = tokio::spawn(run_line_source(reader, "test".into(), options(), cx, None));
        let first = rx.recv().await.unwrap();
        assert_eq!(first.len(), READ_CHUNK / 16);
        assert_eq!(READ_CHUNK, 128 * 1024);
        drop(first);
        while rx.recv().await.is_some() {}
        task.await.unwrap().unwrap();
    }

    /// Any other read error ends the source with an error naming what it
    /// read, after the lines read before it.
    #[tokio::test]
    async fn a_read_error_ends_the_source_naming_the_input() {
        let (cx, mut rx) = context(10);
        let reads = Reads(
            [
                Ok("a\n"),
                Err(std::io::ErrorKind::PermissionDenied),
                Ok("b\n"),
            ]
            .into(),
        );
        let task = tokio::spawn(run_line_source(reads, "test".into(), options(), cx, None));
        assert_eq!(
            logbus_plugin_api::testing::take_text(&mut rx, 1).await,
            ["a"]
        );
        let error = task.await.unwrap().unwrap_err().to_string();
        assert!(error.starts_with("reading test:"), "{error}");
        assert!(rx.recv().await.is_none(), "nothing after the error");
    }

    /// With `save_every` passed, the position is saved while reading, as
    /// soon as a batch is finished, not only at the end. The channel holds
    /// one event, so each send waits for the one before to be finished.
    #[tokio::test]
    async fn the_position_is_saved_while_reading_when_due() {
        let (cx, mut rx) = context(1);
        let saved = Arc::new(Mutex::new(Vec::new()));
        let positions = Positions {
            start: 10,
            store: Box::new(Saved(saved.clone())),
            save_every: Duration::ZERO,
        };
        let reads = Reads([Ok("a\n"), Ok("bb\n"), Ok("ccc\n")].into());
        let task = tokio::spawn(run_line_source(
            reads,
            "test".into(),
            options(),
            cx,
            Some(positions),
        ));
        for _ in 0..3 {
            let mut batch = rx.recv().await.unwrap();
            batch.settle(logbus_plugin_api::Outcome::Delivered);
        }
        task.await.unwrap().unwrap();
        let saved = saved.lock().unwrap().clone();
        // Offsets count from `start`; each finished line is saved once it
        // is finished and due, the last at the end.
        assert_eq!(saved.last(), Some(&19));
        assert!(saved.contains(&12) && saved.contains(&15), "{saved:?}");
    }
}
