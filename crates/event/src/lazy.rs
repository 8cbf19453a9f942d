//! Parsed fields that are still their JSON text.
//!
//! Most events a pipeline parses from JSON are stamped, trimmed and written
//! out as JSON again; building an ordered map of every value only to
//! serialise it back costs more than everything else the reference pipeline
//! does (docs/benchmarks.md). A [`LazyFields`] keeps the line and where each
//! top-level entry lies in it, records top-level sets and deletes as edits
//! beside the text, and writes JSON by splicing the untouched entries'
//! bytes with the edits. Reading one field ([`LazyFields::get`]) parses
//! only its entry's text; a stage that needs the whole map gets the
//! ordinary [`Fields`], built once on first use (and an event that a stage
//! mutates through `fields_mut` becomes ordinary fields for good).
//!
//! **Invariant:** only text that is already exactly what the serialisers
//! (sonic-rs and serde_json, which agree on it) write for the value it
//! parses to is kept lazy: compact (no whitespace
//! outside strings), no duplicate keys at any level, only the escapes the
//! serialiser writes itself, numbers that print back as they read. So the
//! bytes spliced out are the bytes a parse and a serialise would have made,
//! and a lazy event and an eager one are indistinguishable downstream.
//! One exception keeps common lines lazy: a *top-level* number the
//! serialisers would rewrite (`12.340`, `1E2`) is parsed on the spot and
//! recorded as an edit, as if a stage had set it, when both serialisers
//! write the parsed value identically. Anything else is refused by
//! [`LazyFields::parse`] and parsed eagerly.

use std::sync::OnceLock;

use bytes::Bytes;
use serde_json::Value;

use crate::Fields;

/// Deepest nesting kept lazy; deeper text is left to the eager parser
/// (which enforces its own limit and names the error).
const MAX_DEPTH: usize = 128;
/// Keys per object whose uniqueness is checked; an object with more is
/// left to the eager parser.
const MAX_KEYS: usize = 256;

/// A JSON object kept as its text, with top-level edits on top.
#[derive(Clone)]
pub struct LazyFields {
    text: Bytes,
    entries: Vec<Entry>,
    /// The ordinary fields, built on the first deep read (boxed: most
    /// events never build them, and every in-flight event carries the slot).
    built: OnceLock<Box<Fields>>,
}

#[derive(Clone, Debug)]
struct Entry {
    key: Key,
    value: Slot,
}

#[derive(Clone, Debug)]
enum Key {
    /// The key's JSON string in the text, quotes included.
    Text(u32, u32),
    /// A key added by an edit.
    Owned(Box<str>),
}

#[derive(Clone, Debug)]
enum Slot {
    /// The value's JSON text.
    Text(u32, u32),
    /// A value set by an edit. Boxed: an ordered-map `Value` is 72 bytes
    /// inline, and every entry of every in-flight event would pay for it
    /// (issue 22's memory goal; a test holds an entry to 32 bytes).
    Set(Box<Value>),
    /// Deleted: skipped when written; a later set of the key appends.
    Gone,
}

impl LazyFields {
    /// `text` as lazy fields, if it is a JSON object in the form the
    /// serialiser writes (see the module's invariant); `None` for anything
    /// else, valid or not, which the caller parses eagerly.
    pub fn parse(text: Bytes) -> Option<LazyFields> {
        if text.len() >= u32::MAX as usize || std::str::from_utf8(&text).is_err() {
            return None;
        }
        let mut entries = Vec::with_capacity(16);
        let mut scan = Scan { b: &text, i: 0 };
        scan.object(0, Some(&mut entries))?;
        if scan.i != text.len() {
            return None;
        }
        Some(LazyFields {
            text,
            entries,
            built: OnceLock::new(),
        })
    }

    /// The ordinary fields (built on the first call, then kept).
    pub fn fields(&self) -> &Fields {
        self.built.get_or_init(|| Box::new(self.build()))
    }

