//! `transform: js`: the escape hatch for the long tail of transforms, an
//! embedded QuickJS runtime per worker. Scripts get the event as a plain
//! object and return it (or another object, an array of objects, or null);
//! they have no file system, network or process access (no host module is
//! loaded), a per-event CPU budget and a memory ceiling.

#[allow(unused_imports)]
use logbus_plugin_api::{Registry, Typed};

#[cfg(feature = "transform-js")]
pub mod convert;
#[cfg(feature = "transform-js")]
pub mod lazy;
#[cfg(feature = "transform-js")]
pub mod transform;

/// Adds every plugin of this crate that the enabled features include.
pub fn register(registry: &mut Registry) {
    #[cfg(feature = "transform-js")]
    registry.add(Typed(transform::JsTransform));
    let _ = registry;
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "transform-js")]
            "transform-js",
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
