//! `sink: opensearch` — the `_bulk` API on the sink core. An event is
//! committed, and acknowledged to its source, only once OpenSearch said
//! its own item was stored.
//!
//! Bulk answers are per item, so outcomes are too: an item answered 429
//! or 5xx is sent again (alone with the others that failed, not the whole
//! batch); an item refused for its content (a mapping conflict, a parse
//! error) goes to `<id>.dead` with the server's reason; a `create` answered
//! 409 for an id that is already there counts as delivered (it is how a
//! retried bulk looks once its first attempt landed). A request that fails
//! as a whole (connection lost, 429, 5xx, a timeout) is retried whole.
//!
//! The bulk body is written by the encoder, action line and document
//! together, so `batch_max_bytes` is the exact size of what is sent
//! (before gzip). The HTTP client is the sink core's reqwest rather than
//! the `opensearch` crate: that crate re-serialises typed operations and
//! brings its own transport, while the sink already has each item's bytes
//! and a pooled, TLS-configured client (docs/plugins/opensearch.md).

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use logbus_compress::{CompressWriter, Compression};
use logbus_plugin_api::connect::{self, ConnectContext, Probe, ServiceFinding};
use logbus_plugin_api::{
    BuildContext, Bytes, CheckOptions, Event, FieldPath, OptionError, Payload, Sink, StageKind,
    TypedPlugin, async_trait,
};
use logbus_sink::{
    Batch, BatchDefaults, Batching, Driver, DriverConfig, Encoder, ItemResult, OnRejected,
    Response, RetryDefaults, Retrying, Service, Template, check_requests, error_chain,
    event_time_ms, parse_retry_after,
};
use serde::Deserialize;
use serde_json::Value;

/// The bulk action of every event.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Add or replace the document (with `id_field`, a retry replaces
    /// instead of duplicating).
    #[default]
    Index,
    /// Add only; needed for data streams. With `id_field`, a document that
    /// exists already (409) counts as delivered.
    Create,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Index => "index",
            Action::Create => "create",
        }
    }
}

/// Bulk bodies as they are (the default: on a LAN gzip costs both sides
/// more CPU than it saves, docs/benchmarks.md), or gzipped for slow links.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum BodyCompression {
    #[default]
    None,
    /// `Content-Encoding: gzip` (OpenSearch accepts it by default).
    Gzip,
}

/// Options of `sink: opensearch`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenSearchSinkOptions {
    /// Node URLs (`http://host:9200`, `https://…`); requests go to each in
    /// turn.
    pub endpoints: Vec<String>,
    /// The index (or data stream) of each event: `{{field}}` from the
    /// event, strftime directives (`%Y.%m.%d`) from its time
    /// (`time_field`), in UTC: `logs-{{service}}-%Y.%m.%d`.
    pub index: String,
    /// `index` (default) or `create` (data streams need it).
    #[serde(default)]
    pub action: Action,
    /// Field holding the document id, so a retried bulk replaces (or, with
    /// `create`, skips) instead of duplicating. Unset: OpenSearch picks
    /// ids, and a bulk retried after a lost answer can store twice.
    #[serde(default)]
    pub id_field: Option<String>,
    /// Name each document by where its source read the event (a tailed
    /// file and byte offset, a Kafka partition and offset), so what a
    /// crash makes a checkpointing source read again replaces (with
    /// `create`: is skipped as) the document already stored: each event
    /// once in the index across kill -9 (docs/reliability.md). Every
    /// source must reach this sink one way only (`validate` checks).
    /// Events from sources that cannot read again (stdin, syslog) get ids
    /// from OpenSearch. Not with `id_field`.
    #[serde(default)]
    pub id_from_position: bool,
    /// Field whose value is the shard routing key.
    #[serde(default)]
    pub routing_field: Option<String>,
    /// Ingest pipeline for every document (a template: `{{field}}` works).
    #[serde(default)]
    pub pipeline: Option<String>,
    /// Field with the event's time, for the date in `index`: RFC 3339
    /// text, or a number of epoch milliseconds (seconds when below 10^11).
    /// Missing or unreadable: the time LogBus read the event.
    #[serde(default = "default_time_field")]
    pub time_field: String,
    /// `none` (default) or `gzip`.
    #[serde(default)]
    pub compression: BodyCompression,
    /// Basic authentication: the user name.
    #[serde(default)]
    pub username: Option<String>,
    /// Basic authentication: the environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
    /// The environment variable holding a bearer token
    /// (`Authorization: Bearer …`).
    #[serde(default)]
    pub bearer_token_env: Option<String>,
    /// For `https://`: `{ ca_file: ... }` trusts a private CA.
    #[serde(default)]
    pub tls: Option<logbus_tls::ClientTls>,
    #[serde(flatten)]
    pub batching: Batching<OpenSearchDefaults>,
    /// Whole-request timeout (connect, send, answer).
    #[serde(default = "default_request_timeout")]
    #[schemars(range(min = 1))]
    pub request_timeout_ms: u64,
    #[serde(flatten)]
    pub retrying: Retrying<OpenSearchDefaults>,
    /// Most bulks waiting for an answer at once.
    #[serde(default = "default_in_flight")]
    #[schemars(range(min = 1, max = 256))]
    pub in_flight: usize,
    /// Documents refused for good, when no stage reads `<id>.dead`: `fail`
    /// (default) or `drop`.
    #[serde(default)]
    pub on_rejected: OnRejected,
}

