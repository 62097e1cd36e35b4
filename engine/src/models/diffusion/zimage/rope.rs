//! Z-Image's token positions and their RoPE angles. Positions are (caption index, row,
//! column) triples laid out as diffusers' `patchify_and_embed` lays them out: caption token i
//! at (1 + i, 0, 0) over the padded caption (its padding continues the count), the image's
//! patches at (padded caption + 1, row, column), and the image's padding at (0, 0, 0).

use super::transformer::padded;

pub struct Positions {
    pub caption_padded: u32,
    pub image_tokens: u32,
    pub image_padded: u32,
    /// Patches per column and row.
    grid: (u32, u32),
}

impl Positions {
    pub fn new(caption_tokens: u32, grid: (u32, u32)) -> Self {
        let image_tokens = grid.0 * grid.1;
        Self {
            caption_padded: padded(caption_tokens),
            image_tokens,
            image_padded: padded(image_tokens),
            grid,
        }
    }

    pub fn caption(&self) -> Vec<[u32; 3]> {
        (0..self.caption_padded).map(|i| [1 + i, 0, 0]).collect()
    }

    pub fn image(&self) -> Vec<[u32; 3]> {
        let first = self.caption_padded + 1;
        let (rows, cols) = self.grid;
        let patches = (0..rows).flat_map(|r| (0..cols).map(move |c| [first, r, c]));
        let padding = (self.image_tokens..self.image_padded).map(|_| [0, 0, 0]);
        patches.chain(padding).collect()
    }

    /// The main blocks' sequence: the image's tokens, then the caption's.
    pub fn joint(&self) -> Vec<[u32; 3]> {
        let mut ids = self.image();
        ids.extend(self.caption());
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_as_diffusers_lays_them_out() {
        // A 3-token caption pads to 32; a 2×3 patch grid (6 tokens) pads to 32.
        let p = Positions::new(3, (2, 3));
        let cap = p.caption();
        assert_eq!(cap.len(), 32);
        assert_eq!((cap[0], cap[31]), ([1, 0, 0], [32, 0, 0]));
        let img = p.image();
        assert_eq!(img.len(), 32);
        assert_eq!(&img[..4], &[[33, 0, 0], [33, 0, 1], [33, 0, 2], [33, 1, 0]]);
        assert_eq!(img[6], [0, 0, 0]);
        assert_eq!(p.joint().len(), 64);
    }
}
