//! Goldens from diffusers (tests/reference/make_scheduler_goldens.py) replayed through the
//! coefficient form on the CPU, plus the noise generator and config handling.

use serde_json::{Value, json};

use super::*;

fn goldens() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/goldens/scheduler_steps.json"
    );
    let text = std::fs::read_to_string(path).expect("read scheduler_steps.json");
    serde_json::from_str(&text).expect("parse scheduler_steps.json")
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

/// Element-wise within 1e-4 relative, relative to the larger of the element and the
/// vector's RMS (so values that cancel to near zero are not held to an impossible bound).
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let rms = (want.iter().map(|w| w * w).sum::<f32>() / want.len() as f32).sqrt();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-4 * w.abs().max(rms).max(1e-6);
        assert!(
            (g - w).abs() <= tol,
            "{what}[{i}]: got {g}, want {w} (tolerance {tol})\n got {got:?}\nwant {want:?}"
        );
    }
}

fn seed(loop_: &Value, name: &str) -> u64 {
    loop_["seeds"][name].as_u64().expect("seed")
}

/// The GPU's three lines, on the CPU in f32.
fn replay(name: &str, schedule: &Schedule, img2img: bool, loop_: &Value) {
    let len = loop_["x_start"].as_array().expect("x_start").len();
    let init = gaussian_noise(seed(loop_, "init"), len);
    let mut x: Vec<f32> = if img2img {
        let (a, b) = schedule.img2img.expect("img2img coefficients");
        let image = gaussian_noise(seed(loop_, "image"), len);
        image
            .iter()
            .zip(&init)
            .map(|(i, n)| a * i + b * n)
            .collect()
    } else {
        init.iter().map(|n| schedule.init_noise_sigma * n).collect()
    };
    assert_close(&x, &floats(&loop_["x_start"]), &format!("{name} x_start"));
    let mut prev = vec![0f32; len];
    for (i, s) in schedule.steps.iter().enumerate() {
        let what = |v: &str| format!("{name} step {i} {v}");
        let input: Vec<f32> = x.iter().map(|x| s.c_in * x).collect();
        assert_close(
            &input,
            &floats(&loop_["model_input"][i]),
            &what("model_input"),
        );
        let out = step_noise(seed(loop_, "out"), i as u32, len);
        let noise = step_noise(seed(loop_, "noise"), i as u32, len);
        let denoised: Vec<f32> = x.iter().zip(&out).map(|(x, o)| s.p * x + s.q * o).collect();
        assert_close(&denoised, &floats(&loop_["denoised"][i]), &what("denoised"));
        for k in 0..len {
            x[k] = s.a * x[k] + s.b * denoised[k] + s.c * prev[k] + s.d * noise[k];
        }
        assert_close(&x, &floats(&loop_["prev_sample"][i]), &what("prev_sample"));
        prev = denoised;
    }
}

/// Euler's timesteps mapped back from Karras/exponential sigmas (or `0.25·ln σ`) are
/// fractional and inherit the last bit of torch's `x ** 0.5` and numpy's float32 `log`, both
/// SIMD approximations that vary with the CPU; all other timesteps are compared exactly.
fn sigma_derived(case: &Value) -> bool {
    let config = &case["config"];
    case["kind"] == "euler"
        && (config["use_karras_sigmas"] == true
            || config["use_exponential_sigmas"] == true
            || config["timestep_type"] == "continuous")
}

#[test]
fn matches_diffusers() {
    let goldens = goldens();
    let cases = goldens["cases"].as_array().expect("cases");
    assert!(cases.len() > 50);
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let config = SchedulerConfig::from_json(&case["config"]).expect("config");
        let kind: SchedulerKind = case["kind"].as_str().expect("kind").parse().expect("kind");
        let steps = case["steps"].as_u64().expect("steps") as u32;
        let strength = case["strength"].as_f64().map(|s| s as f32);
        let schedule =
            schedule(&config, kind, steps, strength).unwrap_or_else(|e| panic!("{name}: {e}"));
        let timesteps: Vec<f32> = schedule.steps.iter().map(|s| s.timestep).collect();
        let want = floats(&case["timesteps"]);
        if sigma_derived(case) {
            assert_eq!(timesteps.len(), want.len(), "{name}: timesteps");
            for (g, w) in timesteps.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{name}: {g} vs {w}"
                );
            }
        } else {
            assert_eq!(timesteps, want, "{name}: timesteps");
        }
        let init = case["init_noise_sigma"].as_f64().expect("init_noise_sigma") as f32;
        assert_close(
            &[schedule.init_noise_sigma],
            &[init],
            &format!("{name} init_noise_sigma"),
        );
        if !case["loop"].is_null() {
            replay(name, &schedule, strength.is_some(), &case["loop"]);
        }
    }
}

