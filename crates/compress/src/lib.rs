//! Streaming compression for files and objects, one `Write` and one `Read`
//! wrapper per format, so a sink or source handles every format the same
//! way. Each format is its standard *streaming* container, readable by the
//! usual command-line tool: gzip (`gzip`), zlib (`deflate`), lz4 frames
//! (`lz4`), snappy frames (the framing format of `snzip -t framing2`), zstd
//! (`zstd`).
//!
//! Writers flush a complete block on [`Write::flush`], so what a sink has
//! reported as committed can be decompressed even if the process dies
//! before [`CompressWriter::finish`] writes the end of the stream (the tools
//! then warn about a truncated stream but give back every flushed byte).
//! Readers detect the format from its magic bytes.

use std::io::{self, BufRead, BufReader, Read, Write};

/// A compression format, as configured.
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
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    None,
    Gzip,
    /// zlib-wrapped deflate (RFC 1950).
    Deflate,
    Lz4,
    Snappy,
    Zstd,
}

impl Compression {
    /// The usual file name suffix (`""` for none).
    pub fn extension(self) -> &'static str {
        match self {
            Compression::None => "",
            Compression::Gzip => ".gz",
            Compression::Deflate => ".zz",
            Compression::Lz4 => ".lz4",
            Compression::Snappy => ".sz",
            Compression::Zstd => ".zst",
        }
    }

    /// The format whose magic bytes start `head`, if any.
    pub fn detect(head: &[u8]) -> Option<Compression> {
        const LZ4: [u8; 4] = [0x04, 0x22, 0x4d, 0x18];
        const ZSTD: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
        const SNAPPY: [u8; 10] = [0xff, 0x06, 0x00, 0x00, b's', b'N', b'a', b'P', b'p', b'Y'];
        if head.starts_with(&[0x1f, 0x8b]) {
            Some(Compression::Gzip)
        } else if head.starts_with(&ZSTD) {
            Some(Compression::Zstd)
        } else if head.starts_with(&LZ4) {
            Some(Compression::Lz4)
        } else if head.starts_with(&SNAPPY) {
            Some(Compression::Snappy)
        } else if head.len() >= 2
            // zlib's header: deflate with a 32 KiB window and each of the
            // four levels (their check bits make the pair a multiple of 31).
            && head[0] == 0x78
            && matches!(head[1], 0x01 | 0x5e | 0x9c | 0xda)
        {
            Some(Compression::Deflate)
        } else {
            None
        }
    }
}

/// A compressing writer.
pub enum CompressWriter<W: Write> {
    None(W),
    Gzip(flate2::write::GzEncoder<W>),
    Deflate(flate2::write::ZlibEncoder<W>),
    Lz4(lz4_flex::frame::FrameEncoder<W>),
    Snappy(Box<snap::write::FrameEncoder<W>>),
    Zstd(zstd::stream::write::Encoder<'static, W>),
}

impl<W: Write> CompressWriter<W> {
    pub fn new(inner: W, format: Compression) -> io::Result<Self> {
        Ok(match format {
            Compression::None => CompressWriter::None(inner),
            Compression::Gzip => CompressWriter::Gzip(flate2::write::GzEncoder::new(
                inner,
                flate2::Compression::fast(),
            )),
            Compression::Deflate => CompressWriter::Deflate(flate2::write::ZlibEncoder::new(
                inner,
                flate2::Compression::fast(),
            )),
            Compression::Lz4 => CompressWriter::Lz4(lz4_flex::frame::FrameEncoder::new(inner)),
            Compression::Snappy => {
                CompressWriter::Snappy(Box::new(snap::write::FrameEncoder::new(inner)))
            }
            Compression::Zstd => CompressWriter::Zstd(zstd::stream::write::Encoder::new(inner, 3)?),
        })
    }

    /// Writes the end of the stream and returns the inner writer.
    pub fn finish(self) -> io::Result<W> {
        match self {
            CompressWriter::None(w) => Ok(w),
            CompressWriter::Gzip(e) => e.finish(),
            CompressWriter::Deflate(e) => e.finish(),
            CompressWriter::Lz4(e) => e.finish().map_err(io::Error::other),
            CompressWriter::Snappy(e) => {
                e.into_inner().map_err(|e| io::Error::other(e.to_string()))
            }
            CompressWriter::Zstd(e) => e.finish(),
        }
    }

