//! Frame times, kept to show that streaming never stalls the UI: the status bar's "ms/frame",
//! and a summary on exit when the app is started with frame stats on.

use std::collections::VecDeque;
use std::time::Instant;

#[derive(Default)]
pub struct FrameStats {
    last: Option<Instant>,
    /// (CPU ms of the frame, ms since the previous frame, generating?)
    samples: VecDeque<(f32, f32, bool)>,
    totals: Vec<(f32, f32, bool)>,
    keep_all: bool,
}

const FRAME_WINDOW: usize = 120;

impl FrameStats {
    /// `keep_all`: keep every sample for the summary on exit, not only the recent window.
    pub fn new(keep_all: bool) -> Self {
        Self {
            keep_all,
            ..Default::default()
        }
    }

    pub fn record(&mut self, cpu_s: Option<f32>, generating: bool) {
        let now = Instant::now();
        let interval = self
            .last
            .map_or(0.0, |l| now.duration_since(l).as_secs_f32() * 1e3);
        self.last = Some(now);
        let sample = (cpu_s.unwrap_or(0.0) * 1e3, interval, generating);
        if self.samples.len() == FRAME_WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
        if self.keep_all {
            self.totals.push(sample);
        }
    }

    /// Mean CPU time per frame over the recent window, in ms.
    pub fn recent_cpu_ms(&self) -> f32 {
        if self.samples.is_empty() {
            return 0.0;
        }
        self.samples.iter().map(|s| s.0).sum::<f32>() / self.samples.len() as f32
    }

    pub fn report(&self) -> String {
        let summarize = |generating: bool| {
            let mut cpu: Vec<f32> = self
                .totals
                .iter()
                .filter(|s| s.2 == generating)
                .map(|s| s.0)
                .collect();
            if cpu.is_empty() {
                return "no frames".to_owned();
            }
            cpu.sort_by(f32::total_cmp);
            let mean = cpu.iter().sum::<f32>() / cpu.len() as f32;
            let p95 = cpu[(cpu.len() * 95 / 100).min(cpu.len() - 1)];
            format!(
                "{} frames, CPU per frame mean {mean:.2} ms, p95 {p95:.2} ms, max {:.2} ms",
                cpu.len(),
                cpu[cpu.len() - 1]
            )
        };
        format!(
            "frame stats: idle: {}; generating: {}",
            summarize(false),
            summarize(true)
        )
    }
}
