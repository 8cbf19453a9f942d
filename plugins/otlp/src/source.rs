//! `source: otlp` — OpenTelemetry logs over OTLP/gRPC (`grpc_address`)
//! and OTLP/HTTP (`http_address`, `POST /v1/logs`, protobuf or JSON
//! bodies, gzip), each record one event (see [`crate::model`]).
//!
//! Bounded as `source: http` is: a request takes one of
//! `max_concurrent_requests` slots before its body is decoded (gRPC: the
//! body is already read by then, within `max_request_bytes`), a request
//! carries at most `max_records_per_request` records, and a request that
//! waits `accept_timeout_ms` for a slot is refused as UNAVAILABLE (gRPC,
//! with RetryInfo) or 503 with Retry-After (HTTP), having sent nothing. An
//! answer of success means the records are in the pipeline; with
//! `ack: sink`, that every one of them was delivered, and a record the
//! pipeline refused for good is reported as partial success (rejected
//! count and message), while one that errored makes the whole request
//! UNAVAILABLE so the client sends it again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use logbus_connections::admission::{Admission, Settled};
use logbus_connections::http::{HttpConnections, HttpVersion};
use logbus_connections::{ConnectionTable, Limits};
use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, Meta, OptionError, Output, Source, SourceContext,
    StageError, StageKind, TypedPlugin, async_trait,
};
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use prost::Message;
use serde::Deserialize;

use crate::model::{Layout, RpcStatus, record_to_fields};

pub use logbus_connections::admission::AckMode;

/// Options of `source: otlp`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OtlpSourceOptions {
    /// OTLP/gRPC listen address (`0.0.0.0:4317`); unset: no gRPC.
    pub grpc_address: Option<String>,
    /// OTLP/HTTP listen address (`0.0.0.0:4318`); unset: no HTTP.
    pub http_address: Option<String>,
    /// Resource and scope as objects (`nested`) or dotted top-level
    /// fields (`flatten`).
    #[serde(default)]
    pub layout: Layout,
    /// When a request is answered: `queued` or `sink`.
    #[serde(default)]
    pub ack: AckMode,
    /// With `ack: sink`: how long a request waits for its records to be
    /// delivered (then DEADLINE_EXCEEDED / 504).
    #[serde(default = "default_ack_timeout")]
    #[schemars(range(min = 1, max = 3600000))]
    pub ack_timeout_ms: u64,
    /// Largest request, after decompression (RESOURCE_EXHAUSTED / 413).
    #[serde(default = "default_max_request")]
    #[schemars(range(min = 1))]
    pub max_request_bytes: usize,
    /// Most records in one request (INVALID_ARGUMENT / 413 beyond).
    #[serde(default = "default_max_records")]
    #[schemars(range(min = 1, max = 10000000))]
    pub max_records_per_request: usize,
    /// Requests being decoded or waiting for the pipeline at once.
    #[serde(default = "default_concurrency")]
    #[schemars(range(min = 1, max = 4096))]
    pub max_concurrent_requests: usize,
    /// How long a request waits for a slot before it is refused as
    /// UNAVAILABLE / 503 (the pipeline stays full).
    #[serde(default = "default_accept_timeout")]
    #[schemars(range(max = 600000))]
    pub accept_timeout_ms: u64,
    /// The retry delay given with UNAVAILABLE / 503, seconds.
    #[serde(default = "default_retry_after")]
    #[schemars(range(min = 1, max = 3600))]
    pub retry_after_secs: u64,
    /// Serve both listeners over TLS with this certificate and key
    /// (OTLP/gRPC offers ALPN `h2`, OTLP/HTTP `http/1.1`).
    #[serde(default)]
    pub tls: Option<logbus_tls::ServerTls>,
    /// Connections open at once on each listener (the longest-idle one is
    /// closed to admit a new one).
    #[serde(default = "default_max_connections")]
    #[schemars(range(min = 1, max = 65536))]
    pub max_connections: usize,
    /// An idle connection (no bytes either way, no request being served)
    /// is closed after this long, ms.
    #[serde(default = "default_idle_timeout")]
    #[schemars(range(min = 1, max = 3600000))]
    pub idle_timeout_ms: u64,
    /// HTTP: how long a client may take to send a request's headers, ms.
    #[serde(default = "default_header_timeout")]
    #[schemars(range(min = 1, max = 600000))]
    pub header_timeout_ms: u64,
    /// Both transports: how long a request's body may take to arrive once
    /// it holds a slot, ms (then UNAVAILABLE / 503: a stalled upload gives
    /// its slot back, and a stop does not wait for it).
    #[serde(default = "default_body_timeout")]
    #[schemars(range(min = 1, max = 600000))]
    pub body_timeout_ms: u64,
    /// The most one request's events may come to, counting each record's
    /// own copy of its resource and scope (every event carries them), as
    /// protobuf bytes; RESOURCE_EXHAUSTED / 413 beyond, before any event
    /// is made. A small request can name a resource of 2,000 attributes
    /// once and 50,000 records under it.
    #[serde(default = "default_max_decoded")]
    #[schemars(range(min = 1))]
    pub max_decoded_bytes: usize,
}

