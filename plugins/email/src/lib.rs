//! `sink: email`. Its own cargo feature.

use logbus_plugin_api::Registry;

#[cfg(feature = "sink-email")]
pub mod sink;

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "sink-email")]
    registry.add(logbus_plugin_api::Typed(sink::EmailSink));
    let _ = registry;
}
