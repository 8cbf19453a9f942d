//! `source: stdin` and `sink: stdout`: the shell-pipeline end points.

use logbus_plugin_api::{
    BuildContext, CheckOptions, OptionError, Sink, SinkContext, Source, SourceContext, StageError,
    StageKind, TypedPlugin, async_trait,
};
use serde::Deserialize;

use crate::line_reader::{LineReaderOptions, run_line_source};
use crate::writer_sink::run_writer;

/// Options of `source: stdin`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StdinOptions {
    /// Lines longer than this many bytes are split into pieces.
    #[serde(default = "default_max_line")]
    #[schemars(range(min = 1))]
    pub max_line_bytes: usize,
    /// How messages are delimited: `newline` (default), `octet-counting`
    /// (RFC 6587: `LEN SP MSG`), `length-prefixed` (4-byte big-endian),
    /// `whole` (the whole input is one event, up to `max_line_bytes`).
    #[serde(default)]
    pub framing: logbus_framing::Framing,
}

pub(crate) fn default_max_line() -> usize {
    1024 * 1024
}

// `max_line_bytes`' range is in the schema, checked for every plugin alike.
impl CheckOptions for StdinOptions {}

pub struct StdinSource;

impl TypedPlugin for StdinSource {
    type Options = StdinOptions;
    const NAME: &'static str = "stdin";
    const KIND: StageKind = StageKind::Source;

    type Stage = Box<dyn Source>;
    const DESCRIPTION: &'static str =
        "Reads standard input to EOF, one event per line (raw bytes, newline removed).";
    // Two readers of one stdin would split the lines between them arbitrarily.
    const MAX_PER_PIPELINE: Option<usize> = Some(1);

    /// Raw events (one per line or message); a `codec:` parses them.
    fn flow(&self, _options: &StdinOptions) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::raw()
    }

    fn build(&self, options: StdinOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(Stdin { options }))
    }
}

struct Stdin {
    options: StdinOptions,
}

#[async_trait]
impl Source for Stdin {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        let opts = LineReaderOptions {
            max_line_bytes: self.options.max_line_bytes,
            framing: self.options.framing,
            origin: None,
            stream: None,
        };
        run_line_source(std::io::stdin(), "standard input".into(), opts, cx, None).await
    }
}

/// Options of `sink: stdout`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StdoutOptions {
    /// How each event is delimited: `newline` (default), `octet-counting`
    /// or `length-prefixed`.
    #[serde(default)]
    pub framing: logbus_framing::Framing,
}

impl CheckOptions for StdoutOptions {}

pub struct StdoutSink;

impl TypedPlugin for StdoutSink {
    type Options = StdoutOptions;
    const NAME: &'static str = "stdout";
    const KIND: StageKind = StageKind::Sink;

    type Stage = Box<dyn Sink>;
    const DESCRIPTION: &'static str = "Writes each event as a line to standard output: raw events as they are, parsed events as JSON.";

    fn build(
        &self,
        options: StdoutOptions,
        _cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(Stdout {
            framing: options.framing,
        }))
    }
}

struct Stdout {
    framing: logbus_framing::Framing,
}

#[async_trait]
impl Sink for Stdout {
    async fn run(self: Box<Self>, cx: &mut SinkContext) -> Result<(), StageError> {
        run_writer(
            std::io::stdout(),
            "standard output",
            self.framing,
            |_| Ok(()),
            cx,
        )
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::testing;

    /// The events reach standard output (the test's own, not captured) and
    /// are counted committed once written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn stdout_commits_what_it_writes() {
        let sink = testing::sink(&logbus_plugin_api::Typed(StdoutSink), serde_json::json!({}));
        let event = crate::writer_sink::tests::line;
        let (result, metrics) =
            testing::run_sink(sink, vec![vec![event("stdout sink test 1"), event("2")]]).await;
        result.unwrap();
        assert_eq!(metrics.snapshot().events_out, 2);
    }
}
