//! `sink: opensearch` against a real OpenSearch 2.19 node (started by
//! `.ci/services up opensearch` on 127.0.0.1:9200, or
//! `LOGBUS_OPENSEARCH_URL`), with indices prepared and documents read back
//! by an independent client, opensearch-py. The tests that need the node
//! are ignored unless run with `--include-ignored` (CI does); then a
//! missing node fails them.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Arc;

use logbus_test_services::opensearch::{documents, node, python, unique};

use logbus_plugin_api::testing;
use logbus_plugin_api::{
    Event, Meta, Output, OutputRole, SinkContext, StageMetrics, Typed, channel,
};
use serde_json::{Value, json};

/// The test that restarts the node runs alone (it holds this for
/// writing); the others share the node (reading).
static NODE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn events(from: usize, n: usize, extra: impl Fn(usize) -> Value) -> Vec<Event> {
    (from..from + n)
        .map(|i| {
            let mut v = json!({
                "uid": i, "service": format!("svc{}", i % 3),
                // Two days, so two dated indices per service.
                "@timestamp": if i % 2 == 0 { "2026-05-01T10:00:00Z" } else { "2026-05-02T10:00:00Z" },
                "msg": "x".repeat(i % 40),
            });
            if let (Value::Object(v), Value::Object(e)) = (&mut v, extra(i)) {
                v.extend(e);
            }
            Event::fields(v.as_object().unwrap().clone(), Meta::now("t".into()))
        })
        .collect()
}

/// Runs the sink over `batches`; with `dead`, a stage reads `ship.dead`.
async fn run(
    options: Value,
    batches: Vec<Vec<Event>>,
    dead: bool,
) -> (Result<(), String>, Arc<StageMetrics>, Vec<Event>) {
    let sink = testing::sink(&Typed(logbus_opensearch::sink::OpenSearchSink), options);
    let (tx, rx) = channel(100_000);
    let metrics = Arc::new(StageMetrics::default());
    let mut cx = SinkContext::new("ship", rx, metrics.clone());
    let (dead_tx, mut dead_rx) = channel(100_000);
    if dead {
        cx.dead = Output::new(vec![dead_tx], metrics.clone(), OutputRole::Errors);
    } else {
        drop(dead_tx);
    }
    let feeding = tokio::spawn(async move {
        for b in batches {
            tx.send(b).await.unwrap();
        }
    });
    let result = sink.run(&mut cx).await.map_err(|e| e.to_string());
    feeding.await.unwrap();
    drop(cx);
    let mut refused = Vec::new();
    while let Some(mut b) = dead_rx.recv().await {
        refused.extend(b.take());
    }
    (result, metrics, refused)
}

/// 3,000 events land once each in dated indices named from the service
/// and the event's own day, with their ids; sending them all again (as a
/// retry after a lost answer would) stores nothing twice. Both gzipped and
/// plain (the default).
#[ignore = "needs an OpenSearch node and opensearch-py (.ci/services up opensearch; pip install opensearch-py); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_land_once_in_dated_indices_with_their_ids() {
    let url = node();
    let _shared = NODE.read().await;
    for compression in ["gzip", "none"] {
        let prefix = unique(&format!("dated-{compression}"));
        let options = json!({
            "endpoints": [url], "index": format!("{prefix}-{{{{service}}}}-%Y.%m.%d"),
            "id_field": "uid", "compression": compression, "batch_max_events": 250,
        });
        for _ in 0..2 {
            let (result, metrics, _) =
                run(options.clone(), vec![events(0, 3000, |_| json!({}))], false).await;
            result.unwrap();
            assert_eq!(metrics.snapshot().events_out, 3000);
        }
        let docs = documents(&url, &format!("{prefix}-*"));
        assert_eq!(docs.len(), 3000, "{compression}: every event once");
        for (index, id, doc) in &docs {
            let uid = doc["source"]["uid"].as_u64().unwrap();
            assert_eq!(id, &uid.to_string());
            let day = if uid % 2 == 0 {
                "2026.05.01"
            } else {
                "2026.05.02"
            };
            assert_eq!(index, &format!("{prefix}-svc{}-{day}", uid % 3));
        }
    }
}

