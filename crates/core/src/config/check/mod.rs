//! The checker: reads the YAML into the model, and collects every problem
//! (unknown plugins and options, a bad graph, a cycle, limits) with the
//! stage and position it concerns, instead of stopping at the first.
//! This module reads the file and the settings and runs the passes; one
//! stage is read in `stage`, the whole graph checked in `graph`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use logbus_plugin_api::engine::parse_options;
use logbus_plugin_api::{CheckOptions, Flow, Plugin, Registry, StageKind, closest};
use serde_json::Value;

use super::{OnError, Pipeline, QueueSpec, Settings, StageSpec};
use crate::connect::PlacedService;
use crate::diagnostic::Diagnostic;
use crate::flow::Shape;
use crate::preflight::PlacedNeed;
use crate::yaml::{self, Node, NodeKind, Pos};

mod graph;
mod stage;

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
    /// Per sink, the sources that reach it and what a crash costs
    /// between them (`validate` prints it).
    pub deliveries: Vec<crate::flow::Delivery>,
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
        deliveries: Vec::new(),
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
        deliveries: cx.deliveries,
    }
}

struct Checker<'a> {
    options: LoadOptions,
    registry: &'a Registry,
    env: &'a dyn Fn(&str) -> Option<String>,
    diags: Vec<Diagnostic>,
    undeclared: Vec<Diagnostic>,
    flow_outputs: Vec<(String, Shape)>,
    deliveries: Vec<crate::flow::Delivery>,
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
}
