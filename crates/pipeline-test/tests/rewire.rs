//! How `logbus test` rewires a pipeline around one test: what it refuses
//! (naming the stage), what it runs instead of the pipeline's own sources,
//! sinks and durable queues, and that a failed expectation fails.

use std::path::Path;

use logbus_core::{Pipeline, load_str};
use logbus_pipeline_test::{parse_tests, run_test};
use logbus_plugin_api::Registry;

fn pipeline(text: &str, dir: &Path) -> Pipeline {
    let mut registry = Registry::new();
    logbus_io::register(&mut registry);
    logbus_text::register(&mut registry);
    let loaded = load_str(text, &dir.join("p.yml"), &registry, &|_| None);
    loaded
        .pipeline
        .unwrap_or_else(|| panic!("{:#?}", loaded.diagnostics))
}

/// `list` (a YAML list of tests) as a test file.
fn test_file(list: &str) -> String {
    let indented: Vec<String> = list.lines().map(|l| format!("  {l}")).collect();
    format!("tests:\n{}\n", indented.join("\n"))
}

/// The failure of each test in `tests` (a YAML list), `None` where it
/// passed.
async fn outcomes(text: &str, tests: &str) -> Vec<Option<String>> {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(text, dir.path());
    let mut out = Vec::new();
    let tests = parse_tests(&test_file(tests), Path::new("p.test.yml")).unwrap();
    assert!(!tests.is_empty());
    for test in tests {
        out.push(run_test(&p, &test).await.failure);
    }
    out
}

