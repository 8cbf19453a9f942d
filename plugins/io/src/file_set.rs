//! `sink: file` with a path template (`/logs/{{service}}/%Y-%m-%d.log`),
//! size rotation and a bounded number of open files. Each batch is split
//! by the file its events render to; every file touched is written and
//! flushed (and synced, with `sync`) before the batch is committed.
//!
//! Field values in a path are made safe: `/`, NUL and a leading `.` become
//! `_`, so an event cannot write outside the template's directories.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use logbus_compress::{CompressWriter, Compression};
use logbus_framing::Framing;
use logbus_plugin_api::{Event, FieldPath, SinkContext, StageError, blocking};
use serde_json::Value;

use crate::writer_sink::encode_message;

/// A parsed path template.
#[derive(Debug, Clone)]
pub struct PathTemplate {
    parts: Vec<Part>,
    /// Whether anything depends on the event (else one fixed file).
    dynamic: bool,
}

#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Field(FieldPath),
    /// A strftime directive, rendered from the event's ingest time (UTC).
    Time(String),
}

impl PathTemplate {
    pub fn parse(text: &str) -> Result<PathTemplate, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        let mut literal = String::new();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("{{") {
                let end = after
                    .find("}}")
                    .ok_or_else(|| format!("`{{{{` without `}}}}` in `{text}`"))?;
                let name = after[..end].trim();
                let path = FieldPath::parse(name).map_err(|e| format!("in `{text}`: {e}"))?;
                if !literal.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut literal)));
                }
                parts.push(Part::Field(path));
                rest = &after[end + 2..];
            } else if let Some(after) = rest.strip_prefix('%') {
                let c = after
                    .chars()
                    .next()
                    .ok_or_else(|| format!("`%` at the end of `{text}`"))?;
                if c == '%' {
                    literal.push('%');
                } else {
                    if !"YmdHMSjyUbBaAe".contains(c) {
                        return Err(format!(
                            "`%{c}` in `{text}` is not a supported time directive (Y m d H M S j y U b B a A e, or %% for %)"
                        ));
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Time(format!("%{c}")));
                }
                rest = &after[c.len_utf8()..];
            } else {
                let c = rest.chars().next().expect("not empty");
                literal.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        let dynamic = parts.iter().any(|p| !matches!(p, Part::Text(_)));
        Ok(PathTemplate { parts, dynamic })
    }

    pub fn is_dynamic(&self) -> bool {
        self.dynamic
    }

    /// The path for `event`.
    pub fn render(&self, event: &Event) -> String {
        let mut out = String::new();
        let mut time = None;
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Field(path) => {
                    // Through the event: lazy fields parse only this entry.
                    let value = event.field(path);
                    let text = match value.as_deref() {
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Null) | None => "unknown".to_string(),
                        Some(other) => other.to_string(),
                    };
                    out.push_str(&safe(&text));
                }
                Part::Time(fmt) => {
                    let t = *time.get_or_insert_with(|| {
                        chrono::DateTime::from_timestamp_nanos(event.meta().ingest_ns as i64)
                    });
                    out.push_str(&t.format(fmt).to_string());
                }
            }
        }
        out
    }
}

/// A field value as one path component.
fn safe(text: &str) -> String {
    let mut s: String = text
        .chars()
        .map(|c| {
            if c == '/' || c == '\0' || c == '\\' {
                '_'
            } else {
                c
            }
        })
        .collect();
    if s.starts_with('.') {
        s.replace_range(..1, "_");
    }
    if s.is_empty() {
        s.push('_');
    }
    s
}

pub struct FileSetOptions {
    pub append: bool,
    pub create_dirs: bool,
    pub sync: bool,
    pub compression: Compression,
    pub framing: Framing,
    /// Rotate a file once it holds this many bytes (written, compressed).
    pub rotate_bytes: Option<u64>,
    /// Rotated files kept (`path.1` newest … `path.N`).
    pub rotate_keep: usize,
    pub max_open_files: usize,
}

