//! How a decode product spreads over the GPU ([`MatVecLayout`]): chosen per shape and device in
//! [`super::MatVec::new`], or forced by a caller or, for measuring, the environment.

use super::WeightDType;

/// How a decode product spreads over a workgroup: `lanes` invocations per row (a power of two
/// up to the workgroup), `rows` rows per group of lanes (1 to 4, sharing each input read),
/// whether the input is staged in workgroup memory (`stage`, honoured where it fits), the
/// `workgroup` size (64 to 1,024), the row `blocks` each workgroup computes (1 to 16) and,
/// for block formats, whether the input is quantized to int8 (`int8`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatVecLayout {
    pub lanes: Option<u32>,
    pub rows: Option<u32>,
    pub stage: Option<bool>,
    pub workgroup: Option<u32>,
    pub blocks: Option<u32>,
    /// Block formats: quantize the input to int8 for packed integer products (default), or
    /// keep it f32; `int8_max_cols` limits that to rows of at most so many values.
    pub int8: Option<bool>,
    pub int8_max_cols: Option<u32>,
    /// Dense and int8 products whose lanes all take the same number of units (vec4 words,
    /// sub-blocks or sub-block pairs): that many a trip of a loop with a constant trip count
    /// (0: the plain strided loop).
    pub unroll: Option<u32>,
    /// Int8 products in trips (`unroll`): load each trip's weights one trip ahead, the first
    /// before the input is staged (by default in normed products without a gate: QKV), or
    /// each as its trip starts (the others).
    pub pipeline: Option<bool>,
    /// Int8 inputs in two levels: the second quantizes each value's rounding remainder, so
    /// the input is exact to about 1/64,000 of its block's largest value, for twice the
    /// integer products (LM heads, see [`MatVecLayout::for_head`]).
    pub int8_fine: Option<bool>,
    /// Int8 handoffs (see [`Int8Handoff`]): off, both the reading and the writing side.
    pub handoff: Option<bool>,
}

impl MatVecLayout {
    /// The layout a model computing in `dtype` asks for: f32 models keep exact float products
    /// (they reproduce a float32 reference) even where int8 inputs are turned on.
    pub fn for_dtype(dtype: WeightDType) -> Self {
        Self {
            int8: (dtype == WeightDType::F32).then_some(false),
            ..Self::default()
        }
    }

    /// The layout of an LM head: int8 inputs in two levels (`int8_fine`). Its outputs are the
    /// logits that pick each greedy token, and one level moves them by tenths: the real
    /// SmolLM2-135M Q4_1 then answers "What is the capital of France?" with "L'Étoile…" (that
    /// step's top-2 margin is 0.08). The layers' products absorb that rounding; the head would
    /// pass it on. The second level makes the input finer than f16 and keeps the integer
    /// products, which beat the float path's per-weight conversions: on an H200 (`bench`,
    /// 504-token prompt) Llama-3.2-1B decoded Q4_K at 1,043 tok/s against 1,020 with a float
    /// input, Q8_0 990 against 953, Q4_0 1,144 against 1,083 (its 128,256-row head had taken
    /// 115 µs of each 1,009 µs step); Qwen2.5-1.5B gained 1-2 %.
    pub fn for_head(dtype: WeightDType) -> Self {
        Self {
            int8_fine: Some(true),
            ..Self::for_dtype(dtype)
        }
    }

