//! `sink: parquet`: events into Parquet files.
//!
//! A Parquet file is readable only once its footer is written, so events
//! can count as committed only when their file is closed. The sink
//! therefore writes one file per burst: it takes input while more is ready
//! (and fewer than `max_rows` are held), then writes every held event as
//! one file (to a temporary name, synced, then renamed into place, so a
//! reader never sees half a file) and commits them. The events it holds are
//! still counted against its input queue, so a file has at most as many
//! rows as the queue holds: raise the stage's `queue.size` (or let input
//! arrive in larger bursts) for larger files.
//!
//! The schema of each file is inferred from its events (arrow-json's
//! inference: integers, floats, booleans, strings, lists, structs; a field
//! missing from some events is nullable).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_json::reader::infer_json_schema_from_iterator;
use logbus_plugin_api::{
    BuildContext, CheckOptions, InputBatch, OptionError, Sink, SinkContext, StageError, StageKind,
    TypedPlugin, async_trait, blocking,
};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, GzipLevel, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde::Deserialize;
use serde_json::Value;

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum PageCompression {
    None,
    Snappy,
    Gzip,
    Lz4,
    #[default]
    Zstd,
}

/// Options of `sink: parquet`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParquetSinkOptions {
    /// Path of each file, with `{n}` where its sequence number goes
    /// (`out/events-{n}.parquet`); numbering continues after the highest
    /// existing file. Relative paths resolve against the pipeline file.
    pub path: String,
    /// Page compression (default `zstd`).
    #[serde(default)]
    pub compression: PageCompression,
    /// Most rows per file (a single input batch larger than this still
    /// goes into one file).
    #[serde(default = "default_max_rows")]
    #[schemars(range(min = 1))]
    pub max_rows: usize,
    /// The columns, in order, and their types (`int64`, `int32`,
    /// `float64`, `float32`, `boolean`, `string`); all nullable. Without
    /// it the schema is inferred from each file's events. With it, an event
    /// holding a field outside the schema, or a value of another type, is
    /// counted as errored and not written.
    #[serde(default)]
    pub schema: Option<serde_json::Map<String, Value>>,
}

/// A column type of a given schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Int64,
    Int32,
    Float64,
    Float32,
    Boolean,
    String,
}

impl ColumnType {
    fn parse(name: &str) -> Option<ColumnType> {
        Some(match name {
            "int64" => ColumnType::Int64,
            "int32" => ColumnType::Int32,
            "float64" => ColumnType::Float64,
            "float32" => ColumnType::Float32,
            "boolean" => ColumnType::Boolean,
            "string" => ColumnType::String,
            _ => return None,
        })
    }

    fn arrow(self) -> arrow_schema::DataType {
        use arrow_schema::DataType;
        match self {
            ColumnType::Int64 => DataType::Int64,
            ColumnType::Int32 => DataType::Int32,
            ColumnType::Float64 => DataType::Float64,
            ColumnType::Float32 => DataType::Float32,
            ColumnType::Boolean => DataType::Boolean,
            ColumnType::String => DataType::Utf8,
        }
    }

    fn accepts(self, v: &Value) -> bool {
        match (self, v) {
            (_, Value::Null) => true,
            (ColumnType::Int64, Value::Number(n)) => n.is_i64(),
            (ColumnType::Int32, Value::Number(n)) => {
                n.as_i64().is_some_and(|i| i32::try_from(i).is_ok())
            }
            (ColumnType::Float64 | ColumnType::Float32, Value::Number(_)) => true,
            (ColumnType::Boolean, Value::Bool(_)) => true,
            (ColumnType::String, Value::String(_)) => true,
            _ => false,
        }
    }
}

/// A configured schema: the Arrow schema and each column's type.
pub struct GivenSchema {
    pub arrow: arrow_schema::SchemaRef,
    columns: Vec<(String, ColumnType)>,
}

