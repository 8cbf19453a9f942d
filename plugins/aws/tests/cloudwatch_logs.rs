//! `sink: cloudwatch_logs` against moto's CloudWatch Logs server
//! (`.ci/services up cloudwatch`); what was stored is read back by boto3.

use std::sync::Arc;

use logbus_plugin_api::testing;
use logbus_plugin_api::{
    Event, Meta, Output, OutputRole, SinkContext, StageMetrics, Typed, channel,
};
use serde_json::{Value, json};

use logbus_test_services::aws::{cloudwatch, logs_python, merged};

fn now_ms() -> i64 {
    (logbus_plugin_api::now_ns() / 1_000_000) as i64
}

fn event(v: Value) -> Event {
    Event::fields(v.as_object().unwrap().clone(), Meta::now("src".into()))
}

fn unique(name: &str) -> String {
    format!(
        "{name}-{}-{}",
        std::process::id(),
        logbus_plugin_api::now_ns() % 1_000_000_000
    )
}

/// Runs the sink over `events`; returns how it ended, its counters and
/// what went to `<id>.dead`.
async fn run(
    url: &str,
    more: Value,
    events: Vec<Event>,
) -> (Result<(), String>, Arc<StageMetrics>, Vec<Event>) {
    let mut o = json!({
        "endpoint": url, "region": "us-east-1",
        "access_key_id": "test", "secret_access_key": "test",
        "batch_timeout_ms": 50, "retry_initial_backoff_ms": 10, "retry_max_backoff_ms": 100,
    });
    for (k, v) in more.as_object().unwrap() {
        o[k] = v.clone();
    }
    let sink = testing::sink(&Typed(logbus_aws::cloudwatch_logs::CloudWatchLogsSink), o);
    let (tx, rx) = channel(100_000);
    let metrics = Arc::new(StageMetrics::default());
    let mut cx = SinkContext::new("cw", rx, metrics.clone());
    let (dead_tx, mut dead_rx) = channel(100_000);
    cx.dead = Output::new(vec![dead_tx], metrics.clone(), OutputRole::Errors);
    tx.send(events).await.unwrap();
    drop(tx);
    let result = sink.run(&mut cx).await.map_err(|e| e.to_string());
    drop(cx);
    let mut dead = Vec::new();
    while let Some(mut b) = dead_rx.recv().await {
        dead.extend(b.take());
    }
    (result, metrics, dead)
}

/// Every message of a stream, oldest first: (timestamp, message).
fn stored(url: &str, group: &str, stream: &str) -> Vec<(i64, String)> {
    let out = logs_python(
        url,
        "out, token = [], None\n\
         while True:\n\
         \x20   kw = dict(logGroupName=ARGS[0], logStreamName=ARGS[1], startFromHead=True)\n\
         \x20   if token: kw['nextToken'] = token\n\
         \x20   r = logs.get_log_events(**kw)\n\
         \x20   out += [[e['timestamp'], e['message']] for e in r['events']]\n\
         \x20   if not r['events'] or r.get('nextForwardToken') == token: break\n\
         \x20   token = r.get('nextForwardToken')\n\
         print(json.dumps(out))",
        &[group, stream],
    );
    serde_json::from_str(out.trim()).unwrap()
}

