//! Which plugins this binary carries. The only file that knows the list of
//! plugin crates and the cargo feature of each plugin; a plugin left out of
//! the build stays known so that an error can name the feature to add.

use logbus_plugin_api::{Registry, StageKind};

/// Every plugin LogBus has, with the feature that compiles it in.
pub const CATALOG: &[(StageKind, &str, &str)] = &[
    (StageKind::Source, "stdin", "source-stdin"),
    (StageKind::Source, "file", "source-file"),
    (StageKind::Source, "generator", "source-generator"),
    (StageKind::Source, "tail", "source-tail"),
    (StageKind::Source, "http", "source-http"),
    (StageKind::Source, "syslog", "source-syslog"),
    (StageKind::Source, "scheduler", "source-scheduler"),
    (StageKind::Source, "exec", "source-exec"),
    (StageKind::Source, "sysinfo", "source-sysinfo"),
    (StageKind::Source, "journald", "source-journald"),
    (StageKind::Source, "kafka", "source-kafka"),
    (StageKind::Source, "s3", "source-s3"),
    (StageKind::Source, "otlp", "source-otlp"),
    (StageKind::Parser, "lines", "parser-lines"),
    (StageKind::Parser, "json", "parser-json"),
    (StageKind::Transform, "stamp", "transform-stamp"),
    (StageKind::Transform, "filter", "transform-filter"),
    (StageKind::Transform, "route", "transform-route"),
    (StageKind::Transform, "fields", "transform-fields"),
    (StageKind::Transform, "js", "transform-js"),
    (StageKind::Parser, "kv", "parser-kv"),
    (StageKind::Parser, "syslog", "parser-syslog"),
    (StageKind::Parser, "csv", "parser-csv"),
    (StageKind::Parser, "regex", "parser-regex"),
    (StageKind::Parser, "avro", "parser-avro"),
    (StageKind::Parser, "yaml", "parser-yaml"),
    (StageKind::Parser, "parquet", "parser-parquet"),
    (StageKind::Formatter, "json", "formatter-json"),
    (StageKind::Formatter, "kv", "formatter-kv"),
    (StageKind::Formatter, "syslog", "formatter-syslog"),
    (StageKind::Formatter, "csv", "formatter-csv"),
    (StageKind::Formatter, "avro", "formatter-avro"),
    (StageKind::Formatter, "yaml", "formatter-yaml"),
    (StageKind::Sink, "stdout", "sink-stdout"),
    (StageKind::Sink, "file", "sink-file"),
    (StageKind::Sink, "blackhole", "sink-blackhole"),
    (StageKind::Sink, "avro", "sink-avro"),
    (StageKind::Sink, "parquet", "sink-parquet"),
    (StageKind::Sink, "http", "sink-http"),
    (StageKind::Sink, "syslog", "sink-syslog"),
    (StageKind::Sink, "email", "sink-email"),
    (StageKind::Sink, "kafka", "sink-kafka"),
    (StageKind::Sink, "opensearch", "sink-opensearch"),
    (StageKind::Sink, "clickhouse", "sink-clickhouse"),
    (StageKind::Sink, "s3", "sink-s3"),
    (StageKind::Sink, "cloudwatch_logs", "sink-cloudwatch_logs"),
    (StageKind::Sink, "otlp", "sink-otlp"),
];

/// Plugins that need system C libraries to build (and so are in the
/// `full` build, not in `default` or their kind's group).
pub const FULL_ONLY: &[&str] = &["sink-kafka", "source-kafka"];

/// The registry of this build: compiled-in plugins, plus the rest of the
/// catalog marked absent.
pub fn registry() -> Registry {
    let mut registry = Registry::new();
    logbus_io::register(&mut registry);
    logbus_text::register(&mut registry);
    logbus_transform::register(&mut registry);
    logbus_js::register(&mut registry);
    logbus_codec::register(&mut registry);
    logbus_avro::register(&mut registry);
    logbus_parquet::register(&mut registry);
    logbus_tail::register(&mut registry);
    logbus_http::register(&mut registry);
    logbus_otlp::register(&mut registry);
    logbus_net::register(&mut registry);
    logbus_host::register(&mut registry);
    logbus_email::register(&mut registry);
    logbus_kafka::register(&mut registry);
    logbus_opensearch::register(&mut registry);
    logbus_clickhouse::register(&mut registry);
    logbus_aws::register(&mut registry);
    for (kind, name, feature) in CATALOG {
        registry.add_absent(*kind, name, feature);
    }
    registry
}

