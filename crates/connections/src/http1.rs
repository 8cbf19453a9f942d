//! Serving HTTP/1 on a listener under a [`ConnectionTable`]: what every
//! HTTP-speaking source (`source: http`, OTLP/HTTP) needs so that idle or
//! slow clients cannot hold the server (bounded TLS handshakes, a header
//! read timeout, the table's eviction of the longest-idle connection).

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
    pub tls: Option<logbus_tls::TlsAcceptor>,
    pub table: ConnectionTable,
    pub header_timeout: Duration,
    pub shutdown: CancellationToken,
}

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
            let (app, tls, header_timeout, shutdown) = (
                self.app.clone(),
                self.tls.clone(),
                self.header_timeout,
                self.shutdown.clone(),
            );
            tasks.spawn(async move {
                let slot = Arc::new(slot);
                let stream = slot.watch(stream);
                match tls {
                    None => {
                        serve_connection(stream, peer, slot, app, header_timeout, shutdown).await
                    }
                    Some(acceptor) => {
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                        {
                            Ok(Ok(tls)) => {
                                serve_connection(tls, peer, slot, app, header_timeout, shutdown)
                                    .await
                            }
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

/// Serves one connection until the client closes it, it stays idle, its
/// slot goes to a newcomer, or the source stops; the last three let the
/// request in progress (if any) finish first.
async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    slot: Arc<Connection>,
    app: axum::Router,
    header_timeout: Duration,
    shutdown: CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = Handled {
        app,
        slot: slot.clone(),
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        done = conn.as_mut() => {
            if let Err(e) = done {
                tracing::debug!(%peer, "HTTP connection ended: {e}");
            }
            return;
        }
        why = slot.closed() => match why {
            Closed::Evicted => tracing::info!(%peer, "closing the longest-idle HTTP connection to admit a new one"),
            Closed::IdleTimeout => tracing::debug!(%peer, "closing an idle HTTP connection"),
        },
        _ = shutdown.cancelled() => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
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
