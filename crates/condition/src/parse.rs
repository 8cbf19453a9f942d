//! Recursive descent, lowest precedence first (`||`, `&&`, `!`, then a
//! comparison), checking types as it goes so that each error names the
//! place it was found.

use logbus_event::{FieldPath, closest};
use regex::Regex;
use serde_json::Value;

use crate::ConditionError;
use crate::ast::{CmpOp, Expr, Func};
use crate::lex::{Tok, lex};

/// What an expression can be known to be before any event is seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Bool,
    Str,
    Num,
    Null,
    /// A field (or what a function made of one): any value, or missing.
    Any,
}

impl Ty {
    fn of(v: &Value) -> Ty {
        match v {
            Value::Bool(_) => Ty::Bool,
            Value::String(_) => Ty::Str,
            Value::Number(_) => Ty::Num,
            Value::Null => Ty::Null,
            _ => Ty::Any,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Ty::Bool => "a boolean",
            Ty::Str => "a string",
            Ty::Num => "a number",
            Ty::Null => "null",
            Ty::Any => "a field",
        }
    }
}

/// Longest nesting of parentheses, `!` and calls: a hostile condition
/// cannot exhaust the stack while it is compiled or evaluated.
const MAX_DEPTH: usize = 64;

struct Parser {
    toks: Vec<(Tok, usize)>,
    at: usize,
    depth: usize,
    /// The offset of each field path, in the order they appear.
    paths: Vec<usize>,
}

