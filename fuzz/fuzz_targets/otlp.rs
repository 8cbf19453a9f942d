#![no_main]
//! Any bytes as an OTLP/HTTP logs body, protobuf and JSON: decoded or
//! refused with a reason, never a panic; every record of what decodes
//! becomes an event (both layouts) and that event a record again, as a
//! sink would send it.
use libfuzzer_sys::fuzz_target;
use logbus_otlp::model::{
    Layout, Mapping, decode_json, decode_protobuf, fields_to_record, record_to_fields,
};

fuzz_target!(|data: &[u8]| {
    for decoded in [decode_protobuf(data), decode_json(data)] {
        let Ok(request) = decoded else {
            continue;
        };
        for rl in &request.resource_logs {
            for sl in &rl.scope_logs {
                for record in &sl.log_records {
                    for layout in [Layout::Nested, Layout::Flatten] {
                        let fields =
                            record_to_fields(rl.resource.as_ref(), sl.scope.as_ref(), record, layout);
                        let again = fields_to_record(Some(&fields), b"", 1, &Mapping::default());
                        // A body with a value keeps one; none (or an empty
                        // AnyValue) stays none.
                        let has = |b: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| {
                            b.as_ref().is_some_and(|b| b.value.is_some())
                        };
                        assert_eq!(has(&again.body), has(&record.body));
                    }
                }
            }
        }
    }
});
