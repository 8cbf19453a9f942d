//! `sink: http` — batched POSTs with retries. A batch is committed (and its
//! input released) only after the server answered 2xx, so a destination
//! that is down or slow holds the batch and, through the bounded queues,
//! the sources: nothing is dropped unless `on_rejected: drop` says so for
//! a request the server refuses outright, and then it is counted.
//!
//! Retries: connection errors, timeouts, 408, 429 and 5xx, with
//! exponential backoff and full jitter, honouring `Retry-After`. Other 4xx
//! mean the request itself is wrong; retrying cannot help.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use logbus_compress::{CompressWriter, Compression};
use logbus_plugin_api::{
    BuildContext, Built, CheckOptions, Event, InputBatch, OptionError, Payload, Sink, SinkContext,
    StageError, StageKind, TypedPlugin, async_trait, retry_delay,
};
use serde::Deserialize;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    #[default]
    Post,
    Put,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BodyEncoding {
    /// One event per line.
    #[default]
    Ndjson,
    /// A JSON array of the events.
    JsonArray,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BodyCompression {
    #[default]
    None,
    Gzip,
    Zstd,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnRejected {
    /// Stop the stage (the pipeline drains and exits non-zero).
    #[default]
    Fail,
    /// Count the batch as discarded, log it, go on.
    Drop,
}

/// Options of `sink: http`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpSinkOptions {
    /// `http://` or `https://host:port/path`.
    pub url: String,
    /// For `https://`: `{ ca_file: ... }` trusts a private CA instead of
    /// the built-in Mozilla roots.
    #[serde(default)]
    pub tls: Option<logbus_tls::ClientTls>,
    /// `POST` (default) or `PUT`.
    #[serde(default)]
    pub method: Method,
    /// `ndjson` (default) or `json_array`. Structured events are written
    /// as JSON; raw events (a formatter's output) as they are.
    #[serde(default)]
    pub encoding: BodyEncoding,
    /// `none` (default), `gzip` or `zstd` (sets `Content-Encoding`).
    #[serde(default)]
    pub compression: BodyCompression,
    /// Extra request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Sent as `Authorization: Bearer <token>`.
    #[serde(default)]
    pub bearer_token: Option<String>,
    /// Most events in one request.
    #[serde(default = "default_max_events")]
    #[schemars(range(min = 1))]
    pub batch_max_events: usize,
    /// Most body bytes (before compression) in one request.
    #[serde(default = "default_max_bytes")]
    #[schemars(range(min = 1))]
    pub batch_max_bytes: usize,
    /// A partial batch is sent once its first event has waited this long.
    #[serde(default = "default_batch_timeout")]
    pub batch_timeout_ms: u64,
    /// Whole-request timeout (connect, send, response).
    #[serde(default = "default_request_timeout")]
    #[schemars(range(min = 1))]
    pub request_timeout_ms: u64,
    /// First retry delay; doubles per attempt (with full jitter).
    #[serde(default = "default_initial_backoff")]
    #[schemars(range(min = 1))]
    pub retry_initial_backoff_ms: u64,
    /// Longest retry delay (also caps `Retry-After`).
    #[serde(default = "default_max_backoff")]
    #[schemars(range(min = 1))]
    pub retry_max_backoff_ms: u64,
    /// Give up (and fail the stage) after this many attempts; unset:
    /// retry until the destination is back, holding the pipeline.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub retry_max_attempts: Option<u32>,
    /// A request refused with a non-retryable 4xx: `fail` (default) or
    /// `drop` (counted as discarded).
    #[serde(default)]
    pub on_rejected: OnRejected,
}

fn default_max_events() -> usize {
    1000
}
fn default_max_bytes() -> usize {
    1 << 20
}
fn default_batch_timeout() -> u64 {
    1000
}
fn default_request_timeout() -> u64 {
    10_000
}
fn default_initial_backoff() -> u64 {
    100
}
fn default_max_backoff() -> u64 {
    30_000
}

impl CheckOptions for HttpSinkOptions {
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
                "the URL's host is the name verified; `server_name` applies to syslog only",
            ));
        }
        for (key, value) in [
            ("batch_max_events", self.batch_max_events as u64),
            ("batch_max_bytes", self.batch_max_bytes as u64),
            ("request_timeout_ms", self.request_timeout_ms),
            ("retry_initial_backoff_ms", self.retry_initial_backoff_ms),
            ("retry_max_backoff_ms", self.retry_max_backoff_ms),
        ] {
            if value == 0 {
                errors.push(OptionError::at(&[key], "must be at least 1"));
            }
        }
        if self.retry_max_backoff_ms < self.retry_initial_backoff_ms {
            errors.push(OptionError::at(
                &["retry_max_backoff_ms"],
                format!(
                    "must not be below `retry_initial_backoff_ms` ({})",
                    self.retry_initial_backoff_ms
                ),
            ));
        }
        if self.retry_max_attempts == Some(0) {
            errors.push(OptionError::at(
                &["retry_max_attempts"],
                "must be at least 1",
            ));
        }
        for name in self.headers.keys() {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
            {
                errors.push(OptionError::at(
                    &["headers", name],
                    "not a valid header name",
                ));
            }
        }
        errors
    }
}

