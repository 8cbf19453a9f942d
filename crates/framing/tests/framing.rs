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

/// The limits at every boundary, whatever the reads: a counted message
/// of `max` bytes passes and one of `max + 1` is refused at its own
/// frame; a newline-framed line is cut into pieces of `max` bytes, each
/// cut counted; a whole stream of `max` bytes is one message and one of
/// `max + 1` an error.
mod limits {
    use super::*;

    /// Message lengths near multiples of the limit.
    fn lengths(max: usize) -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(
            prop_oneof![0..=3 * max, Just(max), Just(max + 1), Just(2 * max)],
            1..6,
        )
    }

    fn message(i: usize, len: usize) -> Vec<u8> {
        (0..len).map(|k| b'a' + ((i + k) % 26) as u8).collect()
    }

    proptest! {
        #[test]
        fn a_counted_message_over_the_limit_is_refused_at_its_frame(
            (max, lens) in (1usize..40).prop_flat_map(|m| (Just(m), lengths(m))),
            mut cuts in prop::collection::vec(0usize..400, 0..8),
        ) {
            cuts.sort_unstable();
            for framing in [Framing::OctetCounting, Framing::LengthPrefixed] {
                let mut stream = Vec::new();
                let mut first_over = None;
                let messages: Vec<Vec<u8>> =
                    lens.iter().enumerate().map(|(i, &l)| message(i, l)).collect();
                for m in &messages {
                    if m.len() > max && first_over.is_none() {
                        first_over = Some((stream.len(), m.len()));
                    }
                    encode(framing, m, &mut stream);
                }
                let got = deframe(framing, &stream, &cuts, max);
                match first_over {
                    None => prop_assert_eq!(got.unwrap(), messages),
                    Some((at, len)) => prop_assert_eq!(
                        got.unwrap_err(),
                        format!("a message of {len} bytes, over the limit of {max} (at byte {at} of the stream)")
                    ),
                }
            }
        }

        #[test]
        fn a_line_over_the_limit_is_cut_into_pieces_of_the_limit(
            (max, lens) in (1usize..40).prop_flat_map(|m| (Just(m), lengths(m))),
            last_unterminated in any::<bool>(),
            mut cuts in prop::collection::vec(0usize..400, 0..8),
        ) {
            cuts.sort_unstable();
            let mut stream = Vec::new();
            let mut want = Vec::new();
            let mut cut = 0u64;
            for (i, &len) in lens.iter().enumerate() {
                let line = message(i, len);
                stream.extend_from_slice(&line);
                let last = i + 1 == lens.len();
                if !(last && last_unterminated) {
                    stream.push(b'\n');
                } else if len == 0 {
                    break; // nothing after the last newline: no message
                }
                let pieces = len.div_ceil(max).max(1);
                cut += pieces as u64 - 1;
                want.extend((0..pieces).map(|p| line[p * max..len.min((p + 1) * max)].to_vec()));
            }
            let mut d = Deframer::new(Framing::Newline, max);
            let mut out = Vec::new();
            let mut at = 0;
            for &c in cuts.iter().chain(std::iter::once(&stream.len())) {
                let c = c.clamp(at, stream.len());
                d.push(&stream[at..c], &mut out).unwrap();
                at = c;
            }
            out.extend(d.finish().unwrap());
            let got: Vec<Vec<u8>> = out.iter().map(|b| b.to_vec()).collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(d.cut, cut);
            prop_assert_eq!(d.consumed(), stream.len() as u64);
        }

        #[test]
        fn a_whole_stream_over_the_limit_is_an_error(
            max in 1usize..64,
            extra in 0usize..3,
            under in any::<bool>(),
            mut cuts in prop::collection::vec(0usize..200, 0..6),
        ) {
            cuts.sort_unstable();
            let len = if under { max - extra.min(max) } else { max + 1 + extra };
            let stream = message(0, len);
            let got = deframe(Framing::Whole, &stream, &cuts, max);
            if len <= max {
                let want = if len == 0 { vec![] } else { vec![stream] };
                prop_assert_eq!(got.unwrap(), want);
            } else {
                prop_assert_eq!(
                    got.unwrap_err(),
                    format!("the stream is over the limit of {max} bytes (at byte 0 of the stream)")
                );
            }
        }
    }
}

/// A length of ten digits is read (and refused by the limit); eleven are
/// refused as such, before the limit is looked at.
#[test]
fn octet_counting_reads_lengths_of_up_to_ten_digits() {
    let e = deframe(Framing::OctetCounting, b"9999999999 x", &[], 100).unwrap_err();
    assert_eq!(
        e,
        "a message of 9999999999 bytes, over the limit of 100 (at byte 0 of the stream)"
    );
    let e = deframe(Framing::OctetCounting, b"10000000000 x", &[], 100).unwrap_err();
    assert_eq!(
        e,
        "a message length of more than 10 digits (at byte 0 of the stream)"
    );
}

/// Every message with the stream offset `push_placed` and
/// `finish_placed` give it.
fn deframe_placed(
    framing: Framing,
    stream: &[u8],
    cuts: &[usize],
    max: usize,
) -> Vec<(u64, Vec<u8>)> {
    let mut d = Deframer::new(framing, max);
    let (mut out, mut placed) = (Vec::new(), Vec::new());
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
        let cut = cut.clamp(at, stream.len());
        let mut messages = Vec::new();
        let mut starts = Vec::new();
        d.push_placed(&stream[at..cut], &mut messages, &mut starts)
            .unwrap();
        assert_eq!(messages.len(), starts.len(), "one start per message");
        out.extend(messages);
        placed.extend(starts);
        at = cut;
    }
    if let Some((start, last)) = d.finish_placed().unwrap() {
        out.push(last);
        placed.push(start);
    }
    placed
        .into_iter()
        .zip(out)
        .map(|(s, m)| (s, m.to_vec()))
        .collect()
}

proptest! {
    /// Each message is found in the stream at the offset given, offsets
    /// rise, and how the stream was split into reads changes none of them
    /// (a reader resuming at a saved offset names messages alike).
    #[test]
    fn each_message_starts_where_it_says_whatever_the_reads(
        messages in prop::collection::vec("[^\n]{0,100}", 1..10),
        mut cuts in prop::collection::vec(0usize..2000, 0..8),
    ) {
        cuts.sort_unstable();
        for (framing, max) in [
            (Framing::Newline, 1 << 20),
            (Framing::Newline, 16),
            (Framing::OctetCounting, 1 << 20),
            (Framing::LengthPrefixed, 1 << 20),
        ] {
            let mut stream = Vec::new();
            for m in &messages {
                encode(framing, m.as_bytes(), &mut stream);
            }
            let placed = deframe_placed(framing, &stream, &cuts, max);
            prop_assert_eq!(&placed, &deframe_placed(framing, &stream, &[], max));
            let mut last = None;
            for (start, message) in &placed {
                let start = *start as usize;
                prop_assert_eq!(&stream[start..start + message.len()], &message[..]);
                prop_assert!(last < Some(start) || message.is_empty() && last == Some(start));
                last = Some(start);
            }
        }
    }
}
