//! `source: journald` — the systemd journal through `journalctl -o export`
//! (the journal's own stable serialization: no C library to link, and the
//! same code reads the live journal, a directory of journal files, or
//! files copied from another machine). Each entry becomes an event whose
//! fields are the journal's (`MESSAGE`, `PRIORITY`, `_SYSTEMD_UNIT`, ...).
//!
//! Each batch of entries carries an acknowledgement; the saved cursor is
//! that of the newest batch such that it and every batch before it were
//! finished by the sinks (an `OrderedCheckpoint`), so a restart, even
//! after `kill -9`, continues after what was delivered: entries in flight
//! are read again, none is skipped. Backpressure: journalctl's output is
//! not read while the pipeline is full.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use logbus_plugin_api::{
    BatchAck, BuildContext, CheckOptions, Event, Fields, Meta, OptionError, OrderedCheckpoint,
    Output, Position, Source, SourceContext, StageError, StageKind, StageMetrics, TypedPlugin,
    async_trait,
};

/// Batches sent and not yet finished, by the cursor of their last entry.
type Acks = Arc<Mutex<OrderedCheckpoint<Option<String>>>>;

/// The most entries sent as one batch.
const MAX_BATCH: usize = 512;

/// How long a stopping source waits for its last batches to be finished.
const FINAL_ACK_WAIT: Duration = Duration::from_secs(30);

fn lock(acks: &Acks) -> std::sync::MutexGuard<'_, OrderedCheckpoint<Option<String>>> {
    acks.lock().unwrap_or_else(|p| p.into_inner())
}

/// The cursor that is safe to save, and the acknowledgement counters for
/// the metrics.
fn committed_cursor(acks: &Acks, metrics: &StageMetrics) -> Option<String> {
    let acks = lock(acks);
    let oldest = acks
        .oldest_open()
        .map(|opened| std::time::SystemTime::now() - opened.elapsed());
    metrics.set_acks(acks.counts(), oldest);
    acks.committed().cloned().flatten()
}
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ReadFrom {
    /// With no saved cursor: the whole journal.
    #[default]
    Beginning,
    /// With no saved cursor: only entries from now on.
    End,
}

/// Options of `source: journald`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JournaldOptions {
    /// Only these units (`journalctl --unit`).
    #[serde(default)]
    pub units: Vec<String>,
    /// Only entries at this priority or more urgent: `emerg` … `debug`, or
    /// 0–7 (`journalctl --priority=N`).
    #[serde(default)]
    pub priority: Option<String>,
    /// Read this directory of journal files instead of the system journal.
    #[serde(default)]
    pub directory: Option<PathBuf>,
    /// Or these journal files.
    #[serde(default)]
    pub files: Vec<PathBuf>,
    /// Where the cursor is saved (`<state_dir>/<stage id>.journald.cursor`).
    pub state_dir: PathBuf,
    #[serde(default)]
    pub read_from: ReadFrom,
    /// Keep following new entries (default), or stop at the end.
    #[serde(default = "yes")]
    pub follow: bool,
    /// The `journalctl` to run.
    #[serde(default = "default_journalctl")]
    pub journalctl: PathBuf,
    /// How often the cursor is saved (and always at the end).
    #[serde(default = "default_checkpoint")]
    #[schemars(range(min = 10))]
    pub checkpoint_interval_ms: u64,
}

fn yes() -> bool {
    true
}
fn default_journalctl() -> PathBuf {
    "journalctl".into()
}
fn default_checkpoint() -> u64 {
    1000
}

const PRIORITIES: [&str; 8] = [
    "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
];

impl CheckOptions for JournaldOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if let Some(p) = &self.priority
            && !PRIORITIES.contains(&p.as_str())
            && !p.parse::<u8>().is_ok_and(|n| n <= 7)
        {
            errors.push(OptionError::at(
                &["priority"],
                format!("`{p}` is not a priority: emerg, alert, crit, err, warning, notice, info, debug or 0-7"),
            ));
        }
        if self.directory.is_some() && !self.files.is_empty() {
            errors.push(OptionError::at(
                &["files"],
                "give `directory` or `files`, not both",
            ));
        }
        if self.state_dir.as_os_str().is_empty() {
            errors.push(OptionError::at(&["state_dir"], "must not be empty"));
        }
        for u in &self.units {
            if u.is_empty() || u.starts_with('-') {
                errors.push(OptionError::at(
                    &["units"],
                    format!("`{u}` is not a unit name"),
                ));
            }
        }
        errors
    }
}

pub struct Journald;

impl TypedPlugin for Journald {
    type Options = JournaldOptions;
    const NAME: &'static str = "journald";
    const KIND: StageKind = StageKind::Source;

