//! `source: http` — an HTTP server that turns request bodies into events.
//! A request is answered only after its events are in the pipeline, so a
//! 200 means "accepted" and a client that got no answer can safely retry.
//!
//! Bounded by construction: a request takes one of `max_concurrent_requests`
//! slots *before* its body is read, and only then reads (at most
//! `max_body_bytes` on the wire, within `body_timeout_ms`), decompresses
//! (at most `max_body_bytes` again) and splits it (at most
//! `max_events_per_request` events). A body waiting for a slot stays in
//! the kernel's socket buffer. So memory is bounded by the slots, not by
//! what clients send: a small gzip body of tiny lines cannot become
//! millions of events. When the pipeline stays full, the slots stay taken
//! and a new request waits at most `accept_timeout_ms` for one before it
//! gets `503` with `Retry-After` — a request that was answered 503 sent
//! nothing (no duplicates on retry).
//!
//! With `ack: sink` the answer waits longer: until every event of the
//! request is finished downstream (written by the sinks, or dropped on
//! purpose), so a 200 means "delivered" and a client that resends whatever
//! did not get a 200 loses nothing across a crash. The slot is held for
//! that wait too, so the bound above still holds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use logbus_connections::http::{HttpConnections, HttpVersion};
use logbus_connections::{ConnectionTable, Limits};

use logbus_connections::admission::{Admission, Settled};
use logbus_plugin_api::{
    BuildContext, Bytes, CheckOptions, OptionError, Output, Source, SourceContext, StageError,
    StageKind, TypedPlugin, async_trait,
};

use crate::body::{Refused, split};
use serde::Deserialize;

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum BodyFormat {
    /// One event per line (NDJSON or plain text); empty lines are skipped.
    #[default]
    Lines,
    /// The body is a JSON array; each element becomes one event (its JSON text).
    JsonArray,
}

/// Options of `source: http`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpSourceOptions {
    /// Address to listen on, e.g. `127.0.0.1:8080` or `0.0.0.0:8080`.
    pub address: String,
    /// Path that takes events (POST or PUT); anything else is 404, except
    /// `GET /health`.
    #[serde(default = "default_path")]
    pub path: String,
    /// `lines` (NDJSON or plain lines, default) or `json_array`.
    #[serde(default)]
    pub body: BodyFormat,
    /// If set, requests must carry `Authorization: Bearer <token>`.
    #[serde(default)]
    pub bearer_token: Option<String>,
    /// Largest body accepted, after decompression (413 beyond).
    #[serde(default = "default_max_body")]
    #[schemars(range(min = 1))]
    pub max_body_bytes: usize,
    /// Events one request may carry (413 beyond): with tiny lines, a body
    /// within `max_body_bytes` could otherwise hold millions of events.
    #[serde(default = "default_max_events")]
    #[schemars(range(min = 1, max = 10000000))]
    pub max_events_per_request: usize,
    /// How long a request may take to send its body once it has a slot
    /// (408 beyond), so a slow sender cannot hold a slot.
    #[serde(default = "default_body_timeout")]
    #[schemars(range(min = 1, max = 600000))]
    pub body_timeout_ms: u64,
    /// Requests reading a body or waiting for the pipeline at once.
    #[serde(default = "default_concurrency")]
    #[schemars(range(min = 1, max = 4096))]
    pub max_concurrent_requests: usize,
    /// How long a request waits for a slot before `503 Retry-After`.
    #[serde(default = "default_accept_timeout")]
    #[schemars(range(max = 600000))]
    pub accept_timeout_ms: u64,
    /// The `Retry-After` given with a 503, seconds.
    #[serde(default = "default_retry_after")]
    #[schemars(range(min = 1, max = 3600))]
    pub retry_after_secs: u64,
    /// Serve HTTPS with this certificate and key.
    #[serde(default)]
    pub tls: Option<logbus_tls::ServerTls>,
    /// When a request is answered 200: `queued` (default) once its events
    /// are in the pipeline; `sink` once every one of them is delivered.
    #[serde(default)]
    pub ack: AckMode,
    /// With `ack: sink`: how long a request waits for its events to be
    /// delivered before it is answered 504.
    #[serde(default = "default_ack_timeout")]
    #[schemars(range(min = 1, max = 3600000))]
    pub ack_timeout_ms: u64,
    /// Connections open at once. When all are taken, the one idle longest
    /// is closed to admit a new one; only when every one is serving a
    /// request is the new one closed.
    #[serde(default = "default_max_connections")]
    #[schemars(range(min = 1, max = 65536))]
    pub max_connections: usize,
    /// A connection with no request in progress and no bytes moving for
    /// this long is closed, milliseconds.
    #[serde(default = "default_idle_timeout")]
    #[schemars(range(min = 1, max = 3600000))]
    pub idle_timeout_ms: u64,
    /// How long a client may take to send a request's headers (the
    /// connection is closed beyond), milliseconds.
    #[serde(default = "default_header_timeout")]
    #[schemars(range(min = 1, max = 600000))]
    pub header_timeout_ms: u64,
}