fn default_ack_timeout() -> u64 {
    30_000
}
fn default_max_request() -> usize {
    4 << 20
}
fn default_max_records() -> usize {
    100_000
}
fn default_concurrency() -> usize {
    64
}
fn default_accept_timeout() -> u64 {
    1_000
}
fn default_retry_after() -> u64 {
    1
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
fn default_body_timeout() -> u64 {
    10_000
}
fn default_max_decoded() -> usize {
    16 << 20
}

impl CheckOptions for OtlpSourceOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if self.grpc_address.is_none() && self.http_address.is_none() {
            errors.push(OptionError::at(
                &["grpc_address"],
                "this or `http_address` (or both) must be set",
            ));
        }
        for (key, address) in [
            ("grpc_address", &self.grpc_address),
            ("http_address", &self.http_address),
        ] {
            if let Some(a) = address
                && let Err(e) = a.parse::<SocketAddr>()
            {
                errors.push(OptionError::at(
                    &[key],
                    format!("`{a}` is not an address (host:port): {e}"),
                ));
            }
        }
        if self.grpc_address.is_some() && self.grpc_address == self.http_address {
            errors.push(OptionError::at(
                &["http_address"],
                "must differ from `grpc_address`",
            ));
        }
        errors
    }
}

pub struct OtlpSource;

impl TypedPlugin for OtlpSource {
    type Options = OtlpSourceOptions;
    const NAME: &'static str = "otlp";
    const KIND: StageKind = StageKind::Source;

    type Stage = Box<dyn Source>;
    const DESCRIPTION: &'static str = "OpenTelemetry logs over OTLP/gRPC and OTLP/HTTP (protobuf or JSON, gzip): each log record one event with its body, severity, times, trace context, attributes, resource and scope; answers once the records are accepted (or delivered), UNAVAILABLE/503 with a retry delay when the pipeline stays full. Traces and metrics are refused.";

