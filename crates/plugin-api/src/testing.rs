//! Helpers for plugin tests (feature `testing`): build a plugin from JSON
//! options the way the engine does, run a source into a channel, feed a
//! sink, and read option errors as `path: message` text. One copy here
//! instead of one per plugin crate.

use std::sync::Arc;

use serde_json::Value;

use crate::channel::{Receiver, channel};
use crate::event::Event;
use crate::metrics::StageMetrics;
use crate::output::{Output, OutputRole};
use crate::plugin::{
    BuildContext, Built, Plugin, Sink, SinkContext, Source, SourceContext, StageError,
};
use tokio_util::sync::CancellationToken;

/// The context a test stage is built with: stage id `s`, paths relative
/// to the current directory.
pub fn context() -> BuildContext {
    BuildContext {
        stage_id: "s".into(),
        base_dir: ".".into(),
        worker: 0,
    }
}

/// `path: message` of every option error, joined with `; ` (empty when the
/// options build).
pub fn option_errors(plugin: &dyn Plugin, options: Value) -> String {
    match plugin.build(&options, &context()) {
        Err(errors) => errors
            .iter()
            .map(|e| format!("{}: {}", e.path.join("."), e.message))
            .collect::<Vec<_>>()
            .join("; "),
        Ok(_) => String::new(),
    }
}

/// Builds a source; panics with the option errors if it does not build.
pub fn source(plugin: &dyn Plugin, options: Value) -> Box<dyn Source> {
    source_in(plugin, options, std::path::Path::new("."))
}

/// Like [`source`], with relative paths in the options resolved against
/// `base_dir` (as the engine does against the pipeline file's folder).
pub fn source_in(
    plugin: &dyn Plugin,
    options: Value,
    base_dir: &std::path::Path,
) -> Box<dyn Source> {
    let cx = BuildContext {
        base_dir: base_dir.to_path_buf(),
        ..context()
    };
    match plugin.build(&options, &cx) {
        Ok(Built::Source(s)) => s,
        Ok(_) => panic!("{} is not a source", plugin.name()),
        Err(e) => panic!("{} does not build: {e:?}", plugin.name()),
    }
}

/// Builds a sink; panics with the option errors if it does not build.
pub fn sink(plugin: &dyn Plugin, options: Value) -> Box<dyn Sink> {
    match plugin.build(&options, &context()) {
        Ok(Built::Sink(s)) => s,
        Ok(_) => panic!("{} is not a sink", plugin.name()),
        Err(e) => panic!("{} does not build: {e:?}", plugin.name()),
    }
}

/// A source running on the test's runtime, feeding `rx`. Dropped without
/// [`RunningSource::stop`] (a test that panicked), it still tells the
/// source to stop, so a source running on a blocking thread does not keep
/// the test's runtime (and the test) from ending.
pub struct RunningSource {
    pub rx: Receiver,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), StageError>>,
    pub stop_on_drop: crate::DropGuard,
}

impl RunningSource {
    /// Stops the source and returns how it ended.
    pub async fn stop(self) -> Result<(), StageError> {
        self.shutdown.cancel();
        self.task.await.expect("the source task panicked")
    }
}

/// Runs `source` into a channel of `capacity` events.
pub fn run_source(source: Box<dyn Source>, capacity: usize) -> RunningSource {
    let (tx, rx) = channel(capacity);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(source.run(SourceContext {
        id: "s".into(),
        output: Output::new(
            vec![tx],
            Arc::new(StageMetrics::default()),
            OutputRole::Main,
        ),
        shutdown: shutdown.clone(),
    }));
    RunningSource {
        rx,
        stop_on_drop: shutdown.clone().drop_guard(),
        shutdown,
        task,
    }
}

