//! `transform: filter`: keeps the events whose field matches one condition
//! and discards the rest (counted as discarded, never as lost). For "and",
//! chain filters; for "or" on one field, use `in` or `matches`.

use logbus_plugin_api::{
    BuildContext, Built, CheckOptions, Event, EventError, FieldPath, OptionError, Processor,
    StageKind, TypedPlugin, Verdict,
};
use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

use crate::{field_path, needs_fields};

/// Options of `transform: filter`. Give `field` and exactly one operator.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FilterOptions {
    /// Field to test (dotted path for nested fields).
    pub field: String,
    /// Keep when the field equals this value (numbers compare by value: 1 == 1.0; `null` matches a null field).
    #[serde(default, deserialize_with = "present")]
    pub equals: Option<Value>,
    /// Keep when the field is missing or differs from this value.
    #[serde(default, deserialize_with = "present")]
    pub not_equals: Option<Value>,
    /// Keep when the field equals one of these values.
    #[serde(default, rename = "in")]
    #[schemars(length(min = 1))]
    pub one_of: Option<Vec<Value>>,
    /// Keep when the string field contains this text, or the array field contains this string.
    #[serde(default)]
    pub contains: Option<String>,
    /// Keep when the string field matches this regular expression.
    #[serde(default)]
    pub matches: Option<String>,
    /// Keep when the field exists (true) or is missing (false).
    #[serde(default)]
    pub exists: Option<bool>,
    /// Keep when the numeric field is greater than this.
    #[serde(default)]
    pub gt: Option<f64>,
    /// Keep when the numeric field is greater than or equal to this.
    #[serde(default)]
    pub gte: Option<f64>,
    /// Keep when the numeric field is less than this.
    #[serde(default)]
    pub lt: Option<f64>,
    /// Keep when the numeric field is less than or equal to this.
    #[serde(default)]
    pub lte: Option<f64>,
    /// Keep the events that do *not* match.
    #[serde(default)]
    pub invert: bool,
}

/// An option that is present is `Some`, even when its value is `null`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

#[derive(Debug)]
enum Op {
    Equals(Value),
    NotEquals(Value),
    In(Vec<Value>),
    Contains(String),
    Matches(Regex),
    Exists(bool),
    Gt(f64),
    Gte(f64),
    Lt(f64),
    Lte(f64),
}

impl FilterOptions {
    fn op(&self) -> Result<Op, OptionError> {
        let mut ops: Vec<(&str, Op)> = Vec::new();
        if let Some(v) = &self.equals {
            ops.push(("equals", Op::Equals(v.clone())));
        }
        if let Some(v) = &self.not_equals {
            ops.push(("not_equals", Op::NotEquals(v.clone())));
        }
        if let Some(v) = &self.one_of {
            ops.push(("in", Op::In(v.clone())));
        }
        if let Some(v) = &self.contains {
            ops.push(("contains", Op::Contains(v.clone())));
        }
        if let Some(v) = &self.matches {
            let re = Regex::new(v).map_err(|e| {
                OptionError::at(&["matches"], format!("invalid regular expression: {e}"))
            })?;
            ops.push(("matches", Op::Matches(re)));
        }
        if let Some(v) = self.exists {
            ops.push(("exists", Op::Exists(v)));
        }
        for (name, v, make) in [
            ("gt", self.gt, Op::Gt as fn(f64) -> Op),
            ("gte", self.gte, Op::Gte),
            ("lt", self.lt, Op::Lt),
            ("lte", self.lte, Op::Lte),
        ] {
            if let Some(v) = v {
                ops.push((name, make(v)));
            }
        }
        match ops.len() {
            1 => Ok(ops.pop().expect("one op").1),
            0 => Err(OptionError::at(
                &[],
                "give one operator: equals, not_equals, in, contains, matches, exists, gt, gte, lt or lte",
            )),
            _ => {
                let names: Vec<&str> = ops.iter().map(|(n, _)| *n).collect();
                Err(OptionError::at(
                    &[names[1]],
                    format!(
                        "one operator per filter, found {}; chain filters to combine conditions",
                        names.join(", ")
                    ),
                ))
            }
        }
    }
}

impl CheckOptions for FilterOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors: Vec<OptionError> = field_path(&self.field, &["field"])
            .err()
            .into_iter()
            .collect();
        if self.one_of.as_ref().is_some_and(Vec::is_empty) {
            errors.push(OptionError::at(
                &["in"],
                "the list is empty, so nothing would ever match",
            ));
        }
        errors.extend(self.op().err());
        errors
    }
}

pub struct FilterTransform;

impl TypedPlugin for FilterTransform {
    type Options = FilterOptions;
    const NAME: &'static str = "filter";
    const KIND: StageKind = StageKind::Transform;
    const DESCRIPTION: &'static str = "Keeps events whose field matches a condition (equals, not_equals, in, contains, matches, exists, gt, gte, lt, lte); discards the rest.";

