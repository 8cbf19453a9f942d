//! Custom builds: the binary with exactly the plugins a site needs,
//! statically linked so it runs on any Linux of the same architecture, and
//! a check that each plugin feature compiles on its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The plugin features of the `logbus` crate, read from its manifest.
fn plugin_features(root: &Path) -> anyhow::Result<Vec<String>> {
    let manifest = std::fs::read_to_string(root.join("crates/logbus/Cargo.toml"))?;
    Ok(manifest
        .lines()
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k.trim()))
        .filter(|k| {
            ["source-", "sink-", "parser-", "transform-", "formatter-"]
                .iter()
                .any(|p| k.starts_with(p))
        })
        .map(str::to_owned)
        .collect())
}

pub fn check_features(root: &Path) -> anyhow::Result<()> {
    let features = plugin_features(root)?;
    for feature in &features {
        println!("checking feature {feature} alone");
        let status = Command::new(env!("CARGO"))
            .args([
                "check",
                "-p",
                "logbus",
                "--locked",
                "--no-default-features",
                "--features",
                feature,
            ])
            .current_dir(root)
            .status()?;
        if !status.success() {
            bail!("feature `{feature}` does not build alone");
        }
    }
    println!("{} plugin features build alone", features.len());
    Ok(())
}

const MINIMAL: &[&str] = &[
    "source-stdin",
    "source-file",
    "source-http",
    "parser-lines",
    "parser-json",
    "formatter-json",
    "transform-js",
    "sink-stdout",
    "sink-file",
    "sink-http",
];

/// `--plugins` entries are feature names (`sink-file`) or plugin names
/// (`file` means every feature ending in `-file`).
fn resolve_plugins(all: &[String], list: &str) -> anyhow::Result<Vec<String>> {
    let mut chosen = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let matches: Vec<&String> = all
            .iter()
            .filter(|f| *f == item || f.split_once('-').is_some_and(|(_, name)| name == item))
            .collect();
        if matches.is_empty() {
            bail!(
                "`{item}` is no plugin or plugin feature; features: {}",
                all.join(", ")
            );
        }
        chosen.extend(matches.into_iter().cloned());
    }
    chosen.sort();
    chosen.dedup();
    Ok(chosen)
}

fn host_triple() -> anyhow::Result<String> {
    let out = Command::new("rustc").arg("-vV").output()?;
    String::from_utf8(out.stdout)?
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .context("rustc -vV names no host")
}

