//! `sink: s3` against a real S3 server (MinIO, `.ci/services up s3`),
//! which checks every request's SigV4 signature; what was stored is read
//! back by boto3 (see `common`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use logbus_plugin_api::testing;
use logbus_plugin_api::{
    AckReceiver, BatchAck, Event, Meta, Outcome, SinkContext, StageMetrics, Typed, channel,
};
use serde_json::{Value, json};

use logbus_test_services::aws::{
    ACCESS_KEY, SECRET_KEY, bucket, endpoint, merged, objects, objects_meta, records,
    unfinished_uploads,
};

/// The outcome each source batch reported, by its token.
#[derive(Default)]
struct Heard(Mutex<BTreeMap<u64, Outcome>>);
impl AckReceiver for Heard {
    fn finished(&self, token: u64, outcome: Outcome) {
        assert!(self.0.lock().unwrap().insert(token, outcome).is_none());
    }
}

impl Heard {
    fn outcomes(&self) -> BTreeMap<u64, Outcome> {
        self.0.lock().unwrap().clone()
    }
}

/// Events `{"seq": i, "service": …}` for `range`, one source batch (token
/// `token`) for all of them.
fn events(heard: &Arc<Heard>, token: u64, range: std::ops::Range<u64>) -> Vec<Event> {
    let ack = BatchAck::new(heard.clone(), token);
    range
        .map(|i| {
            let service = if i % 2 == 0 { "api" } else { "db" };
            let fields = json!({"seq": i, "service": service, "msg": format!("event {i}")});
            Event::fields(fields.as_object().unwrap().clone(), Meta::now("src".into()))
                .with_ack(ack.handle())
        })
        .collect()
}

fn options(endpoint: &str, bucket: &str, more: Value) -> Value {
    let mut o = json!({
        "bucket": bucket, "endpoint": endpoint, "force_path_style": true,
        "region": "us-east-1",
        "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
        "retry_initial_backoff_ms": 10, "retry_max_backoff_ms": 100,
    });
    for (k, v) in more.as_object().unwrap() {
        o[k] = v.clone();
    }
    o
}

fn sink(options: Value) -> Box<dyn logbus_plugin_api::Sink> {
    testing::sink(&Typed(logbus_aws::s3_sink::S3Sink), options)
}

fn seqs(text: &str) -> Vec<u64> {
    text.lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

/// Events go to one object per key prefix (rendered from a field and the
/// date), gzip-compressed as written, as NDJSON; an object's events are
/// confirmed only once the object exists, which is when the input ends
/// here (no size or age limit is reached).
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_per_prefix_are_confirmed_only_once_written() {
    let url = endpoint();
    let b = bucket(&url, "prefix");
    let heard = Arc::new(Heard::default());
    let s = sink(options(
        &url,
        &b,
        json!({"key_prefix": "logs/{{service}}/%Y/", "filename_extension": "ndjson"}),
    ));
    // A channel of 100 events: the second batch can only be sent once the
    // sink has taken the first and let go of its slots.
    let (tx, rx) = channel(100);
    let mut cx = SinkContext::new("s3", rx, Arc::new(StageMetrics::default()));
    let run = tokio::spawn(async move {
        let r = s.run(&mut cx).await;
        (r, cx.metrics.snapshot())
    });
    tx.send(events(&heard, 1, 0..100)).await.unwrap();
    tx.send(events(&heard, 2, 100..200)).await.unwrap();
    tx.send(events(&heard, 3, 200..300)).await.unwrap();
    // Batch 1 was encoded and its slots came back, yet it is not confirmed:
    // its objects are still open, and nothing is stored.
    assert_eq!(heard.outcomes(), BTreeMap::new());
    assert!(objects(&url, &b).is_empty());
    drop(tx);
    let (result, counts) = run.await.unwrap();
    result.unwrap();
    assert_eq!(counts.events_out, 300);
    assert_eq!(
        heard.outcomes(),
        BTreeMap::from([
            (1, Outcome::Delivered),
            (2, Outcome::Delivered),
            (3, Outcome::Delivered)
        ])
    );
    let stored = objects(&url, &b);
    assert_eq!(stored.len(), 2, "{stored:?}");
    let year = chrono::Utc::now().format("%Y").to_string();
    for (o, service, first) in [(&stored[0], "api", 0), (&stored[1], "db", 1)] {
        let prefix = format!("logs/{service}/{year}/");
        assert!(
            o.key.starts_with(&prefix) && o.key.ends_with(".ndjson.gz"),
            "{}",
            o.key
        );
        assert_eq!(o.content_encoding.as_deref(), Some("gzip"));
        assert_eq!(o.content_type, "text/plain");
        let want: Vec<u64> = (first..300).step_by(2).collect();
        assert_eq!(seqs(&o.text), want);
        for line in o.text.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["service"], service);
        }
    }
}

