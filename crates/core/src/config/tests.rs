//! The checker's own tests: every diagnostic a pipeline file can get,
//! asserted whole (file, line, column, severity, code, stage, message), and
//! the bounds the validated model computes. The engine's integration tests
//! (`crates/logbus/tests/it/validate.rs`) run the same checks through the
//! binary; these pin each rule where it is written, with plugins made up
//! for the purpose so that no real plugin's options are involved.

use std::path::Path;

use logbus_plugin_api::{BuildContext, Built, OptionError, Plugin, Registry, StageKind};
use logbus_queue::LocalConfig;
use serde_json::{Value, json};

use super::*;
use logbus_plugin_api::CheckOptions;

/// A plugin whose checks are driven by its options: `bad: x` is an error
/// at `bad`, `whole: x` an error about the options as a whole, `expr`
/// (or `nested.expr`) an error at the first `!` inside the text, and
/// `routes: [a, b]` its named outputs.
struct Fake {
    name: &'static str,
    kind: StageKind,
    max: Option<usize>,
}

impl Plugin for Fake {
    fn name(&self) -> &'static str {
        self.name
    }
    fn kind(&self) -> StageKind {
        self.kind
    }
    fn description(&self) -> &'static str {
        "made up for the checker's tests"
    }
    fn options_schema(&self) -> Value {
        json!({ "type": "object" })
    }
    fn max_per_pipeline(&self) -> Option<usize> {
        self.max
    }
    fn outputs(&self, options: &Value) -> Vec<String> {
        options["routes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|r| Some(r.as_str()?.to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }
    fn check(&self, options: &Value, _: &BuildContext) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if let Some(v) = options.get("bad") {
            errors.push(OptionError::at(&["bad"], format!("{v} is bad")));
        }
        if options.get("whole").is_some() {
            errors.push(OptionError::at(&[], "wrong as a whole"));
        }
        let inside = |path: &[&str], text: Option<&str>| {
            let at = text?.find('!')?;
            Some(OptionError::inside(path, at, "unexpected `!`"))
        };
        errors.extend(inside(&["expr"], options["expr"].as_str()));
        errors.extend(inside(
            &["nested", "expr"],
            options["nested"]["expr"].as_str(),
        ));
        errors
    }
    fn build(&self, _: &Value, _: &BuildContext) -> Result<Built, Vec<OptionError>> {
        Err(vec![OptionError::at(&[], "not built in these tests")])
    }
}

fn registry() -> Registry {
    let mut r = Registry::new();
    for (name, kind, max) in [
        ("gen", StageKind::Source, None),
        ("once", StageKind::Source, Some(1)),
        ("p", StageKind::Parser, None),
        ("t", StageKind::Transform, None),
        ("twice", StageKind::Transform, Some(2)),
        ("f", StageKind::Formatter, None),
        ("out", StageKind::Sink, None),
        ("outer", StageKind::Sink, None),
    ] {
        r.add(Fake { name, kind, max });
    }
    r.add_absent(StageKind::Sink, "kafka", "sink-kafka");
    r
}

fn env(name: &str) -> Option<String> {
    match name {
        "SINK" => Some("out".into()),
        _ => None,
    }
}

fn load(yaml: &str) -> Loaded {
    load_str(yaml, Path::new("conf/p.yml"), &registry(), &env)
}

/// Every diagnostic, as `logbus validate` prints it.
fn diags(yaml: &str) -> Vec<String> {
    load(yaml)
        .diagnostics
        .iter()
        .map(|d| d.display("p.yml").to_string())
        .collect()
}

pub(crate) fn pipeline(yaml: &str) -> Pipeline {
    let loaded = load(yaml);
    assert!(!loaded.has_errors(), "{:?}", diags(yaml));
    loaded.pipeline.expect("no errors, so a pipeline")
}

const GOOD: &str = "\
stages:
  in: { source: gen }
  work: { transform: t, inputs: [in] }
  out: { sink: out, inputs: [work] }
";

#[test]
fn a_good_pipeline_has_no_diagnostics_and_its_stages_in_order() {
    let loaded = load(GOOD);
    assert!(loaded.diagnostics.is_empty(), "{:?}", diags(GOOD));
    assert!(!loaded.has_errors());
    let p = loaded.pipeline.unwrap();
    assert_eq!(p.path, Path::new("conf/p.yml"));
    assert_eq!(p.base_dir, Path::new("conf"));
    let ids: Vec<(&str, StageKind, &str)> = p
        .stages
        .iter()
        .map(|s| (s.id.as_str(), s.kind, s.plugin_name.as_str()))
        .collect();
    assert_eq!(
        ids,
        [
            ("in", StageKind::Source, "gen"),
            ("work", StageKind::Transform, "t"),
            ("out", StageKind::Sink, "out")
        ]
    );
    assert_eq!(p.stages[1].inputs, ["in"]);
    assert_eq!(p.stages[1].pos, crate::yaml::Pos { line: 3, col: 3 });
    assert_eq!(p.stages[1].plugin.name(), "t");
    // A file in the current directory resolves against `.`.
    let here = load_str(GOOD, Path::new("p.yml"), &registry(), &env);
    assert_eq!(here.pipeline.unwrap().base_dir, Path::new("."));
}

#[test]
fn a_warning_alone_still_gives_a_pipeline() {
    let yaml = "stages:\n  in: { source: gen }\n";
    let loaded = load(yaml);
    assert!(!loaded.has_errors());
    assert!(loaded.pipeline.is_some());
    assert_eq!(
        diags(yaml),
        [
            "p.yml:2:3: warning[no-sink]: stage `in`: output reaches no sink; its events would be discarded"
        ]
    );
}

#[test]
fn an_unusable_file_says_why_at_its_start() {
    assert_eq!(
        diags(""),
        ["p.yml:1:1: error[empty-file]: the pipeline file is empty; it needs a `stages:` map"]
    );
    assert_eq!(
        diags("stages: [a"),
        [
            "p.yml:2:1: error[yaml-syntax]: invalid YAML: while parsing a flow sequence, expected ',' or ']'"
        ]
    );
    assert_eq!(
        diags("- a\n"),
        [
            "p.yml:1:1: error[not-a-map]: the top level must be a map with `stages:` (and optionally `settings:`)"
        ]
    );
    assert_eq!(
        diags("settings: {}\n"),
        ["p.yml:1:9: error[no-stages]: missing `stages:` map"]
    );
    assert_eq!(
        diags("stages: [a]\n"),
        ["p.yml:1:9: error[not-a-map]: `stages` must be a map from stage id to stage"]
    );
    assert_eq!(
        diags("stages: {}\n"),
        ["p.yml:1:9: error[no-stages]: `stages` is empty"]
    );
    for yaml in ["", "- a\n", "settings: {}\n", "stages: [a]\n"] {
        assert!(load(yaml).pipeline.is_none(), "{yaml}");
        assert!(load(yaml).has_errors(), "{yaml}");
    }
}

