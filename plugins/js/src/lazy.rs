//! The event a script sees is a view of the Rust event, not a copy: a field
//! becomes a JS value only when the script reads it, and only the fields
//! the script wrote, deleted, or read as objects (which it may have changed
//! in place) are converted back. A script that reads `level`, sets `sev`
//! and deletes `pad` costs three conversions whatever the event's size.
//!
//! The view is a native QuickJS object: a class whose property hooks
//! ("exotic methods") are the Rust functions below, called by the
//! interpreter directly. It was a JS `Proxy` before, whose traps were JS
//! functions calling back into Rust: every property access cost two JS
//! calls and a Rust call, and the like-for-like JS pipeline spent a third
//! of its time in them (docs/benchmarks.md, "The JS event as a native
//! object").
//!
//! What a call did is kept in Rust ([`CallState`]): the values read or
//! written, by name, and the names deleted. An event object is live for one
//! call of `process`: its pointer to that state is cleared when the call
//! ends, so an object a script kept throws instead of reading another event.
//! The values held are counted references into the JS heap, released when
//! the call's changes are applied or discarded; the names are charged
//! against the worker's memory limit.
//!
//! Field order is kept: untouched fields stay where they were, new fields
//! come last, deleted fields close up (as in JS objects and JSON).
#![allow(unsafe_code)]

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

use indexmap::IndexMap;

/// Names are the script's to choose: a seeded hash (foldhash's, which is
/// fast on short keys).
type Touched = IndexMap<Box<str>, Seen, foldhash::fast::RandomState>;
use logbus_plugin_api::{Event, Payload};
use rquickjs::{Ctx, Exception, Value, qjs};

use crate::convert::{ConvertError, ReadLimits, Walk, from_js, to_js};

const DEAD: &str = "this event object belongs to an earlier call of process(); keep a copy ({...event}) to use it later";

/// A counted reference into the worker's JS heap.
#[derive(Clone, Copy)]
struct Held(qjs::JSValue);

// SAFETY: a worker moves between threads with its runtime (rquickjs's
// `parallel` runtime is `Send`); a `Held` is only read or released inside
// `Context::with`, which holds that runtime's lock.
unsafe impl Send for Held {}

/// What the script did with one field.
enum Seen {
    /// Read as a primitive: unchanged unless written later.
    Read(Held),
    /// Written, or read as an object (the script may change it in place).
    Written(Held),
    /// Deleted, then written again: it moves last, as on a plain object.
    Replaced(Held),
    Deleted,
}

impl Seen {
    fn value(&self) -> Option<qjs::JSValue> {
        match self {
            Seen::Read(v) | Seen::Written(v) | Seen::Replaced(v) => Some(v.0),
            Seen::Deleted => None,
        }
    }
}

/// One call's event and what the script did to it.
#[derive(Default)]
struct CallState {
    /// A second reference to the event (no copy); dropped by `end` before
    /// the event is changed, so changing it does not copy it.
    event: Option<Event>,
    /// By name, in the order the script touched them (a name deleted or
    /// set again after a delete moves last, as on a plain object).
    touched: Touched,
    /// Roughly what `touched` takes on the Rust heap.
    touched_bytes: usize,
    /// The most `touched` may take: the worker's `memory_limit_mb`.
    limit_bytes: usize,
}

/// What one entry of `touched` costs besides its name.
const ENTRY_BYTES: usize = 64;

pub struct LazyEvents {
    class_id: qjs::JSClassID,
    /// Boxed: each live event object points at it.
    state: Box<RefCell<CallState>>,
    /// The map of the call before, emptied: its allocation is reused.
    spare: RefCell<Touched>,
}

static HOOKS: qjs::JSClassExoticMethods = qjs::JSClassExoticMethods {
    get_own_property: Some(get_own_property),
    get_own_property_names: Some(get_own_property_names),
    delete_property: Some(delete_property),
    define_own_property: Some(define_own_property),
    has_property: Some(has_property),
    get_property: Some(get_property),
    set_property: Some(set_property),
};

