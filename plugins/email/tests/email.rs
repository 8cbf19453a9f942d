//! `sink: email` against a real SMTP server on loopback (Python's aiosmtpd,
//! storing what it receives in a Maildir): many events per message, the
//! rate limit and its summary, a server that is not up yet, TLS, and AUTH.
//! The tests that need aiosmtpd are ignored unless run with
//! `--include-ignored` (CI does); then a missing aiosmtpd fails them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use logbus_plugin_api::testing::{build_errors, option_errors};
use logbus_plugin_api::{
    BuildContext, Built, Event, Fields, Meta, Plugin, SinkContext, StageError, StageMetrics, Typed,
    channel,
};
use serde_json::json;

struct Smtpd {
    child: Child,
    maildir: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Smtpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

use logbus_test_ports::free_port;

/// Fails the test unless python3 can import aiosmtpd.
fn require_aiosmtpd() {
    let ok = Command::new("python3")
        .args(["-c", "import aiosmtpd"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "python3 with aiosmtpd is required here (pip install aiosmtpd)"
    );
}

/// A server that requires AUTH as `logbus` / `s3cret` (tests/smtpd_auth.py).
fn smtpd_auth(port: u16) -> Smtpd {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/smtpd_auth.py");
    serve(port, |maildir| {
        let mut c = Command::new("python3");
        c.arg(&script).arg(port.to_string()).arg(maildir);
        c
    })
}

fn smtpd(port: u16) -> Smtpd {
    smtpd_with(port, &[])
}

fn smtpd_with(port: u16, extra: &[&str]) -> Smtpd {
    serve(port, |maildir| {
        let mut c = Command::new("python3");
        c.args(["-m", "aiosmtpd", "-n"])
            .args(extra)
            .arg("-l")
            .arg(format!("127.0.0.1:{port}"))
            .args(["-c", "aiosmtpd.handlers.Mailbox"])
            .arg(maildir);
        c
    })
}

/// Starts the server `command` builds for a fresh Maildir, and waits until
/// it listens on `port`.
fn serve(port: u16, command: impl FnOnce(&Path) -> Command) -> Smtpd {
    let dir = tempfile::tempdir().unwrap();
    let maildir = dir.path().join("mail");
    let child = command(&maildir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the SMTP server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Smtpd {
        child,
        maildir,
        _dir: dir,
    }
}

/// Every message received, oldest first.
fn received(maildir: &Path) -> Vec<String> {
    let mut files: Vec<(std::time::SystemTime, String, PathBuf)> =
        std::fs::read_dir(maildir.join("new"))
            .map(|d| {
                d.map(|e| {
                    let e = e.unwrap();
                    let m = e.metadata().unwrap().modified().unwrap();
                    (m, e.file_name().to_string_lossy().into_owned(), e.path())
                })
                .collect()
            })
            .unwrap_or_default();
    files.sort();
    files
        .into_iter()
        .map(|(_, _, p)| std::fs::read_to_string(p).unwrap())
        .collect()
}

fn events(from: usize, n: usize) -> Vec<Event> {
    (from..from + n)
        .map(|i| {
            Event::fields(
                serde_json::from_value::<Fields>(
                    json!({"level": "error", "msg": format!("boom {i}")}),
                )
                .unwrap(),
                Meta::at("t", 0),
            )
        })
        .collect()
}

/// Runs the sink over batches (sent one after another, each after `gap`).
async fn run(options: serde_json::Value, batches: &[usize], gap: Duration) -> Arc<StageMetrics> {
    let (result, metrics) = try_run(options, batches, gap).await;
    result.unwrap();
    metrics
}

/// Like [`run`], returning how the sink ended instead of expecting success.
async fn try_run(
    options: serde_json::Value,
    batches: &[usize],
    gap: Duration,
) -> (Result<(), StageError>, Arc<StageMetrics>) {
    try_run_counting(options, batches, gap, Arc::new(StageMetrics::default())).await
}

/// [`try_run`], counting into `metrics` (watched while it runs).
async fn try_run_counting(
    options: serde_json::Value,
    batches: &[usize],
    gap: Duration,
    metrics: Arc<StageMetrics>,
) -> (Result<(), StageError>, Arc<StageMetrics>) {
    let cx = BuildContext {
        stage_id: "alerts".into(),
        base_dir: ".".into(),
        worker: 0,
    };
    let sink = match Typed(logbus_email::sink::EmailSink).build(&options, &cx) {
        Ok(Built::Sink(s)) => s,
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("not a sink"),
    };
    let (tx, rx) = channel(10_000);
    let mut scx = SinkContext::new("alerts", rx, metrics.clone());
    let batches = batches.to_vec();
    let feeder = tokio::spawn(async move {
        let mut at = 0;
        for n in batches {
            tx.send(events(at, n)).await.unwrap();
            at += n;
            tokio::time::sleep(gap).await;
        }
    });
    let result = sink.run(&mut scx).await;
    feeder.await.unwrap();
    (result, metrics)
}

fn base(port: u16) -> serde_json::Value {
    json!({
        "host": "127.0.0.1",
        "port": port,
        "from": "LogBus <logbus@example.com>",
        "to": ["oncall@example.com", "Ops <ops@example.com>"],
        "body": "{{level}}: {{msg}}",
        "batch_timeout_ms": 50,
        "retry_initial_backoff_ms": 20,
        "retry_max_backoff_ms": 100,
    })
}

#[ignore = "needs python3 with aiosmtpd (pip install aiosmtpd); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_batched_into_few_messages() {
    require_aiosmtpd();
    let port = free_port();
    let server = smtpd(port);
    let mut o = base(port);
    o["batch_max_events"] = json!(10);
    let metrics = run(o, &[25], Duration::ZERO).await;
    let mail = received(&server.maildir);
    assert_eq!(mail.len(), 3, "{mail:#?}");
    let all = mail.concat();
    assert!(!all.contains("held back"), "nothing was held back: {all}");
    for i in 0..25 {
        assert!(
            all.contains(&format!("error: boom {i}\n")),
            "boom {i} missing"
        );
    }
    assert!(
        mail[0].contains("Subject: [logbus] 10 events from alerts"),
        "{}",
        mail[0]
    );
    assert!(
        mail.iter()
            .any(|m| m.contains("Subject: [logbus] 5 events from alerts"))
    );
    assert!(
        mail[0].contains("To: oncall@example.com, Ops <ops@example.com>"),
        "{}",
        mail[0]
    );
    assert!(mail[0].contains("From: LogBus <logbus@example.com>"));
    let m = metrics.snapshot();
    assert_eq!((m.events_in, m.events_out, m.discarded), (25, 25, 0));
}

#[ignore = "needs python3 with aiosmtpd (pip install aiosmtpd); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_is_held_back_by_the_rate_limit_and_summarised() {
    require_aiosmtpd();
    let port = free_port();
    let server = smtpd(port);
    let mut o = base(port);
    o["max_messages"] = json!(2);
    o["period_ms"] = json!(1500);
    o["batch_max_events"] = json!(10);
    // Three batches at once: two messages, the third held back; then, once
    // the period is over, a fourth message saying so.
    let metrics = run(o, &[10, 10, 10, 0, 0, 10], Duration::from_millis(300)).await;
    let mail = received(&server.maildir);
    assert_eq!(mail.len(), 3, "{mail:#?}");
    assert!(
        mail[2].contains("(10 earlier events were held back by the rate limit"),
        "{}",
        mail[2]
    );
    let m = metrics.snapshot();
    assert_eq!((m.events_in, m.events_out, m.discarded), (40, 30, 10));
}

#[ignore = "needs python3 with aiosmtpd (pip install aiosmtpd); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_up_yet_is_retried() {
    require_aiosmtpd();
    // The server starts once the sink has failed and retried (its counter
    // says so), not after a guessed delay.
    let port = free_port();
    let counted = Arc::new(StageMetrics::default());
    let sending = tokio::spawn(try_run_counting(
        base(port),
        &[3],
        Duration::ZERO,
        counted.clone(),
    ));
    let began = std::time::Instant::now();
    while counted.snapshot().retried == 0 {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "no retry within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let server = tokio::task::spawn_blocking(move || smtpd(port))
        .await
        .unwrap();
    let (result, metrics) = sending.await.unwrap();
    result.unwrap();
    assert_eq!(received(&server.maildir).len(), 1);
    assert_eq!(metrics.snapshot().events_out, 3);
    assert!(
        metrics.snapshot().retried >= 3,
        "the first attempts failed and were retried"
    );
}

#[ignore = "needs python3 with aiosmtpd (pip install aiosmtpd); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starttls_and_implicit_tls_with_a_private_ca() {
    require_aiosmtpd();
    let certs = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = certs.path().join("cert.pem");
    let key = certs.path().join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    for (mode, flags) in [
        ("starttls", ["--tlscert", c, "--tlskey", k]),
        ("tls", ["--smtpscert", c, "--smtpskey", k]),
    ] {
        let port = free_port();
        let server = smtpd_with(port, &flags);
        let mut o = base(port);
        o["host"] = json!("localhost");
        o["tls"] = json!(mode);
        o["ca_file"] = json!(cert);
        let metrics = run(o, &[4], Duration::ZERO).await;
        assert_eq!(metrics.snapshot().events_out, 4, "{mode}");
        let mail = received(&server.maildir);
        assert_eq!(mail.len(), 1, "{mode}");
        assert!(mail[0].contains("error: boom 3"), "{mode}: {}", mail[0]);
    }
}

