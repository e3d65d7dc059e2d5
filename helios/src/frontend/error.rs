//! Why the frontend could not tokenize, detokenize or render a prompt.

/// A frontend failure: the core's assets are unusable, or a request's input
/// cannot be turned into a prompt.
///
/// Variants separate what the server maps differently: [`Self::Tokenizer`] and
/// [`Self::TemplateSyntax`] come from the core's assets (found at startup),
/// [`Self::TemplateException`] and [`Self::InvalidChat`] from a request's
/// input (HTTP 400), [`Self::TemplateRender`] from either.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrontendError {
    /// The tokenizer serialization cannot be loaded.
    #[error("cannot load the tokenizer: {source}")]
    Tokenizer {
        /// The `tokenizers` error.
        #[source]
        source: tokenizers::Error,
    },
    /// Text could not be encoded.
    #[error("cannot encode text: {source}")]
    Encode {
        /// The `tokenizers` error.
        #[source]
        source: tokenizers::Error,
    },
    /// Token ids could not be decoded.
    #[error("cannot decode token ids: {source}")]
    Decode {
        /// The `tokenizers` error.
        #[source]
        source: tokenizers::Error,
    },
    /// Constrained decoding cannot be offered over this core's tokenizer.
    #[error("constrained decoding is not available for this model: {reason}")]
    GrammarUnavailable {
        /// Why the grammar engine could not be built.
        reason: String,
    },
    /// The core's output protocol is unusable.
    #[error(transparent)]
    Protocol(#[from] super::protocol::ProtocolError),
    /// The core carries no chat template, so chat requests cannot be rendered.
    #[error("the core has no chat template")]
    NoChatTemplate,
    /// The core names a special token templates are never given.
    #[error(
        "the core names the special token `{name}`, which is not one of Transformers' \
         named special tokens (bos_token, eos_token, unk_token, sep_token, pad_token, \
         cls_token, mask_token): re-export the core"
    )]
    UnknownSpecialToken {
        /// The name.
        name: String,
    },
    /// The chat template does not parse.
    #[error("chat template syntax error: {source:#}")]
    TemplateSyntax {
        /// MiniJinja's error, with the line.
        #[source]
        source: minijinja::Error,
    },
    /// The template called `raise_exception(message)`: it rejects the
    /// conversation (for example, roles out of order).
    #[error("the chat template rejected the conversation: {message}")]
    TemplateException {
        /// The template's message, verbatim.
        message: String,
    },
    /// Rendering failed for another reason (an undefined value where one is
    /// required, a type error, a value `tojson` cannot serialize).
    #[error("cannot render the chat template: {source:#}")]
    TemplateRender {
        /// MiniJinja's error, with the line.
        #[source]
        source: minijinja::Error,
    },
    /// The conversation or its options are not acceptable, before or after
    /// rendering (the checks Transformers' `apply_chat_template` makes).
    #[error("invalid chat input: {reason}")]
    InvalidChat {
        /// What is wrong, naming the field.
        reason: InvalidChat,
    },
    /// A stop sequence is empty.
    #[error("stop sequence {index} is empty")]
    EmptyStop {
        /// Its position in the request's list.
        index: usize,
    },
}

/// Why a conversation was refused, in Transformers' terms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidChat {
    /// `messages` is empty.
    #[error("messages is empty")]
    EmptyConversation,
    /// `continue_final_message` and `add_generation_prompt` were both set.
    #[error("continue_final_message and add_generation_prompt are mutually exclusive")]
    ContinueWithGenerationPrompt,
    /// The final message has no `field` to continue (absent or null).
    #[error("continue_final_message is set but the final message has no {field:?}")]
    NothingToContinue {
        /// The message field that was to be continued.
        field: String,
    },
    /// The template never mentions the field to continue.
    #[error("continue_final_message field {field:?} does not appear in the chat template")]
    FieldNotInTemplate {
        /// The message field that was to be continued.
        field: String,
    },
    /// The final message's field is a list with no `text` block, or neither a
    /// string nor a list.
    #[error("the final message's {field:?} has no text to continue")]
    NoTextToContinue {
        /// The message field that was to be continued.
        field: String,
    },
    /// The rendered prompt does not contain the final message, so it cannot
    /// be cut at its end.
    #[error("the chat template does not render the final message, so it cannot be continued")]
    FinalMessageNotRendered,
    /// A template variable in `kwargs` is one the renderer sets itself
    /// (`messages`, `tools`, `documents`, `add_generation_prompt`).
    #[error("template variable {name:?} cannot be overridden")]
    ReservedVariable {
        /// The variable's name.
        name: String,
    },
    /// A message is not a JSON object.
    #[error("message {index} is not an object")]
    MessageNotObject {
        /// Its position in `messages`.
        index: usize,
    },
}
