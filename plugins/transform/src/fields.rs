//! `transform: fields`: set, copy, rename and delete fields. Operations run
//! in a fixed order — copy, rename, set, delete — whatever order the keys
//! have in the file, so a pipeline reads the same way it runs.

use logbus_plugin_api::{
    BuildContext, Built, CheckOptions, Event, EventData, EventError, FieldPath, Fields,
    OptionError, Payload, Processor, StageKind, TypedPlugin, Verdict,
};
use serde::Deserialize;
use serde_json::Value;

use crate::{field_path, needs_fields};

/// Options of `transform: fields`.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldsOptions {
    /// `from: to` — copy a field's value to another field (first).
    #[serde(default)]
    pub copy: Fields,
    /// `from: to` — move a field (second). A missing `from` is skipped.
    #[serde(default)]
    pub rename: Fields,
    /// `field: value` — set fields to constant values (third).
    #[serde(default)]
    pub set: Fields,
    /// `field: what` — set fields from the event's metadata (fourth):
    /// `origin`, where the source found it (a tailed file's path); `source`,
    /// the id of the source stage; `attributes`, everything the source
    /// attached (an object: a Kafka message's topic, partition, offset,
    /// key, headers, timestamp); or `attributes.<path>`, one of them
    /// (`attributes.headers.trace_id`). What the event does not have is
    /// skipped.
    #[serde(default)]
    pub from_meta: std::collections::BTreeMap<String, String>,
    /// Fields to remove (last).
    #[serde(default)]
    pub delete: Vec<String>,
}

/// What of an event's metadata `from_meta` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaKey {
    Origin,
    Source,
    Attributes,
    Attribute(FieldPath),
}

impl MetaKey {
    fn parse(what: &str, at: &[&str]) -> Result<MetaKey, OptionError> {
        match what {
            "origin" => Ok(MetaKey::Origin),
            "source" => Ok(MetaKey::Source),
            "attributes" => Ok(MetaKey::Attributes),
            other => match other.strip_prefix("attributes.") {
                Some(path) => field_path(path, at).map(MetaKey::Attribute),
                None => Err(OptionError::at(
                    at,
                    format!(
                        "unknown metadata `{other}`: use origin, source, attributes or attributes.<name>"
                    ),
                )),
            },
        }
    }
}

struct Plan {
    copy: Vec<(FieldPath, FieldPath)>,
    rename: Vec<(FieldPath, FieldPath)>,
    set: Vec<(FieldPath, Value)>,
    from_meta: Vec<(FieldPath, MetaKey)>,
    delete: Vec<FieldPath>,
}

fn pairs(map: &Fields, option: &str) -> Result<Vec<(FieldPath, FieldPath)>, OptionError> {
    map.iter()
        .map(|(from, to)| {
            let to = to.as_str().ok_or_else(|| {
                OptionError::at(
                    &[option, from],
                    "the target must be a field name (a string)",
                )
            })?;
            Ok((
                field_path(from, &[option, from])?,
                field_path(to, &[option, from])?,
            ))
        })
        .collect()
}

