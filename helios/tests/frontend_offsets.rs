//! Token byte spans (`Tokenizer::encode_with_offsets`) on the SmolLM2
//! byte-level BPE and the Qwen2-style tokenizer (NFC, regex split) of the
//! fixtures, and on the Llama-style byte-fallback one: the ids are
//! `encode`'s, and the spans tile the text.

use std::path::PathBuf;

use helios::frontend::Tokenizer;
use serde_json::Value;
use tokenizers::{NormalizedString, Normalizer};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(fixtures().join(name)).unwrap()
}

fn load(file: &str) -> Tokenizer {
    Tokenizer::from_json(&read(file)).unwrap()
}

const TEXTS: [&str; 9] = [
    "Hello  world,\tthis is   a test.\n\n  indented\n",
    "   leading and trailing   ",
    "héllo wörld, 東京 ✓ done.\nnext line",
    "crabs 🦀🦀, a ZWJ 👩\u{200d}💻, maths Ω≈ç√ and ﬁ ligatures",
    "<|im_start|>user\nList the files.\n\n<|im_end|>\n<|im_start|>assistant\n",
    "a<|im_end|>b <|im_end|> c",
    "{\"files\": [\"a.rs\", \"b.rs\"]}\n\n\n",
    "NFD: cafe\u{301}, n\u{303}o, a e\u{301}\u{301}x; \u{301} alone",
    "",
];

/// The prompts Transformers rendered for a chat fixture suite.
fn fixture_prompts(suite: &str) -> Vec<String> {
    let suite: Value = serde_json::from_str(&read(suite)).unwrap();
    (suite["cases"].as_array().unwrap().iter())
        .map(|case| case["prompt"].as_str().unwrap().to_owned())
        .collect()
}

/// `text` as the tokenizer's normalizer sees it (NFC for Qwen).
fn normalized(tokenizer: &Tokenizer, text: &str) -> String {
    let mut normalized = NormalizedString::from(text);
    if let Some(normalizer) = tokenizer.inner().get_normalizer() {
        normalizer.normalize(&mut normalized).unwrap();
    }
    normalized.get().to_owned()
}

/// Checks the spans of `text` without added special tokens: the ids equal
/// `encode`'s; every span lies in the text on character boundaries; starts
/// and ends are nondecreasing; tokens that overlap (the pieces of one
/// character) form groups, the groups tile the text (every byte, spaces
/// included, is covered), and, when `decodes`, each group decodes to its
/// slice of the text, normalized. Returns the number of groups holding more
/// than one token.
fn check_spans(tokenizer: &Tokenizer, text: &str, decodes: bool) -> usize {
    let (ids, offsets) = tokenizer.encode_with_offsets(text, false).unwrap();
    assert_eq!(ids, tokenizer.encode(text, false).unwrap(), "{text:?}");
    assert_eq!(offsets.len(), ids.len());
    for (k, &(start, end)) in offsets.iter().enumerate() {
        assert!(start < end && end <= text.len(), "{text:?}: token {k}");
        assert!(text.is_char_boundary(start) && text.is_char_boundary(end));
    }
    for pair in offsets.windows(2) {
        let ((start, end), (next_start, next_end)) = (pair[0], pair[1]);
        assert!(start <= next_start && end <= next_end, "{text:?}: {pair:?}");
    }
    let mut shared = 0;
    let mut covered = 0;
    let mut first = 0;
    while first < offsets.len() {
        let (start, mut end) = offsets[first];
        let mut last = first + 1;
        while last < offsets.len() && offsets[last].0 < end {
            end = end.max(offsets[last].1);
            last += 1;
        }
        assert_eq!(
            start, covered,
            "{text:?}: bytes {covered}..{start} uncovered"
        );
        if decodes {
            let decoded = tokenizer.decode(&ids[first..last], false).unwrap();
            let expected = normalized(tokenizer, &text[start..end]);
            assert_eq!(decoded, expected, "{text:?}: tokens {first}..{last}");
        }
        shared += usize::from(last - first > 1);
        covered = end;
        first = last;
    }
    assert_eq!(covered, text.len(), "{text:?}: the tail is uncovered");
    shared
}

#[test]
fn smollm2_spans_tile_the_text() {
    let tokenizer = load("smollm2.tokenizer.json");
    let shared: usize = (TEXTS.iter().map(|text| check_spans(&tokenizer, text, true))).sum();
    // Byte-level BPE splits rare characters into pieces sharing a span.
    assert!(shared > 0);
    for prompt in fixture_prompts("smollm2.json") {
        check_spans(&tokenizer, &prompt, true);
    }
}

