//! Gated DeltaNet (shaders/delta_net.wgsl): the linear-attention layers of Qwen3.5, after
//! their input product (q, k, v, z, b and a stacked into one). A causal convolution over the projected q/k/v channels, then the
//! gated delta rule over each value head's recurrent state, and the gated RMSNorm of its
//! output. The convolution's last inputs and the recurrent state are the sequence's cache,
//! carried from step to step on the GPU.

use bytemuck::{Pod, Zeroable};

use super::delta_chunk::{ChunkedDelta, DeltaScratch};
use super::{bind, flag, groups_of_64};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const SOURCE: &str = include_str!("../../../shaders/delta_net.wgsl");

/// Shared by delta_net.wgsl and delta_chunk.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
pub(super) struct Params {
    pub(super) channels: u32,
    pub(super) row_stride: u32,
    pub(super) eps: f32,
    pub(super) z_at: u32,
    pub(super) z_stride: u32,
    pub(super) gates_at: u32,
    pub(super) gates_stride: u32,
    /// The input rows' stride where q/k/v are convolved into rows of their own (chunks).
    pub(super) in_stride: u32,
}

/// The head layout of a Gated DeltaNet layer: `key_heads` q/k heads of `key_dim`, shared by
/// `value_heads / key_heads` value heads each (value head h reads key head
/// `h / (value_heads / key_heads)`), and a convolution of `conv_kernel` taps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
    pub key_heads: u32,
    pub value_heads: u32,
    pub key_dim: u32,
    pub value_dim: u32,
    pub conv_kernel: u32,
}

/// The largest head dims the recurrence takes: one workgroup holds a head's DV columns, each
/// invocation a column of DK state values in registers.
pub const MAX_DELTA_HEAD_DIM: u32 = 256;

/// The longest projected row a layer may have (q, k, v, z, b and a of one token): far past
/// any published shape, and small enough that no row index overflows.
pub const MAX_DELTA_ROW: u32 = 1 << 20;

impl DeltaNetShape {
    /// Channels of the projected rows: q and k (`key_heads·key_dim` each), then v.
    pub fn channels(&self) -> u32 {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// Values of a token's projected row: q, k and v (the convolved channels), then z, b
    /// and a (`value_heads·value_dim`, `value_heads`, `value_heads`).
    pub fn projected_width(&self) -> u32 {
        self.channels() + self.value_heads * self.value_dim + 2 * self.value_heads
    }

    /// Values of one layer's recurrent state (`value_heads × key_dim × value_dim`).
    pub fn state_values(&self) -> u64 {
        u64::from(self.value_heads) * u64::from(self.key_dim) * u64::from(self.value_dim)
    }

    /// Values of one layer's convolution state: every channel's inputs by position in a ring
    /// of `conv_kernel` slots (the last `conv_kernel − 1` inputs, and the slot a step writes).
    pub fn conv_state_values(&self) -> u64 {
        u64::from(self.channels()) * u64::from(self.conv_kernel)
    }

    /// Whether the kernels take this shape; the reason where they do not.
    pub fn check(&self) -> Result<(), String> {
        if self.key_heads == 0
            || self.value_heads == 0
            || !self.value_heads.is_multiple_of(self.key_heads)
        {
            return Err(format!(
                "{} value heads cannot share {} key heads evenly",
                self.value_heads, self.key_heads
            ));
        }
        if !(1..=MAX_DELTA_HEAD_DIM).contains(&self.key_dim)
            || !(1..=MAX_DELTA_HEAD_DIM).contains(&self.value_dim)
        {
            return Err(format!(
                "linear-attention heads of {}×{} are outside 1..={MAX_DELTA_HEAD_DIM}",
                self.key_dim, self.value_dim
            ));
        }
        // The projected row's length, computed wide: head counts come from a config.
        let width = 2 * u64::from(self.key_heads) * u64::from(self.key_dim)
            + 2 * u64::from(self.value_heads) * u64::from(self.value_dim)
            + 2 * u64::from(self.value_heads);
        if width > u64::from(MAX_DELTA_ROW) {
            return Err(format!(
                "linear-attention rows of {width} values are over {MAX_DELTA_ROW}"
            ));
        }
        if !(1..=MAX_CONV_KERNEL).contains(&self.conv_kernel) {
            return Err(format!(
                "a convolution of {} taps is outside 1..={MAX_CONV_KERNEL}",
                self.conv_kernel
            ));
        }
        Ok(())
    }
}

/// One layer's small weights (the products' matrices are the caller's): the convolution
/// `[channels][conv_kernel]`, A = −exp(A_log) and dt_bias per value head, and the output
/// norm's `[value_dim]` weight.
pub struct DeltaNetWeights {
    pub conv: StorageBuffer,
    pub decay_a: StorageBuffer,
    pub dt_bias: StorageBuffer,
    pub norm: StorageBuffer,
}

/// One layer's part of the sequence's cache. Cleared when a sequence starts.
pub struct DeltaNetState {
    pub conv: StorageBuffer,
    pub recurrent: StorageBuffer,
}

impl DeltaNetState {
    pub fn new(gpu: &Gpu, shape: &DeltaNetShape) -> Result<Self, GpuError> {
        Ok(Self {
            conv: gpu.storage("delta-net conv state", 4 * shape.conv_state_values().max(1))?,
            recurrent: gpu.storage("delta-net state", 4 * shape.state_values())?,
        })
    }

