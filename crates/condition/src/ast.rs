//! The compiled tree, and how it prints.

use std::fmt;

use logbus_event::FieldPath;
use regex::Regex;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Exists,
    StartsWith,
    EndsWith,
    Contains,
    Lower,
    Upper,
    Len,
}

impl Func {
    pub const ALL: [(&'static str, Func); 7] = [
        ("exists", Func::Exists),
        ("starts_with", Func::StartsWith),
        ("ends_with", Func::EndsWith),
        ("contains", Func::Contains),
        ("lower", Func::Lower),
        ("upper", Func::Upper),
        ("len", Func::Len),
    ];

    pub fn name(self) -> &'static str {
        Func::ALL
            .iter()
            .find(|(_, f)| *f == self)
            .map(|(n, _)| *n)
            .expect("every function is listed")
    }
}

/// A node of a compiled condition.
#[derive(Debug, Clone)]
pub enum Expr {
    /// Two or more conditions joined by `||`. A chain is one node, not a
    /// left-leaning tree: an 80,000-term `a || b || ...` is then as deep
    /// as one term, and evaluating, printing, cloning and dropping it need
    /// no stack proportional to its length. Only parentheses nest (and
    /// the parser bounds those).
    Or(Vec<Expr>),
    /// Two or more conditions joined by `&&` (one node per chain, as `Or`).
    And(Vec<Expr>),
    Not(Box<Expr>),
    Cmp(Box<Expr>, CmpOp, Box<Expr>),
    In(Box<Expr>, Vec<Value>),
    /// `a =~ "re"` (or `!~` when `negated`).
    Match {
        value: Box<Expr>,
        regex: Regex,
        negated: bool,
    },
    Call(Func, Vec<Expr>),
    Path(FieldPath),
    Lit(Value),
}

impl Expr {
    /// Binding strength, for printing with only the parentheses needed.
    fn precedence(&self) -> u8 {
        match self {
            Expr::Or(..) => 1,
            Expr::And(..) => 2,
            Expr::Not(..) => 3,
            Expr::Cmp(..) | Expr::In(..) | Expr::Match { .. } => 4,
            Expr::Call(..) | Expr::Path(_) | Expr::Lit(_) => 5,
        }
    }

    fn child(&self, child: &Expr, at_least: u8, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let _ = self;
        if child.precedence() < at_least {
            write!(f, "({child})")
        } else {
            write!(f, "{child}")
        }
    }
}

impl Expr {
    /// A chain's terms, left-associative: the first term may be a chain of
    /// the same operator without parentheses, a later one keeps them.
    fn chain(
        &self,
        terms: &[Expr],
        op: &str,
        strength: u8,
        f: &mut fmt::Formatter<'_>,
    ) -> fmt::Result {
        for (i, term) in terms.iter().enumerate() {
            if i > 0 {
                f.write_str(op)?;
            }
            self.child(term, if i == 0 { strength } else { strength + 1 }, f)?;
        }
        Ok(())
    }
}

/// A segment that reads as a name prints bare, any other in backticks.
fn segment(s: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let mut chars = s.chars();
    let bare = chars.next().is_some_and(crate::lex::ident_start)
        && chars.all(crate::lex::ident_char)
        && !matches!(s, "true" | "false" | "null" | "in");
    if bare {
        f.write_str(s)
    } else {
        write!(f, "`{s}`")
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Left-associative: a right operand of the same strength
            // keeps its parentheses.
            Expr::Or(terms) => self.chain(terms, " || ", 1, f),
            Expr::And(terms) => self.chain(terms, " && ", 2, f),
            // `!(c > 1)`, not `!c > 1` (which parses the same but reads
            // as if `!` bound to `c`).
            Expr::Not(a) if matches!(**a, Expr::Not(_)) => write!(f, "!{a}"),
            Expr::Not(a) => {
                f.write_str("!")?;
                self.child(a, 5, f)
            }
            Expr::Cmp(a, op, b) => {
                self.child(a, 5, f)?;
                write!(f, " {} ", op.symbol())?;
                self.child(b, 5, f)
            }
            Expr::In(a, list) => {
                self.child(a, 5, f)?;
                f.write_str(" in [")?;
                for (i, v) in list.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            Expr::Match {
                value,
                regex,
                negated,
            } => {
                self.child(value, 5, f)?;
                write!(
                    f,
                    " {} {}",
                    if *negated { "!~" } else { "=~" },
                    Value::from(regex.as_str())
                )
            }
            Expr::Call(func, args) => {
                write!(f, "{}(", func.name())?;
                for (i, a) in args.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str(")")
            }
            Expr::Path(p) => {
                for (i, s) in p.segments().iter().enumerate() {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    segment(s, f)?;
                }
                Ok(())
            }
            Expr::Lit(v) => write!(f, "{v}"),
        }
    }
}
