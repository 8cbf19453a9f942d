//! Kafka plugins. Each is its own cargo feature.

use logbus_plugin_api::Registry;

#[cfg(feature = "sink-kafka")]
pub mod sink;

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "sink-kafka")]
    registry.add(logbus_plugin_api::Typed(sink::KafkaSink));
    let _ = registry;
}
