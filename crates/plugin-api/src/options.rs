//! Options, as every plugin's are read: typed structs deserialized from
//! the stage's YAML with every unknown key named (and the closest known
//! one suggested), type errors said in config words ("a whole number")
//! at the option's path, declared ranges checked from the JSON Schema,
//! and then the plugin's own [`CheckOptions`]. One place, so the same
//! mistake gets the same message in every plugin.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;

/// An option is wrong. `path` leads from the stage to the offending option
/// (`["set", "level"]`); empty means the stage as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError {
    pub path: Vec<String>,
    pub message: String,
    /// Where inside the option's text the error is (a byte offset), for
    /// options that are a language of their own (a condition); validation
    /// adds it to the option's position in the file.
    pub offset: Option<usize>,
}

impl OptionError {
    pub fn at(path: &[&str], message: impl Into<String>) -> Self {
        OptionError {
            path: path.iter().map(|s| s.to_string()).collect(),
            message: message.into(),
            offset: None,
        }
    }

    /// An error `offset` bytes into the option's text.
    pub fn inside(path: &[&str], offset: usize, message: impl Into<String>) -> Self {
        OptionError {
            offset: Some(offset),
            ..OptionError::at(path, message)
        }
    }
}

/// Range and cross-field checks beyond what the types say.
pub trait CheckOptions {
    fn check(&self) -> Vec<OptionError> {
        Vec::new()
    }
}

/// The JSON Schema of an option struct, generated once per type: every
/// stage asks for it several times while a pipeline is validated (its
/// outputs, its flow, its host needs, its check), and generating it is
/// most of the cost of validating a stage.
pub(crate) fn options_schema<O: schemars::JsonSchema + 'static>() -> Arc<Value> {
    use std::any::TypeId;
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static SCHEMAS: OnceLock<Mutex<HashMap<TypeId, Arc<Value>>>> = OnceLock::new();
    let mut schemas = SCHEMAS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    schemas
        .entry(TypeId::of::<O>())
        .or_insert_with(|| Arc::new(schemars::schema_for!(O).to_value()))
        .clone()
}

