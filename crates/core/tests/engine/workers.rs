//! Stage workers on a shared (global) input queue: every event is handled
//! by exactly one worker, dequeues respect `dequeue_batch`, and a reload
//! swaps every worker.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use logbus_core::runtime::ReloadError;
use logbus_core::start;
use logbus_plugin_api::{CancellationToken, Event};

use crate::support::{TestPlugins, load, valid, wait_until};

fn by_source(events: &[Event]) -> BTreeMap<String, Vec<u64>> {
    let mut map: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for e in events {
        let f = e.as_fields().unwrap();
        map.entry(f["from"].as_str().unwrap().to_string())
            .or_default()
            .push(f["seq"].as_u64().unwrap());
    }
    map.values_mut().for_each(|v| v.sort_unstable());
    map
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_event_is_handled_by_exactly_one_worker() {
    let plugins = TestPlugins::default();
    let text = "settings: { channel_capacity: 64 }\nstages:
  a: { source: generator, count: 20000, template: '{\"seq\":{{seq}},\"from\":\"a\"}', batch_size: 50 }
  b: { source: generator, count: 15000, template: '{\"seq\":{{seq}},\"from\":\"b\"}', batch_size: 7 }
  c: { source: generator, count: 5000, template: '{\"seq\":{{seq}},\"from\":\"c\"}' }
  json: { parser: json, inputs: [a, b, c], workers: 4, queue: { size: 512, dequeue_batch: 32 } }
  tag: { transform: fields, inputs: [json], workers: 3, set: { t: 1 } }
  out: { sink: collect, inputs: [tag], workers: 3, queue: { dequeue_batch: 16 } }
";
    let p = valid(text, &plugins.registry());
    assert_eq!(p.inflight_bound().events, 512 + 64 + 64);
    let report = start(&p, CancellationToken::new()).unwrap().wait().await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.totals.committed, 40000);
    let got = by_source(&plugins.events("out"));
    assert_eq!(got["a"], (0..20000).collect::<Vec<_>>());
    assert_eq!(got["b"], (0..15000).collect::<Vec<_>>());
    assert_eq!(got["c"], (0..5000).collect::<Vec<_>>());
    assert!(plugins.max_batch.load(std::sync::atomic::Ordering::Relaxed) <= 16);
    let json = report.channels.iter().find(|c| c.stage == "json").unwrap();
    assert_eq!(json.capacity, 512);
    assert!(json.max_occupancy <= 512);
}

/// A reload swaps every worker of a changed stage, processors and sinks
/// alike, and refuses to change how many workers a stage has or its queue
/// (that needs a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_swaps_every_worker() {
    let plugins = TestPlugins::default();
    let registry = plugins.registry();
    let text = |v: u32, sink: &str, workers: &str| {
        format!(
            "settings: {{ channel_capacity: 128 }}\nstages:
  gen: {{ source: generator, template: '{{\"seq\":{{{{seq}}}},\"from\":\"g\"}}' }}
  json: {{ parser: json, inputs: [gen], workers: 3 }}
  tag: {{ transform: fields, inputs: [json], {workers}, set: {{ v: {v} }} }}
  out: {{ sink: {sink}, inputs: [tag], workers: 2 }}
"
        )
    };
    let three = "workers: 3";
    let running = start(
        &valid(&text(1, "collect", three), &registry),
        CancellationToken::new(),
    )
    .unwrap();
    let out = running.metrics("out").unwrap().clone();
    let wait = |n: u64| {
        let out = out.clone();
        async move {
            let start = Instant::now();
            while out.snapshot().events_out < n {
                assert!(start.elapsed() < Duration::from_secs(30));
                tokio::task::yield_now().await;
            }
        }
    };
    wait(3000).await;
    wait_until("one run per sink worker", || {
        plugins.runs("out", "collect") == 2
    })
    .await;

    // The number of workers, their order, or the queue, of a stage cannot
    // change; a refused reload swaps nothing (no event ever carries its `v: 3`).
    for changed in [
        "workers: 2",
        "workers: 3, ordered: true",
        "workers: 3, queue: { size: 64 }",
        "workers: 3, queue: { scope: local }",
    ] {
        let refused = running
            .reload(valid(&text(3, "gated", changed), &registry))
            .await;
        assert!(
            matches!(refused, Err(ReloadError::QueueChanged(ref id)) if id == "tag"),
            "{changed}: {refused:?}"
        );
    }

    // The transform's value and the sink's plugin change: every worker of
    // both is swapped.
    let summary = running
        .reload(valid(&text(2, "gated", three), &registry))
        .await
        .unwrap();
    assert_eq!(summary.changed, ["tag", "out"]);
    let at = out.snapshot().events_out;
    wait(at + 20000).await;
    wait_until("both sink workers to run the new sink", || {
        plugins.runs("out", "gated") == 2
    })
    .await;
    running.shutdown();
    let report = running.wait().await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(plugins.runs("out", "gated"), 2);
    assert_eq!(plugins.runs("out", "collect"), 2);
    let events = plugins.events("out");
    let got = by_source(&events);
    assert_eq!(
        got["g"],
        (0..report.totals.emitted).collect::<Vec<_>>(),
        "each event once"
    );
    // Every worker was swapped: the last events all carry the new value.
    let tail = &events[events.len() - 1000..];
    assert!(tail.iter().all(|e| e.as_fields().unwrap()["v"] == 2));
    assert!(events.iter().all(|e| e.as_fields().unwrap()["v"] != 3));
}

