//! Errors of the generation endpoints: one envelope, the right status and
//! a typed code; failures after SSE headers end the stream without `[DONE]`.

mod http_support;

use axum::http::StatusCode;
use http_support::{assert_error, body_text, chat_body, server, sse_data, Options};
use serde_json::{json, Value};

#[tokio::test]
async fn invalid_requests_are_400_with_the_envelope() {
    let server = server(Options::default());
    let cases: Vec<(String, &str, Option<&str>)> = vec![
        (
            chat_body("w1", json!({"temperature": 0})),
            "invalid_parameter",
            Some("temperature"),
        ),
        (
            json!({"model": "tiny", "messages": []}).to_string(),
            "invalid_prompt",
            Some("messages"),
        ),
        ("{\"messages\": [".to_owned(), "invalid_json", None),
        (
            chat_body("w1", json!({"temperature": "hot"})),
            "invalid_json",
            Some("temperature"),
        ),
        (
            chat_body("w1", json!({"seed": -1})),
            "invalid_json",
            Some("seed"),
        ),
        (
            chat_body("w1", json!({"stream_options": {"include_usage": "yes"}})),
            "invalid_json",
            Some("stream_options.include_usage"),
        ),
        (json!({"model": "tiny"}).to_string(), "invalid_json", None),
        (
            json!({"model": "tiny", "messages": [
                {"role": "user", "content": "w1"}, {"role": "wizard", "content": "w2"}]})
            .to_string(),
            "invalid_role",
            Some("messages[1].role"),
        ),
        (
            json!({"model": "tiny", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "w1"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})
            .to_string(),
            "unsupported_content",
            Some("messages[0].content[1]"),
        ),
        (
            chat_body(
                "w1",
                json!({"continue_final_message": true, "add_generation_prompt": true}),
            ),
            "invalid_parameter",
            Some("add_generation_prompt"),
        ),
        (
            chat_body("w1", json!({"top_k": -2})),
            "invalid_parameter",
            Some("top_k"),
        ),
        (
            chat_body("w1", json!({"max_tokens": 0})),
            "invalid_parameter",
            Some("max_tokens"),
        ),
        (
            chat_body("w1", json!({"n": 2})),
            "invalid_parameter",
            Some("n"),
        ),
        (
            chat_body("w1", json!({"stop": ["w1", ""]})),
            "invalid_parameter",
            Some("stop"),
        ),
        (
            chat_body("w1", json!({"max_tokens": 5000})),
            "context_length_exceeded",
            Some("max_tokens"),
        ),
    ];
    for (body, code, param) in cases {
        let response = server.post("/v1/chat/completions", &body).await;
        let envelope = assert_error(response, StatusCode::BAD_REQUEST, code).await;
        assert_eq!(envelope["error"]["type"], "invalid_request_error");
        assert_eq!(envelope["error"]["param"], json!(param), "{body}");
    }
}

#[tokio::test]
async fn an_execution_failure_is_500_and_the_worker_then_503() {
    let server = server(Options {
        fail_first_launch: true,
        ..Options::default()
    });
    let response = server
        .post("/v1/chat/completions", &chat_body("w1", json!({})))
        .await;
    let envelope = assert_error(
        response,
        StatusCode::INTERNAL_SERVER_ERROR,
        "execution_failed",
    );
    assert_eq!(envelope.await["error"]["type"], "server_error");
    let response = server
        .post("/v1/chat/completions", &chat_body("w1", json!({})))
        .await;
    assert_error(
        response,
        StatusCode::SERVICE_UNAVAILABLE,
        "worker_unavailable",
    )
    .await;
}

#[tokio::test]
async fn a_failure_after_the_sse_headers_ends_the_stream_without_done() {
    let server = server(Options {
        fail_first_launch: true,
        ..Options::default()
    });
    let request = chat_body("w1", json!({"stream": true}));
    let response = server.post("/v1/chat/completions", &request).await;
    // The admit launch fails after the request was admitted: the headers
    // are out, so the failure is the stream's last event.
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().contains_key("x-request-id"));
    let data = sse_data(&body_text(response).await);
    assert!(!data.iter().any(|payload| payload == "[DONE]"), "{data:?}");
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "execution_failed");
}

#[tokio::test]
async fn a_stopped_worker_answers_503() {
    let mut server = server(Options::default());
    let worker = server.worker.take().unwrap();
    worker
        .shutdown(helios::scheduler::ShutdownMode::Finish)
        .unwrap();
    let response = server
        .post("/v1/chat/completions", &chat_body("w1", json!({})))
        .await;
    let envelope = assert_error(
        response,
        StatusCode::SERVICE_UNAVAILABLE,
        "worker_unavailable",
    );
    assert_eq!(envelope.await["error"]["type"], "service_unavailable_error");
}

#[tokio::test]
async fn an_oversized_body_is_400_with_the_envelope() {
    let server = server(Options::default());
    // The test server accepts bodies up to 64 KiB.
    let body = chat_body(&"w1 ".repeat(40_000), json!({}));
    let response = server.post("/v1/chat/completions", &body).await;
    let envelope = assert_error(response, StatusCode::BAD_REQUEST, "invalid_body").await;
    assert_eq!(envelope["error"]["type"], "invalid_request_error");
}
