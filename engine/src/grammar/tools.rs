//! Grammars that make a model call a tool (OpenAI's `tool_choice: "required"` or a named
//! function), in the call syntax of the model's own format, with each function's arguments
//! held to its JSON schema.

use serde_json::{Value, json};

use super::GrammarError;
use crate::models::tool_calls::ToolFormat;

/// Which calls the answer must make.
pub struct ToolDemand<'a> {
    pub tools: &'a [Value],
    /// One function by name, or any of `tools`.
    pub function: Option<&'a str>,
    /// Several calls may follow one another.
    pub parallel: bool,
}

/// The Lark grammar for a forced call. `special` gives the id of a special token by its text
/// (a grammar must name special tokens as tokens: text never matches them); `harmony`: the
/// model speaks GPT-OSS's format.
pub fn forced_call_lark(
    format: ToolFormat,
    harmony: bool,
    demand: &ToolDemand<'_>,
    special: &dyn Fn(&str) -> Option<u32>,
) -> Result<String, GrammarError> {
    let functions = chosen(demand)?;
    let mark = |text: &str| match special(text) {
        Some(id) => format!("<[{id}]>"),
        None => lit(text),
    };
    let mut rules = String::new();
    let mut alternatives = Vec::new();
    for (i, (name, schema)) in functions.iter().enumerate() {
        let args = format!("args_{i}");
        rules.push_str(&format!("{args}: %json {}\n", with_guidance(schema)));
        let call = if harmony {
            format!(
                "{} {} {} {} {} {args}",
                mark("<|channel|>"),
                lit(&format!("commentary to=functions.{name} ")),
                mark("<|constrain|>"),
                lit("json"),
                mark("<|message|>")
            )
        } else {
            match format {
                ToolFormat::Hermes => format!(
                    "{} {} {args} {} {}",
                    mark("<tool_call>"),
                    lit(&format!("\n{{\"name\": {}, \"arguments\": ", json!(name))),
                    lit("}\n"),
                    mark("</tool_call>")
                ),
                ToolFormat::Llama3 => format!(
                    "{} {args} {}",
                    lit(&format!("{{\"name\": {}, \"parameters\": ", json!(name))),
                    lit("}")
                ),
                ToolFormat::Mistral if special("[ARGS]").is_some() => format!(
                    "{} {} {} {args}",
                    mark("[TOOL_CALLS]"),
                    lit(name),
                    mark("[ARGS]")
                ),
                ToolFormat::Mistral => format!(
                    "{} {} {args} {}",
                    mark("[TOOL_CALLS]"),
                    lit(&format!("[{{\"name\": {}, \"arguments\": ", json!(name))),
                    lit("}]")
                ),
                ToolFormat::Phi4 => format!(
                    "{} {} {args} {} {}",
                    mark("<|tool_call|>"),
                    lit(&format!("{{\"name\": {}, \"arguments\": ", json!(name))),
                    lit("}"),
                    mark("<|/tool_call|>")
                ),
                ToolFormat::Gemma4 | ToolFormat::FunctionGemma => {
                    return Err(GrammarError::Invalid(
                        "this model writes tool arguments in Gemma's own syntax, which a JSON \
                         schema cannot hold; use tool_choice \"auto\""
                            .into(),
                    ));
                }
            }
        };
        alternatives.push(call);
    }
    let call = alternatives.join(" | ");
    // Harmony sends one call per message and stops at `<|call|>`; the others may chain.
    let repeat = if demand.parallel && !harmony {
        " (/[\\n ]{0,2}/ call)*"
    } else {
        ""
    };
    Ok(format!("start: call{repeat}\ncall: {call}\n{rules}"))
}

/// (name, parameters schema) of the functions the demand allows.
fn chosen<'a>(demand: &ToolDemand<'a>) -> Result<Vec<(&'a str, Value)>, GrammarError> {
    let mut out = Vec::new();
    for tool in demand.tools {
        let function = tool.get("function").unwrap_or(tool);
        let Some(name) = function.get("name").and_then(Value::as_str) else {
            continue;
        };
        if demand.function.is_some_and(|f| f != name) {
            continue;
        }
        let schema = function
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        out.push((name, schema));
    }
    if out.is_empty() {
        return Err(GrammarError::Invalid(match demand.function {
            Some(f) => format!("tool_choice names {f:?}, which is not among the tools"),
            None => "tool_choice requires a call, but no tools were given".into(),
        }));
    }
    Ok(out)
}

/// A function's parameters schema with the bounded whitespace of every JSON constraint, and
/// keywords the grammar cannot hold ignored (OpenAI holds only `strict` tools to them).
fn with_guidance(schema: &Value) -> Value {
    let mut schema = if schema.is_object() {
        schema.clone()
    } else {
        json!({"type": "object"})
    };
    if let Some(map) = schema.as_object_mut() {
        map.insert(
            "x-guidance".into(),
            json!({
                "whitespace_flexible": true,
                "whitespace_pattern": super::JSON_WHITESPACE,
                "lenient": true,
            }),
        );
    }
    schema
}

/// A Lark string literal (read as a JSON string).
fn lit(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_function_is_the_only_alternative() {
        let tools = [
            json!({"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}),
            json!({"type": "function", "function": {"name": "b"}}),
        ];
        let demand = ToolDemand {
            tools: &tools,
            function: Some("b"),
            parallel: false,
        };
        let lark =
            forced_call_lark(ToolFormat::Hermes, false, &demand, &|_| None).expect("a grammar");
        assert!(
            lark.contains(r#""\n{\"name\": \"b\", \"arguments\": ""#),
            "{lark}"
        );
        assert!(!lark.contains("\\\"a\\\""), "{lark}");
        let missing = ToolDemand {
            function: Some("c"),
            ..demand
        };
        assert!(forced_call_lark(ToolFormat::Hermes, false, &missing, &|_| None).is_err());
    }
}