    /// Records the state's reset to a new sequence.
    pub fn clear(&self, rec: &mut Recorder<'_>) {
        rec.clear(&self.conv.buffer);
        rec.clear(&self.recurrent.buffer);
    }
}

/// Values of each token the layer reads from rows of `stride` values, starting at `offset`.
#[derive(Clone, Copy)]
pub struct DeltaRows<'a> {
    pub buffer: &'a StorageBuffer,
    pub offset: u32,
    pub stride: u32,
}

/// The buffers a layer's kernels read and write, per step.
pub struct DeltaNetIo<'a> {
    /// `[tokens][rows_stride]`: q, k and v first in each row (the input product's), convolved
    /// in place.
    pub rows: &'a StorageBuffer,
    pub rows_stride: u32,
    /// z (`value_heads·value_dim` values) and the gates b then a (`value_heads` each): after
    /// q/k/v in `rows` where one product makes them all, else rows of their own.
    pub z: DeltaRows<'a>,
    pub gates: DeltaRows<'a>,
    /// `[tokens][value_heads·value_dim]`.
    pub out: &'a StorageBuffer,
    /// The chunked prompt form's products (shared by the layers).
    pub scratch: &'a DeltaScratch,
}

impl<'a> DeltaNetIo<'a> {
    /// Whether the rows hold what the shape reads: q/k/v within `rows_stride`, z and the gates
    /// within theirs.
    fn check(&self, shape: &DeltaNetShape) -> Result<(), String> {
        let fits = |what: &str, at: u32, len: u32, stride: u32| {
            if u64::from(at) + u64::from(len) > u64::from(stride) {
                Err(format!(
                    "{what} ({len} values at {at}) overflow rows of {stride}"
                ))
            } else {
                Ok(())
            }
        };
        fits("q/k/v", 0, shape.channels(), self.rows_stride)?;
        fits(
            "z",
            self.z.offset,
            shape.value_heads * shape.value_dim,
            self.z.stride,
        )?;
        fits(
            "the gates",
            self.gates.offset,
            2 * shape.value_heads,
            self.gates.stride,
        )
    }

    /// One product's rows holding everything: q/k/v, z, b and a.
    pub fn stacked(
        rows: &'a StorageBuffer,
        shape: &DeltaNetShape,
        out: &'a StorageBuffer,
        scratch: &'a DeltaScratch,
    ) -> Self {
        let stride = shape.projected_width();
        let z_at = shape.channels();
        Self {
            rows,
            rows_stride: stride,
            z: DeltaRows {
                buffer: rows,
                offset: z_at,
                stride,
            },
            gates: DeltaRows {
                buffer: rows,
                offset: z_at + shape.value_heads * shape.value_dim,
                stride,
            },
            out,
            scratch,
        }
    }
}

pub(super) struct Dispatch {
    pub(super) kernel: Kernel,
    pub(super) bind_group: wgpu::BindGroup,
}

/// Prompt steps of at least this many tokens take the chunked form; shorter ones (and
/// decoding) step through the tokens one at a time, which costs less below a chunk's fixed
/// work.
pub const DELTA_CHUNKED_FROM: u32 = 16;

/// The widest convolution a shape may have (`DeltaNetShape::check`).
const MAX_CONV_KERNEL: u32 = 16;

// A chunked step keeps its last K − 1 inputs as the convolution's state: it must have them.
const _: () = assert!(DELTA_CHUNKED_FROM > MAX_CONV_KERNEL - 1);

/// The convolution and the recurrence of one layer: one dispatch a decode step, two a short
/// prompt step, seven a chunked one.
pub struct DeltaNet {
    conv: Dispatch,
    delta: Dispatch,
    /// A decoded token's convolution and recurrence in one dispatch.
    step: Dispatch,
    chunked: Option<ChunkedDelta>,
    channels: u32,
    value_heads: u32,
    _params: UniformBuffer,
}

