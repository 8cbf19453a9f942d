//! Every validation error, with its message and its position in the file.

use logbus_core::{Diagnostic, Severity};
use logbus_plugin_api::{Registry, StageKind};

use crate::support::{load, load_with};

fn diags(text: &str) -> Vec<Diagnostic> {
    load(text).diagnostics
}

/// The single diagnostic with `code`; fails if there is none or several.
fn one(text: &str, code: &str) -> Diagnostic {
    let all = diags(text);
    let found: Vec<&Diagnostic> = all.iter().filter(|d| d.code == code).collect();
    assert_eq!(found.len(), 1, "expected one `{code}` in {all:#?}");
    found[0].clone()
}

fn at(d: &Diagnostic) -> (usize, usize) {
    (d.line.expect("line"), d.col.expect("col"))
}

const OK: &str = "\
stages:
  read:  { source: stdin }
  lines: { parser: lines, inputs: [read] }
  json:  { parser: json, inputs: [lines] }
  fmt:   { formatter: json, inputs: [json] }
  out:   { sink: file, inputs: [fmt], path: out.ndjson }
";

#[test]
fn the_issue_example_is_valid_and_has_a_bound() {
    let loaded = load(OK);
    assert!(loaded.diagnostics.is_empty(), "{:#?}", loaded.diagnostics);
    let p = loaded.pipeline.unwrap();
    let b = p.inflight_bound();
    assert_eq!(
        (b.channels, b.channel_capacity, b.events),
        (4, 4096, 4 * 4096)
    );
}

#[test]
fn yaml_syntax_error_points_at_the_line() {
    let d = one("stages:\n  a: { source: stdin\n  b: 1\n", "yaml-syntax");
    assert!(d.message.starts_with("invalid YAML"), "{}", d.message);
    assert!(d.line.unwrap() >= 2, "{d:?}");
}

#[test]
fn unknown_plugin_lists_this_builds_plugins_and_suggests() {
    let d = one(
        "stages:\n  a: { source: stdn }\n  o: { sink: stdout, inputs: [a] }\n",
        "unknown-plugin",
    );
    assert_eq!(at(&d), (2, 8));
    assert_eq!(d.stage.as_deref(), Some("a"));
    assert!(
        d.message
            .contains("unknown source plugin `stdn`; did you mean `stdin`?"),
        "{}",
        d.message
    );
    assert!(
        d.message.contains("generator"),
        "lists the build's sources: {}",
        d.message
    );
}

#[test]
fn plugin_of_another_kind_is_named() {
    let d = one(
        "stages:\n  a: { source: stdin }\n  j: { transform: json, inputs: [a] }\n  o: { sink: stdout, inputs: [j] }\n",
        "unknown-plugin",
    );
    assert!(
        d.message.contains("exists as a parser, formatter"),
        "{}",
        d.message
    );
}

#[test]
fn plugin_missing_from_this_build_names_the_feature() {
    let mut registry = Registry::new();
    registry.add_absent(StageKind::Sink, "kafka", "sink-kafka");
    let loaded = load_with("stages:\n  o: { sink: kafka, inputs: [x] }\n", &registry);
    let d = loaded
        .diagnostics
        .iter()
        .find(|d| d.code == "unknown-plugin")
        .expect("reported");
    assert_eq!(
        d.message,
        "sink `kafka` is not in this build; rebuild with cargo feature `sink-kafka`"
    );
}

#[test]
fn unknown_option_suggests_the_closest() {
    let d = one(
        "stages:\n  a: { source: stdin }\n  o:\n    sink: file\n    inputs: [a]\n    path: x\n    apend: true\n",
        "bad-option",
    );
    assert_eq!(at(&d), (7, 5));
    assert_eq!(d.stage.as_deref(), Some("o"));
    assert!(
        d.message
            .contains("unknown option `apend`; did you mean `append`?"),
        "{}",
        d.message
    );
}

#[test]
fn every_unknown_option_is_reported_not_just_the_first() {
    let all = diags(
        "stages:\n  a: { source: stdin, foo: 1, bar: 2 }\n  o: { sink: stdout, inputs: [a] }\n",
    );
    assert_eq!(
        all.iter().filter(|d| d.code == "bad-option").count(),
        2,
        "{all:#?}"
    );
}

