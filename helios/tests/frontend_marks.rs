//! Message marks (`ChatTemplate::render_with_marks`) over the committed
//! SmolLM2 and Qwen3 chat fixtures, and their token endpoints through
//! `helios::prefix::prompt_endpoints` (`Frontend::encode_chat_with_marks`).
//!
//! The rule under test: message k's mark is the length of the conversation
//! truncated after message k, rendered without generation prompt or
//! continuation, when that rendering is a byte prefix of the full prompt
//! and ends past the previous mark; otherwise the message has none.

use std::path::PathBuf;

use helios::core::proto;
use helios::frontend::{
    ChatInput, ChatTemplate, Frontend, FrontendError, InvalidChat, RenderedChat, SpecialTokens,
};
use helios::prefix::prompt_endpoints;
use serde_json::{json, Value};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(fixtures().join(name)).unwrap()
}

fn suite(file: &str) -> Value {
    serde_json::from_str(&read(file)).unwrap()
}

fn special_tokens(suite: &Value) -> SpecialTokens {
    serde_json::from_value(suite["special_tokens"].clone()).unwrap()
}

fn template(suite: &Value) -> ChatTemplate {
    ChatTemplate::new(
        &read(suite["template"].as_str().unwrap()),
        special_tokens(suite),
    )
    .unwrap()
}

fn frontend(suite: &Value) -> Frontend {
    let core = proto::Frontend {
        tokenizer_json: read(suite["tokenizer"].as_str().unwrap()),
        chat_template: read(suite["template"].as_str().unwrap()),
        eos_token_ids: vec![2],
        tool_parser: proto::ToolParser::None as i32,
        reasoning_parser: proto::ReasoningParser::None as i32,
        ..proto::Frontend::default()
    };
    Frontend::new(&core, special_tokens(suite)).unwrap()
}

fn input(case: &Value) -> ChatInput {
    let list = |value: &Value| value.as_array().cloned();
    ChatInput {
        messages: list(&case["messages"]).unwrap(),
        tools: list(&case["tools"]),
        documents: list(&case["documents"]),
        add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap_or(false),
        continue_final_message: case["continue_final_message"].as_bool().unwrap_or(false),
        kwargs: case["kwargs"].as_object().cloned().unwrap_or_default(),
    }
}

/// The request holding the first `k` messages of `input`, as a checkpoint
/// for message k would be reused by: no generation prompt, no continuation.
fn truncated(input: &ChatInput, k: usize) -> ChatInput {
    ChatInput {
        messages: input.messages[..k].to_vec(),
        add_generation_prompt: false,
        continue_final_message: false,
        ..input.clone()
    }
}

/// Checks the rule both ways for every message of `input`.
fn check_marks(name: &str, template: &ChatTemplate, input: &ChatInput, rendered: &RenderedChat) {
    let text = &rendered.text;
    assert_eq!(rendered.message_ends.len(), input.messages.len(), "{name}");
    let mut previous = 0;
    for (index, &end) in rendered.message_ends.iter().enumerate() {
        let prefix = template.render(&truncated(input, index + 1));
        match end {
            Some(mark) => {
                assert!(
                    mark > previous && mark <= text.len(),
                    "{name}: mark {index}"
                );
                assert!(text.is_char_boundary(mark), "{name}: mark {index}");
                assert_eq!(text[..mark], prefix.unwrap(), "{name}: message {index}");
                previous = mark;
            }
            None => {
                let advancing_prefix =
                    prefix.is_ok_and(|prefix| text.starts_with(&prefix) && prefix.len() > previous);
                assert!(!advancing_prefix, "{name}: message {index} has no mark");
            }
        }
    }
    assert_eq!(
        rendered.marks(),
        rendered
            .message_ends
            .iter()
            .flatten()
            .copied()
            .collect::<Vec<_>>()
    );
}

/// Renders every case of a suite with marks; returns the message ends of
/// each case by name.
fn check_suite(file: &str) -> Vec<(String, Vec<Option<usize>>)> {
    let suite = suite(file);
    let template = template(&suite);
    (suite["cases"].as_array().unwrap().iter())
        .map(|case| {
            let name = case["name"].as_str().unwrap().to_owned();
            let input = input(case);
            let rendered = template.render_with_marks(&input).unwrap();
            assert_eq!(rendered.text, case["prompt"].as_str().unwrap(), "{name}");
            check_marks(&name, &template, &input, &rendered);
            (name, rendered.message_ends)
        })
        .collect()
}

fn ends_of<'a>(cases: &'a [(String, Vec<Option<usize>>)], name: &str) -> &'a [Option<usize>] {
    &cases.iter().find(|(case, _)| case == name).unwrap().1
}

