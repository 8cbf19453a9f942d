//! Following the data through the DAG before anything runs.
//!
//! The shape checks (options, wiring, cycles) cannot see a filter wired to
//! an unparsed source, a sink template naming a field no stage sets, or
//! `level == error` comparing with a field nobody produces: each of those
//! is valid YAML and a correct graph, and fails only at run time, quietly.
//! Each plugin states what it needs and does ([`Flow`]); this module walks
//! the stages in dependency order, carrying for every output what may
//! arrive there (raw lines, parsed fields, which fields with which types,
//! and whether some stage left the set open), and reports a read where
//! the set is known and the field is not in it.
//!
//! The rule that keeps it free of false alarms: an open set (parsed JSON,
//! a script, a plugin that states nothing) makes every unknown field
//! possible. Only the right-hand side of a field-to-field comparison is
//! reported under an open set, because that is the one case that is
//! almost always a typo; the strict mode (`validate --strict-fields`)
//! reports the other reads too, naming the stage that left the set open.

use std::collections::HashMap;
use std::sync::Arc;

use logbus_plugin_api::{
    FieldRead, FieldType, Flow, Needs, ReadRole, Replay, StageKind, Step, closest,
};
use serde::Serialize;

use crate::config::{DEAD_SUFFIX, ERRORS_SUFFIX};
use crate::diagnostic::Diagnostic;
use crate::yaml::Pos;

/// A stage as the analysis sees it.
pub struct FlowStage<'a> {
    pub id: &'a str,
    pub kind: StageKind,
    pub plugin: &'a str,
    pub pos: Pos,
    pub inputs: &'a [(String, Pos)],
    /// Named outputs (`route`'s); a stage with some has no main output.
    pub named_outputs: &'a [String],
    pub flow: &'a Flow,
    /// Where each step's option is in the file (the stage when it has none).
    pub step_pos: &'a [Pos],
}

/// One field known to reach a point of the pipeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KnownField {
    #[serde(rename = "type")]
    pub ty: FieldTypeName,
    /// The stage that set it last.
    pub set_by: Arc<str>,
    /// Set by a transform on purpose (not parsed out of the input), not
    /// read since, on a path without fan-out since: deleting it now means
    /// the set was for nothing (`field-set-unused`).
    #[serde(skip)]
    pub unused_set: bool,
}

/// A [`FieldType`] as JSON and text write it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FieldTypeName(pub FieldType);

impl Serialize for FieldTypeName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(type_word(self.0))
    }
}

fn type_word(t: FieldType) -> &'static str {
    match t {
        FieldType::String => "string",
        FieldType::Number => "number",
        FieldType::Bool => "boolean",
        FieldType::Object => "object",
        FieldType::Array => "array",
        FieldType::Any => "any",
    }
}

/// What may arrive at one point of the pipeline.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Shape {
    /// Raw (unparsed) events may arrive.
    pub raw: bool,
    /// Parsed events may arrive.
    pub parsed: bool,
    /// Fields known to be set on some path, by dotted path (a persistent
    /// map: passing a shape on or setting one field copies nothing else).
    pub fields: imbl::OrdMap<String, KnownField>,
    /// The first stage after which any other field may be there too
    /// (`None`: exactly the known fields).
    pub open_after: Option<String>,
    /// The sources whose events come here, by stage id.
    #[serde(skip)]
    pub sources: imbl::OrdMap<Arc<str>, Reach>,
}

/// How one source's events reach a point of the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    /// How many ways (saturating): more than one, and one source event
    /// can arrive twice, as copies that share its position.
    pub ways: u32,
    /// What the source states about a crash (nothing: no re-read).
    pub replay: Replay,
}

impl Shape {
    fn union(&mut self, other: &Shape) {
        self.raw |= other.raw;
        self.parsed |= other.parsed;
        if self.fields.is_empty() {
            self.fields = other.fields.clone();
        } else {
            self.union_fields(other);
        }
        if self.open_after.is_none() {
            self.open_after.clone_from(&other.open_after);
        }
        if self.sources.is_empty() {
            self.sources = other.sources.clone();
        } else {
            for (source, reach) in &other.sources {
                match self.sources.get_mut(source) {
                    Some(mine) => mine.ways = mine.ways.saturating_add(reach.ways),
                    None => {
                        self.sources.insert(source.clone(), *reach);
                    }
                }
            }
        }
    }

