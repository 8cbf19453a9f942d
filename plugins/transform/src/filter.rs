//! `transform: filter`: keeps the events that match and discards the rest
//! (counted as discarded, never as lost). Two ways to say what matches:
//! `condition:` in the condition language (`logbus-condition`: `&&`,
//! `||`, grouping, regexes, helpers), or the older one-field form
//! (`field:` and one operator), which stays because pipelines use it.

use logbus_condition::Condition;
use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, EventError, FieldPath, FieldRead, FieldType, Flow, Needs,
    OptionError, Processor, ReadRole, StageKind, TypedPlugin, Verdict,
};
use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

use crate::{condition_reads, field_path, needs_fields, type_of};

/// Options of `transform: filter`. Give `condition`, or `field` and
/// exactly one operator.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FilterOptions {
    /// Keep the events for which this holds, e.g.
    /// `level != "debug" && (service == "auth" || status >= 500)`
    /// (docs/conditions.md).
    #[serde(default)]
    pub condition: Option<String>,
    /// Field to test (dotted path for nested fields).
    #[serde(default)]
    pub field: Option<String>,
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
    fn has_operator(&self) -> bool {
        self.equals.is_some()
            || self.not_equals.is_some()
            || self.one_of.is_some()
            || self.contains.is_some()
            || self.matches.is_some()
            || self.exists.is_some()
            || [self.gt, self.gte, self.lt, self.lte]
                .iter()
                .any(Option::is_some)
    }

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

/// A condition's error, at its place inside the text.
fn compiled(text: &str) -> Result<Condition, OptionError> {
    compiled_at(text, &["condition"])
}

