//! What a Parquet file may cost to read, checked from its own headers
//! before the parquet crate decodes a row.
//!
//! The crate believes what a file declares. A few kilobytes can declare
//! billions of rows (one run-length-encoded run of nulls), a page whose
//! gzip or zstd body inflates far past its header's size (the crate
//! decompresses to the end of the stream and compares afterwards), a
//! dictionary whose one long string every value repeats, or a list count
//! the crate reserves memory for before reading an element. None of these
//! is a panic to catch: the process grows until the kernel kills it (found
//! by the `parquet` fuzz target, inputs in `fuzz/regressions/parquet`).
//!
//! So the footer's Thrift is walked for impossible list counts, and every
//! column chunk's page headers are walked the way the crate will walk them,
//! adding up what decoding them must produce at least: the pages'
//! uncompressed bytes, eight bytes per value, each dictionary-encoded
//! value's longest possible entry, and every column's name once per row. A
//! file whose total exceeds `max_decoded_bytes` is refused before anything
//! is decoded; the reader then also counts the rows it really produces
//! against the same limit, batch by batch.

use std::io::Read;

use bytes::Bytes;
use parquet::basic::{Compression, Type as PhysicalType};
use parquet::column::page::{Page, PageReader};
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData};
use parquet::file::reader::ChunkReader;
use parquet::file::serialized_reader::SerializedPageReader;

/// 256 MiB.
pub const DEFAULT_MAX_DECODED_BYTES: u64 = 256 << 20;
/// One million.
pub const DEFAULT_MAX_ROWS: u64 = 1_000_000;

/// What one file may come to once decoded.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of rows, as JSON.
    pub bytes: u64,
    pub rows: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            bytes: DEFAULT_MAX_DECODED_BYTES,
            rows: DEFAULT_MAX_ROWS,
        }
    }
}

/// What decoding every row of a file produces at least, by its headers;
/// an error names the first page that already breaks `max` or cannot be
/// walked.
pub(crate) fn declared_cost<R: ChunkReader + 'static>(
    file: &[u8],
    meta: &ParquetMetaData,
    pages: impl Fn() -> R,
    limits: Limits,
) -> Result<u64, String> {
    let rows: u64 = meta
        .row_groups()
        .iter()
        .map(|g| u64::try_from(g.num_rows()).unwrap_or(0))
        .fold(0, u64::saturating_add);
    if rows > limits.rows {
        return Err(format!(
            "its row groups declare {rows} rows, more than max_rows ({})",
            limits.rows
        ));
    }
    let max = limits.bytes;
    let names: u64 = meta
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .map(|c| c.name().len() as u64 + 4)
        .sum();
    let mut cost = Cost { total: 0, max };
    for (g, group) in meta.row_groups().iter().enumerate() {
        let rows = u64::try_from(group.num_rows()).unwrap_or(0);
        cost.add(rows.saturating_mul(names.saturating_add(2)), || {
            format!("row group {g} declares {rows} rows")
        })?;
        for (c, column) in group.columns().iter().enumerate() {
            chunk_cost(file, column, &pages, &mut cost)
                .map_err(|e| format!("row group {g}, column {c}: {e}"))?;
        }
    }
    Ok(cost.total)
}

struct Cost {
    total: u64,
    max: u64,
}

impl Cost {
    fn add(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<(), String> {
        self.total = self.total.saturating_add(n);
        if self.total > self.max {
            return Err(format!(
                "{}, so its rows would come to more than max_decoded_bytes ({} bytes)",
                what(),
                self.max
            ));
        }
        Ok(())
    }
}

const DATA_PAGE: i32 = 0;
const INDEX_PAGE: i32 = 1;
const DICTIONARY_PAGE: i32 = 2;
const DATA_PAGE_V2: i32 = 3;

/// One column chunk's pages, walked as `SerializedPageReader` walks them:
/// from the chunk's start for its compressed length, header then body. A
/// header the crate would refuse ends the walk (the crate then says why).
fn chunk_cost<R: ChunkReader + 'static>(
    file: &[u8],
    column: &ColumnChunkMetaData,
    pages: &impl Fn() -> R,
    cost: &mut Cost,
) -> Result<(), String> {
    let (start, len) = column.byte_range();
    let (mut offset, mut remaining) = (start, len);
    let mut entry = 0u64; // The longest dictionary entry, once one is read.
    let mut dictionaries = Dictionaries {
        column,
        pages,
        reader: None,
        at: 0,
    };
    let mut page_no = 0usize;
    while remaining > 0 {
        let Some(at) = usize::try_from(offset).ok().filter(|&o| o < file.len()) else {
            break;
        };
        let head =
            page_header(&file[at..]).map_err(|e| format!("the page header at byte {at} {e}"))?;
        if head.len as u64 > remaining {
            break;
        }
        offset += head.len as u64;
        remaining -= head.len as u64;
        let (Ok(body_len), Ok(size)) = (
            u64::try_from(head.compressed),
            u64::try_from(head.uncompressed),
        ) else {
            break;
        };
        if body_len > remaining {
            break;
        }
        let body_at = offset as usize;
        let Some(body) = file.get(body_at..body_at + body_len as usize) else {
            break;
        };
        offset += body_len;
        remaining -= body_len;
        page_no += 1;
        if head.kind == INDEX_PAGE {
            continue;
        }
        let page = || format!("the page at byte {body_at} declares {size} bytes");
        cost.add(size, page)?;
        if head.compressed_body {
            inflates_within(column.compression(), body, head.levels, size)
                .map_err(|e| format!("the page at byte {body_at} {e}"))?;
        }
        match head.kind {
            DATA_PAGE | DATA_PAGE_V2 => {
                let values = u64::try_from(head.values).unwrap_or(0);
                let each = 8 + entry;
                cost.add(values.saturating_mul(each), || {
                    format!(
                        "the page at byte {body_at} declares {values} values of up to {each} bytes"
                    )
                })?;
            }
            DICTIONARY_PAGE => entry = entry.max(dictionaries.longest_entry(page_no - 1)),
            _ => {}
        }
    }
    Ok(())
}

