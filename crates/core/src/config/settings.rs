//! What a pipeline file may say besides its stages: engine `settings:`,
//! `on_error`, and the `queue:` of a stage with its types.

use logbus_plugin_api::{CheckOptions, OptionError};
use serde::{Deserialize, Serialize};

/// `settings:` — engine-wide knobs.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Capacity of every stage-to-stage channel, in events.
    #[serde(default = "default_channel_capacity")]
    #[schemars(range(min = 1, max = 16777216))]
    pub channel_capacity: usize,
    /// The HTTP API: metrics, stats, graph, reload. Off unless set.
    #[serde(default)]
    pub api: Option<ApiSettings>,
    /// Runtime worker threads that run the stages (default: one per CPU
    /// core; `logbus run --threads` overrides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub threads: Option<usize>,
    /// After SIGINT/SIGTERM (or a failed stage) the sources stop and the
    /// rest drains; a sink still retrying after this long gives up, and
    /// what it held is errored (a checkpointing source sends it again
    /// after a restart) instead of holding the shutdown for ever.
    #[serde(default = "default_drain_timeout_ms")]
    #[schemars(range(min = 1))]
    pub drain_timeout_ms: u64,
    /// Runs each straight run of processors (one reads the next's only
    /// output, default queues, the same `workers`) as one task per worker,
    /// with no channel between them. On unless set to `false`.
    #[serde(default = "default_fuse")]
    pub fuse: bool,
}

fn default_fuse() -> bool {
    true
}

fn default_drain_timeout_ms() -> u64 {
    30_000
}

/// Most runtime worker threads `settings.threads` and `--threads` accept.
pub const MAX_THREADS: usize = 1024;

/// `settings.api`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    /// Address to listen on, e.g. `127.0.0.1:8686`. A non-loopback address needs `token`.
    pub listen: String,
    /// Bearer token every request must present (`Authorization: Bearer ...`).
    #[serde(default)]
    pub token: Option<String>,
    /// Host names requests may name in `Host` besides IP addresses and
    /// `localhost` (a name behind a proxy, the machine's name). Any other
    /// name is refused, so a web page cannot reach the API by pointing a
    /// name of its own at 127.0.0.1 (DNS rebinding).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

/// Shortest API token accepted: a short token can be guessed, and a token
/// of one space once passed for one.
pub const MIN_API_TOKEN_CHARS: usize = 16;

/// Why `token` cannot protect the API, if it cannot.
fn api_token_problem(token: &str) -> Option<String> {
    let n = token.chars().count();
    if n < MIN_API_TOKEN_CHARS {
        return Some(format!(
            "must be at least {MIN_API_TOKEN_CHARS} characters, got {n}"
        ));
    }
    if token.chars().any(char::is_whitespace) {
        return Some("must not contain whitespace".into());
    }
    None
}

impl ApiSettings {
    /// Checks the address and the token; a reachable-from-elsewhere API
    /// must have a token.
    pub fn check(&self) -> Vec<OptionError> {
        let mut errors = self.check_listen();
        if let Some(why) = self.token.as_deref().and_then(api_token_problem) {
            errors.push(OptionError::at(&["api", "token"], why));
        }
        errors
    }

    fn check_listen(&self) -> Vec<OptionError> {
        match self.listen.parse::<std::net::SocketAddr>() {
            Err(e) => vec![OptionError::at(
                &["api", "listen"],
                format!(
                    "`{}` is not an address like 127.0.0.1:8686: {e}",
                    self.listen
                ),
            )],
            Ok(addr)
                if !addr.ip().is_loopback() && self.token.as_deref().is_none_or(str::is_empty) =>
            {
                vec![OptionError::at(
                    &["api", "listen"],
                    format!(
                        "{addr} is reachable from other hosts; set `api.token` (and put TLS in front)"
                    ),
                )]
            }
            Ok(_) => Vec::new(),
        }
    }
}

fn default_channel_capacity() -> usize {
    4096
}

/// Largest channel capacity accepted (events).
pub const MAX_CHANNEL_CAPACITY: usize = 16 * 1024 * 1024;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            channel_capacity: default_channel_capacity(),
            api: None,
            threads: None,
            drain_timeout_ms: default_drain_timeout_ms(),
            fuse: default_fuse(),
        }
    }
}

