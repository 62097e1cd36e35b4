//! Prompt lookup: drafts copied from the context itself. When the last few tokens appeared
//! before, the tokens that followed them then are a good guess for what follows now: code
//! being edited, a document being summarized or quoted, a JSON record written again. Free to
//! draft, so a verification is all it costs.

/// The longest and shortest run of final tokens looked for earlier in the context (longer
/// runs are tried first: they predict better).
const LONGEST: usize = 4;
const SHORTEST: usize = 1;

/// Up to `max` tokens that followed the latest earlier occurrence of the context's final
/// tokens (the longest run that occurred); none when no run did.
pub fn lookup(context: &[u32], max: usize) -> Vec<u32> {
    let len = context.len();
    for n in (SHORTEST..=LONGEST.min(len.saturating_sub(1))).rev() {
        let tail = &context[len - n..];
        // The latest start first: recent text predicts best.
        for start in (0..len - n).rev() {
            if &context[start..start + n] == tail {
                let from = start + n;
                return context[from..(from + max).min(len)].to_vec();
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::lookup;

    #[test]
    fn the_longest_latest_match_gives_the_draft() {
        // "5 6" occurs twice; "4 5 6" once, followed by 7 8 9.
        let ctx = [1, 4, 5, 6, 7, 8, 9, 2, 5, 6, 3, 0, 4, 5, 6];
        assert_eq!(lookup(&ctx, 3), vec![7, 8, 9]);
        assert_eq!(lookup(&ctx, 10), vec![7, 8, 9, 2, 5, 6, 3, 0, 4, 5]);
        assert_eq!(lookup(&ctx, 20).len(), 11);
        // Only "5 6" matches: its latest earlier occurrence is followed by 3 0.
        let ctx = [1, 4, 5, 6, 7, 2, 5, 6, 3, 0, 9, 5, 6];
        assert_eq!(lookup(&ctx, 2), vec![3, 0]);
    }

    #[test]
    fn nothing_to_copy_gives_no_draft() {
        assert!(lookup(&[], 4).is_empty());
        assert!(lookup(&[7], 4).is_empty());
        assert!(lookup(&[1, 2, 3, 4, 5], 4).is_empty());
        // A single token matches when no longer run does.
        assert_eq!(lookup(&[1, 2, 3, 2], 4), vec![3, 2]);
        assert_eq!(lookup(&[3, 3, 3], 4), vec![3]);
        assert_eq!(lookup(&[1, 2, 1, 2], 0), Vec::<u32>::new());
    }
}
