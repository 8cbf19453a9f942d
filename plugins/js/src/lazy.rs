//! The event a script sees is a `Proxy` over the Rust event, not a copy:
//! a field is converted to JS only when the script reads it, and only the
//! fields the script wrote, deleted, or read as objects (which it may have
//! changed in place) are converted back. A script that reads `level`, sets
//! `sev` and deletes `pad` costs three conversions whatever the event's size.
//!
//! The proxy keeps the per-event state in its target object: `c` (values
//! read or written, by name), `w` (names to write back), `d` (names
//! deleted). Everything else the proxy answers from the Rust event through
//! three functions, `fetch(generation, name)`, `present(generation, name)`
//! (whether a field is there, without converting it: `"x" in event`) and
//! `keys(generation)`. When a
//! call of `process` is over its proxy is marked dead, so an event object
//! the script kept from an earlier call throws instead of reading another
//! event (the generation check in `fetch` is the second line of defence).
//!
//! Field order is kept: untouched fields stay where they were, new fields
//! come last, deleted fields close up (as in JS objects and JSON).

use std::sync::{Arc, Mutex};

use logbus_plugin_api::{Event, Payload};
use rquickjs::{Ctx, Exception, Function, Object, Value};

use crate::convert::{ConvertError, ReadLimits, Walk, from_js, to_js};

/// The JS half: builds the proxy handler once per worker; returns
/// `wrap(generation) -> [proxy, target]`.
const GLUE: &str = r#"
(function (fetch, keysOf, present) {
  "use strict";
  const own = (o, k) => o !== null && Object.prototype.hasOwnProperty.call(o, k);
  const live = (t) => {
    if (t.x) throw new TypeError("this event object belongs to an earlier call of process(); keep a copy ({...event}) to use it later");
  };
  const handler = {
    get(t, k) {
      live(t);
      if (typeof k !== "string") return undefined;
      if (own(t.c, k)) return t.c[k];
      if (own(t.d, k)) return undefined;
      const v = fetch(t.g, k);
      if (v !== undefined) {
        t.c[k] = v;
        if (typeof v === "object" && v !== null) (t.w || (t.w = Object.create(null)))[k] = true;
      }
      return v;
    },
    set(t, k, v) {
      live(t);
      if (typeof k !== "string") return false;
      t.c[k] = v;
      (t.w || (t.w = Object.create(null)))[k] = true;
      if (t.d !== null) delete t.d[k];
      return true;
    },
    deleteProperty(t, k) {
      live(t);
      if (typeof k !== "string") return true;
      delete t.c[k];
      if (t.w !== null) delete t.w[k];
      (t.d || (t.d = Object.create(null)))[k] = true;
      return true;
    },
    has(t, k) {
      live(t);
      if (typeof k !== "string") return false;
      if (own(t.c, k)) return true;
      if (own(t.d, k)) return false;
      return present(t.g, k);
    },
    ownKeys(t) {
      live(t);
      const out = [];
      const seen = Object.create(null);
      for (const k of keysOf(t.g)) {
        if (!own(t.d, k)) { out.push(k); seen[k] = true; }
      }
      for (const k of Object.keys(t.c)) {
        if (seen[k] !== true) out.push(k);
      }
      return out;
    },
    getOwnPropertyDescriptor(t, k) {
      if (!handler.has(t, k)) return undefined;
      return { value: handler.get(t, k), writable: true, enumerable: true, configurable: true };
    },
    defineProperty(t, k, d) {
      return handler.set(t, k, d.value);
    },
  };
  return function wrap(g) {
    const t = { g: g, c: Object.create(null), w: null, d: null, x: false };
    return [new Proxy(t, handler), t];
  };
})
"#;

/// The event the current call of `process` is about, shared with the
/// `fetch`/`keys` functions.
#[derive(Default)]
struct Current {
    generation: u32,
    /// A second reference to the event (no copy); dropped by `end` before
    /// the event is changed, so changing it does not copy it.
    event: Option<Event>,
}

pub struct LazyEvents {
    current: Arc<Mutex<Current>>,
}

/// Names of the JS-side pieces, kept on the global object.
pub const WRAP: &str = "\u{1}logbus.wrap";

