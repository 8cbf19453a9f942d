//! `sink: otlp` — events as OpenTelemetry log records to an OTLP
//! receiver (a Collector, a vendor's endpoint, another LogBus) over gRPC
//! or HTTP (protobuf), on the sink core: batches, requests in flight,
//! retries with backoff as the OTLP specification says.
//!
//! Events are batched per resource and scope (the batch key), so each
//! request is one `ResourceLogs` holding one `ScopeLogs`, and each event
//! is encoded as its `LogRecord` the moment it is batched: the batch's
//! bytes are the records' field of the `ScopeLogs` message, exactly, and
//! `batch_max_bytes` is the request's size but for the few bytes of the
//! resource and scope around it. Retried: UNAVAILABLE, CANCELLED,
//! DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, DATA_LOSS, and
//! RESOURCE_EXHAUSTED when the server sent a RetryInfo (its delay is
//! honoured); HTTP 429, 502, 503, 504 (with `Retry-After`) and connection
//! failures. Anything else refuses the batch. A partial success is logged
//! with the receiver's count and message: the receiver does not say which
//! records it refused, and says sending them again will not help.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use logbus_plugin_api::connect::{self, ConnectContext, Probe, ServiceFinding};
use logbus_plugin_api::{
    BuildContext, Bytes, CheckOptions, Event, OptionError, Sink, StageKind, TypedPlugin,
    async_trait,
};
use logbus_sink::{
    Batch, BatchDefaults, Batching, Driver, DriverConfig, Encoder, OnRejected, Response,
    RetryDefaults, Retrying, Service, check_requests, error_chain, parse_retry_after,
};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};
use serde::Deserialize;

use crate::model::{
    Mapping, RpcStatus, fields_to_record, resource_and_scope, resource_of, scope_of,
};

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// OTLP/gRPC (`http://host:4317`).
    #[default]
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http://host:4318`, `/v1/logs`
    /// added when the URL has no path).
    Http,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum OtlpCompression {
    None,
    #[default]
    Gzip,
}

/// Options of `sink: otlp`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OtlpSinkOptions {
    /// The receiver's URL: `http://collector:4317` (gRPC),
    /// `http://collector:4318` or a full `…/v1/logs` URL (HTTP).
    pub endpoint: String,
    #[serde(default)]
    pub protocol: Protocol,
    #[serde(default)]
    pub compression: OtlpCompression,
    /// Sent with every request (gRPC metadata or HTTP headers), e.g. an
    /// API key: `{ x-api-key: "${KEY}" }`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The field that is the record's body (default `body`, else
    /// `message`).
    pub body_field: Option<String>,
    /// The field that is the severity text (default `severity_text`, else
    /// `level`); the number follows from it unless `severity_number` is set.
    pub severity_field: Option<String>,
    /// The field that is the record's time, RFC 3339 or integer
    /// nanoseconds (default `time_unix_nano`, else `timestamp`).
    pub time_field: Option<String>,
    /// HTTP: the gzip level, 1 (fastest) to 9 (smallest); default 6.
    /// gzip at 6 is what bounds the sink's rate on one core; 1 was 3.2×
    /// as fast, for larger bodies (docs/benchmarks.md).
    #[schemars(range(min = 1, max = 9))]
    pub compression_level: Option<u32>,
    /// An https:// endpoint (either protocol): a private CA to trust
    /// and the name to verify instead of the host's. gRPC asks for ALPN
    /// `h2`.
    #[serde(default)]
    pub tls: Option<logbus_tls::ClientTls>,
    #[serde(flatten)]
    pub batching: Batching<OtlpDefaults>,
    #[serde(default = "default_request_timeout")]
    #[schemars(range(min = 1))]
    pub request_timeout_ms: u64,
    #[serde(flatten)]
    pub retrying: Retrying<OtlpDefaults>,
    #[serde(default = "default_in_flight")]
    #[schemars(range(min = 1, max = 64))]
    pub in_flight: usize,
    #[serde(default)]
    pub on_rejected: OnRejected,
}

/// `sink: otlp`'s own batch and retry defaults.
pub struct OtlpDefaults;

impl BatchDefaults for OtlpDefaults {
    const BATCH_MAX_EVENTS: usize = 1000;
    const BATCH_MAX_BYTES: usize = 1 << 20;
    const BATCH_TIMEOUT_MS: u64 = 1000;
}

impl RetryDefaults for OtlpDefaults {}

fn default_request_timeout() -> u64 {
    10_000
}
fn default_in_flight() -> usize {
    4
}

