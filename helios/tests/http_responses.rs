//! OpenAI's Responses API, `POST /v1/responses`, over the test executor:
//! the fake model's tokens come back as output items, streamed as typed,
//! numbered events or not, and `previous_response_id` continues a stored
//! conversation.

mod http_support;

use axum::http::StatusCode;
use axum::response::Response;
use http_support::{assert_error, body_json, body_text, server, Options, Server, MODEL};
use serde_json::{json, Value};

async fn post(server: &Server, body: &Value) -> Response {
    server.post("/v1/responses", &body.to_string()).await
}

async fn ok(server: &Server, body: &Value) -> Value {
    let response = post(server, body).await;
    assert_eq!(response.status(), StatusCode::OK, "{body}");
    assert!(response.headers().contains_key("x-request-id"));
    body_json(response).await
}

/// The prompt the executor ran last.
fn last_prompt(server: &Server) -> Vec<u32> {
    let admissions = server.admissions.lock().unwrap();
    admissions.last().expect("one admission ran").prompt.clone()
}

/// The prompt the chat route renders for `messages` (with `extra` fields).
async fn chat_prompt(server: &Server, messages: Value, extra: Value) -> (Vec<u32>, Value) {
    let mut body = json!({"model": MODEL, "messages": messages, "max_tokens": 2});
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    let response = server.post("/v1/chat/completions", &body.to_string()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let answer = body_json(response).await;
    (last_prompt(server), answer)
}

/// `(event name, data)` of each SSE event.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|line| line.strip_prefix(name))
                    .map(|value| value.trim_start().to_owned())
                    .unwrap_or_else(|| panic!("no {name} in {block}"))
            };
            let data = serde_json::from_str(&field("data:")).unwrap();
            (field("event:"), data)
        })
        .collect()
}

/// The text of a response's message items.
fn output_text(response: &Value) -> String {
    (response["output"].as_array().unwrap().iter())
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().unwrap().iter())
        .map(|part| part["text"].as_str().unwrap().to_owned())
        .collect()
}

/// A seed whose answer to `content` ends by EOS within `max_tokens`, after
/// a few tokens.
fn eos_seed(server: &Server, content: &str, max_tokens: u32) -> u64 {
    (0..64)
        .find(|&seed| {
            let expected = server.expected(content, max_tokens, seed);
            expected.stopped_by_eos && expected.tokens.len() > 3
        })
        .expect("a seed that stops by EOS")
}

#[tokio::test]
async fn a_string_input_is_one_user_message_answered_in_a_message_item() {
    let server = server(Options {
        stop_every: Some(8),
        ..Options::default()
    });
    let seed = eos_seed(&server, "w1 w2", 40);
    let expected = server.expected("w1 w2", 40, seed);
    assert!(!expected.text.is_empty());
    let request = json!({"model": MODEL, "input": "w1 w2", "max_output_tokens": 40,
        "seed": seed, "metadata": {"k": "v"}, "user": "u1",
        "reasoning": {"effort": "low", "summary": "auto"}, "some_future_field": [1]});
    let body = ok(&server, &request).await;
    assert_eq!(body["object"], "response");
    assert!(body["id"].as_str().unwrap().starts_with("resp_"), "{body}");
    assert!(body["created_at"].is_u64());
    assert!(body["completed_at"].is_u64());
    assert_eq!(body["status"], "completed");
    assert_eq!(body["model"], MODEL);
    assert_eq!(body["error"], Value::Null);
    assert_eq!(body["incomplete_details"], Value::Null);
    let output = body["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{body}");
    let message = &output[0];
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["status"], "completed");
    assert!(message["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        message["content"],
        json!([{"type": "output_text", "text": expected.text, "annotations": []}])
    );
    let usage = &body["usage"];
    assert_eq!(usage["input_tokens"], expected.prompt_tokens);
    assert_eq!(usage["output_tokens"], expected.tokens.len());
    assert_eq!(
        usage["total_tokens"],
        expected.prompt_tokens + expected.tokens.len()
    );
    assert!(usage["input_tokens_details"]["cached_tokens"].is_u64());
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
    // The request's settings are echoed.
    assert_eq!(body["max_output_tokens"], 40);
    assert_eq!(body["tools"], json!([]));
    assert_eq!(body["tool_choice"], "auto");
    assert_eq!(body["parallel_tool_calls"], true);
    assert_eq!(body["store"], true);
    assert_eq!(body["previous_response_id"], Value::Null);
    assert_eq!(body["instructions"], Value::Null);
    assert_eq!(body["text"], json!({"format": {"type": "text"}}));
    assert_eq!(body["metadata"], json!({"k": "v"}));
    assert_eq!(body["user"], "u1");
    assert_eq!(body["truncation"], "disabled");
    assert!(body["temperature"].is_number() && body["top_p"].is_number());
}

