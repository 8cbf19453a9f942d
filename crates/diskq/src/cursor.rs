//! Reading a segment file record by record, in bounded chunks, reporting
//! damage as it goes. The live reader, recovery and `queue check` share it.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use crate::record::{Scan, scan};

const CHUNK: usize = 1 << 20;

/// The first position at or after `from` where a whole valid record starts.
pub(crate) fn next_valid(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while at < buf.len() {
        let i = at + memchr::memmem::find(&buf[at..], &crate::record::RECORD_MAGIC)?;
        if let Scan::Record { .. } = scan(buf, i) {
            return Some(i);
        }
        at = i + 1;
    }
    None
}

/// One step through a segment.
#[derive(Debug, PartialEq, Eq)]
pub enum Item {
    /// A valid record at `offset`; its body is `cursor.slice(body)`.
    Record { offset: u64, body: Range<usize> },
    /// `len` bytes at `offset` hold no valid record.
    Damaged { offset: u64, len: u64 },
    /// The segment ends inside a record: a write cut short by a crash.
    Torn { offset: u64, len: u64 },
}

pub struct Cursor {
    file: File,
    /// Bytes of the file from `buf_start` on.
    buf: Vec<u8>,
    buf_start: u64,
    pos: u64,
    /// Where the readable part of the file ends (a sealed segment's length,
    /// or what the writer has published of the active one).
    limit: u64,
    damage_start: Option<u64>,
}

impl Cursor {
    pub fn new(file: File, pos: u64, limit: u64) -> Cursor {
        Cursor {
            file,
            buf: Vec::new(),
            buf_start: pos,
            pos,
            limit,
            damage_start: None,
        }
    }

    pub fn position(&self) -> u64 {
        self.pos
    }

    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    pub fn slice(&self, range: Range<usize>) -> &[u8] {
        &self.buf[range]
    }

    /// The next item, or `None` at the limit.
    pub fn next_item(&mut self) -> io::Result<Option<Item>> {
        loop {
            if self.pos >= self.limit {
                return Ok(self.take_damage());
            }
            let idx = (self.pos - self.buf_start) as usize;
            let buf_end = self.buf_start + self.buf.len() as u64;
            // A header cut by the buffer's end scans as incomplete (and
            // damage before it keeps a cut magic's first bytes), so the
            // refill below is the only one needed.
            match scan(&self.buf, idx) {
                Scan::Record { body, next } => {
                    if let Some(damage) = self.take_damage() {
                        return Ok(Some(damage));
                    }
                    let offset = self.pos;
                    self.pos += (next - idx) as u64;
                    return Ok(Some(Item::Record { offset, body }));
                }
                Scan::Incomplete => {
                    if buf_end >= self.limit {
                        // Cut by the end of the data: a torn tail, unless a
                        // valid record follows (then the length was damaged).
                        if let Some(resume) = next_valid(&self.buf, idx + 1) {
                            self.damage_start.get_or_insert(self.pos);
                            self.pos = self.buf_start + resume as u64;
                            continue;
                        }
                        if let Some(damage) = self.take_damage() {
                            return Ok(Some(damage));
                        }
                        let offset = self.pos;
                        self.pos = self.limit;
                        return Ok(Some(Item::Torn {
                            offset,
                            len: self.limit - offset,
                        }));
                    }
                    self.refill()?;
                }
                Scan::Damaged { resume } => {
                    self.damage_start.get_or_insert(self.pos);
                    self.pos = (self.buf_start + resume as u64).min(self.limit);
                }
            }
        }
    }

    fn take_damage(&mut self) -> Option<Item> {
        let start = self.damage_start.take()?;
        Some(Item::Damaged {
            offset: start,
            len: self.pos - start,
        })
    }

