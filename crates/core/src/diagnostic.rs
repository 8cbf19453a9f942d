//! What `validate` reports: every problem found, each with the stage and the
//! place in the file, so a CI log points straight at the line to fix.

use std::fmt;

use serde::Serialize;

use crate::yaml::Pos;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Stable machine-readable kind, e.g. `unknown-input`.
    pub code: &'static str,
    pub message: String,
    /// The stage the problem belongs to, if any.
    pub stage: Option<String>,
    pub line: Option<usize>,
    pub col: Option<usize>,
}

impl Diagnostic {
    pub fn error(code: &'static str, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: message.into(),
            stage: None,
            line: None,
            col: None,
        }
    }

    pub fn warning(code: &'static str, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Self::error(code, message)
        }
    }

    pub fn at(mut self, pos: Pos) -> Self {
        self.line = Some(pos.line);
        self.col = Some(pos.col);
        self
    }

    pub fn stage(mut self, id: impl Into<String>) -> Self {
        self.stage = Some(id.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// `file:line:col: error: stage `id`: message`
    pub fn display<'a>(&'a self, file: &'a str) -> impl fmt::Display + 'a {
        DisplayDiagnostic { d: self, file }
    }
}

struct DisplayDiagnostic<'a> {
    d: &'a Diagnostic,
    file: &'a str,
}

impl fmt::Display for DisplayDiagnostic<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.d;
        write!(f, "{}", self.file)?;
        if let (Some(l), Some(c)) = (d.line, d.col) {
            write!(f, ":{l}:{c}")?;
        }
        let sev = match d.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, ": {sev}[{}]: ", d.code)?;
        if let Some(stage) = &d.stage {
            write!(f, "stage `{stage}`: ")?;
        }
        f.write_str(&d.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diagnostic_prints_what_it_knows_in_a_fixed_order() {
        let d = Diagnostic::error("code", "message");
        assert!(d.is_error());
        assert_eq!(
            d.display("f.yml").to_string(),
            "f.yml: error[code]: message"
        );
        let d = Diagnostic::warning("w", "careful")
            .stage("s")
            .at(Pos { line: 3, col: 4 });
        assert!(!d.is_error());
        assert_eq!(
            (d.severity, d.stage.as_deref(), d.line, d.col),
            (Severity::Warning, Some("s"), Some(3), Some(4))
        );
        assert_eq!(
            d.display("f.yml").to_string(),
            "f.yml:3:4: warning[w]: stage `s`: careful"
        );
        assert!(Severity::Error < Severity::Warning);
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            serde_json::json!({
                "severity": "warning", "code": "w", "message": "careful",
                "stage": "s", "line": 3, "col": 4
            })
        );
    }
}
