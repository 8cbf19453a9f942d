//! ClickHouse column types, as `DESCRIBE TABLE` writes them, and how an
//! event's JSON value becomes RowBinary for each. The table's columns are
//! known only at start (from the server), so rows are encoded here rather
//! than through the `clickhouse` crate's compile-time `Row` types.
//!
//! A value that does not fit its column (text in an integer column, a
//! number out of range, an unknown enum name) is that event's error,
//! naming the column: it goes to `<id>.dead` instead of failing the
//! batch. A field that is missing (or null) in a column that is not
//! `Nullable` gets the type's zero value (`0`, `""`, the epoch), as
//! ClickHouse does for omitted columns.

use chrono::{DateTime, NaiveDate, Utc};
use serde_json::Value;

/// A column type LogBus can write.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnType {
    String,
    FixedString(usize),
    UInt(u8),
    Int(u8),
    Float32,
    Float64,
    Bool,
    Date,
    Date32,
    DateTime,
    /// Ticks of 10^-precision seconds.
    DateTime64(u32),
    Uuid,
    Ipv4,
    Ipv6,
    /// `Enum8` (1 byte) or `Enum16` (2 bytes), by name.
    Enum(u8, Vec<(String, i16)>),
    Nullable(Box<ColumnType>),
    Array(Box<ColumnType>),
    Map(Box<ColumnType>, Box<ColumnType>),
}

/// Splits `a, b(c, d), 'e,f'` at its top-level commas.
fn split_args(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut quoted, mut start) = (0i32, false, 0);
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quoted => i += 1,
            b'\'' => quoted = !quoted,
            b'(' if !quoted => depth += 1,
            b')' if !quoted => depth -= 1,
            b',' if !quoted && depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(s[start..].trim());
    out
}

impl ColumnType {
    /// Parses a type as ClickHouse writes it; an unsupported type is an
    /// error naming it.
    pub fn parse(text: &str) -> Result<ColumnType, String> {
        let text = text.trim();
        let (name, args) = match text.find('(') {
            Some(open) if text.ends_with(')') => {
                (&text[..open], Some(&text[open + 1..text.len() - 1]))
            }
            _ => (text, None),
        };
        let one = |args: Option<&str>| -> Result<ColumnType, String> {
            ColumnType::parse(args.ok_or_else(|| format!("`{text}` needs a type argument"))?)
        };
        Ok(match (name, args) {
            ("String", None) => ColumnType::String,
            ("FixedString", Some(n)) => ColumnType::FixedString(
                n.trim()
                    .parse()
                    .map_err(|_| format!("`{text}`: not a length"))?,
            ),
            ("UInt8", None) => ColumnType::UInt(1),
            ("UInt16", None) => ColumnType::UInt(2),
            ("UInt32", None) => ColumnType::UInt(4),
            ("UInt64", None) => ColumnType::UInt(8),
            ("Int8", None) => ColumnType::Int(1),
            ("Int16", None) => ColumnType::Int(2),
            ("Int32", None) => ColumnType::Int(4),
            ("Int64", None) => ColumnType::Int(8),
            ("Float32", None) => ColumnType::Float32,
            ("Float64", None) => ColumnType::Float64,
            ("Bool", None) => ColumnType::Bool,
            ("Date", None) => ColumnType::Date,
            ("Date32", None) => ColumnType::Date32,
            // A time zone changes how the server shows it, not what is stored.
            ("DateTime", _) => ColumnType::DateTime,
            ("DateTime64", Some(args)) => {
                let precision = split_args(args)[0];
                let p: u32 = precision
                    .parse()
                    .ok()
                    .filter(|p| *p <= 9)
                    .ok_or_else(|| format!("`{text}`: the precision must be 0 to 9"))?;
                ColumnType::DateTime64(p)
            }
            ("UUID", None) => ColumnType::Uuid,
            ("IPv4", None) => ColumnType::Ipv4,
            ("IPv6", None) => ColumnType::Ipv6,
            ("Enum8" | "Enum16", Some(args)) => {
                let mut values = Vec::new();
                for item in split_args(args) {
                    let (label, number) = item
                        .rsplit_once('=')
                        .ok_or_else(|| format!("`{text}`: `{item}` is not 'name' = value"))?;
                    let label = label.trim();
                    let label = label
                        .strip_prefix('\'')
                        .and_then(|l| l.strip_suffix('\''))
                        .ok_or_else(|| format!("`{text}`: `{label}` is not quoted"))?
                        .replace("\\'", "'");
                    let number: i16 = number
                        .trim()
                        .parse()
                        .map_err(|_| format!("`{text}`: `{number}` is not a number"))?;
                    values.push((label, number));
                }
                ColumnType::Enum(if name == "Enum8" { 1 } else { 2 }, values)
            }
            // The dictionary encoding is the server's business: on the
            // wire (RowBinary) the value is written as the inner type.
            ("LowCardinality", inner) => one(inner)?,
            ("Nullable", inner) => ColumnType::Nullable(Box::new(one(inner)?)),
            ("Array", inner) => ColumnType::Array(Box::new(one(inner)?)),
            ("Map", Some(args)) => match split_args(args).as_slice() {
                [k, v] => ColumnType::Map(
                    Box::new(ColumnType::parse(k)?),
                    Box::new(ColumnType::parse(v)?),
                ),
                _ => return Err(format!("`{text}`: a map has a key and a value type")),
            },
            _ => {
                return Err(format!(
                    "type `{text}` is not supported (String, FixedString, LowCardinality, [U]Int8-64, Float32/64, Bool, Date, Date32, DateTime, DateTime64, UUID, IPv4, IPv6, Enum8/16, Nullable, Array, Map)"
                ));
            }
        })
    }

