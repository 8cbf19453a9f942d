//! The queue's acknowledged position, kept in two checksummed slots that
//! are written alternately in place. A write that is torn (by a crash, a
//! power cut) damages at most the slot being written; the other still
//! holds the previous position, so reading picks the valid slot with the
//! higher generation. This gives the atomicity of write-temp-and-rename at
//! the cost of one `pwrite` per acknowledgement, which matters because the
//! position is saved every time a batch is acknowledged (that is what
//! bounds duplicates after a crash to the batches that were in flight).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Format 1 slots held the position only; format 2 adds the sequence
/// numbers that make loss countable (and one reserved field). Both are
/// read; format 2 is written.
const SLOT_V1: usize = 40;
const SLOT: usize = 64;
const STATE_MAGIC: [u8; 4] = *b"LBQS";

/// Everything before `(segment, offset)` has been acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub segment: u64,
    pub offset: u64,
}

/// Sequence numbers (counting every data record ever stored) saved with
/// the position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seqs {
    /// The first record not acknowledged (the one at the position).
    pub acked: u64,
    /// Every record before this one was on stable storage when saved.
    pub stored: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saved {
    pub generation: u64,
    pub acked: Position,
    /// `None` in a format-1 state file.
    pub seqs: Option<Seqs>,
}

fn encode(saved: Saved) -> [u8; SLOT] {
    let seqs = saved.seqs.unwrap_or_default();
    let mut b = [0u8; SLOT];
    b[..4].copy_from_slice(&STATE_MAGIC);
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    for (i, v) in [
        saved.generation,
        saved.acked.segment,
        saved.acked.offset,
        seqs.acked,
        seqs.stored,
        // Reserved.
        0,
    ]
    .into_iter()
    .enumerate()
    {
        b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b[..56]);
    b[56..60].copy_from_slice(&crc.to_le_bytes());
    b
}

/// A slot of either format at the start of `b`, and its length.
fn decode(b: &[u8]) -> Option<(Saved, usize)> {
    if b.len() < SLOT_V1 || b[..4] != STATE_MAGIC {
        return None;
    }
    let u = |i: usize| u64::from_le_bytes(b[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes"));
    match u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) {
        1 if crc32c::crc32c(&b[..32]).to_le_bytes() == b[32..36] => Some((
            Saved {
                generation: u(0),
                acked: Position {
                    segment: u(1),
                    offset: u(2),
                },
                seqs: None,
            },
            SLOT_V1,
        )),
        2 if b.len() >= SLOT && crc32c::crc32c(&b[..56]).to_le_bytes() == b[56..60] => Some((
            Saved {
                generation: u(0),
                acked: Position {
                    segment: u(1),
                    offset: u(2),
                },
                seqs: Some(Seqs {
                    acked: u(3),
                    stored: u(4),
                }),
            },
            SLOT,
        )),
        _ => None,
    }
}

/// What reading the state file found.
#[derive(Debug, PartialEq, Eq)]
pub enum Loaded {
    /// No state file: a new queue.
    Missing,
    /// Neither slot is valid.
    Garbage,
    Valid(Saved),
}

pub fn load(path: &Path) -> io::Result<Loaded> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) => return Err(e),
    };
    // The second slot sits after the first, whose size its format gives;
    // with the first slot torn, either size may be right.
    let a = decode(&bytes);
    let b = match a {
        Some((_, size)) => bytes.get(size..).and_then(decode),
        None => bytes
            .get(SLOT..)
            .and_then(decode)
            .filter(|(_, size)| *size == SLOT)
            .or_else(|| {
                bytes
                    .get(SLOT_V1..)
                    .and_then(decode)
                    .filter(|(_, size)| *size == SLOT_V1)
            }),
    };
    Ok(match (a.map(|(s, _)| s), b.map(|(s, _)| s)) {
        (Some(a), Some(b)) => Loaded::Valid(if b.generation > a.generation { b } else { a }),
        (Some(s), None) | (None, Some(s)) => Loaded::Valid(s),
        (None, None) => Loaded::Garbage,
    })
}

/// The open state file; `save` writes the slot the generation selects.
pub struct StateFile {
    file: File,
    generation: u64,
}

