//! `transform: fields`: copy, rename, set (constants or templates of
//! other fields), from_meta, lookup (a table from a field's value),
//! convert (types), case and delete. Operations run in that fixed order,
//! whatever order the keys have in the file, so a pipeline reads the same
//! way it runs; these are the reshapes a JS stage was needed for, at
//! native speed.

use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, EventError, FieldPath, FieldRead, FieldType, Fields, Flow,
    Needs, OptionError, Processor, ReadRole, StageKind, Step, TypedPlugin, Verdict,
};
use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

use crate::{field_path, needs_fields, type_of};

/// Options of `transform: fields`.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldsOptions {
    /// `from: to` — copy a field's value to another field (first).
    #[serde(default)]
    pub copy: Fields,
    /// `from: to` — move a field (second). A missing `from` is skipped.
    #[serde(default)]
    pub rename: Fields,
    /// `field: value` — set fields (third): constants, or a string with
    /// `{{path}}` in it, a template of other fields
    /// (`"{{service}}: {{message}}"`; a missing field renders empty, a
    /// non-string one as JSON).
    #[serde(default)]
    pub set: Fields,
    /// `field: what` — set fields from the event's metadata (fourth):
    /// `origin`, where the source found it (a tailed file's path); `source`,
    /// the id of the source stage; `attributes`, everything the source
    /// attached (an object: a Kafka message's topic, partition, offset,
    /// key, headers, timestamp); or `attributes.<path>`, one of them
    /// (`attributes.headers.trace_id`). What the event does not have is
    /// skipped.
    #[serde(default)]
    pub from_meta: std::collections::BTreeMap<String, String>,
    /// `target: {from, table, default}` — write the table's value for the
    /// `from` field's value into `target` (fifth); with no match,
    /// `default`, or nothing when there is none. Numbers and booleans are
    /// looked up by their text (`200` finds the key `"200"`).
    #[serde(default)]
    pub lookup: std::collections::BTreeMap<String, Lookup>,
    /// `field: integer | float | boolean | string` — convert a value
    /// (sixth); one that does not convert is the event's error (for
    /// `on_error`). A missing field is skipped.
    #[serde(default)]
    pub convert: std::collections::BTreeMap<String, Conversion>,
    /// `field: upper | lower` — change a string's case (seventh); other
    /// values are left alone.
    #[serde(default)]
    pub case: std::collections::BTreeMap<String, Case>,
    /// Fields to remove (last).
    #[serde(default)]
    pub delete: Vec<String>,
}

/// One `lookup` entry.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Lookup {
    /// The field whose value is looked up.
    pub from: String,
    /// Value → replacement.
    #[serde(default)]
    pub table: Fields,
    /// A table in a file, read when the pipeline is built (and so again
    /// at each reload): a JSON object, or CSV (`.csv`) rows of
    /// `key,value` — a value that reads as a JSON number or boolean is
    /// one, else text. Inline `table` entries win over the file's.
    #[serde(default)]
    pub file: Option<std::path::PathBuf>,
    /// Written when the value is not in the table (or `from` is missing).
    #[serde(default)]
    pub default: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Conversion {
    Integer,
    Float,
    Boolean,
    String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Case {
    Upper,
    Lower,
}

/// The largest lookup file read: tables are held whole in memory, once
/// per worker, and a file past this is more likely a mistake (or a device
/// such as `/dev/zero`, which never ends) than a table.
pub const MAX_LOOKUP_FILE_BYTES: u64 = 64 << 20;

/// The text of a lookup file: a regular file of at most
/// [`MAX_LOOKUP_FILE_BYTES`], read no further than that even if it grows.
fn read_table_text(full: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let reading = |e: std::io::Error| format!("reading {}: {e}", full.display());
    let file = std::fs::File::open(full).map_err(reading)?;
    let meta = file.metadata().map_err(reading)?;
    if !meta.is_file() {
        return Err(format!(
            "{}: not a regular file (a lookup table is read whole when the pipeline is built)",
            full.display()
        ));
    }
    let too_big = || {
        format!(
            "{}: larger than {} MiB; a lookup table is held in memory whole",
            full.display(),
            MAX_LOOKUP_FILE_BYTES >> 20
        )
    };
    if meta.len() > MAX_LOOKUP_FILE_BYTES {
        return Err(too_big());
    }
    let mut text = String::new();
    file.take(MAX_LOOKUP_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(reading)?;
    if text.len() as u64 > MAX_LOOKUP_FILE_BYTES {
        return Err(too_big());
    }
    Ok(text)
}

/// The table of `lookup.<target>.file`, resolved against `base`.
fn table_file(path: &std::path::Path, base: &std::path::Path) -> Result<Fields, String> {
    let full = base.join(path);
    let text = read_table_text(&full)?;
    if full
        .extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("csv"))
    {
        let mut table = Fields::new();
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .comment(Some(b'#'))
            .flexible(true)
            .from_reader(text.as_bytes());
        for (i, row) in reader.records().enumerate() {
            let row = row.map_err(|e| format!("{}: {e}", full.display()))?;
            // A quoted value may hold a line break in CSV, but in a table
            // of one-line keys and values it is an unclosed quote that
            // would swallow the rows after it.
            if row.iter().any(|field| field.contains(['\n', '\r'])) {
                let line = row.position().map_or(0, |p| p.line());
                return Err(format!(
                    "{}: line {line}: a quoted value runs past the end of its line (an unclosed quote?); lookup keys and values are one line each",
                    full.display()
                ));
            }
            if row.len() != 2 {
                return Err(format!(
                    "{}: row {} has {} columns; a lookup table has two (key,value)",
                    full.display(),
                    i + 1,
                    row.len()
                ));
            }
            let value = match serde_json::from_str::<Value>(&row[1]) {
                Ok(v @ (Value::Number(_) | Value::Bool(_))) => v,
                _ => Value::String(row[1].to_string()),
            };
            table.insert(row[0].to_string(), value);
        }
        Ok(table)
    } else {
        serde_json::from_str::<Fields>(&text)
            .map_err(|e| format!("{}: not a JSON object of key: value ({e})", full.display()))
    }
}

/// A `set` value: a constant, or a template.
#[derive(Debug)]
enum SetValue {
    Constant(Value),
    Template(Vec<Part>),
}

#[derive(Debug)]
enum Part {
    Text(String),
    Field(FieldPath),
}

/// `"{{service}}: {{message}}"` into its parts; `None` when there is no
/// `{{` (a constant).
fn template(text: &str, at: &[&str]) -> Result<Option<Vec<Part>>, OptionError> {
    if !text.contains("{{") {
        return Ok(None);
    }
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        if open > 0 {
            parts.push(Part::Text(rest[..open].to_string()));
        }
        let after = &rest[open + 2..];
        let close = after.find("}}").ok_or_else(|| {
            OptionError::inside(at, text.len() - rest.len() + open, "`{{` without its `}}`")
        })?;
        let path = after[..close].trim();
        let path = FieldPath::parse(path).map_err(|e| {
            OptionError::inside(
                at,
                text.len() - rest.len() + open,
                format!("in `{{{{…}}}}`: {e}"),
            )
        })?;
        parts.push(Part::Field(path));
        rest = &after[close + 2..];
    }
    if !rest.is_empty() {
        parts.push(Part::Text(rest.to_string()));
    }
    Ok(Some(parts))
}

