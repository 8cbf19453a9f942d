//! `sink: syslog` — forwards messages over TCP (octet counting by default,
//! RFC 6587, or newline) or UDP, for LogBus-to-LogBus and LogBus-to-rsyslog.
//! Put `format: syslog` on it (or a `formatter: syslog` before it) to send
//! RFC 5424; raw events go as they are, structured ones as JSON.
//!
//! Batching and retries are the sink core's (`logbus-sink`), with one
//! request in flight: a stream keeps its order. Over TCP a batch is
//! committed once it is written to the socket and flushed (through TLS
//! too); on a write error the connection is made again (backoff with
//! jitter) and the whole batch written again, so delivery is at least once
//! and an unreachable receiver holds the pipeline rather than losing
//! events. Over UDP each datagram that went out is committed; a send error
//! retries only the datagrams after it.

use std::ops::Range;
use std::time::Duration;

use logbus_framing::{Framing, encode};
use logbus_plugin_api::{
    BuildContext, Bytes, CheckOptions, Event, OptionError, Sink, SinkContext, StageError,
    StageKind, TypedPlugin, async_trait,
};
use logbus_sink::{
    Batch, BatchLimits, Driver, DriverConfig, Encoder, ItemResult, OnRejected, Response,
    RetryDefaults, Retrying, Service, write_json_or_raw,
};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use crate::Mode;

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum SinkFraming {
    #[default]
    OctetCounting,
    Newline,
}

/// Options of `sink: syslog`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SyslogSinkOptions {
    /// `tcp` (default) or `udp`.
    #[serde(default)]
    pub mode: Mode,
    /// `host:port` of the receiver.
    pub address: String,
    /// TCP only: `octet-counting` (default) or `newline`.
    #[serde(default)]
    pub framing: SinkFraming,
    #[serde(default = "default_connect_timeout")]
    #[schemars(range(min = 1))]
    pub connect_timeout_ms: u64,
    #[serde(flatten)]
    pub retrying: Retrying<SyslogDefaults>,
    /// TCP only: connect with TLS (RFC 5425). `{}` trusts the built-in
    /// Mozilla roots; `ca_file` a private CA.
    #[serde(default)]
    pub tls: Option<logbus_tls::ClientTls>,
}

/// `sink: syslog`'s own batch and retry defaults.
pub struct SyslogDefaults;

impl RetryDefaults for SyslogDefaults {
    const RETRY_INITIAL_BACKOFF_MS: u64 = 100;
    const RETRY_MAX_BACKOFF_MS: u64 = 10_000;
}

fn default_connect_timeout() -> u64 {
    5000
}

impl CheckOptions for SyslogSinkOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        match self.address.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
            _ => errors.push(OptionError::at(
                &["address"],
                format!("`{}` is not host:port", self.address),
            )),
        }
        if self.mode == Mode::Udp && self.framing != SinkFraming::OctetCounting {
            errors.push(OptionError::at(
                &["framing"],
                "applies only with `mode: tcp` (UDP sends one message per datagram)",
            ));
        }
        if self.mode == Mode::Udp && self.tls.is_some() {
            errors.push(OptionError::at(&["tls"], "applies only with `mode: tcp`"));
        }
        errors.extend(self.retrying.check());
        errors
    }
}

pub struct SyslogSink;

impl TypedPlugin for SyslogSink {
    type Options = SyslogSinkOptions;
    const NAME: &'static str = "syslog";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "Forwards messages over TCP (octet counting or newline) or UDP; reconnects and resends, holding the pipeline while the receiver is away.";

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

    fn build(
        &self,
        options: SyslogSinkOptions,
        cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let tls = match &options.tls {
            Some(t) => {
                let bad = |e: logbus_tls::TlsError| OptionError::at(&["tls"], e.to_string());
                Some((
                    t.connector(&cx.base_dir).map_err(bad)?,
                    t.server_name(&options.address).map_err(bad)?,
                ))
            }
            None => None,
        };
        let framing = match (options.mode, options.framing) {
            (Mode::Udp, _) => None,
            (Mode::Tcp, SinkFraming::OctetCounting) => Some(Framing::OctetCounting),
            (Mode::Tcp, SinkFraming::Newline) => Some(Framing::Newline),
        };
        let config = DriverConfig {
            // Each input batch goes out as it came: no waiting for more.
            limits: BatchLimits {
                max_events: 1024,
                max_bytes: 1 << 20,
                max_age: Duration::ZERO,
                max_partitions: 1,
            },
            retry: options.retrying.policy(),
            in_flight: 1,
            on_rejected: OnRejected::Fail,
            destination: format!(
                "syslog {} {}",
                match options.mode {
                    Mode::Tcp => "tcp",
                    Mode::Udp => "udp",
                },
                options.address
            ),
        };
        let forwarder = Forwarder {
            options,
            tls,
            tcp: tokio::sync::Mutex::new(None),
            udp: tokio::sync::Mutex::new(None),
        };
        Ok(Box::new(SyslogWriter {
            driver: Driver::new(forwarder, Frame(framing), config),
        }))
    }
}