/// Receives at least `n` events; panics when none comes for 20 s, so a
/// broken source fails its test instead of hanging it. It plays the sink:
/// the events it returns are acknowledged delivered.
pub async fn take(rx: &mut Receiver, n: usize) -> Vec<Event> {
    let mut got = Vec::new();
    while got.len() < n {
        let mut batch = tokio::time::timeout(std::time::Duration::from_secs(20), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no event within 20 s ({} of {n} so far)", got.len()))
            .expect("the stream ended early");
        batch.settle(crate::Outcome::Delivered);
        got.extend(batch.take());
    }
    got
}

/// Receives at least `n` raw events, as text.
pub async fn take_text(rx: &mut Receiver, n: usize) -> Vec<String> {
    take(rx, n)
        .await
        .iter()
        .map(|e| String::from_utf8_lossy(e.as_raw().expect("a raw event")).into_owned())
        .collect()
}

/// Runs `sink` over `batches` (sent in order, then the input ends);
/// returns how it ended and its counters.
pub async fn run_sink(
    sink: Box<dyn Sink>,
    batches: Vec<Vec<Event>>,
) -> (Result<(), StageError>, Arc<StageMetrics>) {
    run_sink_counting(sink, batches, Arc::new(StageMetrics::default())).await
}

/// [`run_sink`] counting into `metrics`, which a test can watch while the
/// sink runs (to start a server only once the sink has retried).
pub async fn run_sink_counting(
    sink: Box<dyn Sink>,
    batches: Vec<Vec<Event>>,
    metrics: Arc<StageMetrics>,
) -> (Result<(), StageError>, Arc<StageMetrics>) {
    let (tx, rx) = channel(batches.iter().map(Vec::len).sum::<usize>().max(1));
    let mut cx = SinkContext::new("s", rx, metrics.clone());
    for batch in batches {
        tx.send(batch).await.expect("the sink's input is open");
    }
    drop(tx);
    let result = sink.run(&mut cx).await;
    (result, metrics)
}

/// Asserts that `register` adds one plugin per enabled feature, each named
/// as its feature says (`transform-stamp` adds the transform `stamp`), and
/// nothing else: a crate's tests build its plugins directly, so without
/// this nothing in the crate notices a plugin dropped from `register`.
pub fn assert_registers(register: fn(&mut crate::Registry), features: &[&str]) {
    let mut registry = crate::Registry::new();
    register(&mut registry);
    let mut added: Vec<String> = registry
        .plugins()
        .map(|plugin| format!("{}-{}", plugin.kind(), plugin.name()))
        .collect();
    added.sort();
    let mut expected: Vec<String> = features.iter().map(|f| f.to_string()).collect();
    expected.sort();
    assert_eq!(added, expected, "plugins registered vs features enabled");
}

/// Asserts that the options table of `page` (a `docs/plugins/*.md` text)
/// documents `plugin`'s options as its schema declares them
/// ([`options_table_mismatch`]).
pub fn assert_documented(plugin: &dyn Plugin, page: &str, section: Option<&str>) {
    if let Some(mismatch) = options_table_mismatch(plugin, page, section) {
        panic!("{mismatch}");
    }
}

/// What is wrong with the options table of `page` for `plugin`, if
/// anything: it must list the names the schema declares, each with the
/// default the schema gives (`none` where it gives none). The table is the
/// first one (`| name | … | default | …`) after the line `section` (for a
/// page that documents two plugins), or the page's first. A default cell
/// is read as its first `code` span, else its text.
pub fn options_table_mismatch(
    plugin: &dyn Plugin,
    page: &str,
    section: Option<&str>,
) -> Option<String> {
    let what = format!("{} {}", plugin.kind(), plugin.name());
    let mut lines = page.lines();
    if let Some(section) = section
        && !lines.by_ref().any(|l| l.trim() == section)
    {
        return Some(format!("{what}: no line `{section}` in its page"));
    }
    let cells = |line: &str| -> Vec<String> {
        let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
        // `\|` inside a cell is a literal bar.
        let mut cells = vec![String::new()];
        let mut chars = inner.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&'|') => {
                    cells.last_mut().expect("one cell").push('|');
                    chars.next();
                }
                '|' => cells.push(String::new()),
                c => cells.last_mut().expect("one cell").push(c),
            }
        }
        cells.iter().map(|c| c.trim().to_string()).collect()
    };
    let schema = plugin.options_schema();
    let properties = schema.get("properties").and_then(Value::as_object);
    let Some(header) = lines.by_ref().find(|l| l.starts_with("| name |")) else {
        if properties.is_none_or(|p| p.is_empty()) {
            return None; // no options, no table
        }
        return Some(format!("{what}: no options table (`| name | …`)"));
    };
    let header = cells(header);
    let (Some(name_at), Some(default_at)) = (
        header.iter().position(|h| h == "name"),
        header.iter().position(|h| h == "default"),
    ) else {
        return Some(format!("{what}: the options table has no `default` column"));
    };
    let mut documented = std::collections::BTreeMap::new();
    for row in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let row = cells(row);
        let (Some(name), Some(cell)) = (row.get(name_at), row.get(default_at)) else {
            return Some(format!("{what}: a short row in the options table: {row:?}"));
        };
        let default = match cell.split('`').nth(1) {
            Some(code) if cell.contains('`') => code.to_string(),
            _ => cell.clone(),
        };
        documented.insert(name.trim_matches('`').to_string(), default);
    }
    let declared: std::collections::BTreeMap<String, String> = properties
        .into_iter()
        .flatten()
        .map(|(name, property)| {
            let default = match property.get("default") {
                None | Some(Value::Null) => "none".to_string(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            (name.clone(), default)
        })
        .collect();
    if documented == declared {
        return None;
    }
    let mut said = vec![format!("{what}: its options table differs from the schema")];
    for (name, default) in &declared {
        match documented.get(name) {
            None => said.push(format!(
                "  `{name}` (default {default}) is not in the table"
            )),
            Some(d) if d != default => said.push(format!(
                "  `{name}`: the table says {d}, the schema {default}"
            )),
            Some(_) => {}
        }
    }
    for name in documented.keys().filter(|n| !declared.contains_key(*n)) {
        said.push(format!("  `{name}` is in the table but not an option"));
    }
    Some(said.join("\n"))
}