    /// The ordinary fields, owned.
    pub fn into_fields(mut self) -> Fields {
        self.built
            .take()
            .map_or_else(|| self.build(), |fields| *fields)
    }

    /// Whether the ordinary fields were built (a stage read them).
    pub fn is_built(&self) -> bool {
        self.built.get().is_some()
    }

    /// Sets top-level `key` to `value`: in place if the key is there, else
    /// appended (as an ordered map does).
    pub fn set(&mut self, key: &str, value: Value) {
        self.built = OnceLock::new();
        match self.position(key) {
            Some(i) => self.entries[i].value = Slot::Set(Box::new(value)),
            None => self.entries.push(Entry {
                key: Key::Owned(key.into()),
                value: Slot::Set(Box::new(value)),
            }),
        }
    }

    /// Deletes top-level `key`; whether it was there.
    pub fn delete(&mut self, key: &str) -> bool {
        match self.position(key) {
            Some(i) => {
                self.built = OnceLock::new();
                self.entries[i].value = Slot::Gone;
                true
            }
            None => false,
        }
    }

    /// Whether top-level `key` is there.
    pub fn contains(&self, key: &str) -> bool {
        self.position(key).is_some()
    }

    /// Top-level `key`'s value, parsed from its text alone (or read from
    /// the built fields when a stage built them).
    pub fn get(&self, key: &str) -> Option<Value> {
        if let Some(fields) = self.built.get() {
            return fields.get(key).cloned();
        }
        Some(match &self.entries[self.position(key)?].value {
            Slot::Text(a, b) => self.parse_text(*a, *b),
            Slot::Set(v) => (**v).clone(),
            Slot::Gone => unreachable!("position skips deleted entries"),
        })
    }

    /// The top-level keys, in order.
    pub fn keys(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter(|e| !matches!(e.value, Slot::Gone))
            .map(|e| self.key_of(&e.key))
            .collect()
    }

    fn key_of(&self, key: &Key) -> String {
        match key {
            Key::Owned(k) => k.to_string(),
            Key::Text(a, b) => match self.parse_text(*a, *b) {
                Value::String(s) => s,
                other => other.to_string(),
            },
        }
    }

    /// Writes the object as compact JSON: the untouched entries' text
    /// spliced with the edits.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        let mut first = true;
        for entry in &self.entries {
            let value = match &entry.value {
                Slot::Gone => continue,
                value => value,
            };
            if !first {
                out.push(b',');
            }
            first = false;
            match &entry.key {
                Key::Text(a, b) => out.extend_from_slice(&self.text[*a as usize..*b as usize]),
                Key::Owned(k) => write_string(out, k),
            }
            out.push(b':');
            match value {
                Slot::Text(a, b) => out.extend_from_slice(&self.text[*a as usize..*b as usize]),
                Slot::Set(v) => write_value(out, v),
                Slot::Gone => unreachable!("skipped above"),
            }
        }
        out.push(b'}');
    }

    /// The index of the live entry named `key`.
    fn position(&self, key: &str) -> Option<usize> {
        let escaped = needs_escape(key).then(|| {
            let mut s = Vec::with_capacity(key.len() + 8);
            write_string(&mut s, key);
            s
        });
        self.entries.iter().position(|e| {
            !matches!(e.value, Slot::Gone)
                && match &e.key {
                    Key::Owned(k) => **k == *key,
                    Key::Text(a, b) => {
                        let quoted = &self.text[*a as usize..*b as usize];
                        match &escaped {
                            Some(s) => quoted == s.as_slice(),
                            None => &quoted[1..quoted.len() - 1] == key.as_bytes(),
                        }
                    }
                }
        })
    }

    fn build(&self) -> Fields {
        let mut fields = Fields::with_capacity(self.entries.len());
        for entry in &self.entries {
            let value = match &entry.value {
                Slot::Gone => continue,
                Slot::Set(v) => (**v).clone(),
                Slot::Text(a, b) => self.parse_text(*a, *b),
            };
            fields.insert(self.key_of(&entry.key), value);
        }
        fields
    }

    /// The value of a span that [`Self::parse`] recognised. It parses by
    /// construction (a property test holds the recogniser to that); were
    /// it ever not to, the text is kept as a string rather than lost.
    fn parse_text(&self, a: u32, b: u32) -> Value {
        let span = &self.text[a as usize..b as usize];
        sonic_rs::from_slice::<Value>(span).unwrap_or_else(|e| {
            debug_assert!(false, "recognised JSON failed to parse: {e}");
            Value::String(String::from_utf8_lossy(span).into_owned())
        })
    }
}

