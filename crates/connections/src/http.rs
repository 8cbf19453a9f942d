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
    /// How long a request's body may take to arrive, from the moment the
    /// handler is called; `None` leaves it to the handler. Whatever this
    /// says, a body still arriving when the source stops is cut off then
    /// (see [`BodyCut`]), so a stalled upload holds neither a request
    /// slot past its deadline nor the shutdown.
    pub body_timeout: Option<Duration>,
    pub shutdown: CancellationToken,
}

/// Why a request body ended early: the error its reader gets, so a
/// handler can answer for it (a timeout is the client's doing, a stop is
/// the server's and worth retrying).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyCut {
    /// The body did not arrive within the listener's `body_timeout`.
    Timeout(Duration),
    /// The source is stopping.
    Stopping,
}

impl std::fmt::Display for BodyCut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyCut::Timeout(d) => write!(f, "the body did not arrive within {} ms", d.as_millis()),
            BodyCut::Stopping => f.write_str("the source is stopping"),
        }
    }
}

impl std::error::Error for BodyCut {}

impl BodyCut {
    /// The cut behind a body-reading error, if that is what it was.
    pub fn of(error: &(dyn std::error::Error + 'static)) -> Option<BodyCut> {
        let mut at = Some(error);
        while let Some(e) = at {
            if let Some(cut) = e.downcast_ref::<BodyCut>() {
                return Some(*cut);
            }
            at = e.source();
        }
        None
    }
}

/// A request body that ends with a [`BodyCut`] at its deadline or when
/// the source stops, whichever comes first.
struct Bounded {
    inner: Body,
    deadline: Option<(Duration, std::pin::Pin<Box<tokio::time::Sleep>>)>,
    stopping: std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
}

impl http_body::Body for Bounded {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::future::Future;
        use std::task::Poll;
        if let Poll::Ready(frame) = std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if self.stopping.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(axum::Error::new(BodyCut::Stopping))));
        }
        if let Some((limit, sleep)) = self.deadline.as_mut()
            && sleep.as_mut().poll(cx).is_ready()
        {
            let cut = BodyCut::Timeout(*limit);
            return Poll::Ready(Some(Err(axum::Error::new(cut))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
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
                body_timeout: self.body_timeout,
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
    body_timeout: Option<Duration>,
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
            body_timeout: self.body_timeout,
            shutdown: self.shutdown.clone(),
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
    body_timeout: Option<Duration>,
    shutdown: CancellationToken,
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
        let slot = self.slot.clone();
        let deadline = self
            .body_timeout
            .map(|limit| (limit, Box::pin(tokio::time::sleep(limit))));
        let stopping = Box::pin(self.shutdown.clone().cancelled_owned());
        let request = request.map(|inner| {
            Body::new(Bounded {
                inner: Body::new(inner),
                deadline,
                stopping,
            })
        });
        Box::pin(async move {
            let answer = tower_service::Service::call(&mut app, request).await;
            // A whole request was answered: a client, not a dribbler.
            slot.delivered();
            drop(busy);
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    //! Against a real listener on loopback, spoken to by a raw TCP client
    //! (the bytes of HTTP/1.1 are short enough to write by hand).

    use super::*;
    use crate::Limits;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::sync::{Notify, mpsc};

    /// A server on a free port with two routes: `/` answers at once, `/slow`
    /// says it started and answers once `release` is notified.
    struct Server {
        addr: SocketAddr,
        table: ConnectionTable,
        shutdown: CancellationToken,
        started: mpsc::UnboundedReceiver<()>,
        release: Arc<Notify>,
        task: tokio::task::JoinHandle<()>,
    }

    async fn server(max_connections: usize, idle: Duration, header_timeout: Duration) -> Server {
        server_with(max_connections, idle, header_timeout, None).await
    }

    /// A server whose `POST /upload` reads the body and answers with its
    /// length, or with what cut it off.
    async fn server_with(
        max_connections: usize,
        idle: Duration,
        header_timeout: Duration,
        body_timeout: Option<Duration>,
    ) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (started_tx, started) = mpsc::unbounded_channel();
        let release = Arc::new(Notify::new());
        let waited = release.clone();
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "hello" }))
            .route(
                "/slow",
                axum::routing::get(move || {
                    let (started, release) = (started_tx.clone(), waited.clone());
                    async move {
                        started.send(()).unwrap();
                        release.notified().await;
                        "slow"
                    }
                }),
            )
            .route(
                "/upload",
                axum::routing::post(|body: Body| async move {
                    match axum::body::to_bytes(body, 1 << 20).await {
                        Ok(bytes) => format!("read {}", bytes.len()),
                        Err(e) => match BodyCut::of(&e) {
                            Some(cut) => format!("cut: {cut}"),
                            None => format!("failed: {e}"),
                        },
                    }
                }),
            );
        let table = ConnectionTable::new(Limits {
            max_connections,
            idle_timeout: idle,
        });
        let shutdown = CancellationToken::new();
        let served = HttpConnections {
            app,
            version: HttpVersion::Http1,
            tls: None,
            table: table.clone(),
            header_timeout,
            body_timeout,
            shutdown: shutdown.clone(),
        };
        let task = tokio::spawn(served.serve(listener));
        Server {
            addr,
            table,
            shutdown,
            started,
            release,
            task,
        }
    }

    async fn send(stream: &mut TcpStream, path: &str) {
        let request = format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
    }

    /// One response's status line and body (bodies here are short and
    /// carry a content-length).
    async fn response(stream: &mut TcpStream) -> (String, String) {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before a whole response: {got:?}");
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).into_owned();
            let Some((head, body)) = text.split_once("\r\n\r\n") else {
                continue;
            };
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .expect("content-length")
                .parse()
                .unwrap();
            if body.len() >= length {
                let status = head.lines().next().unwrap().to_owned();
                return (status, body[..length].to_owned());
            }
        }
    }

    async fn get(stream: &mut TcpStream, path: &str) -> String {
        send(stream, path).await;
        let (status, body) = response(stream).await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        body
    }

    /// Waits (at most 10 s) for the server to close the connection and
    /// returns whatever it sent before.
    async fn closed_by_server(stream: &mut TcpStream) -> Vec<u8> {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), async {
            let mut buf = [0u8; 1024];
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => rest.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        assert!(read.is_ok(), "the server kept the connection open");
        rest
    }

    const LONG: Duration = Duration::from_secs(600);

    #[tokio::test]
    async fn requests_are_answered_and_an_idle_connection_is_closed() {
        let s = server(8, Duration::from_millis(300), LONG).await;
        let mut client = TcpStream::connect(s.addr).await.unwrap();
        assert_eq!(get(&mut client, "/").await, "hello");
        assert_eq!(get(&mut client, "/").await, "hello");
        assert!(closed_by_server(&mut client).await.is_empty());
        assert_eq!((s.table.timed_out(), s.table.evicted()), (1, 0));
    }

    #[tokio::test]
    async fn a_full_table_closes_the_idle_connection_for_a_new_one() {
        let s = server(1, LONG, LONG).await;
        let mut first = TcpStream::connect(s.addr).await.unwrap();
        assert_eq!(get(&mut first, "/").await, "hello");
        let mut second = TcpStream::connect(s.addr).await.unwrap();
        assert_eq!(get(&mut second, "/").await, "hello");
        assert!(closed_by_server(&mut first).await.is_empty());
        assert_eq!((s.table.evicted(), s.table.len()), (1, 1));
    }

    /// A connection whose request is being handled is busy: a newcomer to
    /// a full table is turned away, and the request still gets its answer.
    #[tokio::test]
    async fn a_connection_serving_a_request_keeps_its_slot() {
        let mut s = server(1, LONG, LONG).await;
        let mut busy = TcpStream::connect(s.addr).await.unwrap();
        send(&mut busy, "/slow").await;
        s.started.recv().await.unwrap();
        let mut refused = TcpStream::connect(s.addr).await.unwrap();
        assert!(closed_by_server(&mut refused).await.is_empty());
        assert_eq!(s.table.evicted(), 0);
        s.release.notify_one();
        assert_eq!(response(&mut busy).await.1, "slow");
        // Answered, it is idle again and gives way to the next newcomer.
        let mut next = TcpStream::connect(s.addr).await.unwrap();
        assert_eq!(get(&mut next, "/").await, "hello");
        assert!(closed_by_server(&mut busy).await.is_empty());
        assert_eq!(s.table.evicted(), 1);
    }

    /// Half a request head, then silence: the header read timeout closes
    /// the connection long before the idle timeout would.
    #[tokio::test]
    async fn a_request_head_that_never_ends_is_cut_off() {
        let s = server(8, LONG, Duration::from_millis(200)).await;
        let mut client = TcpStream::connect(s.addr).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nhost: te")
            .await
            .unwrap();
        let said = closed_by_server(&mut client).await;
        assert!(
            !String::from_utf8_lossy(&said).contains("200 OK"),
            "{said:?}"
        );
        assert_eq!(s.table.timed_out(), 0);
    }

    /// Half a body, then silence (issue 54: a stalled OTLP upload held its
    /// request slot, and the shutdown, for as long as the client liked):
    /// the body timeout cuts it off, and the handler can tell why.
    #[tokio::test]
    async fn a_body_that_stalls_is_cut_off_at_the_body_timeout() {
        let s = server_with(8, LONG, LONG, Some(Duration::from_millis(200))).await;
        let mut client = TcpStream::connect(s.addr).await.unwrap();
        client
            .write_all(b"POST /upload HTTP/1.1\r\nhost: test\r\ncontent-length: 10\r\n\r\nab")
            .await
            .unwrap();
        let (status, body) = response(&mut client).await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(body, "cut: the body did not arrive within 200 ms");
        // A body that arrives whole is read as it is.
        let mut client = TcpStream::connect(s.addr).await.unwrap();
        client
            .write_all(b"POST /upload HTTP/1.1\r\nhost: test\r\ncontent-length: 3\r\n\r\nabc")
            .await
            .unwrap();
        assert_eq!(response(&mut client).await.1, "read 3");
    }

    /// With no body timeout, a stalled body is still cut off when the
    /// source stops, and the accept loop returns (issue 54: one stalled
    /// upload kept the process alive 100 s after SIGTERM).
    #[tokio::test]
    async fn stopping_cuts_off_a_body_that_stalls() {
        let s = server_with(8, LONG, LONG, None).await;
        let mut client = TcpStream::connect(s.addr).await.unwrap();
        client
            .write_all(b"POST /upload HTTP/1.1\r\nhost: test\r\ncontent-length: 10\r\n\r\nab")
            .await
            .unwrap();
        // The handler is reading the body once the connection is busy.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while s
            .table
            .shared
            .entries()
            .values()
            .all(|e| e.busy.load(std::sync::atomic::Ordering::Acquire) == 0)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the request never reached the handler"
            );
            tokio::task::yield_now().await;
        }
        s.shutdown.cancel();
        assert_eq!(response(&mut client).await.1, "cut: the source is stopping");
        tokio::time::timeout(Duration::from_secs(10), s.task)
            .await
            .expect("the accept loop returns once the stalled request is cut off")
            .unwrap();
    }

    /// Stopping lets the request in progress finish, then the accept loop
    /// returns.
    #[tokio::test]
    async fn stopping_finishes_the_request_in_progress() {
        let mut s = server(8, LONG, LONG).await;
        let mut client = TcpStream::connect(s.addr).await.unwrap();
        send(&mut client, "/slow").await;
        s.started.recv().await.unwrap();
        s.shutdown.cancel();
        let mut task = s.task;
        let early = tokio::time::timeout(Duration::from_millis(100), &mut task).await;
        assert!(early.is_err(), "returned with a request in progress");
        s.release.notify_one();
        assert_eq!(response(&mut client).await.1, "slow");
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the accept loop returns once the request is answered")
            .unwrap();
        assert!(closed_by_server(&mut client).await.is_empty());
    }
}
