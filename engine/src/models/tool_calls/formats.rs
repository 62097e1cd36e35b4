//! Each family's call syntax, read from the first marker on. Each reader returns the calls
//! and the text after the last one, or None when the text is not a call after all.

use serde_json::{Map, Value};

use super::{ParsedCall, ToolFormat};

pub(super) fn parse_calls<'a>(
    format: ToolFormat,
    text: &'a str,
    tools: &[Value],
) -> Option<(Vec<ParsedCall>, &'a str)> {
    match format {
        ToolFormat::Hermes => hermes(text, tools),
        ToolFormat::Llama3 => llama3(text),
        ToolFormat::Mistral => mistral(text),
        ToolFormat::Gemma4 => gemma(text, "<|tool_call>", "<tool_call|>", "<|\"|>"),
        ToolFormat::FunctionGemma => gemma(
            text,
            "<start_function_call>",
            "<end_function_call>",
            "<escape>",
        ),
        ToolFormat::Phi4 => phi4(text),
    }
}

/// The first JSON value in `text` (after blanks) and the text after it.
fn json_prefix(text: &str) -> Option<(Value, &str)> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let value = values.next()?.ok()?;
    Some((value, &text[values.byte_offset()..]))
}

/// A `{"name", "arguments" | "parameters"}` object as a call; string arguments holding JSON
/// are read as that JSON.
fn call_object(v: &Value) -> Option<ParsedCall> {
    let o = v.as_object()?;
    // Some models nest the call as OpenAI's `{"type": "function", "function": {...}}`.
    if let Some(inner) = o.get("function").filter(|f| f.is_object()) {
        return call_object(inner);
    }
    let name = o.get("name")?.as_str()?.to_owned();
    let arguments = match o.get("arguments").or_else(|| o.get("parameters")) {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        Some(v) => v.clone(),
        None => Value::Object(Map::new()),
    };
    let id = o.get("id").and_then(Value::as_str).map(str::to_owned);
    Some(ParsedCall {
        name,
        arguments,
        id,
    })
}

fn hermes<'a>(mut text: &'a str, tools: &[Value]) -> Option<(Vec<ParsedCall>, &'a str)> {
    let mut calls = Vec::new();
    while let Some(rest) = text.trim_start().strip_prefix("<tool_call>") {
        let (inner, after) = match rest.find("</tool_call>") {
            Some(end) => (&rest[..end], &rest[end + "</tool_call>".len()..]),
            // An unfinished last block (the answer was cut, or the model stopped there).
            None => (rest, ""),
        };
        let inner = inner.trim();
        let call = if inner.starts_with("<function=") {
            xml_call(inner, tools)?
        } else {
            let (value, trailing) = json_prefix(inner)?;
            if !trailing.trim().is_empty() {
                return None;
            }
            call_object(&value)?
        };
        calls.push(call);
        text = after;
    }
    Some((calls, text))
}

/// Qwen3-Coder's and Qwen3.5's `<function=NAME><parameter=P>value</parameter></function>`.
/// Values are text; a parameter the tool declares as a string stays one, others are read as
/// JSON where they parse.
fn xml_call(inner: &str, tools: &[Value]) -> Option<ParsedCall> {
    let rest = inner.strip_prefix("<function=")?;
    let close = rest.find('>')?;
    let name = rest[..close].trim().to_owned();
    let mut body = &rest[close + 1..];
    let mut arguments = Map::new();
    while let Some(p) = body.find("<parameter=") {
        let after = &body[p + "<parameter=".len()..];
        let close = after.find('>')?;
        let key = after[..close].trim().to_owned();
        let value_and_rest = &after[close + 1..];
        let end = value_and_rest.find("</parameter>")?;
        let raw = value_and_rest[..end]
            .strip_prefix('\n')
            .unwrap_or(&value_and_rest[..end]);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let value = if declared_type(tools, &name, &key) == Some("string") {
            Value::String(raw.to_owned())
        } else {
            serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
        };
        arguments.insert(key, value);
        body = &value_and_rest[end + "</parameter>".len()..];
    }
    if !body
        .trim()
        .trim_end_matches("</function>")
        .trim()
        .is_empty()
    {
        return None;
    }
    Some(ParsedCall {
        name,
        arguments: Value::Object(arguments),
        id: None,
    })
}