fn render(parts: &[Part], event: &Event) -> String {
    let mut out = String::new();
    for part in parts {
        match part {
            Part::Text(t) => out.push_str(t),
            Part::Field(p) => match event.field(p).as_deref() {
                Some(Value::String(s)) => out.push_str(s),
                Some(Value::Null) | None => {}
                Some(other) => out.push_str(&other.to_string()),
            },
        }
    }
    out
}

/// The table key a value is looked up by.
fn key_of(v: &Value) -> Option<std::borrow::Cow<'_, str>> {
    match v {
        Value::String(s) => Some(std::borrow::Cow::Borrowed(s)),
        Value::Number(_) | Value::Bool(_) => Some(std::borrow::Cow::Owned(v.to_string())),
        _ => None,
    }
}

fn convert(v: &Value, to: Conversion) -> Result<Value, String> {
    let bad = || {
        format!(
            "cannot convert {v} to {}",
            match to {
                Conversion::Integer => "an integer",
                Conversion::Float => "a float",
                Conversion::Boolean => "a boolean",
                Conversion::String => "a string",
            }
        )
    };
    Ok(match (to, v) {
        (Conversion::String, Value::String(_)) => v.clone(),
        (Conversion::String, Value::Null) => return Err(bad()),
        (Conversion::String, other) => Value::String(other.to_string()),
        (Conversion::Integer, Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.2e18 => Value::from(f as i64),
            _ => match n.as_u64() {
                Some(u) => Value::from(u),
                None => return Err(bad()),
            },
        },
        (Conversion::Integer, Value::String(s)) => {
            let t = s.trim();
            match t.parse::<i64>() {
                Ok(i) => Value::from(i),
                Err(_) => match t.parse::<u64>() {
                    Ok(u) => Value::from(u),
                    Err(_) => return Err(bad()),
                },
            }
        }
        (Conversion::Integer, Value::Bool(b)) => Value::from(i64::from(*b)),
        (Conversion::Float, Value::Number(n)) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .ok_or_else(bad)?,
        (Conversion::Float, Value::String(s)) => s
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .ok_or_else(bad)?,
        (Conversion::Boolean, Value::Bool(_)) => v.clone(),
        (Conversion::Boolean, Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "1" => Value::Bool(true),
            "false" | "no" | "off" | "0" => Value::Bool(false),
            _ => return Err(bad()),
        },
        (Conversion::Boolean, Value::Number(n)) if n.as_f64() == Some(0.0) => Value::Bool(false),
        (Conversion::Boolean, Value::Number(n)) if n.as_f64() == Some(1.0) => Value::Bool(true),
        _ => return Err(bad()),
    })
}

/// What of an event's metadata `from_meta` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaKey {
    Origin,
    Source,
    Attributes,
    Attribute(FieldPath),
}

impl MetaKey {
    fn parse(what: &str, at: &[&str]) -> Result<MetaKey, OptionError> {
        match what {
            "origin" => Ok(MetaKey::Origin),
            "source" => Ok(MetaKey::Source),
            "attributes" => Ok(MetaKey::Attributes),
            other => match other.strip_prefix("attributes.") {
                Some(path) => field_path(path, at).map(MetaKey::Attribute),
                None => Err(OptionError::at(
                    at,
                    format!(
                        "unknown metadata `{other}`: use origin, source, attributes or attributes.<name>"
                    ),
                )),
            },
        }
    }
}

struct Plan {
    copy: Vec<(FieldPath, FieldPath)>,
    rename: Vec<(FieldPath, FieldPath)>,
    set: Vec<(FieldPath, SetValue)>,
    from_meta: Vec<(FieldPath, MetaKey)>,
    lookup: Vec<(FieldPath, FieldPath, Fields, Option<Value>)>,
    convert: Vec<(FieldPath, Conversion)>,
    case: Vec<(FieldPath, Case)>,
    delete: Vec<FieldPath>,
}

fn pairs(map: &Fields, option: &str) -> Result<Vec<(FieldPath, FieldPath)>, OptionError> {
    map.iter()
        .map(|(from, to)| {
            let to = to.as_str().ok_or_else(|| {
                OptionError::at(
                    &[option, from],
                    "the target must be a field name (a string)",
                )
            })?;
            Ok((
                field_path(from, &[option, from])?,
                field_path(to, &[option, from])?,
            ))
        })
        .collect()
}

