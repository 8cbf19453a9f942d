//! `source: s3` against MinIO (`.ci/services up s3`); the objects it reads
//! are written by boto3 (see `common`), compressed by Python's own modules.

use std::collections::BTreeMap;
use std::time::Duration;

use logbus_plugin_api::testing::{self, RunningSource};
use logbus_plugin_api::{Outcome, Typed, now_ns};
use serde_json::{Value, json};

use logbus_test_services::aws::{
    ACCESS_KEY, SECRET_KEY, bucket, cutting_proxy, endpoint, merged, python,
};

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

/// A source that has read everything waits for the events still in flight
/// before its last checkpoint: here the "sink" holds every batch until the
/// source has given up its output (the stream ends), and only then settles
/// them. The source must still be running then, and the checkpoint it
/// saves at the end must say every key is done — one saved without waiting
/// would make a restart read both objects again.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_checkpoint_waits_for_the_events_still_in_flight() {
    let url = endpoint();
    let b = bucket(&url, "wait");
    put(&url, &b, "logs/a.log", &lines("a", 50));
    put(&url, &b, "logs/b.log", &lines("b", 50));
    let state = tempfile::tempdir().unwrap();
    let checkpoint = state.path().join("s.s3.json");
    let mut s = source(&url, &b, json!({"state_dir": state.path()}), 10_000);
    let mut held = Vec::new();
    let mut events = 0;
    while let Some(batch) = tokio::time::timeout(Duration::from_secs(20), s.rx.recv())
        .await
        .expect("the stream neither ended nor moved for 20 s")
    {
        events += batch.len();
        held.push(batch);
    }
    assert_eq!(events, 100);
    // The stream has ended: the source has read both objects and dropped
    // its output. Nothing is settled yet, so no checkpoint so far can say
    // the last key is done.
    if let Ok(body) = std::fs::read(&checkpoint) {
        let saved: Value = serde_json::from_slice(&body).unwrap();
        assert_ne!(
            saved["after"], "logs/b.log",
            "saved before delivery: {saved}"
        );
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut s.task)
            .await
            .is_err(),
        "the source ended with 100 events in flight instead of waiting for them"
    );
    for mut batch in held {
        batch.settle(Outcome::Delivered);
    }
    ended(s, 20).await.unwrap();
    let saved: Value = serde_json::from_slice(&std::fs::read(&checkpoint).unwrap()).unwrap();
    assert_eq!(saved["after"], "logs/b.log", "{saved}");
    assert_eq!(saved["partial"], json!({}), "{saved}");
}

/// Lines of about 50 bytes, so an object of `n` spans many reads.
fn long_lines(tag: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("{tag} {i:06} {}", "x".repeat(40)))
        .collect()
}

/// Plays the sink to the stream's end (the source has given up its
/// output): every event settled delivered as it comes; each one's text
/// and origin, in arrival order.
async fn drain(rx: &mut logbus_plugin_api::Receiver) -> Vec<(String, String)> {
    let mut got = Vec::new();
    while let Some(mut batch) = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("the stream neither ended nor moved for 20 s")
    {
        batch.settle(Outcome::Delivered);
        got.extend(batch.take().iter().map(|e| {
            (
                String::from_utf8(e.as_raw().unwrap().to_vec()).unwrap(),
                e.meta().origin.as_deref().unwrap().to_string(),
            )
        }));
    }
    got
}

/// Each download of the object is cut short, each one further in than the
/// last (200 kB, 400 kB, …: a fresh download starts at the object's
/// start). Every attempt that gets further counts as a first, so
/// `retry_max_attempts: 2` does not stop it; the lines already sent are
/// skipped on each new attempt, and every line arrives once, in order.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_cut_short_is_read_again_from_where_it_got_to() {
    let url = endpoint();
    let b = bucket(&url, "cut");
    let want = long_lines("a", 20_000); // about 1 MB
    put(&url, &b, "logs/a.log", &want);
    let proxy = cutting_proxy(&url, |_, n| (n < 5).then_some(n * 200_000));
    let mut s = source(
        &proxy.url,
        &b,
        json!({"retry_max_attempts": 2, "retry_initial_backoff_ms": 10, "retry_max_backoff_ms": 50}),
        100_000,
    );
    let got = drain(&mut s.rx).await;
    ended(s, 30).await.unwrap();
    assert_eq!(
        proxy.gets_of("logs/a.log"),
        5,
        "four cut downloads, then a whole one"
    );
    let text: Vec<String> = got.into_iter().map(|(t, _)| t).collect();
    assert_eq!(text.len(), want.len());
    assert!(text == want, "every line once, in order");
}