#[tokio::test]
async fn items_and_instructions_render_as_the_chat_route_renders_them() {
    let server = server(Options::default());
    let input = json!([
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "w3"}, {"type": "input_text", "text": "w4"}]},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "w5", "annotations": []}]},
        {"role": "developer", "content": "w8"},
        {"role": "user", "content": "w6"},
    ]);
    let request = json!({"model": MODEL, "instructions": "w9", "input": input,
        "max_output_tokens": 12, "seed": 21, "temperature": 0.7, "top_p": 0.9});
    let body = ok(&server, &request).await;
    let prompt = last_prompt(&server);
    let messages = json!([
        {"role": "system", "content": "w9"},
        {"role": "user", "content": "w3\nw4"},
        {"role": "assistant", "content": "w5"},
        {"role": "system", "content": "w8"},
        {"role": "user", "content": "w6"},
    ]);
    let extra = json!({"seed": 21, "max_tokens": 12, "temperature": 0.7, "top_p": 0.9});
    let (chat, answer) = chat_prompt(&server, messages, extra).await;
    assert_eq!(prompt, chat);
    assert_eq!(body["usage"]["input_tokens"], prompt.len());
    // The same prompt, seed and sampling: the same text.
    let text = output_text(&body);
    assert!(!text.is_empty());
    assert_eq!(text, answer["choices"][0]["message"]["content"]);
    assert_eq!(body["instructions"], "w9");
    assert_eq!(body["temperature"], 0.7);
    assert_eq!(body["top_p"], 0.9);
    // Without EOS the output limit ends it.
    assert_eq!(body["status"], "incomplete");
}

