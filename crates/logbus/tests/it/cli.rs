//! The `logbus` command as a user runs it: exit codes, report formats,
//! stdin/file end to end, and SIGTERM in the middle of a large input.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::logbus;

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const VALID: &str = "stages:\n  read: { source: stdin }\n  json: { parser: json, inputs: [read] }\n  out: { sink: stdout, inputs: [json] }\n";

#[test]
fn validate_exit_codes_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let ok = write(dir.path(), "ok.yml", VALID);
    let o = logbus().arg("validate").arg(&ok).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        stdout(&o).contains("valid: 3 stages; worst-case in-flight: 8192 events"),
        "{}",
        stdout(&o)
    );

    let bad = write(
        dir.path(),
        "bad.yml",
        "stages:\n  read: { source: stdin }\n  out: { sink: stdout, inputs: [raed] }\n",
    );
    let o = logbus().arg("validate").arg(&bad).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let text = stdout(&o);
    assert!(text.contains("bad.yml:3:33: error[unknown-input]: stage `out`: input `raed` names no stage; did you mean `read`?"), "{text}");

    let o = logbus()
        .arg("validate")
        .arg(dir.path().join("missing.yml"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot read pipeline file"));
}

#[test]
fn deny_warnings_and_json_format() {
    let dir = tempfile::tempdir().unwrap();
    let warn = write(
        dir.path(),
        "warn.yml",
        "stages:\n  read: { source: stdin }\n  dead: { parser: json, inputs: [read] }\n  out: { sink: stdout, inputs: [read] }\n",
    );
    let o = logbus().arg("validate").arg(&warn).output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("warning[no-sink]: stage `dead`"));
    let o = logbus()
        .args(["validate", "--deny-warnings"])
        .arg(&warn)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));

    let o = logbus()
        .args(["validate", "--format", "json"])
        .arg(&warn)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["warnings"], 1);
    assert_eq!(v["diagnostics"][0]["code"], "no-sink");
    assert_eq!(v["diagnostics"][0]["line"], 3);
    assert_eq!(v["inflight_bound"]["events"], 2 * 4096);
}

#[test]
fn run_refuses_an_invalid_file_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.log");
    let p = write(
        dir.path(),
        "p.yml",
        &format!(
            "stages:\n  gen: {{ source: generator, count: 10 }}\n  out: {{ sink: file, inputs: [gen], path: {} }}\n  x: {{ sink: nope, inputs: [gen] }}\n",
            out.display()
        ),
    );
    let o = logbus().arg("run").arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unknown sink plugin `nope`"), "{err}");
    assert!(err.contains("nothing was started"), "{err}");
    assert!(!out.exists(), "a sink was started for an invalid pipeline");
}

#[test]
fn file_to_file_end_to_end_with_stats_json() {
    let dir = tempfile::tempdir().unwrap();
    let input: String = (0..5000)
        .map(|i| {
            format!(
                "{{\"seq\":{i},\"level\":\"{}\"}}\n",
                if i % 5 == 0 { "debug" } else { "info" }
            )
        })
        .collect();
    write(dir.path(), "in.ndjson", &format!("{input}garbage\n"));
    let p = write(
        dir.path(),
        "p.yml",
        "stages:
  read: { source: file, path: in.ndjson }
  json: { parser: json, inputs: [read], on_error: route }
  keep: { transform: filter, inputs: [json], field: level, not_equals: debug }
  fmt: { formatter: json, inputs: [keep] }
  out: { sink: file, inputs: [fmt], path: out.ndjson, append: false }
  bad: { sink: file, inputs: [json.errors], path: bad.ndjson, append: false }
",
    );
    let stats = dir.path().join("stats.json");
    let o = logbus()
        .arg("run")
        .arg(&p)
        .arg("--stats-json")
        .arg(&stats)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("emitted=5001 committed=4001 discarded=1000 errored=0 created=0 lost=0"),
        "{err}"
    );
    let out = std::fs::read_to_string(dir.path().join("out.ndjson")).unwrap();
    assert_eq!(out.lines().count(), 4000);
    assert!(out.lines().all(|l| l.contains("\"info\"")));
    let bad = std::fs::read_to_string(dir.path().join("bad.ndjson")).unwrap();
    let bad: Value = serde_json::from_str(bad.trim()).unwrap();
    assert_eq!(bad["message"], "garbage");
    assert_eq!(bad["_error"]["stage"], "json");
    let v: Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(v["totals"]["emitted"], 5001);
    assert_eq!(v["totals"]["committed"], 4001);
    assert_eq!(v["totals"]["lost"], 0);
    assert_eq!(v["stages"][1]["routed"], 1);
}

