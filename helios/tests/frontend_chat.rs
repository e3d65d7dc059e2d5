//! Chat-template parity with Transformers.
//!
//! Every case in `fixtures/chat/{smollm2,qwen3,features,bos}.json` was rendered by
//! Transformers' `apply_chat_template` (`generate.py` beside them): the prompt
//! Helios renders must be byte-identical and its token ids identical.
//! `errors.json` holds inputs Transformers rejects; Helios must reject them
//! with the matching error variant.

use std::path::PathBuf;

use helios::core::{load_manifest, proto};
use helios::frontend::{
    ChatInput, ChatTemplate, Frontend, FrontendError, InvalidChat, SpecialTokens, Tokenizer,
};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(fixtures().join(name)).expect("fixture is readable")
}

fn json(name: &str) -> Value {
    serde_json::from_str(&read(name)).expect("fixture is JSON")
}

fn special_tokens(suite: &Value) -> SpecialTokens {
    serde_json::from_value(suite["special_tokens"].clone()).expect("special tokens")
}

fn list(value: &Value) -> Option<Vec<Value>> {
    value.as_array().cloned()
}

fn input(case: &Value) -> ChatInput {
    ChatInput {
        messages: list(&case["messages"]).expect("messages"),
        tools: list(&case["tools"]),
        documents: list(&case["documents"]),
        add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap_or(false),
        continue_final_message: case["continue_final_message"].as_bool().unwrap_or(false),
        kwargs: case["kwargs"].as_object().cloned().unwrap_or_default(),
    }
}

fn ids(value: &Value) -> Vec<u32> {
    serde_json::from_value(value.clone()).expect("token ids")
}

/// Renders and encodes every case of a suite; returns how many were checked.
fn check_cases(suite: &Value, template_of: impl Fn(&Value) -> String) -> usize {
    let tokenizer = Tokenizer::from_json(&read(suite["tokenizer"].as_str().unwrap())).unwrap();
    let tokens = special_tokens(suite);
    let cases = suite["cases"].as_array().expect("cases");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let template = ChatTemplate::new(&template_of(case), tokens.clone())
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        let prompt = template
            .render(&input(case))
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(
            prompt,
            case["prompt"].as_str().unwrap(),
            "{name}: prompt bytes"
        );
        let encoded = tokenizer.encode(&prompt, false).unwrap();
        assert_eq!(encoded, ids(&case["token_ids"]), "{name}: token ids");
    }
    cases.len()
}

fn check_suite(file: &str) -> usize {
    let suite = json(file);
    let template = read(suite["template"].as_str().unwrap());
    check_cases(&suite, |_| template.clone())
}

#[test]
fn smollm2_prompts_and_ids_match_transformers() {
    assert!(check_suite("smollm2.json") >= 10);
}

#[test]
fn qwen3_prompts_and_ids_match_transformers() {
    assert!(check_suite("qwen3.json") >= 12);
}

#[test]
fn python_compatible_features_match_transformers() {
    let suite = json("features.json");
    let checked = check_cases(&suite, |case| case["template"].as_str().unwrap().to_owned());
    assert!(checked >= 10);
}

#[test]
fn rejected_inputs_fail_with_the_matching_variant() {
    let suite = json("errors.json");
    let tokens = special_tokens(&suite);
    for case in suite["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let result = ChatTemplate::new(case["template"].as_str().unwrap(), tokens.clone())
            .and_then(|template| template.render(&input(case)));
        let err = result.expect_err(name);
        let matches = match case["kind"].as_str().unwrap() {
            "raised" => matches!(err, FrontendError::TemplateException { .. }),
            "syntax" => matches!(err, FrontendError::TemplateSyntax { .. }),
            "input" => matches!(err, FrontendError::InvalidChat { .. }),
            "render" => matches!(err, FrontendError::TemplateRender { .. }),
            other => panic!("{name}: unknown kind {other}"),
        };
        assert!(matches, "{name}: unexpected {err:?}");
    }
}

#[test]
fn raise_exception_keeps_the_template_message() {
    let template = ChatTemplate::new(
        "{{ raise_exception('Only user and assistant roles are supported!') }}",
        SpecialTokens::default(),
    )
    .unwrap();
    let input = ChatInput {
        messages: vec![serde_json::json!({"role": "user", "content": "x"})],
        ..ChatInput::default()
    };
    match template.render(&input) {
        Err(FrontendError::TemplateException { message }) => {
            assert_eq!(message, "Only user and assistant roles are supported!");
        }
        other => panic!("expected a template exception, got {other:?}"),
    }
}

