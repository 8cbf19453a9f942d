//! `sink: http` — batched POSTs on the sink core (`logbus-sink`). An event
//! is committed, and acknowledged to its source, only after the server
//! answered 2xx for its request, so a destination that is down or slow
//! holds the batch and, through the bounded queues, the sources.
//!
//! What is specific to HTTP is here: how a status maps to an outcome.
//! Connection errors, timeouts, 408, 429 and 5xx are retried (the core's
//! policy: backoff with full jitter, `Retry-After` in either form); other
//! 4xx mean the request itself is wrong, and retrying cannot help — those
//! events go to `<id>.dead` when a stage reads it, else `on_rejected`
//! decides.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, SystemTime};

use logbus_compress::{CompressWriter, Compression};
use logbus_plugin_api::{
    BuildContext, Bytes, CheckOptions, OptionError, Sink, StageKind, TypedPlugin, async_trait,
};
use logbus_sink::{
    Batch, BatchDefaults, Batching, Driver, DriverConfig, JsonArray, JsonLines, OnRejected,
    Response, RetryDefaults, Retrying, Service, check_requests, error_chain, parse_retry_after,
};
use serde::Deserialize;

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    #[default]
    Post,
    Put,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum BodyEncoding {
    /// One event per line.
    #[default]
    Ndjson,
    /// A JSON array of the events.
    JsonArray,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum BodyCompression {
    #[default]
    None,
    Gzip,
    Zstd,
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
    #[serde(flatten)]
    pub batching: Batching<HttpDefaults>,
    /// Whole-request timeout (connect, send, response).
    #[serde(default = "default_request_timeout")]
    #[schemars(range(min = 1))]
    pub request_timeout_ms: u64,
    #[serde(flatten)]
    pub retrying: Retrying<HttpDefaults>,
    /// Most requests waiting for an answer at once. With more than one,
    /// batches may arrive out of order; `1` keeps the order.
    #[serde(default = "default_in_flight")]
    #[schemars(range(min = 1, max = 256))]
    pub in_flight: usize,
    /// Events refused with a non-retryable 4xx, when no stage reads
    /// `<id>.dead`: `fail` (default) or `drop` (counted as discarded).
    #[serde(default)]
    pub on_rejected: OnRejected,
}

fn default_in_flight() -> usize {
    4
}

fn default_request_timeout() -> u64 {
    10_000
}

/// `sink: http`'s own batch and retry defaults.
pub struct HttpDefaults;

impl BatchDefaults for HttpDefaults {
    const BATCH_MAX_EVENTS: usize = 1000;
    const BATCH_MAX_BYTES: usize = 1 << 20;
    const BATCH_TIMEOUT_MS: u64 = 1000;
}

impl RetryDefaults for HttpDefaults {}

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
        errors.extend(self.batching.check());
        errors.extend(self.retrying.check());
        errors.extend(check_requests(self.request_timeout_ms, self.in_flight, 256));
        for name in self.headers.keys() {
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
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

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "Batched HTTP POST/PUT (NDJSON or a JSON array, gzip/zstd), several requests in flight, retries with full jitter and Retry-After; commits only on 2xx, refused events to <id>.dead.";

    /// The CA file.
    fn host_needs(
        &self,
        o: &Self::Options,
        cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        let ca = o.tls.as_ref().and_then(|t| t.ca_file.as_deref());
        logbus_plugin_api::StatedNeed::client_ca(ca, cx)
            .into_iter()
            .collect()
    }

    fn build(
        &self,
        options: HttpSinkOptions,
        cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let tls = options.tls.clone().unwrap_or_default();
        let tls = tls.config(&cx.base_dir).map_err(|e| {
            let key: &[&str] = match tls.ca_file {
                Some(_) => &["tls", "ca_file"],
                None => &["tls"],
            };
            OptionError::at(key, e.to_string())
        })?;
        let client = reqwest::Client::builder()
            .use_preconfigured_tls((*tls).clone())
            .timeout(Duration::from_millis(options.request_timeout_ms))
            .pool_max_idle_per_host(options.in_flight)
            .build()
            .map_err(|e| OptionError::at(&["url"], format!("building the HTTP client: {e}")))?;
        let mut headers = reqwest::header::HeaderMap::new();
        let mut header = |name: &str, value: &str, path: &[&str]| {
            let value = reqwest::header::HeaderValue::from_str(value)
                .map_err(|_| OptionError::at(path, "not a valid header value"))?;
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| OptionError::at(path, "not a valid header name"))?;
            headers.insert(name, value);
            Ok::<(), OptionError>(())
        };
        let content_type = match options.encoding {
            BodyEncoding::Ndjson => "application/x-ndjson",
            BodyEncoding::JsonArray => "application/json",
        };
        header("content-type", content_type, &["encoding"])?;
        match options.compression {
            BodyCompression::None => {}
            BodyCompression::Gzip => header("content-encoding", "gzip", &["compression"])?,
            BodyCompression::Zstd => header("content-encoding", "zstd", &["compression"])?,
        }
        if let Some(token) = &options.bearer_token {
            header(
                "authorization",
                &format!("Bearer {token}"),
                &["bearer_token"],
            )?;
        }
        for (k, v) in &options.headers {
            header(k, v, &["headers", k])?;
        }
        let method = match options.method {
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
        };
        let config = DriverConfig {
            limits: options.batching.limits(),
            retry: options.retrying.policy(),
            in_flight: options.in_flight,
            on_rejected: options.on_rejected,
            destination: format!("{method} {}", options.url),
        };
        let service = HttpService {
            client,
            method,
            url: options.url.clone(),
            headers,
            compression: options.compression,
        };
        let driver = match options.encoding {
            BodyEncoding::Ndjson => Driver::new(service, JsonLines, config),
            BodyEncoding::JsonArray => Driver::new(service, JsonArray, config),
        };
        Ok(Box::new(driver))
    }
}

