//! Parquet: `sink: parquet` writes a file per burst of input (committed
//! when the file is closed); `parser: parquet` reads a whole Parquet file (one raw event,
//! e.g. `source: file` with `framing: whole`) into one event per row, by
//! arrow-rs. Columns become fields in schema order; nulls are kept as
//! `null`; nested structs, lists and maps become objects and arrays;
//! timestamps and dates become their ISO text (arrow-json's rendering).
//! With `object-parquet`, [`object::ParquetObjects`] is Parquet as an
//! object format for sinks that store objects (`sink: s3`).

#[allow(unused_imports)]
use logbus_plugin_api::{Registry, Typed};

#[cfg(feature = "parser-parquet")]
mod bounds;
#[cfg(feature = "object-parquet")]
pub mod object;
#[cfg(feature = "parser-parquet")]
pub mod reader;
#[cfg(any(feature = "sink-parquet", feature = "object-parquet"))]
pub mod writer;

/// Adds every plugin of this crate that the enabled features include.
pub fn register(registry: &mut Registry) {
    #[cfg(feature = "parser-parquet")]
    registry.add(Typed(reader::ParquetParser));
    #[cfg(feature = "sink-parquet")]
    registry.add(Typed(writer::ParquetSink));
    let _ = registry;
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "parser-parquet")]
            "parser-parquet",
            #[cfg(feature = "sink-parquet")]
            "sink-parquet",
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
