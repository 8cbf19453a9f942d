//! The checker: reads the YAML into the model, and collects every problem
//! (unknown plugins and options, a bad graph, a cycle, limits) with the
//! stage and position it concerns, instead of stopping at the first.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use logbus_plugin_api::engine::parse_options;
use logbus_plugin_api::{
    ArrivingFields, BuildContext, CheckOptions, Flow, Plugin, Registry, StageKind, Step, closest,
};
use serde_json::Value;

use super::{
    COMMON_KEYS, DEAD_SUFFIX, ERRORS_SUFFIX, MAX_WORKERS, OnError, Pipeline, QueueKind, QueueScope,
    QueueSpec, Settings, StageSpec,
};
use crate::connect::PlacedService;
use crate::diagnostic::Diagnostic;
use crate::flow::{FlowStage, Shape};
use crate::preflight::PlacedNeed;
use crate::yaml::{self, Node, NodeKind, Pos};

/// The outcome of validation: a pipeline when there is no error, and every
/// diagnostic (warnings included) either way.
pub struct Loaded {
    pub pipeline: Option<Pipeline>,
    pub diagnostics: Vec<Diagnostic>,
    /// Reads of fields no stage declares, where a stage left the fields
    /// open: warnings `validate --strict-fields` adds.
    pub undeclared: Vec<Diagnostic>,
    /// What each output carries, in dependency order, when
    /// [`LoadOptions::record_fields`] asked for it (`validate --fields`).
    pub fields: Vec<(String, Shape)>,
    /// What the stages need from the host (`validate --preflight`).
    pub host_needs: Vec<PlacedNeed>,
    /// The stages as `validate --connect` probes them, when
    /// [`LoadOptions::connect`] asked for them.
    pub services: Vec<PlacedService>,
}

impl Loaded {
    /// The host checks of `validate --preflight` ([`crate::preflight`]).
    pub fn preflight(&self) -> Vec<Diagnostic> {
        crate::preflight::check(&self.host_needs, self.pipeline.as_ref())
    }

    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot read pipeline file {}: {source}", path.display())]
pub struct UnreadableFile {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// What validation keeps beyond the diagnostics and the pipeline.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Keep what each output carries ([`Loaded::fields`]): memory in
    /// proportion to stages × fields, for `validate --fields`.
    pub record_fields: bool,
    /// Keep each stage's options, their places and what arrives at it
    /// ([`Loaded::services`]), for `validate --connect`.
    pub connect: bool,
}

/// Reads and validates a pipeline file, expanding variables from the process environment.
pub fn load_file(path: &Path, registry: &Registry) -> Result<Loaded, UnreadableFile> {
    load_file_with(path, registry, LoadOptions::default())
}

/// [`load_file`] keeping what [`LoadOptions`] asks for.
pub fn load_file_with(
    path: &Path,
    registry: &Registry,
    options: LoadOptions,
) -> Result<Loaded, UnreadableFile> {
    let text = read_text(path)?;
    Ok(load_str_with(
        &text,
        path,
        registry,
        &|k| std::env::var(k).ok(),
        options,
    ))
}

/// A pipeline file's text. A file that is not UTF-8 is refused naming the
/// first bad byte's line, column and offset (the standard library's
/// message gives no position).
pub fn read_text(path: &Path) -> Result<String, UnreadableFile> {
    let unreadable = |source| UnreadableFile {
        path: path.to_path_buf(),
        source,
    };
    let bytes = std::fs::read(path).map_err(unreadable)?;
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        let before = std::str::from_utf8(&bytes[..at]).expect("valid up to here");
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
        unreadable(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "not UTF-8: byte 0x{:02x} at line {line}, column {col} (byte offset {at})",
                bytes[at]
            ),
        ))
    })
}

/// Validates pipeline text. `path` is used for relative paths and messages only.
pub fn load_str(
    text: &str,
    path: &Path,
    registry: &Registry,
    env: &dyn Fn(&str) -> Option<String>,
) -> Loaded {
    load_str_with(text, path, registry, env, LoadOptions::default())
}

/// [`load_str`] keeping what [`LoadOptions`] asks for.
pub fn load_str_with(
    text: &str,
    path: &Path,
    registry: &Registry,
    env: &dyn Fn(&str) -> Option<String>,
    options: LoadOptions,
) -> Loaded {
    let mut cx = Checker {
        options,
        registry,
        env,
        diags: Vec::new(),
        undeclared: Vec::new(),
        flow_outputs: Vec::new(),
        host_needs: Vec::new(),
        services: Vec::new(),
        arriving: Vec::new(),
        base_dir: path
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from(".")),
    };
    let pipeline = cx.check(text, path);
    let mut diagnostics = cx.diags;
    diagnostics.sort_by_key(|d| (d.line.unwrap_or(0), d.col.unwrap_or(0)));
    let pipeline = pipeline.filter(|_| !diagnostics.iter().any(Diagnostic::is_error));
    let mut undeclared = cx.undeclared;
    undeclared.sort_by_key(|d| (d.line.unwrap_or(0), d.col.unwrap_or(0)));
    Loaded {
        pipeline,
        diagnostics,
        undeclared,
        fields: cx.flow_outputs,
        host_needs: cx.host_needs,
        services: crate::connect::with_arriving(cx.services, &cx.arriving),
    }
}

