//! Chat templates rendered as Transformers' `apply_chat_template` renders them.
//!
//! The core carries the checkpoint's Jinja chat template. [`ChatTemplate`]
//! compiles it once with MiniJinja, configured like Transformers' Jinja2
//! environment, and renders conversations to the same prompt bytes; the
//! committed fixtures under `helios/tests/fixtures/chat/` prove it against
//! Transformers.

mod continuation;
mod environment;
mod json;
mod marks;
mod prefix_renders;
mod python;
mod value;

use minijinja::{Environment, ErrorKind, Value};
use serde::Deserialize;

use super::error::{FrontendError, InvalidChat};
use environment::{RaisedException, TEMPLATE_NAME};
pub(crate) use json::escaped as json_escaped;
pub use marks::RenderedChat;

/// `value` as a template's `tojson` prints it (Python's `json.dumps`
/// layout: `", "` and `": "`, non-ASCII kept), so text the server writes
/// into a prompt matches what templates write.
pub fn python_json(value: &serde_json::Value) -> String {
    json::dumps_json(value, &json::JsonStyle::default()).unwrap_or_else(|_| value.to_string())
}

/// The named special tokens Transformers passes to every template
/// (`tokenizer.special_tokens_map`): `bos_token`, `eos_token`, and so on.
/// An absent one is undefined in the template.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos_token: Option<String>,
    /// End of sequence.
    pub eos_token: Option<String>,
    /// Unknown token.
    pub unk_token: Option<String>,
    /// Separator.
    pub sep_token: Option<String>,
    /// Padding.
    pub pad_token: Option<String>,
    /// Classification.
    pub cls_token: Option<String>,
    /// Mask.
    pub mask_token: Option<String>,
}

impl SpecialTokens {
    /// The tokens of `(name, text)` pairs, as a manifest lists them; a name
    /// Transformers does not pass to templates is an error.
    pub fn from_named<'a>(
        named: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, FrontendError> {
        let mut tokens = Self::default();
        for (name, text) in named {
            let slot = match name {
                "bos_token" => &mut tokens.bos_token,
                "eos_token" => &mut tokens.eos_token,
                "unk_token" => &mut tokens.unk_token,
                "sep_token" => &mut tokens.sep_token,
                "pad_token" => &mut tokens.pad_token,
                "cls_token" => &mut tokens.cls_token,
                "mask_token" => &mut tokens.mask_token,
                _ => {
                    return Err(FrontendError::UnknownSpecialToken {
                        name: name.to_owned(),
                    })
                }
            };
            *slot = Some(text.to_owned());
        }
        Ok(tokens)
    }

