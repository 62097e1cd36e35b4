//! Calls read while they are written, so that a streamed answer sends each call's name as soon
//! as it is known and its arguments piece by piece (OpenAI's `delta.tool_calls` fragments), as
//! an editor showing a file being written needs. Formats whose calls are JSON objects
//! (Hermes' `<tool_call>{…}`, Llama 3's bare objects, Mistral's arrays and `name[ARGS]{…}`,
//! Phi-4-mini's lists) are read this way; the others go out whole when read.
//!
//! The fragments are the arguments as `serde_json` writes them compactly (what the whole call
//! would carry), produced from the raw text only as far as it is certain: complete tokens,
//! and a string's characters so far. No JSON library reads an unfinished document and says
//! how much of its canonical form is settled, hence this small scanner.

use std::collections::HashSet;

use super::ToolFormat;

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
pub(super) fn progress(format: ToolFormat, text: &str) -> Vec<Progress> {
    let mut found = Vec::new();
    match format {
        ToolFormat::Hermes => hermes(text, &mut found),
        ToolFormat::Llama3 => llama3(text, &mut found),
        ToolFormat::Mistral => mistral(text, &mut found),
        ToolFormat::Phi4 => phi4(text, &mut found),
        ToolFormat::Gemma4 | ToolFormat::FunctionGemma => {}
    }
    found
}

fn hermes(mut text: &str, found: &mut Vec<Progress>) {
    while let Some(rest) = text.trim_start().strip_prefix("<tool_call>") {
        let Some(end) = object(rest.trim_start(), found) else {
            return;
        };
        let after = &rest.trim_start()[end..];
        match after.trim_start().strip_prefix("</tool_call>") {
            Some(next) => text = next,
            None => return,
        }
    }
}

fn llama3(text: &str, found: &mut Vec<Progress>) {
    let mut rest = text.trim_start();
    rest = rest
        .strip_prefix("<|python_tag|>")
        .unwrap_or(rest)
        .trim_start();
    while let Some(end) = object(rest, found) {
        match rest[end..].trim_start().strip_prefix(';') {
            Some(next) => rest = next.trim_start(),
            None => return,
        }
    }
}

