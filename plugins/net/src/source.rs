//! `source: syslog` — syslog messages over TCP (RFC 6587: newline or octet
//! counting, detected per connection) or UDP (RFC 5426: one message per
//! datagram). Messages are raw events; `codec: syslog` parses them.
//!
//! Backpressure: a TCP connection's task does not read the socket while its
//! last messages wait for the pipeline, so the kernel's buffers fill and
//! the sender's writes block — flow control does the rest. UDP has no flow
//! control: datagrams that arrive while the pipeline is full wait in the
//! socket buffer and the kernel drops what does not fit (its counters, not
//! ours, see them).

use std::net::SocketAddr;
use std::sync::Arc;

use logbus_framing::{Deframer, Framing};
use logbus_plugin_api::{
    BuildContext, Bytes, CheckOptions, Event, Meta, OptionError, Output, Source, SourceContext,
    StageError, StageKind, TypedPlugin, async_trait,
};
use serde::Deserialize;
use std::time::Duration;

use logbus_connections::{Closed, Connection, ConnectionTable, Limits};
use tokio::io::AsyncReadExt;

use crate::Mode;

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum TcpFraming {
    /// Per connection, by its first byte: a digit means octet counting,
    /// anything else newline-terminated messages.
    #[default]
    Auto,
    Newline,
    OctetCounting,
}

/// Options of `source: syslog`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SyslogSourceOptions {
    /// `tcp` (default) or `udp`.
    #[serde(default)]
    pub mode: Mode,
    /// Address to listen on, e.g. `0.0.0.0:6514` or `127.0.0.1:5140`.
    pub address: String,
    /// TCP only: `auto` (default), `newline` or `octet-counting`.
    #[serde(default)]
    pub framing: TcpFraming,
    /// Longest message; newline-framed ones are cut (counted), an
    /// octet-counted one over the limit closes its connection.
    #[serde(default = "default_max_message")]
    #[schemars(range(min = 1, max = 16777216))]
    pub max_message_bytes: usize,
    /// TCP only: connections served at once. When all are taken, the one
    /// idle longest is closed to admit a new one; only when every one is
    /// busy is the new one closed.
    #[serde(default = "default_max_connections")]
    #[schemars(range(min = 1, max = 65536))]
    pub max_connections: usize,
    /// TCP only: a connection that sends nothing for this long (and has
    /// nothing waiting for the pipeline) is closed, milliseconds.
    #[serde(default = "default_idle_timeout")]
    #[schemars(range(min = 1, max = 86400000))]
    pub idle_timeout_ms: u64,
    /// TCP only: serve TLS (RFC 5425) with this certificate and key.
    #[serde(default)]
    pub tls: Option<logbus_tls::ServerTls>,
}

fn default_max_message() -> usize {
    64 * 1024
}
fn default_max_connections() -> usize {
    256
}
fn default_idle_timeout() -> u64 {
    3_600_000
}

impl CheckOptions for SyslogSourceOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if let Err(e) = self.address.parse::<SocketAddr>() {
            errors.push(OptionError::at(
                &["address"],
                format!(
                    "`{}` is not an address like 0.0.0.0:5140: {e}",
                    self.address
                ),
            ));
        }
        if self.mode == Mode::Udp && self.framing != TcpFraming::Auto {
            errors.push(OptionError::at(
                &["framing"],
                "applies only with `mode: tcp` (UDP carries one message per datagram)",
            ));
        }
        if self.mode == Mode::Udp && self.tls.is_some() {
            errors.push(OptionError::at(&["tls"], "applies only with `mode: tcp`"));
        }
        errors
    }
}

pub struct SyslogSource;

impl TypedPlugin for SyslogSource {
    type Options = SyslogSourceOptions;
    const NAME: &'static str = "syslog";
    const KIND: StageKind = StageKind::Source;

    type Stage = Box<dyn Source>;
    const DESCRIPTION: &'static str = "Syslog messages over TCP (newline or octet-counting framing, detected per connection) or UDP; raw events for `codec: syslog`.";

    /// The address must be free; TLS files readable PEM; each connection
    /// holds a file descriptor.
    fn host_needs(
        &self,
        o: &SyslogSourceOptions,
        cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        use logbus_plugin_api::{HostNeed, StatedNeed};
        let mut needs = vec![StatedNeed::new(
            HostNeed::Listen {
                address: o.address.clone(),
                udp: o.mode == crate::Mode::Udp,
            },
            &["address"],
        )];
        if o.mode == crate::Mode::Tcp {
            needs.push(StatedNeed::new(
                HostNeed::OpenFiles {
                    count: o.max_connections as u64,
                },
                &["max_connections"],
            ));
        }
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
    fn flow(&self, _options: &SyslogSourceOptions) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::raw()
    }

