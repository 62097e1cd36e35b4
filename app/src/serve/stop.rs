//! Stop strings over streamed text: text that could still become a stop string is held back
//! until it either does (the answer ends before it) or cannot.

pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            held: String::new(),
        }
    }

    /// Adds `delta`; returns the text that can be sent and whether a stop string was met (the
    /// answer then ends with that text).
    pub fn push(&mut self, delta: &str) -> (String, bool) {
        self.held.push_str(delta);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let text = self.held[..at].to_owned();
            self.held.clear();
            return (text, true);
        }
        // Keep the longest tail that starts some stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| longest_prefix_suffix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_owned();
        self.held.drain(..cut);
        (text, false)
    }

    /// What is still held once the answer ended without a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Bytes of the longest suffix of `text` (on a character boundary) that is a proper prefix of
/// `stop`.
fn longest_prefix_suffix(text: &str, stop: &str) -> usize {
    let max = stop.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| {
            let start = text.len() - n;
            text.is_char_boundary(start) && stop.starts_with(&text[start..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    #[test]
    fn stop_strings_split_across_deltas_end_the_answer() {
        let mut m = StopMatcher::new(vec!["\nUser:".into(), "éé".into()]);
        assert_eq!(m.push("Hello"), ("Hello".into(), false));
        assert_eq!(m.push(" there\nUs"), (" there".into(), false));
        assert_eq!(m.push("er: more"), (String::new(), true));
        let mut m = StopMatcher::new(vec!["éé".into()]);
        assert_eq!(m.push("café"), ("caf".into(), false));
        assert_eq!(m.push("x"), ("éx".into(), false));
        assert_eq!(m.push("é"), (String::new(), false));
        assert_eq!(m.finish(), "é");
        let mut none = StopMatcher::new(Vec::new());
        assert_eq!(none.push("abc"), ("abc".into(), false));
    }
}
