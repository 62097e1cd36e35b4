use bytemuck::{Pod, Zeroable};

use super::attention_coop;
use super::{RopeTable, WeightDType, bind, flag};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

#[path = "attention_full.rs"]
mod full;
#[path = "attention_runs.rs"]
mod runs;
#[path = "attention_split.rs"]
mod split;

pub use full::{FullAttention, FullLayout};
use runs::KeyRuns;
pub use runs::RUNS_MOST_ROWS;

const SOURCE: &str = include_str!("../../../shaders/attention.wgsl");
const WG: u32 = 256;
/// Largest head dimension the kernel's workgroup arrays hold.
pub const MAX_HEAD_DIM: u32 = 256;
/// Decoding splits the keys into at most MAX_SPLITS runs of at least MIN_SPLIT keys.
pub const MIN_SPLIT: u32 = 64;
pub const MAX_SPLITS: u32 = 16;

/// Invocations of a split decode attention workgroup (one run of keys of one head): 128 for
/// heads of 128 values or more, else `WG`. On an H200 (`bench --prompt-len 504 --gen 64`, two
/// rounds, 256 → 128 invocations) that decoded Qwen3-1.7B Q4_K at 646 / 647 tok/s against
/// 636 / 636, Phi-4-mini Q4_K 453 / 453 against 448 / 448, Qwen2.5-1.5B Q4_K 684 / 683
/// against 672 / 671 and Q8_0 677 / 678 against 667 / 667; Gemma-3-1B (heads of 256) was level
/// (Q8_0 559 / 557 against 558 / 557), while heads of 64 lost (SmolLM2-1.7B Q4_K 845 / 845
/// against 856 / 856, Llama-3.2-1B Q4_K 1,171 / 1,171 against 1,189 / 1,183). 64 invocations
/// were slower on every shape.
fn split_workgroup(head_dim: u32) -> u32 {
    if head_dim >= 128 { 128 } else { WG }
}

/// Lanes that score each key of a split decode step or a batched step together (0: a lane a
/// key): up to eight,
/// a power of two that divides the head's quads and fits a subgroup. One lane a key reads a
/// quad from each of a subgroup's key rows per load; eight read runs of a row. On an H200
/// (`bench --gen 128`, Q4_K, two rounds) Llama-3.1-8B decoded 368 tok/s against 356 after a
/// 504-token prompt and 336 against 314 after 2,000; SmolLM2-1.7B 904-906 against 889,
/// Qwen2.5-1.5B 699-701 against 689-690. Four lanes a key measured level with eight.
/// `BACKPACK_ATTN_KEY_LANES=N` forces N (0 for one lane a key), for measuring.
fn split_key_lanes(gpu: &Gpu, head_dim: u32) -> u32 {
    let caps = gpu.caps();
    if !caps.subgroups || caps.subgroup_min_size < 2 {
        return 0;
    }
    let most = std::env::var("BACKPACK_ATTN_KEY_LANES")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(8);
    let most = most.min(caps.subgroup_min_size).min(64);
    if most < 2 {
        return 0;
    }
    // The largest power of two within `most` that divides the head's quads.
    let mut lanes = 1 << (31 - most.leading_zeros());
    while lanes > 1 && !(head_dim / 4).is_multiple_of(lanes) {
        lanes /= 2;
    }
    if lanes >= 2 { lanes } else { 0 }
}

/// Number of key runs a decode step over `keys` keys uses.
pub fn splits_for(keys: u32) -> u32 {
    let len = MIN_SPLIT.max(keys.div_ceil(MAX_SPLITS));
    keys.div_ceil(len).max(1)
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    capacity: u32,
    scale: f32,
    window: u32,
    scale_base: u32,
    eps: f32,
}

/// Per-head RMSNorm gains of queries and keys (Qwen3's and Gemma 3's `q_norm` / `k_norm`,
/// before RoPE), which a split attention applies as it reads the QKV row.
#[derive(Clone, Copy)]
pub struct HeadNormGains<'a> {
    pub q: &'a StorageBuffer,
    pub k: &'a StorageBuffer,
    pub eps: f32,
}

/// How a KV cache stores keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDType {
    F32,
    F16,
    /// Blocks of 32 dims as int8 with one f32 scale each (8.5 bits a value where f16 takes
    /// 16): nearly twice the context in the same memory, at a small cost in accuracy.
    Q8_0,
}