#[test]
fn workers_and_queue_are_validated() {
    let d = |text: &str| {
        load(text)
            .diagnostics
            .into_iter()
            .map(|d| (d.code, d.message, d.line, d.col))
            .collect::<Vec<_>>()
    };
    let base = "stages:\n  a: { source: stdin }\n";
    let errs = d(&format!(
        "{base}  o: {{ sink: stdout, inputs: [a], workers: 0 }}\n"
    ));
    assert!(
        errs[0]
            .1
            .contains("`workers` must be a whole number from 1 to 256"),
        "{errs:?}"
    );
    let errs = d(
        "stages:\n  a: { source: stdin, workers: 2, queue: { size: 8 } }\n  o: { sink: stdout, inputs: [a] }\n",
    );
    assert!(
        errs.iter()
            .any(|e| e.1.contains("`workers` applies to parsers")),
        "{errs:?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.1.contains("a source has no input queue")),
        "{errs:?}"
    );
    let errs = d(&format!(
        "{base}  o: {{ sink: stdout, inputs: [a], queue: {{ szie: 8 }} }}\n"
    ));
    assert!(
        errs[0]
            .1
            .contains("queue.szie: unknown option `szie`; did you mean `size`?"),
        "{errs:?}"
    );
    assert_eq!((errs[0].2, errs[0].3), (Some(3), Some(44)));
    assert!(
        d(&format!(
            "{base}  o: {{ sink: stdout, inputs: [a], queue: {{ scope: local }} }}\n"
        ))
        .is_empty(),
        "local scope with default frontends is valid"
    );
    let errs = d(&format!(
        "{base}  o: {{ sink: stdout, inputs: [a], queue: {{ size: 8, dequeue_batch: 9 }} }}\n"
    ));
    assert!(errs[0].1.contains("must not exceed `size` (8)"), "{errs:?}");
}

/// A local-scope queue at two fan-in points: a parser fed by three sources
/// (two frontends, so one source falls back to the backend) and a sink fed
/// by a three-worker transform. Every event arrives exactly once and the
/// queue's own counters reconcile with the totals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_queues_deliver_every_event_once_and_reconcile() {
    let plugins = TestPlugins::default();
    let text = "settings: { channel_capacity: 64 }\nstages:
  a: { source: generator, count: 20000, template: '{\"seq\":{{seq}},\"from\":\"a\"}', batch_size: 50 }
  b: { source: generator, count: 15000, template: '{\"seq\":{{seq}},\"from\":\"b\"}', batch_size: 7 }
  c: { source: generator, count: 5000, template: '{\"seq\":{{seq}},\"from\":\"c\"}', batch_size: 100 }
  json:
    parser: json
    inputs: [a, b, c]
    workers: 2
    queue:
      scope: local
      size: 256
      dequeue_batch: 32
      local: { frontend_size: 64, max_frontends: 2, helper_batch: 16 }
  tag: { transform: fields, inputs: [json], workers: 3, set: { t: 1 } }
  out: { sink: collect, inputs: [tag], queue: { scope: local, local: { max_frontends: 3 } } }
