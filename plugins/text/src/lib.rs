//! Text codecs: turn raw lines into structured events and back. JSON
//! (de)serialisation is where a log pipeline spends its time, so these
//! stages work on one event at a time with no intermediate copies.

#[allow(unused_imports)]
use logbus_plugin_api::{Registry, Typed};

pub mod json;
pub mod lines;

/// Adds every plugin of this crate that the enabled features include.
pub fn register(registry: &mut Registry) {
    #[cfg(feature = "parser-lines")]
    registry.add(Typed(lines::LinesParser));
    #[cfg(feature = "parser-json")]
    registry.add(Typed(json::JsonParser));
    #[cfg(feature = "formatter-json")]
    registry.add(Typed(json::JsonFormatter));
    let _ = registry;
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "parser-lines")]
            "parser-lines",
            #[cfg(feature = "parser-json")]
            "parser-json",
            #[cfg(feature = "formatter-json")]
            "formatter-json",
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
