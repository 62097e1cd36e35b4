//! The acceptance rule, on the CPU, over the logits a verification reads back. Each row gets
//! the GPU sampler's processors in transformers' order (repetition penalty, then greedy argmax,
//! or temperature, top-k and top-p), so that speculation changes how fast tokens come, never
//! which distribution they come from.
//!
//! Drafts here are deterministic (prompt lookup, or a draft model's greedy pick), so the rule
//! of Leviathan et al. (2023) with a one-hot draft distribution applies: a draft `d` is kept
//! with probability p(d); otherwise the token is drawn from p with `d` removed, renormalized.
//! Each output token then has exactly p's distribution. At temperature 0 a draft is kept when
//! it is the argmax, so the answer is the greedy one token for token.

use crate::ops::SamplerParams;

/// Tokens the repetition penalty applies to: one bit per vocabulary entry.
#[derive(Clone, Debug)]
pub struct Seen(Vec<u32>);

impl Seen {
    pub fn of(tokens: &[u32], vocab: usize) -> Self {
        let mut seen = Self(vec![0; vocab.div_ceil(32)]);
        for &t in tokens {
            seen.insert(t);
        }
        seen
    }

    pub fn insert(&mut self, token: u32) {
        if let Some(word) = self.0.get_mut(token as usize / 32) {
            *word |= 1 << (token % 32);
        }
    }

    pub fn contains(&self, token: u32) -> bool {
        self.0
            .get(token as usize / 32)
            .is_some_and(|w| w & (1 << (token % 32)) != 0)
    }
}

/// What a verification row gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The draft stands.
    Kept(u32),
    /// The draft was refused (or there was none): this token replaces it and the round ends.
    Drawn(u32),
}

/// A uniform draw in [0, 1) from a seeded SplitMix64 stream (a generator crate would add a
/// dependency for one line of arithmetic).
#[derive(Clone, Debug)]
pub struct Draws(u64);

impl Draws {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    pub fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The verdict on `draft` (None: the row after the last draft, whose token is always drawn)
/// from one row of logits.
pub fn judge(
    row: &[f32],
    seen: Option<&Seen>,
    params: &SamplerParams,
    draft: Option<u32>,
    draws: &mut Draws,
) -> Verdict {
    let greedy = params.temperature <= 0.0 || !params.temperature.is_finite();
    let penalty = seen.map(|s| (s, params.repeat_penalty));
    if greedy {
        let best = argmax(row, penalty);
        return match draft {
            Some(d) if d == best => Verdict::Kept(d),
            _ => Verdict::Drawn(best),
        };
    }
    let kept = Nucleus::new(row, penalty, params);
    if let Some(d) = draft {
        let p = f64::from(kept.weight(d) / kept.total);
        if draws.uniform() < p {
            return Verdict::Kept(d);
        }
    }
    Verdict::Drawn(kept.draw(draws.uniform(), draft))
}

/// A logit after the repetition penalty (transformers: negative ones are multiplied by it,
/// the others divided).
fn penalized(row: &[f32], penalty: Option<(&Seen, f32)>, token: usize) -> f32 {
    let l = row[token];
    match penalty {
        Some((seen, p)) if p != 1.0 && seen.contains(token as u32) => {
            if l < 0.0 {
                l * p
            } else {
                l / p
            }
        }
        _ => l,
    }
}

/// The most likely token, the lowest id winning a tie (as torch.argmax and the GPU sampler).
pub fn argmax(row: &[f32], penalty: Option<(&Seen, f32)>) -> u32 {
    let mut best = 0;
    let mut best_value = f32::NEG_INFINITY;
    for i in 0..row.len() {
        let v = penalized(row, penalty, i);
        if v > best_value {
            best_value = v;
            best = i;
        }
    }
    best as u32
}

/// Tokens scaled logits this far below the best weigh under e^-16 each: the first place top-p
/// looks for its nucleus (the GPU sampler's window).
const WINDOW: f32 = 16.0;

/// The tokens top-k and top-p keep, with their weights (relative to the best token's).
struct Nucleus {
    /// (token, weight), most likely first, ties by id.
    kept: Vec<(u32, f32)>,
    total: f32,
}

impl Nucleus {
    fn new(row: &[f32], penalty: Option<(&Seen, f32)>, params: &SamplerParams) -> Self {
        let scaled: Vec<f32> = (0..row.len())
            .map(|i| penalized(row, penalty, i) / params.temperature)
            .collect();
        let top = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut floor = f32::NEG_INFINITY;
        let k = params.top_k as usize;
        if k > 0 && k < scaled.len() {
            let mut sorted = scaled.clone();
            let (_, kth, _) = sorted.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
            // Ties with the k-th value are kept, as transformers keeps them.
            floor = *kth;
        }
        let weight = |v: f32| (v - top).exp();
        let total: f32 = scaled
            .iter()
            .filter(|&&v| v >= floor)
            .map(|&v| weight(v))
            .sum();
        let by_rank = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let collect = |least: f32| {
            let mut v: Vec<(u32, f32)> = scaled
                .iter()
                .enumerate()
                .filter(|(_, v)| **v >= least)
                .map(|(i, &v)| (i as u32, weight(v)))
                .collect();
            v.sort_by(by_rank);
            v
        };
        if params.top_p >= 1.0 {
            return Self {
                kept: collect(floor),
                total,
            };
        }
        let wanted = params.top_p * total;
        let nucleus = |sorted: &[(u32, f32)]| {
            let mut above = 0.0;
            let mut n = 0;
            for &(_, w) in sorted {
                if above >= wanted {
                    break;
                }
                above += w;
                n += 1;
            }
            (n.max(1), above)
        };
        let mut kept = collect(floor.max(top - WINDOW));
        let (n, mass) = nucleus(&kept);
        if n == kept.len() && mass < wanted {
            // The nucleus reaches below the window: rank every kept token.
            kept = collect(floor);
        }
        let (n, mass) = nucleus(&kept);
        kept.truncate(n);
        Self { kept, total: mass }
    }

