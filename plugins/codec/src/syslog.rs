//! Syslog messages: RFC 5424 and RFC 3164 ("BSD") in, RFC 5424 out.
//!
//! Decoded fields: `facility` and `severity` (numbers, from PRI), and for
//! RFC 5424 `version`, `timestamp` (as written), `hostname`, `appname`,
//! `procid`, `msgid`, `structured_data` (`{"id": {"param": "value"}}`) and
//! `message`; NILVALUE (`-`) fields are left out. For RFC 3164,
//! `timestamp` (`Mmm dd hh:mm:ss` as written), `hostname`, `appname` (the
//! tag), `procid` (from `tag[pid]:`) and `message`. Framing (a line, an
//! octet count) is the transport's business: the input is one message.
//!
//! Encoding writes RFC 5424 from the same fields, escaping `"`, `\` and `]`
//! in parameter values, so decoding an encoded event gives it back.

use logbus_plugin_api::Fields;
use serde_json::{Map, Value};

use crate::DecodeError;

/// Which RFC to expect.
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
pub enum Format {
    /// RFC 5424 when the version after PRI is `1`, RFC 3164 otherwise.
    #[default]
    Auto,
    Rfc5424,
    Rfc3164,
}

struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a str {
        &self.text[self.at..]
    }
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }
    fn expect(&mut self, b: u8, what: &str) -> Result<(), DecodeError> {
        if self.peek() == Some(b) {
            self.at += 1;
            Ok(())
        } else {
            Err(DecodeError::at(self.at, format!("expected {what}")))
        }
    }
    /// Up to the next space (not consumed); must be non-empty.
    fn token(&mut self, what: &str) -> Result<&'a str, DecodeError> {
        let start = self.at;
        let len = self.rest().find(' ').unwrap_or(self.rest().len());
        if len == 0 {
            return Err(DecodeError::at(start, format!("missing {what}")));
        }
        self.at += len;
        Ok(&self.text[start..start + len])
    }
}

pub fn decode(input: &[u8], format: Format) -> Result<Fields, DecodeError> {
    let text = std::str::from_utf8(input)
        .map_err(|e| DecodeError::at(e.valid_up_to(), "invalid UTF-8"))?;
    let mut c = Cursor { text, at: 0 };
    c.expect(b'<', "`<` starting the priority")?;
    let start = c.at;
    while c.peek().is_some_and(|b| b.is_ascii_digit()) && c.at - start < 3 {
        c.at += 1;
    }
    let pri: u32 = text[start..c.at]
        .parse()
        .map_err(|_| DecodeError::at(start, "a priority of 1 to 3 digits"))?;
    if pri > 191 {
        return Err(DecodeError::at(
            start,
            format!("priority {pri} is over 191"),
        ));
    }
    c.expect(b'>', "`>` ending the priority")?;
    let mut fields = Fields::new();
    fields.insert("facility".into(), Value::from(pri / 8));
    fields.insert("severity".into(), Value::from(pri % 8));
    let is_5424 = match format {
        Format::Rfc5424 => true,
        Format::Rfc3164 => false,
        Format::Auto => {
            let r = c.rest().as_bytes();
            r.first().is_some_and(|b| (b'1'..=b'9').contains(b))
                && r.iter().take_while(|b| b.is_ascii_digit()).count() <= 2
                && r.iter().find(|b| !b.is_ascii_digit()) == Some(&b' ')
        }
    };
    if is_5424 {
        decode_5424(&mut c, &mut fields)?;
    } else {
        decode_3164(&mut c, &mut fields);
    }
    Ok(fields)
}