/// Each download is cut at the same place: after the first attempt no
/// attempt gets further, so the source gives up after
/// `retry_max_attempts` attempts and ends naming the object.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_that_never_gets_further_is_given_up() {
    let url = endpoint();
    let b = bucket(&url, "cutever");
    put(&url, &b, "logs/a.log", &long_lines("a", 20_000));
    let proxy = cutting_proxy(&url, |_, _| Some(20_000));
    let mut s = source(
        &proxy.url,
        &b,
        json!({"retry_max_attempts": 3, "retry_initial_backoff_ms": 10, "retry_max_backoff_ms": 50}),
        100_000,
    );
    let got = drain(&mut s.rx).await;
    let err = ended(s, 30).await.unwrap_err();
    assert!(
        err.contains(&format!("s3://{b}/logs/a.log"))
            && err.ends_with("(gave up after 3 attempts)"),
        "{err}"
    );
    assert_eq!(proxy.gets_of("logs/a.log"), 3);
    // What the first attempt read (the first few hundred lines) was sent,
    // and only once.
    assert!(got.len() < 1_000, "{} lines", got.len());
    let want = long_lines("a", got.len());
    assert!(got.iter().map(|(t, _)| t).eq(want.iter()));
}

/// An object that cannot be decoded (gzip's magic, then garbage) is not a
/// network failure: retrying reads the same bytes, so the source ends at
/// once naming it, after a single download.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_cannot_be_decoded_ends_the_source_without_retrying() {
    let url = endpoint();
    let b = bucket(&url, "garbage");
    python(
        &url,
        "s3.put_object(Bucket=ARGS[0], Key='logs/bad.log', Body=b'\\x1f\\x8b' + b'not gzip' * 100)",
        &[&b],
    );
    let proxy = cutting_proxy(&url, |_, _| None);
    let mut s = source(
        &proxy.url,
        &b,
        json!({"retry_max_attempts": 5, "retry_initial_backoff_ms": 10, "retry_max_backoff_ms": 50}),
        100,
    );
    assert!(drain(&mut s.rx).await.is_empty());
    let err = ended(s, 30).await.unwrap_err();
    assert!(
        err.contains(&format!("s3://{b}/logs/bad.log")) && !err.contains("gave up"),
        "{err}"
    );
    assert_eq!(proxy.gets_of("logs/bad.log"), 1);
}

/// `concurrency: 1` reads one object at a time: into a small channel, the
/// three objects' lines arrive in three runs, in key order. (Two readers
/// at once would both wait on the channel and take turns.)
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_one_reads_one_object_at_a_time() {
    let url = endpoint();
    let b = bucket(&url, "one");
    for tag in ["a", "b", "c"] {
        put(
            &url,
            &b,
            &format!("logs/{tag}.log"),
            &long_lines(tag, 20_000),
        );
    }
    let mut s = source(&url, &b, json!({"concurrency": 1}), 64);
    let got = drain(&mut s.rx).await;
    ended(s, 30).await.unwrap();
    assert_eq!(got.len(), 60_000);
    let mut runs: Vec<&str> = got.iter().map(|(_, origin)| origin.as_str()).collect();
    runs.dedup();
    let want: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|t| format!("s3://{b}/logs/{t}.log"))
        .collect();
    assert_eq!(runs, want);
}

