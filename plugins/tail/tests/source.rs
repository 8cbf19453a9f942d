//! `source: tail` as the engine runs it: a full pipeline stops the reading,
//! shutdown saves the positions, and a restart continues exactly there.

use std::io::Write;
use std::sync::Arc;

use logbus_plugin_api::testing;
use logbus_plugin_api::{
    BuildContext, CancellationToken, Output, OutputRole, Plugin, SourceContext, StageMetrics,
    Typed, channel,
};
use serde_json::json;

fn build(options: serde_json::Value, base: &std::path::Path) -> Box<dyn logbus_plugin_api::Source> {
    testing::source_in(&Typed(logbus_tail::source::TailSource), options, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_stops_the_reading_and_a_restart_resumes_where_shutdown_left_off() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    // ~1.2 MB: several read chunks.
    let n = 100_000;
    {
        let mut f = std::fs::File::create(logs.join("app.log")).unwrap();
        for i in 0..n {
            writeln!(f, "line {i:06}").unwrap();
        }
    }
    let options = json!({
        "paths": ["logs/*.log"],
        "state_dir": "state",
        "poll_interval_ms": 10,
        "checkpoint_interval_ms": 10,
    });
    let state = dir.path().join("state/logs.tail.json");

    let (tx, mut rx) = channel(100);
    let shutdown = CancellationToken::new();
    let source = build(options.clone(), dir.path());
    let task = tokio::spawn(source.run(SourceContext {
        id: "logs".into(),
        output: Output::new(
            vec![tx],
            Arc::new(StageMetrics::default()),
            OutputRole::Main,
        ),
        shutdown: shutdown.clone(),
    }));
    // Nobody reads: the channel fills and the tailer waits inside its send,
    // so it has neither read further nor saved a position past the events
    // the pipeline took.
    let handle = rx.handle();
    while handle.occupancy() < 100 {
        assert!(!task.is_finished(), "the source ended");
        tokio::task::yield_now().await;
    }
    assert!(!state.exists(), "a position was saved while blocked");
    // Drain it all, then stop.
    let got = testing::take_text(&mut rx, n).await;
    assert_eq!(got.len(), n);
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, l)| *l == format!("line {i:06}"))
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    let len = std::fs::metadata(logs.join("app.log")).unwrap().len();
    assert_eq!(saved["files"][0]["offset"], len);

    // Restart: only what was appended meanwhile comes out.
    {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(logs.join("app.log"))
            .unwrap();
        writeln!(f, "after restart").unwrap();
    }
    let (tx, mut rx) = channel(100);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(build(options, dir.path()).run(SourceContext {
        id: "logs".into(),
        output: Output::new(
            vec![tx],
            Arc::new(StageMetrics::default()),
            OutputRole::Main,
        ),
        shutdown: shutdown.clone(),
    }));
    assert_eq!(testing::take_text(&mut rx, 1).await, ["after restart"]);
    shutdown.cancel();
    task.await.unwrap().unwrap();
    assert!(rx.recv().await.is_none(), "nothing else was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_says_which_file_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    std::fs::write(logs.join("a.log"), "a1\na2\n").unwrap();
    std::fs::write(logs.join("b.log"), "b1\n").unwrap();
    let source = build(
        json!({ "paths": ["logs/*.log"], "state_dir": "state", "poll_interval_ms": 10 }),
        dir.path(),
    );
    let mut running = testing::run_source(source, 100);
    let events = testing::take(&mut running.rx, 3).await;
    // Lines of one file share one origin, not a copy each.
    let a: Vec<_> = events
        .iter()
        .filter_map(|e| e.meta().origin.clone())
        .filter(|o| o.ends_with("a.log"))
        .collect();
    assert!(a.len() == 2 && Arc::ptr_eq(&a[0], &a[1]), "{a:?}");
    // And where in it: the tailer's offset, in a stream named per file.
    let mut placed: Vec<(String, u64)> = events
        .iter()
        .map(|e| {
            let p = e.meta().position.expect("a position");
            (
                String::from_utf8_lossy(e.as_raw().unwrap()).into_owned(),
                p.offset,
            )
        })
        .collect();
    placed.sort();
    assert_eq!(
        placed,
        [
            ("a1".to_string(), 0),
            ("a2".to_string(), 3),
            ("b1".to_string(), 0)
        ]
    );
    let streams: std::collections::HashSet<u64> = events
        .iter()
        .map(|e| e.meta().position.unwrap().stream)
        .collect();
    assert_eq!(
        streams.len(),
        3,
        "a line that ends before the fingerprint's bytes names the file by the bytes up to its end"
    );
    let mut got: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            let line = String::from_utf8_lossy(e.as_raw().unwrap()).into_owned();
            let origin = e.meta().origin.as_deref().expect("an origin").to_string();
            (line, origin)
        })
        .collect();
    got.sort();
    let path = |name: &str| logs.join(name).to_string_lossy().into_owned();
    assert_eq!(
        got,
        [
            ("a1".to_string(), path("a.log")),
            ("a2".to_string(), path("a.log")),
            ("b1".to_string(), path("b.log")),
        ]
    );
    // It goes on following them.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(logs.join("b.log"))
        .unwrap();
    writeln!(f, "b2").unwrap();
    assert_eq!(testing::take_text(&mut running.rx, 1).await, ["b2"]);
    running.stop().await.unwrap();
}