    /// On a CPU adapter (llvmpipe/lavapipe) an invocation is one SIMD lane of a CPU thread,
    /// where reductions across lanes and barriers cost far more than arithmetic: a whole row
    /// per invocation, four rows sharing each input read, the input staged. On lavapipe
    /// (`bench-gemm --decode`, 8192×576) that took Q4_0 from 37.8 to 5.3 ms and f16 from 39.0
    /// to 14.9 ms. Block formats take one unit a trip: loading many at once gains nothing on
    /// a CPU, and on lavapipe SmolLM2-135M Q4_0 then decoded 15.1 tok/s against 12.5 with four,
    /// Q4_K/Q8_0 products ran up to 1.4× faster (`bench-gemm --decode`, 576×1536), and the
    /// large unrolled shaders LLVM compiles took far longer (the Q5_K parity test 128 s
    /// against 51 with an empty shader cache); f16 kept four (11.5 tok/s against 10.7).
    /// Other adapters choose per shape (nothing set here).
    pub(super) fn software(software: bool, quantized: bool) -> Self {
        if !software {
            return Self::default();
        }
        Self {
            lanes: Some(1),
            rows: Some(4),
            stage: Some(true),
            workgroup: Some(64),
            unroll: quantized.then_some(1),
            ..Self::default()
        }
    }

    /// Each part set here, else the other's.
    pub(super) fn or(self, other: Self) -> Self {
        Self {
            lanes: self.lanes.or(other.lanes),
            rows: self.rows.or(other.rows),
            stage: self.stage.or(other.stage),
            workgroup: self.workgroup.or(other.workgroup),
            blocks: self.blocks.or(other.blocks),
            int8: self.int8.or(other.int8),
            int8_max_cols: self.int8_max_cols.or(other.int8_max_cols),
            unroll: self.unroll.or(other.unroll),
            pipeline: self.pipeline.or(other.pipeline),
            int8_fine: self.int8_fine.or(other.int8_fine),
            handoff: self.handoff.or(other.handoff),
        }
    }

    /// `BACKPACK_MATVEC=lanes=32,rows=2,stage=1,wg=128,blocks=1,int8=0,int8_max_cols=4096,unroll=2,pipe=0,fine=1,handoff=0`
    /// forces layouts for measuring them on a device (`backpack bench`); parts left out or
    /// malformed are chosen as usual. With `BACKPACK_MATVEC_COLS=K` only products over rows of
    /// `K` values (`cols`) take it, with `BACKPACK_MATVEC_OUTPUTS=N` only products of `N`
    /// outputs (`outputs`; a gated product's gate rows), with `BACKPACK_MATVEC_GATED=1` (or
    /// `0`) only gated products (or only the others).
    pub(super) fn from_env(cols: u32, outputs: u32, gated: bool) -> Self {
        let mut layout = Self::default();
        let Ok(text) = std::env::var("BACKPACK_MATVEC") else {
            return layout;
        };
        let only = std::env::var("BACKPACK_MATVEC_COLS").ok();
        if only.is_some_and(|k| k.trim().parse::<u32>().ok() != Some(cols)) {
            return layout;
        }
        let only = std::env::var("BACKPACK_MATVEC_OUTPUTS").ok();
        if only.is_some_and(|n| n.trim().parse::<u32>().ok() != Some(outputs)) {
            return layout;
        }
        let only = std::env::var("BACKPACK_MATVEC_GATED").ok();
        if only.is_some_and(|g| (g.trim() == "1") != gated) {
            return layout;
        }
        for part in text.split(',') {
            let Some((key, value)) = part.split_once('=') else {
                continue;
            };
            let Ok(value) = value.trim().parse::<u32>() else {
                continue;
            };
            match key.trim() {
                "lanes" => layout.lanes = Some(value),
                "rows" => layout.rows = Some(value),
                "stage" => layout.stage = Some(value != 0),
                "wg" => layout.workgroup = Some(value),
                "blocks" => layout.blocks = Some(value),
                "int8" => layout.int8 = Some(value != 0),
                "int8_max_cols" => layout.int8_max_cols = Some(value),
                "unroll" => layout.unroll = Some(value),
                "pipe" => layout.pipeline = Some(value != 0),
                "fine" => layout.int8_fine = Some(value != 0),
                "handoff" => layout.handoff = Some(value != 0),
                _ => {}
            }
        }
        layout
    }
}
