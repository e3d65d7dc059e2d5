//! The rewrite of a chat request for a template that renders no tools
//! (`instructed_input`), against `fixtures/chat/instructed.json`: the suite's
//! Python replay floor mirrors it (`bench/suite/instructed.py`) and is held to
//! the same expected messages (`tests/test_suite_instructed.py`), so both
//! prefill the same prompt.

use std::path::PathBuf;

use helios::frontend::protocol::instructed_input;
use helios::frontend::ChatInput;
use serde_json::Value;

#[test]
fn every_case_gives_the_expected_messages() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat/instructed.json");
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture is readable"))
            .expect("fixture is JSON");
    let cases = fixture["cases"].as_array().expect("cases");
    assert!(cases.len() >= 5, "{} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let mut input = ChatInput {
            messages: case["messages"].as_array().expect("messages").clone(),
            tools: case["tools"].as_array().cloned(),
            ..ChatInput::default()
        };
        instructed_input(
            &mut input,
            case["call_start"].as_str().expect("call_start"),
            case["call_end"].as_str().expect("call_end"),
        );
        assert_eq!(input.tools, None, "{name}");
        assert_eq!(Value::Array(input.messages), case["expected"], "{name}");
    }
}