    /// Appends `value` (absent: `None`) as RowBinary.
    pub fn encode(&self, value: Option<&Value>, out: &mut Vec<u8>) -> Result<(), String> {
        let value = value.filter(|v| !v.is_null());
        if let ColumnType::Nullable(inner) = self {
            return match value {
                None => {
                    out.push(1);
                    Ok(())
                }
                Some(v) => {
                    out.push(0);
                    inner.encode(Some(v), out)
                }
            };
        }
        let Some(value) = value else {
            return self.encode_zero(out);
        };
        match self {
            ColumnType::String => {
                let text = as_text(value);
                write_varint(text.len() as u64, out);
                out.extend_from_slice(text.as_bytes());
            }
            ColumnType::FixedString(n) => {
                let text = as_text(value);
                if text.len() > *n {
                    return Err(format!("{} bytes do not fit FixedString({n})", text.len()));
                }
                out.extend_from_slice(text.as_bytes());
                out.resize(out.len() + n - text.len(), 0);
            }
            ColumnType::UInt(width) => {
                let n = as_u64(value)?;
                if *width < 8 && n >> (8 * *width as u32) != 0 {
                    return Err(format!("{n} does not fit UInt{}", 8 * *width as u32));
                }
                out.extend_from_slice(&n.to_le_bytes()[..*width as usize]);
            }
            ColumnType::Int(width) => {
                let n = as_i64(value)?;
                let bits = 8 * *width as u32;
                if bits < 64 && (n < -(1i64 << (bits - 1)) || n >= 1i64 << (bits - 1)) {
                    return Err(format!("{n} does not fit Int{bits}"));
                }
                out.extend_from_slice(&n.to_le_bytes()[..*width as usize]);
            }
            ColumnType::Float32 => out.extend_from_slice(&(as_f64(value)? as f32).to_le_bytes()),
            ColumnType::Float64 => out.extend_from_slice(&as_f64(value)?.to_le_bytes()),
            ColumnType::Bool => out.push(match value {
                Value::Bool(b) => *b as u8,
                Value::String(s) if s == "true" => 1,
                Value::String(s) if s == "false" => 0,
                Value::Number(n) if n.as_u64() == Some(0) => 0,
                Value::Number(n) if n.as_u64() == Some(1) => 1,
                other => return Err(format!("{other} is not a boolean")),
            }),
            ColumnType::Date => {
                let days = as_days(value)?;
                let days =
                    u16::try_from(days).map_err(|_| format!("{value} is out of Date's range"))?;
                out.extend_from_slice(&days.to_le_bytes());
            }
            ColumnType::Date32 => {
                let days = i32::try_from(as_days(value)?)
                    .map_err(|_| format!("{value} is out of Date32's range"))?;
                out.extend_from_slice(&days.to_le_bytes());
            }
            ColumnType::DateTime => {
                let t = as_time(value)?;
                let s = u32::try_from(t.timestamp())
                    .map_err(|_| format!("{value} is out of DateTime's range"))?;
                out.extend_from_slice(&s.to_le_bytes());
            }
            ColumnType::DateTime64(p) => {
                let t = as_time(value)?;
                let ticks = t
                    .timestamp()
                    .checked_mul(10i64.pow(*p))
                    .and_then(|s| {
                        s.checked_add(t.timestamp_subsec_nanos() as i64 / 10i64.pow(9 - p))
                    })
                    .ok_or_else(|| format!("{value} is out of DateTime64's range"))?;
                out.extend_from_slice(&ticks.to_le_bytes());
            }
            ColumnType::Uuid => {
                let text = value
                    .as_str()
                    .ok_or_else(|| format!("{value} is not a UUID"))?;
                let hex: String = text.chars().filter(|c| *c != '-').collect();
                let n = (hex.len() == 32)
                    .then(|| u128::from_str_radix(&hex, 16).ok())
                    .flatten()
                    .ok_or_else(|| format!("`{text}` is not a UUID"))?;
                // Two little-endian halves, the high one first.
                out.extend_from_slice(&((n >> 64) as u64).to_le_bytes());
                out.extend_from_slice(&(n as u64).to_le_bytes());
            }
            ColumnType::Ipv4 => {
                let text = value.as_str().unwrap_or_default();
                let ip: std::net::Ipv4Addr = text
                    .parse()
                    .map_err(|_| format!("{value} is not an IPv4 address"))?;
                out.extend_from_slice(&u32::from(ip).to_le_bytes());
            }
            ColumnType::Ipv6 => {
                let text = value.as_str().unwrap_or_default();
                let ip: std::net::IpAddr = text
                    .parse()
                    .map_err(|_| format!("{value} is not an IP address"))?;
                let v6 = match ip {
                    std::net::IpAddr::V6(v6) => v6,
                    std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                };
                out.extend_from_slice(&v6.octets());
            }
            ColumnType::Enum(width, values) => {
                let number = match value {
                    Value::String(s) => values
                        .iter()
                        .find(|(label, _)| label == s)
                        .map(|(_, n)| *n)
                        .ok_or_else(|| {
                            let names: Vec<&str> = values.iter().map(|(l, _)| l.as_str()).collect();
                            format!(
                                "`{s}` is not one of the enum's names ({})",
                                names.join(", ")
                            )
                        })?,
                    other => {
                        let n = as_i64(other)?;
                        values
                            .iter()
                            .find(|(_, v)| *v as i64 == n)
                            .map(|(_, v)| *v)
                            .ok_or_else(|| format!("{n} is not one of the enum's values"))?
                    }
                };
                out.extend_from_slice(&number.to_le_bytes()[..*width as usize]);
            }
            ColumnType::Array(inner) => {
                let Value::Array(items) = value else {
                    return Err(format!("{} is not an array", short(value)));
                };
                write_varint(items.len() as u64, out);
                for item in items {
                    inner.encode(Some(item), out)?;
                }
            }
            ColumnType::Map(key, inner) => {
                let Value::Object(entries) = value else {
                    return Err(format!("{} is not an object", short(value)));
                };
                write_varint(entries.len() as u64, out);
                for (k, v) in entries {
                    key.encode(Some(&Value::String(k.clone())), out)?;
                    inner.encode(Some(v), out)?;
                }
            }
            ColumnType::Nullable(_) => unreachable!("handled above"),
        }
        Ok(())
    }

