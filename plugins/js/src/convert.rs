//! Events to JS values and back, in one pass each way, without going
//! through JSON text: the event's fields become a plain object (numbers stay
//! numbers: integers that fit in 32 bits as QuickJS ints, others as
//! doubles), and a returned object is read back the way `JSON.stringify`
//! would see it: functions, symbols and `undefined` members are left out,
//! non-finite numbers become `null`, BigInts become decimal strings.
//!
//! Integers beyond 2^53 lose precision in JS, as they do in any JS engine.
//!
//! Reading back is where a script can make the host pay: an array's length
//! costs QuickJS nothing (`a.length = 2**31 - 1`) but its items would cost
//! Rust a `Vec` of that many values, and getters and Proxy traps run script
//! code in the middle of the walk. So every read is charged against
//! [`ReadLimits`]: approximate bytes (the worker's `memory_limit_mb`) and
//! the call's CPU budget, checked as the walk goes.

use std::cell::Cell;

use rquickjs::{Array, Ctx, Object, String as JsString, Type, Value};
use serde_json::{Map, Number, Value as Json};

/// Deeper than this is refused, which also stops reference cycles.
pub const MAX_DEPTH: usize = 128;

pub fn to_js<'js>(ctx: &Ctx<'js>, value: &Json) -> rquickjs::Result<Value<'js>> {
    Ok(match value {
        Json::Null => Value::new_null(ctx.clone()),
        Json::Bool(b) => Value::new_bool(ctx.clone(), *b),
        Json::Number(n) => match n.as_i64() {
            Some(i) if i32::try_from(i).is_ok() => Value::new_int(ctx.clone(), i as i32),
            Some(i) => Value::new_float(ctx.clone(), i as f64),
            None => Value::new_float(ctx.clone(), n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => JsString::from_str(ctx.clone(), s)?.into_value(),
        Json::Array(items) => {
            let array = Array::new(ctx.clone())?;
            for (i, item) in items.iter().enumerate() {
                array.set(i, to_js(ctx, item)?)?;
            }
            array.into_value()
        }
        Json::Object(map) => object_to_js(ctx, map)?.into_value(),
    })
}

pub fn object_to_js<'js>(ctx: &Ctx<'js>, map: &Map<String, Json>) -> rquickjs::Result<Object<'js>> {
    let object = Object::new(ctx.clone())?;
    for (k, v) in map {
        object.set(k.as_str(), to_js(ctx, v)?)?;
    }
    Ok(object)
}

/// Why a JS value could not become event fields.
#[derive(Debug, PartialEq)]
pub struct ConvertError(pub String);

/// What reading one result back may cost.
pub struct ReadLimits<'a> {
    limit_bytes: usize,
    bytes_left: Cell<usize>,
    reads: Cell<u32>,
    /// Whether the call's CPU budget is spent (checked every few hundred
    /// values: a walk over millions of holes runs no bytecode, so QuickJS's
    /// own interrupt check would never fire).
    spent: &'a dyn Fn() -> bool,
}

/// Roughly what one JSON value or map entry costs besides its text.
const VALUE_BYTES: usize = std::mem::size_of::<Json>();
const ENTRY_BYTES: usize = 2 * std::mem::size_of::<Json>();

