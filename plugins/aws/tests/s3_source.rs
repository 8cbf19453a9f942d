//! `source: s3` against MinIO (`.ci/services up s3`); the objects it reads
//! are written by boto3 (see `common`), compressed by Python's own modules.

use std::collections::BTreeMap;
use std::time::Duration;

use logbus_plugin_api::testing::{self, RunningSource};
use logbus_plugin_api::{Outcome, Typed, now_ns};
use serde_json::{Value, json};

mod common;
use common::{ACCESS_KEY, SECRET_KEY, bucket, endpoint, merged, python};

/// Puts `lines` (joined with newlines) at `key`, compressed by the key's
/// extension (`.gz`, `.zst`; else plain).
fn put(url: &str, b: &str, key: &str, lines: &[String]) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("body");
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(&file, text).unwrap();
    python(
        url,
        "import gzip, zstandard\n\
         b = open(ARGS[2], 'rb').read()\n\
         if ARGS[1].endswith('.gz'): b = gzip.compress(b)\n\
         elif ARGS[1].endswith('.zst'): b = zstandard.ZstdCompressor().compress(b)\n\
         s3.put_object(Bucket=ARGS[0], Key=ARGS[1], Body=b)",
        &[b, key, file.to_str().unwrap()],
    );
}

/// How the source ended, which it must within `secs` seconds.
async fn ended(s: RunningSource, secs: u64) -> Result<(), String> {
    tokio::time::timeout(Duration::from_secs(secs), s.task)
        .await
        .unwrap_or_else(|_| panic!("the source did not end within {secs} s"))
        .expect("the source task panicked")
        .map_err(|e| e.to_string())
}

fn lines(tag: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{tag} {i:06}")).collect()
}

fn source(url: &str, b: &str, more: Value, capacity: usize) -> RunningSource {
    let mut o = json!({
        "bucket": b, "endpoint": url, "force_path_style": true, "region": "us-east-1",
        "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
    });
    for (k, v) in more.as_object().unwrap() {
        o[k] = v.clone();
    }
    testing::run_source(
        testing::source(&Typed(logbus_aws::s3_source::S3Source), o),
        capacity,
    )
}

/// Every object under the prefix that the globs let through, each
/// decompressed by its magic bytes, in key order per object; the source
/// ends by itself (no polling) and its checkpoint says every key is done.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_is_read_decompressed_and_checkpointed() {
    let url = endpoint();
    let b = bucket(&url, "src");
    put(&url, &b, "logs/a.log.gz", &lines("a", 100));
    put(&url, &b, "logs/b.log.zst", &lines("b", 100));
    put(&url, &b, "logs/c.log", &lines("c", 100));
    put(&url, &b, "logs/skip.tmp", &lines("tmp", 5));
    put(&url, &b, "other/d.log", &lines("d", 5));
    let state = tempfile::tempdir().unwrap();
    let started_ns = now_ns();
    let mut s = source(
        &url,
        &b,
        json!({"prefix": "logs/", "exclude": ["*.tmp"], "state_dir": state.path()}),
        10_000,
    );
    let events = testing::take(&mut s.rx, 300).await;
    let taken_ns = now_ns();
    let mut by_origin: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in &events {
        // Stamped when read, not left at the template's zero.
        let ingest_ns = e.meta().ingest_ns;
        assert!(
            (started_ns..=taken_ns).contains(&ingest_ns),
            "ingest time {ingest_ns} outside the run ({started_ns}..={taken_ns})"
        );
        by_origin
            .entry(e.meta().origin.as_deref().unwrap().to_string())
            .or_default()
            .push(String::from_utf8(e.as_raw().unwrap().to_vec()).unwrap());
    }
    for (tag, key) in [("a", "a.log.gz"), ("b", "b.log.zst"), ("c", "c.log")] {
        assert_eq!(
            by_origin[&format!("s3://{b}/logs/{key}")],
            lines(tag, 100),
            "{key}"
        );
    }
    assert_eq!(by_origin.len(), 3);
    // One pass and no polling: it ends once everything is delivered.
    ended(s, 20).await.unwrap();
    let saved: Value = serde_json::from_slice(
        &std::fs::read(state.path().join("s.s3.json")).unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap();
    assert_eq!(saved["after"], "logs/c.log", "{saved}");
    assert_eq!(saved["partial"], json!({}));
}

