//! `validate --connect`: each stage's service reached with its own
//! settings, against the real servers of `.ci/services` (the tests that
//! need one are ignored unless run with `--include-ignored`, as CI does),
//! each finding at the option it names.

use std::path::Path;

use crate::support::logbus;

/// `validate --connect` on `text`; its exit code and the findings, each as
/// `line:col code stage message`.
fn connect(dir: &Path, text: &str, timeout_s: u32) -> (Option<i32>, Vec<String>, String) {
    connect_with(dir, text, timeout_s, &[])
}

fn connect_with(
    dir: &Path,
    text: &str,
    timeout_s: u32,
    env: &[(&str, &str)],
) -> (Option<i32>, Vec<String>, String) {
    let file = dir.join("p.yml");
    std::fs::write(&file, text).unwrap();
    let o = logbus()
        .args([
            "validate",
            "--connect",
            "--format",
            "json",
            "--connect-timeout",
        ])
        .arg(timeout_s.to_string())
        .arg(&file)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let report: serde_json::Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("{e}: {out}{}", String::from_utf8_lossy(&o.stderr)));
    let found = report["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            format!(
                "{}:{} {} {} {}",
                d["line"],
                d["col"],
                d["code"].as_str().unwrap(),
                d["stage"].as_str().unwrap_or("-"),
                d["message"].as_str().unwrap()
            )
        })
        .collect();
    (o.status.code(), found, out)
}

/// Each finding as `line:col code stage`.
fn codes_at(found: &[String]) -> Vec<String> {
    found
        .iter()
        .map(|f| f.splitn(4, ' ').take(3).collect::<Vec<_>>().join(" "))
        .collect()
}

/// The finding of `stage`, which must be the only one.
fn only<'a>(found: &'a [String], stage: &str) -> &'a str {
    let of: Vec<&String> = found
        .iter()
        .filter(|f| f.split(' ').nth(2) == Some(stage))
        .collect();
    assert_eq!(of.len(), 1, "{stage}: {found:#?}");
    of[0]
}

fn assert_no_finding(found: &[String], stage: &str) {
    assert!(
        found.iter().all(|f| f.split(' ').nth(2) != Some(stage)),
        "{stage}: {found:#?}"
    );
}

/// Nothing listens: every service is unreachable, each at its address
/// option, and all of them are probed at once (the run takes one timeout,
/// not one per stage). Needs no server.
#[test]
fn unreachable_services_are_each_reported_at_their_address() {
    let dir = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let text = format!(
        "stages:
  read:
    source: stdin
  parse: {{ parser: json, inputs: [read] }}
  search:
    sink: opensearch
    inputs: [parse]
    endpoints: ['http://127.0.0.1:{port}']
    index: logs
  table:
    sink: clickhouse
    inputs: [parse]
    url: 'http://127.0.0.1:{port}'
    table: logs
  otel:
    sink: otlp
    inputs: [parse]
    protocol: http
    endpoint: 'http://127.0.0.1:{port}'
  bucket:
    sink: s3
    inputs: [parse]
    bucket: logs
    endpoint: 'http://127.0.0.1:{port}'
    access_key_id: a
    secret_access_key: b
  local:
    sink: file
    inputs: [parse]
    path: {dir}/out.ndjson
",
        dir = dir.path().display()
    );
    let started = std::time::Instant::now();
    let (code, found, out) = connect(dir.path(), &text, 8);
    let took = started.elapsed();
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(
        codes_at(&found),
        [
            "8:17 service-unreachable search",
            "13:5 service-unreachable table",
            "19:5 service-unreachable otel",
            "24:5 service-unreachable bucket",
        ],
        "{found:#?}"
    );
    // Four probes of up to 8 s each would take 32 s one after another.
    assert!(took.as_secs() < 30, "{took:?}");
}