impl StateFile {
    /// Opens (creating) the file and writes `acked` into both slots.
    pub fn create(
        path: &Path,
        generation: u64,
        acked: Position,
        seqs: Seqs,
    ) -> io::Result<StateFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        file.set_len(2 * SLOT as u64)?;
        let mut state = StateFile { file, generation };
        state.save(acked, seqs)?;
        state.save(acked, seqs)?;
        Ok(state)
    }

    pub fn save(&mut self, acked: Position, seqs: Seqs) -> io::Result<()> {
        self.generation += 1;
        let slot = (self.generation % 2) * SLOT as u64;
        self.file.write_all_at(
            &encode(Saved {
                generation: self.generation,
                acked,
                seqs: Some(seqs),
            }),
            slot,
        )
    }

    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(segment: u64, offset: u64) -> Position {
        Position { segment, offset }
    }

    fn v1_slot(generation: u64, segment: u64) -> [u8; SLOT_V1] {
        let mut slot = [0u8; SLOT_V1];
        slot[..4].copy_from_slice(&STATE_MAGIC);
        slot[4..8].copy_from_slice(&1u32.to_le_bytes());
        slot[8..16].copy_from_slice(&generation.to_le_bytes());
        slot[16..24].copy_from_slice(&segment.to_le_bytes());
        slot[24..32].copy_from_slice(&16u64.to_le_bytes());
        let crc = crc32c::crc32c(&slot[..32]);
        slot[32..36].copy_from_slice(&crc.to_le_bytes());
        slot
    }

    /// With the first slot torn, its size is unknown: the second is found
    /// where either format would put it, and only in that format.
    #[test]
    fn a_torn_first_slot_finds_the_second_of_either_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let seqs = Seqs {
            acked: 1,
            stored: 2,
        };
        let mut state = StateFile::create(&path, 0, pos(1, 16), seqs).unwrap();
        assert_eq!(state.generation(), 2, "both slots written");
        state.save(pos(3, 16), seqs).unwrap();
        assert_eq!(state.generation(), 3);
        state.sync().unwrap();
        // Generation 3 sits in the second slot, 2 in the first: tear the first.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[0] ^= 0xFF;
        std::fs::write(&path, &bytes).unwrap();
        let Loaded::Valid(saved) = load(&path).unwrap() else {
            panic!("the second slot is valid")
        };
        assert_eq!((saved.generation, saved.acked), (3, pos(3, 16)));

        let mut v1 = Vec::new();
        v1.extend_from_slice(&v1_slot(6, 5));
        v1.extend_from_slice(&v1_slot(7, 9));
        v1[1] ^= 0xFF;
        std::fs::write(&path, &v1).unwrap();
        assert_eq!(
            load(&path).unwrap(),
            Loaded::Valid(Saved {
                generation: 7,
                acked: pos(9, 16),
                seqs: None
            })
        );
        // A format-1 slot where a format-2 one belongs is not taken: after
        // a torn 64-byte slot, a 40-byte slot at 64 is not the second.
        let mut odd = vec![0u8; SLOT];
        odd.extend_from_slice(&v1_slot(8, 2));
        std::fs::write(&path, &odd).unwrap();
        assert_eq!(load(&path).unwrap(), Loaded::Garbage);
    }

    #[test]
    fn an_unreadable_state_file_is_an_error_not_a_first_start() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file belongs cannot be read.
        assert!(load(dir.path()).is_err());
    }

    #[test]
    fn the_newer_valid_slot_wins_and_a_torn_slot_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        assert_eq!(load(&path).unwrap(), Loaded::Missing);
        let seqs = |n: u64| Seqs {
            acked: n,
            stored: n + 5,
        };
        let mut state = StateFile::create(&path, 0, pos(1, 16), seqs(0)).unwrap();
        state.save(pos(1, 100), seqs(3)).unwrap();
        state.save(pos(2, 16), seqs(7)).unwrap();
        let Loaded::Valid(saved) = load(&path).unwrap() else {
            panic!("valid")
        };
        assert_eq!(saved.acked, pos(2, 16));
        assert_eq!(saved.seqs, Some(seqs(7)));
        // Tear the newest slot: the previous position comes back.
        let newest = (saved.generation % 2) as usize * SLOT;
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[newest + 20] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(
            load(&path).unwrap(),
            Loaded::Valid(Saved {
                generation: saved.generation - 1,
                acked: pos(1, 100),
                seqs: Some(seqs(3)),
            })
        );
        // A format-1 file (position only) still reads.
        let mut v1 = Vec::new();
        for (generation, segment) in [(4u64, 3u64), (5, 4)] {
            v1.extend_from_slice(&v1_slot(generation, segment));
        }
        std::fs::write(&path, &v1).unwrap();
        assert_eq!(
            load(&path).unwrap(),
            Loaded::Valid(Saved {
                generation: 5,
                acked: pos(4, 16),
                seqs: None
            })
        );
        // Its newer slot torn: the older one.
        v1[SLOT_V1 + 20] ^= 0x01;
        std::fs::write(&path, &v1).unwrap();
        assert_eq!(
            load(&path).unwrap(),
            Loaded::Valid(Saved {
                generation: 4,
                acked: pos(3, 16),
                seqs: None
            })
        );
        std::fs::write(&path, b"not a state file at all, just garbage text").unwrap();
        assert_eq!(load(&path).unwrap(), Loaded::Garbage);
        std::fs::write(&path, b"").unwrap();
        assert_eq!(load(&path).unwrap(), Loaded::Garbage);
    }
}
