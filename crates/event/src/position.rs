//! Where a replaying source found an event, named so that reading the same
//! input again names it the same way. Checkpointing sources re-read what
//! was in flight at a crash; a destination that can recognise an event it
//! already holds (a document id, a deduplication token, an object key)
//! turns that redelivery into an overwrite of itself, and the crash costs
//! neither gaps nor duplicates. The position is the one fact such a
//! destination needs and the only one the source can promise to repeat:
//! event data may carry a fresh ingest time, and ordering changes with
//! workers and retries.
//!
//! The hash is SipHash-1-3 with fixed keys from the `siphasher` crate, not
//! the standard library's `DefaultHasher`, whose algorithm may change
//! between Rust releases: ids written to a destination must survive an
//! upgrade of LogBus.

use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher13};

/// An event's place in its source's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Position {
    /// Which of the source's inputs (a file, a topic partition), as a hash
    /// of what identifies it to the source across restarts.
    pub stream: u64,
    /// Where in that input the event starts (a byte offset, a message
    /// offset).
    pub offset: u64,
    /// 0 for an event as the source read it; the events a processor makes
    /// from one input event each get a distinct value ([`Position::part`]).
    pub part: u64,
}

impl Position {
    pub fn new(stream: u64, offset: u64) -> Self {
        Position {
            stream,
            offset,
            part: 0,
        }
    }

    /// The position of the `index`th event a processor made from this one
    /// (a split, an array turned into events). Splits of splits stay
    /// distinct: the part is a hash of the chain of indexes.
    pub fn part(self, index: usize) -> Self {
        let mut h = SipHasher13::new_with_keys(0x6c6f_6762_7573, 0x7061_7274);
        h.write_u64(self.part);
        h.write_u64(index as u64);
        Position {
            part: h.finish() | 1,
            ..self
        }
    }

    /// A 128-bit name for the event, unique per source stage: what a sink
    /// gives its destination as the event's id.
    pub fn id(&self, source: &str) -> u128 {
        let mut h = SipHasher13::new_with_keys(0x6c6f_6762_7573, 0x6964);
        h.write_u64(source.len() as u64);
        h.write(source.as_bytes());
        h.write_u64(self.stream);
        h.write_u64(self.offset);
        h.write_u64(self.part);
        h.finish128().as_u128()
    }

    /// A stable 64-bit hash of `parts`, for a source naming one of its
    /// inputs ([`Position::stream`]).
    pub fn stream_of(parts: &[&[u8]]) -> u64 {
        let mut h = SipHasher13::new_with_keys(0x6c6f_6762_7573, 0x7374_7265_616d);
        for part in parts {
            h.write_u64(part.len() as u64);
            h.write(part);
        }
        h.finish()
    }

    /// [`Position::id`] as 32 lowercase hex digits.
    pub fn id_hex(&self, source: &str) -> String {
        format!("{:032x}", self.id(source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_fixed_across_releases() {
        // Written to destinations: a change here duplicates every event
        // a crash makes a new version re-read.
        let p = Position::new(Position::stream_of(&[b"dev", b"ino"]), 4096);
        assert_eq!(
            Position::stream_of(&[b"dev", b"ino"]),
            0xb403_8be0_fe9b_f4b4
        );
        assert_eq!(p.id_hex("logs"), "3c6644c26d42b4a7bd8460d7ee461491");
        // A split-out event never has the part of the event as read.
        assert_ne!(p.part(0).part, 0);
    }

    #[test]
    fn every_field_and_the_source_tell_ids_apart() {
        let p = Position::new(7, 100);
        let ids = [
            p.id("a"),
            p.id("b"),
            Position::new(8, 100).id("a"),
            Position::new(7, 101).id("a"),
            p.part(0).id("a"),
            p.part(1).id("a"),
            p.part(0).part(0).id("a"),
            p.part(1).part(0).id("a"),
        ];
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert_ne!(a, b);
            }
        }
        // Source names are length-prefixed: "ab"+"c" is not "a"+"bc".
        assert_ne!(
            Position::stream_of(&[b"ab", b"c"]),
            Position::stream_of(&[b"a", b"bc"])
        );
    }
}
