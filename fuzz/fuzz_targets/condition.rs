#![no_main]
//! Any text as a condition: compiled, an error or a condition, never a
//! panic; a condition that compiles prints, lists its fields and
//! evaluates against a few events without a panic or a stack overflow
//! (chains are flat, nesting is bounded). (Printing round trips are a
//! property test in crates/condition.)
use libfuzzer_sys::fuzz_target;
use logbus_condition::Condition;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(condition) = Condition::compile(text) else {
        return;
    };
    let _ = condition.to_string();
    for event in [
        serde_json::json!({}),
        serde_json::json!({"a": 1, "b": "x", "level": "error", "n": null, "ok": true}),
        serde_json::json!({"a": {"b": [1, "2", {"c": 3.5}]}, "msg": "Hello World"}),
    ] {
        let fields = event.as_object().unwrap();
        let _ = condition.matches(fields);
    }
    let _ = condition.field_uses();
});