/// A pipeline that does not validate is not probed: its errors are the
/// ones to fix first.
#[test]
fn an_invalid_pipeline_is_not_probed() {
    let dir = tempfile::tempdir().unwrap();
    let (code, found, out) = connect(
        dir.path(),
        "stages:
  read: { source: stdin }
  search:
    sink: opensearch
    inputs: [read]
    endpoints: ['http://127.0.0.1:1']
    index: logs
    batch_max_events: 0
",
        5,
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(found.iter().all(|f| !f.contains("service-")), "{found:#?}");
}

#[cfg(feature = "sink-clickhouse")]
mod clickhouse {
    use super::*;
    use logbus_test_services::clickhouse::{MODERN as URL, server, sql};

    /// The table described with the stage's credentials: the mapping
    /// checked as at start, a missing table or database, a refused
    /// password, and the fields that arrive against the columns.
    #[ignore = "needs a ClickHouse server (.ci/services up clickhouse); run with --include-ignored"]
    #[test]
    fn the_table_and_its_columns_are_checked_against_what_arrives() {
        // The probes have a timeout: no test freezes the server meanwhile.
        let _answering = logbus_test_services::answering("clickhouse");
        server(URL);
        let dir = tempfile::tempdir().unwrap();
        let table = format!(
            "connect_{}_{}",
            std::process::id(),
            logbus_plugin_api::now_ns()
        );
        sql(
            URL,
            &format!(
                "CREATE TABLE {table} (level String, msg String, host String,
                   status Nullable(UInt16), total UInt64 MATERIALIZED 1)
                 ENGINE = MergeTree ORDER BY level"
            ),
        );
        let text = format!(
            "stages:
  read: {{ source: stdin }}
  parse:
    parser: regex
    inputs: [read]
    pattern: '^(?P<level>\\w+) (?P<msg>.*) (?P<code>\\d+)$'
  every:
    sink: clickhouse
    inputs: [parse]
    url: {URL}
    table: {table}
  mapped:
    sink: clickhouse
    inputs: [parse]
    url: {URL}
    table: {table}
    columns:
      level: level
      status: {{ field: code }}
      message: msg
  computed:
    sink: clickhouse
    inputs: [parse]
    url: {URL}
    table: {table}
    columns: {{ level: level, total: code }}
  absent:
    sink: clickhouse
    inputs: [parse]
    url: {URL}
    table: no_such_table_here
  nobase:
    sink: clickhouse
    inputs: [parse]
    url: {URL}
    database: no_such_database
    table: {table}
  wrong:
    sink: clickhouse
    inputs: [parse]
    url: {URL}
    table: {table}
    username: logbus
    password_env: LOGBUS_TEST_WRONG_PASSWORD
  fine:
    sink: clickhouse
    inputs: [parse]
    url: {URL}
    table: {table}
    username: logbus
    password_env: LOGBUS_TEST_RIGHT_PASSWORD
    columns: {{ level: level, msg: msg, status: code }}
"
        );
        let (code, found, out) = connect_with(
            dir.path(),
            &text,
            20,
            &[
                ("LOGBUS_TEST_WRONG_PASSWORD", "not-the-password"),
                ("LOGBUS_TEST_RIGHT_PASSWORD", "logbus-secret"),
            ],
        );
        assert_eq!(code, Some(1), "{out}");
        assert_eq!(
            codes_at(&found),
            [
                "11:5 column-not-produced every",
                "11:5 column-not-produced every",
                "11:5 field-not-stored every",
                "20:7 column-mismatch mapped",
                "26:30 column-mismatch computed",
                "31:5 service-missing absent",
                "36:5 service-missing nobase",
                "43:5 service-refused wrong",
            ],
            "{found:#?}"
        );
        // Every column taken by name: `host` and `status` get nothing,
        // `code` is stored nowhere.
        assert!(found[0].ends_with("option `table`: column `host` is written from field `host`, which no upstream stage produces: every row gets the type's zero value"), "{found:#?}");
        assert!(
            found[1].contains("column `status` is written from field `status`")
                && found[1].ends_with("every row gets NULL"),
            "{found:#?}"
        );
        assert!(
            found[2].contains(&format!(
                "`code` arrives but table default.{table} has no such column"
            )),
            "{found:#?}"
        );
        assert!(found[3].contains("option `columns.message`: column `message` is not in the table (its columns: level, msg, host, status, total)"), "{found:#?}");
        assert!(
            found[4].contains("option `columns.total`: column `total` is MATERIALIZED"),
            "{found:#?}"
        );
        assert!(
            found[5].contains("option `table`: Code: 60.") && found[5].contains("UNKNOWN_TABLE"),
            "{found:#?}"
        );
        assert!(
            found[6].contains("option `database`: Code: 81."),
            "{found:#?}"
        );
        assert!(found[7].contains("AUTHENTICATION_FAILED"), "{found:#?}");
    }
}

#[cfg(feature = "source-kafka")]
mod kafka {
    use super::*;
    use logbus_test_services::kafka::{SASL_BROKERS, brokers, topic};

