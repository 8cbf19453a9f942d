//! The traits a plugin implements and the context the engine hands it.
//!
//! A plugin never creates its own channels: the engine gives a source its
//! [`Output`], a sink its input [`Receiver`], and runs processors (parsers,
//! transforms, formatters) itself, so backpressure, counting and error
//! routing are the same for every plugin.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::channel::Receiver;
use crate::connect::{ConnectContext, Probe};
use crate::event::Event;
use crate::flow::Flow;
use crate::host::StatedNeed;
use crate::metrics::StageMetrics;
use crate::options::{CheckOptions, OptionError, checked_options, options_schema, parse_all};
use crate::output::Output;

/// The five kinds of stage; the config key that names the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StageKind {
    Source,
    Parser,
    Transform,
    Formatter,
    Sink,
}

impl StageKind {
    pub const ALL: [StageKind; 5] = [
        StageKind::Source,
        StageKind::Parser,
        StageKind::Transform,
        StageKind::Formatter,
        StageKind::Sink,
    ];

    pub fn key(self) -> &'static str {
        match self {
            StageKind::Source => "source",
            StageKind::Parser => "parser",
            StageKind::Transform => "transform",
            StageKind::Formatter => "formatter",
            StageKind::Sink => "sink",
        }
    }

    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.key() == key)
    }

    /// What a stage of this kind builds into: parsers, transforms and
    /// formatters are all processors.
    pub const fn built_as(self) -> BuiltAs {
        match self {
            StageKind::Source => BuiltAs::Source,
            StageKind::Parser | StageKind::Transform | StageKind::Formatter => BuiltAs::Processor,
            StageKind::Sink => BuiltAs::Sink,
        }
    }

    /// Parsers, transforms and formatters: one event in, zero or more out.
    pub fn is_processor(self) -> bool {
        matches!(
            self,
            StageKind::Parser | StageKind::Transform | StageKind::Formatter
        )
    }
}

impl fmt::Display for StageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.key())
    }
}

/// A stage failed at run time.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("downstream stopped before the stage finished")]
    OutputClosed,
    #[error("{0}")]
    Other(String),
}

impl StageError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        StageError::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<crate::channel::SendError> for StageError {
    fn from(_: crate::channel::SendError) -> Self {
        StageError::OutputClosed
    }
}

/// One event could not be processed. Handled by the stage's `on_error`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct EventError(pub String);

impl EventError {
    pub fn new(message: impl Into<String>) -> Self {
        EventError(message.into())
    }
}

/// The text a panic carried (`panic!` with a literal or a formatted
/// message), for turning a caught panic into an error that says what
/// happened.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// What a processor did with one event.
#[derive(Debug)]
pub enum Verdict {
    /// Forward the (possibly modified) event.
    Keep,
    /// Drop it on purpose (counted as discarded).
    Discard,
    /// Forward these events instead (zero or more; a split).
    Replace(Vec<Event>),
    /// Send the event to these of the stage's named outputs
    /// ([`Plugin::outputs`]), a copy to each; none is a discard. A stage
    /// with named outputs sends nothing on its main output.
    To(OutputSet),
}

/// Some of a stage's named outputs, by their index in
/// [`Plugin::outputs`] (at most [`OutputSet::MAX`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputSet(u64);

impl OutputSet {
    /// The most named outputs a stage may have.
    pub const MAX: usize = 64;

    /// Adds output `index` (< [`OutputSet::MAX`]).
    pub fn insert(&mut self, index: usize) {
        debug_assert!(index < Self::MAX);
        self.0 |= 1 << index;
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The indices, lowest first.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        let mut bits = self.0;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let i = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                i
            })
        })
    }
}

/// Parsers, transforms and formatters. Runs synchronously on a batch at a
/// time inside the engine's stage loop.
///
/// On error, leave the event as received: with `on_error: route` it is
/// forwarded, with the error attached, to `<id>.errors`.
pub trait Processor: Send + 'static {
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError>;

    /// Called once after the input has ended; may emit held-back events.
    fn finish(&mut self) -> Vec<Event> {
        Vec::new()
    }
}

/// What a source gets from the engine.
pub struct SourceContext {
    pub id: Arc<str>,
    pub output: Output,
    /// Cancelled on SIGINT/SIGTERM or when another stage fails: stop reading,
    /// send what was already read, return.
    pub shutdown: CancellationToken,
}

#[async_trait]
pub trait Source: Send + 'static {
    /// Reads until end of input or shutdown. Everything read must be sent
    /// before returning.
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError>;
}

