//! Compares what a test collected with what it expects, and says how they
//! differ in a way a person can act on: the expected and actual events side
//! by side, with a line diff.

use logbus_plugin_api::{Event, FieldPath, Payload};
use regex::Regex;
use serde_json::Value;
use similar::TextDiff;

use crate::spec::{Condition, Expect};

/// An event as a test sees it: parsed fields as a map, raw bytes as a string.
pub fn as_value(event: &Event) -> Value {
    match event.payload() {
        Payload::Raw(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        parsed => Value::Object(parsed.as_fields().cloned().unwrap_or_default()),
    }
}

/// Equality where `1` and `1.0` are the same number (YAML and JSON disagree
/// on how to write them; a test should not care).
pub fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).expect("values serialise")
}

pub fn expectations(expect: &Expect, events: &[Event]) -> Result<(), String> {
    let actual: Vec<Value> = events.iter().map(as_value).collect();
    if expect.none && !actual.is_empty() {
        return Err(format!(
            "expected no output, got {} event(s); first:\n{}",
            actual.len(),
            pretty(&actual[0])
        ));
    }
    if let Some(n) = expect.count.filter(|n| *n != actual.len()) {
        return Err(format!("expected {n} event(s), got {}", actual.len()));
    }
    if let Some(expected) = &expect.events {
        let equal =
            expected.len() == actual.len() && expected.iter().zip(&actual).all(|(e, a)| same(e, a));
        if !equal {
            let e = pretty(&Value::Array(expected.clone()));
            let a = pretty(&Value::Array(actual.clone()));
            let diff = TextDiff::from_lines(&e, &a)
                .unified_diff()
                .header("expected", "actual")
                .to_string();
            return Err(format!(
                "events differ ({} expected, {} actual)\n--- expected\n{e}\n--- actual\n{a}\n--- diff\n{diff}",
                expected.len(),
                actual.len()
            ));
        }
    }
    for condition in &expect.all {
        let test = compile(condition)?;
        for (i, event) in actual.iter().enumerate() {
            if !test.holds(event) {
                return Err(format!(
                    "event {i} fails `{}`:\n{}",
                    test.describe(),
                    pretty(event)
                ));
            }
        }
    }
    Ok(())
}

struct Compiled<'a> {
    condition: &'a Condition,
    path: FieldPath,
    regex: Option<Regex>,
}

fn compile(c: &Condition) -> Result<Compiled<'_>, String> {
    let ops = [
        c.equals.is_some(),
        c.exists.is_some(),
        c.matches.is_some(),
        c.contains.is_some(),
    ]
    .iter()
    .filter(|x| **x)
    .count();
    if ops != 1 {
        return Err(format!(
            "condition on `{}` needs exactly one of equals, exists, matches, contains",
            c.field
        ));
    }
    let path = FieldPath::parse(&c.field).map_err(|e| format!("condition: {e}"))?;
    let regex = match &c.matches {
        Some(r) => Some(Regex::new(r).map_err(|e| {
            format!(
                "condition on `{}`: invalid regular expression: {e}",
                c.field
            )
        })?),
        None => None,
    };
    Ok(Compiled {
        condition: c,
        path,
        regex,
    })
}

impl Compiled<'_> {
    fn holds(&self, event: &Value) -> bool {
        let value = event.as_object().and_then(|f| self.path.get(f));
        let c = self.condition;
        if let Some(want) = c.exists {
            return value.is_some() == want;
        }
        let Some(value) = value else { return false };
        if let Some(x) = &c.equals {
            return same(value, x);
        }
        if let Some(re) = &self.regex {
            return value.as_str().is_some_and(|s| re.is_match(s));
        }
        if let Some(s) = &c.contains {
            return match value {
                Value::String(v) => v.contains(s.as_str()),
                Value::Array(items) => items.iter().any(|i| i.as_str() == Some(s)),
                _ => false,
            };
        }
        false
    }

    fn describe(&self) -> String {
        let c = self.condition;
        let op = if let Some(x) = &c.equals {
            format!("equals {x}")
        } else if let Some(x) = c.exists {
            format!("exists: {x}")
        } else if let Some(x) = &c.matches {
            format!("matches {x:?}")
        } else {
            format!("contains {:?}", c.contains.as_deref().unwrap_or(""))
        };
        format!("{} {op}", c.field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::Meta;
    use serde_json::json;

    fn ev(v: Value) -> Event {
        Event::fields(serde_json::from_value(v).unwrap(), Meta::at("t", 0))
    }

    fn expect(v: Value) -> Expect {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn equality_ignores_number_spelling_but_not_order_of_events() {
        let events = [ev(json!({"a": 1.0})), ev(json!({"a": 2}))];
        assert!(expectations(&expect(json!({"events": [{"a": 1}, {"a": 2}]})), &events).is_ok());
        let err =
            expectations(&expect(json!({"events": [{"a": 2}, {"a": 1}]})), &events).unwrap_err();
        assert!(err.contains("--- diff"), "{err}");
        assert!(err.contains("-    \"a\": 2"), "{err}");
    }

    #[test]
    fn count_none_and_conditions() {
        let events = [ev(json!({"level": "error", "msg": "db down"}))];
        assert!(expectations(&expect(json!({"count": 1})), &events).is_ok());
        assert!(
            expectations(&expect(json!({"count": 2})), &events)
                .unwrap_err()
                .contains("expected 2 event(s), got 1")
        );
        assert!(expectations(&expect(json!({"none": true})), &events).is_err());
        assert!(expectations(&expect(json!({"none": true})), &[]).is_ok());
        let ok = expect(
            json!({"all": [{"field": "level", "equals": "error"}, {"field": "msg", "matches": "^db"}, {"field": "x", "exists": false}]}),
        );
        assert!(expectations(&ok, &events).is_ok());
        let bad = expect(json!({"all": [{"field": "msg", "contains": "up"}]}));
        assert!(
            expectations(&bad, &events)
                .unwrap_err()
                .contains("event 0 fails `msg contains \"up\"`")
        );
        let two_ops = expect(json!({"all": [{"field": "msg", "contains": "up", "exists": true}]}));
        assert!(
            expectations(&two_ops, &events)
                .unwrap_err()
                .contains("exactly one")
        );
    }

    #[test]
    fn arrays_compare_item_by_item_with_numbers_by_value() {
        assert!(same(&json!([1, [2.0]]), &json!([1.0, [2]])));
        assert!(!same(&json!([1, 2]), &json!([1])));
        assert!(!same(&json!([1, 2]), &json!([2, 1])));
        assert!(!same(&json!({"a": [1]}), &json!({"a": [1], "b": 2})));
    }

    #[test]
    fn contains_looks_inside_a_string_or_among_an_arrays_strings() {
        let events = [ev(
            json!({"msg": "db down", "tags": ["db", "prod"], "n": 5}),
        )];
        for (field, text, holds) in [
            ("msg", "down", true),
            ("msg", "up", false),
            ("tags", "prod", true),
            ("tags", "pro", false),
            ("n", "5", false),
        ] {
            let e = expect(json!({"all": [{"field": field, "contains": text}]}));
            assert_eq!(
                expectations(&e, &events).is_ok(),
                holds,
                "{field} contains {text}"
            );
        }
    }

    #[test]
    fn raw_events_compare_as_strings() {
        let raw = Event::raw("plain line", Meta::at("t", 0));
        assert!(expectations(&expect(json!({"events": ["plain line"]})), &[raw]).is_ok());
    }
}
