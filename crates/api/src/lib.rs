//! The HTTP API of a running pipeline. It reads the same counters the exit
//! summary is made of, through a snapshot, so it can never disagree with
//! the reconciliation and never touches the data path: a slow or stuck
//! client costs the pipeline nothing.
//!
//! - `GET /` — the live view: one page, assets embedded, no network needed
//! - `GET /metrics` — Prometheus/OpenMetrics text (prometheus-client)
//! - `GET /api/stats` — a snapshot of every counter, as JSON
//! - `GET /api/stats/stream` — the same as server-sent events, once a second
//! - `GET /api/graph` — the running DAG
//! - `GET /api/tap?stage=ID&limit=N` — a live sample of events leaving a stage
//! - `POST /api/reload` — re-read and validate the file, apply if valid
//!
//! Without a token the API trusts whoever can reach its socket, which on
//! loopback is the local user — and any web page that user opens, through
//! DNS rebinding (a name that resolves to 127.0.0.1) or a cross-origin form
//! post. So every request's `Host` must be an address or a name the API
//! answers to, and a state change must not come from another origin or as
//! a form. Taps and streams hold memory per client, so they have a fixed
//! number of slots.

mod metrics;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use logbus_core::StatsHandle;
use serde_json::{Value, json};

/// Re-reads the pipeline file and applies it; `Err` says why it was refused.
pub type ReloadFn =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Value, String>> + Send>> + Send + Sync>;

#[derive(Clone)]
pub struct ApiState {
    pub stats: StatsHandle,
    pub reload: ReloadFn,
    /// Required as `Authorization: Bearer <token>` when set.
    pub token: Option<String>,
    /// Host names (besides IP addresses and `localhost`) requests may name.
    pub allowed_hosts: Vec<String>,
    /// Slots for taps and for stats streams.
    pub taps: Arc<tokio::sync::Semaphore>,
    pub streams: Arc<tokio::sync::Semaphore>,
}

/// Taps that may run at once; more get 429.
pub const MAX_TAPS: usize = 16;
/// Stats streams that may be open at once; more get 429.
pub const MAX_STREAMS: usize = 64;
/// Most bytes of events one tap answer collects (as JSON), besides its
/// `limit` of events.
pub const TAP_MAX_BYTES: usize = 4 << 20;

impl ApiState {
    pub fn new(
        stats: StatsHandle,
        reload: ReloadFn,
        token: Option<String>,
        allowed_hosts: Vec<String>,
    ) -> ApiState {
        ApiState {
            stats,
            reload,
            token,
            allowed_hosts,
            taps: Arc::new(tokio::sync::Semaphore::new(MAX_TAPS)),
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
        }
    }
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics_text))
        .route("/api/stats", get(stats))
        .route("/api/stats/stream", get(stats_stream))
        .route("/api/graph", get(graph))
        .route("/api/tap", get(tap))
        .route("/api/reload", post(reload))
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(state.clone(), same_origin))
        .with_state(state)
}

/// Serves until the listener fails or the process ends.
pub async fn serve(listener: tokio::net::TcpListener, state: ApiState) -> std::io::Result<()> {
    axum::serve(listener, router(state)).await
}

/// The page is public (it holds no data); its requests carry the token.
async fn page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("ui.html"),
    )
        .into_response()
}

/// Whether `host` (a `Host` header: a name or address, maybe a port) is
/// one the API answers to: an IP address, `localhost`, or a configured name.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        // `[v6]` or `[v6]:port`
        Some(rest) => {
            return rest
                .split(']')
                .next()
                .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok());
        }
        None => host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                name
            } else {
                host
            }
        }),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || allowed.iter().any(|a| {
            let a = a.trim_end_matches('.').to_ascii_lowercase();
            a == name || a == host.to_ascii_lowercase()
        })
}

/// Refuses requests that name a host the API does not answer to (DNS
/// rebinding) and state changes from another origin or shaped as a form
/// (cross-site request forgery: a form can only send these content types).
async fn same_origin(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if let Some(host) = host
        && !host_allowed(host, &state.allowed_hosts)
    {
        return (
            StatusCode::FORBIDDEN,
            format!(
                "this API does not answer to Host `{host}`; name it in settings.api.allowed_hosts if it is yours\n"
            ),
        )
            .into_response();
    }
    if request.method() != axum::http::Method::GET && request.method() != axum::http::Method::HEAD {
        let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        if let Some(origin) = origin {
            let same = host.is_some_and(|h| {
                origin.eq_ignore_ascii_case(&format!("http://{h}"))
                    || origin.eq_ignore_ascii_case(&format!("https://{h}"))
            });
            if !same {
                return (
                    StatusCode::FORBIDDEN,
                    format!("a request from origin `{origin}` cannot change this pipeline\n"),
                )
                    .into_response();
            }
        }
        let form = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .is_some_and(|t| {
                matches!(
                    t.as_str(),
                    "application/x-www-form-urlencoded" | "multipart/form-data" | "text/plain"
                )
            });
        if form {
            return (
                StatusCode::FORBIDDEN,
                "a form post cannot change this pipeline; send no body or application/json\n",
            )
                .into_response();
        }
    }
    next.run(request).await
}