/// Each compression gives its extension and, where HTTP has a name for
/// it, the object's `Content-Encoding` (lz4 frames have none).
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_compression_names_its_content_encoding() {
    let url = endpoint();
    for (compression, encoding, suffix) in [
        ("zstd", Some("zstd"), ".log.zst"),
        ("deflate", Some("deflate"), ".log.zz"),
        ("lz4", None, ".log.lz4"),
        ("none", None, ".log"),
    ] {
        let b = bucket(&url, compression);
        let heard = Arc::new(Heard::default());
        let (result, _) = testing::run_sink(
            sink(options(&url, &b, json!({"compression": compression}))),
            vec![events(&heard, 1, 0..3)],
        )
        .await;
        result.unwrap();
        let stored = objects(&url, &b);
        assert_eq!(stored.len(), 1, "{compression}: {stored:?}");
        let o = &stored[0];
        assert!(o.key.ends_with(suffix), "{compression}: {}", o.key);
        assert_eq!(o.content_encoding.as_deref(), encoding, "{compression}");
        assert_eq!(seqs(&o.text), [0, 1, 2], "{compression}");
    }
}

/// An object larger than a part goes up as a multipart upload (its ETag
/// ends in `-<parts>`), every byte in order, and is finished once it holds
/// `max_object_bytes`; the next events start a new object.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_object_is_uploaded_in_parts() {
    let url = endpoint();
    let b = bucket(&url, "parts");
    let heard = Arc::new(Heard::default());
    // ~12 MiB per object of 200-byte lines, uncompressed: three parts of
    // 5 MiB at most, so two full ones and a last one.
    let pad = "x".repeat(170);
    let n = 120_000u64;
    let batches: Vec<Vec<Event>> = (0..n / 1000)
        .map(|t| {
            let ack = BatchAck::new(heard.clone(), t);
            (t * 1000..(t + 1) * 1000)
                .map(|i| {
                    Event::raw(format!("{i:012} {pad}"), Meta::now("src".into()))
                        .with_ack(ack.handle())
                })
                .collect()
        })
        .collect();
    // 24 MiB signed and checksummed in a debug build: more than the usual
    // deadline allows on a slow machine.
    let (result, metrics) = testing::run_sink_within(
        std::time::Duration::from_secs(180),
        sink(options(
            &url,
            &b,
            json!({"compression": "none", "max_object_bytes": 12 << 20, "part_size_bytes": 5 << 20}),
        )),
        batches,
    )
    .await;
    result.unwrap();
    assert_eq!(metrics.snapshot().events_out, n);
    let stored = objects(&url, &b);
    let total: u64 = stored.iter().map(|o| o.size).sum();
    assert_eq!(stored.len(), 2, "24 MiB of lines in objects of 12 MiB");
    assert_eq!(total, n * 184);
    let parts: Vec<&str> = stored
        .iter()
        .map(|o| o.etag.trim_matches('"').rsplit('-').next().unwrap())
        .collect();
    assert_eq!(parts, ["3", "2"], "{stored:?}");
    let mut all: Vec<String> = Vec::new();
    for o in &stored {
        assert!(o.key.ends_with(".log"), "{}", o.key);
        all.extend(o.text.lines().map(|l| l[..12].to_string()));
    }
    all.sort();
    let want: Vec<String> = (0..n).map(|i| format!("{i:012}")).collect();
    assert_eq!(all, want);
    assert!(heard.outcomes().values().all(|o| *o == Outcome::Delivered));
    assert_eq!(heard.outcomes().len(), 120);
    assert_eq!(unfinished_uploads(&url, &b), 0);
}

