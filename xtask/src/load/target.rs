//! The thing under load: LogBus running a pipeline, or a peer shipper given
//! as a command line. Both are a process with an input the feeder writes
//! and an output the collector reads; only how those are wired differs.

use std::fs::File;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

#[derive(Debug, Clone, PartialEq)]
pub enum Io {
    /// The target reads its stdin and writes committed events to stdout.
    Stdio,
    /// The target listens on `$LOAD_IN_PORT` and connects to
    /// `$LOAD_OUT_PORT`, newline-framed both ways.
    Tcp,
    /// The target reads its stdin and appends committed lines to the file
    /// `$LOAD_OUT_FILE` (a file sink), which the harness follows.
    File,
}

#[derive(Debug, Clone)]
pub enum TargetSpec {
    LogBus {
        binary: PathBuf,
        pipeline: PathBuf,
        /// `--api` on, for per-channel queue depth (polled ten times a
        /// second); off to measure without that load.
        api: bool,
    },
    Peer {
        name: String,
        command: String,
        io: Io,
    },
}

impl TargetSpec {
    pub fn name(&self) -> &str {
        match self {
            TargetSpec::LogBus { .. } => "logbus",
            TargetSpec::Peer { name, .. } => name,
        }
    }

    /// `NAME[@stdio|@tcp|@file]=COMMAND`.
    pub fn parse_peer(spec: &str) -> anyhow::Result<TargetSpec> {
        let Some((head, command)) = spec.split_once('=') else {
            bail!("--peer takes NAME[@stdio|@tcp|@file]=COMMAND, got `{spec}`");
        };
        let (name, io) = match head.split_once('@') {
            None | Some((_, "stdio")) => (head.split('@').next().unwrap_or(head), Io::Stdio),
            Some((name, "tcp")) => (name, Io::Tcp),
            Some((name, "file")) => (name, Io::File),
            Some((_, other)) => {
                bail!("--peer `{head}`: unknown transport `{other}` (stdio, tcp or file)")
            }
        };
        if name.is_empty() || name == "logbus" || command.trim().is_empty() {
            bail!("--peer `{spec}`: needs a name other than `logbus` and a command");
        }
        Ok(TargetSpec::Peer {
            name: name.to_string(),
            command: command.to_string(),
            io,
        })
    }
}

/// A started target.
pub struct Running {
    pub child: Child,
    pub pid: u32,
    pub input: Option<File>,
    pub output: Option<Box<dyn Read + Send>>,
    pub api: Option<String>,
    pub stats_json: Option<PathBuf>,
    /// Set once the target is gone, for outputs with no end of their own
    /// (a followed file).
    pub output_done: Option<Arc<AtomicBool>>,
    stderr_path: PathBuf,
}

