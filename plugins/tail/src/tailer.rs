//! Following files: discovery by glob, reading what was appended, and the
//! cases that make tailing hard — rotation by rename, copy-truncate,
//! truncation, deletion, files that appear later, and an inode reused for a
//! different file. Synchronous and driven from outside (`scan`, `read`,
//! with the clock passed in), so tests step it deterministically; the
//! source runs it on a thread of its own.
//!
//! A file's identity is its device and inode plus a fingerprint (a hash of
//! its first bytes), so a reused inode is not taken for the file that had
//! it before.

use std::collections::HashMap;
use std::fs::File;
use std::hash::Hasher;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use crate::checkpoint::FileKey;
use crate::checkpoint::{Checkpoint, Checkpoints};
use crate::multiline::{Joiner, MultilineConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    Beginning,
    End,
}

#[derive(Debug, Clone)]
pub struct TailConfig {
    /// Absolute glob patterns.
    pub include: Vec<glob::Pattern>,
    pub exclude: Vec<glob::Pattern>,
    /// For files found at the first scan with no checkpoint. Files that
    /// appear later are always read from their beginning.
    pub read_from: ReadFrom,
    pub fingerprint_bytes: usize,
    pub max_line_bytes: usize,
    /// How long a file that was rotated away or deleted is still read
    /// after it stops growing.
    pub rotate_wait: Duration,
    pub multiline: Option<MultilineConfig>,
    /// Most bytes read from one file per `read` call (fairness).
    pub read_chunk: usize,
}

/// One event read from a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    /// Where in the file the event starts (its first line's first byte).
    pub offset: u64,
    /// Which file, for the event's position: its device, inode and first
    /// bytes (up to `fingerprint_bytes`, and never past the event's end,
    /// so the same event read again names the same file).
    pub stream: u64,
}

struct Tracked {
    key: FileKey,
    path: PathBuf,
    file: File,
    /// The stream id once the file holds `fingerprint_bytes` (every later
    /// event has the same).
    full_stream: Option<u64>,
    /// Next byte to read.
    offset: u64,
    /// Hash of the first `fingerprint_len` bytes (0: not taken yet).
    fingerprint: u64,
    fingerprint_len: u64,
    /// An unterminated last line.
    partial: Vec<u8>,
    /// A line longer than the limit is being cut: its pieces so far.
    cut: bool,
    joiner: Joiner,
    /// The path no longer leads to this file (rotated away or deleted).
    gone_since: Option<Instant>,
    /// When it last gave data (for `rotate_wait`).
    last_data: Instant,
}

impl Tracked {
    /// Bytes up to here have been turned into events: where a restart
    /// resumes.
    fn safe_offset(&self) -> u64 {
        self.offset - self.partial.len() as u64 - self.joiner.pending_bytes
    }

    /// The event of `bytes` that covers the file from `start` to `end`.
    fn line(
        &mut self,
        bytes: Vec<u8>,
        (start, end): (u64, u64),
        fingerprint_bytes: u64,
        stats: &mut TailStats,
    ) -> Line {
        Line {
            path: self.path.clone(),
            bytes,
            offset: start,
            stream: self.stream(end, fingerprint_bytes, stats),
        }
    }

    /// The file's name in events' positions: device, inode and the first
    /// bytes up to `fingerprint_bytes` or `end`, whichever comes first —
    /// bytes that are in the file whenever an event ending at `end` is
    /// read, so a re-read names it alike, while a file that reuses the
    /// inode with other contents does not.
    fn stream(&mut self, end: u64, fingerprint_bytes: u64, stats: &mut TailStats) -> u64 {
        let window = fingerprint_bytes.min(end);
        if window == fingerprint_bytes
            && let Some(stream) = self.full_stream
        {
            return stream;
        }
        stats.head_reads += 1;
        let mut first = vec![0u8; window as usize];
        if self.file.read_exact_at(&mut first, 0).is_err() {
            // Gone shorter (truncated under us): the scan that notices
            // starts the file over.
            first.clear();
        }
        let stream = logbus_plugin_api::Position::stream_of(&[
            &self.key.dev.to_le_bytes(),
            &self.key.ino.to_le_bytes(),
            &first,
        ]);
        if window == fingerprint_bytes && first.len() as u64 == window {
            self.full_stream = Some(stream);
        }
        stream
    }
}

