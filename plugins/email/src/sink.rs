//! `sink: email` — events by mail, many per message. Meant for alerts, so
//! it defends the inbox: events collect into one message (up to
//! `batch_max_events`, or `batch_timeout_ms` after the first), and at most
//! `max_messages` messages go out per `period_ms`; events beyond that are
//! counted as discarded and the next message that may go says how many
//! were held back. An SMTP server that is down or answers 4xx is retried
//! with backoff (the pipeline waits); a 5xx refusal fails the stage.

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::message::{Mailbox, Message};
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use logbus_plugin_api::{
    BuildContext, Built, CheckOptions, Event, FieldPath, OptionError, Payload, Sink, SinkContext,
    StageError, StageKind, TypedPlugin, async_trait, retry_delay,
};
use serde::Deserialize;
use serde_json::Value;

/// Options of `sink: email`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmailSinkOptions {
    /// SMTP server host.
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    /// `none` (plain SMTP, e.g. to a local relay), `starttls` (upgrade,
    /// usually port 587) or `tls` (implicit TLS, usually port 465).
    #[serde(default)]
    pub tls: Tls,
    /// PEM CA certificates to trust besides the built-in Mozilla roots
    /// (a private CA).
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// AUTH (PLAIN/LOGIN) user; with `password`.
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    /// `Name <addr@example.com>` or `addr@example.com`.
    pub from: String,
    pub to: Vec<String>,
    /// Subject; `{{count}}` is the number of events, `{{stage}}` the stage
    /// id, `{{field.path}}` a field of the first event.
    #[serde(default = "default_subject")]
    pub subject: String,
    /// One line of the body per event; `{{field.path}}` as above. Unset:
    /// raw events as they are, structured ones as JSON.
    #[serde(default)]
    pub body: Option<String>,
    /// Most events in one message.
    #[serde(default = "default_max_events")]
    #[schemars(range(min = 1))]
    pub batch_max_events: usize,
    /// A message goes out this long after its first event at the latest.
    #[serde(default = "default_batch_timeout")]
    pub batch_timeout_ms: u64,
    /// At most this many messages per `period_ms`...
    #[serde(default = "default_max_messages")]
    #[schemars(range(min = 1))]
    pub max_messages: u32,
    /// ...; events beyond are counted as discarded, and summarised in the
    /// next message.
    #[serde(default = "default_period")]
    #[schemars(range(min = 1))]
    pub period_ms: u64,
    #[serde(default = "default_timeout")]
    #[schemars(range(min = 1))]
    pub timeout_ms: u64,
    #[serde(default = "default_backoff")]
    #[schemars(range(min = 1))]
    pub retry_initial_backoff_ms: u64,
    #[serde(default = "default_max_backoff")]
    #[schemars(range(min = 1))]
    pub retry_max_backoff_ms: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Tls {
    #[default]
    None,
    Starttls,
    Tls,
}

fn default_port() -> u16 {
    25
}
fn default_subject() -> String {
    "[logbus] {{count}} events from {{stage}}".into()
}
fn default_max_events() -> usize {
    100
}
fn default_batch_timeout() -> u64 {
    10_000
}
fn default_max_messages() -> u32 {
    10
}
fn default_period() -> u64 {
    3_600_000
}
fn default_timeout() -> u64 {
    30_000
}
fn default_backoff() -> u64 {
    1000
}
fn default_max_backoff() -> u64 {
    60_000
}

/// `{{...}}` pieces of a subject or body line.
#[derive(Debug, Clone)]
enum Piece {
    Text(String),
    Count,
    Stage,
    Field(FieldPath),
}

fn template(text: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        if start > 0 {
            out.push(Piece::Text(rest[..start].to_string()));
        }
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("`{{{{` without `}}}}` in `{text}`"))?;
        out.push(match after[..end].trim() {
            "count" => Piece::Count,
            "stage" => Piece::Stage,
            name => Piece::Field(FieldPath::parse(name)?),
        });
        rest = &after[end + 2..];
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest.to_string()));
    }
    Ok(out)
}

fn render(pieces: &[Piece], event: Option<&Event>, count: usize, stage: &str) -> String {
    let mut s = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => s.push_str(t),
            Piece::Count => s.push_str(&count.to_string()),
            Piece::Stage => s.push_str(stage),
            Piece::Field(path) => match event.and_then(|e| e.as_fields()).and_then(|f| path.get(f))
            {
                Some(Value::String(v)) => s.push_str(v),
                Some(v) => s.push_str(&v.to_string()),
                None => {}
            },
        }
    }
    s
}