    /// The addresses it listens on, its connections, its TLS files.
    fn host_needs(
        &self,
        o: &Self::Options,
        cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        let mut needs = Vec::new();
        use logbus_plugin_api::{HostNeed, StatedNeed};
        for (address, option) in [
            (&o.grpc_address, "grpc_address"),
            (&o.http_address, "http_address"),
        ] {
            if let Some(address) = address {
                needs.push(StatedNeed::new(
                    HostNeed::Listen {
                        address: address.clone(),
                        udp: false,
                    },
                    &[option],
                ));
            }
        }
        needs.push(StatedNeed::new(
            HostNeed::OpenFiles {
                count: o.max_connections as u64,
            },
            &["max_connections"],
        ));
        if let Some(tls) = &o.tls {
            needs.extend(StatedNeed::tls_identity(
                cx.resolve(&tls.cert_file),
                cx.resolve(&tls.key_file),
                &["tls"],
            ));
        }
        needs
    }
    const ACKNOWLEDGEMENTS: Option<&'static str> = Some(
        "with `ack: sink`, a request is answered success only once its records are delivered (those refused for good as partial success); an OTLP client retries what was not answered, so nothing is lost",
    );

    /// Log records as parsed events (model.rs); which fields a record
    /// has depends on what its sender set, so the set is open.
    /// With `ack: sink` a client that resends what got no success loses
    /// nothing.
    fn flow(&self, o: &Self::Options) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::open_fields(&[]).then(logbus_plugin_api::Step::Replay(
            logbus_plugin_api::Replay {
                rereads: o.ack == AckMode::Sink,
                positions: false,
            },
        ))
    }

    fn build(&self, options: Self::Options, cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        let parse = |key: &str, a: &Option<String>| {
            a.as_deref()
                .map(|a| {
                    a.parse::<SocketAddr>()
                        .map_err(|e| OptionError::at(&[key], e.to_string()))
                })
                .transpose()
        };
        let grpc = parse("grpc_address", &options.grpc_address)?;
        let http = parse("http_address", &options.http_address)?;
        let acceptor = |alpn: &[&[u8]]| {
            (options.tls.as_ref())
                .map(|t| t.acceptor_with_alpn(&cx.base_dir, alpn))
                .transpose()
                .map_err(|e| OptionError::at(&["tls"], e.to_string()))
        };
        // gRPC clients insist on ALPN `h2`; HTTP/1.1 says so too.
        let grpc_tls = acceptor(&[b"h2"])?;
        let tls = acceptor(&[b"http/1.1"])?;
        Ok(Box::new(Receiver {
            options,
            grpc,
            http,
            grpc_tls,
            tls,
        }))
    }
}

struct Receiver {
    options: OtlpSourceOptions,
    grpc: Option<SocketAddr>,
    http: Option<SocketAddr>,
    grpc_tls: Option<logbus_tls::TlsAcceptor>,
    tls: Option<logbus_tls::TlsAcceptor>,
}

/// What both transports share: the slots and the way into the pipeline.
struct Shared {
    options: OtlpSourceOptions,
    output: Output,
    source: Arc<str>,
    admission: Admission,
}

/// Why a request was not taken.
#[derive(Debug)]
enum Refusal {
    /// The pipeline stays full or is stopping: send it again later.
    Unavailable(String),
    /// The request itself is wrong: sending it again will not help.
    Invalid(String),
    /// Too large.
    TooLarge(String),
    /// `ack: sink` and no answer in time: it may still be delivered.
    Timeout(String),
}

impl Refusal {
    fn status(&self, retry_after: Duration) -> tonic::Status {
        use tonic_types::{ErrorDetails, StatusExt};
        match self {
            Refusal::Unavailable(m) => tonic::Status::with_error_details(
                tonic::Code::Unavailable,
                m.clone(),
                ErrorDetails::with_retry_info(Some(retry_after)),
            ),
            Refusal::Invalid(m) => tonic::Status::invalid_argument(m.clone()),
            Refusal::TooLarge(m) => tonic::Status::resource_exhausted(m.clone()),
            Refusal::Timeout(m) => tonic::Status::deadline_exceeded(m.clone()),
        }
    }

    fn http(&self) -> (StatusCode, &str, i32) {
        match self {
            Refusal::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, m, 14),
            Refusal::Invalid(m) => (StatusCode::BAD_REQUEST, m, 3),
            Refusal::TooLarge(m) => (StatusCode::PAYLOAD_TOO_LARGE, m, 8),
            Refusal::Timeout(m) => (StatusCode::GATEWAY_TIMEOUT, m, 4),
        }
    }
}

impl Shared {
    fn retry_after(&self) -> Duration {
        Duration::from_secs(self.options.retry_after_secs)
    }

    /// A slot, or UNAVAILABLE once `accept_timeout_ms` passed.
    async fn slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>, Refusal> {
        self.admission
            .slot()
            .await
            .ok_or_else(|| Refusal::Unavailable("the pipeline is full; retry later".into()))
    }

