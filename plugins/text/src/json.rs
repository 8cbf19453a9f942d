//! `parser: json` (a raw line holding a JSON object becomes fields; a JSON
//! array becomes one event per element) and
//! `formatter: json` (fields become one compact JSON line).

use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, EventError, FieldType, Fields, Flow, LazyFields, LineBuffer,
    Needs, OptionError, Payload, Processor, StageKind, Step, TypedPlugin, Verdict,
    flow::{DeclaredFields, FieldDeclaration},
};
use serde::Deserialize;
use serde_json::Value;

/// Options of `parser: json`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonParserOptions {
    /// Wrap a JSON value that is not an object as `{"<wrap_field>": value}`
    /// instead of treating it as an error.
    #[serde(default)]
    pub wrap_field: Option<String>,
    /// Keep an object that is already compact JSON as its text: reading a
    /// field parses only its top-level entry, stamping, setting and
    /// deleting top-level fields are edits beside the text, and writing
    /// JSON out splices the two; the fields are built only when a stage
    /// changes a nested field or needs them all. `false` builds every
    /// event's fields at once.
    #[serde(default = "yes")]
    pub lazy: bool,
    /// The fields every event carries, by dotted path and type (`string`,
    /// `number`, `boolean`, `object`, `array`, `any`). `logbus validate`
    /// then checks every later read against them (reading a field not
    /// declared is an error); at run time an event that lacks one or holds
    /// another type is an error for `on_error`.
    #[serde(default)]
    pub fields: FieldDeclaration,
}

fn yes() -> bool {
    true
}

impl CheckOptions for JsonParserOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = match &self.wrap_field {
            Some(f) if f.is_empty() => vec![OptionError::at(&["wrap_field"], "must not be empty")],
            _ => Vec::new(),
        };
        if let Err(e) = DeclaredFields::parse(&self.fields, "fields") {
            errors.extend(e);
        }
        errors
    }
}

pub struct JsonParser;

impl TypedPlugin for JsonParser {
    type Options = JsonParserOptions;
    const NAME: &'static str = "json";
    const KIND: StageKind = StageKind::Parser;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str = "Parses a raw line as a JSON object into fields. A line that is not JSON, or not an object, is an error for `on_error`.";

    fn build(
        &self,
        options: JsonParserOptions,
        _cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let declared =
            DeclaredFields::parse(&options.fields, "fields").map_err(|mut e| e.swap_remove(0))?;
        Ok(Box::new(ParseJson { options, declared }))
    }

    fn flow(&self, options: &JsonParserOptions) -> Flow {
        let declared = DeclaredFields::parse(&options.fields, "fields").unwrap_or_default();
        let mut flow = Flow::pass().needs(Needs::Raw).then(Step::EmitFields {
            open: declared.is_empty(),
        });
        flow.steps.extend(declared.steps("fields"));
        if let Some(wrap) = &options.wrap_field
            && !declared.is_empty()
        {
            flow = flow.set(wrap.clone(), FieldType::Any, &["wrap_field"]);
        }
        flow
    }
}

struct ParseJson {
    options: JsonParserOptions,
    declared: DeclaredFields,
}

impl Processor for ParseJson {
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        let verdict = self.parse(event)?;
        if self.declared.is_empty() {
            return Ok(verdict);
        }
        match &verdict {
            Verdict::Replace(events) => {
                for (i, e) in events.iter().enumerate() {
                    self.declared
                        .check(e)
                        .map_err(|e| EventError::new(format!("item {i} of the array: {e}")))?;
                }
            }
            _ => self.declared.check(event)?,
        }
        Ok(verdict)
    }
}

impl ParseJson {
    #[cfg(test)]
    fn new(options: JsonParserOptions) -> Self {
        let declared = DeclaredFields::parse(&options.fields, "fields").expect("valid declaration");
        ParseJson { options, declared }
    }

