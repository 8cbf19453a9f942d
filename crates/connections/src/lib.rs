//! Connection slots for listening sources.
//!
//! A source holds a task and buffers for every open connection. A client
//! that connects and then says nothing costs that for as long as it likes,
//! and once a cap on connections is reached, enough silent clients lock
//! every real sender out (256 idle TCP connections did exactly that to the
//! syslog source). So every connection takes an entry in a
//! [`ConnectionTable`]:
//!
//! - the table caps the number of connections, and when it is full it makes
//!   room by closing an idle connection rather than refusing the newcomer
//!   (only when every connection is busy is the newcomer refused): first
//!   one that has never delivered a complete message or request (a client
//!   dribbling bytes keeps itself recently active, and 1,000 of them made
//!   a quiet but real sender the longest idle, which lost what it wrote
//!   next), and only when none is left, the one idle longest;
//! - a connection ends once it has been idle for the table's timeout.
//!
//! *Idle* means no bytes moved either way and nothing being served: a
//! connection whose events wait for the pipeline (backpressure) or whose
//! request waits for its acknowledgement is busy, not idle, so slowing the
//! pipeline never turns into closed connections.
//!
//! Time is tokio's clock, so tests drive it with a paused runtime instead
//! of sleeping.

#[cfg(feature = "admission")]
pub mod admission;
#[cfg(feature = "http")]
pub mod http;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Connections served at once, and how long one may stay idle.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub idle_timeout: Duration,
}

/// The open connections of one listening source.
#[derive(Clone)]
pub struct ConnectionTable {
    shared: Arc<Shared>,
}

struct Shared {
    limits: Limits,
    epoch: Instant,
    next_id: AtomicU64,
    entries: Mutex<HashMap<u64, Arc<Entry>>>,
    evicted: AtomicU64,
    /// Evictions of connections that had delivered something.
    evicted_senders: AtomicU64,
    timed_out: AtomicU64,
}

struct Entry {
    id: u64,
    /// When bytes last moved, in microseconds since the table's epoch.
    last_active_us: AtomicU64,
    /// Requests (or batches) being served; not idle while above zero.
    busy: AtomicUsize,
    /// Whether a complete message (or request) has come through it.
    delivered: std::sync::atomic::AtomicBool,
    evict: CancellationToken,
}

impl Shared {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Entry>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The table was full and every connection in it busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl ConnectionTable {
    pub fn new(limits: Limits) -> ConnectionTable {
        ConnectionTable {
            shared: Arc::new(Shared {
                limits,
                epoch: Instant::now(),
                next_id: AtomicU64::new(0),
                entries: Mutex::new(HashMap::new()),
                evicted: AtomicU64::new(0),
                evicted_senders: AtomicU64::new(0),
                timed_out: AtomicU64::new(0),
            }),
        }
    }

