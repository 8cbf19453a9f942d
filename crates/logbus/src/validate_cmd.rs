//! `logbus validate` as a CI gate: files and directories in one call, a
//! report per file in text, JSON or GitHub workflow annotations, the
//! fields known at each stage on request, and one exit code for the lot
//! (docs/validation.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use logbus_core::flow::{Delivery, Guarantee, Shape};
use logbus_core::{Diagnostic, Loaded, Severity};

#[derive(Clone, Copy, clap::ValueEnum, PartialEq)]
pub enum ValidateFormat {
    Text,
    Json,
    /// GitHub Actions workflow commands: an annotation per diagnostic.
    Github,
}

pub struct ValidateArgs {
    pub deny_warnings: bool,
    pub preflight: bool,
    /// `--connect`, with how long each service may take.
    pub connect: Option<std::time::Duration>,
    pub strict_fields: bool,
    pub fields: bool,
    pub format: ValidateFormat,
}

/// The pipeline files `paths` name: files as given (a `name.test.yml`
/// stands for its pipeline `name.yml`), directories searched for `*.yml`
/// and `*.yaml` except test files, sorted, each once.
pub fn pipeline_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    expand(paths, false)
}

/// The YAML files `paths` name, test files included and taken as they
/// are (what `logbus fmt` formats).
pub fn yaml_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    expand(paths, true)
}

fn expand(paths: &[PathBuf], with_tests: bool) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut found = Vec::new();
            walk(path, with_tests, &mut found)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            found.sort();
            if found.is_empty() {
                return Err(format!("{}: no *.yml or *.yaml file", path.display()));
            }
            out.extend(found);
        } else if with_tests {
            out.push(path.clone());
        } else {
            out.push(crate::test_cmd::pipeline_of_test_file(path).unwrap_or_else(|| path.clone()));
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|p| seen.insert(p.clone()));
    Ok(out)
}

fn walk(dir: &Path, with_tests: bool, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, with_tests, out)?;
            continue;
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let yaml = name.ends_with(".yml") || name.ends_with(".yaml");
        let test = name.ends_with(".test.yml") || name.ends_with(".test.yaml");
        if yaml && (with_tests || !test) {
            out.push(path);
        }
    }
    Ok(())
}

/// Validates every file; exit 0 when all are valid, 1 when one is
/// invalid, 2 when one cannot be read (the worst wins).
pub fn run(paths: &[PathBuf], args: &ValidateArgs) -> ExitCode {
    let files = match pipeline_files(paths) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("logbus: error: {e}");
            return ExitCode::from(2);
        }
    };
    let registry = crate::catalog::registry();
    let mut worst = 0u8;
    let mut reports = Vec::new();
    let mut text = String::new();
    for file in &files {
        let name = file.display().to_string();
        let options = logbus_core::LoadOptions {
            record_fields: args.fields,
            connect: args.connect.is_some(),
        };
        let loaded = match logbus_core::load_file_with(file, &registry, options) {
            Ok(l) => l,
            Err(e) => {
                worst = 2;
                match args.format {
                    ValidateFormat::Text => eprintln!("logbus: error: {e}"),
                    ValidateFormat::Github => text.push_str(&format!(
                        "::error file={},title=unreadable::{}\n",
                        property(&name),
                        message(&e.to_string())
                    )),
                    ValidateFormat::Json => reports.push(serde_json::json!({
                        "file": name,
                        "valid": false,
                        "unreadable": e.to_string(),
                    })),
                }
                continue;
            }
        };
        let mut diagnostics = loaded.diagnostics.clone();
        if args.strict_fields {
            diagnostics.extend(loaded.undeclared.iter().cloned());
        }
        if args.preflight {
            diagnostics.extend(loaded.preflight());
        }
        if let Some(timeout) = args.connect {
            diagnostics.extend(connect(&loaded, timeout));
        }
        diagnostics.sort_by_key(|d| (d.line.unwrap_or(0), d.col.unwrap_or(0)));
        let failing = |d: &Diagnostic| d.severity == Severity::Error || args.deny_warnings;
        let valid = !diagnostics.iter().any(failing);
        if !valid {
            worst = worst.max(1);
        }
        match args.format {
            ValidateFormat::Json => {
                reports.push(json_report(&name, &loaded, &diagnostics, valid, args))
            }
            ValidateFormat::Github => {
                for d in &diagnostics {
                    text.push_str(&annotation(&name, d, args.deny_warnings));
                }
                if args.fields {
                    text.push_str(&fields_text(&name, &loaded.fields));
                }
            }
            ValidateFormat::Text => {
                text.push_str(&text_report(&name, &loaded, &diagnostics, valid, args));
            }
        }
    }
    match args.format {
        ValidateFormat::Json => {
            // One file: its object, as before; several: a list of them.
            let out = match reports.len() {
                1 => reports.pop().expect("one"),
                _ => serde_json::Value::Array(reports),
            };
            crate::emit(&format!(
                "{}\n",
                serde_json::to_string_pretty(&out).expect("serialisable")
            ));
        }
        _ => crate::emit(&text),
    }
    ExitCode::from(worst)
}

