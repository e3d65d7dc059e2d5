//! Required tool calls by construction: under the grammar of each call
//! format, a walk that picks allowed tokens (at random, then preferring ones
//! that close what is open) always ends in output the output parser reads
//! as completed calls to declared tools, with arguments valid against their
//! schemas, one call when parallel calls are off, nothing but calls (and
//! reasoning) otherwise.

use std::path::PathBuf;

use helios::frontend::protocol::{
    CustomInput, Marker, MarkerKind, OutputProtocol, ParsedOutput, ReasoningSyntax, ToolFormat,
    ToolSet, ToolSyntax,
};
use helios::frontend::Tokenizer;
use helios::grammar::token_bytes::{vocabulary_bytes, SPECIAL_MARKER};
use helios::grammar::{
    answer_or_calls_grammar, auto_call_grammar, tool_call_grammar, GrammarEngine, GrammarSpec,
};
use serde_json::{json, Value};

fn qwen() -> (Tokenizer, String) {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat/qwen.tokenizer.json");
    let json = std::fs::read_to_string(path).unwrap();
    (Tokenizer::from_json(&json).unwrap(), json)
}

fn marker(tokenizer: &Tokenizer, text: &str, by_token: bool) -> Marker {
    Marker {
        text: text.to_owned(),
        token_id: by_token.then(|| tokenizer.token_to_id(text).unwrap()),
    }
}

fn protocol(
    tokenizer: &Tokenizer,
    format: ToolFormat,
    by_token: bool,
    reasoning: bool,
) -> OutputProtocol {
    let (start, end, separator) = match format {
        ToolFormat::JsonAnswer => (None, None, ";".to_owned()),
        _ => (
            Some(marker(tokenizer, "<tool_call>", by_token)),
            Some(marker(tokenizer, "</tool_call>", by_token)),
            String::new(),
        ),
    };
    OutputProtocol {
        tools: Some(ToolSyntax {
            format,
            call_start: start,
            call_end: end,
            separator,
        }),
        reasoning: reasoning.then(|| ReasoningSyntax {
            start: marker(tokenizer, "<think>", by_token),
            end: marker(tokenizer, "</think>", by_token),
        }),
    }
}

fn tools() -> ToolSet {
    ToolSet::from_definitions(&[
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                           "days": {"type": "integer", "enum": [1, 3]}},
            "required": ["city"]}}}),
        // No free-form arguments: the walk's strings are the enums'.
        json!({"type": "function", "function": {"name": "now", "parameters": {
            "type": "object", "properties": {}, "additionalProperties": false}}}),
    ])
    .unwrap()
}

/// The arguments are valid against the test tools' schemas.
fn valid(name: &str, arguments: &str) -> bool {
    let Ok(Value::Object(arguments)) = serde_json::from_str::<Value>(arguments) else {
        return false;
    };
    match name {
        "get_weather" => {
            let city = arguments.get("city").and_then(Value::as_str);
            let days_ok = arguments.get("days").is_none_or(|d| d == 1 || d == 3);
            matches!(city, Some("Paris" | "Oslo"))
                && days_ok
                && arguments.keys().all(|k| k == "city" || k == "days")
        }
        "now" => true,
        _ => false,
    }
}

/// Walks the grammar; the output parsed by the protocol's own parser.
fn walk(protocol: &OutputProtocol, parallel: bool, in_reasoning: bool, seed: u64) -> ParsedOutput {
    walk_tools(protocol, &tools(), parallel, in_reasoning, seed)
}

