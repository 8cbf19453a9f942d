//! `logbus test`: runs a pipeline's unit tests and reports them for people
//! (one line per test, expected/actual and a diff on failure) or for CI
//! (JUnit XML).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use logbus_core::Pipeline;
use logbus_pipeline_test::{Outcome, TestCase, junit, load_tests, run_test};

/// For `dir/name.test.yml` (a pipeline's test file, no `stages:` of its
/// own) whose pipeline `dir/name.yml` exists: that pipeline.
pub fn pipeline_of_test_file(file: &Path) -> Option<std::path::PathBuf> {
    let name = file.file_name()?.to_str()?;
    let stem = name.strip_suffix(".test.yml")?;
    let pipeline = file.with_file_name(format!("{stem}.yml"));
    let text = std::fs::read_to_string(file).ok()?;
    let has_stages = text.lines().any(|l| l.starts_with("stages:"));
    (pipeline.is_file() && !has_stages).then_some(pipeline)
}

/// The pipelines to test: files as given; in a directory, each pipeline
/// with tests (a `tests:` key, or a `name.test.yml` beside it).
pub fn files_with_tests(paths: &[std::path::PathBuf]) -> Result<Vec<std::path::PathBuf>, String> {
    let mut out = Vec::new();
    for path in paths {
        if !path.is_dir() {
            out.push(path.clone());
            continue;
        }
        let found = crate::validate_cmd::pipeline_files(std::slice::from_ref(path))?;
        let before = out.len();
        for file in found {
            let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let stem = name.trim_end_matches(".yml").trim_end_matches(".yaml");
            let beside = file.with_file_name(format!("{stem}.test.yml")).is_file();
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            if beside || text.lines().any(|l| l.starts_with("tests:")) {
                out.push(file);
            }
        }
        if out.len() == before {
            return Err(format!("{}: no pipeline with tests", path.display()));
        }
    }
    Ok(out)
}

pub fn run(
    file: &Path,
    pipeline: &Pipeline,
    names: &[String],
    as_junit: bool,
) -> anyhow::Result<ExitCode> {
    let tests = match load_tests(file) {
        Ok(t) => t,
        Err(errors) => {
            for e in errors {
                eprintln!("logbus: {e}");
            }
            return Ok(ExitCode::from(1));
        }
    };
    for name in names {
        if !tests.iter().any(|t| &t.name == name) {
            let known: Vec<&str> = tests.iter().map(|t| t.name.as_str()).collect();
            eprintln!(
                "logbus: no test named `{name}` (tests: {})",
                known.join(", ")
            );
            return Ok(ExitCode::from(1));
        }
    }
    let selected: Vec<&TestCase> = tests
        .iter()
        .filter(|t| names.is_empty() || names.contains(&t.name))
        .collect();
    if selected.is_empty() {
        eprintln!(
            "logbus: no tests in {} or {}",
            file.display(),
            logbus_pipeline_test::companion(file).display()
        );
        return Ok(ExitCode::from(1));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(crate::WORKER_STACK_BYTES)
        .build()
        .context("starting the runtime")?;
    let mut outcomes: Vec<Outcome> = Vec::new();
    for test in &selected {
        let outcome = runtime.block_on(run_test(pipeline, test));
        if !as_junit {
            match &outcome.failure {
                None => crate::emit(&format!("test {} ... ok\n", outcome.name)),
                Some(why) => crate::emit(&format!(
                    "test {} ... FAILED ({}:{})\n{}\n",
                    outcome.name,
                    test.file.display(),
                    test.pos.line,
                    indent(why)
                )),
            }
        }
        outcomes.push(outcome);
    }
    let failed = outcomes.iter().filter(|o| !o.passed()).count();
    if as_junit {
        crate::emit(&junit::report(&[(
            file.display().to_string(),
            outcomes.clone(),
        )]));
    } else {
        crate::emit(&format!(
            "{} passed, {failed} failed\n",
            outcomes.len() - failed
        ));
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