/// The JSON-schema type a tool declares for one of its parameters.
fn declared_type<'t>(tools: &'t [Value], function: &str, parameter: &str) -> Option<&'t str> {
    tools
        .iter()
        .map(|t| t.get("function").unwrap_or(t))
        .find(|f| f.get("name").and_then(Value::as_str) == Some(function))?
        .pointer(&format!("/parameters/properties/{parameter}/type"))?
        .as_str()
}

fn llama3(text: &str) -> Option<(Vec<ParsedCall>, &str)> {
    let mut rest = text.trim_start();
    rest = rest.strip_prefix("<|python_tag|>").unwrap_or(rest);
    let mut calls = Vec::new();
    loop {
        let (value, after) = json_prefix(rest)?;
        calls.push(call_object(&value)?);
        match after.trim_start().strip_prefix(';') {
            Some(next) if next.trim_start().starts_with('{') => rest = next,
            _ => return Some((calls, after)),
        }
    }
}

fn mistral(text: &str) -> Option<(Vec<ParsedCall>, &str)> {
    let mut rest = text.trim_start().strip_prefix("[TOOL_CALLS]")?;
    if rest.trim_start().starts_with('[') {
        // v0.3 and Nemo: one JSON array of calls.
        let (value, after) = json_prefix(rest)?;
        let calls: Option<Vec<_>> = value.as_array()?.iter().map(call_object).collect();
        return Some((calls?, after));
    }
    // v11 and later: `name[CALL_ID]id[ARGS]{...}` per `[TOOL_CALLS]`.
    let mut calls = Vec::new();
    loop {
        let name_end = rest.find(['[', '{'])?;
        let name = rest[..name_end].trim().to_owned();
        if name.is_empty() {
            return None;
        }
        rest = &rest[name_end..];
        let mut id = None;
        if let Some(after) = rest.strip_prefix("[CALL_ID]") {
            let end = after.find(['[', '{'])?;
            id = Some(after[..end].trim().to_owned());
            rest = &after[end..];
        }
        rest = rest.strip_prefix("[ARGS]").unwrap_or(rest);
        let (arguments, after) = json_prefix(rest)?;
        calls.push(ParsedCall {
            name,
            arguments,
            id,
        });
        match after.trim_start().strip_prefix("[TOOL_CALLS]") {
            Some(next) => rest = next,
            None => return Some((calls, after)),
        }
    }
}

fn phi4(text: &str) -> Option<(Vec<ParsedCall>, &str)> {
    let mut rest = text;
    let mut calls = Vec::new();
    loop {
        let trimmed = rest.trim_start();
        let (body, closing) = if let Some(r) = trimmed.strip_prefix("<|tool_call|>") {
            (r, Some("<|/tool_call|>"))
        } else if let Some(r) = trimmed.strip_prefix("functools") {
            (r, None)
        } else {
            break;
        };
        let (value, mut after) = json_prefix(body)?;
        match &value {
            Value::Array(items) => {
                for item in items {
                    calls.push(call_object(item)?);
                }
            }
            other => calls.push(call_object(other)?),
        }
        if let Some(close) = closing {
            after = after.trim_start().strip_prefix(close).unwrap_or(after);
        }
        rest = after;
    }
    (!calls.is_empty()).then_some((calls, rest))
}