/// Group and stream come from each event's fields; both are created when
/// missing (the group with its retention); each stream holds its events
/// sorted by time although they arrived out of order.
#[ignore = "needs a CloudWatch Logs server (.ci/services up cloudwatch); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_their_streams_sorted_and_missing_ones_are_created() {
    let url = cloudwatch();
    let app = unique("app");
    let now = now_ms();
    let events = vec![
        event(json!({"service": "api", "ts": now - 2000, "msg": "second"})),
        event(json!({"service": "api", "ts": now - 3000, "msg": "first"})),
        event(json!({"service": "db", "ts": now - 1000, "msg": "only"})),
        event(json!({"service": "api", "ts": now, "msg": "third"})),
    ];
    let (result, metrics, dead) = run(
        &url,
        json!({"group": format!("/{app}/{{{{service}}}}"), "stream": "main", "timestamp_field": "ts", "retention_days": 7}),
        events,
    )
    .await;
    result.unwrap();
    assert!(dead.is_empty());
    assert_eq!(metrics.snapshot().events_out, 4);
    let api = stored(&url, &format!("/{app}/api"), "main");
    let messages: Vec<String> = api
        .iter()
        .map(|(_, m)| {
            serde_json::from_str::<Value>(m).unwrap()["msg"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(messages, ["first", "second", "third"]);
    assert_eq!(api[0].0, now - 3000);
    assert_eq!(stored(&url, &format!("/{app}/db"), "main").len(), 1);
    let retention = logs_python(
        &url,
        "print(logs.describe_log_groups(logGroupNamePrefix=ARGS[0])['logGroups'][0].get('retentionInDays'))",
        &[&format!("/{app}/api")],
    );
    assert_eq!(retention.trim(), "7");
}

/// Events the service refuses as too old or too new go to `<id>.dead`
/// with the reason; the rest of their request is stored.
#[ignore = "needs a CloudWatch Logs server (.ci/services up cloudwatch); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_too_old_or_too_new_go_to_dead_with_the_reason() {
    let url = cloudwatch();
    let group = unique("edge");
    let now = now_ms();
    let events = vec![
        event(json!({"ts": now + 3 * 3600 * 1000, "msg": "from the future"})),
        event(json!({"ts": now, "msg": "fine"})),
        event(json!({"ts": now - 20 * 24 * 3600 * 1000, "msg": "ancient"})),
    ];
    let (result, _, dead) = run(
        &url,
        json!({"group": group, "stream": "s", "timestamp_field": "ts"}),
        events,
    )
    .await;
    result.unwrap();
    let mut reasons: Vec<(String, String)> = dead
        .iter()
        .map(|e| {
            let f = e.as_fields().unwrap();
            (
                f["msg"].as_str().unwrap().to_string(),
                f["_error"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    reasons.sort();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert_eq!(reasons[0].0, "ancient");
    assert!(reasons[0].1.contains("too old"), "{reasons:?}");
    assert_eq!(reasons[1].0, "from the future");
    assert!(reasons[1].1.contains("too new"), "{reasons:?}");
    let kept = stored(&url, &group, "s");
    assert_eq!(kept.len(), 1);
    assert!(kept[0].1.contains("fine"));
}

/// 25,000 events spanning two days (so in requests of at most 10,000
/// events within one day each: the unit tests check the split, which the
/// test server does not enforce) are all stored, in order.
#[ignore = "needs a CloudWatch Logs server (.ci/services up cloudwatch); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_events_are_split_within_the_service_s_limits() {
    let url = cloudwatch();
    let group = unique("bulk");
    let now = now_ms();
    let day = 24 * 3600 * 1000;
    let events: Vec<Event> = (0..25_000i64)
        .map(|i| event(json!({"ts": now - day - 60_000 + i * 5, "i": i})))
        .collect();
    let (result, metrics, dead) = run(
        &url,
        json!({"group": group, "stream": "s", "timestamp_field": "ts"}),
        events,
    )
    .await;
    result.unwrap();
    assert!(dead.is_empty());
    assert_eq!(metrics.snapshot().events_out, 25_000);
    let all = stored(&url, &group, "s");
    assert_eq!(all.len(), 25_000);
    let order: Vec<i64> = all.iter().map(|(t, _)| *t).collect();
    assert!(order.windows(2).all(|w| w[0] <= w[1]));
}

/// With `create_missing: false`, a missing group is refused for good
/// (`<id>.dead`, with the reason).
#[ignore = "needs a CloudWatch Logs server (.ci/services up cloudwatch); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_group_is_refused_without_create_missing() {
    let url = cloudwatch();
    let group = unique("absent");
    let (result, _, dead) = run(
        &url,
        json!({"group": group, "stream": "s", "create_missing": false}),
        vec![event(json!({"msg": "x"}))],
    )
    .await;
    result.unwrap();
    assert_eq!(dead.len(), 1);
    let why = dead[0].as_fields().unwrap()["_error"]["message"].to_string();
    assert!(
        why.contains("does not exist") && why.contains(&group),
        "{why}"
    );
}

/// A stream new to a group that exists is created in it (the group's own
/// creation finds it there and goes on).
#[ignore = "needs a CloudWatch Logs server (.ci/services up cloudwatch); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_stream_of_an_existing_group_is_created() {
    let url = cloudwatch();
    let group = unique("grow");
    for stream in ["first", "second"] {
        let (result, _, dead) = run(
            &url,
            json!({"group": group, "stream": stream}),
            vec![event(json!({"msg": stream}))],
        )
        .await;
        result.unwrap();
        assert!(dead.is_empty(), "{stream}: {dead:?}");
        let kept = stored(&url, &group, stream);
        assert_eq!(kept.len(), 1, "{stream}");
        assert!(kept[0].1.contains(stream), "{kept:?}");
    }
}

/// A group the service will not create (its name is over 512 characters)
/// is refused for good with the service's own reason for the group, not
/// a later one for its stream.
#[ignore = "needs a CloudWatch Logs server (.ci/services up cloudwatch); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_the_service_will_not_create_is_refused_with_its_reason() {
    let url = cloudwatch();
    let group = format!("{}-{}", unique("long"), "g".repeat(512));
    let (result, _, dead) = run(
        &url,
        json!({"group": group, "stream": "s"}),
        vec![event(json!({"msg": "x"}))],
    )
    .await;
    result.unwrap();
    assert_eq!(dead.len(), 1);
    let why = dead[0].as_fields().unwrap()["_error"]["message"].to_string();
    assert!(why.contains("InvalidParameterException"), "{why}");
}

/// A service that cannot be reached is retried, `create_missing` or not
/// (only a missing group or stream is refused without it), until
/// `retry_max_attempts`; then the event goes to `<id>.dead` saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_service_is_retried_then_given_up() {
    let port = logbus_test_ports::free_port();
    let (result, metrics, dead) = run(
        &format!("http://127.0.0.1:{port}"),
        json!({"group": "g", "stream": "s", "create_missing": false, "retry_max_attempts": 2}),
        vec![event(json!({"msg": "x"}))],
    )
    .await;
    result.unwrap();
    assert_eq!(metrics.snapshot().retried, 1);
    assert_eq!(dead.len(), 1);
    let why = dead[0].as_fields().unwrap()["_error"]["message"].to_string();
    assert!(
        why.contains("gave up: 2 attempts") && why.contains("log group g: dispatch failure"),
        "{why}"
    );
}

