//! JSON request values as template values.

use minijinja::Value;

/// Converts a JSON value into a template value, keeping object key order
/// (Python dicts keep insertion order, and `tojson` prints it) and the
/// integer / float distinction (`1` prints as `1`, `1.0` as `1.0`).
pub(crate) fn from_json(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(items) => {
            Value::from(items.iter().map(from_json).collect::<Vec<_>>())
        }
        serde_json::Value::Object(map) => Value::from_pairs(
            map.iter()
                .map(|(k, v)| (Value::from(k.as_str()), from_json(v))),
        ),
    }
}
