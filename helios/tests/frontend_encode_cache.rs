//! Reused history tokens are exactly the tokens of a full encoding: random
//! agent conversations grow turn by turn and branch from earlier turns under
//! the SmolLM2 and Qwen3 templates and tokenizers, and every prompt encoded
//! through the cache must equal a fresh encoding of the whole text, ids and
//! byte spans alike, while later turns reuse most of their history.

use std::path::PathBuf;

use helios::core::proto;
use helios::frontend::{ChatInput, EncodeCache, Frontend, SpecialTokens, Tokenizer};
use serde_json::{json, Value};

#[allow(dead_code)] // shared by the randomized tests
#[path = "rng/mod.rs"]
mod rng;
use rng::Rng;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(fixtures().join(name)).unwrap()
}

fn frontend(suite_file: &str) -> Frontend {
    let suite: Value = serde_json::from_str(&read(suite_file)).unwrap();
    let special: SpecialTokens = serde_json::from_value(suite["special_tokens"].clone()).unwrap();
    let core = proto::Frontend {
        tokenizer_json: read(suite["tokenizer"].as_str().unwrap()),
        chat_template: read(suite["template"].as_str().unwrap()),
        eos_token_ids: vec![2],
        tool_parser: proto::ToolParser::None as i32,
        reasoning_parser: proto::ReasoningParser::None as i32,
        ..proto::Frontend::default()
    };
    Frontend::new(&core, special).unwrap()
}

/// Text that stresses pre-tokenizers: words, numbers, runs of spaces and
/// newlines, accents, CJK, emoji, code, and special-token text typed by a
/// user.
fn text(rng: &mut Rng, words: u64) -> String {
    const PIECES: &[&str] = &[
        "the",
        "file",
        " ",
        "  ",
        "\n",
        "\n\n",
        "fn",
        "main()",
        "{",
        "}",
        "=>",
        "1234",
        "3.14",
        "héllo",
        "wörld",
        "東京",
        "✓",
        "🦀",
        "naïve",
        "e\u{301}",
        "'s",
        "don't",
        "<|im_end|>",
        "<|im_start|>",
        "\t",
        "ok.",
        "Path/to/x.rs",
        "—",
        "\"quoted\"",
    ];
    let mut out = String::new();
    for _ in 0..words {
        out.push_str(PIECES[rng.below(PIECES.len() as u64) as usize]);
        if rng.chance(60) {
            out.push(' ');
        }
    }
    out
}

fn tool_exchange(rng: &mut Rng, turn: usize) -> [Value; 2] {
    let id = format!("call_{turn}");
    let call = json!({"name": "read_file", "arguments": {"path": format!("src/{turn}.rs")}});
    let words = 40 + rng.below(200);
    [
        json!({"role": "assistant", "content": text(rng, 3),
               "tool_calls": [{"id": id, "type": "function", "function": call}]}),
        json!({"role": "tool", "tool_call_id": id, "content": text(rng, words)}),
    ]
}

fn input(messages: &[Value]) -> ChatInput {
    ChatInput {
        messages: messages.to_vec(),
        add_generation_prompt: true,
        ..ChatInput::default()
    }
}

/// Encodes through the cache and checks against a fresh full encoding;
/// returns the tokens reused.
fn check(frontend: &Frontend, cache: &EncodeCache, messages: &[Value]) -> (usize, usize) {
    let text = frontend
        .chat_template()
        .unwrap()
        .render(&input(messages))
        .unwrap();
    let tokenizer: &Tokenizer = frontend.tokenizer();
    let (ids, spans, reuse) = cache.encode(tokenizer, &text).unwrap();
    let (full_ids, full_spans) = tokenizer.encode_with_offsets(&text, false).unwrap();
    assert_eq!(ids, full_ids, "ids differ after reusing {reuse:?}");
    assert_eq!(spans, full_spans, "spans differ after reusing {reuse:?}");
    // The frontend's own paths agree too.
    assert_eq!(
        frontend.encode_chat(&input(messages)).unwrap().token_ids,
        full_ids
    );
    (reuse.tokens, ids.len())
}

