//! OpenTelemetry logs over OTLP: `source: otlp` receives them (gRPC and
//! HTTP, protobuf and JSON bodies), `sink: otlp` sends them (gRPC or HTTP
//! protobuf, on the sink core). Both map records to events and back with
//! [`model`], so LogBus → LogBus over OTLP keeps every field. Traces and
//! metrics are not taken (the source refuses them with a clear error).

#[allow(unused_imports)]
use logbus_plugin_api::{Registry, Typed};

pub mod model;
#[cfg(feature = "sink-otlp")]
pub mod sink;
#[cfg(feature = "source-otlp")]
pub mod source;

/// Adds every plugin of this crate that the enabled features include.
pub fn register(registry: &mut Registry) {
    #[cfg(feature = "source-otlp")]
    registry.add(Typed(source::OtlpSource));
    #[cfg(feature = "sink-otlp")]
    registry.add(Typed(sink::OtlpSink));
    let _ = registry;
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "source-otlp")]
            "source-otlp",
            #[cfg(feature = "sink-otlp")]
            "sink-otlp",
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
