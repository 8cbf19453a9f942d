//! Why formatters write into one reused buffer: a fresh `Vec` per event,
//! sized by a guess, is reallocated and copied whenever the guess is short,
//! and an encoder that reserves for its worst case (sonic-rs reserves six
//! bytes per byte of every string it escapes) makes that nearly every
//! event; the event then carries the slack downstream, and with several
//! runtime threads the grown buffers come from fresh pages that the kernel
//! must fault in. One buffer per formatter instance, cleared per event,
//! with the line copied out at its exact size, costs one copy of the line.

use bytes::Bytes;

/// A buffer grown past this by an outsized event is shrunk back to it
/// after that event, so one huge event does not pin its size for good.
/// (sonic-rs's reserve makes a string of about 11 KiB enough to pass it.)
pub const LINE_BUFFER_KEPT: usize = 64 * 1024;

/// A formatter's reusable output buffer (see the module docs).
#[derive(Debug, Default)]
pub struct LineBuffer {
    scratch: Vec<u8>,
}

impl LineBuffer {
    pub fn new() -> Self {
        LineBuffer::default()
    }

    /// Runs `write` on the emptied buffer and returns exactly what it
    /// wrote; on an error, what it wrote is dropped.
    pub fn line<E>(
        &mut self,
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<Bytes, E> {
        self.scratch.clear();
        let line = write(&mut self.scratch).map(|()| Bytes::copy_from_slice(&self.scratch));
        // A no-op unless an outsized line grew the buffer past the limit.
        self.scratch.clear();
        self.scratch.shrink_to(LINE_BUFFER_KEPT);
        line
    }

    /// What the buffer holds on to between events.
    pub fn capacity(&self) -> usize {
        self.scratch.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each line comes out at its own size, whatever the buffer held
    /// before; an error gives nothing; an outsized line's buffer is shrunk
    /// back, a normal one's is kept.
    #[test]
    fn lines_come_out_exact_and_an_outsized_buffer_is_not_kept() {
        let mut b = LineBuffer::new();
        let long = b.line(|out| {
            out.extend_from_slice(&[b'x'; 300]);
            Ok::<_, ()>(())
        });
        assert_eq!(long.unwrap().len(), 300);
        assert!(b.capacity() >= 300);
        let short = b.line(|out| {
            out.extend_from_slice(b"short");
            Ok::<_, ()>(())
        });
        assert_eq!(&short.unwrap()[..], b"short");
        let failed = b.line(|out| {
            out.extend_from_slice(b"half");
            Err("no")
        });
        assert_eq!(failed, Err("no"));
        let huge = b.line(|out| {
            out.resize(2 * LINE_BUFFER_KEPT, b'y');
            Ok::<_, ()>(())
        });
        assert_eq!(huge.unwrap().len(), 2 * LINE_BUFFER_KEPT);
        // Shrunk back to the limit, not below: a line just under it keeps it.
        assert!(b.capacity() <= LINE_BUFFER_KEPT, "{}", b.capacity());
        let after = b.line(|out| {
            out.extend_from_slice(b"after");
            Ok::<_, ()>(())
        });
        assert_eq!(&after.unwrap()[..], b"after");
        let under = b.line(|out| {
            out.resize(LINE_BUFFER_KEPT - 1024, b'z');
            Ok::<_, ()>(())
        });
        assert_eq!(under.unwrap().len(), LINE_BUFFER_KEPT - 1024);
        assert!(b.capacity() >= LINE_BUFFER_KEPT - 1024, "{}", b.capacity());
        assert_eq!(
            LINE_BUFFER_KEPT,
            64 * 1024,
            "docs/benchmarks.md gives 64 KiB"
        );
    }
}
