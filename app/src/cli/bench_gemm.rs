//! `backpack bench-gemm`: the prompt product alone, at the shapes the models run, on the
//! tensor-core tiles and the SIMT tiles of the same device, so kernel work can be measured
//! without a model around it; with `--decode`, the one-token product (mat-vec) instead, as a
//! chain of dependent dispatches like a decode step's.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use backpack_engine::gpu::{Gpu, Recorder};
use backpack_engine::load::quant::random_blocks;
use backpack_engine::ops::{
    Conv2dShape, CoopTile, MatMul, MatMulOptions, MatVec, MatVecOptions, Matrix, StepParams,
    WeightDType,
};
use clap::Args;

use super::QuantArg;

#[derive(Args)]
pub struct BenchGemmArgs {
    /// Products as M×N×K (rows × outputs × inner), e.g. 504x2048x2048; a convolution as
    /// conv:H×W×CIN→COUT (3×3, stride 1, padding 1), e.g. conv:64x64x320x320. Defaults to a
    /// set of LLM prefill, UNet and Whisper encoder shapes.
    #[arg(long = "shape")]
    shapes: Vec<String>,
    /// Weight format: f16 (default) or a block format.
    #[arg(long, value_enum, default_value = "f16")]
    quant: QuantArg,
    /// 128-wide tiles (as the image networks use for large products).
    #[arg(long)]
    big: bool,
    /// On a CPU adapter, the GPU's SIMT tiles (as --big picks) instead of the CPU tiles.
    #[arg(long)]
    gpu_tiles: bool,
    /// Workgroups a split product aims for (the engine's default: 256); a large value splits
    /// every product as much as one of a single row tile.
    #[arg(long)]
    split_target: Option<u32>,
    /// Tensor-core tile layouts to time, each as GMxGN/WMxWN: a grid of subgroups and the
    /// 16×16 fragments each owns (e.g. 2x2/4x4, 4x4/2x2). Defaults to the one the engine picks
    /// for each product.
    #[arg(long = "coop-tile")]
    coop_tiles: Vec<CoopTile>,
    /// The engine's tiles for M fixed rows, as the image networks build them, instead of
    /// those for prompts (whose length varies).
    #[arg(long)]
    fixed_rows: bool,
    /// Timed repetitions per shape (the median is reported).
    #[arg(long, default_value_t = 20)]
    runs: u32,
    /// Time the decode product (one token) instead; shapes are N×K (outputs × inner), e.g.
    /// 2048x8192. The layout can be forced with BACKPACK_MATVEC (see the engine's MatVec).
    #[arg(long)]
    decode: bool,
    /// With --decode: rotate through copies of the weights totalling at least 256 MB, so that
    /// each product reads them from memory rather than from the GPU's cache, as in a model.
    #[arg(long, requires = "decode")]
    cold: bool,
}

const DEFAULT_DECODE_SHAPES: &[&str] = &[
    "32x256",
    "6144x2048",
    "16384x2048",
    "2048x8192",
    "2048x2048",
    "49152x2048",
];

const DEFAULT_SHAPES: &[&str] = &[
    "504x2048x2048",
    "504x8192x2048",
    "504x2048x8192",
    "1500x768x768",
    "1500x3072x768",
    "4096x320x320",
    "conv:64x64x320x320",
    "conv:32x32x640x640",
    "conv:16x16x1280x1280",
];

enum Shape {
    Product { m: u32, n: u32, k: u32 },
    Conv(Conv2dShape, u32),
}

impl Shape {
    fn parse(text: &str) -> Result<Self> {
        let nums = |s: &str| -> Result<Vec<u32>> {
            s.split(['x', '×'])
                .map(|v| v.trim().parse::<u32>().context("a positive number"))
                .collect()
        };
        if let Some(rest) = text.strip_prefix("conv:") {
            let v = nums(rest)?;
            let [h, w, cin, cout] = v[..] else {
                bail!("conv shapes are conv:HxWxCINxCOUT, not {text}");
            };
            return Ok(Self::Conv(
                Conv2dShape::new(h, w, cin, 3, 1, 1, false),
                cout,
            ));
        }
        let v = nums(text)?;
        let [m, n, k] = v[..] else {
            bail!("product shapes are MxNxK, not {text}");
        };
        Ok(Self::Product { m, n, k })
    }