fn conversations(suite_file: &str, seed: u64) {
    let frontend = frontend(suite_file);
    let cache = EncodeCache::new(frontend.tokenizer());
    assert!(
        cache.enabled(),
        "{suite_file}: the ChatML tokenizers can be shortcut"
    );
    let mut rng = Rng::new(seed);
    let (mut reused, mut total) = (0, 0);
    for _ in 0..3 {
        let mut messages = vec![
            json!({"role": "system", "content": text(&mut rng, 10)}),
            json!({"role": "user", "content": text(&mut rng, 30)}),
        ];
        let mut history = Vec::new();
        for turn in 0..12 {
            let (r, t) = check(&frontend, &cache, &messages);
            if turn > 1 {
                reused += r;
                total += t;
            }
            history.push(messages.clone());
            messages.extend(tool_exchange(&mut rng, turn));
        }
        // Branches from earlier turns, and a repeat of a whole prompt.
        for _ in 0..4 {
            let mut branch = history[rng.below(history.len() as u64) as usize].clone();
            branch.extend(tool_exchange(&mut rng, 99));
            check(&frontend, &cache, &branch);
        }
        check(&frontend, &cache, &messages);
    }
    assert!(
        reused * 10 > total * 7,
        "{suite_file}: later turns reused {reused} of {total} tokens"
    );
}

#[test]
fn smollm2_turns_reuse_their_history_exactly() {
    for seed in 0..4 {
        conversations("smollm2.json", seed);
    }
}

#[test]
fn qwen3_turns_reuse_their_history_exactly() {
    for seed in 10..14 {
        conversations("qwen3.json", seed);
    }
}

#[test]
fn a_tokenizer_with_a_single_word_added_token_is_never_shortcut() {
    let mut json: Value = serde_json::from_str(&read("smollm2.tokenizer.json")).unwrap();
    json["added_tokens"][0]["single_word"] = Value::Bool(true);
    let tokenizer = Tokenizer::from_json(&json.to_string()).unwrap();
    assert!(!EncodeCache::new(&tokenizer).enabled());
}

/// A SentencePiece-style tokenizer (a `Prepend("▁")` normalizer applied to
/// every piece between added tokens, byte fallback): documents that grow by
/// `<s>`-separated pieces, and branches of them, encode through the cache
/// exactly as they encode whole.
#[test]
fn a_prepending_byte_fallback_tokenizer_reuses_exactly() {
    let tokenizer = Tokenizer::from_json(&read("byte_fallback.tokenizer.json")).unwrap();
    let cache = EncodeCache::new(&tokenizer);
    assert!(cache.enabled());
    let mut rng = Rng::new(77);
    let mut reused_any = false;
    for _ in 0..4 {
        let mut document = String::new();
        let mut versions = Vec::new();
        for _ in 0..10 {
            for _ in 0..(1 + rng.below(3)) {
                document.push_str("<s>");
                let words = 20 + rng.below(60);
                document.push_str(&text(&mut rng, words));
                document.push_str("</s>");
            }
            versions.push(document.clone());
            let (ids, spans, reuse) = cache.encode(&tokenizer, &document).unwrap();
            let (full_ids, full_spans) = tokenizer.encode_with_offsets(&document, false).unwrap();
            assert_eq!(
                (ids, spans),
                (full_ids, full_spans),
                "after reusing {reuse:?}"
            );
            reused_any |= reuse.tokens > 0;
        }
        let mut branch = versions[rng.below(versions.len() as u64) as usize].clone();
        branch.push_str("<s>branch ");
        branch.push_str(&text(&mut rng, 30));
        let (ids, spans, _) = cache.encode(&tokenizer, &branch).unwrap();
        assert_eq!(
            (ids, spans),
            tokenizer.encode_with_offsets(&branch, false).unwrap()
        );
    }
    assert!(
        reused_any,
        "pieces after <s> that start with a letter are cut points"
    );
}
