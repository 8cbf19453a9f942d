//! `sink: blackhole`: counts and discards. The sink for load tests and for
//! measuring everything upstream of a real destination.

use logbus_plugin_api::{
    BuildContext, CheckOptions, OptionError, Sink, SinkContext, StageError, StageKind, TypedPlugin,
    async_trait,
};
use serde::Deserialize;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BlackholeOptions {}

impl CheckOptions for BlackholeOptions {}

pub struct BlackholeSink;

impl TypedPlugin for BlackholeSink {
    type Options = BlackholeOptions;
    const NAME: &'static str = "blackhole";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "Counts events as committed and discards them.";

    fn build(
        &self,
        _options: BlackholeOptions,
        _cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(Blackhole))
    }
}

struct Blackhole;

#[async_trait]
impl Sink for Blackhole {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        while let Some(mut batch) = cx.input.recv().await {
            cx.metrics.add_in(batch.len() as u64);
            // Discarding is what this sink is for: finished.
            batch.settle(logbus_plugin_api::Outcome::Delivered);
            cx.committed(batch.len());
        }
        Ok(())
    }
}