#[test]
fn sigterm_mid_input_loses_no_event_the_source_read() {
    let dir = tempfile::tempdir().unwrap();
    let n = 2_000_000u64;
    let input_path = dir.path().join("in.ndjson");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&input_path).unwrap());
        for i in 0..n {
            writeln!(
                f,
                "{{\"seq\":{i},\"msg\":\"some text to make the line longer than a few bytes\"}}"
            )
            .unwrap();
        }
    }
    let out_path = dir.path().join("out.ndjson");
    let p = write(
        dir.path(),
        "p.yml",
        "settings: { channel_capacity: 1024 }\nstages:
  read: { source: stdin }
  json: { parser: json, inputs: [read] }
  fmt: { formatter: json, inputs: [json] }
  out: { sink: file, inputs: [fmt], path: out.ndjson }
",
    );
    let stats = dir.path().join("stats.json");
    let child = logbus()
        .arg("run")
        .arg(&p)
        .arg("--stats-json")
        .arg(&stats)
        .stdin(std::fs::File::open(&input_path).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until output is flowing, then ask for a graceful stop.
    let start = Instant::now();
    while std::fs::metadata(&out_path).map(|m| m.len()).unwrap_or(0) < 100_000 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no output appeared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let emitted = v["totals"]["emitted"].as_u64().unwrap();
    let committed = v["totals"]["committed"].as_u64().unwrap();
    let errored = v["totals"]["errored"].as_u64().unwrap();
    assert_eq!(v["totals"]["lost"], 0);
    // A line cut by the stop is still emitted; it fails to parse and is counted.
    assert!(errored <= 1, "{v}");
    assert_eq!(emitted, committed + errored);
    assert!(
        emitted < n,
        "the whole input was read before the signal; the test proved nothing"
    );
    // Every event read is in the output, intact and in order: a prefix of the input.
    let out = std::fs::read_to_string(&out_path).unwrap();
    let mut count = 0u64;
    for (i, line) in out.lines().enumerate() {
        let e: Value = serde_json::from_str(line).unwrap();
        assert_eq!(e["seq"].as_u64(), Some(i as u64));
        count += 1;
    }
    assert_eq!(count, committed);
}

#[test]
fn graph_plugins_and_version() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "p.yml", VALID);
    let o = logbus()
        .args(["graph", "--format", "dot"])
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(
        stdout(&o),
        concat!(
            "digraph logbus {\n",
            "  rankdir=LR;\n",
            "  node [fontname=\"monospace\"];\n",
            "  \"read\" [shape=invhouse, label=\"read\\nsource stdin\"];\n",
            "  \"json\" [shape=box, label=\"json\\nparser json\"];\n",
            "  \"out\" [shape=house, label=\"out\\nsink stdout\"];\n",
            "  \"read\" -> \"json\";\n",
            "  \"json\" -> \"out\";\n",
            "}\n",
        )
    );
    let o = logbus().arg("graph").arg(&p).output().unwrap();
    assert_eq!(
        stdout(&o),
        "read [source stdin]\n  └─ json [parser json]\n    └─ out [sink stdout]\n"
    );
    let o = logbus().arg("plugins").output().unwrap();
    let text = stdout(&o);
    for needle in [
        "source stdin",
        "source file",
        "source generator",
        "parser lines",
        "parser json",
        "transform stamp",
        "transform filter",
        "transform fields",
        "formatter json",
        "sink stdout",
        "sink file",
        "sink blackhole",
        "path: string (required)",
    ] {
        assert!(
            text.contains(needle),
            "missing `{needle}` in plugins output"
        );
    }
    // Every source says whether it acknowledges; the ones that cannot say
    // what that costs.
    let sources = text.split("\n\n").filter(|p| p.starts_with("source "));
    for plugin in sources {
        let name = plugin.lines().next().unwrap();
        let line = plugin
            .lines()
            .find(|l| l.trim_start().starts_with("acknowledgements: "))
            .unwrap_or_else(|| panic!("{name} says nothing about acknowledgements"));
        match name {
            "source tail" | "source journald" | "source kafka" => {
                assert!(line.contains("end to end"), "{line}")
            }
            "source http" | "source otlp" => assert!(line.contains("ack: sink"), "{line}"),
            "source file" | "source s3" => assert!(line.contains("with state_dir"), "{line}"),
            _ => assert!(line.contains("none — events in flight"), "{name}: {line}"),
        }
    }
    let o = logbus().arg("--version").output().unwrap();
    assert!(stdout(&o).starts_with("logbus "));
}

#[test]
fn stdin_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "p.yml", VALID);
    let mut child = logbus()
        .arg("run")
        .arg(&p)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"a\":1}\r\n{\"b\":2}")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "{\"a\":1}\n{\"b\":2}\n");
}

