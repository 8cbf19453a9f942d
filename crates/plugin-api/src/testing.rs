//! Helpers for plugin tests (feature `testing`): build a plugin from JSON
//! options the way the engine does, run a source into a channel, feed a
//! sink, read option errors as `path: message` text, and hold each plugin's
//! page in `docs/plugins` to its option schema (every plugin crate runs
//! that over what it registers; the binary's tests over every plugin).
//! One copy here instead of one per plugin crate.

use std::sync::Arc;
use std::time::Duration;

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

/// Like [`option_errors`], for what only the build can find and
/// validation by design does not look at: files and environment variables
/// the stage reads when it is built (they may exist only where the pipeline
/// runs, not where it is validated).
pub fn build_errors(plugin: &dyn Plugin, options: Value) -> String {
    match plugin.build(&options, &context()) {
        Err(errors) => joined(&errors),
        Ok(_) => String::new(),
    }
}

/// What a source states about a crash with these options
/// ([`crate::Step::Replay`]); `None` when it states nothing.
pub fn replay(plugin: &dyn Plugin, options: Value) -> Option<crate::Replay> {
    plugin
        .flow(&options)
        .steps
        .into_iter()
        .find_map(|step| match step {
            crate::Step::Replay(r) => Some(r),
            _ => None,
        })
}

/// What the stage states it needs from the host (`validate --preflight`),
/// one `option: need` line each, paths relative to the current directory:
/// `tls.ca_file: Pem ca.pem`, `password_env: EnvVar P`, `address: Listen
/// 127.0.0.1:514/udp`, `max_connections: OpenFiles 10`.
pub fn host_needs(plugin: &dyn Plugin, options: Value) -> Vec<String> {
    use crate::HostNeed;
    plugin
        .host_needs(&options, &context())
        .into_iter()
        .map(|s| {
            let need = match s.need {
                HostNeed::ReadFile { path } => format!("ReadFile {}", path.display()),
                HostNeed::ReadGlob { pattern } => format!("ReadGlob {pattern}"),
                HostNeed::WriteDir { path, create } => {
                    format!("WriteDir {} create={create}", path.display())
                }
                HostNeed::Listen { address, udp } => {
                    format!("Listen {address}/{}", if udp { "udp" } else { "tcp" })
                }
                HostNeed::Pem { path, key } => {
                    format!("Pem{} {}", if key { "Key" } else { "" }, path.display())
                }
                HostNeed::TlsIdentity { cert, key } => {
                    format!("TlsIdentity {} {}", cert.display(), key.display())
                }
                HostNeed::Program { name } => format!("Program {name}"),
                HostNeed::OpenFiles { count } => format!("OpenFiles {count}"),
                HostNeed::EnvVar { name } => format!("EnvVar {name}"),
            };
            format!("{}: {need}", s.option.join("."))
        })
        .collect()
}

/// What `validate --connect` finds for the stage, one `option code` line
/// each, with `arriving` fields (unknown when `None`) and a 10 s timeout;
/// panics when the plugin has no probe.
pub async fn probe(
    plugin: &dyn Plugin,
    options: Value,
    arriving: Option<crate::ArrivingFields>,
) -> Vec<String> {
    probe_findings(plugin, options, arriving)
        .await
        .into_iter()
        .map(|f| format!("{} {}", f.option.join("."), f.code))
        .collect()
}

/// [`probe`]'s findings whole (level and message too).
pub async fn probe_findings(
    plugin: &dyn Plugin,
    options: Value,
    arriving: Option<crate::ArrivingFields>,
) -> Vec<crate::ServiceFinding> {
    let cx = crate::ConnectContext {
        stage_id: "s".into(),
        base_dir: ".".into(),
        timeout: std::time::Duration::from_secs(10),
        arriving: arriving.unwrap_or_default(),
    };
    let probe = plugin
        .connect(&options, cx)
        .expect("the plugin has a probe");
    tokio::time::timeout(std::time::Duration::from_secs(10), probe)
        .await
        .expect("the probe answers within its timeout")
}