/// A first run delivers one object and the start of another, the rest of
/// which errors (a sink failed); the second run reads neither the first
/// object nor the delivered start of the second again, and reads the rest.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_skips_what_was_delivered_and_reads_the_rest() {
    let url = endpoint();
    let b = bucket(&url, "resume");
    put(&url, &b, "1-small.log", &lines("s", 10));
    // ~1 MiB: several reads of 128 KiB, so several batches.
    put(&url, &b, "2-big.log", &lines("big", 80_000));
    let state = tempfile::tempdir().unwrap();
    let options = json!({"concurrency": 1, "state_dir": state.path()});
    let mut s = source(&url, &b, options.clone(), 1_000_000);
    // Objects are read one at a time, in key order: the small one (one
    // batch), then the big one, of which two batches are delivered and the
    // third is dropped unsettled (errored).
    let mut big_first = 0usize;
    let mut big_batches = 0;
    loop {
        let mut batch = tokio::time::timeout(Duration::from_secs(20), s.rx.recv())
            .await
            .unwrap()
            .unwrap();
        let origin = batch.events()[0].meta().origin.clone().unwrap();
        if origin.ends_with("2-big.log") {
            if big_batches == 2 {
                drop(batch);
                break;
            }
            big_batches += 1;
            big_first += batch.len();
        }
        batch.settle(Outcome::Delivered);
    }
    // Drain the rest without delivering it, then stop.
    while let Ok(Some(batch)) = tokio::time::timeout(Duration::from_millis(500), s.rx.recv()).await
    {
        drop(batch);
    }
    let _ = s.stop().await;
    let saved: Value =
        serde_json::from_slice(&std::fs::read(state.path().join("s.s3.json")).unwrap()).unwrap();
    assert_eq!(saved["after"], "1-small.log", "{saved}");
    assert_eq!(saved["partial"]["2-big.log"], big_first as u64, "{saved}");

    let mut s = source(&url, &b, options, 1_000_000);
    let rest = testing::take(&mut s.rx, 80_000 - big_first).await;
    let texts: Vec<String> = rest
        .iter()
        .map(|e| String::from_utf8(e.as_raw().unwrap().to_vec()).unwrap())
        .collect();
    assert_eq!(texts, lines("big", 80_000)[big_first..]);
    ended(s, 20).await.unwrap();
}

/// With `poll_interval_ms`, a key written later is read too.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_reads_keys_written_later() {
    let url = endpoint();
    let b = bucket(&url, "poll");
    put(&url, &b, "2026/01.log", &lines("one", 3));
    let mut s = source(&url, &b, json!({"poll_interval_ms": 100}), 100);
    let first = testing::take_text(&mut s.rx, 3).await;
    assert_eq!(first, lines("one", 3));
    put(&url, &b, "2026/02.log", &lines("two", 3));
    let second = testing::take_text(&mut s.rx, 3).await;
    assert_eq!(second, lines("two", 3));
    s.stop().await.unwrap();
}

/// A listing longer than one page (S3 answers 1,000 keys a page) is read
/// to its end: every key.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_of_more_than_one_page_is_read_to_its_end() {
    let url = endpoint();
    let b = bucket(&url, "pages");
    python(
        &url,
        "for i in range(1001): s3.put_object(Bucket=ARGS[0], Key=f'k/{i:04}.log', Body=f'line {i:04}\\n'.encode())",
        &[&b],
    );
    let mut s = source(&url, &b, json!({"concurrency": 8}), 2_000);
    let mut read = testing::take_text(&mut s.rx, 1001).await;
    read.sort();
    let want: Vec<String> = (0..1001).map(|i| format!("line {i:04}")).collect();
    assert_eq!(read, want);
    ended(s, 30).await.unwrap();
}