/// A mapping refuses every tenth document: exactly those go to
/// `ship.dead` with OpenSearch's reason, and every other one is stored.
#[ignore = "needs an OpenSearch node and opensearch-py (.ci/services up opensearch; pip install opensearch-py); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_documents_go_to_dead_with_the_servers_reason() {
    let url = node();
    let _shared = NODE.read().await;
    let index = unique("mapped");
    python(
        &url,
        "os.indices.create(index=ARGS[0], body={'mappings': {'properties': {'n': {'type': 'integer'}}}})",
        &[&index],
    );
    let (result, metrics, refused) = run(
        json!({"endpoints": [url], "index": index, "id_field": "uid", "batch_max_events": 100}),
        vec![events(
            0,
            1000,
            |i| json!({"n": if i % 10 == 7 { json!("not a number") } else { json!(i) }}),
        )],
        true,
    )
    .await;
    result.unwrap();
    let refused_ids: BTreeSet<u64> = refused
        .iter()
        .map(|e| {
            let f = e.as_fields().unwrap();
            let reason = f["_error"]["message"].as_str().unwrap();
            assert!(
                reason.contains("mapper_parsing_exception") && reason.contains("[n]"),
                "{reason}"
            );
            f["uid"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(refused_ids, (0..1000).filter(|i| i % 10 == 7).collect());
    assert_eq!(metrics.snapshot().events_out, 900);
    let stored: BTreeSet<u64> = documents(&url, &index)
        .iter()
        .map(|(_, _, d)| d["source"]["uid"].as_u64().unwrap())
        .collect();
    assert_eq!(stored, (0..1000).filter(|i| i % 10 != 7).collect());
}

/// A data stream takes `create`; `index` into one is refused per item
/// with the server's reason.
#[ignore = "needs an OpenSearch node and opensearch-py (.ci/services up opensearch; pip install opensearch-py); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_streams_take_create() {
    let url = node();
    let _shared = NODE.read().await;
    let stream = unique("ds-logs");
    python(
        &url,
        "os.indices.put_index_template(name=ARGS[0], body={'index_patterns': [ARGS[0] + '*'], 'data_stream': {}, 'priority': 500})",
        &[&stream],
    );
    let (result, metrics, _) = run(
        json!({"endpoints": [url], "index": stream, "action": "create", "id_field": "uid"}),
        vec![events(0, 500, |_| json!({}))],
        false,
    )
    .await;
    result.unwrap();
    assert_eq!(metrics.snapshot().events_out, 500);
    let docs = documents(&url, &stream);
    assert_eq!(docs.len(), 500);
    assert!(
        docs.iter().all(|(i, ..)| i.starts_with(".ds-")),
        "{:?}",
        docs[0]
    );
    let (result, _, refused) = run(
        json!({"endpoints": [url], "index": stream, "action": "index"}),
        vec![events(1000, 5, |_| json!({}))],
        true,
    )
    .await;
    result.unwrap();
    assert_eq!(refused.len(), 5);
    let reason = refused[0].as_fields().unwrap()["_error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(reason.contains("op_type of create"), "{reason}");
}

/// An ingest pipeline named per event, and routing from a field.
#[ignore = "needs an OpenSearch node and opensearch-py (.ci/services up opensearch; pip install opensearch-py); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_pipeline_and_routing() {
    let url = node();
    let _shared = NODE.read().await;
    let index = unique("piped");
    let pipeline = unique("tag");
    python(
        &url,
        "os.ingest.put_pipeline(id=ARGS[0], body={'processors': [{'set': {'field': 'tagged', 'value': 'by-pipeline'}}, {'uppercase': {'field': 'service'}}]})",
        &[&pipeline],
    );
    let (result, _, _) = run(
        json!({"endpoints": [url], "index": index, "id_field": "uid",
               "pipeline": "{{p}}", "routing_field": "tenant"}),
        vec![events(
            0,
            30,
            |i| json!({"p": pipeline, "tenant": format!("t{}", i % 2)}),
        )],
        false,
    )
    .await;
    result.unwrap();
    let docs = documents(&url, &index);
    assert_eq!(docs.len(), 30);
    for (_, _, d) in docs {
        assert_eq!(d["source"]["tagged"], "by-pipeline");
        assert!(d["source"]["service"].as_str().unwrap().starts_with("SVC"));
        let uid = d["source"]["uid"].as_u64().unwrap();
        assert_eq!(d["routing"], format!("t{}", uid % 2));
    }
}

/// The node restarted mid-run with a write queue of one: the sink sees
/// refused connections, then 429s (whole requests and single items) —
/// the node's own count of rejected writes says they happened — and
/// every document is stored exactly once in the end.
#[ignore = "needs an OpenSearch node and opensearch-py (.ci/services up opensearch; pip install opensearch-py); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_and_429s_are_retried_until_everything_is_stored() {
    let url = node();
    let _alone = NODE.write().await;
    let index = unique("pressure");
    let services = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.ci/services");
    let restart = |queue: Option<&str>| {
        let mut c = Command::new(&services);
        c.args(["restart", "opensearch"]);
        match queue {
            Some(q) => c.env("LOGBUS_OPENSEARCH_WRITE_QUEUE", q),
            None => c.env_remove("LOGBUS_OPENSEARCH_WRITE_QUEUE"),
        };
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let n = 40_000;
    let batches: Vec<Vec<Event>> = (0..n / 1000)
        .map(|b| events(b * 1000, 1000, |_| json!({})))
        .collect();
    let sending = tokio::spawn(run(
        json!({"endpoints": [url], "index": index, "id_field": "uid",
               "batch_max_events": 200, "in_flight": 16,
               "retry_initial_backoff_ms": 20, "retry_max_backoff_ms": 500}),
        batches,
        false,
    ));
    // Mid-run: stored documents, but not all of them.
    let began = std::time::Instant::now();
    loop {
        let count: u64 = python(
            &url,
            "try:\n  os.indices.refresh(index=ARGS[0]); print(os.count(index=ARGS[0])['count'])\nexcept Exception:\n  print(0)",
            &[&index],
        )
        .trim()
        .parse()
        .unwrap();
        if count > 0 {
            assert!(count < n as u64, "finished before the restart");
            break;
        }
        assert!(began.elapsed().as_secs() < 60, "nothing stored in 60 s");
    }
    restart(Some("1"));
    let (result, metrics, _) = sending.await.unwrap();
    let rejected: u64 = python(
        &url,
        "s = os.nodes.stats(metric='thread_pool')\n\
         print(sum(n['thread_pool']['write']['rejected'] for n in s['nodes'].values()))",
        &[],
    )
    .trim()
    .parse()
    .unwrap();
    restart(None);
    result.unwrap();
    assert_eq!(metrics.snapshot().events_out, n as u64);
    assert!(
        metrics.snapshot().retried > 0,
        "the restart and the 429s were retried"
    );
    let stored: Vec<u64> = documents(&url, &index)
        .iter()
        .map(|(_, _, d)| d["source"]["uid"].as_u64().unwrap())
        .collect();
    let unique_ids: BTreeSet<u64> = stored.iter().copied().collect();
    assert_eq!(stored.len(), n, "each document once");
    assert_eq!(unique_ids, (0..n as u64).collect());
    eprintln!("writes the node rejected (429) after the restart: {rejected}");
    assert!(
        rejected > 0,
        "the small write queue must have refused writes"
    );
}

/// A bulk larger than the node accepts (`http.max_content_length`, 16 MiB
/// on the test node) is refused whole with HTTP 413: its events go to
/// `ship.dead` with the node's answer and what to change, and the sink
/// carries on with the next batch.
#[ignore = "needs an OpenSearch node and opensearch-py (.ci/services up opensearch; pip install opensearch-py); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_over_the_nodes_limit_is_refused_with_what_to_change() {
    let url = node();
    let _shared = NODE.read().await;
    let index = unique("too-large");
    let big = events(0, 20, |_| json!({ "blob": "x".repeat(1 << 20) }));
    let small = events(100, 5, |_| json!({}));
    let (result, metrics, refused) = run(
        json!({"endpoints": [url], "index": index, "id_field": "uid", "compression": "none",
               "batch_max_bytes": 64 << 20, "batch_max_events": 20}),
        vec![big, small],
        true,
    )
    .await;
    result.unwrap();
    assert_eq!(refused.len(), 20);
    for e in &refused {
        let reason = e.as_fields().unwrap()["_error"]["message"]
            .as_str()
            .unwrap();
        assert!(
            reason.starts_with(&format!("{url}/_bulk"))
                && reason.ends_with(
                    ": HTTP 413 (the bulk is larger than the cluster's http.max_content_length: lower batch_max_bytes)"
                ),
            "{reason}"
        );
    }
    assert_eq!(metrics.snapshot().events_out, 5);
    let stored: BTreeSet<u64> = documents(&url, &index)
        .iter()
        .map(|(_, _, d)| d["source"]["uid"].as_u64().unwrap())
        .collect();
    assert_eq!(stored, (100..105).collect());
}