impl FieldsOptions {
    /// The plan; lookup files are read from `base` when it is given (at
    /// build), and left for later when not (the context-free check).
    fn plan_in(&self, base: Option<&std::path::Path>) -> Result<Plan, Vec<OptionError>> {
        let mut errors = Vec::new();
        let copy = pairs(&self.copy, "copy")
            .map_err(|e| errors.push(e))
            .unwrap_or_default();
        let rename = pairs(&self.rename, "rename")
            .map_err(|e| errors.push(e))
            .unwrap_or_default();
        let mut set = Vec::new();
        for (k, v) in &self.set {
            let value = match v.as_str().map(|t| template(t, &["set", k])) {
                Some(Ok(Some(parts))) => SetValue::Template(parts),
                Some(Err(e)) => {
                    errors.push(e);
                    continue;
                }
                _ => SetValue::Constant(v.clone()),
            };
            match field_path(k, &["set", k]) {
                Ok(p) => set.push((p, value)),
                Err(e) => errors.push(e),
            }
        }
        let mut lookup = Vec::new();
        for (k, l) in &self.lookup {
            let target = field_path(k, &["lookup", k]);
            let from = field_path(&l.from, &["lookup", k, "from"]);
            match (target, from) {
                (Ok(t), Ok(f)) => {
                    let mut table = Fields::new();
                    if let (Some(file), Some(base)) = (&l.file, base) {
                        match table_file(file, base) {
                            Ok(t) => table = t,
                            Err(e) => errors.push(OptionError::at(&["lookup", k, "file"], e)),
                        }
                    }
                    table.extend(l.table.clone());
                    lookup.push((t, f, table, l.default.clone()))
                }
                (Err(e), _) | (_, Err(e)) => errors.push(e),
            }
            if l.table.is_empty() && l.default.is_none() && l.file.is_none() {
                errors.push(OptionError::at(
                    &["lookup", k, "table"],
                    "the table is empty and there is no default: nothing would be written",
                ));
            }
        }
        let mut convert = Vec::new();
        for (k, c) in &self.convert {
            match field_path(k, &["convert", k]) {
                Ok(p) => convert.push((p, *c)),
                Err(e) => errors.push(e),
            }
        }
        let mut case = Vec::new();
        for (k, c) in &self.case {
            match field_path(k, &["case", k]) {
                Ok(p) => case.push((p, *c)),
                Err(e) => errors.push(e),
            }
        }
        let mut from_meta = Vec::new();
        for (k, what) in &self.from_meta {
            let at = ["from_meta", k.as_str()];
            match field_path(k, &at).and_then(|p| Ok((p, MetaKey::parse(what, &at)?))) {
                Ok(pair) => from_meta.push(pair),
                Err(e) => errors.push(e),
            }
        }
        let mut delete = Vec::new();
        for (i, k) in self.delete.iter().enumerate() {
            match field_path(k, &["delete", &i.to_string()]) {
                Ok(p) => delete.push(p),
                Err(e) => errors.push(e),
            }
        }
        if copy.is_empty()
            && rename.is_empty()
            && set.is_empty()
            && from_meta.is_empty()
            && lookup.is_empty()
            && convert.is_empty()
            && case.is_empty()
            && delete.is_empty()
            && errors.is_empty()
        {
            errors.push(OptionError::at(
                &[],
                "nothing to do: give at least one of copy, rename, set, from_meta, lookup, convert, case, delete",
            ));
        }
        if errors.is_empty() {
            Ok(Plan {
                copy,
                rename,
                set,
                from_meta,
                lookup,
                convert,
                case,
                delete,
            })
        } else {
            Err(errors)
        }
    }
}

impl FieldsOptions {
    #[cfg(test)]
    fn plan(&self) -> Result<Plan, Vec<OptionError>> {
        self.plan_in(None)
    }
}

impl CheckOptions for FieldsOptions {
    fn check(&self) -> Vec<OptionError> {
        self.plan_in(None).err().unwrap_or_default()
    }
}

pub struct FieldsTransform;

impl TypedPlugin for FieldsTransform {
    type Options = FieldsOptions;
    const NAME: &'static str = "fields";
    const KIND: StageKind = StageKind::Transform;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str = "Reshapes parsed events: copy, rename, set (constants or `{{field}}` templates), from_meta (where the event came from), lookup (a table from a field's value), convert (types), case (upper/lower) and delete fields, in that order.";

    fn build(&self, options: FieldsOptions, cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        let plan = options
            .plan_in(Some(&cx.base_dir))
            .map_err(|mut e| e.swap_remove(0))?;
        Ok(Box::new(plan))
    }

