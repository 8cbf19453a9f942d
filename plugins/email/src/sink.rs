//! `sink: email` — events by mail, many per message. Meant for alerts, so
//! it defends the inbox: events collect into one message (up to
//! `batch_max_events`, or `batch_timeout_ms` after the first), and at most
//! `max_messages` messages go out per `period_ms`; events beyond that are
//! counted as discarded and the next message that may go says how many
//! were held back. Batching, retries and commits are the sink core's
//! (`logbus-sink`): an SMTP server that is down or answers 4xx is retried
//! with backoff and full jitter (the pipeline waits); a 5xx refusal fails
//! the stage, or sends the events to `<id>.dead` when a stage reads it.

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::message::{Mailbox, Message};
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, FieldPath, OptionError, Payload, Sink, StageKind,
    TypedPlugin, async_trait,
};
use logbus_sink::{
    Batch, BatchDefaults, BatchLimits, Batching, Driver, DriverConfig, JsonLines, OnRejected,
    Response, RetryDefaults, Retrying, Service,
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
    #[serde(flatten)]
    pub batching: Batching<EmailDefaults>,
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
    #[serde(flatten)]
    pub retrying: Retrying<EmailDefaults>,
}

/// `sink: email`'s own batch and retry defaults.
pub struct EmailDefaults;

impl BatchDefaults for EmailDefaults {
    const BATCH_MAX_EVENTS: usize = 100;
    const BATCH_MAX_BYTES: usize = 10 << 20;
    const BATCH_TIMEOUT_MS: u64 = 10_000;
}

impl RetryDefaults for EmailDefaults {
    const RETRY_INITIAL_BACKOFF_MS: u64 = 1000;
    const RETRY_MAX_BACKOFF_MS: u64 = 60_000;
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
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
fn default_max_messages() -> u32 {
    10
}
fn default_period() -> u64 {
    3_600_000
}
fn default_timeout() -> u64 {
    30_000
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
            Piece::Field(path) => match event.and_then(|e| e.field(path)).as_deref() {
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
        errors.extend(self.batching.check());
        errors.extend(self.retrying.check());
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

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "Sends events by mail over SMTP, many per message, at most N messages per period (the rest counted and summarised).";

    /// The CA file.
    fn host_needs(
        &self,
        o: &Self::Options,
        cx: &BuildContext,
    ) -> Vec<logbus_plugin_api::StatedNeed> {
        let mut needs = Vec::new();
        if let Some(ca) = &o.ca_file {
            needs.push(logbus_plugin_api::StatedNeed::new(
                logbus_plugin_api::HostNeed::Pem {
                    path: cx.resolve(ca),
                    key: false,
                },
                &["ca_file"],
            ));
        }
        needs
    }

    fn build(&self, o: EmailSinkOptions, cx: &BuildContext) -> Result<Self::Stage, OptionError> {
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
        let config = DriverConfig {
            // One message's events, whatever fields they carry.
            limits: BatchLimits {
                max_partitions: 1,
                ..o.batching.limits()
            },
            retry: o.retrying.policy(),
            // One SMTP conversation at a time keeps the rate limit exact.
            in_flight: 1,
            on_rejected: OnRejected::Fail,
            destination: format!("smtp://{}:{}", o.host, o.port),
        };
        let mailer = Mailer {
            transport: builder.build(),
            from,
            to,
            subject,
            body,
            stage: cx.stage_id.clone(),
            max_messages: o.max_messages,
            period: Duration::from_millis(o.period_ms),
            budget: std::sync::Mutex::new(Budget {
                period_start: tokio::time::Instant::now(),
                sent: 0,
                suppressed: 0,
            }),
        };
        // The encoder only sizes the batch: the message is rendered from
        // the events, since a body line may name the message's `{{count}}`.
        Ok(Box::new(Driver::new(mailer, JsonLines, config)))
    }
}

struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    to: Vec<Mailbox>,
    subject: Vec<Piece>,
    body: Option<Vec<Piece>>,
    stage: String,
    max_messages: u32,
    period: Duration,
    budget: std::sync::Mutex<Budget>,
}

/// The rate limit: messages sent in the current period.
struct Budget {
    period_start: tokio::time::Instant,
    sent: u32,
    /// Events held back since the last message that went out.
    suppressed: u64,
}

/// A message and the number of events in it.
pub struct Mail(Message, usize);

#[async_trait]
impl Service for Mailer {
    type Request = Mail;

