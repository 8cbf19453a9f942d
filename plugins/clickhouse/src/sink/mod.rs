//! `sink: clickhouse` — batched RowBinary inserts over the `clickhouse`
//! crate's HTTP client (LZ4 by default), on the sink core. An event is
//! committed, and acknowledged to its source, once the insert holding it
//! was accepted.
//!
//! At start the column mapping is checked against `DESCRIBE TABLE`: a
//! mapped column the table lacks, a type the mapping states that differs
//! from the table's, or a type LogBus cannot write fails the stage naming
//! the column. Rows are encoded for the table's own types (`types.rs`); a
//! value that does not fit is that event's error (`<id>.dead`, the column
//! named). When the server refuses an insert for its data (a constraint,
//! a value it cannot take), the batch is split in halves and retried until
//! the refused rows are alone: they go to `<id>.dead` with the server's
//! message, every other row is stored. Network errors, timeouts and the
//! server's transient errors retry the insert whole.

use std::collections::BTreeMap;
use std::time::Duration;

use logbus_plugin_api::connect::{self, ArrivingFields, ConnectContext, Probe, ServiceFinding};
use logbus_plugin_api::{
    BuildContext, CheckOptions, FieldPath, OptionError, Sink, SinkContext, StageError, StageKind,
    TypedPlugin, async_trait,
};
use logbus_sink::{
    Attempt, BatchDefaults, Batching, Driver, DriverConfig, Journaling, OnRejected, Retried,
    RetryDefaults, Retrying, check_requests, error_chain,
};
use serde::Deserialize;

mod insert;

use insert::{ClickHouseService, Failure, RowEncoder};

use crate::types::ColumnType;

/// One column of the mapping: the field it takes (shorthand: just the
/// field), and optionally the type the user expects the table to have.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum ColumnSpec {
    Field(String),
    Full {
        #[serde(default)]
        field: Option<String>,
        #[serde(default, rename = "type")]
        kind: Option<String>,
    },
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum InsertCompression {
    None,
    /// ClickHouse's own LZ4 framing (`decompress=1`).
    #[default]
    Lz4,
}

/// Options of `sink: clickhouse`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClickHouseSinkOptions {
    /// The HTTP interface: `http://host:8123`, or `https://host:8443`.
    pub url: String,
    /// For `https://`: `{ ca_file: ... }` trusts a private CA instead of
    /// the built-in Mozilla roots.
    #[serde(default)]
    pub tls: Option<logbus_tls::ClientTls>,
    #[serde(default = "default_database")]
    pub database: String,
    pub table: String,
    /// Column name → the field it takes (`{ field, type }` to also state
    /// the type the table must have). Unset: every column of the table,
    /// from the field of its name.
    #[serde(default)]
    pub columns: Option<BTreeMap<String, ColumnSpec>>,
    #[serde(default)]
    pub username: Option<String>,
    /// The environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
    /// `lz4` (default) or `none`.
    #[serde(default)]
    pub compression: InsertCompression,
    #[serde(flatten)]
    pub batching: Batching<ClickHouseDefaults>,
    /// Most time to send an insert and for the server to answer it.
    #[serde(default = "default_request_timeout")]
    #[schemars(range(min = 1))]
    pub request_timeout_ms: u64,
    #[serde(flatten)]
    pub retrying: Retrying<ClickHouseDefaults>,
    /// Most inserts waiting for an answer at once.
    #[serde(default = "default_in_flight")]
    #[schemars(range(min = 1, max = 64))]
    pub in_flight: usize,
    #[serde(default)]
    pub on_rejected: OnRejected,
    /// Send an `insert_deduplication_token` with each insert, the same on
    /// every retry of it: an insert the server stored but whose answer
    /// was lost is not stored twice when it is sent again. With
    /// `batch_journal_dir` the token is the batch's name, the same after
    /// a crash: effectively once from a source that names its events by
    /// position. Needs a `Replicated*MergeTree` table or a `MergeTree`
    /// with `non_replicated_deduplication_window` (checked at start), and
    /// a server of 22.2 or later.
    #[serde(default)]
    pub deduplicate: bool,
    #[serde(flatten)]
    pub journaling: Journaling,
}