/// An object is finished `max_object_age_ms` after its first event, while
/// the input stays open.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_is_finished_when_it_is_old_enough() {
    let url = endpoint();
    let b = bucket(&url, "age");
    let heard = Arc::new(Heard::default());
    let s = sink(options(
        &url,
        &b,
        json!({"max_object_age_ms": 300, "compression": "zstd", "filename_extension": "ndjson"}),
    ));
    let (tx, rx) = channel(100);
    let mut cx = SinkContext::new("s3", rx, Arc::new(StageMetrics::default()));
    let run = tokio::spawn(async move { s.run(&mut cx).await });
    tx.send(events(&heard, 7, 0..10)).await.unwrap();
    let began = std::time::Instant::now();
    while heard.outcomes().is_empty() {
        assert!(began.elapsed().as_secs() < 20, "never written");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(heard.outcomes(), BTreeMap::from([(7, Outcome::Delivered)]));
    let stored = objects(&url, &b);
    assert_eq!(stored.len(), 1);
    assert!(stored[0].key.ends_with(".ndjson.zst"), "{}", stored[0].key);
    assert_eq!(seqs(&stored[0].text), (0..10).collect::<Vec<_>>());
    drop(tx);
    run.await.unwrap().unwrap();
}

/// A shutdown request finishes the open objects as soon as no input is
/// ready, while the input is still open: the sources wait for their
/// events' acknowledgements before they end the input.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_request_finishes_open_objects_before_the_input_ends() {
    let url = endpoint();
    let b = bucket(&url, "shutdown");
    let heard = Arc::new(Heard::default());
    let s = sink(options(&url, &b, json!({})));
    let (tx, rx) = channel(100);
    let mut cx = SinkContext::new("s3", rx, Arc::new(StageMetrics::default()));
    let shutdown = cx.shutdown.clone();
    let run = tokio::spawn(async move { s.run(&mut cx).await });
    tx.send(events(&heard, 1, 0..10)).await.unwrap();
    // Taken (the channel is free again) but not written: no limit reached.
    tx.send(events(&heard, 2, 10..20)).await.unwrap();
    assert_eq!(heard.outcomes(), BTreeMap::new());
    shutdown.cancel();
    let began = std::time::Instant::now();
    while heard.outcomes().len() < 2 {
        assert!(began.elapsed().as_secs() < 20, "{:?}", heard.outcomes());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        heard.outcomes(),
        BTreeMap::from([(1, Outcome::Delivered), (2, Outcome::Delivered)])
    );
    // Events after the request are written as soon as the input is idle.
    tx.send(events(&heard, 3, 20..30)).await.unwrap();
    while heard.outcomes().len() < 3 {
        assert!(began.elapsed().as_secs() < 20, "{:?}", heard.outcomes());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(tx);
    run.await.unwrap().unwrap();
    let mut all: Vec<u64> = objects(&url, &b)
        .iter()
        .flat_map(|o| seqs(&o.text))
        .collect();
    all.sort();
    assert_eq!(all, (0..30).collect::<Vec<_>>());
}

/// `max_object_events`: an object is finished as it takes its last
/// allowed event, not one later; the rest start the next object.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_holds_at_most_max_object_events() {
    let url = endpoint();
    let b = bucket(&url, "events");
    let heard = Arc::new(Heard::default());
    let (result, metrics) = testing::run_sink(
        sink(options(
            &url,
            &b,
            json!({"compression": "none", "max_object_events": 100}),
        )),
        vec![events(&heard, 1, 0..250)],
    )
    .await;
    result.unwrap();
    assert_eq!(metrics.snapshot().events_out, 250);
    assert_eq!(heard.outcomes(), BTreeMap::from([(1, Outcome::Delivered)]));
    let mut held: Vec<Vec<u64>> = objects(&url, &b).iter().map(|o| seqs(&o.text)).collect();
    held.sort();
    let sizes: Vec<usize> = held.iter().map(Vec::len).collect();
    assert_eq!(sizes, [100, 100, 50]);
    assert_eq!(held.concat(), (0..250).collect::<Vec<_>>());
}

