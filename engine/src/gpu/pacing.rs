//! Submissions paced for a window that shares the GPU: a long sequence recorded in parts
//! ([`super::Recorder::in_parts`]) keeps at most two parts in the queue, each cut to take
//! about a budget of GPU time. A queue runs its submissions in order, so a window's frame
//! submitted during an image step otherwise waits for the whole step (hundreds of ms on the
//! diffusion transformers); paced, it waits for two parts at most.
//!
//! Dispatches differ a hundredfold in cost (a norm against a transformer's product), so parts
//! are cut by each dispatch's expected GPU time rather than by count: per kernel, the time per
//! workgroup measured when it ran as a part of its own. A kernel not yet measured runs alone;
//! a sequence that repeats (every step of an image) is cut well from its second run on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Seconds per workgroup of each kernel (by label), as measured; shared by a device's
/// recorders.
pub(crate) type KernelCosts = Arc<Mutex<HashMap<String, f64>>>;

/// A wait shorter than this found the part already done, so when it ended is not known.
const REAL_WAIT: Duration = Duration::from_micros(20);

/// Where a part is cut around the next dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cuts {
    /// Submit the part so far before the dispatch.
    pub before: bool,
    /// Submit the part right after it.
    pub after: bool,
}

/// The cuts around a dispatch of expected GPU time `cost` (`None`: its kernel was never
/// measured), after a part so far of `dispatches` expected to take `planned` seconds.
pub(super) fn cuts(cost: Option<f64>, dispatches: u32, planned: f64, budget: f64) -> Cuts {
    let started = dispatches > 0;
    match cost {
        // Alone, so that it is measured.
        None => Cuts {
            before: started,
            after: true,
        },
        Some(cost) => Cuts {
            before: started && planned + cost > budget,
            after: cost >= budget,
        },
    }
}

/// A part in the queue: its submission and when, its one dispatch's (kernel, workgroups)
/// where it has one, and whether it was queued behind the part before it (so it started when
/// that one ended).
struct Queued {
    index: wgpu::SubmissionIndex,
    submitted: Instant,
    alone: Option<(String, u32)>,
    behind: bool,
}

/// The state of one paced sequence.
pub(super) struct PartPacer {
    budget: f64,
    costs: KernelCosts,
    /// The part being recorded: its dispatches, its one dispatch while it has one, and its
    /// expected GPU time.
    dispatches: u32,
    alone: Option<(String, u32)>,
    planned: f64,
    /// The newest part submitted (the one before it has been waited for).
    newest: Option<Queued>,
    /// When the part last waited for was seen done.
    last_end: Option<Instant>,
}

impl PartPacer {
    pub(super) fn new(budget: Duration, costs: KernelCosts) -> Self {
        Self {
            budget: budget.as_secs_f64(),
            costs,
            dispatches: 0,
            alone: None,
            planned: 0.0,
            newest: None,
            last_end: None,
        }
    }

    fn cost(&self, label: &str, workgroups: u32) -> Option<f64> {
        let costs = self.costs.lock().unwrap_or_else(|e| e.into_inner());
        costs.get(label).map(|per| per * f64::from(workgroups))
    }

    /// The cuts around the next dispatch (`before` is taken before [`Self::record`]), and
    /// its expected GPU time for [`Self::record`].
    pub(super) fn cuts(&self, label: &str, workgroups: u32) -> (Cuts, Option<f64>) {
        let cost = self.cost(label, workgroups);
        (cuts(cost, self.dispatches, self.planned, self.budget), cost)
    }

    /// Counts a dispatch of expected GPU time `cost` into the part being recorded.
    pub(super) fn record(&mut self, label: &str, workgroups: u32, cost: Option<f64>) {
        self.alone = (self.dispatches == 0).then(|| (label.to_owned(), workgroups.max(1)));
        self.dispatches += 1;
        self.planned += cost.unwrap_or(self.budget);
    }

    /// After the part being recorded was submitted as `index`: waits for the part before it
    /// (so two at most are queued), and learns the cost of that part's kernel where it ran
    /// alone.
    pub(super) fn after_submit(&mut self, device: &wgpu::Device, index: wgpu::SubmissionIndex) {
        let submitted = Queued {
            index,
            submitted: Instant::now(),
            alone: self.alone.take(),
            behind: false,
        };
        self.dispatches = 0;
        self.planned = 0.0;
        let Some(older) = self.newest.replace(submitted) else {
            self.last_end = Some(Instant::now());
            return;
        };
        let asked = Instant::now();
        let waited = device.poll(wgpu::PollType::Wait {
            submission_index: Some(older.index),
            timeout: None,
        });
        let now = Instant::now();
        let seen_end = waited.is_ok() && now - asked >= REAL_WAIT;
        if let Some(newest) = self.newest.as_mut() {
            // Submitted while the older part still ran: it starts when that one ends.
            newest.behind = seen_end;
        }
        if let Some((label, workgroups)) = older.alone {
            // It started when the part before it ended if it was queued behind it, else
            // once submitted; it ended now if the wait saw it end, else before the wait.
            let start = match (older.behind, self.last_end) {
                (true, Some(end)) => end,
                _ => older.submitted,
            };
            let end = if seen_end { now } else { asked };
            let per = end.saturating_duration_since(start).as_secs_f64() / f64::from(workgroups);
            let mut costs = self.costs.lock().unwrap_or_else(|e| e.into_inner());
            match costs.get_mut(&label) {
                // Only a part queued behind another and seen to end is timed exactly; the
                // others bound the time from above, which a first estimate may use.
                Some(known) if seen_end && older.behind => *known = 0.5 * (*known + per),
                Some(_) => {}
                None => {
                    costs.insert(label, per);
                }
            }
        }
        self.last_end = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_cut_by_expected_gpu_time() {
        let ms = 1e-3;
        // An unmeasured kernel runs alone: cut before it (unless the part is empty) and after.
        assert_eq!(
            cuts(None, 3, 1.0 * ms, 4.0 * ms),
            Cuts {
                before: true,
                after: true
            }
        );
        assert_eq!(
            cuts(None, 0, 0.0, 4.0 * ms),
            Cuts {
                before: false,
                after: true
            }
        );
        // Measured ones join the part while it stays within the budget.
        assert_eq!(
            cuts(Some(1.0 * ms), 2, 2.5 * ms, 4.0 * ms),
            Cuts {
                before: false,
                after: false
            }
        );
        assert_eq!(
            cuts(Some(2.0 * ms), 2, 2.5 * ms, 4.0 * ms),
            Cuts {
                before: true,
                after: false
            }
        );
        // One longer than the budget makes a part of its own.
        assert_eq!(
            cuts(Some(9.0 * ms), 1, 0.1 * ms, 4.0 * ms),
            Cuts {
                before: true,
                after: true
            }
        );
        assert_eq!(
            cuts(Some(9.0 * ms), 0, 0.0, 4.0 * ms),
            Cuts {
                before: false,
                after: true
            }
        );
    }
}
