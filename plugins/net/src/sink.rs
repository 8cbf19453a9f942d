//! `sink: syslog` — forwards messages over TCP (octet counting by default,
//! RFC 6587, or newline) or UDP, for LogBus-to-LogBus and LogBus-to-rsyslog.
//! Put `format: syslog` on it (or a `formatter: syslog` before it) to send
//! RFC 5424; raw events go as they are, structured ones as JSON.
//!
//! Over TCP a batch is committed once it is written to the socket; on a
//! write error the connection is made again (backoff) and the whole batch
//! written again, so delivery is at least once and an unreachable
//! receiver holds the pipeline rather than losing events.

use std::time::Duration;

use logbus_framing::{Framing, encode};
use logbus_plugin_api::{
    BuildContext, Built, CheckOptions, Event, OptionError, Payload, Sink, SinkContext, StageError,
    StageKind, TypedPlugin, async_trait, retry_delay,
};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use crate::Mode;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
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
    /// First delay before connecting (or sending) again; doubles to the max.
    #[serde(default = "default_initial_backoff")]
    #[schemars(range(min = 1))]
    pub retry_initial_backoff_ms: u64,
    #[serde(default = "default_max_backoff")]
    #[schemars(range(min = 1))]
    pub retry_max_backoff_ms: u64,
    /// TCP only: connect with TLS (RFC 5425). `{}` trusts the built-in
    /// Mozilla roots; `ca_file` a private CA.
    #[serde(default)]
    pub tls: Option<logbus_tls::ClientTls>,
}

fn default_connect_timeout() -> u64 {
    5000
}
fn default_initial_backoff() -> u64 {
    100
}
fn default_max_backoff() -> u64 {
    10_000
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
        if self.retry_max_backoff_ms < self.retry_initial_backoff_ms {
            errors.push(OptionError::at(
                &["retry_max_backoff_ms"],
                "must not be below `retry_initial_backoff_ms`",
            ));
        }
        errors
    }
}

pub struct SyslogSink;

impl TypedPlugin for SyslogSink {
    type Options = SyslogSinkOptions;
    const NAME: &'static str = "syslog";
    const KIND: StageKind = StageKind::Sink;
    const DESCRIPTION: &'static str = "Forwards messages over TCP (octet counting or newline) or UDP; reconnects and resends, holding the pipeline while the receiver is away.";

    fn build(&self, options: SyslogSinkOptions, cx: &BuildContext) -> Result<Built, OptionError> {
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
        Ok(Built::Sink(Box::new(Forwarder {
            options,
            tls,
            tcp: None,
            udp: None,
        })))
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
    tcp: Option<Box<dyn Conn>>,
    udp: Option<tokio::net::UdpSocket>,
}

fn message(e: &Event) -> Vec<u8> {
    match e.payload() {
        Payload::Raw(b) => b.to_vec(),
        Payload::Fields(f) => serde_json::to_vec(f).expect("fields serialize"),
    }
}

#[async_trait]
impl Sink for Forwarder {
    async fn run(mut self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        while let Some(mut batch) = cx.input.recv().await {
            cx.metrics.add_in(batch.len() as u64);
            let messages: Vec<Vec<u8>> = batch.events().iter().map(message).collect();
            let mut attempt = 0;
            loop {
                attempt += 1;
                let result = match self.options.mode {
                    Mode::Tcp => self.write_tcp(&messages).await,
                    Mode::Udp => self.write_udp(&messages).await,
                };
                match result {
                    Ok(()) => break,
                    Err(e) => {
                        let backoff = retry_delay(
                            Duration::from_millis(self.options.retry_initial_backoff_ms),
                            Duration::from_millis(self.options.retry_max_backoff_ms),
                            attempt,
                        );
                        tracing::warn!(
                            address = %self.options.address,
                            "syslog forwarding failed, retrying in {backoff:?}: {e}"
                        );
                        self.tcp = None;
                        self.udp = None;
                        tokio::time::sleep(backoff).await;
                    }
                }
            }
            batch.settle(logbus_plugin_api::Outcome::Delivered);
            cx.committed(batch.len());
            drop(batch);
        }
        if let Some(s) = self.tcp.as_mut() {
            let _ = s.shutdown().await;
        }
        Ok(())
    }
}

impl Forwarder {
    async fn write_tcp(&mut self, messages: &[Vec<u8>]) -> std::io::Result<()> {
        if self.tcp.is_none() {
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
            self.tcp = Some(match &self.tls {
                None => Box::new(stream),
                Some((connector, name)) => Box::new(connector.connect(name.clone(), stream).await?),
            });
        }
        let framing = match self.options.framing {
            SinkFraming::OctetCounting => Framing::OctetCounting,
            SinkFraming::Newline => Framing::Newline,
        };
        let mut buf = Vec::new();
        for m in messages {
            encode(framing, m, &mut buf);
        }
        let stream = self.tcp.as_mut().expect("connected");
        stream.write_all(&buf).await?;
        stream.flush().await
    }

    async fn write_udp(&mut self, messages: &[Vec<u8>]) -> std::io::Result<()> {
        if self.udp.is_none() {
            let socket = tokio::net::UdpSocket::bind("0.0.0.0:0").await?;
            socket.connect(&self.options.address).await?;
            self.udp = Some(socket);
        }
        let socket = self.udp.as_ref().expect("bound");
        for m in messages {
            socket.send(m).await?;
        }
        Ok(())
    }
}
