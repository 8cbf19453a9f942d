//! `source: file` (read one file to EOF, resuming where it stopped when it
//! has a state directory) and `sink: file` (append lines). Following
//! growing files, globs and rotation belong to `tail`.

use std::fs::{File, OpenOptions};
use std::io::BufWriter;
use std::path::PathBuf;
use std::sync::Arc;

use logbus_compress::{CompressWriter, Compression, ReadCompression};
use logbus_plugin_api::{
    BuildContext, CheckOptions, OptionError, Sink, SinkContext, Source, SourceContext, StageError,
    StageKind, TypedPlugin, async_trait,
};
use serde::Deserialize;

use crate::file_set::{FileSet, FileSetOptions, PathTemplate, run_file_set};
use crate::line_reader::{LineReaderOptions, PositionStore, Positions, run_line_source};
use crate::stdio::default_max_line;
use crate::writer_sink::run_writer;

/// Options of `source: file`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileSourceOptions {
    /// File to read; relative paths resolve against the pipeline file's directory.
    pub path: PathBuf,
    /// Lines longer than this many bytes are split into pieces.
    #[serde(default = "default_max_line")]
    #[schemars(range(min = 1))]
    pub max_line_bytes: usize,
    /// `auto` (default): detect gzip, zlib, lz4, snappy or zstd by the
    /// file's first bytes, else plain; or name the format.
    #[serde(default)]
    pub compression: ReadCompression,
    /// How messages are delimited: `newline` (default), `octet-counting`
    /// (RFC 6587: `LEN SP MSG`), `length-prefixed` (4-byte big-endian),
    /// `whole` (the whole input is one event, up to `max_line_bytes`).
    #[serde(default)]
    pub framing: logbus_framing::Framing,
    /// Directory where the read position is saved (`<stage>.file.json`),
    /// made at start if missing.
    /// With it, each line is acknowledged: the saved position never passes
    /// a line the sinks have not confirmed, and a restart resumes there (a
    /// file read to the end reads only what was appended since). Without
    /// it, every run reads the whole file.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// How often the position is saved (and always at the end).
    #[serde(default = "default_checkpoint_interval")]
    #[schemars(range(min = 10, max = 600000))]
    pub checkpoint_interval_ms: u64,
}

fn default_checkpoint_interval() -> u64 {
    1000
}

impl CheckOptions for FileSourceOptions {
    fn check(&self) -> Vec<OptionError> {
        // The ranges of `max_line_bytes` and `checkpoint_interval_ms` are
        // in the schema, checked for every plugin alike.
        let mut errors = Vec::new();
        if self.path.as_os_str().is_empty() {
            errors.push(OptionError::at(&["path"], "must not be empty"));
        }
        if self
            .state_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            errors.push(OptionError::at(&["state_dir"], "must not be empty"));
        }
        errors
    }
}

pub struct FileSource;

impl TypedPlugin for FileSource {
    type Options = FileSourceOptions;
    const NAME: &'static str = "file";
    const KIND: StageKind = StageKind::Source;

    type Stage = Box<dyn Source>;
    const ACKNOWLEDGEMENTS: Option<&'static str> = Some(
        "with state_dir: the saved read position never passes a line the sinks have not confirmed, so a restart re-sends, never skips (without it, every run reads the whole file)",
    );
    const DESCRIPTION: &'static str =
        "Reads one file to EOF, one event per line; with state_dir, resumes where it stopped.";

    /// The file must be readable; `state_dir` is made at start.
    fn host_needs(
        &self,
        o: &FileSourceOptions,
        cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        use logbus_plugin_api::{HostNeed, StatedNeed};
        let mut needs = vec![StatedNeed::new(
            HostNeed::ReadFile {
                path: cx.resolve(&o.path),
            },
            &["path"],
        )];
        if let Some(dir) = &o.state_dir {
            needs.push(StatedNeed::new(
                HostNeed::WriteDir {
                    path: cx.resolve(dir),
                    create: true,
                },
                &["state_dir"],
            ));
        }
        needs
    }

    /// Raw events (one per line or message); a `codec:` parses them.
    /// A crash re-reads: from the saved position with `state_dir`, the
    /// whole file without; each message's offset in the (decompressed)
    /// stream is its position.
    fn flow(&self, _options: &FileSourceOptions) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::raw().then(logbus_plugin_api::Step::Replay(
            logbus_plugin_api::Replay {
                rereads: true,
                positions: true,
            },
        ))
    }

    fn build(
        &self,
        options: FileSourceOptions,
        cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(FileReader {
            path: cx.resolve(&options.path),
            max_line_bytes: options.max_line_bytes,
            compression: options.compression,
            framing: options.framing,
            state_dir: options.state_dir.map(|d| cx.resolve(&d)),
            save_every: std::time::Duration::from_millis(options.checkpoint_interval_ms),
        }))
    }
}