/// More prefixes than `max_open_objects`: the oldest object is finished to
/// make room, so memory stays at that many parts.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_prefix_beyond_the_open_limit_finishes_the_oldest() {
    let url = endpoint();
    let b = bucket(&url, "open");
    let heard = Arc::new(Heard::default());
    let batch = |token: u64, service: &str| {
        let ack = BatchAck::new(heard.clone(), token);
        let fields = json!({"service": service});
        vec![
            Event::fields(fields.as_object().unwrap().clone(), Meta::now("s".into()))
                .with_ack(ack.handle()),
        ]
    };
    let s = sink(options(
        &url,
        &b,
        json!({"key_prefix": "{{service}}/", "max_open_objects": 2}),
    ));
    let (tx, rx) = channel(1);
    let mut cx = SinkContext::new("s3", rx, Arc::new(StageMetrics::default()));
    let run = tokio::spawn(async move { s.run(&mut cx).await });
    tx.send(batch(1, "a")).await.unwrap();
    tx.send(batch(2, "b")).await.unwrap();
    tx.send(batch(3, "c")).await.unwrap();
    // A capacity of 1: this send waits until "c" was taken, which first
    // finished "a".
    tx.send(batch(4, "b")).await.unwrap();
    assert_eq!(heard.outcomes(), BTreeMap::from([(1, Outcome::Delivered)]));
    drop(tx);
    run.await.unwrap().unwrap();
    let keys: Vec<String> = objects(&url, &b).into_iter().map(|o| o.key).collect();
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert_eq!(heard.outcomes().len(), 4);
}

/// Wrong keys: the server refuses the signature, the stage ends saying
/// so, and no event is confirmed.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_fail_clearly_and_confirm_nothing() {
    let url = endpoint();
    let b = bucket(&url, "creds");
    let heard = Arc::new(Heard::default());
    let (result, metrics) = testing::run_sink(
        sink(options(
            &url,
            &b,
            json!({"secret_access_key": "not-the-secret"}),
        )),
        vec![events(&heard, 1, 0..10)],
    )
    .await;
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("SignatureDoesNotMatch") && err.contains(&format!("s3://{b}/")),
        "{err}"
    );
    assert_eq!(heard.outcomes(), BTreeMap::from([(1, Outcome::Errored)]));
    assert_eq!(metrics.snapshot().errored, 10);
    assert_eq!(metrics.snapshot().events_out, 0);
    assert!(objects(&url, &b).is_empty());
}

/// A bucket that does not exist is named in the error.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_is_named() {
    let url = endpoint();
    let heard = Arc::new(Heard::default());
    let (result, _) = testing::run_sink(
        sink(options(&url, "no-such-bucket-here", json!({}))),
        vec![events(&heard, 1, 0..3)],
    )
    .await;
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("NoSuchBucket") && err.contains("s3://no-such-bucket-here/"),
        "{err}"
    );
    assert_eq!(heard.outcomes(), BTreeMap::from([(1, Outcome::Errored)]));
}

/// When one object fails, the objects still open are given up, and the
/// error counts their events (a checkpointing source sends them again).
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_object_counts_the_events_given_up_with_it() {
    let url = endpoint();
    let heard = Arc::new(Heard::default());
    // api gets seqs 0, 2, 4 and is finished (and fails) at its third;
    // db holds 1 and 3 then.
    let (result, metrics) = testing::run_sink(
        sink(options(
            &url,
            "no-such-bucket-here",
            json!({"key_prefix": "{{service}}/", "max_object_events": 3}),
        )),
        vec![events(&heard, 1, 0..6)],
    )
    .await;
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("NoSuchBucket")
            && err.ends_with(
                "; 2 events of unfinished objects were not written (a checkpointing source sends them again)"
            ),
        "{err}"
    );
    assert_eq!(metrics.snapshot().errored, 5);
    assert_eq!(heard.outcomes(), BTreeMap::from([(1, Outcome::Errored)]));
}

/// Nothing listens: each attempt is retried (and counted) until
/// `retry_max_attempts`, then the stage ends naming the endpoint's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_retried_then_given_up() {
    let port = logbus_test_ports::free_port();
    let heard = Arc::new(Heard::default());
    let (result, metrics) = testing::run_sink(
        sink(options(
            &format!("http://127.0.0.1:{port}"),
            "b",
            json!({"retry_max_attempts": 3}),
        )),
        vec![events(&heard, 1, 0..3)],
    )
    .await;
    let err = result.unwrap_err().to_string();
    assert!(err.contains("gave up after 3 attempts"), "{err}");
    assert_eq!(metrics.snapshot().retried, 2);
    assert_eq!(heard.outcomes(), BTreeMap::from([(1, Outcome::Errored)]));
}

