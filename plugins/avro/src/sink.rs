//! `sink: avro`: events into an Avro object container file.
//!
//! A container file is a header (schema, codec, sync marker) followed by
//! blocks, each ending with the marker, and no footer: a file cut after
//! any block is readable up to that block. So the sink writes a block
//! whenever no more input is ready (or a block reaches `block_events`),
//! and counts the block's events committed once the block is written (and
//! synced with `sync: true`), exactly as the line-oriented file sink does.
//!
//! Appending to an existing container file continues it (same schema,
//! same marker); a file written with another schema is refused.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;

use apache_avro::types::Value as Avro;
use apache_avro::{Codec, Schema, Writer};
use logbus_plugin_api::{
    BuildContext, CheckOptions, InputBatch, OptionError, Sink, SinkContext, StageError, StageKind,
    TypedPlugin, async_trait, blocking,
};
use serde::Deserialize;
use serde_json::Value as Json;

use crate::codec::parse_schema;

/// Options of `sink: avro`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AvroSinkOptions {
    /// The container file; relative paths resolve against the pipeline file.
    pub path: PathBuf,
    /// The record schema (Avro JSON, object or string).
    pub schema: Json,
    /// Block compression inside the file: `none` (default; Avro calls it
    /// `null`, which is also accepted, quoted or not) or `deflate`.
    #[serde(default)]
    pub codec: Option<BlockCodec>,
    /// Continue an existing file (true, default) or start a new one.
    #[serde(default = "yes")]
    pub append: bool,
    /// fsync after every block, so committed means on disk.
    #[serde(default)]
    pub sync: bool,
    /// Most events per block.
    #[serde(default = "default_block")]
    #[schemars(range(min = 1))]
    pub block_events: usize,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum BlockCodec {
    #[default]
    #[serde(alias = "null")]
    None,
    Deflate,
}

fn yes() -> bool {
    true
}

fn default_block() -> usize {
    4096
}

impl CheckOptions for AvroSinkOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if self.path.as_os_str().is_empty() {
            errors.push(OptionError::at(&["path"], "must not be empty"));
        }
        if let Err(e) = parse_schema(&self.schema) {
            errors.push(e);
        }
        // `block_events` of 0 is refused by the schema's range.
        errors
    }
}

pub struct AvroSink;

impl TypedPlugin for AvroSink {
    type Options = AvroSinkOptions;
    const NAME: &'static str = "avro";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "Writes events as records of an Avro object container file, a block per write; committed once the block is written.";

    fn build(
        &self,
        options: AvroSinkOptions,
        cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let schema = parse_schema(&options.schema)?;
        Ok(Box::new(AvroFileSink {
            path: cx.resolve(&options.path),
            schema,
            options,
        }))
    }
}

struct AvroFileSink {
    path: PathBuf,
    schema: Schema,
    options: AvroSinkOptions,
}

impl AvroFileSink {
    /// Opens the file: a new container, or the existing one continued
    /// after its last whole block (a block cut by an interrupted write held
    /// only events never counted committed, so it is cut off and they are
    /// written again).
    fn open(&self) -> Result<(File, Option<[u8; 16]>), StageError> {
        let what = self.path.display().to_string();
        let existing =
            self.options.append && std::fs::metadata(&self.path).is_ok_and(|m| m.len() > 0);
        if !existing {
            let file = File::create(&self.path)
                .map_err(|e| StageError::io(format!("creating {what}"), e))?;
            return Ok((file, None));
        }
        let bytes =
            std::fs::read(&self.path).map_err(|e| StageError::io(format!("reading {what}"), e))?;
        let reader = apache_avro::Reader::new(&bytes[..])
            .map_err(|e| StageError::Other(format!("{what} is not an Avro container file: {e}")))?;
        let theirs = reader.writer_schema().canonical_form();
        if theirs != self.schema.canonical_form() {
            return Err(StageError::Other(format!(
                "{what} was written with another schema; appending would corrupt it (use `append: false` or another path)"
            )));
        }
        let (marker, end) = whole_blocks(&bytes).ok_or_else(|| {
            StageError::Other(format!(
                "{what} is not an Avro container file: its header is cut"
            ))
        })?;
        let file = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| StageError::io(format!("opening {what}"), e))?;
        if end < bytes.len() {
            tracing::warn!(
                file = %what,
                "{} bytes after the last whole block (an interrupted write) are cut off; their events were never counted written",
                bytes.len() - end
            );
            file.set_len(end as u64)
                .map_err(|e| StageError::io(format!("cutting the torn end of {what}"), e))?;
        }
        Ok((file, Some(marker)))
    }
}