impl CheckOptions for Settings {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = self
            .api
            .as_ref()
            .map(ApiSettings::check)
            .unwrap_or_default();
        if self.channel_capacity == 0 || self.channel_capacity > MAX_CHANNEL_CAPACITY {
            errors.push(OptionError::at(
                &["channel_capacity"],
                format!(
                    "must be between 1 and {MAX_CHANNEL_CAPACITY} events, got {}",
                    self.channel_capacity
                ),
            ));
        }
        if self.drain_timeout_ms == 0 {
            errors.push(OptionError::at(&["drain_timeout_ms"], "must be at least 1"));
        }
        if let Some(n) = self.threads.filter(|n| !(1..=MAX_THREADS).contains(n)) {
            errors.push(OptionError::at(
                &["threads"],
                format!("must be between 1 and {MAX_THREADS} worker threads, got {n}"),
            ));
        }
        errors
    }
}

/// What a parser, transform or formatter does with an event it cannot process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// Count it as errored, log at a bounded rate, go on.
    #[default]
    Drop,
    /// Stop the stage; the pipeline drains and exits non-zero.
    Fail,
    /// Send it, with the error attached, to `<id>.errors`.
    Route,
}

/// `queue:` of a parser, transform, formatter or sink: its input queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QueueSpec {
    /// `global`: one shared multi-producer/multi-consumer queue read by all
    /// `workers`. `local`: in addition, a private frontend ring (with its
    /// own consumer worker) for each registered upstream producer; what does
    /// not fit goes to the shared backend.
    #[serde(default)]
    pub scope: QueueScope,
    /// Capacity in events (default: `settings.channel_capacity`).
    #[serde(default)]
    #[schemars(range(min = 1, max = 16777216))]
    pub size: Option<usize>,
    /// Most events a worker takes in one dequeue (default: the capacity).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub dequeue_batch: Option<usize>,
    /// Frontend settings (with `scope: local`).
    #[serde(default)]
    pub local: Option<LocalSpec>,
    /// `memory` (the default) loses its contents when the process dies.
    /// `disk`: every event goes through an append-only log on disk.
    /// `disk-assisted`: memory first, spilling to the log beyond
    /// `high_watermark` events.
    #[serde(default, rename = "type")]
    pub kind: QueueKind,
    /// Directory of durable queues; this stage's queue lives in
    /// `<path>/<stage id>` (its identity across restarts and worker counts).
    #[serde(default)]
    pub path: Option<String>,
    /// Most bytes the queue keeps on disk (default 10GiB), e.g. `512MiB`.
    #[serde(default)]
    pub max_disk_bytes: Option<ByteSize>,
    /// What a producer meets at `max_disk_bytes` (default `backpressure`).
    #[serde(default)]
    pub when_full: Option<WhenFullSpec>,
    /// Size at which a segment file is sealed and a new one begun (default 64MiB).
    #[serde(default)]
    pub segment_bytes: Option<ByteSize>,
    /// `batch` (default): fsync before a batch is acknowledged upstream;
    /// `interval`: fsync every `sync_interval_ms`; `none`: leave it to the OS.
    #[serde(default)]
    pub sync: Option<SyncSpec>,
    /// With `sync: interval` (default 100).
    #[serde(default)]
    #[schemars(range(min = 1, max = 60000))]
    pub sync_interval_ms: Option<u64>,
    /// `none` (default) or `lz4`, per record.
    #[serde(default)]
    pub compression: Option<CompressionSpec>,
    /// Disk-assisted: on a forced stop, write the memory backlog to disk
    /// (default true).
    #[serde(default)]
    pub save_on_shutdown: Option<bool>,
    /// Disk-assisted: events in memory before batches spill (default 90% of `size`).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub high_watermark: Option<usize>,
    /// Disk-assisted: spilling stops once memory is down to this and the
    /// log has been read (default 70% of `size`).
    #[serde(default)]
    pub low_watermark: Option<usize>,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum QueueKind {
    #[default]
    Memory,
    Disk,
    DiskAssisted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WhenFullSpec {
    Backpressure,
    DropOldest,
    DropNewest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SyncSpec {
    Batch,
    Interval,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CompressionSpec {
    None,
    Lz4,
}

/// A size in bytes: an integer, or a string with a unit (`64MiB`, `10GiB`,
/// `500MB`, `4096`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(text: &str) -> Result<ByteSize, String> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = (&t[..split], t[split..].trim());
        let factor: u64 = match unit {
            "" | "B" => 1,
            "KB" | "kB" => 1000,
            "KiB" => 1 << 10,
            "MB" => 1000 * 1000,
            "MiB" => 1 << 20,
            "GB" => 1000 * 1000 * 1000,
            "GiB" => 1 << 30,
            "TB" => 1000u64.pow(4),
            "TiB" => 1 << 40,
            _ => return Err(format!("`{text}` is not a size like 64MiB, 10GiB or 4096")),
        };
        let value: f64 = number
            .parse()
            .map_err(|_| format!("`{text}` is not a size like 64MiB, 10GiB or 4096"))?;
        let bytes = value * factor as f64;
        // `u64::MAX as f64` is 2^64, itself out of range.
        if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
            return Err(format!("`{text}` is out of range"));
        }
        Ok(ByteSize(bytes as u64))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a size: an integer, or a string like 64MiB")
        })? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(t) => ByteSize::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