    /// The request's records into the pipeline; the answer once they are
    /// accepted (or delivered).
    async fn accept(
        &self,
        request: ExportLogsServiceRequest,
    ) -> Result<ExportLogsServiceResponse, Refusal> {
        let o = &self.options;
        let n: usize = request
            .resource_logs
            .iter()
            .flat_map(|r| &r.scope_logs)
            .map(|s| s.log_records.len())
            .sum();
        if n > o.max_records_per_request {
            return Err(Refusal::TooLarge(format!(
                "the request holds {n} log records, more than {} (max_records_per_request)",
                o.max_records_per_request
            )));
        }
        if n == 0 {
            return Ok(ExportLogsServiceResponse::default());
        }
        let fanned = fanned_out_bytes(&request);
        if fanned > o.max_decoded_bytes {
            return Err(Refusal::TooLarge(format!(
                "the request's {n} log records come to {fanned} bytes with each one's copy of its resource and scope, more than {} (max_decoded_bytes)",
                o.max_decoded_bytes
            )));
        }
        let meta = Meta::now(self.source.clone());
        let mut events = Vec::with_capacity(n);
        for resource_logs in &request.resource_logs {
            for scope_logs in &resource_logs.scope_logs {
                for record in &scope_logs.log_records {
                    let fields = record_to_fields(
                        resource_logs.resource.as_ref(),
                        scope_logs.scope.as_ref(),
                        record,
                        o.layout,
                    );
                    events.push(Event::fields(fields, meta.clone()));
                }
            }
        }
        drop(request);
        let (events, pending) = self.admission.track(events);
        if self.output.send(events).await.is_err() {
            return Err(Refusal::Unavailable("the pipeline is stopping".into()));
        }
        let Some(pending) = pending else {
            return Ok(ExportLogsServiceResponse::default());
        };
        let rejected = match pending.settled().await {
            Settled::Delivered => return Ok(ExportLogsServiceResponse::default()),
            Settled::Rejected(rejected) => rejected,
            Settled::Errored(errored) => {
                return Err(Refusal::Unavailable(format!(
                    "{errored} of the {n} log records were not delivered (a stage failed or the pipeline is stopping); send them again"
                )));
            }
            Settled::TimedOut => {
                return Err(Refusal::Timeout(format!(
                    "the {n} log records were not confirmed delivered within {} ms; they may still be, so sending them again may duplicate",
                    o.ack_timeout_ms
                )));
            }
        };
        Ok(ExportLogsServiceResponse {
            partial_success: Some(ExportLogsPartialSuccess {
                rejected_log_records: rejected as i64,
                error_message: format!(
                    "{rejected} of the {n} log records were refused for good by the pipeline (a sink's destination, or on_error: drop)"
                ),
            }),
        })
    }
}

/// The gRPC service.
struct Grpc(Arc<Shared>);

#[tonic::async_trait]
impl LogsService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        let s = &self.0;
        let _slot = s.slot().await.map_err(|r| r.status(s.retry_after()))?;
        s.accept(request.into_inner())
            .await
            .map(tonic::Response::new)
            .map_err(|r| r.status(s.retry_after()))
    }
}

