//! What a stage finds when it reaches its service, for `logbus validate
//! --connect`.
//!
//! Validation and the preflight never leave the host, so a pipeline whose
//! broker refuses its password, whose bucket is misspelt or whose
//! ClickHouse table lacks a column passes both and fails at the first
//! batch. Only the plugin speaks its service's protocol, so it is the
//! plugin that probes: with the credentials the options name, read-only
//! (metadata, `HEAD`, `DESCRIBE`, an empty export), never creating a topic,
//! index or bucket. The engine runs the probes side by side under one
//! timeout and places each finding at the option it names.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use crate::flow::FieldType;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FindingLevel {
    Error,
    Warning,
}

/// The service could not be reached (refused, timed out, name unknown,
/// TLS handshake failed).
pub const UNREACHABLE: &str = "service-unreachable";
/// The client could not be set up as the options say (a variable not
/// set, a CA file that does not parse): the stage would fail at start.
pub const SETUP: &str = "service-setup";
/// The service answered and refused these credentials or this permission.
pub const REFUSED: &str = "service-refused";
/// The topic, bucket, table or group the options name is not there.
pub const MISSING: &str = "service-missing";
/// A column is written from a field no upstream stage produces.
pub const COLUMN_NOT_PRODUCED: &str = "column-not-produced";
/// A field arrives that no column stores.
pub const FIELD_NOT_STORED: &str = "field-not-stored";

/// One thing a probe found, at an option of the stage (`["topic"]`; empty
/// for the stage itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceFinding {
    pub level: FindingLevel,
    pub code: &'static str,
    pub option: Vec<String>,
    pub message: String,
}

impl ServiceFinding {
    pub fn error(code: &'static str, option: &[&str], message: impl Into<String>) -> Self {
        ServiceFinding {
            level: FindingLevel::Error,
            code,
            option: option.iter().map(|s| s.to_string()).collect(),
            message: message.into(),
        }
    }

    /// The client could not be set up: where, and why.
    pub fn setup(e: crate::OptionError) -> Self {
        ServiceFinding {
            option: e.path,
            ..ServiceFinding::error(
                SETUP,
                &[],
                format!("cannot set up the client: {}", e.message),
            )
        }
    }

    pub fn warning(code: &'static str, option: &[&str], message: impl Into<String>) -> Self {
        ServiceFinding {
            level: FindingLevel::Warning,
            ..ServiceFinding::error(code, option, message)
        }
    }
}

/// The fields the flow analysis knows to arrive at a stage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArrivingFields {
    /// Dotted paths, with their types.
    pub fields: BTreeMap<String, FieldType>,
    /// Other fields may arrive too (an upstream `parser: json`, a script);
    /// then a field not listed may still be there.
    pub open: bool,
    /// Whether the analysis reached the stage at all (a source's fields
    /// are not analysed; nothing can be concluded then).
    pub known: bool,
}

impl ArrivingFields {
    /// Whether `field` may arrive: listed, under a listed object, the
    /// parent of a listed field, or the set is open or unknown.
    pub fn may_have(&self, field: &str) -> bool {
        if !self.known || self.open || self.fields.contains_key(field) {
            return true;
        }
        let mut end = field.len();
        while let Some(dot) = field[..end].rfind('.') {
            if let Some(t) = self.fields.get(&field[..dot]) {
                return matches!(t, FieldType::Object | FieldType::Any);
            }
            end = dot;
        }
        let prefix = format!("{field}.");
        self.fields
            .range(prefix.clone()..)
            .next()
            .is_some_and(|(k, _)| k.starts_with(&prefix))
    }

    /// The top-level fields that surely arrive (a closed, known set), for
    /// a check that every one is stored somewhere; `None` when open.
    pub fn closed_top_level(&self) -> Option<Vec<&str>> {
        if !self.known || self.open {
            return None;
        }
        let mut top: Vec<&str> = self
            .fields
            .keys()
            .map(|k| k.split('.').next().unwrap_or(k))
            .collect();
        top.dedup();
        Some(top)
    }
}

/// What a probe gets besides its options.
#[derive(Debug, Clone)]
pub struct ConnectContext {
    pub stage_id: String,
    /// The pipeline file's directory (relative paths resolve against it).
    pub base_dir: PathBuf,
    /// How long the probe may take in all; the engine stops it then and
    /// reports the service as unreachable.
    pub timeout: Duration,
    pub arriving: ArrivingFields,
}

impl ConnectContext {
    /// The context the stage's own build gets, for a probe that sets up
    /// its client as the stage does.
    pub fn build_context(&self) -> crate::BuildContext {
        crate::BuildContext {
            stage_id: self.stage_id.clone(),
            base_dir: self.base_dir.clone(),
            worker: 0,
        }
    }
}

/// A probe of one stage's service: what it found, nothing when all is well.
pub type Probe = Pin<Box<dyn Future<Output = Vec<ServiceFinding>> + Send + 'static>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn arriving(fields: &[(&str, FieldType)], open: bool) -> ArrivingFields {
        ArrivingFields {
            fields: fields.iter().map(|(k, t)| (k.to_string(), *t)).collect(),
            open,
            known: true,
        }
    }

    #[test]
    fn a_closed_set_has_its_fields_their_parents_and_what_lies_under_objects() {
        let a = arriving(
            &[
                ("host", FieldType::String),
                ("http.status", FieldType::Number),
                ("labels", FieldType::Object),
                ("count", FieldType::Number),
            ],
            false,
        );
        assert!(a.may_have("host"));
        assert!(a.may_have("http"));
        assert!(a.may_have("http.status"));
        assert!(a.may_have("labels.team"));
        assert!(!a.may_have("count.x"), "under a number");
        assert!(!a.may_have("hostname"));
        assert!(!a.may_have("http.method"));
        assert!(!a.may_have("htt"));
        assert_eq!(
            a.closed_top_level(),
            Some(vec!["count", "host", "http", "labels"])
        );
    }

    #[test]
    fn an_open_or_unknown_set_may_have_anything() {
        let open = arriving(&[("host", FieldType::String)], true);
        assert!(open.may_have("anything"));
        assert_eq!(open.closed_top_level(), None);
        let unknown = ArrivingFields::default();
        assert!(unknown.may_have("anything"));
        assert_eq!(unknown.closed_top_level(), None);
    }
}