impl LazyEvents {
    /// Registers the event class with the context's runtime (one context
    /// per runtime here). `limit_bytes` caps what a call's changes may
    /// take outside the JS heap.
    pub fn install(ctx: &Ctx<'_>, limit_bytes: usize) -> rquickjs::Result<LazyEvents> {
        let raw = ctx.as_raw().as_ptr();
        let mut class_id: qjs::JSClassID = 0;
        let def = qjs::JSClassDef {
            class_name: c"Event".as_ptr(),
            finalizer: None,
            gc_mark: None,
            call: None,
            // QuickJS keeps the pointer and only reads through it.
            exotic: (&raw const HOOKS).cast_mut(),
        };
        // The class's prototype is `Object.prototype` (so `event instanceof
        // Object` holds); every property read goes to the hooks, never to
        // the prototype.
        let object_prototype: rquickjs::Object = ctx
            .globals()
            .get::<_, rquickjs::Object>("Object")?
            .get("prototype")?;
        // SAFETY: `raw` is a live context; `def` is read during the call;
        // `HOOKS` is static. JS_SetClassProto takes the reference given.
        unsafe {
            let rt = qjs::JS_GetRuntime(raw);
            qjs::JS_NewClassID(rt, &mut class_id);
            if qjs::JS_NewClass(rt, class_id, &def) != 0 {
                return Err(rquickjs::Error::Unknown);
            }
            qjs::JS_SetClassProto(raw, class_id, dup(ctx, object_prototype.as_raw()));
        }
        let state = CallState {
            limit_bytes,
            ..CallState::default()
        };
        Ok(LazyEvents {
            class_id,
            state: Box::new(RefCell::new(state)),
            spare: RefCell::default(),
        })
    }