fn default_database() -> String {
    "default".into()
}
fn default_request_timeout() -> u64 {
    30_000
}
fn default_in_flight() -> usize {
    2
}

/// A name ClickHouse takes unquoted or in backquotes.
fn identifier(name: &str) -> String {
    format!("`{}`", name.replace('\\', "\\\\").replace('`', "\\`"))
}

/// `sink: clickhouse`'s own batch and retry defaults.
pub struct ClickHouseDefaults;

impl BatchDefaults for ClickHouseDefaults {
    const BATCH_MAX_EVENTS: usize = 10_000;
    const BATCH_MAX_BYTES: usize = 16 << 20;
    const BATCH_TIMEOUT_MS: u64 = 1000;
}

impl RetryDefaults for ClickHouseDefaults {}

impl CheckOptions for ClickHouseSinkOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        match self.url.split_once("://") {
            Some(("http" | "https", rest)) if !rest.is_empty() => {}
            _ => errors.push(OptionError::at(
                &["url"],
                format!("`{}` is not an http:// or https:// URL", self.url),
            )),
        }
        if self.tls.as_ref().is_some_and(|t| t.server_name.is_some()) {
            errors.push(OptionError::at(
                &["tls", "server_name"],
                "the URL's host is the name verified",
            ));
        }
        if self.table.is_empty() {
            errors.push(OptionError::at(&["table"], "must not be empty"));
        }
        for (name, spec) in self.columns.iter().flatten() {
            let (field, kind) = match spec {
                ColumnSpec::Field(f) => (Some(f.as_str()), None),
                ColumnSpec::Full { field, kind } => (field.as_deref(), kind.as_deref()),
            };
            if let Err(e) = FieldPath::parse(field.unwrap_or(name)) {
                errors.push(OptionError::at(&["columns", name], e.to_string()));
            }
            if let Some(kind) = kind
                && let Err(e) = ColumnType::parse(kind)
            {
                errors.push(OptionError::at(&["columns", name, "type"], e));
            }
        }
        if self.columns.as_ref().is_some_and(|c| c.is_empty()) {
            errors.push(OptionError::at(
                &["columns"],
                "names no column (leave it out to take every column of the table)",
            ));
        }
        if self.password_env.is_some() && self.username.is_none() {
            errors.push(OptionError::at(&["password_env"], "needs `username`"));
        }
        errors.extend(self.batching.check());
        errors.extend(self.retrying.check());
        errors.extend(self.journaling.check());
        if self.journaling.batch_journal_dir.is_some() && !self.deduplicate {
            errors.push(OptionError::at(
                &["batch_journal_dir"],
                "names batches for `deduplicate: true`, which is not set",
            ));
        }
        errors.extend(check_requests(self.request_timeout_ms, self.in_flight, 64));
        errors
    }
}

pub struct ClickHouseSink;

impl TypedPlugin for ClickHouseSink {
    type Options = ClickHouseSinkOptions;
    const NAME: &'static str = "clickhouse";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "ClickHouse: batched RowBinary inserts (LZ4) with a column mapping checked against DESCRIBE TABLE at start; values that do not fit and rows the server refuses (found by splitting the batch) to <id>.dead, the rest stored.";

    /// The CA file, the variable the password comes from, the journal's
    /// directory.
    fn host_needs(
        &self,
        o: &Self::Options,
        cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        use logbus_plugin_api::StatedNeed;
        let ca = o.tls.as_ref().and_then(|t| t.ca_file.as_deref());
        StatedNeed::client_ca(ca, cx)
            .into_iter()
            .chain(StatedNeed::secret_env(
                o.password_env.as_deref(),
                "password_env",
            ))
            .chain(o.journaling.host_need(cx))
            .collect()
    }