    /// The operations in the order the plan applies them.
    fn flow(&self, o: &FieldsOptions) -> Flow {
        let mut flow = Flow::pass().needs(Needs::Fields);
        for (from, to) in &o.copy {
            let Some(to) = to.as_str() else { continue };
            flow = flow
                .read(FieldRead::new(
                    from.clone(),
                    &["copy", from],
                    ReadRole::Optional,
                ))
                .then(Step::Copy {
                    from: from.clone(),
                    to: to.to_string(),
                    option: vec!["copy".into(), from.clone()],
                });
        }
        for (from, to) in &o.rename {
            let Some(to) = to.as_str() else { continue };
            flow = flow
                .read(FieldRead::new(
                    from.clone(),
                    &["rename", from],
                    ReadRole::Optional,
                ))
                .then(Step::Rename {
                    from: from.clone(),
                    to: to.to_string(),
                    option: vec!["rename".into(), from.clone()],
                });
        }
        for (field, value) in &o.set {
            let ty = match value {
                Value::String(text) if text.contains("{{") => {
                    for (name, offset) in logbus_plugin_api::flow::template_fields(text) {
                        // A missing field renders empty: a warning.
                        flow = flow.read(
                            FieldRead::new(name, &["set", field], ReadRole::Optional)
                                .at_offset(offset),
                        );
                    }
                    FieldType::String
                }
                other => type_of(other),
            };
            flow = flow.set(field.clone(), ty, &["set", field]);
        }
        for (field, what) in &o.from_meta {
            let ty = match what.as_str() {
                "origin" | "source" => FieldType::String,
                "attributes" => FieldType::Object,
                _ => FieldType::Any,
            };
            flow = flow.set(field.clone(), ty, &["from_meta", field]);
        }
        for (target, lookup) in &o.lookup {
            flow = flow
                .read(FieldRead::new(
                    lookup.from.clone(),
                    &["lookup", target, "from"],
                    ReadRole::Optional,
                ))
                .set(target.clone(), FieldType::Any, &["lookup", target]);
        }
        for (field, to) in &o.convert {
            let ty = match to {
                Conversion::Integer | Conversion::Float => FieldType::Number,
                Conversion::Boolean => FieldType::Bool,
                Conversion::String => FieldType::String,
            };
            flow = flow
                .read(FieldRead::new(
                    field.clone(),
                    &["convert", field],
                    ReadRole::Optional,
                ))
                .set(field.clone(), ty, &["convert", field]);
        }
        for field in o.case.keys() {
            flow = flow.read(FieldRead::new(
                field.clone(),
                &["case", field],
                ReadRole::Optional,
            ));
        }
        for (i, field) in o.delete.iter().enumerate() {
            flow = flow.delete(field.clone(), &["delete", &i.to_string()]);
        }
        flow
    }

    /// Lookup files are read here too, so `logbus validate` names one
    /// that is missing or malformed.
    fn check_in_context(&self, options: &FieldsOptions, cx: &BuildContext) -> Vec<OptionError> {
        options
            .plan_in(Some(&cx.base_dir))
            .err()
            .unwrap_or_default()
    }
}

fn meta_value(meta: &logbus_plugin_api::Meta, key: &MetaKey) -> Option<Value> {
    match key {
        MetaKey::Origin => meta.origin.as_deref().map(|o| Value::String(o.into())),
        MetaKey::Source => Some(Value::String(meta.source.to_string())),
        MetaKey::Attributes => meta.attributes.as_deref().cloned().map(Value::Object),
        MetaKey::Attribute(name) => meta
            .attributes
            .as_deref()
            .and_then(|a| name.get(a))
            .cloned(),
    }
}

