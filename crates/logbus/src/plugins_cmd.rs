//! `logbus plugins`: what this build carries, read from each plugin's own
//! option schema so the listing cannot drift from what the validator checks.

use logbus_plugin_api::{Registry, StageKind};
use serde_json::{Value, json};

struct OptionDoc {
    name: String,
    ty: String,
    required: bool,
    default: Option<Value>,
    description: String,
}

fn resolve<'a>(schema: &'a Value, mut v: &'a Value) -> &'a Value {
    while let Some(r) = v.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap_or("");
        match schema.get("$defs").and_then(|d| d.get(name)) {
            Some(def) => v = def,
            None => break,
        }
    }
    v
}

fn type_of(schema: &Value, prop: &Value) -> String {
    let prop = resolve(schema, prop);
    if let Some(variants) = prop
        .get("oneOf")
        .or_else(|| prop.get("anyOf"))
        .and_then(Value::as_array)
    {
        let names: Vec<String> = variants
            .iter()
            .map(|v| {
                let v = resolve(schema, v);
                if let Some(c) = v.get("const").and_then(Value::as_str) {
                    c.to_owned()
                } else if let Some(values) = v.get("enum").and_then(Value::as_array) {
                    let names: Vec<&str> = values.iter().filter_map(Value::as_str).collect();
                    names.join(" | ")
                } else {
                    type_of(schema, v)
                }
            })
            .collect();
        return names.join(" | ");
    }
    if let Some(values) = prop.get("enum").and_then(Value::as_array) {
        return values
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" | ");
    }
    match prop.get("type") {
        Some(Value::String(t)) if t == "array" => {
            format!(
                "list of {}",
                prop.get("items")
                    .map_or("any".into(), |i| type_of(schema, i))
            )
        }
        Some(Value::String(t)) if t == "object" => "map".into(),
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect::<Vec<_>>()
            .join(" | "),
        _ => "any".into(),
    }
}

fn options(schema: &Value) -> Vec<OptionDoc> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|props| {
            props
                .iter()
                .map(|(name, prop)| OptionDoc {
                    name: name.clone(),
                    ty: type_of(schema, prop),
                    required: required.contains(&name.as_str()),
                    default: prop.get("default").cloned(),
                    description: prop
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .replace('\n', " "),
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn print(registry: &Registry, as_json: bool) -> anyhow::Result<()> {
    if as_json {
        let plugins: Vec<Value> = registry
            .plugins()
            .map(|p| {
                let mut plugin = json!({
                    "kind": p.kind(),
                    "name": p.name(),
                    "description": p.description(),
                    "options": p.options_schema(),
                });
                if p.kind() == StageKind::Source {
                    plugin["acknowledgements"] = json!(p.acknowledgements());
                }
                plugin
            })
            .collect();
        let absent: Vec<Value> = registry
            .absent()
            .map(|(k, n, f)| json!({"kind": k, "name": n, "feature": f}))
            .collect();
        crate::emit(&format!(
            "{}\n",
            serde_json::to_string_pretty(
                &json!({"plugins": plugins, "not_in_this_build": absent})
            )?
        ));
        return Ok(());
    }
    use std::fmt::Write;
    let mut text = String::new();
    for p in registry.plugins() {
        writeln!(text, "{} {}\n    {}", p.kind(), p.name(), p.description())?;
        if p.kind() == StageKind::Source {
            match p.acknowledgements() {
                Some(how) => writeln!(text, "    acknowledgements: {how}")?,
                None => writeln!(
                    text,
                    "    acknowledgements: none — events in flight when the process dies are lost"
                )?,
            }
        }
        let opts = options(&p.options_schema());
        if opts.is_empty() {
            writeln!(text, "    (no options)")?;
        }
        for o in opts {
            let mut line = format!("    {}: {}", o.name, o.ty);
            if o.required {
                line.push_str(" (required)");
            } else if let Some(d) = o.default.filter(|d| !d.is_null()) {
                line.push_str(&format!(" = {d}"));
            }
            if !o.description.is_empty() {
                line.push_str(&format!(" — {}", o.description));
            }
            writeln!(text, "{line}")?;
        }
        writeln!(text)?;
    }
    let absent: Vec<String> = registry
        .absent()
        .map(|(k, n, f)| format!("{k} {n} (feature `{f}`)"))
        .collect();
    if !absent.is_empty() {
        writeln!(text, "not in this build: {}", absent.join(", "))?;
    }
    crate::emit(&text);
    Ok(())
}