#[ignore = "needs python3 with aiosmtpd (pip install aiosmtpd); run with --include-ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_with_the_right_password_delivers_and_a_wrong_or_missing_one_fails() {
    require_aiosmtpd();
    let port = free_port();
    let server = smtpd_auth(port);
    let mut o = base(port);
    o["username"] = json!("logbus");
    o["password"] = json!("s3cret");
    let metrics = run(o.clone(), &[3], Duration::ZERO).await;
    assert_eq!(metrics.snapshot().events_out, 3);
    let mail = received(&server.maildir);
    assert_eq!(mail.len(), 1, "{mail:#?}");
    assert!(mail[0].contains("error: boom 2"), "{}", mail[0]);

    // A refusal is permanent: the stage fails at once, naming the server
    // and the reply, and commits nothing.
    o["password"] = json!("wrong");
    let (result, metrics) = try_run(o, &[2], Duration::ZERO).await;
    let err = result.expect_err("a wrong password is refused").to_string();
    assert!(
        err.contains(&format!("127.0.0.1:{port}")) && err.contains("535"),
        "{err}"
    );
    assert_eq!(metrics.snapshot().events_out, 0);

    let (result, metrics) = try_run(base(port), &[2], Duration::ZERO).await;
    let err = result.expect_err("no credentials is refused").to_string();
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert_eq!(metrics.snapshot().events_out, 0);
    assert_eq!(received(&server.maildir).len(), 1);
}

