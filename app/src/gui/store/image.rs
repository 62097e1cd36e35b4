//! What the Image panel keeps in `state.json`: the image model, the prompt and every setting
//! of the next generation; and the image sizes offered for a model.

use std::path::{Path, PathBuf};

use backpack_engine::models::diffusion::{ImageDefaults, SchedulerKind};
use serde::{Deserialize, Serialize};

use crate::image_files::ParsedParameters;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImageSettings {
    pub last_model: Option<PathBuf>,
    /// Most recent first.
    pub recent_models: Vec<PathBuf>,
    /// The model whose defaults the settings below started from: loading another one resets
    /// size, steps, guidance and scheduler to its own.
    pub defaults_for: Option<PathBuf>,
    pub prompt: String,
    pub negative: String,
    pub width: u32,
    pub height: u32,
    pub steps: u32,
    pub guidance: f32,
    /// The scheduler's name ([`SchedulerKind::name`]).
    pub scheduler: String,
    /// The seed of the next image (with random on, the one the last Generate drew).
    pub seed: u64,
    /// Draw a new seed for every Generate.
    pub random_seed: bool,
    /// Images per Generate (seeds `seed`, `seed + 1`, …).
    pub batch: u32,
    /// Image-to-image: how much of the start image is replaced (1: all of it).
    pub strength: f32,
}

impl Default for ImageSettings {
    fn default() -> Self {
        Self {
            last_model: None,
            recent_models: Vec::new(),
            defaults_for: None,
            prompt: String::new(),
            negative: String::new(),
            width: 512,
            height: 512,
            steps: 25,
            guidance: 7.5,
            scheduler: SchedulerKind::Euler.name().into(),
            seed: 0,
            random_seed: true,
            batch: 1,
            strength: 0.75,
        }
    }
}

impl ImageSettings {
    pub fn remember_model(&mut self, path: &Path) {
        self.recent_models.retain(|p| p != path);
        self.recent_models.insert(0, path.to_owned());
        self.recent_models.truncate(10);
        self.last_model = Some(path.to_owned());
    }

    pub fn scheduler_kind(&self) -> SchedulerKind {
        self.scheduler.parse().unwrap_or(SchedulerKind::Euler)
    }

    /// The model at `path` was loaded: unless the settings were made for it already, they
    /// start from what it ships with.
    pub fn adopt_defaults(&mut self, path: &Path, defaults: &ImageDefaults) {
        if self.defaults_for.as_deref() == Some(path) {
            return;
        }
        self.defaults_for = Some(path.to_owned());
        self.width = defaults.width;
        self.height = defaults.height;
        self.steps = defaults.steps.max(1);
        self.guidance = defaults.guidance;
        self.scheduler = defaults.scheduler.name().into();
    }

    /// Fills the settings from an image's parameters; its seed is kept fixed so the same
    /// image can be made again.
    pub fn reuse(&mut self, p: &ParsedParameters) {
        self.prompt = p.prompt.clone();
        self.negative = p.negative.clone();
        if let Some(steps) = p.steps {
            self.steps = steps.max(1);
        }
        if let Some(guidance) = p.guidance {
            self.guidance = guidance;
        }
        if let Some(seed) = p.seed {
            self.seed = seed;
            self.random_seed = false;
        }
        if let Some((w, h)) = p.size {
            (self.width, self.height) = (w, h);
        }
        if let Some(kind) = p.scheduler {
            self.scheduler = kind.name().into();
        }
    }
}

/// Sizes offered for a model whose default image is `default` and whose sides must be
/// multiples of `step`: the default first, then the usual squares, portraits and landscapes.
/// Small models (test and toy pipelines) get multiples of their own size instead.
pub fn size_presets(default: (u32, u32), step: u32) -> Vec<(u32, u32)> {
    let step = step.max(1);
    let side = default.0.min(default.1);
    let candidates: Vec<(u32, u32)> = if side >= 512 {
        vec![
            (512, 512),
            (768, 768),
            (1024, 1024),
            (512, 768),
            (768, 512),
            (768, 1024),
            (1024, 768),
            (832, 1216),
            (1216, 832),
        ]
    } else {
        let d = side.max(step);
        vec![
            (2 * d, 2 * d),
            (4 * d, 4 * d),
            (2 * d, 3 * d),
            (3 * d, 2 * d),
        ]
    };
    let mut out = vec![default];
    for size in candidates {
        if size.0.is_multiple_of(step) && size.1.is_multiple_of(step) && !out.contains(&size) {
            out.push(size);
        }
    }
    out
}

/// "768 × 512 landscape", "512 × 512 (default)".
pub fn size_label(size: (u32, u32), default: Option<(u32, u32)>) -> String {
    let (w, h) = size;
    let shape = match w.cmp(&h) {
        std::cmp::Ordering::Less => " portrait",
        std::cmp::Ordering::Greater => " landscape",
        std::cmp::Ordering::Equal => "",
    };
    let default = if default == Some(size) {
        " (default)"
    } else {
        ""
    };
    format!("{w} × {h}{shape}{default}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_follow_the_model() {
        let sd = size_presets((512, 512), 64);
        assert_eq!(sd[0], (512, 512));
        assert!(sd.contains(&(768, 512)) && sd.contains(&(1024, 1024)));
        let xl = size_presets((1024, 1024), 64);
        assert_eq!(xl[0], (1024, 1024));
        assert_eq!(xl.iter().filter(|s| **s == (1024, 1024)).count(), 1);
        let tiny = size_presets((64, 64), 16);
        assert_eq!(
            tiny,
            vec![(64, 64), (128, 128), (256, 256), (128, 192), (192, 128)]
        );
        assert!(size_presets((64, 64), 64).iter().all(|s| s.0 % 64 == 0));
        assert_eq!(size_label((768, 512), None), "768 × 512 landscape");
        assert_eq!(size_label((64, 64), Some((64, 64))), "64 × 64 (default)");
    }

    #[test]
    fn reused_parameters_fix_the_seed() {
        let mut s = ImageSettings::default();
        s.reuse(&ParsedParameters {
            prompt: "a red fox".into(),
            steps: Some(2),
            seed: Some(42),
            size: Some((64, 64)),
            scheduler: Some(SchedulerKind::Lcm),
            ..Default::default()
        });
        assert_eq!((s.prompt.as_str(), s.steps, s.seed), ("a red fox", 2, 42));
        assert!(!s.random_seed);
        assert_eq!((s.width, s.height), (64, 64));
        assert_eq!(s.scheduler_kind(), SchedulerKind::Lcm);
    }
}