#[test]
fn wrong_option_type_points_at_the_option() {
    let d = one(
        "stages:\n  a: { source: generator, count: lots }\n  o: { sink: stdout, inputs: [a] }\n",
        "bad-option",
    );
    assert_eq!(at(&d), (2, 27));
    assert!(d.message.contains("option `count`"), "{}", d.message);
    assert!(
        d.message
            .ends_with("expected a whole number, 0 or more, got the string \"lots\""),
        "{}",
        d.message
    );
}

/// Every type error of a stage at once, each at its option.
#[test]
fn every_type_error_of_a_stage_is_reported() {
    let all = diags(
        "stages:\n  read: { source: file, path: [a], max_line_bytes: \"x\", state_dir: 5 }\n  out: { sink: stdout, inputs: [read] }\n",
    );
    let found: Vec<(usize, usize, &str)> = all
        .iter()
        .map(|d| (d.line.unwrap(), d.col.unwrap(), d.message.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (2, 25, "option `path`: expected a string, got a list"),
            (
                2,
                36,
                "option `max_line_bytes`: expected a whole number, 0 or more, got the string \"x\""
            ),
            (
                2,
                57,
                "option `state_dir`: expected a string, got the number 5"
            ),
        ],
        "{all:#?}"
    );
}

#[test]
fn missing_required_option_points_at_the_stage() {
    let d = one(
        "stages:\n  a: { source: stdin }\n  o: { sink: file, inputs: [a] }\n",
        "bad-option",
    );
    assert_eq!(at(&d), (3, 3));
    assert!(d.message.contains("missing field `path`"), "{}", d.message);
}

#[test]
fn out_of_range_values_are_rejected() {
    let d = one(
        "stages:\n  a: { source: generator, batch_size: 0 }\n  o: { sink: stdout, inputs: [a] }\n",
        "bad-option",
    );
    assert!(
        d.message.contains("batch_size") && d.message.contains("between 1 and 65536"),
        "{}",
        d.message
    );
    assert_eq!(at(&d), (2, 27));
    let s = one(
        "settings:\n  channel_capacity: 0\nstages:\n  a: { source: stdin }\n  o: { sink: stdout, inputs: [a] }\n",
        "settings",
    );
    assert_eq!(at(&s), (2, 3));
    assert!(s.message.contains("must be between 1 and"), "{}", s.message);
    let t = one(
        "settings:\n  channel_capacity: 64\n  threads: 0\nstages:\n  a: { source: stdin }\n  o: { sink: stdout, inputs: [a] }\n",
        "settings",
    );
    assert_eq!(at(&t), (3, 3));
    assert!(
        t.message.contains("threads") && t.message.contains("between 1 and 1024"),
        "{}",
        t.message
    );
}

#[test]
fn unknown_settings_key_is_reported() {
    let d = one(
        "settings:\n  chanel_capacity: 8\nstages:\n  a: { source: stdin }\n  o: { sink: stdout, inputs: [a] }\n",
        "settings",
    );
    assert_eq!(at(&d), (2, 3));
    assert!(
        d.message.contains("did you mean `channel_capacity`"),
        "{}",
        d.message
    );
}

#[test]
fn unknown_input_suggests_the_closest_id() {
    let d = one(
        "stages:\n  reader: { source: stdin }\n  o: { sink: stdout, inputs: [raeder] }\n",
        "unknown-input",
    );
    assert_eq!(at(&d), (3, 31));
    assert_eq!(
        d.message,
        "input `raeder` names no stage; did you mean `reader`?"
    );
}

#[test]
fn source_with_inputs() {
    let d = one(
        "stages:\n  a: { source: stdin }\n  b: { source: stdin, inputs: [a] }\n  o: { sink: stdout, inputs: [a, b] }\n",
        "source-with-inputs",
    );
    assert_eq!(d.stage.as_deref(), Some("b"));
    assert_eq!(at(&d), (3, 32));
}