/// [`walk`] over `tools`.
fn walk_tools(
    protocol: &OutputProtocol,
    tools: &ToolSet,
    parallel: bool,
    in_reasoning: bool,
    seed: u64,
) -> ParsedOutput {
    let (tokenizer, json) = qwen();
    let bytes = vocabulary_bytes(&tokenizer, &json).unwrap();
    let stops = [tokenizer.token_to_id("<|im_end|>").unwrap()];
    let delimiters: Vec<u32> = protocol
        .marker_tokens()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let engine = GrammarEngine::new(&tokenizer, &json, &stops, bytes.len(), &delimiters).unwrap();
    let grammar = tool_call_grammar(protocol, tools, parallel, in_reasoning).unwrap();
    let mut constraint = engine
        .constraint(&GrammarSpec::Lark(grammar.clone()))
        .unwrap_or_else(|e| panic!("{e}\n{grammar}"));
    let mut parser = protocol.parser(Some(tools.clone()), in_reasoning);
    let mut events = Vec::new();
    let mut mask = vec![0u32; engine.mask_words()];
    let mut state = seed;
    // What closes an open construct: markers, tags, brackets, quotes.
    let mut closers: Vec<Vec<u8>> = ["}", "\"", "\n", "</parameter>\n", "; "]
        .iter()
        .map(|text| text.as_bytes().to_vec())
        .collect();
    // A marker read by id is a token, not text to spell.
    let call_end = protocol.tools.as_ref().unwrap().call_end.as_ref();
    let reasoning_end = protocol.reasoning.as_ref().map(|r| &r.end);
    for marker in [call_end, reasoning_end].into_iter().flatten() {
        if marker.token_id.is_none() {
            closers.push(marker.text.as_bytes().to_vec());
        }
    }
    let mut output: Vec<u8> = Vec::new();
    for step in 0..4000 {
        constraint.mask(&mut mask).unwrap();
        let allowed: Vec<usize> = (0..bytes.len())
            .filter(|&id| mask[id / 32] >> (id % 32) & 1 == 1)
            .collect();
        assert!(
            !allowed.is_empty(),
            "nothing allowed at step {step}\n{grammar}"
        );
        // At random at first, then towards closing what is open: a token that
        // ends a closer scores 2, one that ends a closer's prefix 1.
        let score = |id: usize| -> usize {
            // Ending beats closing reasoning, which beats closing a call.
            if stops.contains(&(id as u32)) {
                return 1006;
            }
            let ends = |marker: Option<&Marker>, kind: MarkerKind| {
                protocol.marker_token(id as u32) == Some(kind)
                    || marker.is_some_and(|m| m.text.as_bytes() == bytes[id].as_slice())
            };
            if ends(
                protocol.reasoning.as_ref().map(|r| &r.end),
                MarkerKind::ReasoningEnd,
            ) {
                return 1005;
            }
            let call_end = protocol.tools.as_ref().unwrap().call_end.as_ref();
            if ends(call_end, MarkerKind::CallEnd) {
                return 1004;
            }
            if protocol.marker_token(id as u32).is_some() {
                return 1003;
            }
            // Otherwise the longest run of a closer the token would end
            // the output with (a whole one counts a little more, so that a
            // long closer begun beats a one-character one completed).
            let mut next = output.clone();
            next.extend_from_slice(&bytes[id]);
            let progress = closers
                .iter()
                .flat_map(|closer| {
                    (1..=closer.len())
                        .filter(|&n| next.ends_with(&closer[..n]))
                        .map(move |n| 10 * n + if n == closer.len() { 5 } else { 0 })
                })
                .max()
                .unwrap_or(0);
            if progress == 0 {
                0
            } else {
                10 + progress
            }
        };
        let best = allowed.iter().map(|&id| score(id)).max().unwrap_or(0);
        let preferred: Vec<usize> = allowed
            .iter()
            .copied()
            .filter(|&id| score(id) == best)
            .collect();
        let pool = if step > 8 && best > 0 {
            &preferred
        } else {
            &allowed
        };
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let token = pool[(state >> 33) as usize % pool.len()];
        constraint.advance(token as u32).unwrap();
        if stops.contains(&(token as u32)) {
            events.extend(parser.finish());
            let mut parsed = ParsedOutput::default();
            for event in &events {
                parsed.apply(event);
            }
            return parsed;
        }
        match protocol.marker_token(token as u32) {
            Some(kind) => events.extend(parser.push_marker(kind)),
            None => {
                assert_ne!(bytes[token].first(), Some(&SPECIAL_MARKER));
                output.extend_from_slice(&bytes[token]);
                events.extend(parser.push_text(&String::from_utf8_lossy(&bytes[token])));
            }
        }
    }
    panic!(
        "the walk did not end: {:?}\n{grammar}",
        String::from_utf8_lossy(&output[output.len().saturating_sub(300)..])
    );
}

