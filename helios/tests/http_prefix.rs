//! The prefix cache behind the chat routes: a repeated conversation and an
//! agent's next turn (its reply and a tool result appended) restore what
//! the last request computed instead of prefilling it, with the same
//! output as without the cache, and `/metrics` reports the hits.

mod http_support;

use axum::http::StatusCode;
use http_support::{body_json, body_text, server, Options, Server};
use serde_json::{json, Value};

fn chat(messages: &Value, seed: u64) -> String {
    json!({
        "model": http_support::MODEL,
        "messages": messages,
        "max_tokens": 12,
        "seed": seed,
    })
    .to_string()
}

/// The answer's text and the prompt tokens usage reports cached.
async fn answer(server: &Server, messages: &Value, seed: u64) -> (String, u64) {
    let response = server
        .post("/v1/chat/completions", &chat(messages, seed))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let body = body_json(response).await;
    let text = body["choices"][0]["message"]["content"].as_str().unwrap();
    let usage = &body["usage"];
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached <= usage["prompt_tokens"].as_u64().unwrap());
    (text.to_owned(), cached)
}

fn input(messages: &Value) -> helios::frontend::ChatInput {
    helios::frontend::ChatInput {
        messages: messages.as_array().unwrap().clone(),
        add_generation_prompt: true,
        ..Default::default()
    }
}

/// A counter's value in the `/metrics` text, 0 when absent.
async fn metric(server: &Server, name: &str) -> u64 {
    let text = body_text(server.get("/metrics").await).await;
    (text.lines())
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .map_or(0, |value| value.parse().unwrap())
}

#[tokio::test]
async fn an_agents_next_turn_restores_the_conversation_so_far() {
    let cached = server(Options::default());
    let plain = server(Options {
        no_prefix_cache: true,
        ..Options::default()
    });
    let mut messages = json!([
        {"role": "system", "content": "w1 w2 w3 w4 w5 w6 w7 w8"},
        {"role": "user", "content": "w2 w3 w4 w5 w6 w7 w8 w9 w1 w2"},
    ]);
    let mut reused = 0;
    for turn in 0..3 {
        let (reply, cached_tokens) = answer(&cached, &messages, 40 + turn).await;
        let (direct, none) = answer(&plain, &messages, 40 + turn).await;
        assert_eq!((reply.as_str(), none), (direct.as_str(), 0), "turn {turn}");
        reused += cached_tokens;
        // The repeated request is a whole-prompt hit: same answer, every
        // prompt token cached.
        let (again, all) = answer(&cached, &messages, 40 + turn).await;
        assert_eq!(again, reply);
        let prompt = cached.frontend.encode_chat(&input(&messages)).unwrap();
        assert_eq!(all as usize, prompt.token_ids.len(), "turn {turn}");
        reused += all;
        let list = messages.as_array_mut().unwrap();
        list.push(json!({"role": "assistant", "content": reply}));
        list.push(json!({"role": "user", "content": format!("w{} w3 w5 w7", turn + 1)}));
    }
    let hit_tokens = metric(&cached, "flare_prefix_hit_tokens_total").await;
    let hits = metric(&cached, "flare_prefix_hits_total").await;
    assert!(hits >= 5, "hits {hits}");
    assert_eq!(hit_tokens, reused);
    // Everything not restored was prefilled, and nothing else.
    let prompts = metric(&cached, "flare_prefill_tokens_total").await
        + metric(&cached, "flare_prefix_hit_tokens_total").await;
    assert_eq!(
        prompts,
        metric(&plain, "flare_prefill_tokens_total").await * 2
    );
    assert!(metric(&cached, "flare_prefix_published_total").await > 0);
    assert_eq!(metric(&plain, "flare_prefix_hits_total").await, 0);
}

#[tokio::test]
async fn without_message_checkpoints_each_turn_is_one_prefill_chunk() {
    // --message-checkpoints 0: only the prompt's and the answer's ends are
    // captured, so no message endpoint ends a chunk; the next turn still
    // restores at least the previous prompt (its generation header included;
    // here the answer's end, as the reply is rendered as it was generated).
    let lean = server(Options {
        message_checkpoints: Some(0),
        ..Options::default()
    });
    let full = server(Options::default());
    let mut messages = json!([
        {"role": "system", "content": "w1 w2 w3 w4 w5 w6 w7 w8"},
        {"role": "user", "content": "w2 w3 w4 w5 w6 w7 w8 w9 w1 w2"},
    ]);
    let mut previous_prompt = 0;
    for turn in 0..3 {
        let (reply, cached) = answer(&lean, &messages, 60 + turn).await;
        let (same, _) = answer(&full, &messages, 60 + turn).await;
        assert_eq!(reply, same, "turn {turn}");
        assert!(cached >= previous_prompt, "turn {turn}: {cached} cached");
        assert_eq!(cached == 0, turn == 0, "turn {turn}");
        previous_prompt = lean
            .frontend
            .encode_chat(&input(&messages))
            .unwrap()
            .token_ids
            .len() as u64;
        let list = messages.as_array_mut().unwrap();
        list.push(json!({"role": "assistant", "content": reply}));
        list.push(json!({"role": "user", "content": format!("w{} w3 w5 w7", turn + 2)}));
    }
    // One chunk per turn, and per turn a prompt and a terminal capture.
    assert_eq!(metric(&lean, "flare_launches_prefill_total").await, 3);
    assert_eq!(metric(&lean, "flare_launches_snapshot_total").await, 6);
    // The default offers the message endpoints: more chunks for the same turns.
    assert!(metric(&full, "flare_launches_prefill_total").await > 3);
}

#[tokio::test]
async fn anthropic_usage_counts_cached_input_apart() {
    let server = server(Options::default());
    let body = json!({
        "model": http_support::MODEL,
        "max_tokens": 6,
        "system": "w4 w5 w6",
        "messages": [{"role": "user", "content": "w1 w2 w3 w1 w2 w3"}],
    })
    .to_string();
    let first = body_json(server.post("/v1/messages", &body).await).await;
    let second = body_json(server.post("/v1/messages", &body).await).await;
    let usage = |body: &Value, key: &str| body["usage"][key].as_u64().unwrap();
    assert_eq!(usage(&first, "cache_read_input_tokens"), 0);
    let prompt = usage(&first, "input_tokens");
    // The repeat restores the whole prompt: nothing left to prefill.
    assert_eq!(usage(&second, "cache_read_input_tokens"), prompt);
    assert_eq!(usage(&second, "input_tokens"), 0);
}