impl From<WeightDType> for KvDType {
    fn from(d: WeightDType) -> Self {
        match d {
            WeightDType::F32 => Self::F32,
            WeightDType::F16 => Self::F16,
        }
    }
}

/// A layer's KV cache and how its attention reads it.
#[derive(Clone, Copy, Debug)]
pub struct CacheShape {
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Rows per KV head. Position p lives in row p, or with a window in row p mod rows (a
    /// rolling cache, which needs rows ≥ window + the most tokens stored at once − 1).
    pub rows: u32,
    pub dtype: KvDType,
    /// Keys a query sees: its own position and the window − 1 before it (None: all before).
    pub window: Option<u32>,
    /// Softmax scale of scores (None: 1/√head_dim).
    pub scale: Option<f32>,
    /// Sequences the cache holds side by side, `rows` positions each (slot s's KV head h at
    /// rows (s·kv_heads + h)·rows): one per sequence a batched decode step may take.
    pub slots: u32,
    /// Each query head of the QKV rows is followed by a gate head of the same width (the
    /// query product of Qwen3.5's gated attention).
    pub gated_queries: bool,
}

impl CacheShape {
    /// A cache of `rows` positions that every query sees whole, scaled by 1/√head_dim.
    pub fn new(
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        rows: u32,
        dtype: impl Into<KvDType>,
    ) -> Self {
        Self {
            heads,
            kv_heads,
            head_dim,
            rows,
            dtype: dtype.into(),
            window: None,
            scale: None,
            gated_queries: false,
            slots: 1,
        }
    }

    /// Bytes of one of the layer's two caches (K or V).
    pub fn buffer_bytes(&self) -> u64 {
        let values = u64::from(self.slots)
            * u64::from(self.kv_heads)
            * u64::from(self.rows)
            * u64::from(self.head_dim);
        match self.dtype {
            KvDType::F32 => values * 4,
            KvDType::F16 => values * 2,
            KvDType::Q8_0 => values + values / 32 * 4,
        }
    }

    /// Q8_0: the word where the block scales start, after every value.
    pub(crate) fn scale_base(&self) -> u32 {
        match self.dtype {
            KvDType::Q8_0 => self.slots * self.kv_heads * self.rows * self.head_dim / 4,
            _ => 0,
        }
    }

    pub(crate) fn check(&self) -> Result<(), GpuError> {
        let Self {
            heads,
            kv_heads,
            head_dim,
            ..
        } = *self;
        if head_dim > MAX_HEAD_DIM || !head_dim.is_multiple_of(4) || head_dim == 0 {
            return Err(GpuError::Device(format!(
                "head_dim {head_dim} is unsupported (a multiple of 4, at most {MAX_HEAD_DIM})"
            )));
        }
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(GpuError::Device(format!(
                "{heads} attention heads cannot share {kv_heads} key/value heads"
            )));
        }
        if self.dtype == KvDType::Q8_0 && !head_dim.is_multiple_of(32) {
            return Err(GpuError::Device(format!(
                "a q8_0 KV cache needs heads of a multiple of 32 dims, not {head_dim}"
            )));
        }
        if self.window.is_some_and(|w| w == 0 || w > self.rows) {
            return Err(GpuError::Device(format!(
                "a window of {:?} positions does not fit a cache of {} rows",
                self.window, self.rows
            )));
        }
        Ok(())
    }
}

/// Causal grouped-query attention of the step's queries over the cache.
pub struct Attention {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    /// The query-block kernel for prompts (see attention.wgsl `tiled`); none for a split step
    /// or where its tiles do not fit the device's workgroup memory.
    tiled: Option<(Kernel, wgpu::BindGroup)>,
    /// The tensor-core kernel for prompts, where the adapter and head size take it.
    flash: Option<(Kernel, wgpu::BindGroup)>,
    block_queries: u32,
    heads: u32,
    window: Option<u32>,
    split: bool,
    /// Whether it normalises the query and key heads itself (a split step with head norms).
    norms_heads: bool,
    /// A batched or short step's attention over runs of keys, and the merge of each row's
    /// runs.
    runs: Option<KeyRuns>,
    _params: UniformBuffer,
}

