//! `sink: kafka` against a real Apache Kafka broker (KRaft, started by
//! `.ci/services up kafka` on 127.0.0.1:9092, or `LOGBUS_KAFKA_BROKERS`),
//! with topics created and messages read back by an independent client,
//! kafka-python, so the sink is not only checked against itself.
//! The tests that need the broker are ignored unless run with
//! `--include-ignored` (CI does); then a missing broker fails them.

use std::sync::Arc;

use logbus_test_services::kafka::{SASL_BROKERS, brokers, python, topic};

use logbus_plugin_api::testing;
use logbus_plugin_api::{
    Event, Meta, Output, OutputRole, SinkContext, StageMetrics, Typed, channel,
};
use serde_json::{Value, json};

/// Every message of `topic`, read from the start by kafka-python:
/// `(partition, key, value, headers)`.
fn read_all(brokers: &str, topic: &str, expected: usize) -> Vec<Value> {
    let out = python(
        brokers,
        "from kafka import KafkaConsumer\n\
         c = KafkaConsumer(ARGS[0], bootstrap_servers=BROKERS, auto_offset_reset='earliest', consumer_timeout_ms=10000)\n\
         want = int(ARGS[1])\n\
         n = 0\n\
         for m in c:\n\
         \x20   print(json.dumps({'partition': m.partition, 'key': m.key.decode() if m.key else None,\n\
         \x20       'value': m.value.decode(), 'headers': {k: v.decode() for k, v in m.headers}}))\n\
         \x20   n += 1\n\
         \x20   if n >= want: break",
        &[topic, &expected.to_string()],
    );
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn events(from: usize, n: usize) -> Vec<Event> {
    (from..from + n)
        .map(|i| {
            Event::fields(
                json!({"id": i, "service": format!("svc{}", i % 3), "msg": "x".repeat(i % 50)})
                    .as_object()
                    .unwrap()
                    .clone(),
                Meta::now("t".into()),
            )
        })
        .collect()
}

/// Runs the sink over `batches`; `dead` reads `ship.dead` when given.
async fn run(
    options: Value,
    batches: Vec<Vec<Event>>,
    dead: Option<logbus_plugin_api::Sender>,
) -> (Result<(), String>, Arc<StageMetrics>) {
    let sink = testing::sink(&Typed(logbus_kafka::sink::KafkaSink), options);
    let (tx, rx) = channel(100_000);
    let metrics = Arc::new(StageMetrics::default());
    let mut cx = SinkContext::new("ship", rx, metrics.clone());
    if let Some(dead) = dead {
        cx.dead = Output::new(vec![dead], metrics.clone(), OutputRole::Errors);
    }
    for b in batches {
        tx.send(b).await.unwrap();
    }
    drop(tx);
    let result = sink.run(&mut cx).await.map_err(|e| e.to_string());
    (result, metrics)
}

/// 3,000 events per compression land in a 3-partition topic: every id
/// once, the key from `{{service}}` (so one service, one partition), the
/// `service` header, the event as JSON.
#[ignore = "needs a Kafka broker and kafka-python (.ci/services up kafka; pip install kafka-python); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_land_once_with_key_header_and_each_compression() {
    let brokers = brokers();
    for compression in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let t = topic(&brokers, &format!("sink-{compression}"), 3);
        let batches = (0..3).map(|b| events(b * 1000, 1000)).collect();
        let (result, metrics) = run(
            json!({
                "brokers": brokers, "topic": t, "key": "{{service}}",
                "headers": ["service"], "compression": compression,
            }),
            batches,
            None,
        )
        .await;
        result.unwrap();
        assert_eq!(metrics.snapshot().events_out, 3000, "{compression}");
        let got = read_all(&brokers, &t, 3000);
        assert_eq!(got.len(), 3000, "{compression}");
        let mut ids: Vec<u64> = Vec::new();
        let mut partition_of = std::collections::HashMap::new();
        for m in &got {
            let value: Value = serde_json::from_str(m["value"].as_str().unwrap()).unwrap();
            let service = value["service"].as_str().unwrap();
            assert_eq!(m["key"], service, "{compression}: {m}");
            assert_eq!(m["headers"]["service"], service);
            let p = partition_of
                .entry(service.to_string())
                .or_insert(m["partition"].clone());
            assert_eq!(*p, m["partition"], "one key, one partition");
            ids.push(value["id"].as_u64().unwrap());
        }
        ids.sort_unstable();
        assert_eq!(ids, (0..3000).collect::<Vec<_>>(), "{compression}");
    }
}