impl Running {
    /// Starts the target under `nice -n nice` (when above 0).
    pub fn start(spec: &TargetSpec, work: &Path, tag: &str, nice: u32) -> anyhow::Result<Running> {
        let niced = |program: &Path| {
            if nice > 0 {
                let mut c = Command::new("nice");
                c.arg("-n").arg(nice.to_string()).arg(program);
                c
            } else {
                Command::new(program)
            }
        };
        std::fs::create_dir_all(work)?;
        let stderr_path = work.join(format!("{tag}.stderr"));
        let stderr = File::create(&stderr_path)?;
        match spec {
            TargetSpec::LogBus {
                binary,
                pipeline,
                api: with_api,
            } => {
                let port = free_port()?;
                let api = format!("127.0.0.1:{port}");
                let stats = work.join(format!("{tag}.stats.json"));
                let _ = std::fs::remove_file(&stats);
                let mut command = niced(binary);
                command.arg("run").arg(pipeline);
                if *with_api {
                    command.arg("--api").arg(&api);
                }
                let mut child = command
                    .arg("--stats-json")
                    .arg(&stats)
                    .env("LOGBUS_OUT", "/dev/stdout")
                    .env("LOGBUS_LOG", "warn")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(stderr)
                    .spawn()
                    .with_context(|| format!("starting {}", binary.display()))?;
                let pid = child.id();
                let input = File::from(OwnedFd::from(child.stdin.take().expect("piped")));
                let output: Box<dyn Read + Send> = Box::new(child.stdout.take().expect("piped"));
                let mut running = Running {
                    child,
                    pid,
                    input: Some(input),
                    output: Some(output),
                    api: with_api.then(|| api.clone()),
                    stats_json: Some(stats),
                    output_done: None,
                    stderr_path,
                };
                // Without the API there is nothing to ask; input written
                // early waits in the pipe, charged to the engine.
                running.wait_ready(|| !*with_api || api_answers(&api))?;
                Ok(running)
            }
            TargetSpec::Peer { command, io, .. } => {
                let mut cmd = Command::new("sh");
                if nice > 0 {
                    cmd.arg("-c").arg(format!("exec nice -n {nice} {command}"));
                } else {
                    cmd.arg("-c").arg(format!("exec {command}"));
                }
                cmd.env("LOAD_WORK_DIR", work).stderr(stderr);
                match io {
                    Io::Stdio => {
                        let mut child = cmd
                            .stdin(Stdio::piped())
                            .stdout(Stdio::piped())
                            .spawn()
                            .with_context(|| format!("starting peer `{command}`"))?;
                        let pid = child.id();
                        let input = File::from(OwnedFd::from(child.stdin.take().expect("piped")));
                        let output: Box<dyn Read + Send> =
                            Box::new(child.stdout.take().expect("piped"));
                        Ok(Running {
                            child,
                            pid,
                            input: Some(input),
                            output: Some(output),
                            api: None,
                            stats_json: None,
                            output_done: None,
                            stderr_path,
                        })
                    }
                    Io::File => {
                        let out_file = work.join(format!("{tag}.out"));
                        File::create(&out_file)?;
                        let mut child = cmd
                            .env("LOAD_OUT_FILE", &out_file)
                            .stdin(Stdio::piped())
                            .stdout(Stdio::null())
                            .spawn()
                            .with_context(|| format!("starting peer `{command}`"))?;
                        let pid = child.id();
                        let input = File::from(OwnedFd::from(child.stdin.take().expect("piped")));
                        let done = Arc::new(AtomicBool::new(false));
                        Ok(Running {
                            child,
                            pid,
                            input: Some(input),
                            output: Some(Box::new(Following {
                                file: File::open(&out_file)?,
                                done: done.clone(),
                            })),
                            api: None,
                            stats_json: None,
                            output_done: Some(done),
                            stderr_path,
                        })
                    }
                    Io::Tcp => {
                        let out_listener = TcpListener::bind("127.0.0.1:0")?;
                        let out_port = out_listener.local_addr()?.port();
                        let in_port = free_port()?;
                        let child = cmd
                            .env("LOAD_IN_PORT", in_port.to_string())
                            .env("LOAD_OUT_PORT", out_port.to_string())
                            .stdin(Stdio::null())
                            .stdout(Stdio::null())
                            .spawn()
                            .with_context(|| format!("starting peer `{command}`"))?;
                        let pid = child.id();
                        let mut running = Running {
                            child,
                            pid,
                            input: None,
                            output: Some(Box::new(Accepting::new(out_listener))),
                            api: None,
                            stats_json: None,
                            output_done: None,
                            stderr_path,
                        };
                        let addr = format!("127.0.0.1:{in_port}");
                        let mut stream = None;
                        running.wait_ready(|| match TcpStream::connect(&addr) {
                            Ok(s) => {
                                stream = Some(s);
                                true
                            }
                            Err(_) => false,
                        })?;
                        let stream = stream.expect("connected");
                        stream.set_nodelay(true)?;
                        running.input = Some(File::from(OwnedFd::from(stream)));
                        Ok(running)
                    }
                }
            }
        }
    }