/// What a split attention reads besides the QKV row: where its runs' statistics go, the RoPE
/// table (none: learned positions) and the head norms.
#[derive(Clone, Copy)]
struct SplitParts<'a> {
    stats: &'a StorageBuffer,
    table: Option<&'a RopeTable>,
    head_norm: Option<HeadNormGains<'a>>,
}

impl Attention {
    pub fn new(
        gpu: &Gpu,
        shape: CacheShape,
        q: &StorageBuffer,
        k_cache: &StorageBuffer,
        v_cache: &StorageBuffer,
        out: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        Self::build(gpu, shape, q, k_cache, v_cache, out, None, None, None, step)
    }

    /// Attention for a batched decode step: row t is one token of the sequence in slot
    /// `rows[t].y` of the step's [`super::BatchRows`] `rows`, at its own position, seeing its
    /// own sequence's keys (`sinks` as in [`Attention::with_sinks`]).
    pub fn batched(
        gpu: &Gpu,
        shape: CacheShape,
        [q, k_cache, v_cache, out]: [&StorageBuffer; 4],
        sinks: Option<&StorageBuffer>,
        step: &UniformBuffer,
        rows: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        Self::build(
            gpu,
            shape,
            q,
            k_cache,
            v_cache,
            out,
            None,
            sinks,
            Some(rows),
            step,
        )
    }

    /// As [`Attention::new`], with a logit per query head (`sinks`) joining every softmax's
    /// denominator (GPT-OSS).
    #[allow(clippy::too_many_arguments)]
    pub fn with_sinks(
        gpu: &Gpu,
        shape: CacheShape,
        q: &StorageBuffer,
        k_cache: &StorageBuffer,
        v_cache: &StorageBuffer,
        out: &StorageBuffer,
        sinks: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        Self::build(
            gpu,
            shape,
            q,
            k_cache,
            v_cache,
            out,
            None,
            Some(sinks),
            None,
            step,
        )
    }