/// `logbus test demo.test.yml` runs the tests of `demo.yml` (the file
/// holds only tests) and says so, instead of calling it an invalid
/// pipeline.
#[test]
fn a_test_file_given_to_logbus_test_runs_its_pipelines_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let o = logbus()
        .arg("test")
        .arg(root.join("pipelines/demo.test.yml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{}{err}", stdout(&o));
    assert!(err.contains("demo.test.yml holds the tests of"), "{err}");
    assert!(stdout(&o).contains("... ok"), "{}", stdout(&o));
}

/// Every pipeline shipped in `pipelines/` and `examples/` validates with no
/// warning and runs to a clean reconciliation.
#[test]
fn shipped_pipelines_validate_and_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut checked = 0;
    for dir in ["pipelines", "examples", "examples/edge-agent"] {
        let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        for file in files.iter().filter(|f| {
            let name = f.file_name().unwrap().to_string_lossy();
            name.ends_with(".yml") && !name.ends_with(".test.yml")
        }) {
            // Every shipped pipeline has unit tests, and they pass.
            let o = logbus().arg("test").arg(file).output().unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "{}: {}{}",
                file.display(),
                stdout(&o),
                String::from_utf8_lossy(&o.stderr)
            );
            let o = logbus()
                .args(["validate", "--deny-warnings"])
                .arg(file)
                .output()
                .unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "{}: {}",
                file.display(),
                stdout(&o)
            );
            // A pipeline that serves or follows files runs until stopped:
            // its run is tested on its own (tail.rs, edge_agent.rs,
            // http_intake in cli.rs).
            if std::fs::read_to_string(file)
                .unwrap()
                .contains("# runs until stopped")
            {
                checked += 1;
                continue;
            }
            // Run a copy in a scratch directory, next to copies of the sample inputs.
            let scratch = tempfile::tempdir().unwrap();
            for f in &files {
                std::fs::copy(f, scratch.path().join(f.file_name().unwrap())).unwrap();
            }
            std::fs::copy(
                root.join("examples/sample.ndjson"),
                scratch.path().join("sample.ndjson"),
            )
            .unwrap();
            let copy = scratch.path().join(file.file_name().unwrap());
            let stats = scratch.path().join("stats.json");
            let mut child = logbus()
                .arg("run")
                .arg(&copy)
                .arg("--stats-json")
                .arg(&stats)
                .env("DEMO_COUNT", "2000")
                .env("FANOUT_COUNT", "2000")
                .env("FANIN_COUNT", "2000")
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(b"{\"seq\":1,\"debug_id\":\"x\",\"PRIORITY\":\"3\"}\n{\"seq\":2}\n")
                .unwrap();
            let o = child.wait_with_output().unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "{}: {}",
                file.display(),
                String::from_utf8_lossy(&o.stderr)
            );
            let v: Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
            assert_eq!(v["totals"]["lost"], 0, "{}", file.display());
            assert!(
                v["totals"]["committed"].as_u64().unwrap() > 0,
                "{} committed nothing",
                file.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} pipelines found");
}

const TESTED: &str = "stages:
  read: { source: stdin }
  json: { parser: json, inputs: [read], on_error: route }
  keep: { transform: filter, inputs: [json], field: level, not_equals: debug }
  fmt: { formatter: json, inputs: [keep] }
  out: { sink: stdout, inputs: [fmt] }
  bad: { sink: stdout, inputs: [json.errors] }
tests:
  - name: keeps info
    input: { stage: read, lines: ['{\"level\":\"info\"}', '{\"level\":\"debug\"}'] }
    output: keep
    expect: { events: [{ level: info }] }
  - name: wrong on purpose
    input: { stage: keep, events: [{ level: info, n: 1 }] }
    output: fmt
    expect: { events: ['{\"level\":\"info\",\"n\":2}'] }
";

#[test]
fn pipeline_tests_pass_fail_with_a_diff_and_report_junit() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "p.yml", TESTED);
    let o = logbus().arg("test").arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let text = stdout(&o);
    assert!(text.contains("test keeps info ... ok"), "{text}");
    assert!(text.contains("test wrong on purpose ... FAILED"), "{text}");
    assert!(
        text.contains("-  \"{\\\"level\\\":\\\"info\\\",\\\"n\\\":2}\""),
        "the diff shows expected: {text}"
    );
    assert!(
        text.contains("+  \"{\\\"level\\\":\\\"info\\\",\\\"n\\\":1}\""),
        "the diff shows actual: {text}"
    );
    assert!(text.ends_with("1 passed, 1 failed\n"), "{text}");

    let o = logbus()
        .args(["test"])
        .arg(&p)
        .arg("keeps info")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).ends_with("1 passed, 0 failed\n"));

    let o = logbus()
        .args(["test", "--format", "junit"])
        .arg(&p)
        .output()
        .unwrap();
    let xml = stdout(&o);
    assert!(xml.starts_with("<?xml"), "{xml}");
    assert!(
        xml.contains("tests=\"2\"") && xml.contains("failures=\"1\""),
        "{xml}"
    );
    assert!(xml.contains("<testcase name=\"wrong on purpose\""), "{xml}");

    let o = logbus()
        .args(["test"])
        .arg(&p)
        .arg("nope")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no test named `nope`"));
}