/// The file sink's defaults (`docs/plugins/file.md`).
impl Default for FileSetOptions {
    fn default() -> Self {
        FileSetOptions {
            append: true,
            create_dirs: false,
            sync: false,
            compression: Compression::None,
            framing: Framing::Newline,
            rotate_bytes: None,
            rotate_keep: crate::file::default_rotate_keep(),
            max_open_files: crate::file::default_max_open(),
        }
    }
}

struct Open {
    writer: CompressWriter<BufWriter<File>>,
    bytes: u64,
    used: u64,
}

pub struct FileSet {
    base: PathBuf,
    template: PathTemplate,
    options: FileSetOptions,
    open: HashMap<PathBuf, Open>,
    clock: u64,
    pub rotations: u64,
}

impl FileSet {
    pub fn new(base: PathBuf, template: PathTemplate, options: FileSetOptions) -> FileSet {
        FileSet {
            base,
            template,
            options,
            open: HashMap::new(),
            clock: 0,
            rotations: 0,
        }
    }

    fn path_of(&self, event: &Event) -> PathBuf {
        let rendered = PathBuf::from(self.template.render(event));
        if rendered.is_absolute() {
            rendered
        } else {
            self.base.join(rendered)
        }
    }

    fn open_file(&mut self, path: &Path) -> std::io::Result<()> {
        if self.open.contains_key(path) {
            return Ok(());
        }
        // Bounded: close the least recently used file first.
        while self.open.len() >= self.options.max_open_files {
            let oldest = self
                .open
                .iter()
                .min_by_key(|(_, o)| o.used)
                .map(|(p, _)| p.clone())
                .expect("not empty");
            let o = self.open.remove(&oldest).expect("present");
            finish(o, self.options.sync)?;
        }
        if self.options.create_dirs
            && let Some(parent) = path.parent()
        {
            std::fs::create_dir_all(parent)?;
        }
        let mut open = OpenOptions::new();
        open.create(true);
        if self.options.append {
            open.append(true);
        } else {
            open.write(true).truncate(true);
        }
        let mut file = open.open(path)?;
        if self.options.append
            && self.options.compression == Compression::None
            && self.options.framing == logbus_framing::Framing::Newline
            && crate::writer_sink::close_torn_line(path, &mut file)?
        {
            tracing::warn!(file = %path.display(), "the file ended in a partial line (an earlier crash?); closed it with a newline before appending");
        }
        let bytes = file.metadata()?.len();
        let writer =
            CompressWriter::new(BufWriter::with_capacity(0, file), self.options.compression)?;
        self.open.insert(
            path.to_owned(),
            Open {
                writer,
                bytes,
                used: 0,
            },
        );
        Ok(())
    }

    /// Writes the events, each to its file; returns when all are flushed.
    pub fn write(&mut self, events: &[Event]) -> Result<(), StageError> {
        let mut by_file: Vec<(PathBuf, Vec<u8>)> = Vec::new();
        for event in events {
            let path = self.path_of(event);
            let buf = match by_file.iter_mut().find(|(p, _)| *p == path) {
                Some((_, b)) => b,
                None => {
                    by_file.push((path, Vec::new()));
                    &mut by_file.last_mut().expect("pushed").1
                }
            };
            encode_message(event, self.options.framing, buf);
        }
        for (path, buf) in by_file {
            let what = path.display().to_string();
            self.open_file(&path)
                .map_err(|e| StageError::io(format!("opening {what}"), e))?;
            self.clock += 1;
            let sync = self.options.sync;
            let o = self.open.get_mut(&path).expect("opened");
            o.used = self.clock;
            o.writer
                .write_all(&buf)
                .and_then(|()| o.writer.flush())
                .and_then(|()| {
                    if sync {
                        o.writer.get_ref().get_ref().sync_data()
                    } else {
                        Ok(())
                    }
                })
                .map_err(|e| StageError::io(format!("writing {what}"), e))?;
            o.bytes += buf.len() as u64;
            if self.options.rotate_bytes.is_some_and(|max| o.bytes >= max) {
                self.rotate(&path)
                    .map_err(|e| StageError::io(format!("rotating {what}"), e))?;
            }
        }
        Ok(())
    }

