//! What the Kafka source and sink share: how to reach the brokers (the
//! list, TLS, SASL) and how librdkafka's own reports reach our log.

use logbus_plugin_api::{BuildContext, OptionError};
use rdkafka::ClientConfig;
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
