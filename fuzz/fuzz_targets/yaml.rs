#![no_main]
//! Any bytes: no panic, errors inside the input; every mapping document
//! decoded re-encodes and decodes the same.
use libfuzzer_sys::fuzz_target;
use logbus_codec::yaml::{decode, encode};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    match decode(data) {
        Err(e) => assert!(e.offset <= data.len()),
        Ok(docs) => {
            for doc in docs {
                // Non-finite floats have no JSON form (they decode to null).
                if let Value::Object(fields) = doc {
                    let mut out = Vec::new();
                    if encode(&fields, &mut out).is_err() {
                        continue; // a key too long for YAML: refused, by design
                    }
                    let again = decode(&out).expect("our own output decodes");
                    assert_eq!(again, vec![Value::Object(fields)]);
                }
            }
        }
    }
});
