//! Evaluation over an event's fields: borrowed values all the way from
//! ordinary fields, a new string only for `lower` and `upper`. Through
//! [`FieldSource`] a condition reads an event's lazy fields one top-level
//! entry at a time, so routing and filtering never build the whole map.

use std::borrow::Cow;

use logbus_event::{Event, FieldPath, Fields};
use serde_json::Value;

/// What a condition reads fields from: ordinary fields, or an event
/// (lazy fields parse only the entries a path names).
pub trait FieldSource {
    fn field(&self, path: &FieldPath) -> Option<Cow<'_, Value>>;
}

impl FieldSource for Fields {
    fn field(&self, path: &FieldPath) -> Option<Cow<'_, Value>> {
        path.get(self).map(Cow::Borrowed)
    }
}

impl FieldSource for Event {
    fn field(&self, path: &FieldPath) -> Option<Cow<'_, Value>> {
        Event::field(self, path)
    }
}

use crate::ast::{CmpOp, Expr, Func};

/// Numbers by value (`1 == 1.0`), everything else structurally.
pub fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// The value of an operand; `None` when it is missing.
fn value<'a, S: FieldSource + ?Sized>(expr: &'a Expr, fields: &'a S) -> Option<Cow<'a, Value>> {
    match expr {
        Expr::Path(p) => fields.field(p),
        Expr::Lit(v) => Some(Cow::Borrowed(v)),
        Expr::Call(Func::Lower, args) => match value(&args[0], fields)?.as_ref() {
            Value::String(s) => Some(Cow::Owned(Value::String(s.to_lowercase()))),
            _ => None,
        },
        Expr::Call(Func::Upper, args) => match value(&args[0], fields)?.as_ref() {
            Value::String(s) => Some(Cow::Owned(Value::String(s.to_uppercase()))),
            _ => None,
        },
        Expr::Call(Func::Len, args) => {
            let n = match value(&args[0], fields)?.as_ref() {
                Value::String(s) => s.chars().count(),
                Value::Array(a) => a.len(),
                Value::Object(o) => o.len(),
                _ => return None,
            };
            Some(Cow::Owned(Value::from(n)))
        }
        other => Some(Cow::Owned(Value::Bool(holds(other, fields)))),
    }
}

fn text<'a>(v: &'a Option<Cow<'a, Value>>) -> Option<&'a str> {
    v.as_deref().and_then(Value::as_str)
}

pub fn holds<S: FieldSource + ?Sized>(expr: &Expr, fields: &S) -> bool {
    match expr {
        Expr::Or(terms) => terms.iter().any(|t| holds(t, fields)),
        Expr::And(terms) => terms.iter().all(|t| holds(t, fields)),
        Expr::Not(a) => !holds(a, fields),
        Expr::Cmp(a, op, b) => {
            let (a, b) = (value(a, fields), value(b, fields));
            match op {
                CmpOp::Eq => matches!((&a, &b), (Some(a), Some(b)) if same(a, b)),
                CmpOp::Ne => !matches!((&a, &b), (Some(a), Some(b)) if same(a, b)),
                _ => {
                    let order = match (a.as_deref(), b.as_deref()) {
                        (Some(Value::Number(x)), Some(Value::Number(y))) => x
                            .as_f64()
                            .and_then(|x| y.as_f64().and_then(|y| x.partial_cmp(&y))),
                        (Some(Value::String(x)), Some(Value::String(y))) => Some(x.cmp(y)),
                        _ => None,
                    };
                    order.is_some_and(|o| match op {
                        CmpOp::Lt => o.is_lt(),
                        CmpOp::Le => o.is_le(),
                        CmpOp::Gt => o.is_gt(),
                        _ => o.is_ge(),
                    })
                }
            }
        }
        Expr::In(a, list) => value(a, fields).is_some_and(|v| list.iter().any(|x| same(&v, x))),
        Expr::Match {
            value: v,
            regex,
            negated,
        } => {
            let v = value(v, fields);
            text(&v).is_some_and(|s| regex.is_match(s)) != *negated
        }
        Expr::Call(Func::Exists, args) => match &args[0] {
            Expr::Path(p) => fields.field(p).is_some(),
            _ => false,
        },
        Expr::Call(func @ (Func::StartsWith | Func::EndsWith | Func::Contains), args) => {
            let (a, b) = (value(&args[0], fields), value(&args[1], fields));
            match (func, a.as_deref(), b.as_deref()) {
                (Func::StartsWith, Some(Value::String(a)), Some(Value::String(b))) => {
                    a.starts_with(b.as_str())
                }
                (Func::EndsWith, Some(Value::String(a)), Some(Value::String(b))) => {
                    a.ends_with(b.as_str())
                }
                (Func::Contains, Some(Value::String(a)), Some(Value::String(b))) => {
                    a.contains(b.as_str())
                }
                (Func::Contains, Some(Value::Array(items)), Some(b)) => {
                    items.iter().any(|i| same(i, b))
                }
                _ => false,
            }
        }
        // A field (or `lower(..)` of one) as a condition: holds when true.
        other => matches!(value(other, fields).as_deref(), Some(Value::Bool(true))),
    }
}