fn default_max_connections() -> usize {
    1024
}
fn default_idle_timeout() -> u64 {
    60_000
}
fn default_header_timeout() -> u64 {
    10_000
}

pub use logbus_connections::admission::AckMode;

fn default_ack_timeout() -> u64 {
    30_000
}

fn default_path() -> String {
    "/".into()
}
fn default_max_body() -> usize {
    10 << 20
}
fn default_max_events() -> usize {
    100_000
}
fn default_body_timeout() -> u64 {
    10_000
}
fn default_concurrency() -> usize {
    16
}
fn default_accept_timeout() -> u64 {
    5000
}
fn default_retry_after() -> u64 {
    1
}

impl CheckOptions for HttpSourceOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if let Err(e) = self.address.parse::<SocketAddr>() {
            errors.push(OptionError::at(
                &["address"],
                format!(
                    "`{}` is not an address like 127.0.0.1:8080: {e}",
                    self.address
                ),
            ));
        }
        if !self.path.starts_with('/') || self.path == "/health" {
            errors.push(OptionError::at(
                &["path"],
                "must start with `/` and must not be `/health`",
            ));
        }
        if self.max_body_bytes == 0 {
            errors.push(OptionError::at(&["max_body_bytes"], "must be at least 1"));
        }
        if !(1..=4096).contains(&self.max_concurrent_requests) {
            errors.push(OptionError::at(
                &["max_concurrent_requests"],
                format!(
                    "must be between 1 and 4096, got {}",
                    self.max_concurrent_requests
                ),
            ));
        }
        if !(1..=3_600_000).contains(&self.ack_timeout_ms) {
            errors.push(OptionError::at(
                &["ack_timeout_ms"],
                format!("must be between 1 and 3600000, got {}", self.ack_timeout_ms),
            ));
        }
        if !(1..=10_000_000).contains(&self.max_events_per_request) {
            errors.push(OptionError::at(
                &["max_events_per_request"],
                format!(
                    "must be between 1 and 10000000, got {}",
                    self.max_events_per_request
                ),
            ));
        }
        if !(1..=600_000).contains(&self.body_timeout_ms) {
            errors.push(OptionError::at(
                &["body_timeout_ms"],
                format!("must be between 1 and 600000, got {}", self.body_timeout_ms),
            ));
        }
        if self.bearer_token.as_deref() == Some("") {
            errors.push(OptionError::at(&["bearer_token"], "must not be empty"));
        }
        for (name, value, max) in [
            ("max_connections", self.max_connections as u64, 65_536),
            ("idle_timeout_ms", self.idle_timeout_ms, 3_600_000),
            ("header_timeout_ms", self.header_timeout_ms, 600_000),
        ] {
            if !(1..=max).contains(&value) {
                errors.push(OptionError::at(
                    &[name],
                    format!("must be between 1 and {max}, got {value}"),
                ));
            }
        }
        errors
    }
}

pub struct HttpSource;

impl TypedPlugin for HttpSource {
    type Options = HttpSourceOptions;
    const NAME: &'static str = "http";
    const KIND: StageKind = StageKind::Source;

