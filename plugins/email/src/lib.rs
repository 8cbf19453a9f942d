//! `sink: email`. Its own cargo feature.

use logbus_plugin_api::Registry;

#[cfg(feature = "sink-email")]
pub mod sink;

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "sink-email")]
    registry.add(logbus_plugin_api::Typed(sink::EmailSink));
    let _ = registry;
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "sink-email")]
            "sink-email",
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
