//! Z-Image against diffusers on a tiny random pipeline with our own shapes (model and goldens
//! from tests/reference/make_tiny_zimage.py): the chat-templated prompt's token ids and caption
//! features, one transformer call at two times, the VAE decoder, whole images from given
//! latents with and without guidance, image-to-image, previews, the flow-matching sigma tables
//! of the published scheduler configs (static and dynamic shift), and bad input.

mod common;
#[path = "support/goldens.rs"]
mod goldens;
#[path = "support/previews.rs"]
mod previews;
#[path = "support/temp_dir.rs"]
mod temp_dir;

use backpack_engine::models::diffusion::scheduler::{FlowMatchConfig, linear_sigmas};
use backpack_engine::models::diffusion::{
    DiffusionModel, ImageModelOptions, ImageParams, SchedulerKind,
};
use backpack_engine::ops::WeightDType;
use common::{assert_close, gpu, own_gpu, psnr, texture_rgba};
use goldens::{Goldens, root};
use serde_json::Value;
use temp_dir::{TempDir, copy_dir};

const GOLDENS: Goldens = Goldens("tiny-zimage");

fn meta() -> Value {
    GOLDENS.meta()
}

fn golden(name: &str) -> Vec<f32> {
    GOLDENS.get(name)
}

fn model(dtype: WeightDType) -> DiffusionModel {
    model_on(&gpu(), dtype)
}

fn model_on(gpu: &backpack_engine::gpu::Gpu, dtype: WeightDType) -> DiffusionModel {
    let options = ImageModelOptions {
        dtype,
        ..Default::default()
    };
    let path = root().join("tests/fixtures/models/tiny-zimage");
    DiffusionModel::load(gpu, &path, &options).unwrap_or_else(|e| panic!("tiny-zimage: {e}"))
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let scale: Vec<f32> = want.iter().map(|v| v.abs()).collect();
    assert_close(what, got, want, &scale, tol, tol);
}

#[test]
fn stages_match_diffusers() {
    let mut m = model(WeightDType::F32);
    let info = m.info().clone();
    assert_eq!(info.family, "zimage");
    assert_eq!(info.size_step, 8);
    // The tiny VAE's sample_size (32); the published one says 1024.
    assert_eq!((info.defaults.width, info.defaults.height), (32, 32));
    assert_eq!((info.defaults.steps, info.defaults.guidance), (50, 5.0));
    let meta = meta();
    let prompt = meta["caption"]["prompt"].as_str().expect("prompt");
    let (caption, tokens) = m.caption_features(prompt).expect("caption");
    let ids = golden("prompt.ids");
    assert_eq!(
        tokens as usize,
        ids.len(),
        "the templated prompt's token count"
    );
    close("caption features", &caption, &golden("caption"), 1e-4);

    let latents = golden("transformer.latents");
    for (label, t) in meta["transformer"]["times"].as_object().expect("times") {
        let t = t.as_f64().expect("time") as f32;
        let out = m
            .transformer_once(&latents, (8, 12), t, &caption)
            .expect("transformer");
        close(
            &format!("transformer at {t}"),
            &out,
            &golden(&format!("transformer.out.{label}")),
            2e-4,
        );
    }
    let image = m
        .decode_latents(&golden("vae.latents"), (6, 10))
        .expect("decode");
    close("vae decode", &image, &golden("vae.image"), 2e-4);
}

/// The first image case from its given latents: its name and how close it comes to
/// diffusers' image.
fn first_case_db(m: &mut DiffusionModel) -> (String, f64) {
    let case = &meta()["cases"][0];
    let name = case["name"].as_str().expect("name").to_owned();
    let params = case_params(case, golden(&format!("{name}.latents")));
    let image = m
        .generate(&params, false, |_| true)
        .expect("generate")
        .expect("image");
    let got: Vec<f32> = image.rgb.iter().map(|v| f32::from(*v) / 255.0).collect();
    let db = psnr(&got, &golden(&format!("{name}.image")));
    (name, db)
}

