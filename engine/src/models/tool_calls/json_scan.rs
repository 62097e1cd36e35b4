//! A JSON value read while it is written: how much of its compact form (as `serde_json`
//! writes it) is settled so far — complete tokens, and an unfinished string's characters — and
//! where it ends once complete. No JSON library reads an unfinished document and says how
//! much of its canonical form is settled, hence this small scanner. It resumes where it
//! stopped when the text grows, so that a call's arguments read token by token cost what
//! reading them once does.

use std::collections::HashSet;

pub(super) fn blanks(text: &str) -> usize {
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
#[cfg(test)]
pub(super) fn scan_value(text: &str) -> Scan {
    let mut scan = ValueScan::default();
    scan.feed(text);
    scan.result()
}

/// Where a [`ValueScan`] stands between two tokens.
#[derive(Clone, Debug, Default, PartialEq)]
enum Expect {
    /// A value (or with `expect_key`, a key).
    #[default]
    Value,
    /// A container was just opened: its close, or its first value or key.
    First,
    /// A comma, a container's close, or the end of the whole value.
    After,
    /// The colon after a complete key.
    Colon(String),
}

/// A JSON value's scan that resumes where it stopped when the text grows, so that reading a
/// call token by token costs what reading it once does (a file's content written as one
/// argument is tens of thousands of characters).
#[derive(Debug, Default)]
pub(super) struct ValueScan {
    out: String,
    /// Open containers: an object's keys so far, or None for an array.
    stack: Vec<Option<HashSet<String>>>,
    expect_key: bool,
    expect: Expect,
    /// Where reading resumes: the start of the first token not yet settled, or inside the
    /// open string.
    pos: usize,
    /// The string being read: its opening quote is behind `pos`; a key's characters so far
    /// (a value's go straight out).
    string: Option<String>,
    end: Option<usize>,
    valid: bool,
    started: bool,
}

impl ValueScan {
    /// Reads `text`, which extends the text of every call before (or is the first), as far
    /// as it settles.
    pub(super) fn feed(&mut self, text: &str) {
        if !self.started {
            self.started = true;
            self.valid = true;
        }
        if self.end.is_none() && self.valid && !self.step_all(text) {
            self.valid = false;
        }
    }

    pub(super) fn result(&self) -> Scan {
        Scan {
            canonical: self.out.clone(),
            end: self.end,
            valid: self.valid || !self.started,
        }
    }

    /// Reads tokens until the text ends or the value does; false where it cannot be JSON.
    fn step_all(&mut self, text: &str) -> bool {
        loop {
            let read = if self.string.is_some() {
                self.read_string(text)
            } else {
                if !self.stack.is_empty() {
                    self.pos += blanks(&text[self.pos..]);
                }
                let Some(&c) = text.as_bytes().get(self.pos) else {
                    return true;
                };
                match std::mem::take(&mut self.expect) {
                    Expect::After => self.after_value(c),
                    Expect::Colon(key) => self.colon(c, key),
                    Expect::First if self.closes_empty(c) => {
                        self.out.push(c as char);
                        self.pos += 1;
                        self.stack.pop();
                        self.expect = Expect::After;
                        Some(true)
                    }
                    Expect::First | Expect::Value => self.token(text, c),
                }
            };
            match read {
                Some(true) => {}
                Some(false) => return true,
                None => return false,
            }
            if self.expect == Expect::After && self.stack.is_empty() {
                self.end = Some(self.pos);
                return true;
            }
        }
    }

    /// Whether `c` closes the container just opened.
    fn closes_empty(&self, c: u8) -> bool {
        matches!(
            (c, self.stack.last()),
            (b'}', Some(Some(_))) | (b']', Some(None))
        )
    }

    /// A value's first byte `c` at `pos`: Some(true) when read, Some(false) when it needs more
    /// text, None when it cannot be JSON.
    fn token(&mut self, text: &str, c: u8) -> Option<bool> {
        let rest = &text[self.pos..];
        match c {
            b'"' => {
                if !self.expect_key {
                    self.out.push('"');
                }
                self.string = Some(String::new());
                self.pos += 1;
                Some(true)
            }
            _ if self.expect_key => None,
            b'{' | b'[' => {
                self.out.push(c as char);
                self.pos += 1;
                let object = c == b'{';
                self.stack.push(object.then(HashSet::new));
                self.expect_key = object;
                self.expect = Expect::First;
                Some(true)
            }
            b't' | b'f' | b'n' => {
                let word = ["true", "false", "null"]
                    .into_iter()
                    .find(|w| w.as_bytes()[0] == c)
                    .unwrap_or("null");
                if rest.len() < word.len() {
                    self.expect = Expect::Value;
                    return word.starts_with(rest).then_some(false);
                }
                if !rest.starts_with(word) {
                    return None;
                }
                self.out.push_str(word);
                self.pos += word.len();
                self.expect = Expect::After;
                Some(true)
            }
            b'-' | b'0'..=b'9' => {
                let len = rest
                    .find(|ch: char| !matches!(ch, '-' | '+' | '.' | 'e' | 'E' | '0'..='9'))
                    .unwrap_or(rest.len());
                // A number is settled only once something follows it.
                if len == rest.len() {
                    self.expect = Expect::Value;
                    return Some(false);
                }
                match serde_json::from_str::<serde_json::Value>(&rest[..len]) {
                    Ok(v) if v.is_number() => self.out.push_str(&v.to_string()),
                    _ => return None,
                }
                self.pos += len;
                self.expect = Expect::After;
                Some(true)
            }
            _ => None,
        }
    }

    /// After a value, at `c`: a comma, a close, or (checked by the caller) the end.
    fn after_value(&mut self, c: u8) -> Option<bool> {
        let object = self.stack.last()?.is_some();
        let close = if object { b'}' } else { b']' };
        if c == b',' {
            self.out.push(',');
            self.pos += 1;
            self.expect_key = object;
            self.expect = Expect::Value;
        } else if c == close {
            self.out.push(c as char);
            self.pos += 1;
            self.stack.pop();
            self.expect = Expect::After;
        } else {
            return None;
        }
        Some(true)
    }

    /// The colon after a complete key: the key goes out with it (an unfinished key is held).
    fn colon(&mut self, c: u8, key: String) -> Option<bool> {
        if c != b':' {
            return None;
        }
        self.out.push_str(&serde_json::to_string(&key).ok()?);
        self.out.push(':');
        self.pos += 1;
        self.expect_key = false;
        self.expect = Expect::Value;
        Some(true)
    }

    /// Reads the open string on from `pos`: Some(true) once it closes, Some(false) when the
    /// text ends first (an unfinished escape, or half a surrogate pair, is held), None where
    /// it cannot be JSON.
    fn read_string(&mut self, text: &str) -> Option<bool> {
        let rest = &text[self.pos..];
        // Runs of plain characters go out (or into the key) escaped as serde_json writes
        // them: escaping is per character, so runs escape alike one by one or joined.
        let mut plain = String::new();
        let mut used = 0;
        let mut closed = false;
        let mut chars = rest.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    used = i + 1;
                    closed = true;
                    break;
                }
                '\\' => {
                    let Some((len, decoded)) = escape_at(&rest[i..]) else {
                        // Unfinished: held; or not an escape at all.
                        if escape_may_continue(&rest[i..]) {
                            used = i;
                            break;
                        }
                        return None;
                    };
                    plain.push_str(&decoded);
                    for _ in 1..len {
                        chars.next();
                    }
                    used = i + len;
                }
                c if (c as u32) < 0x20 => return None,
                c => {
                    plain.push(c);
                    used = i + c.len_utf8();
                }
            }
        }
        self.pos += used;
        let key = self.string.as_mut()?;
        if self.expect_key {
            key.push_str(&plain);
        } else {
            let written = serde_json::to_string(&plain).ok()?;
            self.out.push_str(&written[1..written.len() - 1]);
        }
        if !closed {
            return Some(false);
        }
        let key = self.string.take()?;
        if self.expect_key {
            let Some(Some(keys)) = self.stack.last_mut() else {
                return None;
            };
            if !keys.insert(key.clone()) {
                return None;
            }
            self.expect = Expect::Colon(key);
        } else {
            self.out.push('"');
            self.expect = Expect::After;
        }
        Some(true)
    }
}

