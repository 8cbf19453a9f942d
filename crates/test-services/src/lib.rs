//! The real servers the service tests run against, as the tests reach
//! them: where each one listens (`.ci/services` starts them on loopback,
//! or an environment variable points elsewhere), a check that it answers
//! that fails the test with how to start it, and the independent client
//! (kafka-python, opensearch-py, boto3, ClickHouse's HTTP interface) that
//! sets up what a test needs and reads back what LogBus wrote. One crate,
//! so a plugin's tests and the binary's end-to-end tests share them
//! without including each other's files.

pub mod aws;
pub mod clickhouse;
pub mod kafka;
pub mod opensearch;

/// Fails the test, saying how to start it, unless something listens at
/// `addr` (`host:port`).
pub(crate) fn require_listening(addr: &str, what: &str) {
    assert!(
        std::net::TcpStream::connect(addr).is_ok(),
        "{what} at {addr} is required"
    );
}

/// Fails the test, saying what to install, unless python3 can import
/// `module`.
pub(crate) fn require_python(module: &str, install: &str) {
    assert!(
        std::process::Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|o| o.status.success()),
        "python3 with {module} is required ({install})"
    );
}

/// Runs `prelude` then `script` in python3 with `sys`, `json` and `ARGS`
/// (the arguments) set; fails the test with python's stderr unless it
/// succeeds; returns its stdout.
pub(crate) fn python(prelude: &str, script: &str, args: &[&str]) -> String {
    let o = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import sys, json\nARGS = sys.argv[1:]\n{prelude}\n{script}"
        ))
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// A hold on a shared server. Tests that freeze a server (SIGSTOP, to
/// check that a stalled destination holds the pipeline back) take it
/// alone with [`pausing`]; tests whose assertions need the server to
/// answer within a timeout (the `validate --connect` probes) take it
/// shared with [`answering`]. A file lock, so that tests in different
/// processes (a plugin's tests and the binary's, run side by side) agree
/// as well as tests on different threads of one.
pub struct ServiceHold(#[allow(dead_code)] std::fs::File);

fn hold(service: &str, alone: bool) -> ServiceHold {
    let path = std::env::temp_dir().join(format!("logbus-test-{service}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let locked = if alone {
        file.lock()
    } else {
        file.lock_shared()
    };
    locked.unwrap_or_else(|e| panic!("locking {}: {e}", path.display()));
    ServiceHold(file)
}

/// Holds `service` answering: no test freezes it until the hold drops.
pub fn answering(service: &str) -> ServiceHold {
    hold(service, false)
}

/// Holds `service` alone, to freeze it: waits for every [`answering`]
/// hold to drop.
pub fn pausing(service: &str) -> ServiceHold {
    hold(service, true)
}

/// Nanoseconds since the Unix epoch: unique names for topics, tables,
/// indices and buckets across runs.
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    /// The prelude runs before the script, with `ARGS` and `json` set.
    #[test]
    fn python_runs_the_prelude_then_the_script_with_the_arguments() {
        let out = super::python(
            "X = 40",
            "print(json.dumps([X + len(ARGS), ARGS]))",
            &["a", "b"],
        );
        assert_eq!(out.trim(), r#"[42, ["a", "b"]]"#);
    }
}
