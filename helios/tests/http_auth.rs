//! The optional API key: `/v1` routes refuse requests without it (401, in
//! the endpoint's envelope); probes stay open.

mod http_support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_support::{assert_error, body_json, chat_body, server, Options, Server};
use serde_json::json;

fn keyed() -> Server {
    server(Options {
        api_key: Some("sk-test".to_owned()),
        ..Options::default()
    })
}

fn chat(header: Option<(&str, &str)>) -> Request<Body> {
    let mut request =
        Request::post("/v1/chat/completions").header("content-type", "application/json");
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    request
        .body(Body::from(chat_body("hello", json!({"max_tokens": 2}))))
        .unwrap()
}

#[tokio::test]
async fn requests_without_the_key_are_refused_with_401() {
    let server = keyed();
    let response = server.send(chat(None)).await;
    let body = assert_error(response, StatusCode::UNAUTHORIZED, "invalid_api_key").await;
    assert_eq!(body["error"]["type"], "authentication_error");
    let response = server
        .send(chat(Some(("authorization", "Bearer sk-wrong"))))
        .await;
    assert_error(response, StatusCode::UNAUTHORIZED, "invalid_api_key").await;
    let models = server.get("/v1/models").await;
    assert_eq!(models.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn either_header_carries_the_key() {
    let server = keyed();
    let response = server
        .send(chat(Some(("authorization", "Bearer sk-test"))))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let response = server.send(chat(Some(("x-api-key", "sk-test")))).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(body_json(response).await["choices"][0]["message"].is_object());
}

#[tokio::test]
async fn anthropic_requests_get_the_anthropic_envelope() {
    let server = keyed();
    let body = json!({
        "model": "tiny",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "hello"}],
    });
    let response = server.post("/v1/messages", &body.to_string()).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(response.headers().contains_key("x-request-id"));
    let body = body_json(response).await;
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "authentication_error");
}

#[tokio::test]
async fn probes_stay_open_and_no_key_means_no_check() {
    let keyed = keyed();
    assert_eq!(keyed.get("/health").await.status(), StatusCode::OK);
    assert_eq!(keyed.get("/metrics").await.status(), StatusCode::OK);
    let open = server(Options::default());
    assert_eq!(open.send(chat(None)).await.status(), StatusCode::OK);
}