/// While a pass runs, the checkpoint is saved about every second, not
/// only at the pass's end: once the first object's events are settled (a
/// second and a half in, so that only the periodic save can record them),
/// the file says the object is done while the second one is still being
/// read (its reader waits on a channel the held events fill).
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkpoint_is_saved_every_second_while_a_pass_runs() {
    let url = endpoint();
    let b = bucket(&url, "every");
    put(&url, &b, "logs/a.log", &long_lines("a", 20_000));
    put(&url, &b, "logs/b.log", &long_lines("b", 20_000));
    let state = tempfile::tempdir().unwrap();
    let checkpoint = state.path().join("s.s3.json");
    let after = || -> Option<Value> {
        let saved: Value = serde_json::from_slice(&std::fs::read(&checkpoint).ok()?).ok()?;
        Some(saved["after"].clone())
    };
    let started = std::time::Instant::now();
    let mut s = source(
        &url,
        &b,
        json!({"concurrency": 1, "state_dir": state.path()}),
        // Held events count against the channel: room for the first
        // object's and half the second's.
        30_000,
    );
    let mut held = Vec::new();
    let mut first = 0;
    while first < 20_000 {
        let batch = tokio::time::timeout(Duration::from_secs(20), s.rx.recv())
            .await
            .expect("no event within 20 s")
            .expect("the stream ended early");
        first += batch.len();
        held.push(batch);
    }
    assert_eq!(first, 20_000, "the first object alone (concurrency 1)");
    // The behaviour under test is a timer: let it pass its first tick.
    tokio::time::sleep(Duration::from_millis(1_500).saturating_sub(started.elapsed())).await;
    assert_ne!(after(), Some(json!("logs/a.log")), "nothing settled yet");
    // Settled but kept: while they are held, the second object's reader
    // stays blocked and the pass cannot end (and save at its end).
    for batch in &mut held {
        batch.settle(Outcome::Delivered);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while after() != Some(json!("logs/a.log")) {
        assert!(
            std::time::Instant::now() < deadline,
            "no save within 10 s recorded the first object: {:?}",
            after()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!s.task.is_finished(), "the pass is still running");
    drop(held);
    let rest = drain(&mut s.rx).await;
    assert_eq!(rest.len(), 20_000);
    ended(s, 30).await.unwrap();
    assert_eq!(after(), Some(json!("logs/b.log")));
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
    for key in ["max_line_bytes", "request_timeout_ms", "poll_interval_ms"] {
        assert_eq!(with(json!({ key: 1 })), "", "{key}: 1");
        assert_eq!(
            with(json!({ key: 0 })),
            format!("{key}: must be at least 1"),
            "{key}: 0"
        );
    }
    // The shared retry block's bounds, worded as for every sink.
    for key in ["retry_max_attempts", "retry_max_elapsed_ms"] {
        assert_eq!(with(json!({ key: 1 })), "", "{key}: 1");
        assert_eq!(
            with(json!({ key: 0 })),
            format!("{key}: must be at least 1, got 0"),
            "{key}: 0"
        );
    }
    assert_eq!(
        with(json!({"retry_initial_backoff_ms": 0, "retry_max_backoff_ms": 0})),
        "retry_initial_backoff_ms: must be at least 1, got 0; retry_max_backoff_ms: must be at least 1, got 0"
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

/// `validate --connect`: the prefix is listed with the stage's keys.
#[ignore = "needs an S3 server and boto3 (.ci/services up s3; pip install boto3); run with --include-ignored"]
#[tokio::test]
async fn the_probe_finds_a_missing_bucket() {
    let url = endpoint();
    let present = bucket(&url, "probe");
    let plugin = Typed(logbus_aws::s3_source::S3Source);
    let probe = |bucket: String| {
        testing::probe(
            &plugin,
            json!({ "bucket": bucket, "prefix": "logs/", "endpoint": url, "force_path_style": true,
                     "region": "us-east-1", "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY }),
            None,
        )
    };
    assert!(probe(present.clone()).await.is_empty());
    assert_eq!(
        probe(format!("{present}-absent")).await,
        ["bucket service-missing"]
    );
}
