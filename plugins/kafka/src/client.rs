//! What the Kafka source and sink share: how to reach the brokers (the
//! list, TLS, SASL), how librdkafka's own reports reach our log, and a
//! way back to the brokers for a client that lost them all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use logbus_plugin_api::{BuildContext, OptionError};
use rdkafka::ClientConfig;
use rdkafka::client::{Client, ClientContext};
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
/// The TLS files librdkafka reads, for `validate --preflight`.
pub fn tls_needs(tls: Option<&KafkaTls>, cx: &BuildContext) -> Vec<logbus_plugin_api::StatedNeed> {
    use logbus_plugin_api::StatedNeed;
    let Some(tls) = tls else {
        return Vec::new();
    };
    let mut needs: Vec<StatedNeed> = tls
        .ca_file
        .iter()
        .map(|ca| StatedNeed::tls_ca(cx.resolve(ca), &["tls"]))
        .collect();
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        needs.extend(StatedNeed::tls_identity(
            cx.resolve(cert),
            cx.resolve(key),
            &["tls"],
        ));
    }
    needs
}

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
/// id, the first error retrying cannot fix, and whether the client has
/// been without any broker for a while.
pub struct Reports {
    pub stage: Arc<str>,
    fatal: Mutex<Option<String>>,
    noticed: tokio::sync::Notify,
    pub watch: BrokerWatch,
}

