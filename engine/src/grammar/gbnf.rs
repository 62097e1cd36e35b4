//! GBNF (llama.cpp's grammar format) read and written out as llguidance's Lark dialect, so that
//! a grammar written for llama.cpp's server constrains Backpack's answers the same way.
//!
//! llguidance ships this conversion only as a Python script; it is small, so it lives here.
//! Rules that are not recursive and consist only of literals, character classes and other such
//! rules become Lark terminals (uppercase names): llguidance matches those as one lexeme, which
//! keeps long strings and numbers fast. `root` becomes `start` (over one such terminal when
//! it qualifies itself: a free-text grammar is then one lexeme, not a rule per character).

use std::collections::{HashMap, HashSet};

use super::GrammarError;

#[derive(Clone, Debug)]
enum Node {
    Literal(String),
    /// A character class: (first, last) ranges, negated or not.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    AnyChar,
    Rule(String),
    /// llama.cpp's token references (`<[123]>`, `<|name|>`), the same in Lark.
    Token(String),
    Sequence(Vec<Node>),
    Alternatives(Vec<Node>),
    Repeat {
        node: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
}

/// The Lark grammar equivalent to GBNF `text`.
pub fn gbnf_to_lark(text: &str) -> Result<String, GrammarError> {
    let rules = Parser::new(text).rules()?;
    let names: HashSet<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    if !names.contains("root") {
        return Err(GrammarError::Invalid(
            "the grammar has no `root` rule".into(),
        ));
    }
    for (_, body) in &rules {
        if let Some(missing) = first_unknown(body, &names) {
            return Err(GrammarError::Invalid(format!(
                "the grammar uses rule `{missing}` but does not define it"
            )));
        }
    }
    let terminal = terminal_rules(&rules);
    let lark_names = lark_names(&rules, &terminal);
    let mut out = String::new();
    for (name, body) in &rules {
        if name == "root" && terminal.contains(name) {
            // Lark's start must be a rule; the other names all begin with `g_`.
            out.push_str("start: ROOT_TERMINAL\nROOT_TERMINAL: ");
        } else {
            out.push_str(&lark_names[name]);
            out.push_str(": ");
        }
        write_node(&mut out, body, &lark_names, true);
        out.push('\n');
    }
    Ok(out)
}

fn first_unknown<'a>(node: &'a Node, names: &HashSet<&str>) -> Option<&'a str> {
    match node {
        Node::Rule(n) if !names.contains(n.as_str()) => Some(n),
        Node::Sequence(v) | Node::Alternatives(v) => v.iter().find_map(|n| first_unknown(n, names)),
        Node::Repeat { node, .. } => first_unknown(node, names),
        _ => None,
    }
}

/// Rules made only of text and other such rules, found by fixpoint (a recursive rule never
/// qualifies: it would need itself first).
fn terminal_rules(rules: &[(String, Node)]) -> HashSet<String> {
    let mut terminal = HashSet::new();
    loop {
        let before = terminal.len();
        for (name, body) in rules {
            if !terminal.contains(name) && is_terminal(body, &terminal) {
                terminal.insert(name.clone());
            }
        }
        if terminal.len() == before {
            return terminal;
        }
    }
}

fn is_terminal(node: &Node, terminal: &HashSet<String>) -> bool {
    match node {
        Node::Literal(_) | Node::Class { .. } | Node::AnyChar => true,
        Node::Token(_) => false,
        Node::Rule(n) => terminal.contains(n),
        Node::Sequence(v) | Node::Alternatives(v) => v.iter().all(|n| is_terminal(n, terminal)),
        Node::Repeat { node, .. } => is_terminal(node, terminal),
    }
}

/// Lark identifiers: `root` is `start`; others lose their dashes, and terminals are uppercase.
/// A prefix keeps them clear of Lark's own names; a number keeps two GBNF names apart that
/// would otherwise meet (`a-b`, `a_b`).
fn lark_names(rules: &[(String, Node)], terminal: &HashSet<String>) -> HashMap<String, String> {
    let mut taken = HashSet::new();
    let mut out = HashMap::new();
    for (name, _) in rules {
        let base = if name == "root" && terminal.contains(name) {
            "ROOT_TERMINAL".to_owned()
        } else if name == "root" {
            "start".to_owned()
        } else {
            let plain = format!("g_{}", name.replace('-', "_"));
            if terminal.contains(name) {
                plain.to_uppercase()
            } else {
                plain.to_lowercase()
            }
        };
        let mut unique = base.clone();
        let mut n = 2;
        while !taken.insert(unique.clone()) {
            unique = format!("{base}_{n}");
            n += 1;
        }
        out.insert(name.clone(), unique);
    }
    out
}