#[test]
fn top_level_keys_and_variables() {
    assert_eq!(
        diags(&format!("stage: 1\nextra: 2\n{GOOD}")),
        [
            "p.yml:1:1: error[unknown-key]: unknown top-level key `stage`; did you mean `stages`?",
            "p.yml:2:1: error[unknown-key]: unknown top-level key `extra`",
        ]
    );
    // `tests:` belongs to `logbus test`; a variable expands before checks.
    let block = "stages:\n  in: { source: gen }\n  out:\n    sink: ${SINK}\n    inputs: [in]\n";
    let yaml = format!("{block}tests: []\n");
    assert!(diags(&yaml).is_empty(), "{:?}", diags(&yaml));
    assert_eq!(pipeline(&yaml).stages[1].plugin_name, "out");
    let yaml = block.replace("${SINK}", "${NOT_SET}");
    assert_eq!(
        diags(&yaml),
        [
            "p.yml:4:5: error[unknown-plugin]: stage `out`: unknown sink plugin `${NOT_SET}`; sink plugins in this build: out, outer",
            "p.yml:4:11: error[env-var]: environment variable `NOT_SET` is not set (use `${NOT_SET:-default}` for a fallback)",
        ]
    );
    assert!(load(&yaml).pipeline.is_none());
}

#[test]
fn stage_ids_and_plugin_keys() {
    let yaml = "\
stages:
  in: { source: gen }
  in: { source: gen }
  a.b: { sink: out, inputs: [in] }
  none: { inputs: [in] }
  both: { transform: t, sink: out, inputs: [in] }
  empty: { sink: '', inputs: [in] }
  list: [1]
";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:3:3: error[duplicate-id]: stage `in`: duplicate stage id `in` (first defined at line 2)",
            "p.yml:4:3: error[bad-id]: stage `a.b`: stage id `a.b` may contain only letters, digits, `_` and `-`",
            "p.yml:5:3: error[no-plugin]: stage `none`: no plugin key; add exactly one of `source`, `parser`, `transform`, `formatter`, `sink`",
            "p.yml:6:25: error[two-plugins]: stage `both`: a stage has exactly one plugin key, found `transform` and `sink`",
            "p.yml:7:18: error[bad-plugin]: stage `empty`: `sink` must name a plugin",
            "p.yml:8:9: error[not-a-map]: stage `list`: a stage must be a map, e.g. `{ sink: stdout, inputs: [parse] }`",
        ]
    );
    assert_eq!(
        diags("stages:\n  '': { source: gen }\n"),
        [
            "p.yml:2:3: error[bad-id]: stage ``: stage id is empty",
            "p.yml:2:3: warning[no-sink]: stage ``: output reaches no sink; its events would be discarded",
        ]
    );
    // Letters, digits, `_` and `-` are all an id may have, and enough.
    let yaml = "stages:\n  Az09_-: { source: gen }\n  s: { sink: out, inputs: [Az09_-] }\n";
    assert!(diags(yaml).is_empty(), "{:?}", diags(yaml));
}

#[test]
fn unknown_plugins_say_what_there_is() {
    let yaml = "\
stages:
  in: { source: gne }
  a: { transform: gen, inputs: [in] }
  b: { sink: kafka, inputs: [a] }
  c: { sink: zzzzzz, inputs: [a] }
";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:2:9: error[unknown-plugin]: stage `in`: unknown source plugin `gne`; did you mean `gen`?; source plugins in this build: gen, once",
            "p.yml:3:8: error[unknown-plugin]: stage `a`: unknown transform plugin `gen` (`gen` exists as a source); transform plugins in this build: t, twice",
            "p.yml:4:8: error[unknown-plugin]: stage `b`: sink `kafka` is not in this build; rebuild with cargo feature `sink-kafka`",
            "p.yml:5:8: error[unknown-plugin]: stage `c`: unknown sink plugin `zzzzzz`; sink plugins in this build: out, outer",
        ]
    );
}

#[test]
fn inputs_on_error_workers_and_queue_are_read_and_checked() {
    let yaml = "\
stages:
  in: { source: gen, workers: 2, on_error: route, queue: {} }
  a: { transform: t, inputs: in, on_error: fail, workers: 3 }
  b: { transform: t, inputs: [a, ''], on_error: sometimes, workers: 0 }
  c: { transform: t, inputs: {x: 1}, workers: 257 }
  d: { sink: out, inputs: [b, c], on_error: drop, queue: { size: 0, color: red } }
";
    assert_eq!(
        diags(yaml),
        [
            // A source's `on_error` is refused, and still read.
            "p.yml:2:3: warning[unread-errors]: stage `in`: `on_error: route` but no stage reads `in.errors`; failed events would be discarded",
            "p.yml:2:22: error[bad-option]: stage `in`: `workers` applies to parsers, transforms, formatters and sinks",
            "p.yml:2:34: error[bad-option]: stage `in`: `on_error` applies to parsers, transforms and formatters (and to a source's `codec`) only",
            "p.yml:2:51: error[bad-option]: stage `in`: a source has no input queue; `queue` applies to the stages it feeds",
            "p.yml:4:34: error[bad-input]: stage `b`: each input must be a stage id",
            "p.yml:4:49: error[bad-option]: stage `b`: `on_error` must be `drop`, `fail` or `route`, got `sometimes`",
            "p.yml:4:69: error[bad-option]: stage `b`: `workers` must be a whole number from 1 to 256",
            "p.yml:5:3: error[no-inputs]: stage `c`: `inputs` is empty; a transform needs at least one input stage",
            "p.yml:5:22: error[bad-input]: stage `c`: `inputs` must be a list of stage ids",
            "p.yml:5:47: error[bad-option]: stage `c`: `workers` must be a whole number from 1 to 256",
            "p.yml:6:35: error[bad-option]: stage `d`: `on_error` applies to parsers, transforms and formatters (and to a source's `codec`) only",
            "p.yml:6:60: error[bad-option]: stage `d`: queue.size: must be between 1 and 16777216, got 0",
            "p.yml:6:69: error[bad-option]: stage `d`: queue.color: unknown option `color` (options: scope, size, dequeue_batch, local, type, path, max_disk_bytes, when_full, segment_bytes, sync, sync_interval_ms, compression, save_on_shutdown, high_watermark, low_watermark)",
        ]
    );
    // The values that are right are kept.
    let yaml = "\
stages:
  in: { source: gen }
  a: { transform: t, inputs: in, on_error: fail, workers: 256 }
  b: { transform: t, inputs: [a], on_error: route, workers: 1 }
  c: { transform: t, inputs: [b], on_error: drop }
  d: { sink: out, inputs: [c, b.errors], queue: { size: 7 } }
";
    let p = pipeline(yaml);
    let got: Vec<(&[String], OnError, usize)> = p
        .stages
        .iter()
        .map(|s| (s.inputs.as_slice(), s.on_error, s.workers))
        .collect();
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (a, b, c, d) = (
        strings(&["in"]),
        strings(&["a"]),
        strings(&["b"]),
        strings(&["c", "b.errors"]),
    );
    assert_eq!(
        got,
        [
            (&[][..], OnError::Drop, 1),
            (&a[..], OnError::Fail, 256),
            (&b[..], OnError::Route, 1),
            (&c[..], OnError::Drop, 1),
            (&d[..], OnError::Drop, 1),
        ]
    );
    assert_eq!(p.stages[4].queue.as_ref().unwrap().size, Some(7));
    assert_eq!(p.stages[3].queue, None);
}

