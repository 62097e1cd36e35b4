//! Chat templates in the dialect HF tokenizers use: Jinja rendered with `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, `raise_exception` and `strftime_now`,
//! with Python string methods (`.strip()`, `.startswith()`, …) available as in transformers.

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use super::error::LoadError;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: String,
    /// An earlier answer's reasoning, which some templates keep (GPT-OSS's `thinking`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// The calls an assistant turn made (OpenAI's `tool_calls`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Which call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool's name on a `tool` message, where the client gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool definitions as JSON text on a system message, where a template reads them there
    /// (Phi-4-mini's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.to_owned(),
            content: content.to_owned(),
            thinking: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            tools: None,
        }
    }
}

/// One function call, in the shape templates read (`tool_call.function.name`, and the
/// arguments as a mapping, as transformers passes them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// A JSON object where the arguments parse as one; the text as sent otherwise.
    pub arguments: serde_json::Value,
}

fn function_kind() -> String {
    "function".to_owned()
}

/// How hard a reasoning model thinks, where its template takes it (GPT-OSS's
/// `reasoning_effort`; the template's default is medium).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningEffort {
    Low,
    Medium,
    High,
}

impl ReasoningEffort {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
        }
    }

    /// `low`, `medium` or `high`, in any case.
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "low" => Some(Self::Low),
            "medium" => Some(Self::Medium),
            "high" => Some(Self::High),
            _ => None,
        }
    }
}

/// What a chat template is told besides the messages; None leaves a switch undefined, which
/// templates take as their default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatSwitches {
    /// `enable_thinking` (Qwen3's switch).
    pub thinking: Option<bool>,
    /// `reasoning_effort` (GPT-OSS).
    pub reasoning_effort: Option<ReasoningEffort>,
    /// `tools`: function definitions in OpenAI's shape (none when empty, as transformers
    /// passes it).
    pub tools: Vec<serde_json::Value>,
}

pub struct ChatTemplate {
    /// The template reads `enable_thinking` (a reasoning model that can answer directly).
    pub thinking_switch: bool,
    /// The template reads `tools` (otherwise they are described in a system message).
    pub knows_tools: bool,
    /// The template's text, from which the tool-call format is recognised.
    pub source: String,
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, LoadError> {
        let mut env = Environment::new();
        // transformers renders with trim_blocks and lstrip_blocks.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |format: String| -> String {
            strftime_now(&format)
        });
        // transformers replaces Jinja's `tojson` (which escapes HTML) with Python's json.dumps.
        env.add_filter("tojson", super::python_json::tojson_filter);
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| LoadError::Template(e.to_string()))?;
        Ok(Self {
            thinking_switch: source.contains("enable_thinking"),
            knows_tools: reads_tools_variable(source),
            source: source.to_owned(),
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// Renders `messages` with the template's switches set as `switches` says.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        switches: &ChatSwitches,
    ) -> Result<String, LoadError> {
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| LoadError::Template(e.to_string()))?;
        let mut ctx = std::collections::BTreeMap::<&str, Value>::new();
        ctx.insert("messages", Value::from_serialize(messages));
        ctx.insert("add_generation_prompt", add_generation_prompt.into());
        ctx.insert("bos_token", self.bos_token.clone().into());
        ctx.insert("eos_token", self.eos_token.clone().into());
        if let Some(on) = switches.thinking {
            ctx.insert("enable_thinking", on.into());
        }
        if let Some(effort) = switches.reasoning_effort {
            ctx.insert("reasoning_effort", effort.as_str().into());
        }
        ctx.insert(
            "tools",
            if switches.tools.is_empty() {
                Value::from(())
            } else {
                Value::from_serialize(&switches.tools)
            },
        );
        let ctx = Value::from(ctx);
        template.render(ctx).map_err(|e| {
            let mut message = e.to_string();
            if let Some(detail) = e.detail() {
                message = format!("{message}: {detail}");
            }
            LoadError::Template(message)
        })
    }
}

/// Whether a template reads the `tools` variable (not merely a message's `tools` field, as
/// Phi-4-mini's does, or `builtin_tools`).
fn reads_tools_variable(source: &str) -> bool {
    let bytes = source.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    source.match_indices("tools").any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + "tools".len()).copied();
        !before.is_some_and(|b| ident(b) || b == b'\'' || b == b'"' || b == b'.')
            && !after.is_some_and(|b| ident(b) || b == b'\'' || b == b'"')
    })
}

/// Today's date in the handful of strftime directives chat templates use (Llama 3's
/// `strftime_now("%d %b %Y")`), in UTC.
fn strftime_now(format: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let (year, month, day) = civil_from_days(days);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_and_python_methods() {
        let source = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'].strip() }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(source, "", "<|im_end|>").expect("compiles");
        let out = t
            .render(
                &[ChatMessage::new("user", "  hi  ")],
                true,
                &ChatSwitches::default(),
            )
            .expect("renders");
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn the_thinking_switch_reaches_the_template() {
        // The tail of Qwen3's template.
        let source = "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}";
        let t = ChatTemplate::new(source, "", "").expect("compiles");
        assert!(t.thinking_switch);
        let with = |thinking| ChatSwitches {
            thinking,
            ..Default::default()
        };
        let on = t.render(&[], true, &with(None)).expect("renders");
        assert_eq!(on, t.render(&[], true, &with(Some(true))).expect("renders"));
        assert!(!on.contains("<think>"));
        let off = t.render(&[], true, &with(Some(false))).expect("renders");
        assert!(off.ends_with("<think>\n\n</think>\n\n"), "{off:?}");
        assert!(
            !ChatTemplate::new("{{ bos_token }}", "", "")
                .expect("compiles")
                .thinking_switch
        );
    }

    #[test]
    fn the_tools_variable_is_told_from_a_messages_field() {
        assert!(reads_tools_variable(
            "{%- if tools %}{{ tools | tojson }}{% endif %}"
        ));
        assert!(reads_tools_variable("{%- if not tools is defined %}"));
        assert!(!reads_tools_variable(
            "{% if 'tools' in message and message['tools'] is not none %}"
        ));
        assert!(!reads_tools_variable("{{ builtin_tools }} {{ m.tools }}"));
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let t =
            ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").expect("compiles");
        let err = t
            .render(&[], false, &ChatSwitches::default())
            .expect_err("must fail");
        assert!(err.to_string().contains("no system role"), "{err}");
    }

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }
}