#[test]
fn timestep_embedding_matches_diffusers() {
    let goldens = goldens();
    for e in goldens["embeddings"].as_array().expect("embeddings") {
        let t = e["t"].as_f64().expect("t") as f32;
        let dim = e["dim"].as_u64().expect("dim") as usize;
        let flip = e["flip_sin_to_cos"].as_bool().expect("flip");
        let shift = e["shift"].as_f64().expect("shift") as f32;
        let got = timestep_embedding(t, dim, flip, shift);
        let want = floats(&e["values"]);
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // An ulp of an angle near 1000 rad is 6e-5.
            assert!(
                (g - w).abs() <= 1e-4,
                "t {t} dim {dim} shift {shift} [{i}]: got {g}, want {w}"
            );
        }
    }
}

#[test]
fn noise_is_pinned_and_matches_the_reference_implementation() {
    // Pinned: a change here changes every seeded image.
    let first = gaussian_noise(7, 4);
    assert_eq!(first, PINNED_SEED_7);
    let goldens = goldens();
    assert_eq!(
        gaussian_noise(7, 8),
        floats(&goldens["noise"]["gaussian_noise_7_8"])
    );
    assert_eq!(
        step_noise(7, 3, 5),
        floats(&goldens["noise"]["step_noise_7_3_5"])
    );
    // Odd lengths are prefixes of longer draws.
    assert_eq!(gaussian_noise(7, 3), gaussian_noise(7, 8)[..3]);
    assert_ne!(step_noise(7, 0, 4), step_noise(7, 1, 4));
    assert_ne!(step_noise(7, 0, 4), gaussian_noise(7, 4));
}

const PINNED_SEED_7: [f32; 4] = [1.3649923, 0.14452122, -0.39652398, -0.22759631];

#[test]
fn noise_is_standard_normal() {
    let n = 100_000;
    let v = gaussian_noise(12345, n);
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
    let var = v
        .iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / n as f64;
    assert!(mean.abs() < 0.015, "mean {mean}");
    assert!((var - 1.0).abs() < 0.02, "variance {var}");
    let beyond_2 = v.iter().filter(|x| x.abs() > 2.0).count() as f64 / n as f64;
    assert!((beyond_2 - 0.0455).abs() < 0.004, "P(|x| > 2) = {beyond_2}");
}

#[test]
fn kinds_round_trip_and_default_from_the_class() {
    for kind in SchedulerKind::ALL {
        assert_eq!(kind.name().parse::<SchedulerKind>().expect("parse"), kind);
    }
    assert!("ddim".parse::<SchedulerKind>().is_err());
    let kind_of = |class: &str| {
        SchedulerConfig::from_json(&json!({ "_class_name": class }))
            .expect("config")
            .default_kind()
    };
    assert_eq!(kind_of("EulerDiscreteScheduler"), SchedulerKind::Euler);
    assert_eq!(
        kind_of("EulerAncestralDiscreteScheduler"),
        SchedulerKind::EulerAncestral
    );
    assert_eq!(
        kind_of("DPMSolverMultistepScheduler"),
        SchedulerKind::DpmPp2mKarras
    );
    assert_eq!(kind_of("LCMScheduler"), SchedulerKind::Lcm);
    assert_eq!(kind_of("PNDMScheduler"), SchedulerKind::Euler);
    let spacing = |v: Value| {
        SchedulerConfig::from_json(&v)
            .expect("config")
            .timestep_spacing()
    };
    assert_eq!(
        spacing(json!({ "timestep_spacing": "trailing" })),
        "trailing"
    );
    assert_eq!(
        spacing(json!({ "_class_name": "PNDMScheduler" })),
        "linspace"
    );
    assert_eq!(spacing(json!({ "_class_name": "LCMScheduler" })), "leading");
}

