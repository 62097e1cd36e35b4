//! The live-captioning policy of whisper_streaming (LocalAgreement-2): the growing audio of
//! an utterance is transcribed again about once a second, and text is committed only once two
//! consecutive hypotheses agree on it. Committed text never changes; the rest of the newest
//! hypothesis is shown as partial text that may. Once the hypothesis' leading segments are
//! committed, the audio buffer is cut at their end, so each pass stays short.
//!
//! This part is pure bookkeeping over token ids and segment times (relative to the buffer),
//! so it is tested without a model; [`crate::runtime::speech`] feeds it.

/// One transcription of the buffered audio: segments with times in seconds from the buffer's
/// start and their text tokens (no timestamps or special tokens).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hypothesis {
    pub segments: Vec<HypothesisSegment>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct HypothesisSegment {
    pub start: f64,
    pub end: f64,
    pub tokens: Vec<u32>,
    /// What the tokens are compared by, one per token: a new pass may write the same word
    /// with other tokens ("She" after a pause, "she" once it follows text), so the caller
    /// passes a normalised form. Empty: the token ids themselves.
    pub keys: Vec<u64>,
}

impl Hypothesis {
    fn tokens(&self) -> Vec<u32> {
        self.segments
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect()
    }

    fn keys(&self) -> Vec<u64> {
        self.segments
            .iter()
            .flat_map(|s| {
                if s.keys.len() == s.tokens.len() {
                    s.keys.clone()
                } else {
                    s.tokens.iter().map(|&t| u64::from(t)).collect()
                }
            })
            .collect()
    }

    /// (start, end) of the tokens `from..to` of the flattened hypothesis.
    fn span(&self, from: usize, to: usize) -> (f64, f64) {
        let mut at = 0;
        let (mut start, mut end) = (None, 0.0);
        for s in &self.segments {
            let next = at + s.tokens.len();
            if next > from && at < to {
                start.get_or_insert(s.start);
                end = s.end;
            }
            at = next;
        }
        (start.unwrap_or(end), end)
    }
}

/// What one update decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Update {
    /// Newly committed tokens, and their span in seconds from the buffer's start.
    pub commit: Vec<u32>,
    pub commit_span: (f64, f64),
    /// The uncommitted rest of the newest hypothesis.
    pub partial: Vec<u32>,
    pub partial_span: (f64, f64),
    /// Seconds of buffered audio to drop from its start (everything in it is committed).
    pub cut: Option<f64>,
}

/// Longest n-gram of committed tokens looked for at the start of a new hypothesis.
const MAX_OVERLAP: usize = 10;
/// With more buffered audio than this, all but the last segment is committed and cut, so a
/// pass never needs more than one 30 s window.
pub const MAX_BUFFER_SECONDS: f64 = 24.0;

#[derive(Debug, Default)]
pub struct LocalAgreement {
    /// Keys of the committed tokens whose audio is still in the buffer.
    in_buffer: Vec<u64>,
    /// Keys of the uncommitted tail of the previous hypothesis.
    previous: Vec<u64>,
}

impl LocalAgreement {
    /// The new hypothesis of the buffer, with `buffer_seconds` of audio in it.
    pub fn update(&mut self, hyp: &Hypothesis, buffer_seconds: f64) -> Update {
        let tokens = hyp.tokens();
        let keys = hyp.keys();
        let skip = self.already_committed(&keys);
        let fresh = &tokens[skip..];
        let fresh_keys = &keys[skip..];
        let agreed = fresh_keys
            .iter()
            .zip(&self.previous)
            .take_while(|(a, b)| a == b)
            .count();
        let mut commit_len = agreed;
        // A buffer about to outgrow one window: commit everything but the last segment.
        if buffer_seconds > MAX_BUFFER_SECONDS && hyp.segments.len() > 1 {
            let last = hyp.segments.last().map_or(0, |s| s.tokens.len());
            commit_len = commit_len.max((tokens.len() - last).saturating_sub(skip));
        }
        let commit = fresh[..commit_len].to_vec();
        self.in_buffer.extend(&fresh_keys[..commit_len]);
        self.previous = fresh_keys[commit_len..].to_vec();
        let committed_end = skip + commit_len;
        let mut update = Update {
            commit_span: hyp.span(skip, committed_end),
            partial: fresh[commit_len..].to_vec(),
            partial_span: hyp.span(committed_end, tokens.len()),
            commit,
            cut: None,
        };
        update.cut = self.cut_point(hyp, committed_end);
        update
    }

    /// Commits the whole hypothesis: the speaker paused, or the input ended.
    pub fn finish(&mut self, hyp: &Hypothesis) -> Update {
        let tokens = hyp.tokens();
        let skip = self.already_committed(&hyp.keys());
        let update = Update {
            commit: tokens[skip..].to_vec(),
            commit_span: hyp.span(skip, tokens.len()),
            partial: Vec::new(),
            partial_span: (0.0, 0.0),
            cut: None,
        };
        self.reset();
        update
    }

    /// Forgets the buffer (it was cut entirely or dropped).
    pub fn reset(&mut self) {
        self.in_buffer.clear();
        self.previous.clear();
    }

