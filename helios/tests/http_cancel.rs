//! A client that disconnects cancels its request; a client that does not
//! read holds only its own request back.

mod http_support;

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use helios::scheduler::{Metrics, SchedulerHandle};
use http_body_util::BodyExt;
use http_support::{body_json, chat_body, server, Options};
use serde_json::json;

/// Waits until the scheduler holds no request and no page outside the
/// prefix cache.
async fn wait_until_idle(handle: &SchedulerHandle, within: Duration) -> Metrics {
    let start = Instant::now();
    loop {
        let metrics = handle.status().unwrap().metrics;
        // Pages the prefix cache holds stay used; nothing else may.
        let cached = metrics.cache.map_or(0, |cache| cache.pages_held);
        if metrics.running == 0 && metrics.queue_depth == 0 && metrics.pages_used == cached {
            return metrics;
        }
        assert!(start.elapsed() < within, "still busy: {metrics:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_sse_stream_cancels_the_request() {
    // 900 decode steps of 2 ms each: about two seconds if nobody cancels.
    let server = server(Options {
        launch_time: Some(Duration::from_millis(2)),
        ..Options::default()
    });
    let request = chat_body("w1", json!({"max_tokens": 900, "stream": true}));
    let started = Instant::now();
    let response = server.post("/v1/chat/completions", &request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    for _ in 0..3 {
        body.frame().await.unwrap().unwrap();
    }
    let status = server.handle.status().unwrap();
    assert_eq!(status.metrics.running, 1);
    drop(body);
    let metrics = wait_until_idle(&server.handle, Duration::from_millis(1000)).await;
    assert!(started.elapsed() < Duration::from_millis(1500));
    assert_eq!((metrics.cancelled, metrics.finished_length), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_blocks_no_other_request() {
    let server = server(Options::default());
    let stalled = chat_body("w1", json!({"max_tokens": 500, "stream": true}));
    let response = server.post("/v1/chat/completions", &stalled).await;
    assert_eq!(response.status(), StatusCode::OK);
    let unread = response.into_body();
    for seed in 0..4 {
        let request = chat_body("w2", json!({"max_tokens": 50, "seed": seed}));
        let body = body_json(server.post("/v1/chat/completions", &request).await).await;
        assert_eq!(body["usage"]["completion_tokens"], 50);
    }
    drop(unread);
    wait_until_idle(&server.handle, Duration::from_millis(1000)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_queued_cancels_its_request() {
    let server = server(Options {
        launch_time: Some(Duration::from_millis(2)),
        ..Options::default()
    });
    // Four long requests hold every slot of the contract.
    let long = chat_body("w1", json!({"max_tokens": 900, "stream": true}));
    let mut running = Vec::new();
    for _ in 0..4 {
        let response = server.post("/v1/chat/completions", &long).await;
        assert_eq!(response.status(), StatusCode::OK);
        running.push(response.into_body());
    }
    // The fifth waits for admission; its client gives up.
    let waiting = server.post("/v1/chat/completions", &long);
    assert!(tokio::time::timeout(Duration::from_millis(100), waiting)
        .await
        .is_err());
    let start = Instant::now();
    loop {
        let metrics = server.handle.status().unwrap().metrics;
        assert_eq!(metrics.running, 4);
        if metrics.queue_depth == 0 {
            break;
        }
        assert!(start.elapsed() < Duration::from_millis(500), "{metrics:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(running);
    wait_until_idle(&server.handle, Duration::from_millis(1000)).await;
}
