//! Parquet file bytes to rows.

use arrow_json::writer::{LineDelimited, WriterBuilder};
use bytes::Bytes;
use logbus_plugin_api::{
    BuildContext, Built, CheckOptions, Event, EventError, Fields, OptionError, Payload, Processor,
    StageKind, TypedPlugin, Verdict,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Deserialize;

/// Every row of a Parquet file, as fields.
pub fn decode(file: Bytes) -> Result<Vec<Fields>, String> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| format!("not a Parquet file: {e}"))?
        .build()
        .map_err(|e| format!("cannot read the Parquet file: {e}"))?;
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| format!("cannot read a row group: {e}"))?;
        let mut out = Vec::new();
        {
            let mut writer = WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, LineDelimited>(&mut out);
            writer
                .write(&batch)
                .map_err(|e| format!("cannot convert a row group: {e}"))?;
            writer
                .finish()
                .map_err(|e| format!("cannot convert a row group: {e}"))?;
        }
        for line in out.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            rows.push(
                serde_json::from_slice::<Fields>(line)
                    .map_err(|e| format!("cannot convert a row: {e}"))?,
            );
        }
    }
    Ok(rows)
}

/// Options of `parser: parquet` (none yet).
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParquetParserOptions {}

impl CheckOptions for ParquetParserOptions {}

pub struct ParquetParser;

struct ParseParquet;

impl Processor for ParseParquet {
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        let Payload::Raw(bytes) = event.payload() else {
            return Err(EventError::new(
                "the parquet parser needs a raw event (a whole file); this one is already parsed",
            ));
        };
        let rows = decode(bytes.clone()).map_err(EventError::new)?;
        let meta = event.meta().clone();
        Ok(Verdict::Replace(
            rows.into_iter()
                .map(|f| Event::fields(f, meta.clone()))
                .collect(),
        ))
    }
}

impl TypedPlugin for ParquetParser {
    type Options = ParquetParserOptions;
    const NAME: &'static str = "parquet";
    const KIND: StageKind = StageKind::Parser;
    const DESCRIPTION: &'static str =
        "Reads a whole Parquet file (one raw event) into one event per row.";
    fn build(&self, _o: ParquetParserOptions, _cx: &BuildContext) -> Result<Built, OptionError> {
        Ok(Built::Processor(Box::new(ParseParquet)))
    }
}
