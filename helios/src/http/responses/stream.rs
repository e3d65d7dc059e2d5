//! The Responses API's output items and events, made from the parser's
//! events by one state machine, streamed or not.

use axum::http::StatusCode;
use axum::response::sse::Event;
use serde_json::{json, Map, Value};

use super::super::error::HttpError;
use super::super::generation::Finish;
use super::super::sse::{StreamFormat, Usage};
use super::super::tools::call_id;
use super::super::{unix_time, AppState};
use super::custom_input::InputReader;
use crate::frontend::protocol::OutputEvent;

/// What one output item is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Message,
    /// Function call number `index` of the output; a custom tool's call
    /// when `custom`.
    Call {
        index: usize,
        call_id: String,
        name: String,
        custom: bool,
    },
}

/// One output item: its text (reasoning, answer or arguments) and status.
#[derive(Debug, Clone)]
struct Item {
    id: String,
    kind: Kind,
    text: String,
    /// A custom tool call's input, decoded from its arguments as they come.
    input: InputReader,
    /// `in_progress` until it closes, then `completed` or `incomplete`.
    status: &'static str,
}

impl Item {
    /// The item as the Responses API spells it: an item in progress has no
    /// content part yet (the stream adds it).
    fn json(&self) -> Value {
        let done = self.status != "in_progress";
        match &self.kind {
            Kind::Reasoning => {
                let content = if done {
                    json!([{"type": "reasoning_text", "text": self.text}])
                } else {
                    json!([])
                };
                json!({"type": "reasoning", "id": self.id, "summary": [], "content": content})
            }
            Kind::Message => {
                let content = if done {
                    json!([Self::text_part(&self.text)])
                } else {
                    json!([])
                };
                json!({"type": "message", "id": self.id, "status": self.status,
                    "role": "assistant", "content": content})
            }
            Kind::Call {
                call_id,
                name,
                custom: true,
                ..
            } => json!({
                "type": "custom_tool_call",
                "id": self.id,
                "call_id": call_id,
                "name": name,
                "input": self.input.decoded(),
                "status": self.status,
            }),
            Kind::Call { call_id, name, .. } => json!({
                "type": "function_call",
                "id": self.id,
                "call_id": call_id,
                "name": name,
                "arguments": self.text,
                "status": self.status,
            }),
        }
    }

    fn text_part(text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": []})
    }

    /// The content part of a reasoning or message item, with `text`.
    fn part(&self, text: &str) -> Value {
        match self.kind {
            Kind::Reasoning => json!({"type": "reasoning_text", "text": text}),
            _ => Self::text_part(text),
        }
    }
}

/// Where a finished response's conversation goes.
pub(super) struct Record {
    pub(super) state: AppState,
    /// The items that reached the model (previous ones and the input).
    pub(super) conversation: Vec<Value>,
}

/// The Responses API's output: items made from the parser's events, the
/// stream's events (when streaming), and the final response object.
pub(super) struct ResponseStream {
    /// The response object: its fixed fields, and at the end the result.
    pub(super) response: Value,
    /// Whether to build events (a non-streamed response only needs items).
    streaming: bool,
    /// The next event's `sequence_number`.
    sequence: u64,
    items: Vec<Item>,
    /// The index of the item being streamed, if any.
    open: Option<usize>,
    pub(super) record: Option<Record>,
    /// The request's custom tools, whose calls are custom tool calls.
    custom: Vec<String>,
}

impl ResponseStream {
    pub(super) fn new(response: Value, streaming: bool) -> Self {
        Self {
            response,
            streaming,
            sequence: 0,
            items: Vec::new(),
            open: None,
            record: None,
            custom: Vec::new(),
        }
    }

    /// The stream, with `names` the request's custom tools.
    pub(super) fn with_custom_tools(mut self, names: Vec<String>) -> Self {
        self.custom = names;
        self
    }

    /// One event of type `kind` with `fields`, numbered.
    fn event(&mut self, events: &mut Vec<Sent>, kind: &'static str, fields: Value) {
        if !self.streaming {
            return;
        }
        let mut data = Map::new();
        data.insert("type".to_owned(), json!(kind));
        data.insert("sequence_number".to_owned(), json!(self.sequence));
        if let Value::Object(fields) = fields {
            data.extend(fields);
        }
        self.sequence += 1;
        events.push((kind, Value::Object(data)));
    }