impl<'a> ReadLimits<'a> {
    pub fn new(limit_bytes: usize, spent: &'a dyn Fn() -> bool) -> ReadLimits<'a> {
        ReadLimits {
            limit_bytes,
            bytes_left: Cell::new(limit_bytes),
            reads: Cell::new(0),
            spent,
        }
    }

    pub fn charge(&self, bytes: usize) -> Result<(), ConvertError> {
        let Some(left) = self.bytes_left.get().checked_sub(bytes) else {
            return Err(ConvertError(format!(
                "the result would take more than memory_limit_mb ({} MiB) as event fields",
                self.limit_bytes >> 20
            )));
        };
        self.bytes_left.set(left);
        let reads = self.reads.get().wrapping_add(1);
        self.reads.set(reads);
        if reads.is_multiple_of(256) && (self.spent)() {
            return Err(ConvertError(
                "reading the result ran past timeout_ms".into(),
            ));
        }
        Ok(())
    }
}

/// How a walk goes: the limits it is charged against, and the event object
/// of the current call, if any: reading it back walks its hooks, so it
/// must not be met again inside itself (a cycle through the event object
/// would recurse without end).
#[derive(Clone, Copy)]
pub struct Walk<'a, 'js> {
    pub limits: &'a ReadLimits<'a>,
    pub event_object: Option<&'a Value<'js>>,
    pub inside_event: bool,
}

/// Reads a JS value as JSON; `None` for values JSON leaves out (functions,
/// symbols, `undefined`).
pub fn from_js<'js>(
    value: &Value<'js>,
    depth: usize,
    walk: Walk<'_, 'js>,
) -> Result<Option<Json>, ConvertError> {
    let mut walk = walk;
    if let Some(event_object) = walk.event_object
        && value == event_object
    {
        if walk.inside_event {
            return Err(ConvertError(
                "the event contains itself (a reference cycle)".into(),
            ));
        }
        walk.inside_event = true;
    }
    if depth > MAX_DEPTH {
        return Err(ConvertError(format!(
            "the result is nested more than {MAX_DEPTH} levels deep (a reference cycle?)"
        )));
    }
    let js = |e: rquickjs::Error| ConvertError(format!("reading the result: {e}"));
    walk.limits.charge(VALUE_BYTES)?;
    Ok(Some(match value.type_of() {
        Type::Undefined
        | Type::Uninitialized
        | Type::Function
        | Type::Constructor
        | Type::Symbol => {
            return Ok(None);
        }
        Type::Null => Json::Null,
        Type::Bool => Json::Bool(value.as_bool().unwrap_or(false)),
        Type::Int => Json::Number(Number::from(value.as_int().unwrap_or(0))),
        Type::Float => {
            let f = value.as_float().unwrap_or(f64::NAN);
            if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 {
                // JS has one number type: an integral double is an integer.
                Json::Number(Number::from(f as i64))
            } else {
                Number::from_f64(f).map_or(Json::Null, Json::Number)
            }
        }
        Type::String => {
            let text = value
                .as_string()
                .expect("type is string")
                .to_string()
                .map_err(js)?;
            walk.limits.charge(text.len())?;
            Json::String(text)
        }
        Type::BigInt => {
            let text: String = value.get::<rquickjs::Coerced<String>>().map_err(js)?.0;
            Json::String(text)
        }
        Type::Array => {
            let array = value.as_array().expect("type is array");
            // The length is the script's to choose; space grows as items
            // are read (and charged), not from what the length claims.
            let mut items = Vec::new();
            for item in array_items(array).map_err(js)? {
                // Like JSON.stringify: a left-out member of an array is null.
                items.push(from_js(&item.map_err(js)?, depth + 1, walk)?.unwrap_or(Json::Null));
            }
            Json::Array(items)
        }
        Type::Promise => {
            return Err(ConvertError(
                "a Promise cannot become an event field: process() must return its result, not a promise of it".into(),
            ));
        }
        Type::Object | Type::Exception => Json::Object(object_from_js(
            value.as_object().expect("an object"),
            depth,
            walk,
        )?),
        other => {
            return Err(ConvertError(format!(
                "a {other:?} value cannot become an event field"
            )));
        }
    }))
}

/// An array's items by index. rquickjs's own `len` and `iter` assert that
/// the length is a small integer, which a script's `a.length = 2**31`
/// is not; the length is read here as the number it is.
pub fn array_items<'a, 'js>(
    array: &'a Array<'js>,
) -> rquickjs::Result<impl Iterator<Item = rquickjs::Result<Value<'js>>> + 'a> {
    let length: f64 = array.as_object().get("length")?;
    // An array's length is an integer below 2^32.
    let length = length.clamp(0.0, f64::from(u32::MAX)) as usize;
    Ok((0..length).map(move |i| array.get::<Value>(i)))
}

pub fn object_from_js<'js>(
    object: &Object<'js>,
    depth: usize,
    walk: Walk<'_, 'js>,
) -> Result<Map<String, Json>, ConvertError> {
    let js = |e: rquickjs::Error| ConvertError(format!("reading the result: {e}"));
    let mut map = Map::new();
    for prop in object.props::<String, Value>() {
        let (k, v) = prop.map_err(js)?;
        walk.limits.charge(ENTRY_BYTES + k.len())?;
        if let Some(v) = from_js(&v, depth + 1, walk)? {
            map.insert(k, v);
        }
    }
    Ok(map)
}