struct FileReader {
    path: PathBuf,
    max_line_bytes: usize,
    compression: ReadCompression,
    framing: logbus_framing::Framing,
    state_dir: Option<PathBuf>,
    save_every: std::time::Duration,
}

#[async_trait]
impl Source for FileReader {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        let what = self.path.display().to_string();
        let open = || -> Result<_, StageError> {
            let file =
                File::open(&self.path).map_err(|e| StageError::io(format!("opening {what}"), e))?;
            logbus_compress::open(file, self.compression)
                .map_err(|e| StageError::io(format!("reading {what}"), e))
        };
        let opts = LineReaderOptions {
            max_line_bytes: self.max_line_bytes,
            framing: self.framing,
            origin: Some(Arc::from(what.as_str())),
            stream: None,
        };
        let Some(dir) = &self.state_dir else {
            // Every run reads the whole file: the file as it is now names
            // the events (unreadable here: the open below says why).
            let opts = LineReaderOptions {
                stream: FileIdentity::of(&self.path).ok().map(|f| f.stream()),
                ..opts
            };
            return run_line_source(open()?, what, opts, cx, None).await;
        };
        let identity = FileIdentity::of(&self.path)
            .map_err(|e| StageError::io(format!("opening {what}"), e))?;
        // Made here, as `source: tail` does: a missing folder would fail
        // every save with only a warning, and a restart would read the
        // whole file again.
        std::fs::create_dir_all(dir)
            .map_err(|e| StageError::io(format!("creating state_dir {}", dir.display()), e))?;
        let mut state = ReadPosition::new(dir, &cx.id, identity, &what);
        let saved = state.load();
        // The identity the file was first seen with names its events in
        // every run (it is saved at once, before a crash can come).
        let opts = LineReaderOptions {
            stream: Some(state.file.stream()),
            ..opts
        };
        let mut reader = open()?;
        let mut start = 0;
        if saved > 0 {
            // Offsets count the decompressed stream: skip what was read.
            let skipped = std::io::copy(
                &mut std::io::Read::take(&mut reader, saved),
                &mut std::io::sink(),
            )
            .map_err(|e| StageError::io(format!("reading {what}"), e))?;
            if skipped == saved {
                start = saved;
                tracing::info!(stage = %cx.id, "{what}: resuming at byte {saved}");
            } else {
                tracing::warn!(
                    stage = %cx.id,
                    "{what} is shorter ({skipped} bytes) than the saved position ({saved}); reading it from the start"
                );
                reader = open()?;
            }
        }
        if let Err(e) = state.save(start) {
            tracing::warn!(stage = %cx.id, "saving the read position to {}: {e}", state.describe());
        }
        let positions = Positions {
            start,
            store: Box::new(state),
            save_every: self.save_every,
        };
        run_line_source(reader, what, opts, cx, Some(positions)).await
    }
}

/// What tells a file from another at the same path: device, inode, and a
/// hash of its first bytes (an inode can be reused).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
struct FileIdentity {
    dev: u64,
    ino: u64,
    fingerprint: u64,
    fingerprint_len: u64,
}

/// Bytes hashed into a file's fingerprint (fewer if the file is shorter).
const FINGERPRINT_BYTES: u64 = 1024;