/// A chunk's dictionaries, whose longest entry the arrow reader copies
/// out once for every value that refers to it. Read by the crate (so by
/// every codec it knows) once the page's size has been checked, skipping
/// the pages before it without decompressing them.
struct Dictionaries<'a, F, R: ChunkReader> {
    column: &'a ColumnChunkMetaData,
    pages: &'a F,
    reader: Option<SerializedPageReader<R>>,
    /// Pages the reader has passed.
    at: usize,
}

impl<F: Fn() -> R, R: ChunkReader + 'static> Dictionaries<'_, F, R> {
    /// The longest entry of the dictionary that is page `page_no` of the
    /// chunk (0 where the crate cannot read it: it then says why itself).
    fn longest_entry(&mut self, page_no: usize) -> u64 {
        match self.column.column_type() {
            PhysicalType::FIXED_LEN_BYTE_ARRAY => {
                return u64::try_from(self.column.column_descr().type_length()).unwrap_or(0);
            }
            PhysicalType::BYTE_ARRAY => {}
            _ => return 0, // Numbers: within the eight bytes counted per value.
        }
        if self.reader.is_none() {
            let Ok(reader) = SerializedPageReader::new(
                std::sync::Arc::new((self.pages)()),
                self.column,
                0,
                None,
            ) else {
                return 0;
            };
            self.reader = Some(reader);
        }
        let reader = self.reader.as_mut().expect("just made");
        while self.at < page_no {
            if reader.skip_next_page().is_err() {
                return 0;
            }
            self.at += 1;
        }
        self.at += 1;
        match reader.get_next_page() {
            Ok(Some(Page::DictionaryPage { buf, .. })) => longest_plain(&buf),
            _ => 0,
        }
    }
}

/// The longest of PLAIN-encoded byte arrays (each a 4-byte length, then
/// the bytes).
fn longest_plain(buf: &Bytes) -> u64 {
    let (mut at, mut longest) = (0usize, 0u64);
    while let Some(len) = buf.get(at..at + 4) {
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes"));
        longest = longest.max(u64::from(len));
        at = at.saturating_add(4).saturating_add(len as usize);
    }
    longest
}

/// Refuses a compressed page body that inflates past its header's size.
/// Only the codecs the crate decompresses to the end of the stream need
/// this (gzip, zstd, lz4 frames); snappy and raw lz4 stop at the declared
/// size. Decoding stops one byte past the limit, into nothing.
fn inflates_within(
    codec: Compression,
    body: &[u8],
    levels: usize,
    size: u64,
) -> Result<(), String> {
    use logbus_compress::ReadCompression as C;
    let format = match codec {
        Compression::GZIP(_) => C::Gzip,
        Compression::ZSTD(_) => C::Zstd,
        // The crate tries the Hadoop layout first (bounded), then a frame.
        Compression::LZ4 if body.get(levels..levels + 4) == Some(&[0x04, 0x22, 0x4d, 0x18]) => {
            C::Lz4
        }
        _ => return Ok(()),
    };
    let Some(compressed) = body.get(levels..) else {
        return Ok(());
    };
    let limit = size.saturating_sub(levels as u64);
    let Ok(decoder) = logbus_compress::open(compressed, format) else {
        return Ok(());
    };
    let mut sink = [0u8; 64 * 1024];
    let mut out = 0u64;
    let mut limited = decoder.take(limit + 1);
    // A stream that breaks is the crate's to report; only its size matters.
    while let Ok(n) = limited.read(&mut sink) {
        if n == 0 {
            break;
        }
        out += n as u64;
    }
    if out > limit {
        return Err(format!(
            "inflates past the {limit} bytes its header declares"
        ));
    }
    Ok(())
}

