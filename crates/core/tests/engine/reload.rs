//! Hot reload under load: only changed stages are swapped, unchanged ones
//! keep their channels and queued events, removed stages drain, and the
//! books still balance to the event.

use std::time::Duration;

use logbus_core::runtime::ReloadError;
use logbus_core::start;
use logbus_plugin_api::CancellationToken;

use crate::support::{TestPlugins, seqs, valid, wait_until};

/// gen → json → tag (sets `v`) → out, and `extra` stages.
pub(crate) fn pipeline(tag: u32, extra: &str) -> String {
    format!(
        "settings: {{ channel_capacity: 256 }}
stages:
  gen: {{ source: generator, template: '{{\"seq\":{{{{seq}}}}}}' }}
  json: {{ parser: json, inputs: [gen] }}
  tag: {{ transform: fields, inputs: [json], set: {{ v: {tag} }} }}
  out: {{ sink: collect, inputs: [tag] }}
{extra}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_swaps_changed_stages_and_loses_nothing() {
    let plugins = TestPlugins::default();
    let registry = plugins.registry();
    let running = start(
        &valid(&pipeline(1, ""), &registry),
        CancellationToken::new(),
    )
    .unwrap();
    let out = running.metrics("out").unwrap().clone();
    wait_until("traffic", || out.snapshot().events_out > 5_000).await;

    // 1. A changed transform is swapped in place; an added sink starts.
    let summary = running
        .reload(valid(
            &pipeline(2, "  extra: { sink: collect, inputs: [json] }\n"),
            &registry,
        ))
        .await
        .unwrap();
    assert_eq!(summary.changed, ["tag"]);
    assert_eq!(summary.added, ["extra"]);
    assert_eq!(summary.rewired, ["json"]);
    assert!(summary.removed.is_empty());
    assert_eq!(summary.unchanged, 3, "gen, json and out");
    let at_first_reload = out.snapshot().events_out;
    wait_until("traffic after the reload", || {
        out.snapshot().events_out > at_first_reload + 5_000
    })
    .await;

    // 2. An invalid reload is refused and changes nothing.
    let refused = running
        .reload(valid(
            &pipeline(3, "").replace("channel_capacity: 256", "channel_capacity: 128"),
            &registry,
        ))
        .await;
    assert!(
        matches!(refused, Err(ReloadError::SettingsChanged)),
        "{refused:?}"
    );

    // 3. The added sink is removed again: it drains and stops.
    let summary = running
        .reload(valid(&pipeline(2, ""), &registry))
        .await
        .unwrap();
    assert_eq!(summary.removed, ["extra"]);
    assert_eq!(summary.unchanged, 4);
    let at_second_reload = out.snapshot().events_out;
    wait_until("traffic after removal", || {
        out.snapshot().events_out > at_second_reload + 5_000
    })
    .await;

    running.shutdown();
    let report = running.wait().await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.totals.lost, 0, "{report}");
    let events = plugins.events("out");
    let n = report
        .stages
        .iter()
        .find(|s| s.id == "gen")
        .unwrap()
        .counts
        .events_out;
    // Every event reached `out` exactly once, in order, across both reloads.
    assert_eq!(seqs(&events), (0..n).collect::<Vec<_>>());
    // The tag switched from 1 to 2 once and never back.
    let tags: Vec<u64> = events
        .iter()
        .map(|e| e.as_fields().unwrap()["v"].as_u64().unwrap())
        .collect();
    let switch = tags
        .iter()
        .position(|v| *v == 2)
        .expect("the new transform ran");
    assert!(switch > 0, "the old transform ran first");
    assert!(tags[..switch].iter().all(|v| *v == 1) && tags[switch..].iter().all(|v| *v == 2));
    // The temporary sink saw a contiguous run of the stream while it existed.
    let extra = seqs(&plugins.events("extra"));
    assert!(!extra.is_empty());
    assert!(
        extra.windows(2).all(|w| w[1] == w[0] + 1),
        "the removed sink drained in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_sink_takes_over_the_same_queue() {
    let dir = tempfile::tempdir().unwrap();
    let text = |file: &str| {
        format!(
            "settings: {{ channel_capacity: 64 }}\nstages:\n  gen: {{ source: generator, template: '{{\"seq\":{{{{seq}}}}}}' }}\n  out: {{ sink: file, inputs: [gen], path: {}/{file} }}\n",
            dir.path().display()
        )
    };
    let plugins = TestPlugins::default();
    let registry = plugins.registry();
    let running = start(
        &valid(&text("a.ndjson"), &registry),
        CancellationToken::new(),
    )
    .unwrap();
    let out = running.metrics("out").unwrap().clone();
    wait_until("traffic", || out.snapshot().events_out > 2_000).await;
    let summary = running
        .reload(valid(&text("b.ndjson"), &registry))
        .await
        .unwrap();
    assert_eq!(summary.changed, ["out"]);
    let at = out.snapshot().events_out;
    wait_until("traffic to the new file", || {
        out.snapshot().events_out > at + 2_000
    })
    .await;
    running.shutdown();
    let report = running.wait().await;
    assert!(report.is_clean(), "{report}");
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
    let (a, b) = (read("a.ndjson"), read("b.ndjson"));
    assert!(!a.is_empty() && !b.is_empty());
    // Together the two files hold the stream exactly once, in order.
    let all: Vec<u64> = a
        .lines()
        .chain(b.lines())
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(all, (0..report.totals.emitted).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_cannot_build_or_changes_a_kind_is_refused() {
    let plugins = TestPlugins::default();
    let registry = plugins.registry();
    let running = start(
        &valid(&pipeline(1, ""), &registry),
        CancellationToken::new(),
    )
    .unwrap();
    // `tag` becomes a sink: a kind change.
    let kind_change = "settings: { channel_capacity: 256 }\nstages:\n  gen: { source: generator }\n  json: { parser: json, inputs: [gen] }\n  tag: { sink: collect, inputs: [json] }\n";
    let refused = running.reload(valid(kind_change, &registry)).await;
    assert!(
        matches!(refused, Err(ReloadError::KindChanged(ref id)) if id == "tag"),
        "{refused:?}"
    );
    // Removing a source: it stops, the rest drains, the run ends by itself.
    let no_source = "settings: { channel_capacity: 256 }\nstages:\n  other: { source: generator, count: 10, template: '{\"seq\":{{seq}}}' }\n  json: { parser: json, inputs: [other] }\n  tag: { transform: fields, inputs: [json], set: { v: 1 } }\n  out: { sink: collect, inputs: [tag] }\n";
    let summary = running.reload(valid(no_source, &registry)).await.unwrap();
    assert_eq!(summary.removed, ["gen"]);
    assert_eq!(summary.added, ["other"]);
    let report = tokio::time::timeout(Duration::from_secs(30), running.wait())
        .await
        .expect("the pipeline ends once its sources have");
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.totals.emitted, report.totals.committed);
}

/// A route's conditions may change at a reload (its events then follow
/// the new ones); its set of routes may not, since other stages are wired
/// to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_may_change_a_routes_conditions_but_not_its_routes() {
    let plugins = TestPlugins::default();
    let registry = plugins.registry();
    let text = |low: &str, extra: &str| {
        format!(
            "settings: {{ channel_capacity: 64 }}\nstages:
  gen: {{ source: generator, rate: 2000, template: '{{\"seq\":{{{{seq}}}}}}' }}
  json: {{ parser: json, inputs: [gen] }}
  split: {{ transform: route, inputs: [json], routes: {{ low: '{low}'{extra} }} }}
  low: {{ sink: collect, inputs: [split.low] }}
  rest: {{ sink: collect, inputs: [split._unmatched] }}
"
        )
    };
    let cancel = CancellationToken::new();
    let running = start(&valid(&text("seq >= 0", ""), &registry), cancel.clone()).unwrap();
    let _stop = cancel.clone().drop_guard();
    let refused = running
        .reload(valid(&text("seq >= 0", ", high: 'seq > 10'"), &registry))
        .await;
    assert!(
        matches!(refused, Err(ReloadError::OutputsChanged(ref id)) if id == "split"),
        "{refused:?}"
    );
    let summary = running
        .reload(valid(&text("seq < 0", ""), &registry))
        .await
        .unwrap();
    assert_eq!(summary.changed, ["split"]);
    // After the swap everything is unmatched: `rest` starts to fill.
    let began = std::time::Instant::now();
    while plugins.events("rest").is_empty() {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "nothing unmatched"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cancel.cancel();
    let report = running.wait().await;
    assert_eq!(report.totals.lost, 0, "{report}");
}
