//! Building a network's forward pass once per image size as a replayable plan: each layer
//! call loads its weights on first use (they then stay on the GPU for every later plan),
//! takes its activation buffers from an arena that hands a released buffer to the next
//! layer that fits, and appends its dispatches. Running the plan is one recording of those
//! dispatches, with no allocation or binding work per step.

use std::collections::HashMap;
use std::sync::Arc;

use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer, UniformBuffer};
use crate::models::weights::Uploader;
use crate::ops::{Conv2dShape, Gelu, GluKind, MatMul, MatMulOptions, Matrix, StepParams};

/// A channel-last activation `[h·w][channels]` (a token sequence is `h = 1`).
pub struct Act {
    pub buf: Arc<StorageBuffer>,
    pub h: u32,
    pub w: u32,
    pub channels: u32,
}

impl Act {
    pub fn pixels(&self) -> u32 {
        self.h * self.w
    }

    /// Values in the activation.
    pub fn values(&self) -> u32 {
        self.pixels() * self.channels
    }
}

/// Products with at least this many 128×128 output tiles use them (a few per compute unit of a
/// large GPU); others use 64-wide tiles.
const BIG_TILES_FROM: u32 = 512;
/// Products with fewer 64×64 output tiles than this split k to fill the GPU.
const SPLIT_BELOW_TILES: u32 = 512;

/// What a product applies after its bias (and, for ReLU, after its residual).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    None,
    Gelu(Gelu),
    Relu,
    /// diffusers' GEGLU over the product's two blocks of outputs (value, gate), in its
    /// epilogue: half the weight rows come out (see `MatMul::gates_in_epilogue`).
    Geglu,
    /// SwiGLU over the product's two blocks of outputs (gate, up), in its epilogue.
    SwiGlu,
}

/// Which of a product's operands hold f16 values two to a word (tensor-core tiles only: see
/// `MatMulOptions::half_in` and `half_out`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Halves {
    pub input: bool,
    pub output: bool,
}

/// A convolution's input: its shape, and a GroupNorm (with SiLU) folded into its loads
/// ([`crate::ops::GroupNorm::folded`]).
pub(super) struct ConvInput {
    pub shape: Conv2dShape,
    pub norm: Option<Arc<StorageBuffer>>,
}

type Encoder = Box<dyn Fn(&mut Recorder<'_>) + Send + Sync>;

/// The recorded forward pass of one network at one shape.
#[derive(Default)]
pub struct Plan {
    passes: Vec<Encoder>,
}

impl Plan {
    pub fn encode(&self, rec: &mut Recorder<'_>) {
        for pass in &self.passes {
            pass(rec);
        }
    }

    pub fn len(&self) -> usize {
        self.passes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.passes.is_empty()
    }
}

/// Weights of one network on the GPU, by tensor name, loaded on first use.
#[derive(Default)]
pub struct WeightCache {
    pub(super) matrices: HashMap<String, Arc<Matrix>>,
    pub(super) vectors: HashMap<String, Arc<StorageBuffer>>,
    /// Bytes of weights on the GPU.
    pub bytes: u64,
}

/// Activation buffers for one plan, reused once released.
#[derive(Default)]
struct Arena {
    free: Vec<Arc<StorageBuffer>>,
    bytes: u64,
}

impl Arena {
    fn take(&mut self, gpu: &Gpu, bytes: u64) -> Result<Arc<StorageBuffer>, Error> {
        // The smallest free buffer that fits and wastes less than half of itself.
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.size >= bytes && b.size <= bytes.saturating_mul(2).max(4096))
            .min_by_key(|(_, b)| b.size)
            .map(|(i, _)| i);
        if let Some(i) = best {
            return Ok(self.free.swap_remove(i));
        }
        gpu.check_binding_size("activation", bytes)?;
        self.bytes += bytes;
        Ok(Arc::new(gpu.storage("activation", bytes)?))
    }
}

