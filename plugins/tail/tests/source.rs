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