#[async_trait]
impl Source for Receiver {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        let Receiver {
            options,
            grpc,
            http,
            grpc_tls,
            tls,
        } = *self;
        let bind = |a: SocketAddr| async move {
            tokio::net::TcpListener::bind(a)
                .await
                .map_err(|e| StageError::io(format!("listening on {a}"), e))
        };
        let grpc_listener = match grpc {
            Some(a) => Some(bind(a).await?),
            None => None,
        };
        let http_listener = match http {
            Some(a) => Some(bind(a).await?),
            None => None,
        };
        let max_request = options.max_request_bytes;
        let (max_connections, idle_timeout_ms, header_timeout_ms, body_timeout_ms) = (
            options.max_connections,
            options.idle_timeout_ms,
            options.header_timeout_ms,
            options.body_timeout_ms,
        );
        let shared = Arc::new(Shared {
            admission: Admission::new(
                options.max_concurrent_requests,
                Duration::from_millis(options.accept_timeout_ms),
                options.ack,
                Duration::from_millis(options.ack_timeout_ms),
            ),
            options,
            output: cx.output,
            source: cx.id.clone(),
        });
        let mut servers = tokio::task::JoinSet::new();
        let table = || {
            ConnectionTable::new(Limits {
                max_connections,
                idle_timeout: Duration::from_millis(idle_timeout_ms),
            })
        };
        if let Some(listener) = grpc_listener {
            tracing::info!(address = ?grpc, tls = grpc_tls.is_some(), "OTLP/gRPC source listening");
            let service = LogsServiceServer::new(Grpc(shared.clone()))
                .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
                .max_decoding_message_size(max_request);
            let app = tonic::service::Routes::new(service)
                .into_axum_router()
                .layer(tower::util::MapResponseLayer::new(otlp_status_codes));
            let server = HttpConnections {
                app,
                version: HttpVersion::Http2,
                tls: grpc_tls,
                table: table(),
                header_timeout: Duration::from_millis(header_timeout_ms),
                body_timeout: Some(Duration::from_millis(body_timeout_ms)),
                shutdown: cx.shutdown.clone(),
            };
            servers.spawn(server.serve(listener));
        }
        if let Some(listener) = http_listener {
            tracing::info!(address = ?http, tls = tls.is_some(), "OTLP/HTTP source listening");
            let app = axum::Router::new()
                .route("/v1/logs", axum::routing::post(http_logs))
                .route("/v1/traces", axum::routing::any(not_logs))
                .route("/v1/metrics", axum::routing::any(not_logs))
                .layer(DefaultBodyLimit::max(max_request))
                .with_state(shared.clone());
            let server = HttpConnections {
                app,
                version: HttpVersion::Http1,
                tls,
                table: table(),
                header_timeout: Duration::from_millis(header_timeout_ms),
                body_timeout: Some(Duration::from_millis(body_timeout_ms)),
                shutdown: cx.shutdown.clone(),
            };
            servers.spawn(server.serve(listener));
        }
        // A server ends only when the shutdown is asked for, or by
        // panicking: then the other one is stopped too, and the first
        // panic is the stage's error once both have ended.
        let mut failed = None;
        while let Some(done) = servers.join_next().await {
            if let Err(e) = done {
                cx.shutdown.cancel();
                failed.get_or_insert(e);
            }
        }
        match failed {
            None => Ok(()),
            Some(e) => Err(StageError::Other(format!("an OTLP server failed: {e}"))),
        }
    }
}

/// What a request's events will carry, as protobuf bytes: each record,
/// plus its resource and its scope once for every record under them.
fn fanned_out_bytes(request: &ExportLogsServiceRequest) -> usize {
    let mut total = 0usize;
    for resource_logs in &request.resource_logs {
        let resource = resource_logs
            .resource
            .as_ref()
            .map_or(0, prost::Message::encoded_len);
        for scope_logs in &resource_logs.scope_logs {
            let scope = scope_logs
                .scope
                .as_ref()
                .map_or(0, prost::Message::encoded_len);
            for record in &scope_logs.log_records {
                total = total
                    .saturating_add(prost::Message::encoded_len(record))
                    .saturating_add(resource)
                    .saturating_add(scope);
            }
        }
    }
    total
}

/// The OTLP words for two answers tonic gives in its own terms: see
/// [`too_large_is_exhausted`] and [`undecodable_is_invalid`].
fn otlp_status_codes<B>(response: http::Response<B>) -> http::Response<B> {
    undecodable_is_invalid(too_large_is_exhausted(response))
}

/// Whether a `grpc-message` header says `words` (tonic percent-encodes
/// spaces).
fn grpc_message_says(headers: &http::HeaderMap, words: &str) -> bool {
    headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .is_some_and(|m| m.replace("%20", " ").contains(words))
}

/// tonic answers protobuf that does not decode as INTERNAL (a server
/// fault, in gRPC's table); OTLP and docs/plugins/otlp.md say
/// INVALID_ARGUMENT: the request is wrong and sending it again will not
/// help. A body cut off by `body_timeout_ms` or by the stop reaches tonic
/// as a body error, UNKNOWN; it is UNAVAILABLE (send it again).
fn undecodable_is_invalid<B>(mut response: http::Response<B>) -> http::Response<B> {
    let headers = response.headers_mut();
    let code = headers.get("grpc-status").cloned();
    if code.as_ref().is_some_and(|c| c == "13")
        && grpc_message_says(headers, "failed to decode Protobuf message")
    {
        headers.insert("grpc-status", http::HeaderValue::from_static("3"));
    } else if code.as_ref().is_some_and(|c| c == "2")
        && (grpc_message_says(headers, "the source is stopping")
            || grpc_message_says(headers, "the body did not arrive within"))
    {
        headers.insert("grpc-status", http::HeaderValue::from_static("14"));
    }
    response
}

