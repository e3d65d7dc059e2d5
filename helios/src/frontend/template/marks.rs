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
//! ones a later turn or branch is likely to reuse; the truncated renderings
//! an earlier request made are kept (`prefix_renders.rs`), so an agent's
//! turn renders only the messages it appended.

use std::sync::Arc;

use minijinja::Value;

use super::prefix_renders::Rendering;
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
        let count = input.messages.len();
        let first = count.saturating_sub(recent);
        let keys = if first < count {
            self.prefix_renders.truncation_keys(input)
        } else {
            Vec::new()
        };
        // The template's values of the messages, made at the first miss.
        let mut messages: Option<Vec<Value>> = None;
        let mut previous = 0;
        let message_ends = (1..=count)
            .map(|k| {
                if k <= first {
                    return None;
                }
                let rendering = self.truncated(input, &mut messages, k, keys[k - 1]);
                let end = rendering
                    .filter(|prefix| text.starts_with(&**prefix))
                    .map(|prefix| prefix.len())
                    .filter(|&end| end > previous);
                previous = end.unwrap_or(previous);
                end
            })
            .collect();
        Ok(RenderedChat { text, message_ends })
    }

    /// The conversation truncated after message `k`, rendered (or kept from
    /// an earlier request under `key`; see `prefix_renders.rs`); `messages`
    /// holds the template's values of `input`'s messages once a rendering
    /// needed them.
    fn truncated(
        &self,
        input: &ChatInput,
        messages: &mut Option<Vec<Value>>,
        k: usize,
        key: u64,
    ) -> Rendering {
        if let Some(rendering) = self.prefix_renders.get(key) {
            return rendering;
        }
        let messages =
            messages.get_or_insert_with(|| input.messages.iter().map(value::from_json).collect());
        let context = self.context(input, messages[..k].to_vec(), false);
        let rendering: Rendering = self.render_context(context).ok().map(Arc::from);
        self.prefix_renders.put(key, rendering.clone());
        rendering
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use serde_json::{json, Value as Json};

    use super::*;
    use crate::frontend::SpecialTokens;

    fn fixture(name: &str) -> Json {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat");
        let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
        let suite: Json = serde_json::from_str(&read(name)).unwrap();
        json!({"template": read(suite["template"].as_str().unwrap()),
               "special_tokens": suite["special_tokens"]})
    }

    fn template(fixture: &Json) -> ChatTemplate {
        let special: SpecialTokens =
            serde_json::from_value(fixture["special_tokens"].clone()).unwrap();
        ChatTemplate::new(fixture["template"].as_str().unwrap(), special).unwrap()
    }

    /// An agent's turns: each appends a call and its result, and asks again.
    fn turns(count: usize) -> Vec<ChatInput> {
        let mut messages = vec![
            json!({"role": "system", "content": "You are a coding agent."}),
            json!({"role": "user", "content": "Find why the nightly job fails."}),
        ];
        let mut inputs = Vec::new();
        for turn in 0..count {
            inputs.push(ChatInput {
                messages: messages.clone(),
                tools: Some(vec![
                    json!({"type": "function", "function": {"name": "read_file",
                    "parameters": {"type": "object"}}}),
                ]),
                add_generation_prompt: true,
                ..ChatInput::default()
            });
            let id = format!("c{turn}");
            messages.push(json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "read_file",
                 "arguments": {"path": format!("src/f{turn}.rs")}}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": id,
                "content": format!("fn f{turn}() {{}}")}));
        }
        inputs
    }

    #[test]
    fn an_agent_turn_renders_only_the_messages_it_appended() {
        for name in ["smollm2.json", "qwen3.json"] {
            let fixture = fixture(name);
            let kept = template(&fixture);
            for (turn, input) in turns(6).iter().enumerate() {
                let before = kept.prefix_renders.misses.load(Ordering::Relaxed);
                let rendered = kept.render_with_recent_marks(input, 8).unwrap();
                let rendered_now = kept.prefix_renders.misses.load(Ordering::Relaxed) - before;
                // A fresh template renders every truncation: the same marks.
                let fresh = template(&fixture)
                    .render_with_recent_marks(input, 8)
                    .unwrap();
                assert_eq!(rendered, fresh, "{name}, turn {turn}");
                let marked = input.messages.len().min(8);
                let expected = if turn == 0 { marked } else { 2 };
                assert_eq!(rendered_now, expected, "{name}, turn {turn}");
            }
        }
    }

    #[test]
    fn a_kept_rendering_that_is_not_a_prefix_of_the_prompt_marks_nothing() {
        // Qwen3 drops reasoning from assistant turns before the last user
        // query: the truncation after the assistant turn renders it, the
        // full prompt (with a later user message) does not.
        let fixture = fixture("qwen3.json");
        let kept = template(&fixture);
        let mut messages = vec![
            json!({"role": "user", "content": "Hi"}),
            json!({"role": "assistant", "content": "Hello", "reasoning_content": "greet"}),
        ];
        let ask = |messages: &Vec<Json>| ChatInput {
            messages: messages.clone(),
            add_generation_prompt: true,
            ..ChatInput::default()
        };
        kept.render_with_recent_marks(&ask(&messages), 8).unwrap();
        messages.push(json!({"role": "user", "content": "And now?"}));
        let rendered = kept.render_with_recent_marks(&ask(&messages), 8).unwrap();
        let fresh = template(&fixture)
            .render_with_recent_marks(&ask(&messages), 8)
            .unwrap();
        assert_eq!(rendered, fresh);
        assert_eq!(rendered.message_ends[1], None, "{rendered:?}");
    }
}