impl GivenSchema {
    pub fn parse(map: &serde_json::Map<String, Value>) -> Result<GivenSchema, OptionError> {
        let mut columns = Vec::new();
        for (name, t) in map {
            let t = t.as_str().and_then(ColumnType::parse).ok_or_else(|| {
                OptionError::at(
                    &["schema", name],
                    "must be one of int64, int32, float64, float32, boolean, string",
                )
            })?;
            columns.push((name.clone(), t));
        }
        if columns.is_empty() {
            return Err(OptionError::at(
                &["schema"],
                "must name at least one column",
            ));
        }
        let fields: Vec<arrow_schema::Field> = columns
            .iter()
            .map(|(n, t)| arrow_schema::Field::new(n, t.arrow(), true))
            .collect();
        Ok(GivenSchema {
            arrow: Arc::new(arrow_schema::Schema::new(fields)),
            columns,
        })
    }

    /// Whether an event fits: no field outside the schema, every value of
    /// its column's type (or null).
    pub fn fits(&self, row: &serde_json::Map<String, Value>) -> bool {
        row.iter().all(|(k, v)| {
            self.columns
                .iter()
                .find(|(n, _)| n == k)
                .is_some_and(|(_, t)| t.accepts(v))
        })
    }
}

fn default_max_rows() -> usize {
    1_000_000
}

impl CheckOptions for ParquetSinkOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if self.path.matches("{n}").count() != 1 {
            errors.push(OptionError::at(
                &["path"],
                "must contain `{n}` once (each file gets its own number)",
            ));
        }
        if self.max_rows == 0 {
            errors.push(OptionError::at(&["max_rows"], "must be at least 1"));
        }
        if let Some(schema) = &self.schema
            && let Err(e) = GivenSchema::parse(schema)
        {
            errors.push(e);
        }
        errors
    }
}

pub struct ParquetSink;

impl TypedPlugin for ParquetSink {
    type Options = ParquetSinkOptions;
    const NAME: &'static str = "parquet";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "Writes events to Parquet files, one file per burst of input; committed when the file is closed.";

    fn build(
        &self,
        options: ParquetSinkOptions,
        cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let template = cx.resolve(Path::new(&options.path));
        let given = options
            .schema
            .as_ref()
            .map(GivenSchema::parse)
            .transpose()?;
        Ok(Box::new(ParquetFiles {
            template: template.to_string_lossy().into_owned(),
            options,
            given,
        }))
    }
}

struct ParquetFiles {
    template: String,
    options: ParquetSinkOptions,
    given: Option<GivenSchema>,
}

impl ParquetFiles {
    fn path(&self, n: u64) -> PathBuf {
        PathBuf::from(self.template.replace("{n}", &format!("{n:06}")))
    }

