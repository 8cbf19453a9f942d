//! The on-disk layout of a segment and its records, and the one scanner
//! that the reader, recovery and `queue check` all use, so that what is
//! "damaged" means the same thing everywhere.
//!
//! A segment starts with a 16-byte header (magic, format version, segment
//! id). A record is `magic | length | crc32c | body`, where the checksum
//! covers the length bytes and the body, so a damaged length is caught as
//! surely as a damaged body. The magic lets the scanner find the next record
//! after damage: it looks for the magic at every later byte and accepts a
//! candidate only if its checksum holds.

/// First bytes of every record. Chosen to be unlikely in text (two bytes
/// that are not valid UTF-8 starts) so a resync rarely tries false starts.
pub const RECORD_MAGIC: [u8; 4] = [0xF1, 0x9B, b'L', b'Q'];
pub const RECORD_HEADER: usize = 12;
/// A record body larger than this is treated as damage (a corrupt length),
/// never allocated.
pub const MAX_RECORD: usize = 64 << 20;

pub const SEGMENT_MAGIC: [u8; 6] = *b"LBUSQ\0";
pub const SEGMENT_VERSION: u16 = 1;
pub const SEGMENT_HEADER: u64 = 16;

/// Body flag: the rest of the body is an lz4 block with its size prepended.
pub const FLAG_LZ4: u8 = 1;
/// Body flag: not data but the first record of a segment, holding the
/// sequence number of the segment's first data record (8 bytes, LE).
/// Sequence numbers count every data record the queue ever stored, so a
/// gap between one segment's start and what the previous segments hold is
/// exactly the number of records lost there (see `inspect::account`).
pub const FLAG_START: u8 = 0x80;

pub fn segment_header(id: u64) -> [u8; SEGMENT_HEADER as usize] {
    let mut h = [0u8; SEGMENT_HEADER as usize];
    h[..6].copy_from_slice(&SEGMENT_MAGIC);
    h[6..8].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    h[8..].copy_from_slice(&id.to_le_bytes());
    h
}

/// Whether `bytes` starts with a valid header for segment `id`.
pub fn header_ok(bytes: &[u8], id: u64) -> bool {
    bytes.len() >= SEGMENT_HEADER as usize
        && bytes[..6] == SEGMENT_MAGIC
        && bytes[6..8] == SEGMENT_VERSION.to_le_bytes()
        && bytes[8..16] == id.to_le_bytes()
}

/// Appends one record holding `payload` (compressed when `lz4` is set and it
/// pays) to `out`.
pub fn encode(payload: &[u8], lz4: bool, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&RECORD_MAGIC);
    out.extend_from_slice(&[0; 8]);
    let body_start = out.len();
    let mut flags = 0;
    out.push(0);
    if lz4 {
        let compressed = lz4_flex::compress_prepend_size(payload);
        if compressed.len() < payload.len() {
            flags = FLAG_LZ4;
            out.extend_from_slice(&compressed);
        } else {
            out.extend_from_slice(payload);
        }
    } else {
        out.extend_from_slice(payload);
    }
    out[body_start] = flags;
    let len = (out.len() - body_start) as u32;
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len.to_le_bytes()), &out[body_start..]);
    out[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
}

/// Appends the record that opens a segment whose first data record will
/// have sequence number `first_seq`.
pub fn encode_start(first_seq: u64, out: &mut Vec<u8>) {
    let body_len = 9u32;
    let mut body = [0u8; 9];
    body[0] = FLAG_START;
    body[1..].copy_from_slice(&first_seq.to_le_bytes());
    out.extend_from_slice(&RECORD_MAGIC);
    out.extend_from_slice(&body_len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&body_len.to_le_bytes()), &body);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&body);
}

/// The sequence number a segment's start record holds; `None` for a data
/// record.
pub fn start_seq(body: &[u8]) -> Option<u64> {
    match body {
        [FLAG_START, seq @ ..] if seq.len() == 8 => {
            Some(u64::from_le_bytes(seq.try_into().expect("8 bytes")))
        }
        _ => None,
    }
}

/// Bytes of a start record.
pub const START_RECORD: u64 = RECORD_HEADER as u64 + 9;

/// What the scanner found at a position of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Scan {
    /// A whole, valid record: its body is `buf[body]`, the next record
    /// starts at `next`.
    Record {
        body: std::ops::Range<usize>,
        next: usize,
    },
    /// The buffer ends inside what may be a valid record: read more, or,
    /// at the end of a sealed segment, a torn tail.
    Incomplete,
    /// Damage: no valid record starts here; the next candidate is at
    /// `resume` (or the buffer holds none: `resume` is where to keep
    /// looking once more bytes are read).
    Damaged { resume: usize },
}

