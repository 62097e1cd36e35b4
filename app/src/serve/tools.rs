//! OpenAI's tool calling and structured outputs on the way in (`tools`, `tool_choice`,
//! `parallel_tool_calls`, `response_format`, and llama.cpp's `grammar` and `json_schema`) and
//! tool calls on the way out (`message.tool_calls`, `delta.tool_calls`).

use std::hash::{BuildHasher, Hasher};

use backpack_engine::grammar::Constraint;
use backpack_engine::load::{FunctionCall, ToolCall};
use backpack_engine::models::tool_calls::{ParsedCall, ToolFormat};
use serde_json::{Value, json};

use super::api::ApiError;

/// The tools a chat request gives the model, and what it asks of them.
#[derive(Default)]
pub struct ToolRequest {
    /// Definitions for the template (empty with `tool_choice: "none"`).
    pub tools: Vec<Value>,
    /// A call the answer must make (`required`, or a named function).
    pub forced: Option<Constraint>,
}

/// Checks `tools`, `tool_choice` and `parallel_tool_calls`.
pub fn tool_request(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<ToolRequest, ApiError> {
    let tools: Vec<Value> = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(_) => {
            return Err(ApiError::bad_request(
                "tools must be an array",
                Some("tools"),
            ));
        }
    };
    for (i, tool) in tools.iter().enumerate() {
        let kind = tool
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("function");
        let name = tool.pointer("/function/name").and_then(Value::as_str);
        if kind != "function" || name.is_none_or(str::is_empty) {
            return Err(ApiError::bad_request(
                format!(
                    "tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                ),
                Some("tools"),
            ));
        }
        if let Some(p) = tool.pointer("/function/parameters")
            && !p.is_object()
        {
            return Err(ApiError::bad_request(
                format!("tools[{i}].function.parameters must be a JSON schema object"),
                Some("tools"),
            ));
        }
    }
    let parallel = parallel.unwrap_or(true);
    let (function, forced) = match choice {
        None | Some(Value::Null) => (None, false),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => (None, false),
            "none" => return Ok(ToolRequest::default()),
            "required" => (None, true),
            other => {
                return Err(ApiError::bad_request(
                    format!(
                        "tool_choice {other:?} is not one of none, auto, required or a function"
                    ),
                    Some("tool_choice"),
                ));
            }
        },
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) => (Some(name.to_owned()), true),
            None => {
                return Err(ApiError::bad_request(
                    "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    Some("tool_choice"),
                ));
            }
        },
    };
    if forced && tools.is_empty() {
        return Err(ApiError::bad_request(
            "tool_choice requires a call but no tools were given",
            Some("tool_choice"),
        ));
    }
    if let Some(f) = &function
        && !tools
            .iter()
            .any(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(f))
    {
        return Err(ApiError::bad_request(
            format!("tool_choice names {f:?}, which is not among the tools"),
            Some("tool_choice"),
        ));
    }
    Ok(ToolRequest {
        tools,
        forced: forced.then_some(Constraint::ToolCall { function, parallel }),
    })
}

/// `response_format`, `grammar` (GBNF, or llguidance's Lark) and `json_schema` (llama.cpp's
/// field), at most one of them.
pub fn output_constraint(
    response_format: Option<&Value>,
    grammar: Option<&str>,
    json_schema: Option<&Value>,
) -> Result<Option<Constraint>, ApiError> {
    let format = match response_format {
        None | Some(Value::Null) => None,
        Some(f) => match f.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(Constraint::JsonObject),
            Some("json_schema") => {
                let spec = f.get("json_schema").ok_or_else(|| {
                    ApiError::bad_request(
                        "response_format of type json_schema needs a json_schema object",
                        Some("response_format"),
                    )
                })?;
                let schema = spec.get("schema").cloned().unwrap_or_else(|| json!({}));
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(ApiError::bad_request(
                        "response_format.json_schema.schema must be a JSON schema object",
                        Some("response_format"),
                    ));
                }
                let strict = spec.get("strict").and_then(Value::as_bool).unwrap_or(false);
                Some(Constraint::JsonSchema { schema, strict })
            }
            other => {
                return Err(ApiError::bad_request(
                    format!(
                        "response_format type {:?} is not one of text, json_object, json_schema",
                        other.unwrap_or("?")
                    ),
                    Some("response_format"),
                ));
            }
        },
    };
    let grammar = grammar.filter(|g| !g.trim().is_empty()).map(|g| {
        if g.contains("::=") {
            Constraint::Gbnf(g.to_owned())
        } else {
            Constraint::Lark(g.to_owned())
        }
    });
    let schema = json_schema
        .filter(|s| !s.is_null())
        .map(|s| Constraint::JsonSchema {
            schema: s.clone(),
            strict: false,
        });
    let mut given: Vec<Constraint> = [format, grammar, schema].into_iter().flatten().collect();
    if given.len() > 1 {
        return Err(ApiError::bad_request(
            "give one of response_format, grammar and json_schema",
            Some("grammar"),
        ));
    }
    Ok(given.pop())
}