impl schemars::JsonSchema for ByteSize {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ByteSize".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Bytes: an integer, or a number with a unit (B, KB, KiB, MB, MiB, GB, GiB, TB, TiB).",
            "oneOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "pattern": "^\\s*[0-9]+(\\.[0-9]+)?\\s*(B|KB|kB|KiB|MB|MiB|GB|GiB|TB|TiB)?\\s*$" }
            ]
        })
    }
}

/// Limits of the durable queue settings.
pub const MIN_SEGMENT_BYTES: u64 = 4 << 10;
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;
pub(super) const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
pub(super) const DEFAULT_MAX_DISK_BYTES: u64 = 10 << 30;

/// `queue.local`: the frontends of a local-scope queue.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LocalSpec {
    /// Events per frontend ring (`F`).
    #[serde(default = "default_frontend_size")]
    #[schemars(range(min = 1, max = 16777216))]
    pub frontend_size: usize,
    /// Registration slots (`N`): one frontend and one consumer worker each.
    /// Producers beyond this use the backend; slots are not recycled.
    #[serde(default = "default_max_frontends")]
    #[schemars(range(min = 1, max = 64))]
    pub max_frontends: usize,
    /// Most events an idle frontend consumer borrows from the backend at
    /// once; 0 disables helping. At most `min(dequeue_batch, frontend_size)`
    /// (the default).
    #[serde(default)]
    pub helper_batch: Option<usize>,
    /// A frontend consumer finding fewer events may wait for this many...
    #[serde(default)]
    pub min_batch: usize,
    /// ...at most this long (milliseconds; 0: never wait).
    #[serde(default)]
    #[schemars(range(max = 60000))]
    pub min_batch_timeout_ms: u64,
}

fn default_frontend_size() -> usize {
    1024
}

fn default_max_frontends() -> usize {
    8
}

impl Default for LocalSpec {
    fn default() -> Self {
        LocalSpec {
            frontend_size: default_frontend_size(),
            max_frontends: default_max_frontends(),
            helper_batch: None,
            min_batch: 0,
            min_batch_timeout_ms: 0,
        }
    }
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum QueueScope {
    #[default]
    Global,
    Local,
}

impl CheckOptions for QueueSpec {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        if self.scope == QueueScope::Global && self.local.is_some() {
            errors.push(OptionError::at(
                &["local"],
                "frontend settings apply only with `scope: local`",
            ));
        }
        if let Some(local) = &self.local {
            if !(1..=MAX_CHANNEL_CAPACITY).contains(&local.frontend_size) {
                errors.push(OptionError::at(
                    &["local", "frontend_size"],
                    format!(
                        "must be between 1 and {MAX_CHANNEL_CAPACITY} events, got {}",
                        local.frontend_size
                    ),
                ));
            }
            if !(1..=logbus_queue::local::MAX_FRONTENDS).contains(&local.max_frontends) {
                errors.push(OptionError::at(
                    &["local", "max_frontends"],
                    format!(
                        "must be between 1 and {}, got {}",
                        logbus_queue::local::MAX_FRONTENDS,
                        local.max_frontends
                    ),
                ));
            }
            if let Some(helper) = local.helper_batch {
                let limit = self
                    .dequeue_batch
                    .unwrap_or(usize::MAX)
                    .min(local.frontend_size);
                if helper > limit {
                    errors.push(OptionError::at(
                        &["local", "helper_batch"],
                        format!(
                            "must not exceed min(dequeue_batch, frontend_size) = {limit}, got {helper}"
                        ),
                    ));
                }
            }
            if local.min_batch > local.frontend_size {
                errors.push(OptionError::at(
                    &["local", "min_batch"],
                    format!(
                        "must not exceed `frontend_size` ({}), got {}",
                        local.frontend_size, local.min_batch
                    ),
                ));
            }
            if local.min_batch_timeout_ms > 60_000 {
                errors.push(OptionError::at(
                    &["local", "min_batch_timeout_ms"],
                    format!("must be at most 60000, got {}", local.min_batch_timeout_ms),
                ));
            }
        }
        errors.extend(self.check_durable());
        if let Some(size) = self.size
            && !(1..=MAX_CHANNEL_CAPACITY).contains(&size)
        {
            errors.push(OptionError::at(
                &["size"],
                format!("must be between 1 and {MAX_CHANNEL_CAPACITY} events, got {size}"),
            ));
        }
        if let Some(batch) = self.dequeue_batch {
            if batch == 0 {
                errors.push(OptionError::at(&["dequeue_batch"], "must be at least 1"));
            } else if let Some(size) = self.size.filter(|s| batch > *s) {
                errors.push(OptionError::at(
                    &["dequeue_batch"],
                    format!("must not exceed `size` ({size}), got {batch}"),
                ));
            }
        }
        errors
    }
}