/// A container file's sync marker (from its header) and where its last
/// whole block ends, found by walking the blocks by their own lengths;
/// `None` when the header itself is cut.
pub(crate) fn whole_blocks(bytes: &[u8]) -> Option<([u8; 16], usize)> {
    /// A zigzag-encoded varint `long` at `*at`.
    fn long(bytes: &[u8], at: &mut usize) -> Option<i64> {
        let mut n: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = *bytes.get(*at)?;
            *at += 1;
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some((n >> 1) as i64 ^ -((n & 1) as i64));
            }
        }
        None
    }
    fn skip(bytes: &[u8], at: &mut usize, len: i64) -> Option<()> {
        let end = at.checked_add(usize::try_from(len).ok()?)?;
        (end <= bytes.len()).then(|| *at = end)
    }
    let mut at = 4;
    if bytes.get(..4)? != b"Obj\x01" {
        return None;
    }
    // The metadata map: blocks of entries (a negative count is followed by
    // the block's size in bytes), ended by a zero count.
    loop {
        let count = long(bytes, &mut at)?;
        let entries = match count.signum() {
            0 => break,
            1 => count,
            _ => {
                long(bytes, &mut at)?;
                count.checked_neg()?
            }
        };
        for _ in 0..entries {
            let key = long(bytes, &mut at)?;
            skip(bytes, &mut at, key)?;
            let value = long(bytes, &mut at)?;
            skip(bytes, &mut at, value)?;
        }
    }
    let marker: [u8; 16] = bytes.get(at..at + 16)?.try_into().ok()?;
    at += 16;
    // Blocks: a count, a size, the data, the marker. The end of the file
    // ends the walk as any cut block does: nothing more is whole.
    let block_after = |mut at: usize| -> Option<usize> {
        long(bytes, &mut at).filter(|&count| count >= 0)?;
        let size = long(bytes, &mut at)?;
        skip(bytes, &mut at, size)?;
        (bytes.get(at..at + 16)? == marker).then_some(at + 16)
    };
    let mut end = at;
    while let Some(next) = block_after(end) {
        end = next;
    }
    Some((marker, end))
}

#[async_trait]
impl Sink for AvroFileSink {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        let what = self.path.display().to_string();
        let (file, marker) = blocking(|| self.open())?;
        // The writer owns the file; this handle syncs it.
        let sync_handle = file
            .try_clone()
            .map_err(|e| StageError::io(format!("opening {what}"), e))?;
        let codec = match self.options.codec.unwrap_or_default() {
            BlockCodec::None => Codec::Null,
            BlockCodec::Deflate => Codec::Deflate,
        };
        let sync = self.options.sync;
        let io = |e: apache_avro::Error| StageError::Other(format!("writing {what}: {e}"));
        // A new file gets its header at once, even if no event ever comes
        // (apache-avro's writer would write it with the first block).
        let marker = match marker {
            Some(marker) => marker,
            None => {
                let header = Writer::with_codec(&self.schema, Vec::new(), codec)
                    .into_inner()
                    .map_err(io)?;
                blocking(|| {
                    use std::io::Write;
                    (&file).write_all(&header)?;
                    if sync {
                        file.sync_data()?;
                    }
                    Ok::<(), std::io::Error>(())
                })
                .map_err(|e| StageError::io(format!("writing {what}"), e))?;
                header[header.len() - 16..].try_into().expect("16 bytes")
            }
        };
        let mut writer = Writer::append_to_with_codec(&self.schema, file, codec, marker);
        let mut held: Vec<InputBatch> = Vec::new();
        let mut pending = 0usize;
        let mut in_block = 0usize;
        let mut warned = false;
        let flush = |writer: &mut Writer<'_, File>,
                     held: &mut Vec<InputBatch>,
                     pending: &mut usize,
                     in_block: &mut usize,
                     cx: &SinkContext|
         -> Result<(), StageError> {
            blocking(|| {
                writer.flush().map_err(io)?;
                if sync {
                    sync_handle
                        .sync_data()
                        .map_err(|e| StageError::io(format!("syncing {what}"), e))?;
                }
                Ok::<(), StageError>(())
            })?;
            for batch in held.iter_mut() {
                batch.settle(logbus_plugin_api::Outcome::Delivered);
            }
            cx.committed(*pending);
            *pending = 0;
            *in_block = 0;
            held.clear();
            Ok(())
        };
        loop {
            let next = match cx.input.try_recv() {
                Some(batch) => Some(batch),
                None => {
                    flush(&mut writer, &mut held, &mut pending, &mut in_block, cx)?;
                    cx.input.recv().await
                }
            };
            let Some(mut batch) = next else { break };
            cx.metrics.add_in(batch.len() as u64);
            let mut cut = false;
            for event in batch.events_mut() {
                let resolved = match event.as_fields() {
                    Some(f) => Avro::from(Json::Object(f.clone()))
                        .resolve(&self.schema)
                        .map_err(|e| format!("an event does not fit the schema: {e}")),
                    None => Err("a raw event reached the avro sink; parse it first".into()),
                };
                match resolved {
                    Ok(value) => {
                        writer.append(value).map_err(io)?;
                        pending += 1;
                        in_block += 1;
                        // A block is cut at `block_events`, also inside a
                        // batch; the batch counts committed once its last
                        // block is written.
                        if in_block >= self.options.block_events {
                            blocking(|| writer.flush().map_err(io))?;
                            in_block = 0;
                            cut = true;
                        }
                    }
                    Err(why) => {
                        // The first says why; all are counted as errored.
                        if !warned {
                            tracing::warn!(file = %what, "{why}; counted as errored (later ones are counted, not logged)");
                            warned = true;
                        }
                        event.settle(logbus_plugin_api::Outcome::Rejected);
                        cx.metrics.add_errored(1);
                    }
                }
            }
            held.push(batch);
            if cut {
                flush(&mut writer, &mut held, &mut pending, &mut in_block, cx)?;
            }
        }
        flush(&mut writer, &mut held, &mut pending, &mut in_block, cx)?;
        Ok(())
    }
}