impl FileIdentity {
    fn of(path: &std::path::Path) -> std::io::Result<FileIdentity> {
        use std::hash::Hasher;
        use std::os::unix::fs::{FileExt, MetadataExt};
        let file = File::open(path)?;
        let meta = file.metadata()?;
        let len = meta.len().min(FINGERPRINT_BYTES);
        let mut head = vec![0u8; len as usize];
        file.read_exact_at(&mut head, 0)?;
        // SipHash with fixed keys: stable across runs.
        let mut h = std::hash::DefaultHasher::new();
        h.write(&head);
        Ok(FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            fingerprint: h.finish(),
            fingerprint_len: len,
        })
    }

    /// The file's name in its events' positions.
    fn stream(&self) -> u64 {
        logbus_plugin_api::Position::stream_of(&[
            &self.dev.to_le_bytes(),
            &self.ino.to_le_bytes(),
            &self.fingerprint.to_le_bytes(),
            &self.fingerprint_len.to_le_bytes(),
        ])
    }

    /// Whether `saved` (taken earlier) is this file: same inode and the
    /// same first bytes as far as `saved` hashed them.
    fn is(&self, saved: &FileIdentity, path: &std::path::Path) -> bool {
        if (self.dev, self.ino) != (saved.dev, saved.ino)
            || self.fingerprint_len < saved.fingerprint_len
        {
            return false;
        }
        if self.fingerprint_len == saved.fingerprint_len {
            return self.fingerprint == saved.fingerprint;
        }
        // The file grew since: hash the same prefix again.
        use std::hash::Hasher;
        use std::os::unix::fs::FileExt;
        let mut head = vec![0u8; saved.fingerprint_len as usize];
        let Ok(file) = File::open(path) else {
            return false;
        };
        if file.read_exact_at(&mut head, 0).is_err() {
            return false;
        }
        let mut h = std::hash::DefaultHasher::new();
        h.write(&head);
        h.finish() == saved.fingerprint
    }
}

#[derive(serde::Serialize, Deserialize)]
struct SavedPosition {
    version: u32,
    path: String,
    file: FileIdentity,
    /// Bytes of the (decompressed) stream whose messages are finished.
    offset: u64,
}

/// The state file of one `source: file` stage.
struct ReadPosition {
    state: PathBuf,
    file: FileIdentity,
    path: String,
    last: Option<u64>,
}

impl ReadPosition {
    fn new(dir: &std::path::Path, stage: &str, file: FileIdentity, path: &str) -> ReadPosition {
        ReadPosition {
            state: dir.join(format!("{stage}.file.json")),
            file,
            path: path.to_owned(),
            last: None,
        }
    }

    /// The saved offset if it belongs to this file; 0 otherwise. A missing
    /// state file is a first start; an unreadable or damaged one is
    /// reported and read as a first start (duplicates, never gaps).
    /// The saved offset, if it was saved for this file (0 otherwise); the
    /// file keeps the identity it was first saved with, which names its
    /// events in every run however it grows.
    fn load(&mut self) -> u64 {
        let text = match std::fs::read(&self.state) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
            Err(e) => {
                tracing::warn!(
                    "cannot read {}: {e}; reading {} from the start",
                    self.state.display(),
                    self.path
                );
                return 0;
            }
        };
        match serde_json::from_slice::<SavedPosition>(&text) {
            Ok(saved) if self.file.is(&saved.file, std::path::Path::new(&self.path)) => {
                self.file = saved.file;
                saved.offset
            }
            Ok(saved) => {
                tracing::info!(
                    "{} is not the file {} was saved for ({}); reading it from the start",
                    self.path,
                    self.state.display(),
                    saved.path
                );
                0
            }
            Err(e) => {
                tracing::warn!(
                    "{} is damaged ({e}); reading {} from the start",
                    self.state.display(),
                    self.path
                );
                0
            }
        }
    }
}

impl PositionStore for ReadPosition {
    fn save(&mut self, offset: u64) -> std::io::Result<()> {
        if self.last == Some(offset) {
            return Ok(());
        }
        let body = serde_json::to_vec_pretty(&SavedPosition {
            version: 1,
            path: self.path.clone(),
            file: self.file.clone(),
            offset,
        })
        .expect("a position serializes");
        logbus_plugin_api::state::replace_file(&self.state, &body)?;
        self.last = Some(offset);
        Ok(())
    }

    fn describe(&self) -> String {
        self.state.display().to_string()
    }
}

