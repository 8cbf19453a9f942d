//! Validation follows the data: the corpus of broken pipelines is caught,
//! each with its code at its line, and nothing the project ships draws a
//! flow finding (no false alarms).

use std::path::{Path, PathBuf};

use logbus_core::load_file;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The flow codes (docs/validation.md).
const FLOW_CODES: [&str; 6] = [
    "needs-fields",
    "needs-raw",
    "field-not-produced",
    "field-compared-to-unknown",
    "type-mismatch",
    "field-set-unused",
];

/// `# expect: code line, code line` on the first line of a corpus file.
fn expectations(text: &str) -> Vec<(String, usize)> {
    let first = text.lines().next().unwrap_or_default();
    let list = first
        .strip_prefix("# expect: ")
        .unwrap_or_else(|| panic!("no `# expect:` line: {first}"));
    list.split(',')
        .map(|e| {
            let (code, line) = e.trim().split_once(' ').expect("code line");
            (code.to_string(), line.parse().expect("a line number"))
        })
        .collect()
}

#[test]
fn every_broken_pipeline_of_the_corpus_is_caught_at_its_line() {
    let registry = logbus::catalog::registry();
    let dir = repo().join("crates/logbus/tests/flow-corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml"))
        .collect();
    files.sort();
    assert!(files.len() >= 40, "the corpus has {} files", files.len());
    let mut flow_codes_seen = std::collections::BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let expected = expectations(&text);
        let loaded = load_file(file, &registry).unwrap();
        let found: Vec<(String, usize)> = loaded
            .diagnostics
            .iter()
            .map(|d| (d.code.to_string(), d.line.unwrap_or(0)))
            .collect();
        assert_eq!(
            found,
            expected,
            "{}: {:#?}",
            file.display(),
            loaded.diagnostics
        );
        flow_codes_seen.extend(expected.into_iter().map(|(c, _)| c));
    }
    for code in FLOW_CODES {
        assert!(flow_codes_seen.contains(code), "no corpus case for {code}");
    }
}

/// Every pipeline and example the project ships, with the features CI
/// builds: no flow finding at all, strict ones included for the pipelines
/// that declare what they parse.
#[test]
fn nothing_the_project_ships_draws_a_flow_finding() {
    let registry = logbus::catalog::registry();
    let mut checked = 0;
    for dir in ["pipelines", "examples", "xtask/pipelines"] {
        let mut stack = vec![repo().join(dir)];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let name = path.file_name().unwrap().to_string_lossy().to_string();
                if !name.ends_with(".yml") || name.ends_with(".test.yml") {
                    continue;
                }
                let loaded = load_file(&path, &registry).unwrap();
                let flow: Vec<String> = loaded
                    .diagnostics
                    .iter()
                    .filter(|d| FLOW_CODES.contains(&d.code))
                    .map(|d| d.display(&path.display().to_string()).to_string())
                    .collect();
                assert!(flow.is_empty(), "{flow:#?}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 30, "only {checked} pipelines found");
}

/// The analysis never calls a field missing that a run delivers: each
/// pipeline here is run on generated events, and every field the file
/// sink received must be one validation knew could arrive there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_a_run_delivers_are_fields_validation_knew() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.ndjson");
    // (pipeline, the output the formatter reads)
    let cases = [
        // A closed set: regex captures, renamed, converted, set, copied,
        // deleted, stamped.
        (
            r#"
stages:
  gen: { source: generator, count: 50, template: 'GET /a 200 12' }
  re: { parser: regex, inputs: [gen], pattern: '^(?P<method>\S+) (?P<path>\S+) (?P<status>\d+) (?P<ms>\d+)$' }
  tidy:
    transform: fields
    inputs: [re]
    rename: { ms: took_ms }
    convert: { status: integer }
    set: { summary: '{{method}} {{path}}', env: prod }
    copy: { path: route }
    delete: [method]
  time: { transform: stamp, inputs: [tidy], field: at }
  fmt: { formatter: json, inputs: [time] }
  out: { sink: file, inputs: [fmt], path: OUT }
"#,
            "time",
        ),
        // Syslog fields through a route.
        (
            r#"
stages:
  gen: { source: generator, count: 20, template: '<13>1 2026-12-07T00:00:00Z host app 42 ID1 - hello {{seq}}' }
  sys: { parser: syslog, inputs: [gen] }
  split: { transform: route, inputs: [sys], routes: { user: 'facility == 1' } }
  fmt: { formatter: json, inputs: [split.user] }
  out: { sink: file, inputs: [fmt], path: OUT }
"#,
            "split.user",
        ),
        // Failed events on `<id>.errors`: the raw line as `message`.
        (
            r#"
stages:
  gen: { source: generator, count: 5, template: 'not json {{seq}}' }
  parse: { parser: regex, inputs: [gen], pattern: '^(?P<n>\d+)$', on_error: route }
  fmt: { formatter: json, inputs: [parse.errors] }
  out: { sink: file, inputs: [fmt], path: OUT }
  rest: { sink: blackhole, inputs: [parse] }
"#,
            "parse.errors",
        ),
    ];
    let registry = logbus::catalog::registry();
    for (case, feeding) in cases {
        let text = case.replace("OUT", &out.display().to_string());
        let loaded = logbus_core::load_str_with(
            &text,
            &dir.path().join("p.yml"),
            &registry,
            &|_| None,
            logbus_core::LoadOptions {
                record_fields: true,
                connect: false,
            },
        );
        assert!(!loaded.has_errors(), "{:#?}", loaded.diagnostics);
        let known = loaded
            .fields
            .iter()
            .find(|(name, _)| name == feeding)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| panic!("no shape for {feeding}: {:?}", loaded.fields));
        assert!(known.parsed && known.open_after.is_none(), "{known:#?}");
        let pipeline = loaded.pipeline.unwrap();
        let report = logbus_core::start(&pipeline, logbus_plugin_api::CancellationToken::new())
            .unwrap()
            .wait()
            .await;
        assert!(report.is_clean(), "{report}");
        let written = std::fs::read_to_string(&out).unwrap();
        assert!(!written.is_empty(), "the run wrote nothing");
        for line in written.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let mut paths = Vec::new();
            leaf_paths(&v, String::new(), &mut paths);
            for path in paths {
                assert!(
                    known.fields.contains_key(&path),
                    "`{path}` was delivered but validation did not know it could be: {known:#?}"
                );
            }
        }
        std::fs::remove_file(&out).unwrap();
    }
}