#[test]
fn pipeline_test_definitions_are_checked_with_positions() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "p.yml", VALID);
    write(
        dir.path(),
        "p.test.yml",
        "tests:\n  - name: t\n    input: { stage: read, lines: [x] }\n    output: json\n    expect: { cuont: 1 }\n",
    );
    let o = logbus().arg("test").arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("p.test.yml:5:15: invalid test: unknown field `cuont`"),
        "{err}"
    );

    write(
        dir.path(),
        "p.test.yml",
        "tests:\n  - name: t\n    input: { stage: nowhere, lines: [x] }\n    output: json\n",
    );
    let o = logbus().arg("test").arg(&p).output().unwrap();
    assert!(
        stdout(&o).contains("input stage `nowhere` is not in the pipeline"),
        "{}",
        stdout(&o)
    );

    write(
        dir.path(),
        "p.test.yml",
        "tests:\n  - name: t\n    input: { stage: read, lines: [x] }\n    output: out\n",
    );
    let o = logbus().arg("test").arg(&p).output().unwrap();
    assert!(
        stdout(&o).contains("is a sink, which has no output"),
        "{}",
        stdout(&o)
    );

    std::fs::remove_file(dir.path().join("p.test.yml")).unwrap();
    let o = logbus().arg("test").arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no tests in"));
}

#[test]
fn sighup_reloads_a_valid_file_and_refuses_an_invalid_one() {
    let dir = tempfile::tempdir().unwrap();
    let text = |tag: &str| {
        format!(
            "settings: {{ channel_capacity: 256 }}\nstages:
  gen: {{ source: generator, rate: 20000, template: '{{\"seq\":{{{{seq}}}}}}' }}
  json: {{ parser: json, inputs: [gen] }}
  tag: {{ transform: fields, inputs: [json], set: {{ v: {tag} }} }}
  fmt: {{ formatter: json, inputs: [tag] }}
  out: {{ sink: file, inputs: [fmt], path: out.ndjson }}
"
        )
    };
    let p = write(dir.path(), "p.yml", &text("old"));
    let out = dir.path().join("out.ndjson");
    let stats = dir.path().join("stats.json");
    let child = logbus()
        .env("LOGBUS_LOG", "info")
        .arg("run")
        .arg(&p)
        .arg("--stats-json")
        .arg(&stats)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let wait_for = |needle: &str| {
        let start = Instant::now();
        while !std::fs::read_to_string(&out)
            .unwrap_or_default()
            .contains(needle)
        {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "never saw {needle}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let signal = |sig: &str| {
        assert!(
            Command::new("kill")
                .args([sig, &child.id().to_string()])
                .status()
                .unwrap()
                .success()
        );
    };
    wait_for("\"v\":\"old\"");
    write(dir.path(), "p.yml", &text("new"));
    signal("-HUP");
    wait_for("\"v\":\"new\"");
    // An invalid file is refused; the pipeline keeps running as it was.
    write(dir.path(), "p.yml", "stages:\n  gen: { source: nope }\n");
    signal("-HUP");
    let size = std::fs::metadata(&out).unwrap().len();
    let start = Instant::now();
    while std::fs::metadata(&out).unwrap().len() < size + 10_000 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the pipeline stopped after an invalid reload"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    signal("-TERM");
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("reloaded: added [], removed [], changed [tag]"),
        "{err}"
    );
    assert!(err.contains("reload refused, pipeline unchanged"), "{err}");
    let v: Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(v["totals"]["lost"], 0);
    // One unbroken, ordered stream across the reload: old tags, then new.
    let lines = std::fs::read_to_string(&out).unwrap();
    let events: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        events.len() as u64,
        v["totals"]["committed"].as_u64().unwrap()
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["seq"].as_u64(), Some(i as u64));
    }
    let switch = events.iter().position(|e| e["v"] == "new").unwrap();
    assert!(events[..switch].iter().all(|e| e["v"] == "old"));
    assert!(events[switch..].iter().all(|e| e["v"] == "new"));
}