    fn union_fields(&mut self, other: &Shape) {
        for (name, f) in &other.fields {
            match self.fields.get_mut(name) {
                Some(mine) => {
                    mine.ty = FieldTypeName(mine.ty.0.join(f.ty.0));
                    mine.unused_set &= f.unused_set;
                }
                None => {
                    self.fields.insert(name.clone(), f.clone());
                }
            }
        }
    }

    /// What a failed event looks like on `<id>.errors` or `<id>.dead`: as
    /// it arrived, a raw one as `{message}`, with `_error` added.
    fn failed(&self, by: &str) -> Shape {
        let mut out = self.clone();
        if out.raw {
            out.raw = false;
            out.fields
                .insert("message".into(), known(FieldType::String, by));
        }
        out.parsed = self.raw || self.parsed;
        out.fields
            .insert("_error".into(), known(FieldType::Object, by));
        out.fields
            .insert("_error.stage".into(), known(FieldType::String, by));
        out.fields
            .insert("_error.message".into(), known(FieldType::String, by));
        out
    }

    /// Changes every known field (a script, a fan-out: once per such
    /// stage).
    fn each_field(&mut self, change: impl Fn(&mut KnownField)) {
        let keys: Vec<String> = self.fields.keys().cloned().collect();
        for k in keys {
            if let Some(f) = self.fields.get_mut(&k) {
                change(f);
            }
        }
    }

