//! `source: generator`: synthetic events for demos, tests and load, with an
//! exact count and an optional steady rate. Events are raw lines rendered
//! from a template, so they go through the same parsers as real input.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, Meta, OptionError, Source, SourceContext, StageError,
    StageKind, TypedPlugin, async_trait, now_ns,
};
use serde::Deserialize;

/// Options of `source: generator`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GeneratorOptions {
    /// Number of events to emit, then stop; 0 means until shutdown.
    #[serde(default)]
    pub count: u64,
    /// Events per second; 0 means as fast as the pipeline accepts.
    #[serde(default)]
    #[schemars(range(max = 10000000))]
    pub rate: u64,
    /// Line template. `{{seq}}` is the event's sequence number (from 0),
    /// `{{ts}}` the emit time in nanoseconds since the Unix epoch.
    #[serde(default = "default_template")]
    pub template: String,
    /// Events per batch when not rate-limited.
    #[serde(default = "default_batch")]
    #[schemars(range(min = 1, max = 65536))]
    pub batch_size: usize,
}

fn default_template() -> String {
    r#"{"seq":{{seq}},"level":"info","message":"hello from logbus"}"#.to_string()
}

fn default_batch() -> usize {
    512
}

// Both ranges are in the schema, checked for every plugin alike.
impl CheckOptions for GeneratorOptions {}

pub struct GeneratorSource;

impl TypedPlugin for GeneratorSource {
    type Options = GeneratorOptions;
    const NAME: &'static str = "generator";
    const KIND: StageKind = StageKind::Source;

    type Stage = Box<dyn Source>;
    const DESCRIPTION: &'static str = "Emits synthetic lines from a template: a fixed count, at a fixed rate or as fast as accepted.";

    /// Raw events (one per line or message); a `codec:` parses them.
    fn flow(&self, _options: &GeneratorOptions) -> logbus_plugin_api::Flow {
        logbus_plugin_api::Flow::raw()
    }

    fn build(
        &self,
        options: GeneratorOptions,
        _cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(Generator {
            template: Template::parse(&options.template),
            options,
        }))
    }
}

enum Part {
    Text(String),
    Seq,
    Ts,
}

struct Template(Vec<Part>);

impl Template {
    fn parse(text: &str) -> Self {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(i) = rest.find("{{") {
            let (tag, part) = if rest[i..].starts_with("{{seq}}") {
                ("{{seq}}", Part::Seq)
            } else if rest[i..].starts_with("{{ts}}") {
                ("{{ts}}", Part::Ts)
            } else {
                parts.push(Part::Text(rest[..i + 2].to_string()));
                rest = &rest[i + 2..];
                continue;
            };
            parts.push(Part::Text(rest[..i].to_string()));
            parts.push(part);
            rest = &rest[i + tag.len()..];
        }
        parts.push(Part::Text(rest.to_string()));
        Template(parts)
    }

    fn render(&self, seq: u64, ts: u64, buf: &mut BytesMut) {
        for part in &self.0 {
            match part {
                Part::Text(t) => buf.put_slice(t.as_bytes()),
                Part::Seq => buf.put_slice(seq.to_string().as_bytes()),
                Part::Ts => buf.put_slice(ts.to_string().as_bytes()),
            }
        }
    }
}

struct Generator {
    options: GeneratorOptions,
    template: Template,
}