    /// The brokers reached with each stage's settings; topics looked up
    /// without creating them (the test broker creates none by itself).
    #[ignore = "needs a Kafka broker and kafka-python (.ci/services up kafka; pip install kafka-python); run with --include-ignored"]
    #[test]
    fn brokers_credentials_and_topics_are_checked() {
        let brokers = brokers();
        let present = topic(&brokers, "connect", 1);
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "stages:
  read:
    source: kafka
    brokers: {brokers}
    group_id: connect-test
    topics: [{present}, {present}-absent, '^connect-.*']
  misspelt:
    sink: kafka
    inputs: [read]
    brokers: {brokers}
    topic: {present}x
  fine:
    sink: kafka
    inputs: [read]
    brokers: {brokers}
    topic: {present}
  parse: {{ parser: json, inputs: [read] }}
  templated:
    sink: kafka
    inputs: [parse]
    brokers: {brokers}
    topic: '{{{{topic}}}}'
  wrong:
    sink: kafka
    inputs: [read]
    brokers: {SASL_BROKERS}
    topic: {present}
    sasl: {{ mechanism: scram-sha-256, username: logbus, password: wrong }}
  right:
    sink: kafka
    inputs: [read]
    brokers: {SASL_BROKERS}
    topic: {present}
    sasl: {{ mechanism: scram-sha-512, username: logbus, password: logbus-secret }}
  nowhere:
    sink: kafka
    inputs: [read]
    brokers: 127.0.0.1:1
    topic: {present}
"
        );
        let (code, found, out) = connect(dir.path(), &text, 8);
        assert_eq!(code, Some(1), "{out}");
        let at = codes_at(&found);
        assert_eq!(at.len(), 4, "{found:#?}");
        assert!(
            at[0].starts_with("6:") && at[0].ends_with(" service-missing read"),
            "{found:#?}"
        );
        assert_eq!(
            at[1..],
            [
                "11:5 service-missing misspelt",
                "28:5 service-refused wrong",
                "38:5 service-unreachable nowhere",
            ],
            "{found:#?}"
        );
        let read = only(&found, "read");
        assert!(
            read.contains("service-missing read option `topics.1`: topic"),
            "{read}"
        );
        assert!(
            read.contains("does not exist on the cluster (did you mean `connect"),
            "{read}"
        );
        assert!(
            found[1].contains("`auto.create.topics.enable=false`"),
            "{found:#?}"
        );
        assert!(
            found[2].contains("option `sasl`: the brokers refused the credentials")
                && found[2].contains("SCRAM-SHA-256"),
            "{found:#?}"
        );
        assert!(found[3].contains("Connection refused"), "{found:#?}");
        for stage in ["fine", "templated", "right"] {
            assert_no_finding(&found, stage);
        }
    }
}

#[cfg(all(
    feature = "sink-s3",
    feature = "source-s3",
    feature = "sink-cloudwatch_logs"
))]
mod aws {
    use super::*;
    use logbus_test_services::aws::{
        ACCESS_KEY, SECRET_KEY, bucket, cloudwatch, endpoint, logs_python,
    };

    /// Buckets listed with the stage's keys (a missing one, a wrong
    /// secret); CloudWatch groups and streams looked up where the sink
    /// would not create them.
    #[ignore = "needs MinIO and moto (.ci/services up s3 cloudwatch; pip install boto3); run with --include-ignored"]
    #[test]
    fn buckets_keys_groups_and_streams_are_checked() {
        // The probes have a timeout: no test freezes the server meanwhile.
        let _answering = logbus_test_services::answering("s3");
        let s3 = endpoint();
        let present = bucket(&s3, "connect");
        let logs = cloudwatch();
        let group = format!(
            "connect-{}-{}",
            std::process::id(),
            logbus_plugin_api::now_ns()
        );
        logs_python(
            &logs,
            "logs.create_log_group(logGroupName=ARGS[0]); logs.create_log_stream(logGroupName=ARGS[0], logStreamName='s1')",
            &[&group],
        );
        let dir = tempfile::tempdir().unwrap();
        let s3_keys = format!(
            "endpoint: {s3}\n    force_path_style: true\n    region: us-east-1\n    access_key_id: {ACCESS_KEY}"
        );
        let cw = format!(
            "endpoint: {logs}\n    region: us-east-1\n    access_key_id: test\n    secret_access_key: test"
        );
        let text = format!(
            "stages:
  objects:
    source: s3
    bucket: {present}-absent
    {s3_keys}
    secret_access_key: {SECRET_KEY}
  parse: {{ parser: json, inputs: [objects] }}
  fine:
    sink: s3
    inputs: [parse]
    bucket: {present}
    {s3_keys}
    secret_access_key: {SECRET_KEY}
  absent:
    sink: s3
    inputs: [parse]
    bucket: {present}-absent
    {s3_keys}
    secret_access_key: {SECRET_KEY}
  wrong:
    sink: s3
    inputs: [parse]
    bucket: {present}
    {s3_keys}
    secret_access_key: not-the-secret
  stream:
    sink: cloudwatch_logs
    inputs: [parse]
    group: {group}
    stream: s1
    create_missing: false
    {cw}
  nogroup:
    sink: cloudwatch_logs
    inputs: [parse]
    group: {group}-absent
    stream: s1
    create_missing: false
    {cw}
  nostream:
    sink: cloudwatch_logs
    inputs: [parse]
    group: {group}
    stream: s2
    create_missing: false
    {cw}
  created:
    sink: cloudwatch_logs
    inputs: [parse]
    group: {group}-absent
    stream: s1
    {cw}
"
        );
        let (code, found, out) = connect(dir.path(), &text, 10);
        assert_eq!(code, Some(1), "{out}");
        assert_eq!(
            codes_at(&found),
            [
                "4:5 service-missing objects",
                "23:5 service-missing absent",
                "36:5 service-refused wrong",
                "51:5 service-missing nogroup",
                "62:5 service-missing nostream",
            ],
            "{found:#?}"
        );
        assert!(found[0].contains("NoSuchBucket"), "{found:#?}");
        assert!(found[1].contains("NoSuchBucket"), "{found:#?}");
        assert!(
            found[2].contains("option `access_key_id`: S3 bucket")
                && found[2].contains("refused the credentials: SignatureDoesNotMatch"),
            "{found:#?}"
        );
        assert!(found[3].contains("`create_missing: false`"), "{found:#?}");
        assert!(
            found[4].contains("log stream `s2` does not exist"),
            "{found:#?}"
        );
        for stage in ["fine", "stream", "created"] {
            assert_no_finding(&found, stage);
        }
    }
}

