#![no_main]
//! Any bytes as an HTTP source's request body, under every encoding and
//! both body formats: decompressed at most to the limit, split into at
//! most the allowed events; an error otherwise, never a panic.
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use logbus_http::body::{Refused, decode, split};
use logbus_http::source::BodyFormat;

const MAX_BYTES: usize = 1 << 20;
const MAX_EVENTS: usize = 1000;

fuzz_target!(|data: &[u8]| {
    let source: Arc<str> = "fuzz".into();
    for encoding in ["identity", "gzip", "zstd", "deflate", "br"] {
        let Ok(body) = decode(encoding, bytes::Bytes::copy_from_slice(data), MAX_BYTES) else {
            continue;
        };
        assert!(body.len() <= MAX_BYTES);
        for format in [BodyFormat::Lines, BodyFormat::JsonArray] {
            match split(&body, format, &source, MAX_EVENTS) {
                Ok(events) => assert!(events.len() <= MAX_EVENTS),
                Err(Refused::TooMany) | Err(Refused::Malformed(_)) => {}
            }
        }
    }
});