/// tonic refuses a message over `max_decoding_message_size` itself, as
/// OUT_OF_RANGE — which the OTLP specification lists as retryable, so an
/// exporter would send the same oversized request for ever. It is
/// answered RESOURCE_EXHAUSTED without RetryInfo instead: not retryable.
fn too_large_is_exhausted<B>(mut response: http::Response<B>) -> http::Response<B> {
    let headers = response.headers_mut();
    let out_of_range = headers.get("grpc-status").is_some_and(|s| s == "11");
    if out_of_range && grpc_message_says(headers, "message length too large") {
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
    }
    response
}

async fn not_logs() -> Response {
    (
        StatusCode::NOT_FOUND,
        "this OTLP source takes logs only (POST /v1/logs); traces and metrics are not supported\n",
    )
        .into_response()
}

/// How an OTLP/HTTP body is encoded.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Protobuf,
    Json,
}

fn http_answer(encoding: Encoding, status: StatusCode, body: Vec<u8>) -> Response {
    let content_type = match encoding {
        Encoding::Protobuf => "application/x-protobuf",
        Encoding::Json => "application/json",
    };
    (status, [(header::CONTENT_TYPE, content_type)], body).into_response()
}

fn http_refusal(encoding: Encoding, refusal: &Refusal, retry_after: u64) -> Response {
    let (status, message, code) = refusal.http();
    let body = match encoding {
        Encoding::Protobuf => RpcStatus {
            code,
            message: message.to_string(),
        }
        .encode_to_vec(),
        Encoding::Json => {
            serde_json::to_vec(&serde_json::json!({"code": code, "message": message}))
                .unwrap_or_default()
        }
    };
    let mut r = http_answer(encoding, status, body);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(
            header::RETRY_AFTER,
            retry_after.to_string().parse().expect("a number"),
        );
    }
    r
}

async fn http_logs(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    let o = &s.options;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let encoding = match content_type.split(';').next().unwrap_or("").trim() {
        "application/x-protobuf" | "application/protobuf" => Encoding::Protobuf,
        "application/json" => Encoding::Json,
        other => {
            return (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "Content-Type `{other}` is not OTLP (application/x-protobuf or application/json)\n"
                ),
            )
                .into_response();
        }
    };
    let refuse = |r: Refusal| http_refusal(encoding, &r, o.retry_after_secs);
    // A slot before the body is read: memory is bounded by the slots.
    let _slot = match s.slot().await {
        Ok(slot) => slot,
        Err(r) => return refuse(r),
    };
    let raw = match axum::body::to_bytes(body, o.max_request_bytes).await {
        Ok(raw) => raw,
        Err(e) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|e| e.is::<http_body_util::LengthLimitError>());
            return refuse(if too_large {
                Refusal::TooLarge(format!(
                    "the body is larger than {} bytes",
                    o.max_request_bytes
                ))
            } else if let Some(cut) = logbus_connections::http::BodyCut::of(&e) {
                // Stalled or stopped: the slot goes back; send it again.
                Refusal::Unavailable(format!("reading the body: {cut}"))
            } else {
                Refusal::Invalid(format!("reading the body: {e}"))
            });
        }
    };
    let content_encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity");
    let decoded = match logbus_compress::decode_content(content_encoding, &raw, o.max_request_bytes)
    {
        Ok(None) => raw.to_vec(),
        Ok(Some(d)) => d,
        Err(logbus_compress::Undecodable::TooLarge(m)) => return refuse(Refusal::TooLarge(m)),
        Err(
            logbus_compress::Undecodable::Malformed(m)
            | logbus_compress::Undecodable::Unsupported(m),
        ) => {
            return refuse(Refusal::Invalid(m));
        }
    };
    drop(raw);
    let request = match encoding {
        Encoding::Protobuf => crate::model::decode_protobuf(&decoded),
        Encoding::Json => crate::model::decode_json(&decoded),
    }
    .map_err(Refusal::Invalid);
    drop(decoded);
    let request = match request {
        Ok(r) => r,
        Err(r) => return refuse(r),
    };
    match s.accept(request).await {
        Ok(response) => {
            let body = match encoding {
                Encoding::Protobuf => response.encode_to_vec(),
                Encoding::Json => response_json(&response),
            };
            http_answer(encoding, StatusCode::OK, body)
        }
        Err(r) => refuse(r),
    }
}

