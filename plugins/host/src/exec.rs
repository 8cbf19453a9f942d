//! `source: exec` — a command's standard output as events, one per line:
//! a long-running command followed as a stream (restarted as the policy
//! says), or a short one run on a schedule. Its standard error goes to
//! LogBus's log. Backpressure: the output is not read while the pipeline
//! is full, so the pipe fills and the command blocks in its writes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use logbus_plugin_api::{
    BuildContext, Bytes, CheckOptions, Event, Meta, OptionError, Output, Source, SourceContext,
    StageError, StageKind, TypedPlugin, async_trait,
};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ExecMode {
    /// Run once and follow its output; restart per `restart`.
    #[default]
    Streaming,
    /// Run to completion every `interval_ms`.
    Scheduled,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Restart {
    /// Restart when it exits with a failure (non-zero, or killed).
    #[default]
    OnFailure,
    Always,
    /// Its exit ends the source.
    Never,
}

/// Options of `source: exec`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecOptions {
    /// The program and its arguments (no shell: use `[sh, -c, "..."]` for one).
    pub command: Vec<String>,
    #[serde(default)]
    pub mode: ExecMode,
    /// `scheduled`: how often to run it.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub interval_ms: Option<u64>,
    /// `streaming`: `on-failure` (default), `always` or `never`.
    #[serde(default)]
    pub restart: Restart,
    /// Wait before a restart.
    #[serde(default = "default_restart_delay")]
    pub restart_delay_ms: u64,
    /// Environment variables added for the command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (relative: to the pipeline file's directory).
    #[serde(default)]
    pub working_dir: Option<PathBuf>,
    /// Longer lines are cut into pieces of this size.
    #[serde(default = "default_max_line")]
    #[schemars(range(min = 1))]
    pub max_line_bytes: usize,
}

fn default_restart_delay() -> u64 {
    1000
}
fn default_max_line() -> usize {
    1 << 20
}

impl CheckOptions for ExecOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if self.command.first().is_none_or(String::is_empty) {
            errors.push(OptionError::at(&["command"], "give the program to run"));
        }
        match (self.mode, self.interval_ms) {
            (ExecMode::Scheduled, None) => errors.push(OptionError::at(
                &["interval_ms"],
                "`mode: scheduled` needs `interval_ms`",
            )),
            (ExecMode::Streaming, Some(_)) => errors.push(OptionError::at(
                &["interval_ms"],
                "applies only with `mode: scheduled`",
            )),
            _ => {}
        }
        if self.max_line_bytes == 0 {
            errors.push(OptionError::at(&["max_line_bytes"], "must be at least 1"));
        }
        errors
    }
}

pub struct Exec;

impl TypedPlugin for Exec {
    type Options = ExecOptions;
    const NAME: &'static str = "exec";
    const KIND: StageKind = StageKind::Source;

    type Stage = Box<dyn Source>;
    const DESCRIPTION: &'static str = "Runs a command and turns each line of its standard output into an event: followed as a stream (with a restart policy) or run on a schedule.";

    /// The program must be found and executable.
    fn host_needs(
        &self,
        o: &ExecOptions,
        _cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        use logbus_plugin_api::{HostNeed, StatedNeed};
        o.command
            .first()
            .map(|name| {
                StatedNeed::new(HostNeed::Program { name: name.clone() }, &["command", "0"])
            })
            .into_iter()
            .collect()
    }

    /// Raw events (one per line or message); a `codec:` parses them.
    fn flow(&self, _options: &ExecOptions) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::raw()
    }

    fn build(&self, options: ExecOptions, cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        let working_dir = options.working_dir.as_ref().map(|d| cx.resolve(d));
        Ok(Box::new(Runner {
            options,
            working_dir,
        }))
    }
}

struct Runner {
    options: ExecOptions,
    working_dir: Option<PathBuf>,
}

