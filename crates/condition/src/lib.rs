//! Conditions over an event's fields, such as
//! `level != "debug" && (service in ["auth", "billing"]) && status >= 500`.
//!
//! A stage that selects events (`filter`, `route`) would otherwise need
//! one stage per test, with no "or" across fields and no grouping, or a
//! JavaScript stage at half the speed. A condition is compiled once when
//! the stage is built: the text is parsed, its types checked (a string
//! where a condition belongs, `lower(3)`, a regex that does not compile
//! are errors with their offset in the text, so `logbus validate` can put
//! a caret under them), field paths split and regexes built; evaluation
//! then walks a small tree over the event's fields and allocates only
//! for `lower`/`upper`.
//!
//! The typing rules are `transform: filter`'s: numbers compare by value
//! (`1 == 1.0`), other values structurally; a missing field equals
//! nothing (so `x != 1` holds when `x` is missing); `<` and friends
//! compare two numbers, or two strings by their bytes, and are false for
//! anything else; a field used as a condition holds when it is `true`.

mod ast;
mod eval;
mod lex;
mod parse;

use std::fmt;

pub use ast::Expr;
pub use eval::FieldSource;

/// A compiled condition.
#[derive(Debug, Clone)]
pub struct Condition {
    expr: Expr,
    /// Byte offset of each field path, in the order they appear.
    paths: Vec<usize>,
}

/// How a condition uses a field, for `logbus validate`'s flow analysis.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldUse {
    /// The dotted path (`http.status`).
    pub path: String,
    /// Byte offset in the condition's text.
    pub offset: usize,
    pub role: UseRole,
    /// The kind of literal it is compared with (`status >= 500`: a number).
    pub compared_with: Option<LiteralKind>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UseRole {
    /// Read for its value.
    Value,
    /// Inside `exists(...)`.
    Probe,
    /// The right-hand side of a comparison whose left side is a field
    /// too (`level == error`).
    RightOperand,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiteralKind {
    String,
    Number,
    Bool,
    Null,
}

impl LiteralKind {
    fn of(value: &serde_json::Value) -> Option<LiteralKind> {
        Some(match value {
            serde_json::Value::String(_) => LiteralKind::String,
            serde_json::Value::Number(_) => LiteralKind::Number,
            serde_json::Value::Bool(_) => LiteralKind::Bool,
            serde_json::Value::Null => LiteralKind::Null,
            _ => return None,
        })
    }
}

impl Condition {
    /// Parses and type-checks `text`.
    pub fn compile(text: &str) -> Result<Condition, ConditionError> {
        parse::parse(text).map(|(expr, paths)| Condition { expr, paths })
    }

    /// Every field the condition reads, in the order they appear, with
    /// what it is compared with. Walks the tree without recursion.
    pub fn field_uses(&self) -> Vec<FieldUse> {
        // (node, role, literal compared with) in text order.
        let mut found = Vec::new();
        let mut stack: Vec<(&Expr, UseRole, Option<LiteralKind>)> =
            vec![(&self.expr, UseRole::Value, None)];
        while let Some((e, role, lit)) = stack.pop() {
            match e {
                Expr::Or(terms) | Expr::And(terms) => {
                    for term in terms.iter().rev() {
                        stack.push((term, UseRole::Value, None));
                    }
                }
                Expr::Not(a) => stack.push((a, UseRole::Value, None)),
                Expr::Cmp(a, _, b) => {
                    let (a_lit, b_lit) = match (&**a, &**b) {
                        (_, Expr::Lit(v)) => (LiteralKind::of(v), None),
                        (Expr::Lit(v), _) => (None, LiteralKind::of(v)),
                        _ => (None, None),
                    };
                    let b_role = match (&**a, &**b) {
                        (Expr::Path(_), Expr::Path(_)) => UseRole::RightOperand,
                        _ => UseRole::Value,
                    };
                    stack.push((b, b_role, b_lit));
                    stack.push((a, UseRole::Value, a_lit));
                }
                Expr::In(a, values) => {
                    let kinds: Vec<_> = values.iter().map(LiteralKind::of).collect();
                    let same = kinds
                        .first()
                        .copied()
                        .flatten()
                        .filter(|k| kinds.iter().all(|o| *o == Some(*k)));
                    stack.push((a, UseRole::Value, same));
                }
                Expr::Match { value, .. } => {
                    stack.push((value, UseRole::Value, Some(LiteralKind::String)))
                }
                Expr::Call(func, args) => {
                    let role = if *func == ast::Func::Exists {
                        UseRole::Probe
                    } else {
                        UseRole::Value
                    };
                    // starts_with & co. and lower/upper read strings; len
                    // and contains a string or a list.
                    let lit = match func {
                        ast::Func::Exists | ast::Func::Len | ast::Func::Contains => None,
                        _ => Some(LiteralKind::String),
                    };
                    for (i, arg) in args.iter().enumerate().rev() {
                        stack.push((arg, role, if i == 0 { lit } else { None }));
                    }
                }
                Expr::Path(p) => found.push((p.to_string(), role, lit)),
                Expr::Lit(_) => {}
            }
        }
        found
            .into_iter()
            .zip(self.paths.iter().copied())
            .map(|((path, role, compared_with), offset)| FieldUse {
                path,
                offset,
                role,
                compared_with,
            })
            .collect()
    }

    /// Whether the fields (ordinary ones, or an event's) satisfy the
    /// condition; a raw event has no fields, so every path is missing.
    pub fn matches<S: FieldSource + ?Sized>(&self, fields: &S) -> bool {
        eval::holds(&self.expr, fields)
    }

    pub fn expr(&self) -> &Expr {
        &self.expr
    }
}

/// The condition in canonical form: single spaces around operators,
/// parentheses only where precedence needs them, strings as JSON
/// strings. Compiling it again gives the same condition.
impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.expr.fmt(f)
    }
}

/// What is wrong with a condition, and where: `offset` is the byte offset
/// in its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionError {
    pub offset: usize,
    pub message: String,
}

impl ConditionError {
    pub(crate) fn at(offset: usize, message: impl Into<String>) -> ConditionError {
        ConditionError {
            offset,
            message: message.into(),
        }
    }

    /// The line of `text` the error is on, with a caret under the place:
    ///
    /// ```text
    /// level == && ok
    ///          ^
    /// ```
    pub fn caret(&self, text: &str) -> String {
        let offset = self.offset.min(text.len());
        let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
        let end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
        let column = text[start..offset].chars().count();
        format!("{}\n{}^", &text[start..end], " ".repeat(column))
    }

    /// 1-based line and column (in characters) of the error in `text`.
    pub fn line_column(&self, text: &str) -> (usize, usize) {
        let offset = self.offset.min(text.len());
        let before = &text[..offset];
        let line = before.matches('\n').count() + 1;
        let start = before.rfind('\n').map_or(0, |i| i + 1);
        (line, before[start..].chars().count() + 1)
    }
}

impl fmt::Display for ConditionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConditionError {}

#[cfg(test)]
mod tests;