/// The message's `tool_calls` as the engine's template input; arguments arrive as JSON text.
pub fn message_tool_calls(calls: &[Value]) -> Result<Vec<ToolCall>, ApiError> {
    calls
        .iter()
        .map(|c| {
            let name = c.pointer("/function/name").and_then(Value::as_str);
            let Some(name) = name else {
                return Err(ApiError::bad_request(
                    "each tool_calls entry needs function.name",
                    Some("messages"),
                ));
            };
            let arguments = match c.pointer("/function/arguments") {
                Some(Value::String(s)) => {
                    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
                }
                Some(v) => v.clone(),
                None => json!({}),
            };
            Ok(ToolCall {
                id: c
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                kind: "function".into(),
                function: FunctionCall {
                    name: name.to_owned(),
                    arguments,
                },
            })
        })
        .collect()
}

/// A call as OpenAI reports it: an id, the name, and the arguments as JSON text.
pub fn call_json(call: &ParsedCall, format: ToolFormat, index: Option<usize>) -> Value {
    let id = call.id.clone().unwrap_or_else(|| call_id(format));
    let arguments = call.arguments_text();
    let mut v = json!({
        "id": id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    });
    if let Some(i) = index {
        v["index"] = i.into();
    }
    v
}

/// A fresh call id. Mistral's templates refuse any id but nine letters and digits, so those
/// models get such ids; others get OpenAI's `call_` form.
fn call_id(format: ToolFormat) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let len = if format == ToolFormat::Mistral { 9 } else { 24 };
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let mut out = String::with_capacity(len + 5);
    if format != ToolFormat::Mistral {
        out.push_str("call_");
    }
    for i in 0..len {
        hasher.write_usize(i);
        let n = hasher.finish();
        out.push(ALPHABET[(n % ALPHABET.len() as u64) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mistral_ids_are_nine_letters_and_digits() {
        let id = call_id(ToolFormat::Mistral);
        assert_eq!(id.len(), 9);
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric()));
        assert!(call_id(ToolFormat::Hermes).starts_with("call_"));
        assert_ne!(call_id(ToolFormat::Hermes), call_id(ToolFormat::Hermes));
    }

    #[test]
    fn choices_and_formats_are_checked() {
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let forced = tool_request(Some(&tools), Some(&json!("required")), None).expect("ok");
        assert!(forced.forced.is_some());
        let none = tool_request(Some(&tools), Some(&json!("none")), None).expect("ok");
        assert!(none.tools.is_empty());
        let named = json!({"type": "function", "function": {"name": "g"}});
        let e = tool_request(Some(&tools), Some(&named), None)
            .err()
            .expect("unknown name");
        assert_eq!(e.param, Some("tool_choice"));
        let e =
            output_constraint(Some(&json!({"type": "xml"})), None, None).expect_err("unknown type");
        assert_eq!(e.param, Some("response_format"));
        assert_eq!(
            output_constraint(None, Some("root ::= \"a\""), None).expect("ok"),
            Some(Constraint::Gbnf("root ::= \"a\"".into()))
        );
    }
}