#[async_trait]
impl Source for Generator {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        let source: Arc<str> = cx.id.clone();
        let count = self.options.count;
        let rate = self.options.rate;
        let tick = Duration::from_millis(10);
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let started = tokio::time::Instant::now();
        let mut seq = 0u64;
        let mut buf = BytesMut::with_capacity(64 * 1024);
        while count == 0 || seq < count {
            let mut n = self.options.batch_size as u64;
            if rate > 0 {
                tokio::select! {
                    _ = interval.tick() => {}
                    _ = cx.shutdown.cancelled() => break,
                }
                // Catch up to where the schedule says we should be.
                let due =
                    (started.elapsed().as_nanos() as u64).saturating_mul(rate) / 1_000_000_000 + 1;
                n = due.saturating_sub(seq).min(65536);
            } else if cx.shutdown.is_cancelled() {
                break;
            }
            if count > 0 {
                n = n.min(count - seq);
            }
            if n == 0 {
                continue;
            }
            let ts = now_ns();
            let meta = Meta::at(source.clone(), ts);
            let mut events = Vec::with_capacity(n as usize);
            for _ in 0..n {
                self.template.render(seq, ts, &mut buf);
                events.push(Event::raw(buf.split().freeze(), meta.clone()));
                seq += 1;
            }
            // Not raced with shutdown: a batch that was generated is delivered.
            cx.output.send(events).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_renders_placeholders_and_keeps_other_braces() {
        let t = Template::parse(r#"{"a":{{seq}},"b":"{{x}}","t":{{ts}}}"#);
        let mut buf = BytesMut::new();
        t.render(7, 9, &mut buf);
        assert_eq!(&buf[..], br#"{"a":7,"b":"{{x}}","t":9}"#);
    }
}

#[cfg(test)]
mod schedule_tests {
    use super::*;
    use logbus_plugin_api::{CancellationToken, Output, OutputRole, StageMetrics, channel};

    fn generator(count: u64, rate: u64) -> Box<Generator> {
        let options = GeneratorOptions {
            count,
            rate,
            template: "{{seq}}".into(),
            batch_size: 64,
        };
        Box::new(Generator {
            template: Template::parse(&options.template),
            options,
        })
    }

    async fn run(gen_: Box<Generator>, shutdown: CancellationToken) -> Vec<String> {
        let (tx, mut rx) = channel(1_000_000);
        let cx = SourceContext {
            id: "gen".into(),
            output: Output::new(
                vec![tx],
                Arc::new(StageMetrics::default()),
                OutputRole::Main,
            ),
            shutdown,
        };
        let task = tokio::spawn(gen_.run(cx));
        let mut seen = Vec::new();
        while let Some(mut batch) = rx.recv().await {
            seen.extend(
                batch
                    .take()
                    .iter()
                    .map(|e| String::from_utf8_lossy(e.as_raw().unwrap()).into_owned()),
            );
        }
        task.await.unwrap().unwrap();
        seen
    }

    /// On tokio's paused clock the schedule is exact: 50 events at 100/s take 0.5 s.
    #[tokio::test(start_paused = true)]
    async fn rate_spreads_events_over_time() {
        let started = tokio::time::Instant::now();
        let seen = run(generator(50, 100), CancellationToken::new()).await;
        let took = started.elapsed();
        assert_eq!(seen, (0..50).map(|i| i.to_string()).collect::<Vec<_>>());
        assert!(
            took >= Duration::from_millis(480) && took <= Duration::from_millis(520),
            "took {took:?}"
        );
    }

    /// The first event is due at once, not one interval in: two events at
    /// 1/s take one second.
    #[tokio::test(start_paused = true)]
    async fn the_first_event_comes_at_once() {
        let started = tokio::time::Instant::now();
        let seen = run(generator(2, 1), CancellationToken::new()).await;
        let took = started.elapsed();
        assert_eq!(seen, ["0", "1"]);
        assert!(
            took >= Duration::from_millis(990) && took <= Duration::from_millis(1020),
            "took {took:?}"
        );
    }

    #[tokio::test]
    async fn count_is_exact_without_a_rate() {
        let seen = run(generator(1000, 0), CancellationToken::new()).await;
        assert_eq!(seen.len(), 1000);
        assert_eq!(seen.last().map(String::as_str), Some("999"));
    }

    #[tokio::test(start_paused = true)]
    async fn endless_generator_stops_on_shutdown() {
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            stop.cancel();
        });
        let seen = run(generator(0, 1000), shutdown).await;
        // About one second's worth at 1000/s, in order, and then it stopped.
        assert!((950..=1050).contains(&seen.len()), "{}", seen.len());
        assert!(seen.iter().enumerate().all(|(i, s)| *s == i.to_string()));
    }
}