#[test]
fn ordered_is_read_and_refused_where_it_cannot_hold() {
    let yaml = "\
stages:
  in: { source: gen, ordered: true }
  a: { transform: t, inputs: in, workers: 2, ordered: yes }
  b: { transform: t, inputs: [a], workers: 2, ordered: true, queue: { scope: local } }
  c: { transform: t, inputs: [b], workers: 2, ordered: true, queue: { type: disk, path: q } }
  s: { sink: out, inputs: [c], workers: 2, ordered: true }
";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:2:22: error[bad-option]: stage `in`: `ordered` applies to parsers, transforms and formatters (a sink's workers each write on their own)",
            "p.yml:3:55: error[bad-option]: stage `a`: `ordered` must be true or false",
            "p.yml:4:47: error[bad-option]: stage `b`: `ordered` needs a global queue: with `scope: local` each producer has its own ring, so there is no one order to keep",
            "p.yml:5:47: error[bad-option]: stage `c`: `ordered` needs a memory queue: a `disk` or `disk-assisted` queue delivers again what a failed run left, out of turn",
            "p.yml:6:44: error[bad-option]: stage `s`: `ordered` applies to parsers, transforms and formatters (a sink's workers each write on their own)",
        ]
    );
    let p = pipeline(
        "stages:\n  in: { source: gen }\n  a: { transform: t, inputs: [in], workers: 2, ordered: true }\n  b: { transform: t, inputs: [a], ordered: false, queue: { scope: local } }\n  s: { sink: out, inputs: [b] }\n",
    );
    let got: Vec<bool> = p.stages.iter().map(|s| s.ordered).collect();
    assert_eq!(got, [false, true, false, false]);
}

#[test]
fn an_empty_input_name_is_not_an_input() {
    let yaml = "stages:\n  in: { source: gen }\n  s: { sink: out, inputs: '' }\n";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:2:3: warning[no-sink]: stage `in`: output reaches no sink; its events would be discarded",
            "p.yml:3:3: error[no-inputs]: stage `s`: `inputs` is empty; a sink needs at least one input stage",
            "p.yml:3:19: error[bad-input]: stage `s`: `inputs` must be a list of stage ids",
        ]
    );
    let yaml = "stages:\n  in: { source: gen, codec: '' }\n  i2: { source: gen, codec: { '': {} } }\n  s: { sink: out, inputs: [in, i2] }\n";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:2:29: error[bad-option]: stage `in`: `codec` must name a parser plugin, or be a map of one name to its options",
            "p.yml:3:29: error[bad-option]: stage `i2`: `codec` must name a parser plugin, or be a map of one name to its options",
        ]
    );
}

#[test]
fn an_empty_inputs_list_is_named_as_such() {
    let yaml = "stages:\n  in: { source: gen }\n  s: { sink: out, inputs: [] }\n";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:2:3: warning[no-sink]: stage `in`: output reaches no sink; its events would be discarded",
            "p.yml:3:3: error[no-inputs]: stage `s`: `inputs` is empty; a sink needs at least one input stage",
        ]
    );
}

#[test]
fn plugin_options_are_checked_where_they_are_written() {
    let yaml = "\
stages:
  in: { source: gen, bad: 1 }
  a:
    transform: t
    inputs: [in]
    whole: yes
    expr: 'ab!c'
    nested:
      expr: |
        first line
        x != y
  b: { transform: t, inputs: [a], expr: plain!text }
  s: { sink: out, inputs: [b], workers: 2, queue: { size: 4 }, on_error: drop }
";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:2:22: error[bad-option]: stage `in`: option `bad`: 1 is bad",
            "p.yml:3:3: error[bad-option]: stage `a`: wrong as a whole",
            "p.yml:7:14: error[bad-option]: stage `a`: option `expr`: unexpected `!`",
            "p.yml:11:11: error[bad-option]: stage `a`: option `nested.expr`: unexpected `!`",
            "p.yml:12:46: error[bad-option]: stage `b`: option `expr`: unexpected `!`",
            "p.yml:13:64: error[bad-option]: stage `s`: `on_error` applies to parsers, transforms and formatters (and to a source's `codec`) only",
        ]
    );
    // The plugin's options are the keys that are not common to all stages.
    let p = pipeline(
        "stages:\n  in: { source: gen, size: 3 }\n  s: { sink: out, inputs: [in], workers: 2, queue: {}, x: [1] }\n",
    );
    assert_eq!(p.stages[0].options, json!({ "size": 3 }));
    assert_eq!(p.stages[1].options, json!({ "x": [1] }));
}

#[test]
fn a_codec_becomes_the_parser_named_after_its_source() {
    let yaml = "\
stages:
  in: { source: gen, codec: p, on_error: route }
  s: { sink: out, inputs: [in, in.errors] }
";
    let p = pipeline(yaml);
    let got: Vec<(&str, StageKind, &str, Vec<String>, OnError)> = p
        .stages
        .iter()
        .map(|s| {
            (
                s.id.as_str(),
                s.kind,
                s.plugin_name.as_str(),
                s.inputs.clone(),
                s.on_error,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("in.source", StageKind::Source, "gen", vec![], OnError::Drop),
            (
                "in",
                StageKind::Parser,
                "p",
                vec!["in.source".to_string()],
                OnError::Route
            ),
            (
                "s",
                StageKind::Sink,
                "out",
                vec!["in".to_string(), "in.errors".to_string()],
                OnError::Drop
            ),
        ]
    );
    // The codec's options are its own; the source's the source's.
    let p = pipeline(
        "stages:\n  in: { source: gen, size: 1, codec: { p: { depth: 2 } } }\n  s: { sink: out, inputs: [in] }\n",
    );
    assert_eq!(p.stages[0].options, json!({ "size": 1 }));
    assert_eq!(p.stages[1].options, json!({ "depth": 2 }));
    let p = pipeline(
        "stages:\n  in: { source: gen, codec: { p: } }\n  s: { sink: out, inputs: [in] }\n",
    );
    assert_eq!(p.stages[1].options, json!({}));
}

#[test]
fn a_format_becomes_the_formatter_in_front_of_its_sink() {
    let yaml = "\
stages:
  in: { source: gen }
  s: { sink: out, inputs: [in], format: { f: { width: 3 } }, path: x }
";
    let p = pipeline(yaml);
    let got: Vec<(&str, StageKind, Vec<String>, Value)> = p
        .stages
        .iter()
        .map(|s| (s.id.as_str(), s.kind, s.inputs.clone(), s.options.clone()))
        .collect();
    assert_eq!(
        got,
        [
            ("in", StageKind::Source, vec![], json!({})),
            (
                "s.format",
                StageKind::Formatter,
                vec!["in".to_string()],
                json!({ "width": 3 })
            ),
            (
                "s",
                StageKind::Sink,
                vec!["s.format".to_string()],
                json!({ "path": "x" })
            ),
        ]
    );
    // The formatter stands where the sink is written.
    assert_eq!(p.stages[1].pos, p.stages[2].pos);
    // Without inputs, the formatter is the one said to lack them.
    assert_eq!(
        diags("stages:\n  in: { source: gen }\n  s: { sink: out, format: f }\n"),
        [
            "p.yml:2:3: warning[no-sink]: stage `in`: output reaches no sink; its events would be discarded",
            "p.yml:3:3: error[no-inputs]: stage `s.format`: no `inputs`; a formatter needs at least one input stage",
        ]
    );
}

#[test]
fn attached_stages_are_checked_too() {
    let yaml = "\
stages:
  in: { source: gen, codec: [p] }
  i2: { source: gen, codec: { p: { bad: 2 } } }
  i3: { source: gen, codec: { p: { whole: 1 } } }
  i4: { source: gen, codec: nope }
  i5: { source: gen, codec: { p: { nested: { expr: 'a!' } } } }
  a: { transform: t, inputs: [in, i2, i3, i4, i5] }
  s: { sink: out, inputs: [a], format: { f: 1, g: 2 } }
  s2: { sink: out, inputs: [a], format: { f: { bad: 3 } } }
";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:2:29: error[bad-option]: stage `in`: `codec` must name a parser plugin, or be a map of one name to its options",
            "p.yml:3:36: error[bad-option]: stage `i2`: `codec: p`: option `bad`: 2 is bad",
            "p.yml:4:29: error[bad-option]: stage `i3`: `codec: p`: wrong as a whole",
            "p.yml:5:22: error[unknown-plugin]: stage `i4`: unknown parser plugin `nope`; parser plugins in this build: p",
            "p.yml:6:54: error[bad-option]: stage `i5`: `codec: p`: option `nested.expr`: unexpected `!`",
            "p.yml:8:40: error[bad-option]: stage `s`: `format` must name a formatter plugin, or be a map of one name to its options",
            "p.yml:9:48: error[bad-option]: stage `s2`: `format: f`: option `bad`: 3 is bad",
        ]
    );
}