#[tokio::test]
async fn a_streamed_response_is_a_numbered_event_sequence_of_the_same_response() {
    let server = server(Options {
        stop_every: Some(8),
        ..Options::default()
    });
    let seed = eos_seed(&server, "w4 w5", 40);
    let request = json!({"model": MODEL, "input": "w4 w5", "max_output_tokens": 40,
        "seed": seed, "stream": true});
    let response = post(&server, &request).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().contains_key("x-request-id"));
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let events = events(&body_text(response).await);
    for (position, (name, data)) in events.iter().enumerate() {
        assert_eq!(&data["type"], name, "{data}");
        assert_eq!(data["sequence_number"], position, "{data}");
    }
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    let deltas = names.len() - 8;
    assert!(deltas > 0, "{names:?}");
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, expected);

    let created = &events[0].1["response"];
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["output"], json!([]));
    let id = created["id"].as_str().unwrap();
    assert_eq!(events[1].1["response"]["id"], id);
    let added = &events[2].1;
    assert_eq!(added["output_index"], 0);
    assert_eq!(added["item"]["type"], "message");
    assert_eq!(added["item"]["status"], "in_progress");
    assert_eq!(added["item"]["content"], json!([]));
    let item_id = added["item"]["id"].as_str().unwrap();
    let part = &events[3].1;
    assert_eq!(part["item_id"], item_id);
    assert_eq!(part["content_index"], 0);
    assert_eq!(
        part["part"],
        json!({"type": "output_text", "text": "", "annotations": []})
    );
    let mut text = String::new();
    for (_, delta) in &events[4..4 + deltas] {
        assert_eq!(delta["item_id"], item_id);
        assert_eq!(delta["output_index"], 0);
        assert_eq!(delta["content_index"], 0);
        assert_eq!(delta["logprobs"], json!([]));
        text.push_str(delta["delta"].as_str().unwrap());
    }
    let done = &events[4 + deltas].1;
    assert_eq!(done["text"], text.as_str());
    assert_eq!(done["item_id"], item_id);
    assert_eq!(events[5 + deltas].1["part"]["text"], text.as_str());
    let item_done = &events[6 + deltas].1;
    assert_eq!(item_done["item"]["status"], "completed");
    assert_eq!(item_done["item"]["content"][0]["text"], text.as_str());
    let completed = &events[7 + deltas].1["response"];
    assert_eq!(completed["id"], id);
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["output"], json!([item_done["item"]]));

    // Not streamed, the same request is the same response.
    let mut plain = request.clone();
    plain["stream"] = json!(false);
    let body = ok(&server, &plain).await;
    let expected = server.expected("w4 w5", 40, seed);
    assert_eq!(text, expected.text);
    assert_eq!(output_text(&body), text);
    assert_eq!(body["status"], "completed");
    assert_eq!(
        body["usage"]["output_tokens"],
        completed["usage"]["output_tokens"]
    );
    assert_eq!(
        body["usage"]["input_tokens"],
        completed["usage"]["input_tokens"]
    );
    assert_eq!(completed["usage"]["output_tokens"], expected.tokens.len());
    assert_eq!(
        body["output"].as_array().unwrap().len(),
        completed["output"].as_array().unwrap().len()
    );
}

#[tokio::test]
async fn a_small_max_output_tokens_makes_the_response_incomplete() {
    let server = server(Options::default());
    let request = json!({"model": MODEL, "input": "w7", "max_output_tokens": 3, "seed": 2});
    let body = ok(&server, &request).await;
    assert_eq!(body["status"], "incomplete");
    assert_eq!(
        body["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(body["usage"]["output_tokens"], 3);
    assert_eq!(body["output"][0]["status"], "incomplete");
    assert_eq!(output_text(&body), server.expected("w7", 3, 2).text);

    let mut streamed = request;
    streamed["stream"] = json!(true);
    let events = events(&body_text(post(&server, &streamed).await).await);
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "response.incomplete");
    assert_eq!(last["sequence_number"], events.len() - 1);
    assert_eq!(last["response"]["status"], "incomplete");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    assert_eq!(output_text(&last["response"]), output_text(&body));
    assert!(!events.iter().any(|(name, _)| name == "response.completed"));
}

#[tokio::test]
async fn previous_response_id_continues_the_stored_conversation() {
    let server = server(Options::default());
    let first = json!({"model": MODEL, "input": "w1", "instructions": "w9",
        "max_output_tokens": 6, "seed": 1});
    let first = ok(&server, &first).await;
    let first_id = first["id"].as_str().unwrap();
    let first_text = output_text(&first);
    assert!(!first_text.is_empty());

    let second = json!({"model": MODEL, "previous_response_id": first_id,
        "input": [{"role": "user", "content": "w2"}], "max_output_tokens": 6, "seed": 2});
    let second = ok(&server, &second).await;
    assert_eq!(second["previous_response_id"], first_id);
    assert_eq!(second["instructions"], Value::Null);
    let second_prompt = last_prompt(&server);
    let second_text = output_text(&second);
    // The first's input and output, then the new input; its instructions
    // are not carried over.
    let messages = json!([
        {"role": "user", "content": "w1"},
        {"role": "assistant", "content": first_text},
        {"role": "user", "content": "w2"},
    ]);
    let (expected, _) = chat_prompt(&server, messages, json!({})).await;
    assert_eq!(second_prompt, expected);
    assert!(second["usage"]["input_tokens"].as_u64() > first["usage"]["input_tokens"].as_u64());

    // A chain: the third sees both turns, streamed too.
    let third = json!({"model": MODEL, "previous_response_id": second["id"],
        "input": "w3", "max_output_tokens": 4, "seed": 3, "stream": true});
    let events = events(&body_text(post(&server, &third).await).await);
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "response.incomplete");
    let third_id = last["response"]["id"].as_str().unwrap().to_owned();
    let third_prompt = last_prompt(&server);
    let messages = json!([
        {"role": "user", "content": "w1"},
        {"role": "assistant", "content": first_text},
        {"role": "user", "content": "w2"},
        {"role": "assistant", "content": second_text},
        {"role": "user", "content": "w3"},
    ]);
    let (expected, _) = chat_prompt(&server, messages, json!({})).await;
    assert_eq!(third_prompt, expected);

    // The streamed response was stored when it finished.
    let fourth = json!({"model": MODEL, "previous_response_id": third_id,
        "input": "w4", "max_output_tokens": 2});
    let fourth = ok(&server, &fourth).await;
    assert!(
        fourth["usage"]["input_tokens"].as_u64().unwrap() > third_prompt.len() as u64,
        "{fourth}"
    );
}