    fn weight(&self, token: u32) -> f32 {
        self.kept
            .iter()
            .find(|(t, _)| *t == token)
            .map_or(0.0, |(_, w)| *w)
    }

    /// The token at `u` (uniform in [0, 1)) of the kept mass, `without` a refused draft.
    fn draw(&self, u: f64, without: Option<u32>) -> u32 {
        let rest = |&&(t, _): &&(u32, f32)| Some(t) != without;
        let mass: f64 = self
            .kept
            .iter()
            .filter(rest)
            .map(|(_, w)| f64::from(*w))
            .sum();
        let goal = u * mass;
        let mut sum = 0.0;
        let mut last = None;
        for &(t, w) in self.kept.iter().filter(rest) {
            sum += f64::from(w);
            last = Some(t);
            if sum > goal {
                return t;
            }
        }
        // Rounding left the goal at the very end, or the draft was the only kept token (its
        // probability was 1, so it cannot have been refused: keep it).
        last.or(without).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: u32, top_p: f32) -> SamplerParams {
        SamplerParams {
            temperature,
            top_k,
            top_p,
            ..Default::default()
        }
    }

    /// The reference distribution: softmax of logits/T, top-k (ties kept), top-p over the
    /// sorted list, renormalized; by full sorting.
    fn reference(row: &[f32], p: &SamplerParams) -> Vec<f64> {
        let s: Vec<f64> = row
            .iter()
            .map(|&l| f64::from(l) / f64::from(p.temperature))
            .collect();
        let top = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut order: Vec<usize> = (0..s.len()).collect();
        order.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
        let mut keep = vec![true; s.len()];
        if p.top_k > 0 && (p.top_k as usize) < s.len() {
            let kth = s[order[p.top_k as usize - 1]];
            for i in 0..s.len() {
                keep[i] = s[i] >= kth;
            }
        }
        let w: Vec<f64> = (0..s.len())
            .map(|i| if keep[i] { (s[i] - top).exp() } else { 0.0 })
            .collect();
        let total: f64 = w.iter().sum();
        if p.top_p < 1.0 {
            let mut above = 0.0;
            for &i in &order {
                if !keep[i] {
                    continue;
                }
                if above >= f64::from(p.top_p) * total && above > 0.0 {
                    keep[i] = false;
                }
                above += w[i];
            }
        }
        let kept: f64 = (0..s.len()).filter(|&i| keep[i]).map(|i| w[i]).sum();
        (0..s.len())
            .map(|i| if keep[i] { w[i] / kept } else { 0.0 })
            .collect()
    }