/// Looks at `buf[at..]`.
pub fn scan(buf: &[u8], at: usize) -> Scan {
    let rest = &buf[at..];
    if rest.len() < RECORD_HEADER {
        if RECORD_MAGIC.starts_with(&rest[..rest.len().min(4)]) {
            return Scan::Incomplete;
        }
        return Scan::Damaged {
            resume: resync(buf, at + 1),
        };
    }
    if rest[..4] != RECORD_MAGIC {
        return Scan::Damaged {
            resume: resync(buf, at + 1),
        };
    }
    let len_bytes: [u8; 4] = rest[4..8].try_into().expect("4 bytes");
    let len = u32::from_le_bytes(len_bytes) as usize;
    if len == 0 || len > MAX_RECORD {
        return Scan::Damaged {
            resume: resync(buf, at + 1),
        };
    }
    if rest.len() < RECORD_HEADER + len {
        return Scan::Incomplete;
    }
    let crc = u32::from_le_bytes(rest[8..12].try_into().expect("4 bytes"));
    let body = &rest[RECORD_HEADER..RECORD_HEADER + len];
    if crc32c::crc32c_append(crc32c::crc32c(&len_bytes), body) != crc {
        return Scan::Damaged {
            resume: resync(buf, at + 1),
        };
    }
    Scan::Record {
        body: at + RECORD_HEADER..at + RECORD_HEADER + len,
        next: at + RECORD_HEADER + len,
    }
}

/// The next position at or after `from` where the magic (or a prefix of it,
/// at the very end) appears.
fn resync(buf: &[u8], from: usize) -> usize {
    if from >= buf.len() {
        return buf.len();
    }
    match memchr::memmem::find(&buf[from..], &RECORD_MAGIC) {
        Some(i) => from + i,
        None => {
            // A magic cut by the end of the buffer: keep its first bytes.
            let tail = buf.len().saturating_sub(3).max(from);
            (tail..buf.len())
                .find(|&i| RECORD_MAGIC.starts_with(&buf[i..]))
                .unwrap_or(buf.len())
        }
    }
}