    /// `field` and the fields under it: contiguous in the map's order
    /// from `field` on (among keys that start with its text).
    fn tree(&self, field: &str) -> Vec<(String, KnownField)> {
        let prefix = format!("{field}.");
        self.fields
            .range(field.to_string()..)
            .take_while(|(k, _)| k.starts_with(field))
            .filter(|(k, _)| *k == field || k.starts_with(&prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn remove_tree(&mut self, field: &str) -> Vec<(String, KnownField)> {
        let keys: Vec<String> = self.tree(field).into_iter().map(|(k, _)| k).collect();
        keys.into_iter()
            .map(|k| {
                let v = self.fields.remove(&k).expect("listed");
                (k, v)
            })
            .collect()
    }

    /// What reading `field` finds.
    fn lookup(&self, field: &str) -> Lookup {
        if let Some(f) = self.fields.get(field) {
            return Lookup::Known(f.ty.0, f.set_by.to_string());
        }
        // Under an object (or a value of unknown kind) set whole.
        let mut end = field.len();
        while let Some(dot) = field[..end].rfind('.') {
            if let Some(f) = self.fields.get(&field[..dot]) {
                return match f.ty.0 {
                    FieldType::Object | FieldType::Any => {
                        Lookup::Known(FieldType::Any, f.set_by.to_string())
                    }
                    _ if self.open_after.is_some() => Lookup::Open,
                    _ => Lookup::Missing,
                };
            }
            end = dot;
        }
        // A parent of known fields.
        let prefix = format!("{field}.");
        if let Some((k, f)) = self.fields.range(prefix.clone()..).next()
            && k.starts_with(&prefix)
        {
            return Lookup::Known(FieldType::Object, f.set_by.to_string());
        }
        if self.open_after.is_some() {
            Lookup::Open
        } else {
            Lookup::Missing
        }
    }
}

fn known(ty: FieldType, by: &str) -> KnownField {
    KnownField {
        ty: FieldTypeName(ty),
        set_by: Arc::from(by),
        unused_set: false,
    }
}

enum Lookup {
    Known(FieldType, String),
    Open,
    Missing,
}

/// What the analysis found.
#[derive(Default)]
pub struct FlowReport {
    pub diagnostics: Vec<Diagnostic>,
    /// Reads of fields no stage is known to set, under an open set: shown
    /// by `validate --strict-fields` only.
    pub undeclared: Vec<Diagnostic>,
    /// What each stage's main (or each named) output carries, by output
    /// name, in dependency order.
    pub outputs: Vec<(String, Shape)>,
    /// What arrives at each stage, by stage id, when recording.
    pub inputs: Vec<(String, Shape)>,
    /// Per sink, the sources that reach it: what a crash costs there.
    pub deliveries: Vec<Delivery>,
}

/// The sources that reach one sink, and whether it names events by
/// their source position.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub sink: String,
    pub names_by_position: bool,
    pub sources: Vec<(String, Reach)>,
}

/// What a crash costs between one source and one sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Guarantee {
    /// What the source had in flight is lost.
    AtMostOnce,
    /// Re-read: duplicates, never gaps.
    AtLeastOnce,
    /// Re-read, and the sink's destination recognises what it holds.
    EffectivelyOnce,
}

impl Delivery {
    /// The guarantee from one source.
    pub fn guarantee(&self, reach: &Reach) -> Guarantee {
        match (
            reach.replay.rereads,
            reach.replay.positions && self.names_by_position,
        ) {
            (false, _) => Guarantee::AtMostOnce,
            (true, false) => Guarantee::AtLeastOnce,
            (true, true) => Guarantee::EffectivelyOnce,
        }
    }
}

/// The stage that produces output `name`, by index.
fn owner(name: &str, index: &HashMap<&str, usize>) -> Option<usize> {
    if let Some(&i) = index.get(name) {
        return Some(i);
    }
    let (stage, _) = name.rsplit_once('.')?;
    index.get(stage).copied()
}

/// Follows the data; `record`: keep each output's shape in the report
/// (`validate --fields`), which costs memory in proportion to stages ×
/// fields, so only when asked.
pub fn analyse(stages: &[FlowStage<'_>], record: bool) -> FlowReport {
    let index: HashMap<&str, usize> = stages.iter().enumerate().map(|(i, s)| (s.id, i)).collect();
    // Kahn's order; stages on a cycle (reported elsewhere) are left out.
    let mut waiting: Vec<usize> = stages.iter().map(|s| s.inputs.len()).collect();
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); stages.len()];
    for (i, s) in stages.iter().enumerate() {
        for (input, _) in s.inputs {
            match owner(input, &index) {
                Some(o) => readers[o].push(i),
                None => waiting[i] -= 1,
            }
        }
    }
    let mut read: HashMap<&str, usize> = HashMap::new();
    for s in stages {
        for (n, _) in s.inputs {
            *read.entry(n.as_str()).or_default() += 1;
        }
    }
    // An output read by several stages: a field set before it may be
    // read on one branch and deleted on another.
    let carry = |name: &str, mut shape: Shape| {
        if read.get(name).copied().unwrap_or(0) > 1 {
            shape.each_field(|f| f.unused_set = false);
        }
        shape
    };
    let mut ready: Vec<usize> = (0..stages.len()).filter(|&i| waiting[i] == 0).collect();
    ready.reverse();
    let mut report = FlowReport::default();
    let mut carried: HashMap<String, Shape> = HashMap::new();
    while let Some(i) = ready.pop() {
        let s = &stages[i];
        let mut input = Shape::default();
        for (name, _) in s.inputs {
            if let Some(shape) = carried.get(name) {
                input.union(shape);
            }
        }
        let out = run_stage(s, &input, &carried, &mut report);
        if record {
            report.inputs.push((s.id.to_string(), input.clone()));
        }
        if s.kind == StageKind::Sink {
        } else if s.named_outputs.is_empty() {
            if record {
                report.outputs.push((s.id.to_string(), out.clone()));
            }
            carried.insert(s.id.to_string(), carry(s.id, out));
        } else {
            for name in s.named_outputs {
                let full = format!("{}.{name}", s.id);
                if record {
                    report.outputs.push((full.clone(), out.clone()));
                }
                let shape = carry(&full, out.clone());
                carried.insert(full, shape);
            }
        }
        let side = match s.kind {
            StageKind::Sink => DEAD_SUFFIX,
            _ => ERRORS_SUFFIX,
        };
        let side = format!("{}{side}", s.id);
        let failed = input.failed(s.id);
        if record && read.contains_key(side.as_str()) {
            report.outputs.push((side.clone(), failed.clone()));
        }
        carried.insert(side, failed);
        for &r in readers[i].iter().rev() {
            waiting[r] -= 1;
            if waiting[r] == 0 {
                ready.push(r);
            }
        }
    }
    report
}

