//! The `js` transform: each worker owns one QuickJS runtime and context.
//!
//! The script is evaluated once per worker (so module-scope state persists
//! across that worker's events); it must define `process(event, ctx)` and
//! may define `init(ctx)`, called once per worker after evaluation.
//!
//! Limits are per worker runtime: `memory_limit_mb` caps the heap,
//! `timeout_ms` is a CPU budget per call enforced by QuickJS's interrupt
//! handler (checked every few thousand bytecode instructions), which throws
//! an uncatchable exception back to us. Either is an error for that event,
//! handled by the stage's `on_error`, and the runtime stays usable.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, EventError, Fields, OptionError, Payload, Processor,
    StageKind, TypedPlugin, Verdict,
};
use rquickjs::{CatchResultExt, CaughtError, Context, Ctx, Function, Object, Runtime, Value};
use serde::Deserialize;

use crate::convert::{ReadLimits, Walk, array_items, object_from_js, object_to_js};
use crate::lazy::LazyEvents;

/// Options of `transform: js`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JsOptions {
    /// The script, inline. It defines `process(event, ctx)` and optionally
    /// `init(ctx)`. Exactly one of `script` and `file`.
    #[serde(default)]
    pub script: Option<String>,
    /// The script in a file, relative to the pipeline file.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// CPU budget per call of `process` (or `init`), milliseconds.
    #[serde(default = "default_timeout")]
    #[schemars(range(min = 1, max = 60000))]
    pub timeout_ms: u64,
    /// Heap ceiling of each worker's runtime, MiB.
    #[serde(default = "default_memory")]
    #[schemars(range(min = 1, max = 4096))]
    pub memory_limit_mb: u64,
    /// The fields the script sets on every event it emits, by dotted path
    /// and type (`string`, `number`, `boolean`, `object`, `array`, `any`).
    /// Without it `logbus validate` knows nothing of the script's output;
    /// with it, later reads are checked against what came in plus these
    /// (the script is taken to leave other fields as it received them).
    /// At run time an emitted event that lacks one or holds another type
    /// is an error for `on_error`.
    #[serde(default)]
    pub fields: logbus_plugin_api::flow::FieldDeclaration,
}

fn default_timeout() -> u64 {
    50
}

fn default_memory() -> u64 {
    64
}

impl CheckOptions for JsOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        match (&self.script, &self.file) {
            (None, None) => errors.push(OptionError::at(
                &[],
                "give the script inline (`script:`) or in a file (`file:`)",
            )),
            (Some(_), Some(_)) => errors.push(OptionError::at(
                &["file"],
                "give either `script` or `file`, not both",
            )),
            _ => {}
        }
        if !(1..=60_000).contains(&self.timeout_ms) {
            errors.push(OptionError::at(
                &["timeout_ms"],
                format!("must be between 1 and 60000, got {}", self.timeout_ms),
            ));
        }
        if let Err(e) = logbus_plugin_api::flow::DeclaredFields::parse(&self.fields, "fields") {
            errors.extend(e);
        }
        if !(1..=4096).contains(&self.memory_limit_mb) {
            errors.push(OptionError::at(
                &["memory_limit_mb"],
                format!("must be between 1 and 4096, got {}", self.memory_limit_mb),
            ));
        }
        errors
    }
}

pub struct JsTransform;

impl JsOptions {
    /// The script's text and the option it came from (for error paths).
    fn source(&self, cx: &BuildContext) -> Result<(String, &'static str), OptionError> {
        match (&self.script, &self.file) {
            (Some(text), _) => Ok((text.clone(), "script")),
            (None, Some(file)) => {
                let path = cx.resolve(file);
                std::fs::read_to_string(&path)
                    .map(|text| (text, "file"))
                    .map_err(|e| {
                        OptionError::at(&["file"], format!("cannot read {}: {e}", path.display()))
                    })
            }
            (None, None) => Err(OptionError::at(&[], "no script")),
        }
    }
}

impl TypedPlugin for JsTransform {
    type Options = JsOptions;
    const NAME: &'static str = "js";
    const KIND: StageKind = StageKind::Transform;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str =
        "run a JavaScript process(event, ctx) per event (QuickJS, one runtime per worker)";