fn mistral(text: &str, found: &mut Vec<Progress>) {
    let Some(mut rest) = text.trim_start().strip_prefix("[TOOL_CALLS]") else {
        return;
    };
    if let Some(list) = rest.trim_start().strip_prefix('[') {
        objects_list(list, found);
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
        let scan = scan_value(rest);
        if !scan.valid {
            return;
        }
        found.push(Progress {
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

fn phi4(text: &str, found: &mut Vec<Progress>) {
    let Some(body) = text.trim_start().strip_prefix("<|tool_call|>") else {
        return;
    };
    let body = body.trim_start();
    match body.strip_prefix('[') {
        Some(list) => objects_list(list, found),
        None => {
            object(body, found);
        }
    }
}

/// The call objects of a JSON list whose `[` is behind.
fn objects_list(mut rest: &str, found: &mut Vec<Progress>) {
    loop {
        rest = rest.trim_start();
        let Some(end) = object(rest, found) else {
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
fn object(text: &str, found: &mut Vec<Progress>) -> Option<usize> {
    let mut pos = text.strip_prefix('{').map(|_| 1)?;
    let (mut name, mut id, mut arguments) = (None, None, None);
    let mut pushed = false;
    let end = loop {
        pos += blanks(&text[pos..]);
        if text[pos..].starts_with('}') {
            break Some(pos + 1);
        }
        let key = scan_value(&text[pos..]);
        let key_end = key.end?;
        let key: String = serde_json::from_str(&text[pos..pos + key_end]).ok()?;
        pos += key_end;
        pos += blanks(&text[pos..]);
        pos += text[pos..].strip_prefix(':').map(|_| 1)?;
        pos += blanks(&text[pos..]);
        let value = &text[pos..];
        let scan = scan_value(value);
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
            found.push(Progress {
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
        found.push(Progress {
            name,
            id,
            arguments,
        });
    }
    end
}

fn blanks(text: &str) -> usize {
    text.len() - text.trim_start().len()
}

/// How far a JSON value written so far reads.
#[derive(Debug, PartialEq)]
pub(super) struct Scan {
    /// Its settled compact form: whole tokens, and an unfinished string's characters so far.
    pub(super) canonical: String,
    /// Where it ends (bytes), once complete.
    pub(super) end: Option<usize>,
    /// False where the text cannot be JSON, or an object repeats a key (the value would then
    /// not keep what was sent).
    pub(super) valid: bool,
}

/// Reads the JSON value at the start of `text` (no leading blanks) as far as it goes.
pub(super) fn scan_value(text: &str) -> Scan {
    let mut out = String::new();
    // Open containers: an object's keys so far, or None for an array.
    let mut stack: Vec<Option<HashSet<String>>> = Vec::new();
    let mut expect_key = false;
    let mut pos = 0;
    let bytes = text.as_bytes();
    let stop = |out: String, valid: bool| Scan {
        canonical: out,
        end: None,
        valid,
    };
    loop {
        if !stack.is_empty() {
            pos += blanks(&text[pos..]);
        }
        let Some(&c) = bytes.get(pos) else {
            return stop(out, true);
        };
        match c {
            b'{' | b'[' if !expect_key => {
                out.push(c as char);
                pos += 1;
                let object = c == b'{';
                stack.push(object.then(HashSet::new));
                expect_key = object;
                pos += blanks(&text[pos..]);
                let close = if object { b'}' } else { b']' };
                if bytes.get(pos) == Some(&close) {
                    out.push(close as char);
                    pos += 1;
                    stack.pop();
                } else {
                    continue;
                }
            }
            b'"' => {
                let Some(len) = string_len(&text[pos..]) else {
                    // An unfinished key is held; an unfinished value's characters go out.
                    if !expect_key {
                        out.push_str(&escaped_so_far(&text[pos + 1..]));
                    }
                    return stop(out, true);
                };
                let Ok(s) = serde_json::from_str::<String>(&text[pos..pos + len]) else {
                    return stop(out, false);
                };
                if expect_key {
                    let Some(Some(keys)) = stack.last_mut() else {
                        return stop(out, false);
                    };
                    if !keys.insert(s.clone()) {
                        return stop(out, false);
                    }
                }
                let written = serde_json::to_string(&s).unwrap_or_default();
                pos += len;
                if expect_key {
                    pos += blanks(&text[pos..]);
                    match bytes.get(pos) {
                        Some(b':') => {
                            out.push_str(&written);
                            out.push(':');
                            pos += 1;
                            pos += blanks(&text[pos..]);
                            expect_key = false;
                            continue;
                        }
                        None => return stop(out, true),
                        Some(_) => return stop(out, false),
                    }
                }
                out.push_str(&written);
            }
            _ if expect_key => return stop(out, false),
            b't' | b'f' | b'n' => {
                let word = ["true", "false", "null"]
                    .into_iter()
                    .find(|w| w.as_bytes()[0] == c)
                    .unwrap_or("null");
                let have = &text[pos..];
                if have.len() < word.len() {
                    return stop(out, word.starts_with(have));
                }
                if !have.starts_with(word) {
                    return stop(out, false);
                }
                out.push_str(word);
                pos += word.len();
            }
            b'-' | b'0'..=b'9' => {
                let len = text[pos..]
                    .find(|ch: char| !matches!(ch, '-' | '+' | '.' | 'e' | 'E' | '0'..='9'))
                    .unwrap_or(text.len() - pos);
                // A number is settled only once something follows it.
                if pos + len == text.len() {
                    return stop(out, true);
                }
                match serde_json::from_str::<serde_json::Value>(&text[pos..pos + len]) {
                    Ok(v) if v.is_number() => out.push_str(&v.to_string()),
                    _ => return stop(out, false),
                }
                pos += len;
            }
            _ => return stop(out, false),
        }
        // After a value: the end of a container, a comma, or the end of the whole value.
        loop {
            let Some(top) = stack.last() else {
                return Scan {
                    canonical: out,
                    end: Some(pos),
                    valid: true,
                };
            };
            pos += blanks(&text[pos..]);
            let close = if top.is_some() { b'}' } else { b']' };
            match bytes.get(pos) {
                None => return stop(out, true),
                Some(b',') => {
                    out.push(',');
                    pos += 1;
                    expect_key = top.is_some();
                    break;
                }
                Some(&b) if b == close => {
                    out.push(close as char);
                    pos += 1;
                    stack.pop();
                }
                Some(_) => return stop(out, false),
            }
        }
    }
}

/// The length of the complete JSON string at the start of `text` (from its `"`), if closed.
fn string_len(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// `"` and the characters of an unfinished string's content so far (after its `"`), escaped
/// as `serde_json` writes them; an unfinished escape (or half a surrogate pair) is held.
fn escaped_so_far(content: &str) -> String {
    let mut out = String::from("\"");
    let mut chars = content.chars().peekable();
    let mut settled = String::new();
    while let Some(c) = chars.next() {
        if c != '\\' {
            settled.push(c);
            continue;
        }
        let rest: String = chars.clone().collect();
        let take = match rest.chars().next() {
            None => break,
            Some('u') => {
                // \uXXXX, and for a high surrogate the \uXXXX of its low half.
                let high = rest.get(1..5).and_then(|h| u16::from_str_radix(h, 16).ok());
                match high {
                    None => break,
                    Some(h) if (0xD800..0xDC00).contains(&h) => 11,
                    Some(_) => 5,
                }
            }
            Some(_) => 1,
        };
        // Escapes are ASCII: anything else in the span is not one (held, then refused).
        let Some(span) = rest.get(..take).filter(|s| s.is_ascii()) else {
            break;
        };
        let escape = format!("\"\\{span}\"");
        match serde_json::from_str::<String>(&escape) {
            Ok(s) => settled.push_str(&s),
            Err(_) => break,
        }
        for _ in 0..take {
            chars.next();
        }
    }
    let written = serde_json::to_string(&settled).unwrap_or_default();
    // The escaped content without its closing quote.
    out.push_str(&written[1..written.len() - 1]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Every prefix of `raw` scans to a prefix of the value's compact form, and the whole
    /// scans to all of it.
    fn settles_as_serde_writes(raw: &str) {
        let want = serde_json::from_str::<Value>(raw)
            .expect("json")
            .to_string();
        let mut last = String::new();
        for (i, _) in raw.char_indices().chain([(raw.len(), ' ')]) {
            let scan = scan_value(&raw[..i]);
            assert!(scan.valid, "{:?}", &raw[..i]);
            assert!(
                want.starts_with(&scan.canonical),
                "{:?} gave {:?}, not a prefix of {want:?}",
                &raw[..i],
                scan.canonical
            );
            assert!(scan.canonical.len() >= last.len(), "{:?}", &raw[..i]);
            last = scan.canonical;
        }
        let whole = scan_value(raw);
        assert_eq!(whole.canonical, want);
        assert_eq!(whole.end, Some(raw.len()));
    }

    #[test]
    fn prefixes_settle_into_serde_json_output() {
        for raw in [
            r#"{"path": "src/main.rs", "content": "fn main() {\n\tprintln!(\"hi\");\n}\n"}"#,
            r#"{ "a" : [1, 2.50, -3e2, true, null, {"b": []}], "c": {} }"#,
            r#"{"emoji": "\ud83d\ude00 caf\u00e9 \u0001 /slash\/", "n": 0}"#,
            r#"{"nested": {"deep": [[{"x": "y"}]]}, "f": false}"#,
            "{\"tabs\":\"a\\tb\",\"uni\":\"日本語\"}",
        ] {
            settles_as_serde_writes(raw);
        }
    }

    #[test]
    fn bad_text_and_repeated_keys_stop_the_scan() {
        assert!(!scan_value(r#"{"a": tru}"#).valid);
        assert!(!scan_value(r#"{"a" 1}"#).valid);
        assert!(!scan_value(r#"{"a": 1, "a": 2}"#).valid);
        assert!(!scan_value(r#"{a: 1}"#).valid);
        assert!(scan_value(r#"{"a": 1, "b"#).valid);
    }

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
}
