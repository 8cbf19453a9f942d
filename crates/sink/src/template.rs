//! Names taken from an event: a Kafka topic or key, an index name.
//! `{{path}}` is replaced by the field at that dotted path (a string as
//! it is, another value as JSON, a missing one as `unknown`); everything
//! else is literal. A template parsed with [`Template::parse_timed`] also
//! takes strftime directives (`logs-%Y.%m.%d`), rendered in UTC from a time
//! the caller picks (an index is named after the event's own time, not
//! after when it happens to be sent).

use chrono::{DateTime, Utc};
use logbus_plugin_api::{Event, FieldPath};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Field(FieldPath),
    /// A strftime directive (`%Y`), rendered from the caller's time.
    Time(String),
}

/// The strftime directives a timed template accepts.
const TIME_DIRECTIVES: &str = "YmdHMSjyUbBaAeGVu";

#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
}

impl Template {
    /// Parses `text`; an unclosed `{{` or a bad field path is an error
    /// naming it.
    pub fn parse(text: &str) -> Result<Template, String> {
        Self::parse_with(text, false)
    }

    /// As [`Template::parse`], and `%` starts a strftime directive (`%%`
    /// is a literal `%`); an unknown directive is an error naming it.
    pub fn parse_timed(text: &str) -> Result<Template, String> {
        Self::parse_with(text, true)
    }

    fn parse_with(text: &str, timed: bool) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("{{") {
                let close = after
                    .find("}}")
                    .ok_or_else(|| format!("`{{{{` without `}}}}` in `{text}`"))?;
                let name = after[..close].trim();
                let path = FieldPath::parse(name).map_err(|e| format!("in `{text}`: {e}"))?;
                if !literal.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut literal)));
                }
                parts.push(Part::Field(path));
                rest = &after[close + 2..];
            } else if let Some(after) = rest.strip_prefix('%').filter(|_| timed) {
                let c = after
                    .chars()
                    .next()
                    .ok_or_else(|| format!("`%` at the end of `{text}` (write `%%` for a `%`)"))?;
                if c == '%' {
                    literal.push('%');
                } else if TIME_DIRECTIVES.contains(c) {
                    if !literal.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Time(format!("%{c}")));
                } else {
                    let known: Vec<String> =
                        TIME_DIRECTIVES.chars().map(|d| format!("%{d}")).collect();
                    return Err(format!(
                        "`%{c}` in `{text}` is not a supported time directive ({}, or %% for %)",
                        known.join(" ")
                    ));
                }
                rest = &after[c.len_utf8()..];
            } else {
                let c = rest.chars().next().expect("not empty");
                literal.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        Ok(Template { parts })
    }

    /// Whether it names no field and no time (the same for every event).
    pub fn is_static(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Text(_)))
    }

    /// Whether it has time directives.
    pub fn is_timed(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Time(_)))
    }

    /// The text for `event`; time directives from the event's ingest time.
    pub fn render(&self, event: &Event) -> String {
        self.render_at(event, || {
            DateTime::from_timestamp_nanos(event.meta().ingest_ns as i64)
        })
    }

    /// The text for `event`, with time directives rendered from `time`
    /// (asked once, and only if the template has any).
    pub fn render_at(&self, event: &Event, time: impl FnOnce() -> DateTime<Utc>) -> String {
        let mut out = String::new();
        let mut time = Some(time);
        let mut at: Option<DateTime<Utc>> = None;
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Field(path) => match event.as_fields().and_then(|f| path.get(f)) {
                    Some(Value::String(s)) => out.push_str(s),
                    Some(Value::Null) | None => out.push_str("unknown"),
                    Some(other) => out.push_str(&other.to_string()),
                },
                Part::Time(directive) => {
                    let t = *at.get_or_insert_with(|| time.take().expect("asked once")());
                    use std::fmt::Write;
                    let _ = write!(out, "{}", t.format(directive));
                }
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
        // Without `parse_timed`, `%` is literal.
        assert_eq!(Template::parse("a%Yb").unwrap().render(&e), "a%Yb");
    }

    #[test]
    fn time_directives_render_from_the_time_given() {
        let t = Template::parse_timed("logs-{{service}}-%Y.%m.%d-%H%%").unwrap();
        assert!(t.is_timed() && !t.is_static());
        let e = event(json!({"service": "api"}));
        let at = DateTime::parse_from_rfc3339("2026-02-03T04:05:06Z")
            .unwrap()
            .to_utc();
        assert_eq!(t.render_at(&e, || at), "logs-api-2026.02.03-04%");
        let err = Template::parse_timed("logs-%Q").unwrap_err();
        assert!(err.contains("`%Q`") && err.contains("%Y"), "{err}");
        assert!(
            Template::parse_timed("logs-%")
                .unwrap_err()
                .contains("at the end")
        );
        // A template without directives never asks for the time.
        let plain = Template::parse_timed("logs-{{service}}").unwrap();
        assert!(!plain.is_timed());
        assert_eq!(plain.render_at(&e, || panic!("not asked")), "logs-api");
    }
}
