//! The Avro codec functions and the two plugins.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use apache_avro::types::Value as Avro;
use apache_avro::{GenericSingleObjectReader, GenericSingleObjectWriter, Schema};
use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, EventError, Fields, LineBuffer, OptionError, Payload,
    Processor, StageKind, TypedPlugin, Verdict,
};
use serde::Deserialize;
use serde_json::{Map, Number, Value as Json};

/// How Avro data is laid out in an event.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Encoding {
    /// An object container file (header with schema, blocks of records).
    Container,
    /// `C3 01`, the schema's 8-byte CRC-64-AVRO fingerprint, one datum.
    SingleObject,
    /// One datum, nothing else (the schema must be known out of band).
    Datum,
}

/// An Avro value as event fields' JSON.
pub fn to_json(value: &Avro) -> Json {
    match value {
        Avro::Null => Json::Null,
        Avro::Boolean(b) => Json::Bool(*b),
        Avro::Int(i) | Avro::Date(i) | Avro::TimeMillis(i) => Json::from(*i),
        Avro::Long(i)
        | Avro::TimeMicros(i)
        | Avro::TimestampMillis(i)
        | Avro::TimestampMicros(i)
        | Avro::TimestampNanos(i)
        | Avro::LocalTimestampMillis(i)
        | Avro::LocalTimestampMicros(i)
        | Avro::LocalTimestampNanos(i) => Json::from(*i),
        Avro::Float(f) => Number::from_f64(f64::from(*f)).map_or(Json::Null, Json::Number),
        Avro::Double(f) => Number::from_f64(*f).map_or(Json::Null, Json::Number),
        Avro::Bytes(b) | Avro::Fixed(_, b) => {
            Json::Array(b.iter().map(|x| Json::from(*x)).collect())
        }
        Avro::String(s) | Avro::Enum(_, s) => Json::String(s.clone()),
        Avro::Union(_, v) => to_json(v),
        Avro::Array(items) => Json::Array(items.iter().map(to_json).collect()),
        Avro::Map(m) => Json::Object(m.iter().map(|(k, v)| (k.clone(), to_json(v))).collect()),
        Avro::Record(fields) => Json::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), to_json(v)))
                .collect(),
        ),
        Avro::Uuid(u) => Json::String(u.to_string()),
        Avro::Decimal(d) => Json::String(format!("{d:?}")),
        Avro::BigDecimal(d) => Json::String(d.to_string()),
        Avro::Duration(d) => Json::String(format!("{d:?}")),
    }
}

/// A record (or any value) as fields; a non-record value is wrapped as
/// `{"value": ...}`.
fn to_fields(value: &Avro) -> Fields {
    match to_json(value) {
        Json::Object(map) => map,
        other => {
            let mut map = Map::new();
            map.insert("value".into(), other);
            map
        }
    }
}

/// Why bytes are not Avro.
#[derive(Debug)]
pub struct CodecError(pub String);

/// Largest string, byte array or array/map block a datum may declare.
/// apache-avro reserves room for a block's declared item count up front
/// (about 48 bytes per item) against a limit counted in bytes, so a forged
/// count within its 512 MiB default can ask for tens of GiB and abort the
/// process (found by fuzzing). 16 Mi keeps the worst reservation near
/// 800 MiB of address space, most of it never touched.
pub const MAX_AVRO_ALLOCATION: usize = 16 << 20;

fn limits() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        apache_avro::max_allocation_bytes(MAX_AVRO_ALLOCATION);
    });
}

/// Default of `max_decoded_bytes`: what one event's Avro may come to once
/// decoded (the same default as the Parquet parser's).
pub const DEFAULT_MAX_DECODED_BYTES: usize = 256 << 20;

/// [`decode_within`] the default budget.
pub fn decode(
    bytes: &[u8],
    encoding: Encoding,
    schema: Option<&Schema>,
) -> Result<Vec<Fields>, CodecError> {
    decode_within(bytes, encoding, schema, DEFAULT_MAX_DECODED_BYTES)
}

