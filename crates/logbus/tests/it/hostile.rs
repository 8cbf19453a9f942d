//! Hostile input against the `logbus` binary: what the config promises to
//! bound stays bounded, measured from outside (`/proc/<pid>/status`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{free_port, rss, wait_for_port};

fn start(pipeline: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_logbus"))
        .env("LOGBUS_LOG", "error")
        .arg("run")
        .arg(pipeline)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Sends one raw HTTP/1.1 request and returns the status code (0 when the
/// connection failed or closed without an answer).
fn post(port: u16, headers: &str, body: &[u8]) -> u16 {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n",
        body.len()
    );
    if conn.write_all(head.as_bytes()).is_err() || conn.write_all(body).is_err() {
        return 0;
    }
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// 10 MiB of two-byte lines, gzip-compressed to about 10 KB.
fn gzip_bomb() -> Vec<u8> {
    let mut gz =
        logbus_compress::CompressWriter::new(Vec::new(), logbus_compress::Compression::Gzip)
            .unwrap();
    let chunk = "a\n".repeat(64 * 1024);
    for _ in 0..80 {
        gz.write_all(chunk.as_bytes()).unwrap();
    }
    gz.finish().unwrap()
}

/// The HTTP source takes a slot before it reads a body and bounds the
/// events per request, so 32 small gzip bodies that each decompress to
/// 5 million lines leave the process within what its options promise
/// (4 slots × (2 × 10 MiB + 100,000 events)), and a normal request still
/// gets through.
#[test]
fn gzip_bodies_of_tiny_lines_stay_within_the_http_sources_bound() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let out = dir.path().join("out.ndjson");
    let pipeline = dir.path().join("pipeline.yml");
    std::fs::write(
        &pipeline,
        format!(
            r#"
stages:
  in:
    source: http
    address: "127.0.0.1:{port}"
    max_concurrent_requests: 4
    accept_timeout_ms: 60000
  out: {{ sink: file, inputs: [in], path: "{}" }}
"#,
            out.display()
        ),
    )
    .unwrap();
    let mut child = start(&pipeline);
    wait_for_port(port);
    let baseline = rss(child.id());
    let bomb = gzip_bomb();
    assert!(bomb.len() < 64 * 1024, "a small body: {} bytes", bomb.len());

    // 32 bombs from 16 clients at once; the process is sampled meanwhile
    // and killed before it can hurt the machine if the bound does not hold.
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let bomb = bomb.clone();
            std::thread::spawn(move || {
                (0..2)
                    .map(|_| post(port, "Content-Encoding: gzip\r\n", &bomb))
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    let mut peak = 0;
    while clients.iter().any(|c| !c.is_finished()) {
        peak = peak.max(rss(child.id()));
        if peak > 2 << 30 {
            child.kill().unwrap();
            panic!("RSS passed 2 GiB: the HTTP source's bound does not hold");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let codes: Vec<u16> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    assert!(
        codes.iter().all(|&c| c == 413),
        "every bomb is refused as too many events: {codes:?}"
    );
    // A well-behaved request after the attack is delivered.
    assert_eq!(post(port, "", b"{\"after\":1}\n"), 200);
    let began = Instant::now();
    while !std::fs::read_to_string(&out)
        .unwrap_or_default()
        .contains("after")
    {
        assert!(began.elapsed() < Duration::from_secs(20), "not delivered");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let growth = peak.saturating_sub(baseline);
    eprintln!(
        "gzip bodies: {} bytes each, baseline RSS {} MiB, peak {} MiB (+{} MiB)",
        bomb.len(),
        baseline >> 20,
        peak >> 20,
        growth >> 20
    );
    // The promise: 4 slots × (10 MiB raw + 10 MiB decompressed + 100,000
    // events at well under 256 bytes each) = 180 MiB; allocator slack aside.
    assert!(
        growth < 256 << 20,
        "RSS grew by {} MiB under 32 gzip bodies",
        growth >> 20
    );
}

/// A client that sends its headers and then stalls its body holds a slot
/// for `body_timeout_ms` at most: it gets 408, and the slot is free again.
#[test]
fn a_stalled_body_gets_408_and_frees_its_slot() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pipeline = dir.path().join("pipeline.yml");
    std::fs::write(
        &pipeline,
        format!(
            r#"
stages:
  in:
    source: http
    address: "127.0.0.1:{port}"
    max_concurrent_requests: 1
    body_timeout_ms: 300
    accept_timeout_ms: 10000
  out: {{ sink: blackhole, inputs: [in] }}
"#
        ),
    )
    .unwrap();
    let mut child = start(&pipeline);
    wait_for_port(port);
    let mut stalled = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stalled
        .write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"a\":")
        .unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // The one slot is the stalled request's; this one waits for it.
    let waiting = std::thread::spawn(move || post(port, "", b"{\"b\":1}\n"));
    let mut answer = String::new();
    let _ = stalled.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert_eq!(waiting.join().unwrap(), 200, "the slot came free");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Nine levels of nine aliases, about 420 bytes.
fn alias_bomb() -> String {
    let mut text = String::from("a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n");
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    for pair in names.windows(2) {
        let aliases = vec![format!("*{}", pair[0]); 9].join(",");
        text.push_str(&format!("{}: &{} [{aliases}]\n", pair[1], pair[1]));
    }
    text
}

/// `validate` refuses an alias bomb and a 60 KB file nested 30,000 levels
/// deep with an error at a line, instead of growing to gigabytes or
/// overflowing its stack.
#[test]
fn validate_refuses_alias_bombs_and_deep_nesting_with_a_position() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = dir.path().join("bomb.yml");
    std::fs::write(&bomb, format!("{}stages: {{}}\n", alias_bomb())).unwrap();
    let deep = dir.path().join("deep.yml");
    std::fs::write(
        &deep,
        format!("stages:\n  x:\n    {}1\n", "- ".repeat(30_000)),
    )
    .unwrap();
    for (file, expected) in [
        (&bomb, "aliases copy more than"),
        (&deep, "nesting deeper than 128 levels"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_logbus"))
            .arg("validate")
            .arg(file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
        let text = format!("{stdout}{stderr}");
        assert!(text.contains(expected), "{text}");
        let name = file.file_name().unwrap().to_str().unwrap();
        assert!(text.contains(&format!("{name}:")), "names the file: {text}");
    }
}

/// Hostile documents through the `yaml` and `json` parsers are errors of
/// their own events (routed to `<id>.errors`), and the process goes on:
/// an alias bomb, a megabyte of nesting in each format, and JSON just
/// over the depth limit; a document at the limit passes.
#[test]
fn hostile_documents_are_errors_of_their_events_not_of_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let out = dir.path().join("out.ndjson");
    let errors = dir.path().join("errors.ndjson");
    let pipeline = dir.path().join("pipeline.yml");
    std::fs::write(
        &pipeline,
        format!(
            r#"
stages:
  in:
    source: http
    address: "127.0.0.1:{port}"
  yaml: {{ parser: yaml, inputs: [in], on_error: route, wrap_field: doc }}
  json: {{ parser: json, inputs: [in], on_error: route, wrap_field: doc }}
  out: {{ sink: file, inputs: [yaml, json], path: "{}" }}
  bad: {{ sink: file, inputs: [yaml.errors, json.errors], path: "{}" }}
"#,
            out.display(),
            errors.display()
        ),
    )
    .unwrap();
    let mut child = start(&pipeline);
    wait_for_port(port);
    let deep_json = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    // Each document on one line: the source makes one event per line.
    let flow_bomb = format!("{{{}}}", alias_bomb().trim_end().replace('\n', ", "));
    let bodies = [
        flow_bomb,
        format!("{}x", "- ".repeat(500_000)),
        "[".repeat(1 << 20),
        deep_json(129),
        deep_json(128),
    ];
    for body in &bodies {
        assert_eq!(post(port, "", body.as_bytes()), 200);
    }
    let began = Instant::now();
    let count = |p: &std::path::Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .count()
    };
    // Each body goes through both parsers.
    while count(&out) + count(&errors) < 2 * bodies.len() {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "{} of {} documents came out; process alive: {:?}\nout: {:.300}\nerrors: {}",
            count(&out) + count(&errors),
            2 * bodies.len(),
            child.try_wait().unwrap(),
            std::fs::read_to_string(&out).unwrap_or_default(),
            std::fs::read_to_string(&errors)
                .unwrap_or_default()
                .lines()
                .map(|l| l
                    .chars()
                    .filter(|c| *c != '[')
                    .take(300)
                    .collect::<String>()
                    + "\n")
                .collect::<String>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.try_wait().unwrap().is_none(), "still running");
    child.kill().unwrap();
    child.wait().unwrap();
    let bad = std::fs::read_to_string(&errors).unwrap();
    assert_eq!(count(&errors), 8, "{bad:.2000}");
    for reason in [
        "aliases copy more than",
        "nesting deeper than 128 levels",
        "nested deeper than 128 levels at byte",
        "recursion limit exceeded",
    ] {
        assert!(bad.contains(reason), "{reason}: {bad:.2000}");
    }
    // The document at the limit, once from each parser.
    assert_eq!(count(&out), 2);
}

/// Reads until the peer closes the connection (or 20 s pass); whether it
/// did, and what it sent.
fn closed_by_peer(conn: &mut TcpStream) -> (bool, String) {
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return (true, String::from_utf8_lossy(&got).into_owned()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            // A reset is a close too.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return (true, String::from_utf8_lossy(&got).into_owned());
            }
            Err(_) => return (false, String::from_utf8_lossy(&got).into_owned()),
        }
    }
}

fn lines_in(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

/// 256 idle TCP connections (the syslog source's default cap) no longer
/// lock a real sender out: each new connection closes the longest-idle
/// one, and all of its messages arrive. A connection idle past
/// `idle_timeout_ms` is closed.
#[test]
fn idle_syslog_connections_make_room_and_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let out = dir.path().join("out.log");
    let pipeline = dir.path().join("pipeline.yml");
    let write = |idle_ms: u64| {
        std::fs::write(
            &pipeline,
            format!(
                "stages:\n  in: {{ source: syslog, address: \"127.0.0.1:{port}\", idle_timeout_ms: {idle_ms} }}\n  out: {{ sink: file, inputs: [in], path: \"{}\" }}\n",
                out.display()
            ),
        )
        .unwrap()
    };
    write(600_000);
    let mut child = start(&pipeline);
    wait_for_port(port);
    let idle: Vec<TcpStream> = (0..256)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    // Senders stay connected (each needs a slot of its own, so each makes
    // room by closing one idle connection).
    let senders: Vec<TcpStream> = (0..4)
        .map(|sender| {
            let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
            for i in 0..100 {
                writeln!(
                    conn,
                    "<14>1 2026-12-01T00:00:00Z host app - - - sender {sender} message {i}"
                )
                .unwrap();
            }
            conn
        })
        .collect();
    let began = Instant::now();
    while lines_in(&out) < 400 {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "{} of 400 messages arrived past 256 idle connections",
            lines_in(&out)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The four oldest idle connections were closed to make room.
    let closed = idle
        .into_iter()
        .take(4)
        .map(|mut c| closed_by_peer(&mut c).0)
        .filter(|c| *c)
        .count();
    assert_eq!(closed, 4);
    drop(senders);
    child.kill().unwrap();
    child.wait().unwrap();

    write(300);
    let mut child = start(&pipeline);
    wait_for_port(port);
    let mut quiet = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let began = Instant::now();
    assert!(closed_by_peer(&mut quiet).0, "an idle connection is closed");
    assert!(began.elapsed() < Duration::from_secs(10));
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The HTTP source: idle connections at the cap make room for a new
/// client; a client that dribbles its headers is cut off after
/// `header_timeout_ms`; a kept-alive connection with nothing to do is
/// closed after `idle_timeout_ms`.
#[test]
fn idle_and_slow_http_connections_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pipeline = dir.path().join("pipeline.yml");
    std::fs::write(
        &pipeline,
        format!(
            "stages:\n  in: {{ source: http, address: \"127.0.0.1:{port}\", max_connections: 8, idle_timeout_ms: 1000, header_timeout_ms: 500 }}\n  out: {{ sink: blackhole, inputs: [in] }}\n"
        ),
    )
    .unwrap();
    let mut child = start(&pipeline);
    wait_for_port(port);
    // Eight silent connections hold every slot; a real client still gets in.
    let idle: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    for _ in 0..3 {
        assert_eq!(post(port, "", b"{\"a\":1}\n"), 200);
    }
    // Headers that never finish.
    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .unwrap();
    let began = Instant::now();
    let (closed, answer) = closed_by_peer(&mut slow);
    assert!(closed, "{answer}");
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    assert!(began.elapsed() < Duration::from_secs(10));
    // A kept-alive connection after its request.
    let mut kept = TcpStream::connect(("127.0.0.1", port)).unwrap();
    kept.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\n{\"b\":1}\n")
        .unwrap();
    let (closed, answer) = closed_by_peer(&mut kept);
    assert!(closed && answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(idle);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A pipeline file that is not UTF-8 is refused at its first bad byte,
/// by line, column and offset.
#[test]
fn a_file_that_is_not_utf8_is_refused_at_the_bad_byte() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.yml");
    std::fs::write(
        &file,
        b"stages:\n  gen: { source: generator }\n  \xc3\xa9x\xff: 1\n",
    )
    .unwrap();
    for command in ["validate", "fmt"] {
        let out = Command::new(env!("CARGO_BIN_EXE_logbus"))
            .arg(command)
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("not UTF-8: byte 0xff at line 3, column 5 (byte offset 42)"),
            "{command}: {stderr}"
        );
        assert!(stderr.contains("p.yml"), "{stderr}");
        assert_ne!(out.status.code(), Some(0));
    }
}
