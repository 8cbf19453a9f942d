//! Names taken from an event: a Kafka topic or key, an index name.
//! `{{path}}` is replaced by the field at that dotted path (a string as
//! it is, another value as JSON, a missing one as `unknown`); everything
//! else is literal.

use logbus_plugin_api::{Event, FieldPath};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Field(FieldPath),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
}

impl Template {
    /// Parses `text`; an unclosed `{{` or a bad field path is an error
    /// naming it.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 2..];
            let close = after
                .find("}}")
                .ok_or_else(|| format!("`{{{{` without `}}}}` in `{text}`"))?;
            let name = after[..close].trim();
            let path = FieldPath::parse(name).map_err(|e| format!("in `{text}`: {e}"))?;
            parts.push(Part::Field(path));
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(Template { parts })
    }

    /// Whether it names no field (the same for every event).
    pub fn is_static(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Text(_)))
    }

    pub fn render(&self, event: &Event) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Field(path) => match event.as_fields().and_then(|f| path.get(f)) {
                    Some(Value::String(s)) => out.push_str(s),
                    Some(Value::Null) | None => out.push_str("unknown"),
                    Some(other) => out.push_str(&other.to_string()),
                },
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::Meta;
    use serde_json::json;

    fn event(v: Value) -> Event {
        Event::fields(v.as_object().unwrap().clone(), Meta::now("t".into()))
    }

    #[test]
    fn fields_strings_values_and_missing() {
        let t = Template::parse("logs-{{service}}-{{ http.status }}-{{nope}}").unwrap();
        assert!(!t.is_static());
        let e = event(json!({"service": "api", "http": {"status": 503}}));
        assert_eq!(t.render(&e), "logs-api-503-unknown");
        assert!(Template::parse("plain").unwrap().is_static());
        assert!(Template::parse("a-{{b").unwrap_err().contains("without"));
    }
}
