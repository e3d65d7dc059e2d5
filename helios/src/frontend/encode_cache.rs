//! Reusing the tokens of a conversation's history: an agent's next turn
//! renders the whole conversation again, and encoding 32K tokens of history
//! costs far more than prefilling the few hundred it appended.
//!
//! `tokenizers` splits a text on added tokens (`<|im_start|>`, ...) before it
//! normalizes, pre-tokenizes or merges anything, and encodes the pieces
//! between them independently. So where a new text shares a byte prefix with
//! one encoded before, everything up to the end of an added token inside that
//! prefix encodes the same, and the rest can be encoded alone:
//! `encode(T) = encode(T[..c])[..k] ++ encode(T[c..])` for a cut `c` right
//! after an added token, when
//! - the added token is matched on the raw text and strips nothing on its
//!   right (`normalized`, `rstrip` false), and no added token of the
//!   tokenizer depends on its neighbours (`single_word`);
//! - the shared prefix reaches the longest added token's length past `c`, so
//!   the leftmost-longest match ending at `c` is the same in both texts;
//! - the byte at `c` is an ASCII letter or digit and the tokens on either
//!   side meet exactly at `c` in the earlier encoding: no normalizer gap or
//!   stripped whitespace moves a span across the cut;
//! - the tokenizer neither truncates nor pads, and no special tokens are
//!   added (a chat prompt holds its own).
//!
//! A tokenizer for which any of the global conditions fails is never
//! shortcut. The cache keeps the most recently used encodings.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use super::tokenizer::{ByteSpan, Tokenizer};
use super::FrontendError;

/// Encodings kept.
const ENTRIES: usize = 16;
/// A shared prefix shorter than this is not worth a lookup.
const MIN_SHARED: usize = 256;

#[derive(Debug)]
struct Entry {
    text: String,
    ids: Vec<u32>,
    spans: Vec<ByteSpan>,
    /// `(byte, tokens)`: a cut after an added token at `byte`, `tokens`
    /// tokens before it; ascending.
    cuts: Vec<(usize, usize)>,
}

/// Recent encodings of one tokenizer, and what may be reused from them.
#[derive(Debug)]
pub struct EncodeCache {
    /// The added tokens a cut may follow, or `None` when the tokenizer
    /// cannot be shortcut.
    cut_tokens: Option<Vec<u32>>,
    /// Bytes of the longest added token.
    longest_added: usize,
    entries: Mutex<VecDeque<Entry>>,
}

/// How an encoding was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reuse {
    /// Tokens taken from an earlier encoding.
    pub tokens: usize,
    /// Bytes of the text they cover.
    pub bytes: usize,
}

impl EncodeCache {
    /// A cache for `tokenizer`; it never shortcuts one that truncates, pads
    /// or has a neighbour-dependent added token.
    pub fn new(tokenizer: &Tokenizer) -> Self {
        let inner = tokenizer.inner();
        let added = inner.get_added_tokens_decoder();
        let longest_added = added.values().map(|t| t.content.len()).max().unwrap_or(0);
        let usable = inner.get_truncation().is_none()
            && inner.get_padding().is_none()
            && !added.values().any(|token| token.single_word);
        let cut_tokens = usable.then(|| {
            let mut ids: Vec<u32> = (added.iter())
                .filter(|(_, token)| {
                    !token.normalized && !token.rstrip && !token.content.is_empty()
                })
                .map(|(&id, _)| id)
                .collect();
            ids.sort_unstable();
            ids
        });
        Self {
            cut_tokens,
            longest_added,
            entries: Mutex::new(VecDeque::new()),
        }
    }

    /// Whether encodings of this tokenizer can ever be reused.
    pub fn enabled(&self) -> bool {
        self.cut_tokens.as_ref().is_some_and(|ids| !ids.is_empty())
    }

