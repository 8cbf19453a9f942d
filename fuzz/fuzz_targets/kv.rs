#![no_main]
//! Any bytes: decode never panics; what decodes re-encodes and decodes to
//! the same fields.
use libfuzzer_sys::fuzz_target;
use logbus_codec::kv::{Syntax, decode, encode};

fuzz_target!(|data: &[u8]| {
    let syntax = Syntax::default();
    if let Ok(fields) = decode(data, &syntax) {
        let mut out = Vec::new();
        encode(&fields, &syntax, &mut out);
        let again = decode(&out, &syntax).expect("our own output decodes");
        assert_eq!(again, fields);
    }
});
