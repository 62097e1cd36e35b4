//! Calls read while they are written, so that a streamed answer sends each call's name as soon
//! as it is known and its arguments piece by piece (OpenAI's `delta.tool_calls` fragments), as
//! an editor showing a file being written needs. Formats whose calls are JSON objects
//! (Hermes' `<tool_call>{…}`, Llama 3's bare objects, Mistral's arrays and `name[ARGS]{…}`,
//! Phi-4-mini's lists) are read this way; the others go out whole when read.
//!
//! The fragments are the arguments as `serde_json` writes them compactly (what the whole call
//! would carry), produced from the raw text only as far as it is certain: complete tokens,
//! and a string's characters so far (json_scan.rs).

use std::collections::HashMap;

use super::ToolFormat;
use super::json_scan::{Scan, ValueScan, blanks};

/// A call found in what has been written so far.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Progress {
    pub(super) name: String,
    pub(super) id: Option<String>,
    /// The settled prefix of the arguments' compact JSON.
    pub(super) arguments: String,
}

/// The calls of `text` (from the first marker on) whose names are known and whose arguments
/// are JSON objects, in order, with as much of their arguments as is settled. Stops at the
/// first call that cannot be read this way.
#[cfg(test)]
pub(super) fn progress(format: ToolFormat, text: &str) -> Vec<Progress> {
    Reader::default().progress(format, text)
}

/// Reads the calls of a text that grows (what a stream holds from a marker on), each time it
/// grows: every JSON value's scan resumes where it stopped, so a call read token by token
/// costs about what reading it once does. A text that changed other than by growing needs a
/// new reader.
#[derive(Debug, Default)]
pub(super) struct Reader {
    /// Value scans by the byte offset their value starts at.
    scans: HashMap<usize, ValueScan>,
    seen: usize,
}

impl Reader {
    /// As the module's calls so far: those of `text` whose names are known and whose
    /// arguments are JSON objects, in order, with as much of their arguments as is settled.
    /// Stops at the first call that cannot be read this way.
    pub(super) fn progress(&mut self, format: ToolFormat, text: &str) -> Vec<Progress> {
        if text.len() < self.seen {
            self.scans.clear();
        }
        self.seen = text.len();
        let mut cx = Cx {
            whole: text,
            scans: &mut self.scans,
            found: Vec::new(),
        };
        match format {
            ToolFormat::Hermes => hermes(text, &mut cx),
            ToolFormat::Llama3 => llama3(text, &mut cx),
            ToolFormat::Mistral => mistral(text, &mut cx),
            ToolFormat::Phi4 => phi4(text, &mut cx),
            ToolFormat::Gemma4 | ToolFormat::FunctionGemma => {}
        }
        cx.found
    }
}

/// One reading of a reader's text.
struct Cx<'a> {
    whole: &'a str,
    scans: &'a mut HashMap<usize, ValueScan>,
    found: Vec<Progress>,
}

impl Cx<'_> {
    /// The scan of the value at the start of `rest`, a tail of the whole text.
    fn scan(&mut self, rest: &str) -> Scan {
        debug_assert_eq!(
            rest.as_ptr() as usize + rest.len(),
            self.whole.as_ptr() as usize + self.whole.len(),
            "a tail of the text"
        );
        let at = self.whole.len() - rest.len();
        let scan = self.scans.entry(at).or_default();
        scan.feed(rest);
        scan.result()
    }
}

fn hermes(mut text: &str, cx: &mut Cx<'_>) {
    while let Some(rest) = text.trim_start().strip_prefix("<tool_call>") {
        let Some(end) = object(rest.trim_start(), cx) else {
            return;
        };
        let after = &rest.trim_start()[end..];
        match after.trim_start().strip_prefix("</tool_call>") {
            Some(next) => text = next,
            None => return,
        }
    }
}

