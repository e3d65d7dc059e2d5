//! Text to token ids and back, with the core's Hugging Face tokenizer.

use std::str::FromStr;

use tokenizers::processors::PostProcessorWrapper;

use super::byte_level::ByteLevelRoad;
use super::offsets::byte_spans;
use super::FrontendError;

/// A token's bytes in the encoded text: `(start, end)`, end exclusive.
pub type ByteSpan = (usize, usize);

/// The core's tokenizer (a Hugging Face `tokenizers` serialization).
///
/// Encoding never adds special tokens unless asked: a chat prompt already
/// holds them as text, exactly as Transformers' `apply_chat_template` encodes
/// it (`add_special_tokens=False`). Special-token text inside the input (for
/// example a user writing `<|im_end|>`) is matched as that special token, as
/// Transformers does.
///
/// Token byte spans ([`Self::encode_with_offsets`]) are never trimmed: the
/// post-processor's `trim_offsets` (ByteLevel, RoBERTa) is switched off at
/// load time. Trimming changes no id; it only hides a token's leading space,
/// which would make a token that starts before a message mark look as if it
/// started at the mark.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Ids of the byte-fallback tokens (`<0x00>` .. `<0xFF>`), sorted.
    byte_tokens: Vec<u32>,
    /// Ids of the added tokens marked special, sorted.
    special_tokens: Vec<u32>,
    /// The byte-level fast road of [`Self::encode`], for a tokenizer of its
    /// shape.
    byte_level: Option<ByteLevelRoad>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl Tokenizer {
    /// Loads a `tokenizer.json` serialization (the core's
    /// `Frontend.tokenizer_json`).
    pub fn from_json(json: &str) -> Result<Self, FrontendError> {
        let mut inner = tokenizers::Tokenizer::from_str(json)
            .map_err(|source| FrontendError::Tokenizer { source })?;
        if let Some(mut processor) = inner.get_post_processor().cloned() {
            untrim_offsets(&mut processor);
            inner.with_post_processor(Some(processor));
        }
        // The `ByteFallback` decoder reads both spellings of the hex digits.
        let mut byte_tokens: Vec<u32> = (0..=u8::MAX)
            .flat_map(|byte| [format!("<0x{byte:02X}>"), format!("<0x{byte:02x}>")])
            .filter_map(|token| inner.token_to_id(&token))
            .collect();
        byte_tokens.sort_unstable();
        byte_tokens.dedup();
        let mut special_tokens: Vec<u32> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter_map(|(id, token)| token.special.then_some(id))
            .collect();
        special_tokens.sort_unstable();
        let byte_level = ByteLevelRoad::for_tokenizer(&inner);
        Ok(Self {
            inner,
            byte_tokens,
            special_tokens,
            byte_level,
        })
    }

    /// Token ids of `text`, with the post-processor's special tokens (a BOS,
    /// for example) only when `add_special_tokens` is set.
    ///
    /// ASCII text through a byte-level BPE tokenizer takes a shorter road to
    /// the same ids ([`super::byte_level`]; so does
    /// [`Self::encode_with_offsets`]).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, FrontendError> {
        let encoding = self.encoding(text, add_special_tokens, false)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// `text`'s encoding by the byte-level road where it applies, else by
    /// `tokenizers` (with its offsets only when `offsets` is set).
    fn encoding(
        &self,
        text: &str,
        add_special_tokens: bool,
        offsets: bool,
    ) -> Result<tokenizers::Encoding, FrontendError> {
        let fast = (self.byte_level.as_ref())
            .and_then(|road| road.encode(&self.inner, text, add_special_tokens));
        let encoding = match fast {
            Some(encoding) => encoding,
            None if offsets => self.inner.encode(text, add_special_tokens),
            None => self.inner.encode_fast(text, add_special_tokens),
        };
        encoding.map_err(|source| FrontendError::Encode { source })
    }

    /// Ids and byte spans of `text` (as [`Self::encode_with_offsets`]) through
    /// `tokenizers` alone, never the fast road: the reference the road is
    /// tested against.
    pub fn encode_general(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<(Vec<u32>, Vec<ByteSpan>), FrontendError> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|source| FrontendError::Encode { source })?;
        Ok(self.ids_and_spans(&encoding, text.len()))
    }

    /// An encoding's ids and its tokens' byte spans in the `text_len`-byte
    /// text it came from.
    fn ids_and_spans(
        &self,
        encoding: &tokenizers::Encoding,
        text_len: usize,
    ) -> (Vec<u32>, Vec<ByteSpan>) {
        let truncates = self.inner.get_truncation().is_some();
        let spans = byte_spans(encoding, text_len, truncates);
        (encoding.get_ids().to_vec(), spans)
    }

    /// Whether [`Self::encode`] has the byte-level fast road for this
    /// tokenizer's shape.
    pub fn has_byte_level_road(&self) -> bool {
        self.byte_level.is_some()
    }

    /// Token ids of `text`, as [`Self::encode`] gives them, and each token's
    /// byte span `(start, end)` in `text` (not in the normalized text, and
    /// untrimmed: a byte-level token's leading space is inside its span).
    ///
    /// Spans are nondecreasing in both ends, lie on character boundaries
    /// and together cover every byte of `text` (when the tokenizer
    /// truncates, up to the last token), but may overlap: the tokens holding
    /// the bytes of one character (byte-level or byte-fallback pieces) all
    /// carry that character's span. Bytes the normalizer merges away (NFC
    /// composition) belong to the token before them. A token the
    /// post-processor adds (a BOS or EOS that `add_special_tokens` asks for,
    /// absent from `text`) gets the empty span `(p, p)` at its place, `p`
    /// being the furthest end of the tokens before it (0 for a leading one),
    /// so it never crosses a mark. Special tokens written in `text` itself
    /// keep their own spans.
    pub fn encode_with_offsets(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<(Vec<u32>, Vec<ByteSpan>), FrontendError> {
        let encoding = self.encoding(text, add_special_tokens, true)?;
        Ok(self.ids_and_spans(&encoding, text.len()))
    }

    /// The text of `ids`; special tokens are left out when
    /// `skip_special_tokens` is set. Incomplete UTF-8 sequences decode as
    /// U+FFFD, as in Transformers; [`super::Detokenizer`] streams without
    /// them.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, FrontendError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|source| FrontendError::Decode { source })
    }

    /// The id of a token's text (a vocabulary entry or an added token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The text of a token id, as the vocabulary spells it.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is a byte-fallback token (`<0xE4>`): the decoder joins a
    /// run of them and turns the whole run into U+FFFDs, one per byte, when
    /// the run is not valid UTF-8.
    pub fn is_byte_token(&self, id: u32) -> bool {
        self.byte_tokens.binary_search(&id).is_ok()
    }

    /// Whether `id` is a special token, which decoding can skip.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_tokens.binary_search(&id).is_ok()
    }

    /// Whether `id` has a token at all (a model's vocabulary can be padded
    /// past the tokenizer's; decoding drops such ids).
    pub fn knows(&self, id: u32) -> bool {
        self.inner.id_to_token(id).is_some()
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The underlying `tokenizers` instance.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Switches off offset trimming in a post-processor and the processors it
/// chains; ids are unaffected.
fn untrim_offsets(processor: &mut PostProcessorWrapper) {
    match processor {
        PostProcessorWrapper::ByteLevel(byte_level) => byte_level.trim_offsets = false,
        PostProcessorWrapper::Roberta(roberta) => roberta.trim_offsets = false,
        PostProcessorWrapper::Sequence(sequence) => {
            sequence.as_mut().iter_mut().for_each(untrim_offsets);
        }
        PostProcessorWrapper::Bert(_) | PostProcessorWrapper::Template(_) => {}
    }
}
