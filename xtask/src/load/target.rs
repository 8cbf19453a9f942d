//! The thing under load: LogBus running a pipeline, or a peer shipper given
//! as a command line. Both are a process with an input the feeder writes
//! and an output the collector reads; only how those are wired differs.

use std::fs::File;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

#[derive(Debug, Clone, PartialEq)]
pub enum Io {
    /// The target reads its stdin and writes committed events to stdout.
    Stdio,
    /// The target listens on `$LOAD_IN_PORT` and connects to
    /// `$LOAD_OUT_PORT`, newline-framed both ways.
    Tcp,
}

#[derive(Debug, Clone)]
pub enum TargetSpec {
    LogBus {
        binary: PathBuf,
        pipeline: PathBuf,
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

    /// `NAME[@stdio|@tcp]=COMMAND`.
    pub fn parse_peer(spec: &str) -> anyhow::Result<TargetSpec> {
        let Some((head, command)) = spec.split_once('=') else {
            bail!("--peer takes NAME[@stdio|@tcp]=COMMAND, got `{spec}`");
        };
        let (name, io) = match head.split_once('@') {
            None | Some((_, "stdio")) => (head.split('@').next().unwrap_or(head), Io::Stdio),
            Some((name, "tcp")) => (name, Io::Tcp),
            Some((_, other)) => {
                bail!("--peer `{head}`: unknown transport `{other}` (stdio or tcp)")
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
    stderr_path: PathBuf,
}

impl Running {
    pub fn start(spec: &TargetSpec, work: &Path, tag: &str) -> anyhow::Result<Running> {
        std::fs::create_dir_all(work)?;
        let stderr_path = work.join(format!("{tag}.stderr"));
        let stderr = File::create(&stderr_path)?;
        match spec {
            TargetSpec::LogBus { binary, pipeline } => {
                let port = free_port()?;
                let api = format!("127.0.0.1:{port}");
                let stats = work.join(format!("{tag}.stats.json"));
                let _ = std::fs::remove_file(&stats);
                let mut child = Command::new(binary)
                    .arg("run")
                    .arg(pipeline)
                    .arg("--api")
                    .arg(&api)
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
                    api: Some(api.clone()),
                    stats_json: Some(stats),
                    stderr_path,
                };
                running.wait_ready(|| api_answers(&api))?;
                Ok(running)
            }
            TargetSpec::Peer { command, io, .. } => {
                let mut cmd = Command::new("sh");
                cmd.arg("-c").arg(format!("exec {command}"));
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

    pub fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(5).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
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

impl Read for Accepting {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.stream.is_none() {
            let Some(listener) = self.listener.take() else {
                return Ok(0);
            };
            let (stream, _) = listener.accept()?;
            self.stream = Some(stream);
        }
        self.stream.as_mut().expect("accepted").read(buf)
    }
}

fn api_answers(addr: &str) -> bool {
    TcpStream::connect(addr).is_ok()
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Resident set size and CPU seconds (user + system) of a process.
pub fn proc_usage(pid: u32) -> Option<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line.
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let ticks = rustix::param::clock_ticks_per_second().max(1) as f64;
    Some((rss_kib * 1024, (utime + stime) / ticks))
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
        for bad in ["novalue", "x@udp=cmd", "logbus=cmd", "=cmd", "x= "] {
            assert!(TargetSpec::parse_peer(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn this_process_reports_its_own_usage() {
        let (rss, cpu) = proc_usage(std::process::id()).unwrap();
        assert!(rss > 1024 * 1024);
        assert!(cpu >= 0.0);
    }
}
