//! `source: journald` reading real journal files, written by
//! `systemd-journal-remote` from the export format: all entries, unit and
//! priority filters, a cursor that resumes after a restart, following.
//! The source's own behaviour (the journalctl command line it builds, how
//! it ends, when it saves its cursor) is tested against a stand-in
//! `journalctl` script that records its arguments and prints export-format
//! entries when told to, so that each step happens when the test says.
//! The tests that need journalctl and systemd-journal-remote are ignored
//! unless run with `--include-ignored` (CI does); then a missing one fails
//! them.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use logbus_plugin_api::testing::option_errors;
use logbus_plugin_api::{
    BuildContext, Built, CancellationToken, Outcome, Output, OutputRole, Plugin, Receiver,
    SourceContext, StageError, StageMetrics, Typed, channel,
};
use serde_json::json;

const REMOTE: &str = "/lib/systemd/systemd-journal-remote";

/// Fails the test unless journalctl and systemd-journal-remote are installed.
fn require_journal_tools() {
    assert!(
        std::process::Command::new("journalctl")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "journalctl is required here (apt install systemd)"
    );
    assert!(
        Path::new(REMOTE).exists(),
        "{REMOTE} is required here (apt install systemd-journal-remote)"
    );
}

/// Writes `dir/name.journal` holding the entries (unit, priority, message).
fn journal(dir: &Path, name: &str, first_ts: u64, entries: &[(&str, u8, String)]) {
    let export = dir.join(format!("{name}.export"));
    let mut f = std::fs::File::create(&export).unwrap();
    for (i, (unit, prio, msg)) in entries.iter().enumerate() {
        write!(
            f,
            "__REALTIME_TIMESTAMP={}\n__MONOTONIC_TIMESTAMP={}\n_BOOT_ID=0123456789abcdef0123456789abcdef\n_HOSTNAME=test\n_SYSTEMD_UNIT={unit}\nPRIORITY={prio}\nMESSAGE={msg}\n\n",
            first_ts + i as u64,
            first_ts + i as u64
        )
        .unwrap();
    }
    drop(f);
    let out = std::process::Command::new(REMOTE)
        .arg(format!(
            "--output={}",
            dir.join(format!("{name}.journal")).display()
        ))
        .arg(&export)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(export).unwrap();
}

fn entries(from: usize, n: usize) -> Vec<(&'static str, u8, String)> {
    (from..from + n)
        .map(|i| {
            (
                if i % 2 == 0 {
                    "app.service"
                } else {
                    "db.service"
                },
                if i % 3 == 0 { 3 } else { 6 },
                format!("entry {i}"),
            )
        })
        .collect()
}

type Started = (
    Receiver,
    CancellationToken,
    tokio::task::JoinHandle<Result<(), StageError>>,
);

fn start(options: serde_json::Value, base: &Path) -> Started {
    let (rx, shutdown, task, _) = start_with_metrics(options, base);
    (rx, shutdown, task)
}

fn start_with_metrics(
    options: serde_json::Value,
    base: &Path,
) -> (
    Receiver,
    CancellationToken,
    tokio::task::JoinHandle<Result<(), StageError>>,
    Arc<StageMetrics>,
) {
    let cx = BuildContext {
        stage_id: "journal".into(),
        base_dir: base.to_path_buf(),
        worker: 0,
    };
    let source = match Typed(logbus_host::journald::Journald).build(&options, &cx) {
        Ok(Built::Source(s)) => s,
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("not a source"),
    };
    let (tx, rx) = channel(10_000);
    let shutdown = CancellationToken::new();
    let metrics = Arc::new(StageMetrics::default());
    let task = tokio::spawn(source.run(SourceContext {
        id: "journal".into(),
        output: Output::new(vec![tx], metrics.clone(), OutputRole::Main),
        shutdown: shutdown.clone(),
    }));
    (rx, shutdown, task, metrics)
}