/// Parsed and checked options: unknown keys, types and declared ranges
/// ([`parse_options`]) and then [`CheckOptions::check`], whose errors are
/// reported with the range errors (but not twice for one option).
pub(crate) fn checked_options<T: DeserializeOwned + CheckOptions>(
    options: &Value,
    schema: &Value,
) -> Result<T, Vec<OptionError>> {
    let (parsed, mut errors) = parse_all::<T>(options, schema);
    let Some(opts) = parsed else {
        return Err(errors);
    };
    let parsing = errors.len();
    for e in opts.check() {
        if !errors[..parsing]
            .iter()
            .any(|r| r.path.first() == e.path.first())
        {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(opts)
    } else {
        Err(errors)
    }
}

/// Deserializes options, reporting every unknown top-level key (with the
/// closest known one) and then the first type error, each with its path.
pub fn parse_options<T: DeserializeOwned>(
    options: &Value,
    schema: &Value,
) -> Result<T, Vec<OptionError>> {
    match parse_all(options, schema) {
        (Some(v), errors) if errors.is_empty() => Ok(v),
        (_, errors) => Err(errors),
    }
}

/// [`parse_options`]' work: the options when they deserialize (even if a
/// range is broken), and every error found.
pub(crate) fn parse_all<T: DeserializeOwned>(
    options: &Value,
    schema: &Value,
) -> (Option<T>, Vec<OptionError>) {
    let mut errors = Vec::new();
    let mut cleaned = options.clone();
    // Options without fields have an object schema with no `properties`.
    let no_fields = serde_json::Map::new();
    let known = schema
        .get("properties")
        .and_then(Value::as_object)
        .or_else(|| (schema.get("type") == Some(&Value::from("object"))).then_some(&no_fields));
    if let (Some(map), Some(known)) = (cleaned.as_object_mut(), known) {
        let unknown: Vec<String> = map
            .keys()
            .filter(|k| !known.contains_key(*k))
            .cloned()
            .collect();
        for key in unknown {
            map.shift_remove(&key);
            let names: Vec<&str> = known.keys().map(String::as_str).collect();
            let mut msg = format!("unknown option `{key}`");
            if let Some(best) = closest(&key, &names) {
                msg.push_str(&format!("; did you mean `{best}`?"));
            }
            if names.is_empty() {
                msg.push_str(" (this plugin takes no options)");
            } else {
                msg.push_str(&format!(" (options: {})", names.join(", ")));
            }
            errors.push(OptionError {
                path: vec![key],
                message: msg,
                offset: None,
            });
        }
    }
    errors.extend(range_errors(&cleaned, schema));
    // Every type error, not the first: after one, the option is replaced
    // by a value of its declared type (or removed) and the rest is read
    // again, once per option at most.
    let properties = schema.get("properties").and_then(Value::as_object);
    let mut failed: Vec<String> = Vec::new();
    loop {
        match serde_path_to_error::deserialize::<_, T>(&cleaned) {
            Ok(v) if failed.is_empty() => return (Some(v), errors),
            Ok(_) => return (None, errors),
            Err(e) => {
                let mut path = path_segments(e.path());
                let message = e.into_inner().to_string();
                if path.is_empty() {
                    // Inside a `#[serde(flatten)]` block serde forgets
                    // where it was: find the option by standing each in.
                    path.extend(flattened_culprit::<T>(&cleaned, properties, &message));
                }
                let top = path.first().cloned();
                // A required option removed after its own error: said.
                if failed
                    .iter()
                    .any(|f| message == format!("missing field `{f}`"))
                {
                    return (None, errors);
                }
                let property = top.as_deref().and_then(|k| properties?.get(k));
                let plain = match path.len() {
                    1 => plain_words(&message, property),
                    _ => plain_words(&message, None),
                };
                // Out of range and not of the type (-1 for a count): once.
                if !errors.iter().any(|r| r.path.first() == path.first()) {
                    errors.push(OptionError {
                        path,
                        message: plain,
                        offset: None,
                    });
                }
                let Some(key) = top else {
                    return (None, errors);
                };
                if failed.contains(&key) {
                    return (None, errors);
                }
                let stand_in = property.and_then(stand_in);
                match (cleaned.as_object_mut(), stand_in) {
                    (Some(map), Some(v)) => {
                        map.insert(key.clone(), v);
                    }
                    (Some(map), None) => {
                        map.shift_remove(&key);
                    }
                    (None, _) => return (None, errors),
                }
                failed.push(key);
            }
        }
    }
}

/// The top-level option whose value causes `message` when it sits in a
/// flattened block (shared options such as `Retrying`, `AwsOptions`):
/// the first whose stand-in makes that error go away.
fn flattened_culprit<T: DeserializeOwned>(
    options: &Value,
    properties: Option<&serde_json::Map<String, Value>>,
    message: &str,
) -> Option<String> {
    let about_a_value = [
        "invalid type",
        "invalid value",
        "invalid length",
        "unknown variant",
    ];
    if !about_a_value.iter().any(|p| message.starts_with(p)) {
        return None;
    }
    let map = options.as_object()?;
    map.keys()
        .find(|key| {
            let mut tried = options.clone();
            let Some(tried_map) = tried.as_object_mut() else {
                return false;
            };
            match properties.and_then(|p| p.get(*key)).and_then(stand_in) {
                Some(v) => {
                    tried_map.insert((*key).clone(), v);
                }
                None => {
                    tried_map.shift_remove(*key);
                }
            }
            match T::deserialize(&tried) {
                Ok(_) => true,
                Err(e) => {
                    let now = e.to_string();
                    now != message && !now.starts_with("missing field")
                }
            }
        })
        .cloned()
}

/// A value of an option's declared type that deserialises whatever the
/// range (to read the options after a type error): `""`, `0`, `false`,
/// `[]`, `{}`; `None` for types the schema does not give plainly.
/// The JSON Schema type of an option, an optional one's (`["integer",
/// "null"]`) included.
fn schema_type(property: &Value) -> Option<&str> {
    match property.get("type")? {
        Value::String(t) => Some(t.as_str()),
        Value::Array(types) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null"),
        _ => None,
    }
}

pub(crate) fn stand_in(property: &Value) -> Option<Value> {
    Some(match schema_type(property)? {
        "string" => Value::from(""),
        "integer" | "number" => property.get("minimum").cloned().unwrap_or(Value::from(0)),
        "boolean" => Value::from(false),
        "array" => Value::Array(Vec::new()),
        "object" => Value::Object(Default::default()),
        _ => return None,
    })
}

/// A serde type error in the words a user writes a config in: `expected a
/// whole number, got the string "x"` instead of `invalid type: string
/// "x", expected u64`. The option's schema, when given, names the type
/// more exactly than serde can (`a list of strings`).
pub fn plain_words(message: &str, property: Option<&Value>) -> String {
    let Some((unexpected, expected)) = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
        .and_then(|rest| rest.rsplit_once(", expected "))
    else {
        return message.to_string();
    };
    let expected = property
        .and_then(describe_schema)
        .unwrap_or_else(|| describe_expected(expected));
    format!(
        "expected {expected}, got {}",
        describe_unexpected(unexpected)
    )
}

/// What a schema fragment accepts, in words (`a list of strings`).
pub fn describe_schema(property: &Value) -> Option<String> {
    Some(match schema_type(property)? {
        "integer" => match property.get("minimum").and_then(Value::as_f64) {
            Some(m) if m >= 0.0 => "a whole number, 0 or more".to_string(),
            _ => "a whole number".to_string(),
        },
        "number" => "a number".to_string(),
        "string" => "a string".to_string(),
        "boolean" => "true or false".to_string(),
        "object" => "a map".to_string(),
        "array" => match property.get("items").and_then(describe_schema) {
            Some(item) => format!("a list of {}", plural(&item)),
            None => "a list".to_string(),
        },
        _ => return None,
    })
}

/// `a string` → `strings`, for `a list of ...`.
fn plural(item: &str) -> String {
    match item {
        "a string" => "strings".into(),
        "a number" => "numbers".into(),
        "a map" => "maps".into(),
        "true or false" => "booleans".into(),
        "a whole number" | "a whole number, 0 or more" => "whole numbers".into(),
        other => format!("items each {other}"),
    }
}

fn describe_expected(serde: &str) -> String {
    match serde {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a whole number, 0 or more".into(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "a boolean" => "true or false".into(),
        "a sequence" => "a list".into(),
        "path string" => "a path (a string)".into(),
        "a map" => "a map".into(),
        s if s.starts_with("struct ") => "a map of options".into(),
        other => other.into(),
    }
}

fn describe_unexpected(serde: &str) -> String {
    if let Some(s) = serde.strip_prefix("string ") {
        return format!("the string {s}");
    }
    for (prefix, what) in [
        ("integer ", "the number "),
        ("floating point ", "the number "),
    ] {
        if let Some(n) = serde.strip_prefix(prefix) {
            return format!("{what}{}", n.trim_matches('`'));
        }
    }
    if let Some(b) = serde.strip_prefix("boolean ") {
        return b.trim_matches('`').to_string();
    }
    match serde {
        "sequence" => "a list".into(),
        "map" => "a map".into(),
        "unit value" | "null" => "nothing (null)".into(),
        other => other.into(),
    }
}

/// Top-level numbers outside the `minimum` / `maximum` their schema gives
/// (from `#[schemars(range(..))]` on the option struct), so a range is
/// declared once and holds for every plugin, in `logbus validate` too.
fn range_errors(options: &Value, schema: &Value) -> Vec<OptionError> {
    let (Some(map), Some(known)) = (
        options.as_object(),
        schema.get("properties").and_then(Value::as_object),
    ) else {
        return Vec::new();
    };
    // `f64`'s `Display` writes whole numbers without a fraction or an
    // exponent (65535, not 65535.0 or 6.5535e4).
    let show = |n: f64| format!("{n}");
    let mut errors = Vec::new();
    for (key, value) in map {
        let (Some(n), Some(property)) = (value.as_f64(), known.get(key)) else {
            continue;
        };
        let min = property.get("minimum").and_then(Value::as_f64);
        let max = property.get("maximum").and_then(Value::as_f64);
        if min.is_none_or(|m| n >= m) && max.is_none_or(|m| n <= m) {
            continue;
        }
        let message = match (min, max) {
            (Some(lo), Some(hi)) => {
                format!("must be between {} and {}, got {value}", show(lo), show(hi))
            }
            (Some(lo), None) => format!("must be at least {}, got {value}", show(lo)),
            (None, Some(hi)) => format!("must be at most {}, got {value}", show(hi)),
            (None, None) => unreachable!("a bound was broken"),
        };
        errors.push(OptionError {
            path: vec![key.clone()],
            message,
            offset: None,
        });
    }
    errors
}

/// A serde error path (`set.level`, `delete.1`) as the segments
/// `yaml::Node::pos_of` and [`OptionError::path`] use.
pub fn path_segments(path: &serde_path_to_error::Path) -> Vec<String> {
    path.iter()
        .filter_map(|seg| match seg {
            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
            serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
            _ => None,
        })
        .collect()
}

pub use logbus_event::closest;

/// Options of a plugin that takes none.
#[derive(Debug, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoOptions {}

impl CheckOptions for NoOptions {}