#[test]
fn bad_options_are_reported_by_key() {
    let cx = BuildContext {
        stage_id: "logs".into(),
        base_dir: ".".into(),
        worker: 0,
    };
    let errors = |o: serde_json::Value| -> Vec<String> {
        match Typed(logbus_tail::source::TailSource).build(&o, &cx) {
            Err(e) => e
                .iter()
                .map(|e| format!("{}: {}", e.path.join("."), e.message))
                .collect(),
            Ok(_) => Vec::new(),
        }
    };
    let e = errors(json!({ "paths": [], "state_dir": "s" }));
    assert!(e.iter().any(|e| e.starts_with("paths: ")), "{e:?}");
    let e = errors(json!({ "paths": ["a[.log"], "state_dir": "s" }));
    assert!(e.iter().any(|e| e.contains("not a valid glob")), "{e:?}");
    let e = errors(json!({ "paths": ["*.log"] }));
    assert!(e.iter().any(|e| e.contains("state_dir")), "{e:?}");
    let e = errors(json!({ "paths": ["*.log"], "state_dir": "s", "multiline": { "start": "(" } }));
    assert!(
        e.iter().any(|e| e.starts_with("multiline.start: ")),
        "{e:?}"
    );
    let e =
        errors(json!({ "paths": ["*.log"], "state_dir": "s", "multiline": { "timeout_ms": 5 } }));
    assert!(e.iter().any(|e| e.contains("exactly one")), "{e:?}");
}

/// `multiline:` as the stage builds it: `start` and `continuation` join
/// differently, `max_lines` cuts, and the last event comes out after
/// `timeout_ms` without a line after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiline_options_join_lines_as_they_say() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    std::fs::write(
        logs.join("a.log"),
        "[1] boom\n  at a\n[2] x\n  y\n  z\nplain\n",
    )
    .unwrap();
    let joined = |multiline: serde_json::Value, n: usize| {
        let source = build(
            json!({
                "paths": ["logs/*.log"], "state_dir": "state", "poll_interval_ms": 10,
                "multiline": multiline,
            }),
            dir.path(),
        );
        async move {
            let mut running = testing::run_source(source, 100);
            let got: Vec<String> = testing::take(&mut running.rx, n)
                .await
                .iter()
                .map(|e| String::from_utf8_lossy(e.as_raw().unwrap()).into_owned())
                .collect();
            running.stop().await.unwrap();
            got
        }
    };
    assert_eq!(
        joined(
            json!({ "start": "^\\[", "max_lines": 2, "timeout_ms": 20 }),
            3
        )
        .await,
        ["[1] boom\n  at a", "[2] x\n  y", "  z\nplain"]
    );
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    assert_eq!(
        joined(json!({ "continuation": "^\\s", "timeout_ms": 20 }), 3).await,
        ["[1] boom\n  at a", "[2] x\n  y\n  z", "plain"]
    );
}

