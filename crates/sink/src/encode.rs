//! Events become bytes before they are batched, not when the request is
//! built, so the batcher knows a batch's exact size: `max_bytes` is the
//! size of the body the destination receives (before any compression the
//! service applies), framing included, never an estimate.

use logbus_plugin_api::{Event, Payload};

/// What goes around and between the encoded events of one request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    pub prefix: &'static [u8],
    pub separator: &'static [u8],
    pub suffix: &'static [u8],
}

impl Framing {
    /// Items back to back (each item carries its own terminator).
    pub const CONCAT: Framing = Framing {
        prefix: b"",
        separator: b"",
        suffix: b"",
    };
    /// `[a,b,c]`.
    pub const JSON_ARRAY: Framing = Framing {
        prefix: b"[",
        separator: b",",
        suffix: b"]",
    };
}

/// Turns one event into the bytes of one item of a request body.
pub trait Encoder: Send + Sync + 'static {
    fn framing(&self) -> Framing {
        Framing::CONCAT
    }
    /// Appends `event`'s item to `out`. On error nothing the caller keeps
    /// was written (the batcher discards `out`), and the event is rejected
    /// with the message.
    fn encode(&self, event: &Event, out: &mut Vec<u8>) -> Result<(), String>;
}

/// Appends a structured event as JSON, a raw one as its bytes.
pub fn write_json_or_raw(event: &Event, out: &mut Vec<u8>) -> Result<(), String> {
    match event.payload() {
        Payload::Raw(b) => out.extend_from_slice(b),
        Payload::Fields(f) => {
            serde_json::to_writer(&mut *out, f).map_err(|e| format!("encoding as JSON: {e}"))?
        }
        Payload::Lazy(l) => l.write_json(out),
    }
    Ok(())
}

/// One event per line: structured events as JSON, raw ones as they are.
pub struct JsonLines;

impl Encoder for JsonLines {
    fn encode(&self, event: &Event, out: &mut Vec<u8>) -> Result<(), String> {
        write_json_or_raw(event, out)?;
        out.push(b'\n');
        Ok(())
    }
}

/// A JSON array of the events (raw events must already be JSON).
pub struct JsonArray;

impl Encoder for JsonArray {
    fn framing(&self) -> Framing {
        Framing::JSON_ARRAY
    }
    fn encode(&self, event: &Event, out: &mut Vec<u8>) -> Result<(), String> {
        write_json_or_raw(event, out)
    }
}