    fn random_row(n: usize, seed: u64, spread: f32) -> Vec<f32> {
        let mut d = Draws::new(seed);
        (0..n)
            .map(|_| (d.uniform() as f32 - 0.5) * spread)
            .collect()
    }

    #[test]
    fn the_kept_set_matches_a_full_sort() {
        for (seed, n) in [(1, 37), (2, 300), (3, 1001)] {
            for spread in [2.0, 40.0] {
                let row = random_row(n, seed, spread);
                for p in [
                    params(0.7, 0, 1.0),
                    params(1.0, 5, 1.0),
                    params(1.3, 0, 0.9),
                    params(0.5, 40, 0.5),
                    params(2.0, 0, 0.999),
                ] {
                    let want = reference(&row, &p);
                    let got = Nucleus::new(&row, None, &p);
                    for (t, &w) in want.iter().enumerate() {
                        let g = f64::from(got.weight(t as u32) / got.total);
                        assert!((g - w).abs() < 1e-5, "{p:?} n {n} token {t}: {g} vs {w}");
                    }
                }
            }
        }
    }

    /// Speculative sampling keeps the target's distribution whatever the draft: the frequency
    /// of each first token over many rounds matches p, for a likely, an unlikely and an
    /// excluded draft.
    #[test]
    fn drafted_tokens_come_from_the_target_distribution() {
        let row = [2.0, 1.0, 0.5, -1.0, 0.0, 1.5];
        let p = params(1.0, 4, 0.95);
        let want = reference(&row, &p);
        for draft in [0u32, 2, 3] {
            let mut draws = Draws::new(7 + u64::from(draft));
            let rounds = 200_000;
            let mut count = [0usize; 6];
            for _ in 0..rounds {
                let (Verdict::Kept(t) | Verdict::Drawn(t)) =
                    judge(&row, None, &p, Some(draft), &mut draws);
                count[t as usize] += 1;
            }
            for (t, &c) in count.iter().enumerate() {
                let f = c as f64 / f64::from(rounds);
                assert!(
                    (f - want[t]).abs() < 0.006,
                    "draft {draft} token {t}: {f} vs {}",
                    want[t]
                );
            }
        }
    }

    #[test]
    fn greedy_keeps_only_the_argmax_and_ties_go_to_the_lowest_id() {
        let row = [0.5, 3.0, 3.0, -2.0];
        let p = SamplerParams::default();
        let mut d = Draws::new(0);
        assert_eq!(judge(&row, None, &p, Some(1), &mut d), Verdict::Kept(1));
        assert_eq!(judge(&row, None, &p, Some(2), &mut d), Verdict::Drawn(1));
        assert_eq!(judge(&row, None, &p, None, &mut d), Verdict::Drawn(1));
        // The penalty pushes the seen tokens down: 3.0 / 2 < 2.9.
        let seen = Seen::of(&[1, 2], 4);
        let row = [0.5, 3.0, 3.0, 2.9];
        let p = SamplerParams {
            repeat_penalty: 2.0,
            ..Default::default()
        };
        assert_eq!(
            judge(&row, Some(&seen), &p, Some(1), &mut d),
            Verdict::Drawn(3)
        );
        // A negative seen logit is multiplied.
        let row = [-0.5, -1.0, -0.6, -0.9];
        let seen = Seen::of(&[0], 4);
        assert_eq!(
            judge(&row, Some(&seen), &p, None, &mut d),
            Verdict::Drawn(2)
        );
    }
}