    /// A raw event reaches the script as `{message}`; without `fields:`
    /// the output is unknown.
    fn flow(&self, options: &JsOptions) -> logbus_plugin_api::Flow {
        use logbus_plugin_api::flow::DeclaredFields;
        let declared = DeclaredFields::parse(&options.fields, "fields").unwrap_or_default();
        if declared.is_empty() {
            return logbus_plugin_api::Flow::unknown(StageKind::Transform);
        }
        let mut flow = logbus_plugin_api::Flow::pass().then(logbus_plugin_api::Step::RawAsMessage);
        flow.steps.extend(declared.steps("fields"));
        flow
    }

    /// `logbus validate` compiles the script (without running it).
    fn check_in_context(&self, options: &JsOptions, cx: &BuildContext) -> Vec<OptionError> {
        match options.source(cx) {
            Ok((source, option)) => match syntax_check(&source) {
                Ok(()) => Vec::new(),
                Err(e) => vec![OptionError::at(&[option], e)],
            },
            Err(e) => vec![e],
        }
    }

    fn build(&self, options: JsOptions, cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        let (source, option) = options.source(cx)?;
        syntax_check(&source).map_err(|e| OptionError::at(&[option], e))?;
        let worker =
            JsWorker::new(&source, &options, cx).map_err(|e| OptionError::at(&[option], e))?;
        Ok(Box::new(worker))
    }
}

/// Compiles the script without running any of it (QuickJS's compile-only
/// evaluation of global code, strict as at run time), so `validate` can
/// neither hang nor act on what the script does. Reports `line:column` in
/// the script.
pub fn syntax_check(source: &str) -> Result<(), String> {
    let rt = Runtime::new().map_err(|e| e.to_string())?;
    rt.set_memory_limit(64 << 20);
    rt.set_max_stack_size(1 << 20);
    let context = Context::full(&rt).map_err(|e| e.to_string())?;
    context.with(|ctx| {
        compile_only(&ctx, source)
            .catch(&ctx)
            .map_err(|e| describe(e, "syntax error"))
    })
}

/// rquickjs has no public compile-only evaluation, so this calls QuickJS's
/// `JS_Eval` with `JS_EVAL_FLAG_COMPILE_ONLY` directly.
#[allow(unsafe_code)]
fn compile_only(ctx: &Ctx<'_>, source: &str) -> rquickjs::Result<()> {
    use rquickjs::qjs;
    let text = std::ffi::CString::new(source)?;
    let flags =
        qjs::JS_EVAL_TYPE_GLOBAL | qjs::JS_EVAL_FLAG_STRICT | qjs::JS_EVAL_FLAG_COMPILE_ONLY;
    // SAFETY: `ctx` is a live context for the duration of this call, `text`
    // is NUL-terminated and outlives it, and the length excludes the NUL as
    // JS_Eval requires. The returned value is owned by us: `from_raw` takes
    // that reference and frees it when dropped.
    let compiled = unsafe {
        let raw = qjs::JS_Eval(
            ctx.as_raw().as_ptr(),
            text.as_ptr(),
            source.len() as _,
            c"script".as_ptr(),
            flags as i32,
        );
        Value::from_raw(ctx.clone(), raw)
    };
    if compiled.is_exception() {
        return Err(rquickjs::Error::Exception);
    }
    Ok(())
}

/// "line N, column M: message" for an exception, as precisely as QuickJS
/// tells: the position comes from the error's stack trace (`<eval>:L:C`),
/// or from `lineNumber`/`columnNumber` where the engine sets them.
fn describe(error: CaughtError<'_>, what: &str) -> String {
    match error {
        CaughtError::Exception(e) => {
            let message = e.message().unwrap_or_default();
            let name = e
                .get::<_, String>("name")
                .unwrap_or_else(|_| "Error".to_string());
            let position = e
                .get::<_, i32>("lineNumber")
                .ok()
                .filter(|l| *l > 0)
                .map(|l| (l, e.get::<_, i32>("columnNumber").ok().filter(|c| *c > 0)))
                .or_else(|| e.stack().as_deref().and_then(stack_position));
            match position {
                Some((l, Some(c))) => {
                    format!("{what} at script line {l}, column {c}: {name}: {message}")
                }
                Some((l, None)) => format!("{what} at script line {l}: {name}: {message}"),
                None => format!("{what}: {name}: {message}"),
            }
        }
        CaughtError::Value(v) => format!("{what}: threw {}", display_value(&v)),
        CaughtError::Error(e) => format!("{what}: {e}"),
    }
}