/// A tail source running into a channel the test reads, with the metrics
/// it publishes its acknowledgement counts to.
struct Running {
    rx: logbus_plugin_api::Receiver,
    metrics: Arc<StageMetrics>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), logbus_plugin_api::StageError>>,
}

fn start(options: serde_json::Value, base: &std::path::Path) -> Running {
    let (tx, rx) = channel(100);
    let metrics = Arc::new(StageMetrics::default());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(build(options, base).run(SourceContext {
        id: "logs".into(),
        output: Output::new(vec![tx], metrics.clone(), OutputRole::Main),
        shutdown: shutdown.clone(),
    }));
    Running {
        rx,
        metrics,
        shutdown,
        task,
    }
}

impl Running {
    /// The next batch, unsettled (the test plays a sink that has not
    /// confirmed it yet).
    async fn next(&mut self) -> logbus_plugin_api::InputBatch {
        tokio::time::timeout(std::time::Duration::from_secs(20), self.rx.recv())
            .await
            .expect("a batch within 20 s")
            .expect("the source still runs")
    }

    /// Appends `line` and receives it: the source's loop went round again.
    async fn append_and_take(&mut self, path: &std::path::Path, line: &str) {
        let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        writeln!(f, "{line}").unwrap();
        let mut batch = self.next().await;
        let text: Vec<String> = batch
            .events()
            .iter()
            .map(|e| String::from_utf8_lossy(e.as_raw().unwrap()).into_owned())
            .collect();
        assert_eq!(text, [line]);
        batch.settle(logbus_plugin_api::Outcome::Delivered);
    }

