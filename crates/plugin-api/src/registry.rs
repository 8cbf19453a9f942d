//! The one place plugins are found by name. Plugin crates add themselves
//! with a `register(&mut Registry)` function; the binary decides which
//! crates are compiled in and records the names it left out, so an error can
//! say "not in this build" instead of "unknown".

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::plugin::{Plugin, StageKind};

#[derive(Default, Clone)]
pub struct Registry {
    plugins: BTreeMap<(StageKind, &'static str), Arc<dyn Plugin>>,
    /// Known plugins this build left out, with the cargo feature that adds them.
    absent: BTreeMap<(StageKind, &'static str), &'static str>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, plugin: impl Plugin) {
        let key = (plugin.kind(), plugin.name());
        self.absent.remove(&key);
        self.plugins.insert(key, Arc::new(plugin));
    }

    /// Records a plugin that exists but is not compiled into this build.
    pub fn add_absent(&mut self, kind: StageKind, name: &'static str, feature: &'static str) {
        if !self.plugins.contains_key(&(kind, name)) {
            self.absent.insert((kind, name), feature);
        }
    }

    pub fn get(&self, kind: StageKind, name: &str) -> Option<&Arc<dyn Plugin>> {
        self.plugins
            .iter()
            .find(|((k, n), _)| *k == kind && *n == name)
            .map(|(_, p)| p)
    }

    /// The cargo feature to rebuild with, when `name` is known but absent.
    pub fn absent_feature(&self, kind: StageKind, name: &str) -> Option<&'static str> {
        self.absent
            .iter()
            .find(|((k, n), _)| *k == kind && *n == name)
            .map(|(_, f)| *f)
    }

    pub fn names(&self, kind: StageKind) -> Vec<&'static str> {
        self.plugins
            .keys()
            .filter(|(k, _)| *k == kind)
            .map(|(_, n)| *n)
            .collect()
    }

    pub fn plugins(&self) -> impl Iterator<Item = &Arc<dyn Plugin>> {
        self.plugins.values()
    }

    pub fn absent(&self) -> impl Iterator<Item = (StageKind, &'static str, &'static str)> + '_ {
        self.absent.iter().map(|((k, n), f)| (*k, *n, *f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::OptionError;
    use crate::plugin::{BuildContext, Built};

    struct Named(StageKind, &'static str);

    impl Plugin for Named {
        fn name(&self) -> &'static str {
            self.1
        }
        fn kind(&self) -> StageKind {
            self.0
        }
        fn description(&self) -> &'static str {
            ""
        }
        fn options_schema(&self) -> serde_json::Value {
            serde_json::Value::Null
        }
        fn check(&self, _: &serde_json::Value, _: &BuildContext) -> Vec<OptionError> {
            Vec::new()
        }
        fn build(
            &self,
            _: &serde_json::Value,
            _: &BuildContext,
        ) -> Result<Built, Vec<OptionError>> {
            Err(Vec::new())
        }
    }

    /// A name is looked up within its kind; names list sorted, per kind.
    #[test]
    fn plugins_are_found_by_kind_and_name() {
        let mut r = Registry::new();
        r.add(Named(StageKind::Sink, "file"));
        r.add(Named(StageKind::Source, "file"));
        r.add(Named(StageKind::Source, "stdin"));
        assert_eq!(r.get(StageKind::Source, "stdin").unwrap().name(), "stdin");
        assert_eq!(
            r.get(StageKind::Sink, "file").unwrap().kind(),
            StageKind::Sink
        );
        assert!(r.get(StageKind::Sink, "stdin").is_none());
        assert!(r.get(StageKind::Parser, "file").is_none());
        assert_eq!(r.names(StageKind::Source), ["file", "stdin"]);
        assert_eq!(r.names(StageKind::Sink), ["file"]);
        assert!(r.names(StageKind::Transform).is_empty());
        assert_eq!(r.plugins().count(), 3);
    }

    /// An absent plugin is known with its feature until it is added; one
    /// already present is never recorded absent.
    #[test]
    fn absent_plugins_name_their_feature_until_added() {
        let mut r = Registry::new();
        r.add(Named(StageKind::Sink, "file"));
        r.add_absent(StageKind::Sink, "file", "sink-file");
        r.add_absent(StageKind::Sink, "kafka", "sink-kafka");
        r.add_absent(StageKind::Source, "kafka", "source-kafka");
        assert_eq!(r.absent_feature(StageKind::Sink, "file"), None);
        assert_eq!(
            r.absent_feature(StageKind::Sink, "kafka"),
            Some("sink-kafka")
        );
        assert_eq!(
            r.absent_feature(StageKind::Source, "kafka"),
            Some("source-kafka")
        );
        assert_eq!(r.absent_feature(StageKind::Parser, "kafka"), None);
        assert_eq!(r.absent().count(), 2);
        r.add(Named(StageKind::Sink, "kafka"));
        assert_eq!(r.absent_feature(StageKind::Sink, "kafka"), None);
        assert_eq!(
            r.absent().collect::<Vec<_>>(),
            [(StageKind::Source, "kafka", "source-kafka")]
        );
    }
}
