//! Anthropic's `POST /v1/messages` over the test executor.

mod http_support;

use axum::http::StatusCode;
use http_support::{body_json, body_text, server, Options, MODEL};
use serde_json::{json, Value};

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
                    .unwrap()
            };
            let data = serde_json::from_str(&field("data:")).unwrap();
            (field("event:"), data)
        })
        .collect()
}

#[tokio::test]
async fn a_message_returns_the_fake_models_text_streamed_and_not() {
    let server = server(Options::default());
    let expected = server.expected("w7 w8", 15, 4);
    let request = json!({"model": MODEL, "max_tokens": 15, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "w7 w8"}]}]});
    // Anthropic requests carry no seed, so the text is a random draw: the
    // prompt, the output length and the finish are what can be checked.
    let response = server.post("/v1/messages", &request.to_string()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().contains_key("x-request-id"));
    let body = body_json(response).await;
    assert_eq!(body["type"], "message");
    assert_eq!(body["role"], "assistant");
    assert_eq!(body["content"][0]["type"], "text");
    assert!(body["content"][0]["text"].is_string());
    assert_eq!(body["stop_reason"], "max_tokens");
    assert_eq!(body["usage"]["input_tokens"], expected.prompt_tokens);
    assert_eq!(body["usage"]["output_tokens"], 15);

    let mut streamed = request;
    streamed["stream"] = json!(true);
    let response = server.post("/v1/messages", &streamed.to_string()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let events = events(&body_text(response).await);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "content_block_start"]);
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let text: String = (events.iter())
        .filter(|(name, _)| name == "content_block_delta")
        .map(|(_, data)| data["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    assert!(!text.is_empty());
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 15);
}

#[tokio::test]
async fn a_stop_sequence_is_reported_by_name() {
    let server = server(Options::default());
    let request = json!({"model": MODEL, "max_tokens": 200, "stop_sequences": ["w"],
        "system": "w1", "messages": [{"role": "user", "content": "w2"}]});
    let body = body_json(server.post("/v1/messages", &request.to_string()).await).await;
    assert_eq!(body["stop_reason"], "stop_sequence", "{body}");
    assert_eq!(body["stop_sequence"], "w");
}

#[tokio::test]
async fn invalid_messages_are_400_in_anthropics_envelope() {
    let server = server(Options::default());
    let cases = [
        json!({"messages": [{"role": "user", "content": "w1"}]}),
        json!({"max_tokens": 5, "temperature": 0,
            "messages": [{"role": "user", "content": "w1"}]}),
        json!({"max_tokens": 5, "messages": [{"role": "user",
            "content": [{"type": "image", "source": {}}]}]}),
        json!({"max_tokens": 5, "messages": []}),
    ];
    for request in cases {
        let response = server.post("/v1/messages", &request.to_string()).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{request}");
        assert!(response.headers().contains_key("x-request-id"));
        let body = body_json(response).await;
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(body["error"]["message"].is_string());
    }
}