    type Stage = Box<dyn Source>;
    const ACKNOWLEDGEMENTS: Option<&'static str> = Some(
        "with `ack: sink`, a request is answered 200 only once its events are delivered; a client that resends what got no 200 loses nothing",
    );
    const DESCRIPTION: &'static str = "An HTTP server taking NDJSON, plain lines or a JSON array (gzip/zstd bodies, bearer token); answers only once the events are in the pipeline, 503 + Retry-After when it stays full.";

    /// The address must be free; TLS files readable PEM; each connection
    /// holds a file descriptor.
    fn host_needs(
        &self,
        o: &HttpSourceOptions,
        cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        use logbus_plugin_api::{HostNeed, StatedNeed};
        let mut needs = vec![
            StatedNeed::new(
                HostNeed::Listen {
                    address: o.address.clone(),
                    udp: false,
                },
                &["address"],
            ),
            StatedNeed::new(
                HostNeed::OpenFiles {
                    count: o.max_connections as u64,
                },
                &["max_connections"],
            ),
        ];
        if let Some(tls) = &o.tls {
            needs.extend(StatedNeed::tls_identity(
                cx.resolve(&tls.cert_file),
                cx.resolve(&tls.key_file),
                &["tls"],
            ));
        }
        needs
    }

    /// Raw events (one per line or message); a `codec:` parses them.
    /// With `ack: sink` a client that resends what got no 200 loses
    /// nothing.
    fn flow(&self, o: &HttpSourceOptions) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::raw().then(logbus_plugin_api::Step::Replay(
            logbus_plugin_api::Replay {
                rereads: o.ack == AckMode::Sink,
                positions: false,
            },
        ))
    }

    fn build(
        &self,
        options: HttpSourceOptions,
        cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let address = options
            .address
            .parse()
            .map_err(|e| OptionError::at(&["address"], format!("{e}")))?;
        let tls = (options.tls.as_ref())
            .map(|t| t.acceptor(&cx.base_dir))
            .transpose()
            .map_err(|e| OptionError::at(&["tls"], e.to_string()))?;
        Ok(Box::new(Server {
            options,
            address,
            tls,
        }))
    }
}

struct Server {
    options: HttpSourceOptions,
    address: SocketAddr,
    tls: Option<logbus_tls::TlsAcceptor>,
}

struct Shared {
    options: HttpSourceOptions,
    output: Output,
    source: Arc<str>,
    admission: Admission,
}

#[async_trait]
impl Source for Server {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        let listener = tokio::net::TcpListener::bind(self.address)
            .await
            .map_err(|e| StageError::io(format!("listening on {}", self.address), e))?;
        tracing::info!(address = %self.address, tls = self.tls.is_some(), "HTTP source listening");
        let path = self.options.path.clone();
        let max = self.options.max_body_bytes;
        let (options_max_connections, idle_timeout_ms, header_timeout_ms) = (
            self.options.max_connections,
            self.options.idle_timeout_ms,
            self.options.header_timeout_ms,
        );
        let shared = Arc::new(Shared {
            admission: Admission::new(
                self.options.max_concurrent_requests,
                Duration::from_millis(self.options.accept_timeout_ms),
                self.options.ack,
                Duration::from_millis(self.options.ack_timeout_ms),
            ),
            options: self.options,
            output: cx.output,
            source: cx.id.clone(),
        });
        let app = axum::Router::new()
            .route("/health", axum::routing::get(health))
            .route(&path, axum::routing::post(ingest).put(ingest))
            // Compressed bodies are limited after decompression, below; the
            // raw limit only stops an oversized upload early.
            .layer(DefaultBodyLimit::max(max))
            .with_state(shared);
        let connections = ConnectionTable::new(Limits {
            max_connections: options_max_connections,
            idle_timeout: Duration::from_millis(idle_timeout_ms),
        });
        let server = HttpConnections {
            app,
            version: HttpVersion::Http1,
            tls: self.tls,
            table: connections,
            header_timeout: Duration::from_millis(header_timeout_ms),
            // The handler bounds the body itself (408 past body_timeout_ms).
            body_timeout: None,
            shutdown: cx.shutdown.clone(),
        };
        server.serve(listener).await;
        Ok(())
    }
}

