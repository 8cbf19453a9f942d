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
