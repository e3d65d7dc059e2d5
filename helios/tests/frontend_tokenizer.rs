//! Tokenizer parity with Transformers.
//!
//! `fixtures/chat/tokenizers.json` holds, for the SmolLM2 tokenizer (byte-level
//! BPE converted from the GGUF), a Qwen2-style one (NFC, regex split with
//! look-ahead, non-special added tokens) and a Llama-style byte-fallback one,
//! the ids Transformers encodes each text to (with and without special tokens)
//! and the texts it decodes them back to (with and without skipping special
//! tokens).

use std::path::PathBuf;

use helios::frontend::{FrontendError, Tokenizer};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
}

fn suite() -> Value {
    let text = std::fs::read_to_string(fixtures().join("tokenizers.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn load(file: &str) -> Tokenizer {
    Tokenizer::from_json(&std::fs::read_to_string(fixtures().join(file)).unwrap()).unwrap()
}

#[test]
fn encode_and_decode_match_transformers() {
    let suite = suite();
    let tokenizers = suite["tokenizers"].as_object().unwrap();
    assert_eq!(tokenizers.len(), 3);
    for (name, entry) in tokenizers {
        let tokenizer = load(entry["file"].as_str().unwrap());
        for case in entry["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let add_special = case["add_special_tokens"].as_bool().unwrap();
            let expected: Vec<u32> = serde_json::from_value(case["token_ids"].clone()).unwrap();
            let ids = tokenizer.encode(text, add_special).unwrap();
            assert_eq!(
                ids, expected,
                "{name}: encode {text:?} (special: {add_special})"
            );
            assert_eq!(
                tokenizer.decode(&ids, false).unwrap(),
                case["decoded"].as_str().unwrap(),
                "{name}: decode {text:?}"
            );
            assert_eq!(
                tokenizer.decode(&ids, true).unwrap(),
                case["decoded_skip_special"].as_str().unwrap(),
                "{name}: decode {text:?} skipping special tokens"
            );
        }
    }
}

#[test]
fn special_token_text_is_matched_as_the_special_token() {
    let tokenizer = load("smollm2.tokenizer.json");
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    let ids = tokenizer.encode("a<|im_end|>b", false).unwrap();
    assert!(ids.contains(&im_end));
    assert_eq!(tokenizer.id_to_token(im_end).as_deref(), Some("<|im_end|>"));
    assert_eq!(tokenizer.decode(&ids, true).unwrap(), "ab");
}

#[test]
fn a_broken_serialization_is_a_tokenizer_error() {
    assert!(matches!(
        Tokenizer::from_json("{\"model\": 1}"),
        Err(FrontendError::Tokenizer { .. })
    ));
}