    /// Events pass through untouched; with `deduplicate` and a batch
    /// journal, a re-sent batch carries the token it had, so the server
    /// drops it.
    fn flow(&self, o: &Self::Options) -> logbus_plugin_api::Flow {
        let flow = logbus_plugin_api::Flow::pass();
        if o.deduplicate && o.journaling.batch_journal_dir.is_some() {
            flow.then(logbus_plugin_api::Step::NamesByPosition {
                option: vec!["deduplicate".into(), "batch_journal_dir".into()],
            })
        } else {
            flow
        }
    }

    fn build(&self, options: Self::Options, cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(writer(options, cx)?))
    }

    /// `DESCRIBE TABLE` with the stage's credentials, the mapping checked
    /// as the stage checks it at start, and each column's field against
    /// what the flow analysis knows arrives.
    fn connect(&self, options: &Self::Options, cx: ConnectContext) -> Option<Probe> {
        let bcx = cx.build_context();
        let options = options.clone();
        Some(Box::pin(async move {
            match writer(options, &bcx) {
                Ok(w) => w.probe(&cx.arriving).await,
                Err(e) => vec![ServiceFinding::setup(e)],
            }
        }))
    }
}

/// The stage's writer: the client with its TLS and credentials, the
/// mapping as stated (checked against the table at start).
fn writer(
    options: ClickHouseSinkOptions,
    cx: &BuildContext,
) -> Result<ClickHouseWriter, OptionError> {
    let tls = options.tls.clone().unwrap_or_default();
    let tls = tls.config(&cx.base_dir).map_err(|e| {
        let key: &[&str] = match tls.ca_file {
            Some(_) => &["tls", "ca_file"],
            None => &["tls"],
        };
        OptionError::at(key, e.to_string())
    })?;
    // Idle connections dropped after 2 s, as the crate's own client.
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(2))
        .build(connector(tls));
    let mut client = clickhouse::Client::with_http_client(http)
        .with_url(&options.url)
        .with_database(&options.database)
        .with_compression(match options.compression {
            InsertCompression::None => clickhouse::Compression::None,
            InsertCompression::Lz4 => clickhouse::Compression::Lz4,
        });
    if let Some(user) = &options.username {
        client = client.with_user(user);
    }
    if let Some(var) = &options.password_env {
        let password = std::env::var(var).map_err(|_| {
            OptionError::at(
                &["password_env"],
                format!("the environment variable `{var}` is not set (or not UTF-8)"),
            )
        })?;
        client = client.with_password(password);
    }
    let mapping: Vec<Mapped> = options
        .columns
        .iter()
        .flatten()
        .map(|(name, spec)| {
            let (field, stated) = match spec {
                ColumnSpec::Field(f) => (Some(f.clone()), None),
                ColumnSpec::Full { field, kind } => (field.clone(), kind.clone()),
            };
            Mapped {
                name: name.clone(),
                field,
                stated,
            }
        })
        .collect();
    let config = DriverConfig {
        limits: options.batching.limits(),
        retry: options.retrying.policy(),
        in_flight: options.in_flight,
        on_rejected: options.on_rejected,
        destination: format!(
            "ClickHouse {} {}.{}",
            options.url, options.database, options.table
        ),
    };
    Ok(ClickHouseWriter {
        client,
        url: options.url,
        database: options.database,
        table: options.table,
        mapping: (!mapping.is_empty()).then_some(mapping),
        timeout: Duration::from_millis(options.request_timeout_ms),
        deduplicate: options.deduplicate,
        journal_dir: options.journaling.dir(cx),
        config,
    })
}

/// One column the user mapped: its name, the field it takes (default:
/// the column's name) and the type it must have, if stated.
#[derive(Debug, Clone)]
struct Mapped {
    name: String,
    field: Option<String>,
    stated: Option<String>,
}

/// A connector for the crate's HTTP client, as it builds its own
/// (keep-alive), with rustls from our TLS settings for `https://` URLs.
fn connector(
    tls: std::sync::Arc<logbus_tls::tokio_rustls::rustls::ClientConfig>,
) -> hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.set_keepalive(Some(Duration::from_secs(60)));
    http.enforce_http(false);
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config((*tls).clone())
        .https_or_http()
        .enable_http1()
        .wrap_connector(http)
}

