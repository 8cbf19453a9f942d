//! ClickHouse plugins. Each is its own cargo feature.

use logbus_plugin_api::Registry;

#[cfg(feature = "sink-clickhouse")]
pub mod sink;
#[cfg(feature = "sink-clickhouse")]
pub mod types;

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "sink-clickhouse")]
    registry.add(logbus_plugin_api::Typed(sink::ClickHouseSink));
    let _ = registry;
}