async fn health() -> &'static str {
    "ok\n"
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, format!("{}\n", message.into())).into_response()
}

async fn ingest(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    let o = &s.options;
    if let Some(token) = &o.bearer_token {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(token.as_str()) {
            return error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
        }
    }
    // A slot before the body is read: what a request holds in memory is
    // bounded by the slots, whatever clients send.
    let Some(_slot) = s.admission.slot().await else {
        return retry_later(
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the pipeline is full; retry later",
            ),
            o.retry_after_secs,
        );
    };
    let raw = tokio::time::timeout(
        Duration::from_millis(o.body_timeout_ms),
        axum::body::to_bytes(body, o.max_body_bytes),
    )
    .await;
    let raw = match raw {
        Ok(Ok(raw)) => raw,
        Ok(Err(e))
            if logbus_connections::http::BodyCut::of(&e)
                == Some(logbus_connections::http::BodyCut::Stopping) =>
        {
            // Cut off by the stop: the client may send it again.
            return retry_later(
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the source is stopping; retry later",
                ),
                o.retry_after_secs,
            );
        }
        Ok(Err(e)) => {
            // The length limit is the one error a well-formed request can
            // meet here; anything else is a broken upload.
            let too_large = std::error::Error::source(&e)
                .is_some_and(|e| e.is::<http_body_util::LengthLimitError>());
            return match too_large {
                true => error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the body is larger than {} bytes", o.max_body_bytes),
                ),
                false => error(StatusCode::BAD_REQUEST, format!("reading the body: {e}")),
            };
        }
        Err(_) => {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                format!("the body did not arrive within {} ms", o.body_timeout_ms),
            );
        }
    };
    let body = match decode(&headers, raw, o.max_body_bytes) {
        Ok(b) => b,
        Err((status, why)) => return error(status, why),
    };
    let events = match split(&body, o.body, &s.source, o.max_events_per_request) {
        Ok(e) => e,
        Err(Refused::TooMany) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the body holds more than {} events (max_events_per_request)",
                    o.max_events_per_request
                ),
            );
        }
        Err(Refused::Malformed(why)) => return error(StatusCode::BAD_REQUEST, why),
    };
    drop(body);
    let n = events.len();
    let (events, pending) = s.admission.track(events);
    // Held until the pipeline took every event: the answer means accepted.
    if s.output.send(events).await.is_err() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the pipeline is stopping");
    }
    let ok = |what: &str| {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            format!("{{\"{what}\":{n}}}\n"),
        )
            .into_response()
    };
    let Some(pending) = pending else {
        return ok("accepted");
    };
    // `ack: sink`: still holding the slot, wait for the last event.
    match pending.settled().await {
        Settled::Delivered => ok("delivered"),
        Settled::Rejected(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "rejected: the pipeline refused some of the {n} events for good (a sink's destination, or on_error: drop); sending them again will not help"
            ),
        ),
        Settled::Errored(_) => retry_later(
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "errored: some of the {n} events were not delivered (a stage failed or the pipeline is stopping); send them again"
                ),
            ),
            o.retry_after_secs,
        ),
        Settled::TimedOut => error(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "timed out: the {n} events were not confirmed delivered within {} ms; they may still be, so sending them again may duplicate",
                o.ack_timeout_ms
            ),
        ),
    }
}

/// `response` with a `Retry-After` of `secs`.
fn retry_later(mut response: Response, secs: u64) -> Response {
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
    response
}

/// The body, decompressed per `Content-Encoding`, at most `max` bytes.
fn decode(headers: &HeaderMap, body: Bytes, max: usize) -> Result<Bytes, (StatusCode, String)> {
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity");
    crate::body::decode(encoding, body, max).map_err(|refused| match refused {
        crate::body::Undecodable::Unsupported(why) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, why),
        crate::body::Undecodable::Malformed(why) => (StatusCode::BAD_REQUEST, why),
        crate::body::Undecodable::TooLarge(why) => (StatusCode::PAYLOAD_TOO_LARGE, why),
    })
}
