#![no_main]
//! Any bytes fed in any two reads: no panic, and the same messages (or the
//! same error) whatever the split.
use libfuzzer_sys::fuzz_target;
use logbus_framing::{Deframer, Framing};

fuzz_target!(|input: (u8, u16, &[u8])| {
    let (which, split, data) = input;
    let framing = [
        Framing::Newline,
        Framing::OctetCounting,
        Framing::LengthPrefixed,
    ][which as usize % 3];
    let run = |cut: usize| {
        let mut d = Deframer::new(framing, 4096);
        let mut out = Vec::new();
        let cut = cut.min(data.len());
        let first = d.push(&data[..cut], &mut out).map_err(|e| e.offset);
        let second = first.and_then(|_| d.push(&data[cut..], &mut out).map_err(|e| e.offset));
        (out, second)
    };
    let (whole, whole_result) = run(data.len());
    let (split_out, split_result) = run(split as usize);
    assert_eq!(whole_result, split_result);
    if whole_result.is_ok() {
        assert_eq!(whole, split_out);
    }
});