/// Every message until the source ends, acknowledged as delivered (as a
/// sink would).
async fn messages(rx: &mut Receiver) -> Vec<String> {
    messages_settled(rx, Some(Outcome::Delivered)).await
}

/// Every message until the source ends; their acknowledgements settled
/// with `outcome` (`None`: dropped unsettled, i.e. errored).
async fn messages_settled(rx: &mut Receiver, outcome: Option<Outcome>) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(mut b) = rx.recv().await {
        if let Some(o) = outcome {
            b.settle(o);
        }
        for e in b.take() {
            out.push(
                e.as_fields().unwrap()["MESSAGE"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
    }
    out
}

#[ignore = "needs journalctl and systemd-journal-remote (apt install systemd systemd-journal-remote); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_filters_and_resumes_after_its_cursor() {
    require_journal_tools();
    let dir = tempfile::tempdir().unwrap();
    let journals = dir.path().join("journals");
    std::fs::create_dir(&journals).unwrap();
    journal(&journals, "one", 1_700_000_000_000_000, &entries(0, 30));
    let all = json!({ "directory": "journals", "state_dir": "state", "follow": false });

    // Everything, in order; the fields are the journal's.
    let (mut rx, _s, task) = start(all.clone(), dir.path());
    let got = messages(&mut rx).await;
    task.await.unwrap().unwrap();
    assert_eq!(
        got,
        (0..30).map(|i| format!("entry {i}")).collect::<Vec<_>>()
    );

    // Filters (a different state file per stage id is not needed: these
    // runs use their own state directories).
    let (mut rx, _s, task) = start(
        json!({ "directory": "journals", "state_dir": "state-unit", "follow": false, "units": ["app.service"] }),
        dir.path(),
    );
    let got = messages(&mut rx).await;
    task.await.unwrap().unwrap();
    assert_eq!(got.len(), 15);
    let (mut rx, _s, task) = start(
        json!({ "directory": "journals", "state_dir": "state-prio", "follow": false, "priority": "err" }),
        dir.path(),
    );
    let got = messages(&mut rx).await;
    task.await.unwrap().unwrap();
    assert_eq!(got.len(), 10);

    // New entries arrive (a second journal file); the saved cursor means
    // only they are read.
    journal(&journals, "two", 1_700_000_001_000_000, &entries(30, 5));
    let (mut rx, _s, task) = start(all, dir.path());
    let got = messages(&mut rx).await;
    task.await.unwrap().unwrap();
    assert_eq!(
        got,
        (30..35).map(|i| format!("entry {i}")).collect::<Vec<_>>()
    );
}

#[ignore = "needs journalctl and systemd-journal-remote (apt install systemd systemd-journal-remote); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_the_sinks_did_not_finish_are_read_again() {
    require_journal_tools();
    let dir = tempfile::tempdir().unwrap();
    let journals = dir.path().join("journals");
    std::fs::create_dir(&journals).unwrap();
    journal(&journals, "one", 1_700_000_000_000_000, &entries(0, 20));
    let all = json!({ "directory": "journals", "state_dir": "state", "follow": false });
    let everything: Vec<String> = (0..20).map(|i| format!("entry {i}")).collect();

    // The sinks never finished them (errored, as when a stage failed):
    // no cursor moves past them, so the next run reads them all again.
    let (mut rx, _s, task) = start(all.clone(), dir.path());
    assert_eq!(messages_settled(&mut rx, None).await, everything);
    task.await.unwrap().unwrap();
    let (mut rx, _s, task) = start(all.clone(), dir.path());
    assert_eq!(messages(&mut rx).await, everything);
    task.await.unwrap().unwrap();
    // Now they were delivered: the next run starts after them.
    let (mut rx, _s, task) = start(all, dir.path());
    assert!(messages(&mut rx).await.is_empty());
    task.await.unwrap().unwrap();
}

