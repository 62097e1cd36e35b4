//! Optional per-kernel GPU timing with timestamp queries: each dispatch gets its own compute
//! pass with begin/end timestamps. Off by default, since separate passes cost time of their own.

use super::device::{Gpu, GpuError};

/// Total GPU time spent in one kernel label over a profiled submission.
#[derive(Debug, Clone)]
pub struct KernelTiming {
    pub label: String,
    pub calls: u32,
    pub total_ns: f64,
}

pub(crate) struct Profiler {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    capacity: u32,
    labels: Vec<String>,
}

impl Profiler {
    pub fn new(gpu: &Gpu, max_dispatches: u32) -> Self {
        let capacity = max_dispatches * 2;
        let queries = gpu.device().create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("kernel timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: capacity,
        });
        let resolve = gpu.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamp resolve"),
            size: u64::from(capacity) * 8,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Self {
            queries,
            resolve,
            capacity,
            labels: Vec::new(),
        }
    }

    /// Timestamp writes for the next dispatch, or None once the query set is full.
    pub fn next(&mut self, label: &str) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let index = self.labels.len() as u32 * 2;
        if index + 2 > self.capacity {
            return None;
        }
        self.labels.push(label.to_owned());
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(index),
            end_of_pass_write_index: Some(index + 1),
        })
    }

    pub fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        let used = self.labels.len() as u32 * 2;
        if used > 0 {
            encoder.resolve_query_set(&self.queries, 0..used, &self.resolve, 0);
        }
    }

    /// Reads the timestamps of the finished submission and sums them per kernel label.
    pub fn read(&mut self, gpu: &Gpu) -> Result<Vec<KernelTiming>, GpuError> {
        let used = self.labels.len() as u64 * 2;
        if used == 0 {
            return Ok(Vec::new());
        }
        let ticks: Vec<u64> = gpu.read(&self.resolve, 0, used)?;
        let period = f64::from(gpu.queue().get_timestamp_period());
        let mut out: Vec<KernelTiming> = Vec::new();
        for (i, label) in self.labels.drain(..).enumerate() {
            let ns = ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period;
            match out.iter_mut().find(|t| t.label == label) {
                Some(t) => {
                    t.calls += 1;
                    t.total_ns += ns;
                }
                None => out.push(KernelTiming {
                    label,
                    calls: 1,
                    total_ns: ns,
                }),
            }
        }
        out.sort_by(|a, b| b.total_ns.total_cmp(&a.total_ns));
        Ok(out)
    }
}