    type Stage = Box<dyn Source>;
    const ACKNOWLEDGEMENTS: Option<&'static str> = Some(
        "end to end: the saved cursor never passes an entry the sinks have not confirmed, so a restart re-sends, never skips",
    );
    const DESCRIPTION: &'static str = "The systemd journal (or journal files) via `journalctl -o export`, with unit and priority filters and a saved cursor.";

    /// `journalctl` must be there; `state_dir` is made at start.
    fn host_needs(
        &self,
        o: &JournaldOptions,
        cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        use logbus_plugin_api::{HostNeed, StatedNeed};
        vec![
            StatedNeed::new(
                HostNeed::Program {
                    name: "journalctl".into(),
                },
                &[],
            ),
            StatedNeed::new(
                HostNeed::WriteDir {
                    path: cx.resolve(&o.state_dir),
                    create: true,
                },
                &["state_dir"],
            ),
        ]
    }

    /// Journal entries: parsed, with whatever fields each entry has.
    /// The saved cursor never passes an unfinished entry: a crash re-reads.
    fn flow(&self, _o: &JournaldOptions) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::open_fields(&[]).then(logbus_plugin_api::Step::Replay(
            logbus_plugin_api::Replay {
                rereads: true,
                positions: true,
            },
        ))
    }

    fn build(&self, o: JournaldOptions, cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        let state = cx
            .resolve(&o.state_dir)
            .join(format!("{}.journald.cursor", cx.stage_id));
        let directory = o.directory.as_ref().map(|d| cx.resolve(d));
        let files = o.files.iter().map(|f| cx.resolve(f)).collect();
        Ok(Box::new(Reader {
            options: o,
            state,
            directory,
            files,
        }))
    }
}

struct Reader {
    options: JournaldOptions,
    state: PathBuf,
    directory: Option<PathBuf>,
    files: Vec<PathBuf>,
}

#[async_trait]
impl Source for Reader {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        let o = &self.options;
        if let Some(dir) = self.state.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| StageError::io(format!("creating {}", dir.display()), e))?;
        }
        let cursor = std::fs::read_to_string(&self.state)
            .ok()
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty());
        let mut command = tokio::process::Command::new(&o.journalctl);
        command.args(["--output=export", "--no-pager", "--quiet"]);
        if o.follow {
            command.arg("--follow");
        }
        match &cursor {
            Some(c) => {
                command.arg(format!("--after-cursor={c}"));
            }
            None if o.read_from == ReadFrom::End => {
                command.arg("--lines=0");
            }
            None if o.follow => {
                // `--follow` alone starts with the last 10 entries.
                command.arg("--lines=all");
            }
            None => {}
        }
        for u in &o.units {
            command.arg(format!("--unit={u}"));
        }
        if let Some(p) = &o.priority {
            // One level means "this or more urgent".
            command.arg(format!("--priority={p}"));
        }
        if let Some(d) = &self.directory {
            command.arg(format!("--directory={}", d.display()));
        }
        for f in &self.files {
            command.arg(format!("--file={}", f.display()));
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .map_err(|e| StageError::io(format!("starting {}", o.journalctl.display()), e))?;
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        // journalctl's complaints are logged as they come; the last one
        // names why it stopped, should it stop by itself.
        let complaints = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut last = None;
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::warn!("journalctl: {line}");
                last = Some(line);
            }
            last
        });
        let mut reader = Entries::new(BufReader::with_capacity(256 * 1024, stdout));
        let acks: Acks = Arc::default();
        let metrics = cx.output.metrics().clone();
        let mut saved: Option<String> = None;
        let mut saved_at = Instant::now();
        let every = Duration::from_millis(o.checkpoint_interval_ms);
        // Whether journalctl's output ended (it exited, or closed it) rather
        // than this source stopping reading it.
        let mut output_ended = false;
        let result = loop {
            let batch = tokio::select! {
                _ = cx.shutdown.cancelled() => break Ok(()),
                b = reader.next_batch() => b,
            };
            let batch = match batch {
                Ok(Some(batch)) => batch,
                Ok(None) => {
                    output_ended = true;
                    break Ok(());
                }
                Err(e) => break Err(StageError::io("reading journalctl output", e)),
            };
            let cursor = batch
                .last()
                .and_then(|f| f.get("__CURSOR"))
                .and_then(|v| v.as_str())
                .map(str::to_owned);
            if !send(&cx.output, batch, &cx.id, cursor, &acks).await {
                break Ok(());
            }
            if saved_at.elapsed() >= every {
                self.save(committed_cursor(&acks, &metrics), &mut saved);
                saved_at = Instant::now();
            }
        };
        // Let downstream drain (its input ends once this output is gone),
        // then save the cursor of what it finished.
        drop(cx.output);
        // An errored batch holds the cursor for this run: waiting longer
        // cannot move it.
        let deadline = Instant::now() + FINAL_ACK_WAIT;
        while lock(&acks).worth_waiting() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let open = lock(&acks).outstanding();
        if open > 0 {
            tracing::warn!(
                stage = %cx.id,
                "{open} batches of journal entries were not finished; a restart reads them again"
            );
        }
        self.save(committed_cursor(&acks, &metrics), &mut saved);
        if !output_ended {
            let _ = child.start_kill();
        }
        let status = child.wait().await;
        let last_complaint = complaints.await.ok().flatten();
        // journalctl stopping by itself with a failure (a cursor it cannot
        // seek to, a directory it cannot read) fails the stage, following
        // or not; one this source stopped is not asked.
        if output_ended
            && result.is_ok()
            && let Ok(status) = status
            && !status.success()
        {
            return Err(StageError::Other(format!(
                "{} exited with {status}{}",
                o.journalctl.display(),
                last_complaint.map(|l| format!(": {l}")).unwrap_or_default()
            )));
        }
        result
    }
}