/// The condition at option `path`; its error points inside the text.
pub(crate) fn compiled_at(text: &str, path: &[&str]) -> Result<Condition, OptionError> {
    Condition::compile(text).map_err(|e| {
        let (line, column) = e.line_column(text);
        let place = if text.contains('\n') {
            format!("line {line}, column {column}")
        } else {
            format!("column {column}")
        };
        OptionError::inside(
            path,
            e.offset,
            format!(
                "{} (at {place} of the condition)\n{}",
                e.message,
                indent(&e.caret(text))
            ),
        )
    })
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl CheckOptions for FilterOptions {
    fn check(&self) -> Vec<OptionError> {
        if let Some(text) = &self.condition {
            let mut errors: Vec<OptionError> = compiled(text).err().into_iter().collect();
            if self.field.is_some() || self.has_operator() {
                errors.push(OptionError::at(
                    &["condition"],
                    "give `condition` or `field` with an operator, not both",
                ));
            }
            return errors;
        }
        let Some(field) = &self.field else {
            return vec![OptionError::at(
                &[],
                "give `condition` (e.g. `condition: level != \"debug\"`), or `field` and one operator",
            )];
        };
        let mut errors: Vec<OptionError> =
            field_path(field, &["field"]).err().into_iter().collect();
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

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str = "Keeps events that match a condition (`condition: level != \"debug\" && status >= 500`, or one field with equals, not_equals, in, contains, matches, exists, gt, gte, lt, lte); discards the rest.";

    fn build(
        &self,
        options: FilterOptions,
        _cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let test = match (&options.condition, &options.field) {
            (Some(text), _) => Test::Condition(compiled(text)?),
            (None, Some(field)) => Test::Field(field_path(field, &["field"])?, options.op()?),
            (None, None) => return Err(OptionError::at(&[], "give `condition` or `field`")),
        };
        Ok(Box::new(Filter {
            test,
            invert: options.invert,
        }))
    }

    fn flow(&self, o: &FilterOptions) -> Flow {
        let flow = Flow::pass().needs(Needs::Fields);
        if let Some(text) = &o.condition {
            let Ok(condition) = Condition::compile(text) else {
                return flow;
            };
            return condition_reads(&condition, &["condition"])
                .into_iter()
                .fold(flow, Flow::read);
        }
        let Some(field) = &o.field else {
            return flow;
        };
        let read = FieldRead::new(field.clone(), &["field"], ReadRole::Optional);
        let uniform = |values: &[Value]| {
            let first = values.first().map(type_of)?;
            values.iter().all(|v| type_of(v) == first).then_some(first)
        };
        let expects = if o.exists.is_some() {
            return flow.read(FieldRead::new(field.clone(), &["field"], ReadRole::Probe));
        } else if o.gt.or(o.gte).or(o.lt).or(o.lte).is_some() {
            Some(FieldType::Number)
        } else if o.matches.is_some() {
            Some(FieldType::String)
        } else if let Some(v) = o.equals.as_ref().or(o.not_equals.as_ref()) {
            Some(type_of(v))
        } else if let Some(values) = &o.one_of {
            uniform(values)
        } else {
            None
        };
        match expects {
            Some(t) if t != FieldType::Any => flow.read(read.expecting(t)),
            _ => flow.read(read),
        }
    }
}

enum Test {
    Condition(Condition),
    Field(FieldPath, Op),
}

struct Filter {
    test: Test,
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
        // Every other operator needs a value: a missing field falls to `_`.
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
        if !event.is_parsed() {
            return Err(needs_fields("filter"));
        }
        // Read through the event: lazy fields parse only what is named.
        let matched = match &self.test {
            Test::Condition(c) => c.matches(&*event),
            Test::Field(field, op) => matches(op, event.field(field).as_deref()),
        };
        let keep = matched != self.invert;
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
        let test = match &o.condition {
            Some(c) => Test::Condition(Condition::compile(c).unwrap()),
            None => Test::Field(
                FieldPath::parse(o.field.as_deref().unwrap()).unwrap(),
                o.op().unwrap(),
            ),
        };
        let mut f = Filter {
            test,
            invert: o.invert,
        };
        let mut e = Event::fields(
            serde_json::from_value(event).unwrap(),
            logbus_plugin_api::Meta::at("s", 0),
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
    fn every_comparison_at_its_boundary() {
        for (op, at, below, above) in [
            ("gt", false, false, true),
            ("gte", true, false, true),
            ("lt", false, true, false),
            ("lte", true, true, false),
        ] {
            let o = |v: f64| json!({"field": "s", op: 500, "_v": v});
            for (v, want) in [(500.0, at), (499.5, below), (500.5, above)] {
                let mut opt = o(v);
                opt.as_object_mut().unwrap().remove("_v");
                assert_eq!(keeps(opt, json!({"s": v})), want, "{op} on {v}");
            }
            // Not a number: never kept.
            assert!(
                !keeps(json!({"field": "s", op: 500}), json!({"s": "500"})),
                "{op}"
            );
            assert!(!keeps(json!({"field": "s", op: 500}), json!({})), "{op}");
        }
        assert!(!keeps(
            json!({"field": "t", "contains": "z"}),
            json!({"t": ["x", "y"]})
        ));
        assert!(!keeps(
            json!({"field": "t", "contains": "z"}),
            json!({"t": 5})
        ));
    }

    #[test]
    fn a_condition_selects_across_fields() {
        let c = json!({"condition": r#"level != "debug" && (service in ["auth", "billing"] && status >= 500 || exists(panic))"#});
        assert!(keeps(
            c.clone(),
            json!({"level": "info", "service": "auth", "status": 503})
        ));
        assert!(!keeps(
            c.clone(),
            json!({"level": "info", "service": "auth", "status": 404})
        ));
        assert!(!keeps(
            c.clone(),
            json!({"level": "debug", "service": "auth", "status": 503})
        ));
        assert!(keeps(c.clone(), json!({"level": "warn", "panic": true})));
        assert!(!keeps(
            c,
            json!({"level": "info", "service": "web", "status": 503})
        ));
        assert!(keeps(
            json!({"condition": "level == \"debug\"", "invert": true}),
            json!({"level": "info"})
        ));
    }

    #[test]
    fn condition_errors_point_inside_the_condition() {
        let e = opts(json!({"condition": "level == && ok"})).check();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].path, ["condition"]);
        assert_eq!(e[0].offset, Some(9));
        assert_eq!(
            e[0].message,
            "expected a field, a value, a function or `(`, found `&&` (at column 10 of the condition)\n    level == && ok\n             ^"
        );
        let both = opts(json!({"condition": "ok", "field": "a", "equals": 1})).check();
        assert_eq!(
            both[0].message,
            "give `condition` or `field` with an operator, not both"
        );
        // Any one operator beside a condition, without `field`, is refused too.
        for (op, value) in [
            ("equals", json!(1)),
            ("not_equals", json!(1)),
            ("in", json!([1])),
            ("contains", json!("x")),
            ("matches", json!("x")),
            ("exists", json!(true)),
            ("gt", json!(1)),
            ("gte", json!(1)),
            ("lt", json!(1)),
            ("lte", json!(1)),
        ] {
            let op_only = opts(json!({"condition": "ok", op: value})).check();
            assert_eq!(op_only.len(), 1, "{op}: {op_only:?}");
            assert_eq!(
                op_only[0].message, "give `condition` or `field` with an operator, not both",
                "{op}"
            );
        }
        let none = opts(json!({})).check();
        assert!(
            none[0].message.starts_with("give `condition`"),
            "{:?}",
            none[0]
        );
        assert!(opts(json!({"condition": "ok"})).check().is_empty());
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
        assert_eq!(
            opts(json!({"field": "a..b", "exists": true})).check()[0].message,
            "field path `a..b` has an empty segment"
        );
    }

    /// Each form of filter states the field it reads, its role and the
    /// type it compares with.
    #[test]
    fn the_flow_names_what_each_form_reads() {
        use logbus_plugin_api::{FieldRead, FieldType, Needs, ReadRole, Step};
        let flow = |v: serde_json::Value| {
            let o: FilterOptions = serde_json::from_value(v).unwrap();
            let f = FilterTransform.flow(&o);
            assert_eq!(f.needs, Needs::Fields);
            f.steps
        };
        let read = |role, ty: Option<FieldType>| {
            let r = FieldRead::new("x", &["field"], role);
            Step::Read(match ty {
                Some(t) => r.expecting(t),
                None => r,
            })
        };
        use FieldType::*;
        use ReadRole::*;
        for (options, want) in [
            (
                serde_json::json!({"field": "x", "exists": true}),
                read(Probe, None),
            ),
            (
                serde_json::json!({"field": "x", "gt": 1}),
                read(Optional, Some(Number)),
            ),
            (
                serde_json::json!({"field": "x", "gte": 1}),
                read(Optional, Some(Number)),
            ),
            (
                serde_json::json!({"field": "x", "lt": 1}),
                read(Optional, Some(Number)),
            ),
            (
                serde_json::json!({"field": "x", "lte": 1}),
                read(Optional, Some(Number)),
            ),
            (
                serde_json::json!({"field": "x", "matches": "a"}),
                read(Optional, Some(String)),
            ),
            (
                serde_json::json!({"field": "x", "equals": "a"}),
                read(Optional, Some(String)),
            ),
            (
                serde_json::json!({"field": "x", "not_equals": 2}),
                read(Optional, Some(Number)),
            ),
            (
                serde_json::json!({"field": "x", "equals": null}),
                read(Optional, None),
            ),
            (
                serde_json::json!({"field": "x", "in": [1, 2]}),
                read(Optional, Some(Number)),
            ),
            (
                serde_json::json!({"field": "x", "in": [1, "a"]}),
                read(Optional, None),
            ),
            (
                serde_json::json!({"field": "x", "contains": "a"}),
                read(Optional, None),
            ),
        ] {
            assert_eq!(flow(options.clone()), [want], "{options}");
        }
        let steps = flow(serde_json::json!({"condition": "a == b && c > 1"}));
        let roles: Vec<(
            std::string::String,
            ReadRole,
            Option<FieldType>,
            Option<usize>,
        )> = steps
            .iter()
            .map(|s| match s {
                Step::Read(r) => (r.field.clone(), r.role, r.expects, r.offset),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            roles,
            [
                ("a".into(), Optional, None, Some(0)),
                ("b".into(), RightOperand, None, Some(5)),
                ("c".into(), Optional, Some(Number), Some(10)),
            ]
        );
        assert!(flow(serde_json::json!({"condition": "a =="})).is_empty());
    }
}