struct ClickHouseWriter {
    client: clickhouse::Client,
    url: String,
    database: String,
    table: String,
    /// `None`: every column of the table.
    mapping: Option<Vec<Mapped>>,
    timeout: Duration,
    deduplicate: bool,
    journal_dir: Option<std::path::PathBuf>,
    config: DriverConfig,
}

#[derive(Deserialize)]
struct DescribedColumn {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    default_type: String,
}

impl ClickHouseWriter {
    /// The table's columns, by `DESCRIBE TABLE` (as JSONEachRow, which
    /// every server version writes).
    async fn describe(&self) -> Result<Vec<DescribedColumn>, Failure> {
        let query = format!(
            "DESCRIBE TABLE {}.{}",
            identifier(&self.database),
            identifier(&self.table)
        );
        let fetched = async {
            let mut cursor = self.client.query(&query).fetch_bytes("JSONEachRow")?;
            cursor.collect().await
        };
        let bytes = tokio::time::timeout(self.timeout, fetched)
            .await
            .map_err(|_| Failure::Transient(format!("no answer within {:?}", self.timeout)))?
            .map_err(|e| match e {
                // The server answered: the table is not there, the user
                // may not read it.
                clickhouse::error::Error::BadResponse(text) => Failure::Data(text.trim().into()),
                other => Failure::Transient(error_chain(&other)),
            })?;
        std::str::from_utf8(&bytes)
            .map_err(|e| Failure::Data(e.to_string()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).map_err(|e| Failure::Data(format!("reading `{l}`: {e}")))
            })
            .collect()
    }

    /// The table's columns; while the server cannot be reached, retried
    /// on the sink's policy (the pipeline waits, as for a failed insert).
    async fn describe_with_retries(
        &self,
        cx: &SinkContext,
        at: &str,
    ) -> Result<Vec<DescribedColumn>, StageError> {
        let retried = self
            .config
            .retry
            .run(
                &cx.stop,
                |_| async {
                    match self.describe().await {
                        Ok(columns) => Attempt::Done(columns),
                        Err(Failure::Data(reason)) => Attempt::Fail(reason),
                        Err(Failure::Transient(reason)) => Attempt::again(reason),
                    }
                },
                |reason, delay| {
                    tracing::warn!(stage = %cx.id, "{at}: DESCRIBE TABLE failed, retrying in {delay:.1?}: {reason}");
                },
            )
            .await;
        Err(StageError::Other(match retried {
            Retried::Done(columns) => return Ok(columns),
            Retried::Failed(reason) => format!("{at}: DESCRIBE TABLE failed: {reason}"),
            Retried::GaveUp { reason, attempts } => {
                format!("{at}: DESCRIBE TABLE failed after {attempts} attempts: {reason}")
            }
            Retried::Stopped(reason) => {
                format!("{at}: stopped while the server could not be reached: {reason}")
            }
        }))
    }

    /// The columns to write, checked against the table.
    fn plan(&self, table: &[DescribedColumn]) -> Result<Vec<Column>, PlanError> {
        let writable: Vec<&DescribedColumn> = table
            .iter()
            .filter(|c| !matches!(c.default_type.as_str(), "MATERIALIZED" | "ALIAS"))
            .collect();
        let wanted: Vec<Mapped> = match &self.mapping {
            Some(m) => m.clone(),
            None => writable
                .iter()
                .map(|c| Mapped {
                    name: c.name.clone(),
                    field: None,
                    stated: None,
                })
                .collect(),
        };
        let mut columns = Vec::new();
        for Mapped {
            name,
            field,
            stated,
        } in wanted
        {
            let Some(found) = table.iter().find(|c| c.name == name) else {
                let names: Vec<&str> = table.iter().map(|c| c.name.as_str()).collect();
                let hint = logbus_plugin_api::closest(&name, &names)
                    .map(|n| format!("; did you mean `{n}`?"))
                    .unwrap_or_default();
                return Err(PlanError::new(
                    &name,
                    format!(
                        "column `{name}` is not in the table (its columns: {}){hint}",
                        names.join(", ")
                    ),
                ));
            };
            if matches!(found.default_type.as_str(), "MATERIALIZED" | "ALIAS") {
                return Err(PlanError::new(
                    &name,
                    format!(
                        "column `{name}` is {} (computed by the server): it cannot be written",
                        found.default_type
                    ),
                ));
            }
            if let Some(stated) = stated
                && normalise(&stated) != normalise(&found.kind)
            {
                return Err(PlanError::new(
                    &name,
                    format!(
                        "column `{name}`: the mapping says {stated}, the table has {}",
                        found.kind
                    ),
                ));
            }
            let kind = ColumnType::parse(&found.kind)
                .map_err(|e| PlanError::new(&name, format!("column `{name}`: {e}")))?;
            let field = field.unwrap_or_else(|| name.clone());
            let path = FieldPath::parse(&field)
                .map_err(|e| PlanError::new(&name, format!("column `{name}`: {e}")))?;
            columns.push(Column {
                name,
                field,
                path,
                kind,
                nullable: found.kind.starts_with("Nullable("),
                has_default: !found.default_type.is_empty(),
            });
        }
        Ok(columns)
    }

    /// What `validate --connect` finds: the table described with these
    /// credentials, the mapping planned as at start, and the fields that
    /// arrive compared with the columns.
    async fn probe(&self, arriving: &ArrivingFields) -> Vec<ServiceFinding> {
        let table = match self.describe().await {
            Ok(t) => t,
            Err(Failure::Transient(reason)) => {
                return vec![ServiceFinding::error(
                    connect::UNREACHABLE,
                    &["url"],
                    format!("ClickHouse at {}: {reason}", self.url),
                )];
            }
            Err(Failure::Data(reason)) => return vec![refusal(&reason)],
        };
        let columns = match self.plan(&table) {
            Ok(c) => c,
            Err(e) => {
                return vec![ServiceFinding::error(
                    COLUMN_MISMATCH,
                    &self.option_of(&e.column),
                    e.message,
                )];
            }
        };
        let mut found = Vec::new();
        for c in &columns {
            if arriving.may_have(&c.field) {
                continue;
            }
            // The insert names every column it writes, so a DEFAULT is
            // not used for a missing field.
            let gets = match (c.nullable, c.has_default) {
                (true, _) => "NULL",
                (false, true) => {
                    "the type's zero value, not the column's DEFAULT (the insert names the column)"
                }
                (false, false) => "the type's zero value",
            };
            found.push(ServiceFinding::warning(
                connect::COLUMN_NOT_PRODUCED,
                &self.option_of(&c.name),
                format!(
                    "column `{}` is written from field `{}`, which no upstream stage produces: every row gets {gets}",
                    c.name, c.field
                ),
            ));
        }
        if self.mapping.is_none()
            && let Some(top) = arriving.closed_top_level()
        {
            let stored: Vec<&str> = columns
                .iter()
                .map(|c| c.field.split('.').next().unwrap_or(&c.field))
                .collect();
            let lost: Vec<String> = top
                .into_iter()
                .filter(|f| !stored.contains(f))
                .map(|f| format!("`{f}`"))
                .collect();
            if !lost.is_empty() {
                found.push(ServiceFinding::warning(
                    connect::FIELD_NOT_STORED,
                    &["table"],
                    format!(
                        "{} arrive{} but table {}.{} has no such column: not stored (map them with `columns:`, or add the columns)",
                        lost.join(", "),
                        if lost.len() == 1 { "s" } else { "" },
                        self.database,
                        self.table
                    ),
                ));
            }
        }
        found
    }

    /// With `deduplicate`: the table's engine, from `system.tables`, must
    /// keep insert tokens. A plain MergeTree without a deduplication
    /// window fails the stage (the server would store every re-sent batch
    /// again); an engine whose deduplication is elsewhere (Distributed,
    /// Buffer) is only warned about, as is a server that cannot be asked.
    async fn check_deduplication(&self, cx: &SinkContext, at: &str) -> Result<(), StageError> {
        let fetched = async {
            let mut cursor = self
                .client
                .query(
                    "SELECT engine, engine_full FROM system.tables WHERE database = ? AND name = ?",
                )
                .bind(self.database.as_str())
                .bind(self.table.as_str())
                .fetch_bytes("JSONEachRow")?;
            cursor.collect().await
        };
        let answer = match tokio::time::timeout(self.timeout, fetched).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(e)) => {
                tracing::warn!(stage = %cx.id, "{at}: cannot tell whether the table keeps deduplication tokens: {}", error_chain(&e));
                return Ok(());
            }
            Err(_) => {
                tracing::warn!(stage = %cx.id, "{at}: cannot tell whether the table keeps deduplication tokens: no answer within {:?}", self.timeout);
                return Ok(());
            }
        };
        #[derive(Deserialize)]
        struct Engine {
            engine: String,
            engine_full: String,
        }
        let engine: Option<Engine> = std::str::from_utf8(&answer)
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| serde_json::from_str(l).ok()));
        let Some(engine) = engine else {
            tracing::warn!(stage = %cx.id, "{at}: cannot tell whether the table keeps deduplication tokens: system.tables has no row for it");
            return Ok(());
        };
        match deduplication(&engine.engine, &engine.engine_full) {
            Deduplication::Kept => Ok(()),
            Deduplication::Unknown(why) => {
                tracing::warn!(stage = %cx.id, "{at}: {why}");
                Ok(())
            }
            Deduplication::Ignored(why) => {
                Err(StageError::Other(format!("{at}: deduplicate: {why}")))
            }
        }
    }

    /// Where a column's finding belongs: its mapping entry, or the table
    /// when every column is taken by name.
    fn option_of<'a>(&'a self, column: &'a str) -> Vec<&'a str> {
        match &self.mapping {
            Some(m) if m.iter().any(|c| c.name == column) => vec!["columns", column],
            _ => vec!["table"],
        }
    }
}

