//! `logbus validate --connect`: each stage's service, reached from here.
//!
//! The plugins probe (only they speak Kafka, S3 or ClickHouse); this
//! module hands each probe what the flow analysis knows arrives at its
//! stage, runs every probe at once under one deadline, so a pipeline with
//! ten unreachable services still answers in one timeout, and places what
//! they find at the options they name. A probe that does not answer in
//! time is itself a finding: the service is unreachable from this host.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use logbus_plugin_api::connect::UNREACHABLE;
use logbus_plugin_api::{ArrivingFields, ConnectContext, FindingLevel, Plugin, ServiceFinding};
use serde_json::Value;

use crate::diagnostic::Diagnostic;
use crate::flow::Shape;
use crate::yaml::{Node, Pos};

/// A stage as it will be probed: its plugin, options and their places.
#[derive(Clone)]
pub struct PlacedService {
    pub stage: String,
    pub plugin: Arc<dyn Plugin>,
    pub options: Value,
    /// The options' node, to place findings at an option.
    pub node: Option<Node>,
    pub pos: Pos,
    pub base_dir: PathBuf,
    pub arriving: ArrivingFields,
}

impl std::fmt::Debug for PlacedService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacedService")
            .field("stage", &self.stage)
            .field("plugin", &self.plugin.name())
            .finish_non_exhaustive()
    }
}

/// Gives each stage what the analysis found arriving at it.
pub(crate) fn with_arriving(
    mut services: Vec<PlacedService>,
    inputs: &[(String, Shape)],
) -> Vec<PlacedService> {
    let by_stage: std::collections::HashMap<&str, &Shape> =
        inputs.iter().map(|(id, s)| (id.as_str(), s)).collect();
    for s in &mut services {
        if let Some(shape) = by_stage.get(s.stage.as_str()) {
            s.arriving = ArrivingFields {
                fields: shape
                    .fields
                    .iter()
                    .map(|(k, f)| (k.clone(), f.ty.0))
                    .collect(),
                open: shape.open_after.is_some(),
                // Only parsed events have fields to look at.
                known: shape.parsed && !shape.raw,
            };
        }
    }
    services
}

/// Probes every stage's service at once; each probe may take `timeout`.
pub async fn connect(services: &[PlacedService], timeout: Duration) -> Vec<Diagnostic> {
    let mut probes = tokio::task::JoinSet::new();
    let mut index = std::collections::HashMap::new();
    for (i, s) in services.iter().enumerate() {
        let cx = ConnectContext {
            stage_id: s.stage.clone(),
            base_dir: s.base_dir.clone(),
            timeout,
            arriving: s.arriving.clone(),
        };
        let Some(probe) = s.plugin.connect(&s.options, cx) else {
            continue;
        };
        let task = probes.spawn(async move {
            match tokio::time::timeout(timeout, probe).await {
                Ok(found) => found,
                Err(_) => vec![ServiceFinding::error(
                    UNREACHABLE,
                    &[],
                    format!("no answer within {timeout:?}"),
                )],
            }
        });
        index.insert(task.id(), i);
    }
    let mut found: Vec<(usize, Vec<ServiceFinding>)> = Vec::new();
    while let Some(done) = probes.join_next_with_id().await {
        match done {
            Ok((id, f)) => found.push((index[&id], f)),
            // A probe that panicked is a bug in its plugin; say so rather
            // than pass the pipeline.
            Err(e) => found.push((index[&e.id()], vec![panicked(e)])),
        }
    }
    found.sort_by_key(|(i, _)| *i);
    let mut out = Vec::new();
    for (i, findings) in found {
        for f in findings {
            out.push(place(&services[i], f));
        }
    }
    out
}

fn panicked(e: tokio::task::JoinError) -> ServiceFinding {
    ServiceFinding::error(
        UNREACHABLE,
        &[],
        format!("the probe failed: {e} (a bug in the plugin: please report it)"),
    )
}

