//! Serving an axum router on a listener under a [`ConnectionTable`]: what
//! every HTTP-speaking source (`source: http`, OTLP/HTTP, OTLP/gRPC)
//! needs so that idle or slow clients cannot hold the server (bounded TLS
//! handshakes, a header read timeout, the table's eviction of the
//! longest-idle connection). gRPC is served here too, as HTTP/2 with
//! tonic's routes as the router, so its listener has the same cap and
//! idle timeout as the others instead of tonic's unbounded accept loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use tokio_util::sync::CancellationToken;

use crate::{Closed, Connection, ConnectionTable};

/// The accept loop: every connection takes a slot in the table (which
/// closes the longest-idle one when full), completes its TLS handshake
/// (bounded) in its own task, and is served by hyper with a header read
/// timeout. A connection is busy while a request on it is being handled.
pub struct HttpConnections {
    pub app: axum::Router,
    pub version: HttpVersion,
    pub tls: Option<logbus_tls::TlsAcceptor>,
    pub table: ConnectionTable,
    pub header_timeout: Duration,
    pub shutdown: CancellationToken,
}

/// The protocol a listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpVersion {
    /// HTTP/1.1 (with a header read timeout).
    Http1,
    /// HTTP/2 only, with prior knowledge or by ALPN `h2` (gRPC). Each
    /// stream is one request; the connection is busy while any is served.
    Http2,
}

/// Headers a client may send in one HTTP/2 request (hyper's default is
/// 16 MiB per connection).
const MAX_HEADER_LIST: u32 = 64 << 10;

/// How long a closing connection with nothing in progress may stay quiet
/// before it is dropped without the client's goodbye.
const GOODBYE: Duration = Duration::from_secs(1);

/// Longest a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl HttpConnections {
    pub async fn serve(self, listener: tokio::net::TcpListener) {
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            let accepted = tokio::select! {
                _ = self.shutdown.cancelled() => break,
                a = listener.accept() => a,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = self.table.admit() else {
                tracing::warn!(%peer, "every connection is serving a request; closing this one");
                continue;
            };
            let served = Served {
                peer,
                slot: Arc::new(slot),
                app: self.app.clone(),
                version: self.version,
                header_timeout: self.header_timeout,
                shutdown: self.shutdown.clone(),
            };
            let tls = self.tls.clone();
            tasks.spawn(async move {
                let stream = served.slot.watch(stream);
                match tls {
                    None => served.serve(stream).await,
                    Some(acceptor) => {
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                        {
                            Ok(Ok(tls)) => served.serve(tls).await,
                            Ok(Err(e)) => tracing::warn!(%peer, "TLS handshake failed: {e}"),
                            Err(_) => tracing::warn!(%peer, "TLS handshake timed out"),
                        }
                    }
                }
            });
            while tasks.try_join_next().is_some() {}
        }
        // Stopping: each connection finishes the request it is serving.
        while tasks.join_next().await.is_some() {}
    }
}

/// One accepted connection and what serving it needs.
struct Served {
    peer: SocketAddr,
    slot: Arc<Connection>,
    app: axum::Router,
    version: HttpVersion,
    header_timeout: Duration,
    shutdown: CancellationToken,
}

impl Served {
    /// Serves the connection until the client closes it, it stays idle,
    /// its slot goes to a newcomer, or the source stops; the last three
    /// let the requests in progress (if any) finish first.
    async fn serve<S>(self, stream: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = Handled {
            app: self.app.clone(),
            slot: self.slot.clone(),
        };
        let io = hyper_util::rt::TokioIo::new(stream);
        match self.version {
            HttpVersion::Http1 => {
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(self.header_timeout)
                    .serve_connection(io, service);
                drive(&self, conn, |c| c.graceful_shutdown()).await;
            }
            HttpVersion::Http2 => {
                let conn =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .timer(hyper_util::rt::TokioTimer::new())
                        .max_header_list_size(MAX_HEADER_LIST)
                        .serve_connection(io, service);
                drive(&self, conn, |c| c.graceful_shutdown()).await;
            }
        }
    }
}

/// Runs a hyper connection (either version: they share no trait, so
/// `graceful` is its `graceful_shutdown`) until it ends, or until it must
/// close; then lets it finish what it serves, within the goodbye period
/// once it is quiet.
async fn drive<C>(served: &Served, conn: C, graceful: impl FnOnce(std::pin::Pin<&mut C>))
where
    C: std::future::Future<Output = Result<(), hyper::Error>>,
{
    tokio::pin!(conn);
    tokio::select! {
        done = conn.as_mut() => return ended(served.peer, done.err()),
        why = served.slot.closed() => closing(served.peer, why),
        _ = served.shutdown.cancelled() => {}
    }
    graceful(conn.as_mut());
    tokio::select! {
        _ = conn => {}
        _ = served.slot.quiet_for(GOODBYE) => {}
    }
}

fn ended(peer: SocketAddr, error: Option<hyper::Error>) {
    if let Some(e) = error {
        tracing::debug!(%peer, "HTTP connection ended: {e}");
    }
}

fn closing(peer: SocketAddr, why: Closed) {
    match why {
        Closed::Evicted => {
            tracing::info!(%peer, "closing the longest-idle HTTP connection to admit a new one")
        }
        Closed::IdleTimeout => tracing::debug!(%peer, "closing an idle HTTP connection"),
    }
}

/// The router as hyper's service, marking the connection busy for as long
/// as a request is being handled.
#[derive(Clone)]
struct Handled {
    app: axum::Router,
    slot: Arc<Connection>,
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Handled {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response, std::convert::Infallible>> + Send>,
    >;

    fn call(&self, request: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let busy = self.slot.busy();
        let mut app = self.app.clone();
        Box::pin(async move {
            let answer = tower_service::Service::call(&mut app, request.map(Body::new)).await;
            drop(busy);
            answer
        })
    }
}