/// The escape at the start of `text` (from its `\`), if complete: its length in bytes and
/// the characters it stands for. `\u` escapes of a high surrogate take the low half's too.
fn escape_at(text: &str) -> Option<(usize, String)> {
    let len = match text.as_bytes().get(1)? {
        b'u' => {
            let high = text
                .get(2..6)
                .and_then(|h| u16::from_str_radix(h, 16).ok())?;
            if (0xD800..0xDC00).contains(&high) {
                12
            } else {
                6
            }
        }
        _ => 2,
    };
    // Escapes are ASCII: anything else in the span is not one.
    let span = text.get(..len).filter(|s| s.is_ascii())?;
    serde_json::from_str::<String>(&format!("\"{span}\""))
        .ok()
        .map(|s| (len, s))
}

/// Whether the unfinished text at a `\` can still become an escape.
fn escape_may_continue(text: &str) -> bool {
    let b = text.as_bytes();
    match b.get(1) {
        None => true,
        Some(b'u') => {
            let hex = &b[2..b.len().min(6)];
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return false;
            }
            if hex.len() < 4 {
                return true;
            }
            // A high surrogate waits for `\uXXXX`, its low half.
            let tail = &b[6..b.len().min(12)];
            tail.len() < 6
                && tail.iter().enumerate().all(|(i, c)| match i {
                    0 => *c == b'\\',
                    1 => *c == b'u',
                    _ => c.is_ascii_hexdigit(),
                })
        }
        Some(_) => false,
    }
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
        // One scan fed every prefix in turn reads each as a fresh scan of it does.
        let mut fed = ValueScan::default();
        for (i, _) in raw.char_indices().chain([(raw.len(), ' ')]) {
            let scan = scan_value(&raw[..i]);
            fed.feed(&raw[..i]);
            assert_eq!(fed.result(), scan, "{:?} fed in pieces", &raw[..i]);
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
            r#"[ ]"#,
            r#"{ "e": { }, "l": [ [ ] , 1 ], "s": "\"\\\b\f\n\r\t" }"#,
            r#""top \ud83d\ude00 level""#,
            r#"[true,false,null,-0.5e-3,"\u00e9"]"#,
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
        // Not escapes: a lone surrogate, a \u without four hex digits, an unknown letter, a
        // raw control character.
        assert!(!scan_value(r#"{"a": "\ud83dxyz"}"#).valid);
        assert!(!scan_value(r#"{"a": "\uZZ"#).valid);
        assert!(!scan_value(r#"{"a": "\q"#).valid);
        assert!(!scan_value("{\"a\": \"x\u{1}").valid);
        // Unfinished ones are held, not refused.
        for held in [r#"{"a": "x\"#, r#"{"a": "x\u00"#, r#"{"a": "\ud83d\u"#] {
            let scan = scan_value(held);
            assert!(scan.valid, "{held}");
            assert_eq!(
                scan.canonical,
                r#"{"a":"x"#[..if held.contains('x') { 7 } else { 6 }]
            );
        }
    }
}