/// One message per event (raw as it is, structured as JSON), framed for
/// a TCP stream; over UDP each item is one datagram.
struct Frame(Option<Framing>);

impl Encoder for Frame {
    fn encode(&self, event: &Event, out: &mut Vec<u8>) -> Result<(), String> {
        match self.0 {
            None => write_json_or_raw(event, out),
            Some(framing) => {
                let mut message = Vec::new();
                write_json_or_raw(event, &mut message)?;
                encode(framing, &message, out);
                Ok(())
            }
        }
    }
}

struct SyslogWriter {
    driver: Driver<Forwarder>,
}

#[async_trait]
impl Sink for SyslogWriter {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        let result = self.driver.run(cx).await;
        if let Some(s) = self.driver.service().tcp.lock().await.as_mut() {
            let _ = s.shutdown().await;
        }
        result
    }
}

/// A connection to the receiver, plain or TLS.
trait Conn: tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncWrite + Unpin + Send> Conn for T {}

struct Forwarder {
    options: SyslogSinkOptions,
    tls: Option<(
        logbus_tls::TlsConnector,
        rustls_pki_types::ServerName<'static>,
    )>,
    tcp: tokio::sync::Mutex<Option<Box<dyn Conn>>>,
    udp: tokio::sync::Mutex<Option<tokio::net::UdpSocket>>,
}

/// The framed stream (TCP), or the datagrams (UDP): the body and where
/// each item lies in it.
pub struct Wire {
    body: Bytes,
    items: Vec<Range<usize>>,
}

#[async_trait]
impl Service for Forwarder {
    type Request = Wire;

    fn prepare(&self, batch: &Batch) -> Result<Wire, String> {
        Ok(Wire {
            body: Bytes::copy_from_slice(batch.body()),
            items: batch.items().to_vec(),
        })
    }

    async fn send(&self, wire: &Wire) -> Response {
        match self.options.mode {
            Mode::Tcp => match self.write_tcp(&wire.body).await {
                Ok(()) => Response::Delivered,
                Err(e) => {
                    *self.tcp.lock().await = None;
                    Response::Retry {
                        reason: format!("syslog forwarding failed: {e}"),
                        retry_after: None,
                    }
                }
            },
            Mode::Udp => self.write_udp(wire).await,
        }
    }
}

impl Forwarder {
    async fn write_tcp(&self, body: &[u8]) -> std::io::Result<()> {
        let mut conn = self.tcp.lock().await;
        if conn.is_none() {
            let connect = tokio::net::TcpStream::connect(&self.options.address);
            let stream = tokio::time::timeout(
                Duration::from_millis(self.options.connect_timeout_ms),
                connect,
            )
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
            })??;
            stream.set_nodelay(true)?;
            *conn = Some(match &self.tls {
                None => Box::new(stream),
                Some((connector, name)) => Box::new(connector.connect(name.clone(), stream).await?),
            });
        }
        let stream = conn.as_mut().expect("connected");
        stream.write_all(body).await?;
        stream.flush().await
    }

    /// Datagrams that went out are delivered; from a failed one on, they
    /// are sent again (with a new socket).
    async fn write_udp(&self, wire: &Wire) -> Response {
        let mut socket = self.udp.lock().await;
        if socket.is_none() {
            let bound = async {
                let s = tokio::net::UdpSocket::bind("0.0.0.0:0").await?;
                s.connect(&self.options.address).await?;
                Ok::<_, std::io::Error>(s)
            };
            match bound.await {
                Ok(s) => *socket = Some(s),
                Err(e) => {
                    return Response::Retry {
                        reason: format!("syslog over UDP: {e}"),
                        retry_after: None,
                    };
                }
            }
        }
        let s = socket.as_ref().expect("bound");
        let mut results = Vec::with_capacity(wire.items.len());
        for range in &wire.items {
            // After a failed datagram, the rest wait for the retry, so the
            // receiver never gets them ahead of it.
            if matches!(results.last(), None | Some(ItemResult::Delivered)) {
                match s.send(&wire.body[range.clone()]).await {
                    Ok(_) => results.push(ItemResult::Delivered),
                    Err(e) => results.push(ItemResult::Retry(format!("syslog over UDP: {e}"))),
                }
            } else {
                results.push(ItemResult::Retry("an earlier datagram failed".into()));
            }
        }
        if results.iter().any(|r| r != &ItemResult::Delivered) {
            *socket = None;
        }
        Response::Items(results)
    }
}
