//! Tensor-core tile layouts (matmul_coop.wgsl) and the one each prompt product takes.

use super::flag;

/// A tensor-core tile layout (matmul_coop.wgsl): a `grid` of subgroups (along m, along n),
/// each owning `frags` 16×16 fragments (along m, along n), staging `depth` k (32 or 64) per
/// step between two barriers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopTile {
    pub grid: (u32, u32),
    pub frags: (u32, u32),
    pub depth: u32,
}

impl CoopTile {
    /// Output rows and columns of one tile.
    pub fn size(&self) -> (u32, u32) {
        (
            16 * self.grid.0 * self.frags.0,
            16 * self.grid.1 * self.frags.1,
        )
    }

    /// Subgroups whose fragments pass through workgroup memory at once in the epilogue: all
    /// of them, or half where 64-deep staging leaves room for no more (48 KiB on NVIDIA).
    fn epilogue_subgroups(&self) -> u32 {
        let subgroups = self.grid.0 * self.grid.1;
        if self.depth > 32 && subgroups.is_multiple_of(2) {
            subgroups / 2
        } else {
            subgroups
        }
    }

    /// Workgroup memory: the staged f16 tiles (rows of `depth` + 8 halves) and one f32
    /// fragment per epilogue subgroup.
    pub fn workgroup_bytes(&self) -> u32 {
        let (tm, tn) = self.size();
        (tm + tn) * (self.depth + 8) * 2 + self.epilogue_subgroups() * 1024
    }

    /// Whether the layout runs on `caps`' adapter: its invocations fit one workgroup and its
    /// tiles workgroup memory, and since a k step is staged eight k per invocation, every
    /// tile's rows are a whole number of passes of its invocations.
    pub fn fits(&self, caps: &crate::gpu::GpuCaps) -> bool {
        let threads = self.grid.0 * self.grid.1 * caps.subgroup_min_size;
        let (tm, tn) = self.size();
        let rows_per_pass = threads / (self.depth / 8);
        rows_per_pass > 0
            && threads <= caps.max_workgroup_invocations
            && threads <= caps.max_workgroup_size_x
            && tm.is_multiple_of(rows_per_pass)
            && tn.is_multiple_of(rows_per_pass)
            && self.workgroup_bytes() <= caps.max_workgroup_storage
    }

    pub(super) fn defines(&self, sg: u32) -> Vec<(&'static str, String)> {
        let (tm, tn) = self.size();
        let rows_per_pass = self.grid.0 * self.grid.1 * sg / (self.depth / 8);
        vec![
            ("BK", self.depth.to_string()),
            ("KSUB", (self.depth / 16).to_string()),
            ("OUT_SG", self.epilogue_subgroups().to_string()),
            flag(
                "OUT_SPLIT",
                self.epilogue_subgroups() < self.grid.0 * self.grid.1,
            ),
            ("GM", self.grid.0.to_string()),
            ("GN", self.grid.1.to_string()),
            ("WM", self.frags.0.to_string()),
            ("WN", self.frags.1.to_string()),
            ("TM", tm.to_string()),
            ("TN", tn.to_string()),
            ("SG", sg.to_string()),
            ("XN", (tm / rows_per_pass).to_string()),
            ("WG", (tn / rows_per_pass).to_string()),
        ]
    }
}

impl std::fmt::Display for CoopTile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (gm, gn) = self.grid;
        let (wm, wn) = self.frags;
        write!(f, "{gm}x{gn}/{wm}x{wn}")?;
        if self.depth != 32 {
            write!(f, "/{}", self.depth)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for CoopTile {
    type Err = String;

    /// `GMxGN/WMxWN[/DEPTH]`, e.g. `2x2/4x4` (four subgroups of 4×4 fragments: 128×128
    /// outputs, 32 k a step) or `4x4/2x2/64`.
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("a tensor-core tile is GMxGN/WMxWN[/32|/64], not {text}");
        let pair = |part: &str| -> Result<(u32, u32), String> {
            let (a, b) = part.split_once('x').ok_or_else(bad)?;
            Ok((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?))
        };
        let mut parts = text.split('/');
        let (Some(grid), Some(frags)) = (parts.next(), parts.next()) else {
            return Err(bad());
        };
        let depth = match parts.next() {
            None => 32,
            Some(d) => d.parse().map_err(|_| bad())?,
        };
        let (grid, frags) = (pair(grid)?, pair(frags)?);
        if [grid.0, grid.1, frags.0, frags.1].contains(&0)
            || ![32, 64].contains(&depth)
            || parts.next().is_some()
        {
            return Err(bad());
        }
        Ok(Self { grid, frags, depth })
    }
}

