use bytemuck::{Pod, Zeroable};

use super::bind;
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const SOURCE: &str = include_str!("../../../shaders/sample.wgsl");

/// Sampling settings, with transformers' meaning: temperature 0 is greedy, top_k 0 and
/// top_p 1 are off, repeat_penalty 1 is off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerParams {
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub repeat_penalty: f32,
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repeat_penalty: 1.0,
            seed: 0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    vocab: u32,
    top_k: u32,
    seed: u32,
    greedy: u32,
    temperature: f32,
    top_p: f32,
    repeat_penalty: f32,
    /// 1: only the tokens `mask` allows may be picked.
    masked: u32,
}

/// Where `masked` sits in the uniform (it is written alone when a mask is set or cleared).
const MASKED_OFFSET: u64 = 28;

/// Picks the next token from the logits and appends it to the history buffer.
pub struct Sample {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    params: UniformBuffer,
    /// One bit per token, for grammar-constrained answers.
    mask: StorageBuffer,
    vocab: u32,
}

impl Sample {
    pub fn new(
        gpu: &Gpu,
        vocab: u32,
        logits: &StorageBuffer,
        history: &StorageBuffer,
        seen: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        Self::with_width(gpu, vocab, logits, history, seen, step, None)
    }

    /// As [`Sample::new`] with `width` invocations in the workgroup (a power of two, at
    /// least 64, which is also the capacity of the top-k / top-p candidate list); `None`
    /// picks it for the adapter.
    pub fn with_width(
        gpu: &Gpu,
        vocab: u32,
        logits: &StorageBuffer,
        history: &StorageBuffer,
        seen: &StorageBuffer,
        step: &UniformBuffer,
        width: Option<u32>,
    ) -> Result<Self, GpuError> {
        let needed = u64::from(vocab.div_ceil(4)) * 16;
        if logits.size < needed {
            return Err(GpuError::Device(format!(
                "the logits buffer holds {} bytes; the sampler reads {needed} (vocabulary padded to whole vec4 words)",
                logits.size
            )));
        }
        let wg = workgroup_width(gpu, width)?;
        let kernel = gpu.kernel("sample", SOURCE, "main", &[("WG", wg.to_string())])?;
        let params = gpu.uniform(
            "sampler params",
            &Self::pack(vocab, &SamplerParams::default()),
        );
        let mask = gpu.storage("token mask", u64::from(vocab.div_ceil(32)) * 4)?;
        let bind_group = bind(
            gpu,
            &kernel,
            &[
                (0, &params.buffer),
                (1, &step.buffer),
                (2, &logits.buffer),
                (3, &history.buffer),
                (4, &seen.buffer),
                (5, &mask.buffer),
            ],
        );
        Ok(Self {
            kernel,
            bind_group,
            params,
            mask,
            vocab,
        })
    }

    fn pack(vocab: u32, s: &SamplerParams) -> Params {
        let greedy = s.temperature <= 0.0 || !s.temperature.is_finite();
        Params {
            vocab,
            top_k: s.top_k,
            // Fold the 64-bit seed so every bit matters.
            seed: (s.seed ^ (s.seed >> 32)) as u32,
            greedy: u32::from(greedy),
            temperature: if greedy { 1.0 } else { s.temperature },
            top_p: if s.top_p > 0.0 && s.top_p < 1.0 {
                s.top_p
            } else {
                1.0
            },
            repeat_penalty: if s.repeat_penalty > 0.0 {
                s.repeat_penalty
            } else {
                1.0
            },
            masked: 0,
        }
    }

    /// Sets the sampling settings for the following submissions (and clears any mask).
    pub fn set(&self, gpu: &Gpu, s: &SamplerParams) {
        self.params.write(gpu, &Self::pack(self.vocab, s));
    }

    /// Restricts the following submissions to the tokens `mask` allows (bit `i % 32` of word
    /// `i / 32`), or lifts the restriction. A mask shorter than the vocabulary forbids the rest.
    pub fn set_mask(&self, gpu: &Gpu, mask: Option<&[u32]>) {
        if let Some(words) = mask {
            // Written as given each token; only a short mask needs its tail cleared.
            let full = self.vocab.div_ceil(32) as usize;
            let n = words.len().min(full);
            gpu.queue()
                .write_buffer(&self.mask.buffer, 0, bytemuck::cast_slice(&words[..n]));
            if n < full {
                let tail = vec![0u32; full - n];
                gpu.queue().write_buffer(
                    &self.mask.buffer,
                    n as u64 * 4,
                    bytemuck::cast_slice(&tail),
                );
            }
        }
        let flag = u32::from(mask.is_some());
        gpu.queue().write_buffer(
            &self.params.buffer,
            MASKED_OFFSET,
            bytemuck::bytes_of(&flag),
        );
    }

