//! Token byte spans of an encoding, made to cover the text.
//!
//! `tokenizers` maps each token back to the original text through the
//! normalizer's alignments. Two cases leave its spans short of what a
//! prefix cut needs:
//!
//! - tokens the post-processor adds (a BOS or EOS absent from the text) get
//!   `(0, 0)` wherever they stand, so a trailing EOS would look as if it
//!   started before every mark; each gets `(p, p)` instead, `p` being the
//!   furthest end of the tokens before it;
//! - bytes the normalizer removes or merges are in no span: NFC composes
//!   "e" + U+0301 into "é" and aligns it with the "e" alone. Such a gap is
//!   given to the tokens before it (the tokens ending where it starts, all
//!   the pieces of one character), a leading gap to the first tokens, so a
//!   token's span holds every byte it consumed and the spans cover the text.
//!   A tokenizer that truncates leaves the edges alone: there the bytes
//!   before the first token or after the last may be cut off, not merged.

use tokenizers::Encoding;

use super::ByteSpan;

/// The byte spans of `encoding`'s tokens in the `text_len`-byte text it
/// was encoded from (byte offsets, untrimmed) by a tokenizer that
/// `truncates` or not.
pub(super) fn byte_spans(encoding: &Encoding, text_len: usize, truncates: bool) -> Vec<ByteSpan> {
    let mut spans = encoding.get_offsets().to_vec();
    // `tokenizers` marks the tokens the post-processor added, and only them.
    let added: Vec<bool> = (encoding.get_special_tokens_mask().iter())
        .map(|&mask| mask == 1)
        .collect();
    let text_tokens: Vec<usize> = (0..spans.len()).filter(|&k| !added[k]).collect();
    if let Some(&first) = text_tokens.first().filter(|_| !truncates) {
        let start = spans[first].0;
        for &k in &text_tokens {
            if spans[k].0 != start {
                break;
            }
            spans[k].0 = 0;
        }
    }
    let tail = if truncates { 0 } else { text_len };
    for (position, &k) in text_tokens.iter().enumerate() {
        let next_start = match text_tokens.get(position + 1) {
            Some(&next) => spans[next].0,
            None => tail,
        };
        let end = spans[k].1;
        if end >= next_start {
            continue;
        }
        for &j in text_tokens[..=position].iter().rev() {
            if spans[j].1 != end {
                break;
            }
            spans[j].1 = next_start;
        }
    }
    let mut furthest = 0;
    for (span, added) in spans.iter_mut().zip(added) {
        if added {
            *span = (furthest, furthest);
        } else {
            furthest = furthest.max(span.1);
        }
    }
    spans
}
