//! `validate --connect` for the Kafka source and sink: the brokers reached
//! with the stage's TLS and SASL settings, and its topics looked up in the
//! cluster's metadata.
//!
//! The metadata is asked for every topic, never for one by name: a request
//! naming a topic makes a broker with `auto.create.topics.enable` create
//! it, and a probe must change nothing. Whether a missing topic is an
//! error depends on that same broker setting, read with the admin API.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use logbus_plugin_api::connect::{self, Probe, ServiceFinding};
use logbus_plugin_api::{BuildContext, closest};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::metadata::Metadata;
use rdkafka::producer::{BaseProducer, Producer};

use crate::client::{KafkaTls, Sasl, apply_security};

/// What a stage asks of the cluster.
pub struct ProbeSpec {
    pub brokers: String,
    pub tls: Option<KafkaTls>,
    pub sasl: Option<Sasl>,
    /// The stage's own librdkafka properties; those about the connection
    /// (`ssl.*`, `sasl.*`, `socket.*`, …) apply to the probe too.
    pub librdkafka: BTreeMap<String, String>,
    /// Topics that must exist, with the option naming each.
    pub topics: Vec<(String, Vec<String>)>,
    /// A reader waits for a missing topic; a writer's first message would
    /// create it where the brokers allow.
    pub reader: bool,
}

impl ProbeSpec {
    /// The connection settings of a stage; no topic to look up.
    pub fn new(
        brokers: &str,
        tls: &Option<KafkaTls>,
        sasl: &Option<Sasl>,
        librdkafka: &BTreeMap<String, String>,
    ) -> Self {
        ProbeSpec {
            brokers: brokers.to_string(),
            tls: tls.clone(),
            sasl: sasl.clone(),
            librdkafka: librdkafka.clone(),
            topics: Vec::new(),
            reader: false,
        }
    }
}

/// Keeps what librdkafka said went wrong, an authentication failure above
/// all (the metadata request itself only times out then). Its log lines
/// are read too: they come from its own threads, where its error events
/// wait for a poll this client never makes.
#[derive(Default, Clone)]
struct Noticed(Arc<Mutex<Option<Trouble>>>);

#[derive(Clone)]
struct Trouble {
    authentication: bool,
    reason: String,
}

impl Noticed {
    fn note(&self, authentication: bool, reason: String) {
        let mut first = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if first
            .as_ref()
            .is_none_or(|t| authentication && !t.authentication)
        {
            *first = Some(Trouble {
                authentication,
                reason,
            });
        }
    }