    fn entries(&self) -> [(&'static str, &Option<String>); 7] {
        [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
            ("unk_token", &self.unk_token),
            ("sep_token", &self.sep_token),
            ("pad_token", &self.pad_token),
            ("cls_token", &self.cls_token),
            ("mask_token", &self.mask_token),
        ]
    }
}

/// A conversation and the options of Transformers' `apply_chat_template`.
///
/// Messages, tools and documents are JSON values as the request gave them:
/// templates read any field (`role`, `content`, `tool_calls`,
/// `reasoning_content`, ...), and `tojson` prints objects in their key order
/// (this crate builds `serde_json` with `preserve_order`, so parsing a request
/// keeps it). Integers beyond 64 bits arrive as floats.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatInput {
    /// The conversation, oldest first; each message is a JSON object.
    pub messages: Vec<serde_json::Value>,
    /// Tool definitions (JSON schemas), `None` when the request has none.
    pub tools: Option<Vec<serde_json::Value>>,
    /// Retrieval documents, `None` when the request has none.
    pub documents: Option<Vec<serde_json::Value>>,
    /// Open a new assistant turn at the end of the prompt.
    pub add_generation_prompt: bool,
    /// End the prompt inside the final message's `content`, so the model
    /// continues it (excludes `add_generation_prompt`).
    pub continue_final_message: bool,
    /// Further template variables (`enable_thinking`, ...); they override
    /// special tokens of the same name.
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

/// Variables the renderer sets itself; `kwargs` may not name them.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// A compiled chat template with the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    special_tokens: SpecialTokens,
    /// Recent truncated renderings, for message marks.
    prefix_renders: prefix_renders::PrefixRenders,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_bytes", &self.source.len())
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`; a syntax error is reported here, before serving.
    pub fn new(source: &str, special_tokens: SpecialTokens) -> Result<Self, FrontendError> {
        let env = environment::environment(source)
            .map_err(|source| FrontendError::TemplateSyntax { source })?;
        Ok(Self {
            env,
            source: source.to_owned(),
            special_tokens,
            prefix_renders: prefix_renders::PrefixRenders::default(),
        })
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The special tokens every rendering sees.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special_tokens
    }

    /// Renders the prompt text for `input`.
    pub fn render(&self, input: &ChatInput) -> Result<String, FrontendError> {
        let invalid = |reason| FrontendError::InvalidChat { reason };
        if input.messages.is_empty() {
            return Err(invalid(InvalidChat::EmptyConversation));
        }
        if input.continue_final_message && input.add_generation_prompt {
            return Err(invalid(InvalidChat::ContinueWithGenerationPrompt));
        }
        if let Some(index) = input.messages.iter().position(|m| !m.is_object()) {
            return Err(invalid(InvalidChat::MessageNotObject { index }));
        }
        if let Some(name) = RESERVED
            .iter()
            .find(|name| input.kwargs.contains_key(**name))
        {
            return Err(invalid(InvalidChat::ReservedVariable {
                name: (*name).to_owned(),
            }));
        }

        let mut messages: Vec<Value> = input.messages.iter().map(value::from_json).collect();
        let mut continuation = None;
        if input.continue_final_message {
            if let (Some(last), Some(slot)) = (input.messages.last(), messages.last_mut()) {
                let mut marked = last.clone();
                continuation = Some(continuation::mark(&mut marked, &self.source)?);
                *slot = value::from_json(&marked);
            }
        }

        let context = self.context(input, messages, input.add_generation_prompt);
        let rendered = self.render_context(context)?;
        match continuation {
            Some(continuation) => continuation::cut(rendered, &continuation),
            None => Ok(rendered),
        }
    }

    /// The template's variables: `input`'s tools, documents and kwargs with
    /// the given `messages` and `add_generation_prompt`.
    fn context(
        &self,
        input: &ChatInput,
        messages: Vec<Value>,
        add_generation_prompt: bool,
    ) -> Value {
        let list = |values: &Option<Vec<serde_json::Value>>| match values {
            Some(values) => Value::from(values.iter().map(value::from_json).collect::<Vec<_>>()),
            None => Value::from(()),
        };
        let tokens = self
            .special_tokens
            .entries()
            .into_iter()
            .filter_map(|(name, token)| Some((name.to_owned(), Value::from(token.as_deref()?))));
        let kwargs = input
            .kwargs
            .iter()
            .map(|(name, v)| (name.clone(), value::from_json(v)));
        let fixed = [
            ("messages".to_owned(), Value::from(messages)),
            ("tools".to_owned(), list(&input.tools)),
            ("documents".to_owned(), list(&input.documents)),
            (
                "add_generation_prompt".to_owned(),
                Value::from(add_generation_prompt),
            ),
        ];
        // Later entries win: kwargs override special tokens, as in Transformers.
        let mut map = std::collections::BTreeMap::new();
        map.extend(tokens.chain(kwargs).chain(fixed));
        Value::from(map)
    }

    fn render_context(&self, context: Value) -> Result<String, FrontendError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|source| FrontendError::TemplateSyntax { source })?;
        template.render(context).map_err(|source| {
            if let Some(raised) = raised_exception(&source) {
                return FrontendError::TemplateException {
                    message: raised.0.clone(),
                };
            }
            match source.kind() {
                ErrorKind::SyntaxError => FrontendError::TemplateSyntax { source },
                _ => FrontendError::TemplateRender { source },
            }
        })
    }
}

/// The `raise_exception` call in an error's source chain, if any.
fn raised_exception(error: &minijinja::Error) -> Option<&RaisedException> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(err) = current {
        if let Some(raised) = err.downcast_ref::<RaisedException>() {
            return Some(raised);
        }
        current = err.source();
    }
    None
}
