//! The `logbus` command: the edge where configuration, signals and exit
//! codes meet the engine. Everything with logic lives in the libraries.

use logbus::catalog;
mod allocator;
mod huge_pages;
mod plugins_cmd;
mod queue_cmd;
mod test_cmd;
mod top_cmd;
mod validate_cmd;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use logbus_core::{Diagnostic, Loaded, graph, load_file};
use logbus_plugin_api::CancellationToken;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "logbus",
    version,
    about = "YAML-defined log and event pipelines with backpressure by construction"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum OutputFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum TestFormat {
    Text,
    Junit,
}

#[derive(Clone, Copy, ValueEnum)]
enum GraphFormat {
    Dot,
    Text,
}

#[derive(Subcommand)]
enum Command {
    /// Check pipelines without running them: files, or directories (every
    /// `*.yml`/`*.yaml` in them but `*.test.yml`). Exit 0 all valid, 1 one
    /// invalid, 2 one unreadable (docs/validation.md).
    Validate {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Treat warnings as errors.
        #[arg(long)]
        deny_warnings: bool,
        /// Also warn about each field read that no stage declares, where a
        /// stage (a JSON parser, a script) leaves the fields open.
        #[arg(long)]
        strict_fields: bool,
        /// Print the fields known at each stage's output, with their types
        /// and the stage that set each.
        #[arg(long)]
        fields: bool,
        /// Also check the host: input files readable, output and state
        /// directories writable, listen addresses free, TLS files, programs,
        /// the open-file limit (run it on the host, before start).
        #[arg(long)]
        preflight: bool,
        /// Also reach each stage's service with its credentials, read-only:
        /// Kafka brokers and topics, OpenSearch, the ClickHouse table and
        /// its columns (against the fields that arrive), S3 buckets,
        /// CloudWatch groups, OTLP endpoints.
        #[arg(long)]
        connect: bool,
        /// How long each service may take to answer `--connect`, in
        /// seconds.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
        connect_timeout: u64,
        #[arg(long, value_enum, default_value_t = validate_cmd::ValidateFormat::Text)]
        format: validate_cmd::ValidateFormat,
    },
    /// Validate, then run a pipeline until its sources end or SIGINT/SIGTERM.
    Run {
        file: PathBuf,
        /// Write the reconciliation summary as JSON to this file at exit.
        #[arg(long)]
        stats_json: Option<PathBuf>,
        /// Serve the HTTP API (metrics, stats, graph, reload) on this address;
        /// overrides `settings.api.listen`. A non-loopback address needs a
        /// token (`settings.api.token` or LOGBUS_API_TOKEN).
        #[arg(long)]
        api: Option<String>,
        /// Runtime worker threads (overrides `settings.threads`; default:
        /// one per CPU core).
        #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=logbus_core::MAX_THREADS as u64))]
        threads: Option<usize>,
        /// Exit 1 when any event errored, or when sources emitted events
        /// and no sink committed one (a CI smoke run must not pass then).
        #[arg(long)]
        fail_on_errored: bool,
    },
    /// Print the pipeline's DAG.
    Graph {
        file: PathBuf,
        #[arg(long, value_enum, default_value_t = GraphFormat::Text)]
        format: GraphFormat,
    },
    /// Run pipelines' unit tests (`tests:` in FILE and FILE's `.test.yml`);
    /// a directory runs every pipeline in it that has tests. Exit 0 when
    /// all pass, 1 on a failure or an invalid file, 2 unreadable.
    Test {
        /// Pipeline files or directories, then (optionally) the names of
        /// the tests to run: the arguments after the last one that exists
        /// on disk are test names.
        #[arg(required = true, value_name = "FILE|DIR... [NAME...]")]
        args: Vec<PathBuf>,
        #[arg(long, value_enum, default_value_t = TestFormat::Text)]
        format: TestFormat,
    },
    /// Live stats of a running pipeline in the terminal, from its API: give
    /// the pipeline FILE (its `settings.api`) or `--api ADDR`.
    Top {
        file: Option<PathBuf>,
        #[arg(long)]
        api: Option<String>,
        /// Print one frame as text and exit.
        #[arg(long)]
        once: bool,
    },
    /// Print the JSON Schema of a pipeline file for this build's plugins
    /// (for editor completion; see docs/editor.md).
    Schema,
    /// List the plugins compiled into this binary, with their options.
    Plugins {
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Print FILE in the canonical layout (comments kept). `--write`
    /// rewrites it; `--check` exits 1 if it is not formatted. Exit 2 when
    /// it cannot be read or parsed.
    Fmt {
        /// Files, or directories (every `*.yml`/`*.yaml` in them).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long, conflicts_with = "check")]
        write: bool,
        #[arg(long)]
        check: bool,
    },
    /// Look at a durable queue's directory (`<queue.path>/<stage id>`).
    Queue {
        #[command(subcommand)]
        command: QueueCommand,
    },
}

#[derive(Subcommand)]
enum QueueCommand {
    /// Segments, record counts, bytes, reader and writer positions.
    Inspect { dir: PathBuf },
    /// Verify every record's checksum. Exit 0 clean, 1 damaged.
    Check {
        dir: PathBuf,
        /// Rewrite damaged segments and the state so the queue checks clean
        /// (keeps every valid unacknowledged record; the queue must not be
        /// running).
        #[arg(long)]
        repair: bool,
    },
}

fn main() -> ExitCode {
    huge_pages::limit();
    allocator::tune();
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("logbus: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LOGBUS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_target(false).init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    let registry = catalog::registry();
    match command {
        Command::Validate {
            files,
            deny_warnings,
            strict_fields,
            fields,
            preflight,
            connect,
            connect_timeout,
            format,
        } => Ok(validate_cmd::run(
            &files,
            &validate_cmd::ValidateArgs {
                deny_warnings,
                preflight,
                connect: connect.then(|| std::time::Duration::from_secs(connect_timeout)),
                strict_fields,
                fields,
                format,
            },
        )),
        Command::Run {
            file,
            stats_json,
            api,
            threads,
            fail_on_errored,
        } => {
            let Some(loaded) = load_or_report(&file, &registry) else {
                return Ok(ExitCode::from(2));
            };
            print_diagnostics(&file, &loaded.diagnostics);
            let Some(pipeline) = loaded.pipeline else {
                eprintln!("logbus: {} is invalid; nothing was started", file.display());
                return Ok(ExitCode::from(1));
            };
            let api = match api {
                Some(listen) => Some(logbus_core::ApiSettings {
                    listen,
                    token: pipeline
                        .settings
                        .api
                        .as_ref()
                        .and_then(|a| a.token.clone())
                        .or_else(|| std::env::var("LOGBUS_API_TOKEN").ok()),
                    allowed_hosts: pipeline
                        .settings
                        .api
                        .as_ref()
                        .map(|a| a.allowed_hosts.clone())
                        .unwrap_or_default(),
                }),
                None => pipeline.settings.api.clone(),
            };
            if let Some(errors) = api.as_ref().map(|a| a.check()).filter(|e| !e.is_empty()) {
                for e in errors {
                    // The token may come from LOGBUS_API_TOKEN: name the key.
                    eprintln!("logbus: error: --api: {}: {}", e.path.join("."), e.message);
                }
                return Ok(ExitCode::from(1));
            }
            let threads = threads.or(pipeline.settings.threads);
            run(
                pipeline,
                stats_json.as_deref(),
                api,
                threads,
                fail_on_errored,
            )
        }
        Command::Graph { file, format } => {
            let Some(loaded) = load_or_report(&file, &registry) else {
                return Ok(ExitCode::from(2));
            };
            print_diagnostics(&file, &loaded.diagnostics);
            let Some(pipeline) = loaded.pipeline else {
                return Ok(ExitCode::from(1));
            };
            let out = match format {
                GraphFormat::Dot => graph::to_dot(&pipeline),
                GraphFormat::Text => graph::to_text(&pipeline),
            };
            emit(&out);
            Ok(ExitCode::SUCCESS)
        }
        Command::Test { args, format } => {
            let first_name = args
                .iter()
                .skip(1)
                .position(|a| !a.exists())
                .map_or(args.len(), |i| i + 1);
            let names: Vec<String> = args[first_name..]
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let files = match test_cmd::files_with_tests(&args[..first_name]) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("logbus: error: {e}");
                    return Ok(ExitCode::from(2));
                }
            };
            let mut worst = 0u8;
            for file in files {
                let code = test_one(&registry, file, &names, format)?;
                worst = worst.max(code);
            }
            Ok(ExitCode::from(worst))
        }
        Command::Top { file, api, once } => {
            let from_file = match &file {
                Some(f) => {
                    let Some(loaded) = load_or_report(f, &registry) else {
                        return Ok(ExitCode::from(2));
                    };
                    loaded.pipeline.and_then(|p| p.settings.api)
                }
                None => None,
            };
            let token = from_file
                .as_ref()
                .and_then(|a| a.token.clone())
                .or_else(|| std::env::var("LOGBUS_API_TOKEN").ok());
            let Some(addr) = api.or(from_file.map(|a| a.listen)) else {
                eprintln!(
                    "logbus: error: give --api ADDR, or a pipeline FILE with `settings.api.listen`"
                );
                return Ok(ExitCode::from(2));
            };
            top_cmd::run(&addr, token.as_deref(), once)
        }
        Command::Schema => {
            let schema = logbus_core::schema::pipeline_schema(&registry);
            emit(&format!("{}\n", serde_json::to_string_pretty(&schema)?));
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugins { format } => {
            plugins_cmd::print(&registry, format == OutputFormat::Json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Fmt {
            files,
            write,
            check,
        } => {
            let files = match validate_cmd::yaml_files(&files) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("logbus: error: {e}");
                    return Ok(ExitCode::from(2));
                }
            };
            let mut worst = 0u8;
            for file in &files {
                worst = worst.max(fmt_file(file, write, check)?);
            }
            Ok(ExitCode::from(worst))
        }
        Command::Queue { command } => match command {
            QueueCommand::Inspect { dir } => queue_cmd::inspect(&dir),
            QueueCommand::Check { dir, repair } => queue_cmd::check(&dir, repair),
        },
    }
}

/// One pipeline's tests; its exit code.
fn test_one(
    registry: &logbus_plugin_api::Registry,
    file: PathBuf,
    names: &[String],
    format: TestFormat,
) -> anyhow::Result<u8> {
    // `demo.test.yml` is the test file of `demo.yml`: run those.
    let file = match test_cmd::pipeline_of_test_file(&file) {
        Some(pipeline) => {
            eprintln!(
                "logbus: {} holds the tests of {}; running them",
                file.display(),
                pipeline.display()
            );
            pipeline
        }
        None => file,
    };
    let Some(loaded) = load_or_report(&file, registry) else {
        return Ok(2);
    };
    print_diagnostics(&file, &loaded.diagnostics);
    let Some(pipeline) = loaded.pipeline else {
        eprintln!("logbus: {} is invalid; no test was run", file.display());
        return Ok(1);
    };
    let code = test_cmd::run(&file, &pipeline, names, format == TestFormat::Junit)?;
    Ok(if code == ExitCode::SUCCESS { 0 } else { 1 })
}

/// `logbus fmt` of one file: 0 formatted (or written), 1 not formatted
/// (`--check`), 2 unreadable.
fn fmt_file(file: &Path, write: bool, check: bool) -> anyhow::Result<u8> {
    let text = match logbus_core::config::read_text(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("logbus: {e}");
            return Ok(2);
        }
    };
    let formatted = match logbus_core::fmt::format(&text) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return Ok(2);
        }
    };
    if check {
        if formatted == text {
            return Ok(0);
        }
        eprintln!(
            "{}: not formatted (run `logbus fmt --write`)",
            file.display()
        );
        return Ok(1);
    }
    if write {
        if formatted != text {
            let tmp = file.with_extension("yml.fmt-tmp");
            std::fs::write(&tmp, &formatted)
                .and_then(|()| std::fs::rename(&tmp, file))
                .with_context(|| format!("writing {}", file.display()))?;
        }
        return Ok(0);
    }
    emit(&formatted);
    Ok(0)
}