#[cfg(feature = "sink-opensearch")]
mod opensearch {
    use super::*;
    use logbus_test_services::opensearch::node;

    /// Every endpoint asked, a missing ingest pipeline named.
    #[ignore = "needs an OpenSearch node (.ci/services up opensearch); run with --include-ignored"]
    #[test]
    fn endpoints_and_the_ingest_pipeline_are_checked() {
        // The probes have a timeout: no test freezes the server meanwhile.
        let _answering = logbus_test_services::answering("opensearch");
        let url = node();
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "stages:
  read: {{ source: stdin }}
  parse: {{ parser: json, inputs: [read] }}
  fine:
    sink: opensearch
    inputs: [parse]
    endpoints: [{url}]
    index: logs-%Y.%m.%d
  half:
    sink: opensearch
    inputs: [parse]
    endpoints: [{url}, 'http://127.0.0.1:1']
    index: logs
    pipeline: connect-no-such-pipeline
"
        );
        let (code, found, out) = connect(dir.path(), &text, 10);
        assert_eq!(code, Some(1), "{out}");
        assert_eq!(
            codes_at(&found),
            [
                "12:40 service-unreachable half",
                "14:5 service-missing half"
            ],
            "{found:#?}"
        );
        assert!(
            found[0].contains("option `endpoints.1`: http://127.0.0.1:1:"),
            "{found:#?}"
        );
        assert!(
            found[1].contains("ingest pipeline `connect-no-such-pipeline` does not exist"),
            "{found:#?}"
        );
    }
}

#[cfg(feature = "sink-otlp")]
mod otlp {
    use super::*;

    /// An empty export over each protocol to the OpenTelemetry Collector;
    /// OTLP/HTTP sent to the gRPC port is not answered as OTLP.
    #[ignore = "needs the OpenTelemetry Collector (.ci/services up otel); run with --include-ignored"]
    #[test]
    fn an_empty_export_reaches_the_collector_on_both_protocols() {
        for port in [4327, 4328] {
            assert!(
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
                "the OpenTelemetry Collector is required on 127.0.0.1:4327/4328 (.ci/services up otel)"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let text = "stages:
  read: { source: stdin }
  parse: { parser: json, inputs: [read] }
  grpc:
    sink: otlp
    inputs: [parse]
    protocol: grpc
    endpoint: http://127.0.0.1:4327
  http:
    sink: otlp
    inputs: [parse]
    protocol: http
    compression: gzip
    endpoint: http://127.0.0.1:4328
  crossed:
    sink: otlp
    inputs: [parse]
    protocol: http
    endpoint: http://127.0.0.1:4327
";
        let (code, found, out) = connect(dir.path(), text, 10);
        assert_eq!(code, Some(1), "{out}");
        assert_eq!(
            codes_at(&found),
            ["19:5 service-unreachable crossed"],
            "{found:#?}"
        );
        let crossed = only(&found, "crossed");
        assert!(
            crossed.contains("option `endpoint`: http://127.0.0.1:4327/v1/logs"),
            "{crossed}"
        );
    }
}