#[test]
fn the_graph_is_checked_input_by_input() {
    let yaml = "\
stages:
  in: { source: gen, inputs: [x] }
  a: { transform: t, inputs: [in, in, inn, in.errors, in.dead] }
  s: { sink: out, inputs: [a] }
  b: { transform: t, inputs: [s, s.errors] }
  c: { sink: out, inputs: [s.dead, b] }
";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:2:31: error[source-with-inputs]: stage `in`: a source reads no other stage; remove `inputs`",
            "p.yml:2:31: error[unknown-input]: stage `in`: input `x` names no stage; did you mean `a`?",
            "p.yml:3:35: error[duplicate-input]: stage `a`: input `in` is listed twice",
            "p.yml:3:39: error[unknown-input]: stage `a`: input `inn` names no stage; did you mean `in`?",
            "p.yml:3:44: error[no-error-output]: stage `a`: `in.errors` exists only when stage `in` has `on_error: route`",
            "p.yml:3:55: error[no-dead-output]: stage `a`: `in.dead`: only sinks have a `.dead` output, and `in` is not a sink",
            "p.yml:5:31: error[sink-as-input]: stage `b`: `s` is a sink; a sink's only output is `s.dead`, what it could not deliver",
            "p.yml:5:34: error[sink-as-input]: stage `b`: `s` is a sink; a sink's only output is `s.dead`, what it could not deliver",
        ]
    );
    // A sink's `.dead` is an input like any other.
    let yaml = "stages:\n  in: { source: gen }\n  s: { sink: out, inputs: [in] }\n  d: { sink: outer, inputs: [s.dead] }\n";
    assert_eq!(pipeline(yaml).stages[2].inputs, ["s.dead"]);
    // An id that ends like a side output but is a stage of its own.
    let yaml = "stages:\n  in: { source: gen }\n  x-errors: { transform: t, inputs: [in] }\n  s: { sink: out, inputs: [x-errors] }\n";
    assert!(diags(yaml).is_empty(), "{:?}", diags(yaml));
}

#[test]
fn named_outputs_are_read_by_name_only() {
    let yaml = "\
stages:
  in: { source: gen }
  r: { transform: t, inputs: [in], routes: [warn, error, _rest], on_error: route }
  a: { sink: out, inputs: [r.warn, r.eror] }
  b: { sink: out, inputs: [r, r.errors, r.zzzzzz] }
";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:3:3: warning[unread-output]: stage `r`: no stage reads `r.error`; the events it gets would be discarded",
            "p.yml:4:36: error[unknown-output]: stage `a`: `r` has no output `eror`; its outputs are `r.warn`, `r.error` and `r._rest`; did you mean `r.error`?",
            "p.yml:5:28: error[no-main-output]: stage `b`: `r` sends each event to its named outputs only; read one of `r.warn`, `r.error` and `r._rest`",
            "p.yml:5:41: error[unknown-output]: stage `b`: `r` has no output `zzzzzz`; its outputs are `r.warn`, `r.error` and `r._rest`",
        ]
    );
    let p = pipeline(
        "stages:\n  in: { source: gen }\n  r: { transform: t, inputs: [in], routes: [one] }\n  a: { sink: out, inputs: [r.one] }\n",
    );
    assert_eq!(p.stages[1].outputs, ["one"]);
    assert_eq!(
        diags(
            "stages:\n  in: { source: gen }\n  r: { transform: t, inputs: [in], routes: [one] }\n  a: { sink: out, inputs: [r.one, r.two] }\n"
        ),
        [
            "p.yml:4:35: error[unknown-output]: stage `a`: `r` has no output `two`; its outputs are `r.one`"
        ]
    );
    assert_eq!(
        diags(
            "stages:\n  in: { source: gen }\n  r: { transform: t, inputs: [in], routes: [one, two] }\n  a: { sink: out, inputs: [r] }\n"
        ),
        [
            "p.yml:2:3: warning[no-sink]: stage `in`: output reaches no sink; its events would be discarded",
            "p.yml:3:3: warning[no-sink]: stage `r`: output reaches no sink; its events would be discarded",
            "p.yml:3:3: warning[unread-output]: stage `r`: no stage reads `r.one`; the events it gets would be discarded",
            "p.yml:3:3: warning[unread-output]: stage `r`: no stage reads `r.two`; the events it gets would be discarded",
            "p.yml:4:28: error[no-main-output]: stage `a`: `r` sends each event to its named outputs only; read one of `r.one` and `r.two`",
        ]
    );
}

#[test]
fn cycles_are_reported_once_in_the_direction_events_flow() {
    let yaml = "\
stages:
  in: { source: gen }
  a: { transform: t, inputs: [in, c] }
  b: { transform: t, inputs: [a] }
  c: { transform: t, inputs: [b] }
  d: { transform: t, inputs: [d] }
  s: { sink: out, inputs: [c] }
";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:3:3: error[cycle]: stage `a`: cycle: a -> b -> c -> a",
            "p.yml:6:3: error[cycle]: stage `d`: cycle: d -> d",
        ]
    );
    // A diamond is not a cycle.
    let yaml = "\
stages:
  in: { source: gen }
  a: { transform: t, inputs: [in] }
  b: { transform: t, inputs: [in] }
  j: { transform: t, inputs: [a, b] }
  s: { sink: out, inputs: [j] }
";
    assert!(diags(yaml).is_empty(), "{:?}", diags(yaml));
}

#[test]
fn what_reaches_no_sink_and_what_nobody_reads_is_warned_about() {
    let yaml = "\
stages:
  in: { source: gen }
  a: { transform: t, inputs: [in], on_error: route }
  b: { transform: t, inputs: [a] }
  c: { transform: t, inputs: [b] }
  s: { sink: out, inputs: [a] }
";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:3:3: warning[unread-errors]: stage `a`: `on_error: route` but no stage reads `a.errors`; failed events would be discarded",
            "p.yml:4:3: warning[no-sink]: stage `b`: output reaches no sink; its events would be discarded",
            "p.yml:5:3: warning[no-sink]: stage `c`: output reaches no sink; its events would be discarded",
        ]
    );
}