#[test]
fn option_errors_name_the_option() {
    let e = |o: Value| testing::option_errors(&Typed(logbus_aws::s3_sink::S3Sink), o);
    assert_eq!(e(json!({"bucket": "b"})), "");
    assert_eq!(
        e(json!({"bucket": "b", "part_size_bytes": 1000})),
        "part_size_bytes: must be between 5242880 (5 MiB) and 5368709120 (5 GiB), S3's limits on a part; got 1000"
    );
    assert_eq!(
        e(json!({"bucket": "b", "access_key_id": "k"})),
        "secret_access_key: is needed with `access_key_id`"
    );
    assert_eq!(
        e(json!({"bucket": "b", "key_prefix": "%Q/"})),
        "key_prefix: `%Q` in `%Q/` is not a supported time directive (%Y %m %d %H %M %S %j %y %U %b %B %a %A %e %G %V %u, or %% for %)"
    );
    assert_eq!(
        e(json!({"bucket": "b", "endpoint": "127.0.0.1:9000"})),
        "endpoint: `127.0.0.1:9000` is not an http:// or https:// URL"
    );
    assert_eq!(
        e(json!({"bucket": "b", "ssekms_key_id": "k"})),
        "ssekms_key_id: needs `server_side_encryption: aws:kms`"
    );
    assert_eq!(
        e(json!({"bucket": "b", "framing": "whole"})),
        "framing: `whole` cannot hold several events in one object"
    );
    assert_eq!(
        e(json!({"bucket": "b", "object_format": "parquet", "compression": "gzip"})),
        "compression: Parquet objects compress inside (their own `compression`/`codec`); leave this unset"
    );
    assert_eq!(
        e(json!({"bucket": "b", "object_format": "avro"})),
        "avro: `object_format: avro` needs `avro: { schema: … }`"
    );
    assert_eq!(
        e(json!({"bucket": "b", "parquet": {"row_group_rows": 10}})),
        "parquet: needs `object_format: parquet`"
    );
    assert_eq!(
        e(
            json!({"bucket": "b", "object_format": "parquet", "avro": {"schema": {"type": "string"}}})
        ),
        "avro: needs `object_format: avro`"
    );
    assert_eq!(
        e(json!({"bucket": "b", "object_format": "parquet", "parquet": {"row_group_rows": 0}})),
        "parquet.row_group_rows: must be at least 1"
    );
    assert_eq!(
        e(
            json!({"bucket": "b", "object_format": "parquet", "parquet": {"schema": {"a": "uint8"}}})
        ),
        "parquet.schema.a: must be one of int64, int32, float64, float32, boolean, string"
    );
    assert!(
        e(json!({"bucket": "b", "object_format": "avro", "avro": {"schema": {"type": "nope"}}}))
            .starts_with("avro.schema"),
        "{}",
        e(json!({"bucket": "b", "object_format": "avro", "avro": {"schema": {"type": "nope"}}}))
    );
    assert!(e(json!({})).contains("bucket"), "{}", e(json!({})));
}