";
    let p = valid(text, &plugins.registry());
    // json: B + N(F + D) = 256 + 2 × (64 + 32); tag: 64; out: F defaults to
    // 1024 and D = min(64, 1024), so 64 + 3 × (1024 + 64).
    assert_eq!(
        p.inflight_bound().events,
        (256 + 2 * (64 + 32)) + 64 + (64 + 3 * (1024 + 64))
    );
    let report = start(&p, CancellationToken::new()).unwrap().wait().await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.totals.committed, 40000);
    assert_eq!(report.totals.lost, 0);
    let got = by_source(&plugins.events("out"));
    assert_eq!(got["a"], (0..20000).collect::<Vec<_>>());
    assert_eq!(got["b"], (0..15000).collect::<Vec<_>>());
    assert_eq!(got["c"], (0..5000).collect::<Vec<_>>());

    let json = report.channels.iter().find(|c| c.stage == "json").unwrap();
    let local = json.local.as_ref().expect("json has a local queue");
    assert_eq!((local.registrations, local.registration_failures), (2, 1));
    assert!(local.backend_events.exhausted > 0, "{local:?}");
    assert_eq!(
        local.frontend_events + local.backend_events.total(),
        40000,
        "{local:?}"
    );
    assert_eq!(
        (json.sent, json.received, json.abandoned),
        (40000, 40000, 0)
    );
    assert_eq!(local.outstanding, 0);
    assert_eq!(local.help_events_taken, local.help_events_completed);
    let per_fe: u64 = local.frontends.iter().map(|f| f.admitted).sum();
    assert_eq!(per_fe, local.frontend_events);

    let out = report.channels.iter().find(|c| c.stage == "out").unwrap();
    let local = out.local.as_ref().expect("out has a local queue");
    assert_eq!(local.registrations, 3, "one frontend per `tag` worker");
    assert_eq!(local.frontend_events + local.backend_events.total(), 40000);
    assert_eq!(local.outstanding, 0);
}

/// A short-lived upstream can finish before a stage's last worker exists:
/// the workers that already ended must not close the stage's readers,
/// or a later worker sends into nothing and its events are counted as
/// discarded (a clean report with the events missing). Each run races
/// the engine's spawning against the first workers ending, so it repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_that_end_early_do_not_close_the_stages_readers() {
    let plugins = TestPlugins::default();
    let registry = plugins.registry();
    let global = "stages:
  gen: { source: generator, count: 2, template: '{\"seq\":{{seq}},\"from\":\"g\"}' }
  json: { parser: json, inputs: [gen], workers: 4 }
  out: { sink: collect, inputs: [json] }
";
    let local = "stages:
  gen: { source: generator, count: 2, template: '{\"seq\":{{seq}},\"from\":\"g\"}' }
  json: { parser: json, inputs: [gen], workers: 2, queue: { scope: local, local: { max_frontends: 3 } } }
  out: { sink: collect, inputs: [json] }
";
    for (name, text) in [("global", global), ("local", local)] {
        let p = valid(text, &registry);
        let mut failed = 0;
        for _ in 0..300 {
            let report = start(&p, CancellationToken::new()).unwrap().wait().await;
            if report.totals.committed != 2 || report.totals.discarded != 0 {
                failed += 1;
            }
        }
        assert_eq!(
            failed, 0,
            "{name} queue: {failed} of 300 runs lost their events"
        );
    }
}

/// `transform: note_worker`: records the worker index each instance was
/// built with, and keeps every event.
#[derive(Clone, Default)]
struct NoteWorker(std::sync::Arc<std::sync::Mutex<Vec<usize>>>);

impl logbus_plugin_api::TypedPlugin for NoteWorker {
    type Options = logbus_plugin_api::NoOptions;
    const NAME: &'static str = "note_worker";
    const KIND: logbus_plugin_api::StageKind = logbus_plugin_api::StageKind::Transform;
    type Stage = Box<dyn logbus_plugin_api::Processor>;
    const DESCRIPTION: &'static str = "test: stamps the worker index it was built with";
    fn build(
        &self,
        _o: logbus_plugin_api::NoOptions,
        cx: &logbus_plugin_api::BuildContext,
    ) -> Result<Self::Stage, logbus_plugin_api::OptionError> {
        self.0.lock().unwrap().push(cx.worker);
        Ok(Box::new(
            |_: &mut Event| -> Result<logbus_plugin_api::Verdict, logbus_plugin_api::EventError> {
                Ok(logbus_plugin_api::Verdict::Keep)
            },
        ))
    }
}

/// Each of a stage's instances is built with its own worker index, 0 to
/// `workers - 1` (what a plugin uses to shard state or name files).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_is_built_with_its_own_index() {
    let plugins = TestPlugins::default();
    let noted = NoteWorker::default();
    let mut registry = plugins.registry();
    registry.add(logbus_plugin_api::Typed(noted.clone()));
    let text = "stages:
  gen: { source: generator, count: 3000, batch_size: 10, template: '{\"seq\":{{seq}}}' }
  json: { parser: json, inputs: [gen] }
  note: { transform: note_worker, inputs: [json], workers: 3 }
  out: { sink: collect, inputs: [note] }
