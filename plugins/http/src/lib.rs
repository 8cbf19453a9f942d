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

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "sink-http")]
            "sink-http",
            #[cfg(feature = "source-http")]
            "source-http",
        ];
        logbus_plugin_api::testing::assert_registers(super::register, enabled);
    }
}
