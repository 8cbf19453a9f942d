//! Avro object containers as an object format (for `sink: s3` and any
//! other sink that stores objects): the header (schema, codec, sync
//! marker) when the object opens, then a block of `block_events` records
//! at a time, each block's bytes handed out as soon as it is encoded. An
//! Avro container has no footer, so memory holds one block per open
//! object. An event that does not resolve against the schema is refused.

use std::sync::Arc;

use apache_avro::types::Value as Avro;
use apache_avro::{Codec, Schema, Writer};
use logbus_plugin_api::{Event, OptionError};
use logbus_sink::{Misfit, ObjectFormat, ObjectWriter};
use serde::Deserialize;
use serde_json::Value as Json;

use crate::codec::parse_schema;
use crate::sink::BlockCodec;

/// Options of Avro container objects (`sink: s3` with `object_format: avro`).
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AvroObjectOptions {
    /// The record schema (Avro JSON, object or string).
    pub schema: Json,
    /// Block compression: `none` (Avro's `null`) or `deflate`.
    #[serde(default)]
    pub codec: Option<BlockCodec>,
    /// Records per block.
    #[serde(default = "default_block_events")]
    #[schemars(range(min = 1))]
    pub block_events: usize,
}

fn default_block_events() -> usize {
    4096
}

impl AvroObjectOptions {
    /// The options' errors, their paths under `at` (the sink's key for
    /// these options).
    pub fn check(&self, at: &str) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if let Err(mut e) = parse_schema(&self.schema) {
            e.path.insert(0, at.to_string());
            errors.push(e);
        }
        if self.block_events == 0 {
            errors.push(OptionError::at(&[at, "block_events"], "must be at least 1"));
        }
        errors
    }
}

/// Makes an Avro container writer for each object.
pub struct AvroObjects {
    schema: Arc<Schema>,
    codec: Codec,
    block_events: usize,
}

impl AvroObjects {
    pub fn new(options: &AvroObjectOptions, at: &str) -> Result<Self, OptionError> {
        let schema = parse_schema(&options.schema).map_err(|mut e| {
            e.path.insert(0, at.to_string());
            e
        })?;
        Ok(AvroObjects {
            schema: Arc::new(schema),
            codec: match options.codec.unwrap_or_default() {
                BlockCodec::None => Codec::Null,
                BlockCodec::Deflate => Codec::Deflate,
            },
            block_events: options.block_events.max(1),
        })
    }
}

impl ObjectFormat for AvroObjects {
    fn open(&self) -> Result<Box<dyn ObjectWriter>, String> {
        let marker: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        let header = Writer::builder()
            .schema(&self.schema)
            .writer(Vec::new())
            .codec(self.codec)
            .marker(marker)
            .build()
            .into_inner()
            .map_err(|e| format!("writing the Avro header: {e}"))?;
        Ok(Box::new(AvroObject {
            schema: self.schema.clone(),
            codec: self.codec,
            marker,
            block_events: self.block_events,
            size: header.len() as u64,
            ready: header,
            block: Vec::new(),
            broken: None,
        }))
    }
}

struct AvroObject {
    schema: Arc<Schema>,
    codec: Codec,
    marker: [u8; 16],
    block_events: usize,
    /// Encoded blocks not yet taken.
    ready: Vec<u8>,
    /// Bytes of the object encoded so far.
    size: u64,
    /// The block being filled, resolved against the schema.
    block: Vec<Avro>,
    /// A block failed to encode: the object fails when finished.
    broken: Option<String>,
}

impl AvroObject {
    fn close_block(&mut self) -> Result<(), String> {
        if self.block.is_empty() {
            return Ok(());
        }
        let mut writer =
            Writer::append_to_with_codec(&self.schema, Vec::new(), self.codec, self.marker);
        for value in self.block.drain(..) {
            writer
                .append(value)
                .map_err(|e| format!("encoding an Avro record: {e}"))?;
        }
        let bytes = writer
            .into_inner()
            .map_err(|e| format!("encoding an Avro block: {e}"))?;
        self.size += bytes.len() as u64;
        self.ready.extend_from_slice(&bytes);
        Ok(())
    }
}

impl ObjectWriter for AvroObject {
    fn write(&mut self, event: &Event) -> Result<(), Misfit> {
        let Some(fields) = event.as_fields() else {
            return Err(Misfit::Never(
                "a raw event cannot be an Avro record; parse it first".into(),
            ));
        };
        let value = Avro::from(Json::Object(fields.clone()))
            .resolve(&self.schema)
            .map_err(|e| Misfit::Never(format!("the event does not fit the Avro schema: {e}")))?;
        self.block.push(value);
        if self.block.len() >= self.block_events
            && self.broken.is_none()
            && let Err(e) = self.close_block()
        {
            // Resolved values encode; if one ever does not, the object
            // fails when finished rather than losing the block silently.
            self.broken = Some(e);
        }
        Ok(())
    }

    fn ready(&mut self) -> &mut Vec<u8> {
        &mut self.ready
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn finish(mut self: Box<Self>) -> Result<Vec<u8>, String> {
        if let Some(e) = self.broken.take() {
            return Err(e);
        }
        self.close_block()?;
        Ok(std::mem::take(&mut self.ready))
    }
}
