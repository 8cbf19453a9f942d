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
