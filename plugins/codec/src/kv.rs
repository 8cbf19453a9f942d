//! `key=value` pairs (logfmt): `level=info msg="disk full" took=1.5 retry`.
//!
//! Decoding: pairs are separated by spaces (or `separator`); a value is bare
//! (up to the next separator) or double-quoted with `\"`, `\\`, `\n`, `\r`,
//! `\t` and `\uXXXX` escapes. A key without `=` is a flag (`true`). With
//! `types: auto` (the default) a bare value that reads as an integer, a
//! float, `true`/`false` becomes that JSON type and an empty bare value
//! (`key=`) becomes `null`; quoted values are always strings.
//!
//! Encoding is the inverse, so that decoding what was encoded gives the
//! same fields: strings are quoted whenever bare text would read back as
//! something else (a number, a boolean, empty, or containing a space, `=`,
//! `"` or a control character). Nested objects and arrays are written as
//! quoted JSON text (they come back as strings: logfmt has no nesting).
//! Key bytes that would end the key (separator, delimiter, quote, space,
//! control) are written as `_`.

use logbus_plugin_api::Fields;
use serde_json::{Number, Value};

use crate::DecodeError;

/// How bare values are typed.
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
pub enum Types {
    /// Numbers, booleans and `null` (empty) are recognised.
    #[default]
    Auto,
    /// Every value is a string.
    String,
}

#[derive(Debug, Clone, Copy)]
pub struct Syntax {
    pub separator: u8,
    pub delimiter: u8,
    pub types: Types,
}

impl Default for Syntax {
    fn default() -> Self {
        Syntax {
            separator: b' ',
            delimiter: b'=',
            types: Types::Auto,
        }
    }
}

pub fn decode(input: &[u8], syntax: &Syntax) -> Result<Fields, DecodeError> {
    let text = std::str::from_utf8(input)
        .map_err(|e| DecodeError::at(e.valid_up_to(), "invalid UTF-8"))?;
    let bytes = text.as_bytes();
    let mut fields = Fields::new();
    let mut i = 0;
    // With the default space separator, any ASCII whitespace separates.
    let is_sep =
        |b: u8| b == syntax.separator || (syntax.separator == b' ' && b.is_ascii_whitespace());
    loop {
        while i < bytes.len() && is_sep(bytes[i]) {
            i += 1;
        }
        if i >= bytes.len() {
            break;
        }
        let key_start = i;
        while i < bytes.len() && bytes[i] != syntax.delimiter && !is_sep(bytes[i]) {
            if bytes[i] == b'"' {
                return Err(DecodeError::at(i, "a quote inside a key"));
            }
            if bytes[i].is_ascii_control() {
                return Err(DecodeError::at(i, "a control character inside a key"));
            }
            i += 1;
        }
        if i == key_start {
            return Err(DecodeError::at(i, "a value without a key"));
        }
        let key = &text[key_start..i];
        if i >= bytes.len() || is_sep(bytes[i]) {
            fields.insert(key.to_string(), Value::Bool(true));
            continue;
        }
        i += 1; // the delimiter
        let value = if i < bytes.len() && bytes[i] == b'"' {
            let (s, next) = quoted(text, i)?;
            i = next;
            if i < bytes.len() && !is_sep(bytes[i]) {
                return Err(DecodeError::at(i, "text right after a closing quote"));
            }
            Value::String(s)
        } else {
            let start = i;
            while i < bytes.len() && !is_sep(bytes[i]) {
                if bytes[i] == b'"' {
                    return Err(DecodeError::at(i, "a quote inside a bare value"));
                }
                i += 1;
            }
            bare(&text[start..i], syntax.types)
        };
        fields.insert(key.to_string(), value);
    }
    Ok(fields)
}

/// A quoted string starting at `start` (the opening quote); returns it and
/// the offset after the closing quote.
fn quoted(text: &str, start: usize) -> Result<(String, usize), DecodeError> {
    let mut out = String::new();
    let mut chars = text[start + 1..].char_indices();
    while let Some((k, c)) = chars.next() {
        let at = start + 1 + k;
        match c {
            '"' => return Ok((out, at + 1)),
            '\\' => match chars.next() {
                Some((_, '"')) => out.push('"'),
                Some((_, '\\')) => out.push('\\'),
                Some((_, 'n')) => out.push('\n'),
                Some((_, 'r')) => out.push('\r'),
                Some((_, 't')) => out.push('\t'),
                Some((_, 'u')) => {
                    let hex: String = chars.by_ref().take(4).map(|(_, c)| c).collect();
                    let code = u32::from_str_radix(&hex, 16)
                        .ok()
                        .filter(|_| hex.len() == 4)
                        .and_then(char::from_u32)
                        .ok_or_else(|| DecodeError::at(at, "a bad \\u escape"))?;
                    out.push(code);
                }
                Some((_, other)) => {
                    return Err(DecodeError::at(
                        at,
                        format!("an unknown escape `\\{other}`"),
                    ));
                }
                None => return Err(DecodeError::at(at, "an escape at the end of the input")),
            },
            c => out.push(c),
        }
    }
    Err(DecodeError::at(start, "a quote that is never closed"))
}

