//! Helpers for the binary's tests: pipelines loaded from text with every
//! plugin of this build, the `logbus` command, spawned processes and their
//! memory. (The engine's in-process tests and their test plugins are in
//! `crates/core/tests/engine`.)

use std::path::Path;
use std::sync::{Arc, Mutex};

use logbus_core::{Loaded, Pipeline, load_str};
use logbus_plugin_api::Registry;

pub fn load(text: &str) -> Loaded {
    load_with(text, &logbus::catalog::registry())
}

pub fn load_with(text: &str, registry: &Registry) -> Loaded {
    load_str(text, Path::new("test.yml"), registry, &|k| match k {
        "LOGBUS_TEST_SET" => Some("42".to_string()),
        _ => None,
    })
}

pub fn valid(text: &str, registry: &Registry) -> Pipeline {
    let loaded = load_with(text, registry);
    let errors: Vec<String> = loaded
        .diagnostics
        .iter()
        .map(|d| d.display("test.yml").to_string())
        .collect();
    loaded
        .pipeline
        .unwrap_or_else(|| panic!("pipeline should be valid: {errors:#?}"))
}

/// Appends `text` to the file at `path`, creating it.
pub fn append(path: &std::path::Path, text: &str) {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
}

pub use logbus_test_ports::{free_port, wait_for_port};

/// Resident memory of a process, in bytes (0 once it is gone).
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A `logbus` process whose stderr is read as it is written, into memory.
/// A piped stderr that nobody reads fills at 64 KiB, and the process's next
/// log line then blocks a runtime thread: under load (a broker restarting,
/// a sink retrying, each saying so) the pipeline stalls and the test sees
/// a hang that no user would.
pub struct Spawned {
    pub child: std::process::Child,
    said: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Spawned {
    /// Spawns `command` with stderr piped and drained.
    pub fn spawn(command: &mut std::process::Command) -> Spawned {
        let mut child = command
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let said = Arc::new(Mutex::new(Vec::new()));
        let sink = said.clone();
        let reader = std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = stderr.read(&mut buf) {
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Spawned {
            child,
            said,
            reader: Some(reader),
        }
    }

    /// What the process wrote to stderr so far.
    pub fn said(&self) -> String {
        String::from_utf8_lossy(&self.said.lock().unwrap()).into_owned()
    }

    /// The exit status, once it has ended (stderr read to its end).
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.try_wait().unwrap()?;
        self.join_reader();
        Some(status)
    }

    /// Waits for the end; the exit status and all of stderr.
    pub fn wait(mut self) -> (std::process::ExitStatus, String) {
        let status = self.child.wait().unwrap();
        self.join_reader();
        (status, self.said())
    }

    fn join_reader(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
    }
}

/// The `logbus` binary of this build, logging warnings only.
pub fn logbus() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_logbus"));
    c.env("LOGBUS_LOG", "warn");
    c
}
