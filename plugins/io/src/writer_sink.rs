//! The write loop shared by the stdout and file sinks: encode events into
//! one buffer, write it when it is large or when no more input is ready,
//! and only then count the events committed, tell their sources they are
//! delivered (written to the kernel; synced too with `sync: true`), and
//! release their channel slots.

use std::io::Write;

use logbus_framing::Framing;
use logbus_plugin_api::{Event, InputBatch, Outcome, Payload, SinkContext, StageError, blocking};

/// A process killed in the middle of a write can leave a file ending in
/// part of a line. Appending to it as it is would glue the next event onto
/// that fragment, and a reader would lose both; the events of the fragment
/// were never confirmed, so they come again anyway. Before appending
/// newline-framed text, end such a fragment with a newline of its own.
/// Returns whether it did.
/// (`file` is the file opened for appending; `path` is read, since an
/// append-only handle cannot be.)
pub fn close_torn_line(path: &std::path::Path, file: &mut std::fs::File) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(false);
    }
    let mut last = [0u8; 1];
    std::fs::File::open(path)?.read_exact_at(&mut last, len - 1)?;
    if last[0] == b'\n' {
        return Ok(false);
    }
    file.write_all(b"\n")?;
    Ok(true)
}

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
        (Payload::Lazy(fields), Framing::Newline) => {
            fields.write_json(buf);
            buf.push(b'\n');
        }
        (Payload::Lazy(fields), _) => {
            let mut json = Vec::new();
            fields.write_json(&mut json);
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
            for batch in held.iter_mut() {
                batch.settle(Outcome::Delivered);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_last_line_is_closed_once_and_whole_files_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap()
        };
        assert!(!close_torn_line(&path, &mut open()).unwrap(), "empty file");
        std::fs::write(&path, "{\"id\":1}\n{\"id\":2,\"x").unwrap();
        assert!(close_torn_line(&path, &mut open()).unwrap());
        assert!(
            !close_torn_line(&path, &mut open()).unwrap(),
            "already closed"
        );
        open().write_all(b"{\"id\":3}\n").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "{\"id\":1}\n{\"id\":2,\"x\n{\"id\":3}\n");
    }
}