impl Processor for Plan {
    /// Every read and write goes through the event's field accessors, so
    /// lazy fields stay text when the plan names only top-level fields:
    /// a read parses that one entry, a write is an edit beside the text
    /// (a nested path builds the fields, once).
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        if !event.is_parsed() {
            return Err(needs_fields("fields"));
        }
        // Only a conversion can fail, after the edits before it.
        let before = (!self.convert.is_empty()).then(|| event.payload().clone());
        for (from, to) in &self.copy {
            if let Some(v) = event.field(from).map(Cow::into_owned) {
                event.set_field(to, v);
            }
        }
        for (from, to) in &self.rename {
            if let Some(v) = event.take_field(from) {
                event.set_field(to, v);
            }
        }
        for (path, value) in &self.set {
            let v = match value {
                SetValue::Constant(v) => v.clone(),
                SetValue::Template(parts) => Value::String(render(parts, event)),
            };
            event.set_field(path, v);
        }
        for (path, key) in &self.from_meta {
            if let Some(v) = meta_value(event.meta(), key) {
                event.set_field(path, v);
            }
        }
        for (target, from, table, default) in &self.lookup {
            let found = event
                .field(from)
                .and_then(|v| key_of(&v).and_then(|k| table.get(k.as_ref())).cloned())
                .or_else(|| default.clone());
            if let Some(v) = found {
                event.set_field(target, v);
            }
        }
        for (path, to) in &self.convert {
            let converted = match event.field(path) {
                Some(v) => convert(&v, *to),
                None => continue,
            };
            match converted {
                Ok(v) => {
                    event.set_field(path, v);
                }
                Err(e) => {
                    // An event in error is passed on as it came.
                    if let Some(before) = before {
                        *event.payload_mut() = before;
                    }
                    return Err(EventError::new(format!("convert `{path}`: {e}")));
                }
            }
        }
        for (path, case) in &self.case {
            let changed = match event.field(path).as_deref() {
                Some(Value::String(s)) => match case {
                    Case::Upper => s.to_uppercase(),
                    Case::Lower => s.to_lowercase(),
                },
                _ => continue,
            };
            event.set_field(path, Value::String(changed));
        }
        for path in &self.delete {
            event.delete_field(path);
        }
        Ok(Verdict::Keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::Meta;
    use serde_json::json;

    #[test]
    fn operations_run_in_documented_order() {
        let opts: FieldsOptions = serde_json::from_value(json!({
            "delete": ["tmp"],
            "set": {"env": "prod", "a.b": 1},
            "rename": {"msg": "message"},
            "copy": {"msg": "original"}
        }))
        .unwrap();
        let mut plan = opts.plan().unwrap();
        let mut e = Event::fields(
            serde_json::from_value(json!({"msg": "hi", "tmp": 1})).unwrap(),
            Meta::at("s", 0),
        );
        plan.process(&mut e).unwrap();
        assert_eq!(
            Value::Object(e.as_fields().unwrap().clone()),
            json!({"original": "hi", "message": "hi", "env": "prod", "a": {"b": 1}})
        );
    }

    #[test]
    fn from_meta_writes_the_origin_and_source_and_skips_an_unknown_origin() {
        let opts: FieldsOptions = serde_json::from_value(json!({
            "from_meta": {"log.file": "origin", "via": "source"},
            "delete": ["via"],
            "set": {"via": "overwritten by from_meta, then deleted"}
        }))
        .unwrap();
        let mut plan = opts.plan().unwrap();
        let event = |origin: Option<&str>| {
            Event::fields(
                serde_json::from_value(json!({"msg": "hi"})).unwrap(),
                Meta {
                    source: "logs".into(),
                    ingest_ns: 0,
                    origin: origin.map(Into::into),
                    attributes: None,
                    position: None,
                },
            )
        };
        let mut tailed = event(Some("/var/log/app.log"));
        plan.process(&mut tailed).unwrap();
        assert_eq!(
            Value::Object(tailed.as_fields().unwrap().clone()),
            json!({"msg": "hi", "log": {"file": "/var/log/app.log"}})
        );
        let mut unknown = event(None);
        plan.process(&mut unknown).unwrap();
        assert_eq!(
            Value::Object(unknown.as_fields().unwrap().clone()),
            json!({"msg": "hi"})
        );

        let opts: FieldsOptions =
            serde_json::from_value(json!({"from_meta": {"via": "source"}})).unwrap();
        let mut e = event(None);
        opts.plan().unwrap().process(&mut e).unwrap();
        assert_eq!(e.as_fields().unwrap()["via"], "logs");
    }

    #[test]
    fn from_meta_reads_the_source_attributes_whole_or_by_path() {
        let opts: FieldsOptions = serde_json::from_value(json!({
            "from_meta": {
                "kafka": "attributes",
                "partition": "attributes.partition",
                "trace": "attributes.headers.trace_id",
                "absent": "attributes.headers.nope"
            }
        }))
        .unwrap();
        let mut plan = opts.plan().unwrap();
        let attributes: Fields = serde_json::from_value(
            json!({"topic": "logs", "partition": 2, "headers": {"trace_id": "t-1"}}),
        )
        .unwrap();
        let mut e = Event::fields(
            Fields::new(),
            Meta {
                attributes: Some(std::sync::Arc::new(attributes)),
                ..Meta::now("k".into())
            },
        );
        plan.process(&mut e).unwrap();
        assert_eq!(
            Value::Object(e.as_fields().unwrap().clone()),
            json!({
                "kafka": {"topic": "logs", "partition": 2, "headers": {"trace_id": "t-1"}},
                "partition": 2,
                "trace": "t-1"
            }),
            "a missing attribute is skipped"
        );
        // An event without attributes gets none of them.
        let mut plain = Event::fields(Fields::new(), Meta::now("k".into()));
        plan.process(&mut plain).unwrap();
        assert!(plain.as_fields().unwrap().is_empty());
        let bad: FieldsOptions =
            serde_json::from_value(json!({"from_meta": {"x": "offset"}})).unwrap();
        let errs = bad.check();
        assert_eq!(errs[0].path, ["from_meta", "x"]);
        assert!(
            errs[0].message.contains("unknown metadata `offset`"),
            "{}",
            errs[0].message
        );
    }

    fn run(options: Value, event: Value) -> Result<Value, String> {
        let opts: FieldsOptions = serde_json::from_value(options).unwrap();
        let mut plan = opts.plan().map_err(|e| format!("{e:?}"))?;
        let mut e = Event::fields(
            serde_json::from_value(event).unwrap(),
            Meta::now("s".into()),
        );
        plan.process(&mut e).map_err(|e| e.0)?;
        Ok(Value::Object(e.as_fields().unwrap().clone()))
    }

    #[test]
    fn templates_lookup_convert_and_case_in_order() {
        let got = run(
            json!({
                "case": {"level": "upper", "n": "lower"},
                "convert": {"status": "integer", "sev": "string"},
                "lookup": {"sev": {"from": "level", "table": {"debug": 7, "info": 6, "error": 3}, "default": 5}},
                "set": {"summary": "{{service}}: {{msg}} ({{status}}, {{missing}})", "plain": "no template"},
                "rename": {"message": "msg"}
            }),
            json!({"service": "auth", "message": "denied", "status": "403", "level": "error", "n": 5}),
        )
        .unwrap();
        assert_eq!(
            got,
            json!({"service": "auth", "status": 403, "level": "ERROR", "n": 5, "msg": "denied",
                   "summary": "auth: denied (403, )", "plain": "no template", "sev": "3"})
        );
        // No match: the default; a number is looked up by its text.
        let got = run(
            json!({"lookup": {"class": {"from": "status", "table": {"200": "ok", "404": "missing"}, "default": "other"}}}),
            json!({"status": 404}),
        )
        .unwrap();
        assert_eq!(got["class"], "missing");
        let got = run(
            json!({"lookup": {"class": {"from": "status", "table": {"200": "ok"}, "default": "other"}}}),
            json!({}),
        )
        .unwrap();
        assert_eq!(got["class"], "other");
        let got = run(
            json!({"lookup": {"class": {"from": "status", "table": {"200": "ok"}}}}),
            json!({"status": 500}),
        )
        .unwrap();
        assert!(
            got.get("class").is_none(),
            "no match and no default writes nothing"
        );
        // A template renders a non-string field as JSON.
        let got = run(
            json!({"set": {"t": "{{ a.b }}/{{c}}"}}),
            json!({"a": {"b": [1, 2]}, "c": true}),
        )
        .unwrap();
        assert_eq!(got["t"], "[1,2]/true");
    }

    #[test]
    fn lookup_tables_from_json_and_csv_files() {
        let dir = std::env::temp_dir().join(format!("logbus-lookup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("sev.json"), r#"{"debug": 7, "error": 3}"#).unwrap();
        std::fs::write(
            dir.join("owners.csv"),
            "# service,owner\nauth,\"team a, identity\"\nbilling,42\nweb,true\n",
        )
        .unwrap();
        std::fs::write(dir.join("bad.csv"), "a,b,c\n").unwrap();
        std::fs::write(dir.join("bad.json"), "[1]").unwrap();
        let opts: FieldsOptions = serde_json::from_value(json!({"lookup": {
            "sev": {"from": "level", "file": "sev.json", "table": {"error": 2}},
            "owner": {"from": "service", "file": "owners.csv", "default": "nobody"}
        }}))
        .unwrap();
        let mut plan = opts.plan_in(Some(&dir)).unwrap();
        let mut run = |event: Value| {
            let mut e = Event::fields(
                serde_json::from_value(event).unwrap(),
                Meta::now("s".into()),
            );
            plan.process(&mut e).unwrap();
            Value::Object(e.as_fields().unwrap().clone())
        };
        let got = run(json!({"level": "debug", "service": "auth"}));
        assert_eq!(
            (&got["sev"], &got["owner"]),
            (&json!(7), &json!("team a, identity"))
        );
        // Inline entries win over the file's.
        assert_eq!(
            run(json!({"level": "error", "service": "billing"}))["sev"],
            2
        );
        assert_eq!(run(json!({"service": "billing"}))["owner"], 42);
        assert_eq!(run(json!({"service": "web"}))["owner"], true);
        assert_eq!(run(json!({"service": "?"}))["owner"], "nobody");
        let err = |file: &str| {
            let o: FieldsOptions =
                serde_json::from_value(json!({"lookup": {"x": {"from": "a", "file": file}}}))
                    .unwrap();
            let e = o.plan_in(Some(&dir)).err().unwrap();
            (e[0].path.join("."), e[0].message.clone())
        };
        let (path, message) = err("bad.csv");
        assert_eq!(path, "lookup.x.file");
        assert!(
            message.ends_with("bad.csv: row 1 has 3 columns; a lookup table has two (key,value)"),
            "{message}"
        );
        // An unclosed quote would swallow every row after it.
        std::fs::write(
            dir.join("unclosed.csv"),
            "auth,ok\nweb,\"team web\nbilling,42\nsearch,1\n",
        )
        .unwrap();
        let (path, message) = err("unclosed.csv");
        assert_eq!(path, "lookup.x.file");
        assert!(
            message.ends_with(
                "unclosed.csv: line 2: a quoted value runs past the end of its line (an unclosed quote?); lookup keys and values are one line each"
            ),
            "{message}"
        );
        // A device that never ends, a folder, and a file too large to be
        // a table are refused before they are read.
        let message = err("/dev/zero").1;
        assert!(message.ends_with("/dev/zero: not a regular file (a lookup table is read whole when the pipeline is built)"), "{message}");
        assert!(err(".").1.contains("not a regular file"), "{}", err(".").1);
        let big = std::fs::File::create(dir.join("big.csv")).unwrap();
        big.set_len(MAX_LOOKUP_FILE_BYTES + 1).unwrap();
        let message = err("big.csv").1;
        assert!(
            message
                .ends_with("big.csv: larger than 64 MiB; a lookup table is held in memory whole"),
            "{message}"
        );
        assert!(
            err("bad.json").1.contains("not a JSON object"),
            "{}",
            err("bad.json").1
        );
        assert!(
            err("missing.json").1.starts_with("reading "),
            "{}",
            err("missing.json").1
        );
        // Without the pipeline's folder (the context-free check) the file
        // is not read, and a file alone is a table.
        assert!(
            serde_json::from_value::<FieldsOptions>(
                json!({"lookup": {"x": {"from": "a", "file": "missing.json"}}})
            )
            .unwrap()
            .check()
            .is_empty()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn conversions_and_their_errors() {
        let conv = |to: &str, v: Value| {
            run(json!({"convert": {"x": to}}), json!({"x": v})).map(|e| e["x"].clone())
        };
        assert_eq!(conv("integer", json!(" 42 ")).unwrap(), json!(42));
        assert_eq!(conv("integer", json!(42.0)).unwrap(), json!(42));
        assert_eq!(conv("integer", json!(true)).unwrap(), json!(1));
        assert_eq!(
            conv("integer", json!("18446744073709551615")).unwrap(),
            json!(18446744073709551615u64)
        );
        assert_eq!(
            conv("integer", json!(4.5)).unwrap_err(),
            "convert `x`: cannot convert 4.5 to an integer"
        );
        assert_eq!(
            conv("integer", json!("4x")).unwrap_err(),
            "convert `x`: cannot convert \"4x\" to an integer"
        );
        assert_eq!(conv("float", json!("2.5")).unwrap(), json!(2.5));
        assert_eq!(conv("float", json!(3)).unwrap(), json!(3.0));
        assert!(conv("float", json!("nan")).is_err());
        assert!(conv("float", json!([1])).is_err());
        assert_eq!(conv("boolean", json!("Yes")).unwrap(), json!(true));
        assert_eq!(conv("boolean", json!("off")).unwrap(), json!(false));
        assert_eq!(conv("boolean", json!(0)).unwrap(), json!(false));
        assert!(conv("boolean", json!(2)).is_err());
        assert!(conv("boolean", json!("maybe")).is_err());
        assert_eq!(conv("string", json!(12)).unwrap(), json!("12"));
        assert_eq!(conv("string", json!("as is")).unwrap(), json!("as is"));
        assert_eq!(conv("boolean", json!(true)).unwrap(), json!(true));
        assert_eq!(conv("boolean", json!(1)).unwrap(), json!(true));
        assert_eq!(conv("boolean", json!(1.0)).unwrap(), json!(true));
        // An integer stays exact (not through a float), and a float at the
        // edge of i64 is refused, not wrapped.
        let exact = json!(9_007_199_254_740_993_i64);
        assert_eq!(conv("integer", exact.clone()).unwrap(), exact);
        assert_eq!(conv("integer", json!(-5)).unwrap(), json!(-5));
        assert_eq!(
            conv("integer", json!(-8.0e18)).unwrap(),
            json!(-8_000_000_000_000_000_000_i64)
        );
        assert!(conv("integer", json!(9.2e18)).is_err());
        assert_eq!(conv("string", json!({"a": 1})).unwrap(), json!("{\"a\":1}"));
        assert!(conv("string", json!(null)).is_err());
        // A missing field is skipped, not an error.
        assert_eq!(
            run(json!({"convert": {"x": "integer"}}), json!({})).unwrap(),
            json!({})
        );
    }

    #[test]
    fn a_failed_conversion_leaves_the_event_as_it_came() {
        let opts: FieldsOptions = serde_json::from_value(json!({
            "set": {"added": 1}, "rename": {"a": "b"}, "convert": {"n": "integer"}
        }))
        .unwrap();
        let mut plan = opts.plan().unwrap();
        let mut e = Event::fields(
            serde_json::from_value(json!({"a": 1, "n": "x"})).unwrap(),
            Meta::now("s".into()),
        );
        assert!(plan.process(&mut e).is_err());
        assert_eq!(
            Value::Object(e.as_fields().unwrap().clone()),
            json!({"a": 1, "n": "x"})
        );
    }

    #[test]
    fn new_option_errors_point_at_the_entry() {
        let errs = |o: Value| {
            serde_json::from_value::<FieldsOptions>(o)
                .unwrap()
                .check()
                .into_iter()
                .map(|e| (e.path.join("."), e.message, e.offset))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            errs(json!({"set": {"t": "a {{b"}})),
            [(
                "set.t".to_string(),
                "`{{` without its `}}`".to_string(),
                Some(2)
            )]
        );
        assert_eq!(
            errs(json!({"set": {"t": "{{a..b}}"}}))[0].1,
            "in `{{…}}`: field path `a..b` has an empty segment"
        );
        // The offset counts from the start of the text, past earlier parts.
        assert_eq!(
            errs(json!({"set": {"t": "ab {{x}} {{a..b}}"}}))[0].2,
            Some(9)
        );
        assert_eq!(errs(json!({"set": {"t": "{{x}}{{a"}}))[0].2, Some(5));
        assert_eq!(
            errs(json!({"lookup": {"x": {"from": "a..b", "table": {"k": 1}}}}))[0].0,
            "lookup.x.from"
        );
        assert_eq!(
            errs(json!({"lookup": {"x": {"from": "a", "table": {}}}}))[0].1,
            "the table is empty and there is no default: nothing would be written"
        );
        assert_eq!(errs(json!({"case": {"a..b": "upper"}}))[0].0, "case.a..b");
        assert_eq!(errs(json!({"convert": {"": "integer"}}))[0].0, "convert.");
        assert!(serde_json::from_value::<FieldsOptions>(json!({"case": {"a": "title"}})).is_err());
    }

    #[test]
    fn a_template_has_no_empty_text_parts() {
        let parts = |t: &str| template(t, &[]).unwrap().unwrap().len();
        assert_eq!(parts("{{a}}"), 1);
        assert_eq!(parts("{{a}}{{b}}"), 2);
        assert_eq!(parts("x{{a}}y"), 3);
        assert!(template("no braces", &[]).unwrap().is_none());
    }

    /// `logbus validate` reads lookup files against the pipeline's folder.
    #[test]
    fn validation_names_a_missing_or_malformed_lookup_file() {
        let dir = std::env::temp_dir().join(format!("logbus-lookup-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("bad.json"), "[1]").unwrap();
        std::fs::write(dir.join("good.json"), r#"{"a": 1}"#).unwrap();
        let cx = BuildContext {
            base_dir: dir.clone(),
            ..logbus_plugin_api::testing::context()
        };
        let check = |file: &str| {
            let options: FieldsOptions =
                serde_json::from_value(json!({"lookup": {"x": {"from": "k", "file": file}}}))
                    .unwrap();
            FieldsTransform
                .check_in_context(&options, &cx)
                .into_iter()
                .map(|e| (e.path.join("."), e.message))
                .collect::<Vec<_>>()
        };
        assert_eq!(check("good.json"), []);
        for file in ["missing.json", "bad.json"] {
            let errors = check(file);
            assert_eq!(errors.len(), 1, "{file}: {errors:?}");
            assert!(errors[0].0.starts_with("lookup.x"), "{errors:?}");
            assert!(errors[0].1.contains(file), "{errors:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn option_errors_point_at_the_entry() {
        let opts: FieldsOptions =
            serde_json::from_value(json!({"rename": {"a": 3}, "delete": ["ok", "x..y"]})).unwrap();
        let errs = opts.check();
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[0].path, ["rename", "a"]);
        assert_eq!(errs[1].path, ["delete", "1"]);
        let opts: FieldsOptions =
            serde_json::from_value(json!({"from_meta": {"x..y": "origin"}})).unwrap();
        assert_eq!(opts.check()[0].path, ["from_meta", "x..y"]);
        let empty = FieldsOptions::default();
        assert_eq!(empty.check().len(), 1);
    }

    /// A conversion that fails leaves the event as it came, edits before
    /// it undone, lazy or not.
    #[test]
    fn a_failed_conversion_passes_the_event_on_as_it_came() {
        use logbus_plugin_api::{Bytes, LazyFields, Payload};
        let line = r#"{"msg":"hi","n":"4x","level":"warn"}"#;
        let opts: FieldsOptions = serde_json::from_value(json!({
            "set": {"env": "prod"}, "delete": ["msg"], "convert": {"level": "string", "n": "integer"}
        }))
        .unwrap();
        let mut plan = opts.plan().unwrap();
        let lazy = LazyFields::parse(Bytes::from_static(line.as_bytes())).unwrap();
        for mut event in [
            Event::new(Payload::Lazy(lazy), Meta::at("s", 0)),
            Event::fields(serde_json::from_str(line).unwrap(), Meta::at("s", 0)),
        ] {
            let err = plan.process(&mut event).unwrap_err();
            assert_eq!(err.0, "convert `n`: cannot convert \"4x\" to an integer");
            let mut out = Vec::new();
            event.payload().write_json(&mut out);
            assert_eq!(String::from_utf8(out).unwrap(), line);
        }
    }

    /// A plan that names only top-level fields edits lazy fields without
    /// building them (reads, even nested ones, parse one entry; a nested
    /// write builds them); either way the result is what the same plan
    /// does to ordinary fields.
    #[test]
    fn lazy_fields_get_the_same_edits_as_ordinary_ones() {
        use logbus_plugin_api::{Bytes, LazyFields, Payload};
        let line = r#"{"msg":"hi","tmp":1,"level":"warn","n":{"x":1}}"#;
        let meta = Meta {
            source: "logs".into(),
            ingest_ns: 0,
            origin: Some("/var/log/a".into()),
            attributes: None,
            position: None,
        };
        for (options, stays_lazy) in [
            (
                json!({"set": {"env": "prod", "msg": 2}, "delete": ["tmp", "absent"], "from_meta": {"file": "origin"}}),
                true,
            ),
            (json!({"set": {"n.y": 2}, "delete": ["n.x"]}), false),
            (json!({"set": {"copy": "{{msg}} at {{level}}"}}), true),
            (json!({"set": {"copy": "{{n.x}}"}}), true),
            (
                json!({"rename": {"msg": "message"}, "case": {"level": "upper"}}),
                true,
            ),
            (
                json!({"copy": {"level": "was"}, "lookup": {"sev": {"from": "level", "table": {"warn": 4}}},
                       "convert": {"tmp": "string"}, "case": {"msg": "upper"}}),
                true,
            ),
            (
                json!({"lookup": {"sev": {"from": "n.x", "table": {"1": "one"}}}}),
                true,
            ),
            (
                json!({"copy": {"n.x": "x"}, "rename": {"level": "n.level"}}),
                false,
            ),
        ] {
            let opts: FieldsOptions = serde_json::from_value(options.clone()).unwrap();
            let mut plan = opts.plan().unwrap();
            let lazy = LazyFields::parse(Bytes::from_static(line.as_bytes())).unwrap();
            let mut a = Event::new(Payload::Lazy(lazy), meta.clone());
            let mut b = Event::fields(serde_json::from_str(line).unwrap(), meta.clone());
            plan.process(&mut a).unwrap();
            plan.process(&mut b).unwrap();
            assert_eq!(
                matches!(a.payload(), Payload::Lazy(_)),
                stays_lazy,
                "{options}"
            );
            assert_eq!(a.as_fields(), b.as_fields(), "{options}");
            let (mut ja, mut jb) = (Vec::new(), Vec::new());
            a.payload().write_json(&mut ja);
            b.payload().write_json(&mut jb);
            assert_eq!(ja, jb, "{options}");
        }
    }

    /// The flow states each operation in the order the plan applies them,
    /// each at its option.
    #[test]
    fn the_flow_follows_the_operations_in_order() {
        use logbus_plugin_api::{FieldRead, FieldType, Flow, Needs, ReadRole, Step};
        let o: FieldsOptions = serde_json::from_value(json!({
            "copy": { "a": "a2" },
            "rename": { "b": "b2" },
            "set": { "c": "{{x}}-{{ y.z }}", "n": 1, "t": true, "o": {}, "l": [], "z": null },
            "from_meta": { "m1": "origin", "m2": "source", "m3": "attributes", "m4": "attributes.k" },
            "lookup": { "d": { "from": "e", "table": {} } },
            "convert": { "f": "integer", "g": "float", "h": "boolean", "i": "string" },
            "case": { "j": "upper" },
            "delete": ["k"]
        }))
        .unwrap();
        let flow = FieldsTransform.flow(&o);
        assert_eq!(flow.needs, Needs::Fields);
        let read = |f: &str, opt: &[&str]| Step::Read(FieldRead::new(f, opt, ReadRole::Optional));
        let set = |f: &str, ty: FieldType, opt: &[&str]| Step::Set {
            field: f.into(),
            ty,
            option: opt.iter().map(|s| s.to_string()).collect(),
        };
        let expected = Flow::pass()
            .needs(Needs::Fields)
            .then(read("a", &["copy", "a"]))
            .then(Step::Copy {
                from: "a".into(),
                to: "a2".into(),
                option: vec!["copy".into(), "a".into()],
            })
            .then(read("b", &["rename", "b"]))
            .then(Step::Rename {
                from: "b".into(),
                to: "b2".into(),
                option: vec!["rename".into(), "b".into()],
            })
            .then(Step::Read(
                FieldRead::new("x", &["set", "c"], ReadRole::Optional).at_offset(2),
            ))
            .then(Step::Read(
                FieldRead::new("y.z", &["set", "c"], ReadRole::Optional).at_offset(9),
            ))
            .then(set("c", FieldType::String, &["set", "c"]))
            .then(set("n", FieldType::Number, &["set", "n"]))
            .then(set("t", FieldType::Bool, &["set", "t"]))
            .then(set("o", FieldType::Object, &["set", "o"]))
            .then(set("l", FieldType::Array, &["set", "l"]))
            .then(set("z", FieldType::Any, &["set", "z"]))
            .then(set("m1", FieldType::String, &["from_meta", "m1"]))
            .then(set("m2", FieldType::String, &["from_meta", "m2"]))
            .then(set("m3", FieldType::Object, &["from_meta", "m3"]))
            .then(set("m4", FieldType::Any, &["from_meta", "m4"]))
            .then(read("e", &["lookup", "d", "from"]))
            .then(set("d", FieldType::Any, &["lookup", "d"]))
            .then(read("f", &["convert", "f"]))
            .then(set("f", FieldType::Number, &["convert", "f"]))
            .then(read("g", &["convert", "g"]))
            .then(set("g", FieldType::Number, &["convert", "g"]))
            .then(read("h", &["convert", "h"]))
            .then(set("h", FieldType::Bool, &["convert", "h"]))
            .then(read("i", &["convert", "i"]))
            .then(set("i", FieldType::String, &["convert", "i"]))
            .then(read("j", &["case", "j"]))
            .delete("k", &["delete", "0"]);
        assert_eq!(flow, expected);
    }
}
