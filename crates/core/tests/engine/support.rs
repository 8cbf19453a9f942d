//! Test plugins (a collecting sink, a gated sink, a panicking transform,
//! a batch holder) over the real plugins the engine tests run (io, text,
//! transform, http, js, codec, tail), and helpers to load pipelines from
//! text. The engine names no plugin; its tests may.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use logbus_core::{Loaded, Pipeline, load_str};
use logbus_plugin_api::{
    BuildContext, Event, EventError, NoOptions, OptionError, Processor, Registry, Sink,
    SinkContext, StageError, StageKind, Typed, TypedPlugin, Verdict, async_trait,
};
use tokio::sync::Semaphore;

/// The real plugins the engine's tests use.
pub fn plugins() -> Registry {
    let mut registry = Registry::new();
    logbus_io::register(&mut registry);
    logbus_text::register(&mut registry);
    logbus_transform::register(&mut registry);
    logbus_http::register(&mut registry);
    logbus_js::register(&mut registry);
    logbus_codec::register(&mut registry);
    logbus_tail::register(&mut registry);
    registry
}

pub type Store = Arc<Mutex<HashMap<String, Vec<Event>>>>;

/// `sink: collect` keeps every event, by stage id. `sink: gated` does the
/// same but takes one permit from the gate per batch before committing it.
#[derive(Clone, Default)]
pub struct TestPlugins {
    pub store: Store,
    pub gate: Option<Arc<Semaphore>>,
    /// Largest batch any collecting sink received.
    pub max_batch: Arc<std::sync::atomic::AtomicUsize>,
    /// How many times an instance of a collecting sink started to run, by
    /// stage id and plugin name (one per worker, and one more per worker a
    /// reload swaps in).
    pub runs: Arc<Mutex<HashMap<(String, &'static str), usize>>>,
    pub hold: HoldFirstBatch,
}

struct CollectPlugin(TestPlugins);
struct GatedPlugin(TestPlugins);
struct PanicPlugin;

struct CollectSink {
    id: String,
    plugin: &'static str,
    runs: Arc<Mutex<HashMap<(String, &'static str), usize>>>,
    store: Store,
    gate: Option<Arc<Semaphore>>,
    max_batch: Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait]
impl Sink for CollectSink {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        *self
            .runs
            .lock()
            .unwrap()
            .entry((self.id.clone(), self.plugin))
            .or_default() += 1;
        while let Some(mut batch) = cx.input.recv().await {
            cx.metrics.add_in(batch.len() as u64);
            if let Some(gate) = &self.gate {
                gate.acquire().await.expect("gate open").forget();
            }
            let n = batch.len();
            self.max_batch
                .fetch_max(n, std::sync::atomic::Ordering::Relaxed);
            let mut events = batch.take();
            logbus_plugin_api::Event::settle_all(
                &mut events,
                logbus_plugin_api::Outcome::Delivered,
            );
            self.store
                .lock()
                .unwrap()
                .entry(self.id.clone())
                .or_default()
                .extend(events);
            drop(batch);
            cx.committed(n);
        }
        Ok(())
    }
}

impl TypedPlugin for CollectPlugin {
    type Options = NoOptions;
    const NAME: &'static str = "collect";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "test: keeps events in memory";
    fn build(&self, _o: NoOptions, cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(CollectSink {
            id: cx.stage_id.clone(),
            plugin: Self::NAME,
            runs: self.0.runs.clone(),
            store: self.0.store.clone(),
            gate: None,
            max_batch: self.0.max_batch.clone(),
        }))
    }
}

impl TypedPlugin for GatedPlugin {
    type Options = NoOptions;
    const NAME: &'static str = "gated";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "test: keeps events, one batch per gate permit";
    fn build(&self, _o: NoOptions, cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(CollectSink {
            id: cx.stage_id.clone(),
            plugin: Self::NAME,
            runs: self.0.runs.clone(),
            store: self.0.store.clone(),
            gate: self.0.gate.clone(),
            max_batch: self.0.max_batch.clone(),
        }))
    }
}

impl TypedPlugin for PanicPlugin {
    type Options = NoOptions;
    const NAME: &'static str = "panic_on_seq_7";
    const KIND: StageKind = StageKind::Transform;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str = "test: panics on the event whose seq is 7";
    fn build(&self, _o: NoOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(|e: &mut Event| -> Result<Verdict, EventError> {
            if e.as_fields()
                .and_then(|f| f.get("seq"))
                .and_then(|v| v.as_u64())
                == Some(7)
            {
                panic!("seq 7 is cursed");
            }
            Ok(Verdict::Keep)
        }))
    }
}

/// `transform: count_at_end`: keeps every event and, when its input ends,
/// emits one more, `{"counted": N}` (a stage holding state to the end).
/// `transform: fail_counting` does the same but fails on the event whose
/// `seq` is 7 and names its count `failed_stage_saw` (a failed stage must
/// never be asked for it).
struct CountAtEndPlugin;
struct FailCountingPlugin;

struct CountAtEnd {
    key: &'static str,
    fail_on_seq: Option<u64>,
    seen: u64,
    meta: Option<logbus_plugin_api::Meta>,
}

impl logbus_plugin_api::Processor for CountAtEnd {
    fn process(&mut self, e: &mut Event) -> Result<Verdict, EventError> {
        self.meta.get_or_insert_with(|| e.meta().clone());
        let seq = e.as_fields().and_then(|f| f.get("seq")?.as_u64());
        if seq.is_some() && seq == self.fail_on_seq {
            return Err(EventError::new(format!("seq {} fails", seq.unwrap_or(0))));
        }
        self.seen += 1;
        Ok(Verdict::Keep)
    }

