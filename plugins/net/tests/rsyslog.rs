//! Interoperability with a real rsyslog (8.x, Debian's package, run
//! unprivileged in the foreground): LogBus's sink forwarding to rsyslog's
//! imtcp, and rsyslog's omfwd forwarding (octet-counted RFC 5424) to
//! LogBus's source. The tests are ignored unless run with
//! `--include-ignored` (CI does); then a missing rsyslogd fails them.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use logbus_plugin_api::testing;
use logbus_plugin_api::{Event, Meta, Typed};
use serde_json::json;

struct Rsyslog(Child);

impl Drop for Rsyslog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Fails the test unless rsyslogd runs.
fn require_rsyslogd() {
    let ok = Command::new("rsyslogd")
        .arg("-v")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "rsyslogd is required here (apt install rsyslog)");
}

/// Fails the test unless util-linux `logger` runs.
fn require_logger() {
    let ok = Command::new("logger")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "util-linux `logger` is required here (apt install bsdutils)"
    );
}

use logbus_test_ports::free_port;

fn wait_port(port: u16) {
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "port {port} never opened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn rsyslog(dir: &Path, conf: &str) -> Rsyslog {
    let path = dir.join("rsyslog.conf");
    std::fs::write(
        &path,
        format!("global(workDirectory=\"{}\")\n{conf}", dir.display()),
    )
    .unwrap();
    let child = Command::new("rsyslogd")
        .arg("-n")
        .arg("-f")
        .arg(&path)
        .arg("-i")
        .arg(dir.join("rsyslog.pid"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Rsyslog(child)
}

#[ignore = "needs rsyslogd (apt install rsyslog); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logbus_forwards_to_rsyslog() {
    require_rsyslogd();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let out = dir.path().join("out.log");
    let _r = rsyslog(
        dir.path(),
        &format!(
            "module(load=\"imtcp\")\ninput(type=\"imtcp\" port=\"{port}\")\naction(type=\"omfile\" file=\"{}\" template=\"RSYSLOG_SyslogProtocol23Format\")\n",
            out.display()
        ),
    );
    wait_port(port);
    let sink = testing::sink(
        &Typed(logbus_net::sink::SyslogSink),
        json!({ "address": format!("127.0.0.1:{port}") }),
    );
    let events: Vec<Event> = (0..50)
        .map(|i| {
            Event::raw(
                format!("<14>1 2026-11-30T10:00:00.000Z edge7 app 42 ID{i} - message {i}"),
                Meta::at("t", 0),
            )
        })
        .collect();
    let (result, metrics) = testing::run_sink(sink, vec![events]).await;
    result.unwrap();
    assert_eq!(metrics.snapshot().events_out, 50);
    // rsyslog parsed and re-wrote them.
    let start = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        if text.lines().count() >= 50 {
            break text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "rsyslog wrote: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for i in 0..50 {
        let line = text
            .lines()
            .find(|l| l.ends_with(&format!(" message {i}")))
            .unwrap_or_else(|| panic!("message {i} missing in {text}"));
        assert!(
            line.starts_with("<14>1 2026-11-30T10:00:00") && line.contains(" edge7 app 42 "),
            "{line}"
        );
    }
}

#[ignore = "needs rsyslogd and util-linux logger (apt install rsyslog bsdutils); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsyslog_forwards_to_logbus() {
    require_rsyslogd();
    require_logger();
    let dir = tempfile::tempdir().unwrap();
    let (rsyslog_port, logbus_port) = (free_port(), free_port());
    // LogBus listens first.
    let mut running = testing::run_source(
        testing::source(
            &Typed(logbus_net::source::SyslogSource),
            json!({ "address": format!("127.0.0.1:{logbus_port}") }),
        ),
        1000,
    );
    wait_port(logbus_port);
    let _r = rsyslog(
        dir.path(),
        &format!(
            "module(load=\"imtcp\")\ninput(type=\"imtcp\" port=\"{rsyslog_port}\")\naction(type=\"omfwd\" target=\"127.0.0.1\" port=\"{logbus_port}\" protocol=\"tcp\" TCP_Framing=\"octet-counted\" template=\"RSYSLOG_SyslogProtocol23Format\")\n"
        ),
    );
    wait_port(rsyslog_port);
    for i in 0..3 {
        let status = Command::new("logger")
            .args([
                "--server",
                "127.0.0.1",
                "--port",
                &rsyslog_port.to_string(),
                "--tcp",
                "--octet-count",
                "-t",
                "viarsyslog",
            ])
            .arg(format!("hop {i}"))
            .status()
            .unwrap();
        assert!(status.success());
    }
    let mut got = testing::take_text(&mut running.rx, 3).await;
    got.sort();
    for (i, m) in got.iter().enumerate() {
        assert!(
            m.starts_with('<') && m.contains(" viarsyslog ") && m.ends_with(&format!("hop {i}")),
            "{m}"
        );
    }
    running.stop().await.unwrap();
}