impl CheckOptions for EmailSinkOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if self.host.is_empty() {
            errors.push(OptionError::at(&["host"], "must not be empty"));
        }
        if self.tls == Tls::None && self.ca_file.is_some() {
            errors.push(OptionError::at(
                &["ca_file"],
                "applies only with `tls: starttls` or `tls: tls`",
            ));
        }
        if self.username.is_some() != self.password.is_some() {
            errors.push(OptionError::at(
                &["username"],
                "give both `username` and `password`, or neither",
            ));
        }
        if let Err(e) = self.from.parse::<Mailbox>() {
            errors.push(OptionError::at(&["from"], format!("`{}`: {e}", self.from)));
        }
        if self.to.is_empty() {
            errors.push(OptionError::at(&["to"], "give at least one recipient"));
        }
        for (i, to) in self.to.iter().enumerate() {
            if let Err(e) = to.parse::<Mailbox>() {
                errors.push(OptionError::at(
                    &["to", &i.to_string()],
                    format!("`{to}`: {e}"),
                ));
            }
        }
        if let Err(e) = template(&self.subject) {
            errors.push(OptionError::at(&["subject"], e));
        }
        if let Some(Err(e)) = self.body.as_deref().map(template) {
            errors.push(OptionError::at(&["body"], e));
        }
        errors
    }
}

pub struct EmailSink;

impl TypedPlugin for EmailSink {
    type Options = EmailSinkOptions;
    const NAME: &'static str = "email";
    const KIND: StageKind = StageKind::Sink;
    const DESCRIPTION: &'static str = "Sends events by mail over SMTP, many per message, at most N messages per period (the rest counted and summarised).";

    fn build(&self, o: EmailSinkOptions, cx: &BuildContext) -> Result<Built, OptionError> {
        let bad = |key: &str, e: String| OptionError::at(&[key], e);
        let from: Mailbox = o.from.parse().map_err(|e| bad("from", format!("{e}")))?;
        let to =
            o.to.iter()
                .map(|t| t.parse::<Mailbox>().map_err(|e| bad("to", format!("{e}"))))
                .collect::<Result<Vec<_>, _>>()?;
        let subject = template(&o.subject).map_err(|e| bad("subject", e))?;
        let body = o
            .body
            .as_deref()
            .map(template)
            .transpose()
            .map_err(|e| bad("body", e))?;
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&o.host)
            .port(o.port)
            .timeout(Some(Duration::from_millis(o.timeout_ms)));
        if o.tls != Tls::None {
            use lettre::transport::smtp::client::{Certificate, Tls as Mode, TlsParameters};
            let mut params = TlsParameters::builder(o.host.clone());
            if let Some(ca) = &o.ca_file {
                let path = cx.resolve(ca);
                let pem = std::fs::read(&path)
                    .map_err(|e| bad("ca_file", format!("reading {}: {e}", path.display())))?;
                let cert = Certificate::from_pem(&pem)
                    .map_err(|e| bad("ca_file", format!("{}: {e}", path.display())))?;
                params = params.add_root_certificate(cert);
            }
            let params = params
                .build_rustls()
                .map_err(|e| bad("tls", e.to_string()))?;
            builder = builder.tls(match o.tls {
                Tls::Starttls => Mode::Required(params),
                _ => Mode::Wrapper(params),
            });
        }
        if let (Some(u), Some(p)) = (&o.username, &o.password) {
            builder = builder.credentials(Credentials::new(u.clone(), p.clone()));
        }
        Ok(Built::Sink(Box::new(Mailer {
            transport: builder.build(),
            from,
            to,
            subject,
            body,
            stage: cx.stage_id.clone(),
            options: o,
        })))
    }
}

struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    to: Vec<Mailbox>,
    subject: Vec<Piece>,
    body: Option<Vec<Piece>>,
    stage: String,
    options: EmailSinkOptions,
}

/// The rate limit: messages sent in the current period.
struct Budget {
    period_start: tokio::time::Instant,
    sent: u32,
    /// Events held back since the last message that went out.
    suppressed: u64,
}