    fn trouble(&self) -> Option<Trouble> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl rdkafka::producer::ProducerContext for Noticed {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

impl ClientContext for Noticed {
    fn log(&self, level: RDKafkaLogLevel, _: &str, message: &str) {
        let authentication = message.contains("Authentication failed")
            || message.contains("SASL authentication error");
        if authentication || (level as i32) <= (RDKafkaLogLevel::Error as i32) {
            self.note(authentication, message.to_string());
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let authentication = error.rdkafka_error_code() == Some(RDKafkaErrorCode::Authentication);
        self.note(authentication, format!("{error}: {reason}"));
    }
}

const CONNECTION_PREFIXES: &[&str] = &[
    "ssl.",
    "sasl.",
    "security.",
    "socket.",
    "client.dns.",
    "broker.address.",
    "api.version.",
];

pub fn probe(spec: ProbeSpec, cx: &BuildContext, timeout: Duration) -> Probe {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &spec.brokers)
        .set("client.id", format!("logbus-{}-probe", cx.stage_id))
        // Its log is how an authentication failure is told from a
        // broker that does not answer (see `Noticed`).
        .set_log_level(RDKafkaLogLevel::Warning);
    apply_security(&mut config, spec.tls.as_ref(), spec.sasl.as_ref(), cx);
    for (k, v) in &spec.librdkafka {
        if CONNECTION_PREFIXES.iter().any(|p| k.starts_with(p)) {
            config.set(k, v);
        }
    }
    // Leave time to say why, within the engine's deadline.
    let wait = timeout.mul_f64(0.8);
    Box::pin(async move {
        let noticed = Noticed::default();
        let client: BaseProducer<Noticed> = match config.create_with_context(noticed.clone()) {
            Ok(c) => c,
            Err(e) => {
                return vec![ServiceFinding::error(
                    connect::UNREACHABLE,
                    &["brokers"],
                    format!("cannot set up a Kafka client: {e}"),
                )];
            }
        };
        let fetched = tokio::task::spawn_blocking(move || {
            let metadata = client.client().fetch_metadata(None, wait);
            // What librdkafka said meanwhile reaches `Noticed` on a poll.
            client.poll(Duration::ZERO);
            metadata
        })
        .await;
        let metadata = match fetched {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => return vec![unreached(&spec, &noticed, &e, wait)],
            Err(e) => {
                return vec![ServiceFinding::error(
                    connect::UNREACHABLE,
                    &["brokers"],
                    format!("the metadata request failed: {e}"),
                )];
            }
        };
        missing_topics(&spec, &metadata, &config, wait).await
    })
}

fn unreached(
    spec: &ProbeSpec,
    noticed: &Noticed,
    e: &KafkaError,
    wait: Duration,
) -> ServiceFinding {
    match noticed.trouble() {
        Some(t) if t.authentication => ServiceFinding::error(
            connect::REFUSED,
            &["sasl"],
            format!("the brokers refused the credentials: {}", t.reason),
        ),
        Some(t) => ServiceFinding::error(
            connect::UNREACHABLE,
            &["brokers"],
            format!(
                "no metadata from `{}` within {wait:?}: {}",
                spec.brokers, t.reason
            ),
        ),
        None => ServiceFinding::error(
            connect::UNREACHABLE,
            &["brokers"],
            format!("no metadata from `{}` within {wait:?}: {e}", spec.brokers),
        ),
    }
}

async fn missing_topics(
    spec: &ProbeSpec,
    metadata: &Metadata,
    config: &ClientConfig,
    wait: Duration,
) -> Vec<ServiceFinding> {
    let known: Vec<&str> = metadata
        .topics()
        .iter()
        .map(|t| t.name())
        .filter(|n| !n.starts_with("__"))
        .collect();
    let missing: Vec<&(String, Vec<String>)> = spec
        .topics
        .iter()
        .filter(|(t, _)| !known.contains(&t.as_str()))
        .collect();
    if missing.is_empty() {
        return Vec::new();
    }
    let auto_create = match metadata.brokers().first() {
        Some(b) => auto_create(config, b.id(), wait).await,
        None => None,
    };
    missing
        .into_iter()
        .map(|(topic, option)| {
            let hint = match closest(topic, &known) {
                Some(near) => format!(" (did you mean `{near}`?)"),
                None => String::new(),
            };
            let option: Vec<&str> = option.iter().map(String::as_str).collect();
            let message = format!("topic `{topic}` does not exist on the cluster{hint}");
            match (spec.reader, auto_create) {
                (false, Some(true)) => ServiceFinding::warning(
                    connect::MISSING,
                    &option,
                    format!("{message}; the brokers create it at the first message, with their default partitions and replication"),
                ),
                (true, _) => ServiceFinding::error(
                    connect::MISSING,
                    &option,
                    format!("{message}: nothing is read until it is created"),
                ),
                (false, Some(false)) => ServiceFinding::error(
                    connect::MISSING,
                    &option,
                    format!("{message}, and the brokers do not create topics (`auto.create.topics.enable=false`): every message would fail"),
                ),
                (false, None) => ServiceFinding::error(
                    connect::MISSING,
                    &option,
                    format!("{message}; unless the brokers create topics at the first message, every message would fail"),
                ),
            }
        })
        .collect()
}

/// The broker's `auto.create.topics.enable`, where it may be read.
async fn auto_create(config: &ClientConfig, broker: i32, wait: Duration) -> Option<bool> {
    let admin: AdminClient<Noticed> = config.create_with_context(Noticed::default()).ok()?;
    let options = AdminOptions::new().request_timeout(Some(wait));
    let results = admin
        .describe_configs([&ResourceSpecifier::Broker(broker)], &options)
        .await
        .ok()?;
    let resource = results.into_iter().next()?.ok()?;
    let entry = resource.get("auto.create.topics.enable")?;
    Some(entry.value.as_deref()? == "true")
}
