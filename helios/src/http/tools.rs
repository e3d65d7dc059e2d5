//! Tools and `tool_choice`, the same for every API: what reaches the
//! template, which calls the output may hold, and how they are presented.
//!
//! The semantics are the design's:
//! - `auto`: the tools render and calls are parsed (a call naming an
//!   undeclared tool is still presented: the client sees what the model did);
//! - `none`: the tools are removed from the template, and output is text;
//! - `required`: the tools render, an instruction to call one joins the
//!   system message, and the response needs a completed call to a declared
//!   tool;
//! - a named tool: only that tool renders, with no instruction, and the
//!   response needs a completed call to it;
//! - under `required` and a named tool the answer's text is not presented
//!   (reasoning and arguments are), and a call to another tool fails the
//!   response at once;
//! - `parallel_tool_calls: false` presents the first call only.
//!
//! A requirement the output does not meet is [`HttpError::ToolChoiceUnmet`]:
//! an HTTP error before the response starts, an error event after.

use serde_json::Value;

use super::error::HttpError;
use super::generation::Finish;
use crate::frontend::protocol::{
    instructed_input_showing, CustomInput, OutputEvent, OutputProtocol, ToolFormat,
    ToolInstruction, ToolSet,
};
use crate::frontend::ChatInput;

/// Which calls a response may, or must, hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No calls: the tools are not shown.
    None,
    /// At least one call to a declared tool.
    Required,
    /// A call to this tool.
    Named(String),
}

impl ToolChoice {
    /// OpenAI's `tool_choice`: `"auto"`, `"none"`, `"required"`, or a named
    /// function or custom tool (`{"type": "function", "function": {"name":
    /// ..}}`, or the Responses API's flat `{"type": "function" | "custom",
    /// "name": ..}`).
    pub fn from_openai(value: Option<&Value>) -> Result<Self, HttpError> {
        let invalid = HttpError::InvalidParameter {
            param: "tool_choice",
            reason: "must be \"auto\", \"none\", \"required\" or \
                     {\"type\": \"function\", \"function\": {\"name\": ..}}",
        };
        let Some(value) = value.filter(|value| !value.is_null()) else {
            return Ok(Self::Auto);
        };
        match value {
            Value::String(choice) => match choice.as_str() {
                "auto" => Ok(Self::Auto),
                "none" => Ok(Self::None),
                "required" => Ok(Self::Required),
                _ => Err(invalid),
            },
            Value::Object(choice)
                if matches!(
                    choice.get("type").and_then(Value::as_str),
                    Some("function" | "custom")
                ) =>
            {
                let name = (choice.get("function"))
                    .or_else(|| choice.get("custom"))
                    .and_then(|function| function.get("name"))
                    .or_else(|| choice.get("name"))
                    .and_then(Value::as_str);
                name.map(|name| Self::Named(name.to_owned())).ok_or(invalid)
            }
            _ => Err(invalid),
        }
    }

    /// Anthropic's `tool_choice` (`{"type": "auto" | "any" | "none"}` or
    /// `{"type": "tool", "name": ..}`), and whether it allows parallel calls
    /// (`disable_parallel_tool_use`).
    pub fn from_anthropic(value: Option<&Value>) -> Result<(Self, bool), HttpError> {
        let invalid = HttpError::InvalidParameter {
            param: "tool_choice",
            reason: "must be {\"type\": \"auto\" | \"any\" | \"none\"} or \
                     {\"type\": \"tool\", \"name\": ..}",
        };
        let Some(value) = value.filter(|value| !value.is_null()) else {
            return Ok((Self::Auto, true));
        };
        let parallel =
            !(value.get("disable_parallel_tool_use")).is_some_and(|v| v == &Value::Bool(true));
        let choice = match value.get("type").and_then(Value::as_str) {
            Some("auto") => Self::Auto,
            Some("any") => Self::Required,
            Some("none") => Self::None,
            Some("tool") => match value.get("name").and_then(Value::as_str) {
                Some(name) => Self::Named(name.to_owned()),
                None => return Err(invalid),
            },
            _ => return Err(invalid),
        };
        Ok((choice, parallel))
    }
}

/// Whether a tool definition (OpenAI chat shape) is `strict`.
fn is_strict(tool: &Value) -> bool {
    tool["function"]["strict"] == Value::Bool(true)
}

/// A request's tools and its choice, checked.
#[derive(Debug, Clone, Default)]
pub struct ToolRequest {
    /// Definitions in OpenAI's chat shape, as templates read them.
    definitions: Vec<Value>,
    /// The declared tools, custom ones marked (presented as functions of one
    /// string).
    declared: ToolSet,
    choice: ToolChoice,
    parallel: bool,
}

