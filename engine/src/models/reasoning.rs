//! A reasoning model's answer, split into its reasoning and its reply. The text models write
//! the reasoning between `<think>` and `</think>` before the reply: Qwen3 and DeepSeek-R1
//! distills do so themselves, and GPT-OSS's analysis channel is written so by
//! [`super::harmony::HarmonyStream`]. Servers report the two apart (`reasoning_content`), as
//! the OpenAI-compatible servers of other engines do.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Where a piece of the answer belongs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnswerPiece {
    Reasoning(String),
    Reply(String),
}

/// Splits a whole answer: the reasoning (without its markers and the blank lines around it),
/// if the answer opens with it, and the reply.
pub fn split_reasoning(text: &str) -> (Option<String>, String) {
    let mut splitter = ReasoningSplitter::default();
    let mut pieces = splitter.push(text);
    pieces.extend(splitter.finish());
    let (mut reasoning, mut reply) = (None::<String>, String::new());
    for piece in pieces {
        match piece {
            AnswerPiece::Reasoning(r) => reasoning.get_or_insert_with(String::new).push_str(&r),
            AnswerPiece::Reply(r) => reply.push_str(&r),
        }
    }
    (reasoning.map(|r| r.trim().to_owned()), reply)
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// Before anything but whitespace: reasoning may still open.
    #[default]
    Start,
    Reasoning,
    Reply,
}

/// Splits an answer arriving in deltas. Markers split across deltas are held back until they
/// are whole; the blank lines after `</think>` are dropped.
#[derive(Debug, Default)]
pub struct ReasoningSplitter {
    state: State,
    held: String,
    /// The reply has started after reasoning: leading newlines are still dropped.
    after_close: bool,
}

impl ReasoningSplitter {
    /// The pieces `delta` completes.
    pub fn push(&mut self, delta: &str) -> Vec<AnswerPiece> {
        self.held.push_str(delta);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.held.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(OPEN) {
                        self.held = rest.to_owned();
                        self.state = State::Reasoning;
                    } else if OPEN.starts_with(trimmed) {
                        // Whitespace, or the start of the marker: wait for more.
                        return out;
                    } else {
                        self.state = State::Reply;
                    }
                }
                State::Reasoning => match self.held.find(CLOSE) {
                    Some(at) => {
                        let rest = self.held.split_off(at + CLOSE.len());
                        self.held.truncate(at);
                        push(
                            &mut out,
                            AnswerPiece::Reasoning(std::mem::take(&mut self.held)),
                        );
                        self.held = rest;
                        self.state = State::Reply;
                        self.after_close = true;
                    }
                    None => {
                        let keep = partial_suffix(&self.held, CLOSE);
                        let ready = self.held.len() - keep;
                        let rest = self.held.split_off(ready);
                        push(
                            &mut out,
                            AnswerPiece::Reasoning(std::mem::replace(&mut self.held, rest)),
                        );
                        return out;
                    }
                },
                State::Reply => {
                    if self.after_close {
                        let trimmed = self.held.trim_start_matches(['\n', '\r']);
                        if trimmed.is_empty() {
                            self.held.clear();
                            return out;
                        }
                        self.held = trimmed.to_owned();
                        self.after_close = false;
                    }
                    push(&mut out, AnswerPiece::Reply(std::mem::take(&mut self.held)));
                    return out;
                }
            }
        }
    }

    /// Whatever is held back at the end (an unfinished marker is text).
    pub fn finish(&mut self) -> Vec<AnswerPiece> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.state {
            State::Reasoning => push(&mut out, AnswerPiece::Reasoning(held)),
            State::Start | State::Reply if !self.after_close => {
                push(&mut out, AnswerPiece::Reply(held));
            }
            _ => {}
        }
        out
    }
}

fn push(out: &mut Vec<AnswerPiece>, piece: AnswerPiece) {
    let empty = match &piece {
        AnswerPiece::Reasoning(s) | AnswerPiece::Reply(s) => s.is_empty(),
    };
    if !empty {
        out.push(piece);
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `marker`.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| {
            text.len() >= n
                && text.is_char_boundary(text.len() - n)
                && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(deltas: &[&str]) -> (String, String) {
        let mut s = ReasoningSplitter::default();
        let mut all: Vec<AnswerPiece> = deltas.iter().flat_map(|d| s.push(d)).collect();
        all.extend(s.finish());
        let (mut r, mut a) = (String::new(), String::new());
        for p in all {
            match p {
                AnswerPiece::Reasoning(x) => r.push_str(&x),
                AnswerPiece::Reply(x) => a.push_str(&x),
            }
        }
        (r, a)
    }

    #[test]
    fn markers_split_anywhere_across_deltas_give_the_same_split() {
        let text = "<think>\nweigh it: 2 < 3\n</think>\n\nYes, <think> is literal here.";
        let whole = pieces(&[text]);
        assert_eq!(whole.0, "\nweigh it: 2 < 3\n");
        assert_eq!(whole.1, "Yes, <think> is literal here.");
        for cut in 1..text.len() {
            if text.is_char_boundary(cut) {
                assert_eq!(pieces(&[&text[..cut], &text[cut..]]), whole, "cut at {cut}");
            }
        }
        let bytes: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = bytes.iter().map(String::as_str).collect();
        assert_eq!(pieces(&refs), whole);
    }

    #[test]
    fn answers_without_reasoning_and_unfinished_reasoning() {
        assert_eq!(
            pieces(&["Hello ", "<th", "ere"]),
            (String::new(), "Hello <there".into())
        );
        assert_eq!(pieces(&["  <thi"]), (String::new(), "  <thi".into()));
        assert_eq!(
            pieces(&["<think>still going </th"]),
            ("still going </th".into(), String::new())
        );
        assert_eq!(
            split_reasoning("<think>a</think>\n\nb"),
            (Some("a".into()), "b".into())
        );
        assert_eq!(split_reasoning("plain"), (None, "plain".into()));
    }
}
