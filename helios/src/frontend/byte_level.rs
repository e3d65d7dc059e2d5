//! A shorter road through the commonest tokenizer shape: no normalizer, GPT-2
//! byte-level pre-tokenization, a BPE model (SmolLM2's, GPT-2's).
//!
//! `tokenizers` pre-tokenizes through its general machinery: every piece is
//! a normalized string with per-character alignments, and its characters are
//! remapped one by one. On a 4,096-token prompt that is about three quarters
//! of encoding (2.1 of 2.8 ms on the development CPU; the regex engine is not
//! the cost: `onig` and `fancy-regex` encode alike). For ASCII text, this
//! module splits out the added tokens (leftmost-longest, as `tokenizers`
//! does first), splits the rest as the GPT-2 pattern does, maps each piece's
//! bytes to the byte-level alphabet, and hands the pieces to the tokenizer's
//! own BPE model and post-processor: the same ids and offsets, as the
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
    /// The added tokens' texts and ids, longest first: matched in the text
    /// leftmost-longest, as `tokenizers` splits on them before anything else.
    added: Vec<(String, u32)>,
    /// Whether an added token starts with this ASCII byte.
    starts: [bool; 128],
}

impl ByteLevelRoad {
    /// The road for `tokenizer` when it has the shape this module handles:
    /// no normalizer (or an empty sequence), a byte-level pre-tokenizer that
    /// splits with the GPT-2 pattern and adds no prefix space, a BPE model,
    /// and added tokens that strip nothing around them and match anywhere
    /// (no `lstrip`, `rstrip` or `single_word`), all matched in one pass
    /// (`tokenizers` matches the `normalized` ones in a second pass, after the
    /// others: one kind alone makes the passes one).
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
        let decoder = tokenizer.get_added_tokens_decoder();
        let one_pass =
            (decoder.values()).all(|t| !t.normalized) || (decoder.values()).all(|t| t.normalized);
        let exact =
            one_pass && (decoder.values()).all(|t| !t.lstrip && !t.rstrip && !t.single_word);
        let mut added: Vec<(String, u32)> = (decoder.into_iter())
            .filter(|(_, token)| !token.content.is_empty())
            .map(|(id, token)| (token.content, id))
            .collect();
        added.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut starts = [false; 128];
        for (content, _) in &added {
            if let Some(&first) = content.as_bytes().first().filter(|b| b.is_ascii()) {
                starts[usize::from(first)] = true;
            }
        }
        (plain && gpt2 && bpe && exact).then(|| Self {
            chars: byte_level_chars(),
            added,
            starts,
        })
    }

    /// `tokenizer.encode(text, add_special_tokens)`'s encoding (ids, and
    /// offsets as byte offsets into `text`), or `None` when `text` is not
    /// ASCII (the caller encodes it the general way).
    pub fn encode(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
        add_special_tokens: bool,
    ) -> Option<tokenizers::Result<Encoding>> {
        text.is_ascii()
            .then(|| self.encode_ascii(tokenizer, text, add_special_tokens))
    }

    fn encode_ascii(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
        add_special_tokens: bool,
    ) -> tokenizers::Result<Encoding> {
        let model = tokenizer.get_model();
        let bytes = text.as_bytes();
        let mut tokens: Vec<Token> = Vec::with_capacity(text.len() / 3);
        let mut mapped = String::new();
        // The text's byte offset of each byte offset of `mapped` that starts
        // a character (the model's offsets are `mapped`'s byte offsets; a
        // byte-level character is one or two bytes long).
        let mut origin: Vec<usize> = Vec::new();
        let mut plain = |from: usize, to: usize, tokens: &mut Vec<Token>| {
            let mut start = from;
            for piece in gpt2_pieces(&bytes[from..to]) {
                mapped.clear();
                origin.clear();
                for (k, &byte) in piece.iter().enumerate() {
                    let c = self.chars[usize::from(byte)];
                    origin.resize(mapped.len() + c.len_utf8(), start + k);
                    mapped.push(c);
                }
                origin.push(start + piece.len());
                for mut token in model.tokenize(&mapped)? {
                    token.offsets = (origin[token.offsets.0], origin[token.offsets.1]);
                    tokens.push(token);
                }
                start += piece.len();
            }
            tokenizers::Result::Ok(())
        };
        let mut from = 0;
        let mut at = 0;
        while at < bytes.len() {
            let candidate = self.starts[usize::from(bytes[at])];
            let Some((content, id)) = candidate.then(|| self.added_at(&text[at..])).flatten()
            else {
                at += 1;
                continue;
            };
            plain(from, at, &mut tokens)?;
            tokens.push(Token::new(id, content.to_owned(), (at, at + content.len())));
            at += content.len();
            from = at;
        }
        plain(from, bytes.len(), &mut tokens)?;
        tokenizer.post_process(Encoding::from_tokens(tokens, 0), None, add_special_tokens)
    }

    /// The longest added token `rest` starts with.
    fn added_at(&self, rest: &str) -> Option<(&str, u32)> {
        (self.added.iter())
            .find(|(content, _)| rest.starts_with(content.as_str()))
            .map(|(content, id)| (content.as_str(), *id))
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