    /// The response object with `status` and the items so far.
    fn snapshot(&self, status: &str) -> Value {
        let mut response = self.response.clone();
        response["status"] = json!(status);
        response["output"] = self.items.iter().map(Item::json).collect();
        response
    }

    /// Makes `kind` the open item (closing another); its index.
    fn open(&mut self, kind: Kind, events: &mut Vec<Sent>) -> usize {
        if let Some(open) = self.open.filter(|&open| self.items[open].kind == kind) {
            return open;
        }
        self.close(events, "completed");
        let id = match kind {
            Kind::Reasoning => call_id("rs_"),
            Kind::Message => call_id("msg_"),
            Kind::Call { custom: true, .. } => call_id("ctc_"),
            Kind::Call { .. } => call_id("fc_"),
        };
        let index = self.items.len();
        self.items.push(Item {
            id: id.clone(),
            kind,
            text: String::new(),
            input: InputReader::default(),
            status: "in_progress",
        });
        self.open = Some(index);
        let item = self.items[index].json();
        self.event(
            events,
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        if !matches!(self.items[index].kind, Kind::Call { .. }) {
            let part = self.items[index].part("");
            self.event(
                events,
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            );
        }
        index
    }

    /// Closes the open item with `status`, if any.
    fn close(&mut self, events: &mut Vec<Sent>, status: &'static str) {
        if let Some(index) = self.open.take() {
            self.close_item(index, status, events);
        }
    }

    /// Ends item `index` (open or not) with `status`.
    fn close_item(&mut self, index: usize, status: &'static str, events: &mut Vec<Sent>) {
        if self.open == Some(index) {
            self.open = None;
        }
        if self.items[index].status != "in_progress" {
            return;
        }
        if matches!(self.items[index].kind, Kind::Call { custom: true, .. }) {
            let rest = self.items[index].input.finish();
            if !rest.is_empty() {
                self.custom_delta(index, &rest, events);
            }
        }
        let item = &mut self.items[index];
        item.status = status;
        let item = item.clone();
        let at = json!({"item_id": item.id, "output_index": index});
        let with = |extra: Value| {
            let mut fields = at.clone();
            if let (Some(fields), Value::Object(extra)) = (fields.as_object_mut(), extra) {
                fields.extend(extra);
            }
            fields
        };
        match &item.kind {
            Kind::Call { custom: true, .. } => {
                let done = with(json!({"input": item.input.decoded()}));
                self.event(events, "response.custom_tool_call_input.done", done);
            }
            Kind::Call { name, .. } => {
                let done = with(json!({"arguments": item.text, "name": name}));
                self.event(events, "response.function_call_arguments.done", done);
            }
            kind => {
                let done = if *kind == Kind::Reasoning {
                    ("response.reasoning_text.done", json!({}))
                } else {
                    ("response.output_text.done", json!({"logprobs": []}))
                };
                let mut fields = with(json!({"content_index": 0, "text": item.text}));
                if let (Some(fields), Value::Object(extra)) = (fields.as_object_mut(), done.1) {
                    fields.extend(extra);
                }
                self.event(events, done.0, fields);
                let part = with(json!({"content_index": 0, "part": item.part(&item.text)}));
                self.event(events, "response.content_part.done", part);
            }
        }
        let done = json!({"output_index": index, "item": item.json()});
        self.event(events, "response.output_item.done", done);
    }

    /// Sends `delta` of custom tool call `index`'s input.
    fn custom_delta(&mut self, index: usize, delta: &str, events: &mut Vec<Sent>) {
        let item = &self.items[index];
        let fields = json!({"item_id": item.id, "output_index": index, "delta": delta});
        self.event(events, "response.custom_tool_call_input.delta", fields);
    }

    /// Appends `delta` to item `index` and sends it.
    fn delta(&mut self, index: usize, delta: &str, events: &mut Vec<Sent>) {
        let item = &mut self.items[index];
        item.text.push_str(delta);
        if matches!(item.kind, Kind::Call { custom: true, .. }) {
            let decoded = item.input.push(delta);
            if !decoded.is_empty() {
                self.custom_delta(index, &decoded, events);
            }
            return;
        }
        let id = item.id.clone();
        let (kind, extra) = match item.kind {
            Kind::Reasoning => ("response.reasoning_text.delta", json!({"content_index": 0})),
            Kind::Message => (
                "response.output_text.delta",
                json!({"content_index": 0, "logprobs": []}),
            ),
            Kind::Call { .. } => ("response.function_call_arguments.delta", json!({})),
        };
        let mut fields = json!({"item_id": id, "output_index": index, "delta": delta});
        if let (Some(fields), Value::Object(extra)) = (fields.as_object_mut(), extra) {
            fields.extend(extra);
        }
        self.event(events, kind, fields);
    }

    /// The item of function call `index`.
    fn call_item(&self, index: usize) -> Option<usize> {
        (self.items.iter())
            .rposition(|item| matches!(item.kind, Kind::Call { index: i, .. } if i == index))
    }

    /// The final response (kept in `response`) and its closing event.
    fn complete(&mut self, finish: Finish, usage: Usage, events: &mut Vec<Sent>) {
        let truncated = finish == Finish::Length;
        self.close(events, if truncated { "incomplete" } else { "completed" });
        if self.items.is_empty() {
            self.open(Kind::Message, events);
            self.close(events, "completed");
        }
        let status = if truncated { "incomplete" } else { "completed" };
        let mut response = self.snapshot(status);
        if truncated {
            response["incomplete_details"] = json!({"reason": "max_output_tokens"});
        } else {
            response["completed_at"] = json!(unix_time());
        }
        response["usage"] = json!({
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": usage.prompt_tokens_details.cached_tokens,
                "cache_write_tokens": 0,
            },
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.total_tokens,
        });
        if let Some(record) = self.record.take() {
            let mut items = record.conversation;
            items.extend(self.items.iter().map(Item::json));
            if let Some(id) = response["id"].as_str() {
                record.state.responses().insert(id.to_owned(), items);
            }
        }
        let kind = if truncated {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.event(events, kind, json!({"response": response}));
        self.response = response;
    }
}

/// An event before it is sent: its type and its data.
type Sent = (&'static str, Value);

/// SSE events of `sent`, named by their type.
fn sse_events(sent: Vec<Sent>) -> Vec<Event> {
    (sent.into_iter())
        .map(|(kind, data)| Event::default().event(kind).data(data.to_string()))
        .collect()
}

impl ResponseStream {
    /// `response.created` and `response.in_progress`.
    fn started(&mut self) -> Vec<Sent> {
        let mut events = Vec::new();
        let response = self.snapshot("in_progress");
        let data = json!({"response": response});
        self.event(&mut events, "response.created", data.clone());
        self.event(&mut events, "response.in_progress", data);
        events
    }

    /// The events of one piece of output.
    pub(super) fn apply(&mut self, event: &OutputEvent) -> Vec<Sent> {
        let mut events = Vec::new();
        match event {
            OutputEvent::Text(text) => {
                let index = self.open(Kind::Message, &mut events);
                self.delta(index, text, &mut events);
            }
            OutputEvent::Reasoning(text) => {
                let index = self.open(Kind::Reasoning, &mut events);
                self.delta(index, text, &mut events);
            }
            OutputEvent::ToolCallStart { index, name } => {
                let kind = Kind::Call {
                    index: *index,
                    call_id: call_id("call_"),
                    name: name.clone(),
                    custom: self.custom.contains(name),
                };
                self.open(kind, &mut events);
            }
            OutputEvent::ToolCallArguments { index, delta } => {
                if let Some(item) = self.call_item(*index) {
                    self.delta(item, delta, &mut events);
                }
            }
            OutputEvent::ToolCallEnd { index, complete } => {
                if let Some(item) = self.call_item(*index) {
                    let status = if *complete { "completed" } else { "incomplete" };
                    self.close_item(item, status, &mut events);
                }
            }
        }
        events
    }

    /// The items closed and the final response, kept in `response`.
    pub(super) fn finished(&mut self, finish: Finish, usage: Usage) -> Vec<Sent> {
        let mut events = Vec::new();
        self.complete(finish, usage, &mut events);
        events
    }

    /// An `error` event with Helios's code, then `response.failed` (open
    /// items end incomplete).
    pub(super) fn failed(&mut self, error: &HttpError) -> Vec<Sent> {
        let mut events = Vec::new();
        let envelope = error.envelope().error;
        let fields = json!({
            "code": envelope.code,
            "message": envelope.message,
            "param": envelope.param,
        });
        self.event(&mut events, "error", fields);
        for item in &mut self.items {
            if item.status == "in_progress" {
                item.status = "incomplete";
            }
        }
        self.open = None;
        let mut response = self.snapshot("failed");
        // The schema's codes: the request's fault, or the server's.
        let status = error.status();
        let code = if status.is_client_error() && status != StatusCode::NOT_FOUND {
            "invalid_prompt"
        } else {
            "server_error"
        };
        response["error"] = json!({"code": code, "message": error.to_string()});
        self.event(
            &mut events,
            "response.failed",
            json!({"response": response}),
        );
        self.response = response;
        events
    }
}

impl StreamFormat for ResponseStream {
    fn start(&mut self) -> Vec<Event> {
        sse_events(self.started())
    }

    fn output(&mut self, event: &OutputEvent) -> Vec<Event> {
        sse_events(self.apply(event))
    }

    fn finish(&mut self, finish: Finish, usage: Usage) -> Vec<Event> {
        sse_events(self.finished(finish, usage))
    }

    fn error(&mut self, error: &HttpError) -> Vec<Event> {
        sse_events(self.failed(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage() -> Usage {
        Usage {
            prompt_tokens: 7,
            completion_tokens: 5,
            total_tokens: 12,
            prompt_tokens_details: super::super::sse::PromptTokensDetails { cached_tokens: 2 },
        }
    }

    /// Runs `outputs` through a stream ending with `finish`: its events'
    /// types (checking their numbering) and the final response.
    fn run(outputs: &[OutputEvent], finish: Finish, streaming: bool) -> (Vec<String>, Value) {
        let mut format = ResponseStream::new(json!({"id": "resp_1"}), streaming);
        let mut events = format.started();
        for output in outputs {
            events.extend(format.apply(output));
        }
        events.extend(format.finished(finish, usage()));
        for (position, (kind, data)) in events.iter().enumerate() {
            assert_eq!(data["type"], *kind);
            assert_eq!(data["sequence_number"], position);
        }
        let kinds = events
            .into_iter()
            .map(|(kind, _)| kind.to_owned())
            .collect();
        (kinds, format.response)
    }

    #[test]
    fn output_events_become_items_in_order_the_same_streamed_or_not() {
        let outputs = [
            OutputEvent::Reasoning("think".into()),
            OutputEvent::Reasoning("ing".into()),
            OutputEvent::Text("Hello".into()),
            OutputEvent::Text(" there".into()),
            OutputEvent::ToolCallStart {
                index: 0,
                name: "now".into(),
            },
            OutputEvent::ToolCallArguments {
                index: 0,
                delta: "{\"tz\":".into(),
            },
            OutputEvent::ToolCallArguments {
                index: 0,
                delta: " \"UTC\"}".into(),
            },
            OutputEvent::ToolCallEnd {
                index: 0,
                complete: true,
            },
            OutputEvent::ToolCallStart {
                index: 1,
                name: "now".into(),
            },
            OutputEvent::ToolCallArguments {
                index: 1,
                delta: "{".into(),
            },
        ];
        let (kinds, streamed) = run(&outputs, Finish::Length, true);
        let expected = [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.incomplete",
        ];
        assert_eq!(kinds, expected);
        let (kinds, plain) = run(&outputs, Finish::Length, false);
        assert!(kinds.is_empty());
        let response = &streamed;
        assert_eq!(response["status"], "incomplete");
        assert_eq!(
            response["incomplete_details"]["reason"],
            "max_output_tokens"
        );
        assert_eq!(response["usage"]["input_tokens"], 7);
        assert_eq!(
            response["usage"]["input_tokens_details"]["cached_tokens"],
            2
        );
        assert_eq!(response["usage"]["output_tokens"], 5);
        assert_eq!(response["usage"]["total_tokens"], 12);
        let output = response["output"].as_array().unwrap();
        let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            ["reasoning", "message", "function_call", "function_call"]
        );
        assert_eq!(output[0]["content"][0]["text"], "thinking");
        assert!(output[0]["id"].as_str().unwrap().starts_with("rs_"));
        assert_eq!(output[1]["content"][0]["text"], "Hello there");
        assert_eq!(output[1]["status"], "completed");
        assert!(output[1]["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(output[2]["name"], "now");
        assert_eq!(output[2]["arguments"], "{\"tz\": \"UTC\"}");
        assert_eq!(output[2]["status"], "completed");
        assert!(output[2]["id"].as_str().unwrap().starts_with("fc_"));
        assert!(output[2]["call_id"].as_str().unwrap().starts_with("call_"));
        // The call cut by the limit is incomplete.
        assert_eq!(output[3]["arguments"], "{");
        assert_eq!(output[3]["status"], "incomplete");
        // Ids differ between the two runs; the rest is the same.
        let strip = |response: &Value| -> Vec<Value> {
            (response["output"].as_array().unwrap().iter())
                .map(|item| {
                    let mut item = item.clone();
                    item["id"] = Value::Null;
                    if item.get("call_id").is_some() {
                        item["call_id"] = Value::Null;
                    }
                    item
                })
                .collect()
        };
        assert_eq!(strip(&streamed), strip(&plain));
        assert_eq!(streamed["usage"], plain["usage"]);
    }

    #[test]
    fn an_empty_output_is_one_empty_message() {
        let (kinds, response) = run(&[], Finish::Eos, true);
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        assert_eq!(response["status"], "completed");
        assert_eq!(response["incomplete_details"], Value::Null);
        assert!(response["completed_at"].is_u64());
        assert_eq!(response["output"].as_array().unwrap().len(), 1);
        assert_eq!(response["output"][0]["type"], "message");
        assert_eq!(response["output"][0]["content"][0]["text"], "");
    }

    #[test]
    fn a_failure_ends_with_an_error_event_and_response_failed() {
        let mut format = ResponseStream::new(json!({"id": "resp_4"}), true);
        let mut events = format.started();
        events.extend(format.apply(&OutputEvent::Text("partial".into())));
        let error = HttpError::ToolChoiceUnmet {
            reason: "no call".into(),
        };
        events.extend(format.failed(&error));
        let kinds: Vec<&str> = events.iter().map(|(kind, _)| *kind).collect();
        assert_eq!(
            kinds[kinds.len() - 2..],
            ["error", "response.failed"],
            "{kinds:?}"
        );
        let (_, error_event) = &events[events.len() - 2];
        assert_eq!(error_event["code"], "tool_choice_unmet");
        assert_eq!(error_event["sequence_number"], events.len() - 2);
        let (_, failed) = &events[events.len() - 1];
        assert_eq!(failed["response"]["status"], "failed");
        assert_eq!(failed["response"]["error"]["code"], "invalid_prompt");
        assert!(failed["response"]["error"]["message"].is_string());
        assert_eq!(failed["response"]["output"][0]["status"], "incomplete");
        assert_eq!(
            failed["response"]["output"][0]["content"][0]["text"],
            "partial"
        );
        let mut format = ResponseStream::new(json!({"id": "resp_5"}), true);
        format.started();
        let failed = format.failed(&HttpError::WorkerGone);
        assert_eq!(failed[1].1["response"]["error"]["code"], "server_error");
    }

    #[test]
    fn the_stored_output_continues_the_conversation() {
        // What a stored response with a call holds translates back into the
        // assistant turn that made the call.
        let mut format = ResponseStream::new(json!({"id": "resp_3"}), false);
        format.apply(&OutputEvent::ToolCallStart {
            index: 0,
            name: "get_weather".into(),
        });
        format.apply(&OutputEvent::ToolCallArguments {
            index: 0,
            delta: "{\"city\": \"Oslo\"}".into(),
        });
        format.apply(&OutputEvent::ToolCallEnd {
            index: 0,
            complete: true,
        });
        format.finished(Finish::ToolCalls, usage());
        let call = format.response["output"][0].clone();
        assert_eq!(format.response["output"].as_array().unwrap().len(), 1);
        assert_eq!(format.response["status"], "completed");
        let call_id = call["call_id"].as_str().unwrap().to_owned();
        let mut items = vec![json!({"type": "message", "role": "user", "content": "Oslo?"})];
        items.push(call);
        items.push(json!({"type": "function_call_output", "call_id": call_id, "output": "-3"}));
        let messages = super::super::chat_messages(None, &items).unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[1]["tool_calls"][0]["id"], call_id.as_str());
        assert_eq!(
            messages[1]["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Oslo"})
        );
        assert_eq!(messages[2]["tool_call_id"], call_id.as_str());
    }
}