/// The services probed ([`logbus_core::connect`]); only a pipeline that
/// passed validation is worth reaching for.
fn connect(loaded: &Loaded, timeout: std::time::Duration) -> Vec<Diagnostic> {
    if loaded.has_errors() {
        return Vec::new();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    match runtime {
        Ok(r) => r.block_on(logbus_core::connect::connect(&loaded.services, timeout)),
        Err(e) => vec![Diagnostic::error(
            "service-unreachable",
            format!("cannot start the runtime the probes need: {e}"),
        )],
    }
}

fn json_report(
    name: &str,
    loaded: &Loaded,
    diagnostics: &[Diagnostic],
    valid: bool,
    args: &ValidateArgs,
) -> serde_json::Value {
    let failing = |d: &&Diagnostic| d.severity == Severity::Error || args.deny_warnings;
    let mut out = serde_json::json!({
        "file": name,
        "valid": valid,
        "errors": diagnostics.iter().filter(failing).count(),
        "warnings": diagnostics.iter().filter(|d| d.severity == Severity::Warning).count(),
        "diagnostics": diagnostics,
        "inflight_bound": loaded.pipeline.as_ref().map(|p| p.inflight_bound()),
        "stages": loaded.pipeline.as_ref().map(|p| p.stages.len()),
        "fused_chains": loaded.pipeline.as_ref().map(crate::fused_chains),
    });
    if loaded.pipeline.is_some() {
        let deliveries: serde_json::Map<String, serde_json::Value> = loaded
            .deliveries
            .iter()
            .map(|d| {
                let sources: serde_json::Map<String, serde_json::Value> = d
                    .sources
                    .iter()
                    .map(|(source, reach)| {
                        (source.clone(), guarantee_name(d.guarantee(reach)).into())
                    })
                    .collect();
                (d.sink.clone(), sources.into())
            })
            .collect();
        out["deliveries"] = deliveries.into();
    }
    if args.fields {
        let fields: serde_json::Map<String, serde_json::Value> = loaded
            .fields
            .iter()
            .map(|(output, shape)| {
                (
                    output.clone(),
                    serde_json::to_value(shape).expect("serialisable"),
                )
            })
            .collect();
        out["fields"] = serde_json::Value::Object(fields);
    }
    out
}

fn text_report(
    name: &str,
    loaded: &Loaded,
    diagnostics: &[Diagnostic],
    valid: bool,
    args: &ValidateArgs,
) -> String {
    let mut text = String::new();
    for d in diagnostics {
        text.push_str(&format!("{}\n", d.display(name)));
    }
    if args.fields {
        text.push_str(&fields_text(name, &loaded.fields));
    }
    let failing = |d: &&Diagnostic| d.severity == Severity::Error || args.deny_warnings;
    match (&loaded.pipeline, valid) {
        (Some(p), true) => {
            let b = p.inflight_bound();
            text.push_str(&format!(
                "{name}: valid: {} stages; worst-case in-flight: {} events over {} input queues\n",
                p.stages.len(),
                b.events,
                b.channels,
            ));
            for chain in crate::fused_chains(p) {
                text.push_str(&format!(
                    "{name}: fused, one task per worker: {}\n",
                    chain.join(" → ")
                ));
            }
            for d in &loaded.deliveries {
                text.push_str(&delivery_text(name, d));
            }
        }
        _ => text.push_str(&format!(
            "{name}: invalid: {} error(s)\n",
            diagnostics.iter().filter(failing).count()
        )),
    }
    text
}

fn guarantee_name(g: Guarantee) -> &'static str {
    match g {
        Guarantee::AtMostOnce => "at most once",
        Guarantee::AtLeastOnce => "at least once",
        Guarantee::EffectivelyOnce => "effectively once",
    }
}

