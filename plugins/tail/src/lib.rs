//! `source: tail` — follow files matching globs, as they grow, across
//! rotation and restarts. The tailer (`tailer.rs`) is synchronous and
//! stepped from outside; the source runs it on a blocking thread that
//! sends each batch and waits until the pipeline takes it, so a full
//! pipeline stops the reading (nothing is buffered without bound).
//!
//! Read positions are saved only for bytes whose events are finished: each
//! batch carries an acknowledgement, its positions wait in an ordered
//! checkpoint, and the saved state never passes a batch that a sink has not
//! confirmed. A crash therefore re-reads what was in flight (duplicates)
//! and never skips it.

pub mod checkpoint;
pub mod multiline;
pub mod tailer;

use logbus_plugin_api::Registry;

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "source-tail")]
    registry.add(logbus_plugin_api::Typed(source::TailSource));
    let _ = registry;
}

#[cfg(feature = "source-tail")]
pub mod source {
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use logbus_plugin_api::{
        BatchAck, BuildContext, Bytes, CheckOptions, Event, Meta, OptionError, OrderedCheckpoint,
        Output, Position, Source, SourceContext, StageError, StageKind, TypedPlugin, async_trait,
    };
    use serde::Deserialize;

    use crate::checkpoint::{Checkpoint, StateFile};

    /// Positions of batches sent and not yet passed by the checkpoint.
    type Acks = Arc<Mutex<OrderedCheckpoint<Vec<Checkpoint>>>>;

    /// How long a stopping source waits for its last batches to finish
    /// before it saves what is finished and returns.
    const FINAL_ACK_WAIT: Duration = Duration::from_secs(30);
    use crate::multiline::{MultilineConfig, Rule};
    use crate::tailer::{Line, ReadFrom, TailConfig, Tailer};

    #[derive(Debug, Clone, Copy, Default, Deserialize, serde::Serialize, schemars::JsonSchema)]
    #[serde(rename_all = "lowercase")]
    pub enum ReadFromSpec {
        /// Files found at start with no saved position are read whole.
        #[default]
        Beginning,
        /// ...or only what is appended from now on.
        End,
    }