struct Checker<'a> {
    options: LoadOptions,
    registry: &'a Registry,
    env: &'a dyn Fn(&str) -> Option<String>,
    diags: Vec<Diagnostic>,
    undeclared: Vec<Diagnostic>,
    flow_outputs: Vec<(String, Shape)>,
    host_needs: Vec<PlacedNeed>,
    services: Vec<PlacedService>,
    arriving: Vec<(String, Shape)>,
    base_dir: PathBuf,
}

/// A stage as read, before the graph checks.
struct RawStage {
    id: String,
    pos: Pos,
    kind: Option<StageKind>,
    plugin_name: String,
    plugin: Option<Arc<dyn Plugin>>,
    inputs: Vec<(String, Pos)>,
    has_inputs_key: bool,
    on_error: OnError,
    workers: usize,
    ordered: bool,
    queue: Option<QueueSpec>,
    options: Value,
    /// Named outputs its plugin declares ([`Plugin::outputs`]).
    outputs: Vec<String>,
    /// A source's `codec:` or a sink's `format:`, as a stage of its own.
    attached: Option<Box<RawStage>>,
    /// What its plugin says it needs and does ([`Plugin::flow`]), and
    /// where in the file each step's option is.
    flow: Flow,
    step_pos: Vec<Pos>,
}

/// The key that attaches a parser to a source.
const ATTACHED_CODEC: &str = "codec";
/// The key that attaches a formatter to a sink.
const ATTACHED_FORMAT: &str = "format";

/// The attaching key a stage of `kind` may carry.
fn attached_key(kind: Option<StageKind>) -> Option<&'static str> {
    match kind {
        Some(StageKind::Source) => Some(ATTACHED_CODEC),
        Some(StageKind::Sink) => Some(ATTACHED_FORMAT),
        _ => None,
    }
}