/// Decodes one event's bytes, refusing first (see [`crate::bounds`]) input
/// whose values would come to more than `max_decoded_bytes`.
pub fn decode_within(
    bytes: &[u8],
    encoding: Encoding,
    schema: Option<&Schema>,
    max_decoded_bytes: usize,
) -> Result<Vec<Fields>, CodecError> {
    limits();
    let err = |e: apache_avro::Error| CodecError(e.to_string());
    let refused = |e: crate::bounds::OverBudget| CodecError(e.0);
    match encoding {
        Encoding::Container => {
            crate::bounds::check_container(bytes, max_decoded_bytes).map_err(refused)?;
            let read = Arc::new(AtomicUsize::new(0));
            let input = Counted {
                rest: bytes,
                read: read.clone(),
            };
            let at = |e: apache_avro::Error| {
                CodecError(format!("{e} (at byte {})", read.load(Ordering::Relaxed)))
            };
            let reader = match schema {
                Some(s) => apache_avro::Reader::with_schema(s, input),
                None => apache_avro::Reader::new(input),
            }
            .map_err(at)?;
            let mut out = Vec::new();
            for value in reader {
                out.push(to_fields(&value.map_err(at)?));
            }
            Ok(out)
        }
        Encoding::SingleObject => {
            let schema = schema.ok_or_else(|| CodecError("no schema".into()))?;
            // `C3 01` and the fingerprint, then the datum.
            if let Some(datum) = bytes.get(10..) {
                crate::bounds::check_datum(datum, schema, max_decoded_bytes).map_err(refused)?;
            }
            let reader = GenericSingleObjectReader::new(schema.clone()).map_err(err)?;
            let mut input = bytes;
            let value = reader
                .read_value(&mut input)
                .map_err(|e| at(bytes, input, e))?;
            trailing(bytes, input)?;
            Ok(vec![to_fields(&value)])
        }
        Encoding::Datum => {
            let schema = schema.ok_or_else(|| CodecError("no schema".into()))?;
            crate::bounds::check_datum(bytes, schema, max_decoded_bytes).map_err(refused)?;
            let mut input = bytes;
            let value = apache_avro::from_avro_datum(schema, &mut input, None)
                .map_err(|e| at(bytes, input, e))?;
            trailing(bytes, input)?;
            Ok(vec![to_fields(&value)])
        }
    }
}

/// A byte slice that counts what has been read from it, so a container
/// file's error can say how far the reader got.
struct Counted<'a> {
    rest: &'a [u8],
    read: Arc<AtomicUsize>,
}

impl std::io::Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.rest.read(buf)?;
        self.read.fetch_add(n, Ordering::Relaxed);
        Ok(n)
    }
}

/// An error with the offset the decoder had reached.
fn at(all: &[u8], rest: &[u8], e: apache_avro::Error) -> CodecError {
    CodecError(format!("{e} (at byte {})", all.len() - rest.len()))
}

fn trailing(all: &[u8], rest: &[u8]) -> Result<(), CodecError> {
    if rest.is_empty() {
        Ok(())
    } else {
        Err(CodecError(format!(
            "{} bytes left after the datum (at byte {})",
            rest.len(),
            all.len() - rest.len()
        )))
    }
}

/// Encodes fields against `schema`.
pub fn encode(
    fields: &Fields,
    schema: &Schema,
    encoding: Encoding,
    writer: &mut Option<GenericSingleObjectWriter>,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    limits();
    let value = Avro::from(Json::Object(fields.clone()))
        .resolve(schema)
        .map_err(|e| CodecError(format!("the event does not fit the schema: {e}")))?;
    match encoding {
        Encoding::SingleObject => {
            let w = writer.get_or_insert_with(|| {
                GenericSingleObjectWriter::new_with_capacity(schema, 1024)
                    .expect("a record schema was checked at build time")
            });
            w.write_value(value, out)
                .map_err(|e| CodecError(e.to_string()))?;
        }
        Encoding::Datum => {
            out.extend(
                apache_avro::to_avro_datum(schema, value).map_err(|e| CodecError(e.to_string()))?,
            );
        }
        Encoding::Container => {
            let mut w = apache_avro::Writer::new(schema, Vec::new());
            w.append(value).map_err(|e| CodecError(e.to_string()))?;
            out.extend(w.into_inner().map_err(|e| CodecError(e.to_string()))?);
        }
    }
    Ok(())
}

/// Options of `parser: avro`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AvroParserOptions {
    /// `container` (default), `single-object` or `datum`.
    #[serde(default = "container")]
    pub encoding: Encoding,
    /// The schema (Avro JSON, as an object or a string). Required for
    /// `single-object` and `datum`; for `container`, the reader schema.
    #[serde(default)]
    pub schema: Option<Json>,
    /// The most memory one event's Avro may take once decoded (the Avro
    /// values and the fields made from them, estimated from the bytes
    /// before anything is decoded). An event over it is refused whole,
    /// with an error naming the byte where the budget ran out.
    #[serde(default = "default_max_decoded_bytes")]
    pub max_decoded_bytes: usize,
}

fn default_max_decoded_bytes() -> usize {
    DEFAULT_MAX_DECODED_BYTES
}

fn container() -> Encoding {
    Encoding::Container
}