    fn wait_ready(&mut self, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if ready() {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the target exited before it was ready ({status}): {}",
                    self.stderr_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        bail!(
            "the target was not ready within 15 s: {}",
            self.stderr_tail()
        )
    }

    /// Asks the target to stop (SIGTERM), and kills it after 10 s of
    /// grace.
    pub fn terminate(&mut self) -> std::io::Result<()> {
        terminate(&mut self.child, self.pid)
    }

    pub fn stderr_tail(&self) -> String {
        stderr_tail(&self.stderr_path)
    }
}

/// SIGTERM, then a kill after 10 s if it has not ended.
pub fn terminate(child: &mut Child, pid: u32) -> std::io::Result<()> {
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let grace = Instant::now() + Duration::from_secs(10);
    while child.try_wait()?.is_none() {
        if Instant::now() > grace {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The last five lines a target wrote to its stderr file, on one line.
pub fn stderr_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(5).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// The output side of a TCP peer: the first connection the peer makes.
struct Accepting {
    listener: Option<TcpListener>,
    stream: Option<TcpStream>,
}

impl Accepting {
    fn new(listener: TcpListener) -> Accepting {
        Accepting {
            listener: Some(listener),
            stream: None,
        }
    }
}

/// How long a TCP peer has to connect to the harness with its output.
const ACCEPT_WITHIN: Duration = Duration::from_secs(60);

impl Read for Accepting {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.stream.is_none() {
            let Some(listener) = self.listener.take() else {
                return Ok(0);
            };
            listener.set_nonblocking(true)?;
            let deadline = Instant::now() + ACCEPT_WITHIN;
            let stream = loop {
                match listener.accept() {
                    Ok((stream, _)) => break stream,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            return Err(std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                "the peer never connected to LOAD_OUT_PORT",
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => return Err(e),
                }
            };
            stream.set_nonblocking(false)?;
            self.stream = Some(stream);
        }
        self.stream.as_mut().expect("accepted").read(buf)
    }
}

/// The output side of a file peer: follows the file as it grows, and ends
/// at end of file once the target is gone. Polls every millisecond, which
/// bounds the latency it adds.
struct Following {
    file: File,
    done: Arc<AtomicBool>,
}

impl Read for Following {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.file.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if self.done.load(Ordering::Relaxed) {
                // One last look: the target may have written just before.
                return self.file.read(buf);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn api_answers(addr: &str) -> bool {
    TcpStream::connect(addr).is_ok()
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Resident set size of a live process (a zombie has none).
pub fn proc_rss(pid: u32) -> Option<u64> {
    proc_status_bytes(pid, "VmRSS:")
}

/// The most a live process has had resident since it started (the
/// kernel's high-water mark), so a peak between two samples is not missed.
pub fn proc_peak_rss(pid: u32) -> Option<u64> {
    proc_status_bytes(pid, "VmHWM:")
}

fn proc_status_bytes(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// CPU seconds (user + system) of a process, exited-but-unreaped included.
pub fn proc_cpu(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line.
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let ticks = rustix::param::clock_ticks_per_second().max(1) as f64;
    Some((utime + stime) / ticks)
}

/// Running and not a zombie.
pub fn proc_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = stat[stat.rfind(')')? + 2..].to_string();
            after.chars().next()
        })
        .is_some_and(|state| state != 'Z' && state != 'X')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_with_and_without_a_transport() {
        let TargetSpec::Peer { name, io, command } =
            TargetSpec::parse_peer("rsyslog@tcp=xtask/peers/rsyslog/run.sh").unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (name.as_str(), io, command.as_str()),
            ("rsyslog", Io::Tcp, "xtask/peers/rsyslog/run.sh")
        );
        let TargetSpec::Peer { name, io, .. } =
            TargetSpec::parse_peer("vector=vector -c v.toml").unwrap()
        else {
            panic!()
        };
        assert_eq!((name.as_str(), io), ("vector", Io::Stdio));
        let TargetSpec::Peer { io, .. } = TargetSpec::parse_peer("f@file=cmd").unwrap() else {
            panic!()
        };
        assert_eq!(io, Io::File);
        for bad in ["novalue", "x@udp=cmd", "logbus=cmd", "=cmd", "x= "] {
            assert!(TargetSpec::parse_peer(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn this_process_reports_its_own_usage() {
        let me = std::process::id();
        assert!(proc_rss(me).unwrap() > 1024 * 1024);
        assert!(proc_cpu(me).unwrap() >= 0.0);
        assert!(proc_alive(me));
        // A child that exited but is not reaped: no RSS, not alive, CPU known.
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        while proc_alive(pid) {
            std::thread::yield_now();
        }
        assert_eq!(proc_rss(pid), None);
        assert!(proc_cpu(pid).is_some());
        child.wait().unwrap();
        assert!(!proc_alive(pid));
    }
}
