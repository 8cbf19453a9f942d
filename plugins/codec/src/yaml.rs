//! YAML documents: `parser: yaml` turns each document of a raw event (one,
//! or a `---`-separated stream) into an event; `formatter: yaml` writes an
//! event as one document (starting with `---`, so concatenated output is a
//! valid stream).
//!
//! Scalars are typed by the YAML 1.2 core schema (`true`, `12`, `1.5`,
//! `null`, `~`; quoted scalars are strings), which is what yaml-rust2
//! implements. A document must be a mapping (`wrap_field` wraps anything
//! else); mapping keys that are not strings are written as their YAML text.

use logbus_plugin_api::Fields;
use serde_json::{Map, Number, Value};
use std::collections::HashMap;

use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::TScalarStyle;
use yaml_rust2::yaml::Hash;
use yaml_rust2::{Yaml, YamlEmitter};

use crate::DecodeError;

/// Deepest nesting a document may have: deeper is an error, not a stack
/// overflow in the recursive conversions that follow.
pub const MAX_DEPTH: usize = 128;

/// What aliases may copy per input, in approximate bytes (a node counts
/// [`NODE_WEIGHT`], a scalar its text besides): a fixed allowance plus ten
/// times the input's length, so a few hundred bytes of nested aliases
/// cannot expand to gigabytes.
const ALIAS_ALLOWANCE: usize = 1 << 20;
const NODE_WEIGHT: usize = 64;

/// Every document in `input`.
///
/// yaml-rust2's own loader recurses once per nesting level and copies
/// aliases without limit, so documents are built here from its event
/// stream with a depth limit and an alias budget.
pub fn decode(input: &[u8]) -> Result<Vec<Value>, DecodeError> {
    let text = std::str::from_utf8(input)
        .map_err(|e| DecodeError::at(e.valid_up_to(), "invalid UTF-8"))?;
    let mut loader = Loader {
        alias_budget: ALIAS_ALLOWANCE.saturating_add(input.len().saturating_mul(10)),
        ..Loader::default()
    };
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, mark) = parser.next_token().map_err(|e| {
            let m = e.marker();
            DecodeError::at(
                m.index(),
                format!(
                    "invalid YAML at line {}, column {}: {}",
                    m.line(),
                    m.col() + 1,
                    e.info()
                ),
            )
        })?;
        if event == Event::StreamEnd {
            break;
        }
        loader.on_event(event).map_err(|message| {
            DecodeError::at(
                mark.index(),
                format!(
                    "YAML at line {}, column {}: {message}",
                    mark.line(),
                    mark.col() + 1
                ),
            )
        })?;
    }
    loader.docs.iter().map(to_json).collect()
}

/// An open sequence or mapping.
struct Open {
    node: Yaml,
    anchor: usize,
    weight: usize,
    /// For a mapping, the key waiting for its value.
    pending_key: Option<Yaml>,
}

#[derive(Default)]
struct Loader {
    docs: Vec<Yaml>,
    stack: Vec<Open>,
    anchors: HashMap<usize, (Yaml, usize)>,
    alias_budget: usize,
}

impl Loader {
    fn on_event(&mut self, event: Event) -> Result<(), String> {
        match event {
            Event::DocumentStart => self.anchors.clear(),
            Event::Scalar(text, style, anchor, tag) => {
                let weight = NODE_WEIGHT + text.len();
                self.push(scalar(text, style, tag.as_ref()), anchor, weight);
            }
            Event::SequenceStart(anchor, _) => self.open(Yaml::Array(Vec::new()), anchor)?,
            Event::MappingStart(anchor, _) => self.open(Yaml::Hash(Hash::new()), anchor)?,
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some(open) = self.stack.pop() {
                    self.push(open.node, open.anchor, open.weight);
                }
            }
            Event::Alias(id) => {
                let (node, weight) = self
                    .anchors
                    .get(&id)
                    .ok_or("an alias refers to an unknown anchor")?;
                let weight = *weight;
                if weight > self.alias_budget {
                    return Err(
                        "aliases copy more than 1 MiB plus ten times the input's size".into(),
                    );
                }
                self.alias_budget -= weight;
                let node = node.clone();
                self.push(node, 0, weight);
            }
            _ => {}
        }
        Ok(())
    }

    fn open(&mut self, node: Yaml, anchor: usize) -> Result<(), String> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(format!("nesting deeper than {MAX_DEPTH} levels"));
        }
        self.stack.push(Open {
            node,
            anchor,
            weight: NODE_WEIGHT,
            pending_key: None,
        });
        Ok(())
    }

    fn push(&mut self, node: Yaml, anchor: usize, weight: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, (node.clone(), weight));
        }
        let Some(parent) = self.stack.last_mut() else {
            self.docs.push(node);
            return;
        };
        parent.weight = parent.weight.saturating_add(weight);
        match &mut parent.node {
            Yaml::Array(items) => items.push(node),
            Yaml::Hash(hash) => match parent.pending_key.take() {
                None => parent.pending_key = Some(node),
                Some(key) => {
                    hash.insert(key, node);
                }
            },
            _ => unreachable!("only collections are open"),
        }
    }
}

