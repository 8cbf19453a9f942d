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

    /// The column chunk metadata of one column `c` of `kind` whose pages
    /// lie at `start..start + len`, compressed with `codec`.
    fn column(kind: PhysicalType, start: i64, len: i64, codec: Compression) -> ColumnChunkMetaData {
        use parquet::schema::types::{ColumnDescriptor, ColumnPath, Type};
        let t = Type::primitive_type_builder("c", kind)
            .with_length(if kind == PhysicalType::FIXED_LEN_BYTE_ARRAY {
                6
            } else {
                -1
            })
            .build()
            .unwrap();
        let descr = ColumnDescriptor::new(std::sync::Arc::new(t), 1, 0, ColumnPath::from("c"));
        ColumnChunkMetaData::builder(std::sync::Arc::new(descr))
            .set_data_page_offset(start)
            .set_total_compressed_size(len)
            .set_compression(codec)
            .build()
            .unwrap()
    }

    /// A Thrift compact zigzag varint.
    fn varint(n: i64) -> Vec<u8> {
        let mut z = ((n << 1) ^ (n >> 63)) as u64;
        let mut out = Vec::new();
        loop {
            let b = (z & 0x7f) as u8;
            z >>= 7;
            if z == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    }

    /// A page header: type, sizes, and for a data page (v1 or v2) or a
    /// dictionary page its values.
    fn header(kind: i32, uncompressed: i32, compressed: i32, values: i32) -> Vec<u8> {
        let mut h = Vec::new();
        for v in [kind, uncompressed, compressed] {
            h.push(0x15); // the next field id, an i32
            h.extend(varint(v.into()));
        }
        // The page type's own header (a struct field), with its required
        // fields, each the next id and an i32: the number of values first,
        // then encodings (PLAIN, RLE levels) or v2's counts and level sizes.
        let (field, rest): (u8, &[i32]) = match kind {
            DATA_PAGE => (0x2c, &[0, 3, 3]),          // field 5
            DICTIONARY_PAGE => (0x4c, &[0]),          // field 7
            DATA_PAGE_V2 => (0x5c, &[0, 0, 0, 0, 0]), // field 8
            _ => (0, &[]),
        };
        if field != 0 {
            h.push(field);
            for v in std::iter::once(values).chain(rest.iter().copied()) {
                h.push(0x15);
                h.extend(varint(v.into()));
            }
            h.push(0x00);
        }
        h.push(0x00);
        h
    }

    /// A page: its header, then `body`.
    fn page(kind: i32, uncompressed: i32, values: i32, body: &[u8]) -> Vec<u8> {
        let mut p = header(kind, uncompressed, body.len() as i32, values);
        p.extend(body);
        p
    }

    /// What the pages of a chunk of `kind` in `file` at `start..start +
    /// len` come to.
    fn walk(
        file: &[u8],
        kind: PhysicalType,
        start: usize,
        len: usize,
        max: u64,
    ) -> Result<u64, String> {
        let column = column(kind, start as i64, len as i64, Compression::UNCOMPRESSED);
        let mut cost = Cost { total: 0, max };
        chunk_cost(file, &column, &|| Bytes::copy_from_slice(file), &mut cost)?;
        Ok(cost.total)
    }

    /// Each page adds its uncompressed size and eight bytes a value; the
    /// walk follows the chunk's length to its last byte (a page whose body
    /// ends exactly there is counted) and no further.
    #[test]
    fn a_chunk_costs_its_pages_sizes_and_eight_bytes_a_value() {
        let first = page(DATA_PAGE, 100, 5, &[0; 10]);
        let second = page(DATA_PAGE_V2, 50, 3, &[0; 4]);
        let file = [b"PAR1".as_slice(), &first, &second, b"tail"].concat();
        let int = PhysicalType::INT64;
        let both = first.len() + second.len();
        assert_eq!(
            walk(&file, int, 4, both, u64::MAX),
            Ok(100 + 5 * 8 + 50 + 3 * 8)
        );
        // The chunk ends one byte before the second page's body does: the
        // second page is not walked.
        assert_eq!(walk(&file, int, 4, both - 1, u64::MAX), Ok(140));
        assert_eq!(walk(&file, int, 4, first.len(), u64::MAX), Ok(140));
        // Ends inside the first page's header: nothing.
        let head = first.len() - 10;
        assert_eq!(walk(&file, int, 4, head - 1, u64::MAX), Ok(0));
        // A limit of exactly the total is within it; one byte less is not,
        // and the message names the page that broke it.
        assert_eq!(walk(&file, int, 4, both, 214), Ok(214));
        let err = walk(&file, int, 4, both, 213).unwrap_err();
        let second_body = 4 + first.len() + second.len() - 4;
        assert_eq!(
            err,
            format!(
                "the page at byte {second_body} declares 3 values of up to 8 bytes, so its rows would come to more than max_decoded_bytes (213 bytes)"
            )
        );
        let err = walk(&file, int, 4, both, 100 + 5 * 8 + 49).unwrap_err();
        assert!(
            err.starts_with(&format!(
                "the page at byte {second_body} declares 50 bytes, so"
            )),
            "{err}"
        );
    }

    /// A page with no body whose header ends the chunk is still a page.
    #[test]
    fn a_page_with_an_empty_body_at_the_chunks_end_counts() {
        let only = header(DATA_PAGE, 7, 0, 1);
        assert_eq!(
            walk(&only, PhysicalType::INT64, 0, only.len(), u64::MAX),
            Ok(15)
        );
    }

    /// Where the chunk or a page lies outside the file, or a size is
    /// negative, the walk stops (the parquet crate then says why).
    #[test]
    fn a_chunk_or_page_outside_the_file_ends_the_walk() {
        let p = page(DATA_PAGE, 100, 5, &[0; 10]);
        let int = PhysicalType::INT64;
        // The chunk starts at the file's end, or past it.
        assert_eq!(walk(&p, int, p.len(), 10, u64::MAX), Ok(0));
        assert_eq!(walk(&p, int, p.len() + 1, 10, u64::MAX), Ok(0));
        // The body runs past the file's end though the chunk is longer.
        assert_eq!(walk(&p[..p.len() - 1], int, 0, 100, u64::MAX), Ok(0));
        // A negative compressed size.
        let negative = header(DATA_PAGE, 100, -1, 5);
        assert_eq!(walk(&negative, int, 0, 100, u64::MAX), Ok(0));
        // A negative uncompressed size.
        let mut negative = header(DATA_PAGE, -1, 2, 5);
        negative.extend([0, 0]);
        assert_eq!(walk(&negative, int, 0, negative.len(), u64::MAX), Ok(0));
        // A negative value count counts none.
        let p = page(DATA_PAGE, 10, -4, &[0; 2]);
        assert_eq!(walk(&p, int, 0, p.len(), u64::MAX), Ok(10));
        // A header that cannot be read is named by its byte.
        let err = walk(&[0u8, 0x15], int, 1, 5, u64::MAX).unwrap_err();
        assert_eq!(err, "the page header at byte 1 ends inside a value");
    }

    /// Index pages cost nothing and the walk goes on past them; a
    /// dictionary page costs its size, and for a column of numbers its
    /// entries add nothing to each value.
    #[test]
    fn index_and_dictionary_pages() {
        let index = page(INDEX_PAGE, 1_000, 0, &[0; 3]);
        let dictionary = page(DICTIONARY_PAGE, 20, 2, &[0; 3]);
        let data = page(DATA_PAGE, 30, 4, &[0; 3]);
        let file = [index, dictionary, data].concat();
        assert_eq!(
            walk(&file, PhysicalType::INT64, 0, file.len(), u64::MAX),
            Ok(20 + 30 + 4 * 8)
        );
    }

    /// Each value of a dictionary-encoded byte-array column may copy the
    /// dictionary's longest entry; a fixed-length column's entries are
    /// its length.
    #[test]
    fn dictionary_entries_cost_per_value() {
        let mut entries = Vec::new();
        for s in ["ab", "abcdefghij"] {
            entries.extend((s.len() as u32).to_le_bytes());
            entries.extend(s.as_bytes());
        }
        let dictionary = page(DICTIONARY_PAGE, entries.len() as i32, 2, &entries);
        let data = page(DATA_PAGE, 30, 4, &[0; 3]);
        let file = [dictionary.clone(), data.clone()].concat();
        let d = entries.len() as u64;
        assert_eq!(
            walk(&file, PhysicalType::BYTE_ARRAY, 0, file.len(), u64::MAX),
            Ok(d + 30 + 4 * (8 + 10))
        );
        assert_eq!(
            walk(
                &file,
                PhysicalType::FIXED_LEN_BYTE_ARRAY,
                0,
                file.len(),
                u64::MAX
            ),
            Ok(d + 30 + 4 * (8 + 6))
        );
        // Data before the dictionary: no entry yet.
        let file = [data.clone(), dictionary.clone()].concat();
        assert_eq!(
            walk(&file, PhysicalType::BYTE_ARRAY, 0, file.len(), u64::MAX),
            Ok(30 + 4 * 8 + d)
        );
        // A second, longer dictionary after a data page (read past the
        // pages before it): the values after it may copy its longest entry.
        let longer = {
            let mut e = 20u32.to_le_bytes().to_vec();
            e.extend([b'x'; 20]);
            e
        };
        let second = page(DICTIONARY_PAGE, longer.len() as i32, 1, &longer);
        let more = page(DATA_PAGE, 40, 3, &[0; 3]);
        let file = [dictionary, data, second, more].concat();
        assert_eq!(
            walk(&file, PhysicalType::BYTE_ARRAY, 0, file.len(), u64::MAX),
            Ok(d + 30 + 4 * (8 + 10) + longer.len() as u64 + 40 + 3 * (8 + 20))
        );
    }

    /// A file of `rows` rows `{"abc": n, "de": "s<n>"}` in row groups of
    /// four, written by the crate's object format.
    #[cfg(feature = "object-parquet")]
    fn file_of(rows: u64) -> Bytes {
        use logbus_sink::ObjectFormat;
        let options = crate::object::ParquetObjectOptions {
            compression: crate::writer::PageCompression::None,
            row_group_rows: 4,
            schema: None,
        };
        let mut object = crate::object::ParquetObjects::new(&options, "p")
            .unwrap()
            .open()
            .unwrap();
        let mut bytes = Vec::new();
        for n in 0..rows {
            let row = serde_json::json!({"abc": n, "de": format!("s{n}")});
            let event = logbus_plugin_api::Event::fields(
                row.as_object().unwrap().clone(),
                logbus_plugin_api::Meta::at("t", 0),
            );
            object.write(&event).unwrap();
            bytes.extend(std::mem::take(object.ready()));
        }
        bytes.extend(object.finish().unwrap());
        Bytes::from(bytes)
    }

    /// Besides its pages, every row of every row group costs each column's
    /// name and four bytes, and two more; the rows of all row groups are
    /// held against `max_rows`, and the total against `max_decoded_bytes`
    /// (a limit of exactly the total passes).
    #[cfg(feature = "object-parquet")]
    #[test]
    fn every_row_costs_its_columns_names_over_all_row_groups() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let file = file_of(10);
        let reader = SerializedFileReader::new(file.clone()).unwrap();
        let meta = reader.metadata();
        assert_eq!(meta.num_row_groups(), 3);
        let pages: u64 = meta
            .row_groups()
            .iter()
            .flat_map(|g| g.columns())
            .map(|c| {
                let mut cost = Cost {
                    total: 0,
                    max: u64::MAX,
                };
                chunk_cost(&file, c, &|| file.clone(), &mut cost).unwrap();
                cost.total
            })
            .sum();
        assert!(pages > 0);
        let limits = |bytes, rows| Limits { bytes, rows };
        let total = declared_cost(&file, meta, || file.clone(), limits(u64::MAX, 10)).unwrap();
        assert_eq!(total, pages + 10 * ((3 + 4) + (2 + 4) + 2));
        assert_eq!(
            declared_cost(&file, meta, || file.clone(), limits(total, 10)),
            Ok(total)
        );
        let err = declared_cost(&file, meta, || file.clone(), limits(total - 1, 10)).unwrap_err();
        assert!(err.starts_with("row group 2, column "), "{err}");
        assert_eq!(
            declared_cost(&file, meta, || file.clone(), limits(u64::MAX, 9)).unwrap_err(),
            "its row groups declare 10 rows, more than max_rows (9)"
        );
        // The rows' own cost is checked per row group, before its pages.
        let err = declared_cost(&file, meta, || file.clone(), limits(4 * 15, 10)).unwrap_err();
        assert!(
            err.starts_with("row group 0, column 0: the page at byte "),
            "{err}"
        );
        let err = declared_cost(&file, meta, || file.clone(), limits(4 * 15 - 1, 10)).unwrap_err();
        assert_eq!(
            err,
            "row group 0 declares 4 rows, so its rows would come to more than max_decoded_bytes (59 bytes)"
        );
    }

    fn compressed(format: logbus_compress::Compression, n: usize) -> Vec<u8> {
        let mut w = logbus_compress::CompressWriter::new(Vec::new(), format).unwrap();
        std::io::Write::write_all(&mut w, &vec![b'a'; n]).unwrap();
        w.finish().unwrap()
    }

    /// zstd and LZ4 frames decompress to their end in the crate, so they
    /// are held to their page's size too (after a v2 page's levels); LZ4
    /// without a frame's magic, and raw LZ4, stop at the size by themselves.
    #[test]
    fn zstd_and_lz4_frame_bodies_may_inflate_to_their_size_and_no_further() {
        use logbus_compress::Compression as Format;
        let zstd = Compression::ZSTD(Default::default());
        let body = compressed(Format::Zstd, 10_000);
        assert!(inflates_within(zstd, &body, 0, 10_000).is_ok());
        assert_eq!(
            inflates_within(zstd, &body, 0, 9_999).unwrap_err(),
            "inflates past the 9999 bytes its header declares"
        );
        let frame = compressed(Format::Lz4, 10_000);
        assert_eq!(frame[..4], [0x04, 0x22, 0x4d, 0x18]);
        assert!(inflates_within(Compression::LZ4, &frame, 0, 10_000).is_ok());
        assert!(inflates_within(Compression::LZ4, &frame, 0, 9_999).is_err());
        let mut v2 = vec![0u8; 6];
        v2.extend(&frame);
        assert!(inflates_within(Compression::LZ4, &v2, 6, 10_006).is_ok());
        assert!(inflates_within(Compression::LZ4, &v2, 6, 10_005).is_err());
        // The frame's magic is looked for after the levels only.
        assert!(inflates_within(Compression::LZ4, &v2, 0, 1).is_ok());
        assert!(inflates_within(Compression::LZ4_RAW, &frame, 0, 1).is_ok());
        // A body shorter than its levels has nothing to check.
        assert!(inflates_within(zstd, &body[..3], 4, 1).is_ok());
    }

    /// Fields the walk knows are read as the types the crate expects,
    /// whatever their headers declare (the crate's decoder goes by field
    /// id); reading them by their declared types would walk other bytes.
    #[test]
    fn known_fields_are_read_as_the_crate_reads_them_whatever_their_declared_type() {
        let well_typed = [
            &SIZES[..],
            &[0x15, 0x08],                                     // 4: crc, i32
            &[0x1c, 0x15, 0x0e, 0x15, 0x04, 0x00],             // 5: values 7, encoding
            &[0x1c, 0x15, 0x02, 0x00],                         // 6: a struct
            &[0x1c, 0x15, 0x06, 0x15, 0x00, 0x00],             // 7: values 3, encoding
            &[0x1c, 0x15, 0x0e, 0x15, 0x04, 0x35, 0x08, 0x00], // 8: values 7, nulls, def 4
            &[0x00],
        ]
        .concat();
        let declared_otherwise = [
            &SIZES[..],
            &[0x18, 0x08],                                     // 4 declared binary
            &[0x1c, 0x15, 0x0e, 0x18, 0x04, 0x00],             // 5.2 declared binary
            &[0x15, 0x15, 0x02, 0x00],                         // 6 declared i32
            &[0x1c, 0x18, 0x06, 0x15, 0x00, 0x00],             // 7.1 declared binary
            &[0x1c, 0x15, 0x0e, 0x18, 0x04, 0x35, 0x08, 0x00], // 8.2 declared binary
            &[0x00],
        ]
        .concat();
        for h in [well_typed, declared_otherwise] {
            let head = page_header(&[&h[..], b"body"].concat()).unwrap();
            let want = PageHead {
                kind: DATA_PAGE,
                uncompressed: 100,
                compressed: 50,
                values: 7,
                levels: 4,
                compressed_body: true,
                len: h.len(),
            };
            assert_eq!(head, want, "{h:02x?}");
        }
    }

    /// The footer is walked only where there is one: at least 12 bytes
    /// ending in the magic, with a length that fits before it (the footer
    /// may take every byte before its length); otherwise the crate says
    /// what is wrong.
    #[test]
    fn the_footer_is_walked_only_where_there_is_one() {
        // FileMetaData { 4: a list of 2^31 - 1 structs }, and nothing after.
        let claims = [0x49, 0xfc, 0xff, 0xff, 0xff, 0xff, 0x07];
        let file = |head: &[u8], footer: &[u8], len: u32, magic: &[u8]| {
            [head, footer, &len.to_le_bytes()[..], magic].concat()
        };
        let refused = "not a Parquet file: its footer declares a list of 2147483647 elements where 0 bytes remain (at byte 7 of the 7-byte footer)";
        assert_eq!(
            footer_lists_fit(&file(b"PAR1", &claims, 7, b"PAR1")).unwrap_err(),
            refused
        );
        // The footer takes every byte before its length.
        assert_eq!(
            footer_lists_fit(&file(b"", &claims, 7, b"PAR1")).unwrap_err(),
            refused
        );
        // A length past the bytes before it, or no magic at the end: left
        // to the crate.
        assert_eq!(footer_lists_fit(&file(b"", &claims, 8, b"PAR1")), Ok(()));
        assert_eq!(
            footer_lists_fit(&file(b"PAR1", &claims, 7, b"PAR0")),
            Ok(())
        );
        // Twelve bytes are a file with an empty footer, which is walked.
        assert_eq!(
            footer_lists_fit(&file(b"PAR1", b"", 0, b"PAR1")).unwrap_err(),
            "not a Parquet file: its footer ends inside a value (at byte 0 of the 0-byte footer)"
        );
        // Fewer are not a file.
        assert_eq!(footer_lists_fit(b"xxPAR1"), Ok(()));
        assert_eq!(footer_lists_fit(&file(b"", b"", 0, b"PAR")), Ok(()));
        assert_eq!(
            footer_lists_fit(&[&[0u8; 3][..], &0u32.to_le_bytes(), b"PAR1"].concat()),
            Ok(())
        );
    }

    /// Skips a value of Thrift type `kind`; how far it got.
    fn skipped(bytes: &[u8], kind: u8) -> Result<usize, String> {
        let mut t = Thrift { bytes, at: 0 };
        t.skip(kind, 0).map(|()| t.at)
    }

    #[test]
    fn thrift_values_are_walked_by_their_types() {
        // Booleans and bytes, then i16, i32 and i64 varints, then a double.
        assert_eq!(skipped(&[0x01, 0x09], 1), Ok(1));
        assert_eq!(skipped(&[0x80, 0x01, 0x09], 6), Ok(2));
        assert_eq!(skipped(&[0; 9], 7), Ok(8));
        assert_eq!(
            skipped(&[0; 7], 7),
            Err("declares 8 bytes where 7 remain".into())
        );
        assert_eq!(
            skipped(&[0xff; 11], 5),
            Err("holds a varint longer than ten bytes".into())
        );
        // Binary: a length, then its bytes, to the last one and no further.
        assert_eq!(skipped(&[0x03, b'a', b'b', b'c'], 8), Ok(4));
        assert_eq!(
            skipped(&[0x04, b'a', b'b', b'c'], 8),
            Err("declares 4 bytes where 3 remain".into())
        );
        // Lists and sets: at least a byte an element, counted from the
        // header's high nibble or, at 15, a varint.
        assert_eq!(skipped(&[0x25, 0x02, 0x04], 9), Ok(3));
        assert_eq!(skipped(&[0x25, 0x02, 0x04], 10), Ok(3));
        assert_eq!(
            skipped(&[0x35, 0x02, 0x04], 9),
            Err("declares a list of 3 elements where 2 bytes remain".into())
        );
        assert_eq!(skipped(&[0xf5, 0x02, 0x02, 0x04], 9), Ok(4));
        // Maps: a count, then (if any) the key and value types in a byte.
        assert_eq!(skipped(&[0x00, 0x99], 11), Ok(1));
        assert_eq!(skipped(&[0x01, 0x85, 0x02, b'a', b'b', 0x04], 11), Ok(6));
        assert_eq!(
            skipped(&[0x09, 0x85, 0x02, b'a'], 11),
            Err("declares a list of 9 elements where 3 bytes remain".into())
        );
        assert_eq!(
            skipped(&[], 13),
            Err("holds an unknown Thrift type 13".into())
        );
        // Negative numbers, zigzag-decoded.
        let head = page_header(&header(DATA_PAGE, -3, -7, -9)).unwrap();
        assert_eq!(
            (head.kind, head.uncompressed, head.compressed, head.values),
            (0, -3, -7, -9)
        );
    }

    /// Structures, lists and maps may nest 64 deep, not deeper.
    #[test]
    fn nesting_is_allowed_to_64_levels_and_refused_past() {
        let deep = "nests structures more than 64 deep".to_string();
        // Structs whose field 1 is a struct, `n` deep, then their stops.
        let structs = |n: usize| [vec![0x1c; n], vec![0x00; n + 1]].concat();
        assert_eq!(skipped(&structs(64), 12), Ok(129));
        assert_eq!(skipped(&structs(65), 12), Err(deep.clone()));
        // Lists of one list, `n` deep, the innermost empty.
        let lists = |n: usize| [vec![0x19; n], vec![0x05]].concat();
        assert_eq!(skipped(&lists(64), 9), Ok(65));
        assert_eq!(skipped(&lists(65), 9), Err(deep.clone()));
        // Maps of one entry, `n` deep through their keys (a map to a byte)
        // or through their values (a byte to a map), the innermost empty.
        let by_keys = |n: usize| [[0x01, 0xb3].repeat(n), vec![0x00], vec![0x07; n]].concat();
        assert_eq!(skipped(&by_keys(64), 11), Ok(3 * 64 + 1));
        assert_eq!(skipped(&by_keys(65), 11), Err(deep.clone()));
        let by_values = |n: usize| [[0x01, 0x3b, 0x07].repeat(n), vec![0x00]].concat();
        assert_eq!(skipped(&by_values(64), 11), Ok(3 * 64 + 1));
        assert_eq!(skipped(&by_values(65), 11), Err(deep));
    }
}
