//! A stage's output: every downstream gets every event (fan-out). Events are
//! reference-counted, so each extra downstream costs a pointer increment per
//! event, not a copy.

use std::sync::{Arc, RwLock};

use crate::channel::{SendError, Sender};
use crate::event::Event;
use crate::metrics::StageMetrics;

/// What a send counts as in the stage's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputRole {
    /// The stage's main output: counted as `events_out`.
    Main,
    /// The `<id>.errors` output: counted as `routed`.
    Errors,
}

/// The channels an output delivers to. The engine replaces the list when a
/// reload adds or removes readers; a send in progress finishes on the list
/// it started with.
#[derive(Clone, Default)]
pub struct OutputTargets(Arc<RwLock<Arc<Vec<Sender>>>>);

impl OutputTargets {
    pub fn new(senders: Vec<Sender>) -> Self {
        OutputTargets(Arc::new(RwLock::new(Arc::new(senders))))
    }

    pub fn set(&self, senders: Vec<Sender>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(senders);
    }

    fn current(&self) -> Arc<Vec<Sender>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[derive(Clone)]
pub struct Output {
    targets: OutputTargets,
    metrics: Arc<StageMetrics>,
    role: OutputRole,
}

impl Output {
    pub fn new(senders: Vec<Sender>, metrics: Arc<StageMetrics>, role: OutputRole) -> Self {
        Self::with_targets(OutputTargets::new(senders), metrics, role)
    }

    pub fn with_targets(
        targets: OutputTargets,
        metrics: Arc<StageMetrics>,
        role: OutputRole,
    ) -> Self {
        Output {
            targets,
            metrics,
            role,
        }
    }

    /// Whether any stage reads this output.
    pub fn is_connected(&self) -> bool {
        !self.targets.current().is_empty()
    }

    /// Delivers the batch to every downstream, waiting while any is full.
    /// An output nobody reads counts its events as discarded (the validator
    /// warns about such stages).
    pub async fn send(&self, batch: Vec<Event>) -> Result<(), SendError> {
        let n = batch.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let senders = self.targets.current();
        match senders.as_slice() {
            [] => {
                self.metrics.add_discarded(n);
                return Ok(());
            }
            [only] => only.send(batch).await?,
            [rest @ .., last] => {
                for sender in rest {
                    sender.send(batch.clone()).await?;
                }
                last.send(batch).await?;
            }
        }
        match self.role {
            OutputRole::Main => self.metrics.add_out(n),
            OutputRole::Errors => self.metrics.add_routed(n),
        }
        Ok(())
    }

    pub fn metrics(&self) -> &Arc<StageMetrics> {
        &self.metrics
    }
}
