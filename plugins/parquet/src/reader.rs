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
    footer_lists_fit(&file)?;
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

/// The parquet crate sizes a list from the count its footer declares
/// (`Vec::with_capacity(n)`) before reading an element, so a 2.5 KB file
/// that claims two billion row groups makes it ask for 150 GB and abort
/// the process — no panic to catch (found by the `parquet` fuzz target).
/// So the footer's Thrift (compact protocol) is walked first, and a list,
/// set or map that claims more elements than bytes remain (every element
/// takes at least one) refuses the file. The walk follows the declared
/// types, except for FileMetaData's own lists, which the crate reads as
/// lists whatever the header says; inside row groups and column chunks
/// the crate's expectations are not mirrored (yet), so a list there
/// declared under another type is not caught.
fn footer_lists_fit(file: &[u8]) -> Result<(), String> {
    let n = file.len();
    if n < 12 || &file[n - 4..] != b"PAR1" {
        return Ok(()); // Not a plain footer: the parquet crate says why.
    }
    let len = u32::from_le_bytes(file[n - 8..n - 4].try_into().expect("4 bytes")) as usize;
    if len > n - 8 {
        return Ok(()); // The crate reports the impossible length itself.
    }
    let mut walk = Thrift {
        bytes: &file[n - 8 - len..n - 8],
        at: 0,
    };
    walk.skip_struct(0).map_err(|e| {
        format!(
            "not a Parquet file: its footer {e} (at byte {} of the {len}-byte footer)",
            walk.at
        )
    })
}

struct Thrift<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Thrift<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self.bytes.get(self.at).ok_or("ends inside a value")?;
        self.at += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("holds a varint longer than ten bytes".into())
    }

    fn take(&mut self, count: u64) -> Result<(), String> {
        let left = (self.bytes.len() - self.at) as u64;
        if count > left {
            return Err(format!("declares {count} bytes where {left} remain"));
        }
        self.at += count as usize;
        Ok(())
    }

    /// A list, set or map of `count` elements: at least a byte each.
    fn fits(&self, count: u64) -> Result<(), String> {
        let left = (self.bytes.len() - self.at) as u64;
        if count > left {
            return Err(format!(
                "declares a list of {count} elements where {left} bytes remain"
            ));
        }
        Ok(())
    }

    fn skip_struct(&mut self, depth: usize) -> Result<(), String> {
        if depth > 64 {
            return Err("nests structures more than 64 deep".into());
        }
        let mut id: i64 = 0;
        loop {
            let header = self.byte()?;
            if header == 0 {
                return Ok(());
            }
            id = match header >> 4 {
                0 => {
                    // The field id in full, zigzag.
                    let z = self.varint()?;
                    (z >> 1) as i64 ^ -((z & 1) as i64)
                }
                delta => id + i64::from(delta),
            };
            // The crate reads FileMetaData's schema, row groups, key-value
            // metadata and column orders as lists whatever type the field
            // header says, so they are walked as lists here too.
            if depth == 0 && matches!(id, 2 | 4 | 5 | 7) {
                self.skip(9, depth + 1)?;
                continue;
            }
            match header & 0x0f {
                // Booleans in a struct field live in the type nibble.
                1 | 2 => {}
                t => self.skip(t, depth + 1)?,
            }
        }
    }

    fn skip(&mut self, kind: u8, depth: usize) -> Result<(), String> {
        if depth > 64 {
            return Err("nests structures more than 64 deep".into());
        }
        match kind {
            1..=3 => {
                self.byte()?;
            }
            4..=6 => {
                self.varint()?;
            }
            7 => self.take(8)?,
            8 => {
                let len = self.varint()?;
                self.take(len)?;
            }
            9 | 10 => {
                let header = self.byte()?;
                let count = match header >> 4 {
                    15 => self.varint()?,
                    c => u64::from(c),
                };
                self.fits(count)?;
                for _ in 0..count {
                    self.skip(header & 0x0f, depth + 1)?;
                }
            }
            11 => {
                let count = self.varint()?;
                if count > 0 {
                    self.fits(count)?;
                    let types = self.byte()?;
                    for _ in 0..count {
                        self.skip(types >> 4, depth + 1)?;
                        self.skip(types & 0x0f, depth + 1)?;
                    }
                }
            }
            12 => self.skip_struct(depth)?,
            other => return Err(format!("holds an unknown Thrift type {other}")),
        }
        Ok(())
    }
}