    /// Starts a call: returns the object the script gets for `event`
    /// (with fields, lazy or built).
    pub fn begin<'js>(&self, ctx: &Ctx<'js>, event: Event) -> rquickjs::Result<Value<'js>> {
        self.state
            .try_borrow_mut()
            .map_err(|_| rquickjs::Error::Unknown)?
            .event = Some(event);
        // SAFETY: `ctx` is live; the new object's reference is handed to
        // `Value`, which frees it. The opaque pointer is the boxed state,
        // which outlives every call (`end` clears it from the object).
        unsafe {
            let raw = qjs::JS_NewObjectClass(ctx.as_raw().as_ptr(), self.class_id);
            let object = Value::from_raw(ctx.clone(), raw);
            if object.is_exception() {
                return Err(rquickjs::Error::Exception);
            }
            let state: *const RefCell<CallState> = &*self.state;
            qjs::JS_SetOpaque(raw, state.cast_mut().cast::<c_void>());
            Ok(object)
        }
    }

    /// The object stops answering (a script that kept it gets a TypeError
    /// from then on) and the event's second reference goes. What the
    /// script changed stays for [`LazyEvents::apply`].
    pub fn end(&self, object: &Value<'_>) {
        // SAFETY: `object` is one of ours (from `begin`); clearing its
        // opaque pointer makes the hooks refuse it.
        unsafe {
            qjs::JS_SetOpaque(object.as_raw(), std::ptr::null_mut());
        }
        if let Ok(mut state) = self.state.try_borrow_mut() {
            state.event = None;
        }
    }

    /// Applies what the script did to the event's fields: lazy ones take
    /// the edits beside their text, so what the script did not touch is
    /// written out as it came. Releases the values held.
    pub fn apply<'js>(
        &self,
        ctx: &Ctx<'js>,
        object: &Value<'js>,
        payload: &mut Payload,
        limits: &ReadLimits<'_>,
    ) -> Result<(), ConvertError> {
        let mut touched = self.take();
        let walk = Walk {
            limits,
            event_object: Some(object),
            inside_event: true,
        };
        let mut outcome = Ok(());
        for (name, seen) in touched.drain(..) {
            let value = match seen {
                Seen::Deleted => {
                    if outcome.is_ok() {
                        remove(payload, &name);
                    }
                    continue;
                }
                // SAFETY: the reference is ours; `Value` frees it.
                Seen::Read(v) => {
                    drop(unsafe { Value::from_raw(ctx.clone(), v.0) });
                    continue;
                }
                Seen::Written(v) => unsafe { Value::from_raw(ctx.clone(), v.0) },
                Seen::Replaced(v) => {
                    if outcome.is_ok() {
                        remove(payload, &name);
                    }
                    // SAFETY: as above.
                    unsafe { Value::from_raw(ctx.clone(), v.0) }
                }
            };
            if outcome.is_err() {
                continue;
            }
            outcome = from_js(&value, 1, walk).map(|v| match (v, &mut *payload) {
                (Some(v), Payload::Lazy(lazy)) => lazy.set(&name, v),
                (Some(v), Payload::Fields(fields)) => {
                    fields.insert(name.into_string(), v);
                }
                (Some(_), Payload::Raw(_)) => unreachable!("the script sees fields"),
                // `event.x = undefined` removes x, as JSON would.
                (None, payload) => remove(payload, &name),
            });
        }
        self.give_back(touched);
        outcome
    }

    /// Releases what the call held without applying it (the script
    /// returned something else, or failed).
    pub fn discard(&self, ctx: &Ctx<'_>) {
        let mut touched = self.take();
        for (_, seen) in touched.drain(..) {
            release(ctx, seen);
        }
        self.give_back(touched);
    }

    /// The call's map, leaving the spare (empty) one in its place.
    fn take(&self) -> Touched {
        let spare = self.spare.take();
        match self.state.try_borrow_mut() {
            Ok(mut state) => {
                state.touched_bytes = 0;
                std::mem::replace(&mut state.touched, spare)
            }
            Err(_) => spare,
        }
    }

    /// Keeps an emptied map for the next call.
    fn give_back(&self, touched: Touched) {
        debug_assert!(touched.is_empty());
        *self.spare.borrow_mut() = touched;
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

// The hooks. QuickJS calls them with a live context and one of our
// objects; each answers through `hook`, which turns an error into a
// pending JS exception. None may panic (they are called from C).

/// The object's call state, or `None` once its call is over.
///
/// # Safety
/// `obj` is an object of the event class.
unsafe fn state_of<'a>(obj: qjs::JSValue) -> Option<&'a RefCell<CallState>> {
    // SAFETY: the opaque pointer is null or the boxed state, which
    // outlives every live object (see `begin` and `end`).
    unsafe {
        let state = qjs::JS_GetOpaque(obj, qjs::JS_GetClassID(obj)).cast::<RefCell<CallState>>();
        state.as_ref()
    }
}

/// Runs `f` with the context, the object's state and the property's name
/// (`None` for a symbol, or where no property is asked about); an error becomes a pending exception.
///
/// # Safety
/// `ctx` is live, `obj` an object of the event class, `atom` valid.
unsafe fn hook<T>(
    ctx: *mut qjs::JSContext,
    obj: qjs::JSValue,
    atom: Option<qjs::JSAtom>,
    f: impl FnOnce(&Ctx<'_>, &mut CallState, Option<&str>) -> rquickjs::Result<T>,
) -> Option<T> {
    // SAFETY: per this function's contract.
    let ctx = unsafe { Ctx::from_raw(NonNull::new_unchecked(ctx)) };
    let outcome = (|| {
        let Some(state) = (unsafe { state_of(obj) }) else {
            return Err(Exception::throw_type(&ctx, DEAD));
        };
        let Ok(mut state) = state.try_borrow_mut() else {
            return Err(Exception::throw_internal(&ctx, "the event is busy"));
        };
        let Some(atom) = atom else {
            return f(&ctx, &mut state, None);
        };
        // SAFETY: `atom` is valid; the value is handed to `Value`.
        let key = unsafe {
            Value::from_raw(
                ctx.clone(),
                qjs::JS_AtomToValue(ctx.as_raw().as_ptr(), atom),
            )
        };
        if key.is_exception() {
            return Err(rquickjs::Error::Exception);
        }
        if !key.is_string() {
            return f(&ctx, &mut state, None);
        }
        // Borrowed from QuickJS (no copy for ASCII text) for the hook.
        let raw = ctx.as_raw().as_ptr();
        let mut len = 0;
        // SAFETY: `key` is a live string; the text is freed below.
        let text = unsafe { qjs::JS_ToCStringLen2(raw, &mut len, key.as_raw(), false) };
        if text.is_null() {
            return Err(rquickjs::Error::Exception);
        }
        // SAFETY: QuickJS gives `len` bytes at `text`.
        let bytes = unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len as usize) };
        let outcome = match std::str::from_utf8(bytes) {
            Ok(name) => f(&ctx, &mut state, Some(name)),
            Err(_) => f(&ctx, &mut state, Some(&String::from_utf8_lossy(bytes))),
        };
        // SAFETY: from JS_ToCStringLen2 above.
        unsafe { qjs::JS_FreeCString(raw, text) };
        outcome
    })();
    match outcome {
        Ok(v) => Some(v),
        Err(rquickjs::Error::Exception) => None,
        Err(e) => {
            let _ = Exception::throw_internal(&ctx, &e.to_string());
            None
        }
    }
}