    fn build(
        &self,
        options: SyslogSourceOptions,
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
        Ok(Box::new(Listener {
            options,
            address,
            tls,
        }))
    }
}

struct Listener {
    options: SyslogSourceOptions,
    address: SocketAddr,
    tls: Option<logbus_tls::TlsAcceptor>,
}

#[async_trait]
impl Source for Listener {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        match self.options.mode {
            Mode::Tcp => self.tcp(cx).await,
            Mode::Udp => self.udp(cx).await,
        }
    }
}

impl Listener {
    async fn tcp(self, cx: SourceContext) -> Result<(), StageError> {
        let listener = tokio::net::TcpListener::bind(self.address)
            .await
            .map_err(|e| StageError::io(format!("listening on tcp {}", self.address), e))?;
        tracing::info!(address = %self.address, "syslog TCP source listening");
        let output = Arc::new(cx.output);
        let table = ConnectionTable::new(Limits {
            max_connections: self.options.max_connections,
            idle_timeout: Duration::from_millis(self.options.idle_timeout_ms),
        });
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let accepted = tokio::select! {
                _ = cx.shutdown.cancelled() => break,
                a = listener.accept() => a,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accepting a connection: {e}");
                    continue;
                }
            };
            let Ok(slot) = table.admit() else {
                tracing::warn!(%peer, "{} connections, all busy; closing this one", self.options.max_connections);
                drop(stream);
                continue;
            };
            let (output, shutdown, id) = (output.clone(), cx.shutdown.clone(), cx.id.clone());
            let (framing, max) = (self.options.framing, self.options.max_message_bytes);
            let tls = self.tls.clone();
            connections.spawn(async move {
                let reader = Reader {
                    peer,
                    framing,
                    max,
                    output: &output,
                    shutdown: &shutdown,
                    source: &id,
                    slot: &slot,
                };
                match tls {
                    None => reader.run(stream).await,
                    Some(acceptor) => {
                        let handshake = tokio::time::timeout(
                            std::time::Duration::from_secs(10),
                            acceptor.accept(stream),
                        );
                        match handshake.await {
                            Ok(Ok(tls)) => reader.run(tls).await,
                            Ok(Err(e)) => tracing::warn!(%peer, "TLS handshake failed: {e}"),
                            Err(_) => tracing::warn!(%peer, "TLS handshake timed out"),
                        }
                    }
                }
            });
            // Reap finished connections as we go.
            while connections.try_join_next().is_some() {}
        }
        // Stopping: every connection sends what it read, then ends.
        while connections.join_next().await.is_some() {}
        Ok(())
    }

    async fn udp(self, cx: SourceContext) -> Result<(), StageError> {
        let socket = tokio::net::UdpSocket::bind(self.address)
            .await
            .map_err(|e| StageError::io(format!("listening on udp {}", self.address), e))?;
        tracing::info!(address = %self.address, "syslog UDP source listening");
        let max = self.options.max_message_bytes;
        let mut buf = vec![0u8; 65536];
        loop {
            let got = tokio::select! {
                _ = cx.shutdown.cancelled() => return Ok(()),
                r = socket.recv_from(&mut buf) => r,
            };
            let mut events = Vec::new();
            match got {
                Ok((n, _)) => events.extend(datagram(&buf[..n], max, &cx.id)),
                Err(e) => {
                    tracing::warn!("receiving a datagram: {e}");
                    continue;
                }
            }
            // Whatever else is already waiting joins the batch.
            while events.len() < 1024 {
                match socket.try_recv_from(&mut buf) {
                    Ok((n, _)) => events.extend(datagram(&buf[..n], max, &cx.id)),
                    Err(_) => break,
                }
            }
            if cx.output.send(events).await.is_err() {
                return Ok(());
            }
        }
    }
}

/// One datagram as an event: trailing newlines and NULs dropped, cut at
/// `max` bytes.
fn datagram(bytes: &[u8], max: usize, source: &Arc<str>) -> Option<Event> {
    let mut end = bytes.len();
    while end > 0 && matches!(bytes[end - 1], b'\n' | b'\r' | 0) {
        end -= 1;
    }
    if end == 0 {
        return None;
    }
    Some(Event::raw(
        Bytes::copy_from_slice(&bytes[..end.min(max)]),
        Meta::now(source.clone()),
    ))
}

/// One TCP connection's reading, with what it needs.
struct Reader<'a> {
    peer: SocketAddr,
    framing: TcpFraming,
    max: usize,
    output: &'a Output,
    shutdown: &'a logbus_plugin_api::CancellationToken,
    source: &'a Arc<str>,
    slot: &'a Connection,
}