/// The topic can come from the event.
#[ignore = "needs a Kafka broker and kafka-python (.ci/services up kafka; pip install kafka-python); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topic_comes_from_a_template() {
    let brokers = brokers();
    let base = topic(&brokers, "by-service", 1);
    // Topics named `<base>-svc0` .. `-svc2` must exist first.
    for s in 0..3 {
        python(
            &brokers,
            "from kafka.admin import KafkaAdminClient, NewTopic\n\
             KafkaAdminClient(bootstrap_servers=BROKERS).create_topics([NewTopic(ARGS[0], num_partitions=1, replication_factor=1)])",
            &[&format!("{base}-svc{s}")],
        );
    }
    let (result, _) = run(
        json!({"brokers": brokers, "topic": format!("{base}-{{{{service}}}}")}),
        vec![events(0, 30)],
        None,
    )
    .await;
    result.unwrap();
    for s in 0..3 {
        let got = read_all(&brokers, &format!("{base}-svc{s}"), 10);
        assert_eq!(got.len(), 10);
        assert!(
            got.iter()
                .all(|m| m["value"].as_str().unwrap().contains(&format!("svc{s}")))
        );
    }
}

/// A message over the limit and a topic that does not exist are refused
/// for good: those events go to `<id>.dead` with the reason, the others
/// are delivered.
#[ignore = "needs a Kafka broker and kafka-python (.ci/services up kafka; pip install kafka-python); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_and_missing_topics_go_to_dead() {
    let brokers = brokers();
    let t = topic(&brokers, "dead", 1);
    let mut batch = events(0, 5);
    batch.push(Event::fields(
        json!({"id": 99, "big": "y".repeat(2_000_000)})
            .as_object()
            .unwrap()
            .clone(),
        Meta::now("t".into()),
    ));
    let (dead_tx, mut dead_rx) = channel(100);
    let (result, metrics) = run(
        json!({"brokers": brokers, "topic": t, "batch_timeout_ms": 1}),
        vec![batch],
        Some(dead_tx),
    )
    .await;
    result.unwrap();
    assert_eq!(metrics.snapshot().events_out, 5);
    let dead = testing::take(&mut dead_rx, 1).await;
    let error = &dead[0].as_fields().unwrap()["_error"];
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("larger than max_message_bytes"),
        "{error}"
    );
    assert_eq!(read_all(&brokers, &t, 5).len(), 5);

    let (dead_tx, mut dead_rx) = channel(100);
    let (result, _) = run(
        json!({
            "brokers": brokers, "topic": "no-such-topic-anywhere", "batch_timeout_ms": 1,
            "librdkafka": { "topic.metadata.propagation.max.ms": "1000" },
        }),
        vec![events(0, 2)],
        Some(dead_tx),
    )
    .await;
    result.unwrap();
    let dead = testing::take(&mut dead_rx, 2).await;
    let message = dead[0].as_fields().unwrap()["_error"]["message"].to_string();
    assert!(message.contains("does not exist"), "{message}");
}

/// No broker at the address: the sink retries, gives up after its
/// attempts, and the stage fails with a message naming the brokers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_fails_the_stage_naming_it() {
    let (result, metrics) = run(
        json!({
            "brokers": "127.0.0.1:1", "topic": "t", "message_timeout_ms": 300,
            "retry_max_attempts": 2, "retry_initial_backoff_ms": 10,
        }),
        vec![events(0, 3)],
        None,
    )
    .await;
    let err = result.unwrap_err();
    assert!(err.contains("kafka 127.0.0.1:1"), "{err}");
    assert_eq!(metrics.snapshot().events_out, 0);
}

#[test]
fn bad_options_are_named() {
    let err = testing::option_errors(
        &Typed(logbus_kafka::sink::KafkaSink),
        json!({"brokers": "nohostport", "topic": "a-{{b", "headers": ["a..b"], "in_flight": 0}),
    );
    for expected in ["brokers", "topic", "headers.0", "in_flight"] {
        assert!(err.contains(expected), "{expected}: {err}");
    }
}

