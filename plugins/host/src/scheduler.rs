//! `source: scheduler` — an event on a cron expression or every interval:
//! a heartbeat, or the trigger for a downstream stage that polls. A tick
//! that comes while the pipeline is still taking the previous event is
//! skipped, not queued (a scheduler never builds a backlog).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, Fields, Meta, OptionError, Source, SourceContext,
    StageError, StageKind, TypedPlugin, async_trait,
};
use serde::Deserialize;

/// Options of `source: scheduler`. Give `cron` or `interval_ms`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SchedulerOptions {
    /// A cron expression, evaluated in UTC: 5 fields (`*/5 * * * *`), or 6
    /// with seconds first (`*/10 * * * * *`).
    #[serde(default)]
    pub cron: Option<String>,
    /// Or: every this many milliseconds (the first tick right away).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub interval_ms: Option<u64>,
    /// Fields added to every event (besides `scheduled_at` and `tick`).
    #[serde(default)]
    pub fields: Fields,
    /// Stop after this many events (0: until the pipeline stops).
    #[serde(default)]
    pub count: u64,
}

impl CheckOptions for SchedulerOptions {
    fn check(&self) -> Vec<OptionError> {
        let mut errors = Vec::new();
        match (&self.cron, self.interval_ms) {
            (Some(_), Some(_)) | (None, None) => errors.push(OptionError::at(
                &["cron"],
                "give exactly one of `cron` and `interval_ms`",
            )),
            (Some(expr), None) => {
                if let Err(e) = parse_cron(expr) {
                    errors.push(OptionError::at(&["cron"], e));
                }
            }
            (None, Some(0)) => {
                errors.push(OptionError::at(&["interval_ms"], "must be at least 1"));
            }
            (None, Some(_)) => {}
        }
        errors
    }
}

fn parse_cron(expr: &str) -> Result<croner::Cron, String> {
    croner::Cron::new(expr)
        .with_seconds_optional()
        .parse()
        .map_err(|e| format!("`{expr}` is not a cron expression: {e}"))
}

pub struct Scheduler;

impl TypedPlugin for Scheduler {
    type Options = SchedulerOptions;
    const NAME: &'static str = "scheduler";
    const KIND: StageKind = StageKind::Source;

    type Stage = Box<dyn Source>;
    const DESCRIPTION: &'static str =
        "An event on a cron expression (UTC) or every interval: heartbeats and triggers.";

    /// Exactly `scheduled_at`, `tick` and the configured fields.
    fn flow(&self, o: &SchedulerOptions) -> logbus_plugin_api::Flow {
        use logbus_plugin_api::{FieldType, Flow};
        let mut flow = Flow::fields(&[
            ("scheduled_at", FieldType::String),
            ("tick", FieldType::Number),
        ]);
        for (name, value) in &o.fields {
            let ty = match value {
                serde_json::Value::String(_) => FieldType::String,
                serde_json::Value::Number(_) => FieldType::Number,
                serde_json::Value::Bool(_) => FieldType::Bool,
                serde_json::Value::Object(_) => FieldType::Object,
                serde_json::Value::Array(_) => FieldType::Array,
                serde_json::Value::Null => FieldType::Any,
            };
            flow = flow.set(name.clone(), ty, &["fields", name]);
        }
        flow
    }

    fn build(
        &self,
        options: SchedulerOptions,
        _cx: &BuildContext,
    ) -> Result<Self::Stage, OptionError> {
        let schedule = match (&options.cron, options.interval_ms) {
            (Some(expr), _) => Schedule::Cron(Box::new(
                parse_cron(expr).map_err(|e| OptionError::at(&["cron"], e))?,
            )),
            (None, Some(ms)) => Schedule::Every(Duration::from_millis(ms)),
            (None, None) => {
                return Err(OptionError::at(&["cron"], "give `cron` or `interval_ms`"));
            }
        };
        Ok(Box::new(Ticker { options, schedule }))
    }
}

enum Schedule {
    Cron(Box<croner::Cron>),
    Every(Duration),
}

struct Ticker {
    options: SchedulerOptions,
    schedule: Schedule,
}

fn event(fields: &Fields, at: DateTime<Utc>, tick: u64, source: &Arc<str>) -> Event {
    let mut f = Fields::new();
    f.insert(
        "scheduled_at".into(),
        at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            .into(),
    );
    f.insert("tick".into(), tick.into());
    for (k, v) in fields {
        f.insert(k.clone(), v.clone());
    }
    Event::fields(f, Meta::now(source.clone()))
}

#[async_trait]
impl Source for Ticker {
    async fn run(self: Box<Self>, cx: SourceContext) -> Result<(), StageError> {
        let mut tick = 0u64;
        let mut interval = match &self.schedule {
            Schedule::Every(d) => {
                let mut i = tokio::time::interval(*d);
                i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                Some(i)
            }
            Schedule::Cron(_) => None,
        };
        while self.options.count == 0 || tick < self.options.count {
            let at = match (&self.schedule, interval.as_mut()) {
                (_, Some(i)) => {
                    tokio::select! {
                        _ = cx.shutdown.cancelled() => return Ok(()),
                        _ = i.tick() => Utc::now(),
                    }
                }
                (Schedule::Cron(cron), None) => {
                    let now = Utc::now();
                    let next = cron.find_next_occurrence(&now, false).map_err(|e| {
                        StageError::Other(format!("no next time for the cron expression: {e}"))
                    })?;
                    let wait = (next - now).to_std().unwrap_or_default();
                    tokio::select! {
                        _ = cx.shutdown.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(wait) => next,
                    }
                }
                (Schedule::Every(_), None) => unreachable!("an interval schedule has its timer"),
            };
            if cx
                .output
                .send(vec![event(&self.options.fields, at, tick, &cx.id)])
                .await
                .is_err()
            {
                return Ok(());
            }
            tick += 1;
        }
        Ok(())
    }
}