pub fn dist(root: &Path, profile: &str, plugins: Option<&str>) -> anyhow::Result<()> {
    let all = plugin_features(root)?;
    let (label, features): (String, Vec<String>) = match (plugins, profile) {
        (Some(list), _) => ("custom".into(), resolve_plugins(&all, list)?),
        (None, "minimal") => (
            "minimal".into(),
            MINIMAL.iter().map(|s| s.to_string()).collect(),
        ),
        (None, "default") => ("default".into(), vec!["default".into()]),
        (None, "full") => ("full".into(), vec!["full".into()]),
        (None, other) => bail!("unknown profile `{other}`: minimal, default or full"),
    };
    let mut feature_arg = features.clone();
    if !feature_arg.iter().any(|f| f == "default" || f == "full") {
        feature_arg.push("mimalloc".into());
    }
    // librdkafka needs OpenSSL and libcurl: linked statically too.
    let kafka = feature_arg
        .iter()
        .any(|f| f == "full" || f.ends_with("-kafka"));
    if kafka {
        feature_arg.push("kafka-static".into());
    }
    let triple = host_triple()?;
    let target =
        std::env::var("CARGO_TARGET_DIR").map_or_else(|_| root.join("target"), PathBuf::from);
    println!(
        "building {label} ({}) for {triple}, statically linked",
        feature_arg.join(",")
    );
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "-p",
            "logbus",
            "--locked",
            "--profile",
            "dist",
            "--target",
            &triple,
        ])
        .args([
            "--no-default-features",
            "--features",
            &feature_arg.join(","),
        ])
        // With an explicit --target these flags reach only the target's
        // crates, not build scripts or proc macros.
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env("OPENSSL_STATIC", "1")
        .current_dir(root)
        .status()?;
    if !status.success() {
        bail!("dist build failed");
    }
    let built = target.join(&triple).join("dist/logbus");
    let out_dir = root.join("target/dist");
    std::fs::create_dir_all(&out_dir)?;
    let binary = out_dir.join(format!("logbus-{label}"));
    std::fs::copy(&built, &binary)?;

    let ldd = Command::new("ldd").arg(&binary).output()?;
    let ldd_text = format!(
        "{}{}",
        String::from_utf8_lossy(&ldd.stdout),
        String::from_utf8_lossy(&ldd.stderr)
    );
    let is_static =
        ldd_text.contains("not a dynamic executable") || ldd_text.contains("statically linked");
    if !is_static {
        bail!("{} is not static:\n{ldd_text}", binary.display());
    }
    let plugins_json = Command::new(&binary)
        .args(["plugins", "--format", "json"])
        .output()?;
    let plugins: serde_json::Value = serde_json::from_slice(&plugins_json.stdout)?;
    let names: Vec<String> = plugins["plugins"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    format!(
                        "{} {}",
                        p["kind"].as_str().unwrap_or("?"),
                        p["name"].as_str().unwrap_or("?")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let size = std::fs::metadata(&binary)?.len();
    // The measurement pipeline reads stdin and writes stdout; a build
    // without either plugin is reported without it, saying why.
    let missing: Vec<&str> = ["source stdin", "sink stdout"]
        .into_iter()
        .filter(|needed| !names.iter().any(|n| n == needed))
        .collect();
    let measured = if missing.is_empty() {
        Some(measure(&binary, &out_dir)?)
    } else {
        None
    };
    let not_measured = (!missing.is_empty()).then(|| {
        format!(
            "start-up and idle RSS are measured with a stdin → stdout pipeline; this build has no {}",
            missing.join(" and no ")
        )
    });
    let manifest = serde_json::json!({
        "binary": binary.file_name().map(|n| n.to_string_lossy().to_string()),
        "target": triple,
        "features": features,
        "plugins": names,
        "size_bytes": size,
        "statically_linked": is_static,
        "startup_to_exit_ms_median": measured.map(|(startup, _)| startup.as_secs_f64() * 1000.0),
        "idle_rss_bytes": measured.map(|(_, rss)| rss),
        "not_measured": not_measured,
    });
    let manifest_path = out_dir.join(format!("logbus-{label}.json"));
    std::fs::write(&manifest_path, serde_json::to_string_pretty(&manifest)?)?;
    let figures = match (measured, &not_measured) {
        (Some((startup, idle_rss)), _) => format!(
            "start to first event and exit {:.1} ms (median of 21); idle RSS {:.1} MiB",
            startup.as_secs_f64() * 1000.0,
            idle_rss as f64 / 1048576.0
        ),
        (None, Some(why)) => format!("not measured: {why}"),
        (None, None) => unreachable!("measured unless something is missing"),
    };
    println!(
        "{}: {:.1} MiB, static, {} plugins; {figures}\nmanifest: {}",
        binary.display(),
        size as f64 / 1048576.0,
        names.len(),
        manifest_path.display()
    );
    Ok(())
}

/// Start-up: a one-event pipeline (stdin → stdout) from exec to exit, the
/// median of 21 runs — an upper bound on start to first event. Idle RSS:
/// the same pipeline waiting on an open, silent stdin after 500 ms.
fn measure(binary: &Path, dir: &Path) -> anyhow::Result<(Duration, u64)> {
    let pipeline = dir.join("measure.yml");
    std::fs::write(
        &pipeline,
        "stages:\n  read: { source: stdin }\n  out: { sink: stdout, inputs: [read] }\n",
    )?;
    let mut times = Vec::new();
    for _ in 0..21 {
        let started = Instant::now();
        let mut child = Command::new(binary)
            .arg("run")
            .arg(&pipeline)
            .env("LOGBUS_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(b"{\"first\":true}\n")?;
        let out = child.wait_with_output()?;
        times.push(started.elapsed());
        if out.stdout != b"{\"first\":true}\n" {
            bail!("the measuring pipeline did not pass its event");
        }
    }
    times.sort();
    let startup = times[times.len() / 2];

    let mut child = Command::new(binary)
        .arg("run")
        .arg(&pipeline)
        .env("LOGBUS_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(500));
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()))?;
    let rss_kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .context("no VmRSS")?;
    drop(child.stdin.take());
    child.wait()?;
    Ok((startup, rss_kib * 1024))
}