impl Checker<'_> {
    fn push(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    fn check(&mut self, text: &str, path: &Path) -> Option<Pipeline> {
        let mut root = match yaml::parse(text) {
            Ok(Some(root)) => root,
            Ok(None) => {
                self.push(
                    Diagnostic::error(
                        "empty-file",
                        "the pipeline file is empty; it needs a `stages:` map",
                    )
                    .at(Pos { line: 1, col: 1 }),
                );
                return None;
            }
            Err(e) => {
                self.push(
                    Diagnostic::error("yaml-syntax", format!("invalid YAML: {}", e.message))
                        .at(e.pos),
                );
                return None;
            }
        };
        let mut env_errors = Vec::new();
        root.expand_env(self.env, &mut env_errors);
        for e in env_errors {
            self.push(Diagnostic::error("env-var", e.message).at(e.pos));
        }
        if root.entries().is_none() {
            self.push(
                Diagnostic::error(
                    "not-a-map",
                    "the top level must be a map with `stages:` (and optionally `settings:`)",
                )
                .at(root.pos),
            );
            return None;
        }

        for (key, _) in root.entries().unwrap_or_default() {
            let name = key.as_str().unwrap_or("");
            if !matches!(name, "settings" | "stages" | "tests") {
                let mut msg = format!("unknown top-level key `{name}`");
                if let Some(best) = closest(name, &["settings", "stages", "tests"]) {
                    msg.push_str(&format!("; did you mean `{best}`?"));
                }
                self.push(Diagnostic::error("unknown-key", msg).at(key.pos));
            }
        }

        let settings = self.check_settings(root.get("settings"));
        let Some(stages_node) = root.get("stages") else {
            self.push(Diagnostic::error("no-stages", "missing `stages:` map").at(root.pos));
            return None;
        };
        let stages = self.read_stages(stages_node);
        self.check_graph(&stages);
        self.check_plugin_limits(&stages);
        self.check_flow(&stages);

        let stages = stages
            .into_iter()
            .map(|s| {
                Some(StageSpec {
                    id: s.id,
                    pos: s.pos,
                    kind: s.kind?,
                    plugin_name: s.plugin_name,
                    plugin: s.plugin?,
                    inputs: s.inputs.into_iter().map(|(i, _)| i).collect(),
                    on_error: s.on_error,
                    workers: s.workers,
                    ordered: s.ordered,
                    queue: s.queue,
                    outputs: s.outputs,
                    options: s.options,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Pipeline {
            path: path.to_path_buf(),
            base_dir: self.base_dir.clone(),
            settings: settings?,
            stages,
        })
    }

    fn check_settings(&mut self, node: Option<&Node>) -> Option<Settings> {
        let Some(node) = node else {
            return Some(Settings::default());
        };
        if matches!(node.kind, NodeKind::Scalar { .. }) && node.to_json().is_null() {
            return Some(Settings::default());
        }
        let schema = schemars::schema_for!(Settings).to_value();
        let errors = match parse_options::<Settings>(&node.to_json(), &schema) {
            Ok(s) => {
                let errors = s.check();
                if errors.is_empty() {
                    return Some(s);
                }
                errors
            }
            Err(errors) => errors,
        };
        for e in errors {
            self.push(
                Diagnostic::error(
                    "settings",
                    match e.path.is_empty() {
                        true => format!("settings: {}", e.message),
                        false => format!("settings.{}: {}", e.path.join("."), e.message),
                    },
                )
                .at(node.pos_of(&e.path)),
            );
        }
        None
    }

    fn read_stages(&mut self, node: &Node) -> Vec<RawStage> {
        let Some(entries) = node.entries() else {
            self.push(
                Diagnostic::error("not-a-map", "`stages` must be a map from stage id to stage")
                    .at(node.pos),
            );
            return Vec::new();
        };
        if entries.is_empty() {
            self.push(Diagnostic::error("no-stages", "`stages` is empty").at(node.pos));
        }
        let mut first_seen: HashMap<String, Pos> = HashMap::new();
        let mut stages = Vec::new();
        for (key, value) in entries {
            let id = key.as_str().unwrap_or("").to_string();
            if let Some(first) = first_seen.get(&id) {
                self.push(
                    Diagnostic::error(
                        "duplicate-id",
                        format!(
                            "duplicate stage id `{id}` (first defined at line {})",
                            first.line
                        ),
                    )
                    .stage(&id)
                    .at(key.pos),
                );
                continue;
            }
            first_seen.insert(id.clone(), key.pos);
            if let Some(problem) = id_problem(&id) {
                self.push(Diagnostic::error("bad-id", problem).stage(&id).at(key.pos));
            }
            if let Some(mut stage) = self.read_stage(&id, key.pos, value) {
                match stage.attached.take().map(|a| *a) {
                    None => stages.push(stage),
                    // `codec:` — the source becomes `<id>.source`, its parser `<id>`.
                    Some(mut parser) if stage.kind == Some(StageKind::Source) => {
                        stage.id = format!("{id}.source");
                        // `on_error` was the codec's.
                        stage.on_error = OnError::default();
                        parser.inputs = vec![(stage.id.clone(), parser.pos)];
                        stages.push(stage);
                        stages.push(parser);
                    }
                    // `format:` — the formatter `<id>.format` takes the sink's inputs.
                    Some(mut formatter) => {
                        formatter.inputs = std::mem::take(&mut stage.inputs);
                        formatter.has_inputs_key = stage.has_inputs_key;
                        formatter.pos = stage.pos;
                        stage.inputs = vec![(formatter.id.clone(), formatter.pos)];
                        stage.has_inputs_key = true;
                        stages.push(formatter);
                        stages.push(stage);
                    }
                }
            }
        }
        stages
    }

    fn read_stage(&mut self, id: &str, pos: Pos, node: &Node) -> Option<RawStage> {
        let Some(entries) = node.entries() else {
            self.push(
                Diagnostic::error(
                    "not-a-map",
                    "a stage must be a map, e.g. `{ sink: stdout, inputs: [parse] }`",
                )
                .stage(id)
                .at(node.pos),
            );
            return None;
        };
        let (kind, plugin_name, plugin) = self.read_plugin_key(id, pos, entries);
        let (inputs, has_inputs_key) = self.read_inputs(id, node);
        let on_error = self.read_on_error(id, kind, node);
        let workers = self.read_workers(id, kind, node);
        let queue = self.read_queue(id, kind, node);
        let ordered = self.read_ordered(id, kind, node, queue.as_ref());
        let options = self.read_plugin_options(id, pos, kind, node, plugin.as_ref());
        let attached = self.read_attached(id, kind, node, on_error);
        let outputs = plugin
            .as_ref()
            .map_or_else(Vec::new, |p| p.outputs(&options));
        let flow = plugin
            .as_ref()
            .map_or_else(Flow::pass, |p| p.flow(&options));
        let step_pos = place_steps(&flow, Some(node), pos);
        if let Some(p) = &plugin {
            self.place_needs(id, p.as_ref(), &options, Some(node), pos);
            self.keep_for_connect(id, p, &options, Some(node), pos);
        }
        Some(RawStage {
            id: id.to_string(),
            pos,
            kind,
            plugin_name,
            plugin,
            inputs,
            has_inputs_key,
            on_error,
            workers,
            ordered,
            queue,
            options,
            outputs,
            attached,
            flow,
            step_pos,
        })
    }

    /// The one key among `source`, `parser`, `transform`, `formatter` and
    /// `sink`: the stage's kind, its plugin's name, and the plugin when this
    /// build has it.
    fn read_plugin_key(
        &mut self,
        id: &str,
        pos: Pos,
        entries: &[(Node, Node)],
    ) -> (Option<StageKind>, String, Option<Arc<dyn Plugin>>) {
        let plugin_keys: Vec<(&Node, &Node, StageKind)> = entries
            .iter()
            .filter_map(|(k, v)| Some((k, v, StageKind::from_key(k.as_str()?)?)))
            .collect();
        match plugin_keys.as_slice() {
            [] => {
                self.push(
                    Diagnostic::error(
                        "no-plugin",
                        "no plugin key; add exactly one of `source`, `parser`, `transform`, `formatter`, `sink`",
                    )
                    .stage(id)
                    .at(pos),
                );
                (None, String::new(), None)
            }
            [(key, value, kind)] => {
                let name = match &value.kind {
                    NodeKind::Scalar { text, .. } if !text.is_empty() => text.clone(),
                    _ => {
                        self.push(
                            Diagnostic::error(
                                "bad-plugin",
                                format!("`{}` must name a plugin", kind.key()),
                            )
                            .stage(id)
                            .at(value.pos),
                        );
                        String::new()
                    }
                };
                let plugin = if name.is_empty() {
                    None
                } else {
                    self.find_plugin(id, *kind, &name, key.pos)
                };
                (Some(*kind), name, plugin)
            }
            [first, second, ..] => {
                self.push(
                    Diagnostic::error(
                        "two-plugins",
                        format!(
                            "a stage has exactly one plugin key, found `{}` and `{}`",
                            first.2.key(),
                            second.2.key()
                        ),
                    )
                    .stage(id)
                    .at(second.0.pos),
                );
                (None, String::new(), None)
            }
        }
    }

    /// `inputs:` as (output name, position) pairs, and whether the key was
    /// there at all.
    fn read_inputs(&mut self, id: &str, node: &Node) -> (Vec<(String, Pos)>, bool) {
        let mut inputs = Vec::new();
        let mut has_inputs_key = false;
        if let Some((key, value)) = node.entry("inputs") {
            has_inputs_key = true;
            match &value.kind {
                NodeKind::Seq(items) => {
                    for item in items {
                        match item.as_str() {
                            Some(name) if !name.is_empty() => {
                                inputs.push((name.to_string(), item.pos))
                            }
                            _ => self.push(
                                Diagnostic::error("bad-input", "each input must be a stage id")
                                    .stage(id)
                                    .at(item.pos),
                            ),
                        }
                    }
                }
                NodeKind::Scalar { text, .. } if !text.is_empty() => {
                    inputs.push((text.clone(), value.pos))
                }
                _ => self.push(
                    Diagnostic::error("bad-input", "`inputs` must be a list of stage ids")
                        .stage(id)
                        .at(key.pos),
                ),
            }
        }
        (inputs, has_inputs_key)
    }

    fn read_on_error(&mut self, id: &str, kind: Option<StageKind>, node: &Node) -> OnError {
        let mut on_error = OnError::default();
        if let Some((key, value)) = node.entry("on_error") {
            match value.as_str() {
                Some("drop") => on_error = OnError::Drop,
                Some("fail") => on_error = OnError::Fail,
                Some("route") => on_error = OnError::Route,
                other => self.push(
                    Diagnostic::error(
                        "bad-option",
                        format!(
                            "`on_error` must be `drop`, `fail` or `route`, got `{}`",
                            other.unwrap_or("?")
                        ),
                    )
                    .stage(id)
                    .at(value.pos),
                ),
            }
            let codec_source =
                kind == Some(StageKind::Source) && node.entry(ATTACHED_CODEC).is_some();
            if kind.is_some_and(|k| !k.is_processor()) && !codec_source {
                self.push(
                    Diagnostic::error(
                        "bad-option",
                        "`on_error` applies to parsers, transforms and formatters (and to a source's `codec`) only",
                    )
                    .stage(id)
                    .at(key.pos),
                );
            }
        }
        on_error
    }

    fn read_workers(&mut self, id: &str, kind: Option<StageKind>, node: &Node) -> usize {
        let mut workers = 1;
        if let Some((key, value)) = node.entry("workers") {
            match value.to_json().as_u64() {
                Some(n) if (1..=MAX_WORKERS as u64).contains(&n) => workers = n as usize,
                _ => self.push(
                    Diagnostic::error(
                        "bad-option",
                        format!("`workers` must be a whole number from 1 to {MAX_WORKERS}"),
                    )
                    .stage(id)
                    .at(value.pos),
                ),
            }
            if kind == Some(StageKind::Source) {
                self.push(
                    Diagnostic::error(
                        "bad-option",
                        "`workers` applies to parsers, transforms, formatters and sinks",
                    )
                    .stage(id)
                    .at(key.pos),
                );
            }
        }
        workers
    }

    /// `ordered: true`: the workers of a processor stage hand on their
    /// batches in the order they took them. A local-scope queue has no one
    /// order to keep (each producer has its own ring), and a sink's workers
    /// each write on their own, so both are refused.
    fn read_ordered(
        &mut self,
        id: &str,
        kind: Option<StageKind>,
        node: &Node,
        queue: Option<&QueueSpec>,
    ) -> bool {
        let Some((key, value)) = node.entry("ordered") else {
            return false;
        };
        let Some(ordered) = value.to_json().as_bool() else {
            self.push(
                Diagnostic::error("bad-option", "`ordered` must be true or false")
                    .stage(id)
                    .at(value.pos),
            );
            return false;
        };
        if matches!(kind, Some(StageKind::Source | StageKind::Sink)) {
            self.push(
                Diagnostic::error(
                    "bad-option",
                    "`ordered` applies to parsers, transforms and formatters (a sink's workers each write on their own)",
                )
                .stage(id)
                .at(key.pos),
            );
            return false;
        }
        if ordered && queue.is_some_and(|q| q.kind != QueueKind::Memory) {
            self.push(
                Diagnostic::error(
                    "bad-option",
                    "`ordered` needs a memory queue: a `disk` or `disk-assisted` queue delivers again what a failed run left, out of turn",
                )
                .stage(id)
                .at(key.pos),
            );
            return false;
        }
        if ordered && queue.is_some_and(|q| q.scope == QueueScope::Local) {
            self.push(
                Diagnostic::error(
                    "bad-option",
                    "`ordered` needs a global queue: with `scope: local` each producer has its own ring, so there is no one order to keep",
                )
                .stage(id)
                .at(key.pos),
            );
            return false;
        }
        ordered
    }

    fn read_queue(&mut self, id: &str, kind: Option<StageKind>, node: &Node) -> Option<QueueSpec> {
        let mut queue = None;
        if let Some((key, value)) = node.entry("queue") {
            if kind == Some(StageKind::Source) {
                self.push(
                    Diagnostic::error(
                        "bad-option",
                        "a source has no input queue; `queue` applies to the stages it feeds",
                    )
                    .stage(id)
                    .at(key.pos),
                );
            }
            let schema = schemars::schema_for!(QueueSpec).to_value();
            let errors = match parse_options::<QueueSpec>(&value.to_json(), &schema) {
                Ok(q) => {
                    let errors = q.check();
                    queue = Some(q);
                    errors
                }
                Err(errors) => errors,
            };
            for e in errors {
                self.push(
                    Diagnostic::error(
                        "bad-option",
                        format!(
                            "{}: {}",
                            std::iter::once("queue")
                                .chain(e.path.iter().map(String::as_str))
                                .collect::<Vec<_>>()
                                .join("."),
                            e.message
                        ),
                    )
                    .stage(id)
                    .at(value.pos_of(&e.path)),
                );
            }
        }
        queue
    }

    /// Every key that is not common to all stages belongs to the plugin;
    /// the plugin checks them (with positions mapped back to the file).
    fn read_plugin_options(
        &mut self,
        id: &str,
        pos: Pos,
        kind: Option<StageKind>,
        node: &Node,
        plugin: Option<&Arc<dyn Plugin>>,
    ) -> Value {
        let entries = node.entries().unwrap_or_default();
        // Everything else belongs to the plugin.
        let mut options = serde_json::Map::new();
        for (k, v) in entries {
            let key = k.as_str().unwrap_or("");
            if StageKind::from_key(key).is_some() || COMMON_KEYS.contains(&key) {
                continue;
            }
            if attached_key(kind) == Some(key) {
                continue;
            }
            options.insert(key.to_string(), v.to_json());
        }
        let options = Value::Object(options);
        if let Some(plugin) = plugin {
            let bcx = BuildContext {
                stage_id: id.to_string(),
                base_dir: self.base_dir.clone(),
                worker: 0,
            };
            for e in plugin.check(&options, &bcx) {
                let at = if e.path.is_empty() {
                    pos
                } else {
                    option_pos(node, &e)
                };
                let what = if e.path.is_empty() {
                    String::new()
                } else {
                    format!("option `{}`: ", e.path.join("."))
                };
                self.push(
                    Diagnostic::error("bad-option", format!("{what}{}", e.message))
                        .stage(id)
                        .at(at),
                );
            }
        }
        options
    }

    /// Reads a source's `codec:` or a sink's `format:`: a plugin name
    /// (`codec: json`) or a one-entry map of a name and its options
    /// (`format: { csv: { columns: [a, b] } }`). It becomes a stage of its
    /// own: the parser takes the source's id (so readers and `<id>.errors`
    /// see parsed events; the source itself is `<id>.source`), the
    /// formatter is `<id>.format` in front of the sink.
    fn read_attached(
        &mut self,
        id: &str,
        kind: Option<StageKind>,
        node: &Node,
        on_error: OnError,
    ) -> Option<Box<RawStage>> {
        let key_name = attached_key(kind)?;
        let (key, value) = node.entry(key_name)?;
        let (attached_kind, attached_id) = if kind == Some(StageKind::Source) {
            (StageKind::Parser, id.to_string())
        } else {
            (StageKind::Formatter, format!("{id}.format"))
        };
        let (name, options, options_node) = match &value.kind {
            NodeKind::Scalar { text, .. } if !text.is_empty() => {
                (text.clone(), Value::Object(Default::default()), None)
            }
            _ => match value.entries() {
                Some([(k, v)]) if k.as_str().is_some_and(|n| !n.is_empty()) => {
                    let options = match v.to_json() {
                        Value::Null => Value::Object(Default::default()),
                        other => other,
                    };
                    (k.as_str().unwrap_or("").to_string(), options, Some(v))
                }
                _ => {
                    self.push(
                        Diagnostic::error(
                            "bad-option",
                            format!(
                                "`{key_name}` must name a {} plugin, or be a map of one name to its options",
                                attached_kind.key()
                            ),
                        )
                        .stage(id)
                        .at(value.pos),
                    );
                    return None;
                }
            },
        };
        let plugin = self.find_plugin(&attached_id, attached_kind, &name, key.pos)?;
        let bcx = BuildContext {
            stage_id: attached_id.clone(),
            base_dir: self.base_dir.clone(),
            worker: 0,
        };
        for e in plugin.check(&options, &bcx) {
            let at = match (options_node, e.path.is_empty()) {
                (Some(n), false) => option_pos(n, &e),
                _ => value.pos,
            };
            let what = if e.path.is_empty() {
                String::new()
            } else {
                format!("option `{}`: ", e.path.join("."))
            };
            self.push(
                Diagnostic::error(
                    "bad-option",
                    format!("`{key_name}: {name}`: {what}{}", e.message),
                )
                .stage(id)
                .at(at),
            );
        }
        let flow = plugin.flow(&options);
        let step_pos = place_steps(&flow, options_node, value.pos);
        self.place_needs(
            &attached_id,
            plugin.as_ref(),
            &options,
            options_node,
            value.pos,
        );
        self.keep_for_connect(&attached_id, &plugin, &options, options_node, value.pos);
        Some(Box::new(RawStage {
            id: attached_id,
            pos: key.pos,
            kind: Some(attached_kind),
            plugin_name: name,
            plugin: Some(plugin),
            inputs: Vec::new(),
            has_inputs_key: true,
            on_error,
            workers: 1,
            ordered: false,
            queue: None,
            options,
            outputs: Vec::new(),
            attached: None,
            flow,
            step_pos,
        }))
    }

    fn find_plugin(
        &mut self,
        id: &str,
        kind: StageKind,
        name: &str,
        pos: Pos,
    ) -> Option<Arc<dyn Plugin>> {
        if let Some(p) = self.registry.get(kind, name) {
            return Some(p.clone());
        }
        let message = if let Some(feature) = self.registry.absent_feature(kind, name) {
            format!("{kind} `{name}` is not in this build; rebuild with cargo feature `{feature}`")
        } else {
            let names = self.registry.names(kind);
            let mut msg = format!("unknown {kind} plugin `{name}`");
            if let Some(best) = closest(name, &names) {
                msg.push_str(&format!("; did you mean `{best}`?"));
            }
            let other_kinds: Vec<&str> = StageKind::ALL
                .into_iter()
                .filter(|k| *k != kind && self.registry.get(*k, name).is_some())
                .map(StageKind::key)
                .collect();
            if !other_kinds.is_empty() {
                msg.push_str(&format!(
                    " (`{name}` exists as a {})",
                    other_kinds.join(", ")
                ));
            }
            msg.push_str(&format!(
                "; {kind} plugins in this build: {}",
                names.join(", ")
            ));
            msg
        };
        self.push(
            Diagnostic::error("unknown-plugin", message)
                .stage(id)
                .at(pos),
        );
        None
    }

    fn check_graph(&mut self, stages: &[RawStage]) {
        let by_id: BTreeMap<&str, &RawStage> = stages.iter().map(|s| (s.id.as_str(), s)).collect();
        let ids: Vec<&str> = by_id.keys().copied().collect();
        // Flow edges: upstream id -> downstream id.
        let mut edges: BTreeMap<&str, Vec<&str>> = BTreeMap::new();

        for s in stages {
            let is_source = s.kind == Some(StageKind::Source);
            if is_source && !s.inputs.is_empty() {
                self.push(
                    Diagnostic::error(
                        "source-with-inputs",
                        "a source reads no other stage; remove `inputs`",
                    )
                    .stage(&s.id)
                    .at(s.inputs[0].1),
                );
            }
            if !is_source && s.kind.is_some() && s.inputs.is_empty() {
                let hint = if s.has_inputs_key {
                    "`inputs` is empty"
                } else {
                    "no `inputs`"
                };
                self.push(
                    Diagnostic::error(
                        "no-inputs",
                        format!(
                            "{hint}; a {} needs at least one input stage",
                            s.kind.map_or("stage", StageKind::key)
                        ),
                    )
                    .stage(&s.id)
                    .at(s.pos),
                );
            }
            let mut seen = HashSet::new();
            for (input, pos) in &s.inputs {
                if !seen.insert(input.as_str()) {
                    self.push(
                        Diagnostic::error(
                            "duplicate-input",
                            format!("input `{input}` is listed twice"),
                        )
                        .stage(&s.id)
                        .at(*pos),
                    );
                    continue;
                }
                // A named output (`<id>.<route>`) of a stage that declares
                // some; a stage that does has no main output.
                if let Some((base, name)) = input.split_once('.')
                    && let Some(up) = by_id.get(base)
                    && !up.outputs.is_empty()
                    && name != "errors"
                {
                    if up.outputs.iter().any(|o| o == name) {
                        edges.entry(base).or_default().push(s.id.as_str());
                    } else {
                        let mut msg = format!(
                            "`{base}` has no output `{name}`; its outputs are {}",
                            list_outputs(base, &up.outputs)
                        );
                        let names: Vec<&str> = up.outputs.iter().map(String::as_str).collect();
                        if let Some(best) = closest(name, &names) {
                            msg.push_str(&format!("; did you mean `{base}.{best}`?"));
                        }
                        self.push(
                            Diagnostic::error("unknown-output", msg)
                                .stage(&s.id)
                                .at(*pos),
                        );
                    }
                    continue;
                }
                if let Some(up) = by_id.get(input.as_str())
                    && !up.outputs.is_empty()
                {
                    self.push(
                        Diagnostic::error(
                            "no-main-output",
                            format!(
                                "`{input}` sends each event to its named outputs only; read one of {}",
                                list_outputs(input, &up.outputs)
                            ),
                        )
                        .stage(&s.id)
                        .at(*pos),
                    );
                    continue;
                }
                let (upstream_id, errors_output) = match input.strip_suffix(ERRORS_SUFFIX) {
                    Some(base) if by_id.contains_key(base) => (base, true),
                    _ => (input.as_str(), false),
                };
                let (upstream_id, dead_output) = match upstream_id.strip_suffix(DEAD_SUFFIX) {
                    Some(base) if !errors_output && by_id.contains_key(base) => (base, true),
                    _ => (upstream_id, false),
                };
                let Some(upstream) = by_id.get(upstream_id) else {
                    let mut msg = format!("input `{input}` names no stage");
                    if let Some(best) = closest(input, &ids) {
                        msg.push_str(&format!("; did you mean `{best}`?"));
                    }
                    self.push(
                        Diagnostic::error("unknown-input", msg)
                            .stage(&s.id)
                            .at(*pos),
                    );
                    continue;
                };
                if dead_output && upstream.kind != Some(StageKind::Sink) {
                    self.push(
                        Diagnostic::error(
                            "no-dead-output",
                            format!("`{input}`: only sinks have a `.dead` output, and `{upstream_id}` is not a sink"),
                        )
                        .stage(&s.id)
                        .at(*pos),
                    );
                    continue;
                }
                if upstream.kind == Some(StageKind::Sink) && !dead_output {
                    self.push(
                        Diagnostic::error(
                            "sink-as-input",
                            format!("`{upstream_id}` is a sink; a sink's only output is `{upstream_id}{DEAD_SUFFIX}`, what it could not deliver"),
                        )
                        .stage(&s.id)
                        .at(*pos),
                    );
                    continue;
                }
                if errors_output && upstream.on_error != OnError::Route {
                    self.push(
                        Diagnostic::error(
                            "no-error-output",
                            format!("`{input}` exists only when stage `{upstream_id}` has `on_error: route`"),
                        )
                        .stage(&s.id)
                        .at(*pos),
                    );
                    continue;
                }
                edges.entry(upstream_id).or_default().push(s.id.as_str());
            }
        }

        let in_cycle = self.report_cycles(&ids, &edges, &by_id);

        // Stages whose output can never reach a sink: walk the edges
        // backwards from the sinks, each stage once (linear in the graph).
        let mut feeders: HashMap<&str, Vec<&str>> = HashMap::new();
        for (up, downs) in &edges {
            for down in downs {
                feeders.entry(down).or_default().push(up);
            }
        }
        let mut reaches_sink: HashSet<&str> = stages
            .iter()
            .filter(|s| s.kind == Some(StageKind::Sink))
            .map(|s| s.id.as_str())
            .collect();
        let mut frontier: Vec<&str> = reaches_sink.iter().copied().collect();
        while let Some(stage) = frontier.pop() {
            for &up in feeders.get(stage).map(Vec::as_slice).unwrap_or_default() {
                if reaches_sink.insert(up) {
                    frontier.push(up);
                }
            }
        }
        let read: HashSet<&str> = stages
            .iter()
            .flat_map(|s| s.inputs.iter().map(|(i, _)| i.as_str()))
            .collect();
        for s in stages {
            if s.kind.is_some()
                && !reaches_sink.contains(s.id.as_str())
                && !in_cycle.contains(s.id.as_str())
            {
                self.push(
                    Diagnostic::warning(
                        "no-sink",
                        "output reaches no sink; its events would be discarded",
                    )
                    .stage(&s.id)
                    .at(s.pos),
                );
            }
            // A named output nobody reads (but the catch-all, which a
            // route stage often leaves unread on purpose).
            for output in s.outputs.iter().filter(|o| !o.starts_with('_')) {
                let name = format!("{}.{output}", s.id);
                if !read.contains(name.as_str()) {
                    self.push(
                        Diagnostic::warning(
                            "unread-output",
                            format!(
                                "no stage reads `{name}`; the events it gets would be discarded"
                            ),
                        )
                        .stage(&s.id)
                        .at(s.pos),
                    );
                }
            }
            if s.on_error == OnError::Route {
                let name = format!("{}{ERRORS_SUFFIX}", s.id);
                if !read.contains(name.as_str()) {
                    self.push(
                        Diagnostic::warning(
                            "unread-errors",
                            format!("`on_error: route` but no stage reads `{name}`; failed events would be discarded"),
                        )
                        .stage(&s.id)
                        .at(s.pos),
                    );
                }
            }
        }
    }

    /// What the stage needs from the host, at the options that say so
    /// (checked by `validate --preflight` only).
    fn place_needs(
        &mut self,
        id: &str,
        plugin: &dyn Plugin,
        options: &Value,
        node: Option<&Node>,
        fallback: Pos,
    ) {
        let bcx = BuildContext {
            stage_id: id.to_string(),
            base_dir: self.base_dir.clone(),
            worker: 0,
        };
        for stated in plugin.host_needs(options, &bcx) {
            let pos = match node {
                Some(n) if !stated.option.is_empty() => n.pos_of(&stated.option),
                _ => fallback,
            };
            self.host_needs.push(PlacedNeed {
                stage: id.to_string(),
                pos,
                option: stated.option.join("."),
                need: stated.need,
            });
        }
    }

    /// A stage as `validate --connect` will probe it (only when asked).
    fn keep_for_connect(
        &mut self,
        id: &str,
        plugin: &Arc<dyn Plugin>,
        options: &Value,
        node: Option<&Node>,
        pos: Pos,
    ) {
        if self.options.connect {
            self.services.push(PlacedService {
                stage: id.to_string(),
                plugin: plugin.clone(),
                options: options.clone(),
                node: node.cloned(),
                pos,
                base_dir: self.base_dir.clone(),
                arriving: ArrivingFields::default(),
            });
        }
    }

    /// Follows the data through the graph ([`crate::flow`]).
    fn check_flow(&mut self, stages: &[RawStage]) {
        let flow_stages: Vec<FlowStage<'_>> = stages
            .iter()
            .filter_map(|s| {
                Some(FlowStage {
                    id: &s.id,
                    kind: s.kind?,
                    plugin: &s.plugin_name,
                    pos: s.pos,
                    inputs: &s.inputs,
                    named_outputs: &s.outputs,
                    flow: &s.flow,
                    step_pos: &s.step_pos,
                })
            })
            .collect();
        let record = self.options.record_fields || self.options.connect;
        let report = crate::flow::analyse(&flow_stages, record);
        self.diags.extend(report.diagnostics);
        self.undeclared = report.undeclared;
        if self.options.record_fields {
            self.flow_outputs = report.outputs;
        }
        self.arriving = report.inputs;
    }

    fn check_plugin_limits(&mut self, stages: &[RawStage]) {
        // The first stage of each limited plugin, and how many came so far.
        let mut seen: HashMap<(StageKind, &str), (&str, usize)> = HashMap::new();
        for s in stages {
            let (Some(plugin), Some(kind)) = (&s.plugin, s.kind) else {
                continue;
            };
            let Some(max) = plugin.max_per_pipeline() else {
                continue;
            };
            let (first, count) = seen
                .entry((kind, s.plugin_name.as_str()))
                .or_insert((s.id.as_str(), 0));
            let position = *count;
            *count += 1;
            if position >= max {
                self.push(
                    Diagnostic::error(
                        "plugin-limit",
                        format!(
                            "{kind} `{}` may be used by at most {max} stage(s) per pipeline; `{first}` already does",
                            s.plugin_name
                        ),
                    )
                    .stage(&s.id)
                    .at(s.pos),
                );
            }
        }
    }

    /// Reports each cycle once, as `a -> b -> a` in the direction events flow.
    fn report_cycles<'s>(
        &mut self,
        ids: &[&'s str],
        edges: &BTreeMap<&'s str, Vec<&'s str>>,
        by_id: &BTreeMap<&'s str, &RawStage>,
    ) -> HashSet<&'s str> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            Open,
            Done,
        }
        let mut marks: HashMap<&str, Mark> = ids.iter().map(|i| (*i, Mark::New)).collect();
        let mut cycles: Vec<Vec<&str>> = Vec::new();
        for &start in ids {
            if marks[start] != Mark::New {
                continue;
            }
            // Iterative DFS: (node, next edge index); `path` mirrors the open nodes.
            let mut stack: Vec<(&str, usize)> = vec![(start, 0)];
            marks.insert(start, Mark::Open);
            while let Some((node, next)) = stack.last_mut() {
                let downs = edges.get(*node).map(Vec::as_slice).unwrap_or_default();
                if *next < downs.len() {
                    let d = downs[*next];
                    *next += 1;
                    match marks[d] {
                        Mark::New => {
                            marks.insert(d, Mark::Open);
                            stack.push((d, 0));
                        }
                        Mark::Open => {
                            let from = stack
                                .iter()
                                .position(|(n, _)| *n == d)
                                .expect("open node is on the stack");
                            let mut cycle: Vec<&str> =
                                stack[from..].iter().map(|(n, _)| *n).collect();
                            cycle.push(d);
                            cycles.push(cycle);
                        }
                        Mark::Done => {}
                    }
                } else {
                    marks.insert(*node, Mark::Done);
                    stack.pop();
                }
            }
        }
        let mut in_cycle = HashSet::new();
        for cycle in cycles {
            in_cycle.extend(cycle.iter().copied());
            let first = cycle[0];
            let pos = by_id.get(first).map(|s| s.pos).unwrap_or_default();
            self.push(
                Diagnostic::error("cycle", format!("cycle: {}", cycle.join(" -> ")))
                    .stage(first)
                    .at(pos),
            );
        }
        in_cycle
    }
}

/// Stage ids become metric labels, file names and `<id>.errors` outputs.
fn id_problem(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("stage id is empty".into());
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Some(format!(
            "stage id `{id}` may contain only letters, digits, `_` and `-`"
        ));
    }
    None
}

