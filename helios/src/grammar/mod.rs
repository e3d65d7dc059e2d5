//! Grammar-constrained decoding: which tokens a request may sample next.
//!
//! [`GrammarEngine`] is built once per core from its tokenizer: every id's
//! bytes ([`token_bytes`], checked against the tokenizer's own decoding at
//! load) make the token trie of `llguidance`, and the core's stop tokens are
//! the grammar's end. [`GrammarEngine::constraint`] compiles a request's
//! [`GrammarSpec`] (JSON schema, any JSON object, Lark, regex), caching the
//! compiled grammar by its text and bounding its size and compile work, and
//! returns a [`Constraint`]: the matcher of one request, which writes the
//! packed mask of the next token (`ceil(width / 32)` words, bit set =
//! allowed, the padding past the vocabulary never allowed) and advances on
//! each sampled token.

mod engine;
pub mod json_quote;
pub mod token_bytes;
mod tool_calls;

pub use engine::{Constraint, GrammarEngine, GrammarSpec, CACHE_CAPACITY, MAX_GRAMMAR_BYTES};
pub use tool_calls::{
    answer_grammar, answer_or_calls_grammar, auto_call_grammar, tool_call_grammar,
};

use crate::frontend::FrontendError;

/// Why a grammar cannot constrain decoding.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GrammarError {
    /// The tokenizer's decoder has a step token bytes cannot follow.
    #[error("the tokenizer's decoder ({kind}) is not supported for constrained decoding")]
    UnsupportedDecoder {
        /// The step.
        kind: String,
    },
    /// A token's computed bytes differ from the tokenizer's decoding.
    #[error("token {id}'s bytes {expected:?} differ from the tokenizer's decoding {decoded:?}")]
    RoundTrip {
        /// The id.
        id: u32,
        /// What the computed bytes read as.
        expected: String,
        /// What the tokenizer decodes.
        decoded: String,
    },
    /// The tokenizer failed while checking.
    #[error(transparent)]
    Frontend(#[from] FrontendError),
    /// The engine could not be built over the token trie.
    #[error("the grammar engine cannot be built: {reason}")]
    Engine {
        /// llguidance's message.
        reason: String,
    },
    /// A request's grammar is larger than the bound.
    #[error("the grammar is {bytes} bytes, more than the {limit} accepted")]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The bound.
        limit: usize,
    },
    /// A request's grammar does not compile (or exceeds the compile bounds).
    #[error("the grammar does not compile: {reason}")]
    Compile {
        /// llguidance's message.
        reason: String,
    },
    /// The matcher refused a token or failed computing a mask.
    #[error("the grammar matcher failed: {reason}")]
    Matcher {
        /// llguidance's message.
        reason: String,
    },
}
