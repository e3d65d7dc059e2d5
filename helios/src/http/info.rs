//! `GET /v1/models`, `GET /health` and `GET /metrics`.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::AppState;
use crate::scheduler::{Health, Histogram, Metrics, OperationKind};

/// The one model this server serves, with its context limit.
pub async fn models(State(state): State<AppState>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.config().model,
            "object": "model",
            "created": 0,
            "owned_by": "flare",
            // The context limit (prompt plus output), as vLLM names it, so
            // clients can size their prompts.
            "max_model_len": state.config().context_limit,
        }],
    }))
    .into_response()
}

/// 200 while the worker serves; 503 while it stops, after it failed, or
/// when it is gone.
pub async fn health(State(state): State<AppState>) -> Response {
    // The status the model thread published: no round trip to it.
    let (code, body) = match state.handle().status() {
        Ok(status) => match status.health {
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
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "unavailable"}),
        ),
    };
    (code, Json(body)).into_response()
}

/// The scheduler's gauges and counters in Prometheus' text format; 503
/// when the worker is gone.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let Ok(status) = state.handle().status() else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let metrics = status.metrics;
    let ready = u8::from(matches!(status.health, Health::Ready));
    let mut text = String::new();
    for Sample {
        name,
        kind,
        help,
        value,
    } in scheduler_samples(&metrics, ready)
        .into_iter()
        .chain(cache_samples(&metrics))
    {
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
    write_histogram(
        &mut text,
        "flare_delivered_inter_token_seconds",
        "Time between successive output tokens of a request as its HTTP task receives them",
        &state.delivery(),
    );
    write_histogram(
        &mut text,
        "flare_grammar_mask_seconds",
        "Computing one constrained request's token mask for its next sample, on the model thread",
        &latency.grammar_mask,
    );
    write_histogram(
        &mut text,
        "flare_first_launch_seconds",
        "Submission to a request's first launch, on the model thread (its first admission)",
        &latency.first_token.to_first_launch,
    );
    write_histogram(
        &mut text,
        "flare_first_record_seconds",
        "A request's first launch to the retrieval of its first token's record, on the model thread",
        &latency.first_token.to_first_record,
    );
    write_histogram(
        &mut text,
        "flare_first_sampling_launch_seconds",
        "A request's first launch to the submission of its first sampling launch (a chunk \
         ending the prompt, or a resume), on the model thread",
        &latency.first_token.to_sampling_launch,
    );
    write_histogram(
        &mut text,
        "flare_sampling_launch_record_seconds",
        "A request's first sampling launch's submission to the retrieval of its first \
         token's record, on the model thread",
        &latency.first_token.sampling_to_record,
    );
    write_histogram(
        &mut text,
        "flare_prompt_preparation_seconds",
        "Rendering, tokenization and endpoint mapping of a prompt, before submission",
        &state.preparation(),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// One Prometheus sample: a gauge or a counter.
struct Sample {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: u64,
}

fn gauge(name: &'static str, help: &'static str, value: impl Into<u64>) -> Sample {
    let value = value.into();
    Sample {
        name,
        kind: "gauge",
        help,
        value,
    }
}

fn counter(name: &'static str, help: &'static str, value: u64) -> Sample {
    Sample {
        name,
        kind: "counter",
        help,
        value,
    }
}

/// The model thread's gauges and counters.
fn scheduler_samples(m: &Metrics, ready: u8) -> Vec<Sample> {
    let count = |n: usize| n as u64;
    vec![
        gauge("flare_ready", "1 while the worker serves", ready),
        gauge(
            "flare_queue_depth",
            "Requests waiting for admission",
            count(m.queue_depth),
        ),
        gauge(
            "flare_running_requests",
            "Requests holding a slot",
            count(m.running),
        ),
        gauge(
            "flare_launches_in_flight",
            "Launches submitted and not retrieved",
            count(m.in_flight),
        ),
        gauge("flare_pages_used", "KV pages in page tables", m.pages_used),
        gauge(
            "flare_pages_reserved",
            "Free KV pages reserved for growth",
            m.pages_reserved,
        ),
        gauge(
            "flare_pages_free",
            "KV pages neither used nor reserved",
            m.pages_free,
        ),
        counter(
            "flare_preemptions_total",
            "Preemptions since start",
            m.preemptions,
        ),
        counter(
            "flare_prefill_tokens_total",
            "Prompt tokens prefilled since start (restored prefixes excluded)",
            m.prefilled_tokens,
        ),
        counter(
            "flare_requests_finished_stop_total",
            "Requests finished by a stop token since start",
            m.finished_stop,
        ),
        counter(
            "flare_requests_finished_length_total",
            "Requests finished at their output limit since start",
            m.finished_length,
        ),
        counter(
            "flare_requests_cancelled_total",
            "Requests cancelled since start",
            m.cancelled,
        ),
        counter(
            "flare_requests_failed_total",
            "Requests failed since start",
            m.failed,
        ),
    ]
    .into_iter()
    .chain(OperationKind::ALL.map(|kind| {
        let (name, help) = launch_counter(kind);
        counter(name, help, m.launches[kind.index()])
    }))
    .collect()
}

/// The name and help of the launch counter of `kind`.
fn launch_counter(kind: OperationKind) -> (&'static str, &'static str) {
    match kind {
        OperationKind::Admit => (
            "flare_launches_admit_total",
            "Admission graphs launched since start",
        ),
        OperationKind::PrefillChunk => (
            "flare_launches_prefill_total",
            "Prefill chunks launched since start",
        ),
        OperationKind::Decode => (
            "flare_launches_decode_total",
            "Decode steps launched since start",
        ),
        OperationKind::Resume => (
            "flare_launches_resume_total",
            "Resume-sampling graphs launched since start",
        ),
        OperationKind::Snapshot => (
            "flare_launches_snapshot_total",
            "Snapshot graphs launched since start",
        ),
        OperationKind::Restore => (
            "flare_launches_restore_total",
            "Restore graphs launched since start",
        ),
    }
}

/// The prefix cache's gauges and counters, when it is enabled: page
/// pressure and snapshot pressure apart.
fn cache_samples(metrics: &Metrics) -> Vec<Sample> {
    let Some(cache) = metrics.cache else {
        return Vec::new();
    };
    let c = cache.counters;
    vec![
        gauge(
            "flare_prefix_checkpoints",
            "Live prefix checkpoints",
            cache.checkpoints,
        ),
        gauge(
            "flare_prefix_pages_held",
            "KV pages checkpoint chains hold",
            cache.pages_held,
        ),
        gauge(
            "flare_prefix_pages_reclaimable",
            "Checkpoint pages eviction could free now",
            cache.pages_reclaimable,
        ),
        gauge(
            "flare_prefix_snapshot_rows",
            "Snapshot rows in the pool",
            cache.rows,
        ),
        gauge(
            "flare_prefix_snapshot_rows_free",
            "Snapshot rows free",
            cache.rows_free,
        ),
        counter(
            "flare_prefix_lookups_total",
            "Admissions that looked up a prefix",
            c.lookups,
        ),
        counter(
            "flare_prefix_hits_total",
            "Admissions that restored a prefix",
            c.hits,
        ),
        counter(
            "flare_prefix_hit_tokens_total",
            "Prompt tokens restored instead of prefilled",
            c.hit_tokens,
        ),
        counter(
            "flare_prefix_published_total",
            "Checkpoints published",
            c.published,
        ),
        counter(
            "flare_prefix_duplicate_publications_total",
            "Captures of an endpoint already cached",
            c.duplicate_publications,
        ),
        counter(
            "flare_prefix_extension_only_total",
            "Checkpoints published for extension only (captured inside a chunk)",
            c.extension_only,
        ),
        counter(
            "flare_prefix_evicted_total",
            "Checkpoints evicted with their pages",
            c.evicted,
        ),
        counter(
            "flare_prefix_superseded_total",
            "Of the evicted, leaves a later branch from their parent superseded",
            c.superseded,
        ),
        counter(
            "flare_prefix_thinned_total",
            "Checkpoints thinned from a chain",
            c.thinned,
        ),
        counter(
            "flare_prefix_page_pressure_total",
            "Times pages were reclaimed from the cache",
            c.page_pressure,
        ),
        counter(
            "flare_prefix_snapshot_pressure_total",
            "Captures that found no free snapshot row",
            c.snapshot_pressure,
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
