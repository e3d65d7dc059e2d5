//! A shorter road through the commonest tokenizer shape: no normalizer, GPT-2
//! byte-level pre-tokenization, a BPE model (SmolLM2's, GPT-2's).
//!
//! `tokenizers` pre-tokenizes through its general machinery: every piece is
//! a normalized string with per-character alignments, and its characters are
//! remapped one by one. On a 4,096-token prompt that is about three quarters
//! of encoding (2.1 of 2.8 ms on the development CPU; the regex engine is not
//! the cost: `onig` and `fancy-regex` encode alike). For ASCII text holding
//! no added token, this module splits the text as the GPT-2 pattern does,
//! maps each piece's bytes to the byte-level alphabet, and hands the pieces
//! to the tokenizer's own BPE model and post-processor: the same ids, as the
//! differential tests assert. Any other text, or tokenizer, takes the
//! general road.

use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{Encoding, Model, ModelWrapper, Token};

/// The GPT-2 pattern's contractions, in its order of alternatives.
const CONTRACTIONS: [&[u8]; 7] = [b"s", b"t", b"re", b"ve", b"m", b"ll", b"d"];

/// What the fast road needs of a tokenizer it serves.
#[derive(Debug, Clone)]
pub struct ByteLevelRoad {
    /// The byte-level alphabet's character for each ASCII byte.
    chars: [char; 128],
    /// The added tokens' texts: a text holding one takes the general road.
    added: Vec<String>,
}

impl ByteLevelRoad {
    /// The road for `tokenizer` when it has the shape this module handles:
    /// no normalizer (or an empty sequence), a byte-level pre-tokenizer that
    /// splits with the GPT-2 pattern and adds no prefix space, and a BPE
    /// model.
    pub fn for_tokenizer(tokenizer: &tokenizers::Tokenizer) -> Option<Self> {
        let plain = match tokenizer.get_normalizer() {
            None => true,
            Some(NormalizerWrapper::Sequence(sequence)) => sequence.as_ref().is_empty(),
            Some(_) => false,
        };
        let gpt2 = matches!(
            tokenizer.get_pre_tokenizer(),
            Some(PreTokenizerWrapper::ByteLevel(b)) if b.use_regex && !b.add_prefix_space
        );
        let bpe = matches!(tokenizer.get_model(), ModelWrapper::BPE(_));
        (plain && gpt2 && bpe).then(|| Self {
            chars: byte_level_chars(),
            added: (tokenizer.get_added_tokens_decoder().into_values())
                .map(|token| token.content)
                .filter(|content| !content.is_empty())
                .collect(),
        })
    }

    /// Ids of `text` as `tokenizer.encode_fast(text, add_special_tokens)`
    /// gives them, or `None` when `text` is not ASCII or holds an added
    /// token's text (the caller encodes it the general way).
    pub fn encode(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
        add_special_tokens: bool,
    ) -> Option<tokenizers::Result<Vec<u32>>> {
        if !text.is_ascii() || self.added.iter().any(|added| text.contains(added.as_str())) {
            return None;
        }
        Some(self.encode_ascii(tokenizer, text, add_special_tokens))
    }

    fn encode_ascii(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
        add_special_tokens: bool,
    ) -> tokenizers::Result<Vec<u32>> {
        let model = tokenizer.get_model();
        let mut tokens: Vec<Token> = Vec::with_capacity(text.len() / 3);
        let mut mapped = String::new();
        for piece in gpt2_pieces(text.as_bytes()) {
            mapped.clear();
            mapped.extend(piece.iter().map(|&byte| self.chars[usize::from(byte)]));
            tokens.extend(model.tokenize(&mapped)?);
        }
        let encoding = Encoding::from_tokens(tokens, 0);
        let encoding = tokenizer.post_process(encoding, None, add_special_tokens)?;
        Ok(encoding.get_ids().to_vec())
    }
}

/// GPT-2's byte-to-character table (its `bytes_to_unicode`), ASCII half:
/// printable bytes stand for themselves, the others for 256 + their rank.
fn byte_level_chars() -> [char; 128] {
    let mut chars = ['\0'; 128];
    let mut next = 256u32;
    for byte in 0..=255u8 {
        let printable = matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            u32::from(byte)
        } else {
            next += 1;
            next - 1
        };
        if byte < 128 {
            chars[usize::from(byte)] = char::from_u32(code).unwrap_or('\0');
        }
    }
    chars
}

/// Unicode `White_Space` within ASCII: what the pattern's `\s` matches there.
fn is_space(byte: u8) -> bool {
    matches!(byte, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ')
}

/// Neither `\s`, `\p{L}` nor `\p{N}` (ASCII).
fn is_other(byte: u8) -> bool {
    !is_space(byte) && !byte.is_ascii_alphanumeric()
}

/// The pieces of ASCII `text` under the GPT-2 pattern
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`,
/// matched leftmost-first as a backtracking engine does.
fn gpt2_pieces(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= text.len() {
            return None;
        }
        let end = piece_end(text, start);
        let piece = &text[start..end];
        start = end;
        Some(piece)
    })
}

/// Where the piece starting at `i` ends (`i < text.len()`).
fn piece_end(text: &[u8], i: usize) -> usize {
    let run = |from: usize, class: fn(u8) -> bool| {
        from + text[from..].iter().take_while(|&&b| class(b)).count()
    };
    let byte = text[i];
    if byte == b'\'' {
        let rest = &text[i + 1..];
        if let Some(suffix) = CONTRACTIONS.iter().find(|s| rest.starts_with(s)) {
            return i + 1 + suffix.len();
        }
    }
    // ` ?X+` for the letter, number and other classes, in that order.
    let classes: [fn(u8) -> bool; 3] = [
        |b| b.is_ascii_alphabetic(),
        |b| b.is_ascii_digit(),
        is_other,
    ];
    for class in classes {
        if byte == b' ' && text.get(i + 1).is_some_and(|&b| class(b)) {
            return run(i + 1, class);
        }
        if class(byte) {
            return run(i, class);
        }
    }
    // Whitespace: `\s+(?!\S)` backs off one byte before a non-space; a lone
    // space byte before one is `\s+`.
    let end = run(i, is_space);
    if end < text.len() && end - i >= 2 {
        end - 1
    } else if end < text.len() {
        i + 1
    } else {
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> Vec<&str> {
        gpt2_pieces(text.as_bytes())
            .map(|piece| std::str::from_utf8(piece).unwrap())
            .collect()
    }

    #[test]
    fn pieces_follow_the_gpt2_pattern() {
        assert_eq!(split("Hello world"), ["Hello", " world"]);
        assert_eq!(split("a   b"), ["a", "  ", " b"]);
        assert_eq!(split("a\n b"), ["a", "\n", " b"]);
        assert_eq!(split("a\tb"), ["a", "\t", "b"]);
        assert_eq!(
            split("it's x.'s 'S ''s"),
            ["it", "'s", " x", ".'", "s", " '", "S", " ''", "s"]
        );
        assert_eq!(split("x 12ab  "), ["x", " 12", "ab", "  "]);
        assert_eq!(split(" ?!  .;"), [" ?!", " ", " .;"]);
        assert_eq!(split(""), Vec::<&str>::new());
    }

    #[test]
    fn the_ascii_alphabet_is_gpt2s() {
        let chars = byte_level_chars();
        assert_eq!(chars[usize::from(b'a')], 'a');
        assert_eq!(chars[usize::from(b' ')], 'Ġ');
        assert_eq!(chars[usize::from(b'\n')], 'Ċ');
        assert_eq!(chars[0], 'Ā');
    }
}
