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
