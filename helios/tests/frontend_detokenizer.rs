//! The incremental detokenizer: its deltas always add up to the full decode,
//! and no delta ends in a U+FFFD standing for an unfinished character.
//!
//! Checked over every token sequence of the fixtures (chat prompts and
//! tokenizer cases) and over seeded random id sequences, which are mostly
//! invalid UTF-8 byte soup for byte-level BPE, for the SmolLM2, Qwen-style and
//! byte-fallback tokenizers.

use std::path::PathBuf;

use helios::frontend::{Detokenizer, Tokenizer};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
}

fn json(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(name)).unwrap()).unwrap()
}

fn load(file: &str) -> Tokenizer {
    Tokenizer::from_json(&std::fs::read_to_string(fixtures().join(file)).unwrap()).unwrap()
}

const TOKENIZERS: [&str; 3] = [
    "smollm2.tokenizer.json",
    "qwen.tokenizer.json",
    "byte_fallback.tokenizer.json",
];

/// Streams `ids` through a detokenizer: the deltas of every push, then the
/// remainder.
fn stream(tokenizer: &Tokenizer, ids: &[u32], skip_special: bool) -> (Vec<String>, String) {
    let mut detokenizer = Detokenizer::new(skip_special);
    let deltas = ids
        .iter()
        .map(|&id| detokenizer.push(tokenizer, id).unwrap())
        .collect();
    (deltas, detokenizer.finish(tokenizer).unwrap())
}

/// The detokenizer's contract for one sequence.
fn check(tokenizer: &Tokenizer, ids: &[u32], what: &str) {
    for skip_special in [false, true] {
        let (deltas, rest) = stream(tokenizer, ids, skip_special);
        let full = tokenizer.decode(ids, skip_special).unwrap();
        assert_eq!(
            deltas.concat() + &rest,
            full,
            "{what} (skip special: {skip_special})"
        );
        for delta in &deltas {
            assert!(
                !delta.ends_with(char::REPLACEMENT_CHARACTER),
                "{what}: a delta ends in U+FFFD: {delta:?}"
            );
        }
        // Text is held at the end only for an unfinished character or an
        // open run of byte-fallback tokens.
        let open_run = ids.last().is_some_and(|&id| tokenizer.is_byte_token(id));
        if !full.contains(char::REPLACEMENT_CHARACTER) && !open_run {
            assert_eq!(rest, "", "{what}: valid text is released before the end");
        }
    }
}

/// With the first `split` ids as context, the deltas add up to what the
/// output adds to the context's text. A context must end on a character
/// boundary (a rendered prompt does); other splits are skipped.
fn check_with_context(tokenizer: &Tokenizer, ids: &[u32], split: usize, what: &str) {
    let (context, output) = ids.split_at(split);
    let before = tokenizer.decode(context, false).unwrap();
    let full = tokenizer.decode(ids, false).unwrap();
    let open_run = context
        .last()
        .is_some_and(|&id| tokenizer.is_byte_token(id));
    if open_run || before.ends_with(char::REPLACEMENT_CHARACTER) || !full.starts_with(&before) {
        return;
    }
    let mut detokenizer = Detokenizer::with_context(context, false);
    let mut text = String::new();
    for &id in output {
        text += &detokenizer.push(tokenizer, id).unwrap();
    }
    text += &detokenizer.finish(tokenizer).unwrap();
    assert_eq!(
        text,
        full[before.len()..],
        "{what} after {split} context ids"
    );
}

/// Every id sequence of a fixture, with the tokenizer it was made with.
fn fixture_sequences() -> Vec<(&'static str, Vec<u32>, String)> {
    let mut sequences = Vec::new();
    for (file, tokenizer) in [
        ("smollm2.json", TOKENIZERS[0]),
        ("qwen3.json", TOKENIZERS[1]),
        ("features.json", TOKENIZERS[0]),
    ] {
        for case in json(file)["cases"].as_array().unwrap() {
            let ids = serde_json::from_value(case["token_ids"].clone()).unwrap();
            sequences.push((tokenizer, ids, format!("{file} {}", case["name"])));
        }
    }
    let suite = json("tokenizers.json");
    for entry in suite["tokenizers"].as_object().unwrap().values() {
        let file = TOKENIZERS
            .into_iter()
            .find(|name| *name == entry["file"].as_str().unwrap())
            .unwrap();
        for case in entry["cases"].as_array().unwrap() {
            let ids = serde_json::from_value(case["token_ids"].clone()).unwrap();
            sequences.push((file, ids, format!("{file} {:?}", case["text"])));
        }
    }
    sequences
}

