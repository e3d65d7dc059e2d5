//! `continue_final_message`: a prompt that ends inside the final message, so
//! the model continues it instead of starting a new turn.
//!
//! Transformers appends a marker to the final message's text, renders, and
//! cuts the prompt where the marker starts (`render_jinja_template`). The same
//! steps here give the same bytes, including its fallback when the template
//! trims the message (the marker's trailing space is gone): the cut prompt is
//! then right-stripped.

use serde_json::Value;

use super::python;
use crate::frontend::error::{FrontendError, InvalidChat};

/// The marker Transformers appends (with its trailing space).
const MARKER: &str = "CONTINUE_FINAL_MESSAGE_TAG ";
/// The field of the final message that is continued.
const FIELD: &str = "content";

/// The final message's text before the marker was appended.
#[derive(Debug, Clone)]
pub(crate) struct Continuation {
    final_text: String,
}

fn invalid(reason: InvalidChat) -> FrontendError {
    FrontendError::InvalidChat { reason }
}

/// Appends the marker to `message`'s text (a copy of the conversation's last
/// message), checking what Transformers checks first.
pub(crate) fn mark(message: &mut Value, template: &str) -> Result<Continuation, FrontendError> {
    let field = || FIELD.to_owned();
    let content = match message.get_mut(FIELD) {
        None | Some(Value::Null) => {
            return Err(invalid(InvalidChat::NothingToContinue { field: field() }))
        }
        Some(content) => content,
    };
    if !template.contains(FIELD) {
        return Err(invalid(InvalidChat::FieldNotInTemplate { field: field() }));
    }
    let text = match content {
        Value::String(text) => text,
        // The last content block with a `text` key is continued; Python's
        // `"text" in block` also holds for a string block containing "text",
        // which then fails as this does.
        Value::Array(blocks) => {
            let block = blocks.iter_mut().rev().find(|block| match block {
                Value::Object(map) => map.contains_key("text"),
                Value::String(text) => text.contains("text"),
                _ => false,
            });
            match block.and_then(|block| block.get_mut("text")) {
                Some(Value::String(text)) => text,
                _ => return Err(invalid(InvalidChat::NoTextToContinue { field: field() })),
            }
        }
        _ => return Err(invalid(InvalidChat::NoTextToContinue { field: field() })),
    };
    let final_text = text.clone();
    text.push_str(MARKER);
    Ok(Continuation { final_text })
}

/// Cuts the rendered prompt where the marker starts.
pub(crate) fn cut(rendered: String, continuation: &Continuation) -> Result<String, FrontendError> {
    let marker = MARKER.trim_end();
    let final_text = python::strip(&continuation.final_text);
    if !rendered.contains(final_text) {
        return Err(invalid(InvalidChat::FinalMessageNotRendered));
    }
    let Some(at) = rendered.rfind(marker) else {
        return Err(invalid(InvalidChat::FinalMessageNotRendered));
    };
    let mut prompt = rendered;
    if prompt[at..].starts_with(MARKER) {
        prompt.truncate(at);
    } else {
        // The template trimmed the message: the marker lost its space, and
        // whatever white space preceded it is not the message's either.
        let end = python::rstrip(&prompt[..at]).len();
        prompt.truncate(end);
    }
    Ok(prompt)
}