#[test]
fn the_http_intake_example_accepts_posts_and_routes_what_is_not_json() {
    let dir = tempfile::tempdir().unwrap();
    let port = crate::support::free_port();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/http-intake.yml");
    let child = logbus()
        .arg("run")
        .arg(&example)
        .env("INTAKE_ADDR", format!("127.0.0.1:{port}"))
        .env("INTAKE_TOKEN", "t")
        .env("INTAKE_OUT", dir.path().join("out.ndjson"))
        .env("INTAKE_REJECTS", dir.path().join("rejects.ndjson"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let engine = crate::api::Engine::from_child(child);
    crate::support::wait_for_port(port);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let url = format!("http://127.0.0.1:{port}/ingest");
    let mut r = agent
        .post(&url)
        .header("Authorization", "Bearer t")
        .send(&b"{\"n\":1}\nnot json\n{\"n\":2}\n"[..])
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.body_mut().read_to_string().unwrap().trim(),
        "{\"accepted\":3}"
    );
    let r = agent.post(&url).send(&b"{}"[..]).unwrap();
    assert_eq!(r.status().as_u16(), 401);
    Command::new("kill")
        .args(["-TERM", &engine.id().to_string()])
        .status()
        .unwrap();
    let o = engine.into_child().wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = std::fs::read_to_string(dir.path().join("out.ndjson")).unwrap();
    let ns: Vec<i64> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(ns, [1, 2]);
    let rejects = std::fs::read_to_string(dir.path().join("rejects.ndjson")).unwrap();
    assert_eq!(rejects.lines().count(), 1);
    assert!(rejects.contains("not json"), "{rejects}");
}

#[ignore = "needs util-linux logger (apt install bsdutils); run with --include-ignored"]
#[test]
fn the_syslog_relay_example_forwards_logger_messages_to_another_logbus() {
    assert!(
        std::process::Command::new("logger")
            .arg("--help")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--octet-count")),
        "util-linux logger (with --octet-count) is required here (apt install bsdutils)"
    );
    let dir = tempfile::tempdir().unwrap();
    let (relay_port, receiver_port) = (crate::support::free_port(), crate::support::free_port());
    // The receiving LogBus: syslog in, JSON lines out.
    let receiver_yml = write(
        dir.path(),
        "receiver.yml",
        &format!(
            "stages:\n  in: {{ source: syslog, address: \"127.0.0.1:{receiver_port}\", codec: syslog }}\n  fmt: {{ formatter: json, inputs: [in] }}\n  out: {{ sink: file, inputs: [fmt], path: received.ndjson }}\n"
        ),
    );
    let receiver = crate::api::Engine::from_child(
        logbus()
            .arg("run")
            .arg(&receiver_yml)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    crate::support::wait_for_port(receiver_port);
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/syslog-relay.yml");
    let relay = crate::api::Engine::from_child(
        logbus()
            .arg("run")
            .arg(&example)
            .env("RELAY_TCP", format!("127.0.0.1:{relay_port}"))
            .env("RELAY_UDP", format!("127.0.0.1:{relay_port}"))
            .env("RELAY_TO", format!("127.0.0.1:{receiver_port}"))
            .env("RELAY_NAME", "edge-7")
            .env("RELAY_REJECTS", dir.path().join("rejects.ndjson"))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    crate::support::wait_for_port(relay_port);
    let p = relay_port.to_string();
    for (framing, text) in [("--octet-count", "counted"), ("--tcp", "newline")] {
        let status = Command::new("logger")
            .args([
                "--server",
                "127.0.0.1",
                "--port",
                &p,
                "--tcp",
                framing,
                "-t",
                "app",
                text,
            ])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let out = dir.path().join("received.ndjson");
    let start = Instant::now();
    let lines = loop {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        if text.lines().count() >= 2 {
            break text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "received: {text:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    for engine in [relay, receiver] {
        Command::new("kill")
            .args(["-TERM", &engine.id().to_string()])
            .status()
            .unwrap();
        let o = engine.into_child().wait_with_output().unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let mut messages: Vec<String> = lines
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["appname"], "app", "{v}");
            // The relay's tag travels as RFC 5424 structured data.
            assert_eq!(
                v["structured_data"]["logbus@32473"]["relay"], "edge-7",
                "{l}"
            );
            v["message"].as_str().unwrap().to_string()
        })
        .collect();
    messages.sort();
    assert_eq!(messages, ["counted", "newline"]);
}

#[test]
fn stdin_stops_reading_while_the_pipeline_is_full() {
    use std::os::unix::fs::OpenOptionsExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    // The sink writes into a FIFO that is never read: it blocks, the
    // channels fill, and the stdin source must stop reading.
    let fifo = dir.path().join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let mut not_read_yet = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(0o4000)
        .open(&fifo)
        .unwrap();
    let yml = write(
        dir.path(),
        "p.yml",
        &format!(
            "settings: {{ channel_capacity: 64 }}\nstages:\n  in: {{ source: stdin }}\n  out: {{ sink: file, inputs: [in], path: \"{}\" }}\n",
            fifo.display()
        ),
    );
    let mut child = crate::api::Engine::from_child(
        logbus()
            .arg("run")
            .arg(&yml)
            .stdin(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
    .into_child();
    let mut stdin = child.stdin.take().unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let total: u64 = 256 << 20;
    let writer = {
        let written = written.clone();
        std::thread::spawn(move || {
            let chunk = format!("{}\n", "x".repeat(1023)).repeat(1024);
            while written.load(Ordering::SeqCst) < total {
                if stdin.write_all(chunk.as_bytes()).is_err() {
                    break;
                }
                written.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            }
        })
    };
    // Wait until the writer is held back: no progress for a while.
    let mut last = u64::MAX;
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = written.load(Ordering::SeqCst);
        if now == last {
            break;
        }
        last = now;
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "stdin kept being read"
        );
    }
    // Held back far below what it wanted to write: 64-event channels, a
    // 256 KiB sink buffer, the reader's chunk and the pipes' buffers.
    assert!(last < 16 << 20, "{last} bytes were taken from stdin");
    // Held back, not stopped: the engine runs, the writer is blocked in a
    // write (not gone after a failed one), and reading the FIFO lets
    // stdin flow again.
    assert!(child.try_wait().unwrap().is_none(), "logbus exited");
    assert!(
        !writer.is_finished(),
        "the writer gave up: stdin was closed"
    );
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let drain = {
        let draining = draining.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            while draining.load(Ordering::SeqCst) {
                match not_read_yet.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    Err(e) => panic!("reading the FIFO: {e}"),
                }
            }
        })
    };
    let resumed = Instant::now();
    while written.load(Ordering::SeqCst) <= last + (1 << 20) {
        assert!(
            resumed.elapsed() < Duration::from_secs(60),
            "stdin did not flow again once the sink could write"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    writer.join().unwrap();
    draining.store(false, Ordering::SeqCst);
    drain.join().unwrap();
}

/// ARCHITECTURE.md stays true about where things are: every path it
/// names in backticks exists, and it stays short enough to read.
#[test]
fn architecture_names_only_paths_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let tops = [
        "crates/",
        "plugins/",
        "docs/",
        ".ci/",
        "fuzz/",
        "examples/",
        "pipelines/",
        "xtask/",
        ".cargo/",
    ];
    let named: Vec<&str> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| tops.iter().any(|t| span.starts_with(t)) && !span.contains(' '))
        .collect();
    assert!(named.len() > 40, "{named:?}");
    let missing: Vec<&&str> = named
        .iter()
        .filter(|p| !root.join(p.trim_end_matches('/')).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
    let lines = text.lines().count();
    assert!(
        lines <= 220,
        "ARCHITECTURE.md has {lines} lines; keep it near 200"
    );
}

/// docs/editor.md recommends `logbus fmt --check` in CI: every YAML file
/// the project ships passes it (directories, test files included).
#[test]
fn every_shipped_yaml_file_is_formatted() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let o = logbus()
        .args(["fmt", "--check"])
        .args(
            [
                "pipelines",
                "examples",
                "xtask/pipelines",
                "crates/logbus/tests/flow-corpus",
            ]
            .map(|d| root.join(d)),
        )
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn fmt_formats_every_shipped_pipeline_idempotently_and_keeps_its_comments() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for sub in [
        "pipelines",
        "examples",
        "examples/edge-agent",
        "examples/tail",
    ] {
        for entry in std::fs::read_dir(root.join(sub)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yml") {
                continue;
            }
            let o = logbus().arg("fmt").arg(&path).output().unwrap();
            assert!(
                o.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&o.stderr)
            );
            let once = stdout(&o);
            let copy = write(dir.path(), "copy.yml", &once);
            let o = logbus().arg("fmt").arg(&copy).output().unwrap();
            assert_eq!(stdout(&o), once, "{} is not idempotent", path.display());
            let comments = |t: &str| {
                t.lines()
                    .filter(|l| l.trim_start().starts_with('#'))
                    .count()
            };
            let original = std::fs::read_to_string(&path).unwrap();
            assert_eq!(comments(&once), comments(&original), "{}", path.display());
            // Formatted, it is already in the canonical layout.
            let o = logbus()
                .args(["fmt", "--check"])
                .arg(&copy)
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(0), "{}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} files");
}