fn place(s: &PlacedService, f: ServiceFinding) -> Diagnostic {
    let message = match f.option.is_empty() {
        true => f.message,
        false => format!("option `{}`: {}", f.option.join("."), f.message),
    };
    let d = match f.level {
        FindingLevel::Error => Diagnostic::error(f.code, message),
        FindingLevel::Warning => Diagnostic::warning(f.code, message),
    };
    let pos = match &s.node {
        Some(n) if !f.option.is_empty() => n.pos_of(&f.option),
        _ => s.pos,
    };
    d.stage(&s.stage).at(pos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::{
        BuildContext, Built, FieldType, Flow, OptionError, Probe, Registry, StageKind,
    };

    /// A source of `host` only, and a sink whose probe reports what its
    /// options say (or hangs, or panics).
    struct Scripted(StageKind);

    impl Plugin for Scripted {
        fn name(&self) -> &'static str {
            match self.0 {
                StageKind::Source => "hosts",
                _ => "scripted",
            }
        }
        fn kind(&self) -> StageKind {
            self.0
        }
        fn description(&self) -> &'static str {
            "made up for the probe runner's tests"
        }
        fn options_schema(&self) -> Value {
            serde_json::json!({ "type": "object" })
        }
        fn flow(&self, _: &Value) -> Flow {
            match self.0 {
                StageKind::Source => Flow::fields(&[("host", FieldType::String)]),
                _ => Flow::pass(),
            }
        }
        fn check(&self, _: &Value, _: &BuildContext) -> Vec<OptionError> {
            Vec::new()
        }
        fn build(&self, _: &Value, _: &BuildContext) -> Result<Built, Vec<OptionError>> {
            Err(Vec::new())
        }
        fn connect(&self, options: &Value, cx: ConnectContext) -> Option<Probe> {
            let options = options.clone();
            if self.0 == StageKind::Source || options.get("none").is_some() {
                return None;
            }
            Some(Box::pin(async move {
                if options.get("hang").is_some() {
                    std::future::pending::<()>().await;
                }
                if options.get("panic").is_some() {
                    panic!("scripted");
                }
                let mut out = vec![ServiceFinding::error(
                    "service-missing",
                    &["topic"],
                    format!("{} has no topic", cx.stage_id),
                )];
                for field in ["host", "level"] {
                    if !cx.arriving.may_have(field) {
                        out.push(ServiceFinding::warning(
                            "column-not-produced",
                            &[],
                            format!("no {field}"),
                        ));
                    }
                }
                out
            }))
        }
    }

    fn services(yaml: &str) -> Vec<PlacedService> {
        let mut registry = Registry::new();
        registry.add(Scripted(StageKind::Source));
        registry.add(Scripted(StageKind::Sink));
        crate::config::load_str_with(
            yaml,
            std::path::Path::new("p.yml"),
            &registry,
            &|_| None,
            crate::config::LoadOptions {
                record_fields: false,
                connect: true,
            },
        )
        .services
    }

    const PIPELINE: &str = "stages:
  src:
    source: hosts
  a:
    sink: scripted
    inputs: [src]
    topic: x
  b:
    sink: scripted
    inputs: [src]
    hang: true
  c:
    sink: scripted
    inputs: [src]
    none: true
";

    #[tokio::test(start_paused = true)]
    async fn findings_are_placed_at_their_option_with_what_arrives_and_a_silent_probe_times_out() {
        let found = connect(&services(PIPELINE), Duration::from_secs(5)).await;
        let of = |id: &str| -> Vec<&Diagnostic> {
            found
                .iter()
                .filter(|d| d.stage.as_deref() == Some(id))
                .collect()
        };
        let a = of("a");
        assert_eq!(a.len(), 2, "{found:?}");
        assert_eq!(a[0].code, "service-missing");
        assert_eq!((a[0].line, a[0].col), (Some(7), Some(5)), "at the option");
        assert_eq!(a[0].message, "option `topic`: a has no topic");
        assert_eq!(a[1].message, "no level", "host arrives, level does not");
        assert_eq!(a[1].line, Some(4), "at the stage");
        let b = of("b");
        assert_eq!(b.len(), 1, "{found:?}");
        assert_eq!(b[0].code, UNREACHABLE);
        assert_eq!(b[0].message, "no answer within 5s");
        assert!(of("c").is_empty(), "no probe, no finding");
    }

    #[tokio::test]
    async fn a_probe_that_panics_is_reported_at_its_stage_not_passed() {
        let found = connect(
            &services("stages:\n  src:\n    source: hosts\n  a:\n    sink: scripted\n    inputs: [src]\n    panic: true\n"),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].is_error());
        assert_eq!(found[0].stage.as_deref(), Some("a"));
        assert!(
            found[0].message.contains("a bug in the plugin"),
            "{}",
            found[0].message
        );
    }

    #[test]
    fn without_the_option_nothing_is_kept() {
        let mut registry = Registry::new();
        registry.add(Scripted(StageKind::Source));
        registry.add(Scripted(StageKind::Sink));
        let loaded =
            crate::config::load_str(PIPELINE, std::path::Path::new("p.yml"), &registry, &|_| {
                None
            });
        assert!(loaded.services.is_empty());
    }
}
