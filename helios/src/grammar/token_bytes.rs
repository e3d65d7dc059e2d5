//! The bytes each token id stands for, as the grammar engine's token trie
//! needs them, computed from the tokenizer's own decoder declaration.
//!
//! A token's bytes are its vocabulary string passed through the decoder's
//! steps one token at a time: `ByteFallback` turns `<0xHH>` into that one
//! byte (and nothing later rewrites it), `Replace` and `Metaspace` replace
//! their pattern, `ByteLevel` maps GPT-2's alphabet back to bytes (a string
//! with a character outside it keeps its UTF-8, as `tokenizers` does), and
//! `Fuse` and `Strip` act on the whole output, not on a token. A special
//! added token is `0xFF` followed by its text, the trie's special-token
//! marker. Decoding the output token by token through this table gives the
//! bytes the tokenizer's decode gives; [`check_round_trip`] proves it for
//! every id at load, because a grammar over wrong bytes allows the wrong
//! tokens (llguidance's own extraction gets SmolLM2's mixed
//! ByteFallback/ByteLevel decoder wrong: it decodes byte tokens as text
//! first, losing every byte that is not a whole character).

use serde_json::Value;

use super::GrammarError;
use crate::frontend::Tokenizer;

/// The trie's marker before a special token's text.
pub const SPECIAL_MARKER: u8 = 0xFF;

/// One step of a decoder, as far as one token is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    ByteFallback,
    Replace {
        pattern: String,
        content: String,
    },
    ByteLevel,
    /// Acts on the whole output only (`Fuse`, `Strip`).
    Whole,
}

/// The per-token steps of a decoder declaration (`tokenizer.json`'s
/// `decoder`); a decoder this table cannot follow is an error.
fn steps(decoder: &Value, out: &mut Vec<Step>) -> Result<(), GrammarError> {
    let unsupported = |kind: &str| GrammarError::UnsupportedDecoder {
        kind: kind.to_owned(),
    };
    if decoder.is_null() {
        return Ok(());
    }
    match decoder.get("type").and_then(Value::as_str) {
        Some("Sequence") => {
            let decoders = decoder.get("decoders").and_then(Value::as_array);
            for decoder in decoders.ok_or_else(|| unsupported("Sequence"))? {
                steps(decoder, out)?;
            }
        }
        Some("ByteFallback") => out.push(Step::ByteFallback),
        Some("ByteLevel") => out.push(Step::ByteLevel),
        Some("Fuse" | "Strip") => out.push(Step::Whole),
        Some("Replace") => {
            let pattern = decoder.pointer("/pattern/String").and_then(Value::as_str);
            let content = decoder.get("content").and_then(Value::as_str);
            match (pattern, content) {
                (Some(pattern), Some(content)) => out.push(Step::Replace {
                    pattern: pattern.to_owned(),
                    content: content.to_owned(),
                }),
                _ => return Err(unsupported("Replace with a regex pattern")),
            }
        }
        Some("Metaspace") => {
            let replacement = decoder.get("replacement").and_then(Value::as_str);
            out.push(Step::Replace {
                pattern: replacement.unwrap_or("\u{2581}").to_owned(),
                content: " ".to_owned(),
            });
        }
        Some(other) => return Err(unsupported(other)),
        None => return Err(unsupported("(no type)")),
    }
    Ok(())
}

/// GPT-2's byte-level alphabet inverted: the byte each character stands for.
fn byte_of(c: char) -> Option<u8> {
    let code = u32::from(c);
    let printable = |byte: u32| matches!(byte, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    if code < 256 {
        return printable(code).then_some(code as u8);
    }
    // The others stand for 256 + their rank among the non-printable bytes.
    let rank = code - 256;
    (0..256u32)
        .filter(|&byte| !printable(byte))
        .nth(rank as usize)
        .map(|byte| byte as u8)
}

fn byte_fallback(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2)
        .then(|| u8::from_str_radix(hex, 16).ok())
        .flatten()
}

/// One token's bytes through `steps`.
fn token_bytes(token: &str, steps: &[Step]) -> Vec<u8> {
    let mut text = token.to_owned();
    for step in steps {
        match step {
            Step::ByteFallback => {
                if let Some(byte) = byte_fallback(&text) {
                    return vec![byte];
                }
            }
            Step::Replace { pattern, content } => text = text.replace(pattern.as_str(), content),
            Step::ByteLevel => {
                return match text.chars().map(byte_of).collect::<Option<Vec<u8>>>() {
                    Some(bytes) => bytes,
                    None => text.into_bytes(),
                }
            }
            Step::Whole => {}
        }
    }
    text.into_bytes()
}

