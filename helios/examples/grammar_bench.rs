//! Grammar-constrained decoding's host cost on this machine: building the
//! engine over a tokenizer (token bytes, their round-trip check, the trie),
//! compiling a grammar (cold and from the cache), and computing the next
//! token's mask at every step of a canonical output (p50, p90, p99, worst).
//!
//! ```text
//! cargo run --release -p flare-helios --example grammar_bench -- TOKENIZER_JSON [--out F.json]
//! ```

use std::time::Instant;

use helios::frontend::Tokenizer;
use helios::grammar::{GrammarEngine, GrammarSpec};
use serde_json::json;

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: grammar_bench TOKENIZER_JSON [--out F.json]");
    let out = match (args.next().as_deref(), args.next()) {
        (Some("--out"), Some(file)) => Some(file),
        _ => None,
    };
    let text = std::fs::read_to_string(&path).expect("the tokenizer reads");
    let tokenizer = Tokenizer::from_json(&text).expect("the tokenizer loads");
    let stop = (tokenizer.token_to_id("<|im_end|>"))
        .or_else(|| tokenizer.token_to_id("</s>"))
        .unwrap_or(0);
    let started = Instant::now();
    let engine = GrammarEngine::new(&tokenizer, &text, &[stop], tokenizer.vocab_size(), &[])
        .expect("the engine builds");
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "units": {"enum": ["metric", "imperial"]},
        "notes": {"type": "array", "items": {"type": "string"}}},
        "required": ["city", "days", "units"], "additionalProperties": false});
    let spec = GrammarSpec::JsonSchema(schema);
    let started = Instant::now();
    let mut constraint = engine.constraint(&spec).expect("the schema compiles");
    let compile_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let _cached = engine.constraint(&spec).expect("the schema compiles");
    let cached_ms = started.elapsed().as_secs_f64() * 1e3;
    let output = r#"{"city": "Paris, with a long name to make the string run", "days": 12345, "units": "metric", "notes": ["first note about the weather", "second one", "third note, with punctuation: yes!"]}"#;
    let mut tokens = tokenizer.encode(output, false).expect("the output encodes");
    tokens.push(stop);
    let mut mask = vec![0u32; engine.mask_words()];
    let mut micros = Vec::with_capacity(tokens.len());
    for &token in &tokens {
        let started = Instant::now();
        constraint.mask(&mut mask).expect("a mask");
        micros.push(started.elapsed().as_secs_f64() * 1e6);
        assert!(
            mask[token as usize / 32] >> (token % 32) & 1 == 1,
            "token {token} is allowed"
        );
        constraint.advance(token).expect("the token advances");
    }
    let mut sorted = micros.clone();
    sorted.sort_by(f64::total_cmp);
    let report = json!({
        "tokenizer": std::path::Path::new(&path).file_name().map(|n| n.to_string_lossy().into_owned()),
        "vocab_size": tokenizer.vocab_size(),
        "engine_build_ms": build_ms,
        "schema_compile_ms": compile_ms,
        "schema_from_cache_ms": cached_ms,
        "steps": micros.len(),
        "mask_us": {"p50": percentile(&sorted, 0.5), "p90": percentile(&sorted, 0.9),
                    "p99": percentile(&sorted, 0.99), "max": sorted[sorted.len() - 1]},
        "mask_us_per_step": micros,
    });
    let text = serde_json::to_string_pretty(&report).expect("serializes");
    match out {
        Some(file) => std::fs::write(&file, text + "\n").expect("the report writes"),
        None => println!("{text}"),
    }
    eprintln!(
        "vocab {} build {build_ms:.1} ms compile {compile_ms:.2} ms (cached {cached_ms:.3} ms) mask p50 {:.1} us p99 {:.1} us max {:.1} us over {} steps",
        tokenizer.vocab_size(),
        percentile(&sorted, 0.5),
        percentile(&sorted, 0.99),
        sorted[sorted.len() - 1],
        micros.len()
    );
}