/// Each entry's position (from its cursor) until the source ends, the
/// acknowledgements dropped unsettled (errored).
async fn positions_unsettled(rx: &mut Receiver) -> Vec<logbus_plugin_api::Position> {
    let mut out = Vec::new();
    while let Some(mut b) = rx.recv().await {
        for e in b.take() {
            out.push(e.meta().position.expect("every entry is placed"));
        }
    }
    out
}

/// An entry read again after a crash has the position it had (a sink
/// names it alike); entries have distinct positions, in reading order.
#[ignore = "needs journalctl and systemd-journal-remote (apt install systemd systemd-journal-remote); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_read_again_have_the_positions_they_had() {
    require_journal_tools();
    let dir = tempfile::tempdir().unwrap();
    let journals = dir.path().join("journals");
    std::fs::create_dir(&journals).unwrap();
    journal(&journals, "one", 1_700_000_000_000_000, &entries(0, 20));
    let all = json!({ "directory": "journals", "state_dir": "state", "follow": false });
    let (mut rx, _s, task) = start(all.clone(), dir.path());
    let first = positions_unsettled(&mut rx).await;
    task.await.unwrap().unwrap();
    assert_eq!(first.len(), 20);
    assert!(
        first
            .windows(2)
            .all(|w| w[0].stream == w[1].stream && w[0].offset < w[1].offset)
    );
    let (mut rx, _s, task) = start(all, dir.path());
    assert_eq!(positions_unsettled(&mut rx).await, first);
    task.await.unwrap().unwrap();
}

#[ignore = "needs journalctl and systemd-journal-remote (apt install systemd systemd-journal-remote); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_until_stopped() {
    require_journal_tools();
    let dir = tempfile::tempdir().unwrap();
    journal(dir.path(), "one", 1_700_000_000_000_000, &entries(0, 12));
    let (mut rx, stop, task) = start(
        json!({ "files": ["one.journal"], "state_dir": "state" }),
        dir.path(),
    );
    let mut got = 0;
    while got < 12 {
        let mut batch = rx.recv().await.unwrap();
        batch.settle(Outcome::Delivered);
        got += batch.take().len();
    }
    stop.cancel();
    task.await.unwrap().unwrap();
    let cursor = std::fs::read_to_string(dir.path().join("state/journal.journald.cursor")).unwrap();
    assert!(cursor.starts_with("s="), "{cursor}");
}

#[test]
fn bad_options_name_the_key() {
    let errors = |o: serde_json::Value| option_errors(&Typed(logbus_host::journald::Journald), o);
    assert!(errors(json!({ "state_dir": "s", "priority": "loud" })).starts_with("priority: "));
    assert!(
        errors(json!({ "state_dir": "s", "directory": "d", "files": ["f"] }))
            .starts_with("files: ")
    );
    assert!(errors(json!({})).contains("state_dir"));
    assert!(errors(json!({ "state_dir": "" })).starts_with("state_dir: must not be empty"));
    // Priorities by name or 0-7.
    for ok in ["emerg", "debug", "0", "7"] {
        assert_eq!(
            errors(json!({ "state_dir": "s", "priority": ok })),
            "",
            "{ok}"
        );
    }
    for bad in ["8", "-1", "Info"] {
        assert!(
            errors(json!({ "state_dir": "s", "priority": bad }))
                .starts_with(&format!("priority: `{bad}` is not a priority")),
            "{bad}"
        );
    }
    // A unit name is not empty and is not an option.
    assert_eq!(
        errors(json!({ "state_dir": "s", "units": ["a.service"] })),
        ""
    );
    for bad in ["", "-f"] {
        assert!(
            errors(json!({ "state_dir": "s", "units": ["a.service", bad] }))
                .starts_with(&format!("units: `{bad}` is not a unit name")),
            "{bad}"
        );
    }
}