#[test]
fn qwen_spans_tile_the_text() {
    let tokenizer = load("qwen.tokenizer.json");
    let shared: usize = (TEXTS.iter().map(|text| check_spans(&tokenizer, text, true))).sum();
    assert!(shared > 0);
    for prompt in fixture_prompts("qwen3.json") {
        check_spans(&tokenizer, &prompt, true);
    }
}

#[test]
fn bytes_the_normalizer_merges_belong_to_the_token_before_them() {
    // NFC composes "e" + U+0301 into "é", which `tokenizers` aligns with
    // the "e" alone; the token's span also holds the combining mark, and
    // later spans index the original text.
    let tokenizer = load("qwen.tokenizer.json");
    let text = "cafe\u{301} ok";
    let (ids, offsets) = tokenizer.encode_with_offsets(text, false).unwrap();
    let e = text.find("e\u{301}").unwrap();
    let k = offsets.iter().position(|&(start, _)| start == e).unwrap();
    assert_eq!(offsets[k], (e, e + 3));
    assert_eq!(tokenizer.decode(&ids[k..=k], false).unwrap(), "é");
    assert_eq!(offsets[k + 1], (e + 3, e + 4));
    check_spans(&tokenizer, text, true);
}

#[test]
fn byte_fallback_spans_tile_the_text() {
    // Its normalizer prepends "▁" and the decoder strips it again, so the
    // groups are not decoded one by one.
    let tokenizer = load("byte_fallback.tokenizer.json");
    let shared: usize = (TEXTS
        .iter()
        .map(|text| check_spans(&tokenizer, text, false)))
    .sum();
    assert!(shared > 0);
}

#[test]
fn leading_spaces_stay_in_spans_and_added_tokens_get_empty_spans() {
    // SmolLM2's tokenizer with a post-processor that trims byte-level
    // offsets and wraps the text in <|im_start|> ... <|im_end|>.
    let mut json: Value = serde_json::from_str(&read("smollm2.tokenizer.json")).unwrap();
    json["post_processor"] = serde_json::json!({
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            {
                "type": "TemplateProcessing",
                "single": [
                    {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}
                ],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {
                    "<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]},
                    "<|im_end|>": {"id": "<|im_end|>", "ids": [2], "tokens": ["<|im_end|>"]}
                }
            }
        ]
    });
    let json = json.to_string();
    let text = "hello world";
    let world = text.find(' ').unwrap();

    // As loaded by `tokenizers`, the span of " world" loses its space.
    let raw = tokenizers::Tokenizer::from_bytes(json.as_bytes()).unwrap();
    let trimmed = raw.encode(text, true).unwrap();
    assert!(trimmed.get_offsets().contains(&(world + 1, text.len())));

    let tokenizer = Tokenizer::from_json(&json).unwrap();
    let (ids, offsets) = tokenizer.encode_with_offsets(text, true).unwrap();
    assert_eq!(ids, tokenizer.encode(text, true).unwrap());
    assert_eq!(ids, trimmed.get_ids());
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(offsets.first(), Some(&(0, 0)));
    assert_eq!(offsets.last(), Some(&(text.len(), text.len())));
    assert!(offsets.contains(&(world, text.len())), "{offsets:?}");
    // Without added tokens, the same spans minus the two empty ones.
    let (plain_ids, plain) = tokenizer.encode_with_offsets(text, false).unwrap();
    assert_eq!(plain_ids, ids[1..ids.len() - 1]);
    assert_eq!(plain, offsets[1..offsets.len() - 1]);
}

#[test]
fn a_truncated_tail_belongs_to_no_token() {
    // The tokenizer keeps 3 tokens; the last one's span is not stretched
    // over the text it never consumed.
    let mut json: Value = serde_json::from_str(&read("smollm2.tokenizer.json")).unwrap();
    json["truncation"] = serde_json::json!({
        "direction": "Right", "max_length": 3, "strategy": "LongestFirst", "stride": 0
    });
    let tokenizer = Tokenizer::from_json(&json.to_string()).unwrap();
    let text = "one two three four five";
    let (ids, offsets) = tokenizer.encode_with_offsets(text, false).unwrap();
    assert_eq!(ids, tokenizer.encode(text, false).unwrap());
    assert_eq!(offsets, [(0, 3), (3, 7), (7, 13)]);
}
