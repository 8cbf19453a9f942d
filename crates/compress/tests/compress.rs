//! Every format round-trips, is detected by its magic bytes, survives a
//! flush-then-crash (no finish), and interoperates with the system tools.

use std::io::{Read, Write};
use std::process::Command;

use logbus_compress::{CompressWriter, Compression, ReadCompression, open};
use proptest::prelude::*;

const ALL: [Compression; 6] = [
    Compression::None,
    Compression::Gzip,
    Compression::Deflate,
    Compression::Lz4,
    Compression::Snappy,
    Compression::Zstd,
];

fn compress(data: &[u8], format: Compression) -> Vec<u8> {
    let mut w = CompressWriter::new(Vec::new(), format).unwrap();
    w.write_all(data).unwrap();
    w.finish().unwrap()
}

fn decompress(data: &[u8], choice: ReadCompression) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    open(data, choice)?.read_to_end(&mut out)?;
    Ok(out)
}

proptest! {
    #[test]
    fn every_format_round_trips_and_is_detected(data in prop::collection::vec(any::<u8>(), 0..5000)) {
        for format in ALL {
            let packed = compress(&data, format);
            // (A snappy stream of nothing is zero bytes: nothing to detect.)
            if format != Compression::None && !packed.is_empty() {
                prop_assert_eq!(Compression::detect(&packed), Some(format));
            }
            // Plain data that happens to start with a format's magic bytes
            // is, by design, taken for that format by `auto`.
            let choice = if format == Compression::None { ReadCompression::None } else { ReadCompression::Auto };
            prop_assert_eq!(decompress(&packed, choice).unwrap(), data.clone(), "{:?}", format);
        }
    }

    /// Garbage after a valid magic never panics (it may even decode: raw
    /// deflate has no checksum).
    #[test]
    fn corrupt_input_never_panics(tail in prop::collection::vec(any::<u8>(), 0..200)) {
        for format in ALL.into_iter().skip(1) {
            let mut packed = compress(b"hello hello hello", format);
            let keep = packed.len().min(6);
            packed.truncate(keep);
            packed.extend_from_slice(&tail);
            let _ = decompress(&packed, ReadCompression::Auto);
        }
    }
}

#[test]
fn flushed_data_survives_a_missing_finish() {
    for format in ALL.into_iter().skip(1) {
        let mut w = CompressWriter::new(Vec::new(), format).unwrap();
        w.write_all(b"committed line 1\ncommitted line 2\n")
            .unwrap();
        w.flush().unwrap();
        // The process dies here: no finish().
        let partial = w.get_ref().clone();
        let mut out = Vec::new();
        let _ = open(&partial[..], ReadCompression::Auto)
            .unwrap()
            .read_to_end(&mut out);
        assert_eq!(out, b"committed line 1\ncommitted line 2\n", "{format:?}");
    }
}

#[test]
fn plain_text_is_not_mistaken_for_a_format() {
    for text in [&b"{\"a\":1}\n"[..], b"<13>Nov 30 x", b"x", b""] {
        assert_eq!(Compression::detect(text), None);
    }
}

/// Fails the test unless the command-line tool `name` runs.
fn require_tool(name: &str) {
    let ok = Command::new(name)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "`{name}` is required here (apt install {name})");
}

/// Our output decompresses with gzip, zstd and lz4; their output
/// decompresses with us. (Ignored unless run with `--include-ignored`, as
/// CI does after installing the tools; then every tool must be there.)
#[ignore = "needs gzip, zstd and lz4 (apt install gzip zstd lz4); run with --include-ignored"]
#[test]
fn interoperates_with_the_command_line_tools() {
    for name in ["gzip", "zstd", "lz4"] {
        require_tool(name);
    }
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..20000)
        .flat_map(|i| format!("{{\"seq\":{i},\"msg\":\"hello\"}}\n").into_bytes())
        .collect();
    for (format, name) in [
        (Compression::Gzip, "gzip"),
        (Compression::Zstd, "zstd"),
        (Compression::Lz4, "lz4"),
    ] {
        // Ours -> the tool, named with our extension: the tool takes the
        // name as its own and decompresses beside it (it refuses a file
        // whose suffix it does not know).
        let ext = format.extension();
        let ours = dir.path().join(format!("ours{ext}"));
        std::fs::write(&ours, compress(&data, format)).unwrap();
        // (`-m`: lz4 writes to stdout when it is not a terminal, unless
        // told that its arguments are files.)
        let args: &[&str] = if name == "lz4" {
            &["-d", "-m"]
        } else {
            &["-d"]
        };
        let o = Command::new(name).args(args).arg(&ours).output().unwrap();
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let unpacked = dir.path().join("ours");
        assert_eq!(
            std::fs::read(&unpacked).unwrap(),
            data,
            "{name} read our output"
        );
        std::fs::remove_file(&unpacked).unwrap();
        // The tool -> ours.
        let plain = dir.path().join(format!("plain-{ext}.txt"));
        std::fs::write(&plain, &data).unwrap();
        let o = Command::new(name).arg("-c").arg(&plain).output().unwrap();
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(Compression::detect(&o.stdout), Some(format));
        assert_eq!(
            decompress(&o.stdout, ReadCompression::Auto).unwrap(),
            data,
            "we read {name}'s output"
        );
    }
}