fn default_time_field() -> String {
    "@timestamp".into()
}
fn default_in_flight() -> usize {
    4
}
fn default_request_timeout() -> u64 {
    30_000
}

/// `sink: opensearch`'s own batch and retry defaults.
pub struct OpenSearchDefaults;

impl BatchDefaults for OpenSearchDefaults {
    const BATCH_MAX_EVENTS: usize = 1000;
    const BATCH_MAX_BYTES: usize = 5 << 20;
    const BATCH_TIMEOUT_MS: u64 = 1000;
}

impl RetryDefaults for OpenSearchDefaults {}

impl CheckOptions for OpenSearchSinkOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if self.endpoints.is_empty() {
            errors.push(OptionError::at(&["endpoints"], "needs at least one URL"));
        }
        for (i, url) in self.endpoints.iter().enumerate() {
            match url.split_once("://") {
                Some(("http" | "https", rest)) if !rest.is_empty() => {}
                _ => errors.push(OptionError::at(
                    &["endpoints", &i.to_string()],
                    format!("`{url}` is not an http:// or https:// URL"),
                )),
            }
        }
        if let Err(e) = Template::parse_timed(&self.index) {
            errors.push(OptionError::at(&["index"], e));
        }
        if let Some(p) = &self.pipeline
            && let Err(e) = Template::parse(p)
        {
            errors.push(OptionError::at(&["pipeline"], e));
        }
        for (key, field) in [
            ("id_field", self.id_field.as_deref()),
            ("routing_field", self.routing_field.as_deref()),
            ("time_field", Some(self.time_field.as_str())),
        ] {
            if let Some(f) = field
                && let Err(e) = FieldPath::parse(f)
            {
                errors.push(OptionError::at(&[key], e.to_string()));
            }
        }
        if self.id_from_position && self.id_field.is_some() {
            errors.push(OptionError::at(
                &["id_from_position"],
                "choose ids from a field (`id_field`) or from positions, not both",
            ));
        }
        if self.password_env.is_some() && self.username.is_none() {
            errors.push(OptionError::at(
                &["password_env"],
                "needs `username` (basic authentication)",
            ));
        }
        if self.bearer_token_env.is_some() && self.username.is_some() {
            errors.push(OptionError::at(
                &["bearer_token_env"],
                "choose basic authentication (`username`) or a bearer token, not both",
            ));
        }
        if self.tls.as_ref().is_some_and(|t| t.server_name.is_some()) {
            errors.push(OptionError::at(
                &["tls", "server_name"],
                "the URL's host is the name verified",
            ));
        }
        errors.extend(self.batching.check());
        errors.extend(self.retrying.check());
        errors.extend(check_requests(self.request_timeout_ms, self.in_flight, 256));
        errors
    }
}

pub struct OpenSearchSink;