/// The first `:line:column` (or `:line`) of a QuickJS stack trace.
fn stack_position(stack: &str) -> Option<(i32, Option<i32>)> {
    for frame in stack.lines() {
        let frame = frame.trim().trim_end_matches(')');
        let mut parts = frame.rsplit(':');
        let last = parts.next()?.parse::<i32>().ok();
        let before = parts.next().and_then(|p| p.parse::<i32>().ok());
        match (before, last) {
            (Some(l), Some(c)) => return Some((l, Some(c))),
            (None, Some(l)) => return Some((l, None)),
            _ => continue,
        }
    }
    None
}

fn display_value(v: &Value<'_>) -> String {
    v.get::<rquickjs::Coerced<String>>()
        .map(|s| s.0)
        .unwrap_or_else(|_| format!("{:?}", v.type_of()))
}

/// Nanoseconds on a process-wide monotonic clock.
fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// CPU time this thread has used, nanoseconds.
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The CPU budget of the call in progress. `timeout_ms` promises CPU time,
/// not wall time: on a loaded machine a call descheduled for a while must
/// not lose its event. Reading the thread's CPU clock is a system call (a
/// tenth of a short call's cost), so no call reads it at its start: the
/// first check of a call (the interrupt handler runs every few thousand
/// bytecodes; reading a result back checks too) takes the CPU clock as the
/// call's start, and the budget counts from there. A call is thus allowed
/// at most one check interval more than `timeout_ms`, and most calls end
/// before their first check and never read the clock. After that, each
/// check compares the cheap wall clock against a deadline; only once that
/// passes does it read the CPU clock, and then either stops the call or
/// moves the deadline to when the rest of the budget could at the earliest
/// be spent. (The handler runs on the thread executing the script, so the
/// thread's CPU clock is the script's.)
struct CallBudget {
    budget_ns: u64,
    /// The wall clock (`now_ns`) and the thread's CPU clock
    /// (`thread_cpu_ns`); tests give their own.
    wall: fn() -> u64,
    cpu: fn() -> u64,
    /// Wall-clock nanoseconds (`now_ns`) after which the CPU clock is read;
    /// 0 when no call is running.
    check_at: AtomicU64,
    /// The thread's CPU clock at the call's first check; 0 before it.
    cpu_start: AtomicU64,
    /// Whether the running call has been told to stop.
    tripped: AtomicBool,
}

impl CallBudget {
    fn new(budget: Duration) -> CallBudget {
        CallBudget::with_clocks(budget, now_ns, thread_cpu_ns)
    }

    fn with_clocks(budget: Duration, wall: fn() -> u64, cpu: fn() -> u64) -> CallBudget {
        CallBudget {
            budget_ns: budget.as_nanos() as u64,
            wall,
            cpu,
            check_at: AtomicU64::new(0),
            cpu_start: AtomicU64::new(0),
            tripped: AtomicBool::new(false),
        }
    }

    fn start(&self) {
        self.tripped.store(false, Ordering::Relaxed);
        self.cpu_start.store(0, Ordering::Relaxed);
        // Due at once: the first check starts the CPU clock.
        self.check_at.store(1, Ordering::Relaxed);
    }

    /// Ends the call; whether it ran out of budget.
    fn stop(&self) -> bool {
        self.check_at.store(0, Ordering::Relaxed);
        self.tripped.load(Ordering::Relaxed)
    }

    /// Whether the running call has spent its budget.
    fn spent(&self) -> bool {
        let check_at = self.check_at.load(Ordering::Relaxed);
        if check_at == 0 {
            return false;
        }
        let now = (self.wall)();
        if now <= check_at {
            return false;
        }
        let cpu_now = (self.cpu)();
        let cpu_start = self.cpu_start.load(Ordering::Relaxed);
        if cpu_start == 0 {
            self.cpu_start.store(cpu_now.max(1), Ordering::Relaxed);
            self.check_at.store(now + self.budget_ns, Ordering::Relaxed);
            return false;
        }
        let used = cpu_now.saturating_sub(cpu_start);
        if used >= self.budget_ns {
            self.tripped.store(true, Ordering::Relaxed);
            return true;
        }
        self.check_at
            .store(now + (self.budget_ns - used), Ordering::Relaxed);
        false
    }
}