fn load_or_report(file: &Path, registry: &logbus_plugin_api::Registry) -> Option<Loaded> {
    match load_file(file, registry) {
        Ok(loaded) => Some(loaded),
        Err(e) => {
            eprintln!("logbus: error: {e}");
            None
        }
    }
}

fn print_diagnostics(file: &Path, diagnostics: &[Diagnostic]) {
    let name = file.display().to_string();
    for d in diagnostics {
        eprintln!("{}", d.display(&name));
    }
}

/// The stage ids of each chain `run` will fuse (docs/configuration.md).
pub(crate) fn fused_chains(p: &logbus_core::Pipeline) -> Vec<Vec<String>> {
    p.fused_chains()
        .iter()
        .map(|c| c.iter().map(|s| s.id.clone()).collect())
        .collect()
}

/// Stack for each runtime thread. Parsers accept nesting up to 128 levels
/// and the recursive conversions after them need room for that, with a
/// wide margin in unoptimised builds (whose frames are many times larger).
/// Only the pages a thread touches are resident.
pub(crate) const WORKER_STACK_BYTES: usize = 32 << 20;

fn run(
    pipeline: logbus_core::Pipeline,
    stats_json: Option<&Path>,
    api: Option<logbus_core::ApiSettings>,
    threads: Option<usize>,
    fail_on_errored: bool,
) -> anyhow::Result<ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .enable_all()
        .thread_name("logbus-worker")
        .thread_stack_size(WORKER_STACK_BYTES);
    if let Some(n) = threads {
        builder.worker_threads(n);
    }
    let runtime = builder.build().context("starting the runtime")?;
    let report = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let running_stats = Arc::new(std::sync::OnceLock::new());
        spawn_signal_handler(shutdown.clone(), running_stats.clone());
        let bound = pipeline.inflight_bound();
        tracing::info!(
            stages = pipeline.stages.len(),
            inflight_bound = bound.events,
            "starting {}",
            pipeline.path.display()
        );
        let listener = match &api {
            Some(a) => match tokio::net::TcpListener::bind(&a.listen).await {
                Ok(l) => Some(l),
                Err(e) => return Err(vec![format!("cannot listen on {}: {e}", a.listen)]),
            },
            None => None,
        };
        match logbus_core::start(&pipeline, shutdown) {
            Ok(running) => {
                let _ = running_stats.set(running.stats());
                spawn_reload_handler(pipeline.path.clone(), running.reloader());
                if let (Some(listener), Some(api)) = (listener, api) {
                    spawn_api(listener, api, &pipeline, &running);
                }
                Ok(running.wait().await)
            }
            Err(errors) => Err(errors.iter().map(ToString::to_string).collect()),
        }
    });
    let report = match report {
        Ok(r) => r,
        Err(errors) => {
            for e in errors {
                eprintln!("logbus: error: {e}");
            }
            return Ok(ExitCode::from(1));
        }
    };
    // Stages may have left reader threads blocked on input; do not wait for them.
    runtime.shutdown_background();
    eprint!("{report}");
    if let Some(path) = stats_json {
        let json = serde_json::to_vec_pretty(&report).expect("serialisable");
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    let _ = std::io::stderr().flush();
    let t = report.totals;
    let smoke_failed = fail_on_errored && (t.errored > 0 || (t.emitted > 0 && t.committed == 0));
    if smoke_failed {
        eprintln!(
            "logbus: --fail-on-errored: {} event(s) errored, {} of {} committed",
            t.errored, t.committed, t.emitted
        );
    }
    Ok(if report.is_clean() && !smoke_failed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Re-reads and validates the file; applies it if valid. `Err` says why not
/// (every diagnostic), and the running pipeline is then untouched.
async fn reload_from_file(
    file: &Path,
    reloader: &logbus_core::Reloader,
) -> Result<logbus_core::ReloadSummary, String> {
    let registry = catalog::registry();
    let loaded = load_file(file, &registry).map_err(|e| e.to_string())?;
    let name = file.display().to_string();
    match loaded.pipeline {
        Some(pipeline) => reloader.reload(pipeline).await.map_err(|e| e.to_string()),
        None => Err(loaded
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| d.display(&name).to_string())
            .collect::<Vec<_>>()
            .join("\n")),
    }
}

/// SIGHUP: reload from the file (the supervisor logs the outcome).
fn spawn_reload_handler(file: PathBuf, reloader: logbus_core::Reloader) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot install the SIGHUP handler; reload is unavailable");
        return;
    };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading {}", file.display());
            if let Err(why) = reload_from_file(&file, &reloader).await {
                tracing::warn!("reload refused, pipeline unchanged: {why}");
            }
        }
    });
}