    /// (rows, outputs, inner).
    fn mnk(&self) -> (u32, u32, u32) {
        match self {
            Self::Product { m, n, k } => (*m, *n, *k),
            Self::Conv(c, cout) => (c.out_h() * c.out_w, *cout, c.width()),
        }
    }
}

pub fn run(args: BenchGemmArgs, adapter: Option<&str>) -> Result<()> {
    let gpu = super::open_gpu(adapter)?;
    if args.decode {
        return run_decode(&gpu, &args);
    }
    let texts: Vec<String> = if args.shapes.is_empty() {
        DEFAULT_SHAPES.iter().map(|s| s.to_string()).collect()
    } else {
        args.shapes.clone()
    };
    let simt = if gpu.is_software() && !args.gpu_tiles {
        "cpu tiles"
    } else {
        "simt"
    };
    // (label, device, tensor-core tile): the SIMT tiles unless tiles were named, then the
    // tensor-core tiles the engine picks or each named one.
    let mut paths: Vec<(String, Gpu, Option<CoopTile>)> = Vec::new();
    if args.coop_tiles.is_empty() {
        paths.push((simt.to_owned(), gpu.without_cooperative_matrix(), None));
    }
    if gpu.caps().cooperative_matrix {
        if args.coop_tiles.is_empty() {
            paths.push(("tensor cores".to_owned(), gpu.clone(), None));
        }
        for tile in &args.coop_tiles {
            paths.push((format!("tensor cores {tile}"), gpu.clone(), Some(*tile)));
        }
    } else if !args.coop_tiles.is_empty() {
        bail!("--coop-tile needs an adapter with cooperative matrices");
    }
    for text in &texts {
        let shape = Shape::parse(text)?;
        for (name, gpu, tile) in &paths {
            let ms = time_product(gpu, &shape, &args, *tile)?;
            let (m, n, k) = shape.mnk();
            let tflops = 2.0 * f64::from(m) * f64::from(n) * f64::from(k) / (ms * 1e-3) / 1e12;
            println!("{text:>22}  {name:<12}  {ms:8.3} ms  {tflops:9.3} TFLOP/s");
        }
    }
    Ok(())
}