#[test]
fn every_format_gives_completed_valid_calls_and_nothing_else() {
    let (tokenizer, _) = qwen();
    // (format, markers by token id, reasoning): textual reasoning markers
    // go with textual call markers only where the model reasons in text and
    // calls by text, which the grammar does not separate (see
    // `tool_calls.rs`), so they are walked without reasoning.
    let cases = [
        (ToolFormat::JsonInTags, true, true),
        (ToolFormat::JsonInTags, false, false),
        (ToolFormat::JsonInstructed, false, false),
        (ToolFormat::XmlFunctions, true, true),
        (ToolFormat::XmlFunctions, false, false),
        (ToolFormat::JsonAnswer, false, false),
    ];
    let mut calls = 0;
    for (format, by_token, reasoning) in cases {
        let protocol = protocol(&tokenizer, format, by_token, reasoning);
        for seed in 0..6 {
            for parallel in [false, true] {
                let parsed = walk(&protocol, parallel, false, seed);
                let label =
                    format!("{format:?} by_token={by_token} seed={seed} parallel={parallel}");
                assert!(!parsed.calls.is_empty(), "{label}: no call in {parsed:?}");
                assert!(parallel || parsed.calls.len() == 1, "{label}: {parsed:?}");
                assert_eq!(parsed.text, "", "{label}: free text {parsed:?}");
                for call in &parsed.calls {
                    assert!(call.complete, "{label}: {call:?}");
                    assert!(valid(&call.name, &call.arguments), "{label}: {call:?}");
                }
                calls += parsed.calls.len();
            }
        }
    }
    assert!(calls >= 60, "{calls} calls");
}

#[test]
fn an_open_reasoning_block_is_closed_before_the_call() {
    let (tokenizer, _) = qwen();
    for by_token in [true] {
        let protocol = protocol(&tokenizer, ToolFormat::JsonInTags, by_token, true);
        for seed in 0..4 {
            let parsed = walk(&protocol, false, true, seed);
            assert_eq!(parsed.calls.len(), 1, "by_token={by_token}: {parsed:?}");
            assert!(
                valid(&parsed.calls[0].name, &parsed.calls[0].arguments),
                "{parsed:?}"
            );
            assert_eq!(parsed.text, "");
        }
    }
    // A marker the protocol reads by id is one token in the grammar.
    let protocol = protocol(&tokenizer, ToolFormat::JsonInTags, true, true);
    let grammar = tool_call_grammar(&protocol, &tools(), false, false).unwrap();
    let id = tokenizer.token_to_id("<tool_call>").unwrap();
    assert!(grammar.contains(&format!("<[{id}]>")), "{grammar}");
    assert_eq!(protocol.marker_token(id), Some(MarkerKind::CallStart));
}

/// One piece of an output fed to a grammar: text as the tokenizer encodes
/// it, or a marker's added token.
enum Piece<'a> {
    Text(&'a str),
    Token(u32),
}