#[test]
fn bad_options_name_the_key() {
    let errors = |o: serde_json::Value| option_errors(&Typed(logbus_email::sink::EmailSink), o);
    let ok = json!({ "host": "h", "from": "a@b.c", "to": ["d@e.f"] });
    assert_eq!(errors(ok.clone()), "");
    let mut o = ok.clone();
    o["from"] = json!("not an address");
    assert!(errors(o).starts_with("from: "));
    let mut o = ok.clone();
    o["to"] = json!([]);
    assert!(errors(o).starts_with("to: "));
    let mut o = ok.clone();
    o["ca_file"] = json!("ca.pem");
    assert!(errors(o).starts_with("ca_file: "));
    let mut o = ok.clone();
    o["tls"] = json!("starttls");
    o["ca_file"] = json!("/no/such/ca.pem");
    // Read when the stage is built, where it runs: validation cannot know.
    assert!(build_errors(&Typed(logbus_email::sink::EmailSink), o).contains("/no/such/ca.pem"));
    let mut o = ok.clone();
    o["username"] = json!("u");
    assert!(errors(o).contains("password"));
    let mut o = ok.clone();
    o["subject"] = json!("{{unclosed");
    assert!(errors(o).starts_with("subject: "));
    // The longest backoff may equal the first, not be below it.
    let mut o = ok.clone();
    o["retry_initial_backoff_ms"] = json!(500);
    o["retry_max_backoff_ms"] = json!(500);
    assert_eq!(errors(o), "");
    let mut o = ok;
    o["retry_initial_backoff_ms"] = json!(500);
    o["retry_max_backoff_ms"] = json!(499);
    assert!(errors(o).starts_with("retry_max_backoff_ms: "));
}