";
    let report = start(&valid(text, &registry), CancellationToken::new())
        .unwrap()
        .wait()
        .await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(*noted.0.lock().unwrap(), [0, 1, 2]);
    assert_eq!(plugins.events("out").len(), 3000);
}

fn ordered_run(ordered: bool, on_error: &str) -> String {
    format!(
        "settings: {{ channel_capacity: 1024 }}\nstages:
  gen: {{ source: generator, count: 2000, template: '{{\"seq\":{{{{seq}}}}}}', batch_size: 50 }}
  json: {{ parser: json, inputs: [gen], workers: 2, ordered: {ordered} }}
  hold: {{ transform: hold_first_batch, inputs: [json], workers: 2, ordered: {ordered}, on_error: {on_error} }}
  out: {{ sink: collect, inputs: [hold] }}
  bad: {{ sink: collect, inputs: [hold.errors] }}
"
    )
}

fn seqs_of(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e.as_fields().unwrap()["seq"].as_u64().unwrap())
        .collect()
}

/// The first batch is finished after later ones (one worker holds it until
/// the other has processed a later batch). Without `ordered` the second
/// batch overtakes it; with it, both the main output and `<id>.errors`
/// keep the input's order, through a fused chain of ordered stages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_workers_hand_on_batches_in_the_order_they_took_them() {
    for ordered in [false, true] {
        let plugins = TestPlugins::default();
        let p = valid(&ordered_run(ordered, "route"), &plugins.registry());
        assert_eq!(p.fused_chains().len(), 1, "json and hold run fused");
        let report = start(&p, CancellationToken::new()).unwrap().wait().await;
        assert!(report.is_clean(), "ordered {ordered}: {report}");
        assert!(
            !plugins
                .hold
                .gave_up
                .load(std::sync::atomic::Ordering::Relaxed),
            "the other worker never went on to a later batch"
        );
        let out = seqs_of(&plugins.events("out"));
        let bad = seqs_of(&plugins.events("bad"));
        let expect_out: Vec<u64> = (0..2000).filter(|n| n % 10 != 3).collect();
        let expect_bad: Vec<u64> = (0..2000).filter(|n| n % 10 == 3).collect();
        if ordered {
            assert_eq!(out, expect_out);
            assert_eq!(bad, expect_bad);
        } else {
            // Everything arrives, but the second batch first: the other
            // worker sent it before it went on to the event (seq 100) that
            // let the first batch go on.
            let at = |n: u64| out.iter().position(|&s| s == n).unwrap();
            assert!(at(0) > at(50), "{:?}", &out[..60]);
            let mut sorted = out.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, expect_out);
        }
        assert_eq!(report.totals.committed, 2000);
    }
}

/// An ordered stage that fails ends like any other: the failure is
/// reported, nothing is lost, what was sent is in order, and no worker
/// waits for a turn that never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_stage_that_fails_ends_and_accounts_for_every_event() {
    let plugins = TestPlugins::default();
    let text = "settings: { channel_capacity: 1024 }\nstages:
  gen: { source: generator, count: 20000, template: '{\"seq\":{{seq}}}', batch_size: 50 }
  json: { parser: json, inputs: [gen], workers: 2, ordered: true }
  cursed: { transform: panic_on_seq_7, inputs: [json], workers: 2, ordered: true, on_error: fail }
  out: { sink: collect, inputs: [cursed] }
";
    let p = valid(text, &plugins.registry());
    let report = tokio::time::timeout(
        Duration::from_secs(60),
        start(&p, CancellationToken::new()).unwrap().wait(),
    )
    .await
    .expect("the pipeline ends");
    assert_eq!(report.failures.len(), 1, "{report}");
    assert_eq!(report.failures[0].stage, "cursed");
    assert!(
        report.failures[0].message.contains("seq 7 is cursed"),
        "{report}"
    );
    assert_eq!(report.totals.lost, 0, "{report}");
    assert_eq!(
        report.totals.emitted,
        report.totals.committed + report.totals.errored,
        "{report}"
    );
    // What was kept before the failing event was sent, and in order.
    let out = seqs_of(&plugins.events("out"));
    assert_eq!(&out[..7], [0, 1, 2, 3, 4, 5, 6]);
    assert!(out.windows(2).all(|w| w[0] < w[1]), "{out:?}");
}