pub struct HttpSink;

impl TypedPlugin for HttpSink {
    type Options = HttpSinkOptions;
    const NAME: &'static str = "http";
    const KIND: StageKind = StageKind::Sink;
    const DESCRIPTION: &'static str = "Batched HTTP POST/PUT (NDJSON or a JSON array, gzip/zstd) with retries, backoff with jitter and Retry-After; commits only on 2xx.";

    fn build(&self, options: HttpSinkOptions, cx: &BuildContext) -> Result<Built, OptionError> {
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(ca) = options.tls.as_ref().and_then(|t| t.ca_file.as_ref()) {
            let path = cx.resolve(ca);
            let pem = std::fs::read(&path).map_err(|e| {
                OptionError::at(
                    &["tls", "ca_file"],
                    format!("reading {}: {e}", path.display()),
                )
            })?;
            let certs = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect::<Vec<_>>();
            if certs.is_empty() {
                return Err(OptionError::at(
                    &["tls", "ca_file"],
                    format!("{} holds no certificate", path.display()),
                ));
            }
            tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&certs));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(options.request_timeout_ms)))
            .http_status_as_error(false)
            .tls_config(tls.build())
            .build()
            .into();
        Ok(Built::Sink(Box::new(HttpWriter { options, agent })))
    }
}

struct HttpWriter {
    options: HttpSinkOptions,
    agent: ureq::Agent,
}

/// How a batch ended.
enum Delivered {
    Accepted,
    /// Refused and dropped by `on_rejected: drop` (counted as discarded).
    Dropped,
}

/// What one attempt came to.
enum Outcome {
    Done,
    /// Worth another try, after at least this long (from `Retry-After`).
    Retry(String, Option<Duration>),
    Rejected(String),
}

#[async_trait]
impl Sink for HttpWriter {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        let o = &self.options;
        let timeout = Duration::from_millis(o.batch_timeout_ms);
        let mut held: Vec<InputBatch> = Vec::new();
        let mut events: Vec<Event> = Vec::new();
        let mut bytes = 0usize;
        let mut deadline: Option<tokio::time::Instant> = None;
        let mut ended = false;
        loop {
            let full = events.len() >= o.batch_max_events || bytes >= o.batch_max_bytes;
            let due = deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
            if !events.is_empty() && (full || due || ended) {
                // At most `batch_max_events` / `batch_max_bytes` per request;
                // input batches are released once all their events are.
                let mut take = 0;
                let mut size = 0;
                for e in &events {
                    if take == o.batch_max_events
                        || (take > 0 && size + event_len(e) > o.batch_max_bytes)
                    {
                        break;
                    }
                    size += event_len(e);
                    take += 1;
                }
                let rest = events.split_off(take);
                let request = std::mem::replace(&mut events, rest);
                if let Delivered::Accepted = self.deliver(request, cx).await? {
                    cx.committed(take);
                }
                bytes -= size;
                if events.is_empty() {
                    held.clear();
                    deadline = None;
                }
                continue;
            }
            if ended {
                return Ok(());
            }
            let next = match deadline {
                Some(d) => tokio::select! {
                    batch = cx.input.recv() => Some(batch),
                    _ = tokio::time::sleep_until(d) => None,
                },
                None => Some(cx.input.recv().await),
            };
            match next {
                None => {} // the batch timeout: send what is there
                Some(None) => ended = true,
                Some(Some(mut batch)) => {
                    cx.metrics.add_in(batch.len() as u64);
                    for e in batch.take() {
                        bytes += event_len(&e);
                        events.push(e);
                    }
                    held.push(batch);
                    deadline.get_or_insert_with(|| tokio::time::Instant::now() + timeout);
                }
            }
        }
    }
}

fn event_len(e: &Event) -> usize {
    match e.payload() {
        Payload::Raw(b) => b.len() + 1,
        Payload::Fields(f) => f.len() * 16 + 2,
    }
}

