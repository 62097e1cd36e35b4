//! `backpack image` and `backpack bench-image` end to end on a tiny random SD-Turbo-shaped
//! pipeline: `--init-latents` reproduces diffusers' image, the `--json` line and the PNG's
//! `parameters` chunk carry the settings, batches step the seed, image-to-image runs, and bad
//! input exits non-zero with a reason.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "support/temp_dir.rs"]
mod temp_dir;

use backpack_app::image_files::{parse_parameters, read_png};
use backpack_engine::load::SafeTensors;
use temp_dir::TempDir;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn backpack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_backpack"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// A safetensors file holding one f32 tensor `latents`.
fn write_latents(path: &Path, shape: &[usize], values: &[f32]) {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut header = serde_json::json!({
        "latents": {"dtype": "F32", "shape": shape, "data_offsets": [0, bytes.len()]}
    })
    .to_string();
    while !header.len().is_multiple_of(8) {
        header.push(' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&bytes);
    std::fs::write(path, file).expect("write latents");
}

fn golden(name: &str) -> Vec<f32> {
    let st = SafeTensors::open_files(&[fixtures().join("goldens/tiny-sd-turbo.safetensors")])
        .expect("goldens");
    st.get(name).expect("tensor").to_f32()
}

fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn model() -> String {
    fixtures()
        .join("models/tiny-sd-turbo")
        .to_string_lossy()
        .into_owned()
}

const PROMPT: &str = "a red fox in the snow, highly detailed";

#[test]
fn image_json_reproduces_diffusers_and_writes_parameters() {
    let dir = TempDir::new("cli-image");
    let latents = dir.join("latents.safetensors");
    write_latents(&latents, &[1, 4, 8, 8], &golden("image.init_latents"));
    let out_png = dir.join("fox.png");
    let out = backpack(&[
        "image",
        "--model",
        &model(),
        "--prompt",
        PROMPT,
        "--steps",
        "1",
        "--guidance",
        "0",
        "--scheduler",
        "euler",
        "--init-latents",
        latents.to_str().expect("path"),
        "--dtype",
        "f32",
        "--out",
        out_png.to_str().expect("path"),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(&out);
    let line = lines.last().expect("a JSON line");
    for key in [
        "out",
        "seed",
        "steps",
        "width",
        "height",
        "ms_per_step",
        "total_ms",
    ] {
        assert!(line.get(key).is_some(), "{key} missing from {line}");
    }
    assert_eq!(line["steps"], 1);
    assert_eq!(
        (line["width"].as_u64(), line["height"].as_u64()),
        (Some(64), Some(64))
    );
    assert_eq!(line["out"].as_str(), out_png.to_str());
    let png = read_png(&out_png).expect("png");
    let params = parse_parameters(png.parameters.as_deref().expect("parameters chunk"));
    assert_eq!(params.prompt, PROMPT);
    assert_eq!(params.steps, Some(1));
    assert_eq!(params.size, Some((64, 64)));
    let want = golden("image.euler.1");
    let mse: f64 = png
        .rgb
        .iter()
        .zip(&want)
        .map(|(g, w)| (f64::from(*g) / 255.0 - f64::from(*w)).powi(2))
        .sum::<f64>()
        / want.len() as f64;
    let psnr = 10.0 * (1.0 / mse.max(1e-20)).log10();
    assert!(psnr >= 35.0, "PSNR {psnr:.1} dB against diffusers");
}

#[test]
fn batches_step_the_seed_and_img2img_runs() {
    let dir = TempDir::new("cli-batch");
    let out_png = dir.join("batch.png");
    let out = backpack(&[
        "image",
        "--model",
        &model(),
        "--prompt",
        PROMPT,
        "--seed",
        "5",
        "--batch",
        "2",
        "--out",
        out_png.to_str().expect("path"),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2, "one line per image");
    assert_eq!(lines[0]["seed"], 5);
    assert_eq!(lines[1]["seed"], 6);
    let second = dir.join("batch-2.png");
    assert_eq!(lines[1]["out"].as_str(), second.to_str());
    let (a, b) = (
        read_png(&out_png).expect("a"),
        read_png(&second).expect("b"),
    );
    assert_ne!(a.rgb, b.rgb, "seeds 5 and 6 give different images");

    let edited = dir.join("edited.png");
    let out = backpack(&[
        "image",
        "--model",
        &model(),
        "--prompt",
        "a fox in a forest",
        "--init-image",
        out_png.to_str().expect("path"),
        "--strength",
        "0.5",
        "--steps",
        "4",
        "--out",
        edited.to_str().expect("path"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e = read_png(&edited).expect("edited");
    assert_eq!((e.width, e.height), (64, 64));
    assert!(
        e.parameters
            .expect("parameters")
            .contains("Denoising strength: 0.5"),
        "img2img records its strength"
    );
}

#[test]
fn bad_image_input_exits_nonzero_with_a_reason() {
    let dir = TempDir::new("cli-bad");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--model".into(), "/nonexistent/sd".into()],
            "does not exist",
        ),
        (
            vec!["--model".into(), model(), "--strength".into(), "1.5".into()],
            "--strength",
        ),
        (
            vec!["--model".into(), model(), "--width".into(), "100".into()],
            "multiples of 64",
        ),
        (
            vec![
                "--model".into(),
                model(),
                "--scheduler".into(),
                "ddim".into(),
            ],
            "ddim",
        ),
        (
            vec![
                "--model".into(),
                model(),
                "--init-latents".into(),
                dir.join("missing.safetensors")
                    .to_string_lossy()
                    .into_owned(),
            ],
            "missing.safetensors",
        ),
    ];
    for (args, reason) in cases {
        let mut all: Vec<&str> = vec!["image", "--prompt", "x", "--out"];
        let out_png = dir.join("x.png");
        all.push(out_png.to_str().expect("path"));
        all.extend(args.iter().map(String::as_str));
        let out = backpack(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(stderr.contains(reason), "{args:?}: {stderr}");
    }
}

#[test]
fn bench_image_reports_each_part() {
    let out = backpack(&[
        "bench-image",
        "--config",
        &fixtures().join("models/tiny-sdxl").to_string_lossy(),
        "--size",
        "64",
        "--runs",
        "1",
        "--steps",
        "2",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(&out);
    let line = lines.last().expect("a JSON line");
    for key in [
        "text_encoder_ms",
        "unet_step_ms",
        "vae_decode_ms",
        "image_1step_ms",
    ] {
        assert!(
            line[key].as_f64().is_some_and(|v| v > 0.0),
            "{key} in {line}"
        );
    }
}

/// A Z-Image folder through the same command: guided (with a negative prompt), the image size
/// taken from diffusers' `latents=` shape, the image as diffusers makes it; a UNet scheduler
/// is refused by name.
#[test]
fn image_runs_z_image_pipelines() {
    let dir = TempDir::new("cli-zimage");
    let st = SafeTensors::open_files(&[fixtures().join("goldens/tiny-zimage.safetensors")])
        .expect("goldens");
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fixtures().join("goldens/tiny-zimage.json")).expect("meta"),
    )
    .expect("json");
    let case = &meta["cases"][1];
    assert_eq!(case["name"], "guided_2_steps");
    let latents = dir.join("latents.safetensors");
    write_latents(
        &latents,
        &[1, 8, 8, 8],
        &st.get("guided_2_steps.latents").expect("latents").to_f32(),
    );
    let model = fixtures().join("models/tiny-zimage");
    let out_png = dir.join("lighthouse.png");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "image",
            "--model",
            model.to_str().expect("path"),
            "--prompt",
            case["prompt"].as_str().expect("prompt"),
            "--negative",
            case["negative_prompt"].as_str().expect("negative"),
            "--steps",
            "2",
            "--guidance",
            "2.5",
            "--init-latents",
            latents.to_str().expect("path"),
            "--dtype",
            "f32",
            "--out",
            out_png.to_str().expect("path"),
            "--json",
        ];
        args.extend_from_slice(extra);
        backpack(&args)
    };
    let out = run(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = json_lines(&out).pop().expect("a JSON line");
    assert_eq!(
        (line["width"].as_u64(), line["height"].as_u64()),
        (Some(32), Some(32))
    );
    let png = read_png(&out_png).expect("png");
    let want = st.get("guided_2_steps.image").expect("image").to_f32();
    let psnr = png_psnr(&png.rgb, &want);
    assert!(psnr >= 35.0, "PSNR {psnr:.1} dB against diffusers");
    let refused = run(&["--scheduler", "lcm"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("flow-matching Euler"), "{stderr}");
}

/// PSNR in dB of 8-bit pixels against floats in 0..1.
fn png_psnr(rgb: &[u8], want: &[f32]) -> f64 {
    let mse: f64 = rgb
        .iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) / 255.0 - f64::from(*w)).powi(2))
        .sum::<f64>()
        / want.len() as f64;
    10.0 * (1.0 / mse.max(1e-20)).log10()
}

/// A FLUX.2 klein folder through the same command: diffusers' packed `latents=` (the size
/// taken from their shape), and a reference picture through --init-image at its own size; both
/// images as diffusers makes them.
#[test]
fn image_runs_flux2_pipelines() {
    let dir = TempDir::new("cli-flux2");
    let st = SafeTensors::open_files(&[fixtures().join("goldens/tiny-flux2.safetensors")])
        .expect("goldens");
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fixtures().join("goldens/tiny-flux2.json")).expect("meta"),
    )
    .expect("json");
    let model = fixtures().join("models/tiny-flux2");
    let run = |prompt: &str, extra: &[&str], out: &Path| {
        let mut args = vec![
            "image",
            "--model",
            model.to_str().expect("path"),
            "--prompt",
            prompt,
            "--steps",
            "2",
            "--dtype",
            "f32",
            "--out",
            out.to_str().expect("path"),
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = backpack(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_lines(&out).pop().expect("a JSON line")
    };

    let case = &meta["cases"][0];
    assert_eq!(case["name"], "distilled_2_steps");
    let latents = dir.join("latents.safetensors");
    let values = st
        .get("distilled_2_steps.latents")
        .expect("latents")
        .to_f32();
    write_latents(&latents, &[1, 24, 4, 6], &values);
    let out_png = dir.join("fox.png");
    let prompt = case["prompt"].as_str().expect("prompt");
    let line = run(
        prompt,
        &["--init-latents", latents.to_str().expect("path")],
        &out_png,
    );
    assert_eq!(
        (line["width"].as_u64(), line["height"].as_u64()),
        (Some(48), Some(32))
    );
    let png = read_png(&out_png).expect("png");
    let db = png_psnr(
        &png.rgb,
        &st.get("distilled_2_steps.image").expect("image").to_f32(),
    );
    assert!(db >= 35.0, "PSNR {db:.1} dB against diffusers");

    let reference = &meta["reference"];
    let latents = dir.join("reference-latents.safetensors");
    let values = st.get("reference.latents").expect("latents").to_f32();
    write_latents(&latents, &[1, 24, 8, 9], &values);
    let picture = fixtures().join("goldens/tiny-flux2-reference.png");
    let out_png = dir.join("night.png");
    let line = run(
        reference["prompt"].as_str().expect("prompt"),
        &[
            "--init-image",
            picture.to_str().expect("path"),
            "--init-latents",
            latents.to_str().expect("path"),
        ],
        &out_png,
    );
    assert_eq!(
        (line["width"].as_u64(), line["height"].as_u64()),
        (Some(72), Some(64))
    );
    let png = read_png(&out_png).expect("png");
    let db = png_psnr(
        &png.rgb,
        &st.get("reference.image").expect("image").to_f32(),
    );
    assert!(db >= 35.0, "reference: PSNR {db:.1} dB against diffusers");
}