    fn finish(&mut self) -> Vec<Event> {
        let mut fields = logbus_plugin_api::Fields::new();
        fields.insert(self.key.into(), self.seen.into());
        match self.meta.take() {
            Some(meta) => vec![Event::fields(fields, meta)],
            None => Vec::new(),
        }
    }
}

impl CountAtEnd {
    fn built(
        key: &'static str,
        fail_on_seq: Option<u64>,
    ) -> Result<Box<dyn Processor>, OptionError> {
        Ok(Box::new(CountAtEnd {
            key,
            fail_on_seq,
            seen: 0,
            meta: None,
        }))
    }
}

impl TypedPlugin for CountAtEndPlugin {
    type Options = NoOptions;
    const NAME: &'static str = "count_at_end";
    const KIND: StageKind = StageKind::Transform;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str = "test: emits how many events it saw when its input ends";
    fn build(&self, _o: NoOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        CountAtEnd::built("counted", None)
    }
}

impl TypedPlugin for FailCountingPlugin {
    type Options = NoOptions;
    const NAME: &'static str = "fail_counting";
    const KIND: StageKind = StageKind::Transform;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str = "test: fails on seq 7, emits a count at the end";
    fn build(&self, _o: NoOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        CountAtEnd::built("failed_stage_saw", Some(7))
    }
}

/// `transform: hold_first_batch`: the instance that meets `seq` 0 waits
/// there (its worker's thread handed on) until another instance has
/// processed an event of `seq` ≥ 100, i.e. a later batch; events whose
/// `seq` ends in 3 fail. Instances share one gate, so with two workers the
/// first batch is finished after later ones: an explicit barrier, no sleep.
#[derive(Clone, Default)]
pub struct HoldFirstBatch {
    later_seen: Arc<(Mutex<bool>, std::sync::Condvar)>,
    /// Whether the holder gave up waiting (no other worker went on).
    pub gave_up: Arc<std::sync::atomic::AtomicBool>,
}

impl TypedPlugin for HoldFirstBatch {
    type Options = NoOptions;
    const NAME: &'static str = "hold_first_batch";
    const KIND: StageKind = StageKind::Transform;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str = "test: holds seq 0 until a later batch is processed";
    fn build(&self, _o: NoOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        let gate = self.clone();
        Ok(Box::new(
            move |e: &mut Event| -> Result<Verdict, EventError> {
                let seq = e.as_fields().and_then(|f| f.get("seq")?.as_u64());
                let (seen, cv) = &*gate.later_seen;
                match seq {
                    Some(0) => tokio::task::block_in_place(|| {
                        let guard = seen.lock().unwrap();
                        let (guard, timeout) = cv
                            .wait_timeout_while(guard, std::time::Duration::from_secs(30), |s| !*s)
                            .unwrap();
                        if timeout.timed_out() && !*guard {
                            gate.gave_up
                                .store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    }),
                    Some(n) if n >= 100 => {
                        *seen.lock().unwrap() = true;
                        cv.notify_all();
                    }
                    _ => {}
                }
                match seq {
                    Some(n) if n % 10 == 3 => Err(EventError::new(format!("seq {n} ends in 3"))),
                    _ => Ok(Verdict::Keep),
                }
            },
        ))
    }
}

impl TestPlugins {
    pub fn registry(&self) -> Registry {
        let mut r = plugins();
        r.add(Typed(CollectPlugin(self.clone())));
        r.add(Typed(GatedPlugin(self.clone())));
        r.add(Typed(PanicPlugin));
        r.add(Typed(CountAtEndPlugin));
        r.add(Typed(FailCountingPlugin));
        r.add(Typed(self.hold.clone()));
        r
    }

    /// How many instances of `plugin` have started to run as `stage`.
    pub fn runs(&self, stage: &str, plugin: &'static str) -> usize {
        self.runs
            .lock()
            .unwrap()
            .get(&(stage.to_string(), plugin))
            .copied()
            .unwrap_or(0)
    }

    pub fn events(&self, stage: &str) -> Vec<Event> {
        self.store
            .lock()
            .unwrap()
            .get(stage)
            .cloned()
            .unwrap_or_default()
    }
}

pub fn load(text: &str) -> Loaded {
    load_with(text, &plugins())
}

pub fn load_with(text: &str, registry: &Registry) -> Loaded {
    load_str(text, Path::new("test.yml"), registry, &|k| match k {
        "LOGBUS_TEST_SET" => Some("42".to_string()),
        _ => None,
    })
}

pub fn valid(text: &str, registry: &Registry) -> Pipeline {
    let loaded = load_with(text, registry);
    let errors: Vec<String> = loaded
        .diagnostics
        .iter()
        .map(|d| d.display("test.yml").to_string())
        .collect();
    loaded
        .pipeline
        .unwrap_or_else(|| panic!("pipeline should be valid: {errors:#?}"))
}

/// The events' `seq` fields, in order.
pub fn seqs(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e.as_fields().expect("parsed")["seq"].as_u64().expect("seq"))
        .collect()
}

/// Yields to the runtime until `cond` holds; fails after 30 s. Waiting
/// for a condition is not a timing assertion: only a hang fails it.
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        tokio::task::yield_now().await;
    }
}