fn write_node(out: &mut String, node: &Node, names: &HashMap<String, String>, top: bool) {
    match node {
        Node::Literal(s) => {
            // Lark strings are read as JSON strings.
            out.push_str(&serde_json::Value::String(s.clone()).to_string());
        }
        Node::Class { negated, ranges } => {
            out.push_str("/[");
            if *negated {
                out.push('^');
            }
            for &(a, b) in ranges {
                push_class_char(out, a);
                if a != b {
                    out.push('-');
                    push_class_char(out, b);
                }
            }
            out.push_str("]/");
        }
        Node::AnyChar => out.push_str(r"/[\x{0}-\x{10FFFF}]/"),
        Node::Rule(n) => out.push_str(&names[n]),
        Node::Token(t) => out.push_str(t),
        Node::Sequence(v) if v.is_empty() => out.push_str("\"\""),
        Node::Sequence(v) => {
            for (i, n) in v.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                write_node(out, n, names, false);
            }
        }
        Node::Alternatives(v) => {
            if !top {
                out.push('(');
            }
            for (i, n) in v.iter().enumerate() {
                if i > 0 {
                    out.push_str(" | ");
                }
                write_node(out, n, names, false);
            }
            if !top {
                out.push(')');
            }
        }
        Node::Repeat { node, min, max } => {
            let atomic = !matches!(**node, Node::Sequence(_) | Node::Alternatives(_));
            if !atomic {
                out.push('(');
            }
            write_node(out, node, names, true);
            if !atomic {
                out.push(')');
            }
            match (min, max) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (m, None) => out.push_str(&format!("{{{m},}}")),
                (m, Some(n)) if m == n => out.push_str(&format!("{{{m}}}")),
                (m, Some(n)) => out.push_str(&format!("{{{m},{n}}}")),
            }
        }
    }
}

/// A character inside a regex class: letters and digits as they are, anything else escaped by
/// code point (no character can then end the regex or the class early).
fn push_class_char(out: &mut String, c: char) {
    if c.is_ascii_alphanumeric() {
        out.push(c);
    } else {
        out.push_str(&format!("\\x{{{:X}}}", c as u32));
    }
}

/// GBNF's grammar, as llama.cpp's parser reads it: newlines end a rule's alternatives except
/// inside parentheses and right after `::=` or `|`; `#` starts a comment.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