/// The field's value as the script sees it, read once from the event and
/// then kept (so a nested object read twice is the same object).
fn read(
    ctx: &Ctx<'_>,
    state: &mut CallState,
    name: &str,
) -> rquickjs::Result<Option<qjs::JSValue>> {
    if let Some(seen) = state.touched.get(name) {
        return Ok(seen.value());
    }
    // Lazy fields parse only the one value asked for.
    let value = match state.event.as_ref().map(Event::payload) {
        Some(Payload::Lazy(lazy)) => lazy.get(name).map(Cow::Owned),
        Some(payload) => payload
            .as_fields()
            .and_then(|f| f.get(name))
            .map(Cow::Borrowed),
        None => return Err(Exception::throw_type(ctx, DEAD)),
    };
    let Some(value) = value else {
        return Ok(None);
    };
    let js = to_js(ctx, &value)?;
    // `touched` holds a reference of its own.
    let raw = dup(ctx, js.as_raw());
    let seen = if js.is_object() {
        Seen::Written(Held(raw))
    } else {
        Seen::Read(Held(raw))
    };
    note(ctx, state, name, seen)?;
    Ok(Some(raw))
}

/// Records what the script did with `name`, releasing what was held
/// before. A delete, and a write after a delete, move the name last.
fn note(ctx: &Ctx<'_>, state: &mut CallState, name: &str, seen: Seen) -> rquickjs::Result<()> {
    let before = state.touched.get(name);
    let moves_last = matches!(seen, Seen::Deleted) || matches!(before, Some(Seen::Deleted));
    let seen = match (before, seen) {
        (Some(Seen::Deleted | Seen::Replaced(_)), Seen::Written(v)) => Seen::Replaced(v),
        (_, seen) => seen,
    };
    match state.touched.get_index_of(name) {
        Some(i) if !moves_last => {
            let old = std::mem::replace(&mut state.touched[i], seen);
            release(ctx, old);
        }
        Some(i) => {
            if let Some((_, old)) = state.touched.shift_remove_index(i) {
                release(ctx, old);
            }
            state.touched.insert(name.into(), seen);
        }
        None => {
            state.touched_bytes += ENTRY_BYTES + name.len();
            if state.touched_bytes > state.limit_bytes {
                release(ctx, seen);
                return Err(Exception::throw_internal(
                    ctx,
                    "out of memory: the fields this call touched exceed memory_limit_mb",
                ));
            }
            state.touched.insert(name.into(), seen);
        }
    }
    Ok(())
}

/// Lets go of the value `seen` held, if any.
fn release(ctx: &Ctx<'_>, seen: Seen) {
    if let Some(v) = seen.value() {
        // SAFETY: the reference was ours; `Value` frees it.
        drop(unsafe { Value::from_raw(ctx.clone(), v) });
    }
}