/// Sends one batch with its acknowledgement, registered under the cursor
/// of its last entry.
async fn send(
    output: &Output,
    batch: Vec<Fields>,
    source: &Arc<str>,
    cursor: Option<String>,
    acks: &Acks,
) -> bool {
    let meta = Meta::now(source.clone());
    let token = lock(acks).begin(cursor, batch.len() as u64);
    let ack = BatchAck::new(acks.clone(), token);
    let events = batch
        .into_iter()
        .map(|f| {
            let mut meta = meta.clone();
            meta.position = f
                .get("__CURSOR")
                .and_then(|c| c.as_str())
                .and_then(position_of);
            Event::fields(f, meta).with_ack(ack.handle())
        })
        .collect();
    drop(ack);
    output.send(events).await.is_ok()
}

/// An entry's position, from its cursor (`s=<seqnum id>;i=<seqnum>;…`):
/// the journal's sequence-number id names the stream (the numbering a
/// journald instance keeps across its files), the entry's sequence number
/// (hex in the cursor) is the offset. Reading the same journal again gives
/// the same cursors, so the same positions.
fn position_of(cursor: &str) -> Option<Position> {
    let (mut seqnum_id, mut seqnum) = (None, None);
    for part in cursor.split(';') {
        if let Some(id) = part.strip_prefix("s=") {
            seqnum_id = Some(id);
        } else if let Some(n) = part.strip_prefix("i=") {
            seqnum = u64::from_str_radix(n, 16).ok();
        }
    }
    Some(Position::new(
        Position::stream_of(&[b"journald", seqnum_id?.as_bytes()]),
        seqnum?,
    ))
}

impl Reader {
    /// Saves `cursor` if it moved since the last save.
    fn save(&self, cursor: Option<String>, saved: &mut Option<String>) {
        let Some(c) = cursor else { return };
        if saved.as_ref() == Some(&c) {
            return;
        }
        match logbus_plugin_api::state::replace_file(&self.state, c.as_bytes()) {
            Ok(()) => *saved = Some(c),
            Err(e) => {
                tracing::warn!("saving the journal cursor to {}: {e}", self.state.display());
            }
        }
    }
}

/// The journal export format: `KEY=value` lines, binary fields as `KEY`,
/// a little-endian u64 length, the bytes and a newline; entries end with
/// an empty line.
struct Entries<R> {
    reader: BufReader<R>,
}

impl<R: tokio::io::AsyncRead + Unpin> Entries<R> {
    fn new(reader: BufReader<R>) -> Self {
        Entries { reader }
    }

