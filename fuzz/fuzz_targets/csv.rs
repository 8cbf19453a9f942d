#![no_main]
//! Any bytes: no panic, errors inside the input; a record that splits
//! re-encodes and splits the same.
use libfuzzer_sys::fuzz_target;
use logbus_codec::csv_codec::{encode, name, split};

fuzz_target!(|data: &[u8]| {
    match split(data, b',') {
        Err(e) => assert!(e.offset <= data.len()),
        Ok(values) if !values.is_empty() && !(values.len() == 1 && values[0].is_empty()) => {
            let columns: Vec<String> = (0..values.len()).map(|i| format!("c{i}")).collect();
            let fields = name(values.clone(), &columns, false).unwrap();
            let mut out = Vec::new();
            encode(&fields, &columns, b',', &mut out);
            assert_eq!(split(&out, b',').expect("our own output splits"), values);
        }
        Ok(_) => {}
    }
});