impl FieldsOptions {
    fn plan(&self) -> Result<Plan, Vec<OptionError>> {
        let mut errors = Vec::new();
        let copy = pairs(&self.copy, "copy")
            .map_err(|e| errors.push(e))
            .unwrap_or_default();
        let rename = pairs(&self.rename, "rename")
            .map_err(|e| errors.push(e))
            .unwrap_or_default();
        let mut set = Vec::new();
        for (k, v) in &self.set {
            match field_path(k, &["set", k]) {
                Ok(p) => set.push((p, v.clone())),
                Err(e) => errors.push(e),
            }
        }
        let mut from_meta = Vec::new();
        for (k, what) in &self.from_meta {
            let at = ["from_meta", k.as_str()];
            match field_path(k, &at).and_then(|p| Ok((p, MetaKey::parse(what, &at)?))) {
                Ok(pair) => from_meta.push(pair),
                Err(e) => errors.push(e),
            }
        }
        let mut delete = Vec::new();
        for (i, k) in self.delete.iter().enumerate() {
            match field_path(k, &["delete", &i.to_string()]) {
                Ok(p) => delete.push(p),
                Err(e) => errors.push(e),
            }
        }
        if copy.is_empty()
            && rename.is_empty()
            && set.is_empty()
            && from_meta.is_empty()
            && delete.is_empty()
            && errors.is_empty()
        {
            errors.push(OptionError::at(
                &[],
                "nothing to do: give at least one of copy, rename, set, from_meta, delete",
            ));
        }
        if errors.is_empty() {
            Ok(Plan {
                copy,
                rename,
                set,
                from_meta,
                delete,
            })
        } else {
            Err(errors)
        }
    }
}

impl CheckOptions for FieldsOptions {
    fn check(&self) -> Vec<OptionError> {
        self.plan().err().unwrap_or_default()
    }
}

pub struct FieldsTransform;

impl TypedPlugin for FieldsTransform {
    type Options = FieldsOptions;
    const NAME: &'static str = "fields";
    const KIND: StageKind = StageKind::Transform;
    const DESCRIPTION: &'static str = "Reshapes parsed events: copy, rename, set (constant values), from_meta (where the event came from) and delete fields, in that order.";

    fn build(&self, options: FieldsOptions, _cx: &BuildContext) -> Result<Built, OptionError> {
        let plan = options.plan().map_err(|mut e| e.swap_remove(0))?;
        Ok(Built::Processor(Box::new(plan)))
    }
}