#[test]
fn ancestral_steps_keep_the_next_sigma() {
    // σ_down² + σ_up² = σ_next² (here from σ = 4096, where diffusers' float32 form is noise).
    let config = SchedulerConfig::from_json(&json!({
        "beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012,
        "rescale_betas_zero_snr": true, "timestep_spacing": "trailing",
    }))
    .expect("config");
    let ancestral = schedule(&config, SchedulerKind::EulerAncestral, 4, None).expect("schedule");
    let euler = schedule(&config, SchedulerKind::Euler, 4, None).expect("schedule");
    // √(2²⁴ − 1), correctly rounded (torch's approximate `** 0.5` gives 4096).
    assert_eq!(ancestral.init_noise_sigma, 4095.9998);
    for (i, (a, e)) in ancestral.steps.iter().zip(&euler.steps).enumerate() {
        let sigma = 1.0 / f64::from(a.c_in).powi(2) - 1.0;
        let sigma = sigma.sqrt();
        // Euler's a is σ_next/σ; the ancestral a is σ_down/σ.
        let next = f64::from(e.a) * sigma;
        let down = f64::from(a.a) * sigma;
        let up = f64::from(a.d);
        let err = (down * down + up * up - next * next).abs();
        assert!(
            err <= 1e-5 * next * next + 1e-9,
            "step {i}: {down} {up} {next}"
        );
    }
}

fn message(result: Result<Schedule, Error>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn refuses_what_cannot_run() {
    let sd = SchedulerConfig::from_json(&json!({
        "beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012,
    }))
    .expect("config");
    let euler = SchedulerKind::Euler;
    assert!(message(schedule(&sd, euler, 0, None)).contains("at least 1"));
    assert!(message(schedule(&sd, euler, 1001, None)).contains("1000 timesteps"));
    assert!(message(schedule(&sd, euler, 10, Some(0.05))).contains("leaves no step"));
    assert!(message(schedule(&sd, euler, 10, Some(0.0))).contains("leaves no step"));
    assert!(message(schedule(&sd, euler, 10, Some(1.5))).contains("between 0 and 1"));
    assert!(message(schedule(&sd, euler, 10, Some(f32::NAN))).contains("between 0 and 1"));
    assert!(message(schedule(&sd, SchedulerKind::Lcm, 51, None)).contains("at most 50"));
    // 0.7 as the user wrote it: 7 of 10 steps, as in Python (not 6, as 0.7f32 widened gives).
    let img = schedule(&sd, euler, 10, Some(0.7)).expect("img2img");
    assert_eq!(img.steps.len(), 7);

    let bad = |v: Value| {
        SchedulerConfig::from_json(&v)
            .map(|_| ())
            .expect_err("invalid")
            .to_string()
    };
    assert!(bad(json!({ "beta_schedule": "sigmoid" })).contains("beta_schedule"));
    assert!(bad(json!({ "prediction_type": "flow_prediction" })).contains("prediction_type"));
    assert!(bad(json!({ "steps_offset": 1.5 })).contains("steps_offset"));
    assert!(bad(json!([])).contains("JSON object"));
    let clip = SchedulerConfig::from_json(&json!({ "clip_sample": true })).expect("config");
    assert!(message(schedule(&clip, SchedulerKind::Lcm, 4, None)).contains("clip_sample"));
    assert!(schedule(&clip, euler, 4, None).is_ok());
}

#[test]
fn reads_config_files() {
    let dir = std::env::temp_dir().join(format!("backpack-scheduler-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let good = dir.join("scheduler_config.json");
    std::fs::write(
        &good,
        r#"{"_class_name": "LCMScheduler", "original_inference_steps": 50, "trained_betas": null}"#,
    )
    .expect("write");
    let config = SchedulerConfig::from_file(&good).expect("read");
    assert_eq!(config.default_kind(), SchedulerKind::Lcm);
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"timestep_spacing": "sideways"}"#).expect("write");
    let err = SchedulerConfig::from_file(&bad)
        .map(|_| ())
        .expect_err("invalid");
    assert!(
        matches!(err, Error::Load(crate::load::LoadError::Config { .. })),
        "{err}"
    );
    let missing = SchedulerConfig::from_file(&dir.join("none.json")).map(|_| ());
    assert!(matches!(
        missing,
        Err(Error::Load(crate::load::LoadError::Missing { .. }))
    ));
    std::fs::remove_dir_all(&dir).expect("clean up");
}