#[test]
fn non_source_without_inputs() {
    let d = one(
        "stages:\n  a: { source: stdin }\n  p: { parser: json }\n  o: { sink: stdout, inputs: [a] }\n",
        "no-inputs",
    );
    assert_eq!((d.stage.as_deref(), at(&d)), (Some("p"), (3, 3)));
    let d = one(
        "stages:\n  a: { source: stdin }\n  o: { sink: stdout, inputs: [] }\n",
        "no-inputs",
    );
    assert!(d.message.starts_with("`inputs` is empty"), "{}", d.message);
}

#[test]
fn sink_used_as_input() {
    let d = one(
        "stages:\n  a: { source: stdin }\n  o: { sink: stdout, inputs: [a] }\n  p: { parser: json, inputs: [o] }\n  q: { sink: stdout, inputs: [p] }\n",
        "sink-as-input",
    );
    assert_eq!((d.stage.as_deref(), at(&d)), (Some("p"), (4, 31)));
}

#[test]
fn a_sinks_dead_letters_are_an_input_only_sinks_have() {
    let dead = "stages:\n  a: { source: stdin }\n  o: { sink: http, inputs: [a], url: \"http://127.0.0.1:1/\" }\n  d: { sink: file, inputs: [o.dead], path: dead.ndjson }\n";
    let loaded = load(dead);
    assert!(loaded.diagnostics.is_empty(), "{:#?}", loaded.diagnostics);
    let p = loaded.pipeline.unwrap();
    assert_eq!(p.output_of("o.dead"), ("o", Some("dead")));
    assert_eq!(
        p.readers_of(&p.stage("o").unwrap().side_output())
            .map(|s| s.id.as_str())
            .collect::<Vec<_>>(),
        ["d"]
    );
    let d = one(
        "stages:\n  a: { source: stdin }\n  o: { sink: stdout, inputs: [a.dead] }\n",
        "no-dead-output",
    );
    assert!(
        d.message.contains("only sinks have a `.dead` output"),
        "{}",
        d.message
    );
    assert_eq!((d.stage.as_deref(), at(&d)), (Some("o"), (3, 31)));
}

#[test]
fn stage_without_or_with_two_plugin_keys() {
    let d = one(
        "stages:\n  a: { source: stdin }\n  p: { inputs: [a] }\n  o: { sink: stdout, inputs: [a] }\n",
        "no-plugin",
    );
    assert_eq!((d.stage.as_deref(), at(&d)), (Some("p"), (3, 3)));
    let d = one(
        "stages:\n  a: { source: stdin }\n  p: { parser: json, transform: stamp, inputs: [a] }\n  o: { sink: stdout, inputs: [p] }\n",
        "two-plugins",
    );
    assert!(
        d.message.contains("found `parser` and `transform`"),
        "{}",
        d.message
    );
    assert_eq!(at(&d), (3, 22));
}

#[test]
fn duplicate_stage_ids() {
    let d = one(
        "stages:\n  a: { source: stdin }\n  a: { source: stdin }\n  o: { sink: stdout, inputs: [a] }\n",
        "duplicate-id",
    );
    assert_eq!(at(&d), (3, 3));
    assert_eq!(
        d.message,
        "duplicate stage id `a` (first defined at line 2)"
    );
}

fn cycle_messages(text: &str) -> Vec<String> {
    diags(text)
        .into_iter()
        .filter(|d| d.code == "cycle")
        .map(|d| d.message)
        .collect()
}

#[test]
fn cycles_of_length_one_two_and_three() {
    let one_cycle = "stages:\n  s: { source: stdin }\n  a: { transform: stamp, inputs: [s, a] }\n  o: { sink: stdout, inputs: [a] }\n";
    assert_eq!(cycle_messages(one_cycle), ["cycle: a -> a"]);
    let two = "stages:\n  s: { source: stdin }\n  a: { transform: stamp, inputs: [s, b] }\n  b: { transform: stamp, inputs: [a] }\n  o: { sink: stdout, inputs: [b] }\n";
    assert_eq!(cycle_messages(two), ["cycle: a -> b -> a"]);
    let three = "stages:\n  s: { source: stdin }\n  a: { transform: stamp, inputs: [s, c] }\n  b: { transform: stamp, inputs: [a] }\n  c: { transform: stamp, inputs: [b] }\n  o: { sink: stdout, inputs: [c] }\n";
    assert_eq!(cycle_messages(three), ["cycle: a -> b -> c -> a"]);
    // The cycle error points at the first stage of the cycle.
    let d = one(three, "cycle");
    assert_eq!((d.stage.as_deref(), at(&d)), (Some("a"), (3, 3)));
}

