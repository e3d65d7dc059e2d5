//! The byte-level fast road of `Tokenizer::encode` against `tokenizers` itself:
//! seeded random ASCII texts (every byte class the GPT-2 pattern tells apart,
//! contractions, whitespace runs, added tokens' texts whole and cut) give the
//! same ids and byte spans both ways, with and without special tokens;
//! tokenizers of other shapes never take the road.

#[path = "rng/mod.rs"]
mod rng;

use std::path::PathBuf;

use helios::frontend::Tokenizer;
use rng::Rng;

fn load(file: &str) -> Tokenizer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat");
    Tokenizer::from_json(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap()
}

/// Fragments the pattern distinguishes, mixed at random.
const FRAGMENTS: [&str; 24] = [
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    " \n ",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x00",
    "\x7f",
    "'s",
    "'t",
    "'re",
    "'ve",
    "'m",
    "'ll",
    "'d",
    "'S",
    "''",
    " '",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im",
];

fn random_text(rng: &mut Rng) -> String {
    let mut text = String::new();
    for _ in 0..rng.range(0, 40) {
        if rng.chance(35) {
            text.push_str(FRAGMENTS[rng.below(FRAGMENTS.len() as u64) as usize]);
            continue;
        }
        match rng.below(3) {
            0 => {
                for _ in 0..rng.range(1, 8) {
                    text.push(char::from(b'a' + rng.below(26) as u8));
                }
            }
            1 => {
                for _ in 0..rng.range(1, 5) {
                    text.push(char::from(b'0' + rng.below(10) as u8));
                }
            }
            _ => text.push(char::from(rng.below(128) as u8)),
        }
    }
    text
}

#[test]
fn the_fast_road_encodes_as_tokenizers_does() {
    let tokenizer = load("smollm2.tokenizer.json");
    assert!(tokenizer.has_byte_level_road());
    let mut rng = Rng::new(11);
    let prose = "<|im_start|>user\nThe quick brown fox's 3 jumps: 42 over\tthe lazy dog!\n\n  Isn't it?  <|im_end|>\n<|im_start|>assistant\n";
    let texts = (0..4000)
        .map(|_| random_text(&mut rng))
        .chain([prose.to_owned()]);
    for text in texts {
        for add_special in [false, true] {
            let general = tokenizer.encode_general(&text, add_special).unwrap();
            let context = format!("{text:?} (add_special_tokens {add_special})");
            assert_eq!(
                tokenizer.encode(&text, add_special).unwrap(),
                general.0,
                "{context}"
            );
            let road = tokenizer.encode_with_offsets(&text, add_special).unwrap();
            assert_eq!(road, general, "{context}");
        }
    }
}

#[test]
fn other_shapes_take_the_general_road() {
    // NFC and a regex split (Qwen2-style); byte fallback without byte-level
    // pre-tokenization (Llama-style).
    for file in ["qwen.tokenizer.json", "byte_fallback.tokenizer.json"] {
        assert!(!load(file).has_byte_level_road(), "{file}");
    }
}