#[async_trait]
impl Sink for Mailer {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        let o = &self.options;
        let mut budget = Budget {
            period_start: tokio::time::Instant::now(),
            sent: 0,
            suppressed: 0,
        };
        let mut pending: Vec<Event> = Vec::new();
        let mut held = Vec::new();
        let mut deadline: Option<tokio::time::Instant> = None;
        let mut ended = false;
        loop {
            let due = deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
            if !pending.is_empty() && (pending.len() >= o.batch_max_events || due || ended) {
                let take = pending.len().min(o.batch_max_events);
                let rest = pending.split_off(take);
                let batch = std::mem::replace(&mut pending, rest);
                self.dispatch(batch, &mut budget, cx).await?;
                if pending.is_empty() {
                    held.clear();
                    deadline = None;
                }
                continue;
            }
            if ended {
                if budget.suppressed > 0 {
                    tracing::warn!(
                        stage = %self.stage,
                        "{} events were held back by the mail rate limit and not sent",
                        budget.suppressed
                    );
                }
                return Ok(());
            }
            let next = match deadline {
                Some(d) => tokio::select! {
                    b = cx.input.recv() => Some(b),
                    _ = tokio::time::sleep_until(d) => None,
                },
                None => Some(cx.input.recv().await),
            };
            match next {
                None => {}
                Some(None) => ended = true,
                Some(Some(mut batch)) => {
                    cx.metrics.add_in(batch.len() as u64);
                    pending.extend(batch.take());
                    held.push(batch);
                    deadline.get_or_insert_with(|| {
                        tokio::time::Instant::now() + Duration::from_millis(o.batch_timeout_ms)
                    });
                }
            }
        }
    }
}

impl Mailer {
    /// Sends one message for `events`, or holds them back by the rate limit.
    async fn dispatch(
        &self,
        mut events: Vec<Event>,
        budget: &mut Budget,
        cx: &SinkContext,
    ) -> Result<(), StageError> {
        let o = &self.options;
        let period = Duration::from_millis(o.period_ms);
        if budget.period_start.elapsed() >= period {
            budget.period_start = tokio::time::Instant::now();
            budget.sent = 0;
        }
        if budget.sent >= o.max_messages {
            budget.suppressed += events.len() as u64;
            cx.metrics.add_discarded(events.len() as u64);
            // Held back on purpose by the configured limit: not retried.
            Event::settle_all(&mut events, logbus_plugin_api::Outcome::Rejected);
            tracing::warn!(
                stage = %self.stage,
                "mail rate limit reached ({} per {:?}): {} events held back",
                o.max_messages,
                period,
                events.len()
            );
            return Ok(());
        }
        let message = self.message(&events, budget.suppressed)?;
        self.send(message).await?;
        budget.sent += 1;
        budget.suppressed = 0;
        Event::settle_all(&mut events, logbus_plugin_api::Outcome::Delivered);
        cx.committed(events.len());
        Ok(())
    }

    fn message(&self, events: &[Event], suppressed: u64) -> Result<Message, StageError> {
        let subject = render(&self.subject, events.first(), events.len(), &self.stage);
        let mut body = String::new();
        if suppressed > 0 {
            body.push_str(&format!(
                "({suppressed} earlier events were held back by the rate limit and not sent.)\n\n"
            ));
        }
        for e in events {
            match &self.body {
                Some(t) => body.push_str(&render(t, Some(e), events.len(), &self.stage)),
                None => match e.payload() {
                    Payload::Raw(b) => body.push_str(&String::from_utf8_lossy(b)),
                    Payload::Fields(f) => {
                        body.push_str(&serde_json::to_string(f).expect("fields serialize"))
                    }
                },
            }
            body.push('\n');
        }
        let mut builder = Message::builder()
            .from(self.from.clone())
            .subject(subject)
            .header(ContentType::TEXT_PLAIN);
        for to in &self.to {
            builder = builder.to(to.clone());
        }
        builder
            .body(body)
            .map_err(|e| StageError::Other(format!("building the message: {e}")))
    }

    /// Sends, retrying what may succeed later; a permanent refusal fails.
    async fn send(&self, message: Message) -> Result<(), StageError> {
        let o = &self.options;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            match self.transport.send(message.clone()).await {
                Ok(_) => return Ok(()),
                Err(e) if e.is_permanent() => {
                    return Err(StageError::Other(format!(
                        "{}:{} refused the message: {e}",
                        o.host, o.port
                    )));
                }
                Err(e) => {
                    let delay = retry_delay(
                        Duration::from_millis(o.retry_initial_backoff_ms),
                        Duration::from_millis(o.retry_max_backoff_ms),
                        attempt,
                    )
                    .mul_f64(0.5 + fastrand::f64() / 2.0);
                    tracing::warn!(
                        host = %o.host,
                        attempt,
                        "sending mail failed, retrying in {delay:?}: {e}"
                    );
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}