#[test]
fn output_reaching_no_sink_is_a_warning() {
    let all = diags(
        "stages:\n  a: { source: stdin }\n  p: { parser: json, inputs: [a] }\n  dead: { transform: stamp, inputs: [p] }\n  o: { sink: stdout, inputs: [p] }\n",
    );
    let w: Vec<&Diagnostic> = all.iter().filter(|d| d.code == "no-sink").collect();
    assert_eq!(w.len(), 1, "{all:#?}");
    assert_eq!(w[0].severity, Severity::Warning);
    assert_eq!(w[0].stage.as_deref(), Some("dead"));
    // A warning alone leaves the pipeline runnable.
    assert!(load("stages:\n  a: { source: stdin }\n  dead: { parser: json, inputs: [a] }\n  o: { sink: stdout, inputs: [a] }\n").pipeline.is_some());
}

#[test]
fn env_vars_expand_before_validation() {
    // A reference that is the whole value is typed by what it expands to.
    let p = load("settings:\n  channel_capacity: ${LOGBUS_TEST_SET}\nstages:\n  a: { source: generator, count: '${UNSET_X:-5}' }\n  o: { sink: stdout, inputs: [a] }\n").pipeline.unwrap();
    assert_eq!(p.settings.channel_capacity, 42);
    assert_eq!(p.stages[0].options["count"], 5);
    // Part of a value stays text: a type error, reported at the option.
    let d = one(
        "stages:\n  a: { source: generator, count: 'x${UNSET_X:-5}' }\n  o: { sink: stdout, inputs: [a] }\n",
        "bad-option",
    );
    assert_eq!(at(&d), (2, 27));
    let d = one(
        "stages:\n  a: { source: file, path: '${NOPE}' }\n  o: { sink: stdout, inputs: [a] }\n",
        "env-var",
    );
    assert_eq!(at(&d), (2, 28));
    assert!(d.message.contains("`NOPE` is not set"), "{}", d.message);
}

#[test]
fn on_error_rules() {
    let d = one(
        "stages:\n  a: { source: stdin, on_error: drop }\n  o: { sink: stdout, inputs: [a] }\n",
        "bad-option",
    );
    assert!(
        d.message.contains(
            "applies to parsers, transforms and formatters (and to a source's `codec`) only"
        ),
        "{}",
        d.message
    );
    let d = one(
        "stages:\n  a: { source: stdin }\n  p: { parser: json, inputs: [a], on_error: explode }\n  o: { sink: stdout, inputs: [p] }\n",
        "bad-option",
    );
    assert!(
        d.message.contains("`drop`, `fail` or `route`"),
        "{}",
        d.message
    );
    let d = one(
        "stages:\n  a: { source: stdin }\n  p: { parser: json, inputs: [a] }\n  o: { sink: stdout, inputs: [p] }\n  e: { sink: stdout, inputs: [p.errors] }\n",
        "no-error-output",
    );
    assert_eq!(at(&d), (5, 31));
    let w = one(
        "stages:\n  a: { source: stdin }\n  p: { parser: json, inputs: [a], on_error: route }\n  o: { sink: stdout, inputs: [p] }\n",
        "unread-errors",
    );
    assert_eq!(w.severity, Severity::Warning);
}

#[test]
fn errors_are_all_reported_together() {
    let all = diags(
        "stages:\n  a: { source: stdn }\n  b: { parser: json, inputs: [zz] }\n  c: { sink: file, inputs: [b] }\n  c: { sink: stdout, inputs: [b] }\n",
    );
    let codes: Vec<&str> = all
        .iter()
        .filter(|d| d.is_error())
        .map(|d| d.code)
        .collect();
    for code in [
        "unknown-plugin",
        "unknown-input",
        "bad-option",
        "duplicate-id",
    ] {
        assert!(codes.contains(&code), "{code} missing from {codes:?}");
    }
    // Sorted by position.
    let lines: Vec<usize> = all.iter().map(|d| d.line.unwrap_or(0)).collect();
    assert!(lines.windows(2).all(|w| w[0] <= w[1]), "{lines:?}");
}