/// Random `n`×`k` weights in the benchmarked format.
fn weights(gpu: &Gpu, quant: QuantArg, n: u32, k: u32) -> Result<Matrix> {
    Ok(match quant.block_format() {
        Some(ty) => {
            let blocks = random_blocks(ty, n as usize * k as usize / ty.block_elems(), 7);
            Matrix::from_blocks(gpu, "w", ty, &blocks, n, k)?
        }
        None => {
            let data: Vec<f32> = (0..n as usize * k as usize)
                .map(|i| ((i.wrapping_mul(2_654_435_761) >> 9) % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            Matrix::from_f32(gpu, "w", &data, n, k, WeightDType::F16)?
        }
    })
}

/// Decode products: µs per product in a chain of dependent dispatches (the dispatch's own
/// cost included, as in a decode step; the 32×256 shape shows that floor) and the weight
/// read rate.
fn run_decode(gpu: &Gpu, args: &BenchGemmArgs) -> Result<()> {
    let texts: Vec<String> = if args.shapes.is_empty() {
        DEFAULT_DECODE_SHAPES
            .iter()
            .map(|s| s.to_string())
            .collect()
    } else {
        args.shapes.clone()
    };
    const CHAIN: u32 = 100;
    for text in &texts {
        let dims: Vec<u32> = text
            .split(['x', '×'])
            .map(|v| v.trim().parse::<u32>())
            .collect::<Result<_, _>>()
            .with_context(|| format!("decode shapes are NxK, not {text}"))?;
        let [n, k] = dims[..] else {
            bail!("decode shapes are NxK, not {text}");
        };
        let w = weights(gpu, args.quant, n, k)?;
        let copies = if args.cold {
            (256u64 << 20)
                .div_ceil(w.buffer.size)
                .clamp(1, u64::from(CHAIN)) as usize
        } else {
            1
        };
        let ws: Vec<_> = std::iter::once(Ok(w))
            .chain((1..copies).map(|_| weights(gpu, args.quant, n, k)))
            .collect::<Result<_>>()?;
        let x = gpu.storage("x", u64::from(k) * 4)?;
        let y = gpu.storage("y", u64::from(n) * 4)?;
        let step = gpu.uniform("step", &StepParams::new(0, 1));
        let ops = ws
            .iter()
            .map(|w| MatVec::new(gpu, w, &x, &y, &step, MatVecOptions::default()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut times = Vec::new();
        for _ in 0..=args.runs.max(1) {
            let start = Instant::now();
            let mut rec = Recorder::new(gpu);
            for op in ops.iter().cycle().take(CHAIN as usize) {
                op.encode(&mut rec);
            }
            rec.submit();
            gpu.wait()?;
            times.push(start.elapsed().as_secs_f64() * 1e6 / f64::from(CHAIN));
        }
        times.remove(0); // warm-up
        times.sort_by(f64::total_cmp);
        let us = times[times.len() / 2];
        let gbs = ws[0].buffer.size as f64 / (us * 1e-6) / 1e9;
        println!("{text:>22}  decode        {us:8.2} µs  {gbs:7.0} GB/s");
    }
    Ok(())
}

fn time_product(
    gpu: &Gpu,
    shape: &Shape,
    args: &BenchGemmArgs,
    coop_tile: Option<CoopTile>,
) -> Result<f64> {
    let (m, n, k) = shape.mnk();
    let weights = weights(gpu, args.quant, n, k)?;
    let input_len = match shape {
        Shape::Product { .. } => u64::from(m) * u64::from(k),
        Shape::Conv(c, _) => u64::from(c.in_h) * u64::from(c.in_w) * u64::from(c.cin),
    };
    let x = gpu.storage("x", input_len * 4)?;
    let y = gpu.storage("y", u64::from(m) * u64::from(n) * 4)?;
    let scratch = gpu.storage("scratch", MatMul::scratch_bytes(n, k, m).max(4))?;
    let step = gpu.uniform("step", &StepParams::new(0, m));
    let op = MatMul::new(
        gpu,
        &weights,
        &x,
        &y,
        &step,
        MatMulOptions {
            split_scratch: Some((&scratch, m)),
            conv: match shape {
                Shape::Conv(c, _) => Some(*c),
                Shape::Product { .. } => None,
            },
            big_tiles: Some(args.big),
            cpu_tiles: Some(!args.gpu_tiles),
            split_target: args.split_target,
            coop_tile,
            rows: args.fixed_rows.then_some(m),
            ..Default::default()
        },
    )?;
    // Enough products per submission that the submission's own cost (tens of µs) stays
    // small beside them, and a warm-up of about a quarter second first: a GPU that was idle
    // runs at a low clock for a while, which made short runs of one setting differ by 1.8×.
    let submit = |count: u32| -> Result<f64> {
        let start = Instant::now();
        let mut rec = Recorder::new(gpu);
        for _ in 0..count {
            op.encode(&mut rec, m);
        }
        rec.submit();
        gpu.wait()?;
        Ok(start.elapsed().as_secs_f64() * 1e3)
    };
    let probe = submit(10)? / 10.0;
    let count = (5.0 / probe.max(1e-3)).ceil().clamp(10.0, 2000.0) as u32;
    let warm_until = Instant::now() + std::time::Duration::from_millis(250);
    while Instant::now() < warm_until {
        submit(count)?;
    }
    let mut times = (0..args.runs.max(1))
        .map(|_| Ok(submit(count)? / f64::from(count)))
        .collect::<Result<Vec<f64>>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