/// Every id's bytes, `0..tokenizer.vocab_size()`; an id the tokenizer does
/// not know has none (the grammar never allows it).
pub fn vocabulary_bytes(
    tokenizer: &Tokenizer,
    tokenizer_json: &str,
) -> Result<Vec<Vec<u8>>, GrammarError> {
    let json: Value =
        serde_json::from_str(tokenizer_json).map_err(|_| GrammarError::UnsupportedDecoder {
            kind: "(tokenizer.json does not parse)".to_owned(),
        })?;
    let mut plan = Vec::new();
    steps(json.get("decoder").unwrap_or(&Value::Null), &mut plan)?;
    let inner = tokenizer.inner();
    let added = inner.get_added_tokens_decoder();
    let vocab_size = tokenizer.vocab_size();
    let mut words = vec![Vec::new(); vocab_size];
    for (id, word) in words.iter_mut().enumerate() {
        let id = id as u32;
        if let Some(token) = added.get(&id) {
            *word = if token.special {
                let mut bytes = vec![SPECIAL_MARKER];
                bytes.extend_from_slice(token.content.as_bytes());
                bytes
            } else {
                token_bytes(&token.content, &plan)
            };
        } else if let Some(token) = inner.id_to_token(id) {
            *word = token_bytes(&token, &plan);
        }
    }
    Ok(words)
}

/// Checks `words` against the tokenizer's own decoding: for every id that
/// is not special, the text a decode gives it after a plain context token
/// (so whole-output steps such as `Strip` do not act on it) is its bytes
/// read as UTF-8 (lossily, for a token that holds part of a character).
pub fn check_round_trip(tokenizer: &Tokenizer, words: &[Vec<u8>]) -> Result<(), GrammarError> {
    // A plain word, not a byte token: a decoder fuses a run of byte tokens
    // and would read the context's byte with the token's.
    let plain = |id: usize| !tokenizer.is_byte_token(id as u32);
    let context = (0..words.len())
        .find(|&id| plain(id) && (words[id] == b"a" || words[id] == b"the"))
        .or_else(|| {
            (0..words.len())
                .find(|&id| plain(id) && words[id].first().is_some_and(u8::is_ascii_alphabetic))
        })
        .ok_or(GrammarError::RoundTrip {
            id: 0,
            expected: "a plain ASCII word to decode after".to_owned(),
            decoded: String::new(),
        })? as u32;
    let before = tokenizer.decode(&[context], false)?;
    for (id, word) in words.iter().enumerate() {
        let id = id as u32;
        if word.is_empty() || word[0] == SPECIAL_MARKER || !tokenizer.knows(id) {
            continue;
        }
        let decoded = tokenizer.decode(&[context, id], false)?;
        let decoded = decoded.strip_prefix(before.as_str()).unwrap_or(&decoded);
        let expected = String::from_utf8_lossy(word);
        if decoded != expected {
            return Err(GrammarError::RoundTrip {
                id,
                expected: expected.into_owned(),
                decoded: decoded.to_owned(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_level_alphabet_inverts_gpt2s() {
        assert_eq!(byte_of('!'), Some(b'!'));
        assert_eq!(byte_of('\u{120}'), Some(b' '));
        assert_eq!(byte_of('\u{10A}'), Some(b'\n'));
        assert_eq!(byte_of('\u{100}'), Some(0));
        assert_eq!(byte_of(' '), None);
        assert_eq!(byte_fallback("<0xE4>"), Some(0xE4));
        assert_eq!(byte_fallback("<0xE4"), None);
    }

    #[test]
    fn smollm2s_mixed_decoder_keeps_fallback_bytes_whole() {
        let decoder = serde_json::json!({"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteLevel"}]});
        let mut plan = Vec::new();
        steps(&decoder, &mut plan).unwrap();
        assert_eq!(token_bytes("<0xE4>", &plan), vec![0xE4]);
        assert_eq!(token_bytes("\u{120}hello", &plan), b" hello".to_vec());
        assert_eq!(token_bytes("\u{2581}x", &plan), " x".as_bytes().to_vec());
        // A byte-level character is one byte, part of a UTF-8 sequence.
        assert_eq!(token_bytes("\u{e9}", &plan), vec![0xE9]);
    }
}
