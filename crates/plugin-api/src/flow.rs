//! What a stage needs from the events it reads and what it does to them,
//! stated from its options before anything runs.
//!
//! `logbus validate` follows events through the DAG with these statements:
//! a filter wired to an unparsed source, a sink template naming a field no
//! stage sets, or `level == error` (two fields, one of them produced
//! nowhere) are found in CI instead of at 3 a.m. A plugin that says
//! nothing gets [`Flow::unknown`] for its kind, which never makes the
//! analysis report anything downstream of it: an unknown is treated as
//! "anything may be there", never as "nothing is".

use std::fmt;

/// The shape of the events a stage accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Raw or parsed alike.
    Any,
    /// Parsed events (a raw one is an error: a filter without a parser).
    Fields,
    /// Raw events (a parsed one is an error: a parser after a parser).
    Raw,
}

/// What a field holds, as far as the options tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldType {
    String,
    Number,
    Bool,
    Object,
    Array,
    /// Could be anything (parsed JSON, a script's result).
    Any,
}

impl FieldType {
    /// The type as a user writes it in a message.
    pub fn describe(self) -> &'static str {
        match self {
            FieldType::String => "a string",
            FieldType::Number => "a number",
            FieldType::Bool => "a boolean",
            FieldType::Object => "an object",
            FieldType::Array => "a list",
            FieldType::Any => "any value",
        }
    }

    /// The type a value of two paths may have: equal ones stay, others
    /// become [`FieldType::Any`].
    pub fn join(self, other: FieldType) -> FieldType {
        if self == other { self } else { FieldType::Any }
    }

    /// Parses the names a user declares fields with (`string`, `number`,
    /// `integer`, `float`, `boolean`/`bool`, `object`/`map`, `array`/`list`,
    /// `any`).
    pub fn from_name(name: &str) -> Option<FieldType> {
        Some(match name {
            "string" | "str" | "text" => FieldType::String,
            "number" | "integer" | "int" | "float" => FieldType::Number,
            "boolean" | "bool" => FieldType::Bool,
            "object" | "map" => FieldType::Object,
            "array" | "list" => FieldType::Array,
            "any" => FieldType::Any,
            _ => return None,
        })
    }

    pub const NAMES: &'static str = "string, number, boolean, object, array, any";
}

impl fmt::Display for FieldType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.describe())
    }
}

/// How much a missing field matters to the stage that reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadRole {
    /// The stage cannot do its work without it (a template, an id, a
    /// column): missing where every upstream field is known is an error.
    Required,
    /// A condition or an optional copy: missing makes it false or a no-op,
    /// so missing is a warning.
    Optional,
    /// `exists(x)`: asking is the point; never reported as missing.
    Probe,
    /// The right-hand side of a comparison with another field
    /// (`level == error`): produced by no stage, it is almost always a
    /// string written without quotes.
    RightOperand,
}

/// One field a stage reads, and where its options name it.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldRead {
    /// The dotted path as written (`http.status`).
    pub field: String,
    /// The option that names it (`["condition"]`, `["set", "host"]`).
    pub option: Vec<String>,
    /// Where inside the option's text (a condition, a template), in bytes.
    pub offset: Option<usize>,
    pub role: ReadRole,
    /// The type the stage compares it with or needs, if any.
    pub expects: Option<FieldType>,
}

impl FieldRead {
    pub fn new(field: impl Into<String>, option: &[&str], role: ReadRole) -> Self {
        FieldRead {
            field: field.into(),
            option: option.iter().map(|s| s.to_string()).collect(),
            offset: None,
            role,
            expects: None,
        }
    }

    pub fn at_offset(mut self, offset: usize) -> Self {
        self.offset = Some(offset);
        self
    }

    pub fn expecting(mut self, ty: FieldType) -> Self {
        self.expects = Some(ty);
        self
    }
}

