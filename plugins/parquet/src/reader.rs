//! Parquet file bytes to rows.

use arrow_json::writer::{LineDelimited, WriterBuilder};
use bytes::Bytes;
use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, EventError, Fields, OptionError, Payload, Processor,
    StageKind, TypedPlugin, Verdict,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::reader::{ChunkReader, Length};
use serde::Deserialize;

pub use crate::bounds::{DEFAULT_MAX_DECODED_BYTES, DEFAULT_MAX_ROWS, Limits};

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
///
/// `limits` bound what the rows may come to: a file whose headers already
/// declare more is refused before a row is decoded (see `bounds.rs`), and
/// the rows decoded are counted against them too.
pub fn decode(file: Bytes, limits: Limits) -> Result<Vec<Fields>, String> {
    let last = Arc::new(AtomicU64::new(file.len().saturating_sub(8) as u64));
    let at = last.clone();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        read_rows(file, last, limits)
    }))
    .unwrap_or_else(|panic| {
        Err(format!(
            "the Parquet reader failed on this file: {} (reading at byte {})",
            logbus_plugin_api::panic_message(panic.as_ref()),
            at.load(Ordering::Relaxed)
        ))
    })
}

fn read_rows(file: Bytes, last: Arc<AtomicU64>, limits: Limits) -> Result<Vec<Fields>, String> {
    crate::bounds::footer_lists_fit(&file)?;
    let at = || last.load(Ordering::Relaxed);
    let tracked = || Tracked {
        bytes: file.clone(),
        last: last.clone(),
    };
    let builder = ParquetRecordBatchReaderBuilder::try_new(tracked())
        .map_err(|e| format!("not a Parquet file: {e} (reading at byte {})", at()))?;
    crate::bounds::declared_cost(&file, builder.metadata(), tracked, limits)
        .map_err(|e| format!("refused: {e}"))?;
    let reader = builder.build().map_err(|e| {
        format!(
            "cannot read the Parquet file: {e} (reading at byte {})",
            at()
        )
    })?;
    let mut rows = Vec::new();
    let mut decoded = 0u64;
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
        decoded += out.len() as u64;
        if decoded > limits.bytes {
            return Err(format!(
                "refused: the file's rows come to more than max_decoded_bytes ({} bytes) \
                 by row {}",
                limits.bytes,
                rows.len() + batch.num_rows()
            ));
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

/// Options of `parser: parquet`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ParquetParserOptions {
    /// The most bytes one file's rows may come to, as JSON; a file over
    /// it is an error for `on_error` (nothing of it is emitted). A file
    /// whose headers already declare more is refused before decoding.
    #[schemars(range(min = 1))]
    pub max_decoded_bytes: u64,
    /// The most rows one file may hold; likewise refused before decoding
    /// when its row groups declare more.
    #[schemars(range(min = 1))]
    pub max_rows: u64,
}

impl Default for ParquetParserOptions {
    fn default() -> Self {
        ParquetParserOptions {
            max_decoded_bytes: DEFAULT_MAX_DECODED_BYTES,
            max_rows: DEFAULT_MAX_ROWS,
        }
    }
}

impl CheckOptions for ParquetParserOptions {}

pub struct ParquetParser;

struct ParseParquet {
    limits: Limits,
}

impl Processor for ParseParquet {
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        let Payload::Raw(bytes) = event.payload() else {
            return Err(EventError::new(
                "the parquet parser needs a raw event (a whole file); this one is already parsed",
            ));
        };
        let rows = decode(bytes.clone(), self.limits).map_err(EventError::new)?;
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

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str =
        "Reads a whole Parquet file (one raw event) into one event per row.";
    /// Rows of the file's schema: parsed, fields open.
    fn flow(&self, _o: &ParquetParserOptions) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::open_fields(&[]).needs(logbus_plugin_api::Needs::Raw)
    }

    fn build(
        &self,
        o: ParquetParserOptions,
        _cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(ParseParquet {
            limits: Limits {
                bytes: o.max_decoded_bytes,
                rows: o.max_rows,
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// The page walk in `bounds.rs` now refuses the header this guards
    /// against first, so it is tested on its own: reading past the end is
    /// an error, not the end of input.
    #[test]
    fn reading_past_the_end_of_the_file_is_an_error() {
        let tracked = Tracked {
            bytes: Bytes::from_static(b"abc"),
            last: Arc::new(AtomicU64::new(0)),
        };
        let mut r = tracked.get_read(1).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(r.read(&mut buf).unwrap(), 2);
        assert_eq!(tracked.last.load(Ordering::Relaxed), 1);
        let err = r.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        assert_eq!(err.to_string(), "the file ends inside a page header");
        assert_eq!(r.read(&mut []).unwrap(), 0);
    }
}