/// Each bound at its edges, each option that must not be 0, and the
/// credential and encryption options that go together.
#[test]
fn option_bounds_hold_at_their_edges() {
    let e = |more: Value| {
        testing::option_errors(
            &Typed(logbus_aws::s3_sink::S3Sink),
            merged(json!({"bucket": "b"}), more),
        )
    };
    let (min, max) = (5u64 << 20, 5u64 << 30);
    for ok in [min, max] {
        assert_eq!(e(json!({"part_size_bytes": ok})), "", "{ok}");
    }
    for bad in [min - 1, max + 1] {
        assert!(
            e(json!({"part_size_bytes": bad})).starts_with("part_size_bytes: must be between"),
            "{bad}"
        );
    }
    for key in [
        "max_object_bytes",
        "max_object_age_ms",
        "max_open_objects",
        "request_timeout_ms",
        "max_object_events",
    ] {
        assert_eq!(e(json!({ key: 1 })), "", "{key}: 1");
        assert_eq!(
            e(json!({ key: 0 })),
            format!("{key}: must be at least 1"),
            "{key}: 0"
        );
    }
    // The shared retry block's bounds, worded as for every sink.
    for key in ["retry_max_attempts", "retry_max_elapsed_ms"] {
        assert_eq!(e(json!({ key: 1 })), "", "{key}: 1");
        assert_eq!(
            e(json!({ key: 0 })),
            format!("{key}: must be at least 1, got 0"),
            "{key}: 0"
        );
    }
    assert_eq!(
        e(json!({"retry_initial_backoff_ms": 0, "retry_max_backoff_ms": 0})),
        "retry_initial_backoff_ms: must be at least 1, got 0; retry_max_backoff_ms: must be at least 1, got 0"
    );
    assert_eq!(
        e(json!({"retry_initial_backoff_ms": 5, "retry_max_backoff_ms": 5})),
        ""
    );
    assert_eq!(
        e(json!({"retry_initial_backoff_ms": 6, "retry_max_backoff_ms": 5})),
        "retry_max_backoff_ms: must not be below `retry_initial_backoff_ms`"
    );
    for sse in ["AES256", "aws:kms", "aws:kms:dsse"] {
        assert_eq!(e(json!({"server_side_encryption": sse})), "", "{sse}");
    }
    assert_eq!(
        e(json!({"server_side_encryption": "aws:kms", "ssekms_key_id": "k"})),
        ""
    );
    assert_eq!(
        e(json!({"server_side_encryption": "AES256", "ssekms_key_id": "k"})),
        "ssekms_key_id: needs `server_side_encryption: aws:kms`"
    );
    assert_eq!(
        e(json!({"server_side_encryption": "aes256"})),
        "server_side_encryption: `aes256` is not one of AES256, aws:kms, aws:kms:dsse"
    );
    assert_eq!(e(json!({"bucket": ""})), "bucket: must not be empty");
    // Credentials: both keys or neither; a token only with them; keys or
    // a profile; an endpoint over http or https.
    assert_eq!(
        e(json!({"access_key_id": "k", "secret_access_key": "s", "session_token": "t"})),
        ""
    );
    assert_eq!(
        e(json!({"secret_access_key": "s"})),
        "access_key_id: is needed with `secret_access_key`"
    );
    assert_eq!(
        e(json!({"session_token": "t"})),
        "session_token: goes with `access_key_id` and `secret_access_key`"
    );
    assert_eq!(
        e(json!({"access_key_id": "k", "secret_access_key": "s", "profile": "p"})),
        "profile: static keys and a profile exclude each other"
    );
    assert_eq!(e(json!({"profile": "p"})), "");
    for ok in ["http://127.0.0.1:9000", "https://s3.example", ""] {
        assert_eq!(e(json!({"endpoint": ok})), "", "{ok}");
    }
    assert_eq!(
        e(json!({"endpoint": "127.0.0.1:9000"})),
        "endpoint: `127.0.0.1:9000` is not an http:// or https:// URL"
    );
}