fn describe_inputs(s: &FlowStage<'_>, carried: &HashMap<String, Shape>, raw: bool) -> String {
    let names: Vec<String> = s
        .inputs
        .iter()
        .filter(|(n, _)| {
            carried
                .get(n)
                .is_some_and(|c| if raw { c.raw } else { c.parsed })
        })
        .map(|(n, _)| format!("`{n}`"))
        .collect();
    names.join(", ")
}

fn run_stage(
    s: &FlowStage<'_>,
    input: &Shape,
    carried: &HashMap<String, Shape>,
    report: &mut FlowReport,
) -> Shape {
    let mut cur = input.clone();
    let has_input = !s.inputs.is_empty() && (input.raw || input.parsed);
    let input_pos = |raw: bool| {
        s.inputs
            .iter()
            .find(|(n, _)| {
                carried
                    .get(n)
                    .is_some_and(|c| if raw { c.raw } else { c.parsed })
            })
            .map_or(s.pos, |(_, p)| *p)
    };
    let mut skip_reads = false;
    match s.flow.needs {
        Needs::Fields if has_input && input.raw && !input.parsed => {
            let fix = match s.kind {
                StageKind::Formatter => "a formatter writes parsed fields",
                _ => "it works on fields",
            };
            report.diagnostics.push(
                Diagnostic::error(
                    "needs-fields",
                    format!(
                        "{} `{}` needs parsed events ({fix}), but every event from {} is raw: add a parser between them (e.g. `parser: json` or `parser: kv`), or give the source a `codec:`",
                        s.kind,
                        s.plugin,
                        describe_inputs(s, carried, true)
                    ),
                )
                .stage(s.id)
                .at(input_pos(true)),
            );
            skip_reads = true;
        }
        Needs::Raw if has_input && input.parsed && !input.raw => {
            report.diagnostics.push(
                Diagnostic::error(
                    "needs-raw",
                    format!(
                        "{} `{}` reads raw lines, but every event from {} is already parsed: read the source directly, or put a formatter (e.g. `formatter: json`) in between",
                        s.kind,
                        s.plugin,
                        describe_inputs(s, carried, false)
                    ),
                )
                .stage(s.id)
                .at(input_pos(false)),
            );
            skip_reads = true;
        }
        _ => {}
    }
    if s.flow.needs == Needs::Fields {
        // Raw events go to `<id>.errors`, not on.
        cur.raw = false;
    }
    for (n, step) in s.flow.steps.iter().enumerate() {
        let at = s.step_pos.get(n).copied().unwrap_or(s.pos);
        match step {
            Step::Read(read) => {
                if !skip_reads && has_input {
                    check_read(s, read, &cur, at, report);
                }
                mark_read(&mut cur, &read.field);
            }
            Step::Set { field, ty, .. } => {
                cur.remove_tree(field);
                let mut f = known(*ty, s.id);
                f.unused_set = s.kind == StageKind::Transform;
                cur.fields.insert(field.clone(), f);
            }
            Step::Delete { field, .. } => {
                if let Some(f) = cur.fields.get(field)
                    && f.unused_set
                {
                    let by = if *f.set_by == *s.id {
                        "this stage".to_string()
                    } else {
                        format!("`{}`", f.set_by)
                    };
                    report.diagnostics.push(
                        Diagnostic::warning(
                            "field-set-unused",
                            format!(
                                "`{field}` is set by {by} and deleted here before any stage reads it: drop the set, or the delete"
                            ),
                        )
                        .stage(s.id)
                        .at(at),
                    );
                }
                cur.remove_tree(field);
            }
            Step::Copy { from, to, .. } => {
                let copied = cur.tree(from);
                cur.remove_tree(to);
                if copied.is_empty() && cur.open_after.is_some() {
                    cur.fields.insert(to.clone(), known(FieldType::Any, s.id));
                }
                for (k, mut v) in copied {
                    v.set_by = Arc::from(s.id);
                    v.unused_set = s.kind == StageKind::Transform;
                    cur.fields.insert(format!("{to}{}", &k[from.len()..]), v);
                }
            }
            Step::Rename { from, to, .. } => {
                let moved = cur.remove_tree(from);
                cur.remove_tree(to);
                if moved.is_empty() && cur.open_after.is_some() {
                    cur.fields.insert(to.clone(), known(FieldType::Any, s.id));
                }
                for (k, mut v) in moved {
                    v.set_by = Arc::from(s.id);
                    cur.fields.insert(format!("{to}{}", &k[from.len()..]), v);
                }
            }
            Step::EmitRaw => {
                cur = Shape {
                    raw: true,
                    ..Shape::default()
                }
            }
            Step::EmitFields { open } => {
                cur = Shape {
                    parsed: true,
                    open_after: open.then(|| s.id.to_string()),
                    ..Shape::default()
                }
            }
            Step::Opaque => {
                cur.each_field(|f| f.unused_set = false);
                cur.parsed |= cur.raw || !has_input;
                if cur.open_after.is_none() {
                    cur.open_after = Some(s.id.to_string());
                }
                cur.each_field(|f| f.ty = FieldTypeName(FieldType::Any));
            }
            Step::RawAsMessage => {
                if cur.raw {
                    cur.raw = false;
                    cur.parsed = true;
                    cur.fields
                        .insert("message".into(), known(FieldType::String, s.id));
                }
            }
            Step::EmitAny => {
                cur = Shape {
                    raw: true,
                    parsed: true,
                    open_after: Some(s.id.to_string()),
                    ..Shape::default()
                }
            }
            Step::Replay(_) => {}
            Step::NamesByPosition { option } => {
                check_single_paths(s, input, option, at, report);
            }
        }
    }
    if s.kind == StageKind::Sink {
        report.deliveries.push(Delivery {
            sink: s.id.to_string(),
            names_by_position: s
                .flow
                .steps
                .iter()
                .any(|step| matches!(step, Step::NamesByPosition { .. })),
            sources: input
                .sources
                .iter()
                .map(|(id, reach)| (id.to_string(), *reach))
                .collect(),
        });
        return Shape::default();
    }
    // The data may be replaced; where it came from is not.
    cur.sources = if s.inputs.is_empty() {
        let replay = s
            .flow
            .steps
            .iter()
            .find_map(|step| match step {
                Step::Replay(r) => Some(*r),
                _ => None,
            })
            .unwrap_or(Replay {
                rereads: false,
                positions: false,
            });
        imbl::OrdMap::unit(Arc::from(s.id), Reach { ways: 1, replay })
    } else {
        input.sources.clone()
    };
    cur
}