fn spawn_api(
    listener: tokio::net::TcpListener,
    api: logbus_core::ApiSettings,
    pipeline: &logbus_core::Pipeline,
    running: &logbus_core::RunningPipeline,
) {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or(api.listen.clone());
    if api.token.is_some() && !addr.starts_with("127.") && !addr.starts_with("[::1]") {
        tracing::warn!("the API on {addr} is served without TLS; put a TLS proxy in front");
    }
    let (file, reloader) = (pipeline.path.clone(), running.reloader());
    let state = logbus_api::ApiState::new(
        running.stats(),
        std::sync::Arc::new(move || {
            let (file, reloader) = (file.clone(), reloader.clone());
            Box::pin(async move {
                let summary = reload_from_file(&file, &reloader).await?;
                serde_json::to_value(summary).map_err(|e| e.to_string())
            })
        }),
        api.token,
        api.allowed_hosts,
    );
    tracing::info!("API listening on http://{addr}");
    tokio::spawn(async move {
        if let Err(e) = logbus_api::serve(listener, state).await {
            tracing::error!("the API stopped: {e}");
        }
    });
}

/// First SIGINT/SIGTERM: stop the sources and drain. Second: exit now.
/// The handlers are installed before this returns, so a signal that comes
/// right after start-up is handled, not fatal.
///
/// The signals are waited for on a thread of their own, with a small
/// runtime of its own: stages run on the engine's workers, and a stage
/// that holds one for long (a script with `timeout_ms: 60000`, every
/// worker busy) kept a handler spawned there from running at all, so the
/// second signal went unheard for a minute (issue 54).
///
/// Before exiting at the second signal, disk-assisted queues with
/// `save_on_shutdown` write their memory backlog to disk (for at most ten
/// seconds).
fn spawn_signal_handler(
    shutdown: CancellationToken,
    running: Arc<std::sync::OnceLock<logbus_core::StatsHandle>>,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        tracing::warn!("cannot start the signal thread; SIGINT/SIGTERM will kill without draining");
        return;
    };
    let handlers = {
        let _entered = runtime.enter();
        (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        )
    };
    let (Ok(mut term), Ok(mut int)) = handlers else {
        tracing::warn!("cannot install signal handlers; SIGINT/SIGTERM will kill without draining");
        return;
    };
    let listening = std::thread::Builder::new()
        .name("logbus-signals".into())
        .spawn(move || {
            runtime.block_on(async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                tracing::info!(
                    "shutdown requested: stopping sources and draining (signal again to exit at once)"
                );
                shutdown.cancel();
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                eprintln!("logbus: second signal, exiting without draining");
                if let Some(stats) = running.get() {
                    let save = stats.save_queue_backlogs();
                    match tokio::time::timeout(std::time::Duration::from_secs(10), save).await {
                        Ok(saved) => eprintln!(
                            "logbus: {saved} queued events saved to disk queues for the next run"
                        ),
                        Err(_) => {
                            eprintln!("logbus: saving queue backlogs took over 10 s; exiting anyway")
                        }
                    }
                }
                std::process::exit(130);
            })
        });
    if let Err(e) = listening {
        tracing::warn!(
            "cannot start the signal thread ({e}); SIGINT/SIGTERM will kill without draining"
        );
    }
}

/// Writes to stdout; a closed pipe (`logbus plugins | head`) is not an error.
pub(crate) fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}
