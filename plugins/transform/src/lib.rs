//! Native transforms for the common cases: adding a timestamp, keeping the
//! events that match a condition, and reshaping fields. The long tail is
//! the JS transform's job; these stay small and fast.

#[allow(unused_imports)]
use logbus_plugin_api::{Registry, Typed};

#[cfg(feature = "transform-fields")]
pub mod fields;
#[cfg(any(feature = "transform-filter", feature = "transform-route"))]
pub mod filter;
#[cfg(feature = "transform-route")]
pub mod route;
#[cfg(feature = "transform-stamp")]
pub mod stamp;

/// Adds every plugin of this crate that the enabled features include.
pub fn register(registry: &mut Registry) {
    #[cfg(feature = "transform-stamp")]
    registry.add(Typed(stamp::StampTransform));
    #[cfg(feature = "transform-filter")]
    registry.add(Typed(filter::FilterTransform));
    #[cfg(feature = "transform-fields")]
    registry.add(Typed(fields::FieldsTransform));
    #[cfg(feature = "transform-route")]
    registry.add(Typed(route::RouteTransform));
    let _ = registry;
}

/// The error for a transform that met an unparsed event.
#[allow(dead_code)]
fn needs_fields(plugin: &str) -> logbus_plugin_api::EventError {
    logbus_plugin_api::EventError::new(format!(
        "the {plugin} transform needs a parsed event; add a parser (e.g. `parser: json`) before it"
    ))
}

/// The fields a condition reads, as validation's flow analysis takes
/// them: a missing field makes a test false (a warning, not an error),
/// `exists(x)` asks on purpose, and the right side of `a == b` is
/// reported when nothing produces it (usually a string without quotes).
#[cfg(any(feature = "transform-filter", feature = "transform-route"))]
fn condition_reads(
    condition: &logbus_condition::Condition,
    option: &[&str],
) -> Vec<logbus_plugin_api::FieldRead> {
    use logbus_condition::{LiteralKind, UseRole};
    use logbus_plugin_api::{FieldRead, FieldType, ReadRole};
    condition
        .field_uses()
        .into_iter()
        .map(|u| {
            let role = match u.role {
                UseRole::Value => ReadRole::Optional,
                UseRole::Probe => ReadRole::Probe,
                UseRole::RightOperand => ReadRole::RightOperand,
            };
            let read = FieldRead::new(u.path, option, role).at_offset(u.offset);
            match u.compared_with {
                Some(LiteralKind::String) => read.expecting(FieldType::String),
                Some(LiteralKind::Number) => read.expecting(FieldType::Number),
                Some(LiteralKind::Bool) => read.expecting(FieldType::Bool),
                Some(LiteralKind::Null) | None => read,
            }
        })
        .collect()
}

/// The type of a JSON value, for the flow analysis.
#[allow(dead_code)]
fn type_of(value: &serde_json::Value) -> logbus_plugin_api::FieldType {
    use logbus_plugin_api::FieldType;
    match value {
        serde_json::Value::String(_) => FieldType::String,
        serde_json::Value::Number(_) => FieldType::Number,
        serde_json::Value::Bool(_) => FieldType::Bool,
        serde_json::Value::Object(_) => FieldType::Object,
        serde_json::Value::Array(_) => FieldType::Array,
        serde_json::Value::Null => FieldType::Any,
    }
}

/// Parses a field path option, turning a bad path into an option error at `at`.
#[allow(dead_code)]
fn field_path(
    text: &str,
    at: &[&str],
) -> Result<logbus_plugin_api::FieldPath, logbus_plugin_api::OptionError> {
    logbus_plugin_api::FieldPath::parse(text).map_err(|e| logbus_plugin_api::OptionError::at(at, e))
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "transform-stamp")]
            "transform-stamp",
            #[cfg(feature = "transform-filter")]
            "transform-filter",
            #[cfg(feature = "transform-fields")]
            "transform-fields",
            #[cfg(feature = "transform-route")]
            "transform-route",
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