#[test]
fn fmt_check_and_write() {
    let dir = tempfile::tempdir().unwrap();
    let messy = "stages:\n    out: {inputs: [read], sink: stdout}   # printed\n    read: { source: stdin }\n";
    let p = write(dir.path(), "p.yml", messy);
    let o = logbus().args(["fmt", "--check"]).arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not formatted"));
    let o = logbus().args(["fmt", "--write"]).arg(&p).output().unwrap();
    assert!(o.status.success());
    assert_eq!(
        std::fs::read_to_string(&p).unwrap(),
        "stages:\n  out: { sink: stdout, inputs: [read] }  # printed\n  read: { source: stdin }\n"
    );
    let o = logbus().args(["fmt", "--check"]).arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    let bad = write(dir.path(), "bad.yml", "stages: [\n");
    let o = logbus().arg("fmt").arg(&bad).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad.yml:"));
}

#[test]
fn the_runtime_has_the_threads_the_settings_or_the_flag_ask_for() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "p.yml",
        "settings: { threads: 3 }\nstages:\n  gen: { source: generator, count: 10 }\n  out: { sink: blackhole, inputs: [gen] }\n",
    );
    let run = |extra: &[&str]| -> Value {
        let stats = dir.path().join("stats.json");
        let o = logbus()
            .arg("run")
            .arg(&p)
            .args(extra)
            .arg("--stats-json")
            .arg(&stats)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{o:?}");
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap()
    };
    assert_eq!(run(&[])["worker_threads"], 3, "from settings.threads");
    assert_eq!(
        run(&["--threads", "1"])["worker_threads"],
        1,
        "--threads wins"
    );

    let o = logbus()
        .args(["run", "--threads", "0"])
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--threads"), "{err}");
}