#[test]
fn smollm2_marks_every_complete_message() {
    let suite = suite("smollm2.json");
    let cases = check_suite("smollm2.json");
    assert!(cases.len() >= 10);
    for ((name, ends), case) in cases.iter().zip(suite["cases"].as_array().unwrap()) {
        // ChatML renders each message alone, so each has a mark, except a
        // final message left open by continue_final_message.
        let open = case["continue_final_message"].as_bool().unwrap_or(false);
        let (last, complete) = ends.split_last().unwrap();
        assert!(complete.iter().all(Option::is_some), "{name}: {ends:?}");
        assert_eq!(last.is_some(), !open, "{name}: {ends:?}");
    }
    // The final mark of a prompt without generation prompt is its end.
    let text_len = suite["cases"].as_array().unwrap()[2]["prompt"]
        .as_str()
        .unwrap()
        .len();
    assert_eq!(cases[2].0, "multi_turn_no_generation_prompt");
    assert_eq!(*cases[2].1.last().unwrap(), Some(text_len));
}

#[test]
fn qwen3_marks_only_messages_rendered_the_same_later() {
    let cases = check_suite("qwen3.json");
    assert!(cases.len() >= 12);
    // Reasoning of an assistant turn before the last user query is dropped
    // from the full prompt, but the conversation truncated after that turn
    // ends with it (there, no user query follows).
    let dropped = ends_of(&cases, "reasoning_before_last_query_dropped");
    assert!(matches!(dropped, [Some(_), None, Some(_)]), "{dropped:?}");
    // After the last query, an assistant turn rendered last gets an empty
    // <think></think> block, and loses it once tool results follow; of two
    // consecutive tool results, the first closes the user turn holding them
    // only when rendered last.
    let tools = ends_of(&cases, "tool_calls_and_results");
    assert!(
        matches!(tools, [Some(_), Some(_), None, None, Some(_), Some(_)]),
        "{tools:?}"
    );
    // Reasoning after the last query stays; the turn keeps its mark.
    let kept = ends_of(&cases, "reasoning_content_after_last_query");
    assert!(kept.iter().all(Option::is_some), "{kept:?}");
    // The continued message is open: no mark.
    let open = ends_of(&cases, "continue_final_message_after_tools");
    assert_eq!(open.last(), Some(&None));
    assert!(open[..open.len() - 1].iter().any(Option::is_some));
    let unicode = ends_of(&cases, "unicode");
    assert!(unicode.iter().all(Option::is_some), "{unicode:?}");
}

#[test]
fn rejected_and_empty_truncations_have_no_mark() {
    let template = ChatTemplate::new(
        "{% if messages|length < 2 %}{{ raise_exception('two messages at least') }}{% endif %}\
         {% for m in messages %}{% if m.role != 'note' %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}",
        SpecialTokens::default(),
    )
    .unwrap();
    let input = ChatInput {
        messages: vec![
            json!({"role": "user", "content": "a"}),
            json!({"role": "note", "content": "unrendered"}),
            json!({"role": "assistant", "content": "b"}),
        ],
        ..ChatInput::default()
    };
    let rendered = template.render_with_marks(&input).unwrap();
    assert_eq!(rendered.text, "user: a\nassistant: b\n");
    // Message 0 alone is rejected; message 1 adds nothing past message 0's
    // (absent) mark, but its truncation is the first accepted one.
    assert_eq!(rendered.message_ends, vec![None, Some(8), Some(21)]);
    check_marks("inline", &template, &input, &rendered);

    let empty = template.render_with_marks(&ChatInput::default());
    assert!(matches!(
        empty,
        Err(FrontendError::InvalidChat {
            reason: InvalidChat::EmptyConversation
        })
    ));
}

#[test]
fn a_message_that_renders_nothing_has_no_mark() {
    let template = ChatTemplate::new(
        "{% for m in messages %}{% if m.role != 'system' %}{{ m.content }};{% endif %}{% endfor %}",
        SpecialTokens::default(),
    )
    .unwrap();
    let input = ChatInput {
        messages: vec![
            json!({"role": "system", "content": "hidden"}),
            json!({"role": "user", "content": "a"}),
            json!({"role": "system", "content": "hidden"}),
        ],
        ..ChatInput::default()
    };
    let rendered = template.render_with_marks(&input).unwrap();
    assert_eq!(rendered.text, "a;");
    assert_eq!(rendered.message_ends, vec![None, Some(2), None]);
}