/// Whether a table's engine keeps `insert_deduplication_token`s.
#[derive(Debug, PartialEq, Eq)]
enum Deduplication {
    Kept,
    /// The server stores every insert, token or not: why, and the fix.
    Ignored(String),
    /// Decided elsewhere (the tables under a Distributed one).
    Unknown(String),
}

/// Replicated (and ClickHouse Cloud's Shared) MergeTree tables keep the
/// last tokens by default; a plain MergeTree only with a positive
/// `non_replicated_deduplication_window`.
fn deduplication(engine: &str, engine_full: &str) -> Deduplication {
    if engine.starts_with("Replicated") || engine.starts_with("Shared") {
        return Deduplication::Kept;
    }
    if !engine.ends_with("MergeTree") {
        return Deduplication::Unknown(format!(
            "a {engine} table: whether re-sent inserts are dropped depends on the tables it writes to (they need replication or `non_replicated_deduplication_window`)"
        ));
    }
    let window = engine_full
        .split("non_replicated_deduplication_window")
        .nth(1)
        .and_then(|rest| rest.trim_start().strip_prefix('='))
        .and_then(|rest| {
            rest.trim_start()
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse::<u64>().ok())
        })
        .unwrap_or(0);
    if window > 0 {
        return Deduplication::Kept;
    }
    Deduplication::Ignored(format!(
        "the table is a {engine} without `non_replicated_deduplication_window`, so the server stores a re-sent insert again; set it (`ALTER TABLE … MODIFY SETTING non_replicated_deduplication_window = 1000`) or use a Replicated table"
    ))
}

