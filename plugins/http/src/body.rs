//! Request bodies of `source: http`: decompression and splitting into
//! events, apart from the server so that they can be fuzzed on their own
//! (they read whatever a client sends).

use std::sync::Arc;

use logbus_plugin_api::{Bytes, Event, Meta};

use crate::source::BodyFormat;

pub use logbus_compress::Undecodable;

/// The body decompressed per its `Content-Encoding`, at most `max` bytes
/// (see [`logbus_compress::decode_content`]).
pub fn decode(encoding: &str, body: Bytes, max: usize) -> Result<Bytes, Undecodable> {
    Ok(
        match logbus_compress::decode_content(encoding, &body, max)? {
            None => body,
            Some(out) => Bytes::from(out),
        },
    )
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
    // An empty or blank line makes no event.
    if !body[start..end].iter().all(u8::is_ascii_whitespace) {
        events.push(Event::raw(body.slice(start..end), meta.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e.payload() {
                logbus_plugin_api::Payload::Raw(b) => String::from_utf8(b.to_vec()).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    fn split_as(
        format: BodyFormat,
        body: &'static str,
        max: usize,
    ) -> Result<Vec<String>, Refused> {
        split(
            &Bytes::from_static(body.as_bytes()),
            format,
            &"in".into(),
            max,
        )
        .map(|e| texts(&e))
    }

    #[test]
    fn lines_drop_carriage_returns_and_blank_lines_and_stop_past_max() {
        assert_eq!(
            split_as(BodyFormat::Lines, "a\r\n\n  \nb\nc", 3).unwrap(),
            ["a", "b", "c"]
        );
        assert_eq!(
            split_as(BodyFormat::Lines, "\nx\r\n\r\n", 3).unwrap(),
            ["x"]
        );
        assert_eq!(
            split_as(BodyFormat::Lines, "a\nb\nc\n", 2),
            Err(Refused::TooMany)
        );
        assert_eq!(
            split_as(BodyFormat::Lines, "a\nb\nc", 2),
            Err(Refused::TooMany)
        );
    }

    #[test]
    fn a_json_array_gives_each_element_up_to_max() {
        let body = r#"[{"a":1}, "two", 3]"#;
        assert_eq!(
            split_as(BodyFormat::JsonArray, body, 3).unwrap(),
            [r#"{"a":1}"#, r#""two""#, "3"]
        );
        assert_eq!(split_as(BodyFormat::JsonArray, body, 4).unwrap().len(), 3);
        assert_eq!(
            split_as(BodyFormat::JsonArray, body, 2),
            Err(Refused::TooMany)
        );
        assert!(matches!(
            split_as(BodyFormat::JsonArray, "{}", 2),
            Err(Refused::Malformed(m)) if m.starts_with("the body is not a JSON array")
        ));
    }
}
