//! Incremental, UTF-8-safe decoding of generated tokens.

use super::{FrontendError, Tokenizer};

/// Turns generated token ids, fed one at a time, into text deltas.
///
/// Concatenating every delta from [`Self::push`] and the remainder from
/// [`Self::finish`] gives exactly `decode(ids)` (or, with context,
/// `decode(context ++ ids)` without `decode(context)`).
///
/// A delta is released only when the text it completes is final. A token that
/// ends inside a multi-token UTF-8 character (a byte-level BPE piece) releases
/// nothing until the character is complete, so no delta ever ends in a U+FFFD
/// standing for an incomplete sequence. Byte-fallback tokens (`<0xE4>`) are
/// held until their run ends, because the decoder validates a run as a whole
/// (a later invalid byte turns the whole run into U+FFFDs): a character spelled
/// by such a run is released with the next other token, or by
/// [`Self::finish`].
///
/// This is the prefix-offset / read-offset technique: each step decodes a
/// short window that starts at the previous release's first token, so
/// decoders that depend on a token's neighbours (SentencePiece's leading
/// space, `Strip`) see the same context the full decode does. Only the window
/// is kept, so memory does not grow with the output.
///
/// The tokenizer is passed to each call rather than held, so a detokenizer can
/// live in any task that can reach the shared frontend; pass the same one every
/// time.
#[derive(Debug, Clone)]
pub struct Detokenizer {
    /// Ids from the window's start on.
    window: Vec<u32>,
    /// Where, in `window`, the text already released ends.
    read_offset: usize,
    skip_special_tokens: bool,
}

impl Detokenizer {
    /// A detokenizer for output with no preceding context: the deltas add up
    /// to `decode(ids)`.
    pub fn new(skip_special_tokens: bool) -> Self {
        Self::with_context(&[], skip_special_tokens)
    }

    /// A detokenizer whose first tokens are decoded after `context` (the last
    /// few prompt tokens), so a SentencePiece tokenizer keeps the leading
    /// space of the first generated word. The context's own text is never
    /// released. It should end on a character boundary (a rendered prompt
    /// does), since its text is what the output's text is measured from.
    pub fn with_context(context: &[u32], skip_special_tokens: bool) -> Self {
        Self {
            window: context.to_vec(),
            read_offset: context.len(),
            skip_special_tokens,
        }
    }

    /// Adds one generated token and returns the text it completes (empty while
    /// a character or a decoder's context is incomplete).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, FrontendError> {
        // A token that decodes to nothing is left out, so it cannot seem to
        // end a run of byte-fallback tokens that the decoder sees unbroken.
        if !tokenizer.knows(id) || (self.skip_special_tokens && tokenizer.is_special(id)) {
            return Ok(String::new());
        }
        self.window.push(id);
        // A run of byte-fallback tokens is decoded as a whole, and a later
        // byte can turn text it already gave into U+FFFDs: release it only
        // once the run has ended.
        if tokenizer.is_byte_token(id) {
            return Ok(String::new());
        }
        let released = self.decode(tokenizer, &self.window[..self.read_offset])?;
        let text = self.decode(tokenizer, &self.window)?;
        // A trailing U+FFFD means the last token ends inside a character: hold
        // it until a later token completes it (or `finish` gives up on it).
        if text.len() <= released.len() || text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(String::new());
        }
        let Some(delta) = text.get(released.len()..) else {
            return Ok(String::new());
        };
        let delta = delta.to_owned();
        // The next window starts at this release's first token: the decoder
        // context the full decode would give the tokens after it.
        self.window.drain(..self.read_offset);
        self.read_offset = self.window.len();
        Ok(delta)
    }

    /// The text still held back at the end of generation: an incomplete
    /// character decodes here as U+FFFD, as the full decode does.
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, FrontendError> {
        let released = self.decode(tokenizer, &self.window[..self.read_offset])?;
        let text = self.decode(tokenizer, &self.window)?;
        self.window.drain(..self.read_offset);
        self.read_offset = self.window.len();
        Ok(match text.get(released.len()..) {
            Some(rest) if text.starts_with(&released) => rest.to_owned(),
            _ => String::new(),
        })
    }

    fn decode(&self, tokenizer: &Tokenizer, ids: &[u32]) -> Result<String, FrontendError> {
        tokenizer.decode(ids, self.skip_special_tokens)
    }
}