    /// `multiline:` — join the lines of one event. Give `start` or
    /// `continuation`.
    #[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct MultilineOptions {
        /// A line matching this regex begins an event; others continue it.
        #[serde(default)]
        pub start: Option<String>,
        /// A line matching this regex continues the previous event.
        #[serde(default)]
        pub continuation: Option<String>,
        /// Emit an event whose next line has not come for this long.
        #[serde(default = "default_multiline_timeout")]
        #[schemars(range(min = 1, max = 600000))]
        pub timeout_ms: u64,
        /// Most lines in one event.
        #[serde(default = "default_max_lines")]
        #[schemars(range(min = 1))]
        pub max_lines: usize,
    }

    fn default_multiline_timeout() -> u64 {
        1000
    }
    fn default_max_lines() -> usize {
        500
    }

    /// Options of `source: tail`.
    #[derive(Debug, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct TailOptions {
        /// Glob patterns of files to follow (`/var/log/app/*.log`,
        /// `logs/**/*.log`); relative ones resolve against the pipeline
        /// file's directory.
        pub paths: Vec<String>,
        /// Glob patterns of files to leave out.
        #[serde(default)]
        pub exclude: Vec<String>,
        /// Directory where read positions are saved (one file per stage).
        pub state_dir: PathBuf,
        /// Where to start in files found at the first start (no saved
        /// position): `beginning` (default) or `end`. Files that appear
        /// later are always read from their beginning.
        #[serde(default)]
        pub read_from: ReadFromSpec,
        /// Bytes at the start of a file hashed to tell it from another file
        /// that reuses its inode.
        #[serde(default = "default_fingerprint")]
        #[schemars(range(min = 1, max = 65536))]
        pub fingerprint_bytes: usize,
        /// Longer lines are cut into pieces of this size.
        #[serde(default = "default_max_line")]
        #[schemars(range(min = 1))]
        pub max_line_bytes: usize,
        /// How often globs are re-expanded and files checked (filesystem
        /// notifications wake it sooner where available).
        #[serde(default = "default_poll")]
        #[schemars(range(min = 10, max = 60000))]
        pub poll_interval_ms: u64,
        /// How long a rotated-away or deleted file is still read after it
        /// stops growing.
        #[serde(default = "default_rotate_wait")]
        #[schemars(range(max = 3600000))]
        pub rotate_wait_ms: u64,
        /// How often read positions are saved (and always at shutdown).
        #[serde(default = "default_checkpoint")]
        #[schemars(range(min = 10, max = 600000))]
        pub checkpoint_interval_ms: u64,
        #[serde(default)]
        pub multiline: Option<MultilineOptions>,
        /// `true` (default): a saved position never passes a line the
        /// sinks have not confirmed, so a crash re-sends what was in flight
        /// (duplicates, never gaps). `false`: positions are saved once a
        /// batch is handed to the pipeline, as most log shippers do without
        /// acknowledgements: a crash loses what was in flight (and still
        /// re-sends what was read since the last save).
        #[serde(default = "default_true")]
        pub acknowledgements: bool,
    }

    fn default_true() -> bool {
        true
    }

    fn default_fingerprint() -> usize {
        256
    }
    fn default_max_line() -> usize {
        1 << 20
    }
    fn default_poll() -> u64 {
        250
    }
    fn default_rotate_wait() -> u64 {
        5000
    }
    fn default_checkpoint() -> u64 {
        1000
    }

    impl CheckOptions for TailOptions {
        fn check(&self) -> Vec<OptionError> {
            let mut errors = Vec::new();
            if self.paths.is_empty() {
                errors.push(OptionError::at(&["paths"], "give at least one glob"));
            }
            for (key, list) in [("paths", &self.paths), ("exclude", &self.exclude)] {
                for (i, p) in list.iter().enumerate() {
                    if let Err(e) = glob::Pattern::new(p) {
                        errors.push(OptionError::at(
                            &[key, &i.to_string()],
                            format!("`{p}` is not a valid glob: {e}"),
                        ));
                    }
                }
            }
            if self.state_dir.as_os_str().is_empty() {
                errors.push(OptionError::at(&["state_dir"], "must not be empty"));
            }
            if self.max_line_bytes == 0 {
                errors.push(OptionError::at(&["max_line_bytes"], "must be at least 1"));
            }
            if !(1..=65536).contains(&self.fingerprint_bytes) {
                errors.push(OptionError::at(
                    &["fingerprint_bytes"],
                    format!(
                        "must be between 1 and 65536, got {}",
                        self.fingerprint_bytes
                    ),
                ));
            }
            if !(10..=60000).contains(&self.poll_interval_ms) {
                errors.push(OptionError::at(
                    &["poll_interval_ms"],
                    format!(
                        "must be between 10 and 60000, got {}",
                        self.poll_interval_ms
                    ),
                ));
            }
            if let Some(m) = &self.multiline {
                match (&m.start, &m.continuation) {
                    (Some(_), Some(_)) | (None, None) => errors.push(OptionError::at(
                        &["multiline"],
                        "give exactly one of `start` and `continuation`",
                    )),
                    (Some(re), None) | (None, Some(re)) => {
                        let key = if m.start.is_some() {
                            "start"
                        } else {
                            "continuation"
                        };
                        if let Err(e) = regex::bytes::Regex::new(re) {
                            errors.push(OptionError::at(
                                &["multiline", key],
                                format!("not a valid regex: {e}"),
                            ));
                        }
                    }
                }
                if m.max_lines == 0 {
                    errors.push(OptionError::at(
                        &["multiline", "max_lines"],
                        "must be at least 1",
                    ));
                }
            }
            errors
        }
    }

    pub struct TailSource;

    impl TypedPlugin for TailSource {
        type Options = TailOptions;
        const NAME: &'static str = "tail";
        const KIND: StageKind = StageKind::Source;

        type Stage = Box<dyn Source>;
        const ACKNOWLEDGEMENTS: Option<&'static str> = Some(
            "end to end: the saved position of each file never passes a line the sinks have not confirmed, so a restart re-sends, never skips",
        );
        const DESCRIPTION: &'static str = "Follows files matching globs as they grow, across rotation, truncation and restarts (saved positions), one event per line or multi-line event.";

        /// Each glob should match something; `state_dir` is made at start.
        fn host_needs(
            &self,
            o: &TailOptions,
            cx: &BuildContext,
        ) -> Vec<logbus_plugin_api::StatedNeed> {
            use logbus_plugin_api::{HostNeed, StatedNeed};
            let mut needs: Vec<StatedNeed> = o
                .paths
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    StatedNeed::new(
                        HostNeed::ReadGlob {
                            pattern: cx
                                .resolve(std::path::Path::new(p))
                                .to_string_lossy()
                                .into_owned(),
                        },
                        &["paths", &i.to_string()],
                    )
                })
                .collect();
            needs.push(StatedNeed::new(
                HostNeed::WriteDir {
                    path: cx.resolve(&o.state_dir),
                    create: true,
                },
                &["state_dir"],
            ));
            needs
        }

        /// Raw events (one per line or message); a `codec:` parses them.
        /// Raw lines, each with its file and offset as its position;
        /// re-read after a crash when acknowledging.
        fn flow(&self, o: &TailOptions) -> logbus_plugin_api::Flow {
            logbus_plugin_api::Flow::raw().then(logbus_plugin_api::Step::Replay(
                logbus_plugin_api::Replay {
                    rereads: o.acknowledgements,
                    positions: true,
                },
            ))
        }

        fn build(&self, o: TailOptions, cx: &BuildContext) -> Result<Self::Stage, OptionError> {
            let glob_of = |p: &String, key: &str| {
                let path = cx.resolve(Path::new(p));
                glob::Pattern::new(&path.to_string_lossy())
                    .map_err(|e| OptionError::at(&[key], format!("`{p}`: {e}")))
            };
            let include = o
                .paths
                .iter()
                .map(|p| glob_of(p, "paths"))
                .collect::<Result<_, _>>()?;
            let exclude = o
                .exclude
                .iter()
                .map(|p| glob_of(p, "exclude"))
                .collect::<Result<_, _>>()?;
            let multiline = match o.multiline {
                None => None,
                Some(m) => {
                    let rule = match (m.start, m.continuation) {
                        (Some(re), _) => {
                            Rule::Start(regex::bytes::Regex::new(&re).map_err(|e| {
                                OptionError::at(&["multiline", "start"], e.to_string())
                            })?)
                        }
                        (None, Some(re)) => {
                            Rule::Continuation(regex::bytes::Regex::new(&re).map_err(|e| {
                                OptionError::at(&["multiline", "continuation"], e.to_string())
                            })?)
                        }
                        (None, None) => {
                            return Err(OptionError::at(
                                &["multiline"],
                                "give `start` or `continuation`",
                            ));
                        }
                    };
                    Some(MultilineConfig {
                        rule,
                        timeout: Duration::from_millis(m.timeout_ms),
                        max_lines: m.max_lines,
                        max_bytes: o.max_line_bytes,
                    })
                }
            };
            Ok(Box::new(Tail {
                config: TailConfig {
                    include,
                    exclude,
                    read_from: match o.read_from {
                        ReadFromSpec::Beginning => ReadFrom::Beginning,
                        ReadFromSpec::End => ReadFrom::End,
                    },
                    fingerprint_bytes: o.fingerprint_bytes,
                    max_line_bytes: o.max_line_bytes,
                    rotate_wait: Duration::from_millis(o.rotate_wait_ms),
                    multiline,
                    read_chunk: 256 * 1024,
                },
                state_dir: cx.resolve(&o.state_dir),
                acknowledgements: o.acknowledgements,
                poll: Duration::from_millis(o.poll_interval_ms),
                checkpoint_every: Duration::from_millis(o.checkpoint_interval_ms),
            }))
        }
    }

    struct Tail {
        config: TailConfig,
        state_dir: PathBuf,
        acknowledgements: bool,
        poll: Duration,
        checkpoint_every: Duration,
    }

    #[async_trait]
    impl Source for Tail {
        async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
            let handle = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || self.follow(&handle, cx))
                .await
                .map_err(|e| StageError::Other(format!("the tail thread panicked: {e}")))?
        }
    }

    /// The directories to watch for a glob: its longest prefix without
    /// wildcards.
    fn watch_root(pattern: &str) -> PathBuf {
        let mut root = PathBuf::new();
        for part in Path::new(pattern).components() {
            let s = part.as_os_str().to_string_lossy();
            if s.contains(['*', '?', '[']) {
                break;
            }
            root.push(part);
        }
        if root.is_file() {
            root.pop();
        }
        root
    }

    impl Tail {
        fn follow(
            self,
            handle: &tokio::runtime::Handle,
            cx: SourceContext,
        ) -> Result<(), StageError> {
            std::fs::create_dir_all(&self.state_dir).map_err(|e| {
                StageError::io(
                    format!("creating state_dir {}", self.state_dir.display()),
                    e,
                )
            })?;
            let mut state = StateFile::new(&self.state_dir, &cx.id);
            let (checkpoints, note) = state.load();
            if let Some(note) = note {
                tracing::warn!("{note}");
            }
            let (wake_tx, wake) = std::sync::mpsc::channel::<()>();
            // A stop wakes the loop at once, not at the next poll.
            let stop_wakes = {
                let (shutdown, wake_tx) = (cx.shutdown.clone(), wake_tx.clone());
                handle.spawn(async move {
                    shutdown.cancelled().await;
                    let _ = wake_tx.send(());
                })
            };
            let _watcher = self.watch(wake_tx);
            let mut tailer = Tailer::new(self.config, checkpoints);
            let mut last_save = Instant::now();
            let source: Arc<str> = cx.id.clone();
            let acks: Acks = Arc::default();
            // With nothing in flight, where the tailer stands is finished;
            // otherwise the newest position every batch before it finished.
            // (Only this thread begins batches, so nothing starts between
            // the look and the snapshot.)
            let metrics = cx.output.metrics().clone();
            let acknowledgements = self.acknowledgements;
            let save = |state: &mut StateFile, tailer: &Tailer| {
                let positions = {
                    let acks = acks.lock().unwrap_or_else(|p| p.into_inner());
                    let oldest = acks
                        .oldest_open()
                        .map(|opened| std::time::SystemTime::now() - opened.elapsed());
                    metrics.set_acks(acks.counts(), oldest);
                    if acks.outstanding() == 0 {
                        Some(tailer.positions())
                    } else {
                        acks.committed().cloned()
                    }
                };
                if let Some(positions) = positions
                    && let Err(e) = state.save(positions)
                {
                    tracing::warn!("saving read positions to {}: {e}", state.path().display());
                }
            };
            // Each event's origin is its file's path, one shared `Arc` per
            // run of lines from the same file.
            let mut origin: Option<(PathBuf, Arc<str>)> = None;
            let mut send = |lines: Vec<Line>,
                            positions: Vec<Checkpoint>,
                            output: &Output|
             -> Result<bool, StageError> {
                if lines.is_empty() {
                    return Ok(true);
                }
                let batch = acknowledgements.then(|| {
                    let token = acks
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .begin(positions, lines.len() as u64);
                    BatchAck::new(acks.clone(), token)
                });
                let events: Vec<Event> = lines
                    .into_iter()
                    .map(|l| {
                        let path = match &origin {
                            Some((p, arc)) if *p == l.path => arc.clone(),
                            _ => {
                                let arc: Arc<str> = Arc::from(l.path.to_string_lossy().as_ref());
                                origin = Some((l.path, arc.clone()));
                                arc
                            }
                        };
                        let event = Event::raw(
                            Bytes::from(l.bytes),
                            Meta {
                                origin: Some(path),
                                position: Some(Position::new(l.stream, l.offset)),
                                ..Meta::now(source.clone())
                            },
                        );
                        match &batch {
                            Some(batch) => event.with_ack(batch.handle()),
                            None => event,
                        }
                    })
                    .collect();
                drop(batch);
                // Waits while the pipeline is full: backpressure stops the
                // reading here.
                Ok(handle.block_on(output.send(events)).is_ok())
            };
            loop {
                let now = Instant::now();
                tailer.scan(now);
                let mut gone = false;
                loop {
                    let lines = tailer.read(Instant::now());
                    if lines.is_empty() {
                        break;
                    }
                    if !send(lines, tailer.positions(), &cx.output)? {
                        gone = true; // downstream gone
                        break;
                    }
                    if cx.shutdown.is_cancelled() {
                        break;
                    }
                    // Under sustained load this loop does not end (there
                    // is always more to read), so positions are saved
                    // here too: what the sinks finished, in order, never
                    // waiting for an idle pipeline (issue 54: a million
                    // lines waiting meant no save at all, and a kill -9
                    // re-read all of them).
                    if last_save.elapsed() >= self.checkpoint_every {
                        save(&mut state, &tailer);
                        last_save = Instant::now();
                    }
                }
                if gone {
                    break;
                }
                let closed = tailer.close_finished(Instant::now());
                if !send(closed, tailer.positions(), &cx.output)? {
                    break;
                }
                let stopping = cx.shutdown.is_cancelled();
                if stopping {
                    let joined = tailer.flush_joined();
                    send(joined, tailer.positions(), &cx.output)?;
                    break;
                }
                if last_save.elapsed() >= self.checkpoint_every {
                    save(&mut state, &tailer);
                    last_save = Instant::now();
                }
                // Sleep until the poll interval passes or the filesystem
                // says something changed; then drain the wake-ups.
                let _ = wake.recv_timeout(self.poll);
                while wake.try_recv().is_ok() {}
            }
            // Let downstream drain (its input ends once this output is
            // gone), then save what it finished.
            drop(cx.output);
            // An errored batch holds the checkpoint for this run: waiting
            // longer cannot move it.
            let deadline = Instant::now() + FINAL_ACK_WAIT;
            let lock = || acks.lock().unwrap_or_else(|p| p.into_inner());
            while lock().worth_waiting() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let open = lock().outstanding();
            if open > 0 {
                tracing::warn!(
                    stage = %cx.id,
                    "{open} batches were not finished; a restart reads them again"
                );
            }
            save(&mut state, &tailer);
            stop_wakes.abort();
            Ok(())
        }

        /// Filesystem notifications, where the platform has them; polling
        /// covers everything either way.
        fn watch(&self, wake: std::sync::mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
            use notify::Watcher;
            let mut watcher = notify::recommended_watcher(move |_event| {
                let _ = wake.send(());
            })
            .map_err(|e| tracing::info!("no filesystem notifications ({e}); polling"))
            .ok()?;
            for pattern in &self.config.include {
                let root = watch_root(pattern.as_str());
                let mode = if pattern.as_str().contains("**") {
                    notify::RecursiveMode::Recursive
                } else {
                    notify::RecursiveMode::NonRecursive
                };
                if let Err(e) = watcher.watch(&root, mode) {
                    tracing::debug!(dir = %root.display(), "not watched ({e}); polling");
                }
            }
            Some(watcher)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn watch_roots_stop_at_the_first_wildcard() {
            assert_eq!(
                watch_root("/var/log/app/*.log"),
                PathBuf::from("/var/log/app")
            );
            assert_eq!(watch_root("/srv/**/x.log"), PathBuf::from("/srv"));
            assert_eq!(watch_root("/a/b[0-9]/c"), PathBuf::from("/a"));
        }
    }
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "source-tail")]
            "source-tail",
        ];
        logbus_plugin_api::testing::assert_registers(super::register, enabled);
    }

    /// Each plugin's page lists its options with the schema's defaults.
    #[test]
    fn each_plugin_page_documents_its_options() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/plugins");
        logbus_plugin_api::testing::assert_pages_document(super::register, &docs);
    }
}
