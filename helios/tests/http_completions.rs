//! `POST /v1/completions` over the test executor.

mod http_support;

use axum::http::StatusCode;
use http_support::{assert_error, body_json, body_text, server, sse_data, Options, MODEL};
use serde_json::{json, Value};

#[tokio::test]
async fn a_completion_returns_the_fake_models_text_streamed_and_not() {
    let server = server(Options::default());
    let prompt = server.tokenizer().encode("w1 w2 w3", true).unwrap();
    let expected = server.expected_for(&prompt, 12, 5);
    let request = json!({"model": MODEL, "prompt": "w1 w2 w3", "max_tokens": 12, "seed": 5});
    let response = server.post("/v1/completions", &request.to_string()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().contains_key("x-request-id"));
    let body = body_json(response).await;
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["choices"][0]["text"], expected.text);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(body["usage"]["completion_tokens"], 12);

    let mut streamed = request;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let response = server.post("/v1/completions", &streamed.to_string()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let data = sse_data(&body_text(response).await);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = (data[..data.len() - 1].iter())
        .map(|payload| serde_json::from_str(payload).unwrap())
        .collect();
    let text: String = (chunks.iter())
        .filter_map(|chunk| chunk["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, expected.text);
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "length"
    );
    assert_eq!(chunks[chunks.len() - 1]["usage"]["completion_tokens"], 12);
}

#[tokio::test]
async fn a_token_id_prompt_is_served_as_given() {
    let server = server(Options::default());
    let prompt = vec![3, 4, 5, 6];
    let expected = server.expected_for(&prompt, 8, 9);
    let request = json!({"prompt": prompt, "max_tokens": 8, "seed": 9});
    let body = body_json(server.post("/v1/completions", &request.to_string()).await).await;
    assert_eq!(body["choices"][0]["text"], expected.text);
    assert_eq!(body["usage"]["prompt_tokens"], 4);
}

#[tokio::test]
async fn invalid_completion_requests_are_400() {
    let server = server(Options::default());
    let cases = [
        (
            json!({"prompt": "w1", "temperature": 0}),
            "invalid_parameter",
        ),
        (json!({"prompt": "w1", "echo": true}), "invalid_parameter"),
        (json!({"prompt": ["w1", "w2"]}), "invalid_parameter"),
        (json!({"prompt": [1000]}), "invalid_parameter"),
        (json!({"max_tokens": 3}), "invalid_json"),
    ];
    for (request, code) in cases {
        let response = server.post("/v1/completions", &request.to_string()).await;
        assert_error(response, StatusCode::BAD_REQUEST, code).await;
    }
}
