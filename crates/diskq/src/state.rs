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

const SLOT: usize = 40;
const STATE_MAGIC: [u8; 4] = *b"LBQS";
const STATE_VERSION: u32 = 1;

/// Everything before `(segment, offset)` has been acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub segment: u64,
    pub offset: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saved {
    pub generation: u64,
    pub acked: Position,
}

fn encode(saved: Saved) -> [u8; SLOT] {
    let mut b = [0u8; SLOT];
    b[..4].copy_from_slice(&STATE_MAGIC);
    b[4..8].copy_from_slice(&STATE_VERSION.to_le_bytes());
    b[8..16].copy_from_slice(&saved.generation.to_le_bytes());
    b[16..24].copy_from_slice(&saved.acked.segment.to_le_bytes());
    b[24..32].copy_from_slice(&saved.acked.offset.to_le_bytes());
    let crc = crc32c::crc32c(&b[..32]);
    b[32..36].copy_from_slice(&crc.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<Saved> {
    if b.len() < SLOT
        || b[..4] != STATE_MAGIC
        || b[4..8] != STATE_VERSION.to_le_bytes()
        || crc32c::crc32c(&b[..32]).to_le_bytes() != b[32..36]
    {
        return None;
    }
    let u = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().expect("8 bytes"));
    Some(Saved {
        generation: u(8..16),
        acked: Position {
            segment: u(16..24),
            offset: u(24..32),
        },
    })
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
    let a = decode(&bytes);
    let b = bytes.get(SLOT..).and_then(decode);
    Ok(match (a, b) {
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
    pub fn create(path: &Path, generation: u64, acked: Position) -> io::Result<StateFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        file.set_len(2 * SLOT as u64)?;
        let mut state = StateFile { file, generation };
        state.save(acked)?;
        state.save(acked)?;
        Ok(state)
    }

    pub fn save(&mut self, acked: Position) -> io::Result<()> {
        self.generation += 1;
        let slot = (self.generation % 2) * SLOT as u64;
        self.file.write_all_at(
            &encode(Saved {
                generation: self.generation,
                acked,
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

    #[test]
    fn the_newer_valid_slot_wins_and_a_torn_slot_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        assert_eq!(load(&path).unwrap(), Loaded::Missing);
        let mut state = StateFile::create(&path, 0, pos(1, 16)).unwrap();
        state.save(pos(1, 100)).unwrap();
        state.save(pos(2, 16)).unwrap();
        let Loaded::Valid(saved) = load(&path).unwrap() else {
            panic!("valid")
        };
        assert_eq!(saved.acked, pos(2, 16));
        // Tear the newest slot: the previous position comes back.
        let newest = (saved.generation % 2) as usize * SLOT;
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[newest + 20] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(
            load(&path).unwrap(),
            Loaded::Valid(Saved {
                generation: saved.generation - 1,
                acked: pos(1, 100)
            })
        );
        std::fs::write(&path, b"not a state file at all, just garbage text").unwrap();
        assert_eq!(load(&path).unwrap(), Loaded::Garbage);
        std::fs::write(&path, b"").unwrap();
        assert_eq!(load(&path).unwrap(), Loaded::Garbage);
    }
}