/// A random linear pipeline: regex captures, then field operations,
/// stamps, filters and routes that each touch a field there is, into a
/// JSON file. Returns the text (`OUT` for the file) and the output the
/// formatter reads.
fn generated_pipeline(rng: &mut fastrand::Rng) -> (String, String) {
    const NAMES: [&str; 8] = ["host", "path", "status", "user", "ms", "env", "zone", "tag"];
    let groups = rng.usize(1..=4);
    let mut fields: Vec<String> = NAMES[..groups].iter().map(|s| s.to_string()).collect();
    let pattern: Vec<String> = fields.iter().map(|f| format!("(?P<{f}>\\S+)")).collect();
    let template: Vec<String> = (0..groups).map(|i| format!("v{i}-{{{{seq}}}}")).collect();
    let mut text = format!(
        "stages:\n  gen: {{ source: generator, count: 5, template: '{}' }}\n  s0: {{ parser: regex, inputs: [gen], pattern: '^{}$' }}\n",
        template.join(" "),
        pattern.join(" ")
    );
    let mut last = "s0".to_string();
    let fresh = |fields: &[String], rng: &mut fastrand::Rng| loop {
        let name = format!("{}{}", NAMES[rng.usize(..NAMES.len())], rng.u8(..4));
        if !fields.contains(&name) {
            return name;
        }
    };
    for step in 1..=rng.usize(1..=8) {
        let id = format!("s{step}");
        let pick = fields[rng.usize(..fields.len())].clone();
        let body = match rng.u8(..8) {
            0 => {
                let to = fresh(&fields, rng);
                fields.retain(|f| *f != pick);
                fields.push(to.clone());
                format!("transform: fields, rename: {{ {pick}: {to} }}")
            }
            1 => {
                let to = fresh(&fields, rng);
                fields.push(to.clone());
                format!("transform: fields, copy: {{ {pick}: {to} }}")
            }
            2 => {
                let to = fresh(&fields, rng);
                fields.push(to.clone());
                format!("transform: fields, set: {{ {to}: 'x-{{{{{pick}}}}}' }}")
            }
            3 if fields.len() > 1 => {
                fields.retain(|f| *f != pick);
                format!("transform: fields, delete: [{pick}]")
            }
            4 => format!("transform: fields, convert: {{ {pick}: string }}"),
            5 => {
                let to = fresh(&fields, rng);
                fields.push(to.clone());
                format!("transform: stamp, field: {to}")
            }
            6 => format!("transform: filter, condition: '{pick} != \"never\"'"),
            _ => {
                text.push_str(&format!(
                    "  {id}: {{ transform: route, inputs: [{last}], routes: {{ kept: '{pick} != \"never\"' }} }}\n"
                ));
                last = format!("{id}.kept");
                continue;
            }
        };
        text.push_str(&format!("  {id}: {{ {body}, inputs: [{last}] }}\n"));
        last = id;
    }
    text.push_str(&format!(
        "  fmt: {{ formatter: json, inputs: [{last}] }}\n  out: {{ sink: file, inputs: [fmt], path: OUT }}\n"
    ));
    (text, last)
}