    fn parse(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        let Payload::Raw(bytes) = event.payload() else {
            return Err(EventError::new(
                "the json parser needs a raw event; this one is already parsed",
            ));
        };
        if let Some(offset) = nesting_beyond(bytes, MAX_DEPTH) {
            return Err(EventError::new(format!(
                "invalid JSON: nested deeper than {MAX_DEPTH} levels at byte {offset}"
            )));
        }
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
            // A JSON array: one event per element.
            let items = sonic_rs::from_slice::<Vec<Value>>(bytes).map_err(|e| describe(&e))?;
            let mut events = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                let fields = match (item, &self.options.wrap_field) {
                    (Value::Object(map), _) => map,
                    (other, Some(wrap)) => {
                        let mut map = Fields::new();
                        map.insert(wrap.clone(), other);
                        map
                    }
                    (_, None) => {
                        return Err(EventError::new(format!(
                            "not a JSON object: item {i} of the array (use `wrap_field` to keep other values)"
                        )));
                    }
                };
                events.push(Event::fields(fields, event.meta().clone()));
            }
            return Ok(Verdict::Replace(events));
        }
        if self.options.lazy
            && let Some(lazy) = LazyFields::parse(bytes.clone())
        {
            *event.payload_mut() = Payload::Lazy(lazy);
            return Ok(Verdict::Keep);
        }
        let fields = match &self.options.wrap_field {
            None => {
                let mut de = sonic_rs::Deserializer::from_slice(bytes);
                serde::de::DeserializeSeed::deserialize(TopLevel, &mut de)
                    .and_then(|f| de.end().map(|()| f))
                    .map_err(|e| describe(&e))?
            }
            Some(wrap) => match sonic_rs::from_slice::<Value>(bytes).map_err(|e| describe(&e))? {
                Value::Object(map) => map,
                other => {
                    let mut map = Fields::new();
                    map.insert(wrap.clone(), other);
                    map
                }
            },
        };
        *event.payload_mut() = Payload::Fields(fields);
        Ok(Verdict::Keep)
    }
}

/// The top-level object, into a map sized for a typical log line at once
/// (growing an ordered map one doubling at a time rehashes it each time);
/// what it holds deserialises as usual.
struct TopLevel;

/// Top-level fields reserved before the first one is read.
const TOP_LEVEL_FIELDS: usize = 16;

impl<'de> serde::de::DeserializeSeed<'de> for TopLevel {
    type Value = Fields;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Fields, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for TopLevel {
    type Value = Fields;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut access: A) -> Result<Fields, A::Error> {
        let mut fields = Fields::with_capacity(access.size_hint().unwrap_or(TOP_LEVEL_FIELDS));
        while let Some((key, value)) = access.next_entry::<String, Value>()? {
            fields.insert(key, value);
        }
        Ok(fields)
    }
}

/// Deepest nesting the parser accepts: serde_json's own limit, so that
/// whatever is parsed here can also be read back from a durable queue
/// (which stores events as JSON), and far from the stack's end in the
/// recursive conversions that follow.
pub const MAX_DEPTH: usize = 128;

/// The offset of the bracket that opens level `max + 1`, if any. Most
/// lines hold few brackets, so counting them (a vectorised search that
/// stops at the limit) settles it before any byte-by-byte walk.
fn nesting_beyond(bytes: &[u8], max: usize) -> Option<usize> {
    memchr::memchr2_iter(b'[', b'{', bytes).nth(max)?;
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Some(i);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

fn describe(e: &sonic_rs::Error) -> EventError {
    use sonic_rs::error::Category;
    let what = match e.classify() {
        Category::TypeUnmatched => "not a JSON object",
        Category::Eof => "truncated JSON",
        _ => "invalid JSON",
    };
    // sonic-rs appends a multi-line excerpt of the input; the first line
    // (what and where) is what belongs in a log line or an `_error` field.
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    EventError::new(format!("{what}: {first}"))
}

/// Options of `formatter: json`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonFormatterOptions {
    /// Add `_source` (the emitting source stage id) to each object.
    #[serde(default)]
    pub include_source: bool,
}

impl CheckOptions for JsonFormatterOptions {}

pub struct JsonFormatter;

impl TypedPlugin for JsonFormatter {
    type Options = JsonFormatterOptions;
    const NAME: &'static str = "json";
    const KIND: StageKind = StageKind::Formatter;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str = "Serialises parsed fields as one compact JSON object per event (raw bytes out). A raw event is an error.";

    fn build(
        &self,
        options: JsonFormatterOptions,
        _cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(FormatJson::new(options)))
    }

    fn flow(&self, _options: &JsonFormatterOptions) -> Flow {
        Flow::raw().needs(Needs::Fields)
    }
}

struct FormatJson {
    options: JsonFormatterOptions,
    buffer: LineBuffer,
}