    /// The inner writer, e.g. to take the bytes compressed so far out of a
    /// `Vec` (an object's next part) while the stream goes on.
    pub fn get_mut(&mut self) -> &mut W {
        match self {
            CompressWriter::None(w) => w,
            CompressWriter::Gzip(e) => e.get_mut(),
            CompressWriter::Deflate(e) => e.get_mut(),
            CompressWriter::Lz4(e) => e.get_mut(),
            CompressWriter::Snappy(e) => e.get_mut(),
            CompressWriter::Zstd(e) => e.get_mut(),
        }
    }

    pub fn get_ref(&self) -> &W {
        match self {
            CompressWriter::None(w) => w,
            CompressWriter::Gzip(e) => e.get_ref(),
            CompressWriter::Deflate(e) => e.get_ref(),
            CompressWriter::Lz4(e) => e.get_ref(),
            CompressWriter::Snappy(e) => e.get_ref(),
            CompressWriter::Zstd(e) => e.get_ref(),
        }
    }
}

impl<W: Write> Write for CompressWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            CompressWriter::None(w) => w.write(buf),
            CompressWriter::Gzip(e) => e.write(buf),
            CompressWriter::Deflate(e) => e.write(buf),
            CompressWriter::Lz4(e) => e.write(buf),
            CompressWriter::Snappy(e) => e.write(buf),
            CompressWriter::Zstd(e) => e.write(buf),
        }
    }

    /// Ends the current block so everything written so far can be
    /// decompressed from what has reached the inner writer.
    fn flush(&mut self) -> io::Result<()> {
        match self {
            CompressWriter::None(w) => w.flush(),
            CompressWriter::Gzip(e) => e.flush(),
            CompressWriter::Deflate(e) => e.flush(),
            CompressWriter::Lz4(e) => e.flush(),
            CompressWriter::Snappy(e) => e.flush(),
            CompressWriter::Zstd(e) => e.flush(),
        }
    }
}

/// A decompressing reader; `Auto` detection happens in [`open`].
pub enum DecompressReader<R: BufRead> {
    None(R),
    Gzip(flate2::bufread::MultiGzDecoder<R>),
    Deflate(Multi<R, flate2::bufread::ZlibDecoder<R>>),
    Lz4(Multi<R, lz4_flex::frame::FrameDecoder<R>>),
    Snappy(snap::read::FrameDecoder<R>),
    Zstd(zstd::stream::read::Decoder<'static, R>),
}

/// A decoder that stops at the end of one stream or frame.
pub trait SingleStream<R: BufRead>: Read {
    fn start(inner: R) -> Self;
    fn into_inner(self) -> R;
}

impl<R: BufRead> SingleStream<R> for flate2::bufread::ZlibDecoder<R> {
    fn start(inner: R) -> Self {
        flate2::bufread::ZlibDecoder::new(inner)
    }
    fn into_inner(self) -> R {
        flate2::bufread::ZlibDecoder::into_inner(self)
    }
}

impl<R: BufRead> SingleStream<R> for lz4_flex::frame::FrameDecoder<R> {
    fn start(inner: R) -> Self {
        lz4_flex::frame::FrameDecoder::new(inner)
    }
    fn into_inner(self) -> R {
        lz4_flex::frame::FrameDecoder::into_inner(self)
    }
}

/// Streams one after another (a file appended to by several runs): the
/// zlib and lz4 decoders stop after the first, so start a new one while
/// input remains.
pub struct Multi<R: BufRead, D: SingleStream<R>>(Option<D>, std::marker::PhantomData<R>);

impl<R: BufRead, D: SingleStream<R>> Multi<R, D> {
    fn new(inner: R) -> Self {
        Multi(Some(D::start(inner)), std::marker::PhantomData)
    }
}

impl<R: BufRead, D: SingleStream<R>> Read for Multi<R, D> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(decoder) = self.0.as_mut() else {
                return Ok(0);
            };
            let n = decoder.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // This stream has ended: another may follow.
            let mut inner = self.0.take().expect("present").into_inner();
            if inner.fill_buf()?.is_empty() {
                return Ok(0);
            }
            self.0 = Some(D::start(inner));
        }
    }
}