#[test]
fn a_file_source_names_its_file_and_from_meta_writes_it_into_the_event() {
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), "in.ndjson", "{\"a\":1}\n{\"a\":2}\n");
    let p = write(
        dir.path(),
        "p.yml",
        "stages:\n  read: { source: file, path: in.ndjson }\n  json: { parser: json, inputs: [read] }\n  meta: { transform: fields, inputs: [json], from_meta: { log.file: origin, via: source } }\n  out: { sink: stdout, inputs: [meta] }\n",
    );
    let o = logbus().arg("run").arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let lines: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{}", stdout(&o));
    for (i, v) in lines.iter().enumerate() {
        assert_eq!(v["a"], i + 1);
        assert_eq!(v["log"]["file"], input.to_string_lossy().as_ref());
        assert_eq!(v["via"], "read");
    }
}

/// `logbus test` collects from a route's named outputs like from any other.
#[test]
fn pipeline_tests_read_a_routes_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "r.yml",
        "stages:
  read: { source: stdin }
  json: { parser: json, inputs: [read] }
  split: { transform: route, inputs: [json], routes: { slow: 'ms > 100' } }
  out: { sink: stdout, inputs: [split.slow] }
  rest: { sink: stdout, inputs: [split._unmatched] }
tests:
  - name: slow ones
    input: { stage: read, lines: ['{\"ms\":500}', '{\"ms\":5}', '{\"ms\":101}'] }
    output: split.slow
    expect: { events: [{ ms: 500 }, { ms: 101 }] }
  - name: the rest
    input: { stage: split, events: [{ ms: 500 }, { ms: 5 }] }
    output: split._unmatched
    expect: { events: [{ ms: 5 }] }
",
    );
    let o = logbus().arg("test").arg(&p).output().unwrap();
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.ends_with("2 passed, 0 failed\n"), "{text}");
}

/// `logbus validate` says which stages will run fused, in text and JSON.
#[test]
fn validate_lists_the_fused_chains() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let reference = root.join("pipelines/reference.yml");
    let o = logbus().arg("validate").arg(&reference).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        stdout(&o).contains("fused, one task per worker: lines → json → stamp → shape → fmt\n"),
        "{}",
        stdout(&o)
    );
    let o = logbus()
        .args(["validate", "--format", "json"])
        .arg(&reference)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["fused_chains"],
        serde_json::json!([["lines", "json", "stamp", "shape", "fmt"]])
    );
    // Three stages, none fusable: no chain is listed.
    let dir = tempfile::tempdir().unwrap();
    let o = logbus()
        .arg("validate")
        .arg(write(dir.path(), "ok.yml", VALID))
        .output()
        .unwrap();
    assert!(!stdout(&o).contains("fused"), "{}", stdout(&o));
}