    /// How many leading tokens of a new hypothesis repeat text already committed: all of the
    /// buffer's committed tokens when the hypothesis starts with them, else the longest
    /// committed tail that starts it (the model may drop or reword the beginning).
    fn already_committed(&self, tokens: &[u64]) -> usize {
        if tokens.starts_with(&self.in_buffer) {
            return self.in_buffer.len();
        }
        let longest = MAX_OVERLAP.min(self.in_buffer.len()).min(tokens.len());
        (1..=longest)
            .rev()
            .find(|&n| self.in_buffer[self.in_buffer.len() - n..] == tokens[..n])
            .unwrap_or(0)
    }

    /// The end of the last whole segment (not the hypothesis' last) inside the first
    /// `committed` tokens; its tokens leave the buffer's committed list.
    fn cut_point(&mut self, hyp: &Hypothesis, committed: usize) -> Option<f64> {
        let mut at = 0;
        let mut cut = None;
        let last = hyp.segments.len().saturating_sub(1);
        for (i, s) in hyp.segments.iter().enumerate() {
            at += s.tokens.len();
            if i == last || at > committed || s.tokens.is_empty() {
                break;
            }
            cut = Some((at, s.end));
        }
        let (tokens, end) = cut?;
        let drop = tokens.min(self.in_buffer.len());
        self.in_buffer.drain(..drop);
        Some(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(start: f64, end: f64, tokens: &[u32]) -> HypothesisSegment {
        HypothesisSegment {
            start,
            end,
            tokens: tokens.to_vec(),
            keys: Vec::new(),
        }
    }

    fn hyp(segments: Vec<HypothesisSegment>) -> Hypothesis {
        Hypothesis { segments }
    }

    #[test]
    fn text_is_committed_when_two_hypotheses_agree() {
        let mut p = LocalAgreement::default();
        let u = p.update(&hyp(vec![seg(0.0, 1.0, &[1, 2, 3])]), 1.0);
        assert!(u.commit.is_empty());
        assert_eq!(u.partial, vec![1, 2, 3]);
        // The second pass changes its mind about the last word.
        let u = p.update(&hyp(vec![seg(0.0, 2.0, &[1, 2, 4, 5])]), 2.0);
        assert_eq!(u.commit, vec![1, 2]);
        assert_eq!(u.partial, vec![4, 5]);
        // Committed text is not committed twice.
        let u = p.update(&hyp(vec![seg(0.0, 3.0, &[1, 2, 4, 5, 6])]), 3.0);
        assert_eq!(u.commit, vec![4, 5]);
        assert_eq!(u.partial, vec![6]);
        let u = p.finish(&hyp(vec![seg(0.0, 3.5, &[1, 2, 4, 5, 6, 7])]));
        assert_eq!(u.commit, vec![6, 7]);
    }

    #[test]
    fn committed_leading_segments_cut_the_buffer() {
        let mut p = LocalAgreement::default();
        let h = hyp(vec![seg(0.0, 2.0, &[1, 2]), seg(2.0, 3.0, &[3])]);
        p.update(&h, 3.0);
        let u = p.update(&h, 3.2);
        assert_eq!(u.commit, vec![1, 2, 3]);
        // The first segment is committed and is not the last: cut after it.
        assert_eq!(u.cut, Some(2.0));
        assert_eq!(u.commit_span, (0.0, 3.0));
        // After the cut the buffer starts with the second segment's audio.
        let u = p.update(&hyp(vec![seg(0.0, 1.0, &[3]), seg(1.0, 2.0, &[8, 9])]), 2.0);
        assert!(u.commit.is_empty(), "{u:?}");
        assert_eq!(u.partial, vec![8, 9]);
    }

    #[test]
    fn a_reworded_start_is_matched_by_its_overlap() {
        let mut p = LocalAgreement::default();
        let h = hyp(vec![seg(0.0, 1.0, &[10, 11, 12])]);
        p.update(&h, 1.0);
        p.update(&h, 1.5);
        // The model drops the first committed word but repeats the rest.
        let u = p.update(&hyp(vec![seg(0.0, 2.0, &[11, 12, 13])]), 2.0);
        assert!(u.commit.is_empty());
        assert_eq!(u.partial, vec![13]);
    }

    #[test]
    fn the_same_words_in_other_tokens_are_not_committed_twice() {
        let mut p = LocalAgreement::default();
        let keyed = |tokens: &[u32], keys: &[u64]| HypothesisSegment {
            start: 0.0,
            end: 1.0,
            tokens: tokens.to_vec(),
            keys: keys.to_vec(),
        };
        let h = hyp(vec![keyed(&[7, 8], &[70, 80])]);
        p.update(&h, 1.0);
        assert_eq!(p.update(&h, 1.5).commit, vec![7, 8]);
        // Token 9 is another spelling of the word 7 was ("she" for "She").
        let u = p.update(&hyp(vec![keyed(&[9, 8, 5], &[70, 80, 50])]), 2.0);
        assert!(u.commit.is_empty());
        assert_eq!(u.partial, vec![5]);
    }

    #[test]
    fn a_long_buffer_commits_all_but_its_last_segment() {
        let mut p = LocalAgreement::default();
        let h = hyp(vec![
            seg(0.0, 12.0, &[1, 2]),
            seg(12.0, 24.0, &[3]),
            seg(24.0, 25.0, &[4]),
        ]);
        let u = p.update(&h, 25.0);
        assert_eq!(u.commit, vec![1, 2, 3]);
        assert_eq!(u.partial, vec![4]);
        assert_eq!(u.cut, Some(24.0));
    }
}
