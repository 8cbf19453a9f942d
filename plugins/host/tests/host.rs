//! `scheduler` on a paused clock and on the wall clock (cron), and `exec`
//! with real processes: streaming, restarts, schedules, a command that
//! cannot start, and a command that outputs faster than the pipeline takes.

use logbus_plugin_api::testing::{RunningSource, option_errors, run_source, source};
use logbus_plugin_api::{Plugin, Receiver, Typed};
use serde_json::json;

async fn take(rx: &mut Receiver, n: usize) -> Vec<logbus_plugin_api::Event> {
    let mut got = Vec::new();
    while got.len() < n {
        let mut b = rx.recv().await.expect("more events");
        got.extend(b.take());
    }
    got
}

fn text(e: &logbus_plugin_api::Event) -> String {
    String::from_utf8(e.as_raw().unwrap().to_vec()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_interval_schedule_ticks_with_its_fields_and_stops_at_count() {
    let s = source(
        &Typed(logbus_host::scheduler::Scheduler),
        json!({ "interval_ms": 60000, "count": 3, "fields": { "job": "poll" } }),
    );
    let RunningSource {
        mut rx,
        shutdown: _stop,
        task,
        stop_on_drop: _guard,
        ..
    } = run_source(s, 10);
    let started = tokio::time::Instant::now();
    let got = take(&mut rx, 3).await;
    task.await.unwrap().unwrap();
    assert!(rx.recv().await.is_none());
    // Paused clock: exactly two intervals passed (the first tick is at once).
    assert_eq!(started.elapsed().as_secs(), 120);
    let ticks: Vec<u64> = got
        .iter()
        .map(|e| e.as_fields().unwrap()["tick"].as_u64().unwrap())
        .collect();
    assert_eq!(ticks, [0, 1, 2]);
    assert!(got.iter().all(|e| e.as_fields().unwrap()["job"] == "poll"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_schedule_fires_on_its_seconds() {
    let s = source(
        &Typed(logbus_host::scheduler::Scheduler),
        json!({ "cron": "* * * * * *", "count": 2 }),
    );
    let RunningSource {
        mut rx,
        shutdown: _stop,
        task,
        stop_on_drop: _guard,
        ..
    } = run_source(s, 10);
    let got = take(&mut rx, 2).await;
    task.await.unwrap().unwrap();
    let at: Vec<chrono::DateTime<chrono::Utc>> = got
        .iter()
        .map(|e| {
            e.as_fields().unwrap()["scheduled_at"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(at[1] - at[0], chrono::Duration::seconds(1));
    assert_eq!(at[0].timestamp_subsec_millis(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_streams_lines_and_ends_when_the_command_does_with_restart_never() {
    let s = source(
        &Typed(logbus_host::exec::Exec),
        json!({ "command": ["sh", "-c", "printf 'a\\nb\\r\\nc'; echo oops >&2"], "restart": "never" }),
    );
    let RunningSource {
        mut rx,
        shutdown: _stop,
        task,
        stop_on_drop: _guard,
        ..
    } = run_source(s, 10);
    let got = take(&mut rx, 3).await;
    task.await.unwrap().unwrap();
    assert_eq!(got.iter().map(text).collect::<Vec<_>>(), ["a", "b", "c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_restarts_a_failing_command_and_runs_one_on_a_schedule() {
    let s = source(
        &Typed(logbus_host::exec::Exec),
        json!({ "command": ["sh", "-c", "echo run; exit 3"], "restart_delay_ms": 5 }),
    );
    let RunningSource {
        mut rx,
        shutdown: stop,
        task,
        stop_on_drop: _guard,
        ..
    } = run_source(s, 10);
    let got = take(&mut rx, 3).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert!(got.iter().all(|e| text(e) == "run"));

    let s = source(
        &Typed(logbus_host::exec::Exec),
        json!({ "command": ["sh", "-c", "echo tick"], "mode": "scheduled", "interval_ms": 20 }),
    );
    let RunningSource {
        mut rx,
        shutdown: stop,
        task,
        stop_on_drop: _guard,
        ..
    } = run_source(s, 10);
    let got = take(&mut rx, 3).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert!(got.iter().all(|e| text(e) == "tick"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_cannot_start_fails_the_stage_by_name() {
    let s = source(
        &Typed(logbus_host::exec::Exec),
        json!({ "command": ["/no/such/program"] }),
    );
    let RunningSource {
        rx: _rx,
        shutdown: _stop,
        task,
        stop_on_drop: _guard,
        ..
    } = run_source(s, 10);
    let err = task.await.unwrap().unwrap_err().to_string();
    assert!(err.contains("/no/such/program"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_command_is_held_back_by_the_pipeline_and_killed_at_shutdown() {
    // `yes` writes forever; nobody reads the 10-event pipeline.
    let s = source(
        &Typed(logbus_host::exec::Exec),
        json!({ "command": ["yes", "line"], "max_line_bytes": 64 }),
    );
    let RunningSource {
        mut rx,
        shutdown: stop,
        task,
        stop_on_drop: _guard,
        ..
    } = run_source(s, 10);
    let h = rx.handle();
    while h.occupancy() < 10 {
        tokio::task::yield_now().await;
    }
    // It is blocked on the pipeline, not racing ahead: a few more events
    // may be in its hands, never more than a batch.
    stop.cancel();
    let mut n = 0;
    while let Some(mut b) = rx.recv().await {
        n += b.take().len();
    }
    task.await.unwrap().unwrap();
    assert!(n >= 10);
}

#[test]
fn bad_options_name_the_key() {
    let errors = |p: &dyn Plugin, o: serde_json::Value| option_errors(p, o);
    let sched = Typed(logbus_host::scheduler::Scheduler);
    assert!(errors(&sched, json!({})).contains("exactly one"));
    assert!(errors(&sched, json!({ "cron": "not cron" })).starts_with("cron: "));
    assert!(
        errors(&sched, json!({ "cron": "* * * * *", "interval_ms": 5 })).contains("exactly one")
    );
    let exec = Typed(logbus_host::exec::Exec);
    assert!(errors(&exec, json!({ "command": [] })).starts_with("command: "));
    assert!(
        errors(&exec, json!({ "command": ["x"], "mode": "scheduled" })).contains("interval_ms")
    );
    assert!(
        errors(&exec, json!({ "command": ["x"], "interval_ms": 5 }))
            .contains("only with `mode: scheduled`")
    );
    assert_eq!(
        errors(
            &exec,
            json!({ "command": ["x"], "mode": "scheduled", "interval_ms": 0 })
        ),
        "interval_ms: must be at least 1, got 0"
    );
    assert_eq!(
        errors(
            &exec,
            json!({ "command": ["x"], "mode": "scheduled", "interval_ms": 1 })
        ),
        ""
    );
}

/// A line goes on as soon as nothing more is waiting in the pipe (the
/// command may print nothing else for a long time), and lines that come
/// together go on together, in batches of at most 512.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_sends_a_lone_line_at_once_and_batches_lines_that_come_together() {
    let s = source(
        &Typed(logbus_host::exec::Exec),
        json!({ "command": ["sh", "-c", "echo first; sleep 60"], "restart": "never" }),
    );
    let mut running = run_source(s, 10);
    let got = tokio::time::timeout(std::time::Duration::from_secs(20), take(&mut running.rx, 1))
        .await
        .expect("the line arrived while the command still runs");
    assert_eq!(text(&got[0]), "first");
    // The command is killed at shutdown, not waited for.
    running.stop().await.unwrap();

    let s = source(
        &Typed(logbus_host::exec::Exec),
        json!({ "command": ["seq", "1", "3000"], "restart": "never" }),
    );
    let RunningSource {
        mut rx,
        shutdown: _stop,
        task,
        stop_on_drop: _guard,
        ..
    } = run_source(s, 10_000);
    let mut sizes = Vec::new();
    let mut lines = Vec::new();
    while lines.len() < 3000 {
        let mut b = rx.recv().await.expect("more events");
        let events = b.take();
        sizes.push(events.len());
        lines.extend(events.iter().map(text));
    }
    task.await.unwrap().unwrap();
    assert_eq!(lines, (1..=3000).map(|i| i.to_string()).collect::<Vec<_>>());
    assert!(sizes.iter().all(|n| *n <= 512), "{sizes:?}");
    assert!(
        sizes.iter().any(|n| *n > 1),
        "lines read together are sent together: {sizes:?}"
    );
}
