//! Turns a pipeline file into a validated [`Pipeline`], or into the full list
//! of what is wrong with it. Nothing here does I/O beyond reading the file,
//! so `logbus validate` in CI checks exactly what `logbus run` would refuse.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use logbus_plugin_api::{
    BuildContext, CheckOptions, LocalConfig, OptionError, Plugin, Registry, StageKind, closest,
    parse_options,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::diagnostic::Diagnostic;
use crate::yaml::{self, Node, NodeKind, Pos};

/// Suffix of the output that carries a stage's failed events (`on_error: route`).
pub const ERRORS_SUFFIX: &str = ".errors";

/// Suffix of the output that carries what a sink could not deliver: events
/// its destination refused for good, or that ran out of retries.
pub const DEAD_SUFFIX: &str = ".dead";

/// Keys every stage may have besides its plugin's options.
const COMMON_KEYS: [&str; 4] = ["inputs", "on_error", "workers", "queue"];

/// Most workers one stage may have.
pub const MAX_WORKERS: usize = 256;

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
}

impl ApiSettings {
    /// Checks the address; a reachable-from-elsewhere API must have a token.
    pub fn check(&self) -> Vec<OptionError> {
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
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
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
const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
const DEFAULT_MAX_DISK_BYTES: u64 = 10 << 30;

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
            if !(1..=logbus_plugin_api::local::MAX_FRONTENDS).contains(&local.max_frontends) {
                errors.push(OptionError::at(
                    &["local", "max_frontends"],
                    format!(
                        "must be between 1 and {}, got {}",
                        logbus_plugin_api::local::MAX_FRONTENDS,
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
    pub config: logbus_plugin_api::durable::DiskConfig,
    pub kind: logbus_plugin_api::durable::DurableKind,
    pub save_on_shutdown: bool,
}

#[derive(Clone)]
pub struct StageSpec {
    pub id: String,
    pub pos: Pos,
    pub kind: StageKind,
    pub plugin_name: String,
    pub plugin: Arc<dyn Plugin>,
    /// Output names this stage reads: a stage id, `<id>.errors`, or a
    /// sink's `<id>.dead`.
    pub inputs: Vec<String>,
    pub on_error: OnError,
    /// Tasks running this stage (parsers, transforms, formatters, sinks),
    /// sharing its input queue; each gets its own plugin instance.
    pub workers: usize,
    pub queue: Option<QueueSpec>,
    pub options: Value,
}

impl StageSpec {
    /// The name of this stage's second output: `<id>.dead` for a sink,
    /// `<id>.errors` for the others.
    pub fn side_output(&self) -> String {
        match self.kind {
            StageKind::Sink => format!("{}{DEAD_SUFFIX}", self.id),
            _ => format!("{}{ERRORS_SUFFIX}", self.id),
        }
    }

    /// Capacity of this stage's input, in events.
    pub fn capacity(&self, settings: &Settings) -> usize {
        self.queue
            .as_ref()
            .and_then(|q| q.size)
            .unwrap_or(settings.channel_capacity)
    }

    /// The frontends of a local-scope input queue, resolved against the
    /// settings; `None` for a global queue.
    pub fn local_config(&self, settings: &Settings) -> Option<LocalConfig> {
        let queue = self.queue.as_ref()?;
        if queue.scope != QueueScope::Local {
            return None;
        }
        let spec = queue.local.clone().unwrap_or_default();
        let d = self.dequeue_batch(settings).min(spec.frontend_size);
        Some(LocalConfig {
            frontend_size: spec.frontend_size,
            max_frontends: spec.max_frontends,
            helper_batch: spec.helper_batch.unwrap_or(d).min(d),
            min_batch: spec.min_batch,
            min_batch_timeout: std::time::Duration::from_millis(spec.min_batch_timeout_ms),
        })
    }

    /// Plugin instances this stage runs: one per worker, plus one per
    /// frontend of a local-scope queue.
    pub fn instances(&self, settings: &Settings) -> usize {
        if self.kind == StageKind::Source {
            return 1;
        }
        self.workers.max(1) + self.local_config(settings).map_or(0, |l| l.max_frontends)
    }

    /// The most events this stage's input queue can hold, batches in the
    /// consumers' hands included: `B`, plus `N × (F + D)` for a local-scope
    /// queue with `D = min(dequeue_batch, F)`.
    pub fn inflight_bound(&self, settings: &Settings) -> usize {
        // A durable queue's log is on disk; what it adds in memory is the
        // batches its workers hold (a `disk` queue has no memory part).
        let in_hands = self.workers.max(1) * self.dequeue_batch(settings);
        let b = match self.queue.as_ref().map(|q| q.kind) {
            Some(QueueKind::Disk) => in_hands,
            Some(QueueKind::DiskAssisted) => self.capacity(settings) + in_hands,
            _ => self.capacity(settings),
        };
        match self.local_config(settings) {
            None => b,
            Some(l) => {
                let d = self.dequeue_batch(settings).min(l.frontend_size);
                b + l.max_frontends * (l.frontend_size + d)
            }
        }
    }

    /// The durable store of a `disk` or `disk-assisted` input queue; a
    /// relative `path` is relative to `base` (the pipeline file's directory).
    pub fn durable(&self, settings: &Settings, base: &std::path::Path) -> Option<DurableQueueSpec> {
        use logbus_plugin_api::durable::{DiskConfig, DurableKind, SyncMode, WhenFull};
        let q = self.queue.as_ref()?;
        let capacity = self.capacity(settings);
        let kind = match q.kind {
            QueueKind::Memory => return None,
            QueueKind::Disk => DurableKind::Disk,
            QueueKind::DiskAssisted => {
                let high = q
                    .high_watermark
                    .unwrap_or((capacity * 9 / 10).max(1))
                    .min(capacity);
                DurableKind::DiskAssisted {
                    high_watermark: high,
                    low_watermark: q
                        .low_watermark
                        .unwrap_or(capacity * 7 / 10)
                        .min(high.saturating_sub(1)),
                }
            }
        };
        let dir = base.join(q.path.as_deref().unwrap_or(".")).join(&self.id);
        Some(DurableQueueSpec {
            config: DiskConfig {
                dir,
                segment_bytes: q.segment_bytes.map_or(DEFAULT_SEGMENT_BYTES, |b| b.0),
                max_disk_bytes: q.max_disk_bytes.map_or(DEFAULT_MAX_DISK_BYTES, |b| b.0),
                when_full: match q.when_full.unwrap_or(WhenFullSpec::Backpressure) {
                    WhenFullSpec::Backpressure => WhenFull::Backpressure,
                    WhenFullSpec::DropOldest => WhenFull::DropOldest,
                    WhenFullSpec::DropNewest => WhenFull::DropNewest,
                },
                sync: match q.sync.unwrap_or(SyncSpec::Batch) {
                    SyncSpec::Batch => SyncMode::Batch,
                    SyncSpec::Interval => SyncMode::Interval,
                    SyncSpec::None => SyncMode::None,
                },
                sync_interval: std::time::Duration::from_millis(q.sync_interval_ms.unwrap_or(100)),
                lz4: q.compression == Some(CompressionSpec::Lz4),
            },
            kind,
            save_on_shutdown: q.save_on_shutdown.unwrap_or(true),
        })
    }

    /// Most events one worker takes per dequeue.
    pub fn dequeue_batch(&self, settings: &Settings) -> usize {
        let capacity = self.capacity(settings);
        self.queue
            .as_ref()
            .and_then(|q| q.dequeue_batch)
            .unwrap_or(capacity)
            .min(capacity)
    }
}

/// A pipeline that passed validation.
#[derive(Clone)]
pub struct Pipeline {
    pub path: PathBuf,
    pub base_dir: PathBuf,
    pub settings: Settings,
    pub stages: Vec<StageSpec>,
}

impl Pipeline {
    pub fn stage(&self, id: &str) -> Option<&StageSpec> {
        self.stages.iter().find(|s| s.id == id)
    }

    /// The stages reading the output `name` (`id` or `id.errors`).
    /// The stage an input name reads from, and which of its outputs:
    /// `None` for the main one, `Some("errors")` or `Some("dead")`.
    pub fn output_of<'a>(&self, input: &'a str) -> (&'a str, Option<&'static str>) {
        for (suffix, side) in [(ERRORS_SUFFIX, "errors"), (DEAD_SUFFIX, "dead")] {
            if let Some(base) = input.strip_suffix(suffix)
                && self.stage(base).is_some()
            {
                return (base, Some(side));
            }
        }
        (input, None)
    }

    pub fn readers_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a StageSpec> + 'a {
        self.stages
            .iter()
            .filter(move |s| s.inputs.iter().any(|i| i == name))
    }

    /// The worst-case number of events in flight: each non-source stage has
    /// one input channel, and an event is counted against a channel until
    /// the consumer has forwarded or committed it.
    pub fn inflight_bound(&self) -> InflightBound {
        let inputs: Vec<&StageSpec> = self
            .stages
            .iter()
            .filter(|s| s.kind != StageKind::Source)
            .collect();
        InflightBound {
            channels: inputs.len(),
            channel_capacity: self.settings.channel_capacity,
            events: inputs
                .iter()
                .map(|s| s.inflight_bound(&self.settings))
                .sum(),
        }
    }

    pub fn build_context(&self, stage: &StageSpec) -> BuildContext {
        BuildContext {
            stage_id: stage.id.clone(),
            base_dir: self.base_dir.clone(),
            worker: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct InflightBound {
    pub channels: usize,
    pub channel_capacity: usize,
    pub events: usize,
}

/// The outcome of validation: a pipeline when there is no error, and every
/// diagnostic (warnings included) either way.
pub struct Loaded {
    pub pipeline: Option<Pipeline>,
    pub diagnostics: Vec<Diagnostic>,
}

impl Loaded {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot read pipeline file {}: {source}", path.display())]
pub struct UnreadableFile {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Reads and validates a pipeline file, expanding variables from the process environment.
pub fn load_file(path: &Path, registry: &Registry) -> Result<Loaded, UnreadableFile> {
    let text = std::fs::read_to_string(path).map_err(|source| UnreadableFile {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(load_str(&text, path, registry, &|k| std::env::var(k).ok()))
}

/// Validates pipeline text. `path` is used for relative paths and messages only.
pub fn load_str(
    text: &str,
    path: &Path,
    registry: &Registry,
    env: &dyn Fn(&str) -> Option<String>,
) -> Loaded {
    let mut cx = Checker {
        registry,
        env,
        diags: Vec::new(),
        base_dir: path
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from(".")),
    };
    let pipeline = cx.check(text, path);
    let mut diagnostics = cx.diags;
    diagnostics.sort_by_key(|d| (d.line.unwrap_or(0), d.col.unwrap_or(0)));
    let pipeline = pipeline.filter(|_| !diagnostics.iter().any(Diagnostic::is_error));
    Loaded {
        pipeline,
        diagnostics,
    }
}

struct Checker<'a> {
    registry: &'a Registry,
    env: &'a dyn Fn(&str) -> Option<String>,
    diags: Vec<Diagnostic>,
    base_dir: PathBuf,
}

/// A stage as read, before the graph checks.
struct RawStage {
    id: String,
    pos: Pos,
    kind: Option<StageKind>,
    plugin_name: String,
    plugin: Option<Arc<dyn Plugin>>,
    inputs: Vec<(String, Pos)>,
    has_inputs_key: bool,
    on_error: OnError,
    workers: usize,
    queue: Option<QueueSpec>,
    options: Value,
    /// A source's `codec:` or a sink's `format:`, as a stage of its own.
    attached: Option<Box<RawStage>>,
}

/// The key that attaches a parser to a source.
const ATTACHED_CODEC: &str = "codec";
/// The key that attaches a formatter to a sink.
const ATTACHED_FORMAT: &str = "format";

/// The attaching key a stage of `kind` may carry.
fn attached_key(kind: Option<StageKind>) -> Option<&'static str> {
    match kind {
        Some(StageKind::Source) => Some(ATTACHED_CODEC),
        Some(StageKind::Sink) => Some(ATTACHED_FORMAT),
        _ => None,
    }
}

impl Checker<'_> {
    fn push(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    fn check(&mut self, text: &str, path: &Path) -> Option<Pipeline> {
        let mut root = match yaml::parse(text) {
            Ok(Some(root)) => root,
            Ok(None) => {
                self.push(
                    Diagnostic::error(
                        "empty-file",
                        "the pipeline file is empty; it needs a `stages:` map",
                    )
                    .at(Pos { line: 1, col: 1 }),
                );
                return None;
            }
            Err(e) => {
                self.push(
                    Diagnostic::error("yaml-syntax", format!("invalid YAML: {}", e.message))
                        .at(e.pos),
                );
                return None;
            }
        };
        let mut env_errors = Vec::new();
        root.expand_env(self.env, &mut env_errors);
        for e in env_errors {
            self.push(Diagnostic::error("env-var", e.message).at(e.pos));
        }
        if root.entries().is_none() {
            self.push(
                Diagnostic::error(
                    "not-a-map",
                    "the top level must be a map with `stages:` (and optionally `settings:`)",
                )
                .at(root.pos),
            );
            return None;
        }

        for (key, _) in root.entries().unwrap_or_default() {
            let name = key.as_str().unwrap_or("");
            if !matches!(name, "settings" | "stages" | "tests") {
                let mut msg = format!("unknown top-level key `{name}`");
                if let Some(best) = closest(name, &["settings", "stages", "tests"]) {
                    msg.push_str(&format!("; did you mean `{best}`?"));
                }
                self.push(Diagnostic::error("unknown-key", msg).at(key.pos));
            }
        }

        let settings = self.check_settings(root.get("settings"));
        let Some(stages_node) = root.get("stages") else {
            self.push(Diagnostic::error("no-stages", "missing `stages:` map").at(root.pos));
            return None;
        };
        let stages = self.read_stages(stages_node);
        self.check_graph(&stages);
        self.check_plugin_limits(&stages);

        let stages = stages
            .into_iter()
            .map(|s| {
                Some(StageSpec {
                    id: s.id,
                    pos: s.pos,
                    kind: s.kind?,
                    plugin_name: s.plugin_name,
                    plugin: s.plugin?,
                    inputs: s.inputs.into_iter().map(|(i, _)| i).collect(),
                    on_error: s.on_error,
                    workers: s.workers,
                    queue: s.queue,
                    options: s.options,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Pipeline {
            path: path.to_path_buf(),
            base_dir: self.base_dir.clone(),
            settings: settings?,
            stages,
        })
    }

    fn check_settings(&mut self, node: Option<&Node>) -> Option<Settings> {
        let Some(node) = node else {
            return Some(Settings::default());
        };
        if matches!(node.kind, NodeKind::Scalar { .. }) && node.to_json().is_null() {
            return Some(Settings::default());
        }
        let schema = schemars::schema_for!(Settings).to_value();
        let errors = match parse_options::<Settings>(&node.to_json(), &schema) {
            Ok(s) => {
                let errors = s.check();
                if errors.is_empty() {
                    return Some(s);
                }
                errors
            }
            Err(errors) => errors,
        };
        for e in errors {
            self.push(
                Diagnostic::error("settings", format!("settings: {}", e.message))
                    .at(node.pos_of(&e.path)),
            );
        }
        None
    }

    fn read_stages(&mut self, node: &Node) -> Vec<RawStage> {
        let Some(entries) = node.entries() else {
            self.push(
                Diagnostic::error("not-a-map", "`stages` must be a map from stage id to stage")
                    .at(node.pos),
            );
            return Vec::new();
        };
        if entries.is_empty() {
            self.push(Diagnostic::error("no-stages", "`stages` is empty").at(node.pos));
        }
        let mut first_seen: HashMap<String, Pos> = HashMap::new();
        let mut stages = Vec::new();
        for (key, value) in entries {
            let id = key.as_str().unwrap_or("").to_string();
            if let Some(first) = first_seen.get(&id) {
                self.push(
                    Diagnostic::error(
                        "duplicate-id",
                        format!(
                            "duplicate stage id `{id}` (first defined at line {})",
                            first.line
                        ),
                    )
                    .stage(&id)
                    .at(key.pos),
                );
                continue;
            }
            first_seen.insert(id.clone(), key.pos);
            if let Some(problem) = id_problem(&id) {
                self.push(Diagnostic::error("bad-id", problem).stage(&id).at(key.pos));
            }
            if let Some(mut stage) = self.read_stage(&id, key.pos, value) {
                match stage.attached.take().map(|a| *a) {
                    None => stages.push(stage),
                    // `codec:` — the source becomes `<id>.source`, its parser `<id>`.
                    Some(mut parser) if stage.kind == Some(StageKind::Source) => {
                        stage.id = format!("{id}.source");
                        // `on_error` was the codec's.
                        stage.on_error = OnError::default();
                        parser.inputs = vec![(stage.id.clone(), parser.pos)];
                        stages.push(stage);
                        stages.push(parser);
                    }
                    // `format:` — the formatter `<id>.format` takes the sink's inputs.
                    Some(mut formatter) => {
                        formatter.inputs = std::mem::take(&mut stage.inputs);
                        formatter.has_inputs_key = stage.has_inputs_key;
                        formatter.pos = stage.pos;
                        stage.inputs = vec![(formatter.id.clone(), formatter.pos)];
                        stage.has_inputs_key = true;
                        stages.push(formatter);
                        stages.push(stage);
                    }
                }
            }
        }
        stages
    }

    fn read_stage(&mut self, id: &str, pos: Pos, node: &Node) -> Option<RawStage> {
        let Some(entries) = node.entries() else {
            self.push(
                Diagnostic::error(
                    "not-a-map",
                    "a stage must be a map, e.g. `{ sink: stdout, inputs: [parse] }`",
                )
                .stage(id)
                .at(node.pos),
            );
            return None;
        };
        let plugin_keys: Vec<(&Node, &Node, StageKind)> = entries
            .iter()
            .filter_map(|(k, v)| Some((k, v, StageKind::from_key(k.as_str()?)?)))
            .collect();
        let (kind, plugin_name, plugin) = match plugin_keys.as_slice() {
            [] => {
                self.push(
                    Diagnostic::error(
                        "no-plugin",
                        "no plugin key; add exactly one of `source`, `parser`, `transform`, `formatter`, `sink`",
                    )
                    .stage(id)
                    .at(pos),
                );
                (None, String::new(), None)
            }
            [(key, value, kind)] => {
                let name = match &value.kind {
                    NodeKind::Scalar { text, .. } if !text.is_empty() => text.clone(),
                    _ => {
                        self.push(
                            Diagnostic::error(
                                "bad-plugin",
                                format!("`{}` must name a plugin", kind.key()),
                            )
                            .stage(id)
                            .at(value.pos),
                        );
                        String::new()
                    }
                };
                let plugin = if name.is_empty() {
                    None
                } else {
                    self.find_plugin(id, *kind, &name, key.pos)
                };
                (Some(*kind), name, plugin)
            }
            [first, second, ..] => {
                self.push(
                    Diagnostic::error(
                        "two-plugins",
                        format!(
                            "a stage has exactly one plugin key, found `{}` and `{}`",
                            first.2.key(),
                            second.2.key()
                        ),
                    )
                    .stage(id)
                    .at(second.0.pos),
                );
                (None, String::new(), None)
            }
        };

        let mut inputs = Vec::new();
        let mut has_inputs_key = false;
        if let Some((key, value)) = node.entry("inputs") {
            has_inputs_key = true;
            match &value.kind {
                NodeKind::Seq(items) => {
                    for item in items {
                        match item.as_str() {
                            Some(name) if !name.is_empty() => {
                                inputs.push((name.to_string(), item.pos))
                            }
                            _ => self.push(
                                Diagnostic::error("bad-input", "each input must be a stage id")
                                    .stage(id)
                                    .at(item.pos),
                            ),
                        }
                    }
                }
                NodeKind::Scalar { text, .. } if !text.is_empty() => {
                    inputs.push((text.clone(), value.pos))
                }
                _ => self.push(
                    Diagnostic::error("bad-input", "`inputs` must be a list of stage ids")
                        .stage(id)
                        .at(key.pos),
                ),
            }
        }

        let mut on_error = OnError::default();
        if let Some((key, value)) = node.entry("on_error") {
            match value.as_str() {
                Some("drop") => on_error = OnError::Drop,
                Some("fail") => on_error = OnError::Fail,
                Some("route") => on_error = OnError::Route,
                other => self.push(
                    Diagnostic::error(
                        "bad-option",
                        format!(
                            "`on_error` must be `drop`, `fail` or `route`, got `{}`",
                            other.unwrap_or("?")
                        ),
                    )
                    .stage(id)
                    .at(value.pos),
                ),
            }
            let codec_source =
                kind == Some(StageKind::Source) && node.entry(ATTACHED_CODEC).is_some();
            if kind.is_some_and(|k| !k.is_processor()) && !codec_source {
                self.push(
                    Diagnostic::error(
                        "bad-option",
                        "`on_error` applies to parsers, transforms and formatters (and to a source's `codec`) only",
                    )
                    .stage(id)
                    .at(key.pos),
                );
            }
        }

        let mut workers = 1;
        if let Some((key, value)) = node.entry("workers") {
            match value.to_json().as_u64() {
                Some(n) if (1..=MAX_WORKERS as u64).contains(&n) => workers = n as usize,
                _ => self.push(
                    Diagnostic::error(
                        "bad-option",
                        format!("`workers` must be a whole number from 1 to {MAX_WORKERS}"),
                    )
                    .stage(id)
                    .at(value.pos),
                ),
            }
            if kind == Some(StageKind::Source) {
                self.push(
                    Diagnostic::error(
                        "bad-option",
                        "`workers` applies to parsers, transforms, formatters and sinks",
                    )
                    .stage(id)
                    .at(key.pos),
                );
            }
        }
        let mut queue = None;
        if let Some((key, value)) = node.entry("queue") {
            if kind == Some(StageKind::Source) {
                self.push(
                    Diagnostic::error(
                        "bad-option",
                        "a source has no input queue; `queue` applies to the stages it feeds",
                    )
                    .stage(id)
                    .at(key.pos),
                );
            }
            let schema = schemars::schema_for!(QueueSpec).to_value();
            let errors = match parse_options::<QueueSpec>(&value.to_json(), &schema) {
                Ok(q) => {
                    let errors = q.check();
                    queue = Some(q);
                    errors
                }
                Err(errors) => errors,
            };
            for e in errors {
                self.push(
                    Diagnostic::error(
                        "bad-option",
                        format!(
                            "{}: {}",
                            std::iter::once("queue")
                                .chain(e.path.iter().map(String::as_str))
                                .collect::<Vec<_>>()
                                .join("."),
                            e.message
                        ),
                    )
                    .stage(id)
                    .at(value.pos_of(&e.path)),
                );
            }
        }

        // Everything else belongs to the plugin.
        let mut options = serde_json::Map::new();
        for (k, v) in entries {
            let key = k.as_str().unwrap_or("");
            if StageKind::from_key(key).is_some() || COMMON_KEYS.contains(&key) {
                continue;
            }
            if attached_key(kind) == Some(key) {
                continue;
            }
            options.insert(key.to_string(), v.to_json());
        }
        let options = Value::Object(options);
        if let Some(plugin) = &plugin {
            let bcx = BuildContext {
                stage_id: id.to_string(),
                base_dir: self.base_dir.clone(),
                worker: 0,
            };
            for e in plugin.check(&options, &bcx) {
                let at = if e.path.is_empty() {
                    pos
                } else {
                    node.pos_of(&e.path)
                };
                let what = if e.path.is_empty() {
                    String::new()
                } else {
                    format!("option `{}`: ", e.path.join("."))
                };
                self.push(
                    Diagnostic::error("bad-option", format!("{what}{}", e.message))
                        .stage(id)
                        .at(at),
                );
            }
        }

        let attached = self.read_attached(id, kind, node, on_error);
        Some(RawStage {
            id: id.to_string(),
            pos,
            kind,
            plugin_name,
            plugin,
            inputs,
            has_inputs_key,
            on_error,
            workers,
            queue,
            options,
            attached,
        })
    }

    /// Reads a source's `codec:` or a sink's `format:`: a plugin name
    /// (`codec: json`) or a one-entry map of a name and its options
    /// (`format: { csv: { columns: [a, b] } }`). It becomes a stage of its
    /// own: the parser takes the source's id (so readers and `<id>.errors`
    /// see parsed events; the source itself is `<id>.source`), the
    /// formatter is `<id>.format` in front of the sink.
    fn read_attached(
        &mut self,
        id: &str,
        kind: Option<StageKind>,
        node: &Node,
        on_error: OnError,
    ) -> Option<Box<RawStage>> {
        let key_name = attached_key(kind)?;
        let (key, value) = node.entry(key_name)?;
        let (attached_kind, attached_id) = if kind == Some(StageKind::Source) {
            (StageKind::Parser, id.to_string())
        } else {
            (StageKind::Formatter, format!("{id}.format"))
        };
        let (name, options, options_node) = match &value.kind {
            NodeKind::Scalar { text, .. } if !text.is_empty() => {
                (text.clone(), Value::Object(Default::default()), None)
            }
            _ => match value.entries() {
                Some([(k, v)]) if k.as_str().is_some_and(|n| !n.is_empty()) => {
                    let options = match v.to_json() {
                        Value::Null => Value::Object(Default::default()),
                        other => other,
                    };
                    (k.as_str().unwrap_or("").to_string(), options, Some(v))
                }
                _ => {
                    self.push(
                        Diagnostic::error(
                            "bad-option",
                            format!(
                                "`{key_name}` must name a {} plugin, or be a map of one name to its options",
                                attached_kind.key()
                            ),
                        )
                        .stage(id)
                        .at(value.pos),
                    );
                    return None;
                }
            },
        };
        let plugin = self.find_plugin(&attached_id, attached_kind, &name, key.pos)?;
        let bcx = BuildContext {
            stage_id: attached_id.clone(),
            base_dir: self.base_dir.clone(),
            worker: 0,
        };
        for e in plugin.check(&options, &bcx) {
            let at = match (options_node, e.path.is_empty()) {
                (Some(n), false) => n.pos_of(&e.path),
                _ => value.pos,
            };
            let what = if e.path.is_empty() {
                String::new()
            } else {
                format!("option `{}`: ", e.path.join("."))
            };
            self.push(
                Diagnostic::error(
                    "bad-option",
                    format!("`{key_name}: {name}`: {what}{}", e.message),
                )
                .stage(id)
                .at(at),
            );
        }
        Some(Box::new(RawStage {
            id: attached_id,
            pos: key.pos,
            kind: Some(attached_kind),
            plugin_name: name,
            plugin: Some(plugin),
            inputs: Vec::new(),
            has_inputs_key: true,
            on_error,
            workers: 1,
            queue: None,
            options,
            attached: None,
        }))
    }

    fn find_plugin(
        &mut self,
        id: &str,
        kind: StageKind,
        name: &str,
        pos: Pos,
    ) -> Option<Arc<dyn Plugin>> {
        if let Some(p) = self.registry.get(kind, name) {
            return Some(p.clone());
        }
        let message = if let Some(feature) = self.registry.absent_feature(kind, name) {
            format!("{kind} `{name}` is not in this build; rebuild with cargo feature `{feature}`")
        } else {
            let names = self.registry.names(kind);
            let mut msg = format!("unknown {kind} plugin `{name}`");
            if let Some(best) = closest(name, &names) {
                msg.push_str(&format!("; did you mean `{best}`?"));
            }
            let other_kinds: Vec<&str> = StageKind::ALL
                .into_iter()
                .filter(|k| *k != kind && self.registry.get(*k, name).is_some())
                .map(StageKind::key)
                .collect();
            if !other_kinds.is_empty() {
                msg.push_str(&format!(
                    " (`{name}` exists as a {})",
                    other_kinds.join(", ")
                ));
            }
            msg.push_str(&format!(
                "; {kind} plugins in this build: {}",
                names.join(", ")
            ));
            msg
        };
        self.push(
            Diagnostic::error("unknown-plugin", message)
                .stage(id)
                .at(pos),
        );
        None
    }

    fn check_graph(&mut self, stages: &[RawStage]) {
        let by_id: BTreeMap<&str, &RawStage> = stages.iter().map(|s| (s.id.as_str(), s)).collect();
        let ids: Vec<&str> = by_id.keys().copied().collect();
        // Flow edges: upstream id -> downstream id.
        let mut edges: BTreeMap<&str, Vec<&str>> = BTreeMap::new();

        for s in stages {
            let is_source = s.kind == Some(StageKind::Source);
            if is_source && !s.inputs.is_empty() {
                self.push(
                    Diagnostic::error(
                        "source-with-inputs",
                        "a source reads no other stage; remove `inputs`",
                    )
                    .stage(&s.id)
                    .at(s.inputs[0].1),
                );
            }
            if !is_source && s.kind.is_some() && s.inputs.is_empty() {
                let hint = if s.has_inputs_key {
                    "`inputs` is empty"
                } else {
                    "no `inputs`"
                };
                self.push(
                    Diagnostic::error(
                        "no-inputs",
                        format!(
                            "{hint}; a {} needs at least one input stage",
                            s.kind.map_or("stage", StageKind::key)
                        ),
                    )
                    .stage(&s.id)
                    .at(s.pos),
                );
            }
            let mut seen = HashSet::new();
            for (input, pos) in &s.inputs {
                if !seen.insert(input.as_str()) {
                    self.push(
                        Diagnostic::error(
                            "duplicate-input",
                            format!("input `{input}` is listed twice"),
                        )
                        .stage(&s.id)
                        .at(*pos),
                    );
                    continue;
                }
                let (upstream_id, errors_output) = match input.strip_suffix(ERRORS_SUFFIX) {
                    Some(base) if by_id.contains_key(base) => (base, true),
                    _ => (input.as_str(), false),
                };
                let (upstream_id, dead_output) = match upstream_id.strip_suffix(DEAD_SUFFIX) {
                    Some(base) if !errors_output && by_id.contains_key(base) => (base, true),
                    _ => (upstream_id, false),
                };
                let Some(upstream) = by_id.get(upstream_id) else {
                    let mut msg = format!("input `{input}` names no stage");
                    if let Some(best) = closest(input, &ids) {
                        msg.push_str(&format!("; did you mean `{best}`?"));
                    }
                    self.push(
                        Diagnostic::error("unknown-input", msg)
                            .stage(&s.id)
                            .at(*pos),
                    );
                    continue;
                };
                if dead_output && upstream.kind != Some(StageKind::Sink) {
                    self.push(
                        Diagnostic::error(
                            "no-dead-output",
                            format!("`{input}`: only sinks have a `.dead` output, and `{upstream_id}` is not a sink"),
                        )
                        .stage(&s.id)
                        .at(*pos),
                    );
                    continue;
                }
                if upstream.kind == Some(StageKind::Sink) && !dead_output {
                    self.push(
                        Diagnostic::error(
                            "sink-as-input",
                            format!("`{upstream_id}` is a sink; a sink's only output is `{upstream_id}{DEAD_SUFFIX}`, what it could not deliver"),
                        )
                        .stage(&s.id)
                        .at(*pos),
                    );
                    continue;
                }
                if errors_output && upstream.on_error != OnError::Route {
                    self.push(
                        Diagnostic::error(
                            "no-error-output",
                            format!("`{input}` exists only when stage `{upstream_id}` has `on_error: route`"),
                        )
                        .stage(&s.id)
                        .at(*pos),
                    );
                    continue;
                }
                edges.entry(upstream_id).or_default().push(s.id.as_str());
            }
        }

        let in_cycle = self.report_cycles(&ids, &edges, &by_id);

        // Stages whose output can never reach a sink.
        let mut reaches_sink: HashSet<&str> = stages
            .iter()
            .filter(|s| s.kind == Some(StageKind::Sink))
            .map(|s| s.id.as_str())
            .collect();
        loop {
            let before = reaches_sink.len();
            for (up, downs) in &edges {
                if downs.iter().any(|d| reaches_sink.contains(d)) {
                    reaches_sink.insert(up);
                }
            }
            if reaches_sink.len() == before {
                break;
            }
        }
        for s in stages {
            if s.kind.is_some()
                && !reaches_sink.contains(s.id.as_str())
                && !in_cycle.contains(s.id.as_str())
            {
                self.push(
                    Diagnostic::warning(
                        "no-sink",
                        "output reaches no sink; its events would be discarded",
                    )
                    .stage(&s.id)
                    .at(s.pos),
                );
            }
            if s.on_error == OnError::Route {
                let name = format!("{}{ERRORS_SUFFIX}", s.id);
                if !stages
                    .iter()
                    .any(|r| r.inputs.iter().any(|(i, _)| *i == name))
                {
                    self.push(
                        Diagnostic::warning(
                            "unread-errors",
                            format!("`on_error: route` but no stage reads `{name}`; failed events would be discarded"),
                        )
                        .stage(&s.id)
                        .at(s.pos),
                    );
                }
            }
        }
    }

    fn check_plugin_limits(&mut self, stages: &[RawStage]) {
        for s in stages {
            let (Some(plugin), Some(kind)) = (&s.plugin, s.kind) else {
                continue;
            };
            let Some(max) = plugin.max_per_pipeline() else {
                continue;
            };
            let same: Vec<&RawStage> = stages
                .iter()
                .filter(|o| o.kind == Some(kind) && o.plugin_name == s.plugin_name)
                .collect();
            let position = same.iter().position(|o| o.id == s.id).unwrap_or(0);
            if position >= max {
                self.push(
                    Diagnostic::error(
                        "plugin-limit",
                        format!(
                            "{kind} `{}` may be used by at most {max} stage(s) per pipeline; `{}` already does",
                            s.plugin_name, same[0].id
                        ),
                    )
                    .stage(&s.id)
                    .at(s.pos),
                );
            }
        }
    }

    /// Reports each cycle once, as `a -> b -> a` in the direction events flow.
    fn report_cycles<'s>(
        &mut self,
        ids: &[&'s str],
        edges: &BTreeMap<&'s str, Vec<&'s str>>,
        by_id: &BTreeMap<&'s str, &RawStage>,
    ) -> HashSet<&'s str> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            Open,
            Done,
        }
        let mut marks: HashMap<&str, Mark> = ids.iter().map(|i| (*i, Mark::New)).collect();
        let mut cycles: Vec<Vec<&str>> = Vec::new();
        for &start in ids {
            if marks[start] != Mark::New {
                continue;
            }
            // Iterative DFS: (node, next edge index); `path` mirrors the open nodes.
            let mut stack: Vec<(&str, usize)> = vec![(start, 0)];
            marks.insert(start, Mark::Open);
            while let Some((node, next)) = stack.last_mut() {
                let downs = edges.get(*node).map(Vec::as_slice).unwrap_or_default();
                if *next < downs.len() {
                    let d = downs[*next];
                    *next += 1;
                    match marks[d] {
                        Mark::New => {
                            marks.insert(d, Mark::Open);
                            stack.push((d, 0));
                        }
                        Mark::Open => {
                            let from = stack
                                .iter()
                                .position(|(n, _)| *n == d)
                                .expect("open node is on the stack");
                            let mut cycle: Vec<&str> =
                                stack[from..].iter().map(|(n, _)| *n).collect();
                            cycle.push(d);
                            cycles.push(cycle);
                        }
                        Mark::Done => {}
                    }
                } else {
                    marks.insert(*node, Mark::Done);
                    stack.pop();
                }
            }
        }
        let mut in_cycle = HashSet::new();
        for cycle in cycles {
            in_cycle.extend(cycle.iter().copied());
            let first = cycle[0];
            let pos = by_id.get(first).map(|s| s.pos).unwrap_or_default();
            self.push(
                Diagnostic::error("cycle", format!("cycle: {}", cycle.join(" -> ")))
                    .stage(first)
                    .at(pos),
            );
        }
        in_cycle
    }
}

/// Stage ids become metric labels, file names and `<id>.errors` outputs.
fn id_problem(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("stage id is empty".into());
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Some(format!(
            "stage id `{id}` may contain only letters, digits, `_` and `-`"
        ));
    }
    None
}
