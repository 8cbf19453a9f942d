#![no_main]
//! Any bytes as a pipeline file: diagnostics with positions inside the
//! file, or a pipeline; never a panic, a stack overflow or an alias bomb's
//! gigabytes (libFuzzer's RSS limit would catch those).
use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use logbus_plugin_api::Registry;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut r = Registry::new();
        logbus_text::register(&mut r);
        logbus_io::register(&mut r);
        logbus_transform::register(&mut r);
        r
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env = |name: &str| (name == "SET").then(|| "value".to_string());
    let loaded = logbus_core::load_str(text, Path::new("/fuzz/p.yml"), registry(), &env);
    // Lines as YAML counts them: `\r\n`, `\r` and `\n` each end one.
    let lines = text.replace("\r\n", "\n").replace('\r', "\n").matches('\n').count() + 2;
    for d in &loaded.diagnostics {
        if let Some(line) = d.line {
            assert!(line <= lines, "line {line} of {lines}: {d:?}");
        }
    }
    if loaded.pipeline.is_some() {
        assert!(!loaded.has_errors());
    }
});