    /// A slot for a new connection. When the table is full, an idle
    /// connection is told to close (see [`Connection::closed`]) and its
    /// slot goes to the newcomer: one that never delivered anything if
    /// there is one, else the one idle longest. When none is idle, the
    /// newcomer is refused.
    pub fn admit(&self) -> Result<Connection, Full> {
        let shared = &self.shared;
        let now = shared.now_us();
        let mut entries = shared.entries();
        if entries.len() >= shared.limits.max_connections {
            let victim = entries
                .values()
                .filter(|e| e.busy.load(Ordering::Acquire) == 0)
                .min_by_key(|e| {
                    (
                        e.delivered.load(Ordering::Relaxed),
                        e.last_active_us.load(Ordering::Relaxed),
                    )
                })
                .map(|e| e.id)
                .ok_or(Full)?;
            let victim = entries.remove(&victim).expect("found above");
            victim.evict.cancel();
            shared.evicted.fetch_add(1, Ordering::Relaxed);
            if victim.delivered.load(Ordering::Relaxed) {
                shared.evicted_senders.fetch_add(1, Ordering::Relaxed);
            }
        }
        let entry = Arc::new(Entry {
            id: shared.next_id.fetch_add(1, Ordering::Relaxed),
            last_active_us: AtomicU64::new(now),
            busy: AtomicUsize::new(0),
            delivered: std::sync::atomic::AtomicBool::new(false),
            evict: CancellationToken::new(),
        });
        entries.insert(entry.id, entry.clone());
        Ok(Connection {
            shared: shared.clone(),
            entry,
        })
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.shared.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Connections closed so far to make room for a new one.
    pub fn evicted(&self) -> u64 {
        self.shared.evicted.load(Ordering::Relaxed)
    }

    /// Of [`evicted`](Self::evicted), connections that had delivered a
    /// complete message or request: a real sender, whose next write may
    /// be lost (the peer learns of the close only when it writes). Raise
    /// the connection cap when this grows.
    pub fn evicted_senders(&self) -> u64 {
        self.shared.evicted_senders.load(Ordering::Relaxed)
    }

    /// Connections closed so far for staying idle past the timeout.
    pub fn timed_out(&self) -> u64 {
        self.shared.timed_out.load(Ordering::Relaxed)
    }
}

/// Why a connection should close now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Its slot went to a new connection (it was the longest idle).
    Evicted,
    /// It stayed idle for the timeout.
    IdleTimeout,
}

/// One connection's slot; dropping it frees the slot.
pub struct Connection {
    shared: Arc<Shared>,
    entry: Arc<Entry>,
}

impl Connection {
    /// Bytes moved: the connection is not idle.
    pub fn touch(&self) {
        self.entry
            .last_active_us
            .store(self.shared.now_us(), Ordering::Relaxed);
    }

    /// A complete message or request came through: this is a sender, and
    /// the table evicts it only when no connection that never delivered
    /// anything is left to evict.
    pub fn delivered(&self) {
        self.entry.delivered.store(true, Ordering::Relaxed);
    }

    /// Whether it was closed to make room, having delivered something.
    pub fn was_sender(&self) -> bool {
        self.entry.delivered.load(Ordering::Relaxed)
    }

    /// Held while the connection is being served (its events wait for the
    /// pipeline, its request for an answer): it is not idle meanwhile.
    pub fn busy(&self) -> Busy {
        self.entry.busy.fetch_add(1, Ordering::AcqRel);
        Busy {
            shared: self.shared.clone(),
            entry: self.entry.clone(),
        }
    }

    /// Resolves when the connection should close: it was chosen to make
    /// room for a new one, or it has been idle for the timeout.
    pub async fn closed(&self) -> Closed {
        let idle = self.shared.limits.idle_timeout;
        loop {
            let last = self.entry.last_active_us.load(Ordering::Relaxed);
            let deadline = self.shared.epoch + Duration::from_micros(last) + idle;
            tokio::select! {
                _ = self.entry.evict.cancelled() => return Closed::Evicted,
                _ = tokio::time::sleep_until(deadline) => {}
            }
            let quiet = Duration::from_micros(
                self.shared
                    .now_us()
                    .saturating_sub(self.entry.last_active_us.load(Ordering::Relaxed)),
            );
            if self.entry.busy.load(Ordering::Acquire) == 0 && quiet >= idle {
                self.shared.timed_out.fetch_add(1, Ordering::Relaxed);
                return Closed::IdleTimeout;
            }
            if self.entry.busy.load(Ordering::Acquire) > 0 {
                // Busy: look again a timeout from now (the guard touches
                // the connection when it ends).
                self.touch();
            }
        }
    }