#[test]
fn deltas_add_up_to_the_full_decode_for_every_fixture_sequence() {
    let tokenizers: Vec<(&str, Tokenizer)> = TOKENIZERS.iter().map(|f| (*f, load(f))).collect();
    let sequences = fixture_sequences();
    assert!(sequences.len() > 100);
    for (file, ids, what) in sequences {
        let tokenizer = &tokenizers.iter().find(|(f, _)| *f == file).unwrap().1;
        check(tokenizer, &ids, &what);
    }
}

/// SplitMix64: a seeded generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn deltas_add_up_to_the_full_decode_for_random_ids() {
    for (seed, file) in TOKENIZERS.iter().enumerate() {
        let tokenizer = load(file);
        let vocab = tokenizer.vocab_size();
        let mut rng = Rng(seed as u64 + 1);
        for round in 0..150 {
            let len = 1 + rng.below(48);
            let ids: Vec<u32> = (0..len).map(|_| rng.below(vocab) as u32).collect();
            let what = format!("{file} random #{round} {ids:?}");
            check(&tokenizer, &ids, &what);
            check_with_context(&tokenizer, &ids, rng.below(6).min(ids.len()), &what);
        }
    }
}

#[test]
fn a_character_split_over_tokens_is_released_whole() {
    let fallback = load("byte_fallback.tokenizer.json");
    let ids = fallback.encode("中a", false).unwrap();
    // "▁", one byte-fallback token per UTF-8 byte of 中, then "a".
    let bytes: Vec<bool> = ids.iter().map(|&id| fallback.is_byte_token(id)).collect();
    assert_eq!(bytes, [false, true, true, true, false], "{ids:?}");
    let (deltas, rest) = stream(&fallback, &ids, false);
    // The run is released when the token after it arrives.
    assert_eq!(deltas, ["", "", "", "", "中a"]);
    assert_eq!(rest, "");
    let (deltas, rest) = stream(&fallback, &ids[..4], false);
    assert!(deltas.iter().all(String::is_empty), "{deltas:?}");
    assert_eq!(rest, "中");

    let smollm2 = load("smollm2.tokenizer.json");
    let ids = smollm2.encode("😀", false).unwrap();
    assert!(ids.len() > 1, "{ids:?}");
    let (deltas, rest) = stream(&smollm2, &ids, false);
    let (last, held) = deltas.split_last().unwrap();
    assert!(held.iter().all(String::is_empty), "{deltas:?}");
    assert_eq!((last.as_str(), rest.as_str()), ("😀", ""));
}

#[test]
fn an_unfinished_character_is_given_up_at_the_end() {
    let fallback = load("byte_fallback.tokenizer.json");
    let ids = fallback.encode("a中", false).unwrap();
    let cut = &ids[..ids.len() - 1];
    let (deltas, rest) = stream(&fallback, cut, false);
    assert_eq!(deltas.concat(), "a");
    assert_eq!(rest, fallback.decode(cut, false).unwrap()["a".len()..]);
    assert!(rest.ends_with(char::REPLACEMENT_CHARACTER));
}

#[test]
fn context_keeps_the_first_words_leading_space() {
    let fallback = load("byte_fallback.tokenizer.json");
    let prompt = fallback.encode("The weather", false).unwrap();
    let all = fallback.encode("The weather is sunny", false).unwrap();
    assert_eq!(&all[..prompt.len()], prompt.as_slice());
    let output = &all[prompt.len()..];

    let mut detokenizer = Detokenizer::with_context(&prompt, false);
    let mut text = String::new();
    for &id in output {
        text += &detokenizer.push(&fallback, id).unwrap();
    }
    text += &detokenizer.finish(&fallback).unwrap();
    assert_eq!(text, " is sunny");
    // Without context the SentencePiece decoder strips the first space, as
    // decoding the output alone does.
    let (deltas, rest) = stream(&fallback, output, false);
    assert_eq!(deltas.concat() + &rest, "is sunny");
}

#[test]
fn special_tokens_are_skipped_when_asked() {
    let smollm2 = load("smollm2.tokenizer.json");
    let ids = smollm2
        .encode("Hi<|im_end|>\n<|im_start|>there", false)
        .unwrap();
    let (deltas, _) = stream(&smollm2, &ids, true);
    assert_eq!(deltas.concat(), "Hi\nthere");
    let (deltas, _) = stream(&smollm2, &ids, false);
    assert_eq!(deltas.concat(), "Hi<|im_end|>\n<|im_start|>there");
}