impl ToolRequest {
    /// The request with `custom` (names and input formats) marked as the
    /// custom tools among its definitions.
    pub fn with_custom(mut self, custom: Vec<(String, CustomInput)>) -> Self {
        self.declared = self.declared.with_custom(&custom);
        self
    }

    /// Whether `name` is a custom tool.
    pub fn is_custom(&self, name: &str) -> bool {
        self.declared.custom_input(name).is_some()
    }

    /// The set of `definitions`, its custom tools marked.
    fn set(&self, definitions: &[Value]) -> Option<ToolSet> {
        ToolSet::from_definitions(definitions)
            .ok()
            .map(|set| set.with_custom(self.declared.custom()))
    }

    /// Checks `definitions` (OpenAI chat shape) against `choice`.
    pub fn new(
        definitions: Vec<Value>,
        choice: ToolChoice,
        parallel: bool,
    ) -> Result<Self, HttpError> {
        let declared = ToolSet::from_definitions(&definitions)?;
        match &choice {
            ToolChoice::Required if declared.is_empty() => {
                return Err(HttpError::InvalidParameter {
                    param: "tool_choice",
                    reason: "requires a tool call, but the request declares no tools",
                })
            }
            ToolChoice::Named(name) if !declared.contains(name) => {
                return Err(HttpError::UnknownTool { name: name.clone() })
            }
            _ => {}
        }
        Ok(Self {
            definitions,
            declared,
            choice,
            parallel,
        })
    }

    /// Whether the output may hold calls.
    fn calls_allowed(&self) -> bool {
        self.choice != ToolChoice::None && !self.declared.is_empty()
    }

    /// Puts the tools the choice shows into `input`, in the form the core's
    /// protocol needs (the template's `tools`, or the server's instruction),
    /// and `required`'s instruction.
    pub fn prepare(&self, input: &mut ChatInput, protocol: &OutputProtocol) {
        let shown: Vec<&Value> = match &self.choice {
            ToolChoice::None => Vec::new(),
            ToolChoice::Named(name) => (self.definitions.iter())
                .filter(|tool| tool["function"]["name"].as_str() == Some(name.as_str()))
                .collect(),
            ToolChoice::Auto | ToolChoice::Required => self.definitions.iter().collect(),
        };
        let instructed = (protocol.tools.as_ref()).and_then(|syntax| {
            match (syntax.format, &syntax.call_start, &syntax.call_end) {
                (ToolFormat::JsonInstructed, Some(start), Some(end)) => Some((start, end)),
                _ => None,
            }
        });
        match instructed {
            // The server writes the declarations from the request's own values.
            Some((start, end)) => instructed_input_showing(input, &shown, &start.text, &end.text),
            None => input.tools = (!shown.is_empty()).then(|| shown.into_iter().cloned().collect()),
        }
        if self.choice == ToolChoice::Required {
            ToolInstruction::RequireCall.apply(input);
        }
    }

    /// The tools a call must name, and whether several calls are allowed,
    /// when `tool_choice` requires a call (`required`, or a named tool).
    pub fn required(&self) -> Option<(ToolSet, bool)> {
        match &self.choice {
            ToolChoice::Required => Some((self.declared.clone(), self.parallel)),
            ToolChoice::Named(name) => {
                let only: Vec<Value> = (self.definitions.iter())
                    .filter(|tool| tool["function"]["name"].as_str() == Some(name.as_str()))
                    .cloned()
                    .collect();
                self.set(&only).map(|set| (set, self.parallel))
            }
            _ => None,
        }
    }

    /// The tools an `auto` answer's calls are held to when its output is
    /// constrained, and whether several calls are allowed: each tool's
    /// arguments valid against its schema, or, when `loose`, the arguments
    /// of tools that are not `strict` any JSON object (for a schema the
    /// grammar engine cannot compile, which only a strict tool must).
    pub fn auto_calls(&self, loose: bool) -> Option<(ToolSet, bool)> {
        if self.choice != ToolChoice::Auto || self.declared.is_empty() {
            return None;
        }
        let held: Vec<Value> = (self.definitions.iter())
            .map(|tool| match loose && !is_strict(tool) {
                false => tool.clone(),
                true => {
                    let mut any = tool.clone();
                    any["function"]["parameters"] = serde_json::json!({"type": "object"});
                    any
                }
            })
            .collect();
        self.set(&held).map(|set| (set, self.parallel))
    }

    /// Whether a declared tool asks for `strict` arguments.
    pub fn any_strict(&self) -> bool {
        self.definitions.iter().any(is_strict)
    }