/// Where an option error is: the option's key, or — for an error inside
/// an option's text (a condition) — that place in the file: the scalar's
/// position plus the offset (past the opening quote of a quoted one; in a
/// block scalar, that line of its text).
fn option_pos(node: &Node, e: &logbus_plugin_api::OptionError) -> Pos {
    let key = node.pos_of(&e.path);
    let Some(offset) = e.offset else {
        return key;
    };
    let mut value = node;
    for seg in &e.path {
        match value.get(seg) {
            Some(v) => value = v,
            None => return key,
        }
    }
    let NodeKind::Scalar { text, plain } = &value.kind else {
        return key;
    };
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count();
    if text.contains('\n') {
        // A block scalar's position is its first line of text; the
        // indentation YAML strips is the same on every line.
        let line = before.matches('\n').count();
        Pos {
            line: value.pos.line + line,
            col: value.pos.col + col,
        }
    } else {
        Pos {
            line: value.pos.line,
            col: value.pos.col + usize::from(!plain) + col,
        }
    }
}

/// Where each step of a flow is stated: its option's position (inside
/// the text for a condition or template), else `fallback`.
fn place_steps(flow: &Flow, node: Option<&Node>, fallback: Pos) -> Vec<Pos> {
    flow.steps
        .iter()
        .map(|step| {
            let (option, offset) = match step {
                Step::Read(r) => (&r.option, r.offset),
                Step::Set { option, .. }
                | Step::Delete { option, .. }
                | Step::Copy { option, .. }
                | Step::Rename { option, .. } => (option, None),
                _ => return fallback,
            };
            match node {
                Some(node) if !option.is_empty() => option_pos(
                    node,
                    &logbus_plugin_api::OptionError {
                        path: option.clone(),
                        message: String::new(),
                        offset,
                    },
                ),
                _ => fallback,
            }
        })
        .collect()
}

/// `a.x`, `a.y` and `a.z`, for a message.
fn list_outputs(id: &str, outputs: &[String]) -> String {
    let names: Vec<String> = outputs.iter().map(|o| format!("`{id}.{o}`")).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.concat(),
    }
}
