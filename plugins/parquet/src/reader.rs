//! Parquet file bytes to rows.

use arrow_json::writer::{LineDelimited, WriterBuilder};
use bytes::Bytes;
use logbus_plugin_api::{
    BuildContext, Built, CheckOptions, Event, EventError, Fields, OptionError, Payload, Processor,
    StageKind, TypedPlugin, Verdict,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::reader::{ChunkReader, Length};
use serde::Deserialize;

/// The file's bytes, remembering the last range the reader asked for, so
/// an error can say where in the file it was reading.
struct Tracked {
    bytes: Bytes,
    last: Arc<AtomicU64>,
}

impl Length for Tracked {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
}

impl ChunkReader for Tracked {
    type T = EndIsAnError;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        self.last.store(start, Ordering::Relaxed);
        self.bytes.get_read(start).map(EndIsAnError)
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.last.store(start, Ordering::Relaxed);
        self.bytes.get_bytes(start, length)
    }
}

/// A reader of the file from some offset on, for which asking for bytes
/// past the end of the file is an error rather than the end of input.
///
/// The parquet crate's streaming Thrift decoder skips an unknown field of
/// `n` bytes by copying up to `n` bytes from the reader and does not check
/// that it got them. A page header claiming a list of 2^31 doubles right
/// at the end of the file was thus "skipped" element by element, each skip
/// finding nothing: minutes of CPU for a 3 KiB file (found by `fuzz/run`,
/// kept in `fuzz/regressions/parquet`). Nothing in a Parquet file is read
/// to its end through this reader (the footer and page bodies are fetched
/// by range), so running out of bytes always means a damaged file.
struct EndIsAnError(bytes::buf::Reader<Bytes>);

impl std::io::Read for EndIsAnError {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !buf.is_empty() && self.0.get_ref().is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file ends inside a page header",
            ));
        }
        self.0.read(buf)
    }
}

/// Every row of a Parquet file, as fields. Errors name the byte offset of
/// the part of the file being read.
///
/// The parquet and arrow crates panic on some malformed files (unknown
/// logical types, bad bit widths, dictionary pages out of order: twelve
/// kinds found by mutating files, kept in `tests/fixtures/panics`). Such
/// a panic is caught here and becomes this file's error.
pub fn decode(file: Bytes) -> Result<Vec<Fields>, String> {
    let last = Arc::new(AtomicU64::new(file.len().saturating_sub(8) as u64));
    let at = last.clone();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_rows(file, last))).unwrap_or_else(
        |panic| {
            Err(format!(
                "the Parquet reader failed on this file: {} (reading at byte {})",
                logbus_plugin_api::panic_message(panic.as_ref()),
                at.load(Ordering::Relaxed)
            ))
        },
    )
}

fn read_rows(file: Bytes, last: Arc<AtomicU64>) -> Result<Vec<Fields>, String> {
    let at = || last.load(Ordering::Relaxed);
    let reader = ParquetRecordBatchReaderBuilder::try_new(Tracked {
        bytes: file,
        last: last.clone(),
    })
    .map_err(|e| format!("not a Parquet file: {e} (reading at byte {})", at()))?
    .build()
    .map_err(|e| {
        format!(
            "cannot read the Parquet file: {e} (reading at byte {})",
            at()
        )
    })?;
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch
            .map_err(|e| format!("cannot read a row group: {e} (reading at byte {})", at()))?;
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