impl DeltaNet {
    /// `tiled_heads`: value head h reads key head h mod key_heads (GGUF's order) rather than
    /// h / (value_heads / key_heads).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        shape: &DeltaNetShape,
        tiled_heads: bool,
        weights: &DeltaNetWeights,
        state: &DeltaNetState,
        io: &DeltaNetIo<'_>,
        step: &UniformBuffer,
        eps: f32,
    ) -> Result<Self, GpuError> {
        shape.check().map_err(GpuError::Device)?;
        io.check(shape).map_err(GpuError::Device)?;
        let values = Params {
            channels: shape.channels(),
            row_stride: io.rows_stride,
            eps,
            z_at: io.z.offset,
            z_stride: io.z.stride,
            gates_at: io.gates.offset,
            gates_stride: io.gates.stride,
            in_stride: io.rows_stride,
        };
        let params = gpu.uniform("delta-net params", &values);
        let conv_kernel = gpu.kernel(
            "delta-net conv",
            SOURCE,
            "main",
            &[flag("CONV", true), ("K", shape.conv_kernel.to_string())],
        )?;
        let conv = Dispatch {
            bind_group: bind(
                gpu,
                &conv_kernel,
                &[
                    (0, &params.buffer),
                    (1, &step.buffer),
                    (2, &io.rows.buffer),
                    (3, &weights.conv.buffer),
                    (4, &state.conv.buffer),
                ],
            ),
            kernel: conv_kernel,
        };
        // Groups of invocations share each state column's rows, held in registers: 4 groups
        // (2 for columns over 128 wide, keeping workgroups at 512). On an H200 (9B shape,
        // Q4_K) one invocation a column took 24.7 µs a layer's decode step.
        let columns = shape.value_dim.next_power_of_two().max(32);
        let caps = gpu.caps();
        let largest = caps
            .max_workgroup_invocations
            .min(caps.max_workgroup_size_x);
        if columns > largest {
            return Err(GpuError::Device(format!(
                "linear-attention heads {} wide need workgroups of {columns}; the adapter takes {largest}",
                shape.value_dim
            )));
        }
        // Fewer groups where the adapter's workgroups are smaller.
        let groups = [4, 2, 1]
            .into_iter()
            .find(|&g| (g < 4 || columns <= 128) && columns * g <= largest)
            .unwrap_or(1);
        let workgroup = columns * groups;
        let rule = |fused: bool| -> Result<Dispatch, GpuError> {
            let kernel = gpu.kernel(
                "delta-net rule",
                SOURCE,
                "main",
                &[
                    flag("DELTA", true),
                    flag("FUSED", fused),
                    flag("TILED", tiled_heads),
                    ("K", shape.conv_kernel.to_string()),
                    ("DK", shape.key_dim.to_string()),
                    ("DV", shape.value_dim.to_string()),
                    ("WG", workgroup.to_string()),
                    ("GROUPS", groups.to_string()),
                    ("DKQ", shape.key_dim.div_ceil(groups).to_string()),
                    ("NK", shape.key_heads.to_string()),
                    ("NV", shape.value_heads.to_string()),
                ],
            )?;
            let mut entries = vec![
                (0, &params.buffer),
                (1, &step.buffer),
                (2, &io.rows.buffer),
                (5, &weights.decay_a.buffer),
                (6, &weights.dt_bias.buffer),
                (7, &weights.norm.buffer),
                (8, &state.recurrent.buffer),
                (9, &io.out.buffer),
                (11, &io.z.buffer.buffer),
                (12, &io.gates.buffer.buffer),
            ];
            if fused {
                entries.extend([(3, &weights.conv.buffer), (4, &state.conv.buffer)]);
            }
            Ok(Dispatch {
                bind_group: bind(gpu, &kernel, &entries),
                kernel,
            })
        };
        let delta = rule(false)?;
        let step_kernel = rule(true)?;
        // Adapters without room for the chunks' workgroups step prompts token by token.
        let chunked = if ChunkedDelta::fits(gpu.caps(), shape.key_dim) {
            Some(ChunkedDelta::new(
                gpu,
                shape,
                tiled_heads,
                weights,
                state,
                io,
                step,
                values,
            )?)
        } else {
            None
        };
        Ok(Self {
            conv,
            delta,
            step: step_kernel,
            chunked,
            channels: shape.channels(),
            value_heads: shape.value_heads,
            _params: params,
        })
    }

    /// Whether prompt steps of [`DELTA_CHUNKED_FROM`] tokens or more run in chunks here (the
    /// adapter has room for the chunks' workgroups).
    pub fn prompts_in_chunks(&self) -> bool {
        self.chunked.is_some()
    }

    /// Records a decode step (one token, as `step` holds): its convolution and recurrence in
    /// one dispatch.
    pub fn encode(&self, rec: &mut Recorder<'_>) {
        rec.dispatch(&self.step.kernel, &self.step.bind_group, self.value_heads);
    }

    /// Records a prompt step of `n` tokens (the count `step` holds): one token as a decode
    /// step, chunked from [`DELTA_CHUNKED_FROM`] tokens on, token by token between.
    pub fn encode_prompt(&self, rec: &mut Recorder<'_>, n: u32) {
        let chunked = self
            .chunked
            .as_ref()
            .filter(|c| n >= DELTA_CHUNKED_FROM && n <= c.max_tokens());
        if let Some(chunked) = chunked {
            chunked.encode(rec, n);
        } else if n == 1 {
            self.encode(rec);
        } else {
            self.encode_conv(rec);
            rec.dispatch(&self.delta.kernel, &self.delta.bind_group, self.value_heads);
        }
    }

    fn encode_conv(&self, rec: &mut Recorder<'_>) {
        rec.dispatch(
            &self.conv.kernel,
            &self.conv.bind_group,
            groups_of_64(self.channels),
        );
    }
}