    /// Whether a declared tool does not (its arguments may be loosened).
    pub fn any_loose(&self) -> bool {
        !self.definitions.iter().all(is_strict)
    }

    /// The tools the parser reads calls to, when calls are allowed.
    pub fn parsed(&self) -> Option<ToolSet> {
        self.calls_allowed().then(|| self.declared.clone())
    }

    /// The policy that checks and presents the output's calls.
    pub fn policy(&self) -> ToolPolicy {
        ToolPolicy {
            choice: self.choice.clone(),
            declared: self.declared.clone(),
            parallel: self.parallel,
            completed: 0,
            calls: 0,
        }
    }
}

/// Checks and presents one response's output events
/// ([`ToolRequest::policy`]).
#[derive(Debug, Clone, Default)]
pub struct ToolPolicy {
    choice: ToolChoice,
    declared: ToolSet,
    parallel: bool,
    /// Presented calls that completed.
    completed: usize,
    /// Calls the output opened.
    calls: usize,
}

impl ToolPolicy {
    fn presents(&self, index: usize) -> bool {
        self.parallel || index == 0
    }

    fn must_call(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }

    /// The event as presented (`None`: not presented), or the violation it
    /// is.
    pub fn present(&mut self, event: OutputEvent) -> Result<Option<OutputEvent>, HttpError> {
        match &event {
            OutputEvent::Text(_) if self.must_call() => Ok(None),
            OutputEvent::ToolCallStart { index, name } => {
                self.calls = self.calls.max(index + 1);
                let allowed = match &self.choice {
                    ToolChoice::Named(only) => name == only,
                    ToolChoice::Required => self.declared.contains(name),
                    _ => true,
                };
                // A call that is not presented (a later one, without parallel
                // calls) cannot violate the choice.
                if !allowed && self.presents(*index) {
                    return Err(HttpError::ToolChoiceUnmet {
                        reason: format!(
                            "the model called `{name}`, which tool_choice does not allow"
                        ),
                    });
                }
                Ok(self.presents(*index).then_some(event))
            }
            OutputEvent::ToolCallArguments { index, .. } => {
                Ok(self.presents(*index).then_some(event))
            }
            OutputEvent::ToolCallEnd { index, complete } => {
                if *complete && self.presents(*index) {
                    self.completed += 1;
                }
                Ok(self.presents(*index).then_some(event))
            }
            _ => Ok(Some(event)),
        }
    }

    /// How the response ends: [`Finish::ToolCalls`] when the model ended
    /// its turn with completed calls, or the violation of a requirement.
    pub fn finish(&self, finish: Finish) -> Result<Finish, HttpError> {
        if self.must_call() && self.completed == 0 {
            let reason = match finish {
                Finish::Length => "the output limit was reached before a tool call completed",
                _ => "the model answered without calling a tool",
            };
            return Err(HttpError::ToolChoiceUnmet {
                reason: reason.to_owned(),
            });
        }
        Ok(match finish {
            Finish::Eos if self.completed > 0 => Finish::ToolCalls,
            other => other,
        })
    }
}