impl TypedPlugin for OpenSearchSink {
    type Options = OpenSearchSinkOptions;
    const NAME: &'static str = "opensearch";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "OpenSearch _bulk (index or create, index names from fields and the event's date, ids from a field, ingest pipeline, gzip), several bulks in flight; per-item outcomes: 429/5xx retried, refused documents to <id>.dead with the reason.";

    /// The CA file, and the variables the credentials come from.
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
            .chain(StatedNeed::secret_env(
                o.bearer_token_env.as_deref(),
                "bearer_token_env",
            ))
            .collect()
    }

    /// The index and pipeline templates' fields and `id_field` (a
    /// missing `time_field` falls back to the ingest time: not a read).
    fn flow(&self, o: &Self::Options) -> logbus_plugin_api::Flow {
        use logbus_plugin_api::flow::template_reads;
        use logbus_plugin_api::{FieldRead, Flow, ReadRole};
        let mut reads = template_reads(&o.index, &["index"]);
        reads.extend(
            o.pipeline
                .iter()
                .flat_map(|p| template_reads(p, &["pipeline"])),
        );
        reads.extend(
            o.id_field
                .iter()
                .map(|f| FieldRead::new(f.clone(), &["id_field"], ReadRole::Required)),
        );
        let flow = reads.into_iter().fold(Flow::pass(), Flow::read);
        if o.id_from_position {
            flow.then(logbus_plugin_api::Step::NamesByPosition {
                option: vec!["id_from_position".into()],
            })
        } else {
            flow
        }
    }

    fn connect(&self, options: &Self::Options, cx: ConnectContext) -> Option<Probe> {
        let fixed = |t: &str| !t.contains("{{") && !t.contains('%');
        let index = fixed(&options.index).then(|| options.index.clone());
        let pipeline = options.pipeline.clone().filter(|p| fixed(p));
        let endpoints = options.endpoints.clone();
        let connection = connection(options, &cx.build_context());
        Some(Box::pin(async move {
            match connection {
                Ok((client, auth)) => probe(client, auth, endpoints, index, pipeline).await,
                Err(e) => vec![ServiceFinding::setup(e)],
            }
        }))
    }

    fn build(&self, options: Self::Options, cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            reqwest::header::HeaderValue::from_static("application/x-ndjson"),
        );
        if options.compression == BodyCompression::Gzip {
            headers.insert(
                reqwest::header::CONTENT_ENCODING,
                reqwest::header::HeaderValue::from_static("gzip"),
            );
        }
        let (client, auth) = connection(&options, cx)?;
        let field = |key: &str, f: &str| {
            FieldPath::parse(f).map_err(|e| OptionError::at(&[key], e.to_string()))
        };
        let encoder = BulkEncoder {
            action: options.action,
            index: Template::parse_timed(&options.index)
                .map_err(|e| OptionError::at(&["index"], e))?,
            id: options
                .id_field
                .as_deref()
                .map(|f| field("id_field", f))
                .transpose()?,
            position_ids: options.id_from_position,
            routing: options
                .routing_field
                .as_deref()
                .map(|f| field("routing_field", f))
                .transpose()?,
            pipeline: options
                .pipeline
                .as_deref()
                .map(|p| Template::parse(p).map_err(|e| OptionError::at(&["pipeline"], e)))
                .transpose()?,
            time: field("time_field", &options.time_field)?,
        };
        // Only what the outcomes need comes back: a few bytes per item
        // instead of the index, id, version and shard counts of each.
        let urls = options
            .endpoints
            .iter()
            .map(|e| {
                format!(
                    "{}/_bulk?filter_path=errors,items.*.status,items.*.error",
                    e.trim_end_matches('/')
                )
            })
            .collect();
        let config = DriverConfig {
            limits: options.batching.limits(),
            retry: options.retrying.policy(),
            in_flight: options.in_flight,
            on_rejected: options.on_rejected,
            destination: format!("OpenSearch {}", options.endpoints.join(", ")),
        };
        let service = OpenSearchService {
            client,
            urls,
            next: AtomicUsize::new(0),
            headers,
            auth,
            compression: options.compression,
            action: options.action,
            with_ids: options.id_field.is_some() || options.id_from_position,
        };
        Ok(Box::new(Driver::new(service, encoder, config)))
    }
}

