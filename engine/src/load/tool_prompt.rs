//! Tools for a model whose chat template does not read `tools`: the definitions and the
//! calling convention go into the system message, earlier calls are written out the way the
//! model is asked to write them, and tool results come back as user turns. The convention is
//! the `<tool_call>` JSON one (Hermes', which Qwen2.5 and Qwen3 were trained on), so the same
//! parser reads the answers. Phi-4-mini's template reads the definitions from a system
//! message's own `tools` field instead ([`in_system_field`]).

use serde_json::Value;

use super::template::ChatMessage;

/// `messages` rewritten so that a template without tool support carries `tools`, the calls
/// and their results.
pub fn without_tool_support(messages: &[ChatMessage], tools: &[Value]) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    if !tools.is_empty() {
        let description = describe(tools);
        match messages.first() {
            Some(first) if first.role == "system" => {
                let mut system = first.clone();
                system.content = format!("{}\n\n{description}", first.content);
                out.push(system);
            }
            _ => out.push(ChatMessage::new("system", &description)),
        }
    }
    let skip =
        usize::from(!tools.is_empty() && messages.first().is_some_and(|m| m.role == "system"));
    for m in &messages[skip..] {
        match m.role.as_str() {
            "tool" => {
                let text = format!("<tool_response>\n{}\n</tool_response>", m.content);
                // Consecutive results share one user turn, as the calls shared one answer.
                match out.last_mut() {
                    Some(last)
                        if last.role == "user" && last.content.ends_with("</tool_response>") =>
                    {
                        last.content.push('\n');
                        last.content.push_str(&text);
                    }
                    _ => out.push(ChatMessage::new("user", &text)),
                }
            }
            "assistant" if !m.tool_calls.is_empty() => {
                let mut text = m.content.clone();
                for call in &m.tool_calls {
                    let body = serde_json::json!({
                        "name": call.function.name,
                        "arguments": call.function.arguments,
                    });
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("<tool_call>\n{body}\n</tool_call>"));
                }
                out.push(ChatMessage::new("assistant", &text));
            }
            _ => out.push(ChatMessage::new(&m.role, &m.content)),
        }
    }
    out
}

/// `messages` with the function definitions as JSON text in the system message's `tools`
/// field (a system message is added first where there is none); earlier calls and results,
/// which such a template cannot show, written out as for a template without tools.
pub fn in_system_field(messages: &[ChatMessage], tools: &[Value]) -> Vec<ChatMessage> {
    let mut out = without_tool_support(messages, &[]);
    if tools.is_empty() {
        return out;
    }
    // The model card's form: the function objects themselves, not OpenAI's wrappers.
    let functions: Vec<&Value> = tools
        .iter()
        .map(|t| t.get("function").unwrap_or(t))
        .collect();
    let text = serde_json::to_string(&functions).unwrap_or_default();
    match out.first_mut() {
        Some(first) if first.role == "system" => first.tools = Some(text),
        _ => {
            let mut system = ChatMessage::new("system", "");
            system.tools = Some(text);
            out.insert(0, system);
        }
    }
    out
}

fn describe(tools: &[Value]) -> String {
    let mut text = String::from(
        "# Tools\n\nYou may call one or more functions to help with the request. The functions \
         are described inside <tools></tools>:\n<tools>",
    );
    for tool in tools {
        text.push('\n');
        text.push_str(&tool.to_string());
    }
    text.push_str(
        "\n</tools>\n\nTo call a function, answer with one JSON object per call, each inside \
         <tool_call></tool_call>:\n<tool_call>\n{\"name\": <function name>, \"arguments\": \
         <arguments as a JSON object>}\n</tool_call>",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{FunctionCall, ToolCall};

    #[test]
    fn tools_calls_and_results_become_plain_turns() {
        let tools = vec![serde_json::json!({"type": "function", "function": {"name": "f"}})];
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls.push(ToolCall {
            id: "c1".into(),
            kind: "function".into(),
            function: FunctionCall {
                name: "f".into(),
                arguments: serde_json::json!({"x": 1}),
            },
        });
        let messages = vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Go"),
            call,
            ChatMessage::new("tool", "42"),
            ChatMessage::new("tool", "43"),
        ];
        let out = without_tool_support(&messages, &tools);
        assert_eq!(out.len(), 4);
        assert!(out[0].content.starts_with("Be brief.\n\n# Tools"));
        assert!(
            out[0]
                .content
                .contains(r#"{"type":"function","function":{"name":"f"}}"#)
        );
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"x\":1}}\n</tool_call>"
        );
        assert_eq!(out[3].role, "user");
        assert_eq!(
            out[3].content,
            "<tool_response>\n42\n</tool_response>\n<tool_response>\n43\n</tool_response>"
        );
    }
}