/// The rows of a product, as far as they are known when its kernel is built.
#[derive(Clone, Copy, Debug)]
pub(super) enum ProductRows {
    /// A prompt's tokens: any count from one up.
    Varying,
    /// The same count every call (or at least this many: long prompts), on a product that
    /// may split along k. (Unsplit, the wide
    /// tile leaves too few workgroups: Whisper small's 1500×768×768 takes 36. Whisper's
    /// encoders, whose products never split, ran 7–17 % slower on it.)
    Fixed(u32),
    /// A convolution's output pixels.
    Conv(u32),
    /// The same count every call, on a product that never splits along k (a speech
    /// encoder's window).
    Unsplit(u32),
}

/// Workgroups of the 512-invocation tiles that run at once on the GPU the tile rules were
/// measured on (an H200: 132 SMs, one such workgroup each).
const RESIDENT_WORKGROUPS: u32 = 132;

/// The tile of an unsplit product over `rows` fixed rows, by how evenly its workgroups fill
/// the GPU: the wide tile where its waves of workgroups take less than 1.8 times as many
/// 64-deep 128 × 128 tiles' waves (the ratio of their times per wave), 128 × 64 tiles where
/// 128 × 128 ones would leave half the GPU idle, else the 128 × 128 tile, 64 deep over k of
/// 768 or more (level with 32 deep at 1500×768×768 and 1500×2048×512) unless its tiles fit
/// one wave over k under 2048: there the halved epilogue of 64-deep steps shows (Whisper
/// large-v3-turbo's 1500×1280×1280 output product, in the model with its residual: 77 µs
/// against 68 at 32 deep, though `bench-gemm` has them level without it). Whisper's
/// encoder products on an H200 (`bench-gemm --split-target 1`, ms, the chosen tile against the
/// next best; every product's best):
/// - wide: 1500×5120×1280 0.184 against 0.202, 1500×2304×768 0.066 against 0.071,
///   1500×2048×512 0.050 against 0.057, 1500×1536×512 0.047 against 0.052;
/// - 64 deep: 1500×3840×1280 0.157 against 0.181 (wide), 1500×4096×1024 0.134 against 0.146,
///   1500×3072×1024 0.126 against 0.135, 1500×3072×768 0.106 against 0.109, 1500×1280×5120
///   0.174 against 0.210, 1500×1024×4096 0.141 against 0.169;
/// - 128 × 64: 1500×512×2048 0.062 against 0.073.
///
/// The wide tile stays for k of 512 or more (Whisper tiny's 1500×1152×384: 50 against 75
/// TFLOP/s, see `default_coop_tile`).
fn unsplit_tile(n: u32, k: u32, rows: u32) -> Option<CoopTile> {
    let waves = |tiles: u32| tiles.div_ceil(RESIDENT_WORKGROUPS);
    let row_tiles = rows.div_ceil(128);
    let wide_waves = waves(row_tiles * n.div_ceil(256));
    let square_tiles = row_tiles * n.div_ceil(128);
    if k >= 512 && 9 * wide_waves < 5 * waves(square_tiles) {
        Some(WIDE_TILE)
    } else if 2 * square_tiles <= RESIDENT_WORKGROUPS {
        Some(CoopTile {
            grid: (4, 2),
            frags: (2, 2),
            depth: 32,
        })
    } else {
        // One wave of 64-deep tiles ends on their halved epilogue with nothing to overlap it.
        let one_wave = square_tiles <= RESIDENT_WORKGROUPS && k < 2048;
        Some(CoopTile {
            grid: (4, 4),
            frags: (2, 2),
            depth: if k >= 768 && !one_wave { 64 } else { 32 },
        })
    }
}

