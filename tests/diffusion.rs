//! Stable Diffusion against diffusers on tiny random pipelines with our own shapes (models and
//! goldens from tests/reference/make_tiny_diffusion.py): text conditioning, one UNet call, VAE
//! decode and encode, whole images from given latents with every scheduler (with and without
//! guidance, ε and v prediction), SDXL's two text encoders and added conditions, the fp16
//! variant files, a single-file checkpoint, TAESD, seeds, cancellation and bad input.

mod common;
#[path = "support/temp_dir.rs"]
mod temp_dir;

use std::path::{Path, PathBuf};

use backpack_engine::load::SafeTensors;
use backpack_engine::models::diffusion::{
    DiffusionModel, ImageModelOptions, ImageParams, SchedulerKind, nchw_to_nhwc,
};
use backpack_engine::ops::WeightDType;
use common::{assert_close, gpu, psnr};
use serde_json::Value;
use temp_dir::{TempDir, copy_dir};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn meta() -> Value {
    let text = std::fs::read_to_string(root().join("tests/fixtures/goldens/diffusion.json"))
        .expect("diffusion.json");
    serde_json::from_str(&text).expect("json")
}

fn goldens(pipeline: &str) -> SafeTensors {
    let path = root().join(format!("tests/fixtures/goldens/{pipeline}.safetensors"));
    SafeTensors::open_files(&[path]).expect("goldens")
}

fn golden(st: &SafeTensors, name: &str) -> Vec<f32> {
    st.get(name)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .to_f32()
}

fn load(path: &Path, dtype: WeightDType) -> DiffusionModel {
    let options = ImageModelOptions {
        dtype,
        ..Default::default()
    };
    DiffusionModel::load(&gpu(), path, &options)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fixture pipeline's folder; tiny-sd2-v keeps only its scheduler and shares
/// tiny-sd-turbo's weights, so it is put together in a temporary folder.
fn model_dir(pipeline: &str) -> ModelDir {
    let models = root().join("tests/fixtures/models");
    if pipeline != "tiny-sd2-v" {
        return ModelDir::Fixture(models.join(pipeline));
    }
    let dir = TempDir::new("tiny-sd2-v");
    copy_dir(&models.join("tiny-sd-turbo"), &dir);
    copy_dir(&models.join("tiny-sd2-v"), &dir);
    ModelDir::Assembled(dir)
}

/// A fixture pipeline's folder, or one put together for the test (removed when dropped).
enum ModelDir {
    Fixture(PathBuf),
    Assembled(TempDir),
}

impl std::ops::Deref for ModelDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        match self {
            ModelDir::Fixture(path) => path,
            ModelDir::Assembled(dir) => dir,
        }
    }
}

fn model(pipeline: &str) -> DiffusionModel {
    load(&model_dir(pipeline), WeightDType::F32)
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let scale: Vec<f32> = want.iter().map(|v| v.abs()).collect();
    assert_close(what, got, want, &scale, tol, tol);
}