/// Feeds `pieces` then the stop token to `grammar`: `Err` names the first
/// token the grammar's mask does not allow.
fn feed(protocol: &OutputProtocol, grammar: &str, pieces: &[Piece]) -> Result<(), String> {
    let (tokenizer, json) = qwen();
    let bytes = vocabulary_bytes(&tokenizer, &json).unwrap();
    let stop = tokenizer.token_to_id("<|im_end|>").unwrap();
    let delimiters: Vec<u32> = (protocol.marker_tokens().into_iter())
        .map(|(id, _)| id)
        .collect();
    let engine = GrammarEngine::new(&tokenizer, &json, &[stop], bytes.len(), &delimiters).unwrap();
    let mut constraint = engine
        .constraint(&GrammarSpec::Lark(grammar.to_owned()))
        .unwrap_or_else(|e| panic!("{e}\n{grammar}"));
    let mut mask = vec![0u32; engine.mask_words()];
    let mut tokens = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(text) => tokens.extend(tokenizer.encode(text, false).unwrap()),
            Piece::Token(id) => tokens.push(*id),
        }
    }
    tokens.push(stop);
    for (at, &token) in tokens.iter().enumerate() {
        constraint.mask(&mut mask).unwrap();
        if mask[token as usize / 32] >> (token % 32) & 1 == 0 {
            let shown = String::from_utf8_lossy(&bytes[token as usize]).into_owned();
            let before: Vec<u8> = (tokens[..at].iter())
                .flat_map(|&t| bytes[t as usize].clone())
                .collect();
            let before = String::from_utf8_lossy(&before);
            let before = &before[before.len().saturating_sub(60)..];
            return Err(format!(
                "token {at} ({shown:?}) is not allowed after {before:?}"
            ));
        }
        constraint.advance(token).unwrap();
    }
    Ok(())
}

/// A call to `get_weather` for `city` in `format`, its markers by id when
/// `by_token` (the test's strings are leaked: a few bytes per test).
fn weather_call(
    tokenizer: &Tokenizer,
    format: ToolFormat,
    by_token: bool,
    city: &str,
) -> Vec<Piece<'static>> {
    let leak = |text: String| -> &'static str { Box::leak(text.into_boxed_str()) };
    let body = match format {
        ToolFormat::XmlFunctions => {
            format!(
                "\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n</function>\n"
            )
        }
        ToolFormat::JsonAnswer => {
            format!("{{\"name\": \"get_weather\", \"parameters\": {{\"city\": \"{city}\"}}}}")
        }
        _ => format!("\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\"}}}}\n"),
    };
    match format {
        ToolFormat::JsonAnswer => vec![Piece::Text(leak(body))],
        _ if by_token => vec![
            Piece::Token(tokenizer.token_to_id("<tool_call>").unwrap()),
            Piece::Text(leak(body)),
            Piece::Token(tokenizer.token_to_id("</tool_call>").unwrap()),
        ],
        _ => vec![Piece::Text(leak(format!("<tool_call>{body}</tool_call>")))],
    }
}

/// Every call format, with markers by token id and as text.
const FORMATS: [(ToolFormat, bool); 6] = [
    (ToolFormat::JsonInTags, true),
    (ToolFormat::JsonInTags, false),
    (ToolFormat::JsonInstructed, false),
    (ToolFormat::XmlFunctions, true),
    (ToolFormat::XmlFunctions, false),
    (ToolFormat::JsonAnswer, false),
];

