//! The validated pipeline: what the runtime builds stages from, and the
//! bounds computed from it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use logbus_plugin_api::{BuildContext, Plugin, StageKind};
use logbus_queue::LocalConfig;
use serde::Serialize;
use serde_json::Value;

use super::settings::{DEFAULT_MAX_DISK_BYTES, DEFAULT_SEGMENT_BYTES};
use super::{
    CompressionSpec, DEAD_SUFFIX, DurableQueueSpec, ERRORS_SUFFIX, OnError, QueueKind, QueueScope,
    QueueSpec, Settings, SyncSpec, WhenFullSpec,
};
use crate::yaml::Pos;

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
    /// Its workers hand on batches in the order they took them from the
    /// input queue (`ordered: true`; a no-op with one worker).
    pub ordered: bool,
    pub queue: Option<QueueSpec>,
    pub options: Value,
    /// The named outputs its plugin declares for these options (`route`'s
    /// routes): read as `<id>.<name>`; such a stage has no main output.
    pub outputs: Vec<String>,
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
        use logbus_queue::durable::{DiskConfig, DurableKind, SyncMode, WhenFull};
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

    /// The stage an input name reads from, and which of its outputs:
    /// `None` for the main one, `Some("errors")`, `Some("dead")` or a
    /// named output.
    pub fn output_of<'a>(&'a self, input: &'a str) -> (&'a str, Option<&'a str>) {
        for (suffix, side) in [(ERRORS_SUFFIX, "errors"), (DEAD_SUFFIX, "dead")] {
            if let Some(base) = input.strip_suffix(suffix)
                && self.stage(base).is_some()
            {
                return (base, Some(side));
            }
        }
        if let Some((base, name)) = input.split_once('.')
            && let Some(stage) = self.stage(base)
            && let Some(name) = stage.outputs.iter().find(|o| *o == name)
        {
            return (base, Some(name.as_str()));
        }
        (input, None)
    }

    /// The stages reading the output `name` (`id`, `id.errors`, `id.<route>`).
    pub fn readers_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a StageSpec> + 'a {
        self.stages
            .iter()
            .filter(move |s| s.inputs.iter().any(|i| i == name))
    }

    /// The straight runs of processors that run fused (`settings.fuse`):
    /// each run, in data order, has at least two stages. A stage joins
    /// the one before it when it reads nothing but that stage's main
    /// output, is its only reader, has a default queue and the same
    /// `workers`, so running the two in one task changes no event's path,
    /// no instance count and no order a user could see.
    pub fn fused_chains(&self) -> Vec<Vec<&StageSpec>> {
        if !self.settings.fuse {
            return Vec::new();
        }
        let is_processor = |s: &StageSpec| !matches!(s.kind, StageKind::Source | StageKind::Sink);
        // By id, and how many stages read each output: once, not per
        // stage (validation stays linear in the stages).
        let by_id: HashMap<&str, &StageSpec> =
            self.stages.iter().map(|s| (s.id.as_str(), s)).collect();
        let mut readers: HashMap<&str, usize> = HashMap::new();
        for s in &self.stages {
            for i in &s.inputs {
                *readers.entry(i.as_str()).or_default() += 1;
            }
        }
        // The stage each stage joins, if any.
        let joins = |b: &StageSpec| -> Option<&StageSpec> {
            let [input] = b.inputs.as_slice() else {
                return None;
            };
            let a = *by_id.get(input.as_str())?;
            let only_reader = readers.get(a.id.as_str()) == Some(&1);
            (is_processor(a)
                && is_processor(b)
                && only_reader
                && b.queue.is_none()
                && a.local_config(&self.settings).is_none()
                && a.workers.max(1) == b.workers.max(1)
                && a.ordered == b.ordered)
                .then_some(a)
        };
        let next: HashMap<&str, &StageSpec> = self
            .stages
            .iter()
            .filter_map(|b| Some((joins(b)?.id.as_str(), b)))
            .collect();
        let joined: std::collections::HashSet<&str> =
            next.values().map(|b| b.id.as_str()).collect();
        let mut chains = Vec::new();
        for head in &self.stages {
            if joined.contains(head.id.as_str()) || !next.contains_key(head.id.as_str()) {
                continue;
            }
            let mut chain = vec![head];
            while let Some(b) = next.get(chain.last().expect("not empty").id.as_str()) {
                chain.push(b);
            }
            chains.push(chain);
        }
        chains
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
