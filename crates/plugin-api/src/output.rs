//! A stage's output: every downstream gets every event (fan-out). Events are
//! reference-counted, so each extra downstream costs a pointer increment per
//! event, not a copy.

use std::sync::Arc;

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

pub struct Output {
    senders: Vec<Sender>,
    metrics: Arc<StageMetrics>,
    role: OutputRole,
}

impl Output {
    pub fn new(senders: Vec<Sender>, metrics: Arc<StageMetrics>, role: OutputRole) -> Self {
        Output {
            senders,
            metrics,
            role,
        }
    }

    /// Whether any stage reads this output.
    pub fn is_connected(&self) -> bool {
        !self.senders.is_empty()
    }

    /// Delivers the batch to every downstream, waiting while any is full.
    /// An output nobody reads counts its events as discarded (the validator
    /// warns about such stages).
    pub async fn send(&self, batch: Vec<Event>) -> Result<(), SendError> {
        let n = batch.len() as u64;
        if n == 0 {
            return Ok(());
        }
        match self.senders.as_slice() {
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