/// The tensor-core tile for an `n`-wide product over `k` with `rows`. Each candidate falls
/// back to the next where the adapter's workgroups are too small for it.
///
/// - Tiles of 128 × 256 outputs, sixteen subgroups of 2×4 fragments, 32 k a step
///   (`WIDE_TILE`): convolutions of 256 or more channels over 256 or more pixels, and
///   products of 256 or more fixed rows (that may split along k) over k of 640 or more into
///   512 or more outputs. A subgroup loads six fragments for eight products instead of four
///   for four, and X is read half as often. Measured on an H200 (`backpack bench-gemm
///   --coop-tile`, TFLOP/s, against the tile chosen before): UNet convolutions
///   64×64×320→320 59 against 35, 32×32×640→640 66 against 50, 16×16×1280→1280 82 against
///   62; VAE 128×128×512→512 106 against 73, 256×256×256→256 100 against 71; 504×16384×2048
///   148 against 131, 504×1536×8960 115 against 89, 1500×2304×768 62 against 55.
///   SD-Turbo, old and new binary in one run (`bench-image`): VAE decode 50.4–50.7 → 37.3–37.7
///   ms, UNet step 26.7–27.1 → 24.8–25.6.
/// - Prompts (`Varying`) keep the tiles below: 64 rows run at half the speed on the wide tile
///   (64×16384×2048: 37 against 67 TFLOP/s). Prompts of `LONG_PROMPT_ROWS` or more take
///   the `Fixed` choice through a second pipeline (matmul.rs).
/// - Where the 64-deep steps below win, the wide tile does not: products over k under 4096
///   into fewer than 16,384 outputs keep them (504×6144×2048 101 against 87, 504×2048×2048
///   80 against 71, 1500×768×3072 72 against 70).
/// - Convolutions into fewer than 256 channels over many pixels take 256 × 128 tiles (the
///   VAE's last block, 512×512×128→128: 72 against 49).
/// - Otherwise 128 rows, and 128 columns when `n` fills such tiles well, else 64: sixteen
///   subgroups of 2×2 fragments where the adapter takes workgroups of 512 (8 of 2×2 for 64
///   columns), else four of 4×4 (4×2). Sixteen subgroups against four, same H200:
///   504×6144×2048 83 against 67, 1500×3072×768 52 against 42. The 128×128 tile stages 64 k
///   a step over k of 2048 or more (half the barriers per product): 504×2048×8192 86 against
///   104–108, 504×16384×2048 113–115 against 128–131. Shallower products measured slower 64
///   deep (1500×768×768: 35 against 32), as did products over k under 640 on the wide tile
///   (Whisper tiny's 1500×1152×384: 50 against 75; the UNet's 4096×320×320: 34 against 45).
pub(super) fn default_coop_tile(
    n: u32,
    k: u32,
    rows: ProductRows,
    caps: &crate::gpu::GpuCaps,
) -> CoopTile {
    let wide = n >= 1024 || (n >= 512 && n.is_multiple_of(128));
    let deep = wide && k >= 2048;
    let many = CoopTile {
        grid: (4, if wide { 4 } else { 2 }),
        frags: (2, 2),
        depth: if deep { 64 } else { 32 },
    };
    let shallow = CoopTile { depth: 32, ..many };
    let few = CoopTile {
        grid: (2, 2),
        frags: (4, if wide { 4 } else { 2 }),
        depth: 32,
    };
    let preferred = match rows {
        ProductRows::Conv(pixels) if pixels >= 1024 && n < 256 => Some(TALL_TILE),
        ProductRows::Conv(pixels) if pixels >= 256 && n >= 256 => Some(WIDE_TILE),
        ProductRows::Fixed(rows)
            if rows >= 256 && k >= 640 && n >= 512 && !(deep && n < 16384 && k < 4096) =>
        {
            Some(WIDE_TILE)
        }
        ProductRows::Unsplit(rows) if rows >= 256 => unsplit_tile(n, k, rows),
        _ => None,
    };
    preferred
        .into_iter()
        .chain([many, shallow])
        .find(|tile| tile.fits(caps))
        .unwrap_or(few)
}

/// 128 × 256 outputs: sixteen subgroups of 2×4 fragments (see `default_coop_tile`).
const WIDE_TILE: CoopTile = CoopTile {
    grid: (4, 4),
    frags: (2, 4),
    depth: 32,
};

/// 256 × 128 outputs: sixteen subgroups of 4×2 fragments (see `default_coop_tile`).
const TALL_TILE: CoopTile = CoopTile {
    grid: (4, 4),
    frags: (4, 2),
    depth: 32,
};

