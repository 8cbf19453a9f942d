//! HTTP plugins. Each is its own cargo feature.

use logbus_plugin_api::Registry;

#[cfg(feature = "sink-http")]
pub mod sink;

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "sink-http")]
    registry.add(logbus_plugin_api::Typed(sink::HttpSink));
    let _ = registry;
}
