//! The JSON Schema accepts every shipped pipeline and rejects the option
//! errors `logbus validate` rejects, because both come from the same typed
//! option structs.

use std::path::Path;

use logbus_core::yaml;
use serde_json::Value;

fn schema() -> jsonschema::Validator {
    let schema = logbus_core::schema::pipeline_schema(&logbus::catalog::registry());
    jsonschema::validator_for(&schema).expect("the schema is a valid JSON Schema")
}

/// A pipeline file as the schema sees it: YAML with variables expanded.
fn as_json(text: &str) -> Value {
    let mut node = yaml::parse(text).unwrap().unwrap();
    let mut errors = Vec::new();
    node.expand_env(&|_| None, &mut errors);
    assert!(errors.is_empty());
    node.to_json()
}

#[test]
fn every_shipped_pipeline_matches_the_schema() {
    let validator = schema();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut checked = 0;
    for dir in [
        "pipelines",
        "examples",
        "examples/edge-agent",
        "examples/tail",
    ] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if !name.ends_with(".yml") || name.ends_with(".test.yml") {
                continue;
            }
            let doc = as_json(&std::fs::read_to_string(&path).unwrap());
            let errors: Vec<String> = validator
                .iter_errors(&doc)
                .map(|e| format!("{e} at {}", e.instance_path))
                .collect();
            assert!(errors.is_empty(), "{name}: {errors:#?}");
            checked += 1;
        }
    }
    assert!(checked >= 5);
}

#[test]
fn the_schema_rejects_what_validate_rejects_for_options() {
    let validator = schema();
    let registry = logbus::catalog::registry();
    let cases = [
        (
            "unknown option",
            "  o: { sink: file, inputs: [a], path: x, apend: true }",
        ),
        (
            "wrong type",
            "  o: { sink: file, inputs: [a], path: x, append: maybe }",
        ),
        ("missing required", "  o: { sink: file, inputs: [a] }"),
        (
            "out of range",
            "  g: { source: generator, batch_size: 0 }\n  o: { sink: stdout, inputs: [g] }",
        ),
        (
            "bad enum value",
            "  s: { transform: stamp, inputs: [a], format: iso }\n  o: { sink: stdout, inputs: [s] }",
        ),
        (
            "empty list",
            "  f: { transform: filter, inputs: [a], field: x, in: [] }\n  o: { sink: stdout, inputs: [f] }",
        ),
        ("unknown plugin", "  o: { sink: nowhere, inputs: [a] }"),
        (
            "bad on_error",
            "  p: { parser: json, inputs: [a], on_error: explode }\n  o: { sink: stdout, inputs: [p] }",
        ),
        (
            "two plugin keys",
            "  p: { parser: json, transform: stamp, inputs: [a] }\n  o: { sink: stdout, inputs: [p] }",
        ),
        (
            "bad setting",
            "  o: { sink: stdout, inputs: [a] }\nsettings: { channel_capacity: 0 }",
        ),
        (
            "zero threads",
            "  o: { sink: stdout, inputs: [a] }\nsettings: { threads: 0 }",
        ),
    ];
    for (what, stages) in cases {
        let text = format!("stages:\n  a: {{ source: stdin }}\n{stages}\n");
        let loaded = crate::support::load_with(&text, &registry);
        assert!(loaded.has_errors(), "validate accepted {what}:\n{text}");
        assert!(
            !validator.is_valid(&as_json(&text)),
            "the schema accepted {what}:\n{text}"
        );
    }
    // And a valid one passes both.
    let ok = "stages:\n  a: { source: stdin }\n  p: { parser: json, inputs: [a], on_error: route }\n  o: { sink: file, inputs: [p], path: x, append: false }\n  e: { sink: stdout, inputs: [p.errors] }\n";
    assert!(!crate::support::load_with(ok, &registry).has_errors());
    assert!(validator.is_valid(&as_json(ok)));
}

/// Every plugin's page documents its options as the schema declares them:
/// each option listed, each default as the schema gives it (the rules are
/// `options_table_mismatch`'s, the page and section `page_mismatch`'s).
#[test]
fn every_plugin_page_documents_its_options() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/plugins");
    let registry = logbus::catalog::registry();
    assert!(
        registry.plugins().count() >= 40,
        "too few plugins in this build"
    );
    logbus_plugin_api::testing::assert_pages_document(|r| *r = logbus::catalog::registry(), &docs);
}