/// Builds a [`Plan`]: layer calls in forward order.
pub struct Builder<'a, 'w> {
    pub gpu: &'a Gpu,
    pub(super) up: &'w mut Uploader<'a>,
    pub(super) weights: &'w mut WeightCache,
    arena: Arena,
    plan: Plan,
    steps: HashMap<u32, Arc<UniformBuffer>>,
    split_scratch: Option<Arc<StorageBuffer>>,
}

impl<'a, 'w> Builder<'a, 'w> {
    pub fn new(gpu: &'a Gpu, up: &'w mut Uploader<'a>, weights: &'w mut WeightCache) -> Self {
        Self {
            gpu,
            up,
            weights,
            arena: Arena::default(),
            plan: Plan::default(),
            steps: HashMap::new(),
            split_scratch: None,
        }
    }

    /// The plan and the bytes of activations it holds.
    pub fn finish(self) -> (Plan, u64) {
        (self.plan, self.arena.bytes)
    }

    pub fn push(&mut self, f: impl Fn(&mut Recorder<'_>) + Send + Sync + 'static) {
        self.plan.passes.push(Box::new(f));
    }

    /// A fresh activation.
    pub fn alloc(&mut self, h: u32, w: u32, channels: u32) -> Result<Act, Error> {
        let bytes = u64::from(h) * u64::from(w) * u64::from(channels) * 4;
        Ok(Act {
            buf: self.arena.take(self.gpu, bytes)?,
            h,
            w,
            channels,
        })
    }

    /// Returns `x`'s buffer to the arena for later layers.
    pub fn release(&mut self, x: Act) {
        self.arena.free.push(x.buf);
    }

    /// An activation bound to a buffer outside the arena (a plan's inputs and outputs).
    pub fn external(buf: &Arc<StorageBuffer>, h: u32, w: u32, channels: u32) -> Act {
        Act {
            buf: buf.clone(),
            h,
            w,
            channels,
        }
    }

    pub(super) fn step(&mut self, rows: u32) -> Arc<UniformBuffer> {
        let gpu = self.gpu;
        self.steps
            .entry(rows)
            .or_insert_with(|| Arc::new(gpu.uniform("rows", &StepParams::new(0, rows))))
            .clone()
    }

    pub(super) fn has_weight(&self, name: &str) -> bool {
        self.weights.matrices.contains_key(name)
            || self.weights.vectors.contains_key(name)
            || self.up.has(name)
    }

    /// Whether the network has tensor `name` (optional layers).
    pub fn has(&self, name: &str) -> bool {
        self.has_weight(name)
    }

    pub(super) fn matrix(
        &mut self,
        name: &str,
        load: impl FnOnce(&mut Uploader<'a>) -> Result<Matrix, Error>,
    ) -> Result<Arc<Matrix>, Error> {
        if let Some(m) = self.weights.matrices.get(name) {
            return Ok(m.clone());
        }
        let m = Arc::new(load(self.up)?);
        self.weights.bytes += m.buffer.size;
        self.weights.matrices.insert(name.to_owned(), m.clone());
        Ok(m)
    }

    /// The f32 vector `name` of `len` values (`fill`: the value random weights use, None
    /// for small random values).
    pub fn vector(
        &mut self,
        name: &str,
        len: u32,
        fill: Option<f32>,
    ) -> Result<Arc<StorageBuffer>, Error> {
        if let Some(v) = self.weights.vectors.get(name) {
            return Ok(v.clone());
        }
        let v = Arc::new(self.up.vector(name, &[(name, len)], fill)?);
        self.weights.bytes += v.size;
        self.weights.vectors.insert(name.to_owned(), v.clone());
        Ok(v)
    }

    /// A plain f32 table `[rows][cols]` (embeddings).
    pub fn table(&mut self, name: &str, rows: u32, cols: u32) -> Result<Arc<StorageBuffer>, Error> {
        if let Some(v) = self.weights.vectors.get(name) {
            return Ok(v.clone());
        }
        let v = Arc::new(self.up.dense(name, name, rows, cols)?);
        self.weights.bytes += v.size;
        self.weights.vectors.insert(name.to_owned(), v.clone());
        Ok(v)
    }

    pub(super) fn bias(
        &mut self,
        layer: &str,
        len: u32,
    ) -> Result<Option<Arc<StorageBuffer>>, Error> {
        let name = format!("{layer}.bias");
        if self.has_weight(&name) {
            Ok(Some(self.vector(&name, len, None)?))
        } else {
            Ok(None)
        }
    }

    fn scratch_for(
        &mut self,
        n: u32,
        k: u32,
        rows: u32,
    ) -> Result<Option<Arc<StorageBuffer>>, Error> {
        // Splitting k pays only when the output has too few tiles to fill the GPU; an image's
        // thousands of pixel rows have plenty, and the partial sums would cost more traffic
        // than they save.
        let tiles = rows.div_ceil(64) * n.div_ceil(64);
        let need = MatMul::scratch_bytes(n, k, rows);
        if need == 0
            || tiles >= SPLIT_BELOW_TILES
            || self.gpu.check_binding_size("split scratch", need).is_err()
        {
            return Ok(None);
        }
        match &self.split_scratch {
            Some(s) if s.size >= need => Ok(Some(s.clone())),
            _ => {
                let s = Arc::new(self.gpu.storage("split scratch", need)?);
                self.split_scratch = Some(s.clone());
                Ok(Some(s))
            }
        }
    }

    /// Records `y = x·Wᵀ (+ bias)` with an optional activation; with `residual`, the
    /// product is added into that activation, which becomes the output.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn product(
        &mut self,
        x: &Act,
        w: Arc<Matrix>,
        bias: Option<Arc<StorageBuffer>>,
        activation: Activation,
        residual: Option<Act>,
        conv: Option<Conv2dShape>,
        out: (u32, u32),
    ) -> Result<Act, Error> {
        let halves = Halves::default();
        let conv = conv.map(|shape| ConvInput { shape, norm: None });
        self.product_with(x, w, bias, activation, residual, conv, out, halves)
    }

    /// As [`Builder::product`], with f16 operands where `halves` says.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn product_with(
        &mut self,
        x: &Act,
        w: Arc<Matrix>,
        bias: Option<Arc<StorageBuffer>>,
        activation: Activation,
        residual: Option<Act>,
        conv: Option<ConvInput>,
        (out_h, out_w): (u32, u32),
        halves: Halves,
    ) -> Result<Act, Error> {
        let rows = out_h * out_w;
        let (gelu, relu) = match activation {
            Activation::None | Activation::Geglu | Activation::SwiGlu => (None, false),
            Activation::Gelu(g) => (Some(g), false),
            Activation::Relu => (None, true),
        };
        let glu = match activation {
            Activation::Geglu => Some(GluKind::GeluErf),
            Activation::SwiGlu => Some(GluKind::Silu),
            _ => None,
        };
        let out_channels = if glu.is_some() { w.rows / 2 } else { w.rows };
        let accumulate = residual.is_some();
        let y = match residual {
            Some(r) if r.channels == out_channels && r.pixels() == rows => r,
            Some(r) => {
                return Err(Error::Invalid(format!(
                    "residual [{}×{}] does not match a product of [{rows}×{}]",
                    r.pixels(),
                    r.channels,
                    w.rows
                )));
            }
            None => self.alloc(out_h, out_w, out_channels)?,
        };
        let step = self.step(rows);
        let scratch = self.scratch_for(w.rows, w.cols, rows)?;
        let mm = MatMul::new(
            self.gpu,
            &w,
            &x.buf,
            &y.buf,
            &step,
            MatMulOptions {
                bias: bias.as_deref(),
                gelu,
                residual: accumulate,
                split_scratch: scratch.as_deref().map(|s| (s, rows)),
                conv: conv.as_ref().map(|c| c.shape),
                relu,
                big_tiles: Some(rows.div_ceil(128) * w.rows.div_ceil(128) >= BIG_TILES_FROM),
                cpu_tiles: None,
                split_target: None,
                coop_tile: None,
                rows: Some(rows),
                glu,
                half_out: halves.output,
                half_in: halves.input,
                input_norm: conv.as_ref().and_then(|c| c.norm.as_deref()),
            },
        )?;
        self.push(move |rec| mm.encode(rec, rows));
        Ok(y)
    }
}
