//! Cutting a byte stream into messages, and the inverse. A stream source
//! (a file, standard input, later TCP) feeds whatever it read into a
//! [`Deframer`] and gets whole messages back; a sink writes each message
//! with [`encode`]. Messages never copy: they are slices of the read buffer.
//!
//! - `newline`: a message ends at `\n` (a trailing `\r` is the parser's
//!   business); a last message without `\n` still counts at end of stream.
//! - `octet-counting` (RFC 6587 §3.4.1): `LEN SP MSG`, `LEN` in ASCII
//!   decimal without leading zeros. Syslog over TCP uses it.
//! - `length-prefixed`: a 4-byte big-endian length, then the message.
//! - `whole`: the stream is one message (a file as one event).
//!
//! A stream that breaks the framing (a bad length, a message over the
//! limit, a stream ending inside a message) is an error naming the byte
//! offset in the stream: after it, the stream cannot be trusted to be in
//! step, so the source stops rather than guess.

use bytes::{Bytes, BytesMut};

#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Framing {
    #[default]
    Newline,
    OctetCounting,
    LengthPrefixed,
    /// The whole stream is one message (a file read as one event, e.g. an
    /// Avro container file); longer than the limit is an error.
    Whole,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    /// Offset in the whole stream where the framing broke.
    pub offset: u64,
    pub message: String,
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (at byte {} of the stream)",
            self.message, self.offset
        )
    }
}

impl std::error::Error for FrameError {}

pub struct Deframer {
    framing: Framing,
    max_message: usize,
    pending: BytesMut,
    /// Stream offset of `pending[0]`.
    consumed: u64,
    /// Newline framing: messages over the limit are cut (and counted), as
    /// line-oriented tools do; the other framings refuse them.
    pub cut: u64,
    /// With [`Deframer::push_placed`]: the stream offset where each message
    /// handed out starts, in step with the messages.
    starts: Option<Vec<u64>>,
}

impl Deframer {
    pub fn new(framing: Framing, max_message: usize) -> Self {
        Deframer {
            framing,
            max_message: max_message.max(1),
            pending: BytesMut::new(),
            consumed: 0,
            cut: 0,
            starts: None,
        }
    }

    /// Stream offset just past the last message handed out: where a reader
    /// that resumes must start so as to neither repeat nor skip a message.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// [`Deframer::push`], and the stream offset where each message starts
    /// appended to `starts` (a reader that names events by position).
    pub fn push_placed(
        &mut self,
        data: &[u8],
        out: &mut Vec<Bytes>,
        starts: &mut Vec<u64>,
    ) -> Result<(), FrameError> {
        let mut mine = std::mem::take(starts);
        mine.clear();
        self.starts = Some(mine);
        let result = self.push(data, out);
        *starts = self.starts.take().unwrap_or_default();
        result
    }

    /// Where a message that starts `at` bytes into what is taken next
    /// begins in the stream, when offsets are asked for.
    fn started(&mut self, at: u64) {
        let consumed = self.consumed;
        if let Some(starts) = &mut self.starts {
            starts.push(consumed + at);
        }
    }