    /// The next entry and those already read behind it, at most
    /// [`MAX_BATCH`]; `None` once the output has ended.
    async fn next_batch(&mut self) -> std::io::Result<Option<Vec<Fields>>> {
        let Some(first) = self.next().await? else {
            return Ok(None);
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH && !self.reader.buffer().is_empty() {
            match self.next().await? {
                Some(fields) => batch.push(fields),
                None => break,
            }
        }
        Ok(Some(batch))
    }

    async fn next(&mut self) -> std::io::Result<Option<Fields>> {
        let mut fields = Fields::new();
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = self.reader.read_until(b'\n', &mut line).await?;
            if n == 0 {
                return Ok((!fields.is_empty()).then_some(fields));
            }
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            if line.is_empty() {
                if fields.is_empty() {
                    continue;
                }
                return Ok(Some(fields));
            }
            match line.iter().position(|&b| b == b'=') {
                Some(eq) => {
                    let key = String::from_utf8_lossy(&line[..eq]).into_owned();
                    let value = String::from_utf8_lossy(&line[eq + 1..]).into_owned();
                    fields.insert(key, value.into());
                }
                None => {
                    // A binary field: the length, the data, a newline.
                    let key = String::from_utf8_lossy(&line).into_owned();
                    let len = self.reader.read_u64_le().await? as usize;
                    if len > 64 << 20 {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("field {key} claims {len} bytes"),
                        ));
                    }
                    let mut data = vec![0u8; len + 1];
                    self.reader.read_exact(&mut data).await?;
                    data.pop();
                    fields.insert(key, String::from_utf8_lossy(&data).into_owned().into());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(export: &[u8]) -> Entries<&[u8]> {
        Entries::new(BufReader::with_capacity(256 * 1024, export))
    }

    fn message(f: &Fields) -> &str {
        f["MESSAGE"].as_str().unwrap()
    }

    /// A cursor as journalctl writes it names the entry: its numbering
    /// (the `s=` id) and its sequence number (`i=`, hex); a cursor
    /// without either names nothing.
    #[test]
    fn an_entry_is_placed_by_its_cursor() {
        let cursor = "s=8a9d3d7b0a5c4b8e9f1e2d3c4b5a6978;i=1f4;b=0c3f1a2b3c4d5e6f708192a3b4c5d6e7;m=5f5e100;t=5f7a1c2d3e4f5;x=6c1f2e3d4c5b6a79";
        let p = position_of(cursor).unwrap();
        assert_eq!(p.offset, 0x1f4);
        assert_eq!(p.part, 0);
        let other_numbering = cursor.replace("s=8a9d", "s=0000");
        assert_ne!(position_of(&other_numbering).unwrap().stream, p.stream);
        let next = cursor.replace("i=1f4", "i=1f5");
        assert_eq!(position_of(&next).unwrap(), Position { offset: 0x1f5, ..p });
        assert_eq!(position_of("i=1f4;b=x"), None);
        assert_eq!(position_of("s=ab;b=x"), None);
        assert_eq!(position_of("s=ab;i=zz"), None);
    }

    #[tokio::test]
    async fn entries_already_read_make_batches_of_at_most_512() {
        let export: String = (0..1500)
            .map(|i| format!("__CURSOR=s={i}\nMESSAGE=entry {i}\n\n"))
            .collect();
        assert!(export.len() < 256 * 1024, "all of it is read at once");
        let mut reader = entries(export.as_bytes());
        let mut sizes = Vec::new();
        let mut next = 0;
        while let Some(batch) = reader.next_batch().await.unwrap() {
            sizes.push(batch.len());
            for f in &batch {
                assert_eq!(message(f), format!("entry {next}"));
                next += 1;
            }
        }
        assert_eq!(sizes, [512, 512, 476]);
        assert!(reader.next_batch().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn binary_fields_blank_lines_and_a_last_entry_without_its_blank_line() {
        let mut export = b"\n\nMESSAGE=first\nA=b=c\n\n\n".to_vec();
        export.extend_from_slice(b"MESSAGE\n");
        export.extend_from_slice(&5u64.to_le_bytes());
        export.extend_from_slice(b"two\nx\nEMPTY=\n\n");
        export.extend_from_slice(b"MESSAGE=\xffthird");
        let mut reader = entries(&export);
        let batch = reader.next_batch().await.unwrap().unwrap();
        assert_eq!(batch.len(), 3);
        assert_eq!(message(&batch[0]), "first");
        // Only the first `=` separates the key.
        assert_eq!(batch[0]["A"], "b=c");
        assert_eq!(batch[0].len(), 2);
        assert_eq!(message(&batch[1]), "two\nx");
        assert_eq!(batch[1]["EMPTY"], "");
        // Not UTF-8: kept, with the replacement character.
        assert_eq!(message(&batch[2]), "\u{fffd}third");
        assert!(reader.next_batch().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_binary_field_longer_than_64_mib_or_cut_short_is_an_error() {
        let field = |len: u64, data: &[u8]| {
            let mut export = b"MESSAGE=ok\n\nDATA\n".to_vec();
            export.extend_from_slice(&len.to_le_bytes());
            export.extend_from_slice(data);
            export
        };
        // The limit itself is allowed (cut short here, so: unexpected end).
        let at_limit = field(64 << 20, b"abc");
        let mut reader = entries(&at_limit);
        let err = reader.next_batch().await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");
        let over = field((64 << 20) + 1, b"abc");
        let err = entries(&over).next_batch().await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(err.to_string(), "field DATA claims 67108865 bytes");
    }
}
