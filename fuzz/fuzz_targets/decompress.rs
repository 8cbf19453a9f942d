#![no_main]
//! Any bytes through format detection and every decoder: an error or
//! data, never a panic (and never unbounded output: capped here).
use std::io::Read;

use libfuzzer_sys::fuzz_target;
use logbus_compress::{ReadCompression, open};

fuzz_target!(|data: &[u8]| {
    for choice in [
        ReadCompression::Auto,
        ReadCompression::Gzip,
        ReadCompression::Deflate,
        ReadCompression::Lz4,
        ReadCompression::Snappy,
        ReadCompression::Zstd,
    ] {
        if let Ok(reader) = open(data, choice) {
            let mut out = Vec::new();
            let _ = reader.take(1 << 20).read_to_end(&mut out);
        }
    }
});