fn case_params(case: &Value, latents: Vec<f32>) -> ImageParams {
    let text = |key: &str| case[key].as_str().unwrap_or_default().to_owned();
    let number = |key: &str| case[key].as_f64().unwrap_or_else(|| panic!("{key}"));
    ImageParams {
        prompt: text("prompt"),
        negative: text("negative_prompt"),
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
    let mut m = model(dtype);
    for case in meta()["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
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
        let want = golden(&format!("{name}.image"));
        let db = psnr(&got, &want);
        assert!(db >= floor_db, "{name} ({dtype:?}): {db:.1} dB");
    }
}

#[test]
fn images_match_diffusers_in_f32() {
    check_images(WeightDType::F32, 35.0);
}

#[test]
fn images_match_diffusers_in_f16() {
    check_images(WeightDType::F16, 35.0);
}

/// The sigma tables of the published scheduler configs (Z-Image-Turbo's shift 3, Z-Image's
/// shift 6, FLUX.2 klein's dynamic exponential shift) at several step and token counts.
#[test]
fn sigma_tables_match_diffusers() {
    let meta = meta();
    let tables = &meta["schedulers"];
    for case in tables["cases"].as_array().expect("cases") {
        let label = case["scheduler"].as_str().expect("scheduler");
        let config = FlowMatchConfig::from_json(&tables["configs"][label]).expect("config");
        let steps = case["steps"].as_u64().expect("steps") as u32;
        let tokens = case["tokens"].as_u64().expect("tokens") as u32;
        let want: Vec<f32> = case["sigmas"]
            .as_array()
            .expect("sigmas")
            .iter()
            .map(|v| v.as_f64().expect("sigma") as f32)
            .collect();
        let got = config
            .sigmas(&linear_sigmas(steps), tokens)
            .expect("sigmas");
        let scale = vec![1.0; want.len()];
        assert_close(
            &format!("{label}, {steps} steps, {tokens} tokens"),
            &got,
            &want,
            &scale,
            2e-6,
            0.0,
        );
    }
}

#[test]
fn bad_requests_are_refused_with_reasons() {
    let mut m = model(WeightDType::F32);
    let mut params = case_params(&meta()["cases"][0], vec![0.0; 3]);
    let err = m
        .generate(&params, false, |_| true)
        .expect_err("wrong latent size")
        .to_string();
    assert!(err.contains("[1, 8, 8, 12]"), "{err}");
    params.init_latents = None;
    params.width = 36;
    let err = m
        .generate(&params, false, |_| true)
        .expect_err("odd size")
        .to_string();
    assert!(err.contains("multiples of 8"), "{err}");
    params.width = 48;
    let mut seen = 0;
    let stopped = m
        .generate(&params, false, |_| {
            seen += 1;
            false
        })
        .expect("cancel");
    assert!(
        stopped.is_none() && seen == 1,
        "a cancelled image stops at once"
    );
    let err = m
        .unet_once(&[0.0; 4], (1, 1), 1.0, &[], None)
        .expect_err("no unet")
        .to_string();
    assert!(err.contains("diffusion-transformer"), "{err}");
}

/// Without a tiny decoder the VAE draws each step's clean estimate, so after the last step
/// the preview is the image itself.
#[test]
fn previews_show_each_steps_estimate() {
    let mut m = model(WeightDType::F32);
    assert_eq!(m.info().preview, "vae");
    let case = &meta()["cases"][0];
    let name = case["name"].as_str().expect("name");
    let params = case_params(case, golden(&format!("{name}.latents")));
    let texture = m
        .preview_texture(params.width, params.height)
        .expect("texture");
    assert_eq!((texture.width(), texture.height()), (48, 32));
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

/// The text encoder block-quantized on load still gives the pipeline's caption features.
#[test]
fn a_quantized_text_encoder_keeps_the_captions() {
    let options = ImageModelOptions {
        dtype: WeightDType::F32,
        text_quantize: Some(backpack_engine::load::GgmlType::Q8_0),
        ..Default::default()
    };
    let path = root().join("tests/fixtures/models/tiny-zimage");
    let mut m = DiffusionModel::load(&gpu(), &path, &options).expect("load");
    let prompt = meta()["caption"]["prompt"]
        .as_str()
        .expect("prompt")
        .to_owned();
    let (caption, _) = m.caption_features(&prompt).expect("caption");
    let want = golden("caption");
    let dot: f64 = caption
        .iter()
        .zip(&want)
        .map(|(a, b)| f64::from(a * b))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(x * x)).sum::<f64>().sqrt();
    let cosine = dot / (norm(&caption) * norm(&want));
    assert!(cosine > 0.999, "cosine {cosine}");
    let (full, _) = model(WeightDType::F32)
        .caption_features(&prompt)
        .expect("caption");
    assert_ne!(full, caption, "the quantized encoder is another path");
}

/// Image-to-image as diffusers' `ZImageImg2ImgPipeline` runs it (strength 0.6 of 4 steps runs
/// 3), from the encoder's mean latent (the posterior's draw replayed as zeros there).
#[test]
fn image_to_image_matches_diffusers() {
    let mut m = model(WeightDType::F32);
    let meta = meta();
    let case = &meta["img2img"];
    let (w, h) = (48, 32);
    assert_eq!(
        (case["width"].as_u64(), case["height"].as_u64()),
        (Some(w), Some(h))
    );
    let init = golden("img2img.init");
    let plane = (w * h) as usize;
    let pixels: Vec<f32> = (0..plane)
        .flat_map(|p| (0..3).map(move |c| (c, p)))
        .map(|(c, p)| init[c * plane + p])
        .collect();
    let strength = case["strength"].as_f64().expect("strength") as f32;
    let params = ImageParams {
        prompt: case["prompt"].as_str().expect("prompt").to_owned(),
        negative: String::new(),
        steps: case["steps"].as_u64().expect("steps") as u32,
        guidance: 0.0,
        seed: 0,
        width: w as u32,
        height: h as u32,
        scheduler: SchedulerKind::Euler,
        init_image: Some((pixels, strength)),
        init_latents: Some(golden("img2img.noise")),
    };
    let mut steps = 0;
    let image = m
        .generate(&params, false, |_| {
            steps += 1;
            true
        })
        .expect("generate")
        .expect("image");
    assert_eq!(steps, 3, "strength 0.6 of 4 steps runs 3");
    let got: Vec<f32> = image.rgb.iter().map(|v| f32::from(*v) / 255.0).collect();
    let db = psnr(&got, &golden("img2img.image"));
    assert!(db >= 35.0, "img2img: {db:.1} dB");
}

/// The transformer as one file in the model's original key layout (ComfyUI's, the Z-Image
/// repository's: fused QKV, `x_embedder`, `final_layer`, the `model.diffusion_model.` prefix)
/// put in the folder's `transformer/` gives diffusers' image.
#[test]
fn an_original_layout_transformer_file_loads() {
    let dir = TempDir::new("zimage-original");
    copy_dir(&root().join("tests/fixtures/models/tiny-zimage"), &dir);
    let transformer = dir.join("transformer");
    std::fs::remove_file(transformer.join("diffusion_pytorch_model.safetensors")).expect("rm");
    std::fs::copy(
        root().join("tests/fixtures/models/tiny-zimage-original.safetensors"),
        transformer.join("z_image_turbo_bf16.safetensors"),
    )
    .expect("copy");
    let options = ImageModelOptions {
        dtype: WeightDType::F32,
        ..Default::default()
    };
    let mut m = DiffusionModel::load(&gpu(), &dir, &options).expect("load");
    let (name, db) = first_case_db(&mut m);
    assert!(db >= 35.0, "{name} from the original layout: {db:.1} dB");
    // A second weights file makes the folder ambiguous: refused, naming what is missing.
    std::fs::write(transformer.join("extra.safetensors"), b"").expect("write");
    let err = DiffusionModel::load(&gpu(), &dir, &options)
        .err()
        .expect("ambiguous")
        .to_string();
    assert!(err.contains("diffusion_pytorch_model"), "{err}");
}

/// The transformer block-quantized on load (Q8_0) draws the same picture within its
/// rounding, and takes less memory than in f16.
#[test]
fn a_quantized_transformer_keeps_the_image() {
    let path = root().join("tests/fixtures/models/tiny-zimage");
    let load = |quantize| {
        let options = ImageModelOptions {
            dtype: WeightDType::F16,
            quantize,
            ..Default::default()
        };
        DiffusionModel::load(&gpu(), &path, &options).expect("load")
    };
    let mut m = load(Some(backpack_engine::load::GgmlType::Q8_0));
    let full_bytes = load(None).info().weight_bytes;
    assert!(
        m.info().weight_bytes < full_bytes,
        "quantized weights are smaller"
    );
    let (name, db) = first_case_db(&mut m);
    // 49 dB here; a wrong block layout or scale would fall far below.
    assert!(db >= 40.0, "{name} with a Q8_0 transformer: {db:.1} dB");
}

/// Under guidance a prompt and a negative prompt that pad to the same length share one
/// transformer plan, each call bringing its own caption and row count: one guided step gives
/// what the two captions' separate transformer calls, mixed and stepped by hand, give.
#[test]
fn a_shared_plan_keeps_each_captions_rows() {
    let mut m = model(WeightDType::F32);
    let (prompt, negative) = ("A lighthouse at dusk", "");
    let (cond, cond_rows) = m.caption_features(prompt).expect("caption");
    let (uncond, uncond_rows) = m.caption_features(negative).expect("caption");
    assert_ne!(cond_rows, uncond_rows);
    assert_eq!(
        cond_rows.div_ceil(32),
        uncond_rows.div_ceil(32),
        "one padded length"
    );
    let latents = golden("guided_2_steps.latents");
    let guidance = 2.5f32;
    // One step from σ = 1 to 0 at model time 0: x₀ = x + out, out = neg + (g + 1)(pos − neg).
    let pos = m
        .transformer_once(&latents, (8, 8), 0.0, &cond)
        .expect("pos");
    let neg = m
        .transformer_once(&latents, (8, 8), 0.0, &uncond)
        .expect("neg");
    let x0: Vec<f32> = (0..latents.len())
        .map(|i| latents[i] + neg[i] + (guidance + 1.0) * (pos[i] - neg[i]))
        .collect();
    let nchw = m.decode_latents(&x0, (8, 8)).expect("decode");
    let plane = 32 * 32;
    let want: Vec<f32> = (0..plane)
        .flat_map(|p| (0..3).map(move |c| (c, p)))
        .map(|(c, p)| (nchw[c * plane + p] / 2.0 + 0.5).clamp(0.0, 1.0))
        .collect();
    let params = ImageParams {
        prompt: prompt.into(),
        negative: negative.into(),
        steps: 1,
        guidance,
        seed: 0,
        width: 32,
        height: 32,
        scheduler: SchedulerKind::Euler,
        init_image: None,
        init_latents: Some(latents),
    };
    let image = m
        .generate(&params, false, |_| true)
        .expect("generate")
        .expect("image");
    let got: Vec<f32> = image.rgb.iter().map(|v| f32::from(*v) / 255.0).collect();
    let db = psnr(&got, &want);
    assert!(db >= 45.0, "shared plan against separate calls: {db:.1} dB");
}

/// At the published latent channels the previews take the linear map fitted for them, at the
/// latent's size (the latent is a quarter of the image; random weights: the tiny shapes otherwise).
#[test]
fn previews_at_the_published_channels_use_the_linear_map() {
    previews::check_linear_previews(
        "tiny-zimage",
        &[
            ("transformer/config.json", "in_channels", 16),
            ("vae/config.json", "latent_channels", 16),
        ],
        (8, 8),
    );
}

/// Paced as the app's window paces its device (here parts of one dispatch after the first
/// few, two at most in the queue), every step and the decode give the same image to the byte.
#[test]
fn paced_submissions_draw_the_same_image() {
    // A device of its own: pacing is a property of the queue, and other tests share theirs.
    let gpu = own_gpu();
    let mut m = model_on(&gpu, WeightDType::F32);
    let case = &meta()["cases"][0];
    let name = case["name"].as_str().expect("name");
    let params = case_params(case, golden(&format!("{name}.latents")));
    let draw = |m: &mut DiffusionModel| {
        m.generate(&params, false, |_| true)
            .expect("generate")
            .expect("image")
            .rgb
    };
    let unpaced = draw(&mut m);
    gpu.pace_parts(Some(std::time::Duration::from_micros(1)));
    let paced = draw(&mut m);
    gpu.pace_parts(None);
    assert_eq!(unpaced, paced, "{name}: paced image differs");
}