/// `path: message` of each error, joined with `; `.
fn joined(errors: &[crate::OptionError]) -> String {
    errors
        .iter()
        .map(|e| format!("{}: {}", e.path.join("."), e.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `path: message` of every option error, joined with `; ` (empty when the
/// options build).
///
/// Panics where the plugin's check (all that `logbus validate` runs) and
/// its build disagree: an error the build reports that the check does not
/// is a config the gate passes and the engine then refuses to start, and a
/// check error on options that build is a config refused for nothing.
pub fn option_errors(plugin: &dyn Plugin, options: Value) -> String {
    let checked = plugin.check(&options, &context());
    match plugin.build(&options, &context()) {
        Err(errors) => {
            for e in &errors {
                assert!(
                    checked.contains(e),
                    "`{}` refuses {options} when built ({}) but its check does not ({})",
                    plugin.name(),
                    joined(std::slice::from_ref(e)),
                    joined(&checked)
                );
            }
            joined(&errors)
        }
        Ok(_) => {
            assert!(
                checked.is_empty(),
                "`{}` builds with {options} but its check refuses them ({})",
                plugin.name(),
                joined(&checked)
            );
            String::new()
        }
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
    /// The source's counters (acknowledgements, redeliveries, retries).
    pub metrics: Arc<StageMetrics>,
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
    let metrics = Arc::new(StageMetrics::default());
    let task = tokio::spawn(source.run(SourceContext {
        id: "s".into(),
        output: Output::new(vec![tx], metrics.clone(), OutputRole::Main),
        shutdown: shutdown.clone(),
    }));
    RunningSource {
        rx,
        metrics,
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
///
/// # Panics
/// When the sink has not finished its input within [`RUN_SINK_DEADLINE`].
pub async fn run_sink(
    sink: Box<dyn Sink>,
    batches: Vec<Vec<Event>>,
) -> (Result<(), StageError>, Arc<StageMetrics>) {
    run_sink_counting(sink, batches, Arc::new(StageMetrics::default())).await
}

/// How long [`run_sink`] lets a sink take over its input before failing the
/// test. A sink that cannot deliver (a wrong URL, a refused request taken
/// for a transient one) retries for ever by design; a test should fail
/// saying so, well before a mutation run's or CI's own timeout kills it
/// with no message.
pub const RUN_SINK_DEADLINE: Duration = Duration::from_secs(45);

/// [`run_sink`] counting into `metrics`, which a test can watch while the
/// sink runs (to start a server only once the sink has retried).
pub async fn run_sink_counting(
    sink: Box<dyn Sink>,
    batches: Vec<Vec<Event>>,
    metrics: Arc<StageMetrics>,
) -> (Result<(), StageError>, Arc<StageMetrics>) {
    let mut cx = sink_context(batches, metrics.clone()).await;
    let result = within(RUN_SINK_DEADLINE, &metrics, sink.run(&mut cx)).await;
    (result, metrics)
}

/// [`run_sink`] with a deadline of the test's own, for a sink given much
/// more to do than a test usually gives it.
pub async fn run_sink_within(
    deadline: Duration,
    sink: Box<dyn Sink>,
    batches: Vec<Vec<Event>>,
) -> (Result<(), StageError>, Arc<StageMetrics>) {
    let metrics = Arc::new(StageMetrics::default());
    let mut cx = sink_context(batches, metrics.clone()).await;
    let result = within(deadline, &metrics, sink.run(&mut cx)).await;
    (result, metrics)
}

/// A context whose input holds `batches`, then ends.
async fn sink_context(batches: Vec<Vec<Event>>, metrics: Arc<StageMetrics>) -> SinkContext {
    let (tx, rx) = channel(batches.iter().map(Vec::len).sum::<usize>().max(1));
    let cx = SinkContext::new("s", rx, metrics);
    for batch in batches {
        tx.send(batch).await.expect("the sink's input is open");
    }
    cx
}

/// `run`'s output, or a panic naming `metrics` once `deadline` has passed:
/// for a test driving a sink (or anything that retries for ever by design)
/// without [`run_sink`].
pub async fn within<T>(
    deadline: Duration,
    metrics: &StageMetrics,
    run: impl std::future::Future<Output = T>,
) -> T {
    let Ok(out) = tokio::time::timeout(deadline, run).await else {
        let m = metrics.snapshot();
        panic!(
            "the sink had not finished its input after {deadline:?} \
             ({} events in, {} committed, {} errored): is it retrying for ever?",
            m.events_in, m.events_out, m.errored
        );
    };
    out
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

/// Asserts that every plugin `register` adds documents its options in
/// `docs` (the `docs/plugins` folder) as [`page_mismatch`] reads them.
pub fn assert_pages_document(register: fn(&mut crate::Registry), docs: &std::path::Path) {
    let mut registry = crate::Registry::new();
    register(&mut registry);
    let differ: Vec<String> = registry
        .plugins()
        .filter_map(|plugin| page_mismatch(plugin.as_ref(), docs))
        .collect();
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// What is wrong with `plugin`'s options table in `docs`, if anything
/// ([`options_table_mismatch`]). Its page is `<name>.md`, or the page with
/// a heading naming it (`` `source: syslog` `` is on
/// `syslog-transport.md`); on a page for several plugins, the table after
/// the heading that names this one alone, or else the heading that starts
/// with its kind (`Sink`).
pub fn page_mismatch(plugin: &dyn Plugin, docs: &std::path::Path) -> Option<String> {
    let (kind, name) = (plugin.kind().key(), plugin.name());
    let own = format!("`{kind}: {name}`");
    let names_it = |page: &str| {
        page.lines()
            .any(|l| l.starts_with('#') && l.contains(&own) && !l.contains(" and "))
    };
    let read = |path: std::path::PathBuf| std::fs::read_to_string(path).ok();
    let first = read(docs.join(format!("{name}.md")));
    let page = match first {
        Some(page) if names_it(&page) => page,
        first => {
            let mut others: Vec<_> = std::fs::read_dir(docs)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .collect();
            others.sort();
            match others.into_iter().filter_map(read).find(|p| names_it(p)) {
                Some(page) => page,
                None => match first {
                    Some(page) => page,
                    None => {
                        return Some(format!(
                            "{kind} {name}: no page {name}.md in {}",
                            docs.display()
                        ));
                    }
                },
            }
        }
    };
    let mut kind_word = kind.to_string();
    kind_word[..1].make_ascii_uppercase();
    let headings: Vec<&str> = page.lines().filter(|l| l.starts_with('#')).collect();
    let section = headings
        .iter()
        .find(|h| h.contains(&own) && !h.contains(" and "))
        .or_else(|| {
            headings
                .iter()
                .find(|h| h.trim_start_matches('#').trim().starts_with(&kind_word))
        })
        .map(|h| h.trim());
    options_table_mismatch(plugin, &page, section)
}

/// What is wrong with the options table of `page` for `plugin`, if
/// anything: it must list the names the schema declares, each with the
/// default the schema gives. The table is the first one (`| name | … |
/// default | …`) after the line `section` (for a page that documents two
/// plugins), or the page's first.
///
/// The page's conventions, read as the schema's terms:
/// - a row may name several options (`` `a`, `b` ``), with one default
///   each (`1000, 1 MiB`) or one for all; a row `` `opt.key` `` documents
///   the option `opt`;
/// - a default cell that starts with a `code` span is that value (`" "`
///   for a string with its quotes); a number, with a trailing parenthesis
///   as a gloss (`1 MiB`, `64 KiB`, `268435456 (256 MiB)`), is that
///   number; anything else is words;
/// - words stand where the schema gives no default: what happens without
///   the option (`—`, `unset: body, else message`, `the system journal`);
///   a value there is one the schema should have given;
/// - an option is required exactly when the `required` column says `yes`,
///   or, in a table without one, when its default cell says `required`;
/// - a row that says `cargo feature` documents an option a build without
///   that feature does not have: it may be missing from the schema (a
///   custom build's own tests then pass), but where the schema has it the
///   row is compared like any other.
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
    let schema = plugin.options_schema();
    let top = object_of(&schema, &schema, 0);
    let Some(header) = lines.by_ref().find(|l| l.starts_with("| name |")) else {
        if top.as_ref().is_none_or(|(p, _)| p.is_empty()) {
            return None; // no options, no table
        }
        return Some(format!("{what}: no options table (`| name | …`)"));
    };
    let header = table_cells(header);
    let (Some(name_at), Some(default_at)) = (
        header.iter().position(|h| h == "name"),
        header.iter().position(|h| h == "default"),
    ) else {
        return Some(format!("{what}: the options table has no `default` column"));
    };
    let required_at = header.iter().position(|h| h == "required");
    let mut rows = Rows::new();
    for row in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let row = table_cells(row);
        let (Some(names), Some(cell)) = (row.get(name_at), row.get(default_at)) else {
            return Some(format!("{what}: a short row in the options table: {row:?}"));
        };
        let names: Vec<&str> = names
            .split(',')
            .map(|n| n.trim().trim_matches('`'))
            .collect();
        // A `required` column says it there (`yes`), else the default cell.
        let says_required = match required_at.and_then(|i| row.get(i)) {
            Some(column) => column.starts_with("yes"),
            None => cell.contains("required"),
        };
        let gated = row
            .iter()
            .any(|c| c.to_ascii_lowercase().contains("cargo feature"));
        let defaults: Vec<&str> = cell.split(',').map(str::trim).collect();
        for (i, name) in names.iter().enumerate() {
            let cell = if defaults.len() == names.len() {
                defaults[i]
            } else {
                cell.as_str()
            };
            let row = Row {
                default: DocDefault::read(cell),
                required: says_required,
                gated,
            };
            rows.insert(name.to_string(), row);
        }
    }
    let mut said = Vec::new();
    let (properties, required) = top.unwrap_or_default();
    compare_level(&schema, "", &rows, &properties, &required, &mut said);
    if said.is_empty() {
        return None;
    }
    said.insert(
        0,
        format!("{what}: its options table differs from the schema"),
    );
    Some(said.join("\n"))
}

/// The table's rows by option name (`key` or `parent.key`).
type Rows = std::collections::BTreeMap<String, Row>;

/// What one row of an options table says of an option.
struct Row {
    /// The default cell, read.
    default: DocDefault,
    /// Whether the row says the option is required.
    required: bool,
    /// Whether the row names a cargo feature the option comes with.
    gated: bool,
}

/// Compares the options at one level of the schema (`prefix` is `""` or
/// `parent.`) with the rows that name them. An option documented by rows
/// of its keys (`multiline.start`) has its own keys compared the same way
/// when its schema is an object with named properties (a map's keys are
/// free text).
fn compare_level(
    root: &Value,
    prefix: &str,
    rows: &Rows,
    properties: &serde_json::Map<String, Value>,
    required: &[String],
    said: &mut Vec<String>,
) {
    let here = |name: &str| format!("{prefix}{name}");
    let has_keys = |name: &str| {
        let parent = format!("{}.", here(name));
        rows.keys().any(|k| k.starts_with(&parent))
    };
    for (name, property) in properties {
        let declared = match property.get("default") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => Some(other.to_string()),
        };
        let is_required = required.contains(name);
        let Some(Row {
            default: doc,
            required: says_required,
            ..
        }) = rows.get(&here(name))
        else {
            if !has_keys(name) {
                said.push(format!(
                    "  `{}` (default {}) is not in the table",
                    here(name),
                    declared.as_deref().unwrap_or("none")
                ));
                continue;
            }
            // Documented by its keys' rows.
            if let Some(d) = declared {
                said.push(format!(
                    "  `{}`: the table says (its keys), the schema {d}",
                    here(name),
                ));
            }
            if let Some((inner, inner_required)) = object_of(root, property, 0) {
                let prefix = format!("{}.", here(name));
                compare_level(root, &prefix, rows, &inner, &inner_required, said);
            }
            continue;
        };
        if *says_required != is_required {
            said.push(format!(
                "  `{}`: the table says {}, the schema {}",
                here(name),
                if *says_required {
                    "required"
                } else {
                    "optional"
                },
                if is_required { "required" } else { "optional" },
            ));
        }
        match (doc, declared) {
            (DocDefault::Words(_), None) => {}
            (DocDefault::Value(v), Some(d)) if *v == d => {}
            (doc, declared) => said.push(format!(
                "  `{}`: the table says {}, the schema {}",
                here(name),
                doc.text(),
                declared.as_deref().unwrap_or("none")
            )),
        }
    }
    // Rows of this level (`prefix` then a name, or a name's keys) that
    // name no option, unless the option comes with a feature not built.
    let mut strangers: Vec<&str> = rows
        .iter()
        .filter(|(_, row)| !row.gated)
        .filter_map(|(k, _)| k.strip_prefix(prefix))
        .map(|rest| rest.split('.').next().unwrap_or(rest))
        .filter(|name| !properties.contains_key(*name))
        .collect();
    strangers.dedup();
    for name in strangers {
        said.push(format!(
            "  `{}` is in the table but not an option",
            here(name)
        ));
    }
}

/// The named properties (and required names) of the object `schema`
/// describes, through `$ref`, and `anyOf`/`oneOf`/`allOf` (an `Option` is
/// `anyOf` the object and null); `None` for anything else, a map
/// included. `root` holds the `$defs` that `$ref`s point into.
fn object_of(
    root: &Value,
    schema: &Value,
    depth: usize,
) -> Option<(serde_json::Map<String, Value>, Vec<String>)> {
    if depth > 8 {
        return None; // a reference cycle
    }
    let schema = match schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
    {
        Some(pointer) => root.pointer(pointer)?,
        None => schema,
    };
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        let required = schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect();
        return Some((properties.clone(), required));
    }
    ["anyOf", "oneOf", "allOf"]
        .iter()
        .filter_map(|k| schema.get(*k).and_then(Value::as_array))
        .flatten()
        .find_map(|s| object_of(root, s, depth + 1))
}

/// A default cell, read.
#[derive(Debug, PartialEq)]
enum DocDefault {
    /// A value: a `code` span or a number.
    Value(String),
    /// What happens without the option, in words.
    Words(String),
}

impl DocDefault {
    fn read(cell: &str) -> DocDefault {
        if let Some(code) = cell.strip_prefix('`').and_then(|c| c.split('`').next()) {
            // A JSON string's quotes show its spaces: `" "`, `""`.
            let code = match code.strip_prefix('"').and_then(|c| c.strip_suffix('"')) {
                Some(inner) => inner,
                None => code,
            };
            return DocDefault::Value(code.to_string());
        }
        let bare = match cell.find(" (") {
            Some(i) if cell.ends_with(')') => &cell[..i],
            _ => cell,
        };
        if bare.parse::<f64>().is_ok() || bare == "true" || bare == "false" {
            return DocDefault::Value(bare.to_string());
        }
        if let Some((n, unit)) = bare.split_once(' ')
            && let Ok(n) = n.parse::<u64>()
            && let Some(scale) = match unit {
                "KiB" => Some(1u64 << 10),
                "MiB" => Some(1 << 20),
                "GiB" => Some(1 << 30),
                _ => None,
            }
        {
            return DocDefault::Value((n * scale).to_string());
        }
        DocDefault::Words(cell.to_string())
    }

    fn text(&self) -> &str {
        match self {
            DocDefault::Value(s) | DocDefault::Words(s) => s,
        }
    }
}

/// The cells of a Markdown table row; `\|` inside a cell is a literal bar.
fn table_cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{CheckOptions, OptionError};
    use crate::plugin::{StageKind, Typed, TypedPlugin};

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Opts {
        path: String,
        #[serde(default = "size")]
        max_bytes: u64,
        #[serde(default = "space")]
        separator: String,
        #[serde(default)]
        units: Vec<String>,
        #[serde(default)]
        body: Option<String>,
        #[serde(default)]
        multiline: Option<std::collections::BTreeMap<String, u32>>,
        #[serde(default)]
        retry: Option<Retry>,
    }
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Retry {
        #[serde(default = "three")]
        attempts: u32,
        backoff: String,
    }
    fn three() -> u32 {
        3
    }
    fn size() -> u64 {
        1 << 20
    }
    fn space() -> String {
        " ".into()
    }
    impl CheckOptions for Opts {}
    struct P;
    impl TypedPlugin for P {
        type Options = Opts;
        const NAME: &'static str = "p";
        const KIND: StageKind = StageKind::Sink;

        type Stage = Box<dyn Sink>;
        const DESCRIPTION: &'static str = "";
        fn build(&self, _: Opts, _: &BuildContext) -> Result<Self::Stage, OptionError> {
            Err(OptionError::at(&[], "no"))
        }
    }

    const HEADER: &str = "| name | type | default | description |\n|---|---|---|---|\n";
    const GOOD: &str = "| `path` | path | required | |\n\
        | `max_bytes`, `separator` | | 1 MiB, `\" \"` | |\n\
        | `units` | | `[]` (every unit) | |\n\
        | `body` | | unset: `body`, else `message` | |\n\
        | `multiline.start` | regex | — | |\n\
        | `multiline.max_lines` | | 500 | |\n\
        | `retry.attempts` | | 3 | |\n\
        | `retry.backoff` | | required | |\n";

    fn check(rows: &str) -> Option<String> {
        options_table_mismatch(&Typed(P), &format!("# p\n\n{HEADER}{rows}\ntext"), None)
    }

    #[test]
    fn a_table_in_the_pages_conventions_matches() {
        assert_eq!(check(GOOD), None);
        // The table after the section line, not the page's first.
        let page = format!("{HEADER}| `x` | | | |\n\n## Sink\n\n{HEADER}{GOOD}");
        assert_eq!(
            options_table_mismatch(&Typed(P), &page, Some("## Sink")),
            None
        );
        assert_eq!(
            options_table_mismatch(&Typed(P), &page, Some("## Parser")).unwrap(),
            "sink p: no line `## Parser` in its page"
        );
    }

    #[test]
    fn each_difference_is_named() {
        let said = |from: &str, to: &str| {
            assert!(GOOD.contains(from), "{from}");
            check(&GOOD.replace(from, to)).expect("a difference")
        };
        assert!(
            said("1 MiB", "2 MiB")
                .contains("`max_bytes`: the table says 2097152, the schema 1048576")
        );
        assert!(said("`\" \"`", "`,`").contains("`separator`: the table says"));
        assert!(
            said("required", "—").contains("`path`: the table says optional, the schema required")
        );
        assert!(
            said("unset: `body`", "`body`")
                .contains("`body`: the table says body, the schema none")
        );
        assert!(
            said("`[]` (every unit)", "every unit")
                .contains("`units`: the table says every unit, the schema []")
        );
        assert!(said("| `units` |", "| `unit` |").contains(
            "  `units` (default []) is not in the table\n  `unit` is in the table but not an option"
        ));
        assert!(
            said("`multiline.", "`multi.")
                .contains("`multiline` (default none) is not in the table")
        );
        // An option's keys, each with a row of its own, as the options.
        assert!(
            said("| 3 |", "| 4 |").contains("`retry.attempts`: the table says 4, the schema 3")
        );
        assert!(
            said("`retry.backoff` | | required", "`retry.backoff` | | —")
                .contains("`retry.backoff`: the table says optional, the schema required")
        );
        assert_eq!(
            said("`retry.backoff`", "`retry.jitter`"),
            "sink p: its options table differs from the schema\n  \
             `retry.backoff` (default none) is not in the table\n  \
             `retry.jitter` is in the table but not an option"
        );
        // A row of an option that comes with a cargo feature may be
        // missing from a build without it; a row that says no feature may not.
        let extra = "| `arrow` | | — | With cargo feature `p-arrow`. |\n";
        assert_eq!(check(&format!("{GOOD}{extra}")), None);
        assert!(
            check(&format!("{GOOD}{}", extra.replace("cargo feature", "the")))
                .unwrap()
                .contains("`arrow` is in the table but not an option")
        );
        // Where the schema has it, it is compared like any other row.
        assert!(
            said(
                "| `retry.attempts` | | 3 | |",
                "| `retry.attempts` | | 4 | Cargo feature `r`. |"
            )
            .contains("`retry.attempts`: the table says 4, the schema 3")
        );
        assert!(
            said("`retry.attempts` | | 3", "`retry` | | 3")
                .contains("`retry`: the table says 3, the schema none")
        );
        assert_eq!(
            check("").unwrap().lines().next(),
            Some("sink p: its options table differs from the schema")
        );
        assert_eq!(
            options_table_mismatch(&Typed(P), "no table", None).unwrap(),
            "sink p: no options table (`| name | …`)"
        );
        assert_eq!(
            options_table_mismatch(&Typed(P), "| name | type |\n|---|---|\n", None).unwrap(),
            "sink p: the options table has no `default` column"
        );
    }

    #[test]
    fn a_default_cell_reads_as_a_value_or_as_words() {
        let value = |cell: &str| DocDefault::Value(cell.to_string());
        let words = |cell: &str| DocDefault::Words(cell.to_string());
        for (cell, read) in [
            ("`auto`", value("auto")),
            ("`[]` (every unit)", value("[]")),
            ("`\" \"`", value(" ")),
            ("`\"\"`", value("")),
            ("`\"`", value("\"")),
            ("1000", value("1000")),
            ("0.5", value("0.5")),
            ("true", value("true")),
            ("false", value("false")),
            ("64 KiB", value("65536")),
            ("16 MiB", value("16777216")),
            ("2 GiB", value("2147483648")),
            ("268435456 (256 MiB)", value("268435456")),
            ("1 MB", words("1 MB")),
            ("x KiB", words("x KiB")),
            ("unset: `body`", words("unset: `body`")),
            ("—", words("—")),
            (
                "the system journal (all)",
                words("the system journal (all)"),
            ),
        ] {
            assert_eq!(DocDefault::read(cell), read, "{cell}");
        }
        assert_eq!(value("5").text(), "5");
        assert_eq!(words("—").text(), "—");
    }

    #[test]
    fn cells_split_at_bars_but_not_escaped_ones() {
        assert_eq!(table_cells("| `a` | x \\| y |  |"), ["`a`", "x | y", ""]);
        assert_eq!(table_cells("|a|b"), ["a", "b"]);
    }

    /// With a `required` column, that column says it.
    #[test]
    fn a_required_column_decides_what_is_required() {
        let page = "| name | type | default | required | description |\n|---|---|---|---|---|\n\
            | `path` | | — | yes | |\n| `max_bytes` | | 1 MiB | no | |\n\
            | `separator` | | `\" \"` | no | |\n| `units` | | `[]` | no | |\n\
            | `body` | | — | no | |\n| `multiline` | | — | no | |\n\
            | `retry` | | — | no | |\n";
        assert_eq!(options_table_mismatch(&Typed(P), page, None), None);
        let flipped = page.replace("| — | yes |", "| — | no |");
        assert!(
            options_table_mismatch(&Typed(P), &flipped, None)
                .unwrap()
                .contains("`path`: the table says optional, the schema required")
        );
    }

    /// A sink that never finishes fails the test with what it did, instead
    /// of hanging until an outer timeout kills it without a word.
    #[tokio::test(start_paused = true)]
    #[should_panic(
        expected = "the sink had not finished its input after 45s (0 events in, 0 committed, 0 errored)"
    )]
    async fn a_sink_that_never_finishes_fails_the_test_at_the_deadline() {
        struct Stuck;
        #[async_trait::async_trait]
        impl Sink for Stuck {
            async fn run(self: Box<Self>, _: &mut SinkContext) -> Result<(), StageError> {
                std::future::pending().await
            }
        }
        let _ = run_sink(Box::new(Stuck), vec![]).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_sink_that_finishes_just_before_the_deadline_passes() {
        struct Slow;
        #[async_trait::async_trait]
        impl Sink for Slow {
            async fn run(self: Box<Self>, _: &mut SinkContext) -> Result<(), StageError> {
                tokio::time::sleep(RUN_SINK_DEADLINE - Duration::from_millis(1)).await;
                Ok(())
            }
        }
        assert!(run_sink(Box::new(Slow), vec![]).await.0.is_ok());
    }

    /// A deadline of the test's own replaces the usual one.
    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "after 2s")]
    async fn a_deadline_of_its_own_is_kept() {
        struct Slow;
        #[async_trait::async_trait]
        impl Sink for Slow {
            async fn run(self: Box<Self>, _: &mut SinkContext) -> Result<(), StageError> {
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok(())
            }
        }
        let (ok, _) = run_sink_within(Duration::from_secs(4), Box::new(Slow), vec![]).await;
        assert!(ok.is_ok());
        let _ = run_sink_within(Duration::from_secs(2), Box::new(Slow), vec![]).await;
    }
}
