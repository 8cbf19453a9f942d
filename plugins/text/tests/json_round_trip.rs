//! The json formatter's output parses back, through the json parser, to
//! the same fields; any bytes give the parser an error or fields, never a
//! panic.
#![cfg(all(feature = "parser-json", feature = "formatter-json"))]

use logbus_plugin_api::{
    BuildContext, Built, Event, Fields, Meta, Plugin, Processor, Typed, Verdict,
};
use logbus_text::json::{JsonFormatter, JsonParser};
use proptest::prelude::*;
use serde_json::{Value, json};

fn stage(plugin: &dyn Plugin) -> Box<dyn Processor> {
    let cx = BuildContext {
        stage_id: "t".into(),
        base_dir: ".".into(),
        worker: 0,
    };
    match plugin.build(&json!({}), &cx) {
        Ok(Built::Processor(p)) => p,
        _ => panic!("builds"),
    }
}

fn meta() -> Meta {
    Meta::at("t", 0)
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn format_then_parse_gives_the_fields_back(
        map in prop::collection::btree_map(any::<String>(), value(), 0..8)
    ) {
        let fields: Fields = map.into_iter().collect();
        let (mut format, mut parse) = (stage(&Typed(JsonFormatter)), stage(&Typed(JsonParser)));
        let mut event = Event::fields(fields.clone(), meta());
        prop_assert!(matches!(format.process(&mut event), Ok(Verdict::Keep)));
        prop_assert!(event.as_raw().is_some());
        prop_assert!(matches!(parse.process(&mut event), Ok(Verdict::Keep)));
        prop_assert_eq!(event.as_fields().unwrap(), &fields);
    }

    #[test]
    fn any_bytes_give_an_error_or_fields(bytes in prop::collection::vec(any::<u8>(), 0..120)) {
        let mut parse = stage(&Typed(JsonParser));
        let mut event = Event::raw(bytes, meta());
        match parse.process(&mut event) {
            Ok(Verdict::Keep) => prop_assert!(event.as_fields().is_some()),
            Ok(Verdict::Replace(events)) => prop_assert!(events.iter().all(|e| e.as_fields().is_some())),
            Ok(Verdict::Discard | Verdict::To(_)) => prop_assert!(false, "the parser neither discards nor routes"),
            Err(e) => prop_assert!(!e.0.is_empty()),
        }
    }
}
