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

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "sink-clickhouse")]
            "sink-clickhouse",
        ];
        logbus_plugin_api::testing::assert_registers(super::register, enabled);
    }
}
