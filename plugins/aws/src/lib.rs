//! AWS plugins: `sink: s3`, `source: s3` and `sink: cloudwatch_logs`. Each
//! is its own cargo feature; `client.rs` is what all of them share to reach
//! AWS. The S3 sink writes objects through the sink core's object formats:
//! plain lines here, and Parquet and Avro behind the `s3-parquet` and
//! `s3-avro` features, which take their formats from the Parquet and Avro
//! plugin crates. That is the one place a plugin crate depends on another:
//! a format is written once, for its own sink and for S3 alike.

use logbus_plugin_api::Registry;

#[cfg(any(
    feature = "sink-s3",
    feature = "source-s3",
    feature = "sink-cloudwatch_logs"
))]
pub mod client;
#[cfg(feature = "sink-cloudwatch_logs")]
pub mod cloudwatch_logs;
#[cfg(feature = "sink-s3")]
pub mod s3_sink;
#[cfg(feature = "source-s3")]
pub mod s3_source;

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "sink-s3")]
    registry.add(logbus_plugin_api::Typed(s3_sink::S3Sink));
    #[cfg(feature = "sink-cloudwatch_logs")]
    registry.add(logbus_plugin_api::Typed(
        cloudwatch_logs::CloudWatchLogsSink,
    ));
    #[cfg(feature = "source-s3")]
    registry.add(logbus_plugin_api::Typed(s3_source::S3Source));
    let _ = registry;
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "sink-s3")]
            "sink-s3",
            #[cfg(feature = "sink-cloudwatch_logs")]
            "sink-cloudwatch_logs",
            #[cfg(feature = "source-s3")]
            "source-s3",
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
