//! Kafka plugins. Each is its own cargo feature.

use logbus_plugin_api::Registry;

#[cfg(any(feature = "sink-kafka", feature = "source-kafka"))]
pub mod client;
#[cfg(any(feature = "sink-kafka", feature = "source-kafka"))]
pub mod probe;
#[cfg(feature = "sink-kafka")]
pub mod sink;
#[cfg(feature = "source-kafka")]
pub mod source;

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "sink-kafka")]
    registry.add(logbus_plugin_api::Typed(sink::KafkaSink));
    #[cfg(feature = "source-kafka")]
    registry.add(logbus_plugin_api::Typed(source::KafkaSource));
    let _ = registry;
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "sink-kafka")]
            "sink-kafka",
            #[cfg(feature = "source-kafka")]
            "source-kafka",
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