fn llama3(text: &str, cx: &mut Cx<'_>) {
    let mut rest = text.trim_start();
    rest = rest
        .strip_prefix("<|python_tag|>")
        .unwrap_or(rest)
        .trim_start();
    while let Some(end) = object(rest, cx) {
        match rest[end..].trim_start().strip_prefix(';') {
            Some(next) => rest = next.trim_start(),
            None => return,
        }
    }
}

fn mistral(text: &str, cx: &mut Cx<'_>) {
    let Some(mut rest) = text.trim_start().strip_prefix("[TOOL_CALLS]") else {
        return;
    };
    if let Some(list) = rest.trim_start().strip_prefix('[') {
        objects_list(list, cx);
        return;
    }
    loop {
        let Some(name_end) = rest.find(['[', '{']) else {
            return;
        };
        let name = rest[..name_end].trim().to_owned();
        rest = &rest[name_end..];
        let mut id = None;
        if let Some(after) = rest.strip_prefix("[CALL_ID]") {
            let Some(end) = after.find(['[', '{']) else {
                return;
            };
            id = Some(after[..end].trim().to_owned());
            rest = &after[end..];
        }
        rest = rest.strip_prefix("[ARGS]").unwrap_or(rest);
        if name.is_empty() || !rest.starts_with('{') {
            return;
        }
        let scan = cx.scan(rest);
        if !scan.valid {
            return;
        }
        cx.found.push(Progress {
            name,
            id,
            arguments: scan.canonical,
        });
        let Some(end) = scan.end else {
            return;
        };
        match rest[end..].trim_start().strip_prefix("[TOOL_CALLS]") {
            Some(next) => rest = next,
            None => return,
        }
    }
}

fn phi4(text: &str, cx: &mut Cx<'_>) {
    let Some(body) = text.trim_start().strip_prefix("<|tool_call|>") else {
        return;
    };
    let body = body.trim_start();
    match body.strip_prefix('[') {
        Some(list) => objects_list(list, cx),
        None => {
            object(body, cx);
        }
    }
}

/// The call objects of a JSON list whose `[` is behind.
fn objects_list(mut rest: &str, cx: &mut Cx<'_>) {
    loop {
        rest = rest.trim_start();
        let Some(end) = object(rest, cx) else {
            return;
        };
        match rest[end..].trim_start().strip_prefix(',') {
            Some(next) => rest = next,
            None => return,
        }
    }
}

