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
    let mut got: Vec<(String, String)> = testing::take(&mut running.rx, 3)
        .await
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