/// Options of `sink: file`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileSinkOptions {
    /// File to write; relative paths resolve against the pipeline file's directory.
    pub path: PathBuf,
    /// Append to an existing file (true) or truncate it first (false).
    #[serde(default = "yes")]
    pub append: bool,
    /// Create missing parent directories.
    #[serde(default)]
    pub create_dirs: bool,
    /// fsync after every write, so committed means on disk.
    #[serde(default)]
    pub sync: bool,
    /// `none` (default), `gzip`, `deflate` (zlib), `lz4`, `snappy` or
    /// `zstd`: the file is one compressed stream, flushed at every write
    /// (so committed events can be read back even after a crash).
    #[serde(default)]
    pub compression: Compression,
    /// How each event is delimited: `newline` (default), `octet-counting`
    /// or `length-prefixed`.
    #[serde(default)]
    pub framing: logbus_framing::Framing,
    /// Rotate a file once it holds this many bytes: `path` becomes
    /// `path.1` (older ones shift up) and a new `path` is started.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub rotate_bytes: Option<u64>,
    /// Rotated files kept (`path.1` … `path.N`); older ones are deleted.
    #[serde(default = "default_rotate_keep")]
    #[schemars(range(max = 1000))]
    pub rotate_keep: usize,
    /// With a path template: files kept open at once (the least recently
    /// written is closed first).
    #[serde(default = "default_max_open")]
    #[schemars(range(min = 1, max = 65536))]
    pub max_open_files: usize,
}

fn yes() -> bool {
    true
}
pub(crate) fn default_rotate_keep() -> usize {
    5
}
pub(crate) fn default_max_open() -> usize {
    64
}

impl CheckOptions for FileSinkOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if self.path.as_os_str().is_empty() {
            errors.push(OptionError::at(&["path"], "must not be empty"));
        } else if let Err(e) = PathTemplate::parse(&self.path.to_string_lossy()) {
            errors.push(OptionError::at(&["path"], e));
        }
        errors
    }
}

pub struct FileSink;

impl TypedPlugin for FileSink {
    type Options = FileSinkOptions;
    const NAME: &'static str = "file";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "Appends each event as a line to a file: raw events as they are, parsed events as JSON; path templates from fields and time, size rotation.";

    /// The directory every rendered path lies in, and the files it keeps
    /// open at once.
    fn host_needs(
        &self,
        o: &FileSinkOptions,
        cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        use logbus_plugin_api::{HostNeed, StatedNeed};
        let dir = logbus_plugin_api::host::fixed_dir(&o.path.to_string_lossy());
        vec![
            StatedNeed::new(
                HostNeed::WriteDir {
                    path: cx.resolve(&dir),
                    // Templated folders are made as events need them.
                    create: o.create_dirs || template_has_dirs(&o.path),
                },
                &["path"],
            ),
            StatedNeed::new(
                HostNeed::OpenFiles {
                    count: o.max_open_files as u64,
                },
                &["max_open_files"],
            ),
        ]
    }

    /// The path template's fields.
    fn flow(&self, o: &FileSinkOptions) -> logbus_plugin_api::Flow {
        logbus_plugin_api::flow::template_reads(&o.path.to_string_lossy(), &["path"])
            .into_iter()
            .fold(
                logbus_plugin_api::Flow::pass(),
                logbus_plugin_api::Flow::read,
            )
    }

    fn build(
        &self,
        options: FileSinkOptions,
        cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let template = PathTemplate::parse(&options.path.to_string_lossy())
            .map_err(|e| OptionError::at(&["path"], e))?;
        if template.is_dynamic() || options.rotate_bytes.is_some() {
            let set = FileSet::new(
                cx.base_dir.clone(),
                template,
                FileSetOptions {
                    append: options.append,
                    create_dirs: options.create_dirs || template_has_dirs(&options.path),
                    sync: options.sync,
                    compression: options.compression,
                    framing: options.framing,
                    rotate_bytes: options.rotate_bytes,
                    rotate_keep: options.rotate_keep,
                    max_open_files: options.max_open_files,
                },
            );
            return Ok(Box::new(TemplatedWriter { set }));
        }
        Ok(Box::new(FileWriter {
            path: cx.resolve(&options.path),
            options,
        }))
    }
}

/// Directories that depend on the event must be created as they come.
fn template_has_dirs(path: &std::path::Path) -> bool {
    path.parent()
        .is_some_and(|p| p.to_string_lossy().contains("{{") || p.to_string_lossy().contains('%'))
}

struct TemplatedWriter {
    set: FileSet,
}

#[async_trait]
impl Sink for TemplatedWriter {
    async fn run(mut self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        run_file_set(&mut self.set, cx).await
    }
}

struct FileWriter {
    path: PathBuf,
    options: FileSinkOptions,
}