/// What the walk needs of a page header.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct PageHead {
    kind: i32,
    uncompressed: i32,
    compressed: i32,
    values: i32,
    /// Bytes of levels before a v2 page's compressed values.
    levels: usize,
    compressed_body: bool,
    /// The header's own length.
    len: usize,
}

/// A page header, read as the parquet crate reads it (without statistics):
/// known field ids as the types it expects whatever their header says,
/// other fields skipped by their declared type.
pub(crate) fn page_header(bytes: &[u8]) -> Result<PageHead, String> {
    let mut t = Thrift { bytes, at: 0 };
    let mut head = PageHead {
        compressed_body: true,
        ..PageHead::default()
    };
    let (mut v2, mut def, mut rep) = (false, 0i32, 0i32);
    t.fields(0, |t, id, kind, depth| {
        match id {
            1 => head.kind = t.i32()?,
            2 => head.uncompressed = t.i32()?,
            3 => head.compressed = t.i32()?,
            4 => {
                t.i32()?;
            }
            5 => t.fields(depth, |t, id, kind, depth| {
                match id {
                    1 => head.values = t.i32()?,
                    2..=4 => drop(t.i32()?),
                    _ => t.skip_field(kind, depth)?,
                }
                Ok(())
            })?,
            6 => t.fields(depth, |t, _, kind, depth| t.skip_field(kind, depth))?,
            7 => t.fields(depth, |t, id, kind, depth| match id {
                1 | 2 => t.i32().map(drop),
                _ => t.skip_field(kind, depth),
            })?,
            8 => {
                v2 = true;
                t.fields(depth, |t, id, kind, depth| {
                    match id {
                        1 => head.values = t.i32()?,
                        2..=4 => drop(t.i32()?),
                        5 => def = t.i32()?,
                        6 => rep = t.i32()?,
                        7 => head.compressed_body = kind == 1,
                        _ => t.skip_field(kind, depth)?,
                    }
                    Ok(())
                })?
            }
            _ => t.skip_field(kind, depth)?,
        }
        Ok(())
    })?;
    if v2 {
        head.levels =
            usize::try_from(def.max(0)).unwrap_or(0) + usize::try_from(rep.max(0)).unwrap_or(0);
    }
    head.len = t.at;
    Ok(head)
}

