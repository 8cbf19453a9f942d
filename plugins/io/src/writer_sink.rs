//! The write loop shared by the stdout and file sinks: encode events into
//! one buffer, write it when it is large or when no more input is ready,
//! and only then count the events committed and release their channel slots.

use std::io::Write;

use logbus_framing::Framing;
use logbus_plugin_api::{Event, InputBatch, Payload, SinkContext, StageError, blocking};

/// Buffer size at which a write is issued even if more input is ready.
pub const FLUSH_BYTES: usize = 256 * 1024;

/// Writes one event as a framed message (a line by default): raw bytes as
/// they are, structured fields as JSON.
pub fn encode_message(event: &Event, framing: Framing, buf: &mut Vec<u8>) {
    match (event.payload(), framing) {
        (Payload::Raw(bytes), _) => logbus_framing::encode(framing, bytes, buf),
        (Payload::Fields(fields), Framing::Newline) => {
            serde_json::to_writer(&mut *buf, fields).expect("writing JSON to a Vec cannot fail");
            buf.push(b'\n');
        }
        (Payload::Fields(fields), _) => {
            let json = serde_json::to_vec(fields).expect("writing JSON to a Vec cannot fail");
            logbus_framing::encode(framing, &json, buf);
        }
    }
}

pub async fn run_writer<W: Write + Send>(
    writer: &mut W,
    what: &str,
    framing: Framing,
    sync: impl Fn(&mut W) -> std::io::Result<()> + Send + Sync,
    cx: &mut SinkContext,
) -> Result<(), StageError> {
    let mut buf = Vec::with_capacity(FLUSH_BYTES + 64 * 1024);
    let mut held: Vec<InputBatch> = Vec::new();
    let mut pending = 0usize;
    let mut flush =
        |buf: &mut Vec<u8>, held: &mut Vec<InputBatch>, pending: &mut usize, cx: &SinkContext| {
            if !buf.is_empty() {
                blocking(|| {
                    writer.write_all(buf)?;
                    writer.flush()?;
                    sync(writer)
                })
                .map_err(|e| StageError::io(format!("writing {what}"), e))?;
                buf.clear();
            }
            cx.committed(*pending);
            *pending = 0;
            held.clear();
            Ok::<(), StageError>(())
        };
    loop {
        let next = match cx.input.try_recv() {
            Some(batch) => Some(batch),
            None => {
                flush(&mut buf, &mut held, &mut pending, cx)?;
                cx.input.recv().await
            }
        };
        let Some(batch) = next else { break };
        cx.metrics.add_in(batch.len() as u64);
        for event in batch.events() {
            encode_message(event, framing, &mut buf);
        }
        pending += batch.len();
        held.push(batch);
        if buf.len() >= FLUSH_BYTES {
            flush(&mut buf, &mut held, &mut pending, cx)?;
        }
    }
    flush(&mut buf, &mut held, &mut pending, cx)
}
