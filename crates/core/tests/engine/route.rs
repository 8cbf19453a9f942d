//! `transform: route`: every event reaches each route it matches, a copy
//! each, or `_unmatched`; validation knows the routes; counts add up.

use logbus_core::{Diagnostic, Severity, start};
use logbus_plugin_api::CancellationToken;
use serde_json::json;

use crate::support::{TestPlugins, load, seqs, valid};

const PIPELINE: &str = "stages:
  gen: { source: generator, count: 3000, template: '{\"seq\":{{seq}}}' }
  json: { parser: json, inputs: [gen] }
  split: { transform: route, inputs: [json], MODE routes: { low: 'seq < 1000', mid: 'seq >= 500 && seq < 2000', high: 'seq >= 2500' } }
  low: { sink: collect, inputs: [split.low] }
  mid: { sink: collect, inputs: [split.mid] }
  high: { sink: collect, inputs: [split.high] }
  rest: { sink: collect, inputs: [split._unmatched] }
";

async fn run(mode: &str) -> (TestPlugins, logbus_core::RunReport) {
    let plugins = TestPlugins::default();
    let text = PIPELINE.replace("MODE ", mode);
    let p = valid(&text, &plugins.registry());
    let report = start(&p, CancellationToken::new()).unwrap().wait().await;
    (plugins, report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_event_reaches_every_route_it_matches_or_unmatched() {
    let (plugins, report) = run("").await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.totals.lost, 0, "{report}");
    let range = |r: std::ops::Range<u64>| r.collect::<Vec<_>>();
    assert_eq!(seqs(&plugins.events("low")), range(0..1000));
    assert_eq!(seqs(&plugins.events("mid")), range(500..2000));
    assert_eq!(seqs(&plugins.events("high")), range(2500..3000));
    assert_eq!(seqs(&plugins.events("rest")), range(2000..2500));
    let split = report.stages.iter().find(|s| s.id == "split").unwrap();
    assert_eq!(
        serde_json::to_value(&split.outputs).unwrap(),
        json!({"low": 1000, "mid": 1500, "high": 500, "_unmatched": 500})
    );
    // 3000 in; a copy for each of the 500 events two routes took.
    assert_eq!(split.counts.events_in, 3000);
    assert_eq!(split.counts.created, 500);
    assert_eq!(split.counts.events_out, 3500);
    assert_eq!(split.counts.unaccounted(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_mode_first_an_event_takes_only_its_first_route() {
    let (plugins, report) = run("mode: first, ").await;
    assert!(report.is_clean(), "{report}");
    let range = |r: std::ops::Range<u64>| r.collect::<Vec<_>>();
    assert_eq!(seqs(&plugins.events("low")), range(0..1000));
    assert_eq!(seqs(&plugins.events("mid")), range(1000..2000));
    assert_eq!(seqs(&plugins.events("high")), range(2500..3000));
    assert_eq!(seqs(&plugins.events("rest")), range(2000..2500));
    let split = report.stages.iter().find(|s| s.id == "split").unwrap();
    assert_eq!(split.counts.created, 0);
    assert_eq!(split.counts.events_out, 3000);
}

#[test]
fn validation_knows_the_routes() {
    let base = "stages:
  gen: { source: generator, count: 1 }
  json: { parser: json, inputs: [gen] }
  split: { transform: route, inputs: [json], routes: { slow: 'latency > 1', fast: 'latency <= 1' } }
";
    let with = |reader: &str| format!("{base}  out: {{ sink: stdout, inputs: [{reader}] }}\n");
    let errors = |text: &str| -> Vec<Diagnostic> {
        load(text)
            .diagnostics
            .into_iter()
            .filter(|d| d.severity == Severity::Error)
            .collect()
    };
    let d = errors(&with("split.slwo"));
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!(d[0].code, "unknown-output");
    assert_eq!(
        d[0].message,
        "`split` has no output `slwo`; its outputs are `split.slow`, `split.fast` and `split._unmatched`; did you mean `split.slow`?"
    );
    assert_eq!((d[0].line, d[0].col), (Some(5), Some(33)));
    let d = errors(&with("split"));
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!(d[0].code, "no-main-output");
    let loaded = load(&with("split.fast"));
    // `split.slow` is read by nobody: a warning names it.
    let d = &loaded.diagnostics;
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!(d[0].code, "unread-output");
    assert_eq!(
        d[0].message,
        "no stage reads `split.slow`; the events it gets would be discarded"
    );
    let p = loaded.pipeline.unwrap();
    assert_eq!(p.output_of("split.fast"), ("split", Some("fast")));
    assert_eq!(
        p.output_of("split._unmatched"),
        ("split", Some("_unmatched"))
    );
    let dot = logbus_core::graph::to_dot(&p);
    assert!(
        dot.contains("\"split\" -> \"out\" [style=solid, label=\"fast\"];"),
        "{dot}"
    );
    let text = logbus_core::graph::to_text(&p);
    assert!(text.contains("└─ (fast) out [sink stdout]"), "{text}");
    // A condition's error points inside it, in the file.
    let d = load(&with("split.fast").replace("'latency <= 1'", "'latency <= '")).diagnostics;
    let bad: Vec<_> = d.iter().filter(|d| d.code == "bad-option").collect();
    assert_eq!(bad.len(), 1, "{d:#?}");
    assert!(
        bad[0].message.contains("(at column 12 of the condition)"),
        "{}",
        bad[0].message
    );
}

/// Polls `cond` until it holds; fails after 30 s (only a hang fails it).
async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let began = std::time::Instant::now();
    while !cond() {
        assert!(
            began.elapsed() < std::time::Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// The copies of an event share its acknowledgement: the source hears it
/// was delivered only once every route's sink has finished its copy. Here
/// every event matches both routes: the copies (to `copied`, the first)
/// wait in a closed sink while the originals (to `kept`, the last) are
/// committed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_hears_of_an_event_once_every_routes_copy_is_finished() {
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (0..100).map(|i| format!("{{\"seq\":{i}}}\n")).collect();
    std::fs::write(dir.path().join("in.log"), lines).unwrap();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let plugins = TestPlugins {
        gate: Some(gate.clone()),
        ..Default::default()
    };
    let p = valid(
        &format!(
            "stages:
  logs: {{ source: tail, paths: [\"{d}/in.log\"], state_dir: \"{d}/state\", checkpoint_interval_ms: 10, poll_interval_ms: 10 }}
  json: {{ parser: json, inputs: [logs] }}
  split: {{ transform: route, inputs: [json], routes: {{ copied: 'seq >= 0', kept: 'seq >= 0' }} }}
  slow: {{ sink: gated, inputs: [split.copied] }}
  fast: {{ sink: collect, inputs: [split.kept] }}
",
            d = dir.path().display()
        ),
        &plugins.registry(),
    );
    let cancel = CancellationToken::new();
    let running = start(&p, cancel.clone()).unwrap();
    // A failed assertion stops the pipeline (the tail never ends by itself).
    let _stop = cancel.clone().drop_guard();
    let (logs, fast) = (
        running.metrics("logs").unwrap().clone(),
        running.metrics("fast").unwrap().clone(),
    );
    wait_for("`fast` to commit every event", || {
        fast.snapshot().events_out == 100
    })
    .await;
    // Were the acknowledgement carried by the committed originals alone,
    // the source would publish it within a poll and checkpoint interval
    // (10 ms each);
    // twenty intervals later it still has not heard of any event.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(logs.snapshot().acked_delivered, 0);
    assert!(plugins.events("slow").is_empty());
    gate.add_permits(1000);
    wait_for("every acknowledgement", || {
        logs.snapshot().acked_delivered == 100
    })
    .await;
    assert_eq!(seqs(&plugins.events("slow")), (0..100).collect::<Vec<_>>());
    cancel.cancel();
    let report = running.wait().await;
    assert_eq!(report.totals.lost, 0, "{report}");
}

/// `logbus graph --format dot`: every stage with the shape of its kind,
/// every edge, the `<id>.errors` and `<sink>.dead` side outputs dashed and
/// labelled, a route's named outputs solid and labelled.
#[test]
fn the_dot_graph_draws_every_stage_and_edge_in_its_style() {
    let plugins = TestPlugins::default();
    let text = "stages:
  gen: { source: generator, count: 1 }
  json: { parser: json, inputs: [gen], on_error: route }
  split: { transform: route, inputs: [json], routes: { fast: 'seq < 1' } }
  out: { sink: collect, inputs: [split.fast, split._unmatched] }
  bad: { sink: collect, inputs: [json.errors] }
  lost: { sink: collect, inputs: [out.dead] }
";
    let p = valid(text, &plugins.registry());
    let dot = logbus_core::graph::to_dot(&p);
    let expected = r#"digraph logbus {
  rankdir=LR;
  node [fontname="monospace"];
  "gen" [shape=invhouse, label="gen\nsource generator"];
  "json" [shape=box, label="json\nparser json"];
  "split" [shape=box, label="split\ntransform route"];
  "out" [shape=house, label="out\nsink collect"];
  "bad" [shape=house, label="bad\nsink collect"];
  "lost" [shape=house, label="lost\nsink collect"];
  "gen" -> "json";
  "json" -> "split";
  "split" -> "out" [style=solid, label="fast"];
  "split" -> "out" [style=solid, label="_unmatched"];
  "json" -> "bad" [style=dashed, label="errors"];
  "out" -> "lost" [style=dashed, label="dead"];
}
"#;
    assert_eq!(dot, expected);
    // The tree: readers of a side output one level down, named by it; a
    // stage reached twice printed once.
    assert_eq!(
        logbus_core::graph::to_text(&p),
        "gen [source generator]
  └─ json [parser json]
    └─ split [transform route]
      └─ (fast) out [sink collect]
        └─ (dead) lost [sink collect]
      └─ (_unmatched) out (see above)
    └─ (errors) bad [sink collect]
"
    );
}