fn decode_5424(c: &mut Cursor<'_>, fields: &mut Fields) -> Result<(), DecodeError> {
    let at = c.at;
    let version: u32 = c
        .token("the version")?
        .parse()
        .map_err(|_| DecodeError::at(at, "a numeric version"))?;
    fields.insert("version".into(), Value::from(version));
    for name in ["timestamp", "hostname", "appname", "procid", "msgid"] {
        c.expect(b' ', &format!("a space before {name}"))?;
        let value = c.token(name)?;
        if value != "-" {
            fields.insert(name.into(), Value::String(value.to_string()));
        }
    }
    c.expect(b' ', "a space before the structured data")?;
    if c.peek() == Some(b'-') {
        c.at += 1;
    } else {
        let sd = structured_data(c)?;
        fields.insert("structured_data".into(), Value::Object(sd));
    }
    match c.peek() {
        None => {}
        Some(b' ') => {
            c.at += 1;
            let message = c.rest().strip_prefix('\u{feff}').unwrap_or(c.rest());
            fields.insert("message".into(), Value::String(message.to_string()));
        }
        Some(_) => return Err(DecodeError::at(c.at, "expected a space before the message")),
    }
    Ok(())
}

fn structured_data(c: &mut Cursor<'_>) -> Result<Map<String, Value>, DecodeError> {
    let mut sd = Map::new();
    if c.peek() != Some(b'[') {
        return Err(DecodeError::at(
            c.at,
            "expected `-` or `[` for structured data",
        ));
    }
    while c.peek() == Some(b'[') {
        c.at += 1;
        let start = c.at;
        while c.peek().is_some_and(sd_name_byte) {
            c.at += 1;
        }
        if c.at == start {
            return Err(match c.peek() {
                Some(b' ' | b']') | None => DecodeError::at(start, "an SD-ELEMENT without an id"),
                Some(_) => DecodeError::at(start, "a character not allowed in an SD-ID"),
            });
        }
        match c.peek() {
            Some(b' ' | b']') => {}
            None => return Err(DecodeError::at(c.at, "expected `]` closing the SD-ELEMENT")),
            Some(_) => return Err(DecodeError::at(c.at, "a character not allowed in an SD-ID")),
        }
        let id = c.text[start..c.at].to_string();
        let mut params = Map::new();
        while c.peek() == Some(b' ') {
            c.at += 1;
            let name_start = c.at;
            while c.peek().is_some_and(sd_name_byte) {
                c.at += 1;
            }
            if c.at == name_start {
                return Err(DecodeError::at(name_start, "a parameter without a name"));
            }
            let name = c.text[name_start..c.at].to_string();
            c.expect(b'=', "`=` after a parameter name")?;
            c.expect(b'"', "`\"` opening a parameter value")?;
            let mut value = String::new();
            let mut chars = c.rest().char_indices();
            let mut closed = None;
            while let Some((k, ch)) = chars.next() {
                match ch {
                    '"' => {
                        closed = Some(k + 1);
                        break;
                    }
                    '\\' => match chars.next() {
                        Some((_, e @ ('"' | '\\' | ']'))) => value.push(e),
                        // RFC 5424: a backslash before anything else is kept.
                        Some((_, other)) => {
                            value.push('\\');
                            value.push(other);
                        }
                        None => break,
                    },
                    ch => value.push(ch),
                }
            }
            let Some(len) = closed else {
                return Err(DecodeError::at(
                    c.at,
                    "a parameter value that is never closed",
                ));
            };
            c.at += len;
            params.insert(name, Value::String(value));
        }
        c.expect(b']', "`]` closing the SD-ELEMENT")?;
        sd.insert(id, Value::Object(params));
    }
    Ok(sd)
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// RFC 3164 is a description of practice more than a grammar: take what
/// is recognisable and leave the rest in `message`.
fn decode_3164(c: &mut Cursor<'_>, fields: &mut Fields) {
    let rest = c.rest();
    let mut tail = rest;
    // "Mmm dd hh:mm:ss " (day space-padded).
    if rest.len() >= 16
        && rest.is_char_boundary(15)
        && rest.get(..3).is_some_and(|m| MONTHS.contains(&m))
        && rest.as_bytes()[15] == b' '
        && rest.as_bytes()[9] == b':'
        && rest.as_bytes()[12] == b':'
    {
        fields.insert("timestamp".into(), Value::String(rest[..15].to_string()));
        tail = &rest[16..];
        // A hostname follows the timestamp unless the next word is the tag.
        if let Some(space) = tail.find(' ') {
            let word = &tail[..space];
            if !word.ends_with(':') && !word.contains('[') {
                fields.insert("hostname".into(), Value::String(word.to_string()));
                tail = &tail[space + 1..];
            }
        }
    }
    // "tag[pid]: " or "tag: "
    let tag_end = tail.find(['[', ':', ' ']).unwrap_or(0);
    if tag_end > 0 && tag_end <= 48 {
        let tag = &tail[..tag_end];
        let after = &tail[tag_end..];
        if let Some(pid_rest) = after.strip_prefix('[')
            && let Some(close) = pid_rest.find(']')
            && pid_rest[close + 1..].starts_with(':')
        {
            fields.insert("appname".into(), Value::String(tag.to_string()));
            fields.insert(
                "procid".into(),
                Value::String(pid_rest[..close].to_string()),
            );
            tail = pid_rest[close + 2..]
                .strip_prefix(' ')
                .unwrap_or(&pid_rest[close + 2..]);
        } else if let Some(msg) = after.strip_prefix(':') {
            fields.insert("appname".into(), Value::String(tag.to_string()));
            tail = msg.strip_prefix(' ').unwrap_or(msg);
        }
    }
    fields.insert("message".into(), Value::String(tail.to_string()));
    c.at = c.text.len();
}

/// Writes RFC 5424. Missing header fields are NILVALUE; a missing
/// `timestamp` is `now` (UTC, microseconds) unless `stamp_missing` is off.
pub fn encode(fields: &Fields, now: Option<&str>, out: &mut Vec<u8>) {
    let num = |name: &str, default: u64| -> u64 {
        fields.get(name).and_then(Value::as_u64).unwrap_or(default)
    };
    let facility = num("facility", 1).min(23);
    let severity = num("severity", 5).min(7);
    let version = num("version", 1).clamp(1, 99);
    out.extend_from_slice(format!("<{}>{} ", facility * 8 + severity, version).as_bytes());
    let header = |name: &str, max: usize, out: &mut Vec<u8>| {
        let text = match fields.get(name) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        // Header fields are printable US-ASCII without spaces.
        let clean: String = text
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(max)
            .collect();
        if clean.is_empty() {
            out.push(b'-');
        } else {
            out.extend_from_slice(clean.as_bytes());
        }
    };
    match (fields.get("timestamp"), now) {
        (Some(_), _) | (None, None) => header("timestamp", 64, out),
        (None, Some(now)) => out.extend_from_slice(now.as_bytes()),
    }
    for (name, max) in [
        ("hostname", 255),
        ("appname", 48),
        ("procid", 128),
        ("msgid", 32),
    ] {
        out.push(b' ');
        header(name, max, out);
    }
    out.push(b' ');
    match fields.get("structured_data").and_then(Value::as_object) {
        Some(sd) if !sd.is_empty() => {
            for (id, params) in sd {
                out.push(b'[');
                write_sd_name(id, out);
                if let Some(params) = params.as_object() {
                    for (name, value) in params {
                        out.push(b' ');
                        write_sd_name(name, out);
                        out.extend_from_slice(b"=\"");
                        let text = match value {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        for ch in text.chars() {
                            if matches!(ch, '"' | '\\' | ']') {
                                out.push(b'\\');
                            }
                            let mut buf = [0; 4];
                            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                        }
                        out.push(b'"');
                    }
                }
                out.push(b']');
            }
        }
        _ => out.push(b'-'),
    }
    match fields.get("message") {
        Some(Value::String(m)) => {
            out.push(b' ');
            // A message that itself starts with U+FEFF keeps it: a reader
            // takes one leading BOM as the "this is UTF-8" mark (RFC 5424
            // §6.4), so write that mark first.
            if m.starts_with('\u{feff}') {
                out.extend_from_slice("\u{feff}".as_bytes());
            }
            out.extend_from_slice(m.as_bytes());
        }
        Some(Value::Null) | None => {}
        Some(other) => {
            out.push(b' ');
            out.extend_from_slice(other.to_string().as_bytes());
        }
    }
}

/// An SD-NAME with what it may not hold left out (`_` if nothing is left).
fn write_sd_name(name: &str, out: &mut Vec<u8>) {
    let before = out.len();
    out.extend(name.bytes().filter(|b| sd_name_byte(*b)).take(32));
    if out.len() == before {
        out.push(b'_');
    }
}

/// SD-NAME: printable US-ASCII except `=`, space, `]`, `"`.
fn sd_name_byte(b: u8) -> bool {
    b.is_ascii_graphic() && !matches!(b, b'=' | b']' | b'"')
}

#[cfg(any(feature = "parser-syslog", feature = "formatter-syslog"))]
mod plugins {
    #[allow(unused_imports)]
    use logbus_plugin_api::{
        BuildContext, Built, CheckOptions, Event, EventError, LineBuffer, NoOptions, OptionError,
        Payload, Processor, StageKind, TypedPlugin, Verdict,
    };
    use serde::Deserialize;

    use super::{Format, decode};

    /// Options of `parser: syslog`.
    #[derive(Debug, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct SyslogParserOptions {
        /// `auto` (by the version after PRI), `rfc5424` or `rfc3164`.
        #[serde(default)]
        pub format: Format,
    }

    impl CheckOptions for SyslogParserOptions {}

    pub struct SyslogParser;

    impl TypedPlugin for SyslogParser {
        type Options = SyslogParserOptions;
        const NAME: &'static str = "syslog";
        const KIND: StageKind = StageKind::Parser;

        type Stage = Box<dyn Processor>;
        const DESCRIPTION: &'static str = "Parses an RFC 5424 or RFC 3164 syslog message into fields (PRI, header, structured data, message).";
        fn flow(&self, _o: &SyslogParserOptions) -> logbus_plugin_api::Flow {
            use logbus_plugin_api::FieldType::{Number, Object, String};
            logbus_plugin_api::Flow::fields(&[
                ("facility", Number),
                ("severity", Number),
                ("version", Number),
                ("timestamp", String),
                ("hostname", String),
                ("appname", String),
                ("procid", String),
                ("msgid", String),
                ("structured_data", Object),
                ("message", String),
            ])
            .needs(logbus_plugin_api::Needs::Raw)
        }
        fn build(
            &self,
            options: SyslogParserOptions,
            _cx: &BuildContext,
        ) -> Result<Self::Stage, OptionError> {
            let format = options.format;
            Ok(Box::new(
                move |e: &mut Event| -> Result<Verdict, EventError> {
                    let fields = decode(crate::raw_input(e, "syslog")?, format)
                        .map_err(|err| EventError::new(format!("not syslog: {err}")))?;
                    *e.payload_mut() = Payload::Fields(fields);
                    Ok(Verdict::Keep)
                },
            ))
        }
    }

    #[cfg(feature = "formatter-syslog")]
    pub struct SyslogFormatter;

    #[cfg(feature = "formatter-syslog")]
    impl TypedPlugin for SyslogFormatter {
        type Options = NoOptions;
        const NAME: &'static str = "syslog";
        const KIND: StageKind = StageKind::Formatter;

        type Stage = Box<dyn Processor>;
        const DESCRIPTION: &'static str = "Writes fields as an RFC 5424 syslog message (missing header fields are `-`, a missing timestamp is now).";
        fn flow(&self, _o: &NoOptions) -> logbus_plugin_api::Flow {
            logbus_plugin_api::Flow::raw().needs(logbus_plugin_api::Needs::Fields)
        }
        fn build(&self, _o: NoOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
            let mut buffer = LineBuffer::new();
            Ok(Box::new(
                move |e: &mut Event| -> Result<Verdict, EventError> {
                    let now =
                        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
                    let line = buffer.line(|out| {
                        super::encode(crate::fields_input(e, "syslog")?, Some(&now), out);
                        Ok::<_, EventError>(())
                    })?;
                    *e.payload_mut() = Payload::Raw(line);
                    Ok(Verdict::Keep)
                },
            ))
        }
    }
}

#[cfg(feature = "formatter-syslog")]
pub use plugins::SyslogFormatter;
#[cfg(any(feature = "parser-syslog", feature = "formatter-syslog"))]
pub use plugins::{SyslogParser, SyslogParserOptions};
