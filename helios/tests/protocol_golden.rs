//! The output parser on the golden corpus of every tool-call and reasoning
//! format (`fixtures/protocol/golden.json`, written by hand): each output
//! parses to its expected text, reasoning and calls whole, split at every
//! character boundary, a character at a time, at random boundaries and at
//! the tokens a byte-level BPE makes of it; every stream of events is
//! well formed (a call is named once, before its arguments).

mod protocol_support;

use std::path::PathBuf;

use helios::frontend::protocol::{
    Marker, MarkerKind, OutputProtocol, ParsedOutput, ParsedToolCall, ReasoningSyntax, ToolFormat,
    ToolSet, ToolSyntax,
};
use helios::frontend::{Detokenizer, Tokenizer};
use protocol_support::{feed, Piece};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn golden() -> Value {
    let text = std::fs::read_to_string(fixture("protocol/golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn marker(value: &Value) -> Option<Marker> {
    Some(Marker {
        text: value.get("text")?.as_str()?.to_owned(),
        token_id: value
            .get("token_id")
            .and_then(Value::as_u64)
            .map(|id| id as u32),
    })
}

fn protocol(spec: &Value) -> OutputProtocol {
    let format = match spec["format"].as_str().unwrap() {
        "json_in_tags" => ToolFormat::JsonInTags,
        "xml_functions" => ToolFormat::XmlFunctions,
        "json_answer" => ToolFormat::JsonAnswer,
        "json_instructed" => ToolFormat::JsonInstructed,
        other => panic!("unknown format {other}"),
    };
    let reasoning = spec.get("reasoning").map(|r| ReasoningSyntax {
        start: marker(&r["start"]).unwrap(),
        end: marker(&r["end"]).unwrap(),
    });
    OutputProtocol {
        tools: Some(ToolSyntax {
            format,
            call_start: spec.get("call_start").and_then(marker),
            call_end: spec.get("call_end").and_then(marker),
            separator: spec["separator"].as_str().unwrap_or_default().to_owned(),
        }),
        reasoning,
    }
}

fn pieces(output: &Value) -> Vec<Piece> {
    (output.as_array().unwrap().iter())
        .map(|piece| match piece {
            Value::String(text) => Piece::Text(text.clone()),
            marker => Piece::Marker(match marker["marker"].as_str().unwrap() {
                "call_start" => MarkerKind::CallStart,
                "call_end" => MarkerKind::CallEnd,
                "reasoning_start" => MarkerKind::ReasoningStart,
                "reasoning_end" => MarkerKind::ReasoningEnd,
                other => panic!("unknown marker {other}"),
            }),
        })
        .collect()
}

fn expected(case: &Value) -> ParsedOutput {
    let expected = &case["expected"];
    ParsedOutput {
        text: expected["text"].as_str().unwrap().to_owned(),
        reasoning: expected["reasoning"].as_str().unwrap().to_owned(),
        calls: (expected["calls"].as_array().unwrap().iter())
            .map(|call| ParsedToolCall {
                name: call["name"].as_str().unwrap().to_owned(),
                arguments: call["arguments"].as_str().unwrap().to_owned(),
                complete: call["complete"].as_bool().unwrap(),
            })
            .collect(),
    }
}

/// Feeds `pieces` and folds the checked events.
fn parse(
    protocol: &OutputProtocol,
    tools: Option<&ToolSet>,
    in_reasoning: bool,
    pieces: &[Piece],
) -> ParsedOutput {
    feed(protocol, tools, in_reasoning, pieces).1
}

/// `pieces` with each text piece split at the given character boundaries
/// of the whole text (positions counted over all text pieces).
fn split_at(pieces: &[Piece], cuts: &[usize]) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut offset = 0;
    for piece in pieces {
        let Piece::Text(text) = piece else {
            out.push(piece.clone());
            continue;
        };
        let mut start = 0;
        for &cut in cuts {
            if cut > offset + start
                && cut < offset + text.len()
                && text.is_char_boundary(cut - offset)
            {
                out.push(Piece::Text(text[start..cut - offset].to_owned()));
                start = cut - offset;
            }
        }
        out.push(Piece::Text(text[start..].to_owned()));
        offset += text.len();
    }
    out
}

fn text_len(pieces: &[Piece]) -> usize {
    (pieces.iter())
        .map(|piece| match piece {
            Piece::Text(text) => text.len(),
            Piece::Marker(_) => 0,
        })
        .sum()
}

/// A small deterministic generator (xorshift64*).
struct Random(u64);

impl Random {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

/// The text pieces as a byte-level BPE tokenizes them, each token's
/// detokenized delta one piece.
fn by_tokens(tokenizer: &Tokenizer, pieces: &[Piece]) -> Vec<Piece> {
    let mut out = Vec::new();
    for piece in pieces {
        let Piece::Text(text) = piece else {
            out.push(piece.clone());
            continue;
        };
        let mut detokenizer = Detokenizer::new(false);
        for id in tokenizer.encode(text, false).unwrap() {
            let delta = detokenizer.push(tokenizer, id).unwrap();
            out.push(Piece::Text(delta));
        }
        out.push(Piece::Text(detokenizer.finish(tokenizer).unwrap()));
    }
    out
}

#[test]
fn every_golden_output_parses_the_same_however_it_is_split() {
    let golden = golden();
    let definitions = golden["tools"].as_array().unwrap().clone();
    let tools = ToolSet::from_definitions(&definitions).unwrap();
    let tokenizer_json = std::fs::read_to_string(fixture("chat/qwen.tokenizer.json")).unwrap();
    let tokenizer = Tokenizer::from_json(&tokenizer_json).unwrap();
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    let mut checked = 0;
    for (suite, cases) in golden["suites"].as_object().unwrap() {
        let protocol = protocol(&golden["protocols"][suite]);
        for case in cases.as_array().unwrap() {
            let name = format!("{suite}/{}", case["name"].as_str().unwrap());
            let tools = case["tools"].as_bool().unwrap().then_some(&tools);
            let in_reasoning = case["starts_in_reasoning"].as_bool().unwrap();
            let pieces = pieces(&case["output"]);
            let expected = expected(case);
            let whole = parse(&protocol, tools, in_reasoning, &pieces);
            assert_eq!(whole, expected, "{name}, parsed whole");
            let len = text_len(&pieces);
            for cut in 1..len {
                let split = split_at(&pieces, &[cut]);
                let parsed = parse(&protocol, tools, in_reasoning, &split);
                assert_eq!(parsed, expected, "{name}, split at byte {cut}");
            }
            let every: Vec<usize> = (1..len).collect();
            let parsed = parse(&protocol, tools, in_reasoning, &split_at(&pieces, &every));
            assert_eq!(parsed, expected, "{name}, a character at a time");
            for round in 0..20 {
                let mut cuts: Vec<usize> = (0..1 + random.below(8))
                    .map(|_| random.below(len))
                    .collect();
                cuts.sort_unstable();
                cuts.dedup();
                let parsed = parse(&protocol, tools, in_reasoning, &split_at(&pieces, &cuts));
                assert_eq!(parsed, expected, "{name}, random split {round} at {cuts:?}");
            }
            let tokens = by_tokens(&tokenizer, &pieces);
            let parsed = parse(&protocol, tools, in_reasoning, &tokens);
            assert_eq!(parsed, expected, "{name}, split at tokens");
            checked += 1;
        }
    }
    assert_eq!(checked, 60, "every case of the corpus ran");
}

#[test]
fn the_prompt_tail_decides_whether_output_starts_inside_reasoning() {
    let golden = golden();
    let protocol = protocol(&golden["protocols"]["hermes"]);
    assert!(protocol.starts_in_reasoning("<|im_start|>assistant\n<think>\n"));
    // Qwen3 with enable_thinking=false closes the block in the prompt.
    assert!(!protocol.starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    assert!(!protocol.starts_in_reasoning("<|im_start|>assistant\n"));
    let plain = OutputProtocol::default();
    assert!(!plain.starts_in_reasoning("<think>\n"));
}

#[test]
fn marker_tokens_are_known_by_id_only() {
    let golden = golden();
    let tokens = protocol(&golden["protocols"]["hermes_tokens"]);
    assert_eq!(tokens.marker_token(5), Some(MarkerKind::CallStart));
    assert_eq!(tokens.marker_token(8), Some(MarkerKind::ReasoningEnd));
    assert_eq!(tokens.marker_token(9), None);
    let text = protocol(&golden["protocols"]["hermes"]);
    assert_eq!(text.marker_token(5), None);
}