/// `{}` or `{"partialSuccess": {"rejectedLogRecords": "n", "errorMessage": …}}`.
fn response_json(r: &ExportLogsServiceResponse) -> Vec<u8> {
    let v = match &r.partial_success {
        None => serde_json::json!({}),
        Some(p) => serde_json::json!({"partialSuccess": {
            "rejectedLogRecords": p.rejected_log_records.to_string(),
            "errorMessage": p.error_message,
        }}),
    };
    serde_json::to_vec(&v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: &str, message: &str) -> http::Response<()> {
        let mut r = http::Response::new(());
        r.headers_mut()
            .insert("grpc-status", status.parse().unwrap());
        r.headers_mut()
            .insert("grpc-message", message.parse().unwrap());
        r
    }

    fn status(r: &http::Response<()>) -> &str {
        r.headers()["grpc-status"].to_str().unwrap()
    }

    /// Only tonic's own "too large" OUT_OF_RANGE becomes RESOURCE_EXHAUSTED:
    /// another OUT_OF_RANGE, or the words under another status, stay.
    #[test]
    fn only_an_oversized_message_s_out_of_range_is_exhausted() {
        let too_large =
            "Error, decoded message length too large: found 9 bytes, the limit is: 4 bytes";
        let escaped = "Error,%20decoded%20message%20length%20too%20large:%20found%209%20bytes";
        assert_eq!(
            status(&too_large_is_exhausted(answer("11", too_large))),
            "8"
        );
        assert_eq!(status(&too_large_is_exhausted(answer("11", escaped))), "8");
        assert_eq!(
            status(&too_large_is_exhausted(answer("11", "offset past the end"))),
            "11"
        );
        assert_eq!(
            status(&too_large_is_exhausted(answer("13", too_large))),
            "13"
        );
        let mut bare = http::Response::new(());
        bare.headers_mut()
            .insert("grpc-status", "11".parse().unwrap());
        assert_eq!(status(&too_large_is_exhausted(bare)), "11");
    }

    /// Issue 54: protobuf that does not decode was INTERNAL; it is
    /// INVALID_ARGUMENT, as documented. A body cut off is UNAVAILABLE.
    /// Other answers keep their codes.
    #[test]
    fn undecodable_protobuf_is_invalid_argument_and_a_cut_body_unavailable() {
        let undecodable = "failed%20to%20decode%20Protobuf%20message:%20invalid%20wire%20type";
        assert_eq!(status(&otlp_status_codes(answer("13", undecodable))), "3");
        assert_eq!(
            status(&otlp_status_codes(answer(
                "13",
                "failed to decode Protobuf message: x"
            ))),
            "3"
        );
        assert_eq!(status(&otlp_status_codes(answer("13", "a panic"))), "13");
        assert_eq!(status(&otlp_status_codes(answer("2", undecodable))), "2");
        let stopping =
            "error%20reading%20a%20body%20from%20connection:%20the%20source%20is%20stopping";
        assert_eq!(status(&otlp_status_codes(answer("2", stopping))), "14");
        let slow = "the body did not arrive within 10000 ms";
        assert_eq!(status(&otlp_status_codes(answer("2", slow))), "14");
        assert_eq!(
            status(&otlp_status_codes(answer("2", "something else"))),
            "2"
        );
        // Still the oversized rewrite.
        assert_eq!(
            status(&otlp_status_codes(answer(
                "11",
                "decoded message length too large"
            ))),
            "8"
        );
    }
}