/// What a sink gets from the engine.
pub struct SinkContext {
    pub id: Arc<str>,
    pub input: Receiver,
    pub metrics: Arc<StageMetrics>,
    /// `<id>.dead`: where events the destination refused for good, or
    /// that ran out of retries, go when a stage reads it. Check
    /// [`Output::is_connected`] first: unread, the sink's own policy
    /// (fail or drop) applies.
    pub dead: Output,
    /// Cancelled when the drain deadline of a shutdown has passed: a sink
    /// still retrying gives up, settles what it holds as errored (a
    /// checkpointing source sends those again after a restart) and returns
    /// an error that says how many events it held.
    pub stop: CancellationToken,
    /// Cancelled when a shutdown is requested. A sink that holds events
    /// until some limit is reached (an open object, a file to roll)
    /// finishes them now instead of at the end of its input: upstream
    /// sources wait for their events' acknowledgements before they end,
    /// and the input ends only once they have.
    pub shutdown: CancellationToken,
}

impl SinkContext {
    /// A context with no dead-letter reader and no drain deadline (tests,
    /// and stages started outside the engine).
    pub fn new(id: impl Into<Arc<str>>, input: Receiver, metrics: Arc<StageMetrics>) -> Self {
        let dead = Output::new(Vec::new(), metrics.clone(), crate::OutputRole::Errors);
        SinkContext {
            id: id.into(),
            input,
            metrics,
            dead,
            stop: CancellationToken::new(),
            shutdown: CancellationToken::new(),
        }
    }

    /// Records `n` events as durably handed to the destination.
    pub fn committed(&self, n: usize) {
        self.metrics.add_out(n as u64);
    }
}

#[async_trait]
pub trait Sink: Send + 'static {
    /// Consumes the input until it ends. Call [`SinkContext::committed`] for
    /// every event written, and drop each input batch only after its events
    /// are written: that is what keeps the in-flight bound.
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError>;
}

/// A built stage, ready to be wired.
pub enum Built {
    Source(Box<dyn Source>),
    Processor(Box<dyn Processor>),
    Sink(Box<dyn Sink>),
}

impl Built {
    pub fn built_as(&self) -> BuiltAs {
        match self {
            Built::Source(_) => BuiltAs::Source,
            Built::Processor(_) => BuiltAs::Processor,
            Built::Sink(_) => BuiltAs::Sink,
        }
    }
}

/// The three things a stage builds into (see [`StageKind::built_as`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltAs {
    Source,
    Processor,
    Sink,
}

/// The stage a [`TypedPlugin`] builds: `Box<dyn Source>`,
/// `Box<dyn Processor>` or `Box<dyn Sink>`. Its [`BuiltAs`] must be the
/// one of the plugin's `KIND`, or the plugin does not compile once it is
/// wrapped in [`Typed`]:
///
/// ```
/// use logbus_plugin_api::*;
/// struct Out;
/// impl TypedPlugin for Out {
///     type Options = NoOptions;
///     const NAME: &'static str = "out";
///     const KIND: StageKind = StageKind::Sink;
///     type Stage = Box<dyn Sink>;
///     const DESCRIPTION: &'static str = "a sink that builds a sink";
///     fn build(&self, _: NoOptions, _: &BuildContext) -> Result<Self::Stage, OptionError> {
///         Err(OptionError::at(&[], "not needed here"))
///     }
/// }
/// let mut registry = Registry::new();
/// registry.add(Typed(Out));
/// ```
///
/// and the same plugin declaring a sink but building a source:
///
/// ```compile_fail
/// use logbus_plugin_api::*;
/// struct Out;
/// impl TypedPlugin for Out {
///     type Options = NoOptions;
///     const NAME: &'static str = "out";
///     const KIND: StageKind = StageKind::Sink;
///     type Stage = Box<dyn Source>;
///     const DESCRIPTION: &'static str = "a sink that builds a source";
///     fn build(&self, _: NoOptions, _: &BuildContext) -> Result<Self::Stage, OptionError> {
///         Err(OptionError::at(&[], "not needed here"))
///     }
/// }
/// let mut registry = Registry::new();
/// registry.add(Typed(Out));
/// ```
pub trait BuiltStage: Send + 'static {
    const BUILT_AS: BuiltAs;
    fn into_built(self) -> Built;
}

impl BuiltStage for Box<dyn Source> {
    const BUILT_AS: BuiltAs = BuiltAs::Source;
    fn into_built(self) -> Built {
        Built::Source(self)
    }
}

impl BuiltStage for Box<dyn Processor> {
    const BUILT_AS: BuiltAs = BuiltAs::Processor;
    fn into_built(self) -> Built {
        Built::Processor(self)
    }
}

impl BuiltStage for Box<dyn Sink> {
    const BUILT_AS: BuiltAs = BuiltAs::Sink;
    fn into_built(self) -> Built {
        Built::Sink(self)
    }
}

/// Where the plugin is being built.
#[derive(Debug, Clone)]
pub struct BuildContext {
    pub stage_id: String,
    /// Directory of the pipeline file; relative paths resolve against it.
    pub base_dir: PathBuf,
    /// Which instance of the stage this is (0 for the first worker, and
    /// during validation).
    pub worker: usize,
}

impl BuildContext {
    pub fn resolve(&self, path: &std::path::Path) -> PathBuf {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }
}

