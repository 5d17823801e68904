//! Stop conditions: EOG tokens, ignore_eos, and the streaming stop-string
//! matcher (chunk splits, overlapping prefixes, multi-byte UTF-8).

use engine::{Sampler, SamplerConfig, StopConditions, StopMatcher};

/// Feeds `chunks`, checking after every push that shown + held text is what
/// came in; returns (shown text, stopped).
fn run(stops: &[&str], chunks: &[&str]) -> (String, bool) {
    let mut m = StopMatcher::new(stops);
    let mut out = String::new();
    let mut seen = String::new();
    let mut stopped = false;
    for c in chunks {
        seen.push_str(c);
        stopped = m.push(c, &mut out);
        if stopped {
            break;
        }
        assert_eq!(format!("{out}{}", m.held()), seen);
    }
    m.finish(&mut out);
    (out, stopped)
}

#[test]
fn stop_string_split_across_chunks_is_never_shown() {
    let mut m = StopMatcher::new(&["</s>"]);
    let mut out = String::new();
    assert!(!m.push("Hello <", &mut out));
    assert_eq!(out, "Hello ");
    assert_eq!(m.held(), "<");
    assert!(!m.push("/", &mut out));
    assert_eq!(out, "Hello ");
    assert!(m.push("s> world", &mut out));
    assert_eq!(out, "Hello ");
    assert_eq!(m.matched(), Some("</s>"));
    // Later chunks and finish add nothing.
    assert!(m.push("more", &mut out));
    m.finish(&mut out);
    assert_eq!(out, "Hello ");
}

#[test]
fn held_text_is_released_once_it_cannot_match() {
    let mut m = StopMatcher::new(&["</s>"]);
    let mut out = String::new();
    assert!(!m.push("a <", &mut out));
    assert_eq!(out, "a ");
    assert!(!m.push("b", &mut out));
    assert_eq!(out, "a <b");
    assert_eq!(m.held(), "");
    assert!(!m.push("</", &mut out));
    assert_eq!(out, "a <b");
    m.finish(&mut out);
    assert_eq!(out, "a <b</");
    assert_eq!(m.matched(), None);
}

#[test]
fn overlapping_prefixes() {
    // "aa" could still be the start of "aab" after a third "a".
    assert_eq!(
        run(&["aab"], &["a", "a", "a", "b", "c"]),
        ("a".into(), true)
    );
    assert_eq!(run(&["aab"], &["a", "a", "a"]), ("aaa".into(), false));
    // Both "ab" and "aab": the first to complete wins, and on the same end
    // the earlier start, so nothing of "aab" shows.
    assert_eq!(
        run(&["ab", "aab"], &["x", "a", "a", "b"]),
        ("x".into(), true)
    );
    assert_eq!(run(&["ab", "aab"], &["xaab"]), ("x".into(), true));
    assert_eq!(run(&["ab"], &["x", "a", "a", "b"]), ("xa".into(), true));
    // A shorter string inside a longer one completes first.
    assert_eq!(run(&["abcd", "bc"], &["abcd"]), ("a".into(), true));
    assert_eq!(run(&["abcd", "bc"], &["ab", "cd"]), ("a".into(), true));
}

#[test]
fn multi_byte_utf8() {
    assert_eq!(
        run(&["日本"], &["今日", "は日", "本語"]),
        ("今日は".into(), true)
    );
    let mut m = StopMatcher::new(&["日本"]);
    let mut out = String::new();
    m.push("今日", &mut out);
    assert_eq!((out.as_str(), m.held()), ("今", "日"));
    // "è" and "é" share their first byte; nothing is held after "è".
    let mut m = StopMatcher::new(&["aé"]);
    let mut out = String::new();
    assert!(!m.push("xa", &mut out));
    assert_eq!(m.held(), "a");
    assert!(!m.push("è", &mut out));
    assert_eq!((out.as_str(), m.held()), ("xaè", ""));
    assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
    assert_eq!(run(&["🙂"], &["ok 🙂 done"]), ("ok ".into(), true));
}

#[test]
fn finish_flushes_and_empty_stops_pass_through() {
    assert_eq!(run(&["END"], &["foo E", "N"]), ("foo EN".into(), false));
    assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    assert_eq!(run(&[""], &["a", "b"]), ("ab".into(), false));
    let mut m = StopConditions::default().matcher();
    let mut out = String::new();
    assert!(!m.push("x", &mut out));
    assert_eq!(out, "x");
}

#[test]
fn reset_reuses_the_matcher() {
    let mut m = StopMatcher::new(&["\n\n"]);
    let mut out = String::new();
    assert!(m.push("a\n\nb", &mut out));
    m.reset();
    out.clear();
    assert!(!m.push("c\n", &mut out));
    m.finish(&mut out);
    assert_eq!(out, "c\n");
}

/// Random texts split at random points: the output is always the text up to
/// the first stop string to complete, however it was chunked.
#[test]
fn chunking_does_not_change_the_result() {
    let alphabet = ["a", "b", "é", "日", "\n"];
    let stops = ["ab", "aab", "é日", "b\n\n", "日日日", "a\nbb", "\nb"];
    let mut x: u64 = 17;
    let mut next = |n: usize| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 33) as usize) % n
    };
    for _ in 0..2000 {
        let len = 1 + next(12);
        let pieces: Vec<&str> = (0..len).map(|_| alphabet[next(alphabet.len())]).collect();
        let text: String = pieces.concat();

        // Expected: cut at the start of the occurrence with the smallest end
        // (then smallest start).
        let cut = stops
            .iter()
            .filter_map(|s| text.find(s).map(|i| (i + s.len(), i)))
            .min()
            .map(|(_, start)| start);
        let want = (
            cut.map_or(text.clone(), |c| text[..c].to_string()),
            cut.is_some(),
        );

        // One chunk per piece, and random groupings of pieces.
        assert_eq!(run(&stops, &pieces), want, "{pieces:?}");
        let mut chunks = Vec::new();
        let mut i = 0;
        while i < pieces.len() {
            let j = (i + 1 + next(3)).min(pieces.len());
            chunks.push(pieces[i..j].concat());
            i = j;
        }
        let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
        assert_eq!(run(&stops, &chunks), want, "{chunks:?}");
    }
}

#[test]
fn eog_tokens_and_ignore_eos() {
    let stop = StopConditions {
        eog_tokens: vec![2, 7],
        ..StopConditions::default()
    };
    assert!(stop.is_eog(2) && stop.is_eog(7) && !stop.is_eog(3));
    assert!(stop.stops_at(7));
    assert!(!stop.stops_at(3));
    let mut logits = [0.0f32, 1.0, 5.0];
    stop.suppress_eog(&mut logits);
    assert_eq!(logits, [0.0, 1.0, 5.0]);

    let ignore = StopConditions {
        ignore_eos: true,
        ..stop.clone()
    };
    assert!(ignore.is_eog(2));
    assert!(!ignore.stops_at(2));
    // EOG tokens are masked out, so greedy picks the best non-EOG token.
    let mut logits = [0.0f32, 1.0, 5.0, 0.5, 0.0, 0.0, 0.0, 9.0];
    ignore.suppress_eog(&mut logits);
    assert_eq!(logits[2], f32::NEG_INFINITY);
    assert_eq!(logits[7], f32::NEG_INFINITY);
    let mut s = Sampler::new(SamplerConfig::greedy());
    assert_eq!(s.sample(&mut logits), 1);
    // Out-of-range EOG ids are ignored.
    let far = StopConditions {
        eog_tokens: vec![100],
        ignore_eos: true,
        ..StopConditions::default()
    };
    far.suppress_eog(&mut logits);
}