impl Reports {
    pub fn new(stage: Arc<str>) -> Self {
        Reports {
            stage,
            fatal: Mutex::new(None),
            noticed: tokio::sync::Notify::new(),
            watch: BrokerWatch::new(REBOOTSTRAP_AFTER),
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

    fn stats_raw(&self, report: &[u8]) {
        self.0.watch.observe(report, Instant::now());
    }
}

/// How often librdkafka reports its brokers' states (what [`BrokerWatch`]
/// reads), in ms: `statistics.interval.ms`.
pub const STATISTICS_INTERVAL_MS: u64 = 5_000;

/// How long a client may be without a connection to any broker before it
/// is given the configured brokers again.
pub const REBOOTSTRAP_AFTER: Duration = Duration::from_secs(30);

/// Notices a client that has had no connection to any broker for a while,
/// so that it can be given the configured brokers again
/// ([`add_brokers`]).
///
/// Why: a broker that is shutting down can answer a metadata request with
/// a broker list that leaves itself out. A client that knew only that
/// broker (librdkafka retires the bootstrap connections once it has
/// learned the cluster) then forgets it and has nothing left to connect
/// to; librdkafka's own re-bootstrap did not start in that state. Seen in
/// CI after a single-broker restart, and reproduced under load with
/// librdkafka's debug log: the consumer's group coordinator query waited
/// on a "cluster connection already in progress" for minutes, reading
/// nothing, until the test gave up.
pub struct BrokerWatch {
    after: Duration,
    unconnected_since: Mutex<Option<Instant>>,
    due: AtomicBool,
}

impl BrokerWatch {
    pub fn new(after: Duration) -> Self {
        BrokerWatch {
            after,
            unconnected_since: Mutex::new(None),
            due: AtomicBool::new(false),
        }
    }

    /// Reads one of librdkafka's statistics reports (JSON): a broker
    /// connection that is up (a coordinator's included, librdkafka's
    /// internal one not) ends a period without one; a period as long as
    /// `after` makes the brokers due to be given again, and starts the
    /// next period. A report that cannot be read says nothing.
    pub fn observe(&self, report: &[u8], now: Instant) {
        let Ok(report) = serde_json::from_slice::<BrokerStates>(report) else {
            return;
        };
        let connected = report
            .brokers
            .values()
            .any(|b| b.state == "UP" && b.source != "internal");
        let mut since = self
            .unconnected_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if connected {
            *since = None;
            return;
        }
        let began = *since.get_or_insert(now);
        if now.duration_since(began) >= self.after {
            self.due.store(true, Ordering::Relaxed);
            *since = Some(now);
        }
    }

    /// Whether the brokers are due to be given again (once per period).
    pub fn take_due(&self) -> bool {
        self.due.swap(false, Ordering::Relaxed)
    }
}

/// The part of a statistics report the watch reads.
#[derive(Deserialize)]
struct BrokerStates {
    #[serde(default)]
    brokers: HashMap<String, BrokerState>,
}

#[derive(Deserialize)]
struct BrokerState {
    #[serde(default)]
    state: String,
    #[serde(default)]
    source: String,
}

/// The brokers a client was configured with: `bootstrap.servers` as
/// finally set (a `librdkafka:` entry may override the `brokers` option),
/// what [`give_brokers_if_due`] gives a client that lost them.
pub fn bootstrap_servers(config: &ClientConfig) -> String {
    config
        .get("bootstrap.servers")
        .unwrap_or_default()
        .to_owned()
}

/// Gives `client` the configured `brokers` again if its watch says so,
/// saying so in the log.
pub fn give_brokers_if_due<C: ClientContext>(client: &Client<C>, reports: &Reports, brokers: &str) {
    if reports.watch.take_due() {
        let known = add_brokers(client, brokers);
        tracing::warn!(
            stage = %reports.stage,
            "no connection to any Kafka broker for {REBOOTSTRAP_AFTER:?}: the client is given the configured brokers ({brokers}) again ({known} taken)"
        );
    }
}

/// Gives `client` the brokers in `brokers` (the `bootstrap.servers`
/// syntax) as configured brokers, which it connects to when it has
/// nothing better; one it already has as configured is left alone.
/// Returns how many of the list it now has (librdkafka's
/// `rd_kafka_brokers_add`).
#[allow(unsafe_code)]
pub fn add_brokers<C: ClientContext>(client: &Client<C>, brokers: &str) -> i32 {
    let Ok(list) = std::ffi::CString::new(brokers) else {
        return 0;
    };
    // SAFETY: the handle lives as long as `client`, which outlives this
    // call; librdkafka copies the list before returning.
    unsafe { rdkafka::bindings::rd_kafka_brokers_add(client.native_ptr(), list.as_ptr()) }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

    /// A writer into a shared buffer, for a test's own log subscriber.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The lines logged, at every level, while `f` runs on this thread.
    /// What `f` logs, line by line, through a subscriber of its own.
    pub(crate) fn logged_by(f: impl FnOnce()) -> Vec<String> {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    /// librdkafka's own log reaches ours at its level (the four gravest as
    /// errors, notice as info), under the stage's id, through the context
    /// every client is made with.
    #[test]
    fn librdkafka_log_lines_are_logged_at_their_level_under_the_stage() {
        use RDKafkaLogLevel::*;
        let context = ReportingContext(Arc::new(Reports::new("to_kafka".into())));
        let levels = [
            (Emerg, "ERROR"),
            (Alert, "ERROR"),
            (Critical, "ERROR"),
            (Error, "ERROR"),
            (Warning, "WARN"),
            (Notice, "INFO"),
            (Info, "INFO"),
            (Debug, "DEBUG"),
        ];
        let lines = logged_by(|| {
            for (i, (level, _)) in levels.iter().enumerate() {
                ClientContext::log(&context, *level, "FAC", &format!("message {i}"));
            }
        });
        assert_eq!(lines.len(), levels.len(), "{lines:#?}");
        for (i, ((_, expected), line)) in levels.iter().zip(&lines).enumerate() {
            assert!(line.trim_start().starts_with(expected), "{i}: {line}");
            assert!(line.contains("stage=\"to_kafka\""), "{i}: {line}");
            assert!(
                line.contains(&format!("librdkafka FAC: message {i} ")),
                "{i}: {line}"
            );
        }
    }

    /// Every broker in the list needs a host and a numeric port; TLS
    /// takes a client certificate and its key together or neither.
    #[test]
    fn the_connection_options_are_checked() {
        let brokers_ok = |b: &str| check_connection(b, None).is_empty();
        for ok in ["h:1", "h:1, k:65535", "10.0.0.1:9092", "[::1]:9092"] {
            assert!(brokers_ok(ok), "{ok}");
        }
        for bad in ["h", ":1", "h:", "h:x", "h:65536", "h:1,,k:2", ""] {
            let errors = check_connection(bad, None);
            assert_eq!(errors.len(), 1, "{bad:?}");
            assert_eq!(errors[0].path, ["brokers"], "{bad:?}");
        }
        let tls = |cert: bool, key: bool| KafkaTls {
            ca_file: None,
            cert_file: cert.then(|| "c.pem".into()),
            key_file: key.then(|| "k.pem".into()),
        };
        for (cert, key, fine) in [
            (false, false, true),
            (true, true, true),
            (true, false, false),
            (false, true, false),
        ] {
            let errors = check_connection("h:1", Some(&tls(cert, key)));
            assert_eq!(errors.is_empty(), fine, "cert {cert}, key {key}");
            if !fine {
                assert_eq!(errors[0].path, ["tls"]);
            }
        }
    }

    /// A statistics report with brokers of these (source, state).
    fn report(brokers: &[(&str, &str)]) -> Vec<u8> {
        let brokers: serde_json::Map<String, serde_json::Value> = brokers
            .iter()
            .enumerate()
            .map(|(i, (source, state))| {
                (
                    format!("127.0.0.1:{}/{i}", 9000 + i),
                    serde_json::json!({ "nodeid": i, "source": source, "state": state, "stateage": 5 }),
                )
            })
            .collect();
        serde_json::to_vec(
            &serde_json::json!({ "name": "c", "type": "consumer", "brokers": brokers }),
        )
        .unwrap()
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Neither the learned broker nor the coordinator connected; the
    /// internal pseudo-broker is always up and does not count.
    fn unconnected() -> Vec<u8> {
        report(&[
            ("learned", "INIT"),
            ("logical", "TRY_CONNECT"),
            ("internal", "UP"),
        ])
    }

    #[test]
    fn a_client_without_a_connection_for_the_period_is_due_once_per_period() {
        let watch = BrokerWatch::new(secs(30));
        let t0 = Instant::now();
        watch.observe(&unconnected(), t0);
        watch.observe(&unconnected(), t0 + secs(29));
        assert!(!watch.take_due(), "29 s without a connection");
        watch.observe(&unconnected(), t0 + secs(30));
        assert!(watch.take_due(), "30 s without a connection");
        assert!(!watch.take_due(), "due once");
        // The next period starts at the report that made it due.
        watch.observe(&unconnected(), t0 + secs(59));
        assert!(!watch.take_due());
        watch.observe(&unconnected(), t0 + secs(60));
        assert!(watch.take_due());
    }

    #[test]
    fn any_connection_up_ends_the_period() {
        for up in [("learned", "UP"), ("configured", "UP"), ("logical", "UP")] {
            let watch = BrokerWatch::new(secs(30));
            let t0 = Instant::now();
            watch.observe(&unconnected(), t0);
            watch.observe(&report(&[("learned", "DOWN"), up]), t0 + secs(20));
            watch.observe(&unconnected(), t0 + secs(40));
            assert!(!watch.take_due(), "{up:?} connected at 20 s");
            watch.observe(&unconnected(), t0 + secs(70));
            assert!(watch.take_due(), "{up:?}: 30 s without one since 40 s");
        }
        for not_up in [
            "INIT",
            "DOWN",
            "CONNECT",
            "APIVERSION_QUERY",
            "AUTH_HANDSHAKE",
        ] {
            let watch = BrokerWatch::new(secs(30));
            let t0 = Instant::now();
            watch.observe(&report(&[("learned", not_up)]), t0);
            watch.observe(&report(&[("learned", not_up)]), t0 + secs(30));
            assert!(watch.take_due(), "{not_up} is not a connection");
        }
    }

    #[test]
    fn a_report_that_cannot_be_read_says_nothing_and_one_without_brokers_has_none() {
        let watch = BrokerWatch::new(secs(30));
        let t0 = Instant::now();
        watch.observe(b"not json", t0);
        watch.observe(br#"{"brokers": 5}"#, t0 + secs(40));
        assert!(!watch.take_due(), "unreadable reports start no period");
        watch.observe(&unconnected(), t0 + secs(50));
        watch.observe(b"{", t0 + secs(60));
        watch.observe(&report(&[("learned", "UP")])[..10], t0 + secs(70));
        watch.observe(&unconnected(), t0 + secs(80));
        assert!(watch.take_due(), "nor do they end one");
        let watch = BrokerWatch::new(secs(30));
        watch.observe(br#"{"name": "c"}"#, t0);
        watch.observe(br#"{"name": "c", "brokers": {}}"#, t0 + secs(30));
        assert!(watch.take_due(), "no brokers, no connection");
    }

    /// The statistics reports a client makes, kept.
    struct Kept(Mutex<Vec<Vec<u8>>>);

    impl ClientContext for Kept {
        fn stats_raw(&self, report: &[u8]) {
            self.0.lock().unwrap().push(report.to_vec());
        }
    }

    impl ConsumerContext for Kept {}

    /// A consumer whose only broker cannot be reached, reporting every
    /// 100 ms.
    fn kept_consumer() -> BaseConsumer<Kept> {
        ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("group.id", "g")
            .set("statistics.interval.ms", "100")
            .create_with_context(Kept(Mutex::default()))
            .unwrap()
    }

    /// The names of the brokers in a statistics report `consumer` makes
    /// from now on (the reports made before, queued or kept, are dropped).
    fn brokers_reported(consumer: &BaseConsumer<Kept>) -> Vec<String> {
        consumer.client().context().0.lock().unwrap().clear();
        let _ = consumer.poll(Duration::from_millis(200));
        consumer.client().context().0.lock().unwrap().clear();
        let began = Instant::now();
        loop {
            let _ = consumer.poll(Duration::from_millis(50));
            if let Some(last) = consumer.client().context().0.lock().unwrap().pop() {
                let report: serde_json::Value = serde_json::from_slice(&last).unwrap();
                let mut names: Vec<String> = report["brokers"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .cloned()
                    .collect();
                names.sort();
                return names;
            }
            assert!(began.elapsed() < secs(30), "no statistics report in 30 s");
        }
    }

    #[test]
    fn add_brokers_gives_a_client_configured_brokers_once() {
        let consumer = kept_consumer();
        let client = consumer.client();
        assert_eq!(add_brokers(client, "127.0.0.1:2, 127.0.0.1:3"), 2);
        assert_eq!(add_brokers(client, "127.0.0.1:1,127.0.0.1:2"), 2);
        assert_eq!(add_brokers(client, ""), 0);
        assert_eq!(add_brokers(client, "127.0.0.1:4\0,127.0.0.1:5"), 0);
        let names = brokers_reported(&consumer);
        let configured: Vec<&String> = names.iter().filter(|n| n.ends_with("/bootstrap")).collect();
        assert_eq!(
            configured,
            [
                "127.0.0.1:1/bootstrap",
                "127.0.0.1:2/bootstrap",
                "127.0.0.1:3/bootstrap"
            ],
            "{names:?}"
        );
    }

    #[test]
    fn a_client_is_given_the_brokers_when_its_watch_says_so_once() {
        let consumer = kept_consumer();
        let reports = Reports::new("s".into());
        give_brokers_if_due(consumer.client(), &reports, "127.0.0.1:7");
        let t0 = Instant::now();
        reports.watch.observe(&unconnected(), t0);
        reports
            .watch
            .observe(&unconnected(), t0 + REBOOTSTRAP_AFTER);
        give_brokers_if_due(consumer.client(), &reports, "127.0.0.1:8");
        assert!(!reports.watch.take_due(), "the watch's due was taken");
        give_brokers_if_due(consumer.client(), &reports, "127.0.0.1:9");
        let names = brokers_reported(&consumer);
        let configured: Vec<&String> = names.iter().filter(|n| n.ends_with("/bootstrap")).collect();
        assert_eq!(
            configured,
            ["127.0.0.1:1/bootstrap", "127.0.0.1:8/bootstrap"],
            "not before it was due, once when due: {names:?}"
        );
    }

    /// The producer's statistics reach its watch.
    #[test]
    fn statistics_reach_the_producers_watch() {
        let mut reports = Reports::new("s".into());
        reports.watch = BrokerWatch::new(Duration::ZERO);
        let context = ReportingContext(Arc::new(reports));
        context.stats_raw(&report(&[("configured", "UP")]));
        assert!(!context.0.watch.take_due());
        context.stats_raw(&unconnected());
        assert!(context.0.watch.take_due());
    }
}