/// A plugin factory, as the registry holds it.
pub trait Plugin: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn kind(&self) -> StageKind;
    fn description(&self) -> &'static str;
    /// JSON Schema of the options, generated from the typed option struct.
    fn options_schema(&self) -> Value;
    /// How many stages of one pipeline may use this plugin (`Some(1)` for a
    /// process-wide resource such as standard input); `None` for no limit.
    fn max_per_pipeline(&self) -> Option<usize> {
        None
    }
    /// Sources: how this source learns that its events were delivered, in
    /// a sentence, or `None` when it cannot (what is in flight when the
    /// process dies is then lost). Shown by `logbus plugins`.
    fn acknowledgements(&self) -> Option<&'static str> {
        None
    }
    /// The stage's named outputs (read as `<id>.<name>`), in the order
    /// [`Verdict::To`] indexes them, as these options declare them; none
    /// (the default) for a stage with one main output. Options that do not
    /// parse declare none (their errors come from [`Plugin::check`]).
    fn outputs(&self, _options: &Value) -> Vec<String> {
        Vec::new()
    }
    /// What the stage needs from its input and does to the events'
    /// fields, as these options say ([`crate::flow`]); options that do not
    /// parse state nothing ([`Flow::unknown`]).
    fn flow(&self, _options: &Value) -> Flow {
        Flow::unknown(self.kind())
    }
    /// What the stage needs from the host (files, directories, ports), as
    /// these options say ([`crate::host`]); checked by `validate
    /// --preflight`, never at plain validation.
    fn host_needs(&self, _options: &Value, _cx: &BuildContext) -> Vec<StatedNeed> {
        Vec::new()
    }
    /// A read-only probe of the service these options name (its address,
    /// credentials, topic, bucket, table), for `validate --connect`
    /// ([`crate::connect`]); `None` (the default) for a stage with no
    /// service, or options that do not parse.
    fn connect(&self, _options: &Value, _cx: ConnectContext) -> Option<Probe> {
        None
    }
    /// Checks options without doing any I/O.
    fn check(&self, options: &Value, cx: &BuildContext) -> Vec<OptionError>;
    fn build(&self, options: &Value, cx: &BuildContext) -> Result<Built, Vec<OptionError>>;
}

/// Implement this with a typed option struct and wrap it in [`Typed`] to get
/// a [`Plugin`]: unknown keys, types, required options and ranges are then
/// checked the same way for every plugin.
pub trait TypedPlugin: Send + Sync + 'static {
    type Options: DeserializeOwned + schemars::JsonSchema + CheckOptions;
    const NAME: &'static str;
    const KIND: StageKind;
    /// `Box<dyn Source>`, `Box<dyn Processor>` or `Box<dyn Sink>`, as
    /// `KIND` says (checked when the plugin compiles).
    type Stage: BuiltStage;
    const DESCRIPTION: &'static str;
    /// See [`Plugin::max_per_pipeline`].
    const MAX_PER_PIPELINE: Option<usize> = None;
    /// See [`Plugin::acknowledgements`].
    const ACKNOWLEDGEMENTS: Option<&'static str> = None;

    fn build(&self, options: Self::Options, cx: &BuildContext) -> Result<Self::Stage, OptionError>;

    /// Checks that need the pipeline's location (e.g. compiling a script
    /// file), run by validation after the options parsed and passed
    /// [`CheckOptions::check`]. No side effects.
    fn check_in_context(&self, _options: &Self::Options, _cx: &BuildContext) -> Vec<OptionError> {
        Vec::new()
    }

    /// See [`Plugin::outputs`].
    fn outputs(&self, _options: &Self::Options) -> Vec<String> {
        Vec::new()
    }

    /// See [`Plugin::flow`]. The default states nothing, which hides
    /// nothing downstream ([`Flow::unknown`]).
    fn flow(&self, _options: &Self::Options) -> Flow {
        Flow::unknown(Self::KIND)
    }

    /// See [`Plugin::host_needs`]. Paths are resolved with
    /// [`BuildContext::resolve`].
    fn host_needs(&self, _options: &Self::Options, _cx: &BuildContext) -> Vec<StatedNeed> {
        Vec::new()
    }

    /// See [`Plugin::connect`]; called only for options that passed every
    /// check.
    fn connect(&self, _options: &Self::Options, _cx: ConnectContext) -> Option<Probe> {
        None
    }
}

/// Adapter from [`TypedPlugin`] to [`Plugin`].
pub struct Typed<T>(pub T);

impl<T: TypedPlugin> Typed<T> {
    /// Fails to compile (when the plugin is wrapped) where `KIND` and the
    /// stage `build` returns disagree, rather than at run time.
    const KIND_FITS_STAGE: () = assert!(
        T::KIND.built_as() as u8 == <T::Stage as BuiltStage>::BUILT_AS as u8,
        "a TypedPlugin's KIND does not match the stage its build returns"
    );
}

