//! Request bodies of `source: http`: decompression and splitting into
//! events, apart from the server so that they can be fuzzed on their own
//! (they read whatever a client sends).

use std::io::Read;
use std::sync::Arc;

use logbus_plugin_api::{Bytes, Event, Meta};

use crate::source::BodyFormat;

/// Why a body could not be decompressed.
#[derive(Debug, PartialEq, Eq)]
pub enum Undecodable {
    /// A `Content-Encoding` this source does not take (415).
    Unsupported(String),
    /// The bytes are not what the encoding says (400).
    Malformed(String),
    /// Larger than allowed once decompressed (413).
    TooLarge(String),
}

/// The body decompressed per its `Content-Encoding`, at most `max` bytes:
/// decompression stops one byte past the limit, so a small body that
/// inflates to gigabytes costs `max + 1` bytes.
pub fn decode(encoding: &str, body: Bytes, max: usize) -> Result<Bytes, Undecodable> {
    let encoding = encoding.trim().to_ascii_lowercase();
    let format = match encoding.as_str() {
        "identity" | "" => {
            if body.len() > max {
                return Err(Undecodable::TooLarge(format!(
                    "the body is larger than {max} bytes"
                )));
            }
            return Ok(body);
        }
        "gzip" | "x-gzip" => logbus_compress::ReadCompression::Gzip,
        "zstd" => logbus_compress::ReadCompression::Zstd,
        "deflate" => logbus_compress::ReadCompression::Deflate,
        other => {
            return Err(Undecodable::Unsupported(format!(
                "Content-Encoding `{other}` is not supported (gzip, zstd, deflate)"
            )));
        }
    };
    let bad = |e: std::io::Error| Undecodable::Malformed(format!("{encoding} body: {e}"));
    let reader = logbus_compress::open(&body[..], format).map_err(bad)?;
    let mut out = Vec::new();
    // One byte past the limit tells "too large" from "exactly the limit".
    reader
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(bad)?;
    if out.len() > max {
        return Err(Undecodable::TooLarge(format!(
            "the body is larger than {max} bytes once decompressed"
        )));
    }
    Ok(Bytes::from(out))
}

/// Why a body made no events.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    TooMany,
    Malformed(String),
}

/// Events of a body: raw slices of it (lines), or each array element's
/// JSON; at most `max` of them (counted before any more is built).
pub fn split(
    body: &Bytes,
    format: BodyFormat,
    source: &Arc<str>,
    max: usize,
) -> Result<Vec<Event>, Refused> {
    let meta = Meta::now(source.clone());
    match format {
        BodyFormat::Lines => {
            let mut events = Vec::new();
            let mut start = 0;
            for end in memchr::memchr_iter(b'\n', body) {
                push_line(body, start, end, &meta, &mut events);
                if events.len() > max {
                    return Err(Refused::TooMany);
                }
                start = end + 1;
            }
            push_line(body, start, body.len(), &meta, &mut events);
            if events.len() > max {
                return Err(Refused::TooMany);
            }
            Ok(events)
        }
        BodyFormat::JsonArray => {
            let values: Vec<&serde_json::value::RawValue> = serde_json::from_slice(body)
                .map_err(|e| Refused::Malformed(format!("the body is not a JSON array: {e}")))?;
            if values.len() > max {
                return Err(Refused::TooMany);
            }
            Ok(values
                .into_iter()
                .map(|v| Event::raw(Bytes::copy_from_slice(v.get().as_bytes()), meta.clone()))
                .collect())
        }
    }
}

fn push_line(body: &Bytes, start: usize, mut end: usize, meta: &Meta, events: &mut Vec<Event>) {
    if end > start && body[end - 1] == b'\r' {
        end -= 1;
    }
    if end > start && !body[start..end].iter().all(u8::is_ascii_whitespace) {
        events.push(Event::raw(body.slice(start..end), meta.clone()));
    }
}