#[test]
fn auto_with_strict_tools_leaves_text_free_and_holds_calls_to_their_schemas() {
    let (tokenizer, _) = qwen();
    for (format, by_token) in FORMATS {
        let protocol = protocol(&tokenizer, format, by_token, false);
        let label = format!("{format:?} by_token={by_token}");
        let single = auto_call_grammar(&protocol, &tools(), false, false).unwrap();
        let parallel = auto_call_grammar(&protocol, &tools(), true, false).unwrap();
        let text = Piece::Text("It is sunny, {they say}.");
        // Prose needs no call, whatever it holds.
        assert_eq!(
            feed(&protocol, &single, &[text]),
            Ok(()),
            "{label}\n{single}"
        );
        assert_eq!(
            feed(&protocol, &single, &[]),
            Ok(()),
            "{label}: an empty answer"
        );
        let paris = weather_call(&tokenizer, format, by_token, "Paris");
        let oslo = weather_call(&tokenizer, format, by_token, "Oslo");
        let rome = weather_call(&tokenizer, format, by_token, "Rome");
        let lead: &[Piece] = match format {
            // The bare JSON format calls at the start or not at all.
            ToolFormat::JsonAnswer => &[],
            _ => &[Piece::Text("Let me check. ")],
        };
        let with = |calls: &[&[Piece<'static>]]| -> Vec<Piece<'static>> {
            let mut pieces: Vec<Piece> = lead.iter().map(copy).collect();
            for (i, call) in calls.iter().enumerate() {
                if i > 0 {
                    pieces.push(Piece::Text(match format {
                        ToolFormat::JsonAnswer => "; ",
                        _ => "\n",
                    }));
                }
                pieces.extend(call.iter().map(copy));
            }
            pieces
        };
        assert_eq!(
            feed(&protocol, &single, &with(&[&paris])),
            Ok(()),
            "{label}"
        );
        assert!(
            feed(&protocol, &single, &with(&[&rome])).is_err(),
            "{label}: an argument outside the schema"
        );
        assert!(
            feed(&protocol, &single, &with(&[&paris, &oslo])).is_err(),
            "{label}: a second call without parallel calls"
        );
        assert_eq!(
            feed(&protocol, &parallel, &with(&[&paris, &oslo])),
            Ok(()),
            "{label}\n{parallel}"
        );
    }
}

fn copy<'a>(piece: &Piece<'a>) -> Piece<'a> {
    match piece {
        Piece::Text(text) => Piece::Text(text),
        Piece::Token(id) => Piece::Token(*id),
    }
}

