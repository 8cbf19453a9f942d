//! What the OpenSearch tests share: the node (`.ci/services up
//! opensearch` on 127.0.0.1:9200, or `LOGBUS_OPENSEARCH_URL`) and
//! opensearch-py, the independent client that prepares indices and reads
//! documents back. The tests that need them are ignored unless run with
//! `--include-ignored` (CI does); then a missing node or opensearch-py
//! fails them.

use serde_json::{Value, json};

/// The node's URL; fails the test unless the node answers and
/// opensearch-py is installed.
pub fn node() -> String {
    let url =
        std::env::var("LOGBUS_OPENSEARCH_URL").unwrap_or_else(|_| "http://127.0.0.1:9200".into());
    let hostport = url.trim_start_matches("http://").trim_end_matches('/');
    crate::require_listening(
        hostport,
        "an OpenSearch node (.ci/services up opensearch, or set LOGBUS_OPENSEARCH_URL)",
    );
    crate::require_python("opensearchpy", "pip install opensearch-py");
    url
}

/// Runs an opensearch-py snippet with `os` (a client), `json` and `ARGS`;
/// returns its stdout.
pub fn python(url: &str, script: &str, args: &[&str]) -> String {
    crate::python(
        &format!("from opensearchpy import OpenSearch\nos = OpenSearch([{url:?}], timeout=60)"),
        script,
        args,
    )
}

/// A name no other test (or earlier run) uses.
pub fn unique(name: &str) -> String {
    format!("{name}-{}-{}", std::process::id(), crate::now_ns())
}

/// Every document under `pattern` (refreshed first): `(index, id, source)`.
pub fn documents(url: &str, pattern: &str) -> Vec<(String, String, Value)> {
    let out = python(
        url,
        "from opensearchpy import helpers\n\
         os.indices.refresh(index=ARGS[0])\n\
         for h in helpers.scan(os, index=ARGS[0], query={'query': {'match_all': {}}}):\n\
         \x20   print(json.dumps([h['_index'], h['_id'], h['_source'], h.get('_routing')]))",
        &[pattern],
    );
    out.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v[0].as_str().unwrap().to_string(),
                v[1].as_str().unwrap().to_string(),
                json!({"source": v[2], "routing": v[3]}),
            )
        })
        .collect()
}

/// Sends `signal` (`-STOP`, `-CONT`) to the node `.ci/services` started
/// (its pid file under `LOGBUS_SERVICES`, default `/var/tmp/logbus-services`).
/// Hold [`crate::pausing`] while it is stopped.
pub fn signal_node(signal: &str) {
    let services =
        std::env::var("LOGBUS_SERVICES").unwrap_or_else(|_| "/var/tmp/logbus-services".into());
    let pid = std::fs::read_to_string(format!("{services}/run/opensearch/pid"))
        .expect("the node's pid file (.ci/services up opensearch)");
    let status = std::process::Command::new("kill")
        .args([signal, pid.trim()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {}", pid.trim());
}