/// The HTTP client (TLS, timeout) and the credentials, as the stage and
/// its `validate --connect` probe use them.
fn connection(
    options: &OpenSearchSinkOptions,
    cx: &BuildContext,
) -> Result<(reqwest::Client, Auth), OptionError> {
    let secret = |key: &str, var: &str| {
        std::env::var(var).map_err(|_| {
            OptionError::at(
                &[key],
                format!("the environment variable `{var}` is not set (or not UTF-8)"),
            )
        })
    };
    let auth = match (&options.username, &options.bearer_token_env) {
        (Some(user), _) => Auth::Basic {
            user: user.clone(),
            password: options
                .password_env
                .as_deref()
                .map(|var| secret("password_env", var))
                .transpose()?,
        },
        (None, Some(var)) => Auth::Bearer(secret("bearer_token_env", var)?.trim().to_string()),
        (None, None) => Auth::None,
    };
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
        .map_err(|e| OptionError::at(&["endpoints"], format!("building the HTTP client: {e}")))?;
    Ok((client, auth))
}

impl Auth {
    fn apply(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self {
            Auth::None => request,
            Auth::Basic { user, password } => request.basic_auth(user, password.as_deref()),
            Auth::Bearer(token) => request.bearer_auth(token),
        }
    }
}

/// `validate --connect`: each endpoint answers with these credentials; a
/// fixed index may be created if missing (unless the cluster forbids it);
/// a fixed ingest pipeline exists.
async fn probe(
    client: reqwest::Client,
    auth: Auth,
    endpoints: Vec<String>,
    index: Option<String>,
    pipeline: Option<String>,
) -> Vec<ServiceFinding> {
    let credentials: &[&str] = match &auth {
        Auth::Bearer(_) => &["bearer_token_env"],
        _ => &["username"],
    };
    let mut found = Vec::new();
    let mut reached = None;
    for (i, endpoint) in endpoints.iter().enumerate() {
        let base = endpoint.trim_end_matches('/').to_string();
        let at = ["endpoints".to_string(), i.to_string()];
        let at: Vec<&str> = at.iter().map(String::as_str).collect();
        match auth.apply(client.get(format!("{base}/"))).send().await {
            Err(e) => found.push(ServiceFinding::error(
                connect::UNREACHABLE,
                &at,
                format!("{base}: {}", error_chain(&e)),
            )),
            Ok(r) if matches!(r.status().as_u16(), 401 | 403) => found.push(ServiceFinding::error(
                connect::REFUSED,
                credentials,
                format!("{base} refused the credentials: HTTP {}", r.status()),
            )),
            Ok(r) if !r.status().is_success() => found.push(ServiceFinding::error(
                connect::UNREACHABLE,
                &at,
                format!("{base} answered HTTP {} to GET /", r.status()),
            )),
            Ok(_) => {
                reached.get_or_insert(base);
            }
        }
    }
    let Some(base) = reached else {
        return found;
    };
    let get = |path: String| auth.apply(client.get(format!("{base}/{path}"))).send();
    if let Some(pipeline) = pipeline
        && let Ok(r) = get(format!("_ingest/pipeline/{pipeline}")).await
        && r.status() == reqwest::StatusCode::NOT_FOUND
    {
        found.push(ServiceFinding::error(
            connect::MISSING,
            &["pipeline"],
            format!("ingest pipeline `{pipeline}` does not exist on the cluster: every document would be refused"),
        ));
    }
    if let Some(index) = index
        && let Ok(r) = auth
            .apply(client.head(format!("{base}/{index}")))
            .send()
            .await
        && r.status() == reqwest::StatusCode::NOT_FOUND
    {
        let settings = get(
            "_cluster/settings?include_defaults=true&flat_settings=true&filter_path=*.action.auto_create_index".into(),
        )
        .await;
        let forbidden = match settings {
            Ok(r) => r
                .bytes()
                .await
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .is_some_and(|v| {
                    ["persistent", "transient", "defaults"]
                        .iter()
                        .any(|scope| v[scope]["action.auto_create_index"].as_str() == Some("false"))
                }),
            Err(_) => false,
        };
        if forbidden {
            found.push(ServiceFinding::error(
                connect::MISSING,
                &["index"],
                format!("index `{index}` does not exist and the cluster does not create indices (`action.auto_create_index: false`): every document would be refused"),
            ));
        }
    }
    found
}

/// One bulk item per event: the action line, then the document.
struct BulkEncoder {
    action: Action,
    index: Template,
    id: Option<FieldPath>,
    /// Without `id`: the event's source position names the document.
    position_ids: bool,
    routing: Option<FieldPath>,
    pipeline: Option<Template>,
    time: FieldPath,
}

