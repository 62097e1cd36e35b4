//! How many drafts a round takes: as many as pay for what the round costs, judged from the
//! time rounds and plain decode steps have taken and from how many drafts were kept. A round
//! of k drafts gives (1 − a^(k+1)) / (1 − a) tokens when each draft is kept with chance a, and
//! costs a verification of k + 1 rows (plus the draft model's steps); it pays when that is
//! more tokens per second than plain steps give. Where no round pays (text the context does
//! not predict, a verification that costs several decode steps), the answer decodes plainly
//! and tries a round again after a pause that doubles while rounds keep not paying, so that
//! speculating costs little more than not.

/// Weight of the newest round in the kept-drafts estimate (older rounds fade by 1 − this).
const FADE: f64 = 0.1;
/// Weight of the newest time in each smoothed time.
const SMOOTH: f64 = 0.3;
/// Plain steps between a round that did not pay and the next, at first and at most.
const FIRST_PAUSE: u32 = 4;
const LONGEST_PAUSE: u32 = 64;
/// Rounds after which a round size's time, not taken since, is estimated again.
const FRESH: u64 = 16;
/// What the estimate starts from: drafts kept with chance 0.7, weighing two drafts.
const PRIOR: (f64, f64) = (1.4, 2.0);

#[derive(Debug)]
pub(super) struct Pacing {
    /// Drafts kept and drafts judged (a draft after the first refused one is not judged),
    /// each older round's fading.
    kept: f64,
    judged: f64,
    /// Smoothed seconds of a plain decode step.
    plain: Option<f64>,
    /// Smoothed seconds of a round, by its drafts, and the round that last took that many.
    rounds: Vec<Option<(f64, u64)>>,
    /// Rounds so far.
    counted: u64,
    /// Plain steps left before the next round.
    pause: u32,
    /// The pause after the next round that does not pay.
    backoff: u32,
}

impl Pacing {
    /// Pacing for rounds of at most `most` drafts.
    pub(super) fn new(most: usize) -> Self {
        Self {
            kept: PRIOR.0,
            judged: PRIOR.1,
            plain: None,
            rounds: vec![None; most + 1],
            counted: 0,
            pause: 0,
            backoff: FIRST_PAUSE,
        }
    }

    /// The chance a draft is kept, as the rounds so far suggest.
    pub(super) fn acceptance(&self) -> f64 {
        self.kept / self.judged
    }

    /// The drafts the next round should take, at most `most` (0: a plain step).
    pub(super) fn drafts(&mut self, most: usize) -> usize {
        let most = most.min(self.rounds.len() - 1);
        if most == 0 {
            return 0;
        }
        if self.pause > 0 {
            self.pause -= 1;
            // The round after a pause tries again whatever the estimate says: only a
            // round can tell whether the text has become predictable.
            return if self.pause == 0 { most } else { 0 };
        }
        // A plain step first: what rounds are measured against.
        let Some(plain) = self.plain else {
            return 0;
        };
        let a = self.acceptance().min(0.999);
        let (mut best, mut best_rate) = (0, 1.0 / plain);
        for k in 1..=most {
            let tokens = (1.0 - a.powi(k as i32 + 1)) / (1.0 - a);
            let rate = tokens / self.round_cost(k, plain);
            if rate > best_rate {
                (best, best_rate) = (k, rate);
            }
        }
        if best == 0 {
            self.pause = self.backoff;
            self.backoff = (self.backoff * 2).min(LONGEST_PAUSE);
        } else {
            self.backoff = FIRST_PAUSE;
        }
        best
    }

    /// The seconds a round of `k` drafts takes: as measured, or else on the line from a plain
    /// step (no drafts) through the nearest round measured, or as a plain step where none
    /// was (so that the first rounds are tried).
    fn round_cost(&self, k: usize, plain: f64) -> f64 {
        if let Some(t) = self.fresh(k) {
            return t;
        }
        let nearest = (1..self.rounds.len())
            .filter_map(|j| self.fresh(j).map(|t| (j, t)))
            .min_by_key(|&(j, _)| j.abs_diff(k));
        match nearest {
            Some((j, t)) => plain + (t - plain) * k as f64 / j as f64,
            None => plain,
        }
    }

    /// A plain decode step took `seconds`.
    pub(super) fn plain_step(&mut self, seconds: f64) {
        self.plain = Some(smooth(self.plain, seconds));
    }

    /// A round of `drafts` drafts kept `kept` of them and took `seconds`.
    pub(super) fn round(&mut self, drafts: usize, kept: usize, seconds: f64) {
        if drafts == 0 || drafts >= self.rounds.len() {
            return;
        }
        let judged = kept + usize::from(kept < drafts);
        self.kept = self.kept * (1.0 - FADE) + kept as f64;
        self.judged = self.judged * (1.0 - FADE) + judged as f64;
        self.counted += 1;
        let old = self.fresh(drafts);
        self.rounds[drafts] = Some((smooth(old, seconds), self.counted));
    }

    /// The smoothed time of rounds of `k` drafts, unless none of the last [`FRESH`] rounds
    /// was one (a size not taken for a while is estimated again from those that were).
    fn fresh(&self, k: usize) -> Option<f64> {
        self.rounds[k]
            .filter(|&(_, at)| self.counted - at < FRESH)
            .map(|(t, _)| t)
    }
}

fn smooth(old: Option<f64>, new: f64) -> f64 {
    match old {
        Some(old) => old + SMOOTH * (new - old),
        None => new,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds of `k` drafts at a cost of `verify` plain steps, each keeping `kept`.
    fn settle(p: &mut Pacing, verify: f64, kept: impl Fn(usize) -> usize) -> Vec<usize> {
        let mut chosen = Vec::new();
        for _ in 0..200 {
            let k = p.drafts(7);
            chosen.push(k);
            if k == 0 {
                p.plain_step(1.0);
            } else {
                p.round(k, kept(k), verify * (1.0 + k as f64 / 8.0));
            }
        }
        chosen
    }

    #[test]
    fn rounds_that_pay_keep_their_drafts() {
        // Every draft kept and a verification about a plain step: the most drafts.
        let mut p = Pacing::new(7);
        let chosen = settle(&mut p, 1.0, |k| k);
        assert!(chosen[20..].iter().all(|&k| k == 7), "{chosen:?}");
        assert!(p.acceptance() > 0.95);
    }

    #[test]
    fn rounds_that_do_not_pay_give_way_to_plain_steps() {
        // Half the drafts refused at once, and a verification of four plain steps: almost
        // only plain steps once the pause has grown.
        let mut p = Pacing::new(7);
        let chosen = settle(&mut p, 4.0, |_| 0);
        let rounds = chosen[100..].iter().filter(|&&k| k > 0).count();
        assert!(rounds <= 2, "{rounds} rounds in the last 100: {chosen:?}");
        assert!(p.acceptance() < 0.3, "{}", p.acceptance());
        // When the text turns predictable (and verifying cheap), the round after a pause
        // finds it, and rounds take the most drafts again.
        let chosen = settle(&mut p, 1.0, |k| k);
        let most = chosen[150..].iter().filter(|&&k| k == 7).count();
        assert!(most >= 45, "{chosen:?}");
    }

    #[test]
    fn the_round_size_follows_the_chance_a_draft_is_kept() {
        // Four of every seven drafts kept, verification cost growing with the rows: fewer
        // drafts than the most, more than none.
        let mut p = Pacing::new(7);
        let chosen = settle(&mut p, 1.0, |k| k.min(3));
        let last = chosen[150..].iter().copied().max().unwrap_or(0);
        assert!((1..7).contains(&last), "{chosen:?}");
    }
}