#[tokio::test]
async fn an_unknown_or_unstored_previous_response_is_400() {
    let server = server(Options::default());
    let request = json!({"model": MODEL, "previous_response_id": "resp_nope", "input": "w1"});
    let before = server.admissions.lock().unwrap().len();
    let body = assert_error(
        post(&server, &request).await,
        StatusCode::BAD_REQUEST,
        "previous_response_not_found",
    )
    .await;
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["param"], "previous_response_id");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("resp_nope"));
    assert_eq!(server.admissions.lock().unwrap().len(), before);

    for stream in [false, true] {
        let unstored = json!({"model": MODEL, "input": "w1", "store": false,
            "max_output_tokens": 2, "stream": stream});
        let response = post(&server, &unstored).await;
        assert_eq!(response.status(), StatusCode::OK);
        let id = if stream {
            let events = events(&body_text(response).await);
            events.last().unwrap().1["response"]["id"].clone()
        } else {
            let body = body_json(response).await;
            assert_eq!(body["store"], false);
            body["id"].clone()
        };
        assert!(id.is_string());
        let continued = json!({"model": MODEL, "previous_response_id": id, "input": "w2"});
        assert_error(
            post(&server, &continued).await,
            StatusCode::BAD_REQUEST,
            "previous_response_not_found",
        )
        .await;
    }
}

#[tokio::test]
async fn hosted_tools_are_skipped_and_function_tools_reach_the_template() {
    let server = server(Options::default());
    let weather = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    let request = json!({"model": MODEL, "input": "w1", "max_output_tokens": 2, "seed": 4,
        "tools": [
            {"type": "web_search"},
            {"type": "function", "name": "get_weather", "description": "Weather.",
                "parameters": weather, "strict": true},
            {"type": "file_search", "vector_store_ids": ["vs_1"]},
        ],
        "tool_choice": "auto", "parallel_tool_calls": false});
    let body = ok(&server, &request).await;
    let prompt = last_prompt(&server);
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "name": "get_weather", "description": "Weather.",
            "parameters": weather, "strict": true}])
    );
    assert_eq!(body["parallel_tool_calls"], false);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather.", "parameters": weather, "strict": true}}]);
    let (expected, _) = chat_prompt(
        &server,
        json!([{"role": "user", "content": "w1"}]),
        json!({"tools": tools, "parallel_tool_calls": false}),
    )
    .await;
    // The tiny core's template does not print tools: the prompt is the
    // chat route's for the same tools.
    assert_eq!(prompt, expected);

    // A named choice in the flat shape finds the declared function (an
    // undeclared one is 400); the fake model's text is no call, so the
    // choice is unmet (422).
    let mut named = request.clone();
    named["tool_choice"] = json!({"type": "function", "name": "get_weather"});
    let response = post(&server, &named).await;
    assert_error(
        response,
        StatusCode::UNPROCESSABLE_ENTITY,
        "tool_choice_unmet",
    )
    .await;
    let mut unknown = request;
    unknown["tool_choice"] = json!({"type": "function", "name": "launch"});
    assert_error(
        post(&server, &unknown).await,
        StatusCode::BAD_REQUEST,
        "invalid_parameter",
    )
    .await;
}