pub(crate) fn bare(text: &str, types: Types) -> Value {
    if types == Types::String {
        return Value::String(text.to_string());
    }
    typed(text).unwrap_or_else(|| Value::String(text.to_string()))
}

/// What an unquoted `text` reads as under `types: auto` when that is not a
/// string (empty, a boolean, a number).
fn typed(text: &str) -> Option<Value> {
    match text {
        "" => return Some(Value::Null),
        "true" => return Some(Value::Bool(true)),
        "false" => return Some(Value::Bool(false)),
        _ => {}
    }
    if let Ok(i) = text.parse::<i64>() {
        return Some(Value::Number(i.into()));
    }
    if let Ok(u) = text.parse::<u64>() {
        return Some(Value::Number(u.into()));
    }
    // Only the characters of a decimal number: `f64`'s parser also takes
    // `inf` and `NaN`, which stay strings. (Text of these characters
    // without a digit does not parse.)
    let numeric = text
        .bytes()
        .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b));
    if numeric
        && let Ok(f) = text.parse::<f64>()
        && let Some(n) = Number::from_f64(f)
    {
        return Some(Value::Number(n));
    }
    None
}

pub fn encode(fields: &Fields, syntax: &Syntax, out: &mut Vec<u8>) {
    for (n, (key, value)) in fields.iter().enumerate() {
        if n > 0 {
            out.push(syntax.separator);
        }
        // A key cannot hold what delimits it; such bytes become `_`.
        for b in key.bytes() {
            let bad = b == syntax.separator
                || b == syntax.delimiter
                || b == b'"'
                || b.is_ascii_whitespace()
                || b.is_ascii_control();
            out.push(if bad { b'_' } else { b });
        }
        if key.is_empty() {
            out.push(b'_');
        }
        match value {
            Value::Bool(true) => {
                // A flag would be shorter, but `key=true` says the same to
                // more readers.
                out.push(syntax.delimiter);
                out.extend_from_slice(b"true");
            }
            Value::Null => out.push(syntax.delimiter),
            Value::Bool(false) => {
                out.push(syntax.delimiter);
                out.extend_from_slice(b"false");
            }
            Value::Number(num) => {
                out.push(syntax.delimiter);
                match num.as_f64() {
                    Some(f) if num.is_f64() => out.extend_from_slice(format!("{f:?}").as_bytes()),
                    _ => out.extend_from_slice(num.to_string().as_bytes()),
                }
            }
            Value::String(s) => {
                out.push(syntax.delimiter);
                write_string(s, syntax, out);
            }
            nested => {
                out.push(syntax.delimiter);
                write_quoted(&nested.to_string(), out);
            }
        }
    }
}

fn write_string(s: &str, syntax: &Syntax, out: &mut Vec<u8>) {
    let needs_quotes = s.is_empty()
        || (syntax.types == Types::Auto && typed(s).is_some())
        || s.bytes().any(|b| {
            b == syntax.separator
                || b == syntax.delimiter
                || b == b'"'
                || b == b'\\'
                || b.is_ascii_whitespace()
                || b.is_ascii_control()
        });
    if needs_quotes {
        write_quoted(s, out);
    } else {
        out.extend_from_slice(s.as_bytes());
    }
}

/// Bytes scanned at once by [`clean_strides`].
const STRIDE: usize = 32;

fn escaped(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\' || b == 0x7f
}

/// The length of the leading whole 32-byte strides of `bytes` that hold
/// nothing to escape: a test per stride the compiler vectorises (a message
/// is mostly clean).
fn clean_strides(bytes: &[u8]) -> usize {
    bytes
        .chunks_exact(STRIDE)
        .take_while(|stride| !stride.iter().fold(false, |any, &b| any | escaped(b)))
        .count()
        * STRIDE
}

