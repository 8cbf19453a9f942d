//! The checks that need every stage at once: inputs that name stages and
//! outputs that exist, cycles, outputs nobody reads, fan-in limits, the
//! data's flow along the graph ([`crate::flow`]) and the plugins' own
//! limits on the whole pipeline.

use std::collections::{BTreeMap, HashMap, HashSet};

use logbus_plugin_api::{StageKind, closest};

use super::{Checker, RawStage};
use crate::config::{DEAD_SUFFIX, ERRORS_SUFFIX, OnError};
use crate::diagnostic::Diagnostic;
use crate::flow::FlowStage;

impl Checker<'_> {
    pub(super) fn check_graph(&mut self, stages: &[RawStage]) {
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

    /// Follows the data through the graph ([`crate::flow`]).
    pub(super) fn check_flow(&mut self, stages: &[RawStage]) {
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
        self.deliveries = report.deliveries;
    }

    pub(super) fn check_plugin_limits(&mut self, stages: &[RawStage]) {
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

/// `a.x`, `a.y` and `a.z`, for a message.
fn list_outputs(id: &str, outputs: &[String]) -> String {
    let names: Vec<String> = outputs.iter().map(|o| format!("`{id}.{o}`")).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.concat(),
    }
}