    /// Whether this (split) attention normalises the query and key heads itself.
    pub fn norms_heads(&self) -> bool {
        self.norms_heads
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        gpu: &Gpu,
        shape: CacheShape,
        q: &StorageBuffer,
        k_cache: &StorageBuffer,
        v_cache: &StorageBuffer,
        out: &StorageBuffer,
        split: Option<SplitParts<'_>>,
        sinks: Option<&StorageBuffer>,
        batch: Option<&UniformBuffer>,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        shape.check()?;
        let head_dim = shape.head_dim;
        let table = split.and_then(|s| s.table);
        let head_norm = split.and_then(|s| s.head_norm);
        super::rope::check_rotary(table, head_dim)?;
        let rotary_dim = table.map_or(head_dim, |t| t.rotary_dim);
        let (bq, bk) = tiles_for(head_dim);
        let wg = if split.is_some() {
            split_workgroup(head_dim)
        } else {
            WG
        };
        let key_lanes = if split.is_some() || batch.is_some() {
            split_key_lanes(gpu, head_dim)
        } else {
            0
        };
        let defines = [
            ("WG", wg.to_string()),
            ("HD", head_dim.to_string()),
            ("KEY_LANES", key_lanes.to_string()),
            // Softmax max and sum through subgroups: on an H200 (`bench --prompt-len 504
            // --gen 64`, Q4_K, two rounds) decode went SmolLM2-1.7B 835 / 830 → 856 / 856
            // tok/s, Llama-3.2-1B 1,155 / 1,155 → 1,189 / 1,183, Qwen2.5-1.5B 669 / 667 →
            // 672 / 671, and SmolLM2-1.7B after a 2,000-token prompt 737 / 735 → 756 / 760.
            flag("SUBGROUP", gpu.caps().subgroups),
            flag("F16", shape.dtype == KvDType::F16),
            flag("Q8", shape.dtype == KvDType::Q8_0),
            flag("SPLIT", split.is_some()),
            (
                "QSTEP",
                if shape.gated_queries { "2" } else { "1" }.to_string(),
            ),
            flag("NO_ROPE", split.is_some_and(|s| s.table.is_none())),
            flag("HEAD_NORM", head_norm.is_some()),
            ("ROT", rotary_dim.to_string()),
            ("MIN_SPLIT", MIN_SPLIT.to_string()),
            ("MAX_SPLITS", MAX_SPLITS.to_string()),
            flag("RING", shape.window.is_some()),
            // Prompts (not a split or batched decode step) also get the query-block kernel.
            flag("TILED", split.is_none() && batch.is_none()),
            flag("BATCH", batch.is_some()),
            flag("RUNS", false),
            ("BQ", bq.to_string()),
            ("BK", bk.to_string()),
            flag("SINKS", sinks.is_some()),
        ];
        let kernel = gpu.kernel("attention", SOURCE, "main", &defines)?;
        let params = gpu.uniform(
            "attention params",
            &Params {
                heads: shape.heads,
                kv_heads: shape.kv_heads,
                head_dim,
                capacity: shape.rows,
                scale: shape.scale.unwrap_or(1.0 / (head_dim as f32).sqrt()),
                window: shape.window.unwrap_or(0),
                scale_base: shape.scale_base(),
                eps: head_norm.map_or(0.0, |n| n.eps),
            },
        );
        let mut entries = vec![
            (0, &params.buffer),
            (1, &step.buffer),
            (2, &q.buffer),
            (3, &k_cache.buffer),
            (4, &v_cache.buffer),
            (5, &out.buffer),
        ];
        if let Some(sinks) = sinks {
            entries.push((9, &sinks.buffer));
        }
        if let Some(parts) = split {
            entries.push((6, &parts.stats.buffer));
            if let Some(t) = parts.table {
                entries.push((7, &t.cos.buffer));
                entries.push((8, &t.sin.buffer));
            }
        }
        if let Some(norm) = head_norm {
            entries.push((11, &norm.q.buffer));
            entries.push((12, &norm.k.buffer));
        }
        if let Some(rows) = batch {
            // Batched rows take their positions from `rows`, not the step: the automatic
            // layout has no step binding then.
            entries.retain(|(binding, _)| *binding != 1);
            entries.push((super::BATCH_ROWS_BINDING, &rows.buffer));
        }
        let prompts = split.is_none() && batch.is_none();
        let tiled = if prompts && tiles_fit(gpu, head_dim) {
            let tiled = gpu.kernel("attention", SOURCE, "tiled", &defines)?;
            let group = bind(gpu, &tiled, &entries);
            Some((tiled, group))
        } else {
            None
        };
        let flash = if prompts && attention_coop::fits(gpu, head_dim) {
            let flash = attention_coop::kernel(gpu, &defines, head_dim, false)?;
            let group = bind(gpu, &flash, &entries);
            Some((flash, group))
        } else {
            None
        };
        let bind_group = bind(gpu, &kernel, &entries);
        // `BACKPACK_ATTN_RUNS=0` keeps a workgroup per row and head, for measuring the runs.
        let runs_off = std::env::var("BACKPACK_ATTN_RUNS").is_ok_and(|v| v.trim() == "0");
        let runs = if split.is_none() && !runs_off {
            Some(KeyRuns::new(gpu, &shape, &defines, &entries)?)
        } else {
            None
        };
        Ok(Self {
            kernel,
            bind_group,
            tiled,
            flash,
            block_queries: bq,
            heads: shape.heads,
            window: shape.window,
            split: split.is_some(),
            norms_heads: head_norm.is_some(),
            runs,
            _params: params,
        })
    }

    /// Records a batched step's attention for `n_rows` rows, the longest of which sees
    /// `longest` keys: over runs of keys and their merge where the rows' workgroups are few
    /// and their keys many (see [`KeyRuns::suit`]), else a workgroup per row and head.
    pub fn encode_batch(&self, rec: &mut Recorder<'_>, n_rows: u32, longest: u32) {
        let visible = self.visible(longest);
        match &self.runs {
            Some(r) if r.suit(n_rows, visible) => r.encode(rec, n_rows, visible),
            _ => self.encode_with(rec, 0, n_rows, AttentionKernel::PerQuery),
        }
    }

    /// Records attention for `n_tokens` queries starting at position `pos0` (which must match
    /// the step uniform). A split attention handles one token.
    pub fn encode(&self, rec: &mut Recorder<'_>, pos0: u32, n_tokens: u32) {
        let visible = self.visible(pos0 + n_tokens);
        // (A split attention has no runs: it splits its one token's keys itself.)
        let kernel = if self
            .runs
            .as_ref()
            .is_some_and(|r| r.suit(n_tokens, visible))
        {
            // A few rows after a long context (a speculative verification): the query
            // blocks would leave all but a workgroup a head idle, scanning every key.
            AttentionKernel::KeyRuns
        } else if n_tokens < TILED_FROM {
            AttentionKernel::PerQuery
        } else if self.flash.is_some() {
            AttentionKernel::TensorCores
        } else {
            AttentionKernel::QueryBlocks
        };
        self.encode_with(rec, pos0, n_tokens, kernel);
    }

