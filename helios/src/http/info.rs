//! `GET /v1/models`, `GET /health` and `GET /metrics`.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::AppState;
use crate::scheduler::{Health, Histogram, Metrics};

/// The one model this server serves.
pub async fn models(State(state): State<AppState>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.config().model,
            "object": "model",
            "created": 0,
            "owned_by": "flare",
        }],
    }))
    .into_response()
}

/// 200 while the worker serves; 503 while it stops, after it failed, or
/// when it is gone.
pub async fn health(State(state): State<AppState>) -> Response {
    let handle = state.handle().clone();
    // `status` waits for the model thread's reply: not on the executor.
    let status = tokio::task::spawn_blocking(move || handle.status()).await;
    let (code, body) = match status {
        Ok(Ok(status)) => match status.health {
            Health::Ready => (StatusCode::OK, json!({"status": "ok"})),
            Health::Stopping => (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "stopping"}),
            ),
            Health::Failed(error) => (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "failed", "error": error.to_string()}),
            ),
        },
        Ok(Err(_)) | Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "unavailable"}),
        ),
    };
    (code, Json(body)).into_response()
}

/// The scheduler's gauges and counters in Prometheus' text format; 503
/// when the worker is gone.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let handle = state.handle().clone();
    let Ok(Ok(status)) = tokio::task::spawn_blocking(move || handle.status()).await else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let metrics = status.metrics;
    let ready = u8::from(matches!(status.health, Health::Ready));
    let samples: [(&str, &str, &str, u64); 13] = [
        (
            "flare_ready",
            "gauge",
            "1 while the worker serves",
            ready.into(),
        ),
        (
            "flare_queue_depth",
            "gauge",
            "Requests waiting for admission",
            metrics.queue_depth as u64,
        ),
        (
            "flare_running_requests",
            "gauge",
            "Requests holding a slot",
            metrics.running as u64,
        ),
        (
            "flare_launches_in_flight",
            "gauge",
            "Launches submitted and not retrieved",
            metrics.in_flight as u64,
        ),
        (
            "flare_pages_used",
            "gauge",
            "KV pages in page tables",
            metrics.pages_used.into(),
        ),
        (
            "flare_pages_reserved",
            "gauge",
            "Free KV pages reserved for growth",
            metrics.pages_reserved.into(),
        ),
        (
            "flare_pages_free",
            "gauge",
            "KV pages neither used nor reserved",
            metrics.pages_free.into(),
        ),
        (
            "flare_preemptions_total",
            "counter",
            "Preemptions since start",
            metrics.preemptions,
        ),
        (
            "flare_prefill_tokens_total",
            "counter",
            "Prompt tokens prefilled since start (restored prefixes excluded)",
            metrics.prefilled_tokens,
        ),
        (
            "flare_requests_finished_stop_total",
            "counter",
            "Requests finished by a stop token since start",
            metrics.finished_stop,
        ),
        (
            "flare_requests_finished_length_total",
            "counter",
            "Requests finished at their output limit since start",
            metrics.finished_length,
        ),
        (
            "flare_requests_cancelled_total",
            "counter",
            "Requests cancelled since start",
            metrics.cancelled,
        ),
        (
            "flare_requests_failed_total",
            "counter",
            "Requests failed since start",
            metrics.failed,
        ),
    ];
    let mut text = String::new();
    for (name, kind, help, value) in samples.into_iter().chain(cache_samples(&metrics)) {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        ));
    }
    let latency = &status.latency;
    write_histogram(
        &mut text,
        "flare_time_to_first_token_seconds",
        "Submission to the first output token",
        &latency.time_to_first_token,
    );
    write_histogram(
        &mut text,
        "flare_inter_token_latency_seconds",
        "Time between successive output tokens of a request",
        &latency.inter_token,
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// The prefix cache's gauges and counters, when it is enabled: page
/// pressure and snapshot pressure apart.
fn cache_samples(metrics: &Metrics) -> Vec<(&'static str, &'static str, &'static str, u64)> {
    let Some(cache) = metrics.cache else {
        return Vec::new();
    };
    let counters = cache.counters;
    vec![
        (
            "flare_prefix_checkpoints",
            "gauge",
            "Live prefix checkpoints",
            cache.checkpoints.into(),
        ),
        (
            "flare_prefix_pages_held",
            "gauge",
            "KV pages checkpoint chains hold",
            cache.pages_held.into(),
        ),
        (
            "flare_prefix_pages_reclaimable",
            "gauge",
            "Checkpoint pages eviction could free now",
            cache.pages_reclaimable.into(),
        ),
        (
            "flare_prefix_snapshot_rows",
            "gauge",
            "Snapshot rows in the pool",
            cache.rows.into(),
        ),
        (
            "flare_prefix_snapshot_rows_free",
            "gauge",
            "Snapshot rows free",
            cache.rows_free.into(),
        ),
        (
            "flare_prefix_lookups_total",
            "counter",
            "Admissions that looked up a prefix",
            counters.lookups,
        ),
        (
            "flare_prefix_hits_total",
            "counter",
            "Admissions that restored a prefix",
            counters.hits,
        ),
        (
            "flare_prefix_hit_tokens_total",
            "counter",
            "Prompt tokens restored instead of prefilled",
            counters.hit_tokens,
        ),
        (
            "flare_prefix_published_total",
            "counter",
            "Checkpoints published",
            counters.published,
        ),
        (
            "flare_prefix_duplicate_publications_total",
            "counter",
            "Captures of an endpoint already cached",
            counters.duplicate_publications,
        ),
        (
            "flare_prefix_evicted_total",
            "counter",
            "Checkpoints evicted with their pages",
            counters.evicted,
        ),
        (
            "flare_prefix_thinned_total",
            "counter",
            "Checkpoints thinned from a chain",
            counters.thinned,
        ),
        (
            "flare_prefix_page_pressure_total",
            "counter",
            "Times pages were reclaimed from the cache",
            counters.page_pressure,
        ),
        (
            "flare_prefix_snapshot_pressure_total",
            "counter",
            "Captures that found no free snapshot row",
            counters.snapshot_pressure,
        ),
    ]
}

/// One histogram in Prometheus' text format: cumulative `_bucket` lines
/// (`le` ending in `+Inf`), `_sum` and `_count`.
fn write_histogram(text: &mut String, name: &str, help: &str, histogram: &Histogram) {
    text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
    for (bound, count) in histogram.cumulative() {
        let le = if bound.is_infinite() {
            "+Inf".to_owned()
        } else {
            bound.to_string()
        };
        text.push_str(&format!("{name}_bucket{{le=\"{le}\"}} {count}\n"));
    }
    text.push_str(&format!("{name}_sum {}\n", histogram.sum()));
    text.push_str(&format!("{name}_count {}\n", histogram.count()));
}