/// The file name suffixes sinks add: the usual one of each format's tool.
#[test]
fn each_format_has_its_tools_extension() {
    let extensions: Vec<_> = ALL
        .into_iter()
        .map(|format| (format, format.extension()))
        .collect();
    assert_eq!(
        extensions,
        [
            (Compression::None, ""),
            (Compression::Gzip, ".gz"),
            (Compression::Deflate, ".zz"),
            (Compression::Lz4, ".lz4"),
            (Compression::Snappy, ".sz"),
            (Compression::Zstd, ".zst"),
        ]
    );
}

/// A sink appending to an existing file writes a second stream after the
/// first: every format reads both back.
#[test]
fn concatenated_streams_read_back_whole() {
    for format in ALL {
        let mut both = compress(b"first\n", format);
        both.extend(compress(b"second\n", format));
        assert_eq!(
            decompress(&both, ReadCompression::Auto).unwrap(),
            b"first\nsecond\n",
            "{format:?}"
        );
    }
}

/// A stream whose checksum does not match what it decodes to is an error,
/// for the formats that carry one.
#[test]
fn a_damaged_stream_with_a_checksum_is_an_error() {
    let data = b"hello hello hello, a line to check";
    for format in [Compression::Gzip, Compression::Snappy] {
        let mut packed = compress(data, format);
        // Gzip: the last 8 bytes are the CRC-32 and the length; snappy:
        // the last byte is the literal's, covered by the chunk's CRC-32C.
        let at = packed.len() - if format == Compression::Gzip { 6 } else { 1 };
        packed[at] ^= 0x55;
        assert!(
            decompress(&packed, ReadCompression::Auto).is_err(),
            "{format:?} took a damaged stream"
        );
    }
    let mut gz = compress(data, Compression::Gzip);
    let n = gz.len();
    gz[n - 6] ^= 0x55;
    match logbus_compress::decode_content("gzip", &gz, 1 << 20) {
        Err(logbus_compress::Undecodable::Malformed(m)) => {
            assert!(m.starts_with("gzip body: "), "{m}")
        }
        other => panic!("{other:?}"),
    }
}

/// `decode_content`'s limit, at the byte: a body of exactly `max` bytes
/// (as sent, or once decompressed) is taken, one more is too large; an
/// encoding it does not take is named.
#[test]
fn decode_content_takes_exactly_the_limit() {
    use logbus_compress::{Undecodable, decode_content};
    let body = vec![b'x'; 100];
    assert_eq!(decode_content("identity", &body, 100), Ok(None));
    assert_eq!(decode_content("", &body, 100), Ok(None));
    assert_eq!(
        decode_content("identity", &body, 99),
        Err(Undecodable::TooLarge(
            "the body is larger than 99 bytes".into()
        ))
    );
    for (encoding, format) in [
        ("gzip", Compression::Gzip),
        ("x-gzip", Compression::Gzip),
        (" ZSTD ", Compression::Zstd),
        ("deflate", Compression::Deflate),
    ] {
        let packed = compress(&body, format);
        assert_eq!(
            decode_content(encoding, &packed, 100),
            Ok(Some(body.clone())),
            "{encoding}"
        );
        assert_eq!(
            decode_content(encoding, &packed, 99),
            Err(Undecodable::TooLarge(
                "the body is larger than 99 bytes once decompressed".into()
            )),
            "{encoding}"
        );
    }
    assert_eq!(
        decode_content("br", &body, 100),
        Err(Undecodable::Unsupported(
            "Content-Encoding `br` is not supported (gzip, zstd, deflate)".into()
        ))
    );
}
