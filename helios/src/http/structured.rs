//! Which grammar, if any, a request's output follows: structured output
//! (`response_format` on chat, `text.format` on Responses) and tool calls
//! that `tool_choice` requires (`required` or a named tool), which are then
//! valid by construction rather than only validated afterwards.
//!
//! Rules, each with its reason:
//! - the grammar is written in the core's output protocol: reasoning first
//!   when the protocol has it (only its close when the prompt opened it),
//!   then the answer or the calls, so the parser reads what the grammar
//!   allowed;
//! - a required or named call is constrained only where the executor
//!   applies masks; elsewhere it is validated after completion, as before
//!   (the response fails when unmet), so no request that worked is refused;
//! - under `auto`, a request declaring a `strict` tool is held lazily: free
//!   text until a call opens, then a valid call (only where masks apply);
//! - a `json_schema` or `json_object` format needs masks: where the executor
//!   has none it is refused (400), since prose would come back instead;
//! - a grammar that does not compile, or is too large, is 400
//!   `invalid_grammar` naming the field.

use serde_json::{json, Value};

use super::error::HttpError;
use super::tools::ToolRequest;
use super::AppState;
use crate::grammar::{
    answer_grammar, auto_call_grammar, tool_call_grammar, GrammarError, GrammarSpec,
};
use crate::scheduler::{AdmissionError, Grammar};

/// The JSON schema an answer must follow, from a format object: OpenAI
/// chat's `{"type": "json_schema", "json_schema": {"schema": ..}}` or the
/// Responses API's `{"type": "json_schema", "schema": ..}`,
/// `{"type": "json_object"}`, or `None` for `{"type": "text"}` and absence.
pub fn answer_schema(
    format: Option<&Value>,
    param: &'static str,
) -> Result<Option<Value>, HttpError> {
    let Some(format) = format.filter(|format| !format.is_null()) else {
        return Ok(None);
    };
    let invalid = |reason| HttpError::InvalidParameter { param, reason };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "object"}))),
        Some("json_schema") => {
            let schema = (format.pointer("/json_schema/schema"))
                .or_else(|| format.get("schema"))
                .filter(|schema| schema.is_object());
            schema
                .cloned()
                .map(Some)
                .ok_or_else(|| invalid("json_schema needs a `schema` object"))
        }
        _ => Err(invalid("must be of type text, json_object or json_schema")),
    }
}

fn invalid_grammar(error: GrammarError, param: &'static str) -> HttpError {
    HttpError::InvalidGrammar {
        param,
        reason: error.to_string(),
    }
}

/// The grammar of a request's output: its required calls, else its answer
/// schema (`param` names the field that asked for it), else none.
pub fn grammar(
    state: &AppState,
    tools: &ToolRequest,
    answer: Option<&Value>,
    param: &'static str,
    starts_in_reasoning: bool,
) -> Result<Option<Grammar>, HttpError> {
    let protocol = state.frontend().protocol();
    let constrained = state.config().constrained;
    let (lark, param) = match (tools.required(), answer) {
        (Some((set, parallel)), _) if constrained && protocol.tools.is_some() => {
            let lark = tool_call_grammar(protocol, &set, parallel, starts_in_reasoning)
                .map_err(|error| invalid_grammar(error, "tool_choice"))?;
            (lark, "tool_choice")
        }
        (None, None) => match tools.strict_auto() {
            Some((set, parallel)) if constrained && protocol.tools.is_some() => {
                let lark = auto_call_grammar(protocol, &set, parallel, starts_in_reasoning)
                    .map_err(|error| invalid_grammar(error, "tools"))?;
                (lark, "tools")
            }
            _ => return Ok(None),
        },
        (Some(_), None) => return Ok(None),
        (_, Some(_)) if !constrained => {
            return Err(HttpError::Admission(AdmissionError::GrammarUnsupported))
        }
        (_, Some(schema)) => (answer_grammar(protocol, schema, starts_in_reasoning), param),
    };
    let engine = state.frontend().grammar()?;
    let constraint = (engine.constraint(&GrammarSpec::Lark(lark)))
        .map_err(|error| invalid_grammar(error, param))?;
    Ok(Some(Grammar::new(constraint)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_name_their_schema() {
        let chat = json!({"type": "json_schema", "json_schema": {"name": "x",
            "schema": {"type": "object"}}});
        assert_eq!(
            answer_schema(Some(&chat), "response_format").unwrap(),
            Some(json!({"type": "object"}))
        );
        let flat = json!({"type": "json_schema", "name": "x", "schema": {"type": "array"}});
        assert_eq!(
            answer_schema(Some(&flat), "text.format").unwrap(),
            Some(json!({"type": "array"}))
        );
        let object = json!({"type": "json_object"});
        assert_eq!(
            answer_schema(Some(&object), "response_format").unwrap(),
            Some(json!({"type": "object"}))
        );
        assert_eq!(
            answer_schema(Some(&json!({"type": "text"})), "response_format").unwrap(),
            None
        );
        let error = answer_schema(Some(&json!({"type": "yaml"})), "response_format").unwrap_err();
        assert_eq!(error.param().as_deref(), Some("response_format"));
        let error =
            answer_schema(Some(&json!({"type": "json_schema"})), "text.format").unwrap_err();
        assert_eq!(error.param().as_deref(), Some("text.format"));
    }
}