impl<T: TypedPlugin> Plugin for Typed<T> {
    fn name(&self) -> &'static str {
        T::NAME
    }
    fn kind(&self) -> StageKind {
        let () = Self::KIND_FITS_STAGE;
        T::KIND
    }
    fn description(&self) -> &'static str {
        T::DESCRIPTION
    }
    fn options_schema(&self) -> Value {
        (*options_schema::<T::Options>()).clone()
    }
    fn max_per_pipeline(&self) -> Option<usize> {
        T::MAX_PER_PIPELINE
    }
    fn acknowledgements(&self) -> Option<&'static str> {
        T::ACKNOWLEDGEMENTS
    }
    fn outputs(&self, options: &Value) -> Vec<String> {
        match parse_all::<T::Options>(options, &options_schema::<T::Options>()) {
            (Some(opts), _) => self.0.outputs(&opts),
            (None, _) => Vec::new(),
        }
    }
    fn flow(&self, options: &Value) -> Flow {
        match parse_all::<T::Options>(options, &options_schema::<T::Options>()) {
            (Some(opts), _) => self.0.flow(&opts),
            (None, _) => Flow::unknown(T::KIND),
        }
    }
    fn host_needs(&self, options: &Value, cx: &BuildContext) -> Vec<StatedNeed> {
        match parse_all::<T::Options>(options, &options_schema::<T::Options>()) {
            (Some(opts), _) => self.0.host_needs(&opts, cx),
            (None, _) => Vec::new(),
        }
    }
    fn connect(&self, options: &Value, cx: ConnectContext) -> Option<Probe> {
        let opts = checked_options::<T::Options>(options, &options_schema::<T::Options>()).ok()?;
        self.0.connect(&opts, cx)
    }
    fn check(&self, options: &Value, cx: &BuildContext) -> Vec<OptionError> {
        match checked_options::<T::Options>(options, &options_schema::<T::Options>()) {
            Ok(opts) => self.0.check_in_context(&opts, cx),
            Err(errors) => errors,
        }
    }
    fn build(&self, options: &Value, cx: &BuildContext) -> Result<Built, Vec<OptionError>> {
        let () = Self::KIND_FITS_STAGE;
        let opts = checked_options::<T::Options>(options, &options_schema::<T::Options>())?;
        self.0
            .build(opts, cx)
            .map(BuiltStage::into_built)
            .map_err(|e| vec![e])
    }
}

/// Stateless processors can be plain closures.
impl<F> Processor for F
where
    F: FnMut(&mut Event) -> Result<Verdict, EventError> + Send + 'static,
{
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        self(event)
    }
}

