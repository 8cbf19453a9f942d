//! `logbus test`: unit tests for pipelines, kept in YAML next to them.
//!
//! A test injects events (or raw lines) as the input of one stage and
//! collects what leaves another. The pipeline is rewired for the test: its
//! sources and sinks are not started — a test source feeds the chosen stage,
//! a collector reads the chosen output — so a test needs no file, socket or
//! service, and runs the very same stage code with the same `on_error`
//! handling as production.

mod check;
pub mod junit;
mod spec;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use logbus_core::config::{QueueKind, QueueSpec};
use logbus_core::{OnError, Pipeline, StageSpec, start};
use logbus_plugin_api::{
    BuildContext, CancellationToken, Event, Meta, NoOptions, OptionError, Sink, SinkContext,
    Source, SourceContext, StageError, StageKind, Typed, TypedPlugin, async_trait,
};
use serde_json::Value;

pub use spec::{
    Condition, Expect, SpecError, TestCase, TestInput, companion, load_tests, parse_tests,
};

/// How long one test may run before it is failed.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);

const INPUT_ID: &str = "__test_input";
const OUTPUT_ID: &str = "__test_output";

/// The result of one test.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub name: String,
    /// Why it failed; `None` when it passed.
    pub failure: Option<String>,
    pub duration: Duration,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
}

/// Runs one test against a validated pipeline. Must be called inside a
/// multi-thread tokio runtime.
pub async fn run_test(pipeline: &Pipeline, test: &TestCase) -> Outcome {
    let started = Instant::now();
    let failure = run_inner(pipeline, test).await.err();
    Outcome {
        name: test.name.clone(),
        failure,
        duration: started.elapsed(),
    }
}

async fn run_inner(pipeline: &Pipeline, test: &TestCase) -> Result<(), String> {
    let collected = Arc::new(Mutex::new(Vec::new()));
    let rewired = rewire(pipeline, test, collected.clone())?;
    let running = start(&rewired, CancellationToken::new()).map_err(|errors| {
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    })?;
    let report = tokio::time::timeout(TEST_TIMEOUT, running.wait())
        .await
        .map_err(|_| format!("timed out after {}s", TEST_TIMEOUT.as_secs()))?;
    if !report.is_clean() {
        return Err(format!("the pipeline did not run cleanly:\n{report}"));
    }
    let events = std::mem::take(&mut *collected.lock().expect("collector lock"));
    check::expectations(&test.expect, &events)
}

