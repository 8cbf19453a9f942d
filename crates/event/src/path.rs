//! Field paths are split once, when a plugin is built, so the hot path
//! walks segments instead of parsing strings.

use serde_json::Value;

use crate::Fields;

/// A dotted field path (`http.status`), split once when a plugin is built so
/// the hot path does no string parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    segments: Vec<String>,
    text: String,
}

impl FieldPath {
    /// Parses `a.b.c`. Empty segments (`a..b`, leading or trailing dots) are rejected.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("field path is empty".into());
        }
        let segments: Vec<String> = text.split('.').map(str::to_owned).collect();
        if segments.iter().any(String::is_empty) {
            return Err(format!("field path `{text}` has an empty segment"));
        }
        Ok(FieldPath {
            segments,
            text: text.to_owned(),
        })
    }

    /// A path from its segments, which may hold dots (`resource` then
    /// `service.name`, as OpenTelemetry names attributes). Its text is
    /// the segments joined by dots, so it reads ambiguously; conditions
    /// print such a segment quoted.
    pub fn from_segments(segments: Vec<String>) -> Result<Self, String> {
        if segments.is_empty() {
            return Err("field path is empty".into());
        }
        if segments.iter().any(String::is_empty) {
            return Err("a field path segment is empty".into());
        }
        Ok(FieldPath {
            text: segments.join("."),
            segments,
        })
    }

    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn get<'a>(&self, fields: &'a Fields) -> Option<&'a Value> {
        let (last, parents) = self.segments.split_last()?;
        let mut map = fields;
        for seg in parents {
            map = map.get(seg)?.as_object()?;
        }
        map.get(last)
    }

    /// Sets the value, creating intermediate objects. An intermediate that
    /// exists but is not an object is replaced by an object.
    pub fn set(&self, fields: &mut Fields, value: Value) {
        let (last, parents) = self.segments.split_last().expect("path is never empty");
        let mut map = fields;
        for seg in parents {
            let slot = map
                .entry(seg.clone())
                .or_insert_with(|| Value::Object(Fields::new()));
            if !slot.is_object() {
                *slot = Value::Object(Fields::new());
            }
            map = slot.as_object_mut().expect("just made an object");
        }
        map.insert(last.clone(), value);
    }

    /// Removes and returns the value, keeping the order of the other fields.
    pub fn remove(&self, fields: &mut Fields) -> Option<Value> {
        let (last, parents) = self.segments.split_last()?;
        let mut map = fields;
        for seg in parents {
            map = map.get_mut(seg)?.as_object_mut()?;
        }
        map.shift_remove(last)
    }
}

impl std::fmt::Display for FieldPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_get_set_remove_nested() {
        let p = FieldPath::parse("a.b.c").unwrap();
        let mut f = Fields::new();
        p.set(&mut f, json!(3));
        assert_eq!(p.get(&f), Some(&json!(3)));
        assert_eq!(Value::Object(f.clone()), json!({"a": {"b": {"c": 3}}}));
        assert_eq!(p.remove(&mut f), Some(json!(3)));
        assert_eq!(p.get(&f), None);
    }

    #[test]
    fn set_through_a_scalar_replaces_it() {
        let p = FieldPath::parse("a.b").unwrap();
        let mut f = serde_json::from_value::<Fields>(json!({"a": 1})).unwrap();
        p.set(&mut f, json!(true));
        assert_eq!(Value::Object(f), json!({"a": {"b": true}}));
    }

    #[test]
    fn a_segment_may_hold_dots() {
        let p = FieldPath::from_segments(vec!["resource".into(), "service.name".into()]).unwrap();
        let f =
            serde_json::from_value::<Fields>(json!({"resource": {"service.name": "api"}})).unwrap();
        assert_eq!(p.get(&f), Some(&json!("api")));
        assert_eq!(p.segments().len(), 2);
        // Printed as written in a config: segments joined by dots.
        assert_eq!(p.as_str(), "resource.service.name");
        assert_eq!(p.to_string(), "resource.service.name");
        assert_eq!(FieldPath::parse("a.b").unwrap().to_string(), "a.b");
        assert!(FieldPath::from_segments(vec![]).is_err());
        assert!(FieldPath::from_segments(vec!["".into()]).is_err());
    }

    #[test]
    fn bad_paths_are_rejected() {
        assert!(FieldPath::parse("").is_err());
        assert!(FieldPath::parse("a..b").is_err());
        assert!(FieldPath::parse(".a").is_err());
    }
}
