//! Linear latent → RGB maps for live previews without a decoder: one row of RGB weights per
//! latent channel and a bias, giving RGB in −1..1 (least-squares fits of each VAE's output on
//! its latents, as image tools ship them for sampler previews). Data, not code: ComfyUI's
//! `comfy/latent_formats.py` (`SD15`, `SDXL`, `Flux`, `Flux2`).

/// A map's rows (one per latent channel) and its bias.
pub struct PreviewMap {
    pub rows: &'static [[f32; 3]],
    pub bias: [f32; 3],
}

/// Stable Diffusion 1.x/2.x, on the scaled latent the UNet sees.
pub const SD: PreviewMap = PreviewMap {
    rows: &[
        [0.3512, 0.2297, 0.3227],
        [0.3250, 0.4974, 0.2350],
        [-0.2829, 0.1762, 0.2721],
        [-0.2120, -0.2616, -0.7177],
    ],
    bias: [0.0, 0.0, 0.0],
};

/// SDXL, on the scaled latent the UNet sees.
pub const SDXL: PreviewMap = PreviewMap {
    rows: &[
        [0.3651, 0.4232, 0.4341],
        [-0.2533, -0.0042, 0.1068],
        [0.1076, 0.1111, -0.0362],
        [-0.3165, -0.2492, -0.2188],
    ],
    bias: [0.1084, -0.0175, -0.0011],
};

/// The Flux VAE's 16 channels (Z-Image), on the latent as the transformer sees it:
/// `(z − shift_factor)·scaling_factor`.
pub const FLUX: PreviewMap = PreviewMap {
    rows: &[
        [-0.0346, 0.0244, 0.0681],
        [0.0034, 0.0210, 0.0687],
        [0.0275, -0.0668, -0.0433],
        [-0.0174, 0.0160, 0.0617],
        [0.0859, 0.0721, 0.0329],
        [0.0004, 0.0383, 0.0115],
        [0.0405, 0.0861, 0.0915],
        [-0.0236, -0.0185, -0.0259],
        [-0.0245, 0.0250, 0.1180],
        [0.1008, 0.0755, -0.0421],
        [-0.0515, 0.0201, 0.0011],
        [0.0428, -0.0012, -0.0036],
        [0.0817, 0.0765, 0.0749],
        [-0.1264, -0.0522, -0.1103],
        [-0.0280, -0.0881, -0.0499],
        [-0.1262, -0.0982, -0.0778],
    ],
    bias: [-0.0329, -0.0718, -0.0851],
};

/// The FLUX.2 VAE's 32 channels, on the batch-norm-normalised latent the transformer sees,
/// unpacked from its 2×2 patches.
pub const FLUX2: PreviewMap = PreviewMap {
    rows: &[
        [0.0058, 0.0113, 0.0073],
        [0.0495, 0.0443, 0.0836],
        [-0.0099, 0.0096, 0.0644],
        [0.2144, 0.3009, 0.3652],
        [0.0166, -0.0039, -0.0054],
        [0.0157, 0.0103, -0.0160],
        [-0.0398, 0.0902, -0.0235],
        [-0.0052, 0.0095, 0.0109],
        [-0.3527, -0.2712, -0.1666],
        [-0.0301, -0.0356, -0.0180],
        [-0.0107, 0.0078, 0.0013],
        [0.0746, 0.0090, -0.0941],
        [0.0156, 0.0169, 0.0070],
        [-0.0034, -0.0040, -0.0114],
        [0.0032, 0.0181, 0.0080],
        [-0.0939, -0.0008, 0.0186],
        [0.0018, 0.0043, 0.0104],
        [0.0284, 0.0056, -0.0127],
        [-0.0024, -0.0022, -0.0030],
        [0.1207, -0.0026, 0.0065],
        [0.0128, 0.0101, 0.0142],
        [0.0137, -0.0072, -0.0007],
        [0.0095, 0.0092, -0.0059],
        [0.0000, -0.0077, -0.0049],
        [-0.0465, -0.0204, -0.0312],
        [0.0095, 0.0012, -0.0066],
        [0.0290, -0.0034, 0.0025],
        [0.0220, 0.0169, -0.0048],
        [-0.0332, -0.0457, -0.0468],
        [-0.0085, 0.0389, 0.0609],
        [-0.0076, 0.0003, -0.0043],
        [-0.0111, -0.0460, -0.0614],
    ],
    bias: [-0.0329, -0.0718, -0.0851],
};

/// The map for a latent of `channels`, if one is known: the UNet families pick theirs by
/// name; 16 channels are the Flux VAE's, 32 the FLUX.2 VAE's.
pub fn for_channels(channels: u32) -> Option<&'static PreviewMap> {
    match channels {
        16 => Some(&FLUX),
        32 => Some(&FLUX2),
        _ => None,
    }
}