impl OtlpSinkOptions {
    /// The URL requests go to.
    fn url(&self) -> String {
        let e = self.endpoint.trim_end_matches('/');
        match self.protocol {
            Protocol::Http
                if e.split_once("://")
                    .is_some_and(|(_, rest)| !rest.contains('/')) =>
            {
                format!("{e}/v1/logs")
            }
            _ => e.to_string(),
        }
    }
}

impl CheckOptions for OtlpSinkOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        match self.endpoint.split_once("://") {
            Some(("http" | "https", rest)) if !rest.is_empty() => {}
            _ => errors.push(OptionError::at(
                &["endpoint"],
                format!("`{}` is not an http:// or https:// URL", self.endpoint),
            )),
        }
        if self.tls.is_some() && !self.endpoint.starts_with("https://") {
            errors.push(OptionError::at(
                &["tls"],
                "applies to an https:// endpoint only",
            ));
        }
        if self.compression_level.is_some() && self.protocol == Protocol::Grpc {
            errors.push(OptionError::at(
                &["compression_level"],
                "applies to `protocol: http` only (gRPC's gzip level is fixed at 6 by tonic)",
            ));
        }
        if self.compression_level.is_some() && self.compression == OtlpCompression::None {
            errors.push(OptionError::at(
                &["compression_level"],
                "needs `compression: gzip`",
            ));
        }
        for (key, field) in [
            ("body_field", &self.body_field),
            ("severity_field", &self.severity_field),
            ("time_field", &self.time_field),
        ] {
            if field.as_deref().is_some_and(str::is_empty) {
                errors.push(OptionError::at(&[key], "must not be empty"));
            }
        }
        errors.extend(self.batching.check());
        errors.extend(self.retrying.check());
        errors.extend(check_requests(self.request_timeout_ms, self.in_flight, 64));
        for (name, value) in &self.headers {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
            {
                errors.push(OptionError::at(
                    &["headers", name],
                    "not a valid header name",
                ));
            } else if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                errors.push(OptionError::at(
                    &["headers", name],
                    "only printable ASCII is allowed in a header value",
                ));
            }
        }
        errors
    }
}

pub struct OtlpSink;

impl TypedPlugin for OtlpSink {
    type Options = OtlpSinkOptions;
    const NAME: &'static str = "otlp";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "OpenTelemetry log records to an OTLP receiver over gRPC or HTTP (protobuf, gzip, headers), batched per resource and scope, retried as the OTLP specification says; commits once the receiver accepted the request.";

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

    /// An empty export (no log records) sent as the stage would send a
    /// batch: the endpoint, protocol, TLS and headers (credentials)
    /// answered for, nothing stored.
    fn connect(&self, options: &OtlpSinkOptions, cx: ConnectContext) -> Option<Probe> {
        let service = service(options, &cx.build_context());
        Some(Box::pin(async move {
            let service = match service {
                Ok(s) => s,
                Err(e) => return vec![ServiceFinding::setup(e)],
            };
            let empty = match service.compressed(Vec::new()) {
                Ok(b) => b,
                Err(e) => return vec![ServiceFinding::error(connect::SETUP, &["compression"], e)],
            };
            match service.export(empty).await {
                Ok(_) => Vec::new(),
                Err(Response::Retry { reason, .. }) => vec![ServiceFinding::error(
                    connect::UNREACHABLE,
                    &["endpoint"],
                    format!("{}: {reason}", service.url),
                )],
                Err(Response::Rejected { reason }) => {
                    let denied = ["401", "403", "Unauthenticated", "PermissionDenied"]
                        .iter()
                        .any(|w| reason.contains(w));
                    let at: &[&str] = if denied { &["headers"] } else { &["endpoint"] };
                    vec![ServiceFinding::error(
                        connect::REFUSED,
                        at,
                        format!("{} refused an empty export: {reason}", service.url),
                    )]
                }
                Err(other) => vec![ServiceFinding::error(
                    connect::REFUSED,
                    &["endpoint"],
                    format!("{}: {other:?}", service.url),
                )],
            }
        }))
    }

    fn build(
        &self,
        options: OtlpSinkOptions,
        cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let service = service(&options, cx)?;
        let config = DriverConfig {
            limits: options.batching.limits(),
            retry: options.retrying.policy(),
            in_flight: options.in_flight,
            on_rejected: options.on_rejected,
            destination: format!(
                "OTLP/{} {}",
                match options.protocol {
                    Protocol::Grpc => "gRPC",
                    Protocol::Http => "HTTP",
                },
                service.url
            ),
        };
        let encoder = RecordEncoder(Mapping {
            body: options.body_field.clone(),
            severity_text: options.severity_field.clone(),
            time: options.time_field.clone(),
        });
        let driver = Driver::new(service, encoder, config).partition_by(batch_key);
        Ok(Box::new(driver))
    }
}