    pub fn encode(&self, rec: &mut Recorder<'_>) {
        rec.dispatch_xyz(&self.kernel, &self.bind_group, [1, 1, 1]);
    }
}

/// The sampler's workgroup width: `width` if it fits, else as wide as the device allows. One
/// workgroup does a row's work; on a CPU adapter its lanes run as SIMD loops and each barrier
/// costs a pass over all of them (lavapipe, a tiny model's step: 2.2 ms with 1024 lanes,
/// 0.16 ms with 64), so it stays narrow there.
fn workgroup_width(gpu: &Gpu, width: Option<u32>) -> Result<u32, GpuError> {
    let caps = gpu.caps();
    Ok(match width {
        Some(w)
            if w.is_power_of_two()
                && w >= 64
                && w <= caps.max_workgroup_invocations
                && w <= caps.max_workgroup_size_x =>
        {
            w
        }
        Some(w) => {
            return Err(GpuError::Device(format!(
                "a sampler of {w} invocations does not fit (a power of two from 64 to {})",
                caps.max_workgroup_invocations
                    .min(caps.max_workgroup_size_x)
            )));
        }
        None if gpu.is_software() => 64,
        None if caps.max_workgroup_invocations >= 1024 && caps.max_workgroup_size_x >= 1024 => 1024,
        None => 256,
    })
}

/// The sampler of a batched decode step: one workgroup per row, each with the settings and
/// grammar mask of its row's cache slot (see sample.wgsl, BATCH).
pub struct BatchSample {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    /// [`Params`] per slot.
    params: StorageBuffer,
    /// One bit per token per slot.
    mask: StorageBuffer,
    vocab: u32,
}

impl BatchSample {
    /// For `slots` sequences; `logits` holds a row of `vocab` values per batch row, one after
    /// another (as the LM head writes them).
    pub fn new(
        gpu: &Gpu,
        vocab: u32,
        slots: u32,
        [logits, history, seen]: [&StorageBuffer; 3],
        rows: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        let wg = workgroup_width(gpu, None)?;
        let defines = [("WG", wg.to_string()), ("BATCH", "1".to_owned())];
        let kernel = gpu.kernel("sample", SOURCE, "main", &defines)?;
        let params = gpu.storage(
            "sampler params per slot",
            u64::from(slots) * std::mem::size_of::<Params>() as u64,
        )?;
        let mask = gpu.storage(
            "token masks per slot",
            u64::from(slots) * u64::from(vocab.div_ceil(32)) * 4,
        )?;
        let bind_group = bind(
            gpu,
            &kernel,
            &[
                // Each row's position comes from `rows`: the kernel reads no step.
                (0, &params.buffer),
                (2, &logits.buffer),
                (3, &history.buffer),
                (4, &seen.buffer),
                (5, &mask.buffer),
                (super::BATCH_ROWS_BINDING, &rows.buffer),
            ],
        );
        Ok(Self {
            kernel,
            bind_group,
            params,
            mask,
            vocab,
        })
    }

    /// Sets slot `slot`'s settings and its mask (None: every token allowed).
    pub fn set(&self, gpu: &Gpu, slot: u32, s: &SamplerParams, mask: Option<&[u32]>) {
        let mut params = Sample::pack(self.vocab, s);
        params.masked = u32::from(mask.is_some());
        let size = std::mem::size_of::<Params>() as u64;
        gpu.queue().write_buffer(
            &self.params.buffer,
            u64::from(slot) * size,
            bytemuck::bytes_of(&params),
        );
        if let Some(words) = mask {
            let full = self.vocab.div_ceil(32) as usize;
            let at = u64::from(slot) * full as u64 * 4;
            if words.len() >= full {
                gpu.queue().write_buffer(
                    &self.mask.buffer,
                    at,
                    bytemuck::cast_slice(&words[..full]),
                );
            } else {
                // A short mask forbids the rest of the vocabulary.
                let mut row = vec![0u32; full];
                row[..words.len()].copy_from_slice(words);
                gpu.queue()
                    .write_buffer(&self.mask.buffer, at, bytemuck::cast_slice(&row));
            }
        }
    }

    /// Samples the step's `rows` rows.
    pub fn encode(&self, rec: &mut Recorder<'_>, rows: u32) {
        rec.dispatch_xyz(&self.kernel, &self.bind_group, [rows, 1, 1]);
    }
}