/// Nesting deeper than this is refused rather than risking the stack on hostile input.
const MAX_DEPTH: u32 = 64;

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Self { text, pos: 0 }
    }

    fn error(&self, what: &str) -> GrammarError {
        let line = self.text[..self.pos].matches('\n').count() + 1;
        let near: String = self.text[self.pos..].chars().take(20).collect();
        GrammarError::Invalid(format!("GBNF line {line}: {what} (at {near:?})"))
    }

    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n' && c != '\r') {
                        self.bump();
                    }
                }
                _ => break,
            }
        }
    }

    fn rules(mut self) -> Result<Vec<(String, Node)>, GrammarError> {
        let mut rules: Vec<(String, Node)> = Vec::new();
        self.skip_space(true);
        while self.peek().is_some() {
            let name = self.name()?;
            self.skip_space(false);
            if !self.text[self.pos..].starts_with("::=") {
                return Err(self.error("expected `::=`"));
            }
            self.pos += 3;
            self.skip_space(true);
            let body = self.alternatives(false, 0)?;
            if rules.iter().any(|(n, _)| *n == name) {
                return Err(self.error(&format!("rule `{name}` is defined twice")));
            }
            rules.push((name, body));
            self.skip_space(true);
        }
        Ok(rules)
    }

    fn name(&mut self) -> Result<String, GrammarError> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error("expected a rule name"));
        }
        Ok(self.text[start..self.pos].to_owned())
    }

    fn alternatives(&mut self, nested: bool, depth: u32) -> Result<Node, GrammarError> {
        if depth > MAX_DEPTH {
            return Err(self.error("nesting is too deep"));
        }
        let mut alts = vec![self.sequence(nested, depth)?];
        loop {
            self.skip_space(nested);
            if self.peek() != Some('|') {
                break;
            }
            self.pos += 1;
            self.skip_space(true);
            alts.push(self.sequence(nested, depth)?);
        }
        Ok(if alts.len() == 1 {
            alts.remove(0)
        } else {
            Node::Alternatives(alts)
        })
    }

    fn sequence(&mut self, nested: bool, depth: u32) -> Result<Node, GrammarError> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' || (!nested && (c == '\n' || c == '\r')) {
                break;
            }
            let item = match c {
                '"' => self.literal()?,
                '[' => self.class()?,
                '.' => {
                    self.pos += 1;
                    Node::AnyChar
                }
                '(' => {
                    self.pos += 1;
                    self.skip_space(true);
                    let inner = self.alternatives(true, depth + 1)?;
                    if self.bump() != Some(')') {
                        return Err(self.error("expected `)`"));
                    }
                    inner
                }
                '<' => self.token()?,
                c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => Node::Rule(self.name()?),
                _ => return Err(self.error("unexpected character")),
            };
            self.skip_space(nested);
            let item = self.repetition(item)?;
            items.push(item);
            self.skip_space(nested);
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            Node::Sequence(items)
        })
    }

    fn repetition(&mut self, node: Node) -> Result<Node, GrammarError> {
        let (min, max) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                self.pos += 1;
                self.skip_space(true);
                let min = self.number()?;
                self.skip_space(true);
                let max = match self.bump() {
                    Some('}') => Some(min),
                    Some(',') => {
                        self.skip_space(true);
                        let max = if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                            Some(self.number()?)
                        } else {
                            None
                        };
                        self.skip_space(true);
                        if self.bump() != Some('}') {
                            return Err(self.error("expected `}`"));
                        }
                        max
                    }
                    _ => return Err(self.error("expected `,` or `}`")),
                };
                if max.is_some_and(|m| m < min) {
                    return Err(self.error("a repetition's maximum is below its minimum"));
                }
                return Ok(Node::Repeat {
                    node: Box::new(node),
                    min,
                    max,
                });
            }
            _ => return Ok(node),
        };
        self.pos += 1;
        Ok(Node::Repeat {
            node: Box::new(node),
            min,
            max,
        })
    }

    fn number(&mut self) -> Result<u32, GrammarError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        self.text[start..self.pos]
            .parse()
            .map_err(|_| self.error("expected a number"))
    }

    fn token(&mut self) -> Result<Node, GrammarError> {
        let start = self.pos;
        let end = self.text[start..]
            .find('>')
            .ok_or_else(|| self.error("a token reference has no closing `>`"))?;
        self.pos = start + end + 1;
        Ok(Node::Token(self.text[start..self.pos].to_owned()))
    }

    fn literal(&mut self) -> Result<Node, GrammarError> {
        self.pos += 1;
        let mut s = String::new();
        loop {
            match self.peek() {
                None => return Err(self.error("a string is not closed")),
                Some('"') => {
                    self.pos += 1;
                    return Ok(Node::Literal(s));
                }
                Some(_) => s.push(self.char()?),
            }
        }
    }

    fn class(&mut self) -> Result<Node, GrammarError> {
        self.pos += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None => return Err(self.error("a character class is not closed")),
                Some(']') => {
                    self.pos += 1;
                    return Ok(Node::Class { negated, ranges });
                }
                Some(_) => {
                    let first = self.char()?;
                    let mut last = first;
                    if self.peek() == Some('-') && !self.text[self.pos + 1..].starts_with(']') {
                        self.pos += 1;
                        last = self.char()?;
                    }
                    if last < first {
                        return Err(self.error("a character range runs backwards"));
                    }
                    ranges.push((first, last));
                }
            }
        }
    }

    /// One character of a string or class, escapes decoded.
    fn char(&mut self) -> Result<char, GrammarError> {
        let c = self.bump().ok_or_else(|| self.error("unexpected end"))?;
        if c != '\\' {
            return Ok(c);
        }
        let escaped = self.bump().ok_or_else(|| self.error("unfinished escape"))?;
        let hex = |p: &mut Self, n: usize| -> Result<char, GrammarError> {
            let digits = p.text.get(p.pos..p.pos + n).unwrap_or_default();
            let value = u32::from_str_radix(digits, 16)
                .ok()
                .filter(|_| digits.len() == n)
                .and_then(char::from_u32)
                .ok_or_else(|| p.error("bad hexadecimal escape"))?;
            p.pos += n;
            Ok(value)
        };
        match escaped {
            'n' => Ok('\n'),
            'r' => Ok('\r'),
            't' => Ok('\t'),
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            '\\' | '"' | '[' | ']' | '-' | '^' | '/' => Ok(escaped),
            _ => Err(self.error("unknown escape")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_terminals_and_escapes_convert() {
        let gbnf = "root ::= greeting (\" \" name)?  # a comment\n\
                    greeting ::= \"hi\\n\" | \"hello\"\n\
                    name ::= [A-Z] [a-z\\-]{1,8}\n";
        let lark = gbnf_to_lark(gbnf).expect("converts");
        assert_eq!(
            lark,
            "start: ROOT_TERMINAL\nROOT_TERMINAL: G_GREETING (\" \" G_NAME)?\n\
             G_GREETING: \"hi\\n\" | \"hello\"\n\
             G_NAME: /[A-Z]/ /[a-z\\x{2D}]/{1,8}\n"
        );
    }

    #[test]
    fn recursive_rules_stay_rules() {
        let lark = gbnf_to_lark(
            "root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9]+ | list\n",
        )
        .expect("converts");
        assert!(lark.contains("g_list: "), "{lark}");
        assert!(lark.contains("g_item: "), "{lark}");
    }

    #[test]
    fn errors_name_the_line() {
        let e = gbnf_to_lark("root ::= a\n").expect_err("a is undefined");
        assert!(e.to_string().contains("`a`"), "{e}");
        let e = gbnf_to_lark("root ::= \"x\"\nbad ::= [ab").expect_err("unclosed");
        assert!(e.to_string().contains("line 2"), "{e}");
        assert!(gbnf_to_lark("item ::= \"x\"").is_err());
    }
}
