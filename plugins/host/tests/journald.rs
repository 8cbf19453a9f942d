//! `source: journald` reading real journal files, written by
//! `systemd-journal-remote` from the export format: all entries, unit and
//! priority filters, a cursor that resumes after a restart, following.
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

fn start(
    options: serde_json::Value,
    base: &Path,
) -> (
    Receiver,
    CancellationToken,
    tokio::task::JoinHandle<Result<(), StageError>>,
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
    let task = tokio::spawn(source.run(SourceContext {
        id: "journal".into(),
        output: Output::new(
            vec![tx],
            Arc::new(StageMetrics::default()),
            OutputRole::Main,
        ),
        shutdown: shutdown.clone(),
    }));
    (rx, shutdown, task)
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
}