/// `process`'s third argument: `{source, origin, ingest_ms, attributes}`
/// (origin and attributes absent when the source gave none).
fn meta_object<'js>(
    ctx: &Ctx<'js>,
    meta: &logbus_plugin_api::Meta,
) -> rquickjs::Result<Object<'js>> {
    let object = Object::new(ctx.clone())?;
    object.set("source", &*meta.source)?;
    object.set("ingest_ms", (meta.ingest_ns / 1_000_000) as f64)?;
    if let Some(origin) = &meta.origin {
        object.set("origin", &**origin)?;
    }
    if let Some(attributes) = &meta.attributes {
        object.set("attributes", object_to_js(ctx, attributes)?)?;
    }
    Ok(object)
}

/// What one event costs besides its fields (its allocation, metadata and
/// map), roughly: about what the HTTP source measures for a tiny event.
const EVENT_BYTES: usize = 256;

/// Where a worker keeps the script's `process` (as defined when the script
/// was loaded) and the `ctx` object it passes.
const HIDDEN_PROCESS: &str = "\u{1}logbus.process";
const HIDDEN_CTX: &str = "\u{1}logbus.ctx";

/// At most this many `ctx.log()` lines per second per worker; the rest are
/// counted and reported with the next line that gets through.
const LOG_PER_SECOND: u32 = 10;

struct LogLimiter {
    window: Instant,
    used: u32,
    suppressed: u64,
}

pub struct JsWorker {
    // Field order matters: the context must be dropped before the runtime.
    lazy: LazyEvents,
    context: Context,
    runtime: Runtime,
    budget: Arc<CallBudget>,
    /// Whether `process` declares a third parameter: only then is the
    /// event's metadata turned into an object for each call.
    wants_meta: bool,
    timeout: Duration,
    memory_limit: u64,
    /// `fields:`: what every emitted event must carry.
    declared: logbus_plugin_api::flow::DeclaredFields,
}

