//! `validate --preflight`: the host's side, each finding at its option.

use crate::support::logbus;

#[test]
fn preflight_finds_what_the_host_lacks_at_the_option_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let text = format!(
        "stages:
  read:
    source: file
    path: {missing}
  intake:
    source: http
    address: '{address}'
  both: {{ parser: json, inputs: [read, intake] }}
  out:
    sink: file
    inputs: [both]
    path: {dir}/nope/out.ndjson
  made:
    sink: file
    inputs: [both]
    create_dirs: true
    path: {dir}/made/out.ndjson
",
        missing = dir.path().join("absent.log").display(),
        dir = dir.path().display(),
    );
    let file = dir.path().join("p.yml");
    std::fs::write(&file, text).unwrap();

    // Plain validation does no I/O: valid.
    let o = logbus().arg("validate").arg(&file).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );

    let o = logbus()
        .args(["validate", "--preflight"])
        .arg(&file)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(1), "{out}");
    let name = file.display().to_string();
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("[host-")).collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with(&format!(
            "{name}:4:5: error[host-file]: stage `read`: option `path`: cannot read "
        )),
        "{out}"
    );
    assert!(lines[0].ends_with("no such file or directory"), "{out}");
    assert!(
        lines[1].starts_with(&format!("{name}:7:5: error[host-listen]: stage `intake`: option `address`: cannot listen on {address}: ")),
        "{out}"
    );
    assert!(lines[1].contains("another process listens there"), "{out}");
    assert!(
        lines[2].starts_with(&format!(
            "{name}:12:5: error[host-dir]: stage `out`: option `path`: "
        )),
        "{out}"
    );
    assert!(
        lines[2].ends_with("does not exist: create it, or set `create_dirs: true`"),
        "{out}"
    );
    // Nothing was made.
    assert!(!dir.path().join("made").exists());

    // Fixed, it passes.
    std::fs::write(dir.path().join("absent.log"), "{}\n").unwrap();
    std::fs::create_dir(dir.path().join("nope")).unwrap();
    drop(taken);
    let o = logbus()
        .args(["validate", "--preflight", "--format", "github"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// TLS files and secret variables as the service plugins state them: a CA
/// that is not there, a certificate with another key, a variable unset.
#[cfg(all(feature = "sink-clickhouse", feature = "source-http"))]
#[test]
fn tls_files_and_secret_variables_are_checked_where_the_options_name_them() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["one", "two"] {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(dir.path().join(format!("{name}.crt")), made.cert.pem()).unwrap();
        std::fs::write(
            dir.path().join(format!("{name}.key")),
            made.key_pair.serialize_pem(),
        )
        .unwrap();
    }
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = free.local_addr().unwrap();
    drop(free);
    let text = format!(
        "stages:
  intake:
    source: http
    address: '{address}'
    tls: {{ cert_file: one.crt, key_file: two.key }}
  parse: {{ parser: json, inputs: [intake] }}
  table:
    sink: clickhouse
    inputs: [parse]
    url: https://127.0.0.1:8443
    table: logs
    tls: {{ ca_file: absent-ca.pem }}
    username: logbus
    password_env: LOGBUS_TEST_UNSET_PASSWORD
"
    );
    let file = dir.path().join("p.yml");
    std::fs::write(&file, text).unwrap();
    let o = logbus()
        .args(["validate", "--preflight"])
        .arg(&file)
        .env_remove("LOGBUS_TEST_UNSET_PASSWORD")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(1), "{out}");
    let name = file.display().to_string();
    let found: Vec<&str> = out.lines().filter(|l| l.contains("[host-")).collect();
    assert_eq!(found.len(), 3, "{out}");
    assert!(
        found[0].starts_with(&format!(
            "{name}:5:32: error[host-tls]: stage `intake`: option `tls.key_file`: "
        )),
        "{out}"
    );
    assert!(
        found[0].contains("two.key does not belong to the certificate in"),
        "{out}"
    );
    assert!(
        found[1].starts_with(&format!(
            "{name}:12:12: error[host-tls]: stage `table`: option `tls.ca_file`: "
        )),
        "{out}"
    );
    assert!(found[1].contains("absent-ca.pem"), "{out}");
    assert!(
        found[2].starts_with(&format!("{name}:14:5: error[host-env]: stage `table`: option `password_env`: the environment variable `LOGBUS_TEST_UNSET_PASSWORD` is not set")),
        "{out}"
    );
}

/// Every plugin that reads TLS files or a secret variable states them:
/// each missing one is found at its own option.
#[cfg(all(
    feature = "source-otlp",
    feature = "sink-otlp",
    feature = "sink-http",
    feature = "sink-syslog",
    feature = "sink-email",
    feature = "sink-opensearch"
))]
#[test]
fn each_plugin_states_its_tls_files_and_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let text = "stages:
  otel:
    source: otlp
    http_address: 127.0.0.1:0
    tls: { cert_file: a.crt, key_file: a.key }
  out_otlp:
    sink: otlp
    inputs: [otel]
    endpoint: https://127.0.0.1:4318
    tls: { ca_file: b.pem }
  out_http:
    sink: http
    inputs: [otel]
    url: https://127.0.0.1:8080/
    tls: { ca_file: c.pem }
  out_syslog:
    sink: syslog
    inputs: [otel]
    address: 127.0.0.1:6514
    tls: { ca_file: d.pem }
  out_mail:
    sink: email
    inputs: [otel]
    host: 127.0.0.1
    port: 465
    tls: tls
    ca_file: e.pem
    from: a@example.com
    to: [b@example.com]
    subject: s
  out_search:
    sink: opensearch
    inputs: [otel]
    endpoints: [https://127.0.0.1:9200]
    index: logs
    tls: { ca_file: f.pem }
    bearer_token_env: LOGBUS_TEST_UNSET_TOKEN
";
    let file = dir.path().join("p.yml");
    std::fs::write(&file, text).unwrap();
    let o = logbus()
        .args(["validate", "--preflight", "--format", "json"])
        .arg(&file)
        .env_remove("LOGBUS_TEST_UNSET_TOKEN")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let found: Vec<String> = report["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let message = d["message"].as_str().unwrap();
            let option = message.split('`').nth(1).unwrap_or("");
            format!(
                "{} {} {option}",
                d["code"].as_str().unwrap(),
                d["stage"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            "host-tls otel tls.cert_file",
            "host-tls otel tls.key_file",
            "host-tls out_otlp tls.ca_file",
            "host-tls out_http tls.ca_file",
            "host-tls out_syslog tls.ca_file",
            "host-tls out_mail ca_file",
            "host-tls out_search tls.ca_file",
            "host-env out_search bearer_token_env",
        ],
        "{out}"
    );
}