#[test]
fn structural_errors_of_the_file() {
    assert_eq!(diags("").first().map(|d| d.code), Some("empty-file"));
    assert_eq!(
        diags("- a\n- b\n").first().map(|d| d.code),
        Some("not-a-map")
    );
    assert_eq!(
        diags("settings: {}\n").first().map(|d| d.code),
        Some("no-stages")
    );
    let d = one(
        "stags: {}\nstages:\n  a: { source: stdin }\n  o: { sink: stdout, inputs: [a] }\n",
        "unknown-key",
    );
    assert!(d.message.contains("did you mean `stages`"), "{}", d.message);
    let d = one("stages:\n  a: stdin\n", "not-a-map");
    assert_eq!(d.stage.as_deref(), Some("a"));
    let d = one(
        "stages:\n  a.b: { source: stdin }\n  o: { sink: stdout, inputs: [a.b] }\n",
        "bad-id",
    );
    assert!(d.message.contains("only letters, digits"), "{}", d.message);
}

#[test]
fn duplicate_input_in_one_list() {
    let d = one(
        "stages:\n  a: { source: stdin }\n  o: { sink: stdout, inputs: [a, a] }\n",
        "duplicate-input",
    );
    assert_eq!(at(&d), (3, 34));
}

#[test]
fn stdin_can_be_read_by_one_stage_only() {
    let d = one(
        "stages:\n  a: { source: stdin }\n  b: { source: stdin }\n  o: { sink: stdout, inputs: [a, b] }\n",
        "plugin-limit",
    );
    assert_eq!((d.stage.as_deref(), at(&d)), (Some("b"), (3, 3)));
    assert!(d.message.contains("at most 1 stage(s)"), "{}", d.message);
}

#[test]
fn filter_with_an_empty_in_list_is_rejected() {
    let d = one(
        "stages:\n  a: { source: stdin }\n  j: { parser: json, inputs: [a] }\n  f: { transform: filter, inputs: [j], field: x, in: [] }\n  o: { sink: stdout, inputs: [f] }\n",
        "bad-option",
    );
    assert!(d.message.contains("option `in`"), "{}", d.message);
    assert_eq!(at(&d), (4, 50));
}

/// Mangled pipeline files (characters deleted, duplicated, replaced by YAML
/// punctuation) always give diagnostics or a pipeline, never a panic. A
/// seeded generator makes the run repeatable.
#[test]
fn mangled_files_never_panic_the_validator() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut seeds = Vec::new();
    for f in [
        "pipelines/demo.yml",
        "pipelines/reference.yml",
        "examples/errors-and-routing.yml",
        "examples/fan-out.yml",
    ] {
        seeds.push(std::fs::read_to_string(root.join(f)).unwrap());
    }
    let mut state = 0x5eed_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let junk = [
        ":", "-", "{", "}", "[", "]", ",", "&a", "*a", "!!str", "'", "\"", "\n", "  ", "$", "${X",
        "}}", "#", "|", ">", "\t", "é", "\u{0}",
    ];
    let registry = logbus::catalog::registry();
    for round in 0..3000 {
        let mut text: Vec<char> = seeds[round % seeds.len()].chars().collect();
        for _ in 0..(1 + next() % 4) {
            if text.is_empty() {
                break;
            }
            let at = (next() as usize) % text.len();
            match next() % 3 {
                0 => {
                    text.remove(at);
                }
                1 => {
                    let c = text[at];
                    text.insert(at, c);
                }
                _ => {
                    let j = junk[(next() as usize) % junk.len()];
                    for (k, c) in j.chars().enumerate() {
                        text.insert(at + k, c);
                    }
                }
            }
        }
        let text: String = text.into_iter().collect();
        let loaded = crate::support::load_with(&text, &registry);
        // Something sensible came out: a pipeline, or at least one error with a place.
        assert!(
            loaded.pipeline.is_some() || loaded.diagnostics.iter().any(|d| d.is_error()),
            "round {round}: neither a pipeline nor an error for:\n{text}"
        );
        for d in &loaded.diagnostics {
            assert!(!d.message.is_empty());
        }
    }
}