    /// The number after the highest existing file of this template.
    fn next_number(&self) -> u64 {
        let (before, after) = self.template.split_once("{n}").expect("checked");
        let dir = Path::new(before).parent().unwrap_or(Path::new("."));
        let prefix = Path::new(before)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Ok(entries) = std::fs::read_dir(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        }) else {
            return 0;
        };
        entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|name| {
                name.strip_prefix(&prefix)?
                    .strip_suffix(after)?
                    .parse::<u64>()
                    .ok()
            })
            .max()
            .map_or(0, |n| n + 1)
    }

    fn write_file(&self, n: u64, rows: &[Value]) -> Result<(), StageError> {
        let path = self.path(n);
        let what = path.display().to_string();
        let bytes = encode_file(rows, self.options.compression, self.given.as_ref())
            .map_err(|e| StageError::Other(format!("writing {what}: {e}")))?;
        let tmp = path.with_extension("parquet.tmp");
        let mut file = File::create(&tmp)
            .map_err(|e| StageError::io(format!("creating {}", tmp.display()), e))?;
        std::io::Write::write_all(&mut file, &bytes)
            .map_err(|e| StageError::io(format!("writing {}", tmp.display()), e))?;
        file.sync_all()
            .map_err(|e| StageError::io(format!("syncing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| StageError::io(format!("renaming to {what}"), e))?;
        Ok(())
    }
}

/// One Parquet file holding `rows` (JSON objects), with the schema
/// inferred from them.
pub fn encode_file(
    rows: &[Value],
    compression: PageCompression,
    given: Option<&GivenSchema>,
) -> Result<Vec<u8>, String> {
    let fail = |e: &dyn std::fmt::Display| e.to_string();
    let schema = match given {
        Some(g) => g.arrow.clone(),
        None => Arc::new(
            infer_json_schema_from_iterator(rows.iter().map(Ok::<_, arrow_schema_error::E>))
                .map_err(|e| fail(&e))?,
        ),
    };
    let mut decoder = arrow_json::ReaderBuilder::new(schema.clone())
        .with_batch_size(rows.len().max(1))
        .build_decoder()
        .map_err(|e| fail(&e))?;
    decoder.serialize(rows).map_err(|e| fail(&e))?;
    let batch = decoder
        .flush()
        .map_err(|e| fail(&e))?
        .ok_or_else(|| "no rows".to_string())?;
    let props = writer_properties(compression, rows.len().max(1));
    let mut writer = ArrowWriter::try_new(Vec::new(), schema, Some(props)).map_err(|e| fail(&e))?;
    writer.write(&batch).map_err(|e| fail(&e))?;
    writer.into_inner().map_err(|e| fail(&e))
}

/// Writer properties: page compression, and row groups of at most
/// `row_group_rows`.
pub fn writer_properties(compression: PageCompression, row_group_rows: usize) -> WriterProperties {
    let compression = match compression {
        PageCompression::None => Compression::UNCOMPRESSED,
        PageCompression::Snappy => Compression::SNAPPY,
        PageCompression::Gzip => Compression::GZIP(GzipLevel::default()),
        PageCompression::Lz4 => Compression::LZ4_RAW,
        PageCompression::Zstd => Compression::ZSTD(ZstdLevel::default()),
    };
    WriterProperties::builder()
        .set_compression(compression)
        .set_max_row_group_row_count(Some(row_group_rows.max(1)))
        .build()
}

/// The held batches' events are in a file that is written and closed:
/// their sources may move past them (those refused earlier stay rejected).
fn settle_written(held: &mut [InputBatch]) {
    for batch in held {
        batch.settle(logbus_plugin_api::Outcome::Delivered);
    }
}

/// `infer_json_schema_from_iterator` wants `Result<Value, ArrowError>`.
mod arrow_schema_error {
    pub type E = arrow_schema::ArrowError;
}

#[async_trait]
impl Sink for ParquetFiles {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        let mut n = blocking(|| self.next_number());
        let mut held: Vec<InputBatch> = Vec::new();
        let mut rows: Vec<Value> = Vec::new();
        let mut warned_misfit = false;
        loop {
            let idle = rows.len() >= self.options.max_rows;
            let next = if idle { None } else { cx.input.try_recv() };
            let next = match next {
                Some(batch) => Some(batch),
                None => {
                    if !rows.is_empty() {
                        blocking(|| self.write_file(n, &rows))?;
                        n += 1;
                        settle_written(&mut held);
                        cx.committed(rows.len());
                        rows.clear();
                        held.clear();
                    }
                    cx.input.recv().await
                }
            };
            let Some(mut batch) = next else { break };
            if !rows.is_empty() && rows.len() + batch.len() > self.options.max_rows {
                // This batch would overfill the file: close the file first.
                blocking(|| self.write_file(n, &rows))?;
                n += 1;
                settle_written(&mut held);
                cx.committed(rows.len());
                rows.clear();
                held.clear();
            }
            cx.metrics.add_in(batch.len() as u64);
            for event in batch.events_mut() {
                match event.as_fields() {
                    Some(f) if self.given.as_ref().is_some_and(|g| !g.fits(f)) => {
                        if !warned_misfit {
                            warned_misfit = true;
                            tracing::warn!(
                                "an event does not fit the parquet sink's schema and is counted as errored (further ones not logged)"
                            );
                        }
                        event.settle(logbus_plugin_api::Outcome::Rejected);
                        cx.metrics.add_errored(1);
                    }
                    Some(f) => rows.push(Value::Object(f.clone())),
                    None => {
                        tracing::warn!(
                            "a raw event reached the parquet sink and is counted as errored; parse it first"
                        );
                        event.settle(logbus_plugin_api::Outcome::Rejected);
                        cx.metrics.add_errored(1);
                    }
                }
            }
            held.push(batch);
        }
        if !rows.is_empty() {
            blocking(|| self.write_file(n, &rows))?;
            settle_written(&mut held);
            cx.committed(rows.len());
        }
        drop(held);
        Ok(())
    }
}