/// A type with its spaces dropped, so `Map(String,UInt8)` equals
/// `Map(String, UInt8)`.
fn normalise(kind: &str) -> String {
    kind.chars().filter(|c| !c.is_whitespace()).collect()
}

#[async_trait]
impl Sink for ClickHouseWriter {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        let at = format!(
            "ClickHouse {} table {}.{}",
            self.url, self.database, self.table
        );
        let table = self.describe_with_retries(cx, &at).await?;
        let columns = self
            .plan(&table)
            .map_err(|e| StageError::Other(format!("{at}: {e}")))?;
        let names: Vec<String> = columns.iter().map(|c| identifier(&c.name)).collect();
        tracing::info!(stage = %cx.id, "{at}: writing columns {}", names.join(", "));
        let service = ClickHouseService {
            client: self.client.clone(),
            insert: format!(
                "INSERT INTO {}.{} ({}) FORMAT RowBinary",
                identifier(&self.database),
                identifier(&self.table),
                names.join(", ")
            ),
            timeout: self.timeout,
            deduplicate: self.deduplicate,
        };
        if self.deduplicate {
            self.check_deduplication(cx, &at).await?;
        }
        let driver = Driver::new(service, RowEncoder { columns }, self.config.clone())
            .journal_in(self.journal_dir.clone());
        driver.run(cx).await
    }
}

