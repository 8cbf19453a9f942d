//! What the Kafka source and sink share: how to reach the brokers (the
//! list, TLS, SASL) and how librdkafka's own reports reach our log.

use std::sync::{Arc, Mutex};

use logbus_plugin_api::{BuildContext, OptionError};
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
pub enum SaslMechanism {
    #[serde(rename = "plain")]
    Plain,
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    #[serde(rename = "scram-sha-512")]
    ScramSha512,
}

/// SASL credentials (the password usually from `${VAR}`).
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sasl {
    pub mechanism: SaslMechanism,
    pub username: String,
    pub password: String,
}

/// TLS to the brokers: a private CA, and a client certificate if the
/// brokers ask for one.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaTls {
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub cert_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub key_file: Option<std::path::PathBuf>,
}

/// Errors in the broker list and the TLS files' pairing.
pub fn check_connection(brokers: &str, tls: Option<&KafkaTls>) -> Vec<OptionError> {
    let mut errors = Vec::new();
    if brokers.split(',').any(|b| {
        let b = b.trim();
        b.rsplit_once(':')
            .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
    }) {
        errors.push(OptionError::at(
            &["brokers"],
            format!("`{brokers}` is not a list of host:port"),
        ));
    }
    if let Some(tls) = tls
        && tls.cert_file.is_some() != tls.key_file.is_some()
    {
        errors.push(OptionError::at(
            &["tls"],
            "give `cert_file` and `key_file` together",
        ));
    }
    errors
}

/// `security.protocol` and the TLS and SASL properties.
pub fn apply_security(
    c: &mut ClientConfig,
    tls: Option<&KafkaTls>,
    sasl: Option<&Sasl>,
    cx: &BuildContext,
) {
    let protocol = match (tls.is_some(), sasl.is_some()) {
        (false, false) => "plaintext",
        (true, false) => "ssl",
        (false, true) => "sasl_plaintext",
        (true, true) => "sasl_ssl",
    };
    c.set("security.protocol", protocol);
    if let Some(tls) = tls {
        for (key, file) in [
            ("ssl.ca.location", &tls.ca_file),
            ("ssl.certificate.location", &tls.cert_file),
            ("ssl.key.location", &tls.key_file),
        ] {
            if let Some(file) = file {
                c.set(key, cx.resolve(file).display().to_string());
            }
        }
    }
    if let Some(sasl) = sasl {
        let mechanism = match sasl.mechanism {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        };
        c.set("sasl.mechanism", mechanism)
            .set("sasl.username", &sasl.username)
            .set("sasl.password", &sasl.password);
    }
}

/// What librdkafka reports about a client, in our log under the stage's
/// id, and the first error retrying cannot fix.
pub struct Reports {
    pub stage: Arc<str>,
    fatal: Mutex<Option<String>>,
    noticed: tokio::sync::Notify,
}

impl Reports {
    pub fn new(stage: Arc<str>) -> Self {
        Reports {
            stage,
            fatal: Mutex::new(None),
            noticed: tokio::sync::Notify::new(),
        }
    }

    /// The first error that retrying cannot fix, if one came.
    pub fn fatal(&self) -> Option<String> {
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits for an error that retrying cannot fix.
    pub async fn fatal_error(&self) -> String {
        loop {
            if let Some(f) = self.fatal() {
                return f;
            }
            self.noticed.notified().await;
        }
    }

    /// Notes `error` if it is one retrying cannot fix.
    pub fn note(&self, error: &KafkaError, reason: &str) {
        if is_fatal(error) {
            self.fatal
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| format!("{error}: {reason}"));
            self.noticed.notify_one();
        }
    }

    pub fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        let stage = &*self.stage;
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => tracing::error!(stage, "librdkafka {fac}: {message}"),
            RDKafkaLogLevel::Warning => tracing::warn!(stage, "librdkafka {fac}: {message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(stage, "librdkafka {fac}: {message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(stage, "librdkafka {fac}: {message}"),
        }
    }

    pub fn error(&self, error: KafkaError, reason: &str) {
        self.note(&error, reason);
        tracing::warn!(stage = %self.stage, "kafka: {error}: {reason}");
    }
}

/// Errors that retrying cannot fix: wrong credentials, an authorisation
/// refusal, librdkafka's own fatal state.
pub fn is_fatal(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::Fatal
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
        )
    )
}

/// A client context that only reports (the producer's).
pub struct ReportingContext(pub Arc<Reports>);

impl ClientContext for ReportingContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        self.0.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.0.error(error, reason);
    }
}