/// `object_format: parquet`: each object is a Parquet file (read back by
/// pyarrow) with row groups of `row_group_rows`, its schema inferred from
/// the first row group and widened as rows come (an int column meeting a
/// float becomes a float; a field first seen later is added). A row that
/// clashes with the fixed schema of an object starts the next object;
/// nothing is lost or refused.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_objects_hold_row_groups_and_a_clashing_row_starts_the_next() {
    let url = endpoint();
    let b = bucket(&url, "parquet");
    let heard = Arc::new(Heard::default());
    let ack = BatchAck::new(heard.clone(), 1);
    let mut rows: Vec<Value> = (0..2500u64)
        .map(|i| {
            let mut r = json!({"seq": i, "msg": format!("event {i}")});
            // A float among ints in the first row group, and a field that
            // only appears later in it.
            if i == 7 {
                r["latency"] = json!(1.5);
            } else if i < 900 {
                r["latency"] = json!(i);
            }
            if i > 500 {
                r["tags"] = json!({"zone": "a", "n": i});
            }
            r
        })
        .collect();
    // After the first row group the schema is fixed: `seq` as a string
    // clashes and starts a second object.
    rows.push(json!({"seq": "late", "msg": "a string seq"}));
    rows.push(json!({"seq": 2501, "msg": "after it"}));
    let events: Vec<Event> = rows
        .iter()
        .map(|r| {
            Event::fields(r.as_object().unwrap().clone(), Meta::now("src".into()))
                .with_ack(ack.handle())
        })
        .collect();
    drop(ack);
    let (result, metrics) = testing::run_sink(
        sink(options(
            &url,
            &b,
            json!({"object_format": "parquet", "key_prefix": "p/",
                   "parquet": {"row_group_rows": 1000, "compression": "snappy"}}),
        )),
        vec![events],
    )
    .await;
    result.unwrap();
    let counts = metrics.snapshot();
    assert_eq!((counts.events_out, counts.errored), (2502, 0));
    assert_eq!(heard.outcomes(), BTreeMap::from([(1, Outcome::Delivered)]));
    let mut stored = records(&url, &b);
    assert_eq!(stored.len(), 2, "{stored:?}");
    // Keys are `<ms>-<random>`: order them by their first row instead.
    stored.sort_by_key(|(_, _, _, rows)| rows[0]["msg"].as_str().unwrap() != "event 0");
    let (key, content_type, groups, first) = &stored[0];
    assert!(key.starts_with("p/") && key.ends_with(".parquet"), "{key}");
    assert_eq!(content_type, "application/vnd.apache.parquet");
    assert_eq!(*groups, 3, "2500 rows in groups of 1000");
    assert_eq!(first.len(), 2500);
    for (i, r) in first.iter().enumerate() {
        assert_eq!(r["seq"], json!(i), "{r}");
        assert_eq!(r["msg"], json!(format!("event {i}")));
        let latency = match i {
            7 => json!(1.5),
            i if i < 900 => json!(i as f64),
            _ => Value::Null,
        };
        assert_eq!(r["latency"], latency, "row {i}");
        let tags = if i > 500 {
            json!({"zone": "a", "n": i})
        } else {
            Value::Null
        };
        assert_eq!(r["tags"], tags, "row {i}");
    }
    let (_, _, _, second) = &stored[1];
    assert_eq!(
        second,
        &vec![
            json!({"seq": "late", "msg": "a string seq"}),
            json!({"seq": "2501", "msg": "after it"})
        ]
    );
}

/// `object_format: parquet` with a configured schema: events outside it are
/// refused and go to `<id>.dead` with the reason; the rest are stored, and
/// the object is split into parts once its row groups pass a part's size.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_objects_with_a_schema_refuse_what_does_not_fit_to_dead() {
    let url = endpoint();
    let b = bucket(&url, "parquet-schema");
    let heard = Arc::new(Heard::default());
    let n = 60_000u64;
    let pad = "p".repeat(200);
    let batches: Vec<Vec<Event>> = (0..n / 1000)
        .map(|t| {
            let ack = BatchAck::new(heard.clone(), t);
            (t * 1000..(t + 1) * 1000)
                .map(|i| {
                    // Every 1000th row has a string where an int64 goes.
                    let seq = if i % 1000 == 999 {
                        json!("bad")
                    } else {
                        json!(i)
                    };
                    // Random-looking text so that the pages do not compress
                    // to nothing.
                    let noise = format!("{:016x}{pad}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    let f = json!({"seq": seq, "noise": noise});
                    Event::fields(f.as_object().unwrap().clone(), Meta::now("src".into()))
                        .with_ack(ack.handle())
                })
                .collect()
        })
        .collect();
    let s = sink(options(
        &url,
        &b,
        json!({"object_format": "parquet", "key_prefix": "s/",
               "parquet": {"row_group_rows": 5000, "compression": "none",
                           "schema": {"seq": "int64", "noise": "string"}}}),
    ));
    let (tx, rx) = channel(4096);
    let (dead_tx, mut dead_rx) = channel(1000);
    let mut cx = SinkContext::new("s3", rx, Arc::new(StageMetrics::default()));
    cx.dead = logbus_plugin_api::Output::new(
        vec![dead_tx],
        cx.metrics.clone(),
        logbus_plugin_api::OutputRole::Errors,
    );
    let run = tokio::spawn(async move {
        let r = s.run(&mut cx).await;
        (r, cx.metrics.snapshot())
    });
    let dead = tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(mut batch) = dead_rx.recv().await {
            for mut e in batch.take() {
                got.push(e.as_fields().unwrap().clone());
                e.settle(Outcome::Delivered);
            }
        }
        got
    });
    for batch in batches {
        tx.send(batch).await.unwrap();
    }
    drop(tx);
    let (result, counts) = run.await.unwrap();
    result.unwrap();
    let dead = dead.await.unwrap();
    assert_eq!(dead.len(), 60);
    assert_eq!(dead[0]["seq"], "bad");
    assert_eq!(dead[0]["_error"]["stage"], "s3");
    assert!(
        dead[0]["_error"]["message"]
            .as_str()
            .unwrap()
            .contains("schema"),
        "{:?}",
        dead[0]
    );
    assert_eq!(counts.events_out, n - 60);
    assert!(heard.outcomes().values().all(|o| *o == Outcome::Delivered));
    let objects = objects_meta(&url, &b);
    assert_eq!(objects.len(), 1);
    let parts: u64 = objects[0]
        .1
        .trim_matches('"')
        .rsplit('-')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(objects[0].2 > 12 << 20, "{objects:?}");
    assert!(parts >= 2, "{objects:?}");
    let stored = records(&url, &b);
    let (_, _, groups, rows) = &stored[0];
    assert_eq!(*groups, 12, "59,940 rows in groups of 5000");
    let seqs: Vec<u64> = rows.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    let want: Vec<u64> = (0..n).filter(|i| i % 1000 != 999).collect();
    assert_eq!(seqs, want);
    assert_eq!(unfinished_uploads(&url, &b), 0);
}