    /// The value of an omitted column: zeros, empty text, no elements.
    fn encode_zero(&self, out: &mut Vec<u8>) -> Result<(), String> {
        let zeros = match self {
            ColumnType::String | ColumnType::Array(_) | ColumnType::Map(..) => 1,
            ColumnType::FixedString(n) => *n,
            ColumnType::UInt(w) | ColumnType::Int(w) => *w as usize,
            ColumnType::Float32 | ColumnType::Ipv4 => 4,
            ColumnType::Float64 | ColumnType::DateTime64(_) => 8,
            ColumnType::Bool => 1,
            ColumnType::Date => 2,
            ColumnType::Date32 | ColumnType::DateTime => 4,
            ColumnType::Uuid | ColumnType::Ipv6 => 16,
            ColumnType::Enum(width, values) => {
                // An enum has no zero unless one of its values is 0.
                let Some((_, first)) = values.iter().find(|(_, v)| *v == 0).or(values.first())
                else {
                    return Err("an enum without values".into());
                };
                out.extend_from_slice(&first.to_le_bytes()[..*width as usize]);
                return Ok(());
            }
            ColumnType::Nullable(_) => 1,
        };
        out.resize(out.len() + zeros, 0);
        Ok(())
    }
}

fn write_varint(mut n: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A value's text: a string as it is, anything else as JSON.
fn as_text(value: &Value) -> std::borrow::Cow<'_, str> {
    match value {
        Value::String(s) => s.as_str().into(),
        other => other.to_string().into(),
    }
}

/// A value for messages, cut short.
fn short(value: &Value) -> String {
    let mut text = value.to_string();
    if text.len() > 64 {
        let mut cut = 61;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

fn as_u64(value: &Value) -> Result<u64, String> {
    match value {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 1.8e19)
                .map(|f| f as u64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        Value::Bool(b) => Some(*b as u64),
        _ => None,
    }
    .ok_or_else(|| format!("{} is not an unsigned integer", short(value)))
}

fn as_i64(value: &Value) -> Result<i64, String> {
    match value {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18)
                .map(|f| f as i64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        Value::Bool(b) => Some(*b as i64),
        _ => None,
    }
    .ok_or_else(|| format!("{} is not an integer", short(value)))
}

fn as_f64(value: &Value) -> Result<f64, String> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("{} is not a number", short(value)))
}

/// RFC 3339 text, or a number of epoch seconds (milliseconds from 10^11,
/// nanoseconds from 10^16).
fn as_time(value: &Value) -> Result<DateTime<Utc>, String> {
    let t = match value {
        Value::String(s) => DateTime::parse_from_rfc3339(s)
            .map(|t| t.to_utc())
            .or_else(|_| {
                chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f")
                    .map(|t| t.and_utc())
            })
            .ok(),
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.abs() < 1e11 {
                DateTime::from_timestamp_millis((f * 1000.0) as i64)
            } else if f.abs() < 1e16 {
                DateTime::from_timestamp_millis(f as i64)
            } else {
                n.as_i64().map(DateTime::from_timestamp_nanos)
            }
        }
        _ => None,
    };
    t.ok_or_else(|| format!("{} is not a time (RFC 3339 or epoch seconds)", short(value)))
}