impl HttpWriter {
    fn body(&self, events: &[Event]) -> Result<Vec<u8>, StageError> {
        let mut plain = Vec::new();
        if self.options.encoding == BodyEncoding::JsonArray {
            plain.push(b'[');
        }
        for (i, e) in events.iter().enumerate() {
            if self.options.encoding == BodyEncoding::JsonArray && i > 0 {
                plain.push(b',');
            }
            match e.payload() {
                Payload::Raw(b) => plain.extend_from_slice(b),
                Payload::Fields(f) => serde_json::to_writer(&mut plain, f)
                    .map_err(|e| StageError::Other(format!("encoding an event: {e}")))?,
            }
            if self.options.encoding == BodyEncoding::Ndjson {
                plain.push(b'\n');
            }
        }
        if self.options.encoding == BodyEncoding::JsonArray {
            plain.push(b']');
        }
        let format = match self.options.compression {
            BodyCompression::None => return Ok(plain),
            BodyCompression::Gzip => Compression::Gzip,
            BodyCompression::Zstd => Compression::Zstd,
        };
        let io = |e| StageError::io("compressing the request body", e);
        let mut w = CompressWriter::new(Vec::with_capacity(plain.len() / 4), format).map_err(io)?;
        w.write_all(&plain).map_err(io)?;
        w.finish().map_err(io)
    }

    /// Sends one batch until it is accepted, retrying what can be retried.
    async fn deliver(
        &self,
        mut events: Vec<Event>,
        cx: &SinkContext,
    ) -> Result<Delivered, StageError> {
        let o = &self.options;
        let body = std::sync::Arc::new(self.body(&events)?);
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let outcome = {
                let agent = self.agent.clone();
                let body = body.clone();
                let request = self.request(&agent);
                tokio::task::spawn_blocking(move || send(request, &body))
                    .await
                    .map_err(|e| StageError::Other(format!("the HTTP request panicked: {e}")))?
            };
            match outcome {
                Outcome::Done => {
                    Event::settle_all(&mut events, logbus_plugin_api::Outcome::Delivered);
                    return Ok(Delivered::Accepted);
                }
                Outcome::Rejected(why) => match o.on_rejected {
                    OnRejected::Fail => {
                        return Err(StageError::Other(format!(
                            "{} {} refused {} events: {why}",
                            method_name(o.method),
                            o.url,
                            events.len()
                        )));
                    }
                    OnRejected::Drop => {
                        tracing::warn!(
                            url = %o.url,
                            "dropping {} events the server refused: {why}",
                            events.len()
                        );
                        cx.metrics.add_discarded(events.len() as u64);
                        Event::settle_all(&mut events, logbus_plugin_api::Outcome::Rejected);
                        return Ok(Delivered::Dropped);
                    }
                },
                Outcome::Retry(why, after) => {
                    if o.retry_max_attempts.is_some_and(|max| attempt >= max) {
                        return Err(StageError::Other(format!(
                            "{} {} failed {attempt} times, giving up: {why}",
                            method_name(o.method),
                            o.url
                        )));
                    }
                    let cap = Duration::from_millis(o.retry_max_backoff_ms);
                    let exp = retry_delay(
                        Duration::from_millis(o.retry_initial_backoff_ms),
                        cap,
                        attempt,
                    );
                    // Full jitter, but never sooner than the server asked.
                    let jittered = exp.mul_f64(fastrand::f64());
                    let delay = after.map_or(jittered, |a| a.min(cap).max(jittered));
                    tracing::warn!(
                        url = %o.url,
                        attempt,
                        "request failed, retrying in {delay:?}: {why}"
                    );
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    fn request(&self, agent: &ureq::Agent) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        let o = &self.options;
        let mut r = match o.method {
            Method::Post => agent.post(&o.url),
            Method::Put => agent.put(&o.url),
        };
        r = r.header(
            "Content-Type",
            match o.encoding {
                BodyEncoding::Ndjson => "application/x-ndjson",
                BodyEncoding::JsonArray => "application/json",
            },
        );
        match o.compression {
            BodyCompression::None => {}
            BodyCompression::Gzip => r = r.header("Content-Encoding", "gzip"),
            BodyCompression::Zstd => r = r.header("Content-Encoding", "zstd"),
        }
        if let Some(token) = &o.bearer_token {
            r = r.header("Authorization", format!("Bearer {token}"));
        }
        for (k, v) in &o.headers {
            r = r.header(k, v);
        }
        r
    }
}

fn method_name(m: Method) -> &'static str {
    match m {
        Method::Post => "POST",
        Method::Put => "PUT",
    }
}

fn send(request: ureq::RequestBuilder<ureq::typestate::WithBody>, body: &[u8]) -> Outcome {
    match request.send(body) {
        Err(e) => Outcome::Retry(e.to_string(), None),
        Ok(mut resp) => {
            let status = resp.status().as_u16();
            if (200..300).contains(&status) {
                return Outcome::Done;
            }
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let text = resp
                .body_mut()
                .with_config()
                .limit(512)
                .read_to_string()
                .unwrap_or_default();
            let why = format!("HTTP {status}: {}", text.trim());
            if status == 408 || status == 429 || status >= 500 {
                Outcome::Retry(why, retry_after)
            } else {
                Outcome::Rejected(why)
            }
        }
    }
}