/// Maps every case's marks through its token spans and checks the
/// endpoints: each cuts right after a token ending at a mark, before a
/// token starting at or after it, and the first k tokens are those of the
/// truncated conversation encoded on its own. Returns the endpoints found.
fn check_endpoints(frontend: &Frontend, input: &ChatInput) -> usize {
    let prompt = frontend.encode_chat_with_marks(input).unwrap();
    let plain = frontend.encode_chat(input).unwrap();
    assert_eq!(
        (&prompt.text, &prompt.token_ids),
        (&plain.text, &plain.token_ids)
    );
    let marks = prompt.marks();
    let endpoints = prompt_endpoints(&prompt.text, &marks, &prompt.token_offsets).unwrap();
    assert_eq!(endpoints.prompt as usize, prompt.token_ids.len());
    let offsets = &prompt.token_offsets;
    for &k in &endpoints.messages {
        let k = k as usize;
        let mark = offsets[k - 1].1;
        assert!(
            marks.contains(&mark),
            "endpoint {k} ends at {mark}, not a mark"
        );
        assert!(offsets[k..].iter().all(|&(start, _)| start >= mark));
        let message = prompt
            .message_ends
            .iter()
            .position(|&end| end == Some(mark));
        let reused = frontend
            .encode_chat(&truncated(input, message.unwrap() + 1))
            .unwrap();
        assert_eq!(reused.text, prompt.text[..mark]);
        assert_eq!(reused.token_ids, prompt.token_ids[..k], "endpoint {k}");
    }
    // ChatML: every message ends in "<|im_end|>\n" and the next starts with
    // the special token <|im_start|>, so no token crosses a mark.
    let inside = marks.iter().filter(|&&mark| mark < prompt.text.len());
    assert_eq!(endpoints.messages.len(), inside.count());
    endpoints.messages.len()
}

#[test]
fn smollm2_chat_endpoints_end_at_marks() {
    let frontend = frontend(&suite("smollm2.json"));
    let chat = ChatInput {
        messages: vec![
            json!({"role": "system", "content": "You are a helpful agent.  "}),
            json!({"role": "user", "content": "List the files in 東京/ and ✓ them.\n\n"}),
            json!({"role": "assistant", "content": " Calling ls now 🦀"}),
            json!({"role": "tool", "content": "{\"files\": [\"a.rs\", \"b.rs\"]}\n"}),
            json!({"role": "user", "content": "héllo wörld"}),
        ],
        add_generation_prompt: true,
        ..ChatInput::default()
    };
    assert_eq!(check_endpoints(&frontend, &chat), 5);
    let suite = suite("smollm2.json");
    for case in suite["cases"].as_array().unwrap() {
        check_endpoints(&frontend, &input(case));
    }
}

#[test]
fn qwen3_chat_endpoints_end_at_marks() {
    let suite = suite("qwen3.json");
    let frontend = frontend(&suite);
    let total: usize = (suite["cases"].as_array().unwrap().iter())
        .map(|case| check_endpoints(&frontend, &input(case)))
        .sum();
    assert!(total > 20, "{total}");
}

/// The cost of encoding a long agent conversation's next turn (about 120K
/// tokens of tool results under the Qwen3 fixture's tokenizer): rendering,
/// a cold encoding, and the next turn encoded with its last eight messages
/// marked, which reuses the history's tokens. Run with `--release --ignored
/// --nocapture`; it asserts only that the paths agree.
#[test]
#[ignore = "a timing probe: run it by hand"]
fn next_turn_encoding_cost_on_a_long_agent_conversation() {
    let suite = suite("qwen3.json");
    let frontend = frontend(&suite);
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Find why the nightly job fails."}),
    ];
    let exchange = |turn: usize| {
        let call = json!({"name": "read_file", "arguments": {"path": format!("src/f{turn}.rs")}});
        let body: String = (0..400)
            .map(|i| format!("w{} ", (turn * 31 + i) % 997))
            .collect();
        [
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": format!("c{turn}"), "type": "function", "function": call}]}),
            json!({"role": "tool", "tool_call_id": format!("c{turn}"), "content": body}),
        ]
    };
    for turn in 0..60 {
        messages.extend(exchange(turn));
    }
    let input = |messages: &[Value]| ChatInput {
        messages: messages.to_vec(),
        add_generation_prompt: true,
        ..ChatInput::default()
    };
    let started = std::time::Instant::now();
    let text = template(&suite).render(&input(&messages)).unwrap();
    let render_time = started.elapsed();
    let started = std::time::Instant::now();
    let cold = frontend
        .encode_chat_with_recent_marks(&input(&messages), 8)
        .unwrap();
    let cold_time = started.elapsed();
    assert_eq!(cold.text, text);
    messages.extend(exchange(60));
    let started = std::time::Instant::now();
    let next = frontend
        .encode_chat_with_recent_marks(&input(&messages), 8)
        .unwrap();
    let next_time = started.elapsed();
    let fresh = frontend.tokenizer().encode(&next.text, false).unwrap();
    assert_eq!(next.token_ids, fresh);
    eprintln!(
        "{} tokens, {} bytes: render {render_time:?}, cold encode with marks {cold_time:?}, \
         next turn {next_time:?} ({} endpoints)",
        next.token_ids.len(),
        next.text.len(),
        next.message_endpoints().len()
    );
}