/// Days since 1970-01-01 of a date (`2026-05-01`) or a time.
fn as_days(value: &Value) -> Result<i64, String> {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("a date");
    if let Value::String(s) = value
        && let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d")
    {
        return Ok((d - epoch).num_days());
    }
    Ok((as_time(value)?.date_naive() - epoch).num_days())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bytes(t: &str, v: Value) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        ColumnType::parse(t)?.encode(Some(&v), &mut out)?;
        Ok(out)
    }

    #[test]
    fn types_parse_as_describe_writes_them() {
        assert_eq!(
            ColumnType::parse("Map(LowCardinality(String), Array(Nullable(Int32)))").unwrap(),
            ColumnType::Map(
                Box::new(ColumnType::String),
                Box::new(ColumnType::Array(Box::new(ColumnType::Nullable(Box::new(
                    ColumnType::Int(4)
                )))))
            )
        );
        assert_eq!(
            ColumnType::parse("DateTime64(3, 'Europe/Paris')").unwrap(),
            ColumnType::DateTime64(3)
        );
        assert_eq!(
            ColumnType::parse("Enum8('a,b' = 1, 'it\\'s' = -2)").unwrap(),
            ColumnType::Enum(1, vec![("a,b".into(), 1), ("it's".into(), -2)])
        );
        let err = ColumnType::parse("Decimal(10, 2)").unwrap_err();
        assert!(err.contains("`Decimal(10, 2)` is not supported"), "{err}");
    }

    #[test]
    fn values_become_rowbinary() {
        assert_eq!(bytes("String", json!("hé")).unwrap(), b"\x03h\xc3\xa9");
        assert_eq!(bytes("String", json!(12)).unwrap(), b"\x0212");
        assert_eq!(bytes("FixedString(3)", json!("a")).unwrap(), b"a\0\0");
        assert_eq!(bytes("UInt16", json!(258)).unwrap(), [2, 1]);
        assert_eq!(bytes("UInt16", json!("258")).unwrap(), [2, 1]);
        assert_eq!(bytes("Int8", json!(-1)).unwrap(), [0xff]);
        assert_eq!(bytes("UInt64", json!(u64::MAX)).unwrap(), [0xff; 8]);
        assert_eq!(bytes("Float64", json!(1.5)).unwrap(), 1.5f64.to_le_bytes());
        assert_eq!(bytes("Bool", json!(true)).unwrap(), [1]);
        assert_eq!(bytes("Date", json!("1970-01-03")).unwrap(), [2, 0]);
        assert_eq!(
            bytes("DateTime", json!("1970-01-01T00:01:00Z")).unwrap(),
            60u32.to_le_bytes()
        );
        assert_eq!(
            bytes("DateTime64(3)", json!("1970-01-01T00:00:01.234Z")).unwrap(),
            1234i64.to_le_bytes()
        );
        assert_eq!(
            bytes("DateTime64(3)", json!(1_700_000_000_123u64)).unwrap(),
            1_700_000_000_123i64.to_le_bytes()
        );
        assert_eq!(bytes("Nullable(UInt8)", Value::Null).unwrap(), [1]);
        assert_eq!(bytes("Nullable(UInt8)", json!(7)).unwrap(), [0, 7]);
        assert_eq!(bytes("Array(UInt8)", json!([1, 2])).unwrap(), [2, 1, 2]);
        assert_eq!(
            bytes("Map(String, UInt8)", json!({"k": 5})).unwrap(),
            [1, 1, b'k', 5]
        );
        assert_eq!(
            bytes("IPv4", json!("1.2.3.4")).unwrap(),
            0x01020304u32.to_le_bytes()
        );
        assert_eq!(bytes("Enum8('a' = 1, 'b' = 2)", json!("b")).unwrap(), [2]);
        let mut u = bytes("UUID", json!("00112233-4455-6677-8899-aabbccddeeff")).unwrap();
        let low = u.split_off(8);
        assert_eq!(u, 0x0011223344556677u64.to_le_bytes());
        assert_eq!(low, 0x8899aabbccddeeffu64.to_le_bytes());
        // 300-byte strings need a two-byte length.
        assert_eq!(
            &bytes("String", json!("x".repeat(300))).unwrap()[..2],
            [0xac, 0x02]
        );
    }

    #[test]
    fn values_that_do_not_fit_name_why() {
        for (t, v, why) in [
            ("UInt8", json!(256), "does not fit UInt8"),
            ("UInt8", json!(-1), "not an unsigned integer"),
            ("Int16", json!(40000), "does not fit Int16"),
            ("UInt32", json!("twelve"), "not an unsigned integer"),
            ("FixedString(2)", json!("abc"), "do not fit FixedString(2)"),
            ("DateTime", json!("yesterday"), "not a time"),
            (
                "Enum8('a' = 1)",
                json!("z"),
                "not one of the enum's names (a)",
            ),
            ("Array(UInt8)", json!(3), "not an array"),
            ("IPv4", json!("1.2.3"), "not an IPv4 address"),
            ("UUID", json!("nope"), "not a UUID"),
        ] {
            let err = bytes(t, v).unwrap_err();
            assert!(err.contains(why), "{t}: {err}");
        }
    }

    #[test]
    fn missing_values_are_zero_or_null() {
        let zero = |t: &str| {
            let mut out = Vec::new();
            ColumnType::parse(t)
                .unwrap()
                .encode(None, &mut out)
                .unwrap();
            out
        };
        assert_eq!(zero("String"), [0]);
        assert_eq!(zero("UInt32"), [0; 4]);
        assert_eq!(zero("DateTime64(3)"), [0; 8]);
        assert_eq!(zero("Nullable(String)"), [1]);
        assert_eq!(zero("Enum8('x' = 5, 'y' = 0)"), [0]);
        assert_eq!(zero("Enum8('x' = 5)"), [5]);
    }

    #[test]
    fn every_supported_type_parses_and_others_say_why_not() {
        use ColumnType as T;
        for (text, want) in [
            ("String", T::String),
            (" String ", T::String),
            ("FixedString(16)", T::FixedString(16)),
            ("UInt8", T::UInt(1)),
            ("UInt16", T::UInt(2)),
            ("UInt32", T::UInt(4)),
            ("UInt64", T::UInt(8)),
            ("Int8", T::Int(1)),
            ("Int16", T::Int(2)),
            ("Int32", T::Int(4)),
            ("Int64", T::Int(8)),
            ("Float32", T::Float32),
            ("Float64", T::Float64),
            ("Bool", T::Bool),
            ("Date", T::Date),
            ("Date32", T::Date32),
            ("DateTime", T::DateTime),
            ("DateTime('UTC')", T::DateTime),
            ("DateTime64(9)", T::DateTime64(9)),
            ("DateTime64(0)", T::DateTime64(0)),
            ("UUID", T::Uuid),
            ("IPv4", T::Ipv4),
            ("IPv6", T::Ipv6),
            ("Enum16('a' = 1000)", T::Enum(2, vec![("a".into(), 1000)])),
            (
                "LowCardinality(Nullable(String))",
                T::Nullable(Box::new(T::String)),
            ),
            (
                "Map(String, Map(String, Array(Enum8('x(' = 1, 'y,' = 2))))",
                T::Map(
                    Box::new(T::String),
                    Box::new(T::Map(
                        Box::new(T::String),
                        Box::new(T::Array(Box::new(T::Enum(
                            1,
                            vec![("x(".into(), 1), ("y,".into(), 2)],
                        )))),
                    )),
                ),
            ),
        ] {
            assert_eq!(ColumnType::parse(text), Ok(want), "{text}");
        }
        for (text, err) in [
            ("FixedString(n)", "`FixedString(n)`: not a length"),
            (
                "DateTime64(10)",
                "`DateTime64(10)`: the precision must be 0 to 9",
            ),
            (
                "DateTime64(x)",
                "`DateTime64(x)`: the precision must be 0 to 9",
            ),
            ("Enum8('a')", "`Enum8('a')`: `'a'` is not 'name' = value"),
            ("Enum8(a = 1)", "`Enum8(a = 1)`: `a` is not quoted"),
            ("Enum8('a = 1)", "`Enum8('a = 1)`: `'a` is not quoted"),
            ("Enum8('a' = x)", "`Enum8('a' = x)`: ` x` is not a number"),
            ("Nullable", "`Nullable` needs a type argument"),
            ("Array", "`Array` needs a type argument"),
            (
                "Map(String)",
                "`Map(String)`: a map has a key and a value type",
            ),
            (
                "Map(String, Int8, Int8)",
                "`Map(String, Int8, Int8)`: a map has a key and a value type",
            ),
            ("UInt8(3)", "type `UInt8(3)` is not supported"),
            ("String(", "type `String(` is not supported"),
            (
                "Array(Decimal(9, 2))",
                "type `Decimal(9, 2)` is not supported",
            ),
        ] {
            let e = ColumnType::parse(text).unwrap_err();
            assert!(e.starts_with(err), "{text}: {e}");
        }
        assert_eq!(
            split_args(r"'a\'b,c' = 1, f(x, y), z"),
            ["'a\\'b,c' = 1", "f(x, y)", "z"]
        );
        assert_eq!(split_args(""), [""]);
        // A quote hides parentheses and commas; a backslash escapes only
        // inside quotes.
        assert_eq!(split_args("'a)', b"), ["'a)'", "b"]);
        assert_eq!(split_args(r"x\,y"), ["x\\", "y"]);
    }

    #[test]
    fn integers_fit_their_width_to_the_edge() {
        for (t, lo, hi) in [
            ("Int8", -128i64, 127i64),
            ("Int16", -32_768, 32_767),
            ("Int32", i64::from(i32::MIN), i64::from(i32::MAX)),
        ] {
            let width = bytes(t, json!(lo)).unwrap().len();
            assert_eq!(
                bytes(t, json!(lo)).unwrap(),
                lo.to_le_bytes()[..width],
                "{t}"
            );
            assert_eq!(
                bytes(t, json!(hi)).unwrap(),
                hi.to_le_bytes()[..width],
                "{t}"
            );
            assert_eq!(
                bytes(t, json!(lo - 1)).unwrap_err(),
                format!("{} does not fit {t}", lo - 1)
            );
            assert_eq!(
                bytes(t, json!(hi + 1)).unwrap_err(),
                format!("{} does not fit {t}", hi + 1)
            );
        }
        assert_eq!(
            bytes("Int64", json!(i64::MIN)).unwrap(),
            i64::MIN.to_le_bytes()
        );
        assert_eq!(
            bytes("Int64", json!(i64::MAX)).unwrap(),
            i64::MAX.to_le_bytes()
        );
        for (t, hi) in [
            ("UInt8", 255u64),
            ("UInt16", 65_535),
            ("UInt32", u64::from(u32::MAX)),
        ] {
            let width = bytes(t, json!(0)).unwrap().len();
            assert_eq!(
                bytes(t, json!(hi)).unwrap(),
                hi.to_le_bytes()[..width],
                "{t}"
            );
            assert_eq!(
                bytes(t, json!(hi + 1)).unwrap_err(),
                format!("{} does not fit {t}", hi + 1)
            );
        }
        // Whole floats, text and booleans are integers; fractions are not.
        assert_eq!(bytes("UInt8", json!(3.0)).unwrap(), [3]);
        assert_eq!(bytes("UInt8", json!(" 4 ")).unwrap(), [4]);
        assert_eq!(bytes("UInt8", json!(true)).unwrap(), [1]);
        assert_eq!(bytes("Int8", json!(-3.0)).unwrap(), [0xfd]);
        assert_eq!(bytes("Int8", json!("-5")).unwrap(), [0xfb]);
        assert_eq!(bytes("Int8", json!(false)).unwrap(), [0]);
        assert_eq!(
            bytes("UInt64", json!(1.8e19)).unwrap_err(),
            "1.8e+19 is not an unsigned integer"
        );
        assert_eq!(
            bytes("UInt64", json!(1.79e19)).unwrap(),
            (1.79e19 as u64).to_le_bytes()
        );
        assert_eq!(
            bytes("UInt8", json!(-0.5)).unwrap_err(),
            "-0.5 is not an unsigned integer"
        );
        assert_eq!(
            bytes("UInt8", json!(1.5)).unwrap_err(),
            "1.5 is not an unsigned integer"
        );
        assert_eq!(
            bytes("Int64", json!(9.1e18)).unwrap(),
            (9.1e18 as i64).to_le_bytes()
        );
        assert_eq!(
            bytes("Int64", json!(-9.1e18)).unwrap(),
            (-9.1e18 as i64).to_le_bytes()
        );
        assert_eq!(
            bytes("Int64", json!(9.3e18)).unwrap_err(),
            "9.3e+18 is not an integer"
        );
        assert_eq!(
            bytes("Int64", json!(9.2e18)).unwrap_err(),
            "9.2e+18 is not an integer"
        );
        assert_eq!(
            bytes("Int8", json!(0.5)).unwrap_err(),
            "0.5 is not an integer"
        );
        assert_eq!(
            bytes("Int8", json!([1])).unwrap_err(),
            "[1] is not an integer"
        );
        assert_eq!(
            bytes("UInt8", json!({})).unwrap_err(),
            "{} is not an unsigned integer"
        );
    }

    #[test]
    fn floats_booleans_and_text() {
        assert_eq!(bytes("Float32", json!(1.5)).unwrap(), 1.5f32.to_le_bytes());
        assert_eq!(
            bytes("Float32", json!("2.5")).unwrap(),
            2.5f32.to_le_bytes()
        );
        assert_eq!(
            bytes("Float64", json!(" -3 ")).unwrap(),
            (-3f64).to_le_bytes()
        );
        assert_eq!(
            bytes("Float64", json!(true)).unwrap_err(),
            "true is not a number"
        );
        for (v, b) in [
            (json!(false), 0),
            (json!("true"), 1),
            (json!("false"), 0),
            (json!(0), 0),
            (json!(1), 1),
        ] {
            assert_eq!(bytes("Bool", v.clone()).unwrap(), [b], "{v}");
        }
        for v in [json!(2), json!("yes"), json!(1.0)] {
            assert_eq!(
                bytes("Bool", v.clone()).unwrap_err(),
                format!("{v} is not a boolean")
            );
        }
        assert_eq!(
            bytes("String", json!({"a": [1]})).unwrap(),
            b"\x09{\"a\":[1]}"
        );
        assert_eq!(bytes("FixedString(2)", json!("ab")).unwrap(), b"ab");
        assert_eq!(
            bytes("FixedString(2)", json!("abc")).unwrap_err(),
            "3 bytes do not fit FixedString(2)"
        );
        // Lengths of 127 and 128 bytes: one varint byte, then two.
        assert_eq!(bytes("String", json!("x".repeat(127))).unwrap()[0], 127);
        assert_eq!(
            &bytes("String", json!("x".repeat(128))).unwrap()[..2],
            [0x80, 0x01]
        );
        assert_eq!(
            &bytes("String", json!("x".repeat(16_384))).unwrap()[..3],
            [0x80, 0x80, 0x01]
        );
    }

    #[test]
    fn times_and_dates() {
        let secs = |t: &str, v: Value| -> i64 {
            let b = bytes(t, v).unwrap();
            match b.len() {
                2 => i64::from(u16::from_le_bytes(b.try_into().unwrap())),
                4 if t == "Date32" => i64::from(i32::from_le_bytes(b.try_into().unwrap())),
                4 => i64::from(u32::from_le_bytes(b.try_into().unwrap())),
                _ => i64::from_le_bytes(b.try_into().unwrap()),
            }
        };
        // Seconds below 1e11, milliseconds below 1e16, nanoseconds above.
        assert_eq!(secs("DateTime64(3)", json!(1.5)), 1_500);
        assert_eq!(
            secs("DateTime64(3)", json!(99_999_999_999u64)),
            99_999_999_999_000
        );
        assert_eq!(
            secs("DateTime64(3)", json!(100_000_000_000u64)),
            100_000_000_000
        );
        assert_eq!(
            secs("DateTime64(3)", json!(9_999_999_999_999i64)),
            9_999_999_999_999
        );
        assert_eq!(
            bytes("DateTime64(3)", json!(9_999_999_999_999_000i64)).unwrap_err(),
            "9999999999999000 is not a time (RFC 3339 or epoch seconds)"
        );
        assert_eq!(
            secs("DateTime64(9)", json!(10_000_000_000_000_000u64)),
            10_000_000_000_000_000
        );
        assert_eq!(secs("DateTime64(3)", json!(-1.5)), -1_500);
        assert_eq!(
            secs("DateTime64(3)", json!(-100_000_000_000i64)),
            -100_000_000_000
        );
        assert_eq!(
            secs("DateTime64(6)", json!("1970-01-01T00:00:01.000002Z")),
            1_000_002
        );
        assert_eq!(secs("DateTime64(0)", json!("1970-01-01T00:00:01.9Z")), 1);
        assert_eq!(
            secs("DateTime64(9)", json!("1970-01-01 00:00:02.5")),
            2_500_000_000
        );
        assert_eq!(secs("DateTime", json!("1970-01-01T01:00:00+01:00")), 0);
        assert_eq!(secs("DateTime", json!(60)), 60);
        assert_eq!(
            bytes("DateTime", json!("1969-12-31T23:59:59Z")).unwrap_err(),
            "\"1969-12-31T23:59:59Z\" is out of DateTime's range"
        );
        assert_eq!(
            bytes("DateTime64(9)", json!("2300-01-01T00:00:00Z")).unwrap_err(),
            "\"2300-01-01T00:00:00Z\" is out of DateTime64's range"
        );
        assert_eq!(
            bytes("DateTime", json!(true)).unwrap_err(),
            "true is not a time (RFC 3339 or epoch seconds)"
        );
        assert_eq!(secs("Date", json!("1970-01-03")), 2);
        assert_eq!(secs("Date", json!("1970-01-02T23:00:00Z")), 1);
        assert_eq!(secs("Date", json!(86_400 * 3)), 3);
        assert_eq!(secs("Date", json!("2149-06-06")), 65_535);
        assert_eq!(
            bytes("Date", json!("2149-06-07")).unwrap_err(),
            "\"2149-06-07\" is out of Date's range"
        );
        assert_eq!(
            bytes("Date", json!("1969-12-31")).unwrap_err(),
            "\"1969-12-31\" is out of Date's range"
        );
        assert_eq!(secs("Date32", json!("1969-12-31")), -1);
        assert_eq!(secs("Date32", json!("2026-12-06")), 20_793);
        assert_eq!(
            bytes("Date", json!("soon")).unwrap_err(),
            "\"soon\" is not a time (RFC 3339 or epoch seconds)"
        );
    }

    #[test]
    fn addresses_ids_and_enums() {
        assert_eq!(
            bytes("IPv6", json!("::1")).unwrap(),
            std::net::Ipv6Addr::LOCALHOST.octets()
        );
        assert_eq!(
            bytes("IPv6", json!("1.2.3.4")).unwrap(),
            std::net::Ipv4Addr::new(1, 2, 3, 4)
                .to_ipv6_mapped()
                .octets()
        );
        assert_eq!(
            bytes("IPv6", json!("x")).unwrap_err(),
            "\"x\" is not an IP address"
        );
        assert_eq!(
            bytes("IPv6", json!(1)).unwrap_err(),
            "1 is not an IP address"
        );
        assert_eq!(
            bytes("IPv4", json!(1)).unwrap_err(),
            "1 is not an IPv4 address"
        );
        assert_eq!(bytes("UUID", json!(1)).unwrap_err(), "1 is not a UUID");
        assert_eq!(
            bytes("UUID", json!("00112233-4455-6677-8899-aabbccddeef")).unwrap_err(),
            "`00112233-4455-6677-8899-aabbccddeef` is not a UUID"
        );
        assert_eq!(
            bytes("UUID", json!("0011223344556677-8899aabbccddeexx")).unwrap_err(),
            "`0011223344556677-8899aabbccddeexx` is not a UUID"
        );
        let e16 = "Enum16('a' = -300, 'b' = 2)";
        assert_eq!(bytes(e16, json!("a")).unwrap(), (-300i16).to_le_bytes());
        assert_eq!(bytes(e16, json!(2)).unwrap(), 2i16.to_le_bytes());
        assert_eq!(bytes("Enum8('a' = -3)", json!(-3)).unwrap(), [0xfd]);
        assert_eq!(
            bytes(e16, json!(3)).unwrap_err(),
            "3 is not one of the enum's values"
        );
        assert_eq!(
            bytes(e16, json!("c")).unwrap_err(),
            "`c` is not one of the enum's names (a, b)"
        );
        assert_eq!(bytes(e16, json!([1])).unwrap_err(), "[1] is not an integer");
        assert_eq!(
            bytes("Map(String, UInt8)", json!([1])).unwrap_err(),
            "[1] is not an object"
        );
        assert_eq!(
            bytes("Map(UInt8, UInt8)", json!({"300": 1})).unwrap_err(),
            "300 does not fit UInt8"
        );
        assert_eq!(
            bytes("Array(Array(UInt8))", json!([[1], [2, 3]])).unwrap(),
            [2, 1, 1, 2, 2, 3]
        );
        assert_eq!(
            bytes("Array(UInt8)", json!([1, "x"])).unwrap_err(),
            "\"x\" is not an unsigned integer"
        );
        // A long value is cut short in the message, on a character boundary.
        let long = "é".repeat(40);
        let e = bytes("Array(UInt8)", json!(long)).unwrap_err();
        assert_eq!(e, format!("\"{}...", "é".repeat(30)) + " is not an array");
        // Byte 61 inside a character: cut before it.
        let e = bytes("Array(UInt8)", json!(format!("x{long}"))).unwrap_err();
        assert_eq!(e, format!("\"x{}...", "é".repeat(29)) + " is not an array");
        let e = bytes("Array(UInt8)", json!("x".repeat(62))).unwrap_err();
        assert_eq!(e, format!("\"{}\" is not an array", "x".repeat(62)));
        let e = bytes("Array(UInt8)", json!("x".repeat(63))).unwrap_err();
        assert_eq!(e, format!("\"{}... is not an array", "x".repeat(60)));
    }

    #[test]
    fn every_missing_value_has_its_types_zero() {
        let zero = |t: &str| {
            let mut out = vec![9];
            ColumnType::parse(t)
                .unwrap()
                .encode(None, &mut out)
                .map(|()| out)
        };
        for (t, n) in [
            ("String", 1),
            ("Array(UInt8)", 1),
            ("Map(String, String)", 1),
            ("FixedString(5)", 5),
            ("UInt8", 1),
            ("Int16", 2),
            ("Float32", 4),
            ("IPv4", 4),
            ("Float64", 8),
            ("DateTime64(3)", 8),
            ("Bool", 1),
            ("Date", 2),
            ("Date32", 4),
            ("DateTime", 4),
            ("UUID", 16),
            ("IPv6", 16),
        ] {
            let mut want = vec![9];
            want.resize(1 + n, 0);
            assert_eq!(zero(t), Ok(want), "{t}");
        }
        assert_eq!(zero("Enum16('x' = 300, 'y' = 0)"), Ok(vec![9, 0, 0]));
        assert_eq!(zero("Enum16('x' = 300)"), Ok(vec![9, 0x2c, 0x01]));
        // A null is absent too.
        let mut out = Vec::new();
        ColumnType::Int(2)
            .encode(Some(&Value::Null), &mut out)
            .unwrap();
        assert_eq!(out, [0, 0]);
        assert_eq!(
            ColumnType::Enum(1, vec![]).encode(None, &mut Vec::new()),
            Err("an enum without values".into())
        );
        let mut out = Vec::new();
        ColumnType::Nullable(Box::new(ColumnType::Nullable(Box::new(ColumnType::Bool))))
            .encode(Some(&json!(true)), &mut out)
            .unwrap();
        assert_eq!(out, [0, 0, 1]);
    }
}