impl QueueSpec {
    fn check_durable(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        let durable_keys: [(&str, bool); 9] = [
            ("path", self.path.is_some()),
            ("max_disk_bytes", self.max_disk_bytes.is_some()),
            ("when_full", self.when_full.is_some()),
            ("segment_bytes", self.segment_bytes.is_some()),
            ("sync", self.sync.is_some()),
            ("sync_interval_ms", self.sync_interval_ms.is_some()),
            ("compression", self.compression.is_some()),
            ("save_on_shutdown", self.save_on_shutdown.is_some()),
            ("high_watermark", self.high_watermark.is_some()),
        ];
        if self.kind == QueueKind::Memory {
            for (key, set) in durable_keys
                .into_iter()
                .chain([("low_watermark", self.low_watermark.is_some())])
            {
                if set {
                    errors.push(OptionError::at(
                        &[key],
                        "applies only with `type: disk` or `type: disk-assisted`",
                    ));
                }
            }
            return errors;
        }
        if self.path.as_deref().is_none_or(str::is_empty) {
            errors.push(OptionError::at(
                &["type"],
                "a durable queue needs `path`: the directory that holds it across restarts",
            ));
        }
        if self.kind == QueueKind::Disk {
            if self.scope == QueueScope::Local {
                errors.push(OptionError::at(
                    &["scope"],
                    "a `disk` queue cannot have local scope; use `type: disk-assisted`, whose memory part can",
                ));
            }
            for (key, set) in [
                ("save_on_shutdown", self.save_on_shutdown.is_some()),
                ("high_watermark", self.high_watermark.is_some()),
                ("low_watermark", self.low_watermark.is_some()),
            ] {
                if set {
                    errors.push(OptionError::at(
                        &[key],
                        "applies only with `type: disk-assisted`",
                    ));
                }
            }
        }
        if self.sync_interval_ms.is_some() && self.sync != Some(SyncSpec::Interval) {
            errors.push(OptionError::at(
                &["sync_interval_ms"],
                "applies only with `sync: interval`",
            ));
        }
        let segment = self.segment_bytes.map_or(DEFAULT_SEGMENT_BYTES, |b| b.0);
        if let Some(b) = self.segment_bytes
            && !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&b.0)
        {
            errors.push(OptionError::at(
                &["segment_bytes"],
                format!("must be between 4KiB and 1GiB, got {} bytes", b.0),
            ));
        }
        if let Some(max) = self.max_disk_bytes
            && max.0 < 2 * segment
        {
            errors.push(OptionError::at(
                &["max_disk_bytes"],
                format!(
                    "must be at least two segments ({} bytes with segment_bytes {segment}), got {}",
                    2 * segment,
                    max.0
                ),
            ));
        }
        if let (Some(high), Some(low)) = (self.high_watermark, self.low_watermark)
            && low >= high
        {
            errors.push(OptionError::at(
                &["low_watermark"],
                format!("must be below `high_watermark` ({high}), got {low}"),
            ));
        }
        if let (Some(high), Some(size)) = (self.high_watermark, self.size)
            && high > size
        {
            errors.push(OptionError::at(
                &["high_watermark"],
                format!("must not exceed `size` ({size}), got {high}"),
            ));
        }
        if self.high_watermark == Some(0) {
            errors.push(OptionError::at(&["high_watermark"], "must be at least 1"));
        }
        errors
    }
}

/// A stage's durable queue, resolved against the settings.
#[derive(Debug, Clone)]
pub struct DurableQueueSpec {
    pub config: logbus_queue::durable::DiskConfig,
    pub kind: logbus_queue::durable::DurableKind,
    pub save_on_shutdown: bool,
}
