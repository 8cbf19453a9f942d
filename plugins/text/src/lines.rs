//! `parser: lines`: one event per line. Line-framing sources (stdin, file)
//! already emit lines, so for them this only strips a trailing `\r`; an
//! event carrying several lines (a request body, a command's output) is
//! split into one event per line, sharing the original buffer.

use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, EventError, Flow, Needs, OptionError, Payload, Processor,
    StageKind, TypedPlugin, Verdict,
};
use serde::Deserialize;

/// Options of `parser: lines`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LinesOptions {
    /// Discard empty lines (counted as discarded).
    #[serde(default = "yes")]
    pub skip_empty: bool,
    /// Reject lines that are not valid UTF-8 (an error for `on_error`).
    #[serde(default)]
    pub require_utf8: bool,
}

fn yes() -> bool {
    true
}

impl CheckOptions for LinesOptions {}

pub struct LinesParser;

impl TypedPlugin for LinesParser {
    type Options = LinesOptions;
    const NAME: &'static str = "lines";
    const KIND: StageKind = StageKind::Parser;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str = "Splits raw events into one event per line and strips `\\r`; empty lines are dropped unless skip_empty is false.";

    fn build(&self, options: LinesOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(Lines(options)))
    }

    fn flow(&self, _options: &LinesOptions) -> Flow {
        Flow::raw().needs(Needs::Raw)
    }
}

struct Lines(LinesOptions);

fn trim_cr(mut line: logbus_plugin_api::Bytes) -> logbus_plugin_api::Bytes {
    if line.last() == Some(&b'\r') {
        line.truncate(line.len() - 1);
    }
    line
}

impl Processor for Lines {
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        let Payload::Raw(bytes) = event.payload() else {
            return Err(EventError::new(
                "the lines parser needs a raw event; this one is already parsed",
            ));
        };
        if self.0.require_utf8 && std::str::from_utf8(bytes).is_err() {
            return Err(EventError::new("line is not valid UTF-8"));
        }
        if memchr::memchr(b'\n', bytes).is_none() {
            if bytes.last() == Some(&b'\r') {
                let trimmed = trim_cr(bytes.clone());
                *event.payload_mut() = Payload::Raw(trimmed);
            }
            let empty = event.raw_len() == 0;
            return Ok(if empty && self.0.skip_empty {
                Verdict::Discard
            } else {
                Verdict::Keep
            });
        }
        let bytes = bytes.clone();
        let meta = event.meta().clone();
        let mut lines = Vec::new();
        let mut start = 0;
        for end in memchr::memchr_iter(b'\n', &bytes).chain(std::iter::once(bytes.len())) {
            let line = trim_cr(bytes.slice(start..end));
            start = end + 1;
            if line.is_empty() && (self.0.skip_empty || end == bytes.len()) {
                continue;
            }
            lines.push(Event::raw(line, meta.clone()));
        }
        Ok(Verdict::Replace(lines))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::Meta;

    fn raw(s: &str) -> Event {
        raw_bytes(s.as_bytes().to_vec())
    }

    fn raw_bytes(bytes: Vec<u8>) -> Event {
        Event::raw(bytes, Meta::at("t", 0))
    }

    fn texts(v: Verdict, original: &Event) -> Vec<String> {
        match v {
            Verdict::Keep => vec![String::from_utf8_lossy(original.as_raw().unwrap()).into()],
            Verdict::Discard | Verdict::To(_) => vec![],
            Verdict::Replace(es) => es
                .iter()
                .map(|e| String::from_utf8_lossy(e.as_raw().unwrap()).into())
                .collect(),
        }
    }

    #[test]
    fn splits_and_strips() {
        let mut p = Lines(LinesOptions {
            skip_empty: true,
            require_utf8: false,
        });
        let mut e = raw("a\r\n\nb\nc");
        let v = p.process(&mut e).unwrap();
        assert_eq!(texts(v, &e), ["a", "b", "c"]);
        let mut e = raw("single\r");
        let v = p.process(&mut e).unwrap();
        assert_eq!(texts(v, &e), ["single"]);
        let mut e = raw("");
        assert!(matches!(p.process(&mut e).unwrap(), Verdict::Discard));
    }

    #[test]
    fn keeps_empty_lines_when_asked() {
        let mut p = Lines(LinesOptions {
            skip_empty: false,
            require_utf8: false,
        });
        let mut e = raw("a\n\nb\n");
        let v = p.process(&mut e).unwrap();
        assert_eq!(texts(v, &e), ["a", "", "b"]);
    }

    #[test]
    fn utf8_check_and_parsed_input_are_errors() {
        let mut p = Lines(LinesOptions {
            skip_empty: true,
            require_utf8: true,
        });
        let mut e = raw_bytes(vec![0xff, 0xfe]);
        assert!(p.process(&mut e).is_err());
        let mut e = Event::fields(Default::default(), Meta::at("t", 0));
        assert!(p.process(&mut e).is_err());
    }

    #[test]
    fn options_default_to_skipping_empty_lines_of_any_bytes() {
        let o: LinesOptions = serde_json::from_value(serde_json::json!({})).unwrap();
        assert!(o.skip_empty);
        assert!(!o.require_utf8);
    }

    #[test]
    fn bytes_that_are_not_utf8_pass_unless_utf8_is_required() {
        let mut p = Lines(LinesOptions {
            skip_empty: true,
            require_utf8: false,
        });
        let mut e = raw_bytes(vec![0xff, 0xfe]);
        assert!(matches!(p.process(&mut e).unwrap(), Verdict::Keep));
        assert_eq!(e.as_raw().unwrap()[..], [0xff, 0xfe]);
    }
}
