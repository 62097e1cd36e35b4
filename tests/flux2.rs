//! FLUX.2 [klein] against diffusers on a tiny random pipeline with our own shapes (model and
//! goldens from tests/reference/make_tiny_flux2.py): the padded, templated prompt's stacked
//! hidden states, one transformer call at two sigmas, the VAE decoder through the batch-norm
//! statistics, whole images from given latents (distilled, and the base model under guidance),
//! a reference image, previews, the sigma tables under the pipeline's empirical mu, and bad
//! input.

mod common;
#[path = "support/goldens.rs"]
mod goldens;
#[path = "support/previews.rs"]
mod previews;
#[path = "support/temp_dir.rs"]
mod temp_dir;

use std::path::{Path, PathBuf};

use backpack_engine::models::diffusion::flux2::empirical_mu;
use backpack_engine::models::diffusion::scheduler::{FlowMatchConfig, linear_sigmas};
use backpack_engine::models::diffusion::{
    DiffusionModel, ImageModelOptions, ImageParams, SchedulerKind, preview_decoder_repo,
};
use backpack_engine::ops::WeightDType;
use common::{assert_close, gpu, psnr, texture_rgba};
use goldens::{Goldens, root};
use serde_json::Value;
use temp_dir::{TempDir, copy_dir};

const GOLDENS: Goldens = Goldens("tiny-flux2");

fn meta() -> Value {
    GOLDENS.meta()
}

fn golden(name: &str) -> Vec<f32> {
    GOLDENS.get(name)
}

fn fixture() -> PathBuf {
    root().join("tests/fixtures/models/tiny-flux2")
}

fn load(path: &Path, dtype: WeightDType) -> DiffusionModel {
    let options = ImageModelOptions {
        dtype,
        ..Default::default()
    };
    DiffusionModel::load(&gpu(), path, &options)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The fixture with FLUX.2-klein-base's `model_index.json` (no `is_distilled`).
fn base_copy() -> TempDir {
    let dir = TempDir::new("flux2-base");
    copy_dir(&fixture(), &dir);
    let index = root()
        .join("tests/conformance/models/black-forest-labs--FLUX.2-klein-base-4B/model_index.json");
    std::fs::copy(index, dir.join("model_index.json")).expect("base index");
    dir
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let scale: Vec<f32> = want.iter().map(|v| v.abs()).collect();
    assert_close(what, got, want, &scale, tol, tol);
}

#[test]
fn stages_match_diffusers() {
    let mut m = load(&fixture(), WeightDType::F32);
    let info = m.info().clone();
    assert_eq!(info.family, "flux2");
    assert_eq!((info.size_step, info.latent_downscale), (8, 8));
    // The distilled klein's settings; the tiny VAE's sample_size (the published one says 1024).
    assert_eq!((info.defaults.steps, info.defaults.guidance), (4, 1.0));
    assert_eq!((info.defaults.width, info.defaults.height), (32, 32));
    let meta = meta();
    let prompt = meta["caption"]["prompt"].as_str().expect("prompt");
    let (caption, rows) = m.caption_features(prompt).expect("caption");
    assert_eq!(rows, 512, "captions are padded to 512 tokens");
    // The real tokens and the padding (which attends to the real tokens only).
    close("caption features", &caption, &golden("caption"), 1e-4);

    let latents = golden("transformer.latents");
    for (label, sigma) in meta["transformer"]["sigmas"].as_object().expect("sigmas") {
        let sigma = sigma.as_f64().expect("sigma") as f32;
        let out = m
            .transformer_once(&latents, (4, 5), sigma, &caption)
            .expect("transformer");
        close(
            &format!("transformer at sigma {sigma}"),
            &out,
            &golden(&format!("transformer.out.{label}")),
            2e-4,
        );
    }
    let image = m
        .decode_latents(&golden("vae.latents"), (3, 4))
        .expect("decode");
    close("vae decode", &image, &golden("vae.image"), 2e-4);
}

fn case_params(case: &Value, latents: Vec<f32>) -> ImageParams {
    let number = |key: &str| case[key].as_f64().unwrap_or_else(|| panic!("{key}"));
    ImageParams {
        prompt: case["prompt"].as_str().unwrap_or_default().to_owned(),
        negative: String::new(),
        steps: number("steps") as u32,
        guidance: number("guidance") as f32,
        seed: 0,
        width: number("width") as u32,
        height: number("height") as u32,
        scheduler: SchedulerKind::Euler,
        init_image: None,
        init_latents: Some(latents),
    }
}

fn check_images(dtype: WeightDType, floor_db: f64) {
    let mut distilled = load(&fixture(), dtype);
    let base_dir = base_copy();
    let mut base = load(&base_dir, dtype);
    assert_eq!(base.info().defaults.guidance, 4.0, "the base model guides");
    for case in meta()["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let m = if case["base"].as_bool() == Some(true) {
            &mut base
        } else {
            &mut distilled
        };
        let params = case_params(case, golden(&format!("{name}.latents")));
        let mut steps = 0;
        let image = m
            .generate(&params, false, |_| {
                steps += 1;
                true
            })
            .expect("generate")
            .expect("not cancelled");
        assert_eq!(steps, params.steps, "{name}: steps reported");
        assert_eq!((image.width, image.height), (params.width, params.height));
        let got: Vec<f32> = image.rgb.iter().map(|v| f32::from(*v) / 255.0).collect();
        let db = psnr(&got, &golden(&format!("{name}.image")));
        assert!(db >= floor_db, "{name} ({dtype:?}): {db:.1} dB");
    }
}

