//! The tools a request declares, as the parser and validation see them.

use serde_json::Value;

/// A request's function tools: their names and parameter schemas, from
/// definitions in OpenAI's chat shape
/// (`{"type": "function", "function": {"name", "description", "parameters"}}`),
/// the shape every chat template reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolSet {
    tools: Vec<(String, Value)>,
    /// The custom tools among them, with their input's format.
    custom: Vec<(String, CustomInput)>,
}

/// How a custom tool's input, one string, is written: a custom tool is
/// presented as a function of one string argument, [`CUSTOM_INPUT_KEY`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CustomInput {
    /// Any text.
    Text,
    /// Text in a Lark grammar.
    Lark(String),
    /// Text that a regex (Rust syntax) matches whole.
    Regex(String),
}

/// The argument that holds a custom tool's input.
pub const CUSTOM_INPUT_KEY: &str = "input";

/// Why a tool definition is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolSetError {
    /// A definition is not a function tool with a name.
    #[error("tools[{index}] is not a function tool with a `function.name` string")]
    NotAFunction {
        /// Its position.
        index: usize,
    },
    /// A name is declared twice.
    #[error("tools[{index}] declares `{name}` again")]
    Duplicate {
        /// Its position.
        index: usize,
        /// The name.
        name: String,
    },
}

impl ToolSet {
    /// The set of `definitions` (OpenAI chat shape).
    pub fn from_definitions(definitions: &[Value]) -> Result<Self, ToolSetError> {
        let mut tools: Vec<(String, Value)> = Vec::with_capacity(definitions.len());
        for (index, definition) in definitions.iter().enumerate() {
            let function = definition.get("function");
            let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
            let is_function = definition.get("type").and_then(Value::as_str) == Some("function");
            let Some(name) = name.filter(|name| is_function && !name.is_empty()) else {
                return Err(ToolSetError::NotAFunction { index });
            };
            if tools.iter().any(|(known, _)| known == name) {
                return Err(ToolSetError::Duplicate {
                    index,
                    name: name.to_owned(),
                });
            }
            let parameters = function.and_then(|f| f.get("parameters")).cloned();
            tools.push((name.to_owned(), parameters.unwrap_or(Value::Null)));
        }
        Ok(Self {
            tools,
            custom: Vec::new(),
        })
    }

    /// The set with `custom` (names and formats) marked as custom tools,
    /// those of them it declares.
    pub fn with_custom(mut self, custom: &[(String, CustomInput)]) -> Self {
        self.custom = (custom.iter())
            .filter(|(name, _)| self.contains(name))
            .cloned()
            .collect();
        self
    }

    /// The custom tools: names and input formats.
    pub fn custom(&self) -> &[(String, CustomInput)] {
        &self.custom
    }

    /// The input format of `name`, when it is a custom tool.
    pub fn custom_input(&self, name: &str) -> Option<&CustomInput> {
        (self.custom.iter())
            .find(|(known, _)| known == name)
            .map(|(_, input)| input)
    }

    /// Whether no tool is declared.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Whether `name` is declared.
    pub fn contains(&self, name: &str) -> bool {
        self.tools.iter().any(|(known, _)| known == name)
    }

    /// The declared names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.iter().map(|(name, _)| name.as_str())
    }

    /// The declared tools: each name with its parameter schema (`null`
    /// when the definition has none).
    pub fn tools(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.tools
            .iter()
            .map(|(name, schema)| (name.as_str(), schema))
    }

    /// The JSON schema type of parameter `key` of tool `name` (its first
    /// type when it lists several), if declared.
    pub fn parameter_type(&self, name: &str, key: &str) -> Option<&str> {
        let (_, schema) = self.tools.iter().find(|(known, _)| known == name)?;
        schema_type(schema.get("properties")?.get(key)?)
    }
}

/// The JSON type a property schema declares: its `type` (the first that is
/// not `null`, when it lists several), else the type of its `enum` or
/// `const` values. The parser coerces by it and the grammars write by it.
pub fn schema_type(property: &Value) -> Option<&str> {
    match property.get("type") {
        Some(Value::String(kind)) => return Some(kind),
        Some(Value::Array(kinds)) => {
            return kinds
                .iter()
                .filter_map(Value::as_str)
                .find(|kind| *kind != "null")
        }
        _ => {}
    }
    let value = match (property.get("enum"), property.get("const")) {
        (Some(Value::Array(values)), _) => values.first()?,
        (_, Some(value)) => value,
        _ => return None,
    };
    Some(match value {
        Value::String(_) => "string",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::Bool(_) => "boolean",
        Value::Null => "null",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::schema_type;

    #[test]
    fn a_property_type_comes_from_type_then_from_its_values() {
        assert_eq!(schema_type(&json!({"type": "integer"})), Some("integer"));
        assert_eq!(
            schema_type(&json!({"type": ["null", "integer"]})),
            Some("integer")
        );
        assert_eq!(schema_type(&json!({"enum": [1, 2]})), Some("integer"));
        assert_eq!(schema_type(&json!({"const": "x"})), Some("string"));
        assert_eq!(schema_type(&json!({"description": "free"})), None);
    }
}