    /// Adds bytes read from the stream; appends every complete message to
    /// `out`.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<Bytes>) -> Result<(), FrameError> {
        self.pending.extend_from_slice(data);
        match self.framing {
            Framing::Newline => self.newline(out),
            Framing::OctetCounting => self.octet_counting(out),
            Framing::LengthPrefixed => self.length_prefixed(out),
            Framing::Whole if self.pending.len() > self.max_message => Err(self.error(
                0,
                format!("the stream is over the limit of {} bytes", self.max_message),
            )),
            Framing::Whole => Ok(()),
        }
    }

    /// The end of the stream: a last newline-framed message without its
    /// `\n` is returned; anything left in the other framings is a
    /// truncated message.
    pub fn finish(&mut self) -> Result<Option<Bytes>, FrameError> {
        if self.pending.is_empty() {
            return Ok(None);
        }
        match self.framing {
            Framing::Newline | Framing::Whole => {
                let n = self.pending.len();
                self.consumed += n as u64;
                Ok(Some(self.pending.split().freeze()))
            }
            _ => Err(self.error(0, "the stream ends inside a message")),
        }
    }

    /// [`Deframer::finish`], with the stream offset the last message
    /// starts at.
    pub fn finish_placed(&mut self) -> Result<Option<(u64, Bytes)>, FrameError> {
        let at = self.consumed;
        Ok(self.finish()?.map(|last| (at, last)))
    }

    fn error(&self, at: usize, message: impl Into<String>) -> FrameError {
        FrameError {
            offset: self.consumed + at as u64,
            message: message.into(),
        }
    }

    fn take(&mut self, n: usize) -> Bytes {
        self.consumed += n as u64;
        self.pending.split_to(n).freeze()
    }

    fn newline(&mut self, out: &mut Vec<Bytes>) -> Result<(), FrameError> {
        if let Some(last) = memchr::memrchr(b'\n', &self.pending) {
            let base = self.consumed;
            let complete = self.take(last + 1);
            let mut start = 0;
            for nl in memchr::memchr_iter(b'\n', &complete) {
                let mut line = complete.slice(start..nl);
                let mut at = start;
                start = nl + 1;
                while line.len() > self.max_message {
                    self.cut += 1;
                    if let Some(starts) = &mut self.starts {
                        starts.push(base + at as u64);
                    }
                    at += self.max_message;
                    out.push(line.split_to(self.max_message));
                }
                if let Some(starts) = &mut self.starts {
                    starts.push(base + at as u64);
                }
                out.push(line);
            }
        }
        while self.pending.len() > self.max_message {
            self.cut += 1;
            self.started(0);
            let piece = self.take(self.max_message);
            out.push(piece);
        }
        Ok(())
    }

    fn octet_counting(&mut self, out: &mut Vec<Bytes>) -> Result<(), FrameError> {
        loop {
            let digits = self
                .pending
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            // Checked first, so the error does not depend on how the
            // stream was split into reads (found by fuzzing).
            if digits > 10 {
                return Err(self.error(0, "a message length of more than 10 digits"));
            }
            if digits == self.pending.len() {
                return Ok(()); // need more
            }
            if digits == 0 {
                return Err(self.error(0, "expected a decimal message length"));
            }
            if self.pending[digits] != b' ' {
                return Err(self.error(digits, "expected a space after the message length"));
            }
            // RFC 6587 has no empty messages; "0" is read as one anyway so
            // that whatever `encode` writes reads back.
            if self.pending[0] == b'0' && digits > 1 {
                return Err(self.error(0, "a message length with a leading zero"));
            }
            let len: u64 = std::str::from_utf8(&self.pending[..digits])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| self.error(0, "a message length out of range"))?;
            if len > self.max_message as u64 {
                return Err(self.error(
                    0,
                    format!(
                        "a message of {len} bytes, over the limit of {}",
                        self.max_message
                    ),
                ));
            }
            let total = digits + 1 + len as usize;
            if self.pending.len() < total {
                return Ok(());
            }
            self.take(digits + 1);
            self.started(0);
            out.push(self.take(len as usize));
        }
    }

    fn length_prefixed(&mut self, out: &mut Vec<Bytes>) -> Result<(), FrameError> {
        while self.pending.len() >= 4 {
            let len = u32::from_be_bytes(self.pending[..4].try_into().expect("4 bytes")) as usize;
            if len > self.max_message {
                return Err(self.error(
                    0,
                    format!(
                        "a message of {len} bytes, over the limit of {}",
                        self.max_message
                    ),
                ));
            }
            if self.pending.len() < 4 + len {
                return Ok(());
            }
            self.take(4);
            self.started(0);
            out.push(self.take(len));
        }
        Ok(())
    }
}

/// Appends one framed message to `out`.
pub fn encode(framing: Framing, message: &[u8], out: &mut Vec<u8>) {
    match framing {
        Framing::Newline => {
            out.extend_from_slice(message);
            out.push(b'\n');
        }
        Framing::OctetCounting => {
            out.extend_from_slice(message.len().to_string().as_bytes());
            out.push(b' ');
            out.extend_from_slice(message);
        }
        Framing::LengthPrefixed => {
            out.extend_from_slice(&(message.len() as u32).to_be_bytes());
            out.extend_from_slice(message);
        }
        Framing::Whole => out.extend_from_slice(message),
    }
}
