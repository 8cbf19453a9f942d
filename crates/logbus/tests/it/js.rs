//! The JS transform inside a running pipeline and in `logbus validate`.

use logbus_core::start;
use logbus_plugin_api::CancellationToken;

use crate::support::{TestPlugins, load, valid};

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

/// Four workers (each its own QuickJS runtime) drop, split, error and pass
/// events; routed errors carry the script's message; every event is
/// accounted for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_workers_drop_split_route_and_reconcile() {
    let plugins = TestPlugins::default();
    let text = r#"stages:
  gen: { source: generator, count: 10000, template: '{"seq":{{seq}}}' }
  json: { parser: json, inputs: [gen] }
  js:
    transform: js
    inputs: [json]
    workers: 4
    on_error: route
    script: |
      let seen = 0;
      function init(ctx) { seen = 0; }
      function process(e, ctx) {
        seen += 1;
        if (e.seq % 4 === 0) return null;
        if (e.seq % 10 === 3) throw new Error("bad seq " + e.seq);
        if (e.seq % 7 === 0) return [e, { copy_of: e.seq }];
        e.worker = ctx.worker;
        return e;
      }
  ok: { sink: collect, inputs: [js] }
  bad: { sink: collect, inputs: [js.errors] }
"#;
    let p = valid(text, &plugins.registry());
    let report = start(&p, CancellationToken::new()).unwrap().wait().await;
    assert!(report.is_clean(), "{report}");
    let dropped = (0..10000).filter(|s| s % 4 == 0).count() as u64;
    let errored = (0..10000).filter(|s| s % 4 != 0 && s % 10 == 3).count() as u64;
    let split = (0..10000)
        .filter(|s| s % 4 != 0 && s % 10 != 3 && s % 7 == 0)
        .count() as u64;
    let js = report.stages.iter().find(|s| s.id == "js").unwrap();
    assert_eq!(js.counts.discarded, dropped);
    assert_eq!(js.counts.routed, errored);
    assert_eq!(js.counts.created, split);
    let ok = plugins.events("ok");
    assert_eq!(ok.len() as u64, 10000 - dropped - errored + split);
    let workers: std::collections::BTreeSet<u64> = ok
        .iter()
        .filter_map(|e| e.as_fields()?.get("worker")?.as_u64())
        .collect();
    assert!(workers.iter().all(|w| *w < 4), "{workers:?}");
    let bad = plugins.events("bad");
    assert_eq!(bad.len() as u64, errored);
    let f = bad[0].as_fields().unwrap();
    let message = f["_error"]["message"].as_str().unwrap();
    assert!(message.contains("Error: bad seq"), "{message}");
    assert_eq!(f["_error"]["stage"], "js");
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