/// The pipeline as the test runs it: the input stage fed by a test source,
/// the output collected, every other source and every sink left out, and
/// whatever no longer has an input pruned away.
fn rewire(p: &Pipeline, test: &TestCase, collected: Collected) -> Result<Pipeline, String> {
    let target = p
        .stage(&test.input.stage)
        .ok_or_else(|| format!("input stage `{}` is not in the pipeline", test.input.stage))?;
    if target.kind == StageKind::Sink {
        return Err(format!(
            "input stage `{}` is a sink; inject into a stage that produces output",
            target.id
        ));
    }
    let output_base = p.output_of(&test.output).0;
    let out_stage = p
        .stage(output_base)
        .ok_or_else(|| format!("output `{}` names no stage", test.output))?;
    if out_stage.kind == StageKind::Sink {
        return Err(format!(
            "output `{}` is a sink, which has no output; collect from its input instead ({})",
            test.output,
            out_stage.inputs.join(", ")
        ));
    }

    let events = input_events(test);
    let inject = |id: &str| StageSpec {
        id: id.to_string(),
        pos: target.pos,
        kind: StageKind::Source,
        plugin_name: InjectPlugin::NAME.into(),
        plugin: Arc::new(Typed(InjectPlugin(events.clone()))),
        inputs: Vec::new(),
        on_error: OnError::Drop,
        workers: 1,
        ordered: false,
        queue: None,
        options: Value::Object(Default::default()),
        outputs: Vec::new(),
    };
    let mut stages: Vec<StageSpec> = Vec::new();
    if target.kind == StageKind::Source {
        stages.push(inject(&target.id));
    } else {
        stages.push(inject(INPUT_ID));
    }
    // A test never touches a durable queue's directory: its stages get
    // the memory queue (the default kind) of the same shape.
    let in_memory = |s: &StageSpec| {
        let mut s = s.clone();
        if let Some(q) = s.queue.as_mut().filter(|q| q.kind != QueueKind::Memory) {
            *q = QueueSpec {
                scope: q.scope,
                size: q.size,
                dequeue_batch: q.dequeue_batch,
                local: q.local.clone(),
                ..QueueSpec::default()
            };
        }
        s
    };
    for s in &p.stages {
        match s.kind {
            StageKind::Source | StageKind::Sink => {}
            _ if s.id == target.id => {
                let mut fed = in_memory(s);
                fed.inputs = vec![INPUT_ID.to_string()];
                stages.push(fed);
            }
            _ => stages.push(in_memory(s)),
        }
    }
    stages.push(StageSpec {
        id: OUTPUT_ID.into(),
        pos: out_stage.pos,
        kind: StageKind::Sink,
        plugin_name: CollectPlugin::NAME.into(),
        plugin: Arc::new(Typed(CollectPlugin(collected))),
        inputs: vec![test.output.clone()],
        on_error: OnError::Drop,
        workers: 1,
        ordered: false,
        queue: None,
        options: Value::Object(Default::default()),
        outputs: Vec::new(),
    });

    // Prune stages cut off from the input, until nothing changes.
    loop {
        let present: HashSet<String> = stages.iter().map(|s| s.id.clone()).collect();
        // The stage an input reads (`id`, `id.errors`, `id.<route>`), or
        // the input itself when it names a stage whole: an attached
        // stage's id has a dot (`out.format`).
        let base = |name: &str| -> String {
            match name.split_once('.') {
                Some((b, _)) if present.contains(b) => b.to_string(),
                _ => name.to_string(),
            }
        };
        let before = stages.len();
        for s in &mut stages {
            s.inputs.retain(|i| present.contains(&base(i)));
        }
        stages.retain(|s| s.kind == StageKind::Source || !s.inputs.is_empty());
        if stages.len() == before {
            break;
        }
    }
    if !stages.iter().any(|s| s.id == OUTPUT_ID) {
        return Err(format!(
            "output `{}` is not downstream of input stage `{}`",
            test.output, test.input.stage
        ));
    }
    Ok(Pipeline {
        path: p.path.clone(),
        base_dir: p.base_dir.clone(),
        settings: p.settings.clone(),
        stages,
    })
}

fn input_events(test: &TestCase) -> Vec<(Option<serde_json::Map<String, Value>>, String)> {
    let mut out: Vec<(Option<serde_json::Map<String, Value>>, String)> =
        test.input.lines.iter().map(|l| (None, l.clone())).collect();
    for e in &test.input.events {
        match e {
            Value::Object(map) => out.push((Some(map.clone()), String::new())),
            Value::String(s) => out.push((None, s.clone())),
            other => out.push((None, other.to_string())),
        }
    }
    out
}

type Collected = Arc<Mutex<Vec<Event>>>;

/// Emits the test's events once, as one batch.
struct InjectPlugin(Vec<(Option<serde_json::Map<String, Value>>, String)>);

struct Inject(Vec<(Option<serde_json::Map<String, Value>>, String)>);

impl TypedPlugin for InjectPlugin {
    type Options = NoOptions;
    const NAME: &'static str = "test-input";
    const KIND: StageKind = StageKind::Source;

    type Stage = Box<dyn Source>;
    const DESCRIPTION: &'static str = "the events of a pipeline test";

    fn build(&self, _options: NoOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(Inject(self.0.clone())))
    }
}