/// The same property on generated pipelines, and its converse for a
/// straight line without branches: the fields validation knows at the
/// formatter are exactly those every delivered event has, and the
/// pipeline draws no finding but `field-set-unused`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_pipelines_deliver_exactly_the_fields_validation_knew() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.ndjson");
    let registry = logbus::catalog::registry();
    for seed in 0..200u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (text, feeding) = generated_pipeline(&mut rng);
        let text = text.replace("OUT", &out.display().to_string());
        let loaded = logbus_core::load_str_with(
            &text,
            &dir.path().join("p.yml"),
            &registry,
            &|_| None,
            logbus_core::LoadOptions {
                record_fields: true,
                connect: false,
            },
        );
        // A field set and deleted unread is rightly reported; nothing else.
        let findings: Vec<_> = loaded
            .diagnostics
            .iter()
            .filter(|d| d.code != "field-set-unused")
            .collect();
        assert!(findings.is_empty(), "seed {seed}:\n{text}\n{findings:#?}");
        let known = loaded
            .fields
            .iter()
            .find(|(name, _)| *name == feeding)
            .map(|(_, s)| s.clone())
            .unwrap();
        assert!(known.open_after.is_none(), "seed {seed}: {known:#?}");
        let pipeline = loaded.pipeline.unwrap();
        let report = logbus_core::start(&pipeline, logbus_plugin_api::CancellationToken::new())
            .unwrap()
            .wait()
            .await;
        assert!(report.is_clean(), "seed {seed}: {report}\n{text}");
        let written = std::fs::read_to_string(&out).unwrap();
        assert_eq!(written.lines().count(), 5, "seed {seed}:\n{text}");
        let want: std::collections::BTreeSet<&String> = known.fields.keys().collect();
        for line in written.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let mut paths = Vec::new();
            leaf_paths(&v, String::new(), &mut paths);
            let got: std::collections::BTreeSet<&String> = paths.iter().collect();
            assert_eq!(got, want, "seed {seed}:\n{text}");
        }
        std::fs::remove_file(&out).unwrap();
    }
}

/// Every top-level field, and the fields inside `_error`.
fn leaf_paths(v: &serde_json::Value, prefix: String, out: &mut Vec<String>) {
    for (k, child) in v.as_object().into_iter().flatten() {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if k == "_error" {
            leaf_paths(child, path.clone(), out);
        }
        out.push(path);
    }
}