/// A stand-in `journalctl` in `dir`: it writes its arguments, one per line,
/// to `dir/args`, then runs `body` (a shell script, with `entry N` printing
/// an entry whose cursor is `s=N` and message `entry N`, and `await NAME`
/// waiting until the test creates `dir/NAME`).
fn fake_journalctl(dir: &Path, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("journalctl");
    let d = dir.display();
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > '{d}/args.tmp' && mv '{d}/args.tmp' '{d}/args'\n\
             entry() {{ printf '__CURSOR=s=%s\\nMESSAGE=entry %s\\n\\n' \"$1\" \"$1\"; }}\n\
             await() {{ while [ ! -e '{d}/'\"$1\" ]; do sleep 0.01; done; }}\n{body}\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

fn args(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("args"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Polls `what` every 5 ms until it holds (at most 10 s).
async fn until(what: &str, mut holds: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !holds() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited 10 s for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journalctl_is_asked_for_what_the_options_say() {
    let dir = tempfile::tempdir().unwrap();
    let journalctl = fake_journalctl(dir.path(), "exit 0");
    let base = ["--output=export", "--no-pager", "--quiet"];
    let run = |options: serde_json::Value| {
        let mut options = options;
        options["journalctl"] = json!(journalctl);
        options["state_dir"] = json!("state");
        let dir = dir.path().to_path_buf();
        async move {
            let (mut rx, _stop, task) = start(options, &dir);
            assert!(messages(&mut rx).await.is_empty());
            task.await.unwrap().unwrap();
            let args = args(&dir);
            assert_eq!(args[..3], base, "{args:?}");
            args[3..].to_vec()
        }
    };
    // The whole journal, once.
    assert!(run(json!({ "follow": false })).await.is_empty());
    // Following from the start: `--follow` alone would begin with the last
    // ten entries.
    assert_eq!(run(json!({})).await, ["--follow", "--lines=all"]);
    assert_eq!(
        run(json!({ "read_from": "end" })).await,
        ["--follow", "--lines=0"]
    );
    assert_eq!(
        run(json!({ "read_from": "end", "follow": false })).await,
        ["--lines=0"]
    );
    // Filters and where to read.
    assert_eq!(
        run(json!({ "follow": false, "units": ["a.service", "b.service"], "priority": "warning", "directory": "j" })).await,
        [
            "--unit=a.service".to_string(),
            "--unit=b.service".into(),
            "--priority=warning".into(),
            format!("--directory={}", dir.path().join("j").display()),
        ]
    );
    assert_eq!(
        run(json!({ "follow": false, "files": ["x.journal", "/abs/y.journal"] })).await,
        [
            format!("--file={}", dir.path().join("x.journal").display()),
            "--file=/abs/y.journal".into(),
        ]
    );
    // A cursor file holding only white space is no cursor.
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    let cursor = dir.path().join("state/journal.journald.cursor");
    std::fs::write(&cursor, " \n").unwrap();
    assert_eq!(run(json!({})).await, ["--follow", "--lines=all"]);
    // A saved cursor wins over `read_from`.
    std::fs::write(&cursor, "s=7\n").unwrap();
    assert_eq!(
        run(json!({ "read_from": "end" })).await,
        ["--follow", "--after-cursor=s=7"]
    );
    assert_eq!(
        run(json!({ "follow": false })).await,
        ["--after-cursor=s=7"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journalctl_that_fails_fails_the_stage_with_its_last_complaint() {
    let dir = tempfile::tempdir().unwrap();
    let journalctl = fake_journalctl(
        dir.path(),
        "entry 1; echo 'first complaint' >&2; echo 'Failed to seek to cursor: Invalid argument' >&2; exit 3",
    );
    for follow in [false, true] {
        let (mut rx, _stop, task) = start(
            json!({ "journalctl": journalctl, "state_dir": "state", "follow": follow }),
            dir.path(),
        );
        // What it printed before failing is delivered and its cursor kept.
        assert_eq!(messages(&mut rx).await, ["entry 1"]);
        let err = task.await.unwrap().unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{} exited with exit status: 3: Failed to seek to cursor: Invalid argument",
                journalctl.display()
            ),
            "follow: {follow}"
        );
        let cursor = dir.path().join("state/journal.journald.cursor");
        assert_eq!(std::fs::read_to_string(&cursor).unwrap(), "s=1");
        std::fs::remove_file(cursor).unwrap();
    }
    // One that cannot start at all.
    let (_rx, _stop, task) = start(
        json!({ "journalctl": "/nonexistent/journalctl", "state_dir": "state" }),
        dir.path(),
    );
    let err = task.await.unwrap().unwrap_err().to_string();
    assert!(err.contains("starting /nonexistent/journalctl"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journalctl_stopped_at_shutdown_is_not_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let journalctl = fake_journalctl(dir.path(), "entry 1; await never");
    let (mut rx, stop, task) = start(
        json!({ "journalctl": journalctl, "state_dir": "state" }),
        dir.path(),
    );
    let mut batch = rx.recv().await.unwrap();
    batch.settle(Outcome::Delivered);
    drop(batch.take());
    stop.cancel();
    task.await.unwrap().unwrap();
    let cursor = dir.path().join("state/journal.journald.cursor");
    assert_eq!(std::fs::read_to_string(cursor).unwrap(), "s=1");
}

/// While running, the cursor is saved every `checkpoint_interval_ms` (when
/// a batch is sent) and never past an unfinished batch; the metrics carry
/// the age of the oldest unfinished one. Stopping waits for the sinks to
/// finish what was sent, then saves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cursor_is_saved_while_running_and_waits_for_the_sinks_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let journalctl = fake_journalctl(
        dir.path(),
        "entry 1; await go2; entry 2; await go3; entry 3; exit 0",
    );
    let cursor = dir.path().join("state/journal.journald.cursor");
    let saved = || std::fs::read_to_string(&cursor).ok();
    let (mut rx, _stop, task, metrics) = start_with_metrics(
        json!({ "journalctl": journalctl, "state_dir": "state", "checkpoint_interval_ms": 10 }),
        dir.path(),
    );
    let mut first = rx.recv().await.unwrap();
    let sent = std::time::Instant::now();
    // The first batch stays unfinished for at least 40 ms; the second is
    // sent after the interval, so the cursor is considered (and not moved).
    tokio::time::sleep_until((sent + std::time::Duration::from_millis(40)).into()).await;
    std::fs::write(dir.path().join("go2"), "").unwrap();
    let mut second = rx.recv().await.unwrap();
    until("the oldest unfinished batch's age", || {
        metrics.snapshot().oldest_unacked_ms > 0
    })
    .await;
    let age = metrics.snapshot().oldest_unacked_ms;
    assert!(age >= 40, "oldest unfinished batch {age} ms old");
    assert_eq!(saved(), None, "not past an unfinished batch");
    // Both finished; the next batch, after the interval, saves the cursor
    // while the source runs.
    for b in [&mut first, &mut second] {
        b.settle(Outcome::Delivered);
        drop(b.take());
    }
    let finished = std::time::Instant::now();
    tokio::time::sleep_until((finished + std::time::Duration::from_millis(20)).into()).await;
    std::fs::write(dir.path().join("go3"), "").unwrap();
    let mut third = rx.recv().await.unwrap();
    until("the cursor of the second entry", || {
        saved().as_deref() == Some("s=2")
    })
    .await;
    assert_eq!(metrics.snapshot().acked_delivered, 2);
    // journalctl has ended: the output closes, and the source waits for the
    // last batch before its final save.
    assert!(rx.recv().await.is_none());
    assert!(!task.is_finished());
    third.settle(Outcome::Delivered);
    drop(third.take());
    task.await.unwrap().unwrap();
    assert_eq!(saved().as_deref(), Some("s=3"));
    assert_eq!(metrics.snapshot().oldest_unacked_ms, 0);
}