impl Reader<'_> {
    async fn run(self, mut stream: impl tokio::io::AsyncRead + Unpin) {
        let Reader {
            peer,
            framing,
            max,
            output,
            shutdown,
            source,
            slot,
        } = self;
        let mut buf = vec![0u8; 64 * 1024];
        let mut deframer: Option<Deframer> = match framing {
            TcpFraming::Auto => None,
            TcpFraming::Newline => Some(Deframer::new(Framing::Newline, max)),
            TcpFraming::OctetCounting => Some(Deframer::new(Framing::OctetCounting, max)),
        };
        let mut messages = Vec::new();
        loop {
            let n = tokio::select! {
                _ = shutdown.cancelled() => 0,
                why = slot.closed() => {
                    match why {
                        Closed::Evicted if slot.was_sender() => tracing::warn!(%peer, "closing an idle syslog connection that had sent messages, to admit a new one: every connection has delivered messages, so what this sender writes before it reconnects may be lost (raise max_connections)"),
                        Closed::Evicted => tracing::info!(%peer, "closing an idle syslog connection that never sent a whole message, to admit a new one"),
                        Closed::IdleTimeout => tracing::debug!(%peer, "closing an idle syslog connection"),
                    }
                    0
                }
                r = stream.read(&mut buf) => match r {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::debug!(%peer, "connection read failed: {e}");
                        0
                    }
                },
            };
            if n == 0 {
                break;
            }
            slot.touch();
            // Not idle while its messages wait for the pipeline.
            let _busy = slot.busy();
            let d = deframer.get_or_insert_with(|| {
                let framing = if buf[0].is_ascii_digit() {
                    Framing::OctetCounting
                } else {
                    Framing::Newline
                };
                Deframer::new(framing, max)
            });
            let pushed = d.push(&buf[..n], &mut messages);
            if !messages.is_empty() {
                // A sender, not a dribbler: evicted last (see
                // logbus-connections).
                slot.delivered();
            }
            if let Err(e) = pushed {
                tracing::warn!(%peer, "closing a syslog connection: {e}");
                send(output, &mut messages, source).await;
                return;
            }
            // The socket is not read again until the pipeline took these.
            if !send(output, &mut messages, source).await {
                return;
            }
        }
        if let Some(d) = deframer.as_mut() {
            match d.finish() {
                Ok(Some(last)) => messages.push(last),
                Ok(None) => {}
                Err(e) => tracing::warn!(%peer, "syslog connection ended badly: {e}"),
            }
        }
        send(output, &mut messages, source).await;
    }
}

/// Sends the messages (trailing `\r`, `\n` and NULs trimmed, empty ones
/// skipped); `false` once the pipeline is gone.
async fn send(output: &Output, messages: &mut Vec<Bytes>, source: &Arc<str>) -> bool {
    if messages.is_empty() {
        return true;
    }
    let meta = Meta::now(source.clone());
    let events: Vec<Event> = messages
        .drain(..)
        .filter_map(|m| {
            let mut end = m.len();
            // rsyslog's templates end in a newline, inside the frame.
            while end > 0 && matches!(m[end - 1], b'\r' | b'\n' | 0) {
                end -= 1;
            }
            (end > 0).then(|| Event::raw(m.slice(..end), meta.clone()))
        })
        .collect();
    output.send(events).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `validate --preflight` learns of the address, the connections and
    /// the TLS files.
    #[test]
    fn the_address_connections_and_tls_files_are_stated() {
        let needs = logbus_plugin_api::testing::host_needs(
            &logbus_plugin_api::Typed(SyslogSource),
            serde_json::json!({
                "address": "127.0.0.1:6514", "mode": "tcp", "max_connections": 10,
                "tls": { "cert_file": "c.pem", "key_file": "k.pem" },
            }),
        );
        assert_eq!(
            needs,
            [
                "address: Listen 127.0.0.1:6514/tcp",
                "max_connections: OpenFiles 10",
                "tls.cert_file: Pem ./c.pem",
                "tls.key_file: PemKey ./k.pem",
                "tls.key_file: TlsIdentity ./c.pem ./k.pem",
            ]
        );
    }

    fn text(bytes: &[u8], max: usize) -> Option<String> {
        datagram(bytes, max, &Arc::from("s"))
            .map(|e| String::from_utf8(e.as_raw().unwrap().to_vec()).unwrap())
    }

    /// A datagram's trailing line ends and NULs are not part of the
    /// message; one that is nothing else is no message; a long one is cut.
    #[test]
    fn a_datagram_is_one_message_trimmed_and_cut() {
        assert_eq!(text(b"<13>hi\r\n\0", 100).as_deref(), Some("<13>hi"));
        assert_eq!(text(b"<13>a\nb\n", 100).as_deref(), Some("<13>a\nb"));
        assert_eq!(text(b"\n\r\0", 100), None);
        assert_eq!(text(b"", 100), None);
        assert_eq!(text(b"<13>hello\n", 6).as_deref(), Some("<13>he"));
        assert_eq!(text(b"<13>hi", 6).as_deref(), Some("<13>hi"));
    }
}