/// The transport as the options set it up (the stage's and the probe's).
fn service(options: &OtlpSinkOptions, cx: &BuildContext) -> Result<OtlpService, OptionError> {
    let url = options.url();
    let transport = match options.protocol {
        Protocol::Grpc => {
            let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
                .map_err(|e| OptionError::at(&["endpoint"], e.to_string()))?
                .connect_timeout(Duration::from_millis(options.request_timeout_ms))
                .timeout(Duration::from_millis(options.request_timeout_ms))
                .tcp_nodelay(true);
            let mut metadata = tonic::metadata::MetadataMap::new();
            for (k, v) in &options.headers {
                let key =
                    tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                        .map_err(|_| OptionError::at(&["headers", k], "not a valid header name"))?;
                let value = v
                    .parse()
                    .map_err(|_| OptionError::at(&["headers", k], "not a valid header value"))?;
                metadata.insert(key, value);
            }
            let tls = if url.starts_with("https://") {
                let uri: tonic::codegen::http::Uri = url
                    .parse()
                    .map_err(|e| OptionError::at(&["endpoint"], format!("{e}")))?;
                let host = uri.host().unwrap_or_default();
                let port = uri.port_u16().unwrap_or(443);
                let settings = options.tls.clone().unwrap_or_default();
                let name = settings
                    .server_name(&format!("{host}:{port}"))
                    .map_err(|e| OptionError::at(&["tls"], e.to_string()))?;
                let config = settings
                    .config_with_alpn(&cx.base_dir, &[b"h2"])
                    .map_err(|e| OptionError::at(&["tls"], e.to_string()))?;
                Some(TlsConnect {
                    connector: logbus_tls::TlsConnector::from(config),
                    name,
                    host: host.trim_start_matches('[').trim_end_matches(']').into(),
                    port,
                })
            } else {
                None
            };
            Transport::Grpc {
                endpoint: Box::new(endpoint),
                tls,
                channel: OnceLock::new(),
                metadata,
            }
        }
        Protocol::Http => {
            let tls = options.tls.clone().unwrap_or_default();
            let tls = tls
                .config(&cx.base_dir)
                .map_err(|e| OptionError::at(&["tls"], e.to_string()))?;
            let client = reqwest::Client::builder()
                .use_preconfigured_tls((*tls).clone())
                .timeout(Duration::from_millis(options.request_timeout_ms))
                .pool_max_idle_per_host(options.in_flight)
                .build()
                .map_err(|e| {
                    OptionError::at(&["endpoint"], format!("building the HTTP client: {e}"))
                })?;
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(
                reqwest::header::CONTENT_TYPE,
                reqwest::header::HeaderValue::from_static("application/x-protobuf"),
            );
            if options.compression == OtlpCompression::Gzip {
                headers.insert(
                    reqwest::header::CONTENT_ENCODING,
                    reqwest::header::HeaderValue::from_static("gzip"),
                );
            }
            for (k, v) in &options.headers {
                let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                    .map_err(|_| OptionError::at(&["headers", k], "not a valid header name"))?;
                let value = reqwest::header::HeaderValue::from_str(v)
                    .map_err(|_| OptionError::at(&["headers", k], "not a valid header value"))?;
                headers.insert(name, value);
            }
            Transport::Http { client, headers }
        }
    };
    Ok(OtlpService {
        transport,
        url,
        gzip: options.compression == OtlpCompression::Gzip,
        gzip_level: options.compression_level.unwrap_or(6),
    })
}

/// Events with the same resource and scope share a request.
fn batch_key(event: &Event) -> String {
    match event.as_fields() {
        Some(f) => serde_json::to_string(&resource_and_scope(f)).unwrap_or_default(),
        None => String::new(),
    }
}

/// Each event as the `log_records` field (2) of a `ScopeLogs`.
struct RecordEncoder(Mapping);

impl Encoder for RecordEncoder {
    fn encode(&self, event: &Event, out: &mut Vec<u8>) -> Result<(), String> {
        let raw = event.as_raw().map(|b| &b[..]).unwrap_or(b"");
        let record = fields_to_record(event.as_fields(), raw, event.meta().ingest_ns, &self.0);
        prost::encoding::message::encode(2, &record, out);
        Ok(())
    }
}

