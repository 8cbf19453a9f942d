//! Parquet as an object format (for `sink: s3` and any other sink that
//! stores objects): rows are encoded into row groups of `row_group_rows`
//! and each closed row group's bytes are handed out at once, so an object
//! of any size needs memory for one row group, not the object; the footer
//! comes at the end.
//!
//! The schema of an object is fixed by its first row group: with `schema`
//! configured, it is that one (an event outside it is refused); otherwise
//! it is inferred from the first row group's rows, widened as they come
//! (an integer column that meets a float becomes a float, scalars of
//! different kinds become strings, objects become structs with the union
//! of their fields). A later event that does not fit the object's schema
//! is not refused: the object is finished and the event starts the next
//! one, with its own schema.

use std::sync::Arc;

use arrow_json::reader::{Decoder, infer_json_schema_from_iterator};
use arrow_schema::{DataType, Field, Fields as ArrowFields, Schema, SchemaRef};
use logbus_plugin_api::{Event, OptionError};
use logbus_sink::{Misfit, ObjectFormat, ObjectWriter};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::writer::{GivenSchema, PageCompression, writer_properties};

/// Options of Parquet objects (`sink: s3` with `object_format: parquet`).
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParquetObjectOptions {
    /// Page compression inside the object (default `zstd`).
    #[serde(default)]
    pub compression: PageCompression,
    /// Rows per row group; memory holds about one row group per open
    /// object.
    #[serde(default = "default_row_group_rows")]
    #[schemars(range(min = 1))]
    pub row_group_rows: usize,
    /// The columns and their types (`int64`, `int32`, `float64`,
    /// `float32`, `boolean`, `string`), all nullable; an event outside it
    /// is refused. Without it each object's schema is inferred from its
    /// first row group.
    #[serde(default)]
    pub schema: Option<Map<String, Value>>,
}

impl Default for ParquetObjectOptions {
    fn default() -> Self {
        ParquetObjectOptions {
            compression: PageCompression::default(),
            row_group_rows: default_row_group_rows(),
            schema: None,
        }
    }
}

fn default_row_group_rows() -> usize {
    10_000
}

impl ParquetObjectOptions {
    /// The options' errors, their paths under `at` (the sink's key for
    /// these options).
    pub fn check(&self, at: &str) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if self.row_group_rows == 0 {
            errors.push(OptionError::at(
                &[at, "row_group_rows"],
                "must be at least 1",
            ));
        }
        if let Some(schema) = &self.schema
            && let Err(mut e) = GivenSchema::parse(schema)
        {
            e.path.insert(0, at.to_string());
            errors.push(e);
        }
        errors
    }
}

/// Makes a Parquet writer for each object.
pub struct ParquetObjects {
    props: WriterProperties,
    row_group_rows: usize,
    given: Option<Arc<GivenSchema>>,
}

impl ParquetObjects {
    pub fn new(options: &ParquetObjectOptions, at: &str) -> Result<Self, OptionError> {
        let given = match &options.schema {
            Some(s) => Some(Arc::new(GivenSchema::parse(s).map_err(|mut e| {
                e.path.insert(0, at.to_string());
                e
            })?)),
            None => None,
        };
        Ok(ParquetObjects {
            props: writer_properties(options.compression, options.row_group_rows),
            row_group_rows: options.row_group_rows.max(1),
            given,
        })
    }
}

impl ObjectFormat for ParquetObjects {
    fn open(&self) -> Result<Box<dyn ObjectWriter>, String> {
        let mut object = ParquetObject {
            props: self.props.clone(),
            row_group_rows: self.row_group_rows,
            given: self.given.clone(),
            first: Vec::new(),
            inferred: None,
            open: None,
            none: Vec::new(),
            broken: None,
        };
        if let Some(given) = &self.given {
            object.start(given.arrow.clone())?;
        }
        Ok(Box::new(object))
    }
}

