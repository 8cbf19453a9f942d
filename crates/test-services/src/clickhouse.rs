//! What the ClickHouse tests share: the servers (`.ci/services up
//! clickhouse clickhouse-old`) and their own HTTP interface, through
//! Python's urllib, to make tables and read rows back. The tests that need
//! a server are ignored unless run with `--include-ignored` (CI does); then
//! a missing server fails them.

use std::process::Command;

use serde_json::Value;

pub const MODERN: &str = "http://127.0.0.1:8123";
pub const OLD: &str = "http://127.0.0.1:8124";

/// `url`, owned; fails the test unless a server answers there.
pub fn server(url: &str) -> String {
    crate::require_listening(
        url.trim_start_matches("http://"),
        "a ClickHouse server (.ci/services up clickhouse clickhouse-old)",
    );
    url.to_string()
}

/// Runs `sql` over the server's HTTP interface; returns the answer.
pub fn sql(url: &str, sql: &str) -> String {
    let o = Command::new("python3")
        .args([
            "-c",
            "import sys, urllib.request\n\
             r = urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=sys.argv[2].encode()), timeout=60)\n\
             sys.stdout.write(r.read().decode())",
            url,
            sql,
        ])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

pub fn rows(url: &str, query: &str) -> Vec<Value> {
    sql(url, &format!("{query} FORMAT JSONEachRow"))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The rows in `table` now.
pub fn count(url: &str, table: &str) -> u64 {
    let text = sql(url, &format!("SELECT count() FROM {table}"));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("count of {table}: {text:?}: {e}"))
}

pub fn table(name: &str) -> String {
    format!("{name}_{}_{}", std::process::id(), crate::now_ns())
}
