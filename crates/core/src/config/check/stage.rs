//! Reading one stage: its plugin key and options (checked by the plugin,
//! placed at their line), `inputs:`, `workers:`, `on_error:`, its queue,
//! an attached codec or format, and what it states it needs from the host
//! and the services it talks to. Apart from the graph checks because a
//! stage is read alone; the graph needs all of them.

use std::collections::HashMap;
use std::sync::Arc;

use logbus_plugin_api::engine::parse_options;
use logbus_plugin_api::{
    ArrivingFields, BuildContext, CheckOptions, Flow, Plugin, StageKind, Step, closest,
};
use serde_json::Value;

use super::{Checker, RawStage};
use crate::config::{COMMON_KEYS, MAX_WORKERS, OnError, QueueKind, QueueScope, QueueSpec};
use crate::connect::PlacedService;
use crate::diagnostic::Diagnostic;
use crate::preflight::PlacedNeed;
use crate::yaml::{Node, NodeKind, Pos};

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
    pub(super) fn read_stages(&mut self, node: &Node) -> Vec<RawStage> {
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
                | Step::Rename { option, .. }
                | Step::NamesByPosition { option } => (option, None),
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