#[test]
fn local_queue_settings_are_checked_with_their_position() {
    let base = "stages:\n  a: { source: generator }\n  out:\n    sink: blackhole\n    inputs: [a]\n    queue:\n";
    let d = one(
        &format!(
            "{base}      scope: local\n      dequeue_batch: 8\n      local: {{ helper_batch: 9 }}\n"
        ),
        "bad-option",
    );
    assert_eq!(d.stage.as_deref(), Some("out"));
    assert!(
        d.message.starts_with("queue.local.helper_batch: ") && d.message.contains("= 8"),
        "{}",
        d.message
    );
    assert_eq!(d.line, Some(9));
    let d = one(
        &format!("{base}      local: {{ max_frontends: 2 }}\n"),
        "bad-option",
    );
    assert!(
        d.message.contains("only with `scope: local`"),
        "{}",
        d.message
    );
    let d = one(
        &format!("{base}      scope: local\n      local: {{ max_frontends: 65 }}\n"),
        "bad-option",
    );
    assert!(d.message.contains("max_frontends"), "{}", d.message);
    let d = one(
        &format!("{base}      scope: local\n      local: {{ frontend_size: 4, min_batch: 5 }}\n"),
        "bad-option",
    );
    assert!(d.message.contains("min_batch"), "{}", d.message);
    let d = one(
        &format!("{base}      scope: local\n      local: {{ frontends: 4 }}\n"),
        "bad-option",
    );
    assert!(d.message.contains("frontends"), "{}", d.message);
}

#[test]
fn durable_queue_settings_are_checked_with_their_position() {
    let base = "stages:\n  a: { source: generator }\n  out:\n    sink: blackhole\n    inputs: [a]\n    queue:\n";
    let ok = format!(
        "{base}      type: disk-assisted\n      path: /var/lib/logbus/queues\n      max_disk_bytes: 1GiB\n      segment_bytes: 16MiB\n      sync: interval\n      sync_interval_ms: 50\n      compression: lz4\n      when_full: drop_oldest\n      size: 1000\n      high_watermark: 800\n      low_watermark: 200\n"
    );
    let loaded = load(&ok);
    assert!(loaded.diagnostics.is_empty(), "{:#?}", loaded.diagnostics);
    let p = loaded.pipeline.unwrap();
    // Memory part + the batches the worker holds.
    assert_eq!(p.inflight_bound().events, 1000 + 1000);
    let cases: &[(&str, &str, usize)] = &[
        // (queue lines, message fragment, line)
        (
            "      path: /q\n",
            "queue.path: applies only with `type: disk`",
            7,
        ),
        ("      type: disk\n", "needs `path`", 7),
        (
            "      type: disk\n      path: /q\n      scope: local\n",
            "cannot have local scope",
            9,
        ),
        (
            "      type: disk\n      path: /q\n      max_disk_bytes: 10XB\n",
            "not a size like 64MiB",
            9,
        ),
        (
            "      type: disk\n      path: /q\n      segment_bytes: 1KiB\n",
            "between 4KiB and 1GiB",
            9,
        ),
        (
            "      type: disk\n      path: /q\n      max_disk_bytes: 64MiB\n",
            "at least two segments",
            9,
        ),
        (
            "      type: disk\n      path: /q\n      sync_interval_ms: 10\n",
            "only with `sync: interval`",
            9,
        ),
        (
            "      type: disk\n      path: /q\n      high_watermark: 10\n",
            "only with `type: disk-assisted`",
            9,
        ),
        (
            "      type: disk-assisted\n      path: /q\n      high_watermark: 10\n      low_watermark: 10\n",
            "below `high_watermark`",
            10,
        ),
        (
            "      type: disk\n      path: /q\n      sync: always\n",
            "sync",
            9,
        ),
        ("      type: tape\n", "type", 7),
    ];
    for (lines, fragment, line) in cases {
        let d = one(&format!("{base}{lines}"), "bad-option");
        assert_eq!(d.stage.as_deref(), Some("out"), "{lines}");
        assert!(d.message.contains(fragment), "{lines}: {}", d.message);
        assert_eq!(d.line, Some(*line), "{lines}: {}", d.message);
    }
}