#[test]
fn a_plugin_limited_per_pipeline_is_refused_past_its_limit() {
    let yaml = "\
stages:
  a: { source: once }
  b: { source: once }
  c: { source: once }
  t1: { transform: twice, inputs: [a] }
  t2: { transform: twice, inputs: [b] }
  t3: { transform: twice, inputs: [c] }
  s: { sink: out, inputs: [t1, t2, t3] }
";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:3:3: error[plugin-limit]: stage `b`: source `once` may be used by at most 1 stage(s) per pipeline; `a` already does",
            "p.yml:4:3: error[plugin-limit]: stage `c`: source `once` may be used by at most 1 stage(s) per pipeline; `a` already does",
            "p.yml:7:3: error[plugin-limit]: stage `t3`: transform `twice` may be used by at most 2 stage(s) per pipeline; `t1` already does",
        ]
    );
}

#[test]
fn settings_are_checked_where_they_are_written() {
    let bad = |settings: &str| diags(&format!("settings:\n{settings}\n{GOOD}"));
    assert_eq!(
        bad("  channel_capacity: 0"),
        [
            "p.yml:2:3: error[settings]: settings.channel_capacity: must be between 1 and 16777216, got 0"
        ]
    );
    assert_eq!(
        bad("  threads: 1025\n  drain_timeout_ms: 0"),
        [
            "p.yml:2:3: error[settings]: settings.threads: must be between 1 and 1024, got 1025",
            "p.yml:3:3: error[settings]: settings.drain_timeout_ms: must be at least 1, got 0",
        ]
    );
    assert_eq!(
        bad("  colour: 1"),
        [
            "p.yml:2:3: error[settings]: settings.colour: unknown option `colour` (options: channel_capacity, api, threads, drain_timeout_ms, fuse)"
        ]
    );
    assert_eq!(
        diags(&format!("settings: 5\n{GOOD}")),
        ["p.yml:1:11: error[settings]: settings: expected a map of options, got the number 5"]
    );
    assert_eq!(
        bad("  api: { listen: '0.0.0.0:1', token: short }"),
        ["p.yml:2:31: error[settings]: settings.api.token: must be at least 16 characters, got 5"]
    );
    assert!(
        load(&format!("settings:\n  threads: 0\n{GOOD}"))
            .pipeline
            .is_none()
    );
    // An empty `settings:` is the defaults.
    let p = pipeline(&format!("settings:\n{GOOD}"));
    assert_eq!(p.settings.channel_capacity, 4096);
    let p = pipeline(&format!(
        "settings: {{ channel_capacity: 5, threads: 2, fuse: false }}\n{GOOD}"
    ));
    assert_eq!(
        (
            p.settings.channel_capacity,
            p.settings.threads,
            p.settings.fuse
        ),
        (5, Some(2), false)
    );
}

#[test]
fn queue_errors_name_the_queue_key() {
    let yaml = "\
stages:
  in: { source: gen }
  s:
    sink: out
    inputs: [in]
    queue:
      size: 4
      dequeue_batch: 5
      local: { frontend_size: 2 }
";
    assert_eq!(
        diags(yaml),
        [
            "p.yml:9:7: error[bad-option]: stage `s`: queue.local: frontend settings apply only with `scope: local`",
            "p.yml:8:7: error[bad-option]: stage `s`: queue.dequeue_batch: must not exceed `size` (4), got 5",
        ]
        .map(String::from)
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
    );
}

/// A pipeline `in -> s` whose sink's queue is `queue` (a flow map), with
/// `settings`.
fn with_queue(settings: &str, queue: &str) -> Pipeline {
    pipeline(&format!(
        "settings: {settings}\nstages:\n  in: {{ source: gen }}\n  s: {{ sink: out, inputs: [in], workers: 2, queue: {queue} }}\n"
    ))
}

#[test]
fn queue_sizes_batches_and_the_in_flight_bound() {
    // The channel capacity, unless the queue says otherwise; a batch is at
    // most the capacity.
    let p = with_queue("{ channel_capacity: 100 }", "{}");
    let s = &p.stages[1];
    assert_eq!(s.capacity(&p.settings), 100);
    assert_eq!(s.dequeue_batch(&p.settings), 100);
    assert_eq!(s.local_config(&p.settings), None);
    assert_eq!(s.instances(&p.settings), 2);
    assert_eq!(s.inflight_bound(&p.settings), 100);
    assert_eq!(p.stages[0].instances(&p.settings), 1);
    assert_eq!(
        p.inflight_bound(),
        InflightBound {
            channels: 1,
            channel_capacity: 100,
            events: 100
        }
    );
    let p = with_queue(
        "{ channel_capacity: 100 }",
        "{ size: 10, dequeue_batch: 4 }",
    );
    let s = &p.stages[1];
    assert_eq!(
        (s.capacity(&p.settings), s.dequeue_batch(&p.settings)),
        (10, 4)
    );
    // A local-scope queue: `B + N × (F + min(D, F))`, and one plugin
    // instance per frontend besides the workers.
    let p = with_queue(
        "{ channel_capacity: 100 }",
        "{ scope: local, size: 50, dequeue_batch: 8, local: { frontend_size: 6, max_frontends: 3, min_batch: 2, min_batch_timeout_ms: 7 } }",
    );
    let s = &p.stages[1];
    assert_eq!(
        s.local_config(&p.settings),
        Some(LocalConfig {
            frontend_size: 6,
            max_frontends: 3,
            helper_batch: 6,
            min_batch: 2,
            min_batch_timeout: std::time::Duration::from_millis(7),
        })
    );
    assert_eq!(s.instances(&p.settings), 2 + 3);
    assert_eq!(s.inflight_bound(&p.settings), 50 + 3 * (6 + 6));
    let p = with_queue(
        "{ channel_capacity: 100 }",
        "{ scope: local, dequeue_batch: 4, local: { frontend_size: 6, max_frontends: 2, helper_batch: 3 } }",
    );
    let s = &p.stages[1];
    let local = s.local_config(&p.settings).unwrap();
    assert_eq!((local.helper_batch, local.max_frontends), (3, 2));
    assert_eq!(s.inflight_bound(&p.settings), 100 + 2 * (6 + 4));
    // The defaults of `local`.
    let p = with_queue("{}", "{ scope: local }");
    let local = p.stages[1].local_config(&p.settings).unwrap();
    assert_eq!(
        (local.frontend_size, local.max_frontends, local.helper_batch),
        (1024, 8, 1024)
    );
    // A durable queue holds in memory what its workers hold (`disk`), or
    // that and its memory part (`disk-assisted`).
    let p = with_queue("{}", "{ type: disk, path: q, size: 30, dequeue_batch: 5 }");
    assert_eq!(p.stages[1].inflight_bound(&p.settings), 2 * 5);
    let p = with_queue(
        "{}",
        "{ type: disk-assisted, path: q, size: 30, dequeue_batch: 5 }",
    );
    assert_eq!(p.stages[1].inflight_bound(&p.settings), 30 + 2 * 5);
    // Every stage but the sources counts.
    let p = pipeline(&format!("settings: {{ channel_capacity: 7 }}\n{GOOD}"));
    assert_eq!(
        p.inflight_bound(),
        InflightBound {
            channels: 2,
            channel_capacity: 7,
            events: 14
        }
    );
}