#[test]
fn a_schema_with_auto_tools_is_its_answer_or_calls_and_nothing_else() {
    let (tokenizer, _) = qwen();
    let schema = json!({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"], "additionalProperties": false});
    for (format, by_token) in [
        (ToolFormat::JsonInTags, true),
        (ToolFormat::JsonInstructed, false),
        (ToolFormat::XmlFunctions, true),
        (ToolFormat::JsonAnswer, false),
    ] {
        let protocol = protocol(&tokenizer, format, by_token, false);
        let label = format!("{format:?} by_token={by_token}");
        let grammar = answer_or_calls_grammar(&protocol, &schema, &tools(), false, false).unwrap();
        let answer = |text: &'static str| feed(&protocol, &grammar, &[Piece::Text(text)]);
        assert_eq!(answer(r#"{"answer": "yes"}"#), Ok(()), "{label}\n{grammar}");
        assert!(answer(r#"{"answer": "maybe"}"#).is_err(), "{label}");
        assert!(answer("Yes, it is.").is_err(), "{label}: prose");
        let paris = weather_call(&tokenizer, format, by_token, "Paris");
        assert_eq!(
            feed(&protocol, &grammar, &paris),
            Ok(()),
            "{label}\n{grammar}"
        );
        let rome = weather_call(&tokenizer, format, by_token, "Rome");
        assert!(feed(&protocol, &grammar, &rome).is_err(), "{label}");
    }
}

/// A custom tool's grammar that needs escapes in JSON: a word, then a
/// newline, tab, quote or backslash, then a number.
const SAY: &str = "start: \"say \" WORD SEP NUM\nSEP: \"\\n\" | \"\\t\" | \"\\\"\" | \"\\\\\"\n\
                   WORD: /[a-z]{1,3}/\nNUM: /[0-9]{1,2}/\n";
/// What SAY's language is, as a regex.
const SAY_RX: &str = "^say [a-z]{1,3}(\n|\t|\"|\\\\)[0-9]{1,2}$";

/// Two custom tools: `say` in the Lark grammar SAY, `answer` by a regex.
fn custom_tools() -> ToolSet {
    let input = json!({"type": "object", "properties": {"input": {"type": "string"}},
        "required": ["input"], "additionalProperties": false});
    ToolSet::from_definitions(&[
        json!({"type": "function", "function": {"name": "say", "parameters": input}}),
        json!({"type": "function", "function": {"name": "answer", "parameters": input}}),
    ])
    .unwrap()
    .with_custom(&[
        ("say".to_owned(), CustomInput::Lark(SAY.to_owned())),
        (
            "answer".to_owned(),
            CustomInput::Regex("^(yes|no)\\n$".to_owned()),
        ),
    ])
}

#[test]
fn custom_tool_inputs_follow_their_grammar_escaped_in_json_and_raw_in_xml() {
    let (tokenizer, _) = qwen();
    let say = regex::Regex::new(SAY_RX).unwrap();
    let answer = regex::Regex::new("^(yes|no)\n$").unwrap();
    let mut inputs = 0;
    for (format, by_token) in FORMATS {
        let protocol = protocol(&tokenizer, format, by_token, false);
        for seed in 0..6 {
            let parsed = walk_tools(&protocol, &custom_tools(), true, false, seed);
            let label = format!("{format:?} by_token={by_token} seed={seed}");
            assert!(!parsed.calls.is_empty(), "{label}: {parsed:?}");
            for call in &parsed.calls {
                assert!(call.complete, "{label}: {call:?}");
                let arguments: Value = serde_json::from_str(&call.arguments).unwrap();
                let input = arguments["input"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{call:?}"));
                let language = if call.name == "say" { &say } else { &answer };
                assert!(language.is_match(input), "{label}: {input:?} from {call:?}");
                inputs += 1;
            }
        }
    }
    assert!(inputs >= 30, "{inputs} inputs");
}

#[test]
fn a_patch_grammar_holds_the_escaped_and_the_raw_input() {
    // An apply_patch-like grammar, as Codex sends (Lark, common.LF).
    let patch =
        "start: begin hunk+ end\nbegin: \"*** Begin Patch\" LF\nend: \"*** End Patch\" LF?\n\
                 hunk: \"*** Add File: \" FILENAME LF (\"+\" LINE LF)+\nFILENAME: /[^\\n]+/\n\
                 LINE: /[^\\n]*/\n%import common.LF\n";
    let tools = ToolSet::from_definitions(&[json!({"type": "function", "function": {
        "name": "apply_patch", "parameters": {"type": "object",
            "properties": {"input": {"type": "string"}}, "required": ["input"]}}})])
    .unwrap()
    .with_custom(&[(
        "apply_patch".to_owned(),
        CustomInput::Lark(patch.to_owned()),
    )]);
    let (tokenizer, _) = qwen();
    let text = "*** Begin Patch\n*** Add File: a \"b\".txt\n+hello\\world\n*** End Patch\n";
    let escaped = serde_json::to_string(text).unwrap();
    let json = protocol(&tokenizer, ToolFormat::JsonInTags, false, false);
    let grammar = tool_call_grammar(&json, &tools, false, false).unwrap();
    let call = |input: &str| {
        format!(
            "<tool_call>\n{{\"name\": \"apply_patch\", \"arguments\": {{\"input\": {input}}}}}\
             \n</tool_call>"
        )
    };
    assert_eq!(
        feed(&json, &grammar, &[Piece::Text(&call(&escaped))]),
        Ok(()),
        "{grammar}"
    );
    // Unescaped, the same patch breaks the JSON string; one outside the
    // grammar (no End Patch) is refused too.
    let raw = format!("\"{text}\"");
    assert!(feed(&json, &grammar, &[Piece::Text(&call(&raw))]).is_err());
    let cut = serde_json::to_string(&text.replace("*** End Patch\n", "")).unwrap();
    assert!(feed(&json, &grammar, &[Piece::Text(&call(&cut))]).is_err());
    let xml = protocol(&tokenizer, ToolFormat::XmlFunctions, false, false);
    let grammar = tool_call_grammar(&xml, &tools, false, false).unwrap();
    let body = format!(
        "<tool_call>\n<function=apply_patch>\n<parameter=input>\n{text}\n</parameter>\n\
         </function>\n</tool_call>"
    );
    assert_eq!(
        feed(&xml, &grammar, &[Piece::Text(&body)]),
        Ok(()),
        "{grammar}"
    );
}