/// The codes `validate --connect` can print: what the plugins' probes
/// pass to `ServiceFinding::error`/`warning`, a literal or a constant
/// (`connect::MISSING`, a plugin's own `COLUMN_MISMATCH`).
fn connect_codes() -> std::collections::BTreeSet<String> {
    let mut files = vec![repo().join("crates/plugin-api/src/connect.rs")];
    let mut stack = vec![repo().join("plugins")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let texts: Vec<String> = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    // `const NAME: &str = "code";`, wherever declared.
    let mut consts = std::collections::HashMap::new();
    for text in &texts {
        for line in text.lines() {
            let line = line.trim_start().trim_start_matches("pub ");
            if let Some(rest) = line.strip_prefix("const ")
                && let Some((name, value)) = rest.split_once(": &str = \"")
            {
                consts.insert(name.to_string(), value.trim_end_matches("\";").to_string());
            }
        }
    }
    let mut codes = std::collections::BTreeSet::new();
    for text in &texts {
        for opener in ["ServiceFinding::error(", "ServiceFinding::warning("] {
            for (at, _) in text.match_indices(opener) {
                let rest = text[at + opener.len()..].trim_start();
                let arg = &rest[..rest.find(',').unwrap_or(0)];
                let code = match arg.strip_prefix('"') {
                    Some(quoted) => quoted.trim_end_matches('"').to_string(),
                    // A variable: the constructor passing its argument on.
                    None if arg.chars().all(|c| c.is_ascii_lowercase() || c == '_') => continue,
                    None => {
                        let name = arg.rsplit("::").next().unwrap();
                        consts
                            .get(name)
                            .unwrap_or_else(|| panic!("the code `{arg}` is no known constant"))
                            .clone()
                    }
                };
                codes.insert(code);
            }
        }
    }
    codes
}

/// Every code validation can print is in docs/validation.md's table.
#[test]
fn every_diagnostic_code_is_documented() {
    let doc = std::fs::read_to_string(repo().join("docs/validation.md")).unwrap();
    let mut codes = std::collections::BTreeSet::new();
    let mut stack = vec![repo().join("crates/core/src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy();
            if name == "tests.rs" || name == "diagnostic.rs" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for opener in ["Diagnostic::error(", "Diagnostic::warning("] {
                for (at, _) in text.match_indices(opener) {
                    let rest = text[at + opener.len()..].trim_start();
                    if let Some(quoted) = rest.strip_prefix('"') {
                        codes.insert(quoted[..quoted.find('"').unwrap()].to_string());
                    }
                }
            }
        }
    }
    assert!(codes.len() > 30, "{codes:?}");
    let probe_codes = connect_codes();
    assert!(probe_codes.len() >= 7, "{probe_codes:?}");
    codes.extend(probe_codes);
    let missing: Vec<&String> = codes
        .iter()
        .filter(|c| !doc.contains(&format!("`{c}`")))
        .collect();
    assert!(missing.is_empty(), "not in docs/validation.md: {missing:?}");
}

use crate::support::logbus;

/// A directory of pipelines in each output format, with one exit code for
/// the lot; `--fields` and `--strict-fields`.
#[test]
fn validate_takes_directories_and_speaks_text_json_and_github() {
    let dir = tempfile::tempdir().unwrap();
    let good = "stages:\n  read: { source: stdin }\n  parse: { parser: json, inputs: [read] }\n  keep: { transform: filter, inputs: [parse], condition: 'level == \"error\"' }\n  out: { sink: stdout, inputs: [keep] }\n";
    let warned = good.replace("\"error\"", "error");
    let broken = "stages:\n  read: { source: stdin }\n  keep: { transform: filter, inputs: [read], condition: 'x == 1' }\n  out: { sink: stdout, inputs: [keep] }\n";
    std::fs::write(dir.path().join("a.yml"), good).unwrap();
    std::fs::write(dir.path().join("a.test.yml"), "tests: []\n").unwrap();
    std::fs::write(dir.path().join("b.yml"), &warned).unwrap();

    let o = logbus().arg("validate").arg(dir.path()).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(
        text.contains("a.yml: valid") && text.contains("b.yml: valid"),
        "{text}"
    );
    assert!(
        text.contains("b.yml:4:68: warning[field-compared-to-unknown]"),
        "{text}"
    );
    assert!(!text.contains("a.test.yml"), "{text}");

    let o = logbus()
        .args(["validate", "--deny-warnings", "--format", "github"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with("::error file=")
            && text.contains(",line=4,col=68,title=field-compared-to-unknown::stage `keep`: "),
        "{text}"
    );

    std::fs::write(dir.path().join("c.yml"), broken).unwrap();
    let o = logbus()
        .args(["validate", "--format", "json"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let files = v.as_array().expect("a list for several files");
    assert_eq!(files.len(), 3);
    assert_eq!(files[2]["valid"], false);
    assert_eq!(files[2]["diagnostics"][0]["code"], "needs-fields");
    assert_eq!(files[2]["diagnostics"][0]["line"], 3);

    // One file: one object, with the fields when asked.
    let o = logbus()
        .args(["validate", "--format", "json", "--fields"])
        .arg(dir.path().join("a.yml"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["fields"]["read"]["raw"], true);
    assert_eq!(v["fields"]["parse"]["open_after"], "parse");

    // Text `--fields`, and the strict mode naming the open stage.
    let o = logbus()
        .args(["validate", "--fields", "--strict-fields"])
        .arg(dir.path().join("a.yml"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(text.contains("fields at `read`: raw events"), "{text}");
    assert!(
        text.contains("fields at `parse`: parsed events; other fields possible after `parse`"),
        "{text}"
    );
    assert!(text.contains("warning[field-undeclared]"), "{text}");
    assert!(text.contains("`parse` leaves its fields open"), "{text}");

    // Unreadable wins over invalid.
    let o = logbus()
        .arg("validate")
        .arg(dir.path())
        .arg(dir.path().join("missing.yml"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

/// `run --fail-on-errored`: a smoke run whose every event errored fails.
#[test]
fn a_smoke_run_where_every_event_errored_fails_with_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yml");
    std::fs::write(
        &p,
        "stages:\n  gen: { source: generator, count: 3, template: 'not json' }\n  parse: { parser: json, inputs: [gen] }\n  out: { sink: blackhole, inputs: [parse] }\n",
    )
    .unwrap();
    let o = logbus().arg("run").arg(&p).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = logbus()
        .args(["run", "--fail-on-errored"])
        .arg(&p)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("3 event(s) errored, 0 of 3 committed"),
        "{err}"
    );
}