/// An error inside a condition is reported where it is in the file: the
/// option's position plus the offset, past the quote of a quoted scalar,
/// on its own line in a block scalar; the message carries a caret.
#[test]
fn a_condition_error_points_inside_the_condition() {
    let plain = "\
stages:
  read: { source: stdin }
  json: { parser: json, inputs: [read] }
  keep:
    transform: filter
    inputs: [json]
    condition: level == && ok
  out: { sink: stdout, inputs: [keep] }
";
    let d = one(plain, "bad-option");
    assert_eq!(at(&d), (7, 25), "{d:?}");
    assert_eq!(
        d.message,
        "option `condition`: expected a field, a value, a function or `(`, found `&&` (at column 10 of the condition)\n    level == && ok\n             ^"
    );
    let quoted = plain.replace(
        "condition: level == && ok",
        r#"condition: 'lowr(level) == "x"'"#,
    );
    let d = one(&quoted, "bad-option");
    assert_eq!(at(&d), (7, 17), "{d:?}");
    assert!(d.message.contains("did you mean `lower`?"), "{}", d.message);
    let block = plain.replace(
        "condition: level == && ok",
        "condition: |\n      level != \"debug\" &&\n        status > true",
    );
    let d = one(&block, "bad-option");
    assert_eq!(at(&d), (9, 18), "{d:?}");
    assert!(
        d.message.contains(
            "(at line 2, column 12 of the condition)\n      status > true\n               ^"
        ),
        "{}",
        d.message
    );
}

/// A declared range is checked for every plugin by the plugin API, and
/// the message names the option.
#[test]
fn an_option_out_of_its_declared_range_is_named() {
    let d = one(
        "stages:\n  in: { source: otlp, grpc_address: \"127.0.0.1:4317\", max_concurrent_requests: 0 }\n  out: { sink: stdout, inputs: [in] }\n",
        "bad-option",
    );
    assert_eq!(
        d.message,
        "option `max_concurrent_requests`: must be between 1 and 4096, got 0"
    );
    assert_eq!(at(&d), (2, 55));
}

/// A lookup table file that is not there is named by validation, at the
/// option (the file is read relative to the pipeline's folder).
#[test]
fn a_missing_lookup_file_is_named() {
    let d = one(
        "stages:\n  a: { source: stdin }\n  j: { parser: json, inputs: [a] }\n  f:\n    transform: fields\n    inputs: [j]\n    lookup: { sev: { from: level, file: no-such-table.csv } }\n  o: { sink: stdout, inputs: [f] }\n",
        "bad-option",
    );
    assert!(
        d.message.starts_with("option `lookup.sev.file`: reading ")
            && d.message.contains("no-such-table.csv"),
        "{}",
        d.message
    );
    assert_eq!(d.line, Some(7));
}

/// A sink naming documents by source position, fed one tailed file two
/// ways (a route's two outputs): refused at the option, naming the source;
/// fed one way, accepted.
#[test]
fn position_ids_need_each_source_to_arrive_one_way() {
    let two_ways = "\
stages:
  logs: { source: tail, paths: [a.log], state_dir: state }
  json: { parser: json, inputs: [logs] }
  split: { transform: route, inputs: [json], routes: { slow: 'ms > 100' } }
  ship:
    sink: opensearch
    inputs: [split.slow, split._unmatched]
    endpoints: ['http://127.0.0.1:9200']
    index: logs
    id_from_position: true
";
    let d = one(two_ways, "position-names-twice");
    assert_eq!(d.severity, Severity::Error);
    assert_eq!(d.stage.as_deref(), Some("ship"));
    assert_eq!(at(&d), (10, 5), "at `id_from_position`");
    assert!(d.message.contains("`logs` (2 ways)"), "{}", d.message);
    let one_way = two_ways.replace("[split.slow, split._unmatched]", "[split.slow]");
    assert!(
        diags(&one_way)
            .iter()
            .all(|d| d.code != "position-names-twice"),
        "{:#?}",
        diags(&one_way)
    );
}