#[test]
fn images_match_diffusers_in_f32() {
    check_images(WeightDType::F32, 35.0);
}

#[test]
fn images_match_diffusers_in_f16() {
    check_images(WeightDType::F16, 30.0);
}

/// A start image is a reference, as `Flux2KleinPipeline`'s `image`: encoded, packed,
/// normalised and joined to the sequence at t = 10.
#[test]
fn a_reference_image_matches_diffusers() {
    let mut m = load(&fixture(), WeightDType::F32);
    let case = &meta()["reference"];
    // The PNG's pixels in 0..1 (the CLI test reads the PNG itself).
    let pixels = golden("reference.pixels");
    let mut params = case_params(case, golden("reference.latents"));
    params.guidance = 1.0;
    params.init_image = Some((pixels, 0.6));
    let image = m
        .generate(&params, false, |_| true)
        .expect("generate")
        .expect("image");
    let got: Vec<f32> = image.rgb.iter().map(|v| f32::from(*v) / 255.0).collect();
    let db = psnr(&got, &golden("reference.image"));
    assert!(db >= 35.0, "reference image: {db:.1} dB");
    // Without the reference the same latents make a different image.
    params.init_image = None;
    let plain = m
        .generate(&params, false, |_| true)
        .expect("generate")
        .expect("image");
    assert_ne!(plain.rgb, image.rgb, "the reference steers the image");
}

#[test]
fn sigma_tables_match_diffusers() {
    let config_path = root().join(
        "tests/conformance/models/black-forest-labs--FLUX.2-klein-4B/scheduler/scheduler_config.json",
    );
    let config: Value =
        serde_json::from_slice(&std::fs::read(config_path).expect("config")).expect("json");
    let config = FlowMatchConfig::from_json(&config).expect("scheduler");
    for case in meta()["schedulers"].as_array().expect("tables") {
        let steps = case["steps"].as_u64().expect("steps") as u32;
        let tokens = case["tokens"].as_u64().expect("tokens") as u32;
        let mu = empirical_mu(tokens, steps);
        let want_mu = case["mu"].as_f64().expect("mu");
        assert!(
            (mu - want_mu).abs() < 1e-12,
            "mu at {tokens} tokens, {steps} steps"
        );
        let want: Vec<f32> = case["sigmas"]
            .as_array()
            .expect("sigmas")
            .iter()
            .map(|v| v.as_f64().expect("sigma") as f32)
            .collect();
        let got = config
            .sigmas_at_mu(&linear_sigmas(steps), mu)
            .expect("sigmas");
        let scale = vec![1.0; want.len()];
        let what = format!("{steps} steps, {tokens} tokens");
        assert_close(&what, &got, &want, &scale, 2e-6, 0.0);
    }
}

