//! Fused chains (`settings.fuse`): a straight run of processors runs as one
//! task per worker, and nothing a user can see changes — counts per stage,
//! order, routed errors, taps, failures by stage — except the queues the
//! chain no longer reads. A reload that touches a chain splits it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use logbus_core::{RunReport, start};
use logbus_plugin_api::{
    BuildContext, CancellationToken, Event, EventError, NoOptions, OptionError, Processor,
    StageKind, Typed, TypedPlugin, Verdict,
};

use crate::reload::pipeline;
use crate::support::{TestPlugins, seqs, valid, wait_until};

/// gen → json → cursed (errors seq 7 on the event) → keep (drops seq 3) →
/// tag → out, with `cursed.errors` read by `bad`.
fn chain(fuse: bool, cursed_on_error: &str, count: &str) -> String {
    let bad = match cursed_on_error {
        "route" => "  bad: { sink: collect, inputs: [cursed.errors] }\n",
        _ => "",
    };
    format!(
        "settings: {{ channel_capacity: 64, fuse: {fuse} }}
stages:
  gen: {{ source: generator, {count} batch_size: 10, template: '{{\"seq\":{{{{seq}}}}}}' }}
  json: {{ parser: json, inputs: [gen] }}
  cursed: {{ transform: panic_on_seq_7, inputs: [json], on_error: {cursed_on_error} }}
  keep: {{ transform: filter, inputs: [cursed], condition: 'seq != 3' }}
  tag: {{ transform: fields, inputs: [keep], set: {{ v: 1 }} }}
  out: {{ sink: collect, inputs: [tag] }}
{bad}"
    )
}

async fn run(text: &str, plugins: &TestPlugins) -> RunReport {
    let p = valid(text, &plugins.registry());
    start(&p, CancellationToken::new())
        .unwrap_or_else(|e| panic!("{e:?}"))
        .wait()
        .await
}

