//! `source: file` (read one file to EOF) and `sink: file` (append lines).
//! Tailing, globs and rotation belong to a later file-tail plugin.

use std::fs::{File, OpenOptions};
use std::io::BufWriter;
use std::path::PathBuf;
use std::sync::Arc;

use logbus_compress::{CompressWriter, Compression, ReadCompression};
use logbus_plugin_api::{
    BuildContext, Built, CheckOptions, OptionError, Sink, SinkContext, Source, SourceContext,
    StageError, StageKind, TypedPlugin, async_trait,
};
use serde::Deserialize;

use crate::file_set::{FileSet, FileSetOptions, PathTemplate, run_file_set};
use crate::line_reader::{LineReaderOptions, run_line_source};
use crate::stdio::{check_max_line, default_max_line};
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
}

impl CheckOptions for FileSourceOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = check_max_line(self.max_line_bytes);
        if self.path.as_os_str().is_empty() {
            errors.push(OptionError::at(&["path"], "must not be empty"));
        }
        errors
    }
}

pub struct FileSource;

impl TypedPlugin for FileSource {
    type Options = FileSourceOptions;
    const NAME: &'static str = "file";
    const KIND: StageKind = StageKind::Source;
    const DESCRIPTION: &'static str = "Reads one file from the start to EOF, one event per line.";

    fn build(&self, options: FileSourceOptions, cx: &BuildContext) -> Result<Built, OptionError> {
        Ok(Built::Source(Box::new(FileReader {
            path: cx.resolve(&options.path),
            max_line_bytes: options.max_line_bytes,
            compression: options.compression,
            framing: options.framing,
        })))
    }
}

struct FileReader {
    path: PathBuf,
    max_line_bytes: usize,
    compression: ReadCompression,
    framing: logbus_framing::Framing,
}

#[async_trait]
impl Source for FileReader {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        let what = self.path.display().to_string();
        let file =
            File::open(&self.path).map_err(|e| StageError::io(format!("opening {what}"), e))?;
        let opts = LineReaderOptions {
            max_line_bytes: self.max_line_bytes,
            framing: self.framing,
            origin: Some(Arc::from(what.as_str())),
        };
        let reader = logbus_compress::open(file, self.compression)
            .map_err(|e| StageError::io(format!("reading {what}"), e))?;
        run_line_source(reader, what, opts, cx).await
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
fn default_rotate_keep() -> usize {
    5
}
fn default_max_open() -> usize {
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
        if self.rotate_bytes == Some(0) {
            errors.push(OptionError::at(&["rotate_bytes"], "must be at least 1"));
        }
        if self.rotate_keep > 1000 {
            errors.push(OptionError::at(&["rotate_keep"], "must be at most 1000"));
        }
        if !(1..=65536).contains(&self.max_open_files) {
            errors.push(OptionError::at(
                &["max_open_files"],
                "must be between 1 and 65536",
            ));
        }
        errors
    }
}

pub struct FileSink;

impl TypedPlugin for FileSink {
    type Options = FileSinkOptions;
    const NAME: &'static str = "file";
    const KIND: StageKind = StageKind::Sink;
    const DESCRIPTION: &'static str = "Appends each event as a line to a file: raw events as they are, parsed events as JSON; path templates from fields and time, size rotation.";

    fn build(&self, options: FileSinkOptions, cx: &BuildContext) -> Result<Built, OptionError> {
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
            return Ok(Built::Sink(Box::new(TemplatedWriter { set })));
        }
        Ok(Built::Sink(Box::new(FileWriter {
            path: cx.resolve(&options.path),
            options,
        })))
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
        let sync = self.options.sync;
        if self.options.append && self.options.compression != Compression::None {
            // A compressed stream appended to an existing one is a second
            // stream in the same file; every format here reads that back.
            tracing::debug!(file = %what, "appending a new compressed stream");
        }
        let mut writer =
            CompressWriter::new(BufWriter::with_capacity(0, file), self.options.compression)
                .map_err(|e| StageError::io(format!("starting compression for {what}"), e))?;
        run_writer(
            &mut writer,
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