    /// `text`'s ids and untrimmed byte spans, as
    /// [`Tokenizer::encode_with_offsets`] gives them without special tokens,
    /// reusing the longest safe prefix of a recent encoding.
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
    ) -> Result<(Vec<u32>, Vec<ByteSpan>, Reuse), FrontendError> {
        let reused = self.lookup(text);
        let (cut, mut ids, mut spans) = reused.unwrap_or((0, Vec::new(), Vec::new()));
        let reuse = Reuse {
            tokens: ids.len(),
            bytes: cut,
        };
        let (rest_ids, rest_spans) = tokenizer.encode_with_offsets(&text[cut..], false)?;
        ids.extend(rest_ids);
        spans.extend(rest_spans.into_iter().map(|(s, e)| (s + cut, e + cut)));
        self.remember(tokenizer, text, &ids, &spans);
        Ok((ids, spans, reuse))
    }

    /// The reusable head of the best recent encoding: the cut byte and the
    /// ids and spans before it.
    fn lookup(&self, text: &str) -> Option<(usize, Vec<u32>, Vec<ByteSpan>)> {
        if !self.enabled() {
            return None;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let (index, cut, tokens) = (entries.iter().enumerate())
            .filter_map(|(index, entry)| {
                let shared = shared_prefix(entry.text.as_bytes(), text.as_bytes());
                if shared < MIN_SHARED {
                    return None;
                }
                let limit = shared.checked_sub(self.longest_added)?;
                let at = entry.cuts.partition_point(|&(byte, _)| byte <= limit);
                let &(cut, tokens) = entry.cuts[..at].last()?;
                Some((index, cut, tokens))
            })
            .max_by_key(|&(_, cut, _)| cut)?;
        let entry = entries.remove(index).expect("found");
        let head = (entry.ids[..tokens].to_vec(), entry.spans[..tokens].to_vec());
        entries.push_front(entry);
        Some((cut, head.0, head.1))
    }

    fn remember(&self, tokenizer: &Tokenizer, text: &str, ids: &[u32], spans: &[ByteSpan]) {
        let Some(cut_tokens) = &self.cut_tokens else {
            return;
        };
        let bytes = text.as_bytes();
        let cuts: Vec<(usize, usize)> = (1..ids.len())
            .filter(|&k| {
                let (start, end) = spans[k - 1];
                cut_tokens.binary_search(&ids[k - 1]).is_ok()
                    && spans[k].0 == end
                    && bytes.get(end).is_some_and(u8::is_ascii_alphanumeric)
                    && tokenizer.id_to_token(ids[k - 1]).map(|t| t.len()) == Some(end - start)
            })
            .map(|k| (spans[k - 1].1, k))
            .collect();
        if cuts.is_empty() {
            return;
        }
        let entry = Entry {
            text: text.to_owned(),
            ids: ids.to_vec(),
            spans: spans.to_vec(),
            cuts,
        };
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|old| old.text != entry.text);
        entries.push_front(entry);
        entries.truncate(ENTRIES);
    }
}

/// The length of `a` and `b`'s common prefix. Compared a block at a time
/// (each block one `memcmp`), then byte by byte inside the first block that
/// differs: the cache compares a long conversation with each of its entries
/// on every request.
fn shared_prefix(a: &[u8], b: &[u8]) -> usize {
    const BLOCK: usize = 64;
    let len = a.len().min(b.len());
    let mut at = 0;
    while at + BLOCK <= len && a[at..at + BLOCK] == b[at..at + BLOCK] {
        at += BLOCK;
    }
    at + (a[at..len].iter().zip(&b[at..len]))
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests {
    use super::shared_prefix;

    #[test]
    fn the_shared_prefix_is_counted_to_the_byte_across_blocks() {
        let a: Vec<u8> = (0..300u32).map(|i| (i % 251) as u8).collect();
        for cut in [0, 1, 63, 64, 65, 127, 128, 200, 299] {
            let mut b = a.clone();
            b[cut] ^= 1;
            assert_eq!(shared_prefix(&a, &b), cut, "differing at {cut}");
        }
        assert_eq!(shared_prefix(&a, &a), 300);
        assert_eq!(shared_prefix(&a[..130], &a), 130);
        assert_eq!(shared_prefix(&a, &a[..64]), 64);
        assert_eq!(shared_prefix(b"", &a), 0);
    }
}