/// Gemma's `call:NAME{key:value,...}` between `open` and `close`, strings between `quote`.
fn gemma<'a>(
    text: &'a str,
    open: &str,
    close: &str,
    quote: &str,
) -> Option<(Vec<ParsedCall>, &'a str)> {
    let mut rest = text;
    let mut calls = Vec::new();
    while let Some(after_open) = rest.trim_start().strip_prefix(open) {
        let body = after_open.trim_start().strip_prefix("call:")?;
        let brace = body.find('{')?;
        let name = body[..brace].trim().to_owned();
        let mut reader = GemmaValue {
            text: &body[brace..],
            quote,
            depth: 0,
        };
        let arguments = reader.value()?;
        let after = reader.text.trim_start();
        rest = after.strip_prefix(close).unwrap_or(after);
        calls.push(ParsedCall {
            name,
            arguments,
            id: None,
        });
    }
    (!calls.is_empty()).then_some((calls, rest))
}

/// Gemma's argument syntax: JSON-like, with bare keys and strings between `quote` tokens.
struct GemmaValue<'t, 'q> {
    text: &'t str,
    quote: &'q str,
    depth: u32,
}

impl GemmaValue<'_, '_> {
    fn value(&mut self) -> Option<Value> {
        self.depth += 1;
        if self.depth > 64 {
            return None;
        }
        self.text = self.text.trim_start();
        let value = if let Some(r) = self.text.strip_prefix(self.quote) {
            let end = r.find(self.quote)?;
            self.text = &r[end + self.quote.len()..];
            let s = &r[..end];
            Value::String(s.to_owned())
        } else if let Some(r) = self.text.strip_prefix('{') {
            self.text = r;
            let mut map = Map::new();
            loop {
                self.text = self.text.trim_start();
                if let Some(r) = self.text.strip_prefix('}') {
                    self.text = r;
                    break;
                }
                let colon = self.text.find(':')?;
                let key = self.text[..colon].trim().trim_matches('"').to_owned();
                self.text = &self.text[colon + 1..];
                let v = self.value()?;
                map.insert(key, v);
                self.text = self.text.trim_start();
                self.text = self.text.strip_prefix(',').unwrap_or(self.text);
            }
            Value::Object(map)
        } else if let Some(r) = self.text.strip_prefix('[') {
            self.text = r;
            let mut items = Vec::new();
            loop {
                self.text = self.text.trim_start();
                if let Some(r) = self.text.strip_prefix(']') {
                    self.text = r;
                    break;
                }
                items.push(self.value()?);
                self.text = self.text.trim_start();
                self.text = self.text.strip_prefix(',').unwrap_or(self.text);
            }
            Value::Array(items)
        } else {
            // A bare scalar: a number, true, false or null, up to the next delimiter.
            let end = self.text.find([',', '}', ']']).unwrap_or(self.text.len());
            if end == 0 {
                // A delimiter where a value belongs: not Gemma's syntax.
                return None;
            }
            let raw = self.text[..end].trim();
            self.text = &self.text[end..];
            serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
        };
        self.depth -= 1;
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{ParsedCall, ToolFormat};

    fn call(name: &str, arguments: serde_json::Value) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments,
            id: None,
        }
    }

    #[test]
    fn qwen_xml_parameters_follow_the_declared_types() {
        let tools = [
            json!({"type": "function", "function": {"name": "f", "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "code": {"type": "string"}}
            }}}),
        ];
        let text = "<tool_call>\n<function=f>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=code>\n007\n</parameter>\n</function>\n</tool_call>";
        let (content, calls) = ToolFormat::Hermes.parse(text, &tools);
        assert_eq!(content, "");
        assert_eq!(
            calls,
            [call(
                "f",
                json!({"city": "Paris", "days": 3, "code": "007"})
            )]
        );
    }

    #[test]
    fn gemma_arguments_read_as_json() {
        let text = "<|tool_call>call:f{city:<|\"|>Paris, FR<|\"|>,n:42,ok:true,o:{k:[1,<|\"|>a<|\"|>]}}<tool_call|>";
        let (_, calls) = ToolFormat::Gemma4.parse(text, &[]);
        assert_eq!(
            calls,
            [call(
                "f",
                json!({"city": "Paris, FR", "n": 42, "ok": true, "o": {"k": [1, "a"]}})
            )]
        );
    }
}