/// What a crash costs into one sink, per source (docs/reliability.md):
/// `p.yml: delivery into `ship`: effectively once from `logs`; at most
/// once from `gen``, and how to do better where the sources allow it.
fn delivery_text(name: &str, d: &Delivery) -> String {
    let mut parts = Vec::new();
    for g in [
        Guarantee::EffectivelyOnce,
        Guarantee::AtLeastOnce,
        Guarantee::AtMostOnce,
    ] {
        let sources: Vec<String> = d
            .sources
            .iter()
            .filter(|(_, reach)| d.guarantee(reach) == g)
            .map(|(source, _)| format!("`{source}`"))
            .collect();
        if !sources.is_empty() {
            parts.push(format!("{} from {}", guarantee_name(g), sources.join(", ")));
        }
    }
    if parts.is_empty() {
        return String::new();
    }
    // Sources that would be effectively once into a sink naming events
    // by position.
    let placed: Vec<String> = d
        .sources
        .iter()
        .filter(|(_, r)| !d.names_by_position && r.replay.rereads && r.replay.positions)
        .map(|(source, _)| format!("`{source}`"))
        .collect();
    let hint = match placed.len() {
        0 => String::new(),
        _ => format!(
            " ({} {} positions: a sink that names events by them, such as opensearch with `id_from_position` or clickhouse and s3 with a `batch_journal_dir`, is effectively once from {})",
            placed.join(", "),
            if placed.len() == 1 { "gives" } else { "give" },
            if placed.len() == 1 { "it" } else { "them" },
        ),
    };
    format!(
        "{name}: delivery into `{}`: {}{hint}\n",
        d.sink,
        parts.join("; ")
    )
}

/// `--fields`: what each output carries.
fn fields_text(name: &str, outputs: &[(String, Shape)]) -> String {
    let mut text = String::new();
    for (output, shape) in outputs {
        let kind = match (shape.raw, shape.parsed) {
            (true, true) => "raw or parsed events",
            (true, false) => "raw events",
            (false, true) => "parsed events",
            (false, false) => "no events",
        };
        let open = match &shape.open_after {
            Some(by) => format!("; other fields possible after `{by}`"),
            None if shape.parsed => "; exactly these fields".to_string(),
            None => String::new(),
        };
        text.push_str(&format!("{name}: fields at `{output}`: {kind}{open}\n"));
        let width = shape.fields.keys().map(|k| k.len()).max().unwrap_or(0);
        for (field, known) in &shape.fields {
            let ty = serde_json::to_value(known.ty).expect("serialisable");
            text.push_str(&format!(
                "    {field:width$}  {:<7}  set by `{}`\n",
                ty.as_str().unwrap_or("any"),
                known.set_by
            ));
        }
    }
    text
}

/// A GitHub Actions annotation (`::error file=…,line=…::message`).
fn annotation(file: &str, d: &Diagnostic, deny_warnings: bool) -> String {
    let level = match d.severity {
        Severity::Error => "error",
        Severity::Warning if deny_warnings => "error",
        Severity::Warning => "warning",
    };
    let mut props = format!("file={}", property(file));
    if let (Some(l), Some(c)) = (d.line, d.col) {
        props.push_str(&format!(",line={l},col={c}"));
    }
    props.push_str(&format!(",title={}", property(d.code)));
    let text = match &d.stage {
        Some(stage) => format!("stage `{stage}`: {}", d.message),
        None => d.message.clone(),
    };
    format!("::{level} {props}::{}\n", message(&text))
}

/// Escaping for a workflow command's message.
fn message(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// Escaping for a workflow command's property value.
fn property(s: &str) -> String {
    message(s).replace(':', "%3A").replace(',', "%2C")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_escape_what_workflow_commands_treat_as_syntax() {
        let d = Diagnostic::warning("field-not-produced", "50% of\nit")
            .stage("s")
            .at(logbus_core::yaml::Pos { line: 3, col: 4 });
        assert_eq!(
            annotation("a:b,c.yml", &d, false),
            "::warning file=a%3Ab%2Cc.yml,line=3,col=4,title=field-not-produced::stage `s`: 50%25 of%0Ait\n"
        );
        assert!(annotation("f", &d, true).starts_with("::error "));
        let e = Diagnostic::error("empty-file", "empty");
        assert_eq!(
            annotation("f", &e, false),
            "::error file=f,title=empty-file::empty\n"
        );
    }

    #[test]
    fn directories_give_their_pipelines_and_test_files_their_pipeline() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        for f in ["a.yml", "a.test.yml", "b.yaml", "notes.txt"] {
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        std::fs::write(sub.join("c.yml"), "x").unwrap();
        let files = pipeline_files(&[dir.path().to_path_buf()]).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|p| p.strip_prefix(dir.path()).unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["a.yml", "b.yaml", "sub/c.yml"]);
        // A test file holds no stages: its pipeline is validated, once.
        let files =
            pipeline_files(&[dir.path().join("a.test.yml"), dir.path().join("a.yml")]).unwrap();
        assert_eq!(files, [dir.path().join("a.yml")]);
        let empty = tempfile::tempdir().unwrap();
        assert!(
            pipeline_files(&[empty.path().to_path_buf()])
                .unwrap_err()
                .contains("no *.yml")
        );
    }
}
