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
//! - under `auto`, a request declaring a `strict` tool (a custom tool with a
//!   grammar is one) is held lazily: free text until a call opens, then a
//!   valid call (only where masks apply); a custom tool's call holds its
//!   input to its grammar wherever calls are constrained;
//! - a schema with `auto` tools is the schema's answer or calls, so an
//!   agent asking for structured final output can still call its tools;
//! - a `json_schema` or `json_object` format needs masks: where the executor
//!   has none it is refused (400), since prose would come back instead;
//! - a grammar that does not compile, or is too large, is 400
//!   `invalid_grammar` naming the field.

use serde_json::{json, Value};

use super::error::HttpError;
use super::tools::ToolRequest;
use super::AppState;
use crate::grammar::{
    answer_grammar, answer_or_calls_grammar, auto_call_grammar, tool_call_grammar, GrammarError,
    GrammarSpec,
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
/// schema (`param` names the field that asked for it; with `auto` tools,
/// that answer or calls), else its calls when a tool is strict, else none.
pub fn grammar(
    state: &AppState,
    tools: &ToolRequest,
    answer: Option<&Value>,
    param: &'static str,
    starts_in_reasoning: bool,
) -> Result<Option<Grammar>, HttpError> {
    let protocol = state.frontend().protocol();
    let constrained = state.config().constrained;
    let engine = || state.frontend().grammar();
    let compile = |lark: String, param| {
        (engine()?.constraint(&GrammarSpec::Lark(lark)))
            .map(|constraint| Some(Grammar::new(constraint)))
            .map_err(|error| invalid_grammar(error, param))
    };
    if let (Some((set, parallel)), true) = (tools.required(), protocol.tools.is_some()) {
        if constrained {
            let lark = tool_call_grammar(protocol, &set, parallel, starts_in_reasoning)
                .map_err(|error| invalid_grammar(error, "tool_choice"))?;
            return compile(lark, "tool_choice");
        }
    }
    if answer.is_some() && !constrained {
        return Err(HttpError::Admission(AdmissionError::GrammarUnsupported));
    }
    if !constrained || tools.required().is_some() && answer.is_none() {
        return Ok(None);
    }
    // Under `auto`, calls follow their tools' schemas; where one that is not
    // strict does not compile, such tools' arguments are any object.
    let auto = |loose: bool| -> Result<Option<Grammar>, HttpError> {
        // No schema and no strict tool: nothing to hold (and no set to build,
        // as every plain `auto` request would).
        if answer.is_none() && !tools.any_strict() {
            return Ok(None);
        }
        let calls = tools.auto_calls(loose).filter(|_| protocol.tools.is_some());
        match (answer, calls) {
            (Some(schema), Some((set, parallel))) => {
                let lark =
                    answer_or_calls_grammar(protocol, schema, &set, parallel, starts_in_reasoning)
                        .map_err(|error| invalid_grammar(error, param))?;
                compile(lark, param)
            }
            (Some(schema), None) => {
                compile(answer_grammar(protocol, schema, starts_in_reasoning), param)
            }
            (None, Some((set, parallel))) if tools.any_strict() => {
                let lark = auto_call_grammar(protocol, &set, parallel, starts_in_reasoning)
                    .map_err(|error| invalid_grammar(error, "tools"))?;
                compile(lark, "tools")
            }
            (None, _) => Ok(None),
        }
    };
    // Loosening can only help where a tool that is not strict is called.
    auto(false).or_else(|error| match tools.auto_calls(true) {
        Some(_) if tools.any_loose() => auto(true),
        _ => Err(error),
    })
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
