#![no_main]
//! Any bytes as a Parquet file: rows or an error. The parquet and arrow
//! crates panic on some malformed files; `decode` catches that and makes
//! it the file's error, so the panic hook is quietened (libFuzzer's own
//! would abort on a panic that is then caught). A panic that escapes is
//! still a crash.
use std::sync::Once;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static QUIET: Once = Once::new();
    QUIET.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some("escaped") {
                default(info);
            }
        }));
    });
    let _ = logbus_parquet::reader::decode(
        bytes::Bytes::copy_from_slice(data),
        logbus_parquet::reader::Limits {
            bytes: 16 << 20,
            rows: 100_000,
        },
    );
});