#[test]
fn a_straight_run_of_processors_is_fused_and_nothing_else() {
    let plugins = TestPlugins::default();
    let chains = |text: &str| -> Vec<Vec<String>> {
        valid(text, &plugins.registry())
            .fused_chains()
            .iter()
            .map(|c| c.iter().map(|s| s.id.clone()).collect())
            .collect()
    };
    let count = "count: 10,";
    assert_eq!(
        chains(&chain(true, "route", count)),
        [["json", "cursed", "keep", "tag"]],
        "sources and sinks stay apart; reading `cursed.errors` does not split it"
    );
    assert!(chains(&chain(false, "route", count)).is_empty());
    // A second reader of `keep` splits the chain after it.
    let two_readers = chain(true, "route", count) + "  also: { sink: collect, inputs: [keep] }\n";
    assert_eq!(
        chains(&two_readers),
        [vec!["json", "cursed", "keep"]],
        "tag alone is no chain"
    );
    // Different workers, or a queue of its own, keep a stage apart.
    let workers = chain(true, "route", count).replace(
        "inputs: [cursed], condition",
        "inputs: [cursed], workers: 2, condition",
    );
    assert_eq!(chains(&workers), [["json", "cursed"]]);
    let queued = chain(true, "route", count).replace(
        "inputs: [keep], set",
        "inputs: [keep], queue: { size: 10 }, set",
    );
    assert_eq!(chains(&queued), [["json", "cursed", "keep"]]);
    // A first stage with a local-scope queue (its frontends have
    // instances of their own) stays apart.
    let local = chain(true, "route", count).replace(
        "inputs: [gen] }",
        "inputs: [gen], queue: { scope: local } }",
    );
    assert_eq!(chains(&local), [["cursed", "keep", "tag"]]);
    // Two inputs: no chain into it.
    let fan_in = "stages:
  a: { source: generator, count: 1 }
  b: { source: generator, count: 1 }
  pa: { parser: json, inputs: [a] }
  both: { transform: fields, inputs: [pa, b], set: { x: 1 } }
  out: { sink: collect, inputs: [both] }
";
    assert!(chains(fan_in).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fused_chain_counts_routes_and_orders_as_the_stages_apart() {
    const N: u64 = 5_000;
    let count = format!("count: {N},");
    let mut reports = Vec::new();
    let mut delivered = Vec::new();
    for fuse in [true, false] {
        let plugins = TestPlugins::default();
        let report = run(&chain(fuse, "route", &count), &plugins).await;
        assert!(report.is_clean(), "fuse {fuse}: {report}");
        assert_eq!(report.totals.lost, 0);
        let out = plugins.events("out");
        assert_eq!(out.len() as u64, N - 2, "all but seq 3 and seq 7");
        assert!(out.iter().all(|e| e.as_fields().unwrap()["v"] == 1));
        assert_eq!(seqs(&plugins.events("bad")), [7], "routed from `cursed`");
        delivered.push(seqs(&out));
        reports.push(report);
    }
    assert_eq!(
        delivered[0], delivered[1],
        "the same events in the same order"
    );
    let (fused, apart) = (&reports[0], &reports[1]);
    for (f, a) in fused.stages.iter().zip(&apart.stages) {
        assert_eq!(f.id, a.id);
        assert_eq!(f.counts, a.counts, "stage `{}`", f.id);
        assert_eq!(f.bytes_out, a.bytes_out, "stage `{}`", f.id);
    }
    let fused_into: Vec<_> = fused
        .stages
        .iter()
        .map(|s| (s.id.as_str(), s.fused_into.as_deref()))
        .collect();
    assert_eq!(
        fused_into,
        [
            ("gen", None),
            ("json", Some("json")),
            ("cursed", Some("json")),
            ("keep", Some("json")),
            ("tag", Some("json")),
            ("out", None),
            ("bad", None),
        ]
    );
    assert!(apart.stages.iter().all(|s| s.fused_into.is_none()));
    let queues = |r: &RunReport| {
        r.channels
            .iter()
            .map(|c| c.stage.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        queues(fused),
        ["json", "out", "bad"],
        "the chain reads json's queue"
    );
    assert_eq!(queues(apart).len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_stage_inside_a_chain_is_the_one_reported() {
    let plugins = TestPlugins::default();
    let report = run(&chain(true, "fail", "count: 1000,"), &plugins).await;
    assert!(!report.is_clean());
    let failed: Vec<_> = report.failures.iter().map(|f| f.stage.as_str()).collect();
    assert_eq!(failed, ["cursed"], "{report}");
    assert!(
        report.failures[0].message.contains("on_error: fail"),
        "{}",
        report.failures[0].message
    );
    assert_eq!(report.totals.lost, 0, "{report}");
    // What `cursed` kept before seq 7 went through the rest of the chain.
    assert_eq!(
        seqs(&plugins.events("out"))[..5],
        [0, 1, 2, 4, 5],
        "kept before the failing event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_of_a_fused_stage_sees_what_leaves_that_stage() {
    let plugins = TestPlugins::default();
    let p = valid(&chain(true, "route", ""), &plugins.registry());
    let running = start(&p, CancellationToken::new()).unwrap();
    let stats = running.stats();
    let mut keep = stats.tap("keep", 64).expect("a tap of `keep`");
    let mut tag = stats.tap("tag", 64).expect("a tap of `tag`");
    let first_keep = keep.events.recv().await.expect("`keep` sends");
    let first_tag = tag.events.recv().await.expect("`tag` sends");
    running.shutdown();
    let report = running.wait().await;
    assert!(report.is_clean(), "{report}");
    let fields = |e: &logbus_plugin_api::Event| e.as_fields().unwrap().clone();
    assert!(
        fields(&first_keep).get("v").is_none(),
        "before `tag`: {:?}",
        fields(&first_keep)
    );
    assert_eq!(fields(&first_tag)["v"], 1, "after `tag`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_splits_a_chain_it_touches_and_keeps_one_it_does_not() {
    let plugins = TestPlugins::default();
    let registry = plugins.registry();
    let running = start(
        &valid(&pipeline(1, ""), &registry),
        CancellationToken::new(),
    )
    .unwrap();
    let out = running.metrics("out").unwrap().clone();
    let stats = running.stats();
    let fused = |stats: &logbus_core::StatsHandle| -> Vec<String> {
        let report = stats.snapshot();
        report
            .stages
            .iter()
            .filter(|s| s.fused_into.is_some())
            .map(|s| s.id.clone())
            .collect()
    };
    assert_eq!(fused(&stats), ["json", "tag"]);
    wait_until("traffic", || out.snapshot().events_out > 5_000).await;

    // A stage outside the chain is added: the chain runs on fused.
    let extra =
        "  other: { source: generator, count: 10 }\n  sunk: { sink: collect, inputs: [other] }\n";
    let summary = running
        .reload(valid(&pipeline(1, extra), &registry))
        .await
        .unwrap();
    assert_eq!(summary.added, ["other", "sunk"]);
    assert_eq!(fused(&stats), ["json", "tag"]);

    // `tag` changes: the chain is split, its stages run apart from now on.
    let at_split = out.snapshot().events_out;
    let summary = running
        .reload(valid(&pipeline(2, extra), &registry))
        .await
        .unwrap();
    assert_eq!(summary.changed, ["tag"]);
    assert!(fused(&stats).is_empty());
    let queues: Vec<String> = stats
        .snapshot()
        .channels
        .iter()
        .map(|c| c.stage.clone())
        .collect();
    assert!(queues.contains(&"tag".to_string()), "{queues:?}");
    wait_until("traffic after the split", || {
        out.snapshot().events_out > at_split + 5_000
    })
    .await;
    running.shutdown();
    let report = running.wait().await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.totals.lost, 0, "{report}");
    let events = plugins.events("out");
    let n = report.stages[0].counts.events_out;
    assert_eq!(
        seqs(&events),
        (0..n).collect::<Vec<_>>(),
        "once each, in order"
    );
    let tags: Vec<u64> = events
        .iter()
        .map(|e| e.as_fields().unwrap()["v"].as_u64().unwrap())
        .collect();
    let switch = tags
        .iter()
        .position(|v| *v == 2)
        .expect("the new `tag` ran");
    assert!(switch > 0 && tags[switch..].iter().all(|v| *v == 2));
    assert_eq!(plugins.events("sunk").len(), 10);
}

/// The chain's first stage is removed under load: nobody takes over its
/// queue, so the chain drains it while the stage after it runs on its own;
/// every event arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_removes_a_chains_first_stage_drains_its_queue() {
    let text = |parser: &str| {
        format!(
            "settings: {{ channel_capacity: 256 }}
stages:
  gen: {{ source: generator, template: '{{\"seq\":{{{{seq}}}}}}' }}
  {parser}: {{ parser: json, inputs: [gen] }}
  tag: {{ transform: fields, inputs: [{parser}], set: {{ v: 1 }} }}
  out: {{ sink: collect, inputs: [tag] }}
"
        )
    };
    let plugins = TestPlugins::default();
    let registry = plugins.registry();
    let running = start(&valid(&text("first"), &registry), CancellationToken::new()).unwrap();
    let out = running.metrics("out").unwrap().clone();
    wait_until("traffic", || out.snapshot().events_out > 5_000).await;
    let summary = running
        .reload(valid(&text("second"), &registry))
        .await
        .unwrap();
    assert_eq!(summary.removed, ["first"]);
    assert_eq!(summary.added, ["second"]);
    let at_reload = out.snapshot().events_out;
    wait_until("traffic after the reload", || {
        out.snapshot().events_out > at_reload + 5_000
    })
    .await;
    running.shutdown();
    let report = running.wait().await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.totals.lost, 0, "{report}");
    let n = report.stages[0].counts.events_out;
    let mut delivered = seqs(&plugins.events("out"));
    delivered.sort_unstable();
    assert_eq!(delivered, (0..n).collect::<Vec<_>>(), "once each");
}

/// A stage after the failed one in a chain ends as it would apart: what it
/// holds to the end goes on (here one event counting what it saw).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stages_after_a_failed_one_in_a_chain_hand_on_what_they_hold() {
    for fuse in [true, false] {
        let plugins = TestPlugins::default();
        let text = format!(
            "settings: {{ fuse: {fuse} }}
stages:
  gen: {{ source: generator, count: 100, batch_size: 10, template: '{{\"seq\":{{{{seq}}}}}}' }}
  json: {{ parser: json, inputs: [gen] }}
  cursed: {{ transform: panic_on_seq_7, inputs: [json], on_error: fail }}
  count: {{ transform: count_at_end, inputs: [cursed] }}
  out: {{ sink: collect, inputs: [count] }}
"
        );
        let report = run(&text, &plugins).await;
        let failed: Vec<_> = report.failures.iter().map(|f| f.stage.as_str()).collect();
        assert_eq!(failed, ["cursed"], "fuse {fuse}: {report}");
        assert_eq!(report.totals.lost, 0, "fuse {fuse}: {report}");
        let out = plugins.events("out");
        let last = out.last().and_then(|e| e.as_fields()).expect("events");
        assert_eq!(last["counted"], 7, "fuse {fuse}: seq 0..=6 went through");
    }
}

/// A chain whose *middle* member fails ends as the stages would apart: the
/// members after it finish and hand on what they hold, the failed one is
/// not finished (what it would emit at its end never appears), and the
/// books balance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_middle_member_of_a_chain_is_not_finished() {
    for fuse in [true, false] {
        let plugins = TestPlugins::default();
        let registry = plugins.registry();
        let text = format!(
            "settings: {{ fuse: {fuse} }}
stages:
  gen: {{ source: generator, count: 100, batch_size: 10, template: '{{\"seq\":{{{{seq}}}}}}' }}
  json: {{ parser: json, inputs: [gen] }}
  failing: {{ transform: fail_counting, inputs: [json], on_error: fail }}
  count: {{ transform: count_at_end, inputs: [failing] }}
  out: {{ sink: collect, inputs: [count] }}
"
        );
        let p = valid(&text, &registry);
        if fuse {
            let chains: Vec<Vec<&str>> = p
                .fused_chains()
                .iter()
                .map(|c| c.iter().map(|s| s.id.as_str()).collect())
                .collect();
            assert_eq!(chains, [["json", "failing", "count"]]);
        }
        let report = start(&p, CancellationToken::new()).unwrap().wait().await;
        let failed: Vec<_> = report.failures.iter().map(|f| f.stage.as_str()).collect();
        assert_eq!(failed, ["failing"], "fuse {fuse}: {report}");
        assert_eq!(report.totals.lost, 0, "fuse {fuse}: {report}");
        let out = plugins.events("out");
        assert!(
            out.iter()
                .all(|e| !e.as_fields().unwrap().contains_key("failed_stage_saw")),
            "fuse {fuse}: the failed stage was finished: {:?}",
            out.last()
        );
        let last = out.last().and_then(|e| e.as_fields()).expect("events");
        assert_eq!(last["counted"], 7, "fuse {fuse}: seq 0..=6 went through");
        assert_eq!(seqs(&out[..7]), (0..7).collect::<Vec<_>>(), "fuse {fuse}");
    }
}

/// `transform: hold`: the first instance built stops on the event whose
/// `seq` is 50 until the test releases it (a chain worker caught in the
/// middle of a batch); every later instance notes whether it ever handled
/// an event while that first one was still held.
#[derive(Clone, Default)]
struct Hold {
    built: Arc<AtomicUsize>,
    holding: Arc<AtomicBool>,
    release: Arc<(Mutex<bool>, Condvar)>,
    successor_ran: Arc<AtomicBool>,
    successor_overlapped: Arc<AtomicBool>,
}

impl TypedPlugin for Hold {
    type Options = NoOptions;
    const NAME: &'static str = "hold";
    const KIND: StageKind = StageKind::Transform;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str = "test: the first instance stops on seq 50 until released";
    fn build(&self, _o: NoOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        let first = self.built.fetch_add(1, Ordering::SeqCst) == 0;
        let hold = self.clone();
        Ok(Box::new(
            move |e: &mut Event| -> Result<Verdict, EventError> {
                let seq = e.as_fields().and_then(|f| f.get("seq")?.as_u64());
                if first && seq == Some(50) {
                    hold.holding.store(true, Ordering::SeqCst);
                    // Off the runtime's worker: the tasks queued behind this
                    // one (the generator among them) go on elsewhere.
                    tokio::task::block_in_place(|| {
                        let (released, wake) = &*hold.release;
                        let mut released = released.lock().unwrap();
                        while !*released {
                            released = wake.wait(released).unwrap();
                        }
                    });
                    hold.holding.store(false, Ordering::SeqCst);
                } else if !first {
                    if hold.holding.load(Ordering::SeqCst) {
                        hold.successor_overlapped.store(true, Ordering::SeqCst);
                    }
                    hold.successor_ran.store(true, Ordering::SeqCst);
                }
                Ok(Verdict::Keep)
            },
        ))
    }
}

struct ReleaseOnDrop(Arc<(Mutex<bool>, Condvar)>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let (released, wake) = &*self.0;
        *released.lock().unwrap_or_else(|p| p.into_inner()) = true;
        wake.notify_all();
    }
}

/// The workers that take over from a split chain start only once its
/// workers have ended: while a chain worker is still inside a batch, no
/// successor handles an event (else the new instances' output could
/// overtake the old worker's batch, and what the old instances hold could
/// be handed on after events that came later).
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn the_stages_of_a_split_chain_wait_for_its_workers_to_end() {
    let text = |v: u32| {
        format!(
            "settings: {{ channel_capacity: 64, fuse: true }}
stages:
  gen: {{ source: generator, count: 2000, batch_size: 10, template: '{{\"seq\":{{{{seq}}}}}}' }}
  json: {{ parser: json, inputs: [gen] }}
  held: {{ transform: hold, inputs: [json] }}
  tag: {{ transform: fields, inputs: [held], set: {{ v: {v} }} }}
  out: {{ sink: collect, inputs: [tag] }}
"
        )
    };
    let plugins = TestPlugins::default();
    let hold = Hold::default();
    let mut registry = plugins.registry();
    registry.add(Typed(hold.clone()));
    let running = start(&valid(&text(1), &registry), CancellationToken::new()).unwrap();
    // Lets the held worker go when dropped: at the end of the wait below,
    // or when an assertion fails (else the runtime would wait for ever).
    let release = ReleaseOnDrop(hold.release.clone());
    wait_until("the chain worker to hold seq 50", || {
        hold.holding.load(Ordering::SeqCst)
    })
    .await;
    let summary = running.reload(valid(&text(2), &registry)).await.unwrap();
    assert_eq!(summary.changed, ["tag"]);
    assert_eq!(hold.built.load(Ordering::SeqCst), 2, "`held` rebuilt");
    // The successors are spawned; give them every chance to start early.
    // (A correct run cannot fail here; a successor that does not wait is
    // caught as soon as it handles its first event.)
    let began = std::time::Instant::now();
    while began.elapsed() < std::time::Duration::from_millis(500) {
        assert!(
            !hold.successor_ran.load(Ordering::SeqCst),
            "a successor handled an event while the split chain's worker held a batch"
        );
        tokio::task::yield_now().await;
    }
    drop(release);
    let report = running.wait().await;
    assert!(report.is_clean(), "{report}");
    assert!(hold.successor_ran.load(Ordering::SeqCst));
    assert!(!hold.successor_overlapped.load(Ordering::SeqCst));
    let events = plugins.events("out");
    assert_eq!(
        seqs(&events),
        (0..2000).collect::<Vec<_>>(),
        "once each, in order"
    );
    let tags: Vec<u64> = events
        .iter()
        .map(|e| e.as_fields().unwrap()["v"].as_u64().unwrap())
        .collect();
    // The held batch (seq 50..59) went out through the old `tag`.
    assert!(tags[..60].iter().all(|v| *v == 1), "{tags:?}");
    assert!(tags[60..].iter().all(|v| *v == 2), "{tags:?}");
}
