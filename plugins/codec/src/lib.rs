//! Text codecs beyond JSON. Each codec is a pair of pure functions
//! (`decode`: bytes to fields, `encode`: fields to bytes) wrapped in a
//! parser and/or formatter plugin; the functions are what the round-trip
//! property tests exercise. A decoding error names the byte offset where
//! the input stopped making sense.

#[allow(unused_imports)]
use logbus_plugin_api::{Registry, Typed};

pub mod csv_codec;
pub mod kv;
pub mod regex_parser;
pub mod syslog;
pub mod yaml;

/// Adds every plugin of this crate that the enabled features include.
pub fn register(registry: &mut Registry) {
    #[cfg(feature = "parser-kv")]
    registry.add(Typed(kv::KvParser));
    #[cfg(feature = "formatter-kv")]
    registry.add(Typed(kv::KvFormatter));
    #[cfg(feature = "parser-syslog")]
    registry.add(Typed(syslog::SyslogParser));
    #[cfg(feature = "formatter-syslog")]
    registry.add(Typed(syslog::SyslogFormatter));
    #[cfg(feature = "parser-csv")]
    registry.add(Typed(csv_codec::CsvParser));
    #[cfg(feature = "formatter-csv")]
    registry.add(Typed(csv_codec::CsvFormatter));
    #[cfg(feature = "parser-regex")]
    registry.add(Typed(regex_parser::RegexParser));
    #[cfg(feature = "parser-yaml")]
    registry.add(Typed(yaml::YamlParser));
    #[cfg(feature = "formatter-yaml")]
    registry.add(Typed(yaml::YamlFormatter));
    let _ = registry;
}

/// A decoding error: what, and the byte offset in the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub offset: usize,
    pub message: String,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (at byte {})", self.message, self.offset)
    }
}

impl DecodeError {
    pub fn at(offset: usize, message: impl Into<String>) -> Self {
        DecodeError {
            offset,
            message: message.into(),
        }
    }
}

/// The raw bytes of an event a parser was given, or the error for a
/// parsed one.
#[allow(dead_code)]
fn raw_input<'a>(
    event: &'a logbus_plugin_api::Event,
    parser: &str,
) -> Result<&'a [u8], logbus_plugin_api::EventError> {
    match event.payload() {
        logbus_plugin_api::Payload::Raw(bytes) => Ok(bytes),
        logbus_plugin_api::Payload::Fields(_) | logbus_plugin_api::Payload::Lazy(_) => {
            Err(logbus_plugin_api::EventError::new(format!(
                "the {parser} parser needs a raw event; this one is already parsed"
            )))
        }
    }
}

/// The fields of an event a formatter was given, or the error for a raw one.
#[allow(dead_code)]
fn fields_input<'a>(
    event: &'a logbus_plugin_api::Event,
    formatter: &str,
) -> Result<&'a logbus_plugin_api::Fields, logbus_plugin_api::EventError> {
    event.as_fields().ok_or_else(|| {
        logbus_plugin_api::EventError::new(format!(
            "the {formatter} formatter needs a parsed event; add a parser before it"
        ))
    })
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "parser-kv")]
            "parser-kv",
            #[cfg(feature = "formatter-kv")]
            "formatter-kv",
            #[cfg(feature = "parser-syslog")]
            "parser-syslog",
            #[cfg(feature = "formatter-syslog")]
            "formatter-syslog",
            #[cfg(feature = "parser-csv")]
            "parser-csv",
            #[cfg(feature = "formatter-csv")]
            "formatter-csv",
            #[cfg(feature = "parser-regex")]
            "parser-regex",
            #[cfg(feature = "parser-yaml")]
            "parser-yaml",
            #[cfg(feature = "formatter-yaml")]
            "formatter-yaml",
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
