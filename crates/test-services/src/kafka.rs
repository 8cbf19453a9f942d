//! What the Kafka tests share: the broker (`.ci/services up kafka` on
//! 127.0.0.1:9092, or `LOGBUS_KAFKA_BROKERS`) and kafka-python, the
//! independent client that creates topics, produces input and reads
//! output. The tests that need them are ignored unless run with
//! `--include-ignored` (CI does); then a missing broker or kafka-python
//! fails them.

/// The SASL listener `.ci/services` opens beside the plain one.
pub const SASL_BROKERS: &str = "127.0.0.1:9094";

/// The brokers to test against; fails the test unless the first answers
/// and kafka-python is installed.
pub fn brokers() -> String {
    let brokers = std::env::var("LOGBUS_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let first = brokers.split(',').next().unwrap_or_default().to_string();
    crate::require_listening(
        &first,
        "a Kafka broker (.ci/services up kafka, or set LOGBUS_KAFKA_BROKERS)",
    );
    crate::require_python("kafka", "pip install kafka-python");
    brokers
}

/// Runs a kafka-python snippet with `BROKERS` and the arguments set;
/// returns its stdout.
pub fn python(brokers: &str, script: &str, args: &[&str]) -> String {
    crate::python(&format!("BROKERS = {brokers:?}"), script, args)
}

/// A fresh topic with `partitions` partitions.
pub fn topic(brokers: &str, name: &str, partitions: u32) -> String {
    let name = format!("{name}-{}-{}", std::process::id(), crate::now_ns());
    python(
        brokers,
        "from kafka.admin import KafkaAdminClient, NewTopic\n\
         a = KafkaAdminClient(bootstrap_servers=BROKERS)\n\
         a.create_topics([NewTopic(ARGS[0], num_partitions=int(ARGS[1]), replication_factor=1)])",
        &[&name, &partitions.to_string()],
    );
    name
}

/// Produces `count` messages `{"id": i}` (i from `first`) to `topic`, to
/// partition `i % partitions`, keyed `k<i>`, with a `trace` header.
pub fn produce(brokers: &str, topic: &str, first: usize, count: usize, partitions: u32) {
    python(
        brokers,
        "from kafka import KafkaProducer\n\
         p = KafkaProducer(bootstrap_servers=BROKERS, acks='all', linger_ms=5)\n\
         first, count, parts = int(ARGS[1]), int(ARGS[2]), int(ARGS[3])\n\
         for i in range(first, first + count):\n\
         \x20   p.send(ARGS[0], value=json.dumps({'id': i}).encode(), key=b'k%d' % i,\n\
         \x20          partition=i % parts, headers=[('trace', b't-%d' % i)])\n\
         p.flush()",
        &[
            topic,
            &first.to_string(),
            &count.to_string(),
            &partitions.to_string(),
        ],
    );
}

/// The group's committed offset per partition of `topic` (absent: none).
/// An answer the broker marks retriable (its group coordinator still
/// loading after a restart, say) is asked again for up to 30 s.
pub fn committed(brokers: &str, group: &str, topic: &str) -> std::collections::BTreeMap<i32, i64> {
    let out = python(
        brokers,
        "import time\n\
         from kafka.admin import KafkaAdminClient\n\
         from kafka.errors import KafkaError\n\
         give_up = time.monotonic() + 30\n\
         while True:\n\
         \x20   try:\n\
         \x20       a = KafkaAdminClient(bootstrap_servers=BROKERS)\n\
         \x20       offsets = a.list_group_offsets(ARGS[0])[ARGS[0]]\n\
         \x20       break\n\
         \x20   except KafkaError as e:\n\
         \x20       if not e.retriable or time.monotonic() > give_up:\n\
         \x20           raise\n\
         \x20       time.sleep(0.5)\n\
         print(json.dumps({str(tp.partition): m.offset for tp, m in offsets.items() if tp.topic == ARGS[1]}))",
        &[group, topic],
    );
    let map: std::collections::BTreeMap<String, i64> = serde_json::from_str(out.trim()).unwrap();
    map.into_iter()
        .map(|(k, v)| (k.parse().unwrap(), v))
        .collect()
}