    /// `path` → `path.1`, `path.1` → `path.2`, …; the oldest beyond
    /// `rotate_keep` is deleted. The next write starts a fresh `path`.
    fn rotate(&mut self, path: &Path) -> std::io::Result<()> {
        if let Some(o) = self.open.remove(path) {
            finish(o, self.options.sync)?;
        }
        let numbered = |n: usize| PathBuf::from(format!("{}.{n}", path.display()));
        let keep = self.options.rotate_keep;
        if keep == 0 {
            std::fs::remove_file(path)?;
        } else {
            let _ = std::fs::remove_file(numbered(keep));
            for n in (1..keep).rev() {
                let from = numbered(n);
                if from.exists() {
                    std::fs::rename(&from, numbered(n + 1))?;
                }
            }
            std::fs::rename(path, numbered(1))?;
        }
        self.rotations += 1;
        tracing::info!(file = %path.display(), "rotated");
        Ok(())
    }

    /// Closes every file (ending compressed streams).
    pub fn close(&mut self) -> Result<(), StageError> {
        for (path, o) in self.open.drain() {
            finish(o, self.options.sync)
                .map_err(|e| StageError::io(format!("closing {}", path.display()), e))?;
        }
        Ok(())
    }

    pub fn open_files(&self) -> usize {
        self.open.len()
    }
}

fn finish(o: Open, sync: bool) -> std::io::Result<()> {
    let inner = o.writer.finish()?;
    if sync {
        inner.get_ref().sync_data()?;
    }
    Ok(())
}

