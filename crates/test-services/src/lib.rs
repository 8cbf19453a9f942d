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

/// Nanoseconds since the Unix epoch: unique names for topics, tables,
/// indices and buckets across runs.
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}