/// A stage that names events by their source position needs each source
/// to reach it one way only: two copies of one event would get one name,
/// and the destination would keep one of them.
fn check_single_paths(
    s: &FlowStage<'_>,
    input: &Shape,
    option: &[String],
    at: Pos,
    report: &mut FlowReport,
) {
    let twice: Vec<String> = input
        .sources
        .iter()
        .filter(|(_, r)| r.ways > 1)
        .map(|(source, r)| format!("`{source}` ({} ways)", r.ways))
        .collect();
    let unplaced: Vec<String> = input
        .sources
        .iter()
        .filter(|(_, r)| !r.replay.positions)
        .map(|(source, _)| format!("`{source}`"))
        .collect();
    if !unplaced.is_empty() {
        let names = unplaced;
        report.diagnostics.push(
            Diagnostic::warning(
                "position-missing",
                format!(
                    "names each event by its source position, but {} gives its events none: those get ids from the destination, and a crash repeats or loses them as it would without positions",
                    names.join(", ")
                ),
            )
            .stage(s.id)
            .at(at),
        );
    }
    if twice.is_empty() {
        return;
    }
    report.diagnostics.push(
        Diagnostic::error(
            "position-names-twice",
            format!(
                "names each event by its source position, but events of {} can reach it more than one way (fan-out that joins again, a route to several outputs it reads): two copies of one event would share a name and one would replace the other. Read each source through one path, or turn `{}` off",
                twice.join(", "),
                option.join(".")
            ),
        )
        .stage(s.id)
        .at(at),
    );
}

