//! `source: sysinfo` against the machine it runs on: the memory total
//! matches /proc/meminfo, the root filesystem and the loopback interface
//! are there, and traffic we make on loopback shows in its counters.

use logbus_plugin_api::Typed;
use logbus_plugin_api::testing::{self, RunningSource};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_metrics_match_what_the_kernel_says() {
    let RunningSource {
        mut rx,
        task,
        stop_on_drop: _guard,
        ..
    } = testing::run_source(
        testing::source(
            &Typed(logbus_host::sysinfo::SysInfo),
            json!({ "interval_ms": 500, "count": 2, "top_processes": 3 }),
        ),
        10_000,
    );
    let lo_received = || -> u64 {
        std::fs::read_to_string("/proc/net/dev")
            .unwrap()
            .lines()
            .find_map(|l| l.trim().strip_prefix("lo:").map(str::to_owned))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let before = lo_received();
    // The first sample, then 4 MiB over loopback before the second.
    let mut events = rx.recv().await.unwrap().take();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        std::io::copy(&mut s, &mut std::io::sink()).unwrap();
    });
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut c, &vec![0u8; 4 << 20]).unwrap();
    drop(c);
    while let Some(mut b) = rx.recv().await {
        events.extend(b.take());
    }
    task.await.unwrap().unwrap();
    let of = |kind: &str| -> Vec<Value> {
        events
            .iter()
            .map(|e| Value::Object(e.as_fields().unwrap().clone()))
            .filter(|v| v["kind"] == kind)
            .collect()
    };
    // Two samples of each.
    assert_eq!(of("cpu").len(), 2);
    assert_eq!(of("memory").len(), 2);
    assert_eq!(of("load").len(), 2);
    assert_eq!(of("process").len(), 6);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap();
    assert_eq!(of("memory")[0]["total_bytes"].as_u64().unwrap(), kib * 1024);
    let cpu = &of("cpu")[1];
    let cores = std::thread::available_parallelism().unwrap().get() as u64;
    assert!(cpu["cores"].as_u64().unwrap() >= cores);
    let usage = cpu["usage_percent"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&usage), "{usage}");
    assert!(
        of("disk").iter().any(|d| d["mount_point"] == "/"),
        "{:?}",
        of("disk")
    );
    let lo: Vec<Value> = of("network")
        .into_iter()
        .filter(|n| n["interface"] == "lo")
        .collect();
    assert_eq!(lo.len(), 2, "{:?}", of("network"));
    let reported = lo[1]["received_bytes_total"].as_u64().unwrap();
    assert!(
        reported >= before + (4 << 20),
        "{reported} < {before} + 4 MiB"
    );
    assert!(reported <= lo_received());
    // The rate is what arrived since the first sample over the time since
    // it (about the interval: 0.5 s).
    let arrived = reported - lo[0]["received_bytes_total"].as_u64().unwrap();
    assert!(arrived >= 4 << 20, "{arrived}");
    let rate = lo[1]["received_bytes_per_second"].as_f64().unwrap();
    let secs = arrived as f64 / rate;
    assert!((0.4..3.0).contains(&secs), "{arrived} B at {rate} B/s");
    assert!(
        events
            .iter()
            .all(|e| e.as_fields().unwrap()["host"].is_string())
    );
}

#[test]
fn bad_options_name_the_key() {
    let errors = |o: Value| testing::option_errors(&Typed(logbus_host::sysinfo::SysInfo), o);
    assert_eq!(
        errors(json!({ "interval_ms": 99 })),
        "interval_ms: must be at least 100, got 99"
    );
    assert_eq!(errors(json!({ "interval_ms": 100 })), "");
    assert_eq!(
        errors(json!({ "collectors": [] })),
        "collectors: name at least one"
    );
    assert_eq!(errors(json!({ "collectors": ["memory"] })), "");
    assert!(errors(json!({ "top_processes": 1001 })).starts_with("top_processes: "));
}
