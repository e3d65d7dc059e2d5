//! The native frontend: prompt rendering, tokenization and output text.
//!
//! Everything here runs without Python and reproduces what Transformers does
//! with the same assets, so a prompt served by Helios has the bytes and token
//! ids the checkpoint's own tooling produces:
//!
//! - [`ChatTemplate`] renders a conversation with the core's Jinja chat
//!   template (MiniJinja, configured like Transformers' Jinja2 environment),
//!   and marks where each complete message ends ([`RenderedChat`]);
//! - [`Tokenizer`] encodes the prompt, with each token's byte span when
//!   asked, and decodes ids (Hugging Face `tokenizers`);
//! - [`Detokenizer`] turns generated ids into UTF-8-safe text deltas;
//! - [`StopMatcher`] ends the visible output at a stop sequence, across token
//!   boundaries.
//!
//! EOS and length limits are enforced from device state; [`Frontend`] exposes
//! the core's EOS ids for the request state.

mod byte_level;
mod detokenizer;
mod encode_cache;
mod error;
mod offsets;
pub mod protocol;
mod stop;
mod template;
mod tokenizer;

pub use detokenizer::Detokenizer;
pub use encode_cache::{EncodeCache, Reuse};
pub use error::{FrontendError, InvalidChat};
pub use stop::{StopMatcher, StopStep};
pub(crate) use template::json_escaped;
pub use template::{python_json, ChatInput, ChatTemplate, RenderedChat, SpecialTokens};
pub use tokenizer::{ByteSpan, Tokenizer};

use crate::core::proto;

/// A rendered and encoded chat prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatPrompt {
    /// The prompt text, as the template rendered it.
    pub text: String,
    /// Its token ids (no special tokens added beyond the text's own).
    pub token_ids: Vec<u32>,
}

/// A chat prompt with what prefix checkpoints map to token endpoints
/// (`helios::prefix::prompt_endpoints(&text, &marks(), &token_offsets)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkedChatPrompt {
    /// The prompt text, as the template rendered it.
    pub text: String,
    /// Its token ids, as [`ChatPrompt::token_ids`].
    pub token_ids: Vec<u32>,
    /// Each token's byte span in `text` ([`Tokenizer::encode_with_offsets`]).
    pub token_offsets: Vec<ByteSpan>,
    /// Where each message's rendering ends in `text`, or `None`
    /// ([`RenderedChat::message_ends`]).
    pub message_ends: Vec<Option<usize>>,
}

impl MarkedChatPrompt {
    /// The marks alone, in increasing order.
    pub fn marks(&self) -> Vec<usize> {
        self.message_ends.iter().flatten().copied().collect()
    }

    /// The exact token endpoints of the marked messages inside the prompt
    /// (the exact-cut rule of [`crate::prefix::prompt_endpoints`]): what a
    /// request offers the prefix cache. Spans that cannot be mapped offer
    /// none.
    pub fn message_endpoints(&self) -> Vec<u32> {
        crate::prefix::prompt_endpoints(&self.text, &self.marks(), &self.token_offsets)
            .map(|endpoints| endpoints.messages)
            .unwrap_or_default()
    }
}

/// The frontend assets of a core, built once at startup and shared by every
/// request.
#[derive(Debug)]
pub struct Frontend {
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    eos_token_ids: Vec<u32>,
    /// How the model writes reasoning and tool calls.
    protocol: protocol::OutputProtocol,
    /// The tokenizer's serialization, for the grammar engine.
    tokenizer_json: String,
    /// The grammar engine, built on first use (its check decodes every id).
    grammar: std::sync::OnceLock<Result<std::sync::Arc<crate::grammar::GrammarEngine>, String>>,
    /// Recent chat encodings, whose history a next turn reuses.
    encodings: EncodeCache,
}

impl Frontend {
    /// Builds the frontend of a core (`ValidCore::frontend()`), with the
    /// special tokens its template is rendered with.
    ///
    /// An empty chat template means the core serves completions only; a
    /// template that does not compile is an error here, before serving.
    pub fn new(
        frontend: &proto::Frontend,
        special_tokens: SpecialTokens,
    ) -> Result<Self, FrontendError> {
        let tokenizer = Tokenizer::from_json(&frontend.tokenizer_json)?;
        Self::with_tokenizer(frontend, tokenizer, special_tokens)
    }