/// A value whose reference QuickJS will take (hooks return owned values).
fn dup(ctx: &Ctx<'_>, v: qjs::JSValue) -> qjs::JSValue {
    // SAFETY: `v` is a live value held in the call state.
    unsafe { qjs::JS_DupValue(ctx.as_raw().as_ptr(), v) }
}

fn present(state: &CallState, name: &str) -> bool {
    match state.touched.get(name) {
        Some(seen) => seen.value().is_some(),
        None => match state.event.as_ref().map(Event::payload) {
            Some(Payload::Lazy(lazy)) => lazy.contains(name),
            Some(payload) => payload.as_fields().is_some_and(|f| f.contains_key(name)),
            None => false,
        },
    }
}

unsafe extern "C" fn get_property(
    ctx: *mut qjs::JSContext,
    obj: qjs::JSValue,
    atom: qjs::JSAtom,
    _receiver: qjs::JSValue,
) -> qjs::JSValue {
    // SAFETY: called by QuickJS on one of our objects.
    let got = unsafe {
        hook(ctx, obj, Some(atom), |ctx, state, name| {
            Ok(match name {
                Some(name) => read(ctx, state, name)?.map(|v| dup(ctx, v)),
                None => None,
            })
        })
    };
    match got {
        Some(Some(v)) => v,
        Some(None) => qjs::JS_UNDEFINED,
        None => qjs::JS_EXCEPTION,
    }
}

/// Writes `value` (borrowed: QuickJS frees its own reference).
fn write(
    ctx: &Ctx<'_>,
    state: &mut CallState,
    name: Option<&str>,
    value: qjs::JSValue,
) -> rquickjs::Result<c_int> {
    let Some(name) = name else {
        return Err(Exception::throw_type(
            ctx,
            "an event field's name is a string; a symbol cannot be one",
        ));
    };
    note(ctx, state, name, Seen::Written(Held(dup(ctx, value))))?;
    Ok(1)
}

unsafe extern "C" fn set_property(
    ctx: *mut qjs::JSContext,
    obj: qjs::JSValue,
    atom: qjs::JSAtom,
    value: qjs::JSValue,
    _receiver: qjs::JSValue,
    _flags: c_int,
) -> c_int {
    // SAFETY: called by QuickJS on one of our objects.
    unsafe {
        hook(ctx, obj, Some(atom), |ctx, state, name| {
            write(ctx, state, name, value)
        })
    }
    .unwrap_or(-1)
}

unsafe extern "C" fn define_own_property(
    ctx: *mut qjs::JSContext,
    obj: qjs::JSValue,
    atom: qjs::JSAtom,
    value: qjs::JSValue,
    _getter: qjs::JSValue,
    _setter: qjs::JSValue,
    flags: c_int,
) -> c_int {
    let flags = flags as u32;
    // SAFETY: called by QuickJS on one of our objects.
    unsafe {
        hook(ctx, obj, Some(atom), |ctx, state, name| {
            if flags & (qjs::JS_PROP_HAS_GET | qjs::JS_PROP_HAS_SET) != 0 {
                return Err(Exception::throw_type(
                    ctx,
                    "an event field holds a value; it cannot be a getter or setter",
                ));
            }
            if flags & qjs::JS_PROP_HAS_VALUE != 0 {
                return write(ctx, state, name, value);
            }
            // Only attributes (enumerable, writable, ...): fields have
            // fixed ones; nothing changes.
            Ok(1)
        })
    }
    .unwrap_or(-1)
}

unsafe extern "C" fn delete_property(
    ctx: *mut qjs::JSContext,
    obj: qjs::JSValue,
    atom: qjs::JSAtom,
) -> c_int {
    // SAFETY: called by QuickJS on one of our objects.
    unsafe {
        hook(ctx, obj, Some(atom), |ctx, state, name| {
            if let Some(name) = name {
                note(ctx, state, name, Seen::Deleted)?;
            }
            Ok(1)
        })
    }
    .unwrap_or(-1)
}