    fn build(&self, options: FilterOptions, _cx: &BuildContext) -> Result<Built, OptionError> {
        Ok(Built::Processor(Box::new(Filter {
            field: field_path(&options.field, &["field"])?,
            op: options.op()?,
            invert: options.invert,
        })))
    }
}

struct Filter {
    field: FieldPath,
    op: Op,
    invert: bool,
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn matches(op: &Op, value: Option<&Value>) -> bool {
    match (op, value) {
        (Op::Exists(want), v) => v.is_some() == *want,
        (Op::NotEquals(x), v) => !v.is_some_and(|v| same(v, x)),
        (_, None) => false,
        (Op::Equals(x), Some(v)) => same(v, x),
        (Op::In(xs), Some(v)) => xs.iter().any(|x| same(v, x)),
        (Op::Contains(s), Some(Value::String(v))) => v.contains(s.as_str()),
        (Op::Contains(s), Some(Value::Array(items))) => items.iter().any(|i| i.as_str() == Some(s)),
        (Op::Matches(re), Some(Value::String(v))) => re.is_match(v),
        (Op::Gt(x), Some(v)) => v.as_f64().is_some_and(|v| v > *x),
        (Op::Gte(x), Some(v)) => v.as_f64().is_some_and(|v| v >= *x),
        (Op::Lt(x), Some(v)) => v.as_f64().is_some_and(|v| v < *x),
        (Op::Lte(x), Some(v)) => v.as_f64().is_some_and(|v| v <= *x),
        _ => false,
    }
}

impl Processor for Filter {
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        let fields = event.as_fields().ok_or_else(|| needs_fields("filter"))?;
        let keep = matches(&self.op, self.field.get(fields)) != self.invert;
        Ok(if keep {
            Verdict::Keep
        } else {
            Verdict::Discard
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn opts(v: Value) -> FilterOptions {
        serde_json::from_value(v).unwrap()
    }

    fn keeps(o: Value, event: Value) -> bool {
        let o = opts(o);
        let mut f = Filter {
            field: FieldPath::parse(&o.field).unwrap(),
            op: o.op().unwrap(),
            invert: o.invert,
        };
        let mut e = Event::fields(
            serde_json::from_value(event).unwrap(),
            logbus_plugin_api::Meta {
                source: "s".into(),
                ingest_ns: 0,
                origin: None,
                attributes: None,
            },
        );
        matches!(f.process(&mut e).unwrap(), Verdict::Keep)
    }

    #[test]
    fn operators() {
        assert!(keeps(
            json!({"field": "l", "equals": "error"}),
            json!({"l": "error"})
        ));
        assert!(!keeps(
            json!({"field": "l", "equals": "error"}),
            json!({"l": "info"})
        ));
        assert!(keeps(json!({"field": "n", "equals": 1}), json!({"n": 1.0})));
        assert!(keeps(json!({"field": "l", "not_equals": "x"}), json!({})));
        assert!(keeps(
            json!({"field": "l", "in": ["a", "b"]}),
            json!({"l": "b"})
        ));
        assert!(keeps(
            json!({"field": "m", "contains": "ell"}),
            json!({"m": "hello"})
        ));
        assert!(keeps(
            json!({"field": "t", "contains": "x"}),
            json!({"t": ["x", "y"]})
        ));
        assert!(keeps(
            json!({"field": "m", "matches": "^h.*o$"}),
            json!({"m": "hello"})
        ));
        assert!(!keeps(
            json!({"field": "m", "matches": "^h"}),
            json!({"m": 5})
        ));
        assert!(keeps(
            json!({"field": "a.b", "exists": true}),
            json!({"a": {"b": null}})
        ));
        assert!(keeps(json!({"field": "a", "exists": false}), json!({})));
        assert!(keeps(json!({"field": "s", "gte": 500}), json!({"s": 503})));
        assert!(!keeps(
            json!({"field": "s", "lt": 500}),
            json!({"s": "400"})
        ));
        assert!(keeps(
            json!({"field": "l", "equals": "debug", "invert": true}),
            json!({"l": "info"})
        ));
    }

    #[test]
    fn option_errors() {
        assert!(opts(json!({"field": "a"})).op().is_err());
        let two = opts(json!({"field": "a", "equals": 1, "gt": 2}))
            .op()
            .unwrap_err();
        assert_eq!(two.path, ["gt"]);
        let bad = opts(json!({"field": "a", "matches": "("}))
            .op()
            .unwrap_err();
        assert_eq!(bad.path, ["matches"]);
        assert!(
            !opts(json!({"field": "a..b", "exists": true}))
                .check()
                .is_empty()
        );
    }
}
