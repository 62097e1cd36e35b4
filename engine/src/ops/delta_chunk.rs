//! Gated DeltaNet over a prompt in chunks (shaders/delta_chunk.wgsl): the chunked gated delta
//! rule, where only the state's walk through the chunks of 64 tokens runs one chunk after
//! another; the work inside a chunk, and the outputs from the state each chunk starts from,
//! are products over its tokens, every chunk at once. Decoding's single tokens keep the
//! recurrent kernel (delta_net.wgsl); both read and leave the same state.

use std::sync::LazyLock;

use super::delta_net::{
    DeltaNetIo, DeltaNetShape, DeltaNetState, DeltaNetWeights, Dispatch, Params,
};
use super::{bind, flag};
use crate::gpu::{Gpu, GpuCaps, GpuError, Recorder, StorageBuffer, UniformBuffer};

/// delta_chunk.wgsl (with its preparation, walk and outputs) after delta_net.wgsl, whose
/// parameters, helpers and convolution ring the chunks share.
static SOURCE: LazyLock<String> = LazyLock::new(|| {
    [
        include_str!("../../../shaders/delta_net.wgsl"),
        include_str!("../../../shaders/delta_chunk.wgsl"),
        include_str!("../../../shaders/delta_chunk_prep.wgsl"),
        include_str!("../../../shaders/delta_chunk_walk.wgsl"),
    ]
    .join("\n")
});

/// Tokens per chunk (`CH` in the shader).
pub const DELTA_CHUNK: u32 = 64;

/// How the chunk walk lays out a workgroup: `columns` state columns (`COLS` in the shader),
/// `threads` invocations (`WALK_THREADS`: columns × groups of the chunk's rows) and `dims` of W
/// or k staged a tile (`WALK_DH`). The walk is a chain of dependent steps per chunk, so it wants
/// many invocations in flight, and each workgroup stages the chunk's W and k for its columns.
/// On an H200 (9B shape, 4,000-token prompt, `bench --profile`, the walk's GPU time over its 24
/// layers, 128 invocations): 32 columns a workgroup took 151 ms and 8 columns 78 while each
/// workgroup waited for its tiles' loads; with the next tile loaded during the current one's
/// products, 8 / 16 / 32 columns took 62–64 / 44 / 68 ms at 32 dims a tile, and 16 / 32 / 64
/// dims 46 / 44 / 77 ms at 16 columns. With each group's dims of the state updated side by
/// side, 256 invocations (columns, dims): 16, 32 took 26.8 ms; 32, 32 29.9; 8, 32 42.6; 16, 64
/// 40.3; against 33.7 with 128 invocations (16, 32), 57.4 (8, 32) and 64 invocations 60.5
/// (16, 32). `BACKPACK_DELTA_WALK=cols=C,threads=T,dims=D` sets them, for measuring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WalkShape {
    columns: u32,
    threads: u32,
    dims: u32,
}

impl WalkShape {
    const DEFAULT: Self = Self {
        columns: 16,
        threads: 256,
        dims: 32,
    };

    fn chosen(caps: &GpuCaps, key_dim: u32) -> Self {
        let mut shape = Self::DEFAULT;
        if let Ok(spec) = std::env::var("BACKPACK_DELTA_WALK") {
            for (key, value) in spec.split(',').filter_map(|kv| kv.split_once('=')) {
                match (key.trim(), value.trim().parse::<u32>()) {
                    ("cols", Ok(v)) => shape.columns = v,
                    ("threads", Ok(v)) => shape.threads = v,
                    ("dims", Ok(v)) => shape.dims = v,
                    _ => {}
                }
            }
        }
        if shape.valid(caps, key_dim) {
            shape
        } else {
            Self::DEFAULT
        }
    }

    /// Groups of the chunk's rows (`GROUPS`): each takes `rows()` of them for V', and
    /// `dims / groups` of a tile's dims for the state.
    fn groups(self) -> u32 {
        self.threads / self.columns
    }