/// `BACKPACK_COOP_TILE=GMxGN/WMxWN[/32|/64]` forces one tensor-core tile on every prompt
/// product, for measuring layouts in a whole model (`backpack bench`); malformed values are
/// ignored.
pub(super) fn coop_tile_from_env() -> Option<CoopTile> {
    std::env::var("BACKPACK_COOP_TILE")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The smallest workgroup memory the tensor-core tiles need (the four-subgroup 128×128 tile).
pub(crate) const COOP_MIN_WORKGROUP_BYTES: u32 = 24 * 1024;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An adapter like NVIDIA's: subgroups of 32, 48 KiB of workgroup memory.
    pub(crate) fn nvidia_caps(workgroup_invocations: u32) -> crate::gpu::GpuCaps {
        crate::gpu::GpuCaps {
            shader_f16: true,
            subgroups: true,
            subgroup_min_size: 32,
            subgroup_max_size: 32,
            timestamps: true,
            max_storage_binding: 1 << 31,
            max_buffer: 1 << 32,
            max_workgroup_storage: 48 * 1024,
            max_workgroup_invocations: workgroup_invocations,
            max_workgroup_size_x: workgroup_invocations,
            runtime_checks: false,
            cooperative_matrix: true,
        }
    }

    #[test]
    fn default_tiles_follow_the_measured_shapes() {
        let caps = nvidia_caps(1024);
        let pick = |n, k, rows| default_coop_tile(n, k, rows, &caps).to_string();
        let fixed = ProductRows::Fixed(1500);
        // Wide products of many rows over deep enough k, and the 64-deep steps where they won.
        assert_eq!(pick(16384, 2048, fixed), "4x4/2x4");
        assert_eq!(pick(1536, 8960, fixed), "4x4/2x4");
        assert_eq!(pick(2304, 768, fixed), "4x4/2x4");
        assert_eq!(pick(6144, 2048, fixed), "4x4/2x2/64");
        assert_eq!(pick(768, 3072, fixed), "4x4/2x2/64");
        assert_eq!(pick(1152, 384, fixed), "4x4/2x2");
        assert_eq!(pick(384, 1536, fixed), "4x2/2x2");
        // Prompts and few rows keep the narrower tiles.
        assert_eq!(pick(16384, 2048, ProductRows::Varying), "4x4/2x2/64");
        assert_eq!(pick(2304, 768, ProductRows::Varying), "4x4/2x2");
        assert_eq!(pick(2304, 768, ProductRows::Fixed(77)), "4x4/2x2");
        // Unsplit products over a speech encoder's window: by how their tiles fill the GPU.
        let window = ProductRows::Unsplit(1500);
        assert_eq!(pick(5120, 1280, window), "4x4/2x4");
        assert_eq!(pick(2304, 768, window), "4x4/2x4");
        assert_eq!(pick(1536, 512, window), "4x4/2x4");
        assert_eq!(pick(3840, 1280, window), "4x4/2x2/64");
        assert_eq!(pick(3072, 768, window), "4x4/2x2/64");
        assert_eq!(pick(1280, 5120, window), "4x4/2x2/64");
        assert_eq!(pick(1152, 384, window), "4x4/2x2");
        assert_eq!(pick(1280, 1280, window), "4x4/2x2");
        assert_eq!(pick(512, 2048, window), "4x2/2x2");
        // Convolutions: by channels and output pixels.
        assert_eq!(pick(320, 2880, ProductRows::Conv(4096)), "4x4/2x4");
        assert_eq!(pick(128, 1152, ProductRows::Conv(262_144)), "4x4/4x2");
        assert_eq!(pick(1280, 11520, ProductRows::Conv(64)), "4x4/2x2/64");
        for tile in [WIDE_TILE, TALL_TILE] {
            assert!(tile.fits(&caps), "{tile}");
        }
        // Workgroups of 256 invocations take the four-subgroup tiles.
        let small = nvidia_caps(256);
        assert_eq!(
            default_coop_tile(16384, 2048, fixed, &small).to_string(),
            "2x2/4x4"
        );
        assert_eq!(
            default_coop_tile(128, 1152, ProductRows::Conv(262_144), &small).to_string(),
            "4x2/2x2"
        );
    }
}