/// The object's writer once its schema is known.
struct Open {
    schema: SchemaRef,
    decoder: Decoder,
    /// Rows in the decoder (the row group being built).
    rows: usize,
    writer: ArrowWriter<Vec<u8>>,
}

struct ParquetObject {
    props: WriterProperties,
    row_group_rows: usize,
    given: Option<Arc<GivenSchema>>,
    /// Before the schema is known: the first row group's rows, and the
    /// schema they have widened to so far.
    first: Vec<Value>,
    inferred: Option<Schema>,
    open: Option<Open>,
    /// `ready()` before anything is encoded.
    none: Vec<u8>,
    /// Encoding failed after the event was taken (a bug, if ever): the
    /// object fails when finished.
    broken: Option<String>,
}

impl ParquetObject {
    fn start(&mut self, schema: SchemaRef) -> Result<(), String> {
        let decoder = arrow_json::ReaderBuilder::new(schema.clone())
            .with_batch_size(self.row_group_rows)
            .with_coerce_primitive(true)
            .build_decoder()
            .map_err(|e| e.to_string())?;
        let writer = ArrowWriter::try_new(Vec::new(), schema.clone(), Some(self.props.clone()))
            .map_err(|e| e.to_string())?;
        self.open = Some(Open {
            schema,
            decoder,
            rows: 0,
            writer,
        });
        Ok(())
    }

    /// The first row group is complete (or the object ends): its schema is
    /// fixed and its rows encoded.
    fn settle_schema(&mut self) -> Result<(), String> {
        let schema = Arc::new(self.inferred.take().unwrap_or_else(Schema::empty));
        self.start(schema)?;
        let rows = std::mem::take(&mut self.first);
        let open = self.open.as_mut().expect("started");
        open.decoder.serialize(&rows).map_err(|e| e.to_string())?;
        open.rows = rows.len();
        close_row_group(open)
    }
}

/// Encodes the decoder's rows as one row group and closes it; all of its
/// bytes are then ready (the writer's own buffer is emptied too, or up to
/// 8 KiB of each row group, all of a small one, would wait for the next).
fn close_row_group(open: &mut Open) -> Result<(), String> {
    if open.rows == 0 {
        return Ok(());
    }
    let batch = open.decoder.flush().map_err(|e| e.to_string())?;
    open.rows = 0;
    if let Some(batch) = batch {
        open.writer.write(&batch).map_err(|e| e.to_string())?;
        open.writer.flush().map_err(|e| e.to_string())?;
        open.writer.sync().map_err(|e| e.to_string())?;
    }
    Ok(())
}

impl ObjectWriter for ParquetObject {
    fn write(&mut self, event: &Event) -> Result<(), Misfit> {
        let Some(row) = event.as_fields() else {
            return Err(Misfit::Never(
                "a raw event cannot be a Parquet row; parse it first".into(),
            ));
        };
        if let Some(given) = &self.given
            && !given.fits(row)
        {
            return Err(Misfit::Never(
                "the event does not fit the configured Parquet schema".into(),
            ));
        }
        if let Some(open) = &mut self.open {
            if !fits_struct(open.schema.fields(), row) {
                return Err(Misfit::NextObject(
                    "the event does not fit this object's schema".into(),
                ));
            }
            if let Err(e) = open.decoder.serialize(std::slice::from_ref(row)) {
                self.broken = Some(format!("encoding a row: {e}"));
                return Ok(());
            }
            open.rows += 1;
            if open.rows >= self.row_group_rows
                && let Err(e) = close_row_group(open)
            {
                self.broken = Some(e);
            }
            return Ok(());
        }
        // The first row group: widen the schema to take this row.
        let fits = self
            .inferred
            .as_ref()
            .is_some_and(|s| fits_struct(s.fields(), row));
        if !fits {
            let own =
                infer_json_schema_from_iterator(std::iter::once(
                    Ok::<_, arrow_schema::ArrowError>(Value::Object(row.clone())),
                ))
                .map_err(|e| Misfit::Never(format!("no Parquet type for the event: {e}")))?;
            let widened = match &self.inferred {
                None => own,
                Some(so_far) => match widen_fields(so_far.fields(), own.fields()) {
                    Some(fields) => Schema::new(fields),
                    None => {
                        return Err(Misfit::NextObject(
                            "the event's fields clash with this object's schema".into(),
                        ));
                    }
                },
            };
            self.inferred = Some(widened);
        }
        self.first.push(Value::Object(row.clone()));
        if self.first.len() >= self.row_group_rows
            && let Err(e) = self.settle_schema()
        {
            self.broken = Some(e);
        }
        Ok(())
    }