    /// Drops what was consumed and reads the next chunk after the buffer.
    fn refill(&mut self) -> io::Result<()> {
        let consumed = (self.pos - self.buf_start) as usize;
        self.buf.drain(..consumed.min(self.buf.len()));
        self.buf_start = self.pos;
        let buf_end = self.buf_start + self.buf.len() as u64;
        let want = (self.limit - buf_end).min(CHUNK as u64) as usize;
        let old = self.buf.len();
        self.buf.resize(old + want, 0);
        let mut filled = 0;
        while filled < want {
            match self
                .file
                .read_at(&mut self.buf[old + filled..], buf_end + filled as u64)
            {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(e);
                }
            }
        }
        self.buf.truncate(old + filled);
        if filled < want {
            // The file is shorter than the limit said (truncated under us):
            // what is missing cannot be read, so the limit moves in.
            self.limit = buf_end + filled as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{RECORD_HEADER, encode};

    fn cursor_over(bytes: &[u8]) -> (tempfile::NamedTempFile, Cursor) {
        cursor_with_limit(bytes, bytes.len() as u64)
    }

    fn cursor_with_limit(bytes: &[u8], limit: u64) -> (tempfile::NamedTempFile, Cursor) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), bytes).unwrap();
        let f = File::open(file.path()).unwrap();
        (file, Cursor::new(f, 0, limit))
    }

    fn items(c: &mut Cursor) -> Vec<Item> {
        let mut out = Vec::new();
        while let Some(i) = c.next_item().unwrap() {
            out.push(i);
        }
        out
    }

    #[test]
    fn reports_damage_once_per_region_and_a_torn_tail() {
        let mut bytes = Vec::new();
        encode(b"one", false, &mut bytes);
        let damaged_at = bytes.len() as u64;
        bytes.extend_from_slice(&[0x55; 100]);
        let two_at = bytes.len() as u64;
        encode(b"two", false, &mut bytes);
        let torn_at = bytes.len() as u64;
        let mut three = Vec::new();
        encode(b"three", false, &mut three);
        bytes.extend_from_slice(&three[..10]);
        let (_f, mut c) = cursor_over(&bytes);
        let found = items(&mut c);
        assert_eq!(found.len(), 4, "{found:?}");
        assert!(matches!(found[0], Item::Record { offset: 0, .. }));
        assert_eq!(
            found[1],
            Item::Damaged {
                offset: damaged_at,
                len: 100
            }
        );
        assert!(matches!(found[2], Item::Record { offset, .. } if offset == two_at));
        assert_eq!(
            found[3],
            Item::Torn {
                offset: torn_at,
                len: 10
            }
        );
    }

    #[test]
    fn a_damaged_length_is_damage_not_a_torn_tail() {
        let mut bytes = Vec::new();
        encode(b"one", false, &mut bytes);
        let hit = bytes.len();
        encode(b"two", false, &mut bytes);
        encode(b"three", false, &mut bytes);
        bytes[hit + 6] = 0x10; // length of `two` now ~1 MiB
        let (_f, mut c) = cursor_over(&bytes);
        let found = items(&mut c);
        let records = found
            .iter()
            .filter(|i| matches!(i, Item::Record { .. }))
            .count();
        assert_eq!(records, 2, "{found:?}");
        assert!(matches!(found[1], Item::Damaged { .. }), "{found:?}");
    }

    /// Damage that itself starts with the record magic (a record whose
    /// checksum no longer holds): the search goes on past it to the next
    /// whole record.
    #[test]
    fn the_next_valid_record_is_found_past_magic_that_starts_no_record() {
        let mut bytes = Vec::new();
        encode(b"one", false, &mut bytes);
        let hit = bytes.len();
        encode(b"two", false, &mut bytes);
        bytes[hit + RECORD_HEADER] ^= 0xFF; // the body of `two`: bad checksum
        bytes.extend_from_slice(&crate::record::RECORD_MAGIC);
        let three_at = bytes.len();
        encode(b"three", false, &mut bytes);
        assert_eq!(next_valid(&bytes, 0), Some(0));
        assert_eq!(next_valid(&bytes, 1), Some(three_at));
        assert_eq!(next_valid(&bytes, hit), Some(three_at));
        assert_eq!(next_valid(&bytes, three_at + 1), None);
        assert_eq!(next_valid(&bytes, bytes.len()), None);
        let (_f, mut c) = cursor_over(&bytes);
        let found = items(&mut c);
        assert_eq!(
            found[1],
            Item::Damaged {
                offset: hit as u64,
                len: (three_at - hit) as u64
            },
            "{found:?}"
        );
        assert!(matches!(found[2], Item::Record { offset, .. } if offset == three_at as u64));
    }

    /// Nothing past the limit is read, even where the file holds a whole
    /// record there: a limit moved into a record shows it as torn.
    #[test]
    fn nothing_past_the_limit_is_read() {
        let mut bytes = Vec::new();
        encode(b"one", false, &mut bytes);
        let two_at = bytes.len() as u64;
        encode(b"two", false, &mut bytes);
        let (_f, mut c) = cursor_with_limit(&bytes, two_at);
        let found = items(&mut c);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(matches!(found[0], Item::Record { offset: 0, .. }));
        c.set_limit(two_at + 5);
        assert_eq!(
            items(&mut c),
            vec![Item::Torn {
                offset: two_at,
                len: 5
            }]
        );
        assert_eq!(c.position(), two_at + 5);
    }

    /// A file shorter than its limit (cut under the reader): the limit
    /// moves in to what is there, and the cursor ends with the torn tail
    /// instead of waiting for bytes that will not come.
    #[test]
    fn a_file_shorter_than_its_limit_ends_where_the_file_does() {
        let mut bytes = Vec::new();
        encode(b"one", false, &mut bytes);
        let two_at = bytes.len() as u64;
        encode(b"two", false, &mut bytes);
        let cut = bytes.len() as u64 - 3;
        let (_f, mut c) = cursor_with_limit(&bytes[..cut as usize], bytes.len() as u64 + 100);
        let found = items(&mut c);
        assert!(matches!(found[0], Item::Record { offset: 0, .. }));
        assert_eq!(
            found[1..],
            [Item::Torn {
                offset: two_at,
                len: cut - two_at
            }]
        );
        assert_eq!(c.position(), cut);
    }

    #[test]
    fn records_larger_than_a_chunk_are_read_whole() {
        let big = vec![7u8; CHUNK * 2 + 5];
        let mut bytes = Vec::new();
        encode(b"small", false, &mut bytes);
        encode(&big, false, &mut bytes);
        encode(b"after", false, &mut bytes);
        let (_f, mut c) = cursor_over(&bytes);
        let mut sizes = Vec::new();
        while let Some(item) = c.next_item().unwrap() {
            let Item::Record { body, .. } = item else {
                panic!("{item:?}")
            };
            sizes.push(body.len() - 1);
        }
        assert_eq!(sizes, vec![5, big.len(), 5]);
    }

    #[test]
    fn damage_spanning_chunks_is_one_region() {
        let mut bytes = Vec::new();
        encode(b"one", false, &mut bytes);
        let start = bytes.len() as u64;
        bytes.extend(std::iter::repeat_n(0u8, CHUNK * 2 + 3));
        encode(b"two", false, &mut bytes);
        let (_f, mut c) = cursor_over(&bytes);
        let found = items(&mut c);
        assert_eq!(found.len(), 3, "{found:?}");
        assert_eq!(
            found[1],
            Item::Damaged {
                offset: start,
                len: CHUNK as u64 * 2 + 3
            }
        );
    }
}