impl JsWorker {
    fn new(source: &str, options: &JsOptions, cx: &BuildContext) -> Result<JsWorker, String> {
        let runtime = Runtime::new().map_err(|e| format!("cannot start QuickJS: {e}"))?;
        runtime.set_memory_limit((options.memory_limit_mb as usize) << 20);
        runtime.set_max_stack_size(1 << 20);
        let timeout = Duration::from_millis(options.timeout_ms);
        let budget = Arc::new(CallBudget::new(timeout));
        {
            let budget = budget.clone();
            runtime.set_interrupt_handler(Some(Box::new(move || budget.spent())));
        }
        let context = Context::full(&runtime).map_err(|e| format!("cannot start QuickJS: {e}"))?;
        let stage: Arc<str> = cx.stage_id.as_str().into();
        let worker = cx.worker;
        let (lazy, wants_meta) = context.with(|ctx| -> Result<(LazyEvents, bool), String> {
            let cx_object = Object::new(ctx.clone()).map_err(|e| e.to_string())?;
            cx_object
                .set("stage", stage.as_ref())
                .map_err(|e| e.to_string())?;
            cx_object
                .set("worker", worker as i32)
                .map_err(|e| e.to_string())?;
            let limiter = std::sync::Mutex::new(LogLimiter {
                window: Instant::now(),
                used: 0,
                suppressed: 0,
            });
            let log_stage = stage.clone();
            let log = Function::new(ctx.clone(), move |message: rquickjs::Coerced<String>| {
                let mut limiter = limiter.lock().unwrap_or_else(|p| p.into_inner());
                if limiter.window.elapsed() >= Duration::from_secs(1) {
                    limiter.window = Instant::now();
                    limiter.used = 0;
                }
                if limiter.used >= LOG_PER_SECOND {
                    limiter.suppressed += 1;
                    return;
                }
                limiter.used += 1;
                let suppressed = std::mem::take(&mut limiter.suppressed);
                tracing::info!(stage = %log_stage, worker, suppressed, "script: {}", message.0);
            })
            .map_err(|e| e.to_string())?;
            cx_object.set("log", log).map_err(|e| e.to_string())?;

            // Taken before the script runs, so it cannot disguise them.
            let refused_kinds = [
                ("async function(){}", "an async function"),
                ("function*(){}", "a generator function"),
                ("async function*(){}", "an async generator function"),
            ]
            .map(|(example, name)| {
                ctx.eval::<Function, _>(format!("({example})"))
                    .ok()
                    .and_then(|f| f.as_object().and_then(Object::get_prototype))
                    .map(|proto| (proto.into_value(), name))
            });
            let timeout_ms = options.timeout_ms;
            let timed = |what: &str, outcome: Result<Value, CaughtError<'_>>| {
                let described = outcome.map(|_| ()).map_err(|e| describe(e, what));
                if budget.stop() {
                    return Err(format!("{what}: ran past timeout_ms ({timeout_ms} ms) and was stopped"));
                }
                described
            };
            budget.start();
            let evaluated = ctx.eval::<Value, _>(source).catch(&ctx);
            timed("evaluating the script failed", evaluated)?;
            let globals = ctx.globals();
            let process: Function = match globals.get::<_, Value>("process") {
                Ok(v) if v.is_function() => v.into_function().expect("is a function"),
                _ => return Err("the script defines no `process(event, ctx)` function".into()),
            };
            let wants_meta = process.get::<_, u32>("length").unwrap_or(0) >= 3;
            let prototype = process.as_object().and_then(Object::get_prototype);
            if let Some((_, kind)) = refused_kinds.iter().flatten().find(|(refused, _)| {
                prototype.as_ref().is_some_and(|p| p.as_value() == refused)
            }) {
                return Err(format!(
                    "`process` is {kind}; it must be a plain function that returns its result (async and generator functions are not supported)"
                ));
            }
            if let Ok(init) = globals.get::<_, Value>("init")
                && let Some(init) = init.into_function()
            {
                budget.start();
                let done = init.call::<_, Value>((cx_object.clone(),)).catch(&ctx);
                timed("init() failed", done)?;
            }
            // Kept on the global object under names no script uses by
            // accident (a script that goes looking only affects itself):
            // later reassigning `process` does not change what is called.
            globals
                .set(HIDDEN_PROCESS, process)
                .map_err(|e| e.to_string())?;
            globals
                .set(HIDDEN_CTX, cx_object)
                .map_err(|e| e.to_string())?;
            let lazy = LazyEvents::install(&ctx, (options.memory_limit_mb as usize) << 20)
                .map_err(|e| format!("cannot start QuickJS: {e}"))?;
            Ok((lazy, wants_meta))
        })?;
        Ok(JsWorker {
            lazy,
            wants_meta,
            context,
            runtime,
            budget,
            timeout,
            memory_limit: options.memory_limit_mb << 20,
            declared: logbus_plugin_api::flow::DeclaredFields::parse(&options.fields, "fields")
                .map_err(|e| e[0].message.clone())?,
        })
    }
}

impl Processor for JsWorker {
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        let outcome = self.context.with(|ctx| self.call(&ctx, event));
        let Err(error) = outcome else {
            return self.held_to_declaration(event, outcome);
        };
        // An exception may leave garbage behind.
        self.runtime.run_gc();
        // QuickJS reports a failed allocation by throwing plain `null` (it
        // has no memory left for an Error object): say what that means.
        if error.0.ends_with("threw null") || error.0.contains("out of memory") {
            return Err(EventError::new(format!(
                "process() ran out of memory (memory_limit_mb: {}); QuickJS said: {}",
                self.memory_limit >> 20,
                error.0
            )));
        }
        Err(error)
    }
}

impl JsWorker {
    /// What the script emitted, held to its `fields:` declaration.
    fn held_to_declaration(
        &self,
        event: &Event,
        outcome: Result<Verdict, EventError>,
    ) -> Result<Verdict, EventError> {
        if self.declared.is_empty() {
            return outcome;
        }
        match &outcome {
            Ok(Verdict::Keep) => self.declared.check(event)?,
            Ok(Verdict::Replace(events)) => {
                for (i, e) in events.iter().enumerate() {
                    self.declared.check(e).map_err(|err| {
                        EventError::new(format!("event {i} of the result: {err}"))
                    })?;
                }
            }
            _ => {}
        }
        outcome
    }