#[test]
fn a_durable_queue_is_resolved_with_its_defaults() {
    use logbus_queue::durable::{DurableKind, SyncMode, WhenFull};
    let base = Path::new("/base");
    let p = with_queue("{}", "{}");
    assert!(p.stages[1].durable(&p.settings, base).is_none());
    let p = with_queue("{ channel_capacity: 100 }", "{ type: disk, path: q }");
    let d = p.stages[1].durable(&p.settings, base).unwrap();
    assert_eq!(d.kind, DurableKind::Disk);
    assert_eq!(d.config.dir, Path::new("/base/q/s"));
    assert_eq!(d.config.segment_bytes, 64 << 20);
    assert_eq!(d.config.max_disk_bytes, 10 << 30);
    assert_eq!(d.config.when_full, WhenFull::Backpressure);
    assert_eq!(d.config.sync, SyncMode::Batch);
    assert_eq!(
        d.config.sync_interval,
        std::time::Duration::from_millis(100)
    );
    assert!(!d.config.lz4);
    assert!(d.save_on_shutdown);
    // Watermarks: 90 % and 70 % of the capacity by default.
    let p = with_queue(
        "{ channel_capacity: 100 }",
        "{ type: disk-assisted, path: /abs, when_full: drop_oldest, sync: interval, sync_interval_ms: 5, compression: lz4, save_on_shutdown: false, segment_bytes: 8KiB, max_disk_bytes: 1MB }",
    );
    let d = p.stages[1].durable(&p.settings, base).unwrap();
    assert_eq!(
        d.kind,
        DurableKind::DiskAssisted {
            high_watermark: 90,
            low_watermark: 70
        }
    );
    assert_eq!(d.config.dir, Path::new("/abs/s"));
    assert_eq!(
        (d.config.segment_bytes, d.config.max_disk_bytes),
        (8192, 1_000_000)
    );
    assert_eq!(d.config.when_full, WhenFull::DropOldest);
    assert_eq!(d.config.sync, SyncMode::Interval);
    assert_eq!(d.config.sync_interval, std::time::Duration::from_millis(5));
    assert!(d.config.lz4);
    assert!(!d.save_on_shutdown);
    for (when_full, sync, want) in [
        (
            "drop_newest",
            "none",
            (WhenFull::DropNewest, SyncMode::None),
        ),
        (
            "backpressure",
            "batch",
            (WhenFull::Backpressure, SyncMode::Batch),
        ),
    ] {
        let p = with_queue(
            "{}",
            &format!(
                "{{ type: disk, path: q, when_full: {when_full}, sync: {sync}, compression: none }}"
            ),
        );
        let d = p.stages[1].durable(&p.settings, base).unwrap();
        assert_eq!((d.config.when_full, d.config.sync), want);
        assert!(!d.config.lz4);
    }
    // Given watermarks are kept below the capacity, low below high.
    let p = with_queue(
        "{}",
        "{ type: disk-assisted, path: q, size: 10, high_watermark: 10, low_watermark: 3 }",
    );
    let d = p.stages[1].durable(&p.settings, base).unwrap();
    assert_eq!(
        d.kind,
        DurableKind::DiskAssisted {
            high_watermark: 10,
            low_watermark: 3
        }
    );
    let p = with_queue("{}", "{ type: disk-assisted, path: q, size: 1 }");
    let d = p.stages[1].durable(&p.settings, base).unwrap();
    assert_eq!(
        d.kind,
        DurableKind::DiskAssisted {
            high_watermark: 1,
            low_watermark: 0
        }
    );
}

#[test]
fn queue_settings_are_checked_together() {
    let errors = |queue: &str| -> Vec<String> {
        diags(&format!(
            "stages:\n  in: {{ source: gen }}\n  s: {{ sink: out, inputs: [in], queue: {queue} }}\n"
        ))
        .into_iter()
        .map(|d| d.split_once("stage `s`: ").unwrap().1.to_string())
        .collect()
    };
    let none: [&str; 0] = [];
    assert_eq!(errors("{ size: 16777216, dequeue_batch: 16777216 }"), none);
    assert_eq!(
        errors("{ size: 16777217 }"),
        ["queue.size: must be between 1 and 16777216, got 16777217"]
    );
    assert_eq!(
        errors("{ dequeue_batch: 0 }"),
        ["queue.dequeue_batch: must be at least 1, got 0"]
    );
    assert_eq!(
        errors("{ scope: local, local: { frontend_size: 0, max_frontends: 65 } }"),
        [
            "queue.local.frontend_size: must be between 1 and 16777216 events, got 0",
            "queue.local.max_frontends: must be between 1 and 64, got 65",
        ]
    );
    assert_eq!(
        errors("{ scope: local, local: { frontend_size: 16777217 } }"),
        ["queue.local.frontend_size: must be between 1 and 16777216 events, got 16777217"]
    );
    assert_eq!(
        errors("{ scope: local, local: { frontend_size: 8, min_batch_timeout_ms: 60001 } }"),
        ["queue.local.min_batch_timeout_ms: must be at most 60000, got 60001",]
    );
    assert_eq!(
        errors(
            "{ scope: local, dequeue_batch: 4, local: { frontend_size: 8, helper_batch: 5, min_batch: 9 } }"
        ),
        [
            "queue.local.helper_batch: must not exceed min(dequeue_batch, frontend_size) = 4, got 5",
            "queue.local.min_batch: must not exceed `frontend_size` (8), got 9",
        ]
    );
    assert_eq!(
        errors(
            "{ scope: local, local: { frontend_size: 8, helper_batch: 8, min_batch: 8, min_batch_timeout_ms: 60000 } }"
        ),
        none
    );
    assert_eq!(
        errors("{ scope: local, local: { frontend_size: 8, helper_batch: 9 } }"),
        ["queue.local.helper_batch: must not exceed min(dequeue_batch, frontend_size) = 8, got 9"]
    );
    // Durable keys need a durable type, and a durable type its path.
    assert_eq!(
        errors(
            "{ path: q, max_disk_bytes: 1, when_full: drop_oldest, segment_bytes: 1, sync: none, sync_interval_ms: 1, compression: lz4, save_on_shutdown: true, high_watermark: 1, low_watermark: 0 }"
        ),
        [
            "queue.path: applies only with `type: disk` or `type: disk-assisted`",
            "queue.max_disk_bytes: applies only with `type: disk` or `type: disk-assisted`",
            "queue.when_full: applies only with `type: disk` or `type: disk-assisted`",
            "queue.segment_bytes: applies only with `type: disk` or `type: disk-assisted`",
            "queue.sync: applies only with `type: disk` or `type: disk-assisted`",
            "queue.sync_interval_ms: applies only with `type: disk` or `type: disk-assisted`",
            "queue.compression: applies only with `type: disk` or `type: disk-assisted`",
            "queue.save_on_shutdown: applies only with `type: disk` or `type: disk-assisted`",
            "queue.high_watermark: applies only with `type: disk` or `type: disk-assisted`",
            "queue.low_watermark: applies only with `type: disk` or `type: disk-assisted`",
        ]
    );
    assert_eq!(
        errors("{ type: disk, path: '' }"),
        ["queue.type: a durable queue needs `path`: the directory that holds it across restarts"]
    );
    assert_eq!(
        errors("{ type: disk-assisted }"),
        ["queue.type: a durable queue needs `path`: the directory that holds it across restarts"]
    );
    assert_eq!(
        errors(
            "{ type: disk, path: q, scope: local, save_on_shutdown: true, high_watermark: 2, low_watermark: 1, sync_interval_ms: 5 }"
        ),
        [
            "queue.scope: a `disk` queue cannot have local scope; use `type: disk-assisted`, whose memory part can",
            "queue.save_on_shutdown: applies only with `type: disk-assisted`",
            "queue.high_watermark: applies only with `type: disk-assisted`",
            "queue.low_watermark: applies only with `type: disk-assisted`",
            "queue.sync_interval_ms: applies only with `sync: interval`",
        ]
    );
    assert_eq!(
        errors(
            "{ type: disk, path: q, sync: interval, sync_interval_ms: 5, segment_bytes: 4KiB, max_disk_bytes: 8KiB }"
        ),
        none
    );
    assert_eq!(
        errors("{ type: disk, path: q, segment_bytes: 4095 }"),
        ["queue.segment_bytes: must be between 4KiB and 1GiB, got 4095 bytes"]
    );
    assert_eq!(
        errors("{ type: disk, path: q, segment_bytes: 1GiB, max_disk_bytes: 2GiB }"),
        none
    );
    assert_eq!(
        errors("{ type: disk, path: q, segment_bytes: 1073741825, max_disk_bytes: 4GiB }"),
        ["queue.segment_bytes: must be between 4KiB and 1GiB, got 1073741825 bytes"]
    );
    assert_eq!(
        errors("{ type: disk, path: q, segment_bytes: 4KiB, max_disk_bytes: 8191 }"),
        [
            "queue.max_disk_bytes: must be at least two segments (8192 bytes with segment_bytes 4096), got 8191"
        ]
    );
    assert_eq!(
        errors("{ type: disk, path: q, max_disk_bytes: 128MiB }"),
        none
    );
    assert_eq!(
        errors("{ type: disk, path: q, max_disk_bytes: 134217727 }"),
        [
            "queue.max_disk_bytes: must be at least two segments (134217728 bytes with segment_bytes 67108864), got 134217727"
        ]
    );
    assert_eq!(
        errors("{ type: disk-assisted, path: q, size: 10, high_watermark: 5, low_watermark: 5 }"),
        ["queue.low_watermark: must be below `high_watermark` (5), got 5"]
    );
    assert_eq!(
        errors("{ type: disk-assisted, path: q, size: 10, high_watermark: 11, low_watermark: 4 }"),
        ["queue.high_watermark: must not exceed `size` (10), got 11"]
    );
    assert_eq!(
        errors("{ type: disk-assisted, path: q, size: 10, high_watermark: 10, low_watermark: 9 }"),
        none
    );
}

