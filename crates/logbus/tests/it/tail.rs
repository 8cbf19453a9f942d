//! `source: tail` through the `logbus` binary, with the shipped example:
//! files written, rotated by rename and by copy-truncate while it runs,
//! multi-line events joined; then a restart that re-reads nothing.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::append;

fn start(dir: &Path) -> Child {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tail/app-logs.yml");
    Command::new(env!("CARGO_BIN_EXE_logbus"))
        .env("LOGBUS_LOG", "warn")
        .arg("run")
        .arg(example)
        .env("TAIL_DIR", dir.join("logs"))
        .env("TAIL_STATE", dir.join("state"))
        .env("TAIL_OUT", dir.join("out.ndjson"))
        .env("TAIL_REJECTS", dir.join("rejects.ndjson"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The `message` of every event written so far.
fn messages(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("out.ndjson"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["message"].as_str().unwrap().to_string()
        })
        .collect()
}

/// The `file` (the example's `from_meta: {file: origin}`) of the event
/// whose `message` is `message`.
fn file_of(dir: &Path, message: &str) -> String {
    std::fs::read_to_string(dir.join("out.ndjson"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["message"] == message)
        .and_then(|v| v["file"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no event `{message}` with a `file`"))
}

fn wait_for(dir: &Path, n: usize) -> Vec<String> {
    let start = Instant::now();
    loop {
        let got = messages(dir);
        if got.len() >= n {
            return got;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "waited for {n} events, have {got:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(child: Child) {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("lost=0"));
}

#[test]
fn tail_follows_rotation_and_truncation_joins_multi_line_events_and_resumes_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    append(
        &logs.join("app.log"),
        "2026-11-30 10:00:00 INFO started\n2026-11-30 10:00:01 ERROR boom\n  at a()\n  at b()\n",
    );
    let child = start(dir.path());
    // The second event is emitted by the multi-line timeout.
    assert_eq!(
        wait_for(dir.path(), 2),
        ["started", "boom\n  at a()\n  at b()"]
    );

    // Rotation by rename; the writer still appends to the old file once.
    std::fs::rename(logs.join("app.log"), logs.join("app.log.1")).unwrap();
    append(
        &logs.join("app.log.1"),
        "2026-11-30 10:00:02 WARN late write\n",
    );
    append(&logs.join("app.log"), "2026-11-30 10:00:03 INFO new file\n");
    // Copy-truncate of another file.
    let other = logs.join("other.log");
    append(&other, "2026-11-30 10:00:04 INFO before truncate\n");
    let got = wait_for(dir.path(), 5);
    assert!(got.contains(&"before truncate".to_string()), "{got:?}");
    std::fs::copy(&other, logs.join("other.log.1")).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&other)
        .unwrap()
        .set_len(0)
        .unwrap();
    append(&other, "2026-11-30 10:00:05 INFO after truncate\n");
    // A file that appears later, and one that is excluded.
    append(
        &logs.join("late.log"),
        "2026-11-30 10:00:06 INFO late file\n",
    );
    append(&logs.join("old.gz"), "2026-11-30 10:00:07 INFO excluded\n");
    let mut got = wait_for(dir.path(), 7);
    stop(child);
    got.sort();
    let mut want = vec![
        "after truncate",
        "before truncate",
        "boom\n  at a()\n  at b()",
        "late file",
        "late write",
        "new file",
        "started",
    ];
    want.sort();
    assert_eq!(got, want);
    for (message, file) in [
        ("started", "app.log"),
        ("before truncate", "other.log"),
        ("late file", "late.log"),
    ] {
        let want = logs.join(file).to_string_lossy().into_owned();
        assert_eq!(file_of(dir.path(), message), want, "{message}");
    }

    // Restart: nothing is read again; what is appended meanwhile comes out.
    append(
        &logs.join("app.log"),
        "2026-11-30 10:00:08 INFO while stopped\n",
    );
    let child = start(dir.path());
    append(
        &logs.join("late.log"),
        "2026-11-30 10:00:09 INFO after restart\n",
    );
    let got = wait_for(dir.path(), 9);
    stop(child);
    assert_eq!(got.len(), 9, "{got:?}");
    assert_eq!(
        &got[7..]
            .iter()
            .filter(|m| m.contains("while stopped") || m.contains("after restart"))
            .count(),
        &2
    );
}