/// Every byte that is escaped is ASCII, so the text is scanned as bytes
/// (a UTF-8 sequence has none below 0x80) and copied in runs between
/// escapes: clean strides are skipped whole, the stride that holds an
/// escape (or the short tail) is taken byte by byte.
fn write_quoted(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.push(b'"');
    let (mut run, mut i) = (0, 0);
    while i < bytes.len() {
        i += clean_strides(&bytes[i..]);
        let end = (i + STRIDE).min(bytes.len());
        while i < end {
            let b = bytes[i];
            i += 1;
            let control;
            let escape: &[u8] = match b {
                b'"' => b"\\\"",
                b'\\' => b"\\\\",
                b'\n' => b"\\n",
                b'\r' => b"\\r",
                b'\t' => b"\\t",
                b if escaped(b) => {
                    control = [
                        b'\\',
                        b'u',
                        b'0',
                        b'0',
                        HEX[(b >> 4) as usize],
                        HEX[(b & 0xf) as usize],
                    ];
                    &control
                }
                _ => continue,
            };
            out.extend_from_slice(&bytes[run..i - 1]);
            out.extend_from_slice(escape);
            run = i;
        }
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

#[cfg(any(feature = "parser-kv", feature = "formatter-kv"))]
mod plugins {
    use logbus_plugin_api::{
        BuildContext, CheckOptions, Event, EventError, LineBuffer, OptionError, Payload, Processor,
        StageKind, TypedPlugin, Verdict,
    };
    use serde::Deserialize;

    use super::{Syntax, Types, decode, encode};

    /// Options of `parser: kv` and `formatter: kv`.
    #[derive(Debug, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct KvOptions {
        /// Between pairs (one character; default a space, which also
        /// accepts any whitespace when decoding).
        #[serde(default = "default_separator")]
        pub separator: String,
        /// Between a key and its value (one character).
        #[serde(default = "default_delimiter")]
        pub delimiter: String,
        /// `auto`: bare numbers, booleans and empty values are typed;
        /// `string`: every value is a string.
        #[serde(default)]
        pub types: Types,
    }

    fn default_separator() -> String {
        " ".into()
    }
    fn default_delimiter() -> String {
        "=".into()
    }

    impl CheckOptions for KvOptions {
        fn check(&self) -> Vec<OptionError> {
            let mut errors = Vec::new();
            for (name, v) in [
                ("separator", &self.separator),
                ("delimiter", &self.delimiter),
            ] {
                if v.len() != 1 || v == "\"" || v == "\\" {
                    errors.push(OptionError::at(
                        &[name],
                        format!("must be one ASCII character other than `\"` and `\\`, got {v:?}"),
                    ));
                }
            }
            if self.separator == self.delimiter {
                errors.push(OptionError::at(
                    &["delimiter"],
                    "must differ from `separator`",
                ));
            }
            errors
        }
    }

    impl KvOptions {
        fn syntax(&self) -> Syntax {
            Syntax {
                separator: self.separator.as_bytes()[0],
                delimiter: self.delimiter.as_bytes()[0],
                types: self.types,
            }
        }
    }

    pub struct KvParser;

    impl TypedPlugin for KvParser {
        type Options = KvOptions;
        const NAME: &'static str = "kv";
        const KIND: StageKind = StageKind::Parser;

        type Stage = Box<dyn Processor>;
        const DESCRIPTION: &'static str =
            "Parses key=value pairs (logfmt: quoted values, escapes, flags) into fields.";
        fn flow(&self, _o: &KvOptions) -> logbus_plugin_api::Flow {
            logbus_plugin_api::Flow::open_fields(&[]).needs(logbus_plugin_api::Needs::Raw)
        }
        fn build(
            &self,
            options: KvOptions,
            _cx: &BuildContext,
        ) -> Result<Self::Stage, OptionError> {
            let syntax = options.syntax();
            Ok(Box::new(
                move |e: &mut Event| -> Result<Verdict, EventError> {
                    let fields = decode(crate::raw_input(e, "kv")?, &syntax)
                        .map_err(|err| EventError::new(format!("not key=value: {err}")))?;
                    *e.payload_mut() = Payload::Fields(fields);
                    Ok(Verdict::Keep)
                },
            ))
        }
    }

    pub struct KvFormatter;

    impl TypedPlugin for KvFormatter {
        type Options = KvOptions;
        const NAME: &'static str = "kv";
        const KIND: StageKind = StageKind::Formatter;

        type Stage = Box<dyn Processor>;
        const DESCRIPTION: &'static str =
            "Writes fields as one line of key=value pairs (logfmt), quoting where needed.";
        fn flow(&self, _o: &KvOptions) -> logbus_plugin_api::Flow {
            logbus_plugin_api::Flow::raw().needs(logbus_plugin_api::Needs::Fields)
        }
        fn build(
            &self,
            options: KvOptions,
            _cx: &BuildContext,
        ) -> Result<Self::Stage, OptionError> {
            let syntax = options.syntax();
            let mut buffer = LineBuffer::new();
            Ok(Box::new(
                move |e: &mut Event| -> Result<Verdict, EventError> {
                    let line = buffer.line(|out| {
                        encode(crate::fields_input(e, "kv")?, &syntax, out);
                        Ok::<_, EventError>(())
                    })?;
                    *e.payload_mut() = Payload::Raw(line);
                    Ok(Verdict::Keep)
                },
            ))
        }
    }
}

#[cfg(any(feature = "parser-kv", feature = "formatter-kv"))]
pub use plugins::{KvFormatter, KvOptions, KvParser};

#[cfg(test)]
mod tests {
    use super::*;

    /// The quoting as first written, a char at a time: the byte scan must
    /// write exactly what it wrote.
    fn quoted_a_char_at_a_time(s: &str) -> Vec<u8> {
        let mut out = vec![b'"'];
        for c in s.chars() {
            match c {
                '"' => out.extend_from_slice(b"\\\""),
                '\\' => out.extend_from_slice(b"\\\\"),
                '\n' => out.extend_from_slice(b"\\n"),
                '\r' => out.extend_from_slice(b"\\r"),
                '\t' => out.extend_from_slice(b"\\t"),
                c if (c as u32) < 0x20 || c == '\u{7f}' => {
                    out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes())
                }
                c => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        out.push(b'"');
        out
    }

    #[test]
    fn quoting_escapes_every_ascii_control_and_keeps_utf8() {
        let every_ascii: String = (0u8..0x80).map(char::from).collect();
        for s in [
            "",
            "plain",
            "a \"quoted\" word\\",
            "tab\there\r\nnext",
            "\u{1}\u{1f}\u{7f}",
            "é 日本 🎉 \u{80}\u{ff}",
            every_ascii.as_str(),
            &format!("{}\"{}\n{}", "a".repeat(31), "b".repeat(32), "c".repeat(70)),
            &format!("{}\u{7f}", "é".repeat(40)),
        ] {
            let mut out = b"k=".to_vec();
            write_quoted(s, &mut out);
            assert_eq!(
                String::from_utf8(out[2..].to_vec()).unwrap(),
                String::from_utf8(quoted_a_char_at_a_time(s)).unwrap(),
                "{s:?}"
            );
        }
        // Escapes at every offset around the 32-byte strides.
        let alphabet = ['a', ' ', '"', '\\', '\n', '\u{1}', '\u{7f}', 'é', '🎉'];
        let mut seed = 0x2545_f491_u64;
        for len in 0..200 {
            let s: String = (0..len)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    // Mostly plain text, as a message is: strides both clean
                    // and holding escapes.
                    match (seed >> 33) % 256 {
                        k if (k as usize) < alphabet.len() => alphabet[k as usize],
                        _ => 'x',
                    }
                })
                .collect();
            let mut out = Vec::new();
            write_quoted(&s, &mut out);
            assert_eq!(out, quoted_a_char_at_a_time(&s), "{s:?}");
        }
    }

    /// Only whole strides count, and only up to the first that holds an
    /// escape.
    #[test]
    fn clean_strides_stop_at_the_first_stride_with_an_escape() {
        let text = "x".repeat(100);
        assert_eq!(clean_strides(text.as_bytes()), 96);
        assert_eq!(clean_strides(&text.as_bytes()[..31]), 0);
        for (at, strides) in [(0, 0), (31, 0), (32, 1), (63, 1), (64, 2), (96, 3)] {
            let mut dirty = "x".repeat(100).into_bytes();
            dirty[at.min(99)] = b'"';
            assert_eq!(clean_strides(&dirty), strides * STRIDE, "escape at {at}");
        }
        for b in [0x00, 0x1f, b'\\', 0x7f] {
            let mut dirty = "x".repeat(40).into_bytes();
            dirty[5] = b;
            assert_eq!(clean_strides(&dirty), 0, "{b:#x}");
        }
        assert_eq!(clean_strides("é".repeat(20).as_bytes()), 32);
    }

    /// Under `types: auto` a string that would read back as another type is
    /// quoted, and only such a string.
    #[test]
    fn only_text_that_reads_as_another_type_is_typed() {
        for s in [
            "",
            "true",
            "false",
            "12",
            "-3",
            "18446744073709551615",
            "1.5e3",
        ] {
            assert!(typed(s).is_some(), "{s}");
        }
        for s in ["hello", "inf", "NaN", "1.2.3", "e", "True"] {
            assert!(typed(s).is_none(), "{s}");
            assert_eq!(bare(s, Types::Auto), Value::String(s.into()));
        }
    }
}
