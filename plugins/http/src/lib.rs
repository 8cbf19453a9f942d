//! HTTP plugins: `source: http` (a server) and `sink: http` (a client).
//! Each is its own cargo feature.

use logbus_plugin_api::Registry;

#[cfg(feature = "source-http")]
pub mod body;
#[cfg(feature = "sink-http")]
pub mod sink;
#[cfg(feature = "source-http")]
pub mod source;

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "sink-http")]
    registry.add(logbus_plugin_api::Typed(sink::HttpSink));
    #[cfg(feature = "source-http")]
    registry.add(logbus_plugin_api::Typed(source::HttpSource));
    let _ = registry;
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "sink-http")]
            "sink-http",
            #[cfg(feature = "source-http")]
            "source-http",
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