/// One step of what a stage does, in the order it does it: reads see the
/// sets before them.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Read(FieldRead),
    /// Sets (or overwrites) a field; `option` is where the options say so.
    Set {
        field: String,
        ty: FieldType,
        option: Vec<String>,
    },
    Delete {
        field: String,
        option: Vec<String>,
    },
    /// Copies a field (its type goes with it).
    Copy {
        from: String,
        to: String,
        option: Vec<String>,
    },
    /// Moves a field (its type goes with it).
    Rename {
        from: String,
        to: String,
        option: Vec<String>,
    },
    /// The events are replaced by raw ones (a formatter, a source of lines).
    EmitRaw,
    /// The events are replaced by parsed ones holding exactly the fields
    /// set after this step (`open: false`), or at least those (`open:
    /// true`: parsed JSON without a declaration).
    EmitFields {
        open: bool,
    },
    /// Any field may be set, changed or deleted from here (a script).
    Opaque,
    /// Raw events become parsed ones holding their text as `message` (what
    /// a script is handed); parsed ones pass as they are.
    RawAsMessage,
    /// Raw or parsed events of unknown fields (a plugin that says nothing).
    EmitAny,
    /// What a source's events survive ([`Replay`]). A source that states
    /// nothing reads nothing again: a crash loses what it had in flight.
    Replay(Replay),
    /// The stage gives its destination each event's source position
    /// ([`crate::Position`]) as its name, as `option` asks: validation
    /// refuses a pipeline where one source reaches it by two paths.
    NamesByPosition {
        option: Vec<String>,
    },
}

/// What a source does about a crash, as its options say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replay {
    /// What was in flight at a crash is read again after the restart
    /// (the source acknowledges, or its client resends): duplicates,
    /// never gaps.
    pub rereads: bool,
    /// Each event carries a position that reading it again repeats
    /// ([`crate::Position`]).
    pub positions: bool,
}

/// A stage's statement: what it accepts and what it does, step by step.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    pub needs: Needs,
    pub steps: Vec<Step>,
}

impl Flow {
    /// Accepts anything, passes events through unchanged.
    pub fn pass() -> Self {
        Flow {
            needs: Needs::Any,
            steps: Vec::new(),
        }
    }

    /// What a plugin that states nothing gets: accepts anything; a source
    /// or parser emits events of unknown shape, a transform may change
    /// anything, a formatter emits raw lines.
    pub fn unknown(kind: crate::StageKind) -> Self {
        use crate::StageKind::*;
        let step = match kind {
            Source | Parser => Step::EmitAny,
            Transform => Step::Opaque,
            Formatter => Step::EmitRaw,
            Sink => return Flow::pass(),
        };
        Flow {
            needs: Needs::Any,
            steps: vec![step],
        }
    }

    /// A source or parser that emits raw events.
    pub fn raw() -> Self {
        Flow::pass().then(Step::EmitRaw)
    }

    /// Parsed events with exactly these fields.
    pub fn fields(fields: &[(&str, FieldType)]) -> Self {
        let mut flow = Flow::pass().then(Step::EmitFields { open: false });
        for (name, ty) in fields {
            flow = flow.set(*name, *ty, &[]);
        }
        flow
    }

    /// Parsed events with at least these fields.
    pub fn open_fields(fields: &[(&str, FieldType)]) -> Self {
        let mut flow = Flow::pass().then(Step::EmitFields { open: true });
        for (name, ty) in fields {
            flow = flow.set(*name, *ty, &[]);
        }
        flow
    }

    pub fn needs(mut self, needs: Needs) -> Self {
        self.needs = needs;
        self
    }

    pub fn then(mut self, step: Step) -> Self {
        self.steps.push(step);
        self
    }

    pub fn read(self, read: FieldRead) -> Self {
        self.then(Step::Read(read))
    }

    pub fn set(self, field: impl Into<String>, ty: FieldType, option: &[&str]) -> Self {
        self.then(Step::Set {
            field: field.into(),
            ty,
            option: option.iter().map(|s| s.to_string()).collect(),
        })
    }

    pub fn delete(self, field: impl Into<String>, option: &[&str]) -> Self {
        self.then(Step::Delete {
            field: field.into(),
            option: option.iter().map(|s| s.to_string()).collect(),
        })
    }
}

/// The fields a `{{field.path}}` template reads, with each one's byte
/// offset in the text (for templates that follow the sink core's syntax:
/// `{{ name }}`, spaces allowed, `{{` without `}}` read no further).
pub fn template_fields(text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut rest = 0;
    while let Some(open) = text[rest..].find("{{") {
        let start = rest + open + 2;
        let Some(close) = text[start..].find("}}") else {
            break;
        };
        let inner = &text[start..start + close];
        let name = inner.trim();
        if !name.is_empty() {
            let lead = inner.len() - inner.trim_start().len();
            out.push((name.to_string(), start + lead));
        }
        rest = start + close + 2;
    }
    out
}

