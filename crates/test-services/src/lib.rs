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
