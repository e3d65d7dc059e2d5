//! The grammar engine on the fixture tokenizers: every token's bytes round
//! trip through the tokenizer's own decoding (the default model's mixed
//! ByteFallback/ByteLevel decoder included), and masks agree with a brute-force
//! oracle that knows nothing of llguidance: on a finite language, a token is
//! allowed exactly when the output so far plus its bytes is a prefix of a
//! word of the language, and the stop tokens exactly when the output is one.

use std::path::PathBuf;

use helios::frontend::Tokenizer;
use helios::grammar::token_bytes::{check_round_trip, vocabulary_bytes, SPECIAL_MARKER};
use helios::grammar::{GrammarEngine, GrammarError, GrammarSpec, MAX_GRAMMAR_BYTES};

fn tokenizer_json(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/chat")
        .join(format!("{name}.tokenizer.json"));
    std::fs::read_to_string(path).unwrap()
}

fn load(name: &str) -> (Tokenizer, String) {
    let json = tokenizer_json(name);
    (Tokenizer::from_json(&json).unwrap(), json)
}

#[test]
fn every_fixture_tokenizers_bytes_round_trip() {
    for name in ["smollm2", "qwen", "byte_fallback"] {
        let (tokenizer, json) = load(name);
        let words = vocabulary_bytes(&tokenizer, &json).unwrap();
        assert_eq!(words.len(), tokenizer.vocab_size(), "{name}");
        check_round_trip(&tokenizer, &words).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // SmolLM2's byte-level characters are single bytes (a lone UTF-8 lead
    // byte among them), not the text a lossy decode gives.
    let (tokenizer, json) = load("smollm2");
    let words = vocabulary_bytes(&tokenizer, &json).unwrap();
    let lead = tokenizer.token_to_id("\u{c3}").unwrap();
    assert_eq!(words[lead as usize], vec![0xC3]);
    let newline = tokenizer.token_to_id("\u{10a}").unwrap();
    assert_eq!(words[newline as usize], b"\n".to_vec());
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    assert_eq!(words[im_end as usize][0], SPECIAL_MARKER);
    // Byte-fallback tokens are their byte.
    let (tokenizer, json) = load("byte_fallback");
    let words = vocabulary_bytes(&tokenizer, &json).unwrap();
    let byte = tokenizer.token_to_id("<0x80>").unwrap();
    assert_eq!(words[byte as usize], vec![0x80]);
}

#[test]
fn a_wrong_byte_is_caught_by_the_round_trip() {
    let (tokenizer, json) = load("qwen");
    let mut words = vocabulary_bytes(&tokenizer, &json).unwrap();
    let id = (0..words.len())
        .rev()
        .find(|&id| words[id].len() > 1 && words[id][0] != SPECIAL_MARKER)
        .unwrap();
    words[id][0] ^= 0x01;
    let error = check_round_trip(&tokenizer, &words).unwrap_err();
    assert!(
        matches!(error, GrammarError::RoundTrip { id: bad, .. } if bad as usize == id),
        "{error}"
    );
}

/// The oracle's mask after `output` for the finite language `words`.
fn oracle(bytes: &[Vec<u8>], output: &[u8], language: &[&str]) -> Vec<bool> {
    bytes
        .iter()
        .map(|word| {
            if word.is_empty() || word[0] == SPECIAL_MARKER {
                return false;
            }
            let mut next = output.to_vec();
            next.extend_from_slice(word);
            language.iter().any(|w| w.as_bytes().starts_with(&next))
        })
        .collect()
}

fn bit(mask: &[u32], id: usize) -> bool {
    mask[id / 32] >> (id % 32) & 1 == 1
}

/// Walks the language with a deterministic choice of allowed tokens,
/// comparing every mask with the oracle.
fn walk(spec: GrammarSpec, language: &[&str], seed: u64) -> usize {
    let (tokenizer, json) = load("qwen");
    let bytes = vocabulary_bytes(&tokenizer, &json).unwrap();
    let stops = [
        tokenizer.token_to_id("<|im_end|>").unwrap(),
        tokenizer.token_to_id("<|endoftext|>").unwrap(),
    ];
    // Wider than the vocabulary: the padding must never be allowed.
    let width = bytes.len() + 40;
    let engine = GrammarEngine::new(&tokenizer, &json, &stops, width, &[]).unwrap();
    assert_eq!(engine.mask_words(), width.div_ceil(32));
    let mut constraint = engine.constraint(&spec).unwrap();
    let mut mask = vec![0u32; engine.mask_words()];
    let mut output = Vec::new();
    let mut state = seed;
    let mut steps = 0;
    loop {
        constraint.mask(&mut mask).unwrap();
        let expected = oracle(&bytes, &output, language);
        for (id, &allowed) in expected.iter().enumerate() {
            if stops.contains(&(id as u32)) {
                continue;
            }
            assert_eq!(
                bit(&mask, id),
                allowed,
                "token {id} {:?} after {:?}",
                bytes[id],
                String::from_utf8_lossy(&output)
            );
        }
        let ends = language.iter().any(|w| w.as_bytes() == output.as_slice());
        for &stop in &stops {
            assert_eq!(
                bit(&mask, stop as usize),
                ends,
                "a stop after {:?}",
                String::from_utf8_lossy(&output)
            );
        }
        for id in bytes.len()..width {
            assert!(!bit(&mask, id), "padding {id} allowed");
        }
        let allowed: Vec<usize> = (0..width).filter(|&id| bit(&mask, id)).collect();
        assert!(
            !allowed.is_empty(),
            "nothing allowed after {:?}",
            String::from_utf8_lossy(&output)
        );
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let token = allowed[(state >> 33) as usize % allowed.len()];
        constraint.advance(token as u32).unwrap();
        steps += 1;
        if stops.contains(&(token as u32)) {
            assert!(language.iter().any(|w| w.as_bytes() == output.as_slice()));
            return steps;
        }
        output.extend_from_slice(&bytes[token]);
    }
}

#[test]
fn masks_agree_with_brute_force_on_finite_languages() {
    let lark = GrammarSpec::Lark(r#"start: "yes" | "no" | "maybe so" | "maybe not""#.to_owned());
    let regex = GrammarSpec::Regex("(cat|dog)s?|bird".to_owned());
    let mut total = 0;
    for seed in 0..12 {
        total += walk(lark.clone(), &["yes", "no", "maybe so", "maybe not"], seed);
        total += walk(regex.clone(), &["cat", "cats", "dog", "dogs", "bird"], seed);
    }
    assert!(total > 24, "the walks took {total} steps");
}

#[test]
fn oversized_and_broken_grammars_are_refused() {
    let (tokenizer, json) = load("qwen");
    let engine = GrammarEngine::new(
        &tokenizer,
        &json,
        &[tokenizer.token_to_id("<|im_end|>").unwrap()],
        700,
        &[],
    )
    .unwrap();
    let huge = GrammarSpec::Regex("a".repeat(MAX_GRAMMAR_BYTES + 1));
    assert!(matches!(
        engine.constraint(&huge),
        Err(GrammarError::TooLarge { .. })
    ));
    let broken = GrammarSpec::Lark("start: (".to_owned());
    assert!(matches!(
        engine.constraint(&broken),
        Err(GrammarError::Compile { .. })
    ));
    let schema = GrammarSpec::JsonSchema(serde_json::json!({"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}));
    // Compiled once, then from the cache: both constrain alike.
    let mut first = engine.constraint(&schema).unwrap();
    let mut second = engine.constraint(&schema).unwrap();
    let (mut a, mut b) = (
        vec![0u32; engine.mask_words()],
        vec![0u32; engine.mask_words()],
    );
    first.mask(&mut a).unwrap();
    second.mask(&mut b).unwrap();
    assert_eq!(a, b);
    let brace = tokenizer.encode("{", false).unwrap()[0] as usize;
    assert!(bit(&a, brace));
    assert!(!first.is_accepting());
}

#[test]
fn a_delimiter_token_is_matched_as_a_token_never_as_text() {
    let (tokenizer, json) = load("qwen");
    let call = tokenizer.token_to_id("<tool_call>").unwrap();
    let stops = [tokenizer.token_to_id("<|im_end|>").unwrap()];
    let width = tokenizer.vocab_size();
    let allowed = |engine: &GrammarEngine, grammar: &str| {
        let mut constraint = engine
            .constraint(&GrammarSpec::Lark(grammar.to_owned()))
            .unwrap();
        let mut mask = vec![0u32; engine.mask_words()];
        constraint.mask(&mut mask).unwrap();
        bit(&mask, call as usize)
    };
    let plain = GrammarEngine::new(&tokenizer, &json, &stops, width, &[]).unwrap();
    let delimited = GrammarEngine::new(&tokenizer, &json, &stops, width, &[call]).unwrap();
    // Free text: the token's bytes are text unless it is a delimiter.
    assert!(allowed(&plain, "start: /(?s:.*)/"));
    assert!(!allowed(&delimited, "start: /(?s:.*)/"));
    // By id, a delimiter is allowed.
    assert!(allowed(&delimited, &format!("start: <[{call}]> \"x\"")));
}