#[async_trait]
impl Sink for FileWriter {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        let what = self.path.display().to_string();
        let parent = self.path.parent().filter(|p| !p.as_os_str().is_empty());
        if let (true, Some(parent)) = (self.options.create_dirs, parent) {
            std::fs::create_dir_all(parent).map_err(|e| {
                StageError::io(format!("creating directory {}", parent.display()), e)
            })?;
        }
        let mut open = OpenOptions::new();
        open.create(true);
        if self.options.append {
            open.append(true);
        } else {
            open.write(true).truncate(true);
        }
        let mut file = open
            .open(&self.path)
            .map_err(|e| StageError::io(format!("opening {what}"), e))?;
        if self.options.append
            && self.options.compression == Compression::None
            && self.options.framing == logbus_framing::Framing::Newline
            && crate::writer_sink::close_torn_line(&self.path, &mut file)
                .map_err(|e| StageError::io(format!("checking the end of {what}"), e))?
        {
            tracing::warn!(file = %what, "the file ended in a partial line (an earlier crash?); closed it with a newline before appending");
        }
        // Compressed, an append is a second stream in the same file; every
        // format here reads that back (tested).
        let sync = self.options.sync;
        let writer =
            CompressWriter::new(BufWriter::with_capacity(0, file), self.options.compression)
                .map_err(|e| StageError::io(format!("starting compression for {what}"), e))?;
        let writer = run_writer(
            writer,
            &what,
            self.options.framing,
            move |w: &mut CompressWriter<BufWriter<File>>| {
                if sync {
                    w.get_ref().get_ref().sync_data()
                } else {
                    Ok(())
                }
            },
            cx,
        )
        .await?;
        let inner = writer
            .finish()
            .map_err(|e| StageError::io(format!("finishing {what}"), e))?;
        if sync {
            inner
                .get_ref()
                .sync_data()
                .map_err(|e| StageError::io(format!("syncing {what}"), e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position(dir: &std::path::Path, file: &std::path::Path) -> ReadPosition {
        let id = FileIdentity::of(file).unwrap();
        ReadPosition::new(dir, "src", id, file.to_str().unwrap())
    }

    /// `sink: file` writes each event as a line, appends to what is there,
    /// and counts the events committed.
    #[tokio::test]
    async fn the_file_sink_appends_lines_and_commits_them() {
        use logbus_plugin_api::testing;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        std::fs::write(&path, "before\n").unwrap();
        let event = crate::writer_sink::tests::line;
        let sink = testing::sink(
            &logbus_plugin_api::Typed(FileSink),
            serde_json::json!({ "path": path }),
        );
        let (result, metrics) = testing::run_sink(
            sink,
            vec![vec![event("one"), event("two")], vec![event("three")]],
        )
        .await;
        result.unwrap();
        assert_eq!(metrics.snapshot().events_out, 3);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "before\none\ntwo\nthree\n"
        );
    }

    /// Runs `sink: file` with `options` over one batch of lines.
    async fn write_lines(options: serde_json::Value, lines: &[&str]) -> Result<(), StageError> {
        use logbus_plugin_api::testing;
        let sink = testing::sink(&logbus_plugin_api::Typed(FileSink), options);
        let batch = lines
            .iter()
            .map(|l| crate::writer_sink::tests::line(l))
            .collect();
        testing::run_sink(sink, vec![batch]).await.0
    }

    /// A file left ending in part of a line (a crash mid-write) is closed
    /// with a newline before appending, so the next event starts a line.
    #[tokio::test]
    async fn appending_after_a_torn_line_starts_a_new_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        std::fs::write(&path, "whole\ntorn").unwrap();
        write_lines(serde_json::json!({ "path": path }), &["one"])
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "whole\ntorn\none\n"
        );
    }