impl FormatJson {
    fn new(options: JsonFormatterOptions) -> Self {
        FormatJson {
            options,
            buffer: LineBuffer::new(),
        }
    }
}

impl Processor for FormatJson {
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        let include_source = self.options.include_source;
        if let (Payload::Lazy(lazy), false) = (event.payload(), include_source) {
            // Untouched entries are copied as they were read.
            let line = self.buffer.line(|out| {
                lazy.write_json(out);
                Ok::<_, EventError>(())
            })?;
            *event.payload_mut() = Payload::Raw(line);
            return Ok(Verdict::Keep);
        }
        let Some(fields) = event.as_fields() else {
            return Err(EventError::new(
                "the json formatter needs a parsed event; this one is raw",
            ));
        };
        // sonic-rs escapes strings with SIMD: with serde_json, string
        // escaping was the largest single cost of the reference pipeline.
        let line = self.buffer.line(|out| {
            if include_source {
                let mut with = fields.clone();
                with.insert(
                    "_source".into(),
                    Value::String(event.meta().source.to_string()),
                );
                sonic_rs::to_writer(&mut *out, &with)
            } else {
                sonic_rs::to_writer(&mut *out, fields)
            }
            .map_err(|e| EventError::new(format!("cannot serialise: {e}")))
        })?;
        *event.payload_mut() = Payload::Raw(line);
        Ok(Verdict::Keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::Meta;
    use serde_json::json;

    #[test]
    fn options_default_to_lazy_and_refuse_an_empty_wrap_field() {
        let o: JsonParserOptions = serde_json::from_value(json!({})).unwrap();
        assert!(o.lazy);
        assert_eq!(o.wrap_field, None);
        let parser = logbus_plugin_api::Typed(JsonParser);
        let errors = |options| logbus_plugin_api::testing::option_errors(&parser, options);
        assert_eq!(errors(json!({})), "");
        assert_eq!(errors(json!({ "wrap_field": "v" })), "");
        assert_eq!(
            errors(json!({ "wrap_field": "" })),
            "wrap_field: must not be empty"
        );
    }

    /// Exactly `max` levels pass, one more is found at its bracket; a
    /// closed level no longer counts; an escaped quote does not end a
    /// string, so the brackets after the string count.
    #[test]
    fn nesting_is_found_at_the_bracket_past_the_limit() {
        assert_eq!(nesting_beyond(b"[[1],[2]]", 2), None);
        assert_eq!(nesting_beyond(b"[[[1]]]", 2), Some(2));
        assert_eq!(nesting_beyond(br#"{"a":[1],"b":[2],"c":{}}"#, 2), None);
        assert_eq!(nesting_beyond(br#"{"a":"x\"y","b":[[1]]}"#, 2), Some(17));
    }

    /// Read eagerly, a value that is not an object says what was expected.
    #[test]
    fn the_eager_parser_expects_an_object() {
        let mut p = ParseJson::new(JsonParserOptions {
            fields: Default::default(),
            wrap_field: None,
            lazy: false,
        });
        let err = p.process(&mut raw("7")).unwrap_err();
        assert_eq!(
            err.0,
            "not a JSON object: invalid type: integer `7`, expected a JSON object at line 1 column 1"
        );
    }

    fn raw(s: &str) -> Event {
        Event::raw(s.to_string(), Meta::at("src", 0))
    }

    #[test]
    fn parse_then_format_round_trips_and_keeps_order() {
        let mut e = raw(r#"{"z":1,"a":{"b":[1,2]},"m":"x"}"#);
        ParseJson::new(JsonParserOptions {
            fields: Default::default(),
            wrap_field: None,
            lazy: true,
        })
        .process(&mut e)
        .unwrap();
        assert_eq!(
            Value::Object(e.as_fields().unwrap().clone()),
            json!({"z":1,"a":{"b":[1,2]},"m":"x"})
        );
        let mut f = FormatJson::new(JsonFormatterOptions {
            include_source: false,
        });
        f.process(&mut e).unwrap();
        assert_eq!(
            &e.as_raw().unwrap()[..],
            br#"{"z":1,"a":{"b":[1,2]},"m":"x"}"#
        );
    }

    /// A megabyte of `[` (or `{"a":`) is an error, not a stack overflow.
    #[test]
    fn deep_nesting_is_an_error() {
        let mut p = ParseJson::new(JsonParserOptions {
            fields: Default::default(),
            wrap_field: Some("v".into()),
            lazy: true,
        });
        for deep in ["[".repeat(1 << 20), "{\"a\":".repeat(200_000)] {
            let err = p.process(&mut raw(&deep)).unwrap_err();
            assert!(
                err.0.contains("nested deeper than 128 levels at byte"),
                "{err}"
            );
        }
        // Unoptimised builds take far more stack per level than release
        // ones, so the deepest accepted document is parsed on a thread
        // with the stack a release worker would have to spare.
        let at_limit = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn(move || {
                ParseJson::new(JsonParserOptions {
                    fields: Default::default(),
                    wrap_field: Some("v".into()),
                    lazy: true,
                })
                .process(&mut raw(&at_limit))
                .unwrap();
            })
            .unwrap()
            .join()
            .unwrap();
        // Brackets inside strings do not count.
        let quoted = format!("{{\"a\":\"{}\\\"{}\"}}", "[".repeat(300), "{".repeat(300));
        p.process(&mut raw(&quoted)).unwrap();
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let mut p = ParseJson::new(JsonParserOptions {
            fields: Default::default(),
            wrap_field: None,
            lazy: true,
        });
        let err = p.process(&mut raw("not json")).unwrap_err();
        assert!(err.0.starts_with("invalid JSON"), "{err}");
        assert!(err.0.contains("line 1 column"), "{err}");
        assert!(!err.0.contains('\n'), "one line: {err:?}");
        let err = p.process(&mut raw("[{},2]")).unwrap_err();
        assert!(err.0.starts_with("not a JSON object: item 1"), "{err}");
        let err = p.process(&mut raw("7")).unwrap_err();
        assert!(err.0.starts_with("not a JSON object"), "{err}");
        let err = p.process(&mut raw(r#"{"a":"#)).unwrap_err();
        assert!(err.0.starts_with("truncated JSON"), "{err}");
        let mut bad_utf8 = Event::raw(b"{\"a\":\"\xff\"}".to_vec(), Meta::at("src", 0));
        assert!(
            p.process(&mut bad_utf8).is_err(),
            "invalid UTF-8 must not pass"
        );
        // The failed event is left as it was, for routing.
        let mut e = raw("oops");
        p.process(&mut e).unwrap_err();
        assert_eq!(&e.as_raw().unwrap()[..], b"oops");
    }

    /// The top level is read into a map reserved up front: order, a
    /// repeated key (the last value, at the first one's place), more
    /// fields than reserved, and what follows the object are as before.
    #[test]
    fn the_top_level_object_keeps_order_and_refuses_trailing_bytes() {
        let mut p = ParseJson::new(JsonParserOptions {
            fields: Default::default(),
            wrap_field: None,
            lazy: true,
        });
        let many: Vec<String> = (0..40).map(|i| format!("\"k{i}\":{i}")).collect();
        let mut e = raw(&format!("{{\"b\":1,\"a\":2,\"b\":3,{}}}", many.join(",")));
        p.process(&mut e).unwrap();
        let keys: Vec<&str> = e.as_fields().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys[..3], ["b", "a", "k0"]);
        assert_eq!(keys.len(), 42);
        assert_eq!(e.as_fields().unwrap()["b"], 3);
        let err = p.process(&mut raw(r#"{"a":1} x"#)).unwrap_err();
        assert!(err.0.starts_with("invalid JSON"), "{err}");
    }

    #[test]
    fn an_array_of_objects_becomes_one_event_each() {
        let mut p = ParseJson::new(JsonParserOptions {
            fields: Default::default(),
            wrap_field: None,
            lazy: true,
        });
        match p.process(&mut raw(r#" [{"a":1},{"b":[2]}]"#)) {
            Ok(Verdict::Replace(events)) => {
                let got: Vec<Value> = events
                    .iter()
                    .map(|e| Value::Object(e.as_fields().unwrap().clone()))
                    .collect();
                assert_eq!(got, vec![json!({"a": 1}), json!({"b": [2]})]);
                assert_eq!(&*events[0].meta().source, "src", "metadata is kept");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(p.process(&mut raw("[]")), Ok(Verdict::Replace(v)) if v.is_empty()));
        let mut wrap = ParseJson::new(JsonParserOptions {
            fields: Default::default(),
            wrap_field: Some("v".into()),
            lazy: true,
        });
        match wrap.process(&mut raw("[1, {\"a\":2}]")) {
            Ok(Verdict::Replace(events)) => assert_eq!(events.len(), 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn wrap_field_accepts_scalars() {
        let mut e = raw("42");
        ParseJson::new(JsonParserOptions {
            fields: Default::default(),
            wrap_field: Some("value".into()),
            lazy: true,
        })
        .process(&mut e)
        .unwrap();
        assert_eq!(
            Value::Object(e.as_fields().unwrap().clone()),
            json!({"value": 42})
        );
    }

    #[test]
    fn formatter_rejects_raw_and_can_add_source() {
        let mut f = FormatJson::new(JsonFormatterOptions {
            include_source: true,
        });
        assert!(f.process(&mut raw("x")).is_err());
        let mut e = raw(r#"{"a":1}"#);
        ParseJson::new(JsonParserOptions {
            fields: Default::default(),
            wrap_field: None,
            lazy: true,
        })
        .process(&mut e)
        .unwrap();
        f.process(&mut e).unwrap();
        assert_eq!(&e.as_raw().unwrap()[..], br#"{"a":1,"_source":"src"}"#);
    }

    /// Lazy and eager parsing are indistinguishable downstream: the same
    /// fields, the same JSON out, and compact lines really are kept lazy.
    #[test]
    fn lazy_and_eager_parsing_agree() {
        let mut f = FormatJson::new(JsonFormatterOptions {
            include_source: false,
        });
        for (line, kept_lazy) in [
            (
                r#"{"seq":1,"msg":"a \"quoted\" word","n":[1,2.5,null],"o":{"k":true}}"#,
                true,
            ),
            (r#"{"a":1,"a":2}"#, false),
            (r#"{ "spaced" : 1 }"#, false),
            (r#"{"e":"\u00e9","f":1E3}"#, false),
            (r#"{}"#, true),
        ] {
            let mut outs = Vec::new();
            for lazy in [true, false] {
                let mut e = raw(line);
                ParseJson::new(JsonParserOptions {
                    fields: Default::default(),
                    wrap_field: None,
                    lazy,
                })
                .process(&mut e)
                .unwrap();
                assert_eq!(
                    matches!(e.payload(), Payload::Lazy(_)),
                    lazy && kept_lazy,
                    "{line}"
                );
                let fields = e.as_fields().unwrap().clone();
                f.process(&mut e).unwrap();
                outs.push((fields, e.as_raw().unwrap().clone()));
            }
            assert_eq!(outs[0], outs[1], "{line}");
        }
    }

    /// Declared fields: an event that breaks the declaration is an error
    /// for `on_error` (so `errored` counts it), lazy or eager, and each
    /// item of an array is held to it.
    #[test]
    fn declared_fields_are_held_to_at_run_time() {
        for lazy in [true, false] {
            let mut fields = FieldDeclaration::new();
            fields.insert("status".into(), "number".into());
            let mut p = ParseJson::new(JsonParserOptions {
                fields,
                wrap_field: None,
                lazy,
            });
            assert!(p.process(&mut raw(r#"{"status":200,"x":1}"#)).is_ok());
            let e = p.process(&mut raw(r#"{"status":"200"}"#)).unwrap_err();
            assert_eq!(
                e.0,
                "declared field `status` should be a number, got a string"
            );
            let e = p.process(&mut raw(r#"{"x":1}"#)).unwrap_err();
            assert_eq!(e.0, "declared field `status` is missing");
            let e = p
                .process(&mut raw(r#"[{"status":1},{"status":true}]"#))
                .unwrap_err();
            assert!(e.0.starts_with("item 1 of the array: "), "{}", e.0);
        }
        let flow = JsonParser.flow(&JsonParserOptions {
            fields: [("a.b".to_string(), "string".to_string())].into(),
            wrap_field: None,
            lazy: true,
        });
        assert_eq!(flow.needs, Needs::Raw);
        assert_eq!(flow.steps[0], Step::EmitFields { open: false });
        assert_eq!(flow.steps.len(), 2);
        let open = JsonParser.flow(&JsonParserOptions {
            fields: FieldDeclaration::new(),
            wrap_field: None,
            lazy: true,
        });
        assert_eq!(open.steps, [Step::EmitFields { open: true }]);
    }
}
