#![no_main]
//! Any bytes fed in any two reads: no panic, and the same messages (or the
//! same error) whatever the split, each at the same stream offset, where
//! the stream holds it.
use libfuzzer_sys::fuzz_target;
use logbus_framing::{Deframer, Framing};

fuzz_target!(|input: (u8, u16, &[u8])| {
    let (which, split, data) = input;
    let (framing, max) = [
        (Framing::Newline, 4096),
        (Framing::Newline, 7),
        (Framing::OctetCounting, 4096),
        (Framing::LengthPrefixed, 4096),
    ][which as usize % 4];
    let run = |cut: usize| {
        let mut d = Deframer::new(framing, max);
        let (mut out, mut starts, mut more) = (Vec::new(), Vec::new(), Vec::new());
        let cut = cut.min(data.len());
        let first = d
            .push_placed(&data[..cut], &mut out, &mut starts)
            .map_err(|e| e.offset);
        let second = first.and_then(|_| {
            d.push_placed(&data[cut..], &mut out, &mut more)
                .map_err(|e| e.offset)
        });
        starts.extend(more);
        (out, starts, second)
    };
    let (whole, whole_starts, whole_result) = run(data.len());
    let (split_out, split_starts, split_result) = run(split as usize);
    assert_eq!(whole_result, split_result);
    if whole_result.is_ok() {
        assert_eq!(whole, split_out);
        assert_eq!(whole_starts, split_starts);
    }
    assert_eq!(whole.len(), whole_starts.len());
    for (message, &start) in whole.iter().zip(&whole_starts) {
        let start = start as usize;
        assert_eq!(&data[start..start + message.len()], &message[..]);
    }
});
