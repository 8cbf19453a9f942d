//! The runtime's promises: backpressure without loss, exact fan-in and
//! fan-out, `on_error` handling, failure draining, and long chains.

use std::sync::Arc;
use std::time::{Duration, Instant};

use logbus_core::{RunReport, start};
use logbus_plugin_api::CancellationToken;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::support::{TestPlugins, seqs, valid};

/// Spins (yielding to the runtime) until `cond` holds; fails after `limit`.
/// Waiting for a condition is not a timing assertion: only a hang fails it.
async fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::task::yield_now().await;
    }
}

async fn run(text: &str, plugins: &TestPlugins) -> RunReport {
    let p = valid(text, &plugins.registry());
    let running = start(&p, CancellationToken::new()).unwrap_or_else(|e| panic!("{e:?}"));
    running.wait().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_sink_stalls_the_source_and_loses_nothing() {
    slow_sink_stalls_the_source(false).await;
}

/// The same with `lines` and `json` fused: the chain reads the first
/// queue, so only two queues fill, and the chain holds what it took from
/// the first until the sink has room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_sink_stalls_the_source_through_a_fused_chain() {
    slow_sink_stalls_the_source(true).await;
}

async fn slow_sink_stalls_the_source(fuse: bool) {
    const N: u64 = 20_000;
    const CAP: usize = 64;
    let gate = Arc::new(Semaphore::new(0));
    let plugins = TestPlugins {
        gate: Some(gate.clone()),
        ..Default::default()
    };
    let p = valid(
        &format!(
            "settings: {{ channel_capacity: {CAP}, fuse: {fuse} }}\nstages:\n  gen: {{ source: generator, count: {N}, batch_size: 16 }}\n  lines: {{ parser: lines, inputs: [gen] }}\n  json: {{ parser: json, inputs: [lines] }}\n  out: {{ sink: gated, inputs: [json] }}\n"
        ),
        &plugins.registry(),
    );
    let running = start(&p, CancellationToken::new()).unwrap();
    let channels: Vec<_> = running.channels.iter().map(|(_, c)| c.clone()).collect();
    let queues = if fuse { 2 } else { 3 };
    assert_eq!(channels.len(), queues, "queues read");
    // With the sink closed, every channel fills up and the source must stop.
    wait_until("every channel to fill", Duration::from_secs(30), || {
        channels.iter().all(|c| c.occupancy() == CAP)
    })
    .await;
    let source = running.metrics("gen").unwrap().clone();
    // The source counts a batch once its send returned, a moment after the
    // channel took it: wait for the count to catch up with what the full
    // channels hold (nothing has left them: the sink is closed). The
    // first queue may be full with part of the source's next batch (a
    // send takes its permits as they come), which is not counted yet.
    wait_until(
        "the source's count to reach the channels",
        Duration::from_secs(30),
        || source.snapshot().events_out >= (queues * CAP - 16) as u64,
    )
    .await;
    // The count may still take the one batch whose send had all its
    // permits when the count was read (it returns a moment later); after
    // that, nothing more.
    let reached = source.snapshot().events_out;
    for _ in 0..1000 {
        tokio::task::yield_now().await;
    }
    let stalled_at = source.snapshot().events_out;
    assert!(
        stalled_at - reached <= 16,
        "the source kept emitting into full channels: {reached}, then {stalled_at}"
    );
    for _ in 0..1000 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        source.snapshot().events_out,
        stalled_at,
        "the source kept emitting into full channels"
    );
    // Bound: the queues of CAP, plus the one batch the source is blocked sending.
    assert!(
        stalled_at <= (queues * CAP + 16) as u64,
        "emitted {stalled_at} while stalled"
    );
    assert!(stalled_at < N);

    gate.add_permits(1_000_000);
    let report = running.wait().await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.totals.emitted, N);
    assert_eq!(report.totals.committed, N);
    for ch in &report.channels {
        assert!(
            ch.max_occupancy <= CAP,
            "channel into `{}` held {} > {CAP}",
            ch.stage,
            ch.max_occupancy
        );
    }
    assert_eq!(
        seqs(&plugins.events("out")),
        (0..N).collect::<Vec<_>>(),
        "every event arrives intact, in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_in_and_fan_out_deliver_exact_counts_and_content() {
    let plugins = TestPlugins::default();
    let report = run(
        "settings: { channel_capacity: 100 }\nstages:
  a: { source: generator, count: 3000, template: '{\"seq\":{{seq}},\"from\":\"a\"}' }
  b: { source: generator, count: 2000, template: '{\"seq\":{{seq}},\"from\":\"b\"}' }
  json: { parser: json, inputs: [a, b] }
  tag: { transform: fields, inputs: [json], set: { tagged: true } }
  left: { sink: collect, inputs: [tag] }
  right: { sink: collect, inputs: [tag] }
  raw: { sink: collect, inputs: [json] }
",
        &plugins,
    )
    .await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.totals.emitted, 5000);
    assert_eq!(report.totals.committed, 15000);
    for sink in ["left", "right", "raw"] {
        let events = plugins.events(sink);
        assert_eq!(events.len(), 5000, "{sink}");
        for from in ["a", "b"] {
            let mut s: Vec<u64> = events
                .iter()
                .filter(|e| e.as_fields().unwrap()["from"] == from)
                .map(|e| e.as_fields().unwrap()["seq"].as_u64().unwrap())
                .collect();
            // Per source, order is kept through fan-in.
            let expected: Vec<u64> = (0..if from == "a" { 3000 } else { 2000 }).collect();
            assert_eq!(s, expected, "{sink} from {from}");
            s.clear();
        }
    }
    // A stage that mutates after fan-out gets its own copy: `raw` never saw the tag.
    assert!(
        plugins
            .events("raw")
            .iter()
            .all(|e| e.as_fields().unwrap().get("tagged").is_none())
    );
    assert!(
        plugins
            .events("left")
            .iter()
            .all(|e| e.as_fields().unwrap()["tagged"] == json!(true))
    );
}

