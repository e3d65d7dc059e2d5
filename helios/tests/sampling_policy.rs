//! The sampling policy against the fixture the Python harness is held to
//! (`fixtures/sampling/policy.json`, read by `tests/test_sampling_policy.py`
//! too): the same defaults and request give the same parameters, or the same
//! refused field, on both sides.

use std::path::PathBuf;

use helios::core::proto::{FloatRange, SamplingDefaults};
use helios::http::{HttpError, SamplingFields, SamplingPolicy};
use helios::scheduler::SamplingParams;
use serde_json::Value;

const PARAMETERS: [&str; 7] = [
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
];

fn number(value: &Value) -> f32 {
    value.as_f64().expect("a number") as f32
}

/// The manifest's `SamplingDefaults` a case declares.
fn defaults(case: &Value) -> SamplingDefaults {
    let declared = &case["defaults"];
    let ranges = declared["ranges"].as_object().expect("ranges");
    let range = |name: &str| {
        ranges.get(name).map(|pair| FloatRange {
            min: number(&pair[0]),
            max: number(&pair[1]),
        })
    };
    SamplingDefaults {
        temperature: number(&declared["temperature"]),
        top_k: declared["top_k"].as_i64().expect("an integer top_k") as i32,
        top_p: number(&declared["top_p"]),
        min_p: number(&declared["min_p"]),
        repetition_penalty: number(&declared["repetition_penalty"]),
        presence_penalty: number(&declared["presence_penalty"]),
        frequency_penalty: number(&declared["frequency_penalty"]),
        temperature_range: range("temperature"),
        top_k_range: range("top_k"),
        top_p_range: range("top_p"),
        min_p_range: range("min_p"),
        repetition_penalty_range: range("repetition_penalty"),
        presence_penalty_range: range("presence_penalty"),
        frequency_penalty_range: range("frequency_penalty"),
    }
}

fn expected(case: &Value) -> SamplingParams {
    let expected = &case["expected"];
    SamplingParams {
        temperature: number(&expected["temperature"]),
        top_k: u32::try_from(expected["top_k"].as_u64().expect("top_k")).unwrap(),
        top_p: number(&expected["top_p"]),
        min_p: number(&expected["min_p"]),
        repetition_penalty: number(&expected["repetition_penalty"]),
        presence_penalty: number(&expected["presence_penalty"]),
        frequency_penalty: number(&expected["frequency_penalty"]),
    }
}

#[test]
fn helios_resolves_every_case_as_the_fixture_says() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sampling/policy.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 12);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let policy = SamplingPolicy::from_core(&defaults(case));
        // The request's fields, parsed as a request body's are.
        let fields: SamplingFields = serde_json::from_value(case["request"].clone()).unwrap();
        assert!(
            (case["request"].as_object().unwrap().keys()).all(|k| PARAMETERS.contains(&k.as_str()))
        );
        let resolved = policy.resolve(fields);
        match case.get("error").and_then(Value::as_str) {
            Some(field) => match resolved {
                Err(HttpError::InvalidParameter { param, .. }) => {
                    assert_eq!(param, field, "{name}")
                }
                other => panic!("{name}: expected a refusal of {field}, got {other:?}"),
            },
            None => assert_eq!(resolved.unwrap().params, expected(case), "{name}"),
        }
    }
}
