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
    (StageKind::Parser, "lines", "parser-lines"),
    (StageKind::Parser, "json", "parser-json"),
    (StageKind::Transform, "stamp", "transform-stamp"),
    (StageKind::Transform, "filter", "transform-filter"),
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
];

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
    logbus_net::register(&mut registry);
    logbus_host::register(&mut registry);
    logbus_email::register(&mut registry);
    for (kind, name, feature) in CATALOG {
        registry.add_absent(*kind, name, feature);
    }
    registry
}