impl BulkEncoder {
    /// The event's own time, for the date in the index name (read as
    /// every sink reads it: [`event_time_ms`]).
    fn time_of(&self, event: &Event) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(event_time_ms(event, Some(&self.time))).unwrap_or_default()
    }
}

/// A field's value as an id or routing key: a string as it is, a number
/// or boolean as its text; anything else (or nothing) is no value.
fn key_of(event: &Event, path: &FieldPath) -> Option<String> {
    match &*event.field(path)? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        v @ (Value::Number(_) | Value::Bool(_)) => Some(v.to_string()),
        _ => None,
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("a string always serialises");
}

impl Encoder for BulkEncoder {
    fn encode(&self, event: &Event, out: &mut Vec<u8>) -> Result<(), String> {
        out.extend_from_slice(b"{\"");
        out.extend_from_slice(self.action.name().as_bytes());
        out.extend_from_slice(b"\":{\"_index\":");
        write_str(out, &self.index.render_at(event, || self.time_of(event)));
        if let Some(id) = self.id.as_ref().and_then(|p| key_of(event, p)) {
            out.extend_from_slice(b",\"_id\":");
            write_str(out, &id);
        } else if self.position_ids
            && let Some(position) = event.meta().position
        {
            let id = position.id(&event.meta().source);
            write!(out, ",\"_id\":\"{id:032x}\"").expect("writing to a Vec cannot fail");
        }
        if let Some(routing) = self.routing.as_ref().and_then(|p| key_of(event, p)) {
            out.extend_from_slice(b",\"routing\":");
            write_str(out, &routing);
        }
        if let Some(pipeline) = &self.pipeline {
            out.extend_from_slice(b",\"pipeline\":");
            write_str(out, &pipeline.render(event));
        }
        out.extend_from_slice(b"}}\n");
        match event.payload() {
            Payload::Fields(f) => {
                serde_json::to_writer(&mut *out, f).map_err(|e| format!("encoding as JSON: {e}"))?
            }
            Payload::Lazy(f) => f.write_json(out),
            Payload::Raw(b) => {
                let doc = b.strip_suffix(b"\n").unwrap_or(b);
                if doc.contains(&b'\n') {
                    return Err(
                        "a raw event with a line break inside cannot be a bulk document (parse it first)"
                            .into(),
                    );
                }
                out.extend_from_slice(doc);
            }
        }
        out.push(b'\n');
        Ok(())
    }
}

/// How requests authenticate.
enum Auth {
    None,
    Basic {
        user: String,
        password: Option<String>,
    },
    Bearer(String),
}

/// One bulk: its body and how many items it carries.
struct BulkRequest {
    body: Bytes,
    items: usize,
}

struct OpenSearchService {
    client: reqwest::Client,
    urls: Vec<String>,
    next: AtomicUsize,
    headers: reqwest::header::HeaderMap,
    auth: Auth,
    compression: BodyCompression,
    action: Action,
    with_ids: bool,
}

/// Most bytes of an error answer kept for the message.
const REASON_BYTES: usize = 512;

#[derive(Deserialize)]
struct BulkAnswer {
    #[serde(default)]
    errors: bool,
    #[serde(default)]
    items: Vec<std::collections::HashMap<String, BulkItem>>,
}

#[derive(Deserialize)]
struct BulkItem {
    status: u16,
    #[serde(default)]
    error: Option<Value>,
}

/// `type: reason` of an item's error, with the cause when there is one.
fn describe(status: u16, error: Option<&Value>) -> String {
    let Some(error) = error else {
        return format!("HTTP {status}");
    };
    let text = |e: &Value| {
        let kind = e["type"].as_str().unwrap_or("error");
        match e["reason"].as_str() {
            Some(r) => format!("{kind}: {r}"),
            None => kind.to_string(),
        }
    };
    let mut out = format!("OpenSearch refused the document ({status}) {}", text(error));
    if let Some(cause) = error.get("caused_by") {
        out.push_str(" (caused by ");
        out.push_str(&text(cause));
        out.push(')');
    }
    out
}

