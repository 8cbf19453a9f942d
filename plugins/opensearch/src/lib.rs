//! OpenSearch plugins. Each is its own cargo feature.

use logbus_plugin_api::Registry;

#[cfg(feature = "sink-opensearch")]
pub mod sink;

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "sink-opensearch")]
    registry.add(logbus_plugin_api::Typed(sink::OpenSearchSink));
    let _ = registry;
}