fn params(case: &Value, init_latents: Vec<f32>) -> ImageParams {
    ImageParams {
        prompt: case["prompt"].as_str().unwrap_or_default().to_owned(),
        negative: case["negative_prompt"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        steps: case["steps"].as_u64().expect("steps") as u32,
        guidance: case["guidance"].as_f64().expect("guidance") as f32,
        seed: 0,
        width: case["width"].as_u64().expect("width") as u32,
        height: case["height"].as_u64().expect("height") as u32,
        scheduler: case["scheduler"]
            .as_str()
            .expect("scheduler")
            .parse::<SchedulerKind>()
            .expect("kind"),
        init_image: None,
        init_latents: Some(init_latents),
    }
}

fn pixels(rgb: &[u8]) -> Vec<f32> {
    rgb.iter().map(|v| f32::from(*v) / 255.0).collect()
}

/// Text conditioning, one UNet call at two timesteps, the VAE decoder and encoder.
fn check_stages(pipeline: &str) {
    let meta = meta();
    let p = &meta["pipelines"][pipeline];
    let st = goldens(pipeline);
    let mut m = model(pipeline);
    let prompt = meta["prompt"].as_str().expect("prompt");
    let negative = meta["negative_prompt"].as_str().expect("negative");
    let (ctx, added) = m.text_conditioning(prompt, (64, 64)).expect("text");
    close(
        &format!("{pipeline} prompt embeds"),
        &ctx,
        &golden(&st, "text.prompt_embeds"),
        1e-4,
    );
    let (neg, _) = m.text_conditioning(negative, (64, 64)).expect("text");
    close(
        &format!("{pipeline} negative embeds"),
        &neg,
        &golden(&st, "text.negative_prompt_embeds"),
        1e-4,
    );
    if p["kind"] == "sdxl" {
        let added = added.as_ref().expect("SDXL has added conditions");
        let pooled = golden(&st, "text.pooled");
        close(
            &format!("{pipeline} pooled"),
            &added[..pooled.len()],
            &pooled,
            1e-4,
        );
    }
    let latents = golden(&st, "unet.latents");
    for t in golden(&st, "unet.timesteps") {
        let out = m
            .unet_once(&latents, (8, 8), t, &ctx, added.as_deref())
            .expect("unet");
        close(
            &format!("{pipeline} unet at {t}"),
            &out,
            &golden(&st, &format!("unet.out.{t}")),
            2e-4,
        );
    }
    let image = m
        .decode_latents(&golden(&st, "vae.latents"), (8, 8))
        .expect("decode");
    close(
        &format!("{pipeline} vae decode"),
        &image,
        &golden(&st, "vae.image"),
        2e-4,
    );
    let mean = m
        .encode_image(&golden(&st, "vae.encode_input"), (64, 64))
        .expect("encode");
    let scaling = p["vae_scaling_factor"].as_f64().expect("scaling") as f32;
    let want: Vec<f32> = golden(&st, "vae.encode_mean")
        .iter()
        .map(|v| v * scaling)
        .collect();
    close(&format!("{pipeline} vae encode"), &mean, &want, 2e-4);
}

/// Every whole-image case of a pipeline, from the given latents, at ≥ 35 dB.
fn check_images(pipeline: &str) {
    let meta = meta();
    let st = goldens(pipeline);
    let mut m = model(pipeline);
    let cases = meta["pipelines"][pipeline]["images"]
        .as_array()
        .expect("images");
    for case in cases {
        let name = case["tensor"].as_str().expect("tensor");
        let init = golden(&st, case["init_latents"].as_str().expect("latents"));
        let image = m
            .generate(&params(case, init), false, |_| true)
            .expect("generate")
            .expect("not cancelled");
        let p = psnr(&pixels(&image.rgb), &golden(&st, name));
        assert!(p >= 35.0, "{pipeline} {name}: PSNR {p:.1} dB");
    }
}

/// Image-to-image from the encoder's mean latent, noised with the golden's draw.
fn check_img2img(pipeline: &str) {
    let meta = meta();
    let case = &meta["pipelines"][pipeline]["img2img"];
    let st = goldens(pipeline);
    let mut m = model(pipeline);
    let strength = case["strength"].as_f64().expect("strength") as f32;
    let params = ImageParams {
        prompt: case["prompt"].as_str().expect("prompt").to_owned(),
        negative: String::new(),
        steps: case["num_inference_steps"].as_u64().expect("steps") as u32,
        guidance: 0.0,
        seed: 0,
        width: 64,
        height: 64,
        scheduler: SchedulerKind::Euler,
        init_image: Some((nchw_to_nhwc(&golden(&st, "img2img.init"), 3), strength)),
        init_latents: Some(golden(&st, "img2img.noise")),
    };
    let mut steps = 0;
    let image = m
        .generate(&params, false, |_| {
            steps += 1;
            true
        })
        .expect("generate")
        .expect("image");
    assert_eq!(
        steps,
        case["timesteps_run"].as_array().expect("run").len() as u32
    );
    let p = psnr(&pixels(&image.rgb), &golden(&st, "img2img.image_mean"));
    assert!(p >= 35.0, "{pipeline} image-to-image: PSNR {p:.1} dB");
}

#[test]
fn sd1_img2img_matches_diffusers() {
    check_img2img("tiny-sd");
}

#[test]
fn sdxl_img2img_matches_diffusers() {
    check_img2img("tiny-sdxl");
}

#[test]
fn sd1_stages_match_diffusers() {
    check_stages("tiny-sd");
}

#[test]
fn sd2_stages_match_diffusers() {
    check_stages("tiny-sd-turbo");
}

#[test]
fn sdxl_stages_match_diffusers() {
    check_stages("tiny-sdxl");
}

/// A 512×512 image's latent: 4096-token self-attention in the first level.
#[test]
fn unet_on_a_512_latent_matches_diffusers() {
    let meta = meta();
    let st = goldens("tiny-sd-turbo");
    let mut m = model("tiny-sd-turbo");
    let prompt = meta["prompt"].as_str().expect("prompt");
    let (ctx, _) = m.text_conditioning(prompt, (512, 512)).expect("text");
    let out = m
        .unet_once(&golden(&st, "unet.latents_64"), (64, 64), 999.0, &ctx, None)
        .expect("unet");
    close("unet at 64×64", &out, &golden(&st, "unet.out_64.999"), 5e-4);
}

#[test]
fn sd1_images_match_diffusers() {
    check_images("tiny-sd");
}

#[test]
fn sd_turbo_images_match_diffusers() {
    check_images("tiny-sd-turbo");
}

#[test]
fn v_prediction_images_match_diffusers() {
    check_images("tiny-sd2-v");
}

#[test]
fn v_prediction_stages_match_diffusers() {
    check_stages("tiny-sd2-v");
}

#[test]
fn sdxl_images_match_diffusers() {
    check_images("tiny-sdxl");
}

/// tiny-sd's two-step Euler image with guidance (one step from "leading" spacing would barely
/// use the UNet).
fn euler_two_steps(m: &mut DiffusionModel, st: &SafeTensors) -> f64 {
    let meta = meta();
    let case = &meta["pipelines"]["tiny-sd"]["images"][1];
    assert_eq!(case["tensor"], "image.euler.2");
    let image = m
        .generate(
            &params(case, golden(st, "image.init_latents")),
            false,
            |_| true,
        )
        .expect("generate")
        .expect("image");
    psnr(&pixels(&image.rgb), &golden(st, "image.euler.2"))
}

#[test]
fn fp16_variant_files_and_f16_storage_match() {
    let st = goldens("tiny-sd");
    let mut m = load(
        &root().join("tests/fixtures/models/tiny-sd-fp16"),
        WeightDType::F16,
    );
    let p = euler_two_steps(&mut m, &st);
    assert!(p >= 35.0, "fp16 variant: PSNR {p:.1} dB");
}

#[test]
fn single_file_checkpoint_gives_the_same_image() {
    // A single file carries no tokenizer: it is looked up next to the checkpoint.
    let dir = TempDir::new("single-file");
    std::fs::copy(
        root().join("tests/fixtures/models/tiny-sd.safetensors"),
        dir.join("tiny-sd.safetensors"),
    )
    .expect("copy");
    let tok = dir.join("tokenizer");
    std::fs::create_dir_all(&tok).expect("mkdir");
    for f in [
        "vocab.json",
        "merges.txt",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        let src = root()
            .join("tests/fixtures/models/tiny-sd/tokenizer")
            .join(f);
        if src.is_file() {
            std::fs::copy(src, tok.join(f)).expect("copy tokenizer");
        }
    }
    let sched = dir.join("scheduler");
    std::fs::create_dir_all(&sched).expect("mkdir");
    std::fs::copy(
        root().join("tests/fixtures/models/tiny-sd/scheduler/scheduler_config.json"),
        sched.join("scheduler_config.json"),
    )
    .expect("copy scheduler");
    let st = goldens("tiny-sd");
    let mut m = load(&dir.join("tiny-sd.safetensors"), WeightDType::F32);
    let p = euler_two_steps(&mut m, &st);
    assert!(p >= 35.0, "single file: PSNR {p:.1} dB");
}

#[test]
fn seeds_are_reproducible_and_steps_cancel() {
    let mut m = model("tiny-sd-turbo");
    let mut p = params(&meta()["pipelines"]["tiny-sd-turbo"]["images"][1], vec![]);
    p.init_latents = None;
    p.seed = 7;
    let a = m.generate(&p, true, |_| true).expect("a").expect("a");
    let b = m.generate(&p, true, |_| true).expect("b").expect("b");
    assert_eq!(a.rgb, b.rgb, "the same seed gives the same image");
    p.seed = 8;
    let c = m.generate(&p, false, |_| true).expect("c").expect("c");
    assert_ne!(a.rgb, c.rgb, "another seed gives another image");
    let mut seen = 0;
    let stopped = m
        .generate(&p, true, |s| {
            seen = s.step;
            false
        })
        .expect("cancel");
    assert!(
        stopped.is_none() && seen == 1,
        "stopped after the first step"
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let options = ImageModelOptions::default();
    let gpu = gpu();
    let missing = DiffusionModel::load(&gpu, Path::new("/nonexistent/model"), &options)
        .err()
        .expect("missing");
    assert!(
        missing.to_string().contains("model_index.json"),
        "{missing}"
    );

    let dir = TempDir::new("bad-pipeline");
    copy_dir(&root().join("tests/fixtures/models/tiny-sd"), &dir);
    std::fs::write(
        dir.join("model_index.json"),
        r#"{"_class_name": "FluxPipeline"}"#,
    )
    .expect("write");
    let e = DiffusionModel::load(&gpu, &dir, &options)
        .err()
        .expect("unsupported");
    assert!(e.to_string().contains("FluxPipeline"), "{e}");

    let dir = TempDir::new("truncated");
    copy_dir(&root().join("tests/fixtures/models/tiny-sd"), &dir);
    let unet = dir.join("unet/diffusion_pytorch_model.safetensors");
    let bytes = std::fs::read(&unet).expect("read");
    std::fs::write(&unet, &bytes[..bytes.len() / 2]).expect("truncate");
    let e = DiffusionModel::load(&gpu, &dir, &options)
        .err()
        .expect("truncated");
    assert!(e.to_string().contains("diffusion_pytorch_model"), "{e}");

    let mut m = model("tiny-sd");
    let mut p = params(&meta()["pipelines"]["tiny-sd"]["images"][0], vec![]);
    p.init_latents = None;
    p.width = 100;
    let e = m.generate(&p, false, |_| true).expect_err("size");
    assert!(e.to_string().contains("multiples of 64"), "{e}");
    p.width = 64;
    p.init_latents = Some(vec![0.0; 5]);
    let e = m.generate(&p, false, |_| true).expect_err("latents");
    assert!(e.to_string().contains("init latents"), "{e}");
    p.init_latents = None;
    p.steps = 0;
    assert!(m.generate(&p, false, |_| true).is_err());
}

#[test]
fn taesd_matches_diffusers() {
    let st =
        SafeTensors::open_files(&[root().join("tests/fixtures/goldens/tiny-taesd.safetensors")])
            .expect("goldens");
    let mut taesd = backpack_engine::models::diffusion::taesd::Taesd::open(
        &root().join("tests/fixtures/models/tiny-taesd"),
    )
    .expect("open");
    let image = taesd
        .decode(&gpu(), &golden(&st, "taesd.latents"), (8, 8))
        .expect("decode");
    // f16 weights (previews need no more).
    close("taesd", &image, &golden(&st, "taesd.image"), 5e-3);
}

#[test]
fn taesd_previews_are_drawn_each_step() {
    let mut m = DiffusionModel::load(
        &gpu(),
        &model_dir("tiny-sd-turbo"),
        &ImageModelOptions {
            preview_decoder: Some(root().join("tests/fixtures/models/tiny-taesd")),
            ..Default::default()
        },
    )
    .expect("load with TAESD");
    let texture = m.preview_texture(64, 64).expect("texture");
    assert_eq!(
        (texture.width(), texture.height()),
        (64, 64),
        "full-size previews"
    );
    let mut p = params(&meta()["pipelines"]["tiny-sd-turbo"]["images"][1], vec![]);
    p.init_latents = None;
    let mut steps = 0;
    m.generate(&p, true, |_| {
        steps += 1;
        true
    })
    .expect("generate")
    .expect("image");
    assert_eq!(steps, p.steps);
}

/// Rewrites a safetensors file with renamed tensors (same bytes).
fn rename_tensors(path: &Path, rename: impl Fn(&str) -> String) {
    let bytes = std::fs::read(path).expect("read");
    let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Map<String, Value> =
        serde_json::from_slice(&bytes[8..8 + len]).expect("header");
    let renamed: serde_json::Map<String, Value> =
        header.into_iter().map(|(k, v)| (rename(&k), v)).collect();
    let mut text = Value::Object(renamed).to_string();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&bytes[8 + len..]);
    std::fs::write(path, out).expect("write");
}

#[test]
fn vae_files_with_pre_0_14_attention_names_load() {
    let dir = TempDir::new("legacy-vae");
    copy_dir(&model_dir("tiny-sd"), &dir);
    rename_tensors(
        &dir.join("vae/diffusion_pytorch_model.safetensors"),
        |name| {
            name.replace(".to_q.", ".query.")
                .replace(".to_k.", ".key.")
                .replace(".to_v.", ".value.")
                .replace(".to_out.0.", ".proj_attn.")
        },
    );
    let st = goldens("tiny-sd");
    let mut m = load(&dir, WeightDType::F32);
    let image = m
        .decode_latents(&golden(&st, "vae.latents"), (8, 8))
        .expect("decode");
    close("legacy VAE decode", &image, &golden(&st, "vae.image"), 2e-4);
}