/// The parquet crate (before 60) sized a list from the count its footer
/// declares (`Vec::with_capacity(n)`) before reading an element, so a
/// 2.5 KB file that claimed two billion row groups made it ask for 150 GB
/// and abort the process. Parquet 60 checks each count against the bytes
/// left itself; this walk stays in front of it to name where in the footer
/// the impossible list is. It follows the declared types, except for
/// FileMetaData's own lists, which the crate reads as lists whatever the
/// header says.
pub(crate) fn footer_lists_fit(file: &[u8]) -> Result<(), String> {
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
    walk.fields(0, |t, id, kind, depth| {
        // The crate reads FileMetaData's schema, row groups, key-value
        // metadata and column orders as lists whatever type the field
        // header says, so they are walked as lists here too.
        if matches!(id, 2 | 4 | 5 | 7) {
            t.skip(9, depth)
        } else {
            t.skip_field(kind, depth)
        }
    })
    .map_err(|e| {
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

    fn zigzag(&mut self) -> Result<i64, String> {
        let z = self.varint()?;
        Ok((z >> 1) as i64 ^ -((z & 1) as i64))
    }

    fn i32(&mut self) -> Result<i32, String> {
        // The crate keeps the low 32 bits of what it decodes.
        Ok(self.zigzag()? as i32)
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

    /// A struct's fields up to its stop byte: `field(self, id, type,
    /// depth)` reads each value.
    fn fields(
        &mut self,
        depth: usize,
        mut field: impl FnMut(&mut Self, i64, u8, usize) -> Result<(), String>,
    ) -> Result<(), String> {
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
                0 => self.zigzag()?, // The field id in full.
                delta => id + i64::from(delta),
            };
            field(self, id, header & 0x0f, depth + 1)?;
        }
    }

    /// A struct field's value by its declared type (booleans live in the
    /// field header's type nibble).
    fn skip_field(&mut self, kind: u8, depth: usize) -> Result<(), String> {
        match kind {
            1 | 2 => Ok(()),
            t => self.skip(t, depth),
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
            12 => self.fields(depth, |t, _, kind, depth| t.skip_field(kind, depth))?,
            other => return Err(format!("holds an unknown Thrift type {other}")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fields 1-3 of a page header (type, sizes), each `0x15` (delta 1,
    /// i32) and a zigzag varint.
    const SIZES: [u8; 7] = [0x15, 0x00, 0x15, 0xc8, 0x01, 0x15, 0x64];

    #[test]
    fn a_data_page_header_reads_as_the_crate_reads_it() {
        let mut h = SIZES.to_vec();
        // 5: DataPageHeader { 1: num_values 7, 2-4: encodings }, stop.
        h.extend([
            0x2c, 0x15, 0x0e, 0x15, 0x00, 0x15, 0x00, 0x15, 0x00, 0x00, 0x00,
        ]);
        h.extend(b"body");
        let head = page_header(&h).unwrap();
        let want = PageHead {
            kind: DATA_PAGE,
            uncompressed: 100,
            compressed: 50,
            values: 7,
            levels: 0,
            compressed_body: true,
            len: h.len() - 4,
        };
        assert_eq!(head, want);
        // The crate reads field 2 as an i32 whatever its header says
        // (here binary): so does the walk, or it would skip 100 bytes.
        h[2] = 0x18;
        assert_eq!(page_header(&h).unwrap(), want);
    }

    #[test]
    fn a_v2_page_header_gives_its_levels_and_whether_it_is_compressed() {
        let mut h = SIZES.to_vec();
        h[1] = 0x06; // DATA_PAGE_V2 (3)
        // 8: DataPageHeaderV2 { 1: 7 values, 2-4, 5: 4 bytes of definition
        // levels, 6: 2 of repetition levels, 7: false }, stop.
        h.extend([0x5c, 0x15, 0x0e, 0x15, 0x00, 0x15, 0x00, 0x15, 0x00]);
        h.extend([0x15, 0x08, 0x15, 0x04, 0x12, 0x00, 0x00]);
        let head = page_header(&h).unwrap();
        assert_eq!(
            (head.kind, head.values, head.levels, head.compressed_body),
            (DATA_PAGE_V2, 7, 6, false)
        );
    }

    #[test]
    fn a_header_that_cannot_be_walked_says_why() {
        // Ends after the type.
        assert_eq!(
            page_header(&[0x15, 0x00]).unwrap_err(),
            "ends inside a value"
        );
        // An unknown field (9) that is a list of 2^31 doubles in 8 bytes.
        let mut h = SIZES.to_vec();
        h.extend([0x69, 0xf7, 0xff, 0xff, 0xff, 0xff, 0x07]);
        assert_eq!(
            page_header(&h).unwrap_err(),
            "declares a list of 2147483647 elements where 0 bytes remain"
        );
        let deep: Vec<u8> = std::iter::repeat_n(0x1c, 70).collect(); // struct in struct …
        assert_eq!(
            page_header(&[&SIZES[..], &[0x99], &deep].concat()).unwrap_err(),
            "nests structures more than 64 deep"
        );
    }

    #[test]
    fn the_longest_plain_entry_is_found_and_a_truncated_one_ends_the_walk() {
        let mut buf = Vec::new();
        for s in ["ab", "abcdef", ""] {
            buf.extend((s.len() as u32).to_le_bytes());
            buf.extend(s.as_bytes());
        }
        assert_eq!(longest_plain(&Bytes::from(buf.clone())), 6);
        buf.extend([0xff, 0xff]); // half a length
        assert_eq!(longest_plain(&Bytes::from(buf)), 6);
        let claims = [0xff, 0xff, 0xff, 0x7f].to_vec(); // a length with no bytes
        assert_eq!(longest_plain(&Bytes::from(claims)), 0x7fff_ffff);
    }

    #[test]
    fn a_gzip_body_may_inflate_to_its_declared_size_and_no_further() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&[b'a'; 10_000]).unwrap();
        let body = gz.finish().unwrap();
        let gzip = Compression::GZIP(Default::default());
        assert!(inflates_within(gzip, &body, 0, 10_000).is_ok());
        assert_eq!(
            inflates_within(gzip, &body, 0, 9_999).unwrap_err(),
            "inflates past the 9999 bytes its header declares"
        );
        // Levels before the compressed values count toward the size.
        let mut v2 = vec![0u8; 6];
        v2.extend(&body);
        assert!(inflates_within(gzip, &v2, 6, 10_006).is_ok());
        assert!(inflates_within(gzip, &v2, 6, 10_005).is_err());
        // Snappy stops at the declared size by itself: not checked here.
        assert!(inflates_within(Compression::SNAPPY, &body, 0, 1).is_ok());
    }
}
