//! `POST /v1/chat/completions` over the test executor: the fake model's
//! tokens come back as text, streamed and not.

mod http_support;

use axum::http::StatusCode;
use http_support::{body_json, body_text, chat_body, server, sse_data, Options};
use serde_json::{json, Value};

#[tokio::test]
async fn a_chat_completion_returns_the_fake_models_text() {
    let server = server(Options::default());
    let body = chat_body(
        "w1 w2",
        json!({"max_tokens": 20, "seed": 7, "temperature": 1}),
    );
    let response = server.post("/v1/chat/completions", &body).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().contains_key("x-request-id"));
    let body = body_json(response).await;
    let expected = server.expected("w1 w2", 20, 7);
    assert!(!expected.text.is_empty());
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["message"]["content"], expected.text);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["prompt_tokens"], expected.prompt_tokens);
    assert_eq!(body["usage"]["completion_tokens"], 20);
    assert_eq!(body["usage"]["total_tokens"], expected.prompt_tokens + 20);
}

#[tokio::test]
async fn eos_ends_a_completion_with_finish_reason_stop() {
    let server = server(Options {
        stop_every: Some(6),
        ..Options::default()
    });
    let mut seen_eos = false;
    for seed in 0..8 {
        let body = chat_body("w3", json!({"max_tokens": 30, "seed": seed}));
        let body = body_json(server.post("/v1/chat/completions", &body).await).await;
        let expected = server.expected("w3", 30, seed);
        let reason = if expected.stopped_by_eos {
            "stop"
        } else {
            "length"
        };
        seen_eos |= expected.stopped_by_eos;
        assert_eq!(body["choices"][0]["message"]["content"], expected.text);
        assert_eq!(body["choices"][0]["finish_reason"], reason);
        assert_eq!(body["usage"]["completion_tokens"], expected.tokens.len());
    }
    assert!(seen_eos);
}

/// Content deltas, the finish reason and the usage of a streamed body.
fn read_stream(body: &str) -> (String, Vec<Value>, Vec<String>) {
    let data = sse_data(body);
    let mut text = String::new();
    let mut chunks = Vec::new();
    for payload in &data {
        if payload == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(payload).unwrap();
        if let Some(content) = chunk["choices"][0]["delta"]["content"].as_str() {
            text.push_str(content);
        }
        chunks.push(chunk);
    }
    (text, chunks, data)
}

#[tokio::test]
async fn streamed_frames_concatenate_to_the_same_text_and_end_with_done() {
    let server = server(Options::default());
    let request = json!({"max_tokens": 25, "seed": 11, "stream": true,
        "stream_options": {"include_usage": true}});
    let response = server
        .post("/v1/chat/completions", &chat_body("w4 w5", request))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().contains_key("x-request-id"));
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let (text, chunks, data) = read_stream(&body_text(response).await);
    let expected = server.expected("w4 w5", 25, 11);
    assert_eq!(text, expected.text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|chunk| chunk["object"] == "chat.completion.chunk"));
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = &chunks[chunks.len() - 1]["usage"];
    assert_eq!(usage["completion_tokens"], 25);
    assert_eq!(usage["prompt_tokens"], expected.prompt_tokens);

    let plain = chat_body("w4 w5", json!({"max_tokens": 25, "seed": 11}));
    let body = body_json(server.post("/v1/chat/completions", &plain).await).await;
    assert_eq!(body["choices"][0]["message"]["content"], text);
}

#[tokio::test]
async fn a_stop_sequence_cuts_the_output_streamed_and_not() {
    let server = server(Options::default());
    let expected = server.expected("w6", 40, 3);
    // A word in the middle of the output, with its spaces: the output is
    // cut where it first appears.
    let words: Vec<&str> = expected.text.split_whitespace().collect();
    let stop = format!(" {} ", words[words.len() / 2]);
    let cut = expected.text.find(&stop).unwrap();
    let request = json!({"max_tokens": 40, "seed": 3, "stop": [stop, "never seen"]});
    let body = body_json(
        server
            .post("/v1/chat/completions", &chat_body("w6", request.clone()))
            .await,
    )
    .await;
    assert_eq!(
        body["choices"][0]["message"]["content"],
        expected.text[..cut]
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let completion_tokens = body["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(completion_tokens < 40, "{body}");

    let mut streamed = request;
    streamed["stream"] = json!(true);
    let response = server
        .post("/v1/chat/completions", &chat_body("w6", streamed))
        .await;
    let (text, chunks, data) = read_stream(&body_text(response).await);
    assert_eq!(text, expected.text[..cut]);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
}

#[tokio::test]
async fn sampling_parameters_are_accepted_within_range() {
    let server = server(Options::default());
    let request = json!({"max_completion_tokens": 5, "temperature": 0.7, "top_p": 0.9,
        "top_k": 20, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "repetition_penalty": 1.1, "seed": 1, "n": 1, "stop": "zzz"});
    let response = server
        .post("/v1/chat/completions", &chat_body("w1", request))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let body = body_json(response).await;
    assert_eq!(body["usage"]["completion_tokens"], 5);
}
