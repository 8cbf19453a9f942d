//! Avro: `sink: avro` writes object container files (a block per write);
//! `parser: avro` reads object container files (each a whole file in
//! one raw event, e.g. `source: file` with `framing: whole`), single-object
//! encoded data (the 10-byte `C3 01` + schema fingerprint header, as in
//! Kafka topics) and bare datums; `formatter: avro` writes single-object
//! encoding or bare datums. The schema comes from the config (a container
//! file carries its own; a configured one then is the reader schema).
//!
//! Avro values map to JSON the plain way: records and maps are objects
//! (record fields in schema order), unions are their value, enums their
//! symbol, `bytes` and `fixed` arrays of byte values, dates and timestamps
//! their numbers, decimals and UUIDs strings. Encoding resolves a JSON
//! event against the schema (ints into longs, objects into records, a value
//! into the first union branch that fits); what does not fit is an error
//! naming the field. With `object-avro`, [`object::AvroObjects`] is the
//! container as an object format for sinks that store objects (`sink: s3`).

#[allow(unused_imports)]
use logbus_plugin_api::{Registry, Typed};

#[cfg(any(
    feature = "parser-avro",
    feature = "formatter-avro",
    feature = "sink-avro"
))]
pub mod bounds;
#[cfg(any(
    feature = "parser-avro",
    feature = "formatter-avro",
    feature = "sink-avro"
))]
pub mod codec;
#[cfg(feature = "object-avro")]
pub mod object;
#[cfg(feature = "sink-avro")]
pub mod sink;

/// Adds every plugin of this crate that the enabled features include.
pub fn register(registry: &mut Registry) {
    #[cfg(feature = "parser-avro")]
    registry.add(Typed(codec::AvroParser));
    #[cfg(feature = "formatter-avro")]
    registry.add(Typed(codec::AvroFormatter));
    #[cfg(feature = "sink-avro")]
    registry.add(Typed(sink::AvroSink));
    let _ = registry;
}

#[cfg(test)]
mod register_tests {
    #[test]
    fn register_adds_the_plugin_of_each_enabled_feature() {
        let enabled: &[&str] = &[
            #[cfg(feature = "parser-avro")]
            "parser-avro",
            #[cfg(feature = "formatter-avro")]
            "formatter-avro",
            #[cfg(feature = "sink-avro")]
            "sink-avro",
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
