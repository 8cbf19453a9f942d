//! Kafka plugins. Each is its own cargo feature.

use logbus_plugin_api::Registry;

#[cfg(any(feature = "sink-kafka", feature = "source-kafka"))]
pub mod client;
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