/// SASL PLAIN and SCRAM on the broker's SASL listener: the right password
/// delivers; a wrong one ends the stage with the brokers' reason instead
/// of retrying forever.
#[ignore = "needs a Kafka broker and kafka-python (.ci/services up kafka; pip install kafka-python); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_credentials_are_used_and_a_wrong_password_fails_clearly() {
    let brokers = brokers();
    let t = topic(&brokers, "sink-sasl", 1);
    for (i, mechanism) in ["plain", "scram-sha-256", "scram-sha-512"]
        .into_iter()
        .enumerate()
    {
        let options = |password: &str| {
            json!({
                "brokers": SASL_BROKERS, "topic": t,
                "sasl": {"mechanism": mechanism, "username": "logbus", "password": password}
            })
        };
        let (result, metrics) = run(options("logbus-secret"), vec![events(i * 10, 10)], None).await;
        result.unwrap_or_else(|e| panic!("{mechanism}: {e}"));
        assert_eq!(metrics.snapshot().events_out, 10, "{mechanism}");
        let (result, metrics) = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            run(options("wrong"), vec![events(100, 10)], None),
        )
        .await
        .unwrap_or_else(|_| panic!("{mechanism}: a wrong password must end the stage"));
        let err = result.expect_err("a wrong password is an error");
        assert!(
            err.contains(SASL_BROKERS) && err.to_lowercase().contains("authentication"),
            "{mechanism}: {err}"
        );
        assert_eq!(metrics.snapshot().events_out, 0);
    }
    let ids: Vec<u64> = read_all(&brokers, &t, 30)
        .iter()
        .map(|m| {
            serde_json::from_str::<Value>(m["value"].as_str().unwrap()).unwrap()["id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, (0..30).collect::<Vec<_>>());
}

/// `validate --connect`: a fixed topic is looked up (the test broker
/// creates none by itself), a templated one is not.
#[ignore = "needs a Kafka broker and kafka-python (.ci/services up kafka; pip install kafka-python); run with --include-ignored"]
#[tokio::test]
async fn the_probe_looks_up_a_fixed_topic() {
    let brokers = brokers();
    let present = topic(&brokers, "probe", 1);
    let plugin = Typed(logbus_kafka::sink::KafkaSink);
    let probe = |topic: String| {
        testing::probe(&plugin, json!({ "brokers": brokers, "topic": topic }), None)
    };
    assert!(probe(present.clone()).await.is_empty());
    assert_eq!(
        probe(format!("{present}-absent")).await,
        ["topic service-missing"]
    );
    assert!(probe("{{t}}".into()).await.is_empty());
    // The broker creates no topic: an error that says so.
    let found = testing::probe_findings(
        &plugin,
        json!({ "brokers": brokers, "topic": format!("{present}-absent") }),
        None,
    )
    .await;
    assert_eq!(found[0].level, logbus_plugin_api::FindingLevel::Error);
    assert!(
        found[0]
            .message
            .contains("`auto.create.topics.enable=false`"),
        "{}",
        found[0].message
    );
    // Credentials the SASL listener refuses, told from a broker that
    // does not answer.
    let refused = testing::probe(
        &plugin,
        json!({ "brokers": SASL_BROKERS, "topic": present,
                "sasl": { "mechanism": "scram-sha-256", "username": "logbus", "password": "wrong" } }),
        None,
    )
    .await;
    assert_eq!(refused, ["sasl service-refused"]);
    let nowhere = testing::probe(
        &plugin,
        json!({ "brokers": "127.0.0.1:1", "topic": present }),
        None,
    )
    .await;
    assert_eq!(nowhere, ["brokers service-unreachable"]);
}

/// `validate --preflight` learns of the TLS files librdkafka reads.
#[test]
fn the_tls_files_are_stated() {
    let needs = testing::host_needs(
        &Typed(logbus_kafka::sink::KafkaSink),
        json!({ "brokers": "b:9093", "topic": "t",
                "tls": { "ca_file": "ca.pem", "cert_file": "c.pem", "key_file": "k.pem" } }),
    );
    assert_eq!(
        needs,
        [
            "tls.ca_file: Pem ./ca.pem",
            "tls.cert_file: Pem ./c.pem",
            "tls.key_file: PemKey ./k.pem",
            "tls.key_file: TlsIdentity ./c.pem ./k.pem",
        ]
    );
}