    fn ready(&mut self) -> &mut Vec<u8> {
        match &mut self.open {
            Some(open) => open.writer.inner_mut(),
            None => &mut self.none,
        }
    }

    /// Bytes encoded so far: every row group is closed as soon as it is
    /// written, so nothing is ever in progress inside the writer (rows not
    /// yet in a row group are still JSON in the decoder, and not counted).
    fn size(&self) -> u64 {
        self.open
            .as_ref()
            .map_or(0, |open| open.writer.bytes_written() as u64)
    }

    fn finish(mut self: Box<Self>) -> Result<Vec<u8>, String> {
        if let Some(e) = self.broken.take() {
            return Err(e);
        }
        if self.open.is_none() {
            self.settle_schema()?;
        }
        let mut open = self.open.take().expect("started");
        close_row_group(&mut open)?;
        open.writer.into_inner().map_err(|e| e.to_string())
    }
}

/// Whether a JSON object fits a struct's fields as the decoder reads them
/// (numbers and booleans into strings included).
fn fits_struct(fields: &ArrowFields, row: &Map<String, Value>) -> bool {
    row.iter().all(|(name, value)| {
        fields
            .iter()
            .find(|f| f.name() == name)
            .is_some_and(|f| fits(f.data_type(), value))
    })
}

fn fits(t: &DataType, v: &Value) -> bool {
    match (t, v) {
        (_, Value::Null) => true,
        (
            DataType::Utf8 | DataType::LargeUtf8,
            Value::String(_) | Value::Number(_) | Value::Bool(_),
        ) => true,
        (DataType::Int64, Value::Number(n)) => n.is_i64(),
        (DataType::Float64, Value::Number(_)) => true,
        (DataType::Boolean, Value::Bool(_)) => true,
        (DataType::List(item), Value::Array(items)) => {
            items.iter().all(|x| fits(item.data_type(), x))
        }
        (DataType::Struct(fields), Value::Object(map)) => fits_struct(fields, map),
        _ => false,
    }
}

/// The union of two inferred field lists, or `None` if a field's types
/// cannot be reconciled (an object where a scalar was).
fn widen_fields(a: &ArrowFields, b: &ArrowFields) -> Option<Vec<Field>> {
    let mut out: Vec<Field> = a.iter().map(|f| f.as_ref().clone()).collect();
    for f in b.iter() {
        match out.iter_mut().find(|o| o.name() == f.name()) {
            Some(o) => {
                let t = widen(o.data_type(), f.data_type())?;
                *o = Field::new(o.name(), t, true);
            }
            None => out.push(Field::new(f.name(), f.data_type().clone(), true)),
        }
    }
    Some(out)
}

fn widen(a: &DataType, b: &DataType) -> Option<DataType> {
    use DataType::*;
    let scalar = |t: &DataType| matches!(t, Int64 | Float64 | Boolean | Utf8);
    Some(match (a, b) {
        _ if a == b => a.clone(),
        (Null, t) | (t, Null) => t.clone(),
        (Int64, Float64) | (Float64, Int64) => Float64,
        (x, y) if scalar(x) && scalar(y) => Utf8,
        (List(x), List(y)) => {
            let t = widen(x.data_type(), y.data_type())?;
            List(Arc::new(Field::new(x.name(), t, true)))
        }
        (Struct(x), Struct(y)) => Struct(widen_fields(x, y)?.into()),
        _ => return None,
    })
}