/// Each step's clean estimate goes through the batch-norm statistics and the VAE into the
/// preview, so after the last step the preview is the image itself.
#[test]
fn previews_show_each_steps_estimate() {
    let mut m = load(&fixture(), WeightDType::F32);
    assert_eq!(m.info().preview, "vae");
    let case = &meta()["cases"][0];
    let name = case["name"].as_str().expect("name");
    let params = case_params(case, golden(&format!("{name}.latents")));
    let texture = m
        .preview_texture(params.width, params.height)
        .expect("texture");
    let mut drawn = Vec::new();
    let image = m
        .generate(&params, true, |_| {
            drawn.push(texture_rgba(&texture));
            true
        })
        .expect("generate")
        .expect("image");
    assert_eq!(drawn.len(), params.steps as usize);
    assert_ne!(drawn[0], drawn[1], "each step draws its own estimate");
    let last: Vec<u8> = drawn[1].chunks(4).flat_map(|p| p[..3].to_vec()).collect();
    let worst = last
        .iter()
        .zip(&image.rgb)
        .map(|(a, b)| a.abs_diff(*b))
        .max();
    assert!(
        worst <= Some(1),
        "the last preview is the image: off by {worst:?}"
    );
}

#[test]
fn bad_input_is_refused_with_reasons() {
    let mut m = load(&fixture(), WeightDType::F32);
    let mut params = case_params(&meta()["cases"][0], vec![0.0; 3]);
    let err = m
        .generate(&params, false, |_| true)
        .expect_err("wrong latent size")
        .to_string();
    assert!(err.contains("[1, 24, 4, 6]"), "{err}");
    params.init_latents = None;
    params.width = 36;
    let err = m
        .generate(&params, false, |_| true)
        .expect_err("odd size")
        .to_string();
    assert!(err.contains("multiples of 8"), "{err}");
    let err = m
        .transformer_once(&[0.0; 24], (1, 1), 0.5, &[0.0; 10])
        .expect_err("short caption")
        .to_string();
    assert!(err.contains("[512][48]"), "{err}");

    // A text encoder too shallow for layers 9, 18 and 27 is named.
    let dir = TempDir::new("flux2-shallow");
    copy_dir(&fixture(), &dir);
    let config_path = dir.join("text_encoder/config.json");
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(&config_path).expect("read")).expect("json");
    config["num_hidden_layers"] = 20.into();
    std::fs::write(&config_path, config.to_string()).expect("write");
    let options = ImageModelOptions {
        dtype: WeightDType::F32,
        random_weights: true,
        ..Default::default()
    };
    let err = DiffusionModel::load(&gpu(), &dir, &options)
        .err()
        .expect("too few layers")
        .to_string();
    assert!(
        err.contains("text_encoder/config.json") && err.contains("[9, 18, 27]"),
        "{err}"
    );

    // A tokenizer that pads on the left would move every real token: refused by name.
    let dir = TempDir::new("flux2-left");
    copy_dir(&fixture(), &dir);
    let config_path = dir.join("tokenizer/tokenizer_config.json");
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(&config_path).expect("read")).expect("json");
    config["padding_side"] = "left".into();
    std::fs::write(&config_path, config.to_string()).expect("write");
    let err = DiffusionModel::load(&gpu(), &dir, &options)
        .err()
        .expect("left padding")
        .to_string();
    assert!(
        err.contains("tokenizer_config.json") && err.contains("\"left\""),
        "{err}"
    );
}