/// A stage that turns one event into several (a JSON array line) counts
/// the extra ones as created, one that turns it into none as discarded,
/// and the books balance, fused or apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_replaced_by_several_or_none_counts_as_created_or_discarded() {
    for fuse in [true, false] {
        let plugins = TestPlugins::default();
        let text = format!(
            "settings: {{ fuse: {fuse} }}
stages:
  gen: {{ source: generator, count: 100, template: '[{{\"seq\":{{{{seq}}}}}},{{\"seq\":{{{{seq}}}}}},{{\"seq\":{{{{seq}}}}}}]' }}
  empty: {{ source: generator, count: 10, template: '[]' }}
  json: {{ parser: json, inputs: [gen, empty] }}
  tag: {{ transform: fields, inputs: [json], set: {{ t: 1 }} }}
  out: {{ sink: collect, inputs: [tag] }}
"
        );
        let report = start(&valid(&text, &plugins.registry()), CancellationToken::new())
            .unwrap()
            .wait()
            .await;
        assert!(report.is_clean(), "fuse {fuse}: {report}");
        assert_eq!(report.totals.lost, 0, "fuse {fuse}: {report}");
        let json = &report
            .stages
            .iter()
            .find(|s| s.id == "json")
            .unwrap()
            .counts;
        assert_eq!(
            (
                json.events_in,
                json.created,
                json.discarded,
                json.events_out
            ),
            (110, 200, 10, 300),
            "fuse {fuse}"
        );
        assert_eq!(plugins.events("out").len(), 300, "fuse {fuse}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_json_is_dropped_and_counted() {
    let plugins = TestPlugins::default();
    let report = run(
        "stages:
  a: { source: generator, count: 300, template: 'x{{seq}}' }
  b: { source: generator, count: 600, template: '{\"seq\":{{seq}}}' }
  json: { parser: json, inputs: [a, b], on_error: drop }
  out: { sink: collect, inputs: [json] }
",
        &plugins,
    )
    .await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.totals.emitted, 900);
    assert_eq!(report.totals.errored, 300);
    assert_eq!(report.totals.committed, 600);
    assert_eq!(report.totals.lost, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_json_is_routed_with_the_error_attached() {
    let plugins = TestPlugins::default();
    let report = run(
        "stages:
  a: { source: generator, count: 300, template: 'x{{seq}}' }
  b: { source: generator, count: 600, template: '{\"seq\":{{seq}}}' }
  json: { parser: json, inputs: [a, b], on_error: route }
  out: { sink: collect, inputs: [json] }
  bad: { sink: collect, inputs: [json.errors] }
",
        &plugins,
    )
    .await;
    assert!(report.is_clean(), "{report}");
    assert_eq!((report.totals.committed, report.totals.errored), (900, 0));
    let json = report.stages.iter().find(|s| s.id == "json").unwrap();
    assert_eq!(json.counts.routed, 300);
    let bad = plugins.events("bad");
    assert_eq!(bad.len(), 300);
    let mut texts: Vec<String> = bad
        .iter()
        .map(|e| {
            e.as_fields().unwrap()["message"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    texts.sort_by_key(|t| t[1..].parse::<u32>().unwrap());
    assert_eq!(texts, (0..300).map(|i| format!("x{i}")).collect::<Vec<_>>());
    let err = &bad[0].as_fields().unwrap()["_error"];
    assert_eq!(err["stage"], "json");
    assert!(
        err["message"].as_str().unwrap().starts_with("invalid JSON"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_json_with_fail_stops_the_stage_and_drains() {
    let plugins = TestPlugins::default();
    let report = run(
        "settings: { channel_capacity: 16 }\nstages:
  good: { source: generator, count: 100000, template: '{\"seq\":{{seq}}}' }
  bad: { source: generator, count: 1, template: 'not json' }
  json: { parser: json, inputs: [good, bad], on_error: fail }
  out: { sink: collect, inputs: [json] }
",
        &plugins,
    )
    .await;
    assert_eq!(report.failures.len(), 1, "{report}");
    assert_eq!(report.failures[0].stage, "json");
    assert!(
        report.failures[0].message.contains("on_error: fail"),
        "{report}"
    );
    // Nothing vanished: what was not committed is counted as errored.
    assert_eq!(report.totals.lost, 0, "{report}");
    assert_eq!(
        report.totals.emitted,
        report.totals.committed + report.totals.errored
    );
    assert!(!report.is_clean());
}

/// A processor's panic on one event (a third-party decoder meeting input
/// it never expected) is that event's error, handled by `on_error`: routed
/// here, and every other event goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_on_one_event_is_that_events_error() {
    let plugins = TestPlugins::default();
    let report = run(
        "settings: { channel_capacity: 8 }\nstages:
  gen: { source: generator, count: 5000, template: '{\"seq\":{{seq}}}', batch_size: 4 }
  json: { parser: json, inputs: [gen] }
  cursed: { transform: panic_on_seq_7, inputs: [json], on_error: route }
  out: { sink: collect, inputs: [cursed] }
  bad: { sink: collect, inputs: [cursed.errors] }
",
        &plugins,
    )
    .await;
    assert!(report.failures.is_empty(), "{report}");
    assert_eq!(plugins.events("out").len(), 4999);
    let bad = plugins.events("bad");
    assert_eq!(bad.len(), 1);
    let error = &bad[0].as_fields().unwrap()["_error"];
    assert_eq!(error["stage"], "cursed");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("panicked on this event: seq 7 is cursed"),
        "{error}"
    );
    assert_eq!(report.totals.lost, 0, "{report}");
}

/// With `on_error: fail` the panic fails the stage, reported by name, and
/// the rest drains without loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_with_on_error_fail_is_a_reported_failure_not_a_crash() {
    let plugins = TestPlugins::default();
    let report = run(
        "settings: { channel_capacity: 8 }\nstages:
  gen: { source: generator, count: 5000, template: '{\"seq\":{{seq}}}', batch_size: 4 }
  json: { parser: json, inputs: [gen] }
  cursed: { transform: panic_on_seq_7, inputs: [json], on_error: fail }
  out: { sink: collect, inputs: [cursed] }
",
        &plugins,
    )
    .await;
    assert_eq!(report.failures.len(), 1, "{report}");
    assert_eq!(report.failures[0].stage, "cursed");
    assert!(
        report.failures[0].message.contains("seq 7 is cursed"),
        "{report}"
    );
    assert_eq!(report.totals.lost, 0, "{report}");
    assert_eq!(
        report.totals.emitted,
        report.totals.committed + report.totals.errored
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_cannot_open_its_file_fails_and_the_rest_drains() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = TestPlugins::default();
    let report = run(
        &format!(
            "stages:\n  gen: {{ source: generator, count: 10000 }}\n  out: {{ sink: file, inputs: [gen], path: {}/missing/dir/out.log }}\n  ok: {{ sink: collect, inputs: [gen] }}\n",
            dir.path().display()
        ),
        &plugins,
    )
    .await;
    assert_eq!(report.failures.len(), 1, "{report}");
    assert_eq!(report.failures[0].stage, "out");
    assert!(report.failures[0].message.contains("opening"), "{report}");
    assert_eq!(report.totals.lost, 0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_stages_in_a_chain() {
    let mut text = String::from(
        "settings: { channel_capacity: 256 }\nstages:\n  gen: { source: generator, count: 20000 }\n  json: { parser: json, inputs: [gen] }\n",
    );
    let mut prev = "json".to_string();
    for i in 0..47 {
        text.push_str(&format!(
            "  t{i}: {{ transform: fields, inputs: [{prev}], set: {{ f{i}: {i} }} }}\n"
        ));
        prev = format!("t{i}");
    }
    text.push_str(&format!("  out: {{ sink: collect, inputs: [{prev}] }}\n"));
    let plugins = TestPlugins::default();
    let p = valid(&text, &plugins.registry());
    assert_eq!(p.stages.len(), 50);
    let running = start(&p, CancellationToken::new()).unwrap();
    let report = running.wait().await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.totals.committed, 20000);
    for stage in &report.stages[1..] {
        assert_eq!(
            stage.counts.events_in, 20000,
            "stage {} passed a different count",
            stage.id
        );
    }
    let events = plugins.events("out");
    assert_eq!(seqs(&events), (0..20000).collect::<Vec<_>>());
    let last = events.last().unwrap().as_fields().unwrap();
    assert!((0..47).all(|i| last[&format!("f{i}")] == json!(i)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_an_endless_source_and_drains_everything() {
    let plugins = TestPlugins::default();
    let p = valid(
        "settings: { channel_capacity: 64 }\nstages:\n  gen: { source: generator }\n  json: { parser: json, inputs: [gen] }\n  out: { sink: collect, inputs: [json] }\n",
        &plugins.registry(),
    );
    let running = start(&p, CancellationToken::new()).unwrap();
    let out = running.metrics("out").unwrap().clone();
    wait_until("some events to arrive", Duration::from_secs(30), || {
        out.snapshot().events_out > 10_000
    })
    .await;
    running.shutdown();
    let report = running.wait().await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.totals.emitted, report.totals.committed);
    let n = report.totals.committed;
    assert_eq!(seqs(&plugins.events("out")), (0..n).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_reading_source_stops_reading_when_the_pipeline_is_full() {
    // The file source shares its reader with stdin: when the output channel
    // is full, the reader thread blocks and reads nothing more.
    const CAP: usize = 128;
    let dir = tempfile::tempdir().unwrap();
    let lines: u64 = 200_000;
    let text: String = (0..lines).map(|i| format!("{{\"seq\":{i}}}\n")).collect();
    std::fs::write(dir.path().join("in.ndjson"), text).unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let plugins = TestPlugins {
        gate: Some(gate.clone()),
        ..Default::default()
    };
    let p = valid(
        &format!(
            "settings: {{ channel_capacity: {CAP} }}\nstages:\n  read: {{ source: file, path: {}/in.ndjson }}\n  json: {{ parser: json, inputs: [read] }}\n  out: {{ sink: gated, inputs: [json] }}\n",
            dir.path().display()
        ),
        &plugins.registry(),
    );
    let running = start(&p, CancellationToken::new()).unwrap();
    let channels: Vec<_> = running.channels.iter().map(|(_, c)| c.clone()).collect();
    wait_until("the channels to fill", Duration::from_secs(30), || {
        channels.iter().all(|c| c.occupancy() == CAP)
    })
    .await;
    let read = running.metrics("read").unwrap().clone();
    let stalled_at = read.snapshot().events_out;
    for _ in 0..1000 {
        tokio::task::yield_now().await;
    }
    assert_eq!(read.snapshot().events_out, stalled_at);
    // Two channels, plus what the reader holds: one batch being sent, one in
    // the hand-off slot, one read chunk (128 KiB of ~13-byte lines).
    let per_chunk = 128 * 1024 / 12;
    assert!(
        stalled_at <= (2 * CAP) as u64 + 3 * per_chunk,
        "emitted {stalled_at}"
    );
    assert!(
        stalled_at < lines / 2,
        "the source read on while the sink was stalled"
    );
    gate.add_permits(1_000_000);
    let report = running.wait().await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(seqs(&plugins.events("out")), (0..lines).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sink_stops_an_endless_source() {
    let plugins = TestPlugins::default();
    let p = valid(
        "stages:\n  gen: { source: generator }\n  out: { sink: file, inputs: [gen], path: /dev/full }\n",
        &plugins.registry(),
    );
    let running = start(&p, CancellationToken::new()).unwrap();
    // Without the failure stopping the sources this never ends.
    let report = tokio::time::timeout(Duration::from_secs(60), running.wait())
        .await
        .expect("the pipeline ended after its sink failed");
    assert_eq!(report.failures.len(), 1, "{report}");
    assert_eq!(report.failures[0].stage, "out");
    assert!(
        report.failures[0].message.contains("writing /dev/full"),
        "{report}"
    );
    assert_eq!(report.totals.lost, 0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_nobody_reads_never_slows_or_loses_data_path_events() {
    let plugins = TestPlugins::default();
    let p = valid(
        "settings: { channel_capacity: 64 }\nstages:\n  gen: { source: generator, count: 50000, template: '{\"seq\":{{seq}}}' }\n  json: { parser: json, inputs: [gen] }\n  out: { sink: collect, inputs: [json] }\n",
        &plugins.registry(),
    );
    let running = start(&p, CancellationToken::new()).unwrap();
    let stats = running.stats();
    // Two taps with room for 8 events each, never read.
    let taps = [stats.tap("json", 8).unwrap(), stats.tap("gen", 8).unwrap()];
    assert!(stats.tap("out", 8).is_none(), "a sink has no output to tap");
    assert!(stats.tap("nope", 8).is_none());
    let report = running.wait().await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.totals.committed, 50000);
    assert_eq!(seqs(&plugins.events("out")), (0..50000).collect::<Vec<_>>());
    for tap in &taps {
        assert!(
            tap.dropped() > 0,
            "the full tap dropped instead of blocking"
        );
    }
}

/// An HTTP endpoint on loopback that answers every request with `status`
/// (a real socket and a real HTTP/1.1 exchange, for the http sink).
async fn http_endpoint(status: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ingest", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 16];
                let mut seen = Vec::new();
                // Headers, then as much body as Content-Length says.
                loop {
                    let Ok(n) = conn.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if seen.len() < end + 4 + len {
                        continue;
                    }
                    seen.drain(..end + 4 + len);
                    let answer = format!(
                        "HTTP/1.1 {status} Whatever\r\ncontent-length: 12\r\n\r\nnot for you\n"
                    );
                    if conn.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_sink_cannot_deliver_goes_to_its_dead_letter_reader() {
    let url = http_endpoint(400).await;
    let plugins = TestPlugins::default();
    let report = run(
        &format!(
            "stages:\n  gen: {{ source: generator, count: 500 }}\n  json: {{ parser: json, inputs: [gen] }}\n  out: {{ sink: http, inputs: [json], url: \"{url}\", batch_max_events: 100 }}\n  dead: {{ sink: collect, inputs: [out.dead] }}\n"
        ),
        &plugins,
    )
    .await;
    assert!(report.is_clean(), "{report}");
    let dead = plugins.events("dead");
    assert_eq!(dead.len(), 500);
    let mut got: Vec<u64> = dead
        .iter()
        .map(|e| {
            let f = e.as_fields().unwrap();
            assert_eq!(f["_error"]["stage"], "out");
            let why = f["_error"]["message"].as_str().unwrap();
            assert!(why.starts_with("HTTP 400: not for you"), "{why}");
            f["seq"].as_u64().unwrap()
        })
        .collect();
    got.sort();
    assert_eq!(got, (0..500).collect::<Vec<_>>());
    let out = report.stages.iter().find(|s| s.id == "out").unwrap();
    assert_eq!((out.counts.events_out, out.counts.routed), (0, 500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_still_retrying_at_the_drain_deadline_gives_up_and_says_what_it_held() {
    let url = http_endpoint(503).await;
    let plugins = TestPlugins::default();
    let p = valid(
        &format!(
            "settings: {{ channel_capacity: 64, drain_timeout_ms: 300 }}\nstages:\n  gen: {{ source: generator }}\n  out: {{ sink: http, inputs: [gen], url: \"{url}\", batch_max_events: 10, batch_timeout_ms: 1, retry_initial_backoff_ms: 1, retry_max_backoff_ms: 20 }}\n"
        ),
        &plugins.registry(),
    );
    let running = start(&p, CancellationToken::new()).unwrap();
    let out = running.metrics("out").unwrap().clone();
    wait_until("the sink to hold events", Duration::from_secs(30), || {
        out.snapshot().events_in > 0
    })
    .await;
    running.shutdown();
    // Without the deadline this would retry for ever.
    let report = tokio::time::timeout(Duration::from_secs(60), running.wait())
        .await
        .expect("the drain deadline ends the run");
    assert_eq!(report.failures.len(), 1, "{report}");
    let failure = &report.failures[0];
    assert_eq!(failure.stage, "out");
    assert!(
        failure.message.contains("the drain deadline passed with")
            && failure.message.contains(&url),
        "{}",
        failure.message
    );
    // Nothing vanished: what the sink held is counted as errored.
    assert_eq!(report.totals.lost, 0, "{report}");
    assert_eq!(report.totals.committed, 0);
    assert_eq!(report.totals.errored, report.totals.emitted, "{report}");
}

/// A plugin written against `Plugin` by hand (not `Typed`, where this does
/// not compile) whose kind says sink but which builds a processor: the
/// pipeline does not start, and the error names the stage and the bug.
#[tokio::test]
async fn a_plugin_that_builds_another_kind_of_stage_is_refused_at_start() {
    use logbus_plugin_api::{
        BuildContext, Built, EventError, OptionError, Plugin, StageKind, Verdict,
    };
    struct MisKinded;
    impl Plugin for MisKinded {
        fn name(&self) -> &'static str {
            "mis_kinded"
        }
        fn kind(&self) -> StageKind {
            StageKind::Sink
        }
        fn description(&self) -> &'static str {
            "test: says sink, builds a processor"
        }
        fn options_schema(&self) -> serde_json::Value {
            json!({ "type": "object" })
        }
        fn check(&self, _: &serde_json::Value, _: &BuildContext) -> Vec<OptionError> {
            Vec::new()
        }
        fn build(
            &self,
            _: &serde_json::Value,
            _: &BuildContext,
        ) -> Result<Built, Vec<OptionError>> {
            Ok(Built::Processor(Box::new(
                |_: &mut logbus_plugin_api::Event| -> Result<Verdict, EventError> {
                    Ok(Verdict::Keep)
                },
            )))
        }
    }
    let mut registry = TestPlugins::default().registry();
    registry.add(MisKinded);
    let p = valid(
        "stages:\n  gen: { source: generator, count: 1 }\n  out: { sink: mis_kinded, inputs: [gen] }\n",
        &registry,
    );
    let Err(errors) = start(&p, CancellationToken::new()) else {
        panic!("started a sink that is a processor");
    };
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].stage, "out");
    assert_eq!(
        errors[0].message,
        "plugin `mis_kinded` is a sink but built a Processor (a bug in the plugin)"
    );
}