#[tokio::test]
async fn a_stream_failing_after_it_started_ends_with_response_failed() {
    let server = server(Options::default());
    let weather = json!({"type": "object"});
    let request = json!({"model": MODEL, "input": "w1", "max_output_tokens": 3, "seed": 4,
        "stream": true, "tools": [{"type": "function", "name": "get_weather",
        "parameters": weather}], "tool_choice": "required"});
    let response = post(&server, &request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let events = events(&body_text(response).await);
    for (position, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], position, "{data}");
    }
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names[..2], ["response.created", "response.in_progress"]);
    assert_eq!(names[names.len() - 2..], ["error", "response.failed"]);
    let error = &events[events.len() - 2].1;
    assert_eq!(error["code"], "tool_choice_unmet");
    assert!(error["message"].is_string());
    let failed = &events[events.len() - 1].1["response"];
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"]["code"], "invalid_prompt");
    assert_eq!(failed["tool_choice"], "required");
}

#[tokio::test]
async fn invalid_requests_are_refused_in_the_openai_envelope() {
    let server = server(Options::default());
    let cases = [
        (
            json!({"input": "w1", "text": {"format": {"type": "json_schema", "name": "x"}}}),
            StatusCode::BAD_REQUEST,
            "invalid_parameter",
            Some("text.format"),
        ),
        (
            json!({"input": "w1", "text": {"format": {"type": "yaml"}}}),
            StatusCode::BAD_REQUEST,
            "invalid_parameter",
            Some("text.format"),
        ),
        (
            json!({"input": [{"role": "user", "content": [
                {"type": "input_text", "text": "what is it?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}),
            StatusCode::BAD_REQUEST,
            "unsupported_content",
            Some("input[0].content[1]"),
        ),
        (
            json!({"model": "gpt-4o", "input": "w1"}),
            StatusCode::NOT_FOUND,
            "model_not_found",
            Some("model"),
        ),
        (
            json!({"input": []}),
            StatusCode::BAD_REQUEST,
            "invalid_parameter",
            Some("input"),
        ),
        (
            json!({"input": "w1", "max_output_tokens": 0}),
            StatusCode::BAD_REQUEST,
            "invalid_parameter",
            Some("max_output_tokens"),
        ),
        (
            json!({"input": "w1", "temperature": 0}),
            StatusCode::BAD_REQUEST,
            "invalid_parameter",
            Some("temperature"),
        ),
        (
            json!({"input": 5}),
            StatusCode::BAD_REQUEST,
            "invalid_parameter",
            Some("input"),
        ),
        (
            json!({"input": "w1", "tool_choice": "sometimes"}),
            StatusCode::BAD_REQUEST,
            "invalid_parameter",
            Some("tool_choice"),
        ),
        (
            json!({"input": "w1", "max_output_tokens": "many"}),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            Some("max_output_tokens"),
        ),
    ];
    let before = server.admissions.lock().unwrap().len();
    for (request, status, code, param) in cases {
        let body = assert_error(post(&server, &request).await, status, code).await;
        assert_eq!(body["error"]["param"].as_str(), param, "{request}: {body}");
    }
    assert_eq!(server.admissions.lock().unwrap().len(), before);
}