#[test]
fn a_file_is_read_as_utf8_and_a_bad_byte_is_placed() {
    let dir = std::env::temp_dir().join(format!("logbus-core-read-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("p.yml");
    let mut bytes = b"stages:\n  \xc3\xa9: x".to_vec();
    bytes.push(0xff);
    std::fs::write(&file, &bytes).unwrap();
    let e = read_text(&file).unwrap_err();
    assert_eq!(e.path, file);
    assert_eq!(e.source.kind(), std::io::ErrorKind::InvalidData);
    assert_eq!(
        e.to_string(),
        format!(
            "cannot read pipeline file {}: not UTF-8: byte 0xff at line 2, column 7 (byte offset 15)",
            file.display()
        )
    );
    let e = read_text(&dir.join("none.yml")).unwrap_err();
    assert_eq!(e.source.kind(), std::io::ErrorKind::NotFound);
    assert!(load_file(&dir.join("none.yml"), &registry()).is_err());
    std::fs::write(&file, GOOD).unwrap();
    assert_eq!(read_text(&file).unwrap(), GOOD);
    let loaded = load_file(&file, &registry()).unwrap();
    assert_eq!(loaded.pipeline.unwrap().base_dir, dir);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sizes_are_read_with_their_units() {
    let cases: [(&str, u64); 13] = [
        ("4096", 4096),
        (" 7 B ", 7),
        ("2KB", 2000),
        ("2kB", 2000),
        ("2KiB", 2048),
        ("1.5MB", 1_500_000),
        ("3MiB", 3 << 20),
        ("2GB", 2_000_000_000),
        ("2GiB", 2 << 30),
        ("1TB", 1_000_000_000_000),
        ("1TiB", 1 << 40),
        ("0.5 KiB", 512),
        ("0", 0),
    ];
    for (text, bytes) in cases {
        assert_eq!(ByteSize::parse(text), Ok(ByteSize(bytes)), "{text}");
    }
    assert_eq!(
        ByteSize::parse("16777216TiB"),
        Err("`16777216TiB` is out of range".into())
    );
    assert_eq!(
        ByteSize::parse("16777215TiB"),
        Ok(ByteSize(16_777_215 << 40))
    );
    for bad in ["", "MiB", "1 XB", "1..2MB", "-1"] {
        assert_eq!(
            ByteSize::parse(bad),
            Err(format!("`{bad}` is not a size like 64MiB, 10GiB or 4096")),
            "{bad}"
        );
    }
    let de = |v: Value| serde_json::from_value::<ByteSize>(v).map_err(|e| e.to_string());
    assert_eq!(de(json!(12)), Ok(ByteSize(12)));
    assert_eq!(de(json!("1KiB")), Ok(ByteSize(1024)));
    assert_eq!(
        de(json!("1 XB")),
        Err("`1 XB` is not a size like 64MiB, 10GiB or 4096".into())
    );
    assert_eq!(
        de(json!(-1)),
        Err("expected a size: an integer, or a string like 64MiB".into())
    );
}

#[test]
fn the_api_listens_on_loopback_or_needs_a_token() {
    let api = |listen: &str, token: Option<&str>| {
        ApiSettings {
            listen: listen.into(),
            token: token.map(String::from),
            allowed_hosts: vec![],
        }
        .check()
        .into_iter()
        .map(|e| format!("{}: {}", e.path.join("."), e.message))
        .collect::<Vec<_>>()
    };
    let none: [&str; 0] = [];
    assert_eq!(api("127.0.0.1:8686", None), none);
    assert_eq!(api("[::1]:8686", None), none);
    assert_eq!(
        api("0.0.0.0:8686", None),
        [
            "api.listen: 0.0.0.0:8686 is reachable from other hosts; set `api.token` (and put TLS in front)"
        ]
    );
    assert_eq!(
        api("0.0.0.0:8686", Some("")),
        [
            "api.listen: 0.0.0.0:8686 is reachable from other hosts; set `api.token` (and put TLS in front)",
            "api.token: must be at least 16 characters, got 0",
        ]
    );
    assert_eq!(api("0.0.0.0:8686", Some("0123456789abcdef")), none);
    assert_eq!(
        api("127.0.0.1:1", Some("0123456789abcde")),
        ["api.token: must be at least 16 characters, got 15"]
    );
    assert_eq!(
        api("127.0.0.1:1", Some("0123456789 abcdef")),
        ["api.token: must not contain whitespace"]
    );
    // Characters, not bytes.
    assert_eq!(api("127.0.0.1:1", Some("ééééééééééééééé")).len(), 1);
    assert_eq!(api("127.0.0.1:1", Some("éééééééééééééééé")), none);
    assert_eq!(
        api("localhost:1", None),
        [
            "api.listen: `localhost:1` is not an address like 127.0.0.1:8686: invalid socket address syntax"
        ]
    );
}

#[test]
fn settings_are_range_checked_by_their_own_rules() {
    let check = |s: Settings| {
        s.check()
            .into_iter()
            .map(|e| format!("{}: {}", e.path.join("."), e.message))
            .collect::<Vec<_>>()
    };
    let none: [&str; 0] = [];
    let base = Settings::default();
    assert_eq!(
        (
            base.channel_capacity,
            base.drain_timeout_ms,
            base.fuse,
            base.threads
        ),
        (4096, 30_000, true, None)
    );
    assert_eq!(check(base.clone()), none);
    let with = |f: fn(&mut Settings)| {
        let mut s = Settings::default();
        f(&mut s);
        check(s)
    };
    assert_eq!(
        with(|s| s.channel_capacity = 0),
        ["channel_capacity: must be between 1 and 16777216 events, got 0"]
    );
    assert_eq!(with(|s| s.channel_capacity = 1), none);
    assert_eq!(with(|s| s.channel_capacity = MAX_CHANNEL_CAPACITY), none);
    assert_eq!(
        with(|s| s.channel_capacity = MAX_CHANNEL_CAPACITY + 1),
        ["channel_capacity: must be between 1 and 16777216 events, got 16777217"]
    );
    assert_eq!(
        with(|s| s.drain_timeout_ms = 0),
        ["drain_timeout_ms: must be at least 1"]
    );
    assert_eq!(with(|s| s.drain_timeout_ms = 1), none);
    assert_eq!(
        with(|s| s.threads = Some(0)),
        ["threads: must be between 1 and 1024 worker threads, got 0"]
    );
    assert_eq!(with(|s| s.threads = Some(1)), none);
    assert_eq!(with(|s| s.threads = Some(MAX_THREADS)), none);
    assert_eq!(
        with(|s| s.threads = Some(MAX_THREADS + 1)),
        ["threads: must be between 1 and 1024 worker threads, got 1025"]
    );
    assert_eq!(
        with(|s| {
            s.api = Some(ApiSettings {
                listen: "x".into(),
                token: None,
                allowed_hosts: vec![],
            })
        }),
        ["api.listen: `x` is not an address like 127.0.0.1:8686: invalid socket address syntax"]
    );
}

#[test]
fn outputs_and_readers_are_found_by_name() {
    let p = pipeline(
        "\
stages:
  in: { source: gen }
  r: { transform: t, inputs: [in], routes: [a, b], on_error: route }
  x: { transform: t, inputs: [r.a, r.errors] }
  s: { sink: out, inputs: [x, r.b] }
  d: { sink: outer, inputs: [s.dead] }
",
    );
    assert_eq!(p.output_of("in"), ("in", None));
    assert_eq!(p.output_of("r.errors"), ("r", Some("errors")));
    assert_eq!(p.output_of("s.dead"), ("s", Some("dead")));
    assert_eq!(p.output_of("r.a"), ("r", Some("a")));
    assert_eq!(p.output_of("r.c"), ("r.c", None));
    assert_eq!(p.output_of("q.errors"), ("q.errors", None));
    assert_eq!(p.output_of("q.dead"), ("q.dead", None));
    assert_eq!(p.output_of("q.a"), ("q.a", None));
    let readers = |name| {
        p.readers_of(name)
            .map(|s| s.id.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(readers("r.a"), ["x"]);
    assert_eq!(readers("r.errors"), ["x"]);
    assert_eq!(readers("r.b"), ["s"]);
    assert_eq!(readers("x"), ["s"]);
    assert_eq!(readers("s.dead"), ["d"]);
    assert!(readers("r").is_empty());
    assert_eq!(p.stage("x").unwrap().side_output(), "x.errors");
    assert_eq!(p.stage("s").unwrap().side_output(), "s.dead");
    assert!(p.stage("nope").is_none());
    let cx = p.build_context(p.stage("x").unwrap());
    assert_eq!(
        (cx.stage_id.as_str(), cx.base_dir.as_path(), cx.worker),
        ("x", Path::new("conf"), 0)
    );
}

#[test]
fn straight_runs_of_processors_are_fused() {
    let chains = |yaml: &str| -> Vec<Vec<String>> {
        pipeline(yaml)
            .fused_chains()
            .iter()
            .map(|c| c.iter().map(|s| s.id.clone()).collect())
            .collect()
    };
    let run = "\
stages:
  in: { source: gen }
  a: { parser: p, inputs: [in] }
  b: { transform: t, inputs: [a] }
  c: { transform: t, inputs: [b] }
  s: { sink: out, inputs: [c] }
";
    let none: [[&str; 0]; 0] = [];
    assert_eq!(chains(run), [["a", "b", "c"]]);
    assert!(chains(&format!("settings: {{ fuse: false }}\n{run}")).is_empty());
    // A stage with a queue of its own, or other workers, starts a new run;
    // so does one read by two, and a local-scope queue ends one.
    assert_eq!(
        chains(&run.replace("inputs: [b] }", "inputs: [b], queue: { size: 9 } }")),
        [["a", "b"]]
    );
    assert_eq!(
        chains(&run.replace("inputs: [b] }", "inputs: [b], workers: 2 }")),
        [["a", "b"]]
    );
    assert_eq!(
        chains(
            &run.replace("inputs: [b] }", "inputs: [b], workers: 2 }")
                .replace(
                    "s: { sink: out, inputs: [c] }",
                    "d: { transform: t, inputs: [c], workers: 2 }\n  s: { sink: out, inputs: [d] }"
                )
        ),
        [["a", "b"], ["c", "d"]]
    );
    assert_eq!(
        chains(&run.replace("inputs: [c] }", "inputs: [c, b] }")),
        [["a", "b"]]
    );
    // Ordered workers fuse only with ordered workers.
    assert_eq!(
        chains(&run.replace("inputs: [b] }", "inputs: [b], ordered: true }")),
        [["a", "b"]]
    );
    assert_eq!(
        chains(
            &run.replace(
                "inputs: [in] }",
                "inputs: [in], workers: 2, ordered: true }"
            )
            .replace("inputs: [a] }", "inputs: [a], workers: 2, ordered: true }")
            .replace("inputs: [b] }", "inputs: [b], workers: 2 }")
        ),
        [["a", "b"]]
    );
    assert_eq!(
        chains(&run.replace("inputs: [a] }", "inputs: [a], queue: { scope: local } }")),
        none
    );
    // Two inputs, or a side output, are not a straight run.
    assert_eq!(
        chains(&run.replace("inputs: [b] }", "inputs: [b, in] }")),
        [["a", "b"]]
    );
    assert_eq!(
        chains(
            &run.replace(
                "b: { transform: t, inputs: [a] }",
                "b: { transform: t, inputs: [a], on_error: route }"
            )
            .replace("inputs: [b] }", "inputs: [b.errors] }")
        ),
        [["a", "b"]]
    );
    // Sources and sinks never join.
    assert!(chains(GOOD).is_empty());
}