/// A scalar typed as YAML's core schema says: quoted text is a string, a
/// `!!bool`/`!!int`/`!!float`/`!!null` tag must match its text, anything
/// else plain is typed by its look.
fn scalar(text: String, style: TScalarStyle, tag: Option<&Tag>) -> Yaml {
    if style != TScalarStyle::Plain {
        return Yaml::String(text);
    }
    let Some(tag) = tag else {
        return Yaml::from_str(&text);
    };
    if tag.handle != "tag:yaml.org,2002:" {
        return Yaml::String(text);
    }
    match tag.suffix.as_str() {
        "bool" => match text.as_str() {
            "true" | "True" | "TRUE" => Yaml::Boolean(true),
            "false" | "False" | "FALSE" => Yaml::Boolean(false),
            _ => Yaml::BadValue,
        },
        "int" => text.parse().map_or(Yaml::BadValue, Yaml::Integer),
        "float" => match Yaml::from_str(&text) {
            Yaml::Real(_) | Yaml::Integer(_) => Yaml::Real(text),
            _ => Yaml::BadValue,
        },
        "null" => match text.as_str() {
            "~" | "null" => Yaml::Null,
            _ => Yaml::BadValue,
        },
        _ => Yaml::String(text),
    }
}

fn to_json(y: &Yaml) -> Result<Value, DecodeError> {
    Ok(match y {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Integer(i) => Value::from(*i),
        // JSON has no infinities or NaN (`.inf`, `.nan`): they are null.
        Yaml::Real(text) => text
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect::<Result<_, _>>()?),
        Yaml::Hash(hash) => {
            let mut map = Map::new();
            for (k, v) in hash {
                let key = match k {
                    Yaml::String(s) => s.clone(),
                    other => scalar_text(other),
                };
                map.insert(key, to_json(v)?);
            }
            Value::Object(map)
        }
        Yaml::Alias(_) => return Err(DecodeError::at(0, "an unresolved alias")),
        Yaml::BadValue => return Err(DecodeError::at(0, "a value YAML could not read")),
    })
}

fn scalar_text(y: &Yaml) -> String {
    match y {
        Yaml::Integer(i) => i.to_string(),
        Yaml::Real(r) => r.clone(),
        Yaml::Boolean(b) => b.to_string(),
        Yaml::Null => "null".into(),
        other => {
            let mut out = String::new();
            let _ = YamlEmitter::new(&mut out).dump(other);
            out.trim_start_matches("---").trim().to_string()
        }
    }
}

fn to_yaml(v: &Value) -> Yaml {
    match v {
        Value::Null => Yaml::Null,
        Value::Bool(b) => Yaml::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Yaml::Integer(i),
            // u64 beyond i64 and floats: written as reals; `{:?}` keeps a
            // fraction or exponent so they read back as floats.
            None => Yaml::Real(format!("{:?}", n.as_f64().unwrap_or(f64::NAN))),
        },
        Value::String(s) => Yaml::String(s.clone()),
        Value::Array(items) => Yaml::Array(items.iter().map(to_yaml).collect()),
        Value::Object(map) => {
            let mut hash = Hash::new();
            for (k, v) in map {
                hash.insert(Yaml::String(k.clone()), to_yaml(v));
            }
            Yaml::Hash(hash)
        }
    }
}

/// YAML limits an implicit key to 1024 characters as written (escapes
/// included) and yaml-rust2's emitter writes every key implicitly; keys
/// with control characters are also where it has been seen to write what
/// it cannot read back (found by fuzzing), and so are strings that read
/// back as another type (the emitter writes `0o04` unquoted, which reads
/// back as the integer 4; found by fuzzing). Such documents are checked by
/// reading them back.
fn risky(value: &Value) -> bool {
    let retyped = |s: &str| !matches!(Yaml::from_str(s), Yaml::String(_));
    match value {
        Value::Object(map) => map.iter().any(|(k, v)| {
            k.len() > 100 || k.chars().any(char::is_control) || retyped(k) || risky(v)
        }),
        Value::Array(items) => items.iter().any(risky),
        Value::String(s) => retyped(s),
        _ => false,
    }
}

