//! The run's counts as a report: what each stage and channel holds, read
//! while the pipeline runs (`StatsHandle`, the API's `/stats`) and at its end.

use super::*;

/// Every stage and channel that ever ran, and the configuration running now.
pub(super) struct Inventory {
    pub(super) stages: Vec<(String, StageKind, Arc<StageMetrics>)>,
    pub(super) channels: Vec<(String, ChannelHandle)>,
    /// Main output of every stage that has one, for taps.
    pub(super) outputs: HashMap<String, OutputTargets>,
    /// Stages running fused: the chain's first stage.
    pub(super) fused: HashMap<String, String>,
    pub(super) pipeline: Pipeline,
}

pub(super) fn inventory_push_stage(
    inventory: &Mutex<Inventory>,
    spec: &StageSpec,
    metrics: &Arc<StageMetrics>,
) {
    inventory.lock().expect("inventory lock").stages.push((
        spec.id.clone(),
        spec.kind,
        metrics.clone(),
    ));
}

pub(super) fn report_parts(inv: &Inventory) -> (Vec<StageReport>, Vec<ChannelReport>) {
    (
        inv.stages
            .iter()
            .map(|(id, kind, m)| StageReport {
                id: id.clone(),
                kind: *kind,
                counts: m.snapshot(),
                blocked_seconds: m.blocked_seconds(),
                bytes_out: m.bytes_out(),
                outputs: m.named_outputs().into_iter().collect(),
                fused_into: inv.fused.get(id).cloned(),
            })
            .collect(),
        inv.channels
            .iter()
            .map(|(id, c)| ChannelReport {
                stage: id.clone(),
                capacity: c.stats().capacity(),
                occupancy: c.occupancy(),
                max_occupancy: c.stats().max_occupancy(),
                sent: c.stats().sent(),
                received: c.stats().received(),
                abandoned: c.stats().abandoned(),
                batch_sizes: c.stats().batch_size_snapshot(),
                wait_seconds: c.stats().wait_seconds(),
                ingest_latency_us: c.stats().ingest_latency_snapshot(),
                local: c.local(),
                disk: c.durable(),
            })
            .collect(),
    )
}

/// Reads a running pipeline's counters (the same ones the exit summary
/// uses) and its current configuration, without touching the data path.
#[derive(Clone)]
pub struct StatsHandle {
    pub(super) inventory: Arc<Mutex<Inventory>>,
    pub(super) started: Instant,
}

impl StatsHandle {
    /// A report as of now. While events are in flight, `totals.lost`
    /// counts them (it is 0 only once the pipeline has drained).
    pub fn snapshot(&self) -> RunReport {
        let (stages, channels) = report_parts(&self.inventory.lock().expect("inventory lock"));
        RunReport::new(stages, channels, Vec::new(), self.started.elapsed())
    }

    /// A live sample of the events leaving `stage` (see [`Tap`]); `None`
    /// for an unknown stage or a sink (which has no output).
    pub fn tap(&self, stage: &str, capacity: usize) -> Option<logbus_plugin_api::engine::Tap> {
        let inv = self.inventory.lock().expect("inventory lock");
        inv.outputs.get(stage).map(|o| o.tap(capacity))
    }

    /// A forced stop: writes the memory backlog of every disk-assisted
    /// queue with `save_on_shutdown` to its log. Returns events saved.
    pub async fn save_queue_backlogs(&self) -> u64 {
        let channels: Vec<(String, ChannelHandle)> = self
            .inventory
            .lock()
            .expect("inventory lock")
            .channels
            .clone();
        let mut total = 0;
        for (stage, handle) in channels {
            let saved = handle.save_backlog().await;
            if saved > 0 {
                tracing::warn!(stage = %stage, "saved {saved} queued events to the disk queue");
            }
            total += saved;
        }
        total
    }

    /// The configuration running now (after any reload).
    pub fn pipeline(&self) -> Pipeline {
        self.inventory
            .lock()
            .expect("inventory lock")
            .pipeline
            .clone()
    }
}
