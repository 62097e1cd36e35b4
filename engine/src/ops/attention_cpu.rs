//! Full attention on CPU adapters: scores, row statistics and values as three passes of the
//! subgroup tiles in shaders/attention_cpu.wgsl, through a scores buffer shared on the device.

use bytemuck::{Pod, Zeroable};

use super::{FullLayout, bind, cpu_tiles, flag};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const SOURCE: &str = include_str!("../../../shaders/attention_cpu.wgsl");

/// The scores buffer holds as many heads at once as fit this (a Whisper encoder's 1500
/// queries × 1500 keys take 9 MiB a head); heads beyond it run in further groups.
const SCORES_BUDGET: u64 = 64 << 20;
/// Queries, keys and value dims of a workgroup's tile.
const TILE: u32 = 32;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    heads: u32,
    kv_heads: u32,
    keys: u32,
    q_stride: u32,
    scale: f32,
    kv_stride: u32,
    k_off: u32,
    head0: u32,
    rows: u32,
    row_stride: u32,
    _pad: [u32; 2],
}

/// The heads one round of the three passes covers.
struct HeadGroup {
    heads: u32,
    scores: wgpu::BindGroup,
    stats: wgpu::BindGroup,
    values: wgpu::BindGroup,
    _params: UniformBuffer,
}

pub(super) struct CpuAttention {
    scores: Kernel,
    stats: Kernel,
    values: Kernel,
    groups: Vec<HeadGroup>,
    keys: u32,
    head_dim: u32,
}

impl CpuAttention {
    /// `None` unless the adapter runs the CPU kernels and one head's scores for every query
    /// row `q` can hold fit the budget.
    pub(super) fn new(
        gpu: &Gpu,
        layout: &FullLayout,
        (q, kv, out, step): (
            &StorageBuffer,
            &StorageBuffer,
            &StorageBuffer,
            &UniformBuffer,
        ),
        causal: bool,
    ) -> Result<Option<Self>, GpuError> {
        if !cpu_tiles(gpu) || layout.q_stride == 0 {
            return Ok(None);
        }
        let rows = q.size / (u64::from(layout.q_stride) * 4);
        let row_stride = layout.keys.div_ceil(4) * 4;
        let per_head = rows * u64::from(row_stride) * 4;
        let budget = SCORES_BUDGET.min(gpu.caps().max_storage_binding);
        let per_group = (budget / per_head.max(1)).min(u64::from(layout.heads)) as u32;
        if per_group == 0 || rows == 0 {
            return Ok(None);
        }
        let rows = rows as u32;
        let scores_buf = gpu.shared_scratch("attention scores", u64::from(per_group) * per_head)?;
        let stats_buf =
            gpu.shared_scratch("attention row stats", u64::from(per_group * rows) * 8)?;
        let defines = [("HD", layout.head_dim.to_string()), flag("CAUSAL", causal)];
        let scores = gpu.kernel("attention_cpu", SOURCE, "scores", &defines)?;
        let stats = gpu.kernel("attention_cpu", SOURCE, "stats_pass", &defines)?;
        let values = gpu.kernel("attention_cpu", SOURCE, "values", &defines)?;
        let mut groups = Vec::new();
        for head0 in (0..layout.heads).step_by(per_group as usize) {
            let params = gpu.uniform(
                "cpu attention params",
                &Params {
                    heads: layout.heads,
                    kv_heads: layout.kv_heads,
                    keys: layout.keys,
                    q_stride: layout.q_stride,
                    scale: 1.0 / (layout.head_dim as f32).sqrt(),
                    kv_stride: layout.kv_stride,
                    k_off: layout.k_off,
                    head0,
                    rows,
                    row_stride,
                    _pad: [0; 2],
                },
            );
            let (p, st) = (&params.buffer, &step.buffer);
            groups.push(HeadGroup {
                heads: per_group.min(layout.heads - head0),
                scores: bind(
                    gpu,
                    &scores,
                    &[
                        (0, p),
                        (1, st),
                        (2, &q.buffer),
                        (3, &kv.buffer),
                        (4, &scores_buf.buffer),
                    ],
                ),
                stats: bind(
                    gpu,
                    &stats,
                    &[(0, p), (4, &scores_buf.buffer), (5, &stats_buf.buffer)],
                ),
                values: bind(
                    gpu,
                    &values,
                    &[
                        (0, p),
                        (1, st),
                        (3, &kv.buffer),
                        (4, &scores_buf.buffer),
                        (5, &stats_buf.buffer),
                        (6, &out.buffer),
                    ],
                ),
                _params: params,
            });
        }
        Ok(Some(Self {
            scores,
            stats,
            values,
            groups,
            keys: layout.keys,
            head_dim: layout.head_dim,
        }))
    }

    pub(super) fn encode(&self, rec: &mut Recorder<'_>, n_queries: u32) {
        let row_tiles = n_queries.div_ceil(TILE);
        for g in &self.groups {
            rec.dispatch_xyz(
                &self.scores,
                &g.scores,
                [self.keys.div_ceil(TILE), row_tiles, g.heads],
            );
            rec.dispatch_xyz(&self.stats, &g.stats, [n_queries, 1, g.heads]);
            rec.dispatch_xyz(
                &self.values,
                &g.values,
                [self.head_dim.div_ceil(TILE), row_tiles, g.heads],
            );
        }
    }
}