/// One document, starting with `---` and ending with a newline. A
/// document the block emitter cannot write so that it reads back the same
/// is written in flow style instead (JSON, which YAML reads, every string
/// quoted); one that cannot be held either way is an error rather than
/// unreadable output.
pub fn encode(fields: &Fields, out: &mut Vec<u8>) -> Result<(), String> {
    let value = Value::Object(fields.clone());
    let mut text = String::new();
    YamlEmitter::new(&mut text)
        .dump(&to_yaml(&value))
        .expect("emitting to a String cannot fail");
    if risky(&value)
        && decode(text.as_bytes()).ok().as_deref() != Some(std::slice::from_ref(&value))
    {
        let flow = format!(
            "---\n{}",
            serde_json::to_string(&value).expect("JSON values serialise")
        );
        if decode(flow.as_bytes()).ok() != Some(vec![value]) {
            return Err("the fields cannot be written as YAML that reads back the same".into());
        }
        text = flow;
    }
    out.extend_from_slice(text.as_bytes());
    out.push(b'\n');
    Ok(())
}

#[cfg(any(feature = "parser-yaml", feature = "formatter-yaml"))]
mod plugins {
    use logbus_plugin_api::{
        BuildContext, CheckOptions, Event, EventError, Fields, LineBuffer, NoOptions, OptionError,
        Payload, Processor, StageKind, TypedPlugin, Verdict,
    };
    use serde::Deserialize;
    use serde_json::Value;

    /// Options of `parser: yaml`.
    #[derive(Debug, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct YamlParserOptions {
        /// Wrap a document that is not a mapping as `{"<wrap_field>": value}`
        /// instead of treating it as an error.
        #[serde(default)]
        pub wrap_field: Option<String>,
    }

    impl CheckOptions for YamlParserOptions {}

    pub struct YamlParser;

    impl TypedPlugin for YamlParser {
        type Options = YamlParserOptions;
        const NAME: &'static str = "yaml";
        const KIND: StageKind = StageKind::Parser;

        type Stage = Box<dyn Processor>;
        const DESCRIPTION: &'static str = "Parses YAML: each document of the event (one, or a ---separated stream) becomes an event.";
        fn flow(&self, _o: &YamlParserOptions) -> logbus_plugin_api::Flow {
            logbus_plugin_api::Flow::open_fields(&[]).needs(logbus_plugin_api::Needs::Raw)
        }
        fn build(
            &self,
            o: YamlParserOptions,
            _cx: &BuildContext,
        ) -> Result<Self::Stage, OptionError> {
            Ok(Box::new(
                move |e: &mut Event| -> Result<Verdict, EventError> {
                    let docs = super::decode(crate::raw_input(e, "yaml")?)
                        .map_err(|err| EventError::new(format!("not YAML: {err}")))?;
                    let mut events = Vec::with_capacity(docs.len());
                    for (i, doc) in docs.into_iter().enumerate() {
                        let fields: Fields = match (doc, &o.wrap_field) {
                            (Value::Object(map), _) => map,
                            (other, Some(wrap)) => {
                                let mut map = Fields::new();
                                map.insert(wrap.clone(), other);
                                map
                            }
                            (_, None) => {
                                return Err(EventError::new(format!(
                                    "not a YAML mapping: document {i} (use `wrap_field` to keep other values)"
                                )));
                            }
                        };
                        events.push(Event::fields(fields, e.meta().clone()));
                    }
                    if events.len() == 1 {
                        *e = events.pop().expect("one");
                        return Ok(Verdict::Keep);
                    }
                    Ok(Verdict::Replace(events))
                },
            ))
        }
    }

    pub struct YamlFormatter;

    impl TypedPlugin for YamlFormatter {
        type Options = NoOptions;
        const NAME: &'static str = "yaml";
        const KIND: StageKind = StageKind::Formatter;

        type Stage = Box<dyn Processor>;
        const DESCRIPTION: &'static str = "Writes each event as one YAML document (starting with ---, so the output is a YAML stream).";
        fn flow(&self, _o: &NoOptions) -> logbus_plugin_api::Flow {
            logbus_plugin_api::Flow::raw().needs(logbus_plugin_api::Needs::Fields)
        }
        fn build(&self, _o: NoOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
            let mut buffer = LineBuffer::new();
            Ok(Box::new(
                move |e: &mut Event| -> Result<Verdict, EventError> {
                    let line = buffer.line(|out| {
                        super::encode(crate::fields_input(e, "yaml")?, out).map_err(EventError::new)
                    })?;
                    *e.payload_mut() = Payload::Raw(line);
                    Ok(Verdict::Keep)
                },
            ))
        }
    }
}

#[cfg(any(feature = "parser-yaml", feature = "formatter-yaml"))]
pub use plugins::{YamlFormatter, YamlParser, YamlParserOptions};