struct Column {
    name: String,
    /// The field as the mapping names it.
    field: String,
    path: FieldPath,
    kind: ColumnType,
    nullable: bool,
    has_default: bool,
}

/// A column the stage cannot write as mapped.
#[derive(Debug)]
struct PlanError {
    column: String,
    message: String,
}

impl PlanError {
    fn new(column: &str, message: String) -> Self {
        PlanError {
            column: column.to_string(),
            message,
        }
    }
}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The mapping does not fit the table (the stage would fail at start).
const COLUMN_MISMATCH: &str = "column-mismatch";

/// The server answered `DESCRIBE TABLE` with an error: which option is at
/// fault, from ClickHouse's error code.
fn refusal(reason: &str) -> ServiceFinding {
    // Some answers wrap the text as `{"exception": "..."}`.
    let unwrapped = serde_json::from_str::<serde_json::Value>(reason)
        .ok()
        .and_then(|v| v["exception"].as_str().map(str::to_string));
    let reason = unwrapped.as_deref().unwrap_or(reason);
    let code: Option<u32> = reason
        .split("Code: ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok());
    match code {
        // UNKNOWN_TABLE
        Some(60) => ServiceFinding::error(connect::MISSING, &["table"], reason),
        // UNKNOWN_DATABASE
        Some(81) => ServiceFinding::error(connect::MISSING, &["database"], reason),
        // UNKNOWN_USER, WRONG_PASSWORD, REQUIRED_PASSWORD, AUTHENTICATION_FAILED
        Some(192 | 193 | 194 | 516) => {
            ServiceFinding::error(connect::REFUSED, &["username"], reason)
        }
        _ => ServiceFinding::error(connect::REFUSED, &["table"], reason),
    }
}

#[cfg(test)]
mod tests {
    use super::insert::error_code;
    use super::*;

    /// `validate --preflight` learns of the CA file and the password's
    /// variable.
    #[test]
    fn the_ca_file_and_the_password_variable_are_stated() {
        let needs = logbus_plugin_api::testing::host_needs(
            &logbus_plugin_api::Typed(ClickHouseSink),
            serde_json::json!({
                "url": "https://h:8443", "table": "t", "tls": { "ca_file": "ca.pem" },
                "username": "u", "password_env": "CH_PASSWORD",
            }),
        );
        assert_eq!(
            needs,
            [
                "tls.ca_file: Pem ./ca.pem",
                "password_env: EnvVar CH_PASSWORD"
            ]
        );
        let none = logbus_plugin_api::testing::host_needs(
            &logbus_plugin_api::Typed(ClickHouseSink),
            serde_json::json!({ "url": "http://h:8123", "table": "t" }),
        );
        assert!(none.is_empty(), "{none:?}");
    }

    /// `validate --connect`: the server's error code says which option is
    /// at fault; a JSON-wrapped answer is unwrapped.
    #[test]
    fn a_refused_describe_names_the_option_at_fault() {
        let at = |reason: &str| {
            let f = refusal(reason);
            (f.code, f.option.join("."), f.message)
        };
        assert_eq!(
            at("Code: 60. DB::Exception: Table default.x does not exist. (UNKNOWN_TABLE)").0,
            connect::MISSING
        );
        assert_eq!(
            at("Code: 81. DB::Exception: Database d does not exist. (UNKNOWN_DATABASE)").1,
            "database"
        );
        let wrong = at("Code: 516. DB::Exception: logbus: Authentication failed");
        assert_eq!((wrong.0, wrong.1.as_str()), (connect::REFUSED, "username"));
        let wrapped = at(r#"{"exception": "Code: 60. DB::Exception: Table t does not exist"}"#);
        assert_eq!((wrapped.0, wrapped.1.as_str()), (connect::MISSING, "table"));
        assert_eq!(wrapped.2, "Code: 60. DB::Exception: Table t does not exist");
        let other = at("Code: 497. DB::Exception: Not enough privileges");
        assert_eq!((other.0, other.1.as_str()), (connect::REFUSED, "table"));
        assert_eq!(at("no code at all").0, connect::REFUSED);
    }

    #[test]
    fn codes_are_read_from_server_exceptions() {
        assert_eq!(
            error_code("Code: 469. DB::Exception: Constraint `c` for table default.t is violated"),
            Some(469)
        );
        assert_eq!(error_code("connection refused"), None);
    }

    /// Which engines keep insert tokens: replicated ones, a MergeTree with
    /// a window; a plain MergeTree is refused naming the setting, an
    /// engine that writes elsewhere is only warned about.
    #[test]
    fn the_table_engine_says_whether_tokens_are_kept() {
        assert_eq!(
            deduplication(
                "ReplicatedMergeTree",
                "ReplicatedMergeTree('/t', 'r') ORDER BY id"
            ),
            Deduplication::Kept
        );
        assert_eq!(
            deduplication(
                "MergeTree",
                "MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 100, index_granularity = 8192"
            ),
            Deduplication::Kept
        );
        for plain in [
            "MergeTree ORDER BY id SETTINGS index_granularity = 8192",
            "MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 0",
        ] {
            let Deduplication::Ignored(why) = deduplication("MergeTree", plain) else {
                panic!("{plain}");
            };
            assert!(why.contains("non_replicated_deduplication_window"), "{why}");
        }
        assert!(matches!(
            deduplication("Distributed", "Distributed(c, db, t)"),
            Deduplication::Unknown(_)
        ));
    }

    /// The journal names batches for the token: alone it is a mistake;
    /// with it the flow says the sink names by position.
    #[test]
    fn a_batch_journal_needs_deduplicate_and_then_names_by_position() {
        let check = |o: serde_json::Value| {
            let o: ClickHouseSinkOptions = serde_json::from_value(o).unwrap();
            o.check()
                .into_iter()
                .map(|e| format!("{}: {}", e.path.join("."), e.message))
                .collect::<Vec<_>>()
        };
        let base =
            serde_json::json!({ "url": "http://h:8123", "table": "t", "batch_journal_dir": "j" });
        assert_eq!(
            check(base.clone()),
            ["batch_journal_dir: names batches for `deduplicate: true`, which is not set"]
        );
        let mut with = base.clone();
        with["deduplicate"] = true.into();
        assert!(check(with.clone()).is_empty());
        with["batch_journal_dir"] = "".into();
        assert_eq!(check(with), ["batch_journal_dir: must not be empty"]);
        let flow = |o: serde_json::Value| {
            let o: ClickHouseSinkOptions = serde_json::from_value(o).unwrap();
            format!("{:?}", ClickHouseSink.flow(&o))
        };
        let mut named = base.clone();
        named["deduplicate"] = true.into();
        assert!(flow(named).contains("NamesByPosition"));
        let mut unnamed = serde_json::json!({ "url": "http://h:8123", "table": "t" });
        assert!(!flow(unnamed.clone()).contains("NamesByPosition"));
        unnamed["deduplicate"] = true.into();
        assert!(!flow(unnamed).contains("NamesByPosition"));
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(identifier("a`b"), "`a\\`b`");
    }

    #[test]
    fn types_compare_without_spaces() {
        assert_eq!(
            normalise("Map(String, UInt8)"),
            normalise("Map(String,UInt8)")
        );
    }
}