fn busy(what: &str, max: usize) -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, "1")],
        Json(json!({ "error": format!("{max} {what} are open already; try again later") })),
    )
        .into_response()
}

async fn auth(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    if let Some(token) = state.token.as_ref().filter(|_| request.uri().path() != "/") {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if presented != Some(token.as_str()) {
            return (StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n").into_response();
        }
    }
    next.run(request).await
}

async fn metrics_text(State(state): State<ApiState>) -> Response {
    match metrics::render(&state.stats) {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}\n"),
        )
            .into_response(),
    }
}

fn stats_json(stats: &StatsHandle) -> Value {
    let report = stats.snapshot();
    let bound = stats.pipeline().inflight_bound();
    let mut v = serde_json::to_value(&report).unwrap_or(Value::Null);
    if let Some(map) = v.as_object_mut() {
        map.insert("inflight_bound".into(), json!(bound));
        map.insert("rss_bytes".into(), json!(metrics::process_rss_bytes()));
    }
    v
}

async fn stats(State(state): State<ApiState>) -> Json<Value> {
    Json(stats_json(&state.stats))
}

async fn stats_stream(State(state): State<ApiState>) -> Response {
    let Ok(slot) = state.streams.clone().try_acquire_owned() else {
        return busy("stats streams", MAX_STREAMS);
    };
    // The slot lives in the stream's state: it is given back when the
    // client goes away and the stream is dropped.
    let stream = futures::stream::unfold(
        (state.stats, true, slot),
        |(stats, first, slot)| async move {
            if !first {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let event = SseEvent::default()
                .event("stats")
                .data(stats_json(&stats).to_string());
            Some((Ok::<_, Infallible>(event), (stats, false, slot)))
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn graph(State(state): State<ApiState>) -> Json<Value> {
    let p = state.stats.pipeline();
    let stages: Vec<Value> = p
        .stages
        .iter()
        .map(|s| {
            json!({
                "id": s.id,
                "kind": s.kind,
                "plugin": s.plugin_name,
                "inputs": s.inputs,
                "workers": s.workers,
                "ordered": s.ordered,
                "capacity": s.capacity(&p.settings),
            })
        })
        .collect();
    let p = &p;
    let edges: Vec<Value> = p
        .stages
        .iter()
        .flat_map(|s| {
            s.inputs.iter().map(move |input| match p.output_of(input) {
                (base, Some(side)) => {
                    let errors = matches!(side, "errors" | "dead");
                    json!({"from": base, "to": s.id, "errors": errors, "side": side})
                }
                (_, None) => json!({"from": input, "to": s.id, "errors": false}),
            })
        })
        .collect();
    Json(json!({ "stages": stages, "edges": edges }))
}

async fn reload(State(state): State<ApiState>) -> Response {
    match (state.reload)().await {
        Ok(summary) => (StatusCode::OK, Json(summary)).into_response(),
        Err(why) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({ "error": why })),
        )
            .into_response(),
    }
}

#[derive(serde::Deserialize)]
struct TapQuery {
    stage: String,
    #[serde(default = "default_limit")]
    limit: usize,
    #[serde(default = "default_wait")]
    wait_ms: u64,
}

fn default_limit() -> usize {
    10
}
fn default_wait() -> u64 {
    2000
}

/// Up to `limit` (at most 1000) events that leave `stage` from now on,
/// waiting at most `wait_ms`; with how many the tap had to drop.
async fn tap(State(state): State<ApiState>, Query(q): Query<TapQuery>) -> Response {
    let Ok(_slot) = state.taps.clone().try_acquire_owned() else {
        return busy("taps", MAX_TAPS);
    };
    let limit = q.limit.clamp(1, 1000);
    let Some(mut tap) = state.stats.tap(&q.stage, limit) else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": format!("no stage `{}` with an output to tap", q.stage) })),
        )
            .into_response();
    };
    let mut events = Vec::new();
    let mut bytes = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(q.wait_ms.min(30_000));
    while events.len() < limit && bytes < TAP_MAX_BYTES {
        match tokio::time::timeout_at(deadline, tap.events.recv()).await {
            Ok(Some(event)) => {
                let value = match event.payload() {
                    logbus_plugin_api::Payload::Raw(b) => {
                        Value::String(String::from_utf8_lossy(b).into_owned())
                    }
                    parsed => Value::Object(parsed.as_fields().cloned().unwrap_or_default()),
                };
                bytes += serde_json::to_string(&value).map_or(0, |t| t.len());
                events.push(value);
            }
            _ => break,
        }
    }
    Json(json!({
        "stage": q.stage,
        "events": events,
        "dropped": tap.dropped(),
        "truncated": bytes >= TAP_MAX_BYTES,
    }))
    .into_response()
}