enum Transport {
    Grpc {
        endpoint: Box<tonic::transport::Endpoint>,
        /// An https:// endpoint: how to make its TLS connections.
        tls: Option<TlsConnect>,
        /// Made on the first request (it needs the runtime); it connects
        /// and reconnects by itself.
        channel: OnceLock<tonic::transport::Channel>,
        metadata: tonic::metadata::MetadataMap,
    },
    Http {
        client: reqwest::Client,
        headers: reqwest::header::HeaderMap,
    },
}

struct OtlpService {
    transport: Transport,
    url: String,
    gzip: bool,
    gzip_level: u32,
}

/// TLS connections for OTLP/gRPC to an https:// endpoint, made with the
/// shared client settings (tonic's own TLS would read certificates a
/// second way).
#[derive(Clone)]
struct TlsConnect {
    connector: logbus_tls::TlsConnector,
    name: logbus_tls::ServerName<'static>,
    host: Arc<str>,
    port: u16,
}

type TlsIo =
    hyper_util::rt::TokioIo<logbus_tls::tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

impl TlsConnect {
    /// The connector tonic's channel calls for each (re)connection; the
    /// URI is the endpoint's, already known.
    fn service(
        self,
    ) -> impl tower::Service<
        tonic::codegen::http::Uri,
        Response = TlsIo,
        Error = std::io::Error,
        Future = impl Future<Output = std::io::Result<TlsIo>> + Send,
    > + Send
    + 'static {
        tower::service_fn(move |_: tonic::codegen::http::Uri| {
            let tls = self.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect((&*tls.host, tls.port)).await?;
                tcp.set_nodelay(true)?;
                let stream = tls.connector.connect(tls.name, tcp).await?;
                Ok(hyper_util::rt::TokioIo::new(stream))
            }
        })
    }
}

/// Appends a length-delimited field.
fn field(tag: u32, bytes: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// Most bytes of an error answer kept for the message.
const REASON_BYTES: usize = 512;

#[async_trait]
impl Service for OtlpService {
    type Request = Bytes;

    /// `ExportLogsServiceRequest { resource_logs: [ResourceLogs { resource,
    /// scope_logs: [ScopeLogs { scope, log_records: <the batch> }] }] }`.
    fn prepare(&self, batch: &Batch) -> Result<Bytes, String> {
        let (resource, scope) = batch
            .events()
            .first()
            .and_then(|e| e.as_fields())
            .map(resource_and_scope)
            .unwrap_or_default();
        let mut scope_logs = Vec::with_capacity(batch.body().len() + 64);
        if !scope.is_empty() {
            prost::encoding::message::encode(1, &scope_of(&scope), &mut scope_logs);
        }
        scope_logs.extend_from_slice(batch.body());
        let mut resource_logs = Vec::with_capacity(scope_logs.len() + 256);
        if !resource.is_empty() {
            prost::encoding::message::encode(1, &resource_of(&resource), &mut resource_logs);
        }
        field(2, &scope_logs, &mut resource_logs);
        drop(scope_logs);
        let mut request = Vec::with_capacity(resource_logs.len() + 8);
        field(1, &resource_logs, &mut request);
        self.compressed(request)
    }

    async fn send(&self, request: &Bytes) -> Response {
        match self.export(request.clone()).await {
            Ok(Some(partial)) => {
                tracing::warn!(
                    destination = %self.url,
                    "the receiver refused {} log records for good: {}",
                    partial.rejected_log_records,
                    partial.error_message
                );
                Response::Delivered
            }
            Ok(None) => Response::Delivered,
            Err(response) => response,
        }
    }
}

impl OtlpService {
    /// The request as sent: gzip-compressed for OTLP/HTTP with
    /// `compression: gzip` (gRPC compresses its own frames).
    fn compressed(&self, request: Vec<u8>) -> Result<Bytes, String> {
        if !(self.gzip && matches!(self.transport, Transport::Http { .. })) {
            return Ok(Bytes::from(request));
        }
        let mut w = flate2::write::GzEncoder::new(
            Vec::with_capacity(request.len() / 4),
            flate2::Compression::new(self.gzip_level),
        );
        w.write_all(&request)
            .map_err(|e| format!("compressing the request: {e}"))?;
        w.finish()
            .map(Bytes::from)
            .map_err(|e| format!("compressing the request: {e}"))
    }

    /// One export request and what the receiver answered.
    async fn export(&self, request: Bytes) -> Answer {
        match &self.transport {
            Transport::Grpc {
                endpoint,
                tls,
                channel,
                metadata,
            } => {
                let channel = channel
                    .get_or_init(|| match tls {
                        None => endpoint.connect_lazy(),
                        Some(tls) => endpoint.connect_with_connector_lazy(tls.clone().service()),
                    })
                    .clone();
                send_grpc(channel, metadata, request, self.gzip).await
            }
            Transport::Http { client, headers } => {
                send_http(client, &self.url, headers, request).await
            }
        }
    }
}

type Answer = Result<
    Option<opentelemetry_proto::tonic::collector::logs::v1::ExportLogsPartialSuccess>,
    Response,
>;

fn partial(r: ExportLogsServiceResponse) -> Answer {
    Ok(r.partial_success.filter(|p| p.rejected_log_records > 0))
}

async fn send_grpc(
    channel: tonic::transport::Channel,
    metadata: &tonic::metadata::MetadataMap,
    body: Bytes,
    gzip: bool,
) -> Answer {
    use tonic::Code;
    let mut grpc = tonic::client::Grpc::new(channel);
    if gzip {
        grpc = grpc.send_compressed(tonic::codec::CompressionEncoding::Gzip);
    }
    grpc = grpc.accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    if let Err(e) = grpc.ready().await {
        return Err(Response::Retry {
            reason: format!("connecting: {}", error_chain(&e)),
            retry_after: None,
        });
    }
    let mut request = tonic::Request::new(body);
    *request.metadata_mut() = metadata.clone();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
    );
    match grpc.unary(request, path, RawCodec).await {
        Ok(response) => partial(response.into_inner()),
        Err(status) => {
            use tonic_types::StatusExt;
            let retry_after = status.get_details_retry_info().and_then(|r| r.retry_delay);
            let reason = format!("{:?}: {}", status.code(), status.message());
            let retryable = match status.code() {
                Code::Unavailable
                | Code::Cancelled
                | Code::DeadlineExceeded
                | Code::Aborted
                | Code::OutOfRange
                | Code::DataLoss => true,
                Code::ResourceExhausted => retry_after.is_some(),
                _ => false,
            };
            Err(if retryable {
                Response::Retry {
                    reason,
                    retry_after,
                }
            } else {
                Response::Rejected { reason }
            })
        }
    }
}

