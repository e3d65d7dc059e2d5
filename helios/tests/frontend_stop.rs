//! Stop sequences over streamed text: matches across piece boundaries, text
//! held back only while it may still become a stop sequence, and a result that
//! does not depend on how the text was split.

use helios::frontend::{FrontendError, StopMatcher, StopStep};

/// Feeds `pieces` and returns the released text and the stop that matched.
fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>) {
    let mut matcher = StopMatcher::new(stops).unwrap();
    let mut released = String::new();
    for piece in pieces {
        match matcher.push(piece) {
            StopStep::Continue { text } => released += &text,
            StopStep::Stopped { text, stop } => {
                released += &text;
                return (released, Some(stop));
            }
        }
    }
    released += &matcher.finish();
    (released, None)
}

fn step(text: &str) -> StopStep {
    StopStep::Continue {
        text: text.to_owned(),
    }
}

#[test]
fn a_stop_inside_one_piece_cuts_before_it() {
    assert_eq!(run(&["STOP"], &["abcSTOPdef"]), ("abc".to_owned(), Some(0)));
}

#[test]
fn a_stop_across_pieces_is_found_and_never_released() {
    let mut matcher = StopMatcher::new(&["</answer>"]).unwrap();
    assert_eq!(matcher.push("The end</"), step("The end"));
    assert_eq!(matcher.held(), "</");
    assert_eq!(matcher.push("ans"), step(""));
    assert_eq!(
        matcher.push("wer> trailing"),
        StopStep::Stopped {
            text: String::new(),
            stop: 0
        }
    );
    assert!(matcher.is_stopped());
    assert_eq!(matcher.push("more"), step(""));
}

#[test]
fn held_text_is_released_once_it_cannot_match() {
    let mut matcher = StopMatcher::new(&["<|stop|>"]).unwrap();
    assert_eq!(matcher.push("a <|st"), step("a "));
    assert_eq!(matcher.push("ar"), step("<|star"));
    assert_eq!(matcher.held(), "");
}

#[test]
fn held_text_is_released_at_the_end() {
    let mut matcher = StopMatcher::new(&["\n\nUser:"]).unwrap();
    assert_eq!(matcher.push("Done.\n\nUs"), step("Done."));
    assert_eq!(matcher.finish(), "\n\nUs");
}

#[test]
fn overlapping_prefixes_hold_the_longest_candidate() {
    // "aab" can still start at the second "a" after "aa" fails at "aaa".
    assert_eq!(
        run(&["aab"], &["a", "a", "a", "b"]),
        ("a".to_owned(), Some(0))
    );
    assert_eq!(
        run(&["abac"], &["ab", "ab", "ac"]),
        ("ab".to_owned(), Some(0))
    );
}

#[test]
fn the_stop_that_ends_first_wins() {
    // "cd" completes before "bcde" would.
    assert_eq!(
        run(&["bcde", "cd"], &["abcdef"]),
        ("ab".to_owned(), Some(1))
    );
    // Both end at the same place: the one that starts first (longest) wins.
    assert_eq!(run(&["d", "cd"], &["abcd"]), ("ab".to_owned(), Some(1)));
    // Duplicates: the first listed.
    assert_eq!(run(&["x", "x"], &["ax"]), ("a".to_owned(), Some(0)));
}

#[test]
fn multibyte_text_is_split_on_character_boundaries() {
    assert_eq!(
        run(&["終わり"], &["こんにちは終", "わ", "り!"]),
        ("こんにちは".to_owned(), Some(0))
    );
    assert_eq!(run(&["😀😀"], &["a😀", "b"]), ("a😀b".to_owned(), None));
}

#[test]
fn no_stops_release_everything_at_once() {
    let mut matcher = StopMatcher::new::<&str>(&[]).unwrap();
    assert_eq!(matcher.push("anything"), step("anything"));
    assert_eq!(matcher.finish(), "");
}

#[test]
fn an_empty_stop_is_refused() {
    assert!(matches!(
        StopMatcher::new(&["ok", ""]),
        Err(FrontendError::EmptyStop { index: 1 })
    ));
}

/// SplitMix64, for seeded random texts and splits.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// The reference: the first position where any stop ends, then the earliest
/// start, computed over the whole text at once.
fn reference(stops: &[&str], text: &str) -> (String, Option<usize>) {
    let best = stops
        .iter()
        .enumerate()
        .filter_map(|(index, stop)| {
            let start = text.find(stop)?;
            Some((start + stop.len(), start, index))
        })
        .min();
    match best {
        Some((_, start, index)) => (text[..start].to_owned(), Some(index)),
        None => (text.to_owned(), None),
    }
}

#[test]
fn results_do_not_depend_on_how_text_is_split() {
    let alphabet = ['a', 'b', 'c', 'é', '中'];
    let mut rng = Rng(7);
    for _ in 0..2000 {
        let text: String = (0..rng.below(24)).map(|_| alphabet[rng.below(5)]).collect();
        let stops: Vec<String> = (0..1 + rng.below(3))
            .map(|_| {
                (0..1 + rng.below(3))
                    .map(|_| alphabet[rng.below(5)])
                    .collect()
            })
            .collect();
        let stops: Vec<&str> = stops.iter().map(String::as_str).collect();
        let chars: Vec<char> = text.chars().collect();
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < chars.len() {
            let len = 1 + rng.below(4);
            let end = (at + len).min(chars.len());
            pieces.push(chars[at..end].iter().collect::<String>());
            at = end;
        }
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(
            run(&stops, &pieces),
            reference(&stops, &text),
            "{stops:?} {pieces:?}"
        );
    }
}