/// At the published latent channels the previews take the linear map fitted for them, at the
/// latent's size (the unpacked latent, a quarter of the image; random weights: the tiny shapes
/// otherwise).
#[test]
fn previews_at_the_published_channels_use_the_linear_map() {
    previews::check_linear_previews(
        "tiny-flux2",
        &[
            ("transformer/config.json", "in_channels", 128),
            ("vae/config.json", "latent_channels", 32),
        ],
        (8, 8),
    );
}

/// The transformer as one file in Black Forest Labs' original key layout (ComfyUI's single
/// files), put alone in the folder's `transformer/`, gives the diffusers folder's image.
#[test]
fn an_original_layout_transformer_file_loads() {
    let dir = TempDir::new("flux2-original");
    copy_dir(&fixture(), &dir);
    let transformer = dir.join("transformer");
    std::fs::remove_file(transformer.join("diffusion_pytorch_model.safetensors")).expect("rm");
    std::fs::copy(
        root().join("tests/fixtures/models/tiny-flux2-original.safetensors"),
        transformer.join("flux-2-klein-tiny.safetensors"),
    )
    .expect("copy");
    let case = &meta()["cases"][0];
    let name = case["name"].as_str().expect("name");
    let params = case_params(case, golden(&format!("{name}.latents")));
    let mut original = load(&dir, WeightDType::F32);
    let from_file = original
        .generate(&params, false, |_| true)
        .expect("generate")
        .expect("image");
    let mut folder = load(&fixture(), WeightDType::F32);
    let from_folder = folder
        .generate(&params, false, |_| true)
        .expect("generate")
        .expect("image");
    assert_eq!(
        from_file.rgb, from_folder.rgb,
        "the same weights, the same image"
    );
}

fn tiny_taef2() -> PathBuf {
    root().join("tests/fixtures/models/tiny-taef2")
}

/// TAEF2 as published (one `taef2.safetensors`, no `config.json`): its shape is read from the
/// tensors, and its decoder, pooled branches included, matches the reference network
/// (tests/reference/make_tiny_taef2.py).
#[test]
fn taef2_decodes_as_its_reference() {
    use backpack_engine::models::diffusion::taesd::{Taesd, TaesdConfig};
    let goldens = Goldens("tiny-taef2");
    let mut taef2 = Taesd::open(&tiny_taef2()).expect("open");
    assert_eq!(
        taef2.config,
        TaesdConfig {
            latent_channels: 6,
            out_channels: 3,
            channels: vec![8, 8, 8],
            blocks: vec![2, 1, 1],
        }
    );
    let image = taef2
        .decode(&gpu(), &goldens.get("taef2.latents"), (8, 8))
        .expect("decode");
    let want = goldens.get("taef2.image");
    let scale = vec![1.0; want.len()];
    // f16 weights, as published.
    assert_close("taef2", &image, &want, &scale, 5e-3, 5e-3);

    // A folder without weights, and a file that holds no decoder, are refused by name.
    let empty = TempDir::new("taef2-empty");
    let err = Taesd::open(&empty).err().expect("no weights").to_string();
    assert!(err.contains("diffusion_pytorch_model.safetensors"), "{err}");
    let not_tae = root().join("tests/fixtures/goldens/tiny-taef2.safetensors");
    let err = Taesd::open(&not_tae).err().expect("no decoder").to_string();
    assert!(
        err.contains("tiny-taef2.safetensors") && err.contains("decoder.layers.0.weight"),
        "{err}"
    );
}