/// The payload of a record body, decompressed if it was compressed.
pub fn payload(body: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, String> {
    let (&flags, data) = body.split_first().ok_or("empty record body")?;
    match flags {
        0 => Ok(std::borrow::Cow::Borrowed(data)),
        FLAG_LZ4 => lz4_flex::decompress_size_prepended(data)
            .map(std::borrow::Cow::Owned)
            .map_err(|e| format!("lz4: {e}")),
        other => Err(format!("unknown record flags {other:#x}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Size of the record `encode` writes for an uncompressed payload.
    fn encoded_len(payload_len: usize) -> usize {
        RECORD_HEADER + 1 + payload_len
    }

    fn records(payloads: &[&[u8]], lz4: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            encode(p, lz4, &mut out);
        }
        out
    }

    fn all(buf: &[u8]) -> (Vec<Vec<u8>>, usize) {
        let (mut found, mut damaged, mut at) = (Vec::new(), 0, 0);
        while at < buf.len() {
            match scan(buf, at) {
                Scan::Record { body, next } => {
                    found.push(payload(&buf[body]).unwrap().into_owned());
                    at = next;
                }
                Scan::Damaged { resume } => {
                    damaged += 1;
                    at = resume;
                }
                Scan::Incomplete => match crate::cursor::next_valid(buf, at + 1) {
                    Some(next) => {
                        damaged += 1;
                        at = next;
                    }
                    None => break,
                },
            }
        }
        (found, damaged)
    }

    #[test]
    fn round_trip_plain_and_lz4() {
        let long = vec![b'a'; 4000];
        for lz4 in [false, true] {
            let buf = records(&[b"one", &long, b"three"], lz4);
            let (found, damaged) = all(&buf);
            assert_eq!(damaged, 0);
            assert_eq!(
                found,
                vec![b"one".to_vec(), long.clone(), b"three".to_vec()]
            );
        }
        assert!(records(&[&long], true).len() < 200, "lz4 compresses");
    }

    #[test]
    fn every_single_bit_flip_loses_at_most_the_record_it_hits() {
        let payloads: [&[u8]; 3] = [b"first record", b"second record", b"third record"];
        let buf = records(&payloads, false);
        let ends: Vec<usize> = payloads
            .iter()
            .scan(0, |end, p| {
                *end += encoded_len(p.len());
                Some(*end)
            })
            .collect();
        for byte in 0..buf.len() {
            for bit in 0..8 {
                let mut bad = buf.clone();
                bad[byte] ^= 1 << bit;
                let (found, _) = all(&bad);
                let hit = ends.iter().position(|&end| byte < end).unwrap();
                let expected: Vec<Vec<u8>> = payloads
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != hit)
                    .map(|(_, p)| p.to_vec())
                    .collect();
                assert_eq!(found, expected, "flip of bit {bit} of byte {byte}");
            }
        }
    }

    #[test]
    fn a_cut_record_is_incomplete_not_damaged() {
        let buf = records(&[b"whole", b"cut short"], false);
        for cut in encoded_len(5)..buf.len() {
            let (found, damaged) = all(&buf[..cut]);
            assert_eq!(found, vec![b"whole".to_vec()], "cut at {cut}");
            assert_eq!(damaged, 0, "cut at {cut}");
        }
    }

    #[test]
    fn garbage_between_records_is_skipped() {
        let mut buf = records(&[b"a"], false);
        buf.extend_from_slice(b"\xF1\x9B garbage \xF1\x9BLQ\xff\xff\xff\xff");
        encode(b"b", false, &mut buf);
        let (found, damaged) = all(&buf);
        assert_eq!(found, vec![b"a".to_vec(), b"b".to_vec()]);
        // Two regions: the text, then a magic whose length is over the limit.
        assert_eq!(damaged, 2);
    }

    /// A record header whose length field is `len`, with a valid
    /// checksum over that length and `body`.
    fn with_length(len: u32, body: &[u8]) -> Vec<u8> {
        let mut out = RECORD_MAGIC.to_vec();
        out.extend_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&len.to_le_bytes()), body);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(body);
        out
    }

    /// The length field's bounds, exactly: 0 and `MAX_RECORD + 1` are
    /// damage (never waited for, never allocated), 1 and `MAX_RECORD` are
    /// lengths a record may have (here: wait for the body).
    #[test]
    fn the_length_field_is_damage_outside_one_to_max_record() {
        let next = records(&[b"after"], false);
        for (len, damaged) in [
            (0u32, true),
            (1, false),
            (MAX_RECORD as u32, false),
            (MAX_RECORD as u32 + 1, true),
            (u32::MAX, true),
        ] {
            let mut buf = with_length(len, b"");
            let header = buf.len();
            let want = if damaged {
                // Damage resumes at the next record, not waiting for a body.
                buf.extend_from_slice(&next);
                Scan::Damaged { resume: header }
            } else {
                Scan::Incomplete
            };
            assert_eq!(scan(&buf, 0), want, "length {len}");
        }
        // A header alone, with a length of 0: damage, not a record to
        // wait for.
        assert_eq!(
            scan(&with_length(0, b""), 0),
            Scan::Damaged {
                resume: RECORD_HEADER
            }
        );
        // One byte of body with its checksum: a record.
        let buf = with_length(1, b"x");
        assert_eq!(
            scan(&buf, 0),
            Scan::Record {
                body: RECORD_HEADER..RECORD_HEADER + 1,
                next: RECORD_HEADER + 1
            }
        );
    }

    /// In a tail shorter than a header: a prefix of the magic may be a
    /// record still being written (incomplete); anything else is damage,
    /// resuming at the next place the magic could begin.
    #[test]
    fn a_short_tail_is_incomplete_only_if_it_could_start_a_record() {
        let whole = records(&[b"a"], false);
        let n = whole.len();
        for cut in 1..RECORD_HEADER {
            let mut buf = whole.clone();
            buf.extend_from_slice(&RECORD_MAGIC[..cut.min(4)]);
            buf.extend(std::iter::repeat_n(0u8, cut.saturating_sub(4)));
            assert_eq!(scan(&buf, n), Scan::Incomplete, "a header cut at {cut}");
        }
        // Garbage, then the first two bytes of a magic at the very end.
        let mut buf = whole.clone();
        buf.extend_from_slice(b"zz");
        buf.extend_from_slice(&RECORD_MAGIC[..2]);
        assert_eq!(scan(&buf, n), Scan::Damaged { resume: n + 2 });
        assert_eq!(scan(&buf, n + 2), Scan::Incomplete);
        // Damage resumes after where it was found, never before: here a
        // magic one byte back, and a buffer of garbage from its start.
        let buf = [RECORD_MAGIC.as_slice(), b"xx"].concat();
        assert_eq!(scan(&buf, 1), Scan::Damaged { resume: buf.len() });
        assert_eq!(scan(b"zz", 0), Scan::Damaged { resume: 2 });
        // Garbage with no magic at all: resume at the end.
        let mut buf = whole.clone();
        buf.extend_from_slice(b"zzzz");
        assert_eq!(scan(&buf, n), Scan::Damaged { resume: n + 4 });
        // Damage found with a whole record after it: resume at its magic.
        let mut buf = whole;
        buf.extend_from_slice(b"zz");
        let at = buf.len();
        buf.extend_from_slice(&records(&[b"b"], false));
        assert_eq!(scan(&buf, n), Scan::Damaged { resume: at });
    }

    #[test]
    fn a_start_record_holds_exactly_eight_bytes_of_sequence() {
        let mut buf = Vec::new();
        encode_start(42, &mut buf);
        assert_eq!(buf.len() as u64, START_RECORD);
        let Scan::Record { body, .. } = scan(&buf, 0) else {
            panic!("a start record scans")
        };
        assert_eq!(start_seq(&buf[body]), Some(42));
        assert_eq!(start_seq(&[FLAG_START, 1, 2, 3]), None, "too short");
        assert_eq!(start_seq(&[FLAG_START; 10]), None, "too long");
        assert_eq!(start_seq(&[0; 9]), None, "a data record");
    }

    #[test]
    fn segment_header_names_its_id() {
        let h = segment_header(7);
        assert!(header_ok(&h, 7));
        assert!(!header_ok(&h, 8));
        assert!(!header_ok(&h[..10], 7));
    }
}