#[async_trait]
impl Source for Inject {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        let meta = Meta::now(cx.id.clone());
        let events = self
            .0
            .into_iter()
            .map(|(fields, line)| match fields {
                Some(f) => Event::fields(f, meta.clone()),
                None => Event::raw(line.into_bytes(), meta.clone()),
            })
            .collect();
        cx.output.send(events).await?;
        Ok(())
    }
}

/// Keeps every event that reaches it.
struct CollectPlugin(Collected);

struct Collect(Collected);

impl TypedPlugin for CollectPlugin {
    type Options = NoOptions;
    const NAME: &'static str = "test-output";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "collects the output of a pipeline test";

    fn build(&self, _options: NoOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(Collect(self.0.clone())))
    }
}

#[async_trait]
impl Sink for Collect {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        while let Some(mut batch) = cx.input.recv().await {
            let n = batch.len();
            cx.metrics.add_in(n as u64);
            let mut events = batch.take();
            Event::settle_all(&mut events, logbus_plugin_api::Outcome::Delivered);
            self.0.lock().expect("collector lock").extend(events);
            drop(batch);
            cx.committed(n);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_core::config::QueueScope;

    /// A durable queue becomes a memory queue with everything else kept:
    /// its scope, size, dequeue batch and local-scope settings.
    #[test]
    fn a_durable_queue_keeps_its_shape_in_memory() {
        let dir = std::env::temp_dir().join(format!("logbus-rewire-{}", std::process::id()));
        let text = format!(
            "stages:
  gen: {{ source: generator, count: 1 }}
  json: {{ parser: json, inputs: [gen], workers: 2, queue: {{ type: disk-assisted, path: {:?}, scope: local, size: 640, dequeue_batch: 32, local: {{ frontend_size: 64, max_frontends: 2 }} }} }}
  out: {{ sink: blackhole, inputs: [json] }}
",
            dir.join("q").display().to_string()
        );
        let mut registry = logbus_plugin_api::Registry::new();
        logbus_io::register(&mut registry);
        logbus_text::register(&mut registry);
        let loaded = logbus_core::load_str(&text, &dir.join("p.yml"), &registry, &|_| None);
        let pipeline = loaded
            .pipeline
            .unwrap_or_else(|| panic!("{:#?}", loaded.diagnostics));
        let test = parse_tests(
            "tests:\n  - name: t\n    input: { stage: json, lines: ['{}'] }\n    output: json\n",
            std::path::Path::new("p.test.yml"),
        )
        .unwrap()
        .remove(0);
        let rewired = rewire(&pipeline, &test, Default::default()).unwrap();
        let before = pipeline.stage("json").unwrap().queue.clone().unwrap();
        let after = rewired.stage("json").unwrap().queue.clone().unwrap();
        assert_eq!(after.kind, QueueKind::Memory);
        assert_eq!(after.scope, QueueScope::Local);
        assert_eq!((after.size, after.dequeue_batch), (Some(640), Some(32)));
        assert_eq!(after.local, before.local);
        assert!(after.local.is_some());
        assert_eq!(after.path, None, "nothing of the disk is kept");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_outcome_passed_when_it_has_no_failure() {
        let mut registry = logbus_plugin_api::Registry::new();
        logbus_io::register(&mut registry);
        logbus_text::register(&mut registry);
        let text = "stages:
  gen: { source: generator, count: 1 }
  json: { parser: json, inputs: [gen] }
  out: { sink: blackhole, inputs: [json] }
";
        let loaded =
            logbus_core::load_str(text, std::path::Path::new("p.yml"), &registry, &|_| None);
        let pipeline = loaded.pipeline.unwrap();
        let tests = parse_tests(
            "tests:
  - { name: good, input: { stage: json, lines: ['{}'] }, output: json, expect: { count: 1 } }
  - { name: bad, input: { stage: json, lines: ['{}'] }, output: json, expect: { count: 2 } }
",
            std::path::Path::new("p.test.yml"),
        )
        .unwrap();
        assert!(run_test(&pipeline, &tests[0]).await.passed());
        assert!(!run_test(&pipeline, &tests[1]).await.passed());
    }
}