/// A read uses the field, what it holds and what holds it.
fn mark_read(cur: &mut Shape, field: &str) {
    let mut used: Vec<String> = cur.tree(field).into_iter().map(|(k, _)| k).collect();
    let mut end = field.len();
    while let Some(dot) = field[..end].rfind('.') {
        used.push(field[..dot].to_string());
        end = dot;
    }
    for name in used {
        if let Some(f) = cur.fields.get_mut(&name)
            && f.unused_set
        {
            f.unused_set = false;
        }
    }
}

fn check_read(s: &FlowStage<'_>, read: &FieldRead, cur: &Shape, at: Pos, report: &mut FlowReport) {
    let field = read.field.as_str();
    let lookup = if cur.parsed {
        cur.lookup(field)
    } else {
        Lookup::Missing
    };
    match lookup {
        Lookup::Known(ty, by) => {
            if let Some(want) = read.expects
                && ty != FieldType::Any
                && want != FieldType::Any
                && ty != want
            {
                report.diagnostics.push(
                    Diagnostic::warning(
                        "type-mismatch",
                        format!(
                            "`{field}` is {} here (set by `{by}`), but this compares it with {}: it never matches; convert it first (`transform: fields` with `convert:`) or compare with {}",
                            ty.describe(),
                            want.describe(),
                            ty.describe()
                        ),
                    )
                    .stage(s.id)
                    .at(at),
                );
            }
        }
        Lookup::Open => match read.role {
            ReadRole::RightOperand => report.diagnostics.push(compared_to_unknown(s, field, at)),
            ReadRole::Probe => {}
            ReadRole::Required | ReadRole::Optional => {
                let by = cur.open_after.as_deref().unwrap_or("?");
                report.undeclared.push(
                    Diagnostic::warning(
                        "field-undeclared",
                        format!(
                            "`{field}` is read here, but no stage upstream declares it: `{by}` leaves its fields open; declare what it produces (`fields:` on a JSON parser or a JS transform) to have reads checked"
                        ),
                    )
                    .stage(s.id)
                    .at(at),
                );
            }
        },
        Lookup::Missing => {
            let known: Vec<&str> = cur.fields.keys().map(String::as_str).collect();
            // (A message lists them; only a missing read gets here.)
            let what = if !cur.parsed {
                "the events reaching it are raw (unparsed), so they have no fields".to_string()
            } else if known.is_empty() {
                "the events reaching it have no known fields".to_string()
            } else {
                let mut shown: Vec<String> =
                    known.iter().take(8).map(|k| format!("`{k}`")).collect();
                if known.len() > 8 {
                    shown.push(format!("and {} more", known.len() - 8));
                }
                format!("the events reaching it have {}", shown.join(", "))
            };
            let hint = closest(field, &known)
                .map(|b| format!("; did you mean `{b}`?"))
                .unwrap_or_default();
            let d = match read.role {
                ReadRole::Probe => return,
                ReadRole::RightOperand => {
                    report.diagnostics.push(compared_to_unknown(s, field, at));
                    return;
                }
                ReadRole::Required => Diagnostic::error(
                    "field-not-produced",
                    format!(
                        "`{field}` is read here, but no upstream stage produces it: {what}{hint}"
                    ),
                ),
                ReadRole::Optional => Diagnostic::warning(
                    "field-not-produced",
                    format!(
                        "`{field}` is read here, but no upstream stage produces it, so it is always missing: {what}{hint}"
                    ),
                ),
            };
            report.diagnostics.push(d.stage(s.id).at(at));
        }
    }
}

fn compared_to_unknown(s: &FlowStage<'_>, field: &str, at: Pos) -> Diagnostic {
    Diagnostic::warning(
        "field-compared-to-unknown",
        format!(
            "`{field}` is compared as a field, and no upstream stage is known to produce it; did you mean the string \"{field}\"? (quote it: `\"{field}\"`)"
        ),
    )
    .stage(s.id)
    .at(at)
}

#[cfg(test)]
mod tests;
