//! The test file format: `tests:` in the pipeline file or in a
//! `<name>.test.yml` next to it. Parsed from the position-keeping YAML
//! tree, so a mistake in a test points at its line like one in a stage.

use std::path::{Path, PathBuf};

use logbus_core::yaml::{self, Node, Pos};
use serde::Deserialize;
use serde_json::Value;

/// One pipeline unit test.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestCase {
    pub name: String,
    pub input: TestInput,
    /// The output to collect: a stage id, or `<id>.errors`.
    pub output: String,
    #[serde(default)]
    pub expect: Expect,
    /// Where the test is defined (filled in after parsing).
    #[serde(skip)]
    pub file: PathBuf,
    #[serde(skip)]
    pub pos: Pos,
}

/// Events given to a stage as its input. For a source, they replace what
/// the source would emit.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestInput {
    pub stage: String,
    /// Parsed events (maps).
    #[serde(default)]
    pub events: Vec<Value>,
    /// Raw lines, as a line-reading source would emit them.
    #[serde(default)]
    pub lines: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Exactly this many events.
    #[serde(default)]
    pub count: Option<usize>,
    /// Exactly these events, in order: maps for parsed events, strings for raw ones.
    #[serde(default)]
    pub events: Option<Vec<Value>>,
    /// Conditions every collected event must meet.
    #[serde(default)]
    pub all: Vec<Condition>,
    /// No event at all.
    #[serde(default)]
    pub none: bool,
}

/// A condition on one field (dotted path); give one operator.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    pub field: String,
    #[serde(default, deserialize_with = "present")]
    pub equals: Option<Value>,
    #[serde(default)]
    pub exists: Option<bool>,
    #[serde(default)]
    pub matches: Option<String>,
    #[serde(default)]
    pub contains: Option<String>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// A problem in a test definition, with its place.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}:{}:{}: {message}", file.display(), pos.line, pos.col)]
pub struct SpecError {
    pub file: PathBuf,
    pub pos: Pos,
    pub message: String,
}

/// The tests of a pipeline: its own `tests:` list, then `<stem>.test.yml`.
pub fn load_tests(pipeline: &Path) -> Result<Vec<TestCase>, Vec<SpecError>> {
    let mut tests = Vec::new();
    let mut errors = Vec::new();
    let mut read = |file: &Path, required: bool| {
        let text = match std::fs::read_to_string(file) {
            Ok(t) => t,
            Err(_) if !required => return,
            Err(e) => {
                errors.push(SpecError {
                    file: file.to_path_buf(),
                    pos: Pos::default(),
                    message: format!("cannot read: {e}"),
                });
                return;
            }
        };
        match parse_tests(&text, file) {
            Ok(t) => tests.extend(t),
            Err(e) => errors.extend(e),
        }
    };
    read(pipeline, true);
    read(&companion(pipeline), false);
    if errors.is_empty() {
        Ok(tests)
    } else {
        Err(errors)
    }
}

/// `dir/name.yml` → `dir/name.test.yml`.
pub fn companion(pipeline: &Path) -> PathBuf {
    let stem = pipeline.file_stem().unwrap_or_default().to_string_lossy();
    pipeline.with_file_name(format!("{stem}.test.yml"))
}

/// Parses the `tests:` list of one file (no list: no tests).
pub fn parse_tests(text: &str, file: &Path) -> Result<Vec<TestCase>, Vec<SpecError>> {
    let err = |pos: Pos, message: String| SpecError {
        file: file.to_path_buf(),
        pos,
        message,
    };
    let root = match yaml::parse(text) {
        Ok(Some(root)) => root,
        Ok(None) => return Ok(Vec::new()),
        Err(e) => return Err(vec![err(e.pos, format!("invalid YAML: {}", e.message))]),
    };
    if let yaml::NodeKind::Seq(_) = &root.kind {
        return Err(vec![err(
            root.pos,
            "a test file is a mapping with `tests:`, a list of tests; this one is a list".into(),
        )]);
    }
    let Some(list) = root.get("tests") else {
        return Ok(Vec::new());
    };
    let items: &[Node] = match &list.kind {
        yaml::NodeKind::Seq(items) => items,
        _ => {
            return Err(vec![err(
                list.pos,
                "`tests` must be a list of tests".into(),
            )]);
        }
    };
    let mut tests = Vec::new();
    let mut errors = Vec::new();
    for item in items {
        match serde_path_to_error::deserialize::<_, TestCase>(item.to_json()) {
            Ok(mut t) => {
                t.file = file.to_path_buf();
                t.pos = item.pos;
                if t.input.events.is_empty() && t.input.lines.is_empty() {
                    errors.push(err(
                        item.pos_of(&["input".into()]),
                        format!("test `{}`: `input` needs `events` or `lines`", t.name),
                    ));
                }
                tests.push(t);
            }
            Err(e) => {
                let path = logbus_plugin_api::engine::path_segments(e.path());
                errors.push(err(
                    item.pos_of(&path),
                    format!("invalid test: {}", e.into_inner()),
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(tests)
    } else {
        Err(errors)
    }
}