pub(crate) fn parse_schema(schema: &Json) -> Result<Schema, OptionError> {
    let text = match schema {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    };
    Schema::parse_str(&text)
        .map_err(|e| OptionError::at(&["schema"], format!("not an Avro schema: {e}")))
}

impl CheckOptions for AvroParserOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors: Vec<OptionError> = match (&self.schema, self.encoding) {
            (None, Encoding::SingleObject | Encoding::Datum) => vec![OptionError::at(
                &["schema"],
                "`single-object` and `datum` need the schema",
            )],
            (Some(s), _) => parse_schema(s).err().into_iter().collect(),
            (None, Encoding::Container) => Vec::new(),
        };
        if self.max_decoded_bytes == 0 {
            errors.push(OptionError::at(
                &["max_decoded_bytes"],
                "must be at least 1, got 0",
            ));
        }
        errors
    }
}

pub struct AvroParser;

struct ParseAvro {
    encoding: Encoding,
    schema: Option<Schema>,
    max_decoded_bytes: usize,
}

impl Processor for ParseAvro {
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        let Payload::Raw(bytes) = event.payload() else {
            return Err(EventError::new(
                "the avro parser needs a raw event; this one is already parsed",
            ));
        };
        let records = decode_within(
            bytes,
            self.encoding,
            self.schema.as_ref(),
            self.max_decoded_bytes,
        )
        .map_err(|e| EventError::new(format!("not Avro: {}", e.0)))?;
        if self.encoding != Encoding::Container && records.len() == 1 {
            let fields = records.into_iter().next().expect("one");
            *event.payload_mut() = Payload::Fields(fields);
            return Ok(Verdict::Keep);
        }
        let meta = event.meta().clone();
        Ok(Verdict::Replace(
            records
                .into_iter()
                .map(|f| Event::fields(f, meta.clone()))
                .collect(),
        ))
    }
}

impl TypedPlugin for AvroParser {
    type Options = AvroParserOptions;
    const NAME: &'static str = "avro";
    const KIND: StageKind = StageKind::Parser;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str = "Reads Avro: a whole object container file per event (one event per record), or single-object encoded / bare datums with a configured schema.";
    /// Records of the writer's schema: parsed, fields open (a union's
    /// branches differ).
    fn flow(&self, _o: &AvroParserOptions) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::open_fields(&[]).needs(logbus_plugin_api::Needs::Raw)
    }

    fn build(&self, o: AvroParserOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        let schema = o.schema.as_ref().map(parse_schema).transpose()?;
        Ok(Box::new(ParseAvro {
            encoding: o.encoding,
            schema,
            max_decoded_bytes: o.max_decoded_bytes,
        }))
    }
}

/// Options of `formatter: avro`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AvroFormatterOptions {
    /// `single-object` (default: header with the schema fingerprint, then
    /// the datum), `datum`, or `container` (a whole container file per
    /// event: only for one-record files).
    #[serde(default = "single_object")]
    pub encoding: Encoding,
    /// The schema events are written with (Avro JSON, object or string).
    pub schema: Json,
}

fn single_object() -> Encoding {
    Encoding::SingleObject
}

impl CheckOptions for AvroFormatterOptions {
    fn check(&self) -> Vec<OptionError> {
        // Any schema that parses can be written single-object (its
        // fingerprint always exists).
        parse_schema(&self.schema).err().into_iter().collect()
    }
}

pub struct AvroFormatter;

struct FormatAvro {
    encoding: Encoding,
    schema: Schema,
    writer: Option<GenericSingleObjectWriter>,
    buffer: LineBuffer,
}

impl Processor for FormatAvro {
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        let fields = event.as_fields().ok_or_else(|| {
            EventError::new("the avro formatter needs a parsed event; add a parser before it")
        })?;
        let (schema, encoding, writer) = (&self.schema, self.encoding, &mut self.writer);
        let line = self.buffer.line(|out| {
            encode(fields, schema, encoding, writer, out).map_err(|e| EventError::new(e.0))
        })?;
        *event.payload_mut() = Payload::Raw(line);
        Ok(Verdict::Keep)
    }
}

impl TypedPlugin for AvroFormatter {
    type Options = AvroFormatterOptions;
    const NAME: &'static str = "avro";
    const KIND: StageKind = StageKind::Formatter;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str = "Writes each event as Avro against the configured schema: single-object encoding (default) or a bare datum.";
    fn flow(&self, _o: &AvroFormatterOptions) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::raw().needs(logbus_plugin_api::Needs::Fields)
    }

    fn build(
        &self,
        o: AvroFormatterOptions,
        _cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(FormatAvro {
            encoding: o.encoding,
            schema: parse_schema(&o.schema)?,
            writer: None,
            buffer: LineBuffer::new(),
        }))
    }
}