/// `object_format: avro`: an Avro object container (read back by fastavro), a
/// block per `block_events`, deflate-compressed; events that do not
/// resolve against the schema are refused and counted errored when no
/// `<id>.dead` is connected.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_objects_are_containers_of_blocks() {
    let url = endpoint();
    let b = bucket(&url, "avro");
    let heard = Arc::new(Heard::default());
    let ack = BatchAck::new(heard.clone(), 1);
    let events: Vec<Event> = (0..1001u64)
        .map(|i| {
            let f = if i == 500 {
                json!({"seq": "not a long", "msg": "x"})
            } else {
                json!({"seq": i, "msg": format!("event {i}")})
            };
            Event::fields(f.as_object().unwrap().clone(), Meta::now("src".into()))
                .with_ack(ack.handle())
        })
        .collect();
    drop(ack);
    let schema = json!({"type": "record", "name": "E", "fields": [
        {"name": "seq", "type": "long"}, {"name": "msg", "type": "string"}]});
    let (result, metrics) = testing::run_sink(
        sink(options(
            &url,
            &b,
            json!({"object_format": "avro", "key_prefix": "a/",
                   "avro": {"schema": schema, "codec": "deflate", "block_events": 300}}),
        )),
        vec![events],
    )
    .await;
    result.unwrap();
    let counts = metrics.snapshot();
    assert_eq!((counts.events_out, counts.errored), (1000, 1));
    // The refused event's batch reports the worst outcome.
    assert_eq!(heard.outcomes(), BTreeMap::from([(1, Outcome::Rejected)]));
    let stored = records(&url, &b);
    assert_eq!(stored.len(), 1);
    let (key, content_type, blocks, rows) = &stored[0];
    assert!(key.starts_with("a/") && key.ends_with(".avro"), "{key}");
    assert_eq!(content_type, "application/avro");
    assert_eq!(*blocks, 4, "1000 records in blocks of 300");
    let want: Vec<Value> = (0..1001u64)
        .filter(|i| *i != 500)
        .map(|i| json!({"seq": i, "msg": format!("event {i}")}))
        .collect();
    assert_eq!(rows, &want);
}

/// `validate --connect`: the bucket is listed with the stage's keys.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test]
async fn the_probe_finds_a_missing_bucket_and_a_wrong_secret() {
    let url = endpoint();
    let present = bucket(&url, "probe");
    let plugin = Typed(logbus_aws::s3_sink::S3Sink);
    let probe = |bucket: &str, secret: &str| {
        testing::probe(
            &plugin,
            json!({ "bucket": bucket, "endpoint": url, "force_path_style": true, "region": "us-east-1",
                     "access_key_id": ACCESS_KEY, "secret_access_key": secret }),
            None,
        )
    };
    assert!(probe(&present, SECRET_KEY).await.is_empty());
    assert_eq!(
        probe(&format!("{present}-absent"), SECRET_KEY).await,
        ["bucket service-missing"]
    );
    assert_eq!(
        probe(&present, "not-the-secret").await,
        ["access_key_id service-refused"]
    );
}
