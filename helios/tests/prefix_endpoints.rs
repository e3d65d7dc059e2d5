//! The exact-cut rule against BPE tokens crossing marks: hand-built offsets,
//! then the SmolLM2 byte-level BPE and a byte-fallback tokenizer from the
//! fixtures, checked mark by mark against the rule as the design states it.

use std::path::PathBuf;

use helios::prefix::{prompt_endpoints, EndpointError};
use tokenizers::Tokenizer;

fn tokenizer(file: &str) -> Tokenizer {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/chat")
        .join(file);
    Tokenizer::from_file(path).unwrap()
}

/// The rule, literally: a cut before token `k` is exact at `mark` when
/// every preceding token ends at or before it and every following token
/// starts at or after it; the endpoint must lie strictly inside the prompt.
fn literal_rule(mark: usize, offsets: &[(usize, usize)]) -> Option<u32> {
    (1..offsets.len())
        .filter(|&k| {
            offsets[..k].iter().all(|&(_, end)| end <= mark)
                && offsets[k..].iter().all(|&(start, _)| start >= mark)
        })
        .max()
        .map(|k| k as u32)
}

#[test]
fn hand_built_bpe_tokens_crossing_marks() {
    // "user: hi\n" | "\nok " | "world" with marks after each message; BPE
    // merged "\n\n" across the first mark and " world" across the second.
    let text = "user: hi\n\nok world";
    let offsets = [(0, 4), (4, 5), (5, 8), (8, 10), (10, 12), (12, 18)];
    assert_eq!(&text[8..10], "\n\n");
    assert_eq!(&text[12..18], " world");
    let endpoints = prompt_endpoints(text, &[9, 13], &offsets).unwrap();
    assert_eq!(endpoints.messages, Vec::<u32>::new());
    assert_eq!(endpoints.prompt, 6);
    // The same text split at the marks keeps both endpoints.
    let offsets = [
        (0, 4),
        (4, 5),
        (5, 8),
        (8, 9),
        (9, 10),
        (10, 12),
        (12, 13),
        (13, 18),
    ];
    let endpoints = prompt_endpoints(text, &[9, 13], &offsets).unwrap();
    assert_eq!(endpoints.messages, vec![4, 7]);
    // Trimmed offsets would hide the crossing: " world" reported as
    // (13, 18) makes 13 look exact although the token holds byte 12.
    let trimmed = [(0, 4), (4, 5), (5, 8), (8, 10), (10, 12), (13, 18)];
    let endpoints = prompt_endpoints(text, &[13], &trimmed).unwrap();
    assert_eq!(endpoints.messages, vec![5]);
}

#[test]
fn overlapping_unicode_spans_never_cut_a_character() {
    // Byte-fallback pieces of "é" both carry the character's span (1, 3).
    let text = "aéb";
    let offsets = [(0, 1), (1, 3), (1, 3), (3, 4)];
    let endpoints = prompt_endpoints(text, &[1, 3], &offsets).unwrap();
    assert_eq!(endpoints.messages, vec![1, 3]);
    assert_eq!(
        prompt_endpoints(text, &[2], &offsets),
        Err(EndpointError::MarkInsideCharacter { mark: 2 })
    );
}

#[test]
fn endpoints_are_sorted_unique_and_inside_the_prompt() {
    let text = "abcdef";
    let offsets = [(0, 2), (2, 4), (4, 6)];
    let endpoints = prompt_endpoints(text, &[4, 0, 2, 4, 6], &offsets).unwrap();
    assert_eq!(endpoints.messages, vec![1, 2]);
}

/// Checks every character boundary of `text` as a mark: the mapping agrees
/// with the literal rule, and every endpoint's tokens decode to exactly the
/// text before the mark. Returns (exact, cancelled) counts.
fn check_every_mark(tokenizer: &Tokenizer, text: &str) -> (usize, usize) {
    let encoding = tokenizer.encode(text, false).unwrap();
    let offsets = encoding.get_offsets();
    let ids = encoding.get_ids();
    let marks: Vec<usize> = (1..text.len())
        .filter(|&m| text.is_char_boundary(m))
        .collect();
    let (mut exact, mut cancelled) = (0, 0);
    for &mark in &marks {
        let mapped = prompt_endpoints(text, &[mark], offsets).unwrap();
        let expected = literal_rule(mark, offsets);
        assert_eq!(
            mapped.messages,
            Vec::from_iter(expected),
            "mark {mark} of {text:?}"
        );
        match expected {
            Some(k) => {
                exact += 1;
                let prefix = tokenizer.decode(&ids[..k as usize], false).unwrap();
                assert_eq!(prefix, text[..mark], "tokens before mark {mark}");
            }
            None => cancelled += 1,
        }
    }
    (exact, cancelled)
}

#[test]
fn smollm2_byte_level_bpe_against_the_literal_rule() {
    let tokenizer = tokenizer("smollm2.tokenizer.json");
    let chat = "<|im_start|>system\nYou are a helpful agent.<|im_end|>\n\
                <|im_start|>user\nList the files.\n\n<|im_end|>\n\
                <|im_start|>assistant\nCalling ls now.  <|im_end|>\n\
                <|im_start|>tool\n{\"files\": [\"a.rs\", \"b.rs\"]}\n<|im_end|>\n\
                <|im_start|>assistant\n";
    let (exact, cancelled) = check_every_mark(&tokenizer, chat);
    assert!(
        exact > 10 && cancelled > 10,
        "{exact} exact, {cancelled} cancelled"
    );
    // Message ends right after "<|im_end|>\n" are exact in ChatML.
    let marks: Vec<usize> = chat
        .match_indices("<|im_end|>\n")
        .map(|(i, s)| i + s.len())
        .collect();
    let encoding = tokenizer.encode(chat, false).unwrap();
    let endpoints = prompt_endpoints(chat, &marks, encoding.get_offsets()).unwrap();
    assert_eq!(endpoints.messages.len(), marks.len());
    // A plain-text template: the message ends in "\n", the template adds
    // "\n\n"; the byte-level regex and BPE merge "\n\n" across the mark.
    let plain = "User: list the files\n\n\nAssistant: calling ls";
    let mark = plain.find('\n').unwrap() + 1;
    let encoding = tokenizer.encode(plain, false).unwrap();
    let crossing = (encoding.get_offsets().iter()).any(|&(s, e)| s < mark && mark < e);
    assert!(crossing, "the fixture merges the two newlines");
    let endpoints = prompt_endpoints(plain, &[mark], encoding.get_offsets()).unwrap();
    assert!(endpoints.messages.is_empty());
    check_every_mark(&tokenizer, plain);
}

#[test]
fn byte_fallback_pieces_against_the_literal_rule() {
    let tokenizer = tokenizer("byte_fallback.tokenizer.json");
    let text = "héllo wörld, 東京 ✓ done.\nnext line";
    let (exact, _) = check_every_mark(&tokenizer, text);
    assert!(exact > 0);
}