/// What a bulk answer means for each of the `sent` items.
fn outcomes(answer: BulkAnswer, sent: usize, action: Action, with_ids: bool) -> Response {
    {
        if !answer.errors {
            return Response::Delivered;
        }
        if answer.items.len() != sent {
            return Response::Retry {
                reason: format!(
                    "the bulk answer has {} items for the {sent} sent",
                    answer.items.len()
                ),
                retry_after: None,
            };
        }
        let results = answer
            .items
            .into_iter()
            .map(|item| {
                let Some(item) = item.into_values().next() else {
                    return ItemResult::Retry("an empty bulk answer item".into());
                };
                match item.status {
                    200..=299 => ItemResult::Delivered,
                    // A create of an id already stored: an earlier attempt
                    // of this item landed.
                    409 if action == Action::Create && with_ids => ItemResult::Delivered,
                    429 | 500.. => ItemResult::Retry(describe(item.status, item.error.as_ref())),
                    status => ItemResult::Rejected(describe(status, item.error.as_ref())),
                }
            })
            .collect();
        Response::Items(results)
    }
}

#[async_trait]
impl Service for OpenSearchService {
    type Request = BulkRequest;

    fn prepare(&self, batch: &Batch) -> Result<BulkRequest, String> {
        let body = match self.compression {
            BodyCompression::None => Bytes::copy_from_slice(batch.body()),
            BodyCompression::Gzip => {
                let fail = |e: std::io::Error| format!("compressing the bulk body: {e}");
                let mut w = CompressWriter::new(
                    Vec::with_capacity(batch.body().len() / 4),
                    Compression::Gzip,
                )
                .map_err(fail)?;
                w.write_all(batch.body()).map_err(fail)?;
                Bytes::from(w.finish().map_err(fail)?)
            }
        };
        Ok(BulkRequest {
            body,
            items: batch.len(),
        })
    }