    fn rows(self) -> u32 {
        DELTA_CHUNK / self.groups()
    }

    /// Workgroup memory of the walk: the state's columns, a staged tile, V' of the columns
    /// and the decays.
    fn workgroup_bytes(self, key_dim: u32) -> u32 {
        4 * (key_dim * self.columns
            + DELTA_CHUNK * (self.dims + 1)
            + DELTA_CHUNK * self.columns
            + DELTA_CHUNK)
    }

    fn valid(self, caps: &GpuCaps, key_dim: u32) -> bool {
        let pow2 = |v: u32| v.is_power_of_two();
        pow2(self.threads)
            && (32..=256).contains(&self.threads)
            && self.threads <= caps.max_workgroup_invocations
            && pow2(self.columns)
            && self.columns < self.threads
            && self.groups() <= DELTA_CHUNK
            && pow2(self.dims)
            && self.dims >= self.groups()
            && self.dims <= 128
            && (DELTA_CHUNK * self.dims).is_multiple_of(self.threads)
            && self.workgroup_bytes(key_dim) <= caps.max_workgroup_storage
    }
}

/// The per-token products a prompt's chunks hand from the preparation to the walk, shared
/// by every layer of a model (one layer runs at a time).
pub struct DeltaScratch {
    /// `[tokens][value_heads]`: the running log decay within each chunk.
    decays: StorageBuffer,
    /// `[tokens][value_heads][key_dim]`.
    w_rows: StorageBuffer,
    /// `[tokens][value_heads][value_dim]`.
    u_rows: StorageBuffer,
    /// `[tokens][value_heads][DELTA_CHUNK]`: each token's row of the chunk's decayed q·k.
    p_rows: StorageBuffer,
    /// `[chunks][value_heads][key_dim][value_dim]`: the state each chunk starts from.
    chunk_states: StorageBuffer,
    /// `[tokens][channels]`: the convolved q/k/v.
    mixed: StorageBuffer,
    tokens: u32,
}

impl DeltaScratch {
    /// Room for prompt steps of up to `tokens` tokens.
    pub fn new(gpu: &Gpu, shape: &DeltaNetShape, tokens: u32) -> Result<Self, GpuError> {
        let per_head = |values: u32| {
            4 * u64::from(tokens.max(1)) * u64::from(shape.value_heads) * u64::from(values)
        };
        Ok(Self {
            decays: gpu.storage("delta-net chunk decays", per_head(1))?,
            w_rows: gpu.storage("delta-net chunk W", per_head(shape.key_dim))?,
            u_rows: gpu.storage("delta-net chunk U", per_head(shape.value_dim))?,
            p_rows: gpu.storage("delta-net chunk P", per_head(DELTA_CHUNK))?,
            chunk_states: gpu.storage(
                "delta-net chunk states",
                4 * u64::from(tokens.max(1).div_ceil(DELTA_CHUNK)) * shape.state_values(),
            )?,
            mixed: gpu.storage(
                "delta-net convolved rows",
                4 * u64::from(tokens.max(1)) * u64::from(shape.channels()),
            )?,
            tokens: tokens.max(1),
        })
    }

    /// Bytes of this scratch per token of the prompt step (as [`DeltaScratch::new`] sizes
    /// it, the chunks' starting states spread over their tokens).
    pub fn row_bytes(shape: &DeltaNetShape) -> u64 {
        let per_head = 1 + shape.key_dim + shape.value_dim + DELTA_CHUNK;
        4 * (u64::from(shape.value_heads) * u64::from(per_head)
            + u64::from(shape.channels())
            + shape.state_values().div_ceil(u64::from(DELTA_CHUNK)))
    }

    /// The prompt step this scratch takes at most.
    pub fn tokens(&self) -> u32 {
        self.tokens
    }
}