impl std::fmt::Debug for LazyFields {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut json = Vec::new();
        self.write_json(&mut json);
        f.debug_tuple("LazyFields")
            .field(&String::from_utf8_lossy(&json))
            .finish()
    }
}

impl PartialEq for LazyFields {
    fn eq(&self, other: &Self) -> bool {
        self.fields() == other.fields()
    }
}

/// Whether the serialiser escapes something in `s`.
fn needs_escape(s: &str) -> bool {
    s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\')
}

/// Whether a decimal without exponent (`int` the text from its first
/// integer digit on, `fraction` the digits after the point) is written
/// back as it reads by both serialisers: at most 15 significant digits
/// (so it is the shortest text of the double it parses to), no trailing
/// zero, and a magnitude both write without an exponent (at least
/// 0.0001, below 10^15). A property test holds this to the serialisers.
fn plain_decimal_round_trips(int: &[u8], fraction: &[u8]) -> bool {
    let integer_digits = int.iter().take_while(|b| b.is_ascii_digit()).count();
    if fraction.last() == Some(&b'0') {
        return false;
    }
    if int[0] == b'0' {
        let zeros = fraction.iter().take_while(|&&b| b == b'0').count();
        zeros <= 3 && fraction.len() - zeros <= 15
    } else {
        integer_digits + fraction.len() <= 15
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    sonic_rs::to_writer(&mut *out, s).expect("a string serialises into a Vec");
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    sonic_rs::to_writer(&mut *out, v).expect("a JSON value serialises into a Vec");
}

/// The recogniser: a strict JSON scanner that accepts only the text the
/// serialiser writes, so that `None` means "parse this eagerly", never
/// "invalid".
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl Scan<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// An object at `self.i`; at the top level its entries are recorded.
    fn object(&mut self, depth: usize, mut top: Option<&mut Vec<Entry>>) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        // Key spans of a nested object, for the duplicate check.
        let mut keys: Vec<(u32, u32)> = Vec::new();
        loop {
            let ka = self.i;
            self.string()?;
            let kb = self.i;
            let key = &self.b[ka..kb];
            let duplicate = match top.as_deref() {
                Some(entries) => entries.iter().any(|e| match e.key {
                    Key::Text(a, b) => &self.b[a as usize..b as usize] == key,
                    Key::Owned(_) => false,
                }),
                None => keys
                    .iter()
                    .any(|&(a, b)| &self.b[a as usize..b as usize] == key),
            };
            if duplicate {
                return None;
            }
            self.eat(b':')?;
            let va = self.i;
            // A top-level number the serialisers would write differently
            // is kept as the value it parses to (see the module's docs).
            let rewritten = match (&top, self.peek()?) {
                (Some(_), b'-' | b'0'..=b'9') => self.number()?,
                _ => self.value(depth + 1).map(|()| None)?,
            };
            let vb = self.i;
            match top.as_deref_mut() {
                Some(entries) => {
                    if entries.len() == MAX_KEYS {
                        return None;
                    }
                    entries.push(Entry {
                        key: Key::Text(ka as u32, kb as u32),
                        value: match rewritten {
                            Some(value) => Slot::Set(Box::new(value)),
                            None => Slot::Text(va as u32, vb as u32),
                        },
                    });
                }
                None => {
                    if keys.len() == MAX_KEYS {
                        return None;
                    }
                    keys.push((ka as u32, kb as u32));
                }
            }
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.eat(b'[')?;
        if self.eat(b']').is_some() {
            return Some(());
        }
        loop {
            self.value(depth + 1)?;
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string(),
            b'{' => self.object(depth, None),
            b'[' => self.array(depth),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            // Nested, a number the serialisers would rewrite is refused.
            b'-' | b'0'..=b'9' => match self.number()? {
                None => Some(()),
                Some(_) => None,
            },
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.b[self.i..]
            .starts_with(word)
            .then(|| self.i += word.len())
    }

    /// A string with only the escapes the serialiser writes. (The text is
    /// valid UTF-8 as a whole, checked before.)
    fn string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        loop {
            let rest = &self.b[self.i..];
            let at = memchr::memchr2(b'"', b'\\', rest)?;
            // A control character must be escaped; `fold` rather than `any`
            // so the check vectorises.
            if rest[..at].iter().fold(false, |c, &b| c | (b < 0x20)) {
                return None;
            }
            self.i += at + 1;
            if rest[at] == b'"' {
                return Some(());
            }
            // The serialiser writes these short escapes and no others
            // (a property test checks the list against it).
            match self.peek()? {
                b'"' | b'\\' | b'n' | b'r' | b't' | b'b' | b'f' => self.i += 1,
                _ => return None,
            }
        }
    }

    /// A number: `Some(None)` if it prints back as it reads (a plain
    /// integer short enough for `i64`, a plain decimal short enough to
    /// round-trip, or anything else both serialisers write identically);
    /// `Some(Some(value))` if both serialisers write `value`, what it
    /// parses to, identically but differently from the text (`1.50`,
    /// `1E2`); `None` if it is not a number or the serialisers disagree.
    fn number(&mut self) -> Option<Option<Value>> {
        let b = self.b;
        let start = self.i;
        self.eat(b'-');
        let digits = self.i;
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => {
                while matches!(self.peek(), Some(b'0'..=b'9')) {
                    self.i += 1;
                }
            }
            _ => return None,
        }
        let integer_digits = self.i - digits;
        let mut fraction = None;
        if self.eat(b'.').is_some() {
            let from = self.i;
            self.digits()?;
            fraction = Some(&b[from..self.i]);
        }
        let mut exponent = false;
        if matches!(self.peek(), Some(b'e' | b'E')) {
            exponent = true;
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            self.digits()?;
        }
        let text = &b[start..self.i];
        match (fraction, exponent) {
            (None, false) if integer_digits <= 18 && text != b"-0" => return Some(None),
            (Some(fraction), false) if plain_decimal_round_trips(&b[digits..], fraction) => {
                return Some(None);
            }
            _ => {}
        }
        // Rare: ask both serialisers (sinks write with either) what they
        // would write.
        let value = sonic_rs::from_slice::<Value>(text).ok()?;
        let mut sonic = Vec::with_capacity(text.len() + 8);
        write_value(&mut sonic, &value);
        if sonic != serde_json::to_vec(&value).ok()? {
            return None;
        }
        Some((sonic != text).then_some(value))
    }

    fn digits(&mut self) -> Option<()> {
        let from = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        (self.i > from).then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every entry of every in-flight event pays for the largest slot, so
    /// a set value is boxed; an inline ordered-map `Value` (72 bytes) made
    /// an entry 88 bytes and a corpus event's 16 entries 1.4 KiB, more than
    /// its line (docs/benchmarks.md, "Peak RSS under a flood").
    #[test]
    fn an_entry_and_the_lazy_fields_stay_small() {
        assert!(size_of::<Entry>() <= 32, "{}", size_of::<Entry>());
        assert!(size_of::<LazyFields>() <= 72, "{}", size_of::<LazyFields>());
    }

    /// What the eager path makes of `text`: sonic-rs parses it into fields
    /// and writes them back.
    fn eager(text: &str) -> Option<(Fields, String)> {
        let fields: Fields = sonic_rs::from_str(text).ok()?;
        let out = sonic_rs::to_string(&fields).ok()?;
        Some((fields, out))
    }

    fn lazy(text: &str) -> Option<LazyFields> {
        LazyFields::parse(Bytes::copy_from_slice(text.as_bytes()))
    }

    fn written(l: &LazyFields) -> String {
        let mut out = Vec::new();
        l.write_json(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn compact_canonical_objects_are_kept_lazy_and_written_back_verbatim() {
        for text in [
            r#"{}"#,
            r#"{"a":1}"#,
            r#"{"a":-12,"b":"x\"y\\z\n\t\r","c":[1,{"d":null},true,false,[]],"e":{}}"#,
            r#"{"f":1.5,"g":0.1,"h":-0.25,"big":123456789012345678}"#,
            r#"{"ü":"ß € 😀","k":"\b\f"}"#,
        ] {
            let l = lazy(text).unwrap_or_else(|| panic!("{text} should be kept lazy"));
            let (fields, out) = eager(text).unwrap();
            assert_eq!(written(&l), text);
            assert_eq!(out, text, "the eager path writes it back identically");
            assert_eq!(l.fields(), &fields);
        }
    }

    #[test]
    fn text_the_serialiser_would_rewrite_is_left_to_the_eager_parser() {
        for text in [
            r#"{ "a":1}"#,
            r#"{"a": 1}"#,
            r#"{"a":1} "#,
            r#"{"a":1,"a":2}"#,
            r#"{"o":{"k":1,"k":2}}"#,
            r#"{"a":"\u0041"}"#,
            r#"{"a":"\/"}"#,
            r#"{"o":{"a":1E2}}"#,
            r#"{"a":[1.50]}"#,
            r#"{"o":{"a":-0}}"#,
            r#"{"a":[12345678901234567890123]}"#,
            r#"{"a":1e400}"#,
            r#"[1]"#,
            r#""s""#,
            r#"{"a":1"#,
            r#"{"a":tru}"#,
            r#"{"a":01}"#,
            "{\"a\":\"\u{1}\"}",
        ] {
            assert!(lazy(text).is_none(), "{text} must not be kept lazy");
        }
        assert!(LazyFields::parse(Bytes::from_static(b"{\"a\":\"\xff\"}")).is_none());
    }

    /// A top-level number the serialisers would rewrite stays lazy as an
    /// edit holding what it parses to, written as the eager path writes it.
    #[test]
    fn a_top_level_number_the_serialisers_rewrite_is_kept_as_an_edit() {
        for (text, out) in [
            (r#"{"a":1.50,"b":"x"}"#, r#"{"a":1.5,"b":"x"}"#),
            (r#"{"a":1E2}"#, r#"{"a":100.0}"#),
            (r#"{"a":12.340}"#, r#"{"a":12.34}"#),
            (r#"{"a":-0}"#, r#"{"a":0.0}"#),
            (r#"{"a":1e+2}"#, r#"{"a":100.0}"#),
            (r#"{"a":25E-1}"#, r#"{"a":2.5}"#),
        ] {
            let l = lazy(text).unwrap_or_else(|| panic!("{text} refused"));
            let (fields, eager_out) = eager(text).unwrap();
            assert_eq!(written(&l), out, "{text}");
            assert_eq!(eager_out, out, "{text}: the eager path agrees");
            assert_eq!(serde_json::to_string(&fields).unwrap(), out);
            assert_eq!(l.fields(), &fields);
        }
    }

    /// Plain decimals the fast path keeps as text are written back as they
    /// read; at its edges it defers to the serialisers.
    #[test]
    fn plain_decimals_at_the_fast_paths_edges() {
        let fast = |t: &str| {
            let (int, frac) = t.trim_start_matches('-').split_once('.').unwrap();
            let _ = int;
            plain_decimal_round_trips(t.trim_start_matches('-').as_bytes(), frac.as_bytes())
        };
        for t in [
            "0.0001",
            "-0.0001",
            "0.5",
            "12.34",
            "99999999999999.9",
            "0.000123456789012345",
            "123456789012345.0",
            "12345678.12",
        ] {
            if fast(t) {
                let v: Value = sonic_rs::from_str(t).unwrap();
                assert_eq!(sonic_rs::to_string(&v).unwrap(), t);
                assert_eq!(serde_json::to_string(&v).unwrap(), t);
            }
        }
        assert!(fast("0.0001") && fast("99999999999999.9") && fast("0.000123456789012345"));
        assert!(fast("12345678.12"));
        for t in [
            "0.00001",
            "1.10",
            "1234567890123456.1",
            "1.0",
            "0.1234567890123456",
            "1.123456789012345",
        ] {
            assert!(!fast(t), "{t} taken by the fast path");
        }
    }

    #[test]
    fn depth_beyond_the_limit_is_left_to_the_eager_parser() {
        let deep = |n: usize| format!("{{\"a\":{}1{}}}", "[".repeat(n), "]".repeat(n));
        assert!(lazy(&deep(MAX_DEPTH - 2)).is_some());
        assert!(lazy(&deep(MAX_DEPTH)).is_none());
    }

    #[test]
    fn edits_follow_ordered_map_semantics() {
        let text = r#"{"a":1,"b":"two","c":[3]}"#;
        let mut l = lazy(text).unwrap();
        let mut f = eager(text).unwrap().0;
        // Set in place, append, delete, and delete then set again (appends).
        l.set("b", json!({"x":"y\"z"}));
        f.insert("b".into(), json!({"x":"y\"z"}));
        l.set("new\"key", json!(1.25));
        f.insert("new\"key".into(), json!(1.25));
        assert!(l.delete("a"));
        f.shift_remove("a");
        assert!(!l.delete("a"), "already gone");
        assert!(!l.delete("missing"));
        l.set("a", json!(null));
        f.insert("a".into(), json!(null));
        l.set("new\"key", json!(2));
        f.insert("new\"key".into(), json!(2));
        assert!(l.contains("c") && l.contains("a") && !l.contains("zz"));
        // Reads of one key, and the key order, without building the map.
        assert_eq!(l.keys(), f.keys().cloned().collect::<Vec<_>>());
        for key in ["a", "b", "c", "new\"key", "zz"] {
            assert_eq!(l.get(key).as_ref(), f.get(key), "{key}");
        }
        assert!(!l.is_built());
        assert_eq!(written(&l), sonic_rs::to_string(&f).unwrap());
        assert_eq!(l.fields(), &f);
        assert_eq!(l.clone().into_fields(), f);
    }

    #[test]
    fn a_key_with_escapes_is_found_by_its_decoded_name() {
        let mut l = lazy(r#"{"a\"b":1,"c\\d":2}"#).unwrap();
        assert!(l.delete("a\"b"));
        l.set("c\\d", json!(3));
        assert_eq!(written(&l), r#"{"c\\d":3}"#);
        assert_eq!(l.fields(), &eager(r#"{"c\\d":3}"#).unwrap().0);
    }

    #[test]
    fn raw_control_characters_in_a_string_are_refused_however_many() {
        for n in 1..=3 {
            let text = format!("{{\"a\":\"x{}y\"}}", "\u{1}".repeat(n));
            assert!(lazy(&text).is_none(), "{n} raw control characters");
        }
        assert!(
            lazy("{\"a\":\"x\\u0001y\"}").is_none(),
            "escaped: left to the eager parser"
        );
    }

    #[test]
    fn a_key_with_a_control_character_is_found_and_lazy_fields_compare_by_content() {
        let mut l = lazy(r#"{"a\nb":1,"c d":2}"#).unwrap();
        assert!(l.contains("a\nb"));
        assert!(l.contains("c d"));
        assert!(!l.contains("a b"));
        assert!(l.delete("a\nb"));
        assert_eq!(written(&l), r#"{"c d":2}"#);
        // Equal by content, whatever the text or the edits behind it.
        assert_eq!(l, lazy(r#"{"c d":2}"#).unwrap());
        assert_ne!(l, lazy(r#"{"c d":3}"#).unwrap());
        assert_eq!(format!("{l:?}"), r#"LazyFields("{\"c d\":2}")"#);
    }

    #[test]
    fn an_edit_after_a_read_is_seen_by_the_next_read() {
        let mut l = lazy(r#"{"a":1}"#).unwrap();
        assert_eq!(l.fields()["a"], json!(1));
        assert!(l.is_built());
        l.set("a", json!(2));
        assert!(!l.is_built());
        assert_eq!(l.fields()["a"], json!(2));
    }

    /// Every short escape the recogniser accepts is one the serialiser
    /// writes, and every control character it writes with `\u` is refused.
    #[test]
    fn the_accepted_escapes_are_the_serialisers_own() {
        for c in 0u8..0x80 {
            let s = (c as char).to_string();
            let written = sonic_rs::to_string(&s).unwrap();
            assert_eq!(written, serde_json::to_string(&s).unwrap(), "char {c}");
            let text = format!("{{\"k\":{written}}}");
            if written.contains("\\u") {
                assert!(lazy(&text).is_none(), "{written} accepted");
            } else {
                let l = lazy(&text).unwrap_or_else(|| panic!("{written} (char {c}) refused"));
                assert_eq!(l.fields()["k"], json!(s));
            }
        }
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;

    /// JSON-ish text: mostly valid, often compact and canonical, sometimes
    /// with whitespace, escapes, odd numbers, duplicate keys or damage.
    fn value(depth: u32) -> BoxedStrategy<String> {
        let key = prop::sample::select(vec!["a", "b", "k", "ü", "a\\\"b", "x\\u0041", "a"])
            .prop_map(|k| format!("\"{k}\""));
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| f.to_string()),
            prop::sample::select(vec![
                "-0",
                "0.0",
                "1e5",
                "1E-7",
                "1.50",
                "2.5e300",
                "00",
                "1.",
                "-",
                "123456789012345678901",
            ])
            .prop_map(str::to_string),
            "[ -~]{0,8}".prop_map(|s| format!("\"{s}\"")),
            prop::sample::select(vec![
                "\"\\n\\t\\\\\"",
                "\"\\/\"",
                "\"\\u00e9\"",
                "\"\\b\\f\\r\"",
                "\"é😀\"",
                "\"\\x\"",
            ])
            .prop_map(str::to_string),
        ];
        if depth == 0 {
            return leaf.boxed();
        }
        let sep = prop::sample::select(vec![",", ",", ",", ", ", " ,"]);
        prop_oneof![
            3 => leaf,
            1 => prop::collection::vec((key, sep.clone(), value(depth - 1)), 0..5).prop_map(|kv| {
                let body: Vec<String> = kv.iter().map(|(k, _, v)| format!("{k}:{v}")).collect();
                format!("{{{}}}", body.join(kv.first().map_or(",", |(_, s, _)| s)))
            }),
            1 => prop::collection::vec(value(depth - 1), 0..4)
                .prop_map(|items| format!("[{}]", items.join(","))),
        ]
        .boxed()
    }

    fn object() -> impl Strategy<Value = String> {
        let key = prop::sample::select(vec!["a", "b", "msg", "lvl", "a\\\"q", "n\\\\m"])
            .prop_map(|k| format!("\"{k}\""));
        prop::collection::vec((key, value(3)), 0..8).prop_map(|kv| {
            let body: Vec<String> = kv.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            format!("{{{}}}", body.join(","))
        })
    }

    /// The properties below say something only if the generator makes
    /// both kinds of text often.
    #[test]
    fn the_generator_makes_lazy_and_eager_text() {
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = object();
        let accepted = (0..2000)
            .filter(|_| {
                let text = strategy.new_tree(&mut runner).unwrap().current();
                LazyFields::parse(Bytes::from(text)).is_some()
            })
            .count();
        assert!(
            (300..1700).contains(&accepted),
            "{accepted} of 2000 kept lazy"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Reading one key, or the keys, from the text answers what the
        /// built fields answer.
        #[test]
        fn one_key_read_from_the_text_is_the_built_fields_value(text in object()) {
            if let Some(l) = LazyFields::parse(Bytes::from(text.clone())) {
                let keys = l.keys();
                let fields = l.clone().into_fields();
                prop_assert_eq!(&keys, &fields.keys().cloned().collect::<Vec<_>>());
                for key in keys.iter().map(String::as_str).chain(["absent"]) {
                    let got = l.get(key);
                    prop_assert_eq!(got.as_ref(), fields.get(key), "{}", key);
                }
            }
        }

        /// The module's invariant: lazy fields write exactly what the
        /// eager path (parse, then serialise with either serialiser)
        /// writes, and build the same fields; text without a rewritten
        /// number is written back byte for byte.
        #[test]
        fn what_is_kept_lazy_writes_what_the_eager_path_writes(text in object()) {
            if let Some(l) = LazyFields::parse(Bytes::from(text.clone())) {
                let fields: Fields = sonic_rs::from_str(&text).expect("accepted text parses");
                let mut out = Vec::new();
                l.write_json(&mut out);
                let out = String::from_utf8(out).unwrap();
                prop_assert_eq!(sonic_rs::to_string(&fields).unwrap(), out.clone());
                prop_assert_eq!(serde_json::to_string(&fields).unwrap(), out.clone());
                prop_assert_eq!(l.fields(), &fields);
                if l.entries.iter().all(|e| matches!(e.value, Slot::Text(..))) {
                    prop_assert_eq!(out, text);
                }
            }
        }

        /// The plain-decimal fast path claims only text both serialisers
        /// write back as it reads.
        #[test]
        fn the_plain_decimal_fast_path_agrees_with_the_serialisers(
            negative in any::<bool>(),
            int in prop_oneof!["0", "[1-9][0-9]{0,3}", "[1-9][0-9]{9,15}"],
            zeros in 0usize..6,
            frac in "[0-9]{0,13}[1-9]",
        ) {
            let fraction = format!("{}{}", "0".repeat(zeros), frac);
            let text = format!("{}{int}.{fraction}", if negative { "-" } else { "" });
            let digits = text.trim_start_matches('-');
            if plain_decimal_round_trips(digits.as_bytes(), fraction.as_bytes()) {
                let v: Value = sonic_rs::from_str(&text).unwrap();
                prop_assert_eq!(sonic_rs::to_string(&v).unwrap(), text.clone());
                prop_assert_eq!(serde_json::to_string(&v).unwrap(), text);
            }
        }

        /// Edits on lazy fields end where the same edits on an ordered map
        /// end, in what they hold and in what they write.
        #[test]
        fn edits_match_the_ordered_map(
            text in object(),
            edits in prop::collection::vec(
                (prop::sample::select(vec!["a", "b", "msg", "new", "a\"q"]), prop::option::of(any::<i32>())),
                0..8,
            ),
        ) {
            if let Some(mut l) = LazyFields::parse(Bytes::from(text.clone())) {
                let mut f: Fields = sonic_rs::from_str(&text).unwrap();
                for (key, value) in edits {
                    match value {
                        Some(v) => {
                            l.set(key, Value::from(v));
                            f.insert(key.to_string(), Value::from(v));
                        }
                        None => {
                            prop_assert_eq!(l.delete(key), f.shift_remove(key).is_some());
                        }
                    }
                }
                let mut out = Vec::new();
                l.write_json(&mut out);
                prop_assert_eq!(String::from_utf8(out).unwrap(), sonic_rs::to_string(&f).unwrap());
                prop_assert_eq!(l.fields(), &f);
            }
        }
    }
}