/// With TAEF2 installed, each step's clean estimate is unpacked (still normalised) and drawn
/// through it at the image's full size; a tiny decoder of another latent space is left out
/// with the reason, and the previews fall back.
#[test]
fn taef2_previews_are_full_size() {
    let options = ImageModelOptions {
        dtype: WeightDType::F32,
        preview_decoder: Some(tiny_taef2()),
        ..Default::default()
    };
    assert_eq!(preview_decoder_repo(&fixture()), "madebyollin/taef2");
    let mut m = DiffusionModel::load(&gpu(), &fixture(), &options).expect("load");
    assert_eq!(m.info().preview, "taesd");
    let case = &meta()["cases"][0];
    let name = case["name"].as_str().expect("name");
    let params = case_params(case, golden(&format!("{name}.latents")));
    let texture = m
        .preview_texture(params.width, params.height)
        .expect("texture");
    assert_eq!(
        (texture.width(), texture.height()),
        (params.width, params.height)
    );
    let mut drawn = Vec::new();
    m.generate(&params, true, |_| {
        drawn.push(texture_rgba(&texture));
        true
    })
    .expect("generate")
    .expect("image");
    assert_eq!(drawn.len(), params.steps as usize);
    assert_ne!(drawn[0], drawn[1], "each step draws its own estimate");
    let first: Vec<u8> = drawn[1].chunks(4).map(|p| p[0]).collect();
    assert!(
        first.iter().any(|&v| v != first[0]),
        "a picture, not a flat colour"
    );

    let options = ImageModelOptions {
        dtype: WeightDType::F32,
        preview_decoder: Some(root().join("tests/fixtures/models/tiny-taesd")),
        ..Default::default()
    };
    let m = DiffusionModel::load(&gpu(), &fixture(), &options).expect("load");
    let preview = &m.info().preview;
    assert!(
        preview.starts_with("vae (") && preview.contains("decodes 4 channels"),
        "{preview}"
    );
}

/// TAEF2's published decoder, tensor for tensor (names and shapes recorded from
/// `taef2_decoder.pth`, tests/conformance/taef2/), written under the Hub file's names with
/// small random values: its shape is read as the real decoder's (32 latent channels, four
/// levels of 64, blocks 3/3/3/1, pooled branches where the file has them) and every tensor
/// loads at its shape.
#[test]
fn taef2_as_published_loads_tensor_for_tensor() {
    use backpack_engine::models::diffusion::taesd::{Taesd, TaesdConfig};
    let recorded: Value = serde_json::from_slice(
        &std::fs::read(root().join("tests/conformance/taef2/taef2_decoder_tensors.json"))
            .expect("recorded tensors"),
    )
    .expect("json");
    let mut state = 1u32;
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for entry in recorded["tensors"].as_array().expect("tensors") {
        let name = entry[0].as_str().expect("name");
        let (index, rest) = name.split_once('.').expect("index.rest");
        let index: usize = index.parse().expect("index");
        let shape: Vec<usize> = entry[1]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .collect();
        let count: usize = shape.iter().product();
        let fan_in = (count / shape[0]).max(1) as f32;
        let bytes: Vec<u8> = (0..count)
            .flat_map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let v = ((state >> 8) as f32 / (1u32 << 24) as f32 - 0.5) / fan_in.sqrt();
                half::f16::from_f32(v).to_le_bytes()
            })
            .collect();
        tensors.push((format!("decoder.layers.{}.{rest}", index - 1), shape, bytes));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F16, shape.clone(), bytes)
                    .expect("view");
            (name.clone(), view)
        })
        .collect();
    let dir = TempDir::new("taef2-published");
    safetensors::tensor::serialize_to_file(views, None, &dir.join("taef2.safetensors"))
        .expect("write");
    let mut taef2 = Taesd::open(&dir).expect("open");
    assert_eq!(
        taef2.config,
        TaesdConfig {
            latent_channels: 32,
            out_channels: 3,
            channels: vec![64, 64, 64, 64],
            blocks: vec![3, 3, 3, 1],
        }
    );
    let latent = vec![0.5; 32 * 2 * 2];
    let image = taef2.decode(&gpu(), &latent, (2, 2)).expect("decode");
    assert_eq!(image.len(), 3 * 16 * 16);
    assert!(image.iter().all(|v| v.is_finite()));
}