    fn prepare(&self, batch: &Batch) -> Result<Mail, String> {
        let suppressed = self.budget().suppressed;
        Ok(Mail(self.message(batch.events(), suppressed)?, batch.len()))
    }

    async fn send(&self, Mail(message, events): &Mail) -> Response {
        {
            let mut budget = self.budget();
            if budget.period_start.elapsed() >= self.period {
                budget.period_start = tokio::time::Instant::now();
                budget.sent = 0;
            }
            if budget.sent >= self.max_messages {
                budget.suppressed += *events as u64;
                // Held back on purpose by the configured limit: not retried.
                return Response::Discarded {
                    reason: format!(
                        "mail rate limit reached ({} per {:?})",
                        self.max_messages, self.period
                    ),
                };
            }
        }
        match self.transport.send(message.clone()).await {
            Ok(_) => {
                let mut budget = self.budget();
                budget.sent += 1;
                budget.suppressed = 0;
                Response::Delivered
            }
            Err(e) if e.is_permanent() => Response::Rejected {
                reason: format!("the server refused the message: {e}"),
            },
            Err(e) => Response::Retry {
                reason: format!("sending mail failed: {e}"),
                retry_after: None,
            },
        }
    }
}

impl Mailer {
    fn budget(&self) -> std::sync::MutexGuard<'_, Budget> {
        self.budget.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn message(&self, events: &[Event], suppressed: u64) -> Result<Message, String> {
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
                    Payload::Fields(f) => body.push_str(
                        &serde_json::to_string(f).map_err(|e| format!("encoding an event: {e}"))?,
                    ),
                    Payload::Lazy(f) => {
                        let mut json = Vec::new();
                        f.write_json(&mut json);
                        body.push_str(&String::from_utf8_lossy(&json));
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
            .map_err(|e| format!("building the message: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `validate --preflight` learns of the CA file.
    #[test]
    fn the_ca_file_is_stated() {
        let needs = logbus_plugin_api::testing::host_needs(
            &logbus_plugin_api::Typed(EmailSink),
            serde_json::json!({
                "host": "h", "tls": "tls", "ca_file": "ca.pem",
                "from": "a@example.com", "to": ["b@example.com"],
            }),
        );
        assert_eq!(needs, ["ca_file: Pem ./ca.pem"]);
    }
    use logbus_plugin_api::Meta;

    /// A template is text and `{{…}}` pieces, no empty text between them,
    /// and renders with the text before, between and after them.
    #[test]
    fn a_template_keeps_its_text_around_the_pieces() {
        let pieces = template("{{count}} events, {{ stage }}: {{level}} ok").unwrap();
        assert!(
            matches!(
                pieces.as_slice(),
                [Piece::Count, Piece::Text(a), Piece::Stage, Piece::Text(b), Piece::Field(_), Piece::Text(c)]
                    if a == " events, " && b == ": " && c == " ok"
            ),
            "{pieces:?}"
        );
        let fields = serde_json::json!({"level": "warn"});
        let event = Event::fields(fields.as_object().unwrap().clone(), Meta::at("t", 0));
        assert_eq!(
            render(&pieces, Some(&event), 3, "alerts"),
            "3 events, alerts: warn ok"
        );
        assert!(matches!(
            template("{{count}}").unwrap().as_slice(),
            [Piece::Count]
        ));
        assert!(template("no {{end").unwrap_err().contains("without"));
    }
}
