//! A quick check that this GPU runs Backpack's kernels correctly: a few products and the
//! sampler against plain CPU references, on fixed pseudo-random inputs of awkward sizes. Used by
//! `backpack --self-test` for users and support.

use crate::gpu::{Gpu, Recorder};
use crate::load::GgmlType;
use crate::load::quant::{dequantize, quantize_q8_0};
use crate::ops::{
    MatVec, MatVecOptions, Matrix, NormKind, Sample, SamplerParams, StepParams, WeightDType,
    int8_rounded_input,
};

/// One check: what ran, whether it matched, and the largest error seen.
#[derive(Clone, Debug)]
pub struct Check {
    pub name: &'static str,
    pub passed: bool,
    pub detail: String,
}

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| v * r * g).collect()
}

fn product(w: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows)
        .map(|r| {
            w[r * cols..(r + 1) * cols]
                .iter()
                .zip(x)
                .map(|(a, b)| a * b)
                .sum()
        })
        .collect()
}

/// Largest |got − want| relative to the largest |want|.
fn worst_error(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs() / scale))
}

/// A product to check: the matrix on the GPU and the same values on the host.
struct ProductCase<'a> {
    name: &'static str,
    w: Matrix,
    host_w: &'a [f32],
    rows: usize,
    cols: usize,
    /// Fuse an RMSNorm in front, as the decoder's QKV and gate/up products do.
    norm: bool,
}

fn matvec_check(gpu: &Gpu, case: ProductCase<'_>, rng: &mut Lcg) -> Result<Check, crate::Error> {
    let ProductCase {
        name,
        w,
        host_w,
        rows,
        cols,
        norm,
    } = case;
    let x = rng.vec(cols);
    let gain = rng.vec(cols);
    let xb = gpu.storage_from("self-test x", &x)?;
    let yb = gpu.storage_from("self-test y", &vec![0.0f32; rows])?;
    let gb = gpu.storage_from("self-test gain", &gain)?;
    let step = gpu.uniform("self-test step", &StepParams::new(0, 1));
    let op = MatVec::new(
        gpu,
        &w,
        &xb,
        &yb,
        &step,
        MatVecOptions {
            norm: norm.then_some((NormKind::Rms, &gb, None, 1e-5)),
            ..Default::default()
        },
    )?;
    let mut rec = Recorder::new(gpu);
    op.encode(&mut rec);
    rec.submit();
    let got: Vec<f32> = gpu.read(&yb.buffer, 0, rows as u64)?;
    let input = if norm { rms_norm(&x, &gain, 1e-5) } else { x };
    // Block formats multiply an int8 copy of the input: the reference rounds it the same way.
    let input = if op.takes_int8() {
        int8_rounded_input(&input)
    } else {
        input
    };
    let want = product(host_w, &input, rows, cols);
    let err = worst_error(&got, &want);
    Ok(Check {
        name,
        passed: err < 2e-3,
        detail: format!("{rows}×{cols}, worst relative error {err:.1e}"),
    })
}

fn sampler_check(gpu: &Gpu, rng: &mut Lcg) -> Result<Check, crate::Error> {
    let vocab = 50_257usize;
    let mut logits = rng.vec(vocab);
    let top = 31_337usize;
    logits[top] = 4.0;
    logits[vocab - 1] = 4.0; // a later tie must lose
    let mut padded = logits.clone();
    padded.resize(vocab.div_ceil(4) * 4, 1e30);
    let lb = gpu.storage_from("self-test logits", &padded)?;
    let hb = gpu.storage_from("self-test history", &[0u32, 0])?;
    let seen = gpu.storage_from("self-test seen", &vec![1u32; vocab.div_ceil(32)])?;
    let step = gpu.uniform("self-test step", &StepParams::new(0, 1));
    let op = Sample::new(gpu, vocab as u32, &lb, &hb, &seen, &step)?;
    op.set(gpu, &SamplerParams::default());
    let mut rec = Recorder::new(gpu);
    op.encode(&mut rec);
    rec.submit();
    let got: Vec<u32> = gpu.read(&hb.buffer, 1, 1)?;
    Ok(Check {
        name: "greedy sampler (argmax, lowest index on ties)",
        passed: got[0] as usize == top,
        detail: format!("vocabulary {vocab}: picked {}, expected {top}", got[0]),
    })
}

/// Runs every check; an error means the GPU could not run them at all.
pub fn run(gpu: &Gpu) -> Result<Vec<Check>, crate::Error> {
    let mut rng = Lcg(0x5eed);
    let mut checks = Vec::new();

    let (rows, cols) = (37, 300);
    let w = rng.vec(rows * cols);
    let host: Vec<f32> = w.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect();
    let m = Matrix::from_f32(
        gpu,
        "self-test f16",
        &w,
        rows as u32,
        cols as u32,
        WeightDType::F16,
    )?;
    checks.push(matvec_check(
        gpu,
        ProductCase {
            name: "f16 matrix-vector product with fused RMSNorm",
            w: m,
            host_w: &host,
            rows,
            cols,
            norm: true,
        },
        &mut rng,
    )?);

    let (rows, cols) = (19, 256);
    let w = rng.vec(rows * cols);
    let mut blocks = Vec::new();
    quantize_q8_0(&w, &mut blocks);
    let mut host = vec![0.0f32; rows * cols];
    dequantize(GgmlType::Q8_0, &blocks, &mut host);
    let m = Matrix::from_blocks(
        gpu,
        "self-test q8_0",
        GgmlType::Q8_0,
        &blocks,
        rows as u32,
        cols as u32,
    )?;
    checks.push(matvec_check(
        gpu,
        ProductCase {
            name: "Q8_0 dequantize-and-multiply",
            w: m,
            host_w: &host,
            rows,
            cols,
            norm: false,
        },
        &mut rng,
    )?);

    checks.push(sampler_check(gpu, &mut rng)?);
    Ok(checks)
}