/// One `{"name": …, "arguments" | "parameters": {…}}` object at the start of `text`: its
/// progress joins `found` once its name is known and its arguments have begun. The object's
/// end (in bytes) when it is complete.
fn object(text: &str, cx: &mut Cx<'_>) -> Option<usize> {
    let mut pos = text.strip_prefix('{').map(|_| 1)?;
    let (mut name, mut id, mut arguments) = (None, None, None);
    let mut pushed = false;
    let end = loop {
        pos += blanks(&text[pos..]);
        if text[pos..].starts_with('}') {
            break Some(pos + 1);
        }
        let key = cx.scan(&text[pos..]);
        let key_end = key.end?;
        let key: String = serde_json::from_str(&text[pos..pos + key_end]).ok()?;
        pos += key_end;
        pos += blanks(&text[pos..]);
        pos += text[pos..].strip_prefix(':').map(|_| 1)?;
        pos += blanks(&text[pos..]);
        let value = &text[pos..];
        let scan = cx.scan(value);
        if !scan.valid {
            return None;
        }
        match key.as_str() {
            "name" | "id" => {
                let raw = &value[..scan.end?];
                let s: String = serde_json::from_str(raw).ok()?;
                if key == "name" {
                    name = Some(s);
                } else {
                    id = Some(s);
                }
            }
            // Arguments written as a JSON string are read as the JSON inside it: whole.
            "arguments" | "parameters" if value.starts_with('{') => {
                arguments = Some(scan.canonical);
            }
            // OpenAI's nested `{"type": "function", "function": {...}}`, or string arguments.
            "function" | "arguments" | "parameters" => return None,
            _ => {}
        }
        if let (Some(n), Some(a)) = (&name, &arguments)
            && !pushed
        {
            cx.found.push(Progress {
                name: n.clone(),
                id: id.clone(),
                arguments: a.clone(),
            });
            pushed = true;
        }
        pos += scan.end?;
        pos += blanks(&text[pos..]);
        match text[pos..].chars().next() {
            Some(',') => pos += 1,
            Some('}') => break Some(pos + 1),
            _ => return None,
        }
    };
    // A call read whole only once complete still counts (its name came after its arguments).
    if !pushed && let (Some(name), Some(arguments)) = (name, arguments) {
        cx.found.push(Progress {
            name,
            id,
            arguments,
        });
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn calls_are_read_while_written() {
        let text = "<tool_call>\n{\"name\": \"write\", \"arguments\": {\"path\": \"a.txt\", \"text\": \"hel";
        assert_eq!(
            progress(ToolFormat::Hermes, text),
            [Progress {
                name: "write".into(),
                id: None,
                arguments: r#"{"path":"a.txt","text":"hel"#.into(),
            }]
        );
        // Not before the name is known; arguments as a string are read whole later.
        assert!(progress(ToolFormat::Hermes, "<tool_call>{\"arguments\": {\"x\": 1").is_empty());
        assert!(
            progress(
                ToolFormat::Hermes,
                "<tool_call>{\"name\": \"f\", \"arguments\": \"{"
            )
            .is_empty()
        );
        // Two calls of a Mistral list, a Llama pair, Mistral's [ARGS] form, Phi-4's list.
        let mistral = "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"k\": [1";
        let names: Vec<_> = progress(ToolFormat::Mistral, mistral)
            .into_iter()
            .map(|p| (p.name, p.arguments))
            .collect();
        // The 1 may go on (12…): it is not settled yet.
        assert_eq!(
            names,
            [("a".into(), "{}".into()), ("b".into(), "{\"k\":[".into())]
        );
        let llama = "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": 1}}; {\"name\": \"b\", \"parameters\": {";
        assert_eq!(progress(ToolFormat::Llama3, llama).len(), 2);
        let args = "[TOOL_CALLS]search[CALL_ID]abc123XYZ[ARGS]{\"q\": \"x";
        assert_eq!(
            progress(ToolFormat::Mistral, args),
            [Progress {
                name: "search".into(),
                id: Some("abc123XYZ".into()),
                arguments: "{\"q\":\"x".into(),
            }]
        );
        let phi = "<|tool_call|>[{\"name\": \"f\", \"arguments\": {\"a\": 2}}]";
        assert_eq!(progress(ToolFormat::Phi4, phi)[0].arguments, "{\"a\":2}");
    }

    /// A reader fed a growing text reads every prefix as a fresh reading of it does.
    #[test]
    fn a_reader_resumes_as_a_fresh_reading() {
        for (format, text) in [
            (
                ToolFormat::Hermes,
                "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"p\": \"a\\u00e9\\n\", \"n\": [1, 22, {}]}}\n</tool_call>\n<tool_call>{\"arguments\": {\"x\": true}, \"name\": \"v\"}</tool_call>",
            ),
            (
                ToolFormat::Mistral,
                "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"k\": [1, null]}}]",
            ),
            (
                ToolFormat::Mistral,
                "[TOOL_CALLS]search[CALL_ID]abc123XYZ[ARGS]{\"q\": \"x y\"}[TOOL_CALLS]f[ARGS]{}",
            ),
            (
                ToolFormat::Llama3,
                "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": 1}}; {\"name\": \"b\", \"parameters\": {\"s\": \"\\ud83d\\ude00\"}}",
            ),
        ] {
            let mut reader = Reader::default();
            for (i, _) in text.char_indices().chain([(text.len(), ' ')]) {
                assert_eq!(
                    reader.progress(format, &text[..i]),
                    progress(format, &text[..i]),
                    "{format:?} {:?}",
                    &text[..i]
                );
            }
        }
    }
}