/// Wrong keys: the listing is refused and the stage ends saying so.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_end_the_source_clearly() {
    let url = endpoint();
    let b = bucket(&url, "srccreds");
    let s = source(&url, &b, json!({"secret_access_key": "wrong"}), 10);
    let err = ended(s, 20).await.unwrap_err();
    assert!(
        err.contains("SignatureDoesNotMatch") && err.contains(&format!("listing s3://{b}/")),
        "{err}"
    );
}

/// Nothing listens: the listing is retried under the stage's own retry
/// options until `retry_max_attempts`, then the source ends
/// naming the endpoint's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_retried_then_given_up() {
    let port = logbus_test_ports::free_port();
    let s = source(
        &format!("http://127.0.0.1:{port}"),
        "b",
        json!({"retry_max_attempts": 3, "retry_initial_backoff_ms": 10, "retry_max_backoff_ms": 20}),
        10,
    );
    let err = ended(s, 60).await.unwrap_err();
    assert!(
        err.starts_with("listing s3://b/: ") && err.ends_with("(gave up after 3 attempts)"),
        "{err}"
    );
}

/// A checkpoint that exists but cannot be read (here: a directory) ends
/// the source with the reason; it is not taken for a first start, which
/// would read the bucket again from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_checkpoint_is_an_error_not_a_first_start() {
    let state = tempfile::tempdir().unwrap();
    std::fs::create_dir(state.path().join("s.s3.json")).unwrap();
    let port = logbus_test_ports::free_port();
    let s = source(
        &format!("http://127.0.0.1:{port}"),
        "b",
        json!({"state_dir": state.path(), "retry_max_attempts": 1}),
        10,
    );
    let err = ended(s, 60).await.unwrap_err();
    assert!(err.contains("reading the checkpoint"), "{err}");
    assert!(err.contains("s.s3.json"), "{err}");
}

#[test]
fn option_errors_name_the_option() {
    let e = |o: Value| testing::option_errors(&Typed(logbus_aws::s3_source::S3Source), o);
    assert_eq!(e(json!({"bucket": "b"})), "");
    assert_eq!(
        e(json!({"bucket": "b", "include": ["a[b"]})),
        "include.0: `a[b` is not a glob: Pattern syntax error near position 1: invalid range pattern"
    );
    assert_eq!(
        e(json!({"bucket": "b", "concurrency": 0})),
        "concurrency: must be between 1 and 64, got 0"
    );
    assert_eq!(
        e(json!({"bucket": "b", "poll_interval_ms": 0})),
        "poll_interval_ms: must be at least 1"
    );
    // Each bound at its edges.
    let with = |more: Value| e(merged(json!({"bucket": "b"}), more));
    for ok in [1, 64] {
        assert_eq!(with(json!({"concurrency": ok})), "", "{ok}");
    }
    assert_eq!(
        with(json!({"concurrency": 65})),
        "concurrency: must be between 1 and 64, got 65"
    );
    for key in [
        "max_line_bytes",
        "request_timeout_ms",
        "retry_max_attempts",
        "poll_interval_ms",
    ] {
        assert_eq!(with(json!({ key: 1 })), "", "{key}: 1");
        assert_eq!(
            with(json!({ key: 0 })),
            format!("{key}: must be at least 1"),
            "{key}: 0"
        );
    }
    assert_eq!(
        with(json!({"retry_initial_backoff_ms": 0, "retry_max_backoff_ms": 0})),
        "retry_initial_backoff_ms: must be at least 1; retry_max_backoff_ms: must be at least 1"
    );
    assert_eq!(
        with(json!({"retry_initial_backoff_ms": 5, "retry_max_backoff_ms": 5})),
        ""
    );
    assert_eq!(
        with(json!({"retry_initial_backoff_ms": 6, "retry_max_backoff_ms": 5})),
        "retry_max_backoff_ms: must not be below `retry_initial_backoff_ms`"
    );
    assert_eq!(
        with(json!({"exclude": ["ok/*", "b[", "c"]})),
        "exclude.1: `b[` is not a glob: Pattern syntax error near position 1: invalid range pattern"
    );
    assert_eq!(with(json!({"bucket": ""})), "bucket: must not be empty");
}
