//! Any split of an encoded stream into reads gives the messages back;
//! broken streams are errors with the right offset, never panics.

use logbus_framing::{Deframer, Framing, encode};
use proptest::prelude::*;

fn deframe(
    framing: Framing,
    stream: &[u8],
    cuts: &[usize],
    max: usize,
) -> Result<Vec<Vec<u8>>, String> {
    let mut d = Deframer::new(framing, max);
    let mut out = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
        let cut = cut.clamp(at, stream.len());
        d.push(&stream[at..cut], &mut out)
            .map_err(|e| e.to_string())?;
        at = cut;
    }
    if let Some(last) = d.finish().map_err(|e| e.to_string())? {
        out.push(last);
    }
    Ok(out.into_iter().map(|b| b.to_vec()).collect())
}

proptest! {
    #[test]
    fn counted_framings_round_trip_through_any_reads(
        messages in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..10),
        mut cuts in prop::collection::vec(0usize..4000, 0..8),
    ) {
        cuts.sort_unstable();
        for framing in [Framing::OctetCounting, Framing::LengthPrefixed] {
            let mut stream = Vec::new();
            for m in &messages {
                encode(framing, m, &mut stream);
            }
            prop_assert_eq!(deframe(framing, &stream, &cuts, 1 << 20).unwrap(), messages.clone());
        }
    }

    #[test]
    fn newline_framing_round_trips_lines(
        messages in prop::collection::vec("[^\n]{0,80}", 1..10),
        mut cuts in prop::collection::vec(0usize..1000, 0..8),
    ) {
        cuts.sort_unstable();
        let mut stream = Vec::new();
        for m in &messages {
            encode(Framing::Newline, m.as_bytes(), &mut stream);
        }
        let got = deframe(Framing::Newline, &stream, &cuts, 1 << 20).unwrap();
        let want: Vec<Vec<u8>> = messages.iter().map(|m| m.as_bytes().to_vec()).collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn garbage_never_panics(stream in prop::collection::vec(any::<u8>(), 0..200)) {
        for framing in [Framing::Newline, Framing::OctetCounting, Framing::LengthPrefixed] {
            if let Err(e) = deframe(framing, &stream, &[], 64) {
                prop_assert!(e.contains("at byte"));
            }
        }
    }
}

#[test]
fn octet_counting_errors_name_the_offset() {
    let e = deframe(Framing::OctetCounting, b"5 hello3 abcx", &[], 100).unwrap_err();
    assert_eq!(
        e,
        "expected a decimal message length (at byte 12 of the stream)"
    );
    let e = deframe(Framing::OctetCounting, b"5 helloabc", &[], 100).unwrap_err();
    assert_eq!(
        e,
        "expected a decimal message length (at byte 7 of the stream)"
    );
    let e = deframe(Framing::OctetCounting, b"05 hello", &[], 100).unwrap_err();
    assert!(e.contains("leading zero") && e.contains("byte 0"), "{e}");
    let e = deframe(Framing::OctetCounting, b"500 x", &[], 100).unwrap_err();
    assert!(e.contains("over the limit of 100"), "{e}");
    let e = deframe(Framing::OctetCounting, b"5 hel", &[], 100).unwrap_err();
    assert_eq!(
        e,
        "the stream ends inside a message (at byte 0 of the stream)"
    );
    let e = deframe(Framing::LengthPrefixed, &[0, 0, 1, 0, b'x'], &[], 100).unwrap_err();
    assert!(e.contains("256 bytes"), "{e}");
}

#[test]
fn long_lines_are_cut_and_counted() {
    let mut d = Deframer::new(Framing::Newline, 4);
    let mut out = Vec::new();
    d.push(b"abcdefghij\nxy\n", &mut out).unwrap();
    let got: Vec<&[u8]> = out.iter().map(|b| &b[..]).collect();
    assert_eq!(got, vec![&b"abcd"[..], b"efgh", b"ij", b"xy"]);
    assert_eq!(d.cut, 2);
}

/// RFC 6587's example shape, as rsyslog sends it with octet counting.
#[test]
fn rfc6587_octet_counted_syslog() {
    let got = deframe(
        Framing::OctetCounting,
        b"34 <13>1 - host app - - - message one30 <13>1 - host app - - - msg two",
        &[10, 40],
        1000,
    )
    .unwrap();
    assert_eq!(
        got,
        vec![
            b"<13>1 - host app - - - message one".to_vec(),
            b"<13>1 - host app - - - msg two".to_vec()
        ]
    );
}

/// Found by fuzzing: an over-long length gave a different error (and
/// offset) depending on where the stream was split into reads.
#[test]
fn an_overlong_length_fails_the_same_whatever_the_reads() {
    let stream = b"12345678901234567890x hello";
    let whole = deframe(Framing::OctetCounting, stream, &[], 100).unwrap_err();
    let split = deframe(Framing::OctetCounting, stream, &[12], 100).unwrap_err();
    assert_eq!(whole, split);
    assert!(whole.contains("more than 10 digits"), "{whole}");
}

#[test]
fn whole_framing_is_one_message_up_to_the_limit() {
    let got = deframe(Framing::Whole, b"a\nb\x00c", &[2, 4], 100).unwrap();
    assert_eq!(got, vec![b"a\nb\x00c".to_vec()]);
    assert!(deframe(Framing::Whole, b"", &[], 100).unwrap().is_empty());
    let e = deframe(Framing::Whole, &[7u8; 101], &[50], 100).unwrap_err();
    assert!(e.contains("over the limit of 100"), "{e}");
}