    /// `append: false` replaces what the file held.
    #[tokio::test]
    async fn without_append_the_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        std::fs::write(&path, "old\ntorn").unwrap();
        write_lines(
            serde_json::json!({ "path": path, "append": false }),
            &["one"],
        )
        .await
        .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\n");
    }

    /// A compressed file appended to gets a second stream right after the
    /// first, with nothing between them (a newline there, as for a torn
    /// text line, would break the gzip reader), and reads back whole.
    #[tokio::test]
    async fn a_compressed_append_is_a_second_stream_that_reads_back() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log.gz");
        let options = serde_json::json!({ "path": path, "compression": "gzip", "sync": true });
        write_lines(options.clone(), &["one", "two"]).await.unwrap();
        let first = std::fs::read(&path).unwrap();
        assert_ne!(first.last(), Some(&b'\n'));
        write_lines(options, &["three"]).await.unwrap();
        let both = std::fs::read(&path).unwrap();
        assert_eq!(
            &both[first.len()..first.len() + 2],
            b"\x1f\x8b",
            "a gzip member follows"
        );
        let mut text = String::new();
        logbus_compress::open(
            std::fs::File::open(&path).unwrap(),
            logbus_compress::ReadCompression::Auto,
        )
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
        assert_eq!(text, "one\ntwo\nthree\n");
    }

    /// Only newline framing has lines to close: an octet-counted file is
    /// appended to exactly where it ends.
    #[tokio::test]
    async fn other_framings_are_appended_to_as_they_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        std::fs::write(&path, "3 abc").unwrap();
        write_lines(
            serde_json::json!({ "path": path, "framing": "octet-counting" }),
            &["one"],
        )
        .await
        .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "3 abc3 one");
    }

    /// `create_dirs` makes the missing folders; without it, the missing
    /// folder is an error that names the file.
    #[tokio::test]
    async fn missing_folders_are_made_only_with_create_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/out.log");
        let error = write_lines(serde_json::json!({ "path": path }), &["one"])
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("opening") && error.contains("a/b/out.log"),
            "{error}"
        );
        write_lines(
            serde_json::json!({ "path": path, "create_dirs": true }),
            &["one"],
        )
        .await
        .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\n");
    }

    /// Folders named by a template (a field or a time directive) are
    /// made as events need them, without `create_dirs`.
    #[tokio::test]
    async fn folders_a_template_names_are_made_without_create_dirs() {
        use logbus_plugin_api::testing;
        let dir = tempfile::tempdir().unwrap();
        for (template, made) in [
            ("by-time/%Y/out.log", "by-time"),
            ("by-field/{{app}}/out.log", "by-field"),
        ] {
            let sink = testing::sink(
                &logbus_plugin_api::Typed(FileSink),
                serde_json::json!({ "path": dir.path().join(template) }),
            );
            let mut fields = logbus_plugin_api::Fields::new();
            fields.insert("app".into(), "web".into());
            let event =
                logbus_plugin_api::Event::fields(fields, logbus_plugin_api::Meta::now("s".into()));
            let (result, _) = testing::run_sink(sink, vec![vec![event]]).await;
            result.unwrap_or_else(|e| panic!("{template}: {e}"));
            let folder = std::fs::read_dir(dir.path().join(made))
                .unwrap()
                .next()
                .unwrap()
                .unwrap();
            let text = std::fs::read_to_string(folder.path().join("out.log")).unwrap();
            assert_eq!(text, "{\"app\":\"web\"}\n", "{template}");
        }
    }

    /// `rotate_bytes` rotates a fixed path too (through the templated
    /// writer), and `create_dirs` makes a folder the template does not name.
    #[tokio::test]
    async fn a_fixed_path_rotates_and_create_dirs_holds_for_templates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        write_lines(
            serde_json::json!({ "path": path, "rotate_bytes": 8 }),
            &["one-one", "two-two", "three"],
        )
        .await
        .unwrap();
        // Rotated at least once (after a write reaches 8 bytes), and the
        // files, oldest first, hold every line once.
        assert!(dir.path().join("out.log.1").exists());
        let all: String = ["out.log.3", "out.log.2", "out.log.1", "out.log"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(dir.path().join(f)).ok())
            .collect();
        assert_eq!(all, "one-one\ntwo-two\nthree\n");
        let path = dir.path().join("made/{{app}}.log");
        let run = |create_dirs: bool| {
            let sink = logbus_plugin_api::testing::sink(
                &logbus_plugin_api::Typed(FileSink),
                serde_json::json!({ "path": path, "create_dirs": create_dirs }),
            );
            let mut fields = logbus_plugin_api::Fields::new();
            fields.insert("app".into(), "web".into());
            let event =
                logbus_plugin_api::Event::fields(fields, logbus_plugin_api::Meta::now("s".into()));
            async move {
                logbus_plugin_api::testing::run_sink(sink, vec![vec![event]])
                    .await
                    .0
            }
        };
        // The folder is not the template's: without create_dirs, an error.
        let error = run(false).await.unwrap_err().to_string();
        assert!(error.contains("made/web.log"), "{error}");
        run(true).await.unwrap();
        assert!(dir.path().join("made/web.log").exists());
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    }

    /// Reads `path` with `source: file` to its end.
    async fn read_file(options: serde_json::Value, n: usize) -> Vec<logbus_plugin_api::Event> {
        use logbus_plugin_api::testing;
        let source = testing::source(&logbus_plugin_api::Typed(FileSource), options);
        let mut running = testing::run_source(source, 64);
        let events = testing::take(&mut running.rx, n).await;
        running.task.await.unwrap().unwrap();
        if let Some(more) = running.rx.recv().await {
            panic!("more than {n} events: {} more", more.len());
        }
        events
    }

    fn text(events: &[logbus_plugin_api::Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| String::from_utf8_lossy(e.as_raw().unwrap()).into_owned())
            .collect()
    }

    /// Every line is an event carrying the file as its origin and the time
    /// it was read, the last one too when no newline ends it.
    #[tokio::test]
    async fn the_file_source_reads_each_line_with_its_origin_and_read_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.log");
        std::fs::write(&path, "one\ntwo\nthree").unwrap();
        let before = now();
        let events = read_file(serde_json::json!({ "path": path }), 3).await;
        let after = now();
        assert_eq!(text(&events), ["one", "two", "three"]);
        for event in &events {
            let meta = event.meta();
            assert_eq!(meta.origin.as_deref(), path.to_str());
            assert_eq!(&*meta.source, "s");
            assert!(
                (before..=after).contains(&meta.ingest_ns),
                "read at {} outside {before}..={after}",
                meta.ingest_ns
            );
        }
    }

    /// A compressed file is read as the lines it holds.
    #[tokio::test]
    async fn the_file_source_reads_a_compressed_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.log.zst");
        write_lines(
            serde_json::json!({ "path": path, "compression": "zstd" }),
            &["one", "two"],
        )
        .await
        .unwrap();
        let events = read_file(serde_json::json!({ "path": path }), 2).await;
        assert_eq!(text(&events), ["one", "two"]);
    }

    /// With `state_dir`, a second run reads only what was appended; a file
    /// now shorter than the saved position is read from the start.
    #[tokio::test]
    async fn with_a_state_dir_a_rerun_reads_only_what_is_new() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.log");
        let options = serde_json::json!({ "path": path, "state_dir": dir.path().join("state") });
        std::fs::write(&path, "one\ntwo\n").unwrap();
        assert_eq!(text(&read_file(options.clone(), 2).await), ["one", "two"]);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut file, b"three\n").unwrap();
        assert_eq!(text(&read_file(options.clone(), 1).await), ["three"]);
        // Cut short in place, past the fingerprinted first KiB: the same
        // file by inode and first bytes, but shorter than the saved position.
        let lines: Vec<String> = (0..200).map(|i| format!("line-{i:03}\n")).collect();
        std::fs::write(&path, lines.concat()).unwrap();
        assert_eq!(read_file(options.clone(), 200).await.len(), 200);
        std::fs::write(&path, lines[..150].concat()).unwrap();
        let again = text(&read_file(options, 150).await);
        assert_eq!((again[0].as_str(), again.len()), ("line-000", 150));
    }

    /// Each event's position is its offset in the (decompressed) stream,
    /// in a stream named by the file: a rerun without state reads the
    /// same names, one resumed from a saved position names what it reads
    /// alike, and a gzip file counts offsets of what it holds.
    #[tokio::test]
    async fn positions_are_stream_offsets_named_alike_by_every_run() {
        let placed = |events: &[logbus_plugin_api::Event]| -> Vec<(String, u64, u64)> {
            events
                .iter()
                .map(|e| {
                    let p = e.meta().position.expect("a position");
                    assert_eq!(p.part, 0);
                    (
                        String::from_utf8_lossy(e.as_raw().unwrap()).into_owned(),
                        p.stream,
                        p.offset,
                    )
                })
                .collect()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.log");
        std::fs::write(&path, "one\ntwo\nthree\n").unwrap();
        let plain = serde_json::json!({ "path": path });
        let first = placed(&read_file(plain.clone(), 3).await);
        let offsets: Vec<(&str, u64)> = first.iter().map(|(t, _, o)| (t.as_str(), *o)).collect();
        assert_eq!(offsets, [("one", 0), ("two", 4), ("three", 8)]);
        assert!(first.iter().all(|(_, s, _)| *s == first[0].1));
        assert_eq!(placed(&read_file(plain, 3).await), first, "read again");

        let stateful = serde_json::json!({ "path": path, "state_dir": dir.path().join("state") });
        assert_eq!(placed(&read_file(stateful.clone(), 3).await), first);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut file, b"four\nfive\n").unwrap();
        let resumed = placed(&read_file(stateful, 2).await);
        assert_eq!(
            resumed,
            [
                ("four".to_string(), first[0].1, 14),
                ("five".to_string(), first[0].1, 19)
            ]
        );

        let gz = dir.path().join("in.log.gz");
        write_lines(
            serde_json::json!({ "path": gz, "compression": "gzip" }),
            &["alpha", "beta"],
        )
        .await
        .unwrap();
        let zipped = placed(&read_file(serde_json::json!({ "path": gz }), 2).await);
        let offsets: Vec<u64> = zipped.iter().map(|(_, _, o)| *o).collect();
        assert_eq!(offsets, [0, 6]);
        assert_ne!(zipped[0].1, first[0].1, "another file, another name");
    }

    /// A `state_dir` that cannot be made (a file is in the way) is an
    /// error naming it, before anything is read.
    #[tokio::test]
    async fn a_state_dir_that_cannot_be_made_is_an_error_naming_it() {
        use logbus_plugin_api::testing;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.log");
        std::fs::write(&path, "one\n").unwrap();
        let blocked = dir.path().join("blocked");
        std::fs::write(&blocked, "").unwrap();
        let source = testing::source(
            &logbus_plugin_api::Typed(FileSource),
            serde_json::json!({ "path": path, "state_dir": blocked.join("state") }),
        );
        let mut running = testing::run_source(source, 4);
        let error = (&mut running.task).await.unwrap().unwrap_err().to_string();
        assert!(
            error.contains("creating state_dir") && error.contains("blocked/state"),
            "{error}"
        );
        assert!(running.rx.recv().await.is_none(), "nothing was read");
    }

    /// A missing file is an error naming it.
    #[tokio::test]
    async fn a_missing_file_is_an_error_naming_it() {
        use logbus_plugin_api::testing;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.log");
        for options in [
            serde_json::json!({ "path": path }),
            serde_json::json!({ "path": path, "state_dir": dir.path() }),
        ] {
            let source = testing::source(&logbus_plugin_api::Typed(FileSource), options);
            let error = testing::run_source(source, 4)
                .task
                .await
                .unwrap()
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("opening") && error.contains("nope.log"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_saved_position_is_used_only_for_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("in.log");
        std::fs::write(&file, "one\ntwo\n").unwrap();
        assert_eq!(position(dir.path(), &file).load(), 0, "first start");
        position(dir.path(), &file).save(4).unwrap();
        assert_eq!(position(dir.path(), &file).load(), 4);

        // Grown in place: the same file.
        let mut text = std::fs::read(&file).unwrap();
        text.extend_from_slice(b"three\n");
        std::fs::write(&file, &text).unwrap();
        assert_eq!(position(dir.path(), &file).load(), 4);

        // Rewritten in place with other first bytes: another file.
        std::fs::write(&file, "ONE\ntwo\nthree\n").unwrap();
        assert_eq!(position(dir.path(), &file).load(), 0);

        // Replaced by a new inode with the same content: another file.
        position(dir.path(), &file).save(4).unwrap();
        let other = dir.path().join("other.log");
        std::fs::write(&other, "ONE\ntwo\nthree\n").unwrap();
        std::fs::rename(&other, &file).unwrap();
        assert_eq!(position(dir.path(), &file).load(), 0);
    }

    #[test]
    fn a_damaged_state_file_reads_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("in.log");
        std::fs::write(&file, "one\n").unwrap();
        std::fs::write(dir.path().join("src.file.json"), "{not json").unwrap();
        assert_eq!(position(dir.path(), &file).load(), 0);
    }

    #[test]
    fn a_state_dir_that_cannot_be_written_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("in.log");
        std::fs::write(&file, "one\n").unwrap();
        let mut p = position(&dir.path().join("missing"), &file);
        assert!(p.save(4).is_err());
        assert!(p.describe().contains("missing/src.file.json"));
    }
}