/// How one run of the command ended.
enum Ended {
    Exited(std::process::ExitStatus),
    /// The pipeline stopped (shutdown, or downstream gone).
    Stopped,
}

#[async_trait]
impl Source for Runner {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        let o = &self.options;
        let delay = Duration::from_millis(o.restart_delay_ms);
        match o.mode {
            ExecMode::Streaming => loop {
                match self.run_once(&cx).await? {
                    Ended::Stopped => return Ok(()),
                    Ended::Exited(status) => {
                        let failed = !status.success();
                        let again = match o.restart {
                            Restart::Always => true,
                            Restart::OnFailure => failed,
                            Restart::Never => false,
                        };
                        if failed {
                            tracing::warn!(command = ?o.command, "the command exited: {status}");
                        }
                        if !again {
                            return Ok(());
                        }
                        tracing::info!(command = ?o.command, "restarting in {delay:?}");
                        tokio::select! {
                            _ = cx.shutdown.cancelled() => return Ok(()),
                            _ = tokio::time::sleep(delay) => {}
                        }
                    }
                }
            },
            ExecMode::Scheduled => {
                let every = Duration::from_millis(o.interval_ms.unwrap_or(60_000));
                let mut interval = tokio::time::interval(every);
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    tokio::select! {
                        _ = cx.shutdown.cancelled() => return Ok(()),
                        _ = interval.tick() => {}
                    }
                    match self.run_once(&cx).await? {
                        Ended::Stopped => return Ok(()),
                        Ended::Exited(status) if !status.success() => {
                            tracing::warn!(command = ?o.command, "the command exited: {status}");
                        }
                        Ended::Exited(_) => {}
                    }
                }
            }
        }
    }
}

impl Runner {
    async fn run_once(&self, cx: &SourceContext) -> Result<Ended, StageError> {
        let o = &self.options;
        let mut command = tokio::process::Command::new(&o.command[0]);
        command
            .args(&o.command[1..])
            .envs(&o.env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(dir) = &self.working_dir {
            command.current_dir(dir);
        }
        let mut child = command
            .spawn()
            .map_err(|e| StageError::io(format!("starting {:?}", o.command), e))?;
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let name = o.command[0].clone();
        let errors = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::warn!(command = %name, "stderr: {line}");
            }
        });
        let stopped = !forward(stdout, o.max_line_bytes, &cx.output, &cx.id, &cx.shutdown).await;
        if stopped {
            let _ = child.start_kill();
            let _ = child.wait().await;
            errors.abort();
            return Ok(Ended::Stopped);
        }
        let status = child
            .wait()
            .await
            .map_err(|e| StageError::io(format!("waiting for {:?}", o.command), e))?;
        let _ = errors.await;
        Ok(Ended::Exited(status))
    }
}

/// Sends the stream's lines until it ends (`true`) or the pipeline stops
/// (`false`). Lines waiting in the buffer go out together.
async fn forward(
    stream: impl AsyncRead + Unpin,
    max_line: usize,
    output: &Output,
    source: &Arc<str>,
    shutdown: &logbus_plugin_api::CancellationToken,
) -> bool {
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let mut batch = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        let mut piece = (&mut reader).take(max_line as u64);
        let n = tokio::select! {
            _ = shutdown.cancelled() => {
                let _ = output.send(std::mem::take(&mut batch)).await;
                return false;
            }
            // At most one piece per read: a line without an end cannot
            // grow the buffer past `max_line`.
            r = piece.read_until(b'\n', &mut line) => r.unwrap_or(0),
        };
        if n == 0 {
            return output.send(batch).await.is_ok();
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        let meta = Meta::now(source.clone());
        for piece in line.chunks(max_line) {
            batch.push(Event::raw(Bytes::copy_from_slice(piece), meta.clone()));
        }
        if (reader.buffer().is_empty() || batch.len() >= 512)
            && output.send(std::mem::take(&mut batch)).await.is_err()
        {
            return false;
        }
    }
}