/// The sink loop: one batch at a time, committed once written.
pub async fn run_file_set(set: &mut FileSet, cx: &mut SinkContext) -> Result<(), StageError> {
    while let Some(mut batch) = cx.input.recv().await {
        cx.metrics.add_in(batch.len() as u64);
        blocking(|| set.write(batch.events()))?;
        batch.settle(logbus_plugin_api::Outcome::Delivered);
        cx.committed(batch.len());
        drop(batch);
    }
    blocking(|| set.close())
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::{Fields, Meta};

    fn event(fields: serde_json::Value, ingest_ns: u64) -> Event {
        Event::fields(
            serde_json::from_value::<Fields>(fields).unwrap(),
            Meta::at("t", ingest_ns),
        )
    }

    #[test]
    fn templates_render_fields_and_time_and_stay_inside_their_directory() {
        let t = PathTemplate::parse("logs/{{service}}/{{ http.status }}/%Y-%m-%d_%H.log").unwrap();
        assert!(t.is_dynamic());
        // 2026-11-30T10:00:00Z
        let at = 1_795_000_000_000_000_000u64;
        let e = event(
            serde_json::json!({"service": "api", "http": {"status": 503}}),
            at,
        );
        let day = chrono::DateTime::from_timestamp_nanos(at as i64)
            .format("%Y-%m-%d_%H")
            .to_string();
        assert_eq!(t.render(&e), format!("logs/api/503/{day}.log"));
        // The same from lazy fields, read without building them.
        let text = br#"{"service":"api","http":{"status":503}}"#;
        let lazy = logbus_plugin_api::LazyFields::parse(bytes::Bytes::from_static(text)).unwrap();
        let lazy = Event::new(logbus_plugin_api::Payload::Lazy(lazy), Meta::at("s", at));
        assert_eq!(t.render(&lazy), format!("logs/api/503/{day}.log"));
        assert!(matches!(lazy.payload(), logbus_plugin_api::Payload::Lazy(l) if !l.is_built()));
        let evil = event(serde_json::json!({"service": "../../etc/passwd"}), at);
        let rendered = t.render(&evil);
        assert!(
            rendered.starts_with("logs/_._.._etc_passwd/unknown/"),
            "{rendered}"
        );
        assert!(!PathTemplate::parse("plain.log").unwrap().is_dynamic());
        assert!(PathTemplate::parse("a/{{x").is_err());
        assert!(PathTemplate::parse("a/%Q.log").is_err());
        assert_eq!(
            t.render(&event(serde_json::json!({}), at))
                .split('/')
                .nth(1),
            Some("unknown")
        );
    }

    fn set(dir: &Path, template: &str, options: FileSetOptions) -> FileSet {
        FileSet::new(
            dir.to_owned(),
            PathTemplate::parse(template).unwrap(),
            options,
        )
    }

    fn options() -> FileSetOptions {
        FileSetOptions::default()
    }

    fn app(name: &str) -> Event {
        event(serde_json::json!({ "app": name }), 1)
    }

    #[test]
    fn separators_and_nul_in_a_value_become_underscores() {
        assert_eq!(safe("a/b\\c\0d"), "a_b_c_d");
        assert_eq!(safe(".hidden"), "_hidden");
        assert_eq!(safe("plain"), "plain");
    }

    /// With `max_open_files` reached, the least recently written file is
    /// the one closed.
    #[test]
    fn the_least_recently_written_file_is_closed_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = set(
            dir.path(),
            "{{app}}.log",
            FileSetOptions {
                max_open_files: 2,
                ..options()
            },
        );
        for name in ["a", "b", "a", "c"] {
            files.write(&[app(name)]).unwrap();
        }
        let mut open: Vec<_> = files
            .open
            .keys()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        open.sort();
        assert_eq!(open, ["a.log", "c.log"]);
    }

    /// A file closed to make room ends its compressed stream, so it reads
    /// back whole (zstd, unlike gzip, does not finish on drop).
    #[test]
    fn a_file_closed_for_room_is_a_whole_compressed_stream() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let mut files = set(
            dir.path(),
            "{{app}}.log.zst",
            FileSetOptions {
                max_open_files: 1,
                compression: Compression::Zstd,
                ..options()
            },
        );
        files.write(&[app("a")]).unwrap();
        files.write(&[app("b")]).unwrap();
        let mut text = String::new();
        logbus_compress::open(
            File::open(dir.path().join("a.log.zst")).unwrap(),
            logbus_compress::ReadCompression::Zstd,
        )
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
        assert_eq!(text, "{\"app\":\"a\"}\n");
        files.close().unwrap();
    }

    /// As for a fixed path: a torn last line is closed before appending
    /// text, and nothing is added to a compressed or counted file.
    #[test]
    fn only_newline_text_gets_a_torn_line_closed() {
        let dir = tempfile::tempdir().unwrap();
        let write = |template: &str, options: FileSetOptions| {
            let mut files = set(dir.path(), template, options);
            files.write(&[app("x")]).unwrap();
            files.close().unwrap();
        };
        std::fs::write(dir.path().join("x.log"), "torn").unwrap();
        write("{{app}}.log", options());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("x.log")).unwrap(),
            "torn\n{\"app\":\"x\"}\n"
        );
        std::fs::write(dir.path().join("x.oc"), "3 abc").unwrap();
        write(
            "{{app}}.oc",
            FileSetOptions {
                framing: Framing::OctetCounting,
                ..options()
            },
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("x.oc")).unwrap(),
            "3 abc11 {\"app\":\"x\"}"
        );
        let gz = || FileSetOptions {
            compression: Compression::Gzip,
            ..options()
        };
        write("{{app}}.gz", gz());
        let first = std::fs::read(dir.path().join("x.gz")).unwrap();
        write("{{app}}.gz", gz());
        let both = std::fs::read(dir.path().join("x.gz")).unwrap();
        assert_eq!(&both[first.len()..first.len() + 2], b"\x1f\x8b");
    }
}
