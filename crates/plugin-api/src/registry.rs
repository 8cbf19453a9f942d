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