impl LazyEvents {
    /// Installs the glue in a context.
    pub fn install<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<LazyEvents> {
        let current: Arc<Mutex<Current>> = Arc::default();
        let fetch = {
            let current = current.clone();
            Function::new(
                ctx.clone(),
                move |ctx: Ctx<'js>,
                      generation: u32,
                      name: String|
                      -> rquickjs::Result<Value<'js>> {
                    let cur = current.lock().unwrap_or_else(|p| p.into_inner());
                    // Lazy fields parse only the one value asked for.
                    let value = match live(&ctx, &cur, generation)? {
                        Payload::Lazy(lazy) => lazy.get(&name).map(std::borrow::Cow::Owned),
                        payload => payload
                            .as_fields()
                            .and_then(|f| f.get(&name))
                            .map(std::borrow::Cow::Borrowed),
                    };
                    match value {
                        Some(v) => to_js(&ctx, &v),
                        None => Ok(Value::new_undefined(ctx.clone())),
                    }
                },
            )?
        };
        let keys = {
            let current = current.clone();
            Function::new(
                ctx.clone(),
                move |ctx: Ctx<'js>, generation: u32| -> rquickjs::Result<Vec<String>> {
                    let cur = current.lock().unwrap_or_else(|p| p.into_inner());
                    Ok(match live(&ctx, &cur, generation)? {
                        Payload::Lazy(lazy) => lazy.keys(),
                        payload => payload
                            .as_fields()
                            .map(|f| f.keys().cloned().collect())
                            .unwrap_or_default(),
                    })
                },
            )?
        };
        let present = {
            let current = current.clone();
            Function::new(
                ctx.clone(),
                move |ctx: Ctx<'js>, generation: u32, name: String| -> rquickjs::Result<bool> {
                    let cur = current.lock().unwrap_or_else(|p| p.into_inner());
                    Ok(match live(&ctx, &cur, generation)? {
                        Payload::Lazy(lazy) => lazy.contains(&name),
                        payload => payload.as_fields().is_some_and(|f| f.contains_key(&name)),
                    })
                },
            )?
        };
        let make: Function = ctx.eval(GLUE)?;
        let wrap: Function = make.call((fetch, keys, present))?;
        ctx.globals().set(WRAP, wrap)?;
        Ok(LazyEvents { current })
    }

    /// Starts a call: `event` (with fields, lazy or built) is what the
    /// proxy shows.
    /// Returns the proxy and its state object.
    pub fn begin<'js>(
        &self,
        ctx: &Ctx<'js>,
        event: Event,
    ) -> rquickjs::Result<(Value<'js>, Object<'js>)> {
        let generation = {
            let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
            cur.generation = cur.generation.wrapping_add(1);
            cur.event = Some(event);
            cur.generation
        };
        let wrap: Function = ctx.globals().get(WRAP)?;
        let pair: rquickjs::Array = wrap.call((generation,))?;
        Ok((pair.get(0)?, pair.get(1)?))
    }

    /// Ends the call: the proxy stops answering (a script that kept it
    /// gets a TypeError from then on).
    pub fn end(&self, state: &Object<'_>) {
        let _ = state.set("x", true);
        self.current.lock().unwrap_or_else(|p| p.into_inner()).event = None;
    }
}

fn live<'a>(ctx: &Ctx<'_>, cur: &'a Current, generation: u32) -> rquickjs::Result<&'a Payload> {
    match cur.event.as_ref().map(Event::payload) {
        Some(p @ (Payload::Fields(_) | Payload::Lazy(_))) if cur.generation == generation => Ok(p),
        _ => Err(Exception::throw_type(
            ctx,
            "this event object belongs to an earlier call of process(); keep a copy ({...event}) to use it later",
        )),
    }
}

fn remove(payload: &mut Payload, name: &str) {
    match payload {
        Payload::Lazy(lazy) => {
            lazy.delete(name);
        }
        Payload::Fields(fields) => {
            fields.shift_remove(name);
        }
        Payload::Raw(_) => unreachable!("the script sees fields"),
    }
}

/// Applies what the script did to the proxy (per its state object) to the
/// event's fields: lazy ones take the edits beside their text, so what the
/// script did not touch is written out as it came.
pub fn apply<'js>(
    state: &Object<'js>,
    proxy: &Value<'js>,
    payload: &mut Payload,
    limits: &ReadLimits<'_>,
) -> Result<(), ConvertError> {
    let walk = Walk {
        limits,
        proxy: Some(proxy),
        inside_proxy: true,
    };
    let js = |e: rquickjs::Error| ConvertError(format!("reading the result: {e}"));
    let deleted: Option<Object> = state.get("d").map_err(js)?;
    if let Some(deleted) = deleted {
        for name in deleted.keys::<String>() {
            remove(payload, &name.map_err(js)?);
        }
    }
    let written: Option<Object> = state.get("w").map_err(js)?;
    if let Some(written) = written {
        let values: Object = state.get("c").map_err(js)?;
        for name in written.keys::<String>() {
            let name = name.map_err(js)?;
            let value: Value = values.get(name.as_str()).map_err(js)?;
            match (from_js(&value, 1, walk)?, &mut *payload) {
                (Some(v), Payload::Lazy(lazy)) => lazy.set(&name, v),
                (Some(v), Payload::Fields(fields)) => {
                    fields.insert(name, v);
                }
                (Some(_), Payload::Raw(_)) => unreachable!("the script sees fields"),
                // `event.x = undefined` removes x, as JSON would.
                (None, payload) => remove(payload, &name),
            }
        }
    }
    Ok(())
}
