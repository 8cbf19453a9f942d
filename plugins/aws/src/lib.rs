//! AWS plugins. Each is its own cargo feature.

use logbus_plugin_api::Registry;

#[cfg(feature = "sink-s3")]
pub mod client;
#[cfg(feature = "sink-s3")]
pub mod s3_sink;

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "sink-s3")]
    registry.add(logbus_plugin_api::Typed(s3_sink::S3Sink));
    let _ = registry;
}