    /// Keys the last of the step's rows sees when `end` tokens are in the cache.
    fn visible(&self, end: u32) -> u32 {
        self.window.map_or(end, |w| end.min(w))
    }

    /// The kernels a prompt can run on this adapter (tests cover each).
    pub fn kernels(&self) -> Vec<AttentionKernel> {
        let mut kernels = vec![AttentionKernel::PerQuery];
        if self.runs.is_some() {
            kernels.push(AttentionKernel::KeyRuns);
        }
        if self.tiled.is_some() {
            kernels.push(AttentionKernel::QueryBlocks);
        }
        if self.flash.is_some() {
            kernels.push(AttentionKernel::TensorCores);
        }
        kernels
    }

    /// As [`Attention::encode`] with the kernel chosen (one of [`Attention::kernels`]; any
    /// other runs the per-query kernel, as a split attention always does).
    pub fn encode_with(
        &self,
        rec: &mut Recorder<'_>,
        pos0: u32,
        n_tokens: u32,
        kernel: AttentionKernel,
    ) {
        let blocks = match kernel {
            AttentionKernel::TensorCores => self
                .flash
                .as_ref()
                .map(|f| (f, n_tokens.div_ceil(attention_coop::queries(false)))),
            AttentionKernel::QueryBlocks => self
                .tiled
                .as_ref()
                .map(|t| (t, n_tokens.div_ceil(self.block_queries))),
            AttentionKernel::KeyRuns => match &self.runs {
                Some(r) if n_tokens <= RUNS_MOST_ROWS => {
                    r.encode(rec, n_tokens, self.visible(pos0 + n_tokens));
                    return;
                }
                _ => None,
            },
            AttentionKernel::PerQuery | AttentionKernel::Cpu | AttentionKernel::WideTensorCores => {
                None
            }
        };
        if let Some(((kernel, group), blocks)) = blocks {
            rec.dispatch_xyz(kernel, group, [self.heads, blocks, 1]);
            return;
        }
        let y = if self.split {
            splits_for((pos0 + 1).min(self.window.unwrap_or(u32::MAX)))
        } else {
            n_tokens
        };
        rec.dispatch_xyz(&self.kernel, &self.bind_group, [self.heads, y, 1]);
    }
}

/// Queries per workgroup of the tiled kernel, and keys per staged tile, for a head size:
/// what fits 32 KiB of workgroup memory (the smallest that Vulkan drivers here offer).
fn tiles_for(head_dim: u32) -> (u32, u32) {
    if head_dim <= 64 { (32, 32) } else { (16, 16) }
}

/// Whether the query-block kernel's workgroup arrays for heads of `head_dim` fit the device
/// (heads of 256 need about 35 KiB; some GPUs offer 32).
fn tiles_fit(gpu: &Gpu, head_dim: u32) -> bool {
    let (bq, bk) = tiles_for(head_dim);
    let quads = head_dim / 4;
    let bytes = 16 * bk * (quads + 1) + 16 * bk * quads + 4 * bq * bk + 4 * WG;
    bytes <= gpu.caps().max_workgroup_storage
}

/// From this many queries on, the tiled kernel is used.
const TILED_FROM: u32 = 4;

/// The kernels of an [`Attention`] or a [`FullAttention`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// One workgroup per query and head: few queries (a decoded token, a decoder's
    /// cross-attention).
    PerQuery,
    /// Blocks of queries over staged key tiles (attention.wgsl `tiled`; causal where the
    /// attention is, without a mask in a [`FullAttention`]).
    QueryBlocks,
    /// CPU adapters: scores, row statistics and values as three passes (attention_cpu.wgsl).
    Cpu,
    /// Blocks of 64 queries on tensor cores (attention_coop.wgsl), without a mask where the
    /// attention is not causal.
    TensorCores,
    /// Blocks of 128 queries on tensor cores over f16 rows, without a mask (at least 128
    /// queries).
    WideTensorCores,
    /// Each query's keys in runs across workgroups, merged after: up to [`RUNS_MOST_ROWS`]
    /// queries over long contexts (more run per query).
    KeyRuns,
}