/// The seven dispatches of a chunked prompt step.
pub(super) struct ChunkedDelta {
    conv: Dispatch,
    conv_state: Dispatch,
    qk_norm: Dispatch,
    prep: Dispatch,
    walk: Dispatch,
    out: Dispatch,
    gated_norm: Dispatch,
    key_heads: u32,
    value_heads: u32,
    value_dim: u32,
    columns: u32,
    channels: u32,
    max_tokens: u32,
    _params: UniformBuffer,
}

impl ChunkedDelta {
    /// `recurrent` is the recurrent kernels' parameters; these kernels read q/k/v from the
    /// convolved rows of the scratch instead.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        gpu: &Gpu,
        shape: &DeltaNetShape,
        tiled_heads: bool,
        weights: &DeltaNetWeights,
        state: &DeltaNetState,
        io: &DeltaNetIo<'_>,
        step: &UniformBuffer,
        recurrent: Params,
    ) -> Result<Self, GpuError> {
        let s = io.scratch;
        let params = gpu.uniform(
            "delta-net chunk params",
            &Params {
                row_stride: shape.channels(),
                ..recurrent
            },
        );
        let walk = WalkShape::chosen(gpu.caps(), shape.key_dim);
        let kernel = |stage: &'static str| {
            gpu.kernel(
                "delta-net chunks",
                &SOURCE,
                "main",
                &[
                    flag(stage, true),
                    flag("TILED", tiled_heads),
                    ("DK", shape.key_dim.to_string()),
                    ("DV", shape.value_dim.to_string()),
                    ("NK", shape.key_heads.to_string()),
                    ("NV", shape.value_heads.to_string()),
                    ("WALK_THREADS", walk.threads.to_string()),
                    ("COLS", walk.columns.to_string()),
                    ("ROWS", walk.rows().to_string()),
                    ("WALK_DH", walk.dims.to_string()),
                    // Values of a staged tile (the chunk's rows × WALK_DH dims) each of the
                    // walk's invocations loads.
                    (
                        "TILE_PART",
                        (DELTA_CHUNK * walk.dims / walk.threads).to_string(),
                    ),
                    // A tile's dims each of the walk's groups of rows updates in the state.
                    ("WALK_DPER", (walk.dims / walk.groups()).to_string()),
                    ("K", shape.conv_kernel.to_string()),
                ],
            )
        };
        let dispatch = |stage: &'static str, buffers: &[(u32, &wgpu::Buffer)]| {
            let kernel = kernel(stage)?;
            let mut entries = vec![(0, &params.buffer)];
            entries.extend_from_slice(buffers);
            Ok::<_, GpuError>(Dispatch {
                bind_group: bind(gpu, &kernel, &entries),
                kernel,
            })
        };
        let rows = &s.mixed.buffer;
        Ok(Self {
            conv: dispatch(
                "CONV_ALL",
                &[
                    (1, &step.buffer),
                    (2, rows),
                    (3, &weights.conv.buffer),
                    (4, &state.conv.buffer),
                    (14, &io.rows.buffer),
                ],
            )?,
            conv_state: dispatch(
                "CONV_STATE",
                &[
                    (1, &step.buffer),
                    (4, &state.conv.buffer),
                    (14, &io.rows.buffer),
                ],
            )?,
            qk_norm: dispatch("QKNORM", &[(2, rows)])?,
            prep: dispatch(
                "PREP",
                &[
                    (1, &step.buffer),
                    (2, rows),
                    (3, &weights.decay_a.buffer),
                    (4, &weights.dt_bias.buffer),
                    (5, &s.decays.buffer),
                    (6, &s.w_rows.buffer),
                    (7, &s.u_rows.buffer),
                    (8, &s.p_rows.buffer),
                    (12, &io.gates.buffer.buffer),
                ],
            )?,
            walk: dispatch(
                "WALK",
                &[
                    (1, &step.buffer),
                    (2, rows),
                    (5, &s.decays.buffer),
                    (6, &s.w_rows.buffer),
                    (7, &s.u_rows.buffer),
                    (9, &state.recurrent.buffer),
                    (13, &s.chunk_states.buffer),
                ],
            )?,
            out: dispatch(
                "OUT",
                &[
                    (1, &step.buffer),
                    (2, rows),
                    (5, &s.decays.buffer),
                    (7, &s.u_rows.buffer),
                    (8, &s.p_rows.buffer),
                    (10, &io.out.buffer),
                    (13, &s.chunk_states.buffer),
                ],
            )?,
            gated_norm: dispatch(
                "GNORM",
                &[
                    (3, &weights.norm.buffer),
                    (10, &io.out.buffer),
                    (11, &io.z.buffer.buffer),
                ],
            )?,
            key_heads: shape.key_heads,
            value_heads: shape.value_heads,
            value_dim: shape.value_dim,
            columns: walk.columns,
            channels: shape.channels(),
            max_tokens: s.tokens,
            _params: params,
        })
    }

    /// Whether the adapter takes the chunks' kernels for heads of `key_dim`: 256 invocations,
    /// the preparation's 25.5 KiB of workgroup memory (M, two staged tiles of 16 dims, the
    /// decays and gates) and the walk's (up to 28.5 KiB at heads of 256).
    pub(super) fn fits(caps: &GpuCaps, key_dim: u32) -> bool {
        let prep_bytes =
            4 * (2 * DELTA_CHUNK + DELTA_CHUNK * DELTA_CHUNK + 2 * 16 * (DELTA_CHUNK + 4));
        caps.max_workgroup_invocations >= 256
            && caps.max_workgroup_size_x >= 256
            && caps.max_workgroup_storage >= prep_bytes
            && WalkShape::chosen(caps, key_dim).valid(caps, key_dim)
    }

    pub(super) fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// Records the recurrence over `n` convolved prompt rows (at most the scratch's tokens).
    pub(super) fn encode(&self, rec: &mut Recorder<'_>, n: u32) {
        let chunks = n.div_ceil(DELTA_CHUNK);
        let run = |rec: &mut Recorder<'_>, d: &Dispatch, grid: [u32; 3]| {
            rec.dispatch_xyz(&d.kernel, &d.bind_group, grid);
        };
        run(rec, &self.conv, [self.channels.div_ceil(64), n, 1]);
        run(rec, &self.conv_state, [self.channels.div_ceil(64), 1, 1]);
        run(rec, &self.qk_norm, [self.key_heads, n, 1]);
        run(rec, &self.prep, [self.value_heads, chunks, 1]);
        let column_groups = self.value_dim.div_ceil(self.columns);
        run(rec, &self.walk, [column_groups, self.value_heads, 1]);
        // The outputs in blocks of 64 value columns (OUT's tiles).
        run(
            rec,
            &self.out,
            [self.value_heads, chunks, self.value_dim.div_ceil(64)],
        );
        run(rec, &self.gated_norm, [self.value_heads, n, 1]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::MAX_DELTA_HEAD_DIM;

    /// The default walk fits every head the layers take on adapters with 32 KiB of workgroup
    /// memory (lavapipe's), and a shape asked for that does not fit gives way to it.
    #[test]
    fn the_default_walk_fits_every_head_in_32_kib() {
        let mut caps = crate::ops::coop_tile::tests::nvidia_caps(256);
        caps.max_workgroup_storage = 32 * 1024;
        for key_dim in [1, 13, 128, 136, MAX_DELTA_HEAD_DIM] {
            assert!(WalkShape::DEFAULT.valid(&caps, key_dim), "{key_dim}");
            assert!(ChunkedDelta::fits(&caps, key_dim), "{key_dim}");
        }
        let wide = WalkShape {
            columns: 32,
            ..WalkShape::DEFAULT
        };
        assert!(!wide.valid(&caps, MAX_DELTA_HEAD_DIM));
        assert!(wide.valid(&caps, 64));
        let odd = WalkShape {
            dims: 24,
            ..WalkShape::DEFAULT
        };
        assert!(!odd.valid(&caps, 64));
        caps.max_workgroup_invocations = 128;
        assert!(!ChunkedDelta::fits(&caps, 128));
    }
}
