//! The linear previews of a diffusion transformer at its published latent channels: the tiny
//! fixture's config edited to those channels, loaded with random weights.

use backpack_engine::models::diffusion::{
    DiffusionModel, ImageModelOptions, ImageParams, SchedulerKind,
};
use backpack_engine::ops::WeightDType;
use serde_json::Value;

use crate::common::{gpu, texture_rgba};
use crate::goldens::root;
use crate::temp_dir::{TempDir, copy_dir};

/// Copies the fixture `name`, sets each `(file, key, value)`, loads it with random weights and
/// checks that a 32×32 image's previews take the linear map at `texture`'s size, a new picture
/// each step.
pub fn check_linear_previews(name: &str, edits: &[(&str, &str, u32)], texture: (u32, u32)) {
    let dir = TempDir::new("linear-preview");
    copy_dir(&root().join("tests/fixtures/models").join(name), &dir);
    for (file, key, value) in edits {
        let path = dir.join(file);
        let mut v: Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        v[*key] = (*value).into();
        std::fs::write(&path, v.to_string()).expect("write");
    }
    let options = ImageModelOptions {
        dtype: WeightDType::F32,
        random_weights: true,
        ..Default::default()
    };
    let mut m = DiffusionModel::load(&gpu(), &dir, &options).expect("load");
    assert_eq!(m.info().preview, "linear");
    let drawn_into = m.preview_texture(32, 32).expect("texture");
    assert_eq!((drawn_into.width(), drawn_into.height()), texture);
    let params = ImageParams {
        prompt: "a fox".into(),
        negative: String::new(),
        steps: 2,
        guidance: 0.0,
        seed: 3,
        width: 32,
        height: 32,
        scheduler: SchedulerKind::Euler,
        init_image: None,
        init_latents: None,
    };
    let mut drawn = Vec::new();
    m.generate(&params, true, |_| {
        drawn.push(texture_rgba(&drawn_into));
        true
    })
    .expect("generate")
    .expect("image");
    assert_eq!(drawn.len(), 2);
    assert_ne!(drawn[0], drawn[1], "each step draws its own estimate");
}