/// Marks `event` as failed at `stage`, for a stage's `<id>.errors` or a
/// sink's `<id>.dead`: the reason goes into an `_error` field
/// (`{stage, message}`); a raw event becomes `{message: <its text>}` first.
pub fn attach_error(mut event: Event, stage: &str, message: &str) -> Event {
    let info = serde_json::json!({ "stage": stage, "message": message });
    let payload = event.payload_mut();
    payload.materialize();
    if let crate::Payload::Raw(bytes) = payload {
        let mut f = crate::Fields::new();
        f.insert(
            "message".into(),
            Value::String(String::from_utf8_lossy(bytes).into_owned()),
        );
        *payload = crate::Payload::Fields(f);
    }
    if let crate::Payload::Fields(f) = payload {
        f.insert("_error".into(), info);
    }
    event
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{NoOptions, parse_options, plain_words, stand_in};

    #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Ranged {
        #[schemars(range(min = 1, max = 64))]
        #[serde(default)]
        in_flight: u32,
        #[schemars(range(min = 1, max = 9))]
        level: Option<u32>,
        #[schemars(range(max = 600000))]
        #[serde(default)]
        timeout_ms: u64,
        #[schemars(range(min = 0.5))]
        #[serde(default)]
        ratio: f64,
        #[serde(default)]
        name: String,
    }

    fn errors(options: Value) -> Vec<String> {
        let schema = schemars::schema_for!(Ranged).to_value();
        match parse_options::<Ranged>(&options, &schema) {
            Ok(_) => Vec::new(),
            Err(e) => e
                .iter()
                .map(|e| format!("{}: {}", e.path.join("."), e.message))
                .collect(),
        }
    }

    #[test]
    fn declared_ranges_are_checked_at_each_bound() {
        let ok =
            serde_json::json!({"in_flight": 1, "level": 9, "timeout_ms": 600000, "ratio": 0.5});
        let schema = schemars::schema_for!(Ranged).to_value();
        let parsed = parse_options::<Ranged>(&ok, &schema).expect("in range at every bound");
        assert_eq!(
            (
                parsed.in_flight,
                parsed.level,
                parsed.timeout_ms,
                parsed.ratio
            ),
            (1, Some(9), 600000, 0.5)
        );
        assert_eq!(
            errors(serde_json::json!({"in_flight": 0})),
            ["in_flight: must be between 1 and 64, got 0"]
        );
        assert_eq!(
            errors(serde_json::json!({"in_flight": 65, "level": 10})),
            [
                "in_flight: must be between 1 and 64, got 65",
                "level: must be between 1 and 9, got 10"
            ]
        );
        assert_eq!(
            errors(serde_json::json!({"timeout_ms": 600001})),
            ["timeout_ms: must be between 0 and 600000, got 600001"]
        );
        assert_eq!(
            errors(serde_json::json!({"ratio": 0.25})),
            ["ratio: must be at least 0.5, got 0.25"]
        );
        // A negative count is out of range, said once (not a type error too).
        assert_eq!(
            errors(serde_json::json!({"timeout_ms": -1})),
            ["timeout_ms: must be between 0 and 600000, got -1"]
        );
        // Not a number: the type error, as before.
        assert_eq!(errors(serde_json::json!({"in_flight": "x"})).len(), 1);
        // Unknown keys and a range error are both reported.
        assert_eq!(
            errors(serde_json::json!({"in_fligth": 2, "level": 0})).len(),
            2
        );
    }

    /// Options of a shared block a plugin flattens into its own (the
    /// sink core's `Retrying`) are named as if they were its own.
    #[test]
    fn type_errors_in_a_flattened_block_name_the_option() {
        #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
        #[allow(dead_code)]
        struct Shared {
            #[serde(default)]
            backoff_ms: u64,
            #[serde(default)]
            attempts: Option<u32>,
        }
        #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Own {
            url: String,
            #[serde(flatten)]
            shared: Shared,
        }
        let schema = schemars::schema_for!(Own).to_value();
        let errors = |v: Value| match parse_options::<Own>(&v, &schema) {
            Ok(_) => Vec::new(),
            Err(e) => e
                .iter()
                .map(|e| format!("{}: {}", e.path.join("."), e.message))
                .collect::<Vec<_>>(),
        };
        assert_eq!(
            errors(serde_json::json!({"url": "u", "backoff_ms": "soon", "attempts": -1})),
            [
                "attempts: must be at least 0, got -1",
                "backoff_ms: expected a whole number, 0 or more, got the string \"soon\"",
            ]
        );
        assert_eq!(
            errors(serde_json::json!({"url": 1, "attempts": "x"})),
            [
                "url: expected a string, got the number 1",
                "attempts: expected a whole number, 0 or more, got the string \"x\"",
            ]
        );
        assert!(errors(serde_json::json!({"url": "u", "attempts": 3})).is_empty());
    }

    #[test]
    fn every_type_error_is_reported_in_plain_words() {
        #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Many {
            path: String,
            count: u64,
            ratio: f64,
            on: bool,
            names: Vec<String>,
            #[serde(default)]
            #[schemars(range(min = 1))]
            size: Option<u32>,
        }
        let schema = schemars::schema_for!(Many).to_value();
        let errors = |v: Value| match parse_options::<Many>(&v, &schema) {
            Ok(_) => Vec::new(),
            Err(e) => e
                .iter()
                .map(|e| format!("{}: {}", e.path.join("."), e.message))
                .collect::<Vec<_>>(),
        };
        assert_eq!(
            errors(serde_json::json!({
                "path": ["a"], "count": "x", "ratio": true, "on": "yes", "names": "n", "size": 0
            })),
            [
                "size: must be at least 1, got 0",
                "path: expected a string, got a list",
                "count: expected a whole number, 0 or more, got the string \"x\"",
                "ratio: expected a number, got true",
                "on: expected true or false, got the string \"yes\"",
                "names: expected a list of strings, got the string \"n\"",
            ]
        );
        // Inside a list: serde's words, translated.
        assert_eq!(
            errors(
                serde_json::json!({"path": "p", "count": 1, "ratio": 1, "on": true, "names": ["a", 2]})
            ),
            ["names.1: expected a string, got the number 2"]
        );
        // A required option after a type error is not also "missing".
        assert_eq!(
            errors(serde_json::json!({"path": 1})),
            [
                "path: expected a string, got the number 1",
                "count: missing field `count`"
            ]
            .map(|s| s.replace("count: ", ": "))
        );
        assert_eq!(
            plain_words("invalid type: null, expected f64", None),
            "expected a number, got nothing (null)"
        );
        assert_eq!(
            plain_words("invalid value: integer `-1`, expected usize", None),
            "expected a whole number, 0 or more, got the number -1"
        );
        assert_eq!(
            plain_words("unknown variant `x`", None),
            "unknown variant `x`"
        );
        assert_eq!(
            stand_in(&serde_json::json!({"type": "integer", "minimum": 3})),
            Some(3.into())
        );
        assert_eq!(
            stand_in(&serde_json::json!({"type": ["string", "null"]})),
            Some("".into())
        );
        assert_eq!(stand_in(&serde_json::json!({"$ref": "#/x"})), None);
    }

    #[test]
    fn stage_kinds_round_trip_through_their_keys() {
        for kind in StageKind::ALL {
            assert_eq!(StageKind::from_key(kind.key()), Some(kind));
            assert_eq!(kind.to_string(), kind.key());
        }
        assert_eq!(
            StageKind::ALL.map(StageKind::key),
            ["source", "parser", "transform", "formatter", "sink"]
        );
        assert_eq!(StageKind::from_key("filter"), None);
        assert_eq!(
            StageKind::ALL.map(StageKind::is_processor),
            [false, true, true, true, false]
        );
        // Display pads, so the kind lines up in tables.
        assert_eq!(format!("[{:>6}]", StageKind::Sink), "[  sink]");
    }

    #[test]
    fn stage_errors_say_what_failed_and_why() {
        let e = StageError::io("opening out.log", std::io::Error::other("no space"));
        assert_eq!(e.to_string(), "opening out.log: no space");
        assert_eq!(
            std::error::Error::source(&e).unwrap().to_string(),
            "no space"
        );
        let closed: StageError = crate::channel::SendError(Vec::new()).into();
        assert!(matches!(closed, StageError::OutputClosed), "{closed:?}");
        assert_eq!(EventError::new("bad level").to_string(), "bad level");
    }

    #[test]
    fn a_panic_message_is_read_from_either_payload() {
        let payload = |f: fn()| std::panic::catch_unwind(f).unwrap_err();
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let literal = payload(|| panic!("a literal"));
        let formatted = payload(|| panic!("formatted {}", 7));
        let other = payload(|| std::panic::panic_any(7_u8));
        std::panic::set_hook(hook);
        assert_eq!(panic_message(&*literal), "a literal");
        assert_eq!(panic_message(&*formatted), "formatted 7");
        assert_eq!(panic_message(&*other), "a panic without a message");
    }

    #[test]
    fn an_output_set_lists_its_indices_lowest_first() {
        let mut set = OutputSet::default();
        assert!(set.is_empty());
        assert_eq!((set.len(), set.iter().count()), (0, 0));
        for i in [63, 5, 0, 5] {
            set.insert(i);
        }
        assert!(!set.is_empty());
        assert_eq!(set.len(), 3);
        assert_eq!(set.iter().collect::<Vec<_>>(), [0, 5, 63]);
    }

    #[test]
    fn relative_paths_resolve_against_the_pipeline_folder() {
        let cx = BuildContext {
            stage_id: "s".into(),
            base_dir: "/etc/logbus".into(),
            worker: 0,
        };
        assert_eq!(
            cx.resolve(std::path::Path::new("state")),
            std::path::Path::new("/etc/logbus/state")
        );
        assert_eq!(
            cx.resolve(std::path::Path::new("/var/lib/x")),
            std::path::Path::new("/var/lib/x")
        );
        let e = OptionError::inside(&["when"], 4, "unknown operator");
        assert_eq!(
            (e.path, e.offset, e.message.as_str()),
            (vec!["when".to_string()], Some(4), "unknown operator")
        );
        assert_eq!(OptionError::at(&[], "x").offset, None);
    }

    /// A typed plugin whose options have a range, a cross-field check and
    /// named outputs, to see what [`Typed`] does with each.
    struct Router;

    #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct RouterOptions {
        #[schemars(range(min = 1, max = 9))]
        #[serde(default = "one")]
        level: u32,
        #[serde(default)]
        routes: Vec<String>,
        #[schemars(range(max = 10))]
        #[serde(default)]
        #[allow(dead_code)]
        shift: i64,
    }

    fn one() -> u32 {
        1
    }

    impl CheckOptions for RouterOptions {
        fn check(&self) -> Vec<OptionError> {
            let mut errors = Vec::new();
            if self.level > 5 && self.routes.is_empty() {
                errors.push(OptionError::at(&["level"], "above 5 needs routes"));
            }
            if self.routes.iter().any(String::is_empty) {
                errors.push(OptionError::at(&["routes"], "a route needs a name"));
            }
            errors
        }
    }

    impl TypedPlugin for Router {
        type Options = RouterOptions;
        const NAME: &'static str = "router";
        const KIND: StageKind = StageKind::Transform;

        type Stage = Box<dyn Processor>;
        const DESCRIPTION: &'static str = "routes";
        const MAX_PER_PIPELINE: Option<usize> = Some(2);
        const ACKNOWLEDGEMENTS: Option<&'static str> = Some("never");

        fn build(
            &self,
            options: RouterOptions,
            _: &BuildContext,
        ) -> Result<Self::Stage, OptionError> {
            if options.routes.iter().any(|r| r == "broken") {
                return Err(OptionError::at(&["routes"], "cannot build `broken`"));
            }
            Ok(Box::new(|_: &mut Event| Ok(Verdict::Discard)))
        }

        fn check_in_context(&self, options: &RouterOptions, cx: &BuildContext) -> Vec<OptionError> {
            if options.routes.iter().any(|r| r == &cx.stage_id) {
                vec![OptionError::at(&["routes"], "a route named like the stage")]
            } else {
                Vec::new()
            }
        }

        fn outputs(&self, options: &RouterOptions) -> Vec<String> {
            options.routes.clone()
        }
    }

    fn said(errors: &[OptionError]) -> Vec<String> {
        errors
            .iter()
            .map(|e| format!("{}: {}", e.path.join("."), e.message))
            .collect()
    }

    #[test]
    fn a_typed_plugin_says_what_its_constants_say() {
        let p = Typed(Router);
        assert_eq!(
            (p.name(), p.kind(), p.description()),
            ("router", StageKind::Transform, "routes")
        );
        assert_eq!(p.max_per_pipeline(), Some(2));
        assert_eq!(p.acknowledgements(), Some("never"));
        let schema = p.options_schema();
        assert_eq!(schema["properties"]["level"]["maximum"], 9);
        assert_eq!(
            p.outputs(&serde_json::json!({"routes": ["a", "b"]})),
            ["a", "b"]
        );
        // Options that do not parse declare no outputs.
        assert!(p.outputs(&serde_json::json!({"routes": 3})).is_empty());
    }

    #[test]
    fn a_typed_plugin_checks_ranges_then_its_own_rules_then_the_context() {
        let p = Typed(Router);
        let cx = BuildContext {
            stage_id: "s".into(),
            base_dir: ".".into(),
            worker: 0,
        };
        let check = |options| said(&p.check(&options, &cx));
        assert!(check(serde_json::json!({"routes": ["a"], "level": 7})).is_empty());
        // The plugin's own rule, when the ranges hold.
        assert_eq!(
            check(serde_json::json!({"level": 7})),
            ["level: above 5 needs routes"]
        );
        // An option out of range is not also reported by the plugin's rule.
        assert_eq!(
            check(serde_json::json!({"level": 10})),
            ["level: must be between 1 and 9, got 10"]
        );
        // ... but a rule about another option still is.
        assert_eq!(
            check(serde_json::json!({"level": 10, "routes": [""]})),
            [
                "level: must be between 1 and 9, got 10",
                "routes: a route needs a name"
            ]
        );
        // Only a bound above: said as such.
        assert_eq!(
            check(serde_json::json!({"shift": 11})),
            ["shift: must be at most 10, got 11"]
        );
        assert!(check(serde_json::json!({"shift": -1000})).is_empty());
        // With the options right, the checks that need the pipeline.
        let stage = cx.stage_id.clone();
        assert_eq!(
            check(serde_json::json!({"routes": [stage]})),
            ["routes: a route named like the stage"]
        );
        // A type error says where, inside a list too.
        assert_eq!(
            check(serde_json::json!({"routes": ["a", 2]})),
            ["routes.1: expected a string, got the number 2"]
        );
    }

    #[test]
    fn a_typed_plugin_builds_only_from_options_that_pass() {
        let p = Typed(Router);
        let cx = BuildContext {
            stage_id: "s".into(),
            base_dir: ".".into(),
            worker: 0,
        };
        let mut built = match p.build(&serde_json::json!({"routes": ["a"]}), &cx) {
            Ok(Built::Processor(processor)) => processor,
            _ => panic!("not a processor"),
        };
        let mut event = Event::raw("x", crate::Meta::now("s".into()));
        assert!(matches!(built.process(&mut event), Ok(Verdict::Discard)));
        let error = |options| match p.build(&options, &cx) {
            Err(e) => said(&e),
            Ok(_) => panic!("built from {options}"),
        };
        assert_eq!(
            error(serde_json::json!({"level": 0})),
            ["level: must be between 1 and 9, got 0"]
        );
        assert_eq!(
            error(serde_json::json!({"level": 6})),
            ["level: above 5 needs routes"]
        );
        assert_eq!(
            error(serde_json::json!({"routes": ["broken"]})),
            ["routes: cannot build `broken`"]
        );
    }

    #[test]
    fn an_unknown_option_names_the_closest_and_lists_the_rest() {
        let schema = schemars::schema_for!(Ranged).to_value();
        let rejected = |options| match parse_options::<Ranged>(&options, &schema) {
            Err(e) => said(&e),
            Ok(_) => panic!("accepted {options}"),
        };
        assert_eq!(
            rejected(serde_json::json!({"in_fligth": 2})),
            [
                "in_fligth: unknown option `in_fligth`; did you mean `in_flight`? (options: in_flight, level, timeout_ms, ratio, name)"
            ]
        );
        assert_eq!(
            rejected(serde_json::json!({"colour": "red"})),
            [
                "colour: unknown option `colour` (options: in_flight, level, timeout_ms, ratio, name)"
            ]
        );
        let none = schemars::schema_for!(NoOptions).to_value();
        match parse_options::<NoOptions>(&serde_json::json!({"path": "x"}), &none) {
            Err(e) => assert_eq!(
                said(&e),
                ["path: unknown option `path` (this plugin takes no options)"]
            ),
            Ok(_) => panic!("accepted an option"),
        }
    }

    /// Parsers, transforms and formatters build processors; each `Built`
    /// says what it is, which the engine compares with the stage's kind.
    #[test]
    fn each_kind_builds_its_own_thing() {
        let kinds: Vec<BuiltAs> = StageKind::ALL.iter().map(|k| k.built_as()).collect();
        assert_eq!(
            kinds,
            [
                BuiltAs::Source,
                BuiltAs::Processor,
                BuiltAs::Processor,
                BuiltAs::Processor,
                BuiltAs::Sink
            ]
        );
        let keep = |_: &mut Event| -> Result<Verdict, EventError> { Ok(Verdict::Keep) };
        assert_eq!(
            Built::Processor(Box::new(keep)).built_as(),
            BuiltAs::Processor
        );
        assert_eq!(<Box<dyn Source> as BuiltStage>::BUILT_AS, BuiltAs::Source);
        assert_eq!(<Box<dyn Sink> as BuiltStage>::BUILT_AS, BuiltAs::Sink);
        assert!(matches!(
            BuiltStage::into_built(Box::new(keep) as Box<dyn Processor>),
            Built::Processor(_)
        ));
    }

    /// A plugin that says nothing of its limits, acknowledgements or
    /// outputs has none: any number per pipeline, no acknowledgements, only
    /// the main output.
    #[test]
    fn what_a_plugin_does_not_declare_it_does_not_have() {
        struct Bare;
        impl Plugin for Bare {
            fn name(&self) -> &'static str {
                "bare"
            }
            fn kind(&self) -> StageKind {
                StageKind::Sink
            }
            fn description(&self) -> &'static str {
                "nothing"
            }
            fn options_schema(&self) -> Value {
                serde_json::json!({})
            }
            fn check(&self, _: &Value, _: &BuildContext) -> Vec<OptionError> {
                Vec::new()
            }
            fn build(&self, _: &Value, _: &BuildContext) -> Result<Built, Vec<OptionError>> {
                Err(Vec::new())
            }
        }
        let bare = Bare;
        assert_eq!(bare.max_per_pipeline(), None);
        assert_eq!(bare.acknowledgements(), None);
        assert_eq!(
            bare.outputs(&serde_json::json!({"to": ["a"]})),
            Vec::<String>::new()
        );

        #[derive(serde::Deserialize, schemars::JsonSchema)]
        struct Plain {
            #[serde(default)]
            #[allow(dead_code)]
            to: Vec<String>,
        }
        impl CheckOptions for Plain {}
        struct BareTyped;
        impl TypedPlugin for BareTyped {
            type Options = Plain;
            const NAME: &'static str = "bare";
            const KIND: StageKind = StageKind::Sink;

            type Stage = Box<dyn Sink>;
            const DESCRIPTION: &'static str = "nothing";
            fn build(&self, _: Plain, _: &BuildContext) -> Result<Self::Stage, OptionError> {
                Err(OptionError::at(&[], "not built"))
            }
        }
        let typed = Typed(BareTyped);
        assert_eq!(typed.max_per_pipeline(), None);
        assert_eq!(typed.acknowledgements(), None);
        assert_eq!(
            typed.outputs(&serde_json::json!({"to": ["a"]})),
            Vec::<String>::new()
        );
    }

    /// `committed` is what a sink's `events_out` counts.
    #[test]
    fn a_sink_counts_what_it_commits() {
        let (_tx, rx) = crate::channel(4);
        let metrics = Arc::new(StageMetrics::default());
        let cx = SinkContext::new("out", rx, metrics.clone());
        cx.committed(3);
        cx.committed(0);
        cx.committed(2);
        assert_eq!(metrics.snapshot().events_out, 5);
    }

    #[test]
    fn a_failed_event_carries_the_stage_and_the_reason() {
        let meta = || crate::Meta::now("s".into());
        let error = serde_json::json!({"stage": "parse", "message": "not JSON"});
        let raw = attach_error(Event::raw("a line", meta()), "parse", "not JSON");
        assert_eq!(
            serde_json::to_value(raw.as_fields().unwrap()).unwrap(),
            serde_json::json!({"message": "a line", "_error": error})
        );
        let mut fields = crate::Fields::new();
        fields.insert("level".into(), "warn".into());
        let parsed = attach_error(Event::fields(fields, meta()), "parse", "not JSON");
        assert_eq!(
            serde_json::to_value(parsed.as_fields().unwrap()).unwrap(),
            serde_json::json!({"level": "warn", "_error": error})
        );
        let lazy = crate::LazyFields::parse(crate::Bytes::from_static(b"{\"n\":1}")).unwrap();
        let lazy = attach_error(
            Event::new(crate::Payload::Lazy(lazy), meta()),
            "parse",
            "not JSON",
        );
        assert!(matches!(lazy.payload(), crate::Payload::Fields(_)));
        assert_eq!(
            serde_json::to_value(lazy.as_fields().unwrap()).unwrap(),
            serde_json::json!({"n": 1, "_error": error})
        );
    }
}