/// The tree, and the byte offset of each field path in the order the
/// paths appear (a left-to-right walk of the tree meets them so).
pub fn parse(text: &str) -> Result<(Expr, Vec<usize>), ConditionError> {
    if text.trim().is_empty() {
        return Err(ConditionError::at(0, "the condition is empty"));
    }
    let mut p = Parser {
        toks: lex(text)?,
        at: 0,
        depth: 0,
        paths: Vec::new(),
    };
    let start = p.offset();
    let (expr, ty) = p.or()?;
    if p.peek() != &Tok::End {
        return Err(p.unexpected("`&&`, `||` or the end of the condition"));
    }
    p.want_condition(ty, start, "the condition")?;
    Ok((expr, p.paths))
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.at].0
    }

    fn peek2(&self) -> &Tok {
        self.toks.get(self.at + 1).map_or(&Tok::End, |(tok, _)| tok)
    }

    fn offset(&self) -> usize {
        self.toks[self.at].1
    }

    fn bump(&mut self) -> (Tok, usize) {
        let t = self.toks[self.at].clone();
        if self.at + 1 < self.toks.len() {
            self.at += 1;
        }
        t
    }

    fn unexpected(&self, wanted: &str) -> ConditionError {
        ConditionError::at(
            self.offset(),
            format!("expected {wanted}, found {}", self.peek().describe()),
        )
    }

    fn expect(&mut self, tok: Tok) -> Result<usize, ConditionError> {
        if *self.peek() == tok {
            Ok(self.bump().1)
        } else {
            Err(self.unexpected(&format!("`{}`", tok.symbol())))
        }
    }

    fn deeper(&mut self) -> Result<(), ConditionError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(ConditionError::at(
                self.offset(),
                format!("nested more than {MAX_DEPTH} deep"),
            ));
        }
        Ok(())
    }

    /// `&&`, `||` and `!` join conditions: a comparison, a function that
    /// answers yes or no, `true`/`false`, or a field (holds when `true`).
    fn want_condition(&self, ty: Ty, at: usize, role: &str) -> Result<(), ConditionError> {
        match ty {
            Ty::Bool | Ty::Any => Ok(()),
            other => Err(ConditionError::at(
                at,
                format!(
                    "{role} must be a condition (a comparison, `exists(..)`, a field that is true), not {}",
                    other.name()
                ),
            )),
        }
    }

    fn or(&mut self) -> Result<(Expr, Ty), ConditionError> {
        let start = self.offset();
        let (first, ty) = self.and()?;
        if *self.peek() != Tok::Or {
            return Ok((first, ty));
        }
        self.want_condition(ty, start, "the left side of `||`")?;
        let mut terms = vec![first];
        while *self.peek() == Tok::Or {
            self.bump();
            let at = self.offset();
            let (right, rty) = self.and()?;
            self.want_condition(rty, at, "the right side of `||`")?;
            terms.push(right);
        }
        Ok((Expr::Or(terms), Ty::Bool))
    }

    fn and(&mut self) -> Result<(Expr, Ty), ConditionError> {
        let start = self.offset();
        let (first, ty) = self.not()?;
        if *self.peek() != Tok::And {
            return Ok((first, ty));
        }
        self.want_condition(ty, start, "the left side of `&&`")?;
        let mut terms = vec![first];
        while *self.peek() == Tok::And {
            self.bump();
            let at = self.offset();
            let (right, rty) = self.not()?;
            self.want_condition(rty, at, "the right side of `&&`")?;
            terms.push(right);
        }
        Ok((Expr::And(terms), Ty::Bool))
    }

    fn not(&mut self) -> Result<(Expr, Ty), ConditionError> {
        if *self.peek() != Tok::Not {
            return self.comparison();
        }
        self.bump();
        self.deeper()?;
        let at = self.offset();
        let (inner, ty) = self.not()?;
        self.depth -= 1;
        self.want_condition(ty, at, "what `!` negates")?;
        Ok((Expr::Not(Box::new(inner)), Ty::Bool))
    }

    fn comparison(&mut self) -> Result<(Expr, Ty), ConditionError> {
        let start = self.offset();
        let (left, lty) = self.operand()?;
        let op = match self.peek() {
            Tok::Eq => CmpOp::Eq,
            Tok::Ne => CmpOp::Ne,
            Tok::Lt => CmpOp::Lt,
            Tok::Le => CmpOp::Le,
            Tok::Gt => CmpOp::Gt,
            Tok::Ge => CmpOp::Ge,
            Tok::Ident(w) if w == "in" => return self.in_list(left),
            Tok::Match | Tok::NotMatch => return self.regex(left, lty, start),
            _ => return Ok((left, lty)),
        };
        let op_at = self.bump().1;
        let right_at = self.offset();
        let (right, rty) = self.operand()?;
        if matches!(op, CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge) {
            for (ty, at) in [(lty, start), (rty, right_at)] {
                if matches!(ty, Ty::Bool | Ty::Null) {
                    return Err(ConditionError::at(
                        at,
                        format!(
                            "`{}` compares numbers or strings, not {}",
                            op.symbol(),
                            ty.name()
                        ),
                    ));
                }
            }
            if matches!((lty, rty), (Ty::Str, Ty::Num) | (Ty::Num, Ty::Str)) {
                return Err(ConditionError::at(
                    op_at,
                    "compares a number with a string, which never holds",
                ));
            }
        }
        Ok((Expr::Cmp(Box::new(left), op, Box::new(right)), Ty::Bool))
    }

    fn in_list(&mut self, left: Expr) -> Result<(Expr, Ty), ConditionError> {
        self.bump();
        self.expect(Tok::LBracket)?;
        let mut list = Vec::new();
        if *self.peek() == Tok::RBracket {
            return Err(ConditionError::at(
                self.offset(),
                "the list is empty, so `in` would never hold",
            ));
        }
        loop {
            let at = self.offset();
            match self.literal()? {
                Some(v) => list.push(v),
                None => {
                    return Err(ConditionError::at(
                        at,
                        format!(
                            "a list after `in` holds values (strings, numbers, true, false, null), not {}",
                            self.peek().describe()
                        ),
                    ));
                }
            }
            match self.peek() {
                Tok::Comma => {
                    self.bump();
                    if *self.peek() == Tok::RBracket {
                        self.bump();
                        break;
                    }
                }
                Tok::RBracket => {
                    self.bump();
                    break;
                }
                _ => return Err(self.unexpected("`,` or `]`")),
            }
        }
        Ok((Expr::In(Box::new(left), list), Ty::Bool))
    }

    fn regex(&mut self, value: Expr, ty: Ty, start: usize) -> Result<(Expr, Ty), ConditionError> {
        let (tok, op_at) = self.bump();
        if !matches!(ty, Ty::Str | Ty::Any) {
            return Err(ConditionError::at(
                start,
                format!("`{}` matches strings, not {}", tok.symbol(), ty.name()),
            ));
        }
        let _ = op_at;
        let at = self.offset();
        let Tok::Str(pattern) = self.peek().clone() else {
            return Err(self.unexpected("a regular expression in quotes"));
        };
        self.bump();
        let regex = Regex::new(&pattern)
            .map_err(|e| ConditionError::at(at, format!("invalid regular expression: {e}")))?;
        Ok((
            Expr::Match {
                value: Box::new(value),
                regex,
                negated: tok == Tok::NotMatch,
            },
            Ty::Bool,
        ))
    }

    /// A literal value, or `None` (nothing consumed) when the next token
    /// does not start one.
    fn literal(&mut self) -> Result<Option<Value>, ConditionError> {
        let (tok, at) = (self.peek().clone(), self.offset());
        let v = match tok {
            Tok::Str(s) => Value::String(s),
            Tok::Num(raw) => match serde_json::from_str::<serde_json::Number>(&raw) {
                Ok(n) => Value::Number(n),
                Err(_) => {
                    return Err(ConditionError::at(at, format!("`{raw}` is not a number")));
                }
            },
            Tok::Ident(w) if w == "true" => Value::Bool(true),
            Tok::Ident(w) if w == "false" => Value::Bool(false),
            Tok::Ident(w) if w == "null" => Value::Null,
            _ => return Ok(None),
        };
        self.bump();
        Ok(Some(v))
    }

    fn operand(&mut self) -> Result<(Expr, Ty), ConditionError> {
        if let Some(v) = self.literal()? {
            let ty = Ty::of(&v);
            return Ok((Expr::Lit(v), ty));
        }
        match self.peek().clone() {
            Tok::LParen => {
                self.bump();
                self.deeper()?;
                let inner = self.or()?;
                self.depth -= 1;
                self.expect(Tok::RParen)?;
                Ok(inner)
            }
            Tok::Ident(name) if *self.peek2() == Tok::LParen => self.call(&name),
            Tok::Ident(w) if w == "in" => Err(self.unexpected("a field or a value")),
            Tok::Ident(_) | Tok::Key(_) => Ok((Expr::Path(self.path()?), Ty::Any)),
            Tok::LBracket => Err(ConditionError::at(
                self.offset(),
                "a list belongs after `in` (`level in [\"warn\", \"error\"]`)",
            )),
            _ => Err(self.unexpected("a field, a value, a function or `(`")),
        }
    }

    fn path(&mut self) -> Result<FieldPath, ConditionError> {
        let start = self.offset();
        self.paths.push(start);
        let mut segments = Vec::new();
        loop {
            match self.bump().0 {
                Tok::Ident(s) | Tok::Key(s) => segments.push(s),
                // `a.0`: a segment that lexed as a number (`0.1` is two).
                Tok::Num(raw) if !segments.is_empty() && !raw.starts_with('-') => {
                    segments.extend(raw.split('.').map(str::to_string));
                }
                // After a dot, a quoted string is a key too.
                Tok::Str(s) if !segments.is_empty() && !s.is_empty() => segments.push(s),
                other => {
                    return Err(ConditionError::at(
                        self.toks[self.at.saturating_sub(1)].1,
                        format!(
                            "expected a field name after `.`, found {}",
                            other.describe()
                        ),
                    ));
                }
            }
            if *self.peek() != Tok::Dot {
                break;
            }
            self.bump();
        }
        FieldPath::from_segments(segments).map_err(|e| ConditionError::at(start, e))
    }

    fn call(&mut self, name: &str) -> Result<(Expr, Ty), ConditionError> {
        let name_at = self.offset();
        let Some(func) = Func::ALL.iter().find(|(n, _)| *n == name).map(|(_, f)| *f) else {
            let names: Vec<&str> = Func::ALL.iter().map(|(n, _)| *n).collect();
            let hint = closest(name, &names)
                .map(|b| format!("; did you mean `{b}`?"))
                .unwrap_or_default();
            return Err(ConditionError::at(
                name_at,
                format!(
                    "`{name}` is not a function{hint} (functions: {})",
                    names.join(", ")
                ),
            ));
        };
        self.bump();
        self.expect(Tok::LParen)?;
        self.deeper()?;
        let mut args = Vec::new();
        let mut arg_at = Vec::new();
        if *self.peek() != Tok::RParen {
            loop {
                arg_at.push(self.offset());
                args.push(self.or()?);
                if *self.peek() == Tok::Comma {
                    self.bump();
                } else {
                    break;
                }
            }
        }
        self.depth -= 1;
        let close = self.expect(Tok::RParen)?;
        let arity = match func {
            Func::StartsWith | Func::EndsWith | Func::Contains => 2,
            _ => 1,
        };
        if args.len() != arity {
            return Err(ConditionError::at(
                close,
                format!(
                    "`{name}` takes {arity} argument{}, got {}",
                    if arity == 1 { "" } else { "s" },
                    args.len()
                ),
            ));
        }
        if func == Func::Exists && !matches!(args[0].0, Expr::Path(_)) {
            return Err(ConditionError::at(
                arg_at[0],
                "`exists` takes a field (`exists(user.id)`)",
            ));
        }
        for ((_, ty), at) in args.iter().zip(&arg_at) {
            let fits = match func {
                Func::Exists => true,
                Func::Len | Func::Lower | Func::Upper | Func::StartsWith | Func::EndsWith => {
                    matches!(ty, Ty::Str | Ty::Any)
                }
                Func::Contains => !matches!(ty, Ty::Bool | Ty::Null),
            };
            if !fits {
                return Err(ConditionError::at(
                    *at,
                    format!("`{name}` takes strings or fields, not {}", ty.name()),
                ));
            }
        }
        let ty = match func {
            Func::Exists | Func::StartsWith | Func::EndsWith | Func::Contains => Ty::Bool,
            // Missing when the value is not a string (or has no length).
            Func::Lower | Func::Upper | Func::Len => Ty::Any,
        };
        Ok((
            Expr::Call(func, args.into_iter().map(|(e, _)| e).collect()),
            ty,
        ))
    }
}
