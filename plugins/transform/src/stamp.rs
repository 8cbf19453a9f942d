//! `transform: stamp`: writes the time the source read the event (or the
//! time the stamp stage saw it) into a field.

use chrono::{DateTime, SecondsFormat};
use logbus_plugin_api::{
    BuildContext, CheckOptions, Event, EventError, FieldPath, FieldType, Flow, Needs, OptionError,
    Processor, StageKind, TypedPlugin, Verdict, now_ns,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{field_path, needs_fields};

#[derive(Debug, Clone, Copy, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StampFormat {
    /// `2026-11-30T05:00:00.123456Z`
    Rfc3339,
    UnixS,
    UnixMs,
    UnixUs,
    UnixNs,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StampTime {
    /// When the source read the event.
    Ingest,
    /// When this stage processes it.
    Now,
}

/// Options of `transform: stamp`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StampOptions {
    /// Field to write (dotted path for nested fields).
    #[serde(default = "default_field")]
    pub field: String,
    /// How to write the time: an RFC 3339 string (UTC, microseconds) or an
    /// integer count of seconds, milliseconds, microseconds or nanoseconds since the Unix epoch.
    #[serde(default = "default_format")]
    pub format: StampFormat,
    /// Which time: when the source read the event, or when this stage runs.
    #[serde(default = "default_time")]
    pub time: StampTime,
}

fn default_field() -> String {
    "ingest_ts".into()
}
fn default_format() -> StampFormat {
    StampFormat::Rfc3339
}
fn default_time() -> StampTime {
    StampTime::Ingest
}

impl CheckOptions for StampOptions {
    fn check(&self) -> Vec<OptionError> {
        field_path(&self.field, &["field"])
            .err()
            .into_iter()
            .collect()
    }
}

pub struct StampTransform;

impl TypedPlugin for StampTransform {
    type Options = StampOptions;
    const NAME: &'static str = "stamp";
    const KIND: StageKind = StageKind::Transform;

    type Stage = Box<dyn Processor>;
    const DESCRIPTION: &'static str =
        "Adds a timestamp field: the ingest time (default) or the processing time.";

    fn build(&self, options: StampOptions, _cx: &BuildContext) -> Result<Self::Stage, OptionError> {
        Ok(Box::new(Stamp {
            field: field_path(&options.field, &["field"])?,
            format: options.format,
            time: options.time,
        }))
    }

    fn flow(&self, options: &StampOptions) -> Flow {
        let ty = match options.format {
            StampFormat::Rfc3339 => FieldType::String,
            _ => FieldType::Number,
        };
        Flow::pass()
            .needs(Needs::Fields)
            .set(options.field.clone(), ty, &["field"])
    }
}

struct Stamp {
    field: FieldPath,
    format: StampFormat,
    time: StampTime,
}

pub fn format_ns(ns: u64, format: StampFormat) -> Value {
    match format {
        StampFormat::Rfc3339 => Value::String(
            DateTime::from_timestamp_nanos(ns as i64).to_rfc3339_opts(SecondsFormat::Micros, true),
        ),
        StampFormat::UnixS => Value::from(ns / 1_000_000_000),
        StampFormat::UnixMs => Value::from(ns / 1_000_000),
        StampFormat::UnixUs => Value::from(ns / 1_000),
        StampFormat::UnixNs => Value::from(ns),
    }
}

impl Processor for Stamp {
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        let ns = match self.time {
            StampTime::Ingest => event.meta().ingest_ns,
            StampTime::Now => now_ns(),
        };
        let value = format_ns(ns, self.format);
        if event.set_field(&self.field, value) {
            Ok(Verdict::Keep)
        } else {
            Err(needs_fields("stamp"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::{Fields, Meta};
    use serde_json::json;

    #[test]
    fn formats() {
        let ns = 1_764_478_800_123_456_789u64;
        assert_eq!(
            format_ns(ns, StampFormat::Rfc3339),
            json!("2025-11-30T05:00:00.123456Z")
        );
        assert_eq!(
            format_ns(ns, StampFormat::UnixMs),
            json!(1_764_478_800_123u64)
        );
        assert_eq!(format_ns(ns, StampFormat::UnixS), json!(1_764_478_800u64));
        assert_eq!(
            format_ns(ns, StampFormat::UnixUs),
            json!(1_764_478_800_123_456u64)
        );
        assert_eq!(format_ns(ns, StampFormat::UnixNs), json!(ns));
    }

    #[test]
    fn the_defaults_and_a_bad_field_path() {
        let options: StampOptions = serde_json::from_value(json!({})).unwrap();
        assert_eq!(options.field, "ingest_ts");
        assert!(options.check().is_empty());
        let options: StampOptions = serde_json::from_value(json!({"field": "a..b"})).unwrap();
        let errors = options.check();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].path, ["field"]);
    }

    #[test]
    fn stamps_ingest_time_into_nested_field() {
        let mut s = Stamp {
            field: FieldPath::parse("t.in").unwrap(),
            format: StampFormat::UnixNs,
            time: StampTime::Ingest,
        };
        let mut e = Event::fields(Fields::new(), Meta::at("s", 42));
        s.process(&mut e).unwrap();
        assert_eq!(
            Value::Object(e.as_fields().unwrap().clone()),
            json!({"t": {"in": 42}})
        );
        let mut raw = Event::raw("x", Meta::at("s", 42));
        assert!(s.process(&mut raw).is_err());
    }

    #[test]
    fn stamps_lazy_fields_without_building_them() {
        use logbus_plugin_api::{Bytes, LazyFields, Payload};
        let mut s = Stamp {
            field: FieldPath::parse("ts").unwrap(),
            format: StampFormat::UnixNs,
            time: StampTime::Ingest,
        };
        let lazy = LazyFields::parse(Bytes::from_static(br#"{"ts":0,"a":1}"#)).unwrap();
        let meta = Meta::at("s", 42);
        let mut e = Event::new(Payload::Lazy(lazy), meta);
        s.process(&mut e).unwrap();
        let mut json = Vec::new();
        assert!(matches!(e.payload(), Payload::Lazy(_)));
        e.payload().write_json(&mut json);
        assert_eq!(json, br#"{"ts":42,"a":1}"#);
    }

    /// The stamp's field and its type.
    #[test]
    fn the_flow_sets_the_field_with_its_format_type() {
        use logbus_plugin_api::{FieldType, Needs, Step};
        for (format, ty) in [
            ("rfc3339", FieldType::String),
            ("unix_s", FieldType::Number),
            ("unix_ms", FieldType::Number),
            ("unix_us", FieldType::Number),
            ("unix_ns", FieldType::Number),
        ] {
            let o: StampOptions =
                serde_json::from_value(json!({"field": "at", "format": format})).unwrap();
            let flow = StampTransform.flow(&o);
            assert_eq!(flow.needs, Needs::Fields);
            assert_eq!(
                flow.steps,
                [Step::Set {
                    field: "at".into(),
                    ty,
                    option: vec!["field".into()]
                }],
                "{format}"
            );
        }
    }
}
