//! `GET /health` follows the worker; `GET /v1/models` lists the model.

mod http_support;

use axum::http::StatusCode;
use helios::scheduler::{ShutdownMode, INTER_TOKEN_BUCKETS};
use http_support::{body_json, chat_body, server, Options, MODEL};
use serde_json::json;

#[tokio::test]
async fn health_is_200_while_the_worker_serves_and_503_once_it_stops() {
    let mut server = server(Options::default());
    let response = server.get("/health").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body_json(response).await["status"], "ok");
    let worker = server.worker.take().unwrap();
    worker.shutdown(ShutdownMode::Finish).unwrap();
    let response = server.get("/health").await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body_json(response).await["status"], "unavailable");
}

#[tokio::test]
async fn health_reports_an_executor_failure() {
    let server = server(Options {
        fail_first_launch: true,
        ..Options::default()
    });
    let response = server
        .post("/v1/chat/completions", &chat_body("w1", json!({})))
        .await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let response = server.get("/health").await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = body_json(response).await;
    assert_eq!(body["status"], "failed");
    assert!(body["error"].is_string());
}

#[tokio::test]
async fn models_lists_the_served_model() {
    let server = server(Options::default());
    let response = server.get("/v1/models").await;
    assert_eq!(response.status(), StatusCode::OK);
    let body = body_json(response).await;
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["id"], MODEL);
    assert_eq!(body["data"][0]["object"], "model");
}

#[tokio::test]
async fn metrics_reports_the_scheduler_gauges() {
    let server = server(Options::default());
    let response = server
        .post(
            "/v1/chat/completions",
            &chat_body("w1", json!({"max_tokens": 3})),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let response = server.get("/metrics").await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = http_support::body_text(response).await;
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing from {text}"))
            .to_owned()
    };
    assert_eq!(value("flare_ready"), "1");
    for name in [
        "flare_queue_depth",
        "flare_running_requests",
        "flare_pages_used",
    ] {
        value(name).parse::<u64>().unwrap();
    }
    assert!(text.contains("# TYPE flare_preemptions_total counter"));
    // The one request above finished (3 tokens, or earlier at a stop token).
    let finished: u64 = ["stop", "length"]
        .map(|r| {
            value(&format!("flare_requests_finished_{r}_total"))
                .parse::<u64>()
                .unwrap()
        })
        .iter()
        .sum();
    assert_eq!(finished, 1);
    assert_eq!(value("flare_requests_cancelled_total"), "0");
    assert_eq!(value("flare_requests_failed_total"), "0");
}

#[tokio::test]
async fn metrics_reports_latency_histograms() {
    // The fake model draws no stop token by default: exactly 4 tokens.
    let server = server(Options::default());
    let response = server
        .post(
            "/v1/chat/completions",
            &chat_body("w1", json!({"max_tokens": 4})),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = http_support::body_text(server.get("/metrics").await).await;
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing from {text}"))
            .parse()
            .unwrap()
    };
    assert!(text.contains("# TYPE flare_time_to_first_token_seconds histogram"));
    // One request: one first token, then three gaps (no stop token drawn).
    assert_eq!(value("flare_time_to_first_token_seconds_count"), 1.0);
    assert_eq!(
        value("flare_time_to_first_token_seconds_bucket{le=\"+Inf\"}"),
        1.0
    );
    assert_eq!(value("flare_inter_token_latency_seconds_count"), 3.0);
    // The same three gaps as the request's HTTP task received the tokens.
    assert!(text.contains("# TYPE flare_delivered_inter_token_seconds histogram"));
    assert_eq!(value("flare_delivered_inter_token_seconds_count"), 3.0);
    assert!(value("flare_delivered_inter_token_seconds_sum") > 0.0);
    // Its finest bound as Rust prints it (the suite reads buckets by label).
    assert!(value("flare_delivered_inter_token_seconds_bucket{le=\"0.00025\"}") <= 3.0);
    // No constrained request: no mask computed.
    assert_eq!(value("flare_grammar_mask_seconds_count"), 0.0);
    // The model thread's share of the first token, split at the first launch:
    // both parts inside the time to first token, which starts earlier (at the
    // hand-off to the model thread) and ends later (when the token is routed).
    assert_eq!(value("flare_first_launch_seconds_count"), 1.0);
    assert_eq!(value("flare_first_record_seconds_count"), 1.0);
    let parts = value("flare_first_launch_seconds_sum") + value("flare_first_record_seconds_sum");
    assert!(parts > 0.0 && parts <= value("flare_time_to_first_token_seconds_sum"));
    // The second part split at the chunk that sampled the first token: the two
    // halves are the whole (up to the clock reads between them).
    assert_eq!(value("flare_first_sampling_launch_seconds_count"), 1.0);
    assert_eq!(value("flare_sampling_launch_record_seconds_count"), 1.0);
    let halves = value("flare_first_sampling_launch_seconds_sum")
        + value("flare_sampling_launch_record_seconds_sum");
    assert!(halves > 0.0 && halves <= value("flare_first_record_seconds_sum") + 1e-6);
    assert!(value("flare_time_to_first_token_seconds_sum") > 0.0);
    // Buckets are cumulative: never decreasing up to +Inf.
    let buckets: Vec<f64> = text
        .lines()
        .filter(|line| line.starts_with("flare_inter_token_latency_seconds_bucket"))
        .map(|line| line.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(buckets.len(), INTER_TOKEN_BUCKETS.len() + 1);
    assert!(buckets.windows(2).all(|pair| pair[0] <= pair[1]));
    assert_eq!(*buckets.last().unwrap(), 3.0);
    // One prompt rendered and tokenized before submission.
    assert!(text.contains("# TYPE flare_prompt_preparation_seconds histogram"));
    assert_eq!(value("flare_prompt_preparation_seconds_count"), 1.0);
    assert!(value("flare_prompt_preparation_seconds_sum") > 0.0);
    // Its launches: one admission; with the prefix cache on (the default),
    // a prefill chunk that stops at the user message's end and one to the
    // prompt's end, which samples the first token; a decode step per further
    // token; snapshots at both endpoints and at the end (the terminal
    // capture).
    assert!(text.contains("# TYPE flare_launches_prefill_total counter"));
    assert_eq!(value("flare_launches_admit_total"), 1.0);
    assert_eq!(value("flare_launches_prefill_total"), 2.0);
    assert_eq!(value("flare_launches_decode_total"), 3.0);
    assert_eq!(value("flare_launches_snapshot_total"), 3.0);
    assert_eq!(value("flare_launches_restore_total"), 0.0);
    assert_eq!(value("flare_launches_resume_total"), 0.0);
}