/// One endpoint, with a pooled async client: requests in flight share its
/// connections.
struct HttpService {
    client: reqwest::Client,
    method: reqwest::Method,
    url: String,
    headers: reqwest::header::HeaderMap,
    compression: BodyCompression,
}

/// Most bytes of an error response kept for the message.
const REASON_BYTES: usize = 512;

#[async_trait]
impl Service for HttpService {
    type Request = Bytes;

    fn prepare(&self, batch: &Batch) -> Result<Bytes, String> {
        let format = match self.compression {
            BodyCompression::None => return Ok(Bytes::copy_from_slice(batch.body())),
            BodyCompression::Gzip => Compression::Gzip,
            BodyCompression::Zstd => Compression::Zstd,
        };
        let fail = |e: std::io::Error| format!("compressing the request body: {e}");
        let mut w = CompressWriter::new(Vec::with_capacity(batch.body().len() / 4), format)
            .map_err(fail)?;
        w.write_all(batch.body()).map_err(fail)?;
        w.finish().map(Bytes::from).map_err(fail)
    }

    async fn send(&self, body: &Bytes) -> Response {
        let sent = self
            .client
            .request(self.method.clone(), &self.url)
            .headers(self.headers.clone())
            .body(body.clone())
            .send()
            .await;
        let mut resp = match sent {
            Ok(r) => r,
            Err(e) => {
                return Response::Retry {
                    reason: error_chain(&e),
                    retry_after: None,
                };
            }
        };
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Response::Delivered;
        }
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let mut text = Vec::new();
        while text.len() < REASON_BYTES {
            match resp.chunk().await {
                Ok(Some(chunk)) => text.extend_from_slice(&chunk),
                _ => break,
            }
        }
        text.truncate(REASON_BYTES);
        let reason = format!("HTTP {status}: {}", String::from_utf8_lossy(&text).trim());
        if status == 408 || status == 429 || status >= 500 {
            Response::Retry {
                reason,
                retry_after,
            }
        } else {
            Response::Rejected { reason }
        }
    }
}