/// `logbus` turns transparent huge pages off for itself (they cost peak
/// RSS, docs/benchmarks.md) unless `LOGBUS_HUGE_PAGES=1` keeps the
/// system's setting; the kernel reports the process's choice in
/// `/proc/PID/status`.
#[test]
fn huge_pages_are_off_unless_kept() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "p.yml", VALID);
    // A kernel built without huge pages reports 0 either way.
    let kernel_has_them = Path::new("/sys/kernel/mm/transparent_hugepage").exists();
    let kept = if kernel_has_them { "1" } else { "0" };
    for (keep, expected) in [(None, "0"), (Some("1"), kept)] {
        let mut command = logbus();
        command
            .arg("run")
            .arg(&p)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(value) = keep {
            command.env("LOGBUS_HUGE_PAGES", value);
        }
        let mut child = command.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"{\"a\":1}\n").unwrap();
        // A line through the pipeline: the process is past its start.
        let mut first = [0u8; 8];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut first)
            .unwrap();
        assert_eq!(&first, b"{\"a\":1}\n");
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        let thp = status
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:"))
            .expect("the kernel reports THP_enabled")
            .trim()
            .to_string();
        drop(stdin);
        assert_eq!(child.wait().unwrap().code(), Some(0));
        assert_eq!(thp, expected, "LOGBUS_HUGE_PAGES={keep:?}");
    }
}

/// A flood of bad events does not flood the log: per stage, the first 5
/// errors of a 10-second window are logged, then how many were kept quiet
/// (here at exit); a stage with no quiet errors says nothing more.
#[test]
fn event_errors_are_logged_five_per_window_then_counted() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yml");
    std::fs::write(
        &p,
        "stages:
  bad: { source: generator, count: 20, template: 'not json {{seq}}' }
  few: { source: generator, count: 3, template: 'nor this {{seq}}' }
  json: { parser: json, inputs: [bad], on_error: drop }
  other: { parser: json, inputs: [few], on_error: drop }
  out: { sink: blackhole, inputs: [json, other] }
",
    )
    .unwrap();
    let o = logbus().arg("run").arg(&p).output().unwrap();
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{said}");
    let lines = |stage: &str, what: &str| {
        said.lines()
            .filter(|l| l.contains(&format!("stage=\"{stage}\"")) && l.contains(what))
            .count()
    };
    assert_eq!(lines("json", "dropped an event"), 5, "{said}");
    assert_eq!(
        lines("json", "15 more dropped events were not logged"),
        1,
        "{said}"
    );
    assert_eq!(lines("other", "dropped an event"), 3, "{said}");
    assert_eq!(lines("other", "were not logged"), 0, "{said}");
}

/// `validate` says, per sink and source, what a crash costs: effectively
/// once where the sink names events by positions the source gives, at
/// least once where the source reads again (with the way to do better
/// where it gives positions), at most once where it cannot; the same in
/// the JSON report.
#[test]
fn validate_says_what_a_crash_costs_per_sink_and_source() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "p.yml",
        "\
stages:
  logs: { source: tail, paths: [a.log], state_dir: state }
  j: { source: journald, state_dir: state }
  gen: { source: generator }
  json: { parser: json, inputs: [logs, gen] }
  ship:
    sink: opensearch
    inputs: [json]
    endpoints: ['http://127.0.0.1:9200']
    index: logs
    id_from_position: true
  store:
    sink: clickhouse
    inputs: [json]
    url: 'http://127.0.0.1:8123'
    table: logs
    deduplicate: true
    batch_journal_dir: journal
  archive: { sink: s3, inputs: [json], bucket: b, batch_journal_dir: journal }
  keep: { sink: file, inputs: [json, j], path: out.ndjson }
",
    );
    let o = logbus().arg("validate").arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let text = stdout(&o);
    assert!(
        text.contains(
            "delivery into `ship`: effectively once from `logs`; at most once from `gen`\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "delivery into `store`: effectively once from `logs`; at most once from `gen`\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "delivery into `archive`: effectively once from `logs`; at most once from `gen`\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("delivery into `keep`: at least once from `j`, `logs`; at most once from `gen` (`j`, `logs` give positions: a sink that names events by them"),
        "{text}"
    );
    // The generator gives no positions: `ship` is warned.
    assert!(text.contains("warning[position-missing]"), "{text}");
    let o = logbus()
        .args(["validate", "--format", "json"])
        .arg(&p)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let report = if report.is_array() {
        report[0].clone()
    } else {
        report
    };
    assert_eq!(
        report["deliveries"]["ship"],
        serde_json::json!({"logs": "effectively once", "gen": "at most once"})
    );
    assert_eq!(report["deliveries"]["keep"]["j"], "at least once");
}
