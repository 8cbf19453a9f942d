//! Network plugins: syslog over TCP and UDP, in and out. Each plugin is its
//! own cargo feature.

use logbus_plugin_api::Registry;

#[cfg(feature = "sink-syslog")]
pub mod sink;
#[cfg(feature = "source-syslog")]
pub mod source;

/// Transport of a syslog stage.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Tcp,
    Udp,
}

pub fn register(registry: &mut Registry) {
    #[cfg(feature = "source-syslog")]
    registry.add(logbus_plugin_api::Typed(source::SyslogSource));
    #[cfg(feature = "sink-syslog")]
    registry.add(logbus_plugin_api::Typed(sink::SyslogSink));
    let _ = registry;
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "source-syslog")]
            "source-syslog",
            #[cfg(feature = "sink-syslog")]
            "sink-syslog",
        ];
        logbus_plugin_api::testing::assert_registers(super::register, enabled);
    }

    /// Each plugin's page lists its options with the schema's defaults.
    #[test]
    fn each_plugin_page_documents_its_options() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/plugins");
        logbus_plugin_api::testing::assert_pages_document(super::register, &docs);
    }
}
