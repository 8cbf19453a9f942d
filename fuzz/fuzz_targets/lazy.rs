#![no_main]
//! Lazy fields (the JSON parser's fast path) on any bytes: what
//! `LazyFields::parse` accepts must parse as JSON, write exactly what both
//! serialisers write for the parsed fields, build those same fields, and
//! after edits (a delete and a set chosen by the input) still write what
//! the same edits on an ordered map write. Anything it refuses is the eager
//! parser's business (the `json` target).
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use logbus_event::{Fields, LazyFields};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some(mut lazy) = LazyFields::parse(Bytes::copy_from_slice(data)) else {
        return;
    };
    let mut fields: Fields = sonic_rs::from_slice(data).expect("accepted text is JSON");
    let written = |lazy: &LazyFields| {
        let mut out = Vec::new();
        lazy.write_json(&mut out);
        String::from_utf8(out).expect("lazy fields write UTF-8")
    };
    let out = written(&lazy);
    assert_eq!(out, sonic_rs::to_string(&fields).unwrap());
    assert_eq!(out, serde_json::to_string(&fields).unwrap());
    assert_eq!(lazy.fields(), &fields);

    // Edits picked by the input's length: delete the n-th key (or a
    // missing one), then set an existing or a new key.
    let keys: Vec<String> = fields.keys().cloned().collect();
    let pick = data.len() % (keys.len() + 1);
    let gone = keys.get(pick).cloned().unwrap_or_else(|| "fuzz-missing".into());
    assert_eq!(lazy.delete(&gone), fields.shift_remove(&gone).is_some());
    let set = keys.get(data.len() % (keys.len() + 2)).cloned().unwrap_or_else(|| "fuzz-new".into());
    let value = Value::from(data.len() as u64);
    lazy.set(&set, value.clone());
    fields.insert(set, value);
    assert_eq!(written(&lazy), serde_json::to_string(&fields).unwrap());
    assert_eq!(lazy.fields(), &fields);
});