    /// One call of `process`, with the CPU budget armed from the call
    /// until its result is read back or its error described: getters,
    /// Proxy traps and `toString` run script code in both.
    fn call<'js>(&self, ctx: &Ctx<'js>, event: &mut Event) -> Result<Verdict, EventError> {
        // Lazy fields stay lazy: the event object parses only what the
        // script reads, and its edits are spliced in when the event is
        // written.
        if let Payload::Raw(bytes) = event.payload() {
            let mut map = Fields::new();
            map.insert(
                "message".into(),
                serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned()),
            );
            *event.payload_mut() = Payload::Fields(map);
        }
        let object = self
            .lazy
            .begin(ctx, event.detached())
            .map_err(|e| EventError::new(format!("passing the event to the script: {e}")))?;
        let spent = || self.budget.spent();
        let limits = ReadLimits::new(self.memory_limit as usize, &spent);
        self.budget.start();
        let outcome = self.call_and_read(ctx, event, &object, &limits);
        self.lazy.end(&object);
        // Whatever the outcome, the values the call held are let go.
        self.lazy.discard(ctx);
        if self.budget.stop() {
            return Err(EventError::new(format!(
                "process() ran past timeout_ms ({} ms) and was stopped",
                self.timeout.as_millis()
            )));
        }
        outcome
    }

    fn call_and_read<'js>(
        &self,
        ctx: &Ctx<'js>,
        event: &mut Event,
        object: &Value<'js>,
        limits: &ReadLimits<'_>,
    ) -> Result<Verdict, EventError> {
        let globals = ctx.globals();
        let process: Function = globals
            .get(HIDDEN_PROCESS)
            .map_err(|e| EventError::new(e.to_string()))?;
        let cx_object: Object = globals
            .get(HIDDEN_CTX)
            .map_err(|e| EventError::new(e.to_string()))?;
        let called = if self.wants_meta {
            let meta = meta_object(ctx, event.meta())
                .map_err(|e| EventError::new(format!("passing the metadata to the script: {e}")))?;
            process.call::<_, Value>((object.clone(), cx_object, meta))
        } else {
            process.call::<_, Value>((object.clone(), cx_object))
        };
        let result = called
            .catch(ctx)
            .map_err(|e| EventError::new(describe(e, "process() threw")))?;
        if result == *object {
            // The common case: the event came back. Let go of the event
            // object's reference to the event first, so the change does
            // not copy it.
            self.lazy.end(object);
            self.lazy
                .apply(ctx, object, event.payload_mut(), limits)
                .map_err(|e| EventError::new(e.0))?;
            return Ok(Verdict::Keep);
        }
        self.verdict(event, result, object, limits)
    }

    fn verdict<'js>(
        &self,
        event: &mut Event,
        result: Value<'js>,
        object: &Value<'js>,
        limits: &ReadLimits<'_>,
    ) -> Result<Verdict, EventError> {
        let walk = Walk {
            limits,
            event_object: Some(object),
            inside_event: false,
        };
        if result.is_null() || result.is_undefined() {
            return Ok(Verdict::Discard);
        }
        if let Some(array) = result.as_array() {
            // The length is the script's to choose: grow as items are read.
            let mut out = Vec::new();
            let items = array_items(array).map_err(|e| EventError::new(e.to_string()))?;
            for (i, item) in items.enumerate() {
                limits
                    .charge(EVENT_BYTES)
                    .map_err(|e| EventError::new(e.0))?;
                let item = item.map_err(|e| EventError::new(e.to_string()))?;
                let Some(object) = item
                    .as_object()
                    .filter(|_| !item.is_array() && !item.is_function() && !item.is_promise())
                else {
                    return Err(EventError::new(format!(
                        "process() returned an array whose item {i} is {}; expected objects",
                        type_name(&item)
                    )));
                };
                let fields = object_from_js(object, 0, walk).map_err(|e| EventError::new(e.0))?;
                out.push(Event::fields(fields, event.meta().clone()));
            }
            return Ok(Verdict::Replace(out));
        }
        match result.as_object() {
            Some(object) if !result.is_function() && !result.is_promise() => {
                let fields = object_from_js(object, 0, walk).map_err(|e| EventError::new(e.0))?;
                *event.payload_mut() = Payload::Fields(fields);
                Ok(Verdict::Keep)
            }
            _ => Err(EventError::new(format!(
                "process() returned {}; expected an object, null or an array of objects",
                type_name(&result)
            ))),
        }
    }
}

