//! The JSON Schema of a whole pipeline file, assembled from the schema of
//! every plugin in the registry — the same typed option structs the
//! validator deserialises into, so the two cannot drift. Editors use it for
//! completion and checking as you type; `logbus validate` stays the
//! authority (the schema cannot see the graph: inputs, cycles, sinks).

use logbus_plugin_api::{Registry, StageKind};
use serde_json::{Map, Value, json};

use crate::config::{MAX_WORKERS, QueueSpec, Settings};

/// Prefixes every `#/$defs/X` reference inside `value` with `prefix`.
fn rebase_refs(value: &mut Value, prefix: &str) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get_mut("$ref")
                && let Some(name) = r.strip_prefix("#/$defs/")
            {
                *r = format!("#/$defs/{prefix}{name}");
            }
            map.values_mut().for_each(|v| rebase_refs(v, prefix));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rebase_refs(v, prefix)),
        _ => {}
    }
}

/// Moves a schema's `$defs` into `defs` under `prefix`, returning the rest.
fn hoist(mut schema: Value, prefix: &str, defs: &mut Map<String, Value>) -> Map<String, Value> {
    rebase_refs(&mut schema, prefix);
    let mut map = match schema {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    if let Some(Value::Object(own)) = map.remove("$defs") {
        for (name, def) in own {
            defs.insert(format!("{prefix}{name}"), def);
        }
    }
    map.remove("$schema");
    map.remove("title");
    map
}

/// The schema of a pipeline file for the plugins in `registry`.
pub fn pipeline_schema(registry: &Registry) -> Value {
    let mut defs = Map::new();
    let settings = hoist(
        schemars::schema_for!(Settings).to_value(),
        "settings-",
        &mut defs,
    );
    let queue = hoist(
        schemars::schema_for!(QueueSpec).to_value(),
        "queue-",
        &mut defs,
    );
    defs.insert("queue".into(), Value::Object(queue));

    let mut variants = Vec::new();
    for plugin in registry.plugins() {
        let kind = plugin.kind();
        let mut variant_extra_dependent = false;
        let name = format!("{}-{}", kind.key(), plugin.name());
        let mut stage = hoist(plugin.options_schema(), &format!("{name}-"), &mut defs);
        let mut props = match stage.remove("properties") {
            Some(Value::Object(p)) => p,
            _ => Map::new(),
        };
        let mut required: Vec<Value> = match stage.remove("required") {
            Some(Value::Array(r)) => r,
            _ => Vec::new(),
        };
        props.insert(
            kind.key().into(),
            json!({ "const": plugin.name(), "description": plugin.description() }),
        );
        required.push(json!(kind.key()));
        if kind != StageKind::Source {
            props.insert(
                "inputs".into(),
                json!({
                    "description": "Stages whose output this stage reads (`<id>.errors` for a stage's failed events).",
                    "type": "array",
                    "items": { "type": "string" },
                    "minItems": 1
                }),
            );
            required.push(json!("inputs"));
            props.insert(
                "workers".into(),
                json!({
                    "description": "Tasks running this stage, sharing its input queue; each has its own plugin instance. No order is kept across workers unless `ordered` is set.",
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_WORKERS,
                    "default": 1
                }),
            );
            if kind != StageKind::Sink {
                props.insert(
                    "ordered".into(),
                    json!({
                        "description": "The workers hand on batches in the order they took them from the input queue (a global queue only).",
                        "type": "boolean",
                        "default": false
                    }),
                );
            }
            props.insert("queue".into(), json!({ "$ref": "#/$defs/queue" }));
        }
        let attached = match kind {
            StageKind::Source => Some(("codec", StageKind::Parser)),
            StageKind::Sink => Some(("format", StageKind::Formatter)),
            _ => None,
        };
        if let Some((key, attached_kind)) = attached {
            let names: Vec<&str> = registry
                .plugins()
                .filter(|p| p.kind() == attached_kind)
                .map(|p| p.name())
                .collect();
            props.insert(
                key.into(),
                json!({
                    "description": format!(
                        "A {} run inside this stage: its name, or a map of its name to its options.",
                        attached_kind.key()
                    ),
                    "oneOf": [
                        { "enum": names },
                        {
                            "type": "object",
                            "minProperties": 1,
                            "maxProperties": 1,
                            "propertyNames": { "enum": names }
                        }
                    ]
                }),
            );
        }
        if kind == StageKind::Source {
            // On a source, `on_error` is its codec's.
            props.insert(
                "on_error".into(),
                json!({
                    "description": "What to do with an event this source's `codec` cannot parse.",
                    "enum": ["drop", "fail", "route"],
                    "default": "drop"
                }),
            );
            variant_extra_dependent = true;
        }
        if kind.is_processor() {
            props.insert(
                "on_error".into(),
                json!({
                    "description": "What to do with an event this stage cannot process.",
                    "enum": ["drop", "fail", "route"],
                    "default": "drop"
                }),
            );
        }
        let mut variant = Map::new();
        variant.insert("type".into(), json!("object"));
        variant.insert(
            "description".into(),
            json!(format!(
                "{kind} `{}`: {}",
                plugin.name(),
                plugin.description()
            )),
        );
        variant.insert("properties".into(), Value::Object(props));
        variant.insert("required".into(), Value::Array(required));
        variant.insert("additionalProperties".into(), json!(false));
        if variant_extra_dependent {
            variant.insert("dependentRequired".into(), json!({ "on_error": ["codec"] }));
        }
        defs.insert(name.clone(), Value::Object(variant));
        variants.push(json!({ "$ref": format!("#/$defs/{name}") }));
    }
    defs.insert("stage".into(), json!({ "oneOf": variants }));

    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "LogBus pipeline",
        "description": "A LogBus pipeline file. `logbus validate` checks what a schema cannot: inputs, cycles, sinks.",
        "type": "object",
        "additionalProperties": false,
        "required": ["stages"],
        "properties": {
            "settings": Value::Object(settings),
            "stages": {
                "description": "Stage id -> stage. Ids: letters, digits, `_` and `-`.",
                "type": "object",
                "minProperties": 1,
                "propertyNames": { "pattern": "^[A-Za-z0-9_-]+$" },
                "additionalProperties": { "$ref": "#/$defs/stage" }
            },
            "tests": {
                "description": "Unit tests run by `logbus test` (see docs/testing-pipelines.md).",
                "type": "array"
            }
        },
        "$defs": Value::Object(defs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::{
        BuildContext, CheckOptions, OptionError, Processor, Sink, Source, Typed, TypedPlugin,
    };

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Inner {
        n: u32,
    }

    /// Options whose schema has definitions of its own, referred to from
    /// inside a list (`anyOf`) and an object (`items`).
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Options {
        path: String,
        one: Option<Inner>,
        #[serde(default)]
        many: Vec<Inner>,
    }
    impl CheckOptions for Options {}

    macro_rules! plugin {
        ($t:ident, $name:literal, $kind:expr, $stage:ty) => {
            struct $t;
            impl TypedPlugin for $t {
                type Options = Options;
                const NAME: &'static str = $name;
                const KIND: StageKind = $kind;
                type Stage = $stage;
                const DESCRIPTION: &'static str = concat!("the ", $name);
                fn build(&self, _: Options, _: &BuildContext) -> Result<Self::Stage, OptionError> {
                    Err(OptionError::at(&[], "not built"))
                }
            }
        };
    }
    plugin!(Gen, "gen", StageKind::Source, Box<dyn Source>);
    plugin!(Lines, "lines", StageKind::Parser, Box<dyn Processor>);
    plugin!(Edit, "edit", StageKind::Transform, Box<dyn Processor>);
    plugin!(Csv, "csv", StageKind::Formatter, Box<dyn Processor>);
    plugin!(Out, "out", StageKind::Sink, Box<dyn Sink>);

    fn schema() -> Value {
        let mut r = Registry::new();
        r.add(Typed(Gen));
        r.add(Typed(Lines));
        r.add(Typed(Edit));
        r.add(Typed(Csv));
        r.add(Typed(Out));
        pipeline_schema(&r)
    }

    #[test]
    fn each_plugin_is_a_stage_variant_with_its_definitions_hoisted() {
        let s = schema();
        let defs = &s["$defs"];
        assert_eq!(s["required"], json!(["stages"]));
        assert_eq!(s["additionalProperties"], json!(false));
        assert_eq!(
            s["properties"]["stages"]["additionalProperties"],
            json!({ "$ref": "#/$defs/stage" })
        );
        let variants: Vec<&str> = defs["stage"]["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["$ref"].as_str().unwrap())
            .collect();
        assert_eq!(variants.len(), 5);
        for name in [
            "source-gen",
            "parser-lines",
            "transform-edit",
            "formatter-csv",
            "sink-out",
        ] {
            assert!(
                variants.contains(&format!("#/$defs/{name}").as_str()),
                "{variants:?}"
            );
            let v = &defs[name];
            assert_eq!(v["type"], json!("object"), "{name}");
            assert_eq!(v["additionalProperties"], json!(false), "{name}");
            // The plugin's own definitions, under its name, referred to
            // there from inside lists and objects alike.
            assert!(defs[format!("{name}-Inner")].is_object(), "{name}");
            let props = &v["properties"];
            assert_eq!(
                props["many"]["items"]["$ref"],
                json!(format!("#/$defs/{name}-Inner")),
                "{name}"
            );
            assert!(
                props["one"]
                    .to_string()
                    .contains(&format!("\"#/$defs/{name}-Inner\"")),
                "{name}: {}",
                props["one"]
            );
            assert_eq!(props["path"]["type"], json!("string"), "{name}");
        }
        assert!(defs.get("Inner").is_none());
        let transform = &defs["transform-edit"];
        assert_eq!(
            transform["description"],
            json!("transform `edit`: the edit")
        );
        assert_eq!(
            transform["required"],
            json!(["path", "transform", "inputs"])
        );
        let props = transform["properties"].as_object().unwrap();
        assert_eq!(
            props["transform"],
            json!({ "const": "edit", "description": "the edit" })
        );
        assert_eq!(props["workers"]["maximum"], json!(MAX_WORKERS));
        assert_eq!(props["ordered"]["type"], json!("boolean"));
        assert_eq!(props["queue"], json!({ "$ref": "#/$defs/queue" }));
        assert_eq!(props["on_error"]["enum"], json!(["drop", "fail", "route"]));
        assert!(transform.get("dependentRequired").is_none());
        for key in ["codec", "format"] {
            assert!(!props.contains_key(key), "{key}");
        }

        // A source reads nothing and has no queue; its `on_error` is its
        // codec's, which it then needs.
        let source = &defs["source-gen"];
        assert_eq!(source["required"], json!(["path", "source"]));
        let props = source["properties"].as_object().unwrap();
        for key in ["inputs", "workers", "ordered", "queue", "format"] {
            assert!(!props.contains_key(key), "{key}");
        }
        assert_eq!(props["codec"]["oneOf"][0], json!({ "enum": ["lines"] }));
        assert_eq!(
            props["codec"]["oneOf"][1]["propertyNames"],
            json!({ "enum": ["lines"] })
        );
        assert_eq!(
            source["dependentRequired"],
            json!({ "on_error": ["codec"] })
        );
        assert!(
            props["on_error"]["description"]
                .as_str()
                .unwrap()
                .contains("`codec`")
        );
        // A sink takes a formatter and has no `on_error`.
        let sink = &defs["sink-out"];
        let props = sink["properties"].as_object().unwrap();
        assert_eq!(props["format"]["oneOf"][0], json!({ "enum": ["csv"] }));
        assert!(!props.contains_key("on_error"));
        assert!(!props.contains_key("codec"));
        assert!(!props.contains_key("ordered"));
        assert!(props.contains_key("inputs"));
    }

    #[test]
    fn settings_and_queue_come_with_their_definitions() {
        let s = schema();
        let settings = &s["properties"]["settings"];
        assert!(settings.get("$schema").is_none());
        assert!(settings.get("title").is_none());
        assert!(settings.get("$defs").is_none());
        assert!(
            settings["properties"]["api"]
                .to_string()
                .contains("\"#/$defs/settings-ApiSettings\""),
            "{}",
            settings["properties"]["api"]
        );
        assert!(s["$defs"]["settings-ApiSettings"]["properties"]["listen"].is_object());
        let queue = &s["$defs"]["queue"];
        assert!(
            queue["properties"]["local"]
                .to_string()
                .contains("#/$defs/queue-LocalSpec")
        );
        assert!(s["$defs"]["queue-LocalSpec"].is_object());
        assert!(queue.get("$defs").is_none());
        // Sizes take a number or a text with a unit.
        assert_eq!(
            queue["properties"]["max_disk_bytes"]["anyOf"][0],
            json!({ "$ref": "#/$defs/queue-ByteSize" })
        );
        assert_eq!(
            s["$defs"]["queue-ByteSize"]["oneOf"][0],
            json!({ "type": "integer", "minimum": 0 })
        );
    }
}