impl<R: BufRead> Read for DecompressReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            DecompressReader::None(r) => r.read(buf),
            DecompressReader::Gzip(d) => d.read(buf),
            DecompressReader::Deflate(d) => d.read(buf),
            DecompressReader::Lz4(d) => d.read(buf),
            DecompressReader::Snappy(d) => d.read(buf),
            DecompressReader::Zstd(d) => d.read(buf),
        }
    }
}

/// How a reader picks its format.
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
#[serde(rename_all = "lowercase")]
pub enum ReadCompression {
    /// By the first bytes: any format above, else plain.
    #[default]
    Auto,
    None,
    Gzip,
    Deflate,
    Lz4,
    Snappy,
    Zstd,
}

/// Wraps `inner` in the decoder `choice` names (or detects).
pub fn open<R: Read>(
    inner: R,
    choice: ReadCompression,
) -> io::Result<DecompressReader<BufReader<R>>> {
    let mut inner = BufReader::with_capacity(256 * 1024, inner);
    let format = match choice {
        ReadCompression::Auto => Compression::detect(inner.fill_buf()?).unwrap_or_default(),
        ReadCompression::None => Compression::None,
        ReadCompression::Gzip => Compression::Gzip,
        ReadCompression::Deflate => Compression::Deflate,
        ReadCompression::Lz4 => Compression::Lz4,
        ReadCompression::Snappy => Compression::Snappy,
        ReadCompression::Zstd => Compression::Zstd,
    };
    Ok(match format {
        Compression::None => DecompressReader::None(inner),
        Compression::Gzip => DecompressReader::Gzip(flate2::bufread::MultiGzDecoder::new(inner)),
        Compression::Deflate => DecompressReader::Deflate(Multi::new(inner)),
        Compression::Lz4 => DecompressReader::Lz4(Multi::new(inner)),
        Compression::Snappy => DecompressReader::Snappy(snap::read::FrameDecoder::new(inner)),
        Compression::Zstd => {
            DecompressReader::Zstd(zstd::stream::read::Decoder::with_buffer(inner)?)
        }
    })
}

/// Why a body could not be decompressed.
#[derive(Debug, PartialEq, Eq)]
pub enum Undecodable {
    /// A `Content-Encoding` this source does not take (415).
    Unsupported(String),
    /// The bytes are not what the encoding says (400).
    Malformed(String),
    /// Larger than allowed once decompressed (413).
    TooLarge(String),
}

/// The body decompressed per its `Content-Encoding`, at most `max` bytes:
/// decompression stops one byte past the limit, so a small body that
/// inflates to gigabytes costs `max + 1` bytes.
///
/// `Ok(None)`: no encoding, the body is as sent.
pub fn decode_content(
    encoding: &str,
    body: &[u8],
    max: usize,
) -> Result<Option<Vec<u8>>, Undecodable> {
    let encoding = encoding.trim().to_ascii_lowercase();
    let format = match encoding.as_str() {
        "identity" | "" => {
            if body.len() > max {
                return Err(Undecodable::TooLarge(format!(
                    "the body is larger than {max} bytes"
                )));
            }
            return Ok(None);
        }
        "gzip" | "x-gzip" => ReadCompression::Gzip,
        "zstd" => ReadCompression::Zstd,
        "deflate" => ReadCompression::Deflate,
        other => {
            return Err(Undecodable::Unsupported(format!(
                "Content-Encoding `{other}` is not supported (gzip, zstd, deflate)"
            )));
        }
    };
    let bad = |e: std::io::Error| Undecodable::Malformed(format!("{encoding} body: {e}"));
    let reader = open(body, format).map_err(bad)?;
    let mut out = Vec::new();
    // One byte past the limit tells "too large" from "exactly the limit".
    reader
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(bad)?;
    if out.len() > max {
        return Err(Undecodable::TooLarge(format!(
            "the body is larger than {max} bytes once decompressed"
        )));
    }
    Ok(Some(out))
}