    /// Resolves once nothing is being served and no bytes have moved for
    /// `quiet`: how long a closing connection may take to say goodbye
    /// (an HTTP/2 client that never finished its handshake never will).
    pub async fn quiet_for(&self, quiet: Duration) {
        loop {
            let last = self.entry.last_active_us.load(Ordering::Relaxed);
            tokio::time::sleep_until(self.shared.epoch + Duration::from_micros(last) + quiet).await;
            let since = self
                .shared
                .now_us()
                .saturating_sub(self.entry.last_active_us.load(Ordering::Relaxed));
            if self.entry.busy.load(Ordering::Acquire) == 0 && Duration::from_micros(since) >= quiet
            {
                return;
            }
            if self.entry.busy.load(Ordering::Acquire) > 0 {
                self.touch();
            }
        }
    }

    /// `stream`, touching this connection whenever bytes move through it.
    pub fn watch<S>(&self, stream: S) -> Watched<S> {
        Watched {
            stream,
            shared: self.shared.clone(),
            entry: self.entry.clone(),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let mut entries = self.shared.entries();
        if entries
            .get(&self.entry.id)
            .is_some_and(|e| Arc::ptr_eq(e, &self.entry))
        {
            entries.remove(&self.entry.id);
        }
    }
}

/// See [`Connection::busy`].
pub struct Busy {
    shared: Arc<Shared>,
    entry: Arc<Entry>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.entry
            .last_active_us
            .store(self.shared.now_us(), Ordering::Relaxed);
        self.entry.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A stream whose reads and writes count as activity on its connection.
pub struct Watched<S> {
    stream: S,
    shared: Arc<Shared>,
    entry: Arc<Entry>,
}

impl<S> Watched<S> {
    fn touch(&self) {
        self.entry
            .last_active_us
            .store(self.shared.now_us(), Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(max: usize, idle_ms: u64) -> ConnectionTable {
        ConnectionTable::new(Limits {
            max_connections: max,
            idle_timeout: Duration::from_millis(idle_ms),
        })
    }

    /// Issue 54: dribbling clients keep themselves recently active; the
    /// table evicts them, never the quiet sender that delivered messages,
    /// until no connection that never delivered anything is left; then it
    /// evicts the sender idle longest and counts it.
    #[tokio::test(start_paused = true)]
    async fn connections_that_never_delivered_go_before_a_quiet_sender() {
        let t = table(4, 600_000);
        let sender = t.admit().unwrap();
        sender.delivered();
        let mut others: Vec<Connection> = (0..3).map(|_| t.admit().unwrap()).collect();
        for round in 0..3 {
            tokio::time::advance(Duration::from_secs(10)).await;
            for other in &others {
                other.touch();
            }
            others.push(t.admit().unwrap());
            assert!(
                !sender.entry.evict.is_cancelled(),
                "round {round}: the sender was evicted"
            );
        }
        assert_eq!((t.evicted(), t.evicted_senders()), (3, 0));
        // Only senders left: the one idle longest goes, and is counted.
        for other in &others {
            other.delivered();
        }
        let _last = t.admit().unwrap();
        assert_eq!(sender.closed().await, Closed::Evicted);
        assert!(sender.was_sender());
        assert_eq!((t.evicted(), t.evicted_senders()), (4, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_table_closes_the_longest_idle_connection() {
        let t = table(3, 60_000);
        let a = t.admit().unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let b = t.admit().unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let c = t.admit().unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        // `a` spoke last, so `b` is now the longest idle.
        a.touch();
        let d = t.admit().unwrap();
        assert_eq!(b.closed().await, Closed::Evicted);
        assert_eq!((t.len(), t.evicted()), (3, 1));
        // The evicted connection's slot is not freed twice when it drops.
        drop(b);
        assert_eq!(t.len(), 3);
        drop((a, c, d));
        assert!(t.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn busy_connections_are_never_evicted_and_a_full_busy_table_refuses() {
        let t = table(2, 60_000);
        let a = t.admit().unwrap();
        let b = t.admit().unwrap();
        let (_ga, gb) = (a.busy(), b.busy());
        tokio::time::advance(Duration::from_secs(600)).await;
        assert_eq!(t.admit().err(), Some(Full));
        drop(gb);
        let c = t.admit().unwrap();
        assert_eq!(b.closed().await, Closed::Evicted);
        drop(c);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_times_out_and_activity_or_work_keeps_it_open() {
        let t = table(8, 10_000);
        let quiet = t.admit().unwrap();
        let talking = t.admit().unwrap();
        let working = t.admit().unwrap();
        let guard = working.busy();
        let began = Instant::now();
        let watch_quiet = async {
            let why = quiet.closed().await;
            (why, began.elapsed())
        };
        let keep_talking = async {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                talking.touch();
            }
        };
        let ((why, after), ()) = tokio::join!(watch_quiet, keep_talking);
        assert_eq!(why, Closed::IdleTimeout);
        assert_eq!(after, Duration::from_secs(10));
        // 20 s on: the one that kept talking is still open, so is the busy one.
        let open = tokio::time::timeout(Duration::from_millis(1), talking.closed()).await;
        assert!(open.is_err(), "talking stays open");
        let busy = tokio::time::timeout(Duration::from_secs(60), working.closed()).await;
        assert!(busy.is_err(), "a busy connection is not idle");
        // Once its work ends, the timeout counts from then.
        drop(guard);
        let began = Instant::now();
        assert_eq!(working.closed().await, Closed::IdleTimeout);
        assert_eq!(began.elapsed(), Duration::from_secs(10));
        assert_eq!(t.timed_out(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn quiet_for_waits_out_work_and_then_the_quiet_period() {
        let t = table(8, 60_000);
        let conn = t.admit().unwrap();
        let began = Instant::now();
        conn.quiet_for(Duration::from_secs(1)).await;
        assert_eq!(began.elapsed(), Duration::from_secs(1));
        // Busy for 5 s: quiet only a second after the work ends.
        let guard = conn.busy();
        let began = Instant::now();
        let work = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(guard);
        };
        let ((), ()) = tokio::join!(conn.quiet_for(Duration::from_secs(1)), work);
        assert_eq!(began.elapsed(), Duration::from_secs(6));
        // Bytes half-way through restart the count.
        conn.touch();
        let began = Instant::now();
        let talk = async {
            tokio::time::sleep(Duration::from_millis(700)).await;
            conn.touch();
        };
        let ((), ()) = tokio::join!(conn.quiet_for(Duration::from_secs(1)), talk);
        assert_eq!(began.elapsed(), Duration::from_millis(1700));
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_through_a_watched_stream_count_as_activity() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let t = table(8, 10_000);
        let conn = t.admit().unwrap();
        let (client, server) = tokio::io::duplex(64);
        let mut server = conn.watch(server);
        let mut client = client;
        tokio::time::advance(Duration::from_secs(8)).await;
        client.write_all(b"hi").await.unwrap();
        let mut buf = [0u8; 2];
        server.read_exact(&mut buf).await.unwrap();
        let began = Instant::now();
        assert_eq!(conn.closed().await, Closed::IdleTimeout);
        assert_eq!(began.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_counts_what_it_holds_and_every_eviction() {
        let t = table(1, 60_000);
        assert!(t.is_empty());
        let a = t.admit().unwrap();
        assert!(!t.is_empty());
        let b = t.admit().unwrap();
        let c = t.admit().unwrap();
        assert_eq!(a.closed().await, Closed::Evicted);
        assert_eq!(b.closed().await, Closed::Evicted);
        assert_eq!((t.len(), t.evicted(), t.timed_out()), (1, 2, 0));
        drop((a, b));
        assert_eq!(t.len(), 1);
        drop(c);
        assert!(t.is_empty());
    }

    /// Bytes that moved while `closed` waited move its deadline to a
    /// timeout after them, not after the moment it looked.
    #[tokio::test(start_paused = true)]
    async fn the_idle_timeout_counts_from_the_last_bytes() {
        let t = table(8, 10_000);
        let conn = t.admit().unwrap();
        let began = Instant::now();
        let talk = async {
            tokio::time::sleep(Duration::from_secs(4)).await;
            conn.touch();
        };
        let (why, ()) = tokio::join!(conn.closed(), talk);
        assert_eq!(why, Closed::IdleTimeout);
        assert_eq!(began.elapsed(), Duration::from_secs(14));
    }

    /// The end of the stream moves no bytes: a client that hung up is not
    /// active.
    #[tokio::test(start_paused = true)]
    async fn reading_the_end_of_a_stream_is_not_activity() {
        use tokio::io::AsyncReadExt;
        let t = table(8, 10_000);
        let conn = t.admit().unwrap();
        let (client, server) = tokio::io::duplex(64);
        let mut server = conn.watch(server);
        drop(client);
        tokio::time::advance(Duration::from_secs(8)).await;
        let mut buf = [0u8; 8];
        assert_eq!(server.read(&mut buf).await.unwrap(), 0);
        let began = Instant::now();
        assert_eq!(conn.closed().await, Closed::IdleTimeout);
        assert_eq!(began.elapsed(), Duration::from_secs(2));
    }

    /// Writes count as activity, plain or vectored; a write of nothing
    /// does not.
    #[tokio::test(start_paused = true)]
    async fn writes_through_a_watched_stream_count_as_activity() {
        use tokio::io::AsyncWriteExt;
        let t = table(8, 10_000);
        for vectored in [false, true] {
            let conn = t.admit().unwrap();
            let (_client, server) = tokio::io::duplex(64);
            let mut server = conn.watch(server);
            tokio::time::advance(Duration::from_secs(8)).await;
            let wrote = if vectored {
                server.write_vectored(&[]).await.unwrap()
            } else {
                server.write(b"").await.unwrap()
            };
            assert_eq!(wrote, 0);
            let began = Instant::now();
            assert_eq!(
                conn.closed().await,
                Closed::IdleTimeout,
                "vectored: {vectored}"
            );
            assert_eq!(
                began.elapsed(),
                Duration::from_secs(2),
                "vectored: {vectored}"
            );

            let conn = t.admit().unwrap();
            let (_client, server) = tokio::io::duplex(64);
            let mut server = conn.watch(server);
            tokio::time::advance(Duration::from_secs(8)).await;
            let wrote = if vectored {
                let parts = [std::io::IoSlice::new(b"he"), std::io::IoSlice::new(b"llo")];
                server.write_vectored(&parts).await.unwrap()
            } else {
                server.write(b"hello").await.unwrap()
            };
            assert!(wrote > 0);
            let began = Instant::now();
            assert_eq!(
                conn.closed().await,
                Closed::IdleTimeout,
                "vectored: {vectored}"
            );
            assert_eq!(
                began.elapsed(),
                Duration::from_secs(10),
                "vectored: {vectored}"
            );
        }
    }

    /// Flush, shutdown and the vectored-write capability reach the stream
    /// underneath.
    #[tokio::test]
    async fn a_watched_stream_passes_flush_and_shutdown_through() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
        let t = table(8, 10_000);
        let conn = t.admit().unwrap();
        let (mut client, server) = tokio::io::duplex(64);
        /// A writer without vectored writes (tokio's own all have them).
        struct Plain;
        impl AsyncWrite for Plain {
            fn poll_write(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
                data: &[u8],
            ) -> Poll<std::io::Result<usize>> {
                Poll::Ready(Ok(data.len()))
            }
            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
                Poll::Ready(Ok(()))
            }
            fn poll_shutdown(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<std::io::Result<()>> {
                Poll::Ready(Ok(()))
            }
        }
        assert!(!conn.watch(Plain).is_write_vectored());
        let mut server = conn.watch(BufWriter::new(server));
        assert!(server.is_write_vectored());
        server.write_all(b"buffered").await.unwrap();
        server.flush().await.unwrap();
        let mut buf = [0u8; 8];
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"buffered");
        server.write_all(b"last").await.unwrap();
        server.shutdown().await.unwrap();
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"last");
    }
}