unsafe extern "C" fn has_property(
    ctx: *mut qjs::JSContext,
    obj: qjs::JSValue,
    atom: qjs::JSAtom,
) -> c_int {
    // SAFETY: called by QuickJS on one of our objects.
    unsafe {
        hook(ctx, obj, Some(atom), |_, state, name| {
            Ok(c_int::from(name.is_some_and(|name| present(state, name))))
        })
    }
    .unwrap_or(-1)
}

unsafe extern "C" fn get_own_property(
    ctx: *mut qjs::JSContext,
    desc: *mut qjs::JSPropertyDescriptor,
    obj: qjs::JSValue,
    atom: qjs::JSAtom,
) -> c_int {
    // SAFETY: called by QuickJS on one of our objects; `desc` is null or
    // QuickJS's to fill (it frees what it is given).
    unsafe {
        hook(ctx, obj, Some(atom), |ctx, state, name| {
            let Some(name) = name else {
                return Ok(0);
            };
            if desc.is_null() {
                return Ok(c_int::from(present(state, name)));
            }
            let Some(value) = read(ctx, state, name)? else {
                return Ok(0);
            };
            desc.write(qjs::JSPropertyDescriptor {
                flags: qjs::JS_PROP_C_W_E as c_int,
                value: dup(ctx, value),
                getter: qjs::JS_UNDEFINED,
                setter: qjs::JS_UNDEFINED,
            });
            Ok(1)
        })
    }
    .unwrap_or(-1)
}

/// The field names, in order: the event's (less those deleted, or deleted
/// and set again), then the ones the script added or set again.
fn names(state: &CallState) -> Vec<String> {
    let mut names = match state.event.as_ref().map(Event::payload) {
        Some(Payload::Lazy(lazy)) => lazy.keys(),
        Some(payload) => payload
            .as_fields()
            .map(|f| f.keys().cloned().collect())
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let in_event: HashSet<String> = names.iter().cloned().collect();
    names.retain(|name| {
        !matches!(
            state.touched.get(name.as_str()),
            Some(Seen::Deleted | Seen::Replaced(_))
        )
    });
    for (name, seen) in &state.touched {
        let added = match seen {
            Seen::Replaced(_) => true,
            Seen::Read(_) | Seen::Written(_) => !in_event.contains(&**name),
            Seen::Deleted => false,
        };
        if added {
            names.push(name.to_string());
        }
    }
    names
}

unsafe extern "C" fn get_own_property_names(
    ctx: *mut qjs::JSContext,
    ptab: *mut *mut qjs::JSPropertyEnum,
    plen: *mut u32,
    obj: qjs::JSValue,
) -> c_int {
    // SAFETY: called by QuickJS on one of our objects; the table is
    // allocated with `js_malloc` and its atoms are new references, which
    // QuickJS frees (on failure here, this function frees them).
    let listed = unsafe {
        hook(ctx, obj, None, |ctx, state, _| {
            let names = names(state);
            let raw = ctx.as_raw().as_ptr();
            let size = std::mem::size_of::<qjs::JSPropertyEnum>() * names.len().max(1);
            let table = qjs::js_malloc(raw, size as _).cast::<qjs::JSPropertyEnum>();
            if table.is_null() {
                return Err(rquickjs::Error::Exception);
            }
            for (i, name) in names.iter().enumerate() {
                let atom = qjs::JS_NewAtomLen(raw, name.as_ptr().cast(), name.len() as _);
                if atom == qjs::JS_ATOM_NULL {
                    for made in 0..i {
                        qjs::JS_FreeAtom(raw, (*table.add(made)).atom);
                    }
                    qjs::js_free(raw, table.cast());
                    return Err(rquickjs::Error::Exception);
                }
                table.add(i).write(qjs::JSPropertyEnum {
                    is_enumerable: true,
                    atom,
                });
            }
            *ptab = table;
            *plen = names.len() as u32;
            Ok(())
        })
    };
    if listed.is_some() { 0 } else { -1 }
}
