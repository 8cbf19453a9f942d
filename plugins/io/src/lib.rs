//! Sources and sinks that move bytes without any external service: the
//! parts an edge agent and a load test need. Each plugin is behind its own
//! cargo feature so a build carries only what a site uses.

#[allow(unused_imports)]
use logbus_plugin_api::{Registry, Typed};

pub mod blackhole;
pub mod file;
pub mod file_set;
pub mod generator;
pub mod line_reader;
pub mod stdio;
pub mod writer_sink;

/// Adds every plugin of this crate that the enabled features include.
pub fn register(registry: &mut Registry) {
    #[cfg(feature = "source-stdin")]
    registry.add(Typed(stdio::StdinSource));
    #[cfg(feature = "source-file")]
    registry.add(Typed(file::FileSource));
    #[cfg(feature = "source-generator")]
    registry.add(Typed(generator::GeneratorSource));
    #[cfg(feature = "sink-stdout")]
    registry.add(Typed(stdio::StdoutSink));
    #[cfg(feature = "sink-file")]
    registry.add(Typed(file::FileSink));
    #[cfg(feature = "sink-blackhole")]
    registry.add(Typed(blackhole::BlackholeSink));
    let _ = registry;
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "source-stdin")]
            "source-stdin",
            #[cfg(feature = "source-file")]
            "source-file",
            #[cfg(feature = "source-generator")]
            "source-generator",
            #[cfg(feature = "sink-stdout")]
            "sink-stdout",
            #[cfg(feature = "sink-file")]
            "sink-file",
            #[cfg(feature = "sink-blackhole")]
            "sink-blackhole",
        ];
        logbus_plugin_api::testing::assert_registers(super::register, enabled);
    }

    /// Each plugin's page lists its options with the schema's defaults.
    #[test]
    fn each_plugin_page_documents_its_options() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/plugins");
        logbus_plugin_api::testing::assert_pages_document(super::register, &docs);
    }
}

/// What `logbus validate` says of each plugin's wrong options: the checks
/// beyond the schema's ranges (an empty path, a path template that does
/// not parse) and the ranges at their bounds.
#[cfg(test)]
mod option_tests {
    use logbus_plugin_api::Typed;
    use logbus_plugin_api::testing::option_errors;
    use serde_json::json;

    #[test]
    fn file_source_options() {
        let p = Typed(crate::file::FileSource);
        assert_eq!(
            option_errors(&p, json!({"path": ""})),
            "path: must not be empty"
        );
        assert_eq!(
            option_errors(&p, json!({"path": "x", "state_dir": ""})),
            "state_dir: must not be empty"
        );
        assert_eq!(
            option_errors(&p, json!({"path": "x", "max_line_bytes": 0})),
            "max_line_bytes: must be at least 1, got 0"
        );
        for (ms, said) in [
            (
                9,
                "checkpoint_interval_ms: must be between 10 and 600000, got 9",
            ),
            (10, ""),
            (600_000, ""),
            (
                600_001,
                "checkpoint_interval_ms: must be between 10 and 600000, got 600001",
            ),
        ] {
            let options = json!({"path": "x", "state_dir": "s", "checkpoint_interval_ms": ms});
            assert_eq!(option_errors(&p, options), said);
        }
    }

    #[test]
    fn file_sink_options() {
        let p = Typed(crate::file::FileSink);
        let said = |options: serde_json::Value| option_errors(&p, options);
        assert_eq!(said(json!({"path": ""})), "path: must not be empty");
        assert_eq!(
            said(json!({"path": "out/{{host.log"})),
            "path: `{{` without `}}` in `out/{{host.log`"
        );
        assert_eq!(
            said(json!({"path": "out", "rotate_bytes": 0})),
            "rotate_bytes: must be at least 1, got 0"
        );
        assert_eq!(said(json!({"path": "out", "rotate_bytes": 1})), "");
        assert_eq!(said(json!({"path": "out", "rotate_keep": 1000})), "");
        assert_eq!(
            said(json!({"path": "out", "rotate_keep": 1001})),
            "rotate_keep: must be between 0 and 1000, got 1001"
        );
        assert_eq!(said(json!({"path": "out", "max_open_files": 65536})), "");
        assert_eq!(
            said(json!({"path": "out", "max_open_files": 0})),
            "max_open_files: must be between 1 and 65536, got 0"
        );
    }

    #[test]
    fn stdin_and_generator_options() {
        assert_eq!(
            option_errors(
                &Typed(crate::stdio::StdinSource),
                json!({"max_line_bytes": 0})
            ),
            "max_line_bytes: must be at least 1, got 0"
        );
        let p = Typed(crate::generator::GeneratorSource);
        let said = |options: serde_json::Value| option_errors(&p, options);
        assert_eq!(said(json!({"batch_size": 1, "rate": 10_000_000})), "");
        assert_eq!(said(json!({"batch_size": 65536})), "");
        assert_eq!(
            said(json!({"batch_size": 0})),
            "batch_size: must be between 1 and 65536, got 0"
        );
        assert_eq!(
            said(json!({"batch_size": 65537})),
            "batch_size: must be between 1 and 65536, got 65537"
        );
        assert_eq!(
            said(json!({"rate": 10_000_001})),
            "rate: must be between 0 and 10000000, got 10000001"
        );
    }

    /// The blackhole sink takes every event and counts it committed.
    #[tokio::test]
    async fn the_blackhole_commits_everything_it_takes() {
        use logbus_plugin_api::testing;
        let sink = testing::sink(&Typed(crate::blackhole::BlackholeSink), json!({}));
        let line = crate::writer_sink::tests::line;
        let (result, metrics) =
            testing::run_sink(sink, vec![vec![line("a"), line("b")], vec![line("c")]]).await;
        result.unwrap();
        let counts = metrics.snapshot();
        assert_eq!((counts.events_in, counts.events_out), (3, 3));
    }
}