/// No node where the options say: the stage retries, then fails naming
/// the URL and the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_node_is_named() {
    let (result, metrics, _) = run(
        json!({"endpoints": ["http://127.0.0.1:1"], "index": "x",
               "retry_max_attempts": 2, "retry_initial_backoff_ms": 10}),
        vec![events(0, 3, |_| json!({}))],
        false,
    )
    .await;
    let err = result.unwrap_err();
    assert!(
        err.contains("http://127.0.0.1:1/_bulk") && err.to_lowercase().contains("connect"),
        "{err}"
    );
    assert_eq!(metrics.snapshot().events_out, 0);
}

#[test]
fn bad_options_are_named() {
    let plugin = Typed(logbus_opensearch::sink::OpenSearchSink);
    let err = testing::option_errors(
        &plugin,
        json!({"endpoints": ["localhost:9200"], "index": "logs-%Q", "id_field": "a..b",
               "password_env": "X", "in_flight": 0}),
    );
    for expected in [
        "endpoints.0",
        "`%Q`",
        "id_field",
        "password_env",
        "in_flight",
    ] {
        assert!(err.contains(expected), "{expected}: {err}");
    }
    let err = testing::option_errors(&plugin, json!({"endpoints": [], "index": "x"}));
    assert!(err.contains("at least one URL"), "{err}");
    // A scheme with nothing after it, or another scheme, is not a URL here.
    for (i, bad) in ["http://", "ftp://h:9200", "https//h"].iter().enumerate() {
        let err = testing::option_errors(
            &plugin,
            json!({"endpoints": ["https://h:9200", bad], "index": "x"}),
        );
        assert_eq!(
            err,
            format!("endpoints.1: `{bad}` is not an http:// or https:// URL"),
            "{i}"
        );
    }
    assert_eq!(
        testing::option_errors(
            &plugin,
            json!({"endpoints": ["http://a:9200", "https://b"], "index": "x"})
        ),
        ""
    );
    // Read when the stage is built, where it runs: validation cannot know.
    let err = testing::build_errors(
        &plugin,
        json!({"endpoints": ["http://h:9200"], "index": "x", "username": "u",
               "password_env": "LOGBUS_TEST_SURELY_UNSET"}),
    );
    assert!(
        err.contains("`LOGBUS_TEST_SURELY_UNSET` is not set"),
        "{err}"
    );
}