fn type_name(v: &Value<'_>) -> String {
    match v.type_of() {
        rquickjs::Type::Int | rquickjs::Type::Float => "a number".into(),
        rquickjs::Type::Undefined => "undefined".into(),
        rquickjs::Type::Null => "null".into(),
        rquickjs::Type::String => "a string".into(),
        rquickjs::Type::Bool => "a boolean".into(),
        rquickjs::Type::Function | rquickjs::Type::Constructor => "a function".into(),
        rquickjs::Type::Array => "an array".into(),
        rquickjs::Type::Promise => "a Promise (process() must not be async)".into(),
        other => format!("a {other:?}").to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Time off the CPU (here: asleep) does not count against the budget;
    /// time on it does.
    #[test]
    fn the_budget_counts_cpu_time_not_wall_time() {
        let budget = CallBudget::new(Duration::from_millis(20));
        assert!(!budget.spent(), "no call running");
        budget.start();
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !budget.spent(),
            "a call that slept five budgets long used almost no CPU"
        );
        let began = Instant::now();
        let mut x = 0u64;
        while !budget.spent() {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            assert!(
                began.elapsed() < Duration::from_secs(120),
                "20 ms of CPU never counted"
            );
        }
        budget.stop();
        assert!(!budget.spent(), "stopped");
    }

    /// Every value a call holds is let go, whatever the call does (returns
    /// its event, another object, the event inside others, throws, fails
    /// to be read back): objects left over from many calls would be found
    /// in the heap's count, a leaked reference keeps one alive for ever.
    #[test]
    fn calls_leave_nothing_behind_in_the_heap() {
        let script = r#"
            function process(e) {
              const nested = e.user; nested.seen = true; const level = e.level;
              e.added = { n: e.n }; delete e.pad; delete e.added; e.added = [level];
              switch (e.n % 6) {
                case 0: return e;
                case 1: return { copy: { ...e }, level };
                case 2: throw new Error("no");
                case 3: return [e, { n: e.n }];
                case 4: e.self = e; return e;
                default: return null;
              }
            }
        "#;
        let options = JsOptions {
            script: Some(script.into()),
            file: None,
            timeout_ms: 1000,
            memory_limit_mb: 64,
            fields: Default::default(),
        };
        let cx = BuildContext {
            stage_id: "leak".into(),
            base_dir: ".".into(),
            worker: 0,
        };
        let mut worker = JsWorker::new(script, &options, &cx).unwrap();
        let run = |worker: &mut JsWorker, calls: u64| {
            let mut outcomes = [0u64; 2];
            for n in 0..calls {
                let fields =
                    serde_json::json!({"n": n, "level": "info", "user": {"id": n}, "pad": "x"});
                let mut event = Event::fields(
                    fields.as_object().unwrap().clone(),
                    logbus_plugin_api::Meta::at("t", 1),
                );
                outcomes[usize::from(worker.process(&mut event).is_ok())] += 1;
            }
            worker.runtime.run_gc();
            (worker.runtime.memory_usage().obj_count, outcomes)
        };
        let (objects_before, _) = run(&mut worker, 60);
        let (objects_after, outcomes) = run(&mut worker, 3000);
        assert_eq!(outcomes, [1000, 2000], "errors and successes both ran");
        assert!(
            objects_after <= objects_before,
            "{objects_before} objects after 60 calls, {objects_after} after 3060"
        );
    }

    /// `fields:`: each emitted event is held to the declaration; the flow
    /// is the input plus the declared fields, a raw input as `message`.
    #[test]
    fn declared_fields_are_held_to_and_stated() {
        let script = r#"
            function process(e) {
              if (e.message === "skip") return e;
              if (e.message === "two") return [{ took: 1 }, { took: "x" }];
              e.took = e.message.length;
              return e;
            }
        "#;
        let options = JsOptions {
            script: Some(script.into()),
            file: None,
            timeout_ms: 1000,
            memory_limit_mb: 64,
            fields: [("took".to_string(), "number".to_string())].into(),
        };
        let cx = BuildContext {
            stage_id: "js".into(),
            base_dir: ".".into(),
            worker: 0,
        };
        let mut worker = JsWorker::new(script, &options, &cx).unwrap();
        let raw = |text: &'static str| {
            Event::raw(
                logbus_plugin_api::Bytes::from_static(text.as_bytes()),
                logbus_plugin_api::Meta::at("t", 1),
            )
        };
        assert!(worker.process(&mut raw("hello")).is_ok());
        let e = worker.process(&mut raw("skip")).unwrap_err();
        assert_eq!(e.0, "declared field `took` is missing");
        let e = worker.process(&mut raw("two")).unwrap_err();
        assert_eq!(
            e.0,
            "event 1 of the result: declared field `took` should be a number, got a string"
        );
        let flow = JsTransform.flow(&options);
        assert_eq!(flow.steps[0], logbus_plugin_api::Step::RawAsMessage);
        assert_eq!(flow.steps.len(), 2);
        let unknown = JsTransform.flow(&JsOptions {
            fields: Default::default(),
            ..options
        });
        assert_eq!(unknown.steps, [logbus_plugin_api::Step::Opaque]);
    }

    /// The first frame with a position gives it, with or without a column.
    #[test]
    fn a_stack_trace_gives_the_first_position_it_has() {
        assert_eq!(
            stack_position("    at process (<eval>:3:11)\n    at <eval> (<eval>:9:1)"),
            Some((3, Some(11)))
        );
        assert_eq!(
            stack_position("    at f (native)\n    at process (script:12)"),
            Some((12, None))
        );
        assert_eq!(stack_position("    at f (native)"), None);
        assert_eq!(stack_position(""), None);
    }

    /// The thread's CPU clock, in nanoseconds: a fresh thread has used
    /// less than a second, and some after spinning.
    #[test]
    fn the_thread_cpu_clock_reads_nanoseconds() {
        let (start, spun) = std::thread::spawn(|| {
            let start = thread_cpu_ns();
            let began = Instant::now();
            let mut x = 0u64;
            while began.elapsed() < Duration::from_millis(30) {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            (start, thread_cpu_ns())
        })
        .join()
        .unwrap();
        assert!(start < 1_000_000_000, "a fresh thread at {start} ns");
        assert!(spun > start, "{start} then {spun}");
        assert!(spun < 1_000_000_000, "30 ms of spinning read as {spun} ns");
    }

    thread_local! {
        static WALL: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
        static CPU: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
        static CPU_READS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }

    /// The budget on clocks the test moves: the CPU clock is read only at
    /// the first check and once the wall-clock deadline passes; time off
    /// the CPU moves the deadline by what is left; CPU time before the
    /// call does not count.
    #[test]
    fn the_budget_reads_the_cpu_clock_only_when_the_deadline_passes() {
        let (wall, cpu) = (
            || WALL.get(),
            || {
                CPU_READS.set(CPU_READS.get() + 1);
                CPU.get()
            },
        );
        // Sets the clocks; how many times the CPU clock was read so far.
        let at = |w: u64, c: u64| {
            WALL.set(w);
            CPU.set(c);
        };
        let reads = || CPU_READS.get();
        let ms = 1_000_000;
        let budget = CallBudget::with_clocks(Duration::from_millis(20), wall, cpu);
        // 500 ms of CPU before the call: none of it counts.
        at(1_000 * ms, 500 * ms);
        budget.start();
        assert!(!budget.spent(), "the first check starts the CPU clock");
        assert_eq!(reads(), 1);
        // Deadline: 20 ms of wall time from the first check.
        at(1_019 * ms, 519 * ms);
        assert!(!budget.spent(), "before the deadline");
        assert_eq!(reads(), 1, "no read before the deadline");
        // Off the CPU for most of it: 5 ms used, so the deadline moves
        // to 15 ms from now.
        at(1_030 * ms, 505 * ms);
        assert!(!budget.spent(), "5 ms of CPU used");
        assert_eq!(reads(), 2);
        at(1_044 * ms, 519 * ms);
        assert!(!budget.spent(), "before the moved deadline (1,045 ms)");
        assert_eq!(reads(), 2, "no read before the moved deadline");
        at(1_045 * ms + 1, 520 * ms);
        assert!(budget.spent(), "20 ms of CPU used");
        assert_eq!(reads(), 3);
        assert!(budget.stop(), "the call ran out");
        // A new call starts afresh.
        budget.start();
        assert!(!budget.spent());
        assert!(!budget.stop());
    }
}