/// [`template_fields`] as required reads of option `option`.
pub fn template_reads(text: &str, option: &[&str]) -> Vec<FieldRead> {
    template_fields(text)
        .into_iter()
        .map(|(field, offset)| FieldRead::new(field, option, ReadRole::Required).at_offset(offset))
        .collect()
}

/// The `fields:` option of a stage whose output inference cannot know
/// (`parser: json`, `transform: js`): the user's word for which fields
/// every event carries, by dotted path and type. Validation then treats
/// the set as closed (a read of any other field is an error); at run time
/// an event that lacks a declared field or holds another type fails with
/// a message for `on_error`, so a broken declaration is counted in
/// `errored` instead of silently believed.
pub type FieldDeclaration = std::collections::BTreeMap<String, String>;

/// A [`FieldDeclaration`] checked and ready to test events with.
#[derive(Debug, Clone, Default)]
pub struct DeclaredFields {
    fields: Vec<(String, crate::FieldPath, FieldType)>,
}

impl DeclaredFields {
    /// The declaration, or an error per bad entry (under option `option`).
    pub fn parse(
        declared: &FieldDeclaration,
        option: &str,
    ) -> Result<DeclaredFields, Vec<crate::OptionError>> {
        let mut fields = Vec::new();
        let mut errors = Vec::new();
        for (name, ty) in declared {
            let path = crate::FieldPath::parse(name);
            let ty = FieldType::from_name(ty);
            match (path, ty) {
                (Ok(path), Some(ty)) => fields.push((name.clone(), path, ty)),
                (Err(e), _) => errors.push(crate::OptionError::at(&[option, name], e)),
                (_, None) => errors.push(crate::OptionError::at(
                    &[option, name],
                    format!(
                        "`{}` is not a field type; use one of {}",
                        declared[name],
                        FieldType::NAMES
                    ),
                )),
            }
        }
        if errors.is_empty() {
            Ok(DeclaredFields { fields })
        } else {
            Err(errors)
        }
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The steps that set the declared fields, positioned at their entries.
    pub fn steps(&self, option: &str) -> Vec<Step> {
        self.fields
            .iter()
            .map(|(name, _, ty)| Step::Set {
                field: name.clone(),
                ty: *ty,
                option: vec![option.to_string(), name.clone()],
            })
            .collect()
    }

    /// Whether `event` carries every declared field with its type.
    pub fn check(&self, event: &crate::Event) -> Result<(), crate::EventError> {
        for (name, path, ty) in &self.fields {
            let Some(value) = event.field(path) else {
                return Err(crate::EventError::new(format!(
                    "declared field `{name}` is missing"
                )));
            };
            let fits = match ty {
                FieldType::String => value.is_string(),
                FieldType::Number => value.is_number(),
                FieldType::Bool => value.is_boolean(),
                FieldType::Object => value.is_object(),
                FieldType::Array => value.is_array(),
                FieldType::Any => true,
            };
            if !fits {
                return Err(crate::EventError::new(format!(
                    "declared field `{name}` should be {}, got {}",
                    ty.describe(),
                    describe_value(&value)
                )));
            }
        }
        Ok(())
    }
}

fn describe_value(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_fields_are_checked_on_each_event() {
        let mut d = FieldDeclaration::new();
        d.insert("status".into(), "integer".into());
        d.insert("http.path".into(), "string".into());
        let declared = DeclaredFields::parse(&d, "fields").unwrap();
        assert_eq!(declared.steps("fields").len(), 2);
        let event = |v: serde_json::Value| {
            let serde_json::Value::Object(map) = v else {
                unreachable!()
            };
            crate::Event::fields(map, crate::Meta::now("s".into()))
        };
        assert!(
            declared
                .check(&event(
                    serde_json::json!({"status": 200, "http": {"path": "/"}})
                ))
                .is_ok()
        );
        let e = declared
            .check(&event(
                serde_json::json!({"status": "200", "http": {"path": "/"}}),
            ))
            .unwrap_err();
        assert_eq!(
            e.0,
            "declared field `status` should be a number, got a string"
        );
        let e = declared
            .check(&event(serde_json::json!({"status": 1})))
            .unwrap_err();
        assert_eq!(e.0, "declared field `http.path` is missing");
        let mut all = FieldDeclaration::new();
        for (name, ty) in [
            ("s", "string"),
            ("n", "float"),
            ("b", "bool"),
            ("o", "map"),
            ("a", "list"),
            ("x", "any"),
        ] {
            all.insert(name.into(), ty.into());
        }
        let all = DeclaredFields::parse(&all, "fields").unwrap();
        let fits = serde_json::json!({"s": "", "n": 1.5, "b": false, "o": {}, "a": [], "x": null});
        assert!(all.check(&event(fits.clone())).is_ok());
        for (name, wrong, got) in [
            ("s", serde_json::json!(1), "a number"),
            ("n", serde_json::json!("1"), "a string"),
            ("b", serde_json::json!(null), "null"),
            ("o", serde_json::json!([]), "a list"),
            ("a", serde_json::json!({}), "an object"),
        ] {
            let mut v = fits.clone();
            v[name] = wrong;
            let e = all.check(&event(v)).unwrap_err();
            assert!(
                e.0.starts_with(&format!("declared field `{name}` should be ")),
                "{}",
                e.0
            );
            assert!(e.0.ends_with(&format!(", got {got}")), "{}", e.0);
        }
        let mut v = fits.clone();
        v["n"] = serde_json::json!(true);
        assert!(
            all.check(&event(v))
                .unwrap_err()
                .0
                .ends_with("got a boolean")
        );
        d.insert("x".into(), "integr".into());
        let errors = DeclaredFields::parse(&d, "fields").unwrap_err();
        assert_eq!(errors[0].path, ["fields", "x"]);
        assert!(errors[0].message.contains("string, number"));
    }

    #[test]
    fn template_fields_are_found_with_their_offsets() {
        assert_eq!(
            template_fields("logs-{{service}}-{{ http.status }}-%Y"),
            [("service".to_string(), 7), ("http.status".to_string(), 20)]
        );
        assert!(template_fields("plain").is_empty());
        assert!(template_fields("a-{{b").is_empty());
        assert!(template_fields("{{}}").is_empty());
    }

    #[test]
    fn field_types_read_as_users_write_them() {
        assert_eq!(FieldType::from_name("integer"), Some(FieldType::Number));
        assert_eq!(FieldType::from_name("list"), Some(FieldType::Array));
        assert_eq!(FieldType::from_name("nope"), None);
        assert_eq!(FieldType::Number.join(FieldType::Number), FieldType::Number);
        assert_eq!(FieldType::Number.join(FieldType::String), FieldType::Any);
        assert_eq!(FieldType::Array.to_string(), "a list");
        let described: Vec<&str> = [
            FieldType::String,
            FieldType::Number,
            FieldType::Bool,
            FieldType::Object,
            FieldType::Array,
            FieldType::Any,
        ]
        .iter()
        .map(|t| t.describe())
        .collect();
        assert_eq!(
            described,
            [
                "a string",
                "a number",
                "a boolean",
                "an object",
                "a list",
                "any value"
            ]
        );
        for name in [
            "string", "str", "text", "number", "int", "integer", "float", "boolean", "bool",
            "object", "map", "array", "list", "any",
        ] {
            assert!(FieldType::from_name(name).is_some(), "{name}");
        }
        assert_eq!(FieldType::from_name("bool"), Some(FieldType::Bool));
        assert_eq!(FieldType::from_name("map"), Some(FieldType::Object));
        assert_eq!(FieldType::from_name("text"), Some(FieldType::String));
        assert_eq!(FieldType::from_name("any"), Some(FieldType::Any));
    }

    #[test]
    fn a_plugin_that_says_nothing_hides_nothing() {
        use crate::StageKind;
        assert_eq!(Flow::unknown(StageKind::Source).steps, [Step::EmitAny]);
        assert_eq!(Flow::unknown(StageKind::Transform).steps, [Step::Opaque]);
        assert_eq!(Flow::unknown(StageKind::Formatter).steps, [Step::EmitRaw]);
        assert!(Flow::unknown(StageKind::Sink).steps.is_empty());
        assert!(
            Flow::unknown(StageKind::Parser)
                .steps
                .iter()
                .all(|s| *s == Step::EmitAny)
        );
    }
}