/// `validate --connect`: the node answers; a missing ingest pipeline is
/// found at `pipeline`.
#[ignore = "needs an OpenSearch node (.ci/services up opensearch); run with --include-ignored"]
#[tokio::test]
async fn the_probe_finds_a_missing_ingest_pipeline() {
    let url = node();
    let plugin = Typed(logbus_opensearch::sink::OpenSearchSink);
    let fine = testing::probe(
        &plugin,
        json!({ "endpoints": [url], "index": "logs" }),
        None,
    )
    .await;
    assert!(fine.is_empty(), "{fine:?}");
    let missing = testing::probe(
        &plugin,
        json!({ "endpoints": [url], "index": "logs", "pipeline": "probe-no-such-pipeline" }),
        None,
    )
    .await;
    assert_eq!(missing, ["pipeline service-missing"]);
    // A pipeline or index named per event (`{{field}}`, `%Y`) is not
    // looked up: which one exists is known only when events arrive.
    let templated = testing::probe(
        &plugin,
        json!({ "endpoints": [url], "index": "logs-%Y", "pipeline": "{{ pipeline }}" }),
        None,
    )
    .await;
    assert!(templated.is_empty(), "{templated:?}");
}

/// A server on loopback that answers every request with `status` and an
/// empty body (the test node has no security plugin, so it never refuses
/// credentials itself).
fn answering(status: &'static str) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    port
}

/// `validate --connect`: refused credentials are found at the option that
/// gives them.
#[tokio::test]
async fn the_probe_names_refused_credentials() {
    let port = answering("401 Unauthorized");
    let plugin = Typed(logbus_opensearch::sink::OpenSearchSink);
    let url = format!("http://127.0.0.1:{port}");
    let basic = testing::probe(
        &plugin,
        json!({ "endpoints": [url], "index": "i", "username": "u" }),
        None,
    )
    .await;
    assert_eq!(basic, ["username service-refused"]);
    // A bearer token from a variable every process has.
    let bearer = testing::probe_findings(
        &plugin,
        json!({ "endpoints": [url], "index": "i", "bearer_token_env": "PATH" }),
        None,
    )
    .await;
    assert_eq!(bearer.len(), 1, "{bearer:?}");
    assert_eq!(bearer[0].option, ["bearer_token_env"]);
    let broken = answering("500 Internal Server Error");
    let other = testing::probe(
        &plugin,
        json!({ "endpoints": [format!("http://127.0.0.1:{broken}")], "index": "i" }),
        None,
    )
    .await;
    assert_eq!(other, ["endpoints.0 service-unreachable"]);
}