/// Counters for the stage's log and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TailStats {
    pub files_opened: u64,
    pub files_closed: u64,
    pub truncations: u64,
    pub replaced: u64,
    pub lines_cut: u64,
    pub resumed: u64,
    pub errors: u64,
    /// Reads of a file's first bytes to name its events: one per event
    /// early in a file, then one per file.
    pub head_reads: u64,
}

pub struct Tailer {
    config: TailConfig,
    files: HashMap<FileKey, Tracked>,
    checkpoints: Checkpoints,
    first_scan: bool,
    pub stats: TailStats,
}

fn fingerprint(file: &File, len: u64) -> io::Result<u64> {
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, 0)?;
    Ok(fingerprint_of(&buf))
}

/// The fingerprint of a file that starts with `bytes` (SipHash with fixed
/// keys: stable across runs, so saved fingerprints stay comparable).
pub fn fingerprint_of(bytes: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

impl Tailer {
    pub fn new(config: TailConfig, checkpoints: Checkpoints) -> Tailer {
        Tailer {
            config,
            files: HashMap::new(),
            checkpoints,
            first_scan: true,
            stats: TailStats::default(),
        }
    }

    /// Paths matching the globs now.
    fn discover(&self) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for pattern in &self.config.include {
            let Ok(paths) = glob::glob(pattern.as_str()) else {
                continue;
            };
            for path in paths.flatten() {
                if self.config.exclude.iter().any(|x| x.matches_path(&path)) || !path.is_file() {
                    continue;
                }
                if !found.contains(&path) {
                    found.push(path);
                }
            }
        }
        found.sort();
        found
    }

    /// Finds new files, notices rotated, deleted, truncated and replaced
    /// ones. Call it periodically (and on a filesystem notification).
    pub fn scan(&mut self, now: Instant) {
        let mut seen = Vec::new();
        for path in self.discover() {
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            let key = FileKey {
                dev: meta.dev(),
                ino: meta.ino(),
            };
            seen.push(key);
            if let Some(t) = self.files.get_mut(&key) {
                t.path = path;
                t.gone_since = None;
                continue;
            }
            let file = match File::open(&path) {
                Ok(f) => f,
                Err(e) => {
                    self.stats.errors += 1;
                    tracing::warn!(path = %path.display(), "cannot open: {e}");
                    continue;
                }
            };
            let offset = self.start_offset(key, &file, meta.len(), &path);
            self.stats.files_opened += 1;
            tracing::debug!(path = %path.display(), offset, "following");
            self.files.insert(
                key,
                Tracked {
                    key,
                    path,
                    file,
                    full_stream: None,
                    offset,
                    fingerprint: 0,
                    fingerprint_len: 0,
                    partial: Vec::new(),
                    cut: false,
                    joiner: Joiner::default(),
                    gone_since: None,
                    last_data: now,
                },
            );
        }
        self.first_scan = false;
        // Files the globs no longer lead to keep being read for a while.
        for (key, t) in &mut self.files {
            if !seen.contains(key) && t.gone_since.is_none() {
                t.gone_since = Some(now);
            }
        }
        // Truncated (copy-truncate) or rewritten in place: start over.
        let fp_bytes = self.config.fingerprint_bytes as u64;
        for t in self.files.values_mut() {
            let Ok(len) = t.file.metadata().map(|m| m.len()) else {
                continue;
            };
            let truncated = len < t.offset;
            let replaced = !truncated
                && t.fingerprint_len > 0
                && fingerprint(&t.file, t.fingerprint_len).ok() != Some(t.fingerprint);
            if truncated || replaced {
                if truncated {
                    self.stats.truncations += 1;
                } else {
                    self.stats.replaced += 1;
                }
                tracing::info!(
                    path = %t.path.display(),
                    "{}; reading it from the start",
                    if truncated { "truncated" } else { "rewritten in place" }
                );
                t.offset = 0;
                t.full_stream = None;
                t.partial.clear();
                t.cut = false;
                t.joiner.take();
                t.fingerprint_len = 0;
            }
            if t.fingerprint_len < fp_bytes.min(len) && t.offset >= fp_bytes.min(len) {
                let n = fp_bytes.min(len);
                if let Ok(fp) = fingerprint(&t.file, n) {
                    t.fingerprint = fp;
                    t.fingerprint_len = n;
                }
            }
        }
    }

    /// Where reading a newly found file starts.
    fn start_offset(&mut self, key: FileKey, file: &File, len: u64, path: &Path) -> u64 {
        if let Some(cp) = self.checkpoints.get(key) {
            let same = cp.fingerprint_len == 0
                || (cp.fingerprint_len <= len
                    && fingerprint(file, cp.fingerprint_len).ok() == Some(cp.fingerprint));
            if same && cp.offset <= len {
                self.stats.resumed += 1;
                return cp.offset;
            }
            tracing::info!(
                path = %path.display(),
                "inode reused by a different file (fingerprint differs); reading it from the start"
            );
            self.checkpoints.remove(key);
            return 0;
        }
        if self.first_scan && self.config.read_from == ReadFrom::End {
            len
        } else {
            0
        }
    }

    /// Reads what was appended to every followed file (at most
    /// `read_chunk` bytes each), as events.
    pub fn read(&mut self, now: Instant) -> Vec<Line> {
        let mut out = Vec::new();
        let mut keys: Vec<FileKey> = self.files.keys().copied().collect();
        keys.sort();
        for key in keys {
            let t = self.files.get_mut(&key).expect("tracked");
            let mut buf = vec![0u8; self.config.read_chunk];
            let n = match t.file.read_at(&mut buf, t.offset) {
                Ok(n) => n,
                Err(e) => {
                    self.stats.errors += 1;
                    tracing::warn!(path = %t.path.display(), "read failed: {e}");
                    continue;
                }
            };
            buf.truncate(n);
            if n > 0 {
                t.last_data = now;
            }
            // Where the next line starts: after what became lines.
            let mut at = t.offset - t.partial.len() as u64;
            t.offset += n as u64;
            let fp = self.config.fingerprint_bytes as u64;
            let mut rest = &buf[..];
            while let Some(i) = memchr::memchr(b'\n', rest) {
                let mut line = std::mem::take(&mut t.partial);
                line.extend_from_slice(&rest[..i]);
                rest = &rest[i + 1..];
                // (After a cut, this is the last piece of the long line.)
                t.cut = false;
                let max = self.config.max_line_bytes;
                let mut line = &line[..];
                while line.len() > max {
                    self.stats.lines_cut += 1;
                    emit(
                        &self.config,
                        &mut self.stats,
                        t,
                        line[..max].to_vec(),
                        (at, max as u64),
                        now,
                        &mut out,
                    );
                    at += max as u64;
                    line = &line[max..];
                }
                let consumed = line.len() as u64 + 1;
                emit(
                    &self.config,
                    &mut self.stats,
                    t,
                    line.to_vec(),
                    (at, consumed),
                    now,
                    &mut out,
                );
                at += consumed;
            }
            t.partial.extend_from_slice(rest);
            // A line longer than the limit is emitted in pieces.
            while t.partial.len() >= self.config.max_line_bytes {
                let piece: Vec<u8> = t.partial.drain(..self.config.max_line_bytes).collect();
                self.stats.lines_cut += 1;
                t.cut = true;
                let consumed = piece.len() as u64;
                emit(
                    &self.config,
                    &mut self.stats,
                    t,
                    piece,
                    (at, consumed),
                    now,
                    &mut out,
                );
                at += consumed;
            }
            if let Some(m) = &self.config.multiline {
                let start = at - t.joiner.pending_bytes;
                if let Some(event) = t.joiner.flush_stale(m, now) {
                    out.push(t.line(event, (start, at), fp, &mut self.stats));
                }
            }
        }
        out
    }

    /// Closes files rotated away or deleted that have been quiet for
    /// `rotate_wait`, after emitting what they still held. Returns how
    /// many were closed.
    pub fn close_finished(&mut self, now: Instant) -> Vec<Line> {
        let mut out = Vec::new();
        let wait = self.config.rotate_wait;
        let done: Vec<FileKey> = self
            .files
            .iter()
            .filter(|(_, t)| {
                t.gone_since.is_some_and(|g| now.duration_since(g) >= wait)
                    && now.duration_since(t.last_data) >= wait
            })
            .map(|(k, _)| *k)
            .collect();
        for key in done {
            if let Some(mut t) = self.files.remove(&key) {
                let fp = self.config.fingerprint_bytes as u64;
                let lines_end = t.offset - t.partial.len() as u64;
                let start = lines_end - t.joiner.pending_bytes;
                if let Some(event) = t.joiner.take() {
                    out.push(t.line(event, (start, lines_end), fp, &mut self.stats));
                }
                if !t.partial.is_empty() {
                    // An unterminated last line of a file that is gone.
                    let bytes = std::mem::take(&mut t.partial);
                    out.push(t.line(bytes, (lines_end, t.offset), fp, &mut self.stats));
                }
                self.checkpoints.remove(key);
                self.stats.files_closed += 1;
                tracing::debug!(path = %t.path.display(), "stopped following (rotated or deleted)");
            }
        }
        out
    }

    /// Emits every event waiting in a multi-line joiner (at shutdown).
    pub fn flush_joined(&mut self) -> Vec<Line> {
        let mut out = Vec::new();
        let fp = self.config.fingerprint_bytes as u64;
        for t in self.files.values_mut() {
            let lines_end = t.offset - t.partial.len() as u64;
            let start = lines_end - t.joiner.pending_bytes;
            if let Some(event) = t.joiner.take() {
                out.push(t.line(event, (start, lines_end), fp, &mut self.stats));
            }
        }
        out
    }

    /// The positions to save: for every followed file, the bytes already
    /// turned into events.
    pub fn positions(&self) -> Vec<Checkpoint> {
        let mut v: Vec<Checkpoint> = self
            .files
            .iter()
            .map(|(key, t)| Checkpoint {
                dev: key.dev,
                ino: key.ino,
                fingerprint: t.fingerprint,
                fingerprint_len: t.fingerprint_len,
                offset: t.safe_offset(),
                path: t.path.display().to_string(),
            })
            .collect();
        v.sort_by_key(|c| (c.dev, c.ino));
        v
    }

    pub fn followed(&self) -> usize {
        self.files.len()
    }
}

/// Hands on one line (or piece) that took the file's bytes from `start`
/// on, `consumed` of them; with multi-line joining, the event it
/// completes, which started where the joiner's first line did.
fn emit(
    config: &TailConfig,
    stats: &mut TailStats,
    t: &mut Tracked,
    line: Vec<u8>,
    (start, consumed): (u64, u64),
    now: Instant,
    out: &mut Vec<Line>,
) {
    let fp = config.fingerprint_bytes as u64;
    match &config.multiline {
        Some(m) => {
            let group_start = start - t.joiner.pending_bytes;
            if let Some(event) = t.joiner.push(m, &line, consumed, now) {
                out.push(t.line(event, (group_start, start), fp, stats));
            }
        }
        None => out.push(t.line(line, (start, start + consumed), fp, stats)),
    }
}
