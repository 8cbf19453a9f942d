//! The JS transform's workers inside a running pipeline.

use logbus_core::start;
use logbus_plugin_api::CancellationToken;

use crate::support::{TestPlugins, valid};

/// Four workers (each its own QuickJS runtime) drop, split, error and pass
/// events; routed errors carry the script's message; every event is
/// accounted for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_workers_drop_split_route_and_reconcile() {
    let plugins = TestPlugins::default();
    let text = r#"stages:
  gen: { source: generator, count: 10000, template: '{"seq":{{seq}}}' }
  json: { parser: json, inputs: [gen] }
  js:
    transform: js
    inputs: [json]
    workers: 4
    on_error: route
    script: |
      let seen = 0;
      function init(ctx) { seen = 0; }
      function process(e, ctx) {
        seen += 1;
        if (e.seq % 4 === 0) return null;
        if (e.seq % 10 === 3) throw new Error("bad seq " + e.seq);
        if (e.seq % 7 === 0) return [e, { copy_of: e.seq }];
        e.worker = ctx.worker;
        return e;
      }
  ok: { sink: collect, inputs: [js] }
  bad: { sink: collect, inputs: [js.errors] }
"#;
    let p = valid(text, &plugins.registry());
    let report = start(&p, CancellationToken::new()).unwrap().wait().await;
    assert!(report.is_clean(), "{report}");
    let dropped = (0..10000).filter(|s| s % 4 == 0).count() as u64;
    let errored = (0..10000).filter(|s| s % 4 != 0 && s % 10 == 3).count() as u64;
    let split = (0..10000)
        .filter(|s| s % 4 != 0 && s % 10 != 3 && s % 7 == 0)
        .count() as u64;
    let js = report.stages.iter().find(|s| s.id == "js").unwrap();
    assert_eq!(js.counts.discarded, dropped);
    assert_eq!(js.counts.routed, errored);
    assert_eq!(js.counts.created, split);
    let ok = plugins.events("ok");
    assert_eq!(ok.len() as u64, 10000 - dropped - errored + split);
    let workers: std::collections::BTreeSet<u64> = ok
        .iter()
        .filter_map(|e| e.as_fields()?.get("worker")?.as_u64())
        .collect();
    assert!(workers.iter().all(|w| *w < 4), "{workers:?}");
    let bad = plugins.events("bad");
    assert_eq!(bad.len() as u64, errored);
    let f = bad[0].as_fields().unwrap();
    let message = f["_error"]["message"].as_str().unwrap();
    assert!(message.contains("Error: bad seq"), "{message}");
    assert_eq!(f["_error"]["stage"], "js");
}