    /// Waits (at most 20 s) until the published counts say `done`.
    async fn until(&self, what: &str, done: impl Fn(&logbus_plugin_api::StageCounts) -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !done(&self.metrics.snapshot()) {
            assert!(std::time::Instant::now() < deadline, "never {what}");
            assert!(!self.task.is_finished(), "the source ended");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

fn saved_offset(state: &std::path::Path) -> Option<u64> {
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(state).ok()?).unwrap();
    saved["files"][0]["offset"].as_u64()
}

/// While a sink holds a batch, the saved position stays before it however
/// many later batches it confirmed; the age of that batch is published;
/// once it is confirmed the running source saves past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_position_never_passes_a_batch_a_sink_still_holds() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let log = logs.join("app.log");
    std::fs::write(&log, "held\n").unwrap();
    let state = dir.path().join("state/logs.tail.json");
    let mut run = start(
        json!({ "paths": ["logs/*.log"], "state_dir": "state",
                "poll_interval_ms": 10, "checkpoint_interval_ms": 10 }),
        dir.path(),
    );
    let mut held = run.next().await;
    run.until("an open batch's age", |c| c.oldest_unacked_ms > 0)
        .await;
    run.append_and_take(&log, "confirmed").await;
    run.until("the confirmation counted", |c| c.acked_delivered == 1)
        .await;
    // That count was published by a save; the next line shows the source
    // went on past it.
    run.append_and_take(&log, "after").await;
    assert_eq!(saved_offset(&state), None, "saved past the held batch");
    held.settle(logbus_plugin_api::Outcome::Delivered);
    drop(held);
    let len = std::fs::metadata(&log).unwrap().len();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while saved_offset(&state) != Some(len) {
        assert!(
            std::time::Instant::now() < deadline,
            "never saved while running"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(run.metrics.snapshot().oldest_unacked_ms, 0);
    run.shutdown.cancel();
    run.task.await.unwrap().unwrap();
}

/// While there is always more to read (a backlog, a fast writer), the
/// source never goes idle; positions are still saved every interval, as
/// far as the batches the sinks finished, so a kill -9 re-reads the
/// in-flight bound plus one interval, not the whole backlog (issue 54).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_advance_under_sustained_load_without_an_idle_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let log = logs.join("app.log");
    let line = format!("{}\n", "x".repeat(99));
    let total_lines = 200_000;
    std::fs::write(&log, line.repeat(total_lines)).unwrap();
    let state = dir.path().join("state/logs.tail.json");
    let mut run = start(
        json!({ "paths": ["logs/*.log"], "state_dir": "state",
                "poll_interval_ms": 10, "checkpoint_interval_ms": 10 }),
        dir.path(),
    );
    let mut received = 0;
    let mut first = true;
    let saved = loop {
        let mut batch = run.next().await;
        received += batch.len();
        batch.settle(logbus_plugin_api::Outcome::Delivered);
        drop(batch);
        if first {
            // Past the interval while the source waits on a full output.
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
            first = false;
        }
        if let Some(offset) = saved_offset(&state) {
            break offset;
        }
        assert!(
            received < total_lines,
            "the whole backlog was read before any position was saved"
        );
    };
    assert!(
        received < total_lines / 2,
        "the first save came after {received} of {total_lines} lines"
    );
    // Never past what was received and settled.
    assert!(
        saved > 0 && saved <= (received * line.len()) as u64,
        "{saved}"
    );
    assert_eq!(saved % line.len() as u64, 0, "a save between lines");
    run.shutdown.cancel();
    while let Some(mut batch) = run.rx.recv().await {
        batch.settle(logbus_plugin_api::Outcome::Delivered);
    }
    run.task.await.unwrap().unwrap();
}

/// Positions are saved no more often than `checkpoint_interval_ms` (and
/// always at shutdown, which is quick when nothing is in flight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_wait_for_the_checkpoint_interval_and_shutdown_saves_them() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let log = logs.join("app.log");
    std::fs::write(&log, "").unwrap();
    let state = dir.path().join("state/logs.tail.json");
    let mut run = start(
        json!({ "paths": ["logs/*.log"], "state_dir": "state",
                "poll_interval_ms": 10, "checkpoint_interval_ms": 600000 }),
        dir.path(),
    );
    for line in ["one", "two", "three"] {
        run.append_and_take(&log, line).await;
    }
    assert_eq!(saved_offset(&state), None, "saved before the interval");
    run.shutdown.cancel();
    tokio::time::timeout(std::time::Duration::from_secs(10), run.task)
        .await
        .expect("a shutdown with nothing in flight does not wait")
        .unwrap()
        .unwrap();
    assert_eq!(
        saved_offset(&state),
        Some(std::fs::metadata(&log).unwrap().len())
    );
}

/// A stopping source lets go of its output, then waits for the batches a
/// sink still holds before it saves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_the_batches_in_flight_before_saving() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let log = logs.join("app.log");
    std::fs::write(&log, "a\nb\n").unwrap();
    let state = dir.path().join("state/logs.tail.json");
    let mut run = start(
        json!({ "paths": ["logs/*.log"], "state_dir": "state", "poll_interval_ms": 10 }),
        dir.path(),
    );
    let mut held = run.next().await;
    run.shutdown.cancel();
    // The output is gone: the source is past its loop, waiting.
    assert!(run.rx.recv().await.is_none());
    let mut task = run.task;
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(300), &mut task)
            .await
            .is_err(),
        "it stopped with a batch in flight"
    );
    held.settle(logbus_plugin_api::Outcome::Delivered);
    drop(held);
    task.await.unwrap().unwrap();
    assert_eq!(
        saved_offset(&state),
        Some(std::fs::metadata(&log).unwrap().len())
    );
}

/// A line appended between polls is read when the filesystem says the
/// file changed, not at the next poll (a minute away here); a stop is
/// not kept waiting for the poll either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_notifications_wake_the_source_between_polls() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let log = logs.join("app.log");
    std::fs::write(&log, "first\n").unwrap();
    let mut run = start(
        json!({ "paths": ["logs/*.log"], "state_dir": "state", "poll_interval_ms": 60000 }),
        dir.path(),
    );
    run.next()
        .await
        .settle(logbus_plugin_api::Outcome::Delivered);
    run.append_and_take(&log, "woken").await;
    // A stop does not wait for the next poll either.
    run.shutdown.cancel();
    tokio::time::timeout(std::time::Duration::from_secs(10), run.task)
        .await
        .expect("stopped before the next poll")
        .unwrap()
        .unwrap();
}
