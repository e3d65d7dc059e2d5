//! Message marks: where each complete message's rendering ends in a
//! rendered prompt, the byte offsets prefix checkpoints are cut at
//! (`helios::prefix::prompt_endpoints`).
//!
//! A template is a program over the whole conversation, so the renderer
//! cannot tell where a message ends from the output alone. The rule: render
//! the conversation truncated after message k, as a request holding only
//! those messages would render it (no generation prompt, no continuation,
//! the same tools, documents and kwargs). When that text is a byte prefix of
//! the full prompt, its length is message k's mark: a later request whose
//! conversation starts with these k messages renders the same bytes there.
//!
//! Message k has no mark when
//! - its truncated rendering is not a prefix of the prompt: the template
//!   renders earlier messages differently once later ones exist (Qwen3
//!   drops `reasoning_content` from assistant turns before the last user
//!   query), or the message is the one `continue_final_message` leaves open;
//! - the template rejects or fails on the truncated conversation (a template
//!   that requires a user message, for example);
//! - its mark would not be past the previous message's mark (the message
//!   rendered nothing of its own), so marks are strictly increasing.
//!
//! Marks lie on character boundaries: a prefix that is itself valid UTF-8
//! ends on one. Finding them renders the conversation once per message
//! marked: a server marks only the most recent messages
//! ([`ChatTemplate::render_with_recent_marks`]), whose endpoints are the
//! ones a later turn or branch is likely to reuse.

use minijinja::Value;

use super::{value, ChatInput, ChatTemplate};
use crate::frontend::FrontendError;

/// A rendered prompt and where each complete message's rendering ends in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedChat {
    /// The prompt text, exactly as [`ChatTemplate::render`] renders it.
    pub text: String,
    /// One entry per message of the conversation: the byte offset in `text`
    /// where the conversation truncated after that message ends, or `None`
    /// (see the module documentation for when). The `Some` entries are
    /// strictly increasing, at most `text.len()`, on character boundaries.
    pub message_ends: Vec<Option<usize>>,
}

impl RenderedChat {
    /// The marks alone, in increasing order, as
    /// `helios::prefix::prompt_endpoints` takes them.
    pub fn marks(&self) -> Vec<usize> {
        self.message_ends.iter().flatten().copied().collect()
    }
}

impl ChatTemplate {
    /// Renders `input` as [`Self::render`] does, and marks where each
    /// complete message ends in the prompt. Only the full rendering can
    /// fail; a truncated conversation the template rejects has no mark.
    pub fn render_with_marks(&self, input: &ChatInput) -> Result<RenderedChat, FrontendError> {
        self.render_with_recent_marks(input, usize::MAX)
    }

    /// [`Self::render_with_marks`] for the last `recent` messages only
    /// (earlier entries are `None`), rendering the conversation `recent`
    /// more times at most.
    pub fn render_with_recent_marks(
        &self,
        input: &ChatInput,
        recent: usize,
    ) -> Result<RenderedChat, FrontendError> {
        let text = self.render(input)?;
        let messages: Vec<Value> = input.messages.iter().map(value::from_json).collect();
        let first = messages.len().saturating_sub(recent);
        let mut previous = 0;
        let message_ends = (1..=messages.len())
            .map(|k| {
                if k <= first {
                    return None;
                }
                let context = self.context(input, messages[..k].to_vec(), false);
                let end = (self.render_context(context).ok())
                    .filter(|prefix| text.starts_with(prefix.as_str()))
                    .map(|prefix| prefix.len())
                    .filter(|&end| end > previous);
                previous = end.unwrap_or(previous);
                end
            })
            .collect();
        Ok(RenderedChat { text, message_ends })
    }
}