    async fn send(&self, request: &BulkRequest) -> Response {
        let url = &self.urls[self.next.fetch_add(1, Ordering::Relaxed) % self.urls.len()];
        let mut post = self
            .client
            .post(url)
            .headers(self.headers.clone())
            .body(request.body.clone());
        post = self.auth.apply(post);
        let sent = post.send().await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                return Response::Retry {
                    reason: format!("{url}: {}", error_chain(&e)),
                    retry_after: None,
                };
            }
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let text = match resp.bytes().await {
            Ok(t) => t,
            Err(e) => {
                return Response::Retry {
                    reason: format!("{url}: reading the answer: {}", error_chain(&e)),
                    retry_after,
                };
            }
        };
        if (200..300).contains(&status) {
            return match serde_json::from_slice::<BulkAnswer>(&text) {
                Ok(answer) => outcomes(answer, request.items, self.action, self.with_ids),
                Err(e) => Response::Retry {
                    reason: format!("{url}: an unreadable bulk answer: {e}"),
                    retry_after: None,
                },
            };
        }
        let shown = &text[..text.len().min(REASON_BYTES)];
        let shown = String::from_utf8_lossy(shown);
        let reason = match shown.trim() {
            // A node refusing a request too large answers with no body.
            "" => format!("{url}: HTTP {status}"),
            body => format!("{url}: HTTP {status}: {body}"),
        };
        match status {
            // Wrong credentials or permissions: retrying holds the
            // pipeline (nothing is lost) until they are fixed.
            401 | 403 | 408 | 429 | 500.. => Response::Retry {
                reason,
                retry_after,
            },
            413 => Response::Rejected {
                reason: format!(
                    "{reason} (the bulk is larger than the cluster's http.max_content_length: lower batch_max_bytes)"
                ),
            },
            _ => Response::Rejected { reason },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `validate --preflight` learns of the CA file and the variables the
    /// credentials come from.
    #[test]
    fn the_ca_file_and_the_secret_variables_are_stated() {
        let needs = |options| {
            logbus_plugin_api::testing::host_needs(
                &logbus_plugin_api::Typed(OpenSearchSink),
                options,
            )
        };
        assert_eq!(
            needs(serde_json::json!({
                "endpoints": ["https://h:9200"], "index": "i", "tls": { "ca_file": "ca.pem" },
                "username": "u", "password_env": "OS_PASSWORD",
            })),
            [
                "tls.ca_file: Pem ./ca.pem",
                "password_env: EnvVar OS_PASSWORD"
            ]
        );
        assert_eq!(
            needs(serde_json::json!({
                "endpoints": ["https://h:9200"], "index": "i", "bearer_token_env": "OS_TOKEN",
            })),
            ["bearer_token_env: EnvVar OS_TOKEN"]
        );
    }
    use logbus_plugin_api::Meta;
    use serde_json::json;

    fn event(v: Value) -> Event {
        Event::fields(v.as_object().unwrap().clone(), Meta::now("t".into()))
    }

    fn encoder(action: Action, id: Option<&str>) -> BulkEncoder {
        BulkEncoder {
            action,
            index: Template::parse_timed("logs-{{service}}-%Y.%m.%d").unwrap(),
            id: id.map(|f| FieldPath::parse(f).unwrap()),
            position_ids: false,
            routing: None,
            pipeline: None,
            time: FieldPath::parse("@timestamp").unwrap(),
        }
    }

    /// With `id_from_position`, an event's id is its position's, the same
    /// every time the event is read again; an event without a position
    /// gets none (OpenSearch picks one) and `id_field` comes first.
    #[test]
    fn position_ids_name_an_event_read_again_alike() {
        use logbus_plugin_api::Position;
        let e = BulkEncoder {
            position_ids: true,
            ..encoder(Action::Create, None)
        };
        let placed = |offset: u64, ingest_ns: u64| {
            Event::fields(
                json!({"@timestamp": "2026-03-04T00:00:00Z", "service": "api"})
                    .as_object()
                    .unwrap()
                    .clone(),
                Meta {
                    position: Some(Position::new(7, offset)),
                    ..Meta::at("logs", ingest_ns)
                },
            )
        };
        let id = |e: &BulkEncoder, event: &Event| {
            let mut out = Vec::new();
            e.encode(event, &mut out).unwrap();
            lines(&out)[0]["create"].get("_id").cloned()
        };
        let first = id(&e, &placed(100, 1)).unwrap();
        assert_eq!(first, json!(Position::new(7, 100).id_hex("logs")));
        assert_eq!(id(&e, &placed(100, 2)).unwrap(), first, "read again later");
        assert_ne!(id(&e, &placed(101, 1)).unwrap(), first);
        assert_eq!(id(&e, &event(json!({"service": "api"}))), None);
        let by_field = BulkEncoder {
            position_ids: true,
            ..encoder(Action::Create, Some("uid"))
        };
        let mut with_uid = placed(100, 1);
        with_uid.set_field(&FieldPath::parse("uid").unwrap(), json!("u-1"));
        assert_eq!(id(&by_field, &with_uid), Some(json!("u-1")));
    }

    #[test]
    fn ids_come_from_a_field_or_from_positions_not_both() {
        let errors = logbus_plugin_api::testing::option_errors(
            &logbus_plugin_api::Typed(OpenSearchSink),
            serde_json::json!({
                "endpoints": ["http://h:9200"], "index": "i",
                "id_field": "uid", "id_from_position": true,
            }),
        );
        assert_eq!(
            errors,
            "id_from_position: choose ids from a field (`id_field`) or from positions, not both"
        );
    }

    fn lines(out: &[u8]) -> Vec<Value> {
        std::str::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn the_index_date_comes_from_the_events_time() {
        let e = encoder(Action::Create, Some("uid"));
        for (time, day) in [
            (json!("2026-03-04T23:59:59+00:00"), "2026.03.04"),
            (json!("2026-03-04T23:59:59-02:00"), "2026.03.05"),
            (json!(1_772_668_800_000u64), "2026.03.05"),
            (json!(1_772_668_800u64), "2026.03.05"),
        ] {
            let mut out = Vec::new();
            e.encode(
                &event(json!({"@timestamp": time, "service": "api", "uid": 7})),
                &mut out,
            )
            .unwrap();
            let l = lines(&out);
            assert_eq!(
                l[0],
                json!({"create": {"_index": format!("logs-api-{day}"), "_id": "7"}})
            );
            assert_eq!(l[1]["service"], "api");
        }
    }

    /// An id or routing key is a non-empty string, or a number or boolean
    /// as its text; an empty string, null, an object or no field at all
    /// gives none (OpenSearch then picks the id).
    #[test]
    fn ids_come_from_strings_numbers_and_booleans_only() {
        let e = encoder(Action::Index, Some("uid"));
        let id = |uid: Option<Value>| {
            let mut v = json!({"@timestamp": "2026-03-04T00:00:00Z", "service": "api"});
            if let Some(uid) = uid {
                v["uid"] = uid;
            }
            let mut out = Vec::new();
            e.encode(&event(v), &mut out).unwrap();
            lines(&out)[0]["index"].get("_id").cloned()
        };
        assert_eq!(id(Some(json!("a-1"))), Some(json!("a-1")));
        assert_eq!(id(Some(json!(7))), Some(json!("7")));
        assert_eq!(id(Some(json!(true))), Some(json!("true")));
        for none in [json!(""), json!(null), json!({"x": 1}), json!([1])] {
            assert_eq!(id(Some(none.clone())), None, "{none}");
        }
        assert_eq!(id(None), None);
    }

    #[test]
    fn without_a_readable_time_the_ingest_time_names_the_index() {
        let e = encoder(Action::Index, None);
        let ev = event(json!({"@timestamp": "yesterday", "service": "db"}));
        let day = DateTime::from_timestamp_nanos(ev.meta().ingest_ns as i64)
            .format("%Y.%m.%d")
            .to_string();
        let mut out = Vec::new();
        e.encode(&ev, &mut out).unwrap();
        assert_eq!(
            lines(&out)[0],
            json!({"index": {"_index": format!("logs-db-{day}")}})
        );
    }

    #[test]
    fn raw_documents_keep_their_bytes_but_not_inner_line_breaks() {
        let e = encoder(Action::Index, None);
        let mut out = Vec::new();
        let raw = |b: &'static [u8]| Event::raw(Bytes::from_static(b), Meta::now("t".into()));
        e.encode(&raw(b"{\"a\":1}\n"), &mut out).unwrap();
        assert!(
            out.ends_with(b"}}\n{\"a\":1}\n"),
            "{:?}",
            String::from_utf8_lossy(&out)
        );
        let err = e.encode(&raw(b"{\"a\":\n1}"), &mut Vec::new()).unwrap_err();
        assert!(err.contains("line break"), "{err}");
    }

    #[test]
    fn item_outcomes() {
        let answer: BulkAnswer = serde_json::from_value(json!({"errors": true, "items": [
            {"create": {"status": 201}},
            {"create": {"status": 409, "error": {"type": "version_conflict_engine_exception", "reason": "exists"}}},
            {"create": {"status": 429, "error": {"type": "es_rejected_execution_exception", "reason": "queue full"}}},
            {"create": {"status": 400, "error": {"type": "mapper_parsing_exception", "reason": "failed to parse field [n]",
                "caused_by": {"type": "number_format_exception", "reason": "For input string: \"x\""}}}},
            {"create": {"status": 503}},
        ]}))
        .unwrap();
        let Response::Items(items) = outcomes(answer, 5, Action::Create, true) else {
            panic!("per item")
        };
        assert_eq!(items[0], ItemResult::Delivered);
        assert_eq!(items[1], ItemResult::Delivered, "409 on create with ids");
        assert!(matches!(&items[2], ItemResult::Retry(r) if r.contains("queue full")));
        assert!(
            matches!(&items[3], ItemResult::Rejected(r) if r.contains("mapper_parsing_exception: failed to parse field [n]") && r.contains("number_format_exception")),
            "{:?}",
            items[3]
        );
        assert!(matches!(&items[4], ItemResult::Retry(r) if r.contains("503")));
        // Without ids, a 409 is a refusal like any 4xx.
        let answer: BulkAnswer =
            serde_json::from_value(json!({"errors": true, "items": [{"create": {"status": 409}}]}))
                .unwrap();
        let Response::Items(items) = outcomes(answer, 1, Action::Create, false) else {
            panic!("per item")
        };
        assert!(matches!(items[0], ItemResult::Rejected(_)));
        // An answer that does not match the request is retried whole.
        let answer: BulkAnswer =
            serde_json::from_value(json!({"errors": true, "items": []})).unwrap();
        assert!(matches!(
            outcomes(answer, 3, Action::Index, false),
            Response::Retry { .. }
        ));
        let ok: BulkAnswer = serde_json::from_value(json!({"errors": false})).unwrap();
        assert_eq!(outcomes(ok, 3, Action::Index, false), Response::Delivered);
    }
}
