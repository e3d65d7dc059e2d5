//! Requests held to the core's contract: the served model and its aliases,
//! the core's sampling defaults and ranges, and assistant prefill, each
//! checked in what the executor was asked to run.

mod http_support;

use axum::http::StatusCode;
use helios::core::proto::{FloatRange, SamplingDefaults};
use helios::frontend::ChatInput;
use helios::scheduler::SamplingParams;
use http_support::{
    assert_error, body_json, chat_body, server, Admitted, Options, Server, ALIAS, MODEL,
};
use serde_json::{json, Value};

fn range(min: f32, max: f32) -> Option<FloatRange> {
    Some(FloatRange { min, max })
}

/// Model-card-like defaults: temperature and top-p ranged, min-p fixed.
fn card_defaults() -> SamplingDefaults {
    SamplingDefaults {
        temperature: 0.2,
        top_k: 0,
        top_p: 0.9,
        min_p: 0.05,
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        temperature_range: range(0.01, 2.0),
        top_k_range: range(0.0, 50.0),
        top_p_range: range(0.01, 1.0),
        min_p_range: None,
        repetition_penalty_range: range(0.5, 2.0),
        presence_penalty_range: range(-2.0, 2.0),
        frequency_penalty_range: None,
    }
}

fn last_admission(server: &Server) -> Admitted {
    (server.admissions.lock().unwrap().last().cloned()).expect("one admission ran")
}

async fn chat_ok(server: &Server, body: String) -> Value {
    let response = server.post("/v1/chat/completions", &body).await;
    assert_eq!(response.status(), StatusCode::OK);
    body_json(response).await
}

#[tokio::test]
async fn omitted_sampling_fields_run_with_the_cores_defaults() {
    let server = server(Options {
        sampling: Some(card_defaults()),
        ..Options::default()
    });
    chat_ok(
        &server,
        chat_body("w1 w2", json!({"max_tokens": 2, "seed": 5})),
    )
    .await;
    let admitted = last_admission(&server);
    assert_eq!(
        admitted.sampling,
        SamplingParams {
            temperature: 0.2,
            top_k: 0,
            top_p: 0.9,
            min_p: 0.05,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    );
    assert_eq!(admitted.seed, 5);
}

#[tokio::test]
async fn out_of_range_values_clamp_and_unranged_ones_stay_at_their_default() {
    let server = server(Options {
        sampling: Some(card_defaults()),
        ..Options::default()
    });
    let fields = json!({"max_tokens": 2, "temperature": 7.5, "top_p": 1.5, "top_k": 500,
        "min_p": 0.5, "repetition_penalty": 0.1, "frequency_penalty": 1.0,
        "presence_penalty": 1.5});
    chat_ok(&server, chat_body("w1 w2", fields)).await;
    assert_eq!(
        last_admission(&server).sampling,
        SamplingParams {
            temperature: 2.0,
            top_k: 50,
            top_p: 1.0,
            min_p: 0.05,
            repetition_penalty: 0.5,
            presence_penalty: 1.5,
            frequency_penalty: 0.0,
        }
    );
    // Anthropic's fields go through the same policy.
    let body = json!({"model": MODEL, "max_tokens": 2, "temperature": 0.001, "top_k": -1,
        "messages": [{"role": "user", "content": "w1"}]});
    let response = server.post("/v1/messages", &body.to_string()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let sampling = last_admission(&server).sampling;
    assert_eq!((sampling.temperature, sampling.top_k), (0.01, 0));
}

#[tokio::test]
async fn only_the_served_model_and_its_aliases_are_served() {
    let server = server(Options::default());
    for name in [MODEL, ALIAS] {
        let body = json!({"model": name, "max_tokens": 2, "messages": [
            {"role": "user", "content": "w1"}]});
        chat_ok(&server, body.to_string()).await;
    }
    // No model named: the one served.
    chat_ok(
        &server,
        json!({"max_tokens": 2, "messages": [
        {"role": "user", "content": "w1"}]})
        .to_string(),
    )
    .await;
    let before = server.admissions.lock().unwrap().len();
    let wrong = json!({"model": "gpt-4o", "max_tokens": 2, "prompt": "w1",
        "messages": [{"role": "user", "content": "w1"}]});
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let response = server.post(path, &wrong.to_string()).await;
        let envelope = assert_error(response, StatusCode::NOT_FOUND, "model_not_found").await;
        assert_eq!(envelope["error"]["param"], "model");
        assert_eq!(envelope["error"]["type"], "invalid_request_error");
    }
    let response = server.post("/v1/messages", &wrong.to_string()).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let envelope = body_json(response).await;
    assert_eq!(envelope["type"], "error");
    assert_eq!(envelope["error"]["type"], "not_found_error", "{envelope}");
    assert_eq!(
        server.admissions.lock().unwrap().len(),
        before,
        "nothing ran"
    );
}

#[tokio::test]
async fn anthropic_refuses_roles_and_blocks_it_cannot_serve() {
    let server = server(Options::default());
    let cases = [
        (
            json!([{"role": "user", "content": "w1"}, {"role": "system", "content": "w2"}]),
            "messages[1].role",
        ),
        (
            json!([{"role": "user", "content": [{"type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]),
            "messages[0].content[0]",
        ),
    ];
    for (messages, at) in cases {
        let body = json!({"model": MODEL, "max_tokens": 2, "messages": messages});
        let response = server.post("/v1/messages", &body.to_string()).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let envelope = body_json(response).await;
        assert_eq!(envelope["error"]["type"], "invalid_request_error");
        let message = envelope["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(at), "{message}");
    }
}

#[tokio::test]
async fn models_report_the_context_limit() {
    let server = server(Options::default());
    let models = body_json(server.get("/v1/models").await).await;
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["max_model_len"], server.context_limit);
}

/// The prompt Transformers' `apply_chat_template(..., continue_final_message=True)`
/// renders (the frontend equals it on the committed fixtures).
fn continued_prompt(server: &Server, messages: &Value) -> Vec<u32> {
    let input = ChatInput {
        messages: messages.as_array().unwrap().clone(),
        continue_final_message: true,
        ..ChatInput::default()
    };
    server.frontend.encode_chat(&input).unwrap().token_ids
}

#[tokio::test]
async fn a_final_assistant_message_is_continued() {
    let server = server(Options {
        no_prefix_cache: true,
        ..Options::default()
    });
    let messages = json!([{"role": "user", "content": "w1 w2"},
        {"role": "assistant", "content": "w3 w4"}]);
    let expected = continued_prompt(&server, &messages);
    let generation_header = server
        .frontend
        .encode_chat(&ChatInput {
            messages: messages.as_array().unwrap().clone(),
            add_generation_prompt: true,
            ..ChatInput::default()
        })
        .unwrap()
        .token_ids;
    assert!(expected.len() < generation_header.len());

    let body = json!({"model": MODEL, "max_tokens": 2, "messages": messages,
        "continue_final_message": true, "add_generation_prompt": false});
    let answer = chat_ok(&server, body.to_string()).await;
    assert_eq!(last_admission(&server).prompt, expected);
    assert_eq!(answer["usage"]["prompt_tokens"], expected.len());
    // continue_final_message alone turns the generation prompt off.
    let body = json!({"model": MODEL, "max_tokens": 2, "messages": messages,
        "continue_final_message": true});
    chat_ok(&server, body.to_string()).await;
    assert_eq!(last_admission(&server).prompt, expected);

    let body = json!({"model": MODEL, "max_tokens": 2, "messages": messages});
    let response = server.post("/v1/messages", &body.to_string()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(last_admission(&server).prompt, expected);
}