#[test]
fn option_errors_name_the_option() {
    let e = |o: Value| {
        testing::option_errors(&Typed(logbus_aws::cloudwatch_logs::CloudWatchLogsSink), o)
    };
    assert_eq!(e(json!({"group": "g", "stream": "s"})), "");
    assert_eq!(
        e(json!({"group": "g", "stream": "s", "batch_max_events": 20000})),
        "batch_max_events: at most 10000 (the service's limit per request)"
    );
    assert_eq!(
        e(json!({"group": "g", "stream": "s", "retention_days": 2})),
        "retention_days: 2 is not a retention CloudWatch accepts ([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653])"
    );
    assert_eq!(
        e(json!({"group": "", "stream": "s"})),
        "group: must not be empty"
    );
    // The service's limits at their edges.
    let with = |more: Value| e(merged(json!({"group": "g", "stream": "s"}), more));
    assert_eq!(with(json!({"batch_max_events": 10_000})), "");
    assert_eq!(
        with(json!({"batch_max_events": 10_001})),
        "batch_max_events: at most 10000 (the service's limit per request)"
    );
    assert_eq!(with(json!({"batch_max_bytes": 1_048_576})), "");
    assert_eq!(
        with(json!({"batch_max_bytes": 1_048_577})),
        "batch_max_bytes: at most 1048576 (the service's limit per request, 26 bytes per event included)"
    );
    assert_eq!(with(json!({"retention_days": 3653})), "");
    assert_eq!(with(json!({"stream": ""})), "stream: must not be empty");
    assert!(
        with(json!({"stream": "%Q"})).starts_with("stream: `%Q`"),
        "{}",
        with(json!({"stream": "%Q"}))
    );
    assert_eq!(with(json!({"timestamp_field": "at.when"})), "");
    assert!(
        with(json!({"timestamp_field": "a..b"})).starts_with("timestamp_field: "),
        "{}",
        with(json!({"timestamp_field": "a..b"}))
    );
}

/// `validate --connect`: with `create_missing: false` a missing group or
/// stream is found; with it (the default), nothing.
#[ignore = "needs a CloudWatch Logs server (.ci/services up cloudwatch); run with --include-ignored"]
#[tokio::test]
async fn the_probe_finds_what_would_not_be_created() {
    let url = cloudwatch();
    let group = unique("probe");
    logs_python(
        &url,
        "logs.create_log_group(logGroupName=ARGS[0]); logs.create_log_stream(logGroupName=ARGS[0], logStreamName='s1')",
        &[&group],
    );
    let plugin = Typed(logbus_aws::cloudwatch_logs::CloudWatchLogsSink);
    let probe = |group: String, stream: &str, create: bool| {
        testing::probe(
            &plugin,
            json!({ "group": group, "stream": stream, "create_missing": create, "endpoint": url,
                    "region": "us-east-1", "access_key_id": "test", "secret_access_key": "test" }),
            None,
        )
    };
    assert!(probe(group.clone(), "s1", false).await.is_empty());
    assert_eq!(
        probe(format!("{group}-absent"), "s1", false).await,
        ["group service-missing"]
    );
    assert_eq!(
        probe(group.clone(), "s2", false).await,
        ["stream service-missing"]
    );
    assert!(
        probe(format!("{group}-absent"), "s1", true)
            .await
            .is_empty()
    );
}
