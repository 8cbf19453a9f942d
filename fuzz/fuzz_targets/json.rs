#![no_main]
//! The json parser stage on any bytes: an error or fields, never a panic;
//! parsed fields serialise and parse back the same.
use libfuzzer_sys::fuzz_target;
use logbus_plugin_api::{BuildContext, Built, Event, Meta, Plugin, Typed, Verdict};

fuzz_target!(|data: &[u8]| {
    let cx = BuildContext {
        stage_id: "fuzz".into(),
        base_dir: ".".into(),
        worker: 0,
    };
    let Ok(Built::Processor(mut parser)) =
        Typed(logbus_text::json::JsonParser).build(&serde_json::json!({}), &cx)
    else {
        panic!("builds");
    };
    let mut event = Event::raw(
        data.to_vec(),
        Meta {
            source: "f".into(),
            ingest_ns: 0,
            origin: None,
            attributes: None,
            position: None,
        },
    );
    match parser.process(&mut event) {
        Ok(Verdict::Keep) => {
            let fields = event.as_fields().expect("parsed").clone();
            let text = serde_json::to_vec(&fields).unwrap();
            let mut again = Event::raw(
                text,
                Meta {
                    source: "f".into(),
                    ingest_ns: 0,
                    origin: None,
                    attributes: None,
                    position: None,
                },
            );
            assert!(matches!(parser.process(&mut again), Ok(Verdict::Keep)));
            assert_eq!(again.as_fields().unwrap(), &fields);
        }
        Ok(_) | Err(_) => {}
    }
});