/// A plugin's name and feature are written in several places: its
/// `TypedPlugin::NAME`, its crate's `register` and `[features]`, this
/// binary's `[features]` (the forwarding entry and its kind's group list)
/// and [`CATALOG`]. These tests make the catalog the authority and fail
/// when any of the others disagrees with it.
#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    use super::*;

    /// The `[features]` table of a Cargo.toml as these files write it: one
    /// `name = ["entry", ...]` per line.
    fn features(toml: &str) -> BTreeMap<String, Vec<String>> {
        let mut out = BTreeMap::new();
        let mut inside = false;
        for line in toml.lines().map(str::trim) {
            if line.starts_with('[') && !line.starts_with("[\"") {
                inside = line == "[features]";
                continue;
            }
            if !inside || line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, list) = line.split_once('=').expect("name = [...]");
            let entries = list
                .trim()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .split(',')
                .map(|e| e.trim().trim_matches('"').to_string())
                .filter(|e| !e.is_empty())
                .collect();
            out.insert(name.trim().to_string(), entries);
        }
        out
    }

    fn group(kind: StageKind) -> &'static str {
        match kind {
            StageKind::Source => "sources",
            StageKind::Parser => "parsers",
            StageKind::Transform => "transforms",
            StageKind::Formatter => "formatters",
            StageKind::Sink => "sinks",
        }
    }

    fn plugin_crate_features(krate: &str) -> BTreeMap<String, Vec<String>> {
        let dir = krate
            .strip_prefix("logbus-")
            .expect("plugin crates are logbus-*");
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../plugins/{dir}/Cargo.toml"));
        features(
            &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        )
    }

    #[test]
    fn the_binary_features_and_the_plugin_crates_agree_with_the_catalog() {
        let binary = features(include_str!("../Cargo.toml"));
        let mut forwarded_crates = BTreeSet::new();
        for (kind, name, feature) in CATALOG {
            assert_eq!(
                *feature,
                format!("{}-{name}", kind.key()),
                "feature name of {kind} {name}"
            );
            let forward = binary
                .get(*feature)
                .unwrap_or_else(|| panic!("crates/logbus/Cargo.toml has no feature `{feature}`"));
            let [entry] = forward.as_slice() else {
                panic!("`{feature}` should forward to exactly one plugin crate, not {forward:?}");
            };
            let (krate, inner) = entry.split_once('/').expect("crate/feature");
            assert_eq!(inner, *feature, "`{feature}` forwards to `{entry}`");
            assert!(
                plugin_crate_features(krate).contains_key(*feature),
                "{krate} has no feature `{feature}`"
            );
            forwarded_crates.insert(krate.to_string());
            if FULL_ONLY.contains(feature) {
                assert!(
                    binary["full"].contains(&feature.to_string()),
                    "`full` lacks `{feature}`"
                );
                assert!(
                    !binary[group(*kind)].contains(&feature.to_string()),
                    "`{feature}` needs system libraries: `full`, not the `{}` group",
                    group(*kind)
                );
                continue;
            }
            assert!(
                binary[group(*kind)].contains(&feature.to_string()),
                "the `{}` group lacks `{feature}`",
                group(*kind)
            );
        }
        // Nothing beyond the catalog: no group member, and no plugin-crate
        // feature, that the catalog does not list.
        let listed: BTreeSet<String> = CATALOG.iter().map(|(_, _, f)| f.to_string()).collect();
        for kind in StageKind::ALL {
            for member in &binary[group(kind)] {
                assert!(
                    listed.contains(member),
                    "`{member}` is in a group but not in CATALOG"
                );
            }
        }
        for krate in &forwarded_crates {
            for feature in plugin_crate_features(krate).keys() {
                // Build switches (`static`) are not plugins.
                let names_a_plugin = StageKind::ALL
                    .iter()
                    .any(|k| feature.starts_with(&format!("{}-", k.key())));
                assert!(
                    !names_a_plugin || listed.contains(feature),
                    "{krate} has feature `{feature}` that CATALOG does not list"
                );
            }
        }
    }

    #[test]
    fn the_registry_holds_exactly_the_catalog() {
        let registry = registry();
        let listed: BTreeSet<(StageKind, &str)> =
            CATALOG.iter().map(|(k, n, _)| (*k, *n)).collect();
        for plugin in registry.plugins() {
            assert!(
                listed.contains(&(plugin.kind(), plugin.name())),
                "{} `{}` is registered but not in CATALOG",
                plugin.kind(),
                plugin.name()
            );
        }
        // Built with every plugin (the default features), each catalog
        // entry is registered under its own name, not merely known absent.
        let all = cfg!(all(
            feature = "sources",
            feature = "parsers",
            feature = "transforms",
            feature = "formatters",
            feature = "sinks"
        ));
        for (kind, name, feature) in CATALOG {
            match registry.get(*kind, name) {
                Some(p) => assert_eq!((p.kind(), p.name()), (*kind, *name)),
                None => {
                    assert!(
                        !all || FULL_ONLY.contains(feature),
                        "{kind} `{name}` is in CATALOG but its crate registered nothing under that name"
                    );
                    assert_eq!(registry.absent_feature(*kind, name), Some(*feature));
                }
            }
        }
    }
}