    /// Builds the frontend of a core with the named special tokens its
    /// manifest carries (Transformers' `special_tokens_map`), so templates
    /// that print `bos_token` and the like render as Transformers renders
    /// them. A core without them (older exports) gets `eos_token` as the
    /// first EOS id's text and the others undefined.
    pub fn from_core(frontend: &proto::Frontend) -> Result<Self, FrontendError> {
        let tokenizer = Tokenizer::from_json(&frontend.tokenizer_json)?;
        let special_tokens = if frontend.named_special_tokens.is_empty() {
            SpecialTokens {
                eos_token: (frontend.eos_token_ids.first())
                    .and_then(|&id| tokenizer.id_to_token(id)),
                ..SpecialTokens::default()
            }
        } else {
            SpecialTokens::from_named(
                (frontend.named_special_tokens.iter())
                    .map(|token| (token.name.as_str(), token.content.as_str())),
            )?
        };
        Self::with_tokenizer(frontend, tokenizer, special_tokens)
    }

    fn with_tokenizer(
        frontend: &proto::Frontend,
        tokenizer: Tokenizer,
        special_tokens: SpecialTokens,
    ) -> Result<Self, FrontendError> {
        let chat_template = match frontend.chat_template.as_str() {
            "" => None,
            source => Some(ChatTemplate::new(source, special_tokens)?),
        };
        Ok(Self {
            encodings: EncodeCache::new(&tokenizer),
            tokenizer,
            chat_template,
            eos_token_ids: frontend.eos_token_ids.clone(),
            protocol: protocol::OutputProtocol::from_core(frontend)?,
            tokenizer_json: frontend.tokenizer_json.clone(),
            grammar: std::sync::OnceLock::new(),
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat template, or [`FrontendError::NoChatTemplate`].
    pub fn chat_template(&self) -> Result<&ChatTemplate, FrontendError> {
        self.chat_template
            .as_ref()
            .ok_or(FrontendError::NoChatTemplate)
    }

    /// The output protocol: how reasoning and tool calls are written.
    pub fn protocol(&self) -> &protocol::OutputProtocol {
        &self.protocol
    }

    /// The grammar engine over this tokenizer (built on first use): its
    /// stop tokens end a grammar, and the output protocol's marker tokens
    /// are matched by id only. Why it cannot be built, otherwise.
    pub fn grammar(&self) -> Result<&crate::grammar::GrammarEngine, FrontendError> {
        let built = self.grammar.get_or_init(|| {
            let delimiters: Vec<u32> = (self.protocol.marker_tokens().into_iter())
                .map(|(id, _)| id)
                .collect();
            crate::grammar::GrammarEngine::new(
                &self.tokenizer,
                &self.tokenizer_json,
                &self.eos_token_ids,
                self.tokenizer.vocab_size(),
                &delimiters,
            )
            .map(std::sync::Arc::new)
            .map_err(|error| error.to_string())
        });
        match built {
            Ok(engine) => Ok(engine),
            Err(reason) => Err(FrontendError::GrammarUnavailable {
                reason: reason.clone(),
            }),
        }
    }

    /// The ids that end generation.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Whether `id` ends generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_token_ids.contains(&id)
    }

    /// Renders `input` with the chat template and encodes it as Transformers'
    /// `apply_chat_template(..., tokenize=True)` does, reusing the tokens of
    /// a recent conversation it continues ([`EncodeCache`]).
    pub fn encode_chat(&self, input: &ChatInput) -> Result<ChatPrompt, FrontendError> {
        let text = self.chat_template()?.render(input)?;
        let token_ids = if self.encodings.enabled() {
            self.encodings.encode(&self.tokenizer, &text)?.0
        } else {
            self.tokenizer.encode(&text, false)?
        };
        Ok(ChatPrompt { text, token_ids })
    }

    /// [`Self::encode_chat`], with each token's byte span and each
    /// message's end mark ([`ChatTemplate::render_with_marks`]).
    pub fn encode_chat_with_marks(
        &self,
        input: &ChatInput,
    ) -> Result<MarkedChatPrompt, FrontendError> {
        self.encode_chat_with_recent_marks(input, usize::MAX)
    }

    /// [`Self::encode_chat_with_marks`] marking the last `recent` messages
    /// only ([`ChatTemplate::render_with_recent_marks`]).
    pub fn encode_chat_with_recent_marks(
        &self,
        input: &ChatInput,
        recent: usize,
    ) -> Result<MarkedChatPrompt, FrontendError> {
        let template = self.chat_template()?;
        let RenderedChat { text, message_ends } =
            template.render_with_recent_marks(input, recent)?;
        let (token_ids, token_offsets, _) = self.encodings.encode(&self.tokenizer, &text)?;
        Ok(MarkedChatPrompt {
            text,
            token_ids,
            token_offsets,
            message_ends,
        })
    }
}
