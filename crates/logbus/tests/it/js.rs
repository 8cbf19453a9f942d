//! The JS transform in `logbus validate` and in the running binary (its
//! workers inside the engine: `crates/core/tests/engine/js.rs`).

use crate::support::load;

#[test]
fn a_script_syntax_error_is_reported_with_stage_and_position() {
    let text = "stages:
  a: { source: generator, count: 1 }
  j:
    transform: js
    inputs: [a]
    script: |
      function process(e) {
        return e +;
      }
  o: { sink: blackhole, inputs: [j] }
";
    let loaded = load(text);
    let d: Vec<_> = loaded.diagnostics.iter().filter(|d| d.is_error()).collect();
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!(d[0].stage.as_deref(), Some("j"));
    assert_eq!(d[0].line, Some(6), "points at the script option");
    assert!(
        d[0].message.contains("syntax error at script line 2"),
        "{}",
        d[0].message
    );
}

/// CPU ticks (user + system) the process has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    // utime and stime are fields 14 and 15; this slice starts at field 3.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// A script that holds the only worker (a loop within `timeout_ms:
/// 60000`) does not stop the signals being heard: the first starts the
/// drain at once, the second exits at once with 130 (issue 54: both waited
/// ~58 s for the script's budget to run out).
#[test]
fn signals_are_heard_while_a_script_holds_every_worker() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("busy.yml");
    std::fs::write(
        &p,
        "stages:
  gen: { source: generator, count: 10 }
  busy:
    transform: js
    inputs: [gen]
    timeout_ms: 60000
    script: |
      function process(e) {
        const end = Date.now() + 600000;
        while (Date.now() < end) {}
        return e;
      }
  out: { sink: blackhole, inputs: [busy] }
",
    )
    .unwrap();
    let mut engine = crate::support::Spawned::spawn(
        crate::support::logbus()
            .env("LOGBUS_LOG", "info")
            .args(["run", "--threads", "1"])
            .arg(&p),
    );
    let pid = engine.child.id();
    // The script is running: the process burns a CPU.
    let start = std::time::Instant::now();
    loop {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "the script never ran: {}",
            engine.said()
        );
        let before = cpu_ticks(pid);
        std::thread::sleep(std::time::Duration::from_millis(300));
        if cpu_ticks(pid) - before >= 10 {
            break;
        }
    }
    let kill = || {
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
    };
    kill();
    let heard = std::time::Instant::now();
    while !engine.said().contains("shutdown requested") {
        assert!(
            heard.elapsed() < std::time::Duration::from_secs(10),
            "the first signal was not heard: {}",
            engine.said()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    kill();
    let exited = std::time::Instant::now();
    let status = loop {
        if let Some(status) = engine.try_wait() {
            break status;
        }
        assert!(
            exited.elapsed() < std::time::Duration::from_secs(10),
            "the second signal did not exit: {}",
            engine.said()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130), "{}", engine.said());
}