/// A fresh id for a tool call, `prefix` followed by 24 hex digits
/// (`call_`, `toolu_`, `fc_`).
pub fn call_id(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}{}", &id[..24])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn auto_calls_keep_schemas_and_loosen_only_tools_that_are_not_strict() {
        let mut tools = weather();
        tools[1]["function"]["strict"] = json!(true);
        tools[1]["function"]["parameters"] = json!({"type": "object", "properties": {}});
        let request = ToolRequest::new(tools.clone(), ToolChoice::Auto, false).unwrap();
        assert!(request.any_strict());
        let schemas = |loose| -> Vec<Value> {
            let (set, parallel) = request.auto_calls(loose).unwrap();
            assert!(!parallel);
            set.tools().map(|(_, schema)| schema.clone()).collect()
        };
        let declared = [&tools[0], &tools[1]].map(|t| t["function"]["parameters"].clone());
        assert_eq!(schemas(false), declared.to_vec());
        assert_eq!(
            schemas(true),
            vec![json!({"type": "object"}), declared[1].clone()]
        );
        for choice in [ToolChoice::Required, ToolChoice::None] {
            let other = ToolRequest::new(tools.clone(), choice, true).unwrap();
            assert_eq!(other.auto_calls(false), None);
        }
        assert!(request.any_loose());
        let plain = ToolRequest::new(weather(), ToolChoice::Auto, true).unwrap();
        assert!(!plain.any_strict() && plain.any_loose());
    }

    fn weather() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
            json!({"type": "function", "function": {"name": "now"}}),
        ]
    }

    fn start(index: usize, name: &str) -> OutputEvent {
        OutputEvent::ToolCallStart {
            index,
            name: name.to_owned(),
        }
    }

    fn end(index: usize) -> OutputEvent {
        OutputEvent::ToolCallEnd {
            index,
            complete: true,
        }
    }

    #[test]
    fn a_named_tool_must_be_declared_and_required_needs_tools() {
        let error = ToolRequest::new(weather(), ToolChoice::Named("x".into()), true).unwrap_err();
        assert!(matches!(error, HttpError::UnknownTool { .. }), "{error}");
        let error = ToolRequest::new(Vec::new(), ToolChoice::Required, true).unwrap_err();
        assert_eq!(error.param().as_deref(), Some("tool_choice"));
        assert!(ToolRequest::new(Vec::new(), ToolChoice::None, true).is_ok());
    }

    #[test]
    fn the_choice_decides_what_the_template_sees() {
        let protocol = OutputProtocol::default();
        let mut input = ChatInput {
            messages: vec![json!({"role": "user", "content": "hi"})],
            ..ChatInput::default()
        };
        let named = ToolRequest::new(weather(), ToolChoice::Named("now".into()), true).unwrap();
        named.prepare(&mut input, &protocol);
        assert_eq!(input.tools.as_ref().map(Vec::len), Some(1));
        assert_eq!(input.messages.len(), 1, "no instruction for a named tool");
        let none = ToolRequest::new(weather(), ToolChoice::None, true).unwrap();
        none.prepare(&mut input, &protocol);
        assert_eq!(input.tools, None);
        assert!(none.parsed().is_none());
        let required = ToolRequest::new(weather(), ToolChoice::Required, true).unwrap();
        required.prepare(&mut input, &protocol);
        assert_eq!(input.tools.as_ref().map(Vec::len), Some(2));
        assert_eq!(input.messages[0]["role"], "system");
    }

    #[test]
    fn required_fails_without_a_completed_call_and_hides_text() {
        let request = ToolRequest::new(weather(), ToolChoice::Required, true).unwrap();
        let mut policy = request.policy();
        assert_eq!(
            policy.present(OutputEvent::Text("hi".into())).unwrap(),
            None
        );
        assert!(matches!(
            policy.finish(Finish::Eos),
            Err(HttpError::ToolChoiceUnmet { .. })
        ));
        assert!(policy.present(start(0, "launch")).is_err());
        let mut policy = request.policy();
        assert!(policy.present(start(0, "now")).unwrap().is_some());
        policy.present(end(0)).unwrap();
        assert_eq!(policy.finish(Finish::Eos).unwrap(), Finish::ToolCalls);
    }

    #[test]
    fn a_named_choice_refuses_another_tool_and_auto_presents_unknown_ones() {
        let named = ToolRequest::new(weather(), ToolChoice::Named("now".into()), true).unwrap();
        assert!(named.policy().present(start(0, "get_weather")).is_err());
        let auto = ToolRequest::new(weather(), ToolChoice::Auto, true).unwrap();
        let mut policy = auto.policy();
        assert!(policy.present(start(0, "launch")).unwrap().is_some());
        assert_eq!(policy.finish(Finish::Length).unwrap(), Finish::Length);
        assert_eq!(
            policy.present(OutputEvent::Text("t".into())).unwrap(),
            Some(OutputEvent::Text("t".into()))
        );
    }

    #[test]
    fn a_call_that_is_not_presented_cannot_violate_the_choice() {
        let request = ToolRequest::new(weather(), ToolChoice::Named("now".into()), false).unwrap();
        let mut policy = request.policy();
        assert!(policy.present(start(0, "now")).unwrap().is_some());
        policy.present(end(0)).unwrap();
        assert_eq!(policy.present(start(1, "get_weather")).unwrap(), None);
        assert_eq!(policy.finish(Finish::Eos).unwrap(), Finish::ToolCalls);
    }

    #[test]
    fn without_parallel_calls_only_the_first_is_presented() {
        let request = ToolRequest::new(weather(), ToolChoice::Auto, false).unwrap();
        let mut policy = request.policy();
        assert!(policy.present(start(0, "now")).unwrap().is_some());
        assert!(policy.present(end(0)).unwrap().is_some());
        assert_eq!(policy.present(start(1, "now")).unwrap(), None);
        assert_eq!(policy.present(end(1)).unwrap(), None);
        assert_eq!(policy.finish(Finish::Eos).unwrap(), Finish::ToolCalls);
    }
}