async fn send_http(
    client: &reqwest::Client,
    url: &str,
    headers: &reqwest::header::HeaderMap,
    body: Bytes,
) -> Answer {
    let sent = client
        .post(url)
        .headers(headers.clone())
        .body(body)
        .send()
        .await;
    let mut resp = match sent {
        Ok(r) => r,
        Err(e) => {
            return Err(Response::Retry {
                reason: error_chain(&e),
                retry_after: None,
            });
        }
    };
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, SystemTime::now()));
    let mut text = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        text.extend_from_slice(&chunk);
        if status / 100 != 2 && text.len() >= REASON_BYTES {
            break;
        }
    }
    if (200..300).contains(&status) {
        return match ExportLogsServiceResponse::decode(&text[..]) {
            Ok(r) => partial(r),
            // A 2xx is acceptance whatever its body says.
            Err(_) => Ok(None),
        };
    }
    // The body is a google.rpc.Status (message in field 2) or text.
    let message = RpcStatus::decode(&text[..])
        .ok()
        .filter(|s| !s.message.is_empty())
        .map(|s| s.message)
        .unwrap_or_else(|| {
            text.truncate(REASON_BYTES);
            String::from_utf8_lossy(&text).trim().to_string()
        });
    let reason = format!("HTTP {status}: {message}");
    Err(if matches!(status, 429 | 502 | 503 | 504) {
        Response::Retry {
            reason,
            retry_after,
        }
    } else {
        Response::Rejected { reason }
    })
}

/// gRPC with the request already encoded (the batch's bytes) and the
/// response decoded as protobuf.
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Bytes;
    type Decode = ExportLogsServiceResponse;
    type Encoder = RawEncoder;
    type Decoder = ResponseDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

struct RawEncoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes_put(dst, &item);
        Ok(())
    }
}

fn bytes_put(dst: &mut tonic::codec::EncodeBuf<'_>, bytes: &[u8]) {
    use prost::bytes::BufMut;
    dst.put_slice(bytes);
}

struct ResponseDecoder;

impl tonic::codec::Decoder for ResponseDecoder {
    type Item = ExportLogsServiceResponse;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<ExportLogsServiceResponse>, tonic::Status> {
        ExportLogsServiceResponse::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(format!("decoding the response: {e}")))
    }
}
