//! A stand-in for a window's frames while the engine works: every 1/60 s a small submission
//! (a copy the size of a 1280×800 frame) goes straight to the queue, as egui's renderer
//! submits, and is timed from submission to completion. That wait is what the engine's work
//! ahead of a frame in the queue costs it; `bench-image --frame-probe` reports it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use backpack_engine::gpu::Gpu;
use eframe::wgpu;

const FRAME_BYTES: u64 = 1280 * 800 * 4;
const PERIOD: Duration = Duration::from_micros(16_667);

pub struct FrameProbe {
    stop: Arc<AtomicBool>,
    /// Each frame's (ms since the probe started, ms waited).
    thread: JoinHandle<Vec<(f64, f64)>>,
}

/// Waits of the probe's frames, in ms.
pub struct FrameWaits {
    pub frames: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// The longest waits, longest first: (ms since the probe started, ms waited).
    pub longest: Vec<(f64, f64)>,
}

impl FrameProbe {
    pub fn start(gpu: &Gpu) -> Self {
        let device = gpu.device().clone();
        let queue = gpu.queue().clone();
        let buffer = |label| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: FRAME_BYTES,
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let (src, dst) = (buffer("probe frame"), buffer("probe target"));
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut waits = Vec::new();
            let started = Instant::now();
            let mut next = started;
            while !stopped.load(Ordering::Relaxed) {
                let mut encoder = device.create_command_encoder(&Default::default());
                encoder.copy_buffer_to_buffer(&src, 0, &dst, 0, FRAME_BYTES);
                let submitted = Instant::now();
                let index = queue.submit([encoder.finish()]);
                let done = device.poll(wgpu::PollType::Wait {
                    submission_index: Some(index),
                    timeout: Some(Duration::from_secs(30)),
                });
                if done.is_err() {
                    break;
                }
                let at = (submitted - started).as_secs_f64() * 1e3;
                waits.push((at, submitted.elapsed().as_secs_f64() * 1e3));
                next += PERIOD;
                let now = Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
                } else {
                    next = now;
                }
            }
            waits
        });
        Self { stop, thread }
    }

    pub fn finish(self) -> FrameWaits {
        self.stop.store(true, Ordering::Relaxed);
        let mut frames = self.thread.join().unwrap_or_default();
        frames.sort_by(|a, b| b.1.total_cmp(&a.1));
        let longest = frames.iter().take(5).copied().collect();
        let mut waits: Vec<f64> = frames.iter().map(|f| f.1).collect();
        waits.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let i = ((waits.len() as f64 - 1.0) * q).round() as usize;
            waits.get(i).copied().unwrap_or(0.0)
        };
        FrameWaits {
            frames: waits.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: waits.last().copied().unwrap_or(0.0),
            longest,
        }
    }
}