#[test]
fn input_errors_name_the_reason() {
    let template =
        ChatTemplate::new("{{ messages[0].content }}", SpecialTokens::default()).unwrap();
    let user = serde_json::json!({"role": "user", "content": "x"});
    let cases = [
        (ChatInput::default(), InvalidChat::EmptyConversation),
        (
            ChatInput {
                messages: vec![user.clone()],
                add_generation_prompt: true,
                continue_final_message: true,
                ..ChatInput::default()
            },
            InvalidChat::ContinueWithGenerationPrompt,
        ),
        (
            ChatInput {
                messages: vec![user.clone(), Value::from("not an object")],
                ..ChatInput::default()
            },
            InvalidChat::MessageNotObject { index: 1 },
        ),
        (
            ChatInput {
                messages: vec![user.clone()],
                kwargs: serde_json::from_str(r#"{"messages": []}"#).unwrap(),
                ..ChatInput::default()
            },
            InvalidChat::ReservedVariable {
                name: "messages".to_owned(),
            },
        ),
    ];
    for (input, expected) in cases {
        match template.render(&input) {
            Err(FrontendError::InvalidChat { reason }) => assert_eq!(reason, expected),
            other => panic!("expected {expected:?}, got {other:?}"),
        }
    }
}

#[test]
fn frontend_from_the_tiny_core_encodes_chat_prompts() {
    let core_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-core");
    let core = load_manifest(&core_dir).unwrap();
    let frontend = Frontend::from_core(core.frontend()).unwrap();
    assert_eq!(
        frontend.eos_token_ids(),
        core.frontend().eos_token_ids.as_slice()
    );
    assert!(frontend.is_eos(core.frontend().eos_token_ids[0]));
    let input = ChatInput {
        messages: vec![serde_json::json!({"role": "user", "content": "w1 w2"})],
        add_generation_prompt: true,
        ..ChatInput::default()
    };
    let prompt = frontend.encode_chat(&input).unwrap();
    assert!(prompt.text.ends_with("assistant\n"), "{:?}", prompt.text);
    assert_eq!(
        prompt.token_ids,
        frontend.tokenizer().encode(&prompt.text, false).unwrap()
    );
}

#[test]
fn the_frontend_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Frontend>();
    shareable::<ChatTemplate>();
    shareable::<Tokenizer>();
}

#[test]
fn a_core_without_a_chat_template_serves_no_chat() {
    let core_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-core");
    let mut proto = load_manifest(&core_dir).unwrap().frontend().clone();
    proto.chat_template.clear();
    let frontend = Frontend::from_core(&proto).unwrap();
    assert!(matches!(
        frontend.encode_chat(&ChatInput::default()),
        Err(FrontendError::NoChatTemplate)
    ));
}

/// A core's frontend as the manifest writer lays it out, with `named` as its
/// named special tokens.
fn core_frontend(suite: &Value, named: &[(String, String)]) -> proto::Frontend {
    proto::Frontend {
        tokenizer_json: read(suite["tokenizer"].as_str().unwrap()),
        chat_template: read(suite["template"].as_str().unwrap()),
        eos_token_ids: vec![2],
        named_special_tokens: (named.iter())
            .map(|(name, content)| proto::NamedToken {
                name: name.clone(),
                content: content.clone(),
            })
            .collect(),
        tool_parser: proto::ToolParser::None as i32,
        reasoning_parser: proto::ReasoningParser::None as i32,
        ..proto::Frontend::default()
    }
}

#[test]
fn a_cores_named_special_tokens_render_as_transformers_renders_them() {
    let suite = json("bos.json");
    // What the manifest writer stores: Transformers' `special_tokens_map`.
    let named: Vec<(String, String)> = (suite["special_tokens"].as_object().unwrap().iter())
        .map(|(name, content)| (name.clone(), content.as_str().unwrap().to_owned()))
        .collect();
    assert!(named.iter().any(|(name, _)| name == "bos_token"));
    let frontend = Frontend::from_core(&core_frontend(&suite, &named)).unwrap();
    let cases = suite["cases"].as_array().unwrap();
    assert!(cases.len() >= 4);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let prompt = frontend.encode_chat(&input(case)).unwrap();
        assert_eq!(prompt.text, case["prompt"].as_str().unwrap(), "{name}");
        assert_eq!(prompt.token_ids, ids(&case["token_ids"]), "{name}");
    }
    // A core exported before the manifest carried them renders no BOS.
    let older = Frontend::from_core(&core_frontend(&suite, &[])).unwrap();
    let first = &cases[0];
    let text = older.encode_chat(&input(first)).unwrap().text;
    assert_eq!(format!("<s>{text}"), first["prompt"].as_str().unwrap());
}

#[test]
fn a_special_token_name_templates_never_see_is_refused() {
    let suite = json("bos.json");
    let named = [("begin_token".to_owned(), "<s>".to_owned())];
    let error = Frontend::from_core(&core_frontend(&suite, &named)).unwrap_err();
    assert!(
        matches!(error, FrontendError::UnknownSpecialToken { ref name } if name == "begin_token"),
        "{error}"
    );
}