impl Processor for Plan {
    fn process(&mut self, event: &mut Event) -> Result<Verdict, EventError> {
        // The fields are written while the meta is read: borrow both halves.
        let EventData { payload, meta } = event.data_mut();
        let Payload::Fields(fields) = payload else {
            return Err(needs_fields("fields"));
        };
        for (from, to) in &self.copy {
            if let Some(v) = from.get(fields).cloned() {
                to.set(fields, v);
            }
        }
        for (from, to) in &self.rename {
            if let Some(v) = from.remove(fields) {
                to.set(fields, v);
            }
        }
        for (path, value) in &self.set {
            path.set(fields, value.clone());
        }
        for (path, key) in &self.from_meta {
            let value = match key {
                MetaKey::Origin => meta.origin.as_deref().map(|o| Value::String(o.into())),
                MetaKey::Source => Some(Value::String(meta.source.to_string())),
                MetaKey::Attributes => meta.attributes.as_deref().cloned().map(Value::Object),
                MetaKey::Attribute(name) => meta
                    .attributes
                    .as_deref()
                    .and_then(|a| name.get(a))
                    .cloned(),
            };
            if let Some(v) = value {
                path.set(fields, v);
            }
        }
        for path in &self.delete {
            path.remove(fields);
        }
        Ok(Verdict::Keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logbus_plugin_api::Meta;
    use serde_json::json;

    #[test]
    fn operations_run_in_documented_order() {
        let opts: FieldsOptions = serde_json::from_value(json!({
            "delete": ["tmp"],
            "set": {"env": "prod", "a.b": 1},
            "rename": {"msg": "message"},
            "copy": {"msg": "original"}
        }))
        .unwrap();
        let mut plan = opts.plan().unwrap();
        let mut e = Event::fields(
            serde_json::from_value(json!({"msg": "hi", "tmp": 1})).unwrap(),
            Meta {
                source: "s".into(),
                ingest_ns: 0,
                origin: None,
                attributes: None,
            },
        );
        plan.process(&mut e).unwrap();
        assert_eq!(
            Value::Object(e.as_fields().unwrap().clone()),
            json!({"original": "hi", "message": "hi", "env": "prod", "a": {"b": 1}})
        );
    }

    #[test]
    fn from_meta_writes_the_origin_and_source_and_skips_an_unknown_origin() {
        let opts: FieldsOptions = serde_json::from_value(json!({
            "from_meta": {"log.file": "origin", "via": "source"},
            "delete": ["via"],
            "set": {"via": "overwritten by from_meta, then deleted"}
        }))
        .unwrap();
        let mut plan = opts.plan().unwrap();
        let event = |origin: Option<&str>| {
            Event::fields(
                serde_json::from_value(json!({"msg": "hi"})).unwrap(),
                Meta {
                    source: "logs".into(),
                    ingest_ns: 0,
                    origin: origin.map(Into::into),
                    attributes: None,
                },
            )
        };
        let mut tailed = event(Some("/var/log/app.log"));
        plan.process(&mut tailed).unwrap();
        assert_eq!(
            Value::Object(tailed.as_fields().unwrap().clone()),
            json!({"msg": "hi", "log": {"file": "/var/log/app.log"}})
        );
        let mut unknown = event(None);
        plan.process(&mut unknown).unwrap();
        assert_eq!(
            Value::Object(unknown.as_fields().unwrap().clone()),
            json!({"msg": "hi"})
        );

        let opts: FieldsOptions =
            serde_json::from_value(json!({"from_meta": {"via": "source"}})).unwrap();
        let mut e = event(None);
        opts.plan().unwrap().process(&mut e).unwrap();
        assert_eq!(e.as_fields().unwrap()["via"], "logs");
    }

    #[test]
    fn from_meta_reads_the_source_attributes_whole_or_by_path() {
        let opts: FieldsOptions = serde_json::from_value(json!({
            "from_meta": {
                "kafka": "attributes",
                "partition": "attributes.partition",
                "trace": "attributes.headers.trace_id",
                "absent": "attributes.headers.nope"
            }
        }))
        .unwrap();
        let mut plan = opts.plan().unwrap();
        let attributes: Fields = serde_json::from_value(
            json!({"topic": "logs", "partition": 2, "headers": {"trace_id": "t-1"}}),
        )
        .unwrap();
        let mut e = Event::fields(
            Fields::new(),
            Meta {
                attributes: Some(std::sync::Arc::new(attributes)),
                ..Meta::now("k".into())
            },
        );
        plan.process(&mut e).unwrap();
        assert_eq!(
            Value::Object(e.as_fields().unwrap().clone()),
            json!({
                "kafka": {"topic": "logs", "partition": 2, "headers": {"trace_id": "t-1"}},
                "partition": 2,
                "trace": "t-1"
            }),
            "a missing attribute is skipped"
        );
        // An event without attributes gets none of them.
        let mut plain = Event::fields(Fields::new(), Meta::now("k".into()));
        plan.process(&mut plain).unwrap();
        assert!(plain.as_fields().unwrap().is_empty());
        let bad: FieldsOptions =
            serde_json::from_value(json!({"from_meta": {"x": "offset"}})).unwrap();
        let errs = bad.check();
        assert_eq!(errs[0].path, ["from_meta", "x"]);
        assert!(
            errs[0].message.contains("unknown metadata `offset`"),
            "{}",
            errs[0].message
        );
    }

    #[test]
    fn option_errors_point_at_the_entry() {
        let opts: FieldsOptions =
            serde_json::from_value(json!({"rename": {"a": 3}, "delete": ["ok", "x..y"]})).unwrap();
        let errs = opts.check();
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[0].path, ["rename", "a"]);
        assert_eq!(errs[1].path, ["delete", "1"]);
        let opts: FieldsOptions =
            serde_json::from_value(json!({"from_meta": {"x..y": "origin"}})).unwrap();
        assert_eq!(opts.check()[0].path, ["from_meta", "x..y"]);
        let empty = FieldsOptions::default();
        assert_eq!(empty.check().len(), 1);
    }
}