const PIPELINE: &str = "stages:
  gen: { source: generator, count: 1000000 }
  json: { parser: json, inputs: [gen], on_error: route }
  out: { sink: blackhole, inputs: [json] }
  bad: { sink: blackhole, inputs: [json.errors] }
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_test_cannot_name_is_refused_with_the_stage() {
    let got = outcomes(
        PIPELINE,
        "- name: into a sink
  input: { stage: out, lines: ['{}'] }
  output: json
- name: from a sink
  input: { stage: json, lines: ['{}'] }
  output: out
- name: nowhere
  input: { stage: nowhere, lines: ['{}'] }
  output: json
- name: no such output
  input: { stage: json, lines: ['{}'] }
  output: missing
",
    )
    .await;
    assert_eq!(
        got,
        [
            Some("input stage `out` is a sink; inject into a stage that produces output".into()),
            Some("output `out` is a sink, which has no output; collect from its input instead (json)".into()),
            Some("input stage `nowhere` is not in the pipeline".into()),
            Some("output `missing` names no stage".into()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_upstream_of_the_input_is_not_downstream() {
    let text = "stages:
  gen: { source: generator, count: 1 }
  a: { parser: json, inputs: [gen] }
  b: { formatter: json, inputs: [a] }
  out: { sink: blackhole, inputs: [b] }
";
    let got = outcomes(
        text,
        "- name: backwards
  input: { stage: b, lines: ['{}'] }
  output: a
",
    )
    .await;
    assert_eq!(
        got,
        [Some(
            "output `a` is not downstream of input stage `b`".into()
        )]
    );
}

/// The pipeline's source (a million events) does not run, the events a
/// test injects do, errors route to `<id>.errors`, and an expectation
/// that does not hold fails the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_injected_events_run_and_expectations_are_checked() {
    let got = outcomes(
        PIPELINE,
        r#"- name: parsed
  input: { stage: json, lines: ['{"a":1}', '{"a":2}'] }
  output: json
  expect: { events: [{ a: 1 }, { a: 2 }] }
- name: into the source
  input: { stage: gen, lines: ['{"a":3}'] }
  output: json
  expect: { events: [{ a: 3 }] }
- name: routed errors
  input: { stage: json, lines: ['not json', '{"a":4}'] }
  output: json.errors
  expect: { count: 1 }
- name: wrong
  input: { stage: json, lines: ['{"a":1}'] }
  output: json
  expect: { events: [{ a: 2 }] }
"#,
    )
    .await;
    assert_eq!(got[..3], [None, None, None], "{got:#?}");
    let wrong = got[3].as_deref().expect("a wrong expectation fails");
    assert!(
        wrong.starts_with("events differ (1 expected, 1 actual)"),
        "{wrong}"
    );
}

/// A durable queue's directory is never touched by a test: the stage runs
/// on a memory queue of the same size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_queue_becomes_a_memory_queue() {
    let dir = tempfile::tempdir().unwrap();
    let queue_dir = dir.path().join("q");
    let text = format!(
        "stages:
  gen: {{ source: generator, count: 1 }}
  json: {{ parser: json, inputs: [gen], queue: {{ type: disk, path: {:?} }} }}
  out: {{ sink: blackhole, inputs: [json] }}
",
        queue_dir.display().to_string()
    );
    let p = pipeline(&text, dir.path());
    let tests = parse_tests(
        &test_file(
            "- name: through a disk queue
  input: { stage: json, lines: ['{\"a\":1}'] }
  output: json
  expect: { count: 1 }",
        ),
        Path::new("p.test.yml"),
    )
    .unwrap();
    let outcome = run_test(&p, &tests[0]).await;
    assert_eq!(outcome.failure, None);
    assert!(
        !queue_dir.exists(),
        "the test created the queue's directory"
    );
}

/// A test file must hold `tests:`; a bare list (a likely slip) is an
/// error, not a file with no tests.
#[test]
fn a_test_file_without_a_tests_key_is_an_error() {
    let errors = parse_tests(
        "- name: t\n  input: { stage: json, lines: ['{}'] }\n  output: json\n",
        Path::new("p.test.yml"),
    )
    .unwrap_err();
    assert_eq!(errors.len(), 1);
    assert_eq!(
        errors[0].message,
        "a test file is a mapping with `tests:`, a list of tests; this one is a list"
    );
    assert!(
        parse_tests("stages: {}\n", Path::new("p.yml"))
            .unwrap()
            .is_empty()
    );
}

/// A pipeline's tests are its own `tests:` and then its companion file's;
/// a missing companion is no error, a missing pipeline is.
#[test]
fn tests_come_from_the_pipeline_then_its_companion_file() {
    use logbus_pipeline_test::{companion, load_tests};
    let dir = tempfile::tempdir().unwrap();
    let yml = dir.path().join("shop.yml");
    assert_eq!(companion(&yml), dir.path().join("shop.test.yml"));
    let test = |name: &str| {
        format!(
            "tests:\n  - {{ name: {name}, input: {{ stage: json, lines: ['{{}}'] }}, output: json }}\n"
        )
    };
    std::fs::write(&yml, test("inline")).unwrap();
    let names = |tests: Vec<logbus_pipeline_test::TestCase>| {
        tests.into_iter().map(|t| t.name).collect::<Vec<_>>()
    };
    assert_eq!(names(load_tests(&yml).unwrap()), ["inline"]);
    std::fs::write(companion(&yml), test("beside")).unwrap();
    assert_eq!(names(load_tests(&yml).unwrap()), ["inline", "beside"]);
    let missing = load_tests(&dir.path().join("gone.yml")).unwrap_err();
    assert_eq!(missing.len(), 1);
    assert!(
        missing[0].message.starts_with("cannot read: "),
        "{missing:?}"
    );
    assert!(missing[0].to_string().contains("gone.yml"), "{missing:?}");
}

/// The JUnit report: one suite per file, a failure with its first line as
/// the message and the whole text as the description.
#[test]
fn the_junit_report_names_each_suite_case_and_failure() {
    use logbus_pipeline_test::{Outcome, junit};
    let outcome = |name: &str, failure: Option<&str>| Outcome {
        name: name.into(),
        failure: failure.map(Into::into),
        duration: std::time::Duration::from_millis(1500),
    };
    let xml = junit::report(&[(
        "shop.yml".into(),
        vec![
            outcome("parses", None),
            outcome("routes", Some("events differ\n- a\n+ b")),
        ],
    )]);
    assert!(
        xml.contains("<testsuite name=\"shop.yml\" tests=\"2\""),
        "{xml}"
    );
    assert!(
        xml.contains("<testcase name=\"parses\" time=\"1.500\"/>"),
        "{xml}"
    );
    assert!(xml.contains("<failure message=\"events differ\""), "{xml}");
    assert!(xml.contains("- a\n+ b"), "{xml}");
}

/// A sink's attached formatter is a stage of its own (`out.format`, an id
/// with a dot): a test feeds it and collects what it makes, though the
/// sink it belongs to does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_formatter_is_tested_on_its_own() {
    let got = outcomes(
        "stages:
  gen: { source: generator, count: 1 }
  parse: { parser: json, inputs: [gen] }
  out: { sink: blackhole, inputs: [parse], format: json }
",
        r#"- name: formats
  input: { stage: out.format, events: [{ a: 1 }] }
  output: out.format
  expect: { events: ['{"a":1}'] }
"#,
    )
    .await;
    assert_eq!(got, [None]);
}
