//! The live view in real headless Chromium, driven by Playwright
//! (`tests/ui/ui_test.mjs`). The test needs node, Chromium and Playwright,
//! so it is ignored unless run with `--include-ignored` (`.ci/run` installs
//! them and does); then a missing one fails it, saying how to install it.

use std::path::Path;
use std::process::Command;

/// Fails the test unless node, Chromium (at `chromium`) and playwright-core
/// (under `ui`) are installed.
fn require_browser(ui: &Path, chromium: &str) {
    let have_node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(have_node, "node is required here (apt install nodejs npm)");
    assert!(
        ui.join("node_modules/playwright-core").exists(),
        "playwright-core is required here (npm ci --prefix {})",
        ui.display()
    );
    assert!(
        Path::new(chromium).exists(),
        "Chromium is required at {chromium} (apt install chromium, or set CHROMIUM to its path)"
    );
}

#[ignore = "needs node, Chromium and Playwright (apt install chromium; npm ci --prefix crates/logbus/tests/ui); run with --include-ignored"]
#[test]
fn the_live_view_loads_shows_every_stage_and_counters_advance() {
    let ui = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui");
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    require_browser(&ui, &chromium);
    let dir = tempfile::tempdir().unwrap();
    // A route, and a chain of ten filters after it: thirteen columns deep,
    // wider than the pane, which the view must wrap.
    let chain: String = (1..=10)
        .map(|i| {
            let input = if i == 1 {
                "split.low".to_string()
            } else {
                format!("c{}", i - 1)
            };
            format!("  c{i}: {{ transform: filter, inputs: [{input}], condition: 'seq >= 0' }}\n")
        })
        .chain(["  end: { sink: blackhole, inputs: [c10] }".to_string()])
        .collect();
    // A second, acknowledging source: its node shows what its sink confirmed.
    let lines: String = (0..500).map(|i| format!("line {i}\n")).collect();
    std::fs::write(dir.path().join("in.log"), lines).unwrap();
    let (engine, port) = crate::api::start(
        dir.path(),
        &format!(
            "settings: {{ channel_capacity: 512 }}\nstages:
  gen: {{ source: generator, rate: 3000 }}
  json: {{ parser: json, inputs: [gen], on_error: route }}
  keep: {{ transform: filter, inputs: [json], field: level, equals: info }}
  out: {{ sink: blackhole, inputs: [keep] }}
  bad: {{ sink: blackhole, inputs: [json.errors] }}
  logs: {{ source: tail, paths: [\"{dir}/in.log\"], state_dir: \"{dir}/state\", checkpoint_interval_ms: 100 }}
  kept: {{ sink: blackhole, inputs: [logs] }}
  split: {{ transform: route, inputs: [json], routes: {{ low: 'seq >= 0' }} }}
{chain}
",
            chain = chain,
            dir = dir.path().display()
        ),
        &[],
    );
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui.png");
    let out = Command::new("node")
        .arg(ui.join("ui_test.mjs"))
        .arg(format!("http://127.0.0.1:{port}/"))
        .arg("gen,json,keep,out,bad")
        .arg(&target)
        .arg("logs")
        .arg("split.low")
        .env("CHROMIUM", &chromium)
        .output()
        .unwrap();
    let _ = Command::new("kill")
        .args(["-TERM", &engine.id().to_string()])
        .status();
    let _ = engine.into_child().wait();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("7 passed, 0 failed"), "{text}");
}
