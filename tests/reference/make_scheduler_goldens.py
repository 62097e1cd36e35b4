#!/usr/bin/env python3
"""Goldens for the diffusion schedulers (engine/src/models/diffusion/scheduler/).

Runs diffusers' own schedulers (EulerDiscrete, EulerAncestralDiscrete, DPMSolverMultistep as
DPM++ 2M Karras, LCM) over many scheduler configs, step counts and img2img strengths, and
records what the Rust scheduler must reproduce:

  timesteps          the timesteps the UNet sees (after img2img truncation)
  init_noise_sigma   the text-to-image noise scale
  loop               a simulated denoising loop on 12 values: the start latent, and per step
                     the scaled model input, the denoised (x0) prediction and the next sample.
                     Model outputs and injected noise come from the engine's own seeded
                     generator (re-implemented below), so the Rust test regenerates them
                     from the seeds; the schedulers' `randn_tensor` is monkeypatched to
                     return that noise. The loop runs in float64 (the schedulers' sigmas
                     stay float32), so the goldens carry no float32 rounding of the
                     samples themselves.

Also: diffusers' `get_timestep_embedding` for dims 320 and 256, and the first values of the
seeded noise generator.

Run from the repository root (needs torch, numpy and diffusers; no model downloads):

    pip install diffusers
    python3 tests/reference/make_scheduler_goldens.py

It writes tests/fixtures/goldens/scheduler_steps.json, replayed by
`cargo test -p backpack-engine --lib diffusion::scheduler`.
"""

import json
import math
import os

import diffusers
import numpy as np
import torch
from diffusers import (
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    LCMScheduler,
)
from diffusers.models.embeddings import get_timestep_embedding
from diffusers.schedulers import scheduling_euler_ancestral_discrete, scheduling_lcm

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "goldens", "scheduler_steps.json")
LEN = 12
MASK = (1 << 64) - 1

# ---- The engine's seeded noise (scheduler/noise.rs documents the same algorithm) ----


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def gaussian_noise(seed, n):
    state = seed & MASK
    out = []

    def next_u64():
        nonlocal state
        state = (state + 0x9E3779B97F4A7C15) & MASK
        return mix64(state)

    while len(out) < n:
        u1 = ((next_u64() >> 11) + 1) * 2.0**-53
        u2 = (next_u64() >> 11) * 2.0**-53
        r = math.sqrt(-2.0 * math.log(u1))
        theta = 2.0 * math.pi * u2
        out.append(float(np.float32(r * math.cos(theta))))
        out.append(float(np.float32(r * math.sin(theta))))
    return out[:n]


def step_noise(seed, step, n):
    return gaussian_noise(mix64((seed ^ mix64(step + 1)) & MASK), n)


# ---- Scheduler configs as the models ship them (scheduler/scheduler_config.json) ----

SD15 = {  # runwayml/stable-diffusion-v1-5: PNDM, no timestep_spacing key
    "_class_name": "PNDMScheduler",
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "num_train_timesteps": 1000,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "trained_betas": None,
    "clip_sample": False,
}
SD21V = {  # stabilityai/stable-diffusion-2-1: DDIM, v-prediction
    "_class_name": "DDIMScheduler",
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "clip_sample": False,
    "num_train_timesteps": 1000,
    "prediction_type": "v_prediction",
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "trained_betas": None,
}
SDXL = {  # stabilityai/stable-diffusion-xl-base-1.0
    "_class_name": "EulerDiscreteScheduler",
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "clip_sample": False,
    "interpolation_type": "linear",
    "num_train_timesteps": 1000,
    "prediction_type": "epsilon",
    "sample_max_value": 1.0,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "trained_betas": None,
    "use_karras_sigmas": False,
}
SD_TURBO = dict(SDXL, timestep_spacing="trailing")
SDXL_TURBO = dict(SD_TURBO, _class_name="EulerAncestralDiscreteScheduler")
LCM_DREAMSHAPER = {  # SimianLuo/LCM_Dreamshaper_v7
    "_class_name": "LCMScheduler",
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "clip_sample": False,
    "num_train_timesteps": 1000,
    "original_inference_steps": 50,
    "prediction_type": "epsilon",
    "set_alpha_to_one": True,
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "trained_betas": None,
}
DPM_SDXL = dict(SDXL, _class_name="DPMSolverMultistepScheduler", use_karras_sigmas=True)

CLASSES = {
    "euler": EulerDiscreteScheduler,
    "euler_a": EulerAncestralDiscreteScheduler,
    "dpmpp_2m_karras": DPMSolverMultistepScheduler,
    "lcm": LCMScheduler,
}


def forced(kind):
    """What the Rust kind fixes regardless of the file (DPM++ 2M Karras is one algorithm)."""
    if kind == "dpmpp_2m_karras":
        return {"use_karras_sigmas": True, "algorithm_type": "dpmsolver++", "solver_order": 2}
    return {}


def cases():
    out = []

    def add(name, kind, config, steps, strength=None, loop=True):
        out.append(dict(name=name, kind=kind, config=config, steps=steps, strength=strength, loop=loop))

    for kind in ["euler", "euler_a", "dpmpp_2m_karras", "lcm"]:
        for n in [1, 2, 3, 4, 10, 25]:
            add(f"sd15-{kind}-{n}", kind, SD15, n)
        add(f"sd21v-{kind}-10", kind, SD21V, 10)
    for n in [1, 2, 3, 4]:
        add(f"sd-turbo-euler-{n}", "euler", SD_TURBO, n)
        add(f"sdxl-turbo-euler_a-{n}", "euler_a", SDXL_TURBO, n)
    for n in [1, 4, 25]:
        add(f"sdxl-euler-{n}", "euler", SDXL, n)
    for n in [1, 2, 4, 8]:
        add(f"lcm-dreamshaper-{n}", "lcm", LCM_DREAMSHAPER, n)
    # Euler options.
    add("euler-karras-10", "euler", dict(SDXL, use_karras_sigmas=True), 10)
    add("euler-karras-trailing-4", "euler", dict(SD_TURBO, use_karras_sigmas=True), 4)
    add("euler-exponential-6", "euler", dict(SDXL, use_exponential_sigmas=True), 6)
    add("euler-log-linear-5", "euler", dict(SDXL, interpolation_type="log_linear"), 5)
    add("euler-sigma-min-5", "euler", dict(SDXL, final_sigmas_type="sigma_min"), 5)
    add("euler-sample-4", "euler", dict(SDXL, prediction_type="sample"), 4)
    add("euler-linear-defaults-5", "euler", {"_class_name": "EulerDiscreteScheduler"}, 5)
    add("euler-cosine-5", "euler", {"beta_schedule": "squaredcos_cap_v2"}, 5)
    add(
        "euler-zsnr-vpred-continuous-4",
        "euler",
        dict(SD21V, rescale_betas_zero_snr=True, timestep_spacing="trailing", timestep_type="continuous"),
        4,
    )
    add("euler-zsnr-vpred-6", "euler", dict(SD21V, rescale_betas_zero_snr=True, timestep_spacing="trailing"), 6)
    # Timesteps only: from σ = 4096 diffusers' σ_down = sqrt(σ_next² − σ_up²) cancels to float32
    # rounding noise of torch's pow (the Rust side uses the exact σ_next²/σ).
    add(
        "euler_a-zsnr-vpred-4",
        "euler_a",
        dict(SD21V, rescale_betas_zero_snr=True, timestep_spacing="trailing"),
        4,
        loop=False,
    )
    add("euler_a-linspace-5", "euler_a", dict(SDXL, timestep_spacing="linspace"), 5)
    # DPM++ 2M options.
    add("dpm-sigma-min-10", "dpmpp_2m_karras", dict(DPM_SDXL, final_sigmas_type="sigma_min"), 10)
    add("dpm-sigma-min-20", "dpmpp_2m_karras", dict(DPM_SDXL, final_sigmas_type="sigma_min"), 20)
    add(
        "dpm-sigma-min-euler-final-20",
        "dpmpp_2m_karras",
        dict(DPM_SDXL, final_sigmas_type="sigma_min", euler_at_final=True),
        20,
    )
    add(
        "dpm-sigma-min-no-lower-final-6",
        "dpmpp_2m_karras",
        dict(DPM_SDXL, final_sigmas_type="sigma_min", lower_order_final=False),
        6,
    )
    add("dpm-heun-8", "dpmpp_2m_karras", dict(DPM_SDXL, solver_type="heun"), 8)
    add("dpm-sample-5", "dpmpp_2m_karras", dict(DPM_SDXL, prediction_type="sample"), 5)
    add("dpm-cosine-6", "dpmpp_2m_karras", {"beta_schedule": "squaredcos_cap_v2"}, 6)
    add("dpm-zsnr-vpred-6", "dpmpp_2m_karras", dict(SD21V, rescale_betas_zero_snr=True), 6)
    # LCM options.
    add("lcm-vpred-4", "lcm", dict(LCM_DREAMSHAPER, prediction_type="v_prediction"), 4)
    add("lcm-sample-3", "lcm", dict(LCM_DREAMSHAPER, prediction_type="sample"), 3)
    add("lcm-orig-20-scaling-5-4", "lcm", dict(LCM_DREAMSHAPER, original_inference_steps=20, timestep_scaling=5.0), 4)
    # Image-to-image.
    for s in [0.3, 0.5, 1.0]:
        add(f"img2img-sd15-euler-10-{s}", "euler", SD15, 10, s)
        add(f"img2img-sdxl-euler-10-{s}", "euler", SDXL, 10, s)
        add(f"img2img-turbo-euler_a-4-{s}", "euler_a", SDXL_TURBO, 4, s)
        add(f"img2img-dpm-10-{s}", "dpmpp_2m_karras", DPM_SDXL, 10, s)
        add(f"img2img-lcm-4-{s}", "lcm", LCM_DREAMSHAPER, 4, s)
    add("img2img-dpm-sigma-min-20-0.7", "dpmpp_2m_karras", dict(DPM_SDXL, final_sigmas_type="sigma_min"), 20, 0.7)
    add("img2img-lcm-8-0.7", "lcm", LCM_DREAMSHAPER, 8, 0.7)
    add("img2img-sd21v-euler_a-6-0.5", "euler_a", SD21V, 6, 0.5)
    # Timesteps only (long schedules and numpy corner cases).
    add("trailing-61", "euler", SD_TURBO, 61, loop=False)  # np.arange yields 62 timesteps
    add("trailing-16", "euler", SD_TURBO, 16, loop=False)  # x.5 timesteps round half to even
    add("leading-7", "euler", SDXL, 7, loop=False)
    add("linspace-7", "euler", dict(SDXL, timestep_spacing="linspace"), 7, loop=False)
    add("linspace-50", "euler", SD15, 50, loop=False)
    add("euler-karras-50", "euler", dict(SDXL, use_karras_sigmas=True), 50, loop=False)
    add("dpm-50", "dpmpp_2m_karras", DPM_SDXL, 50, loop=False)
    add("dpm-cosine-30", "dpmpp_2m_karras", {"beta_schedule": "squaredcos_cap_v2"}, 30, loop=False)
    add("lcm-50", "lcm", LCM_DREAMSHAPER, 50, loop=False)
    add("lcm-7", "lcm", LCM_DREAMSHAPER, 7, loop=False)
    add("img2img-trailing-61-0.5", "euler", SD_TURBO, 61, 0.5, loop=False)
    return out


# ---- Running diffusers ----

_noise = {"value": None}


def fake_randn(shape, generator=None, device=None, dtype=None, layout=None):
    value = _noise["value"]
    assert value is not None and tuple(value.shape) == tuple(shape), "unexpected randn_tensor call"
    return value.to(dtype=dtype)


scheduling_euler_ancestral_discrete.randn_tensor = fake_randn
scheduling_lcm.randn_tensor = fake_randn


def tensor(values):
    return torch.tensor(values, dtype=torch.float64)


def r(x):
    """Seven significant digits: ample for the 1e-4 comparisons and keeps the file small."""
    return float(f"{float(x):.7g}")


def rs(v):
    return [r(x) for x in v.tolist()]


def run_case(index, case):
    kind = case["kind"]
    sched = CLASSES[kind].from_config({**case["config"], **forced(kind)})
    n = case["steps"]
    sched.set_timesteps(n)
    order = sched.order
    timesteps = sched.timesteps
    strength = case["strength"]
    if strength is not None:
        # StableDiffusionImg2ImgPipeline.get_timesteps
        init_timestep = min(int(n * strength), n)
        t_start = max(n - init_timestep, 0)
        timesteps = timesteps[t_start * order :]
        sched.set_begin_index(t_start * order)
    else:
        sched.set_begin_index(0)
    result = {
        "name": case["name"],
        "kind": kind,
        "config": case["config"],
        "steps": n,
        "strength": strength,
        "timesteps": [float(t) for t in timesteps.tolist()],
        "init_noise_sigma": float(sched.init_noise_sigma),
        "loop": None,
    }
    if not case["loop"]:
        return result
    seeds = {name: 1000 * (index + 1) + k for k, name in enumerate(["init", "image", "out", "noise"])}
    noise0 = tensor(gaussian_noise(seeds["init"], LEN))
    if strength is None:
        x = noise0 * float(sched.init_noise_sigma)
    else:
        image = tensor(gaussian_noise(seeds["image"], LEN))
        x = sched.add_noise(image, noise0, timesteps[:1])
    loop = {"seeds": seeds, "x_start": rs(x), "model_input": [], "denoised": [], "prev_sample": []}
    for i, t in enumerate(timesteps):
        model_input = sched.scale_model_input(x, t)
        out = tensor(step_noise(seeds["out"], i, LEN))
        _noise["value"] = tensor(step_noise(seeds["noise"], i, LEN))
        step = sched.step(out, t, x)
        _noise["value"] = None
        if kind == "dpmpp_2m_karras":
            denoised = sched.model_outputs[-1]
        elif kind == "lcm":
            denoised = step.denoised
        else:
            denoised = step.pred_original_sample
        x = step.prev_sample.to(torch.float64)
        loop["model_input"].append(rs(model_input))
        loop["denoised"].append(rs(denoised))
        loop["prev_sample"].append(rs(x))
    result["loop"] = loop
    return result


def embeddings():
    out = []
    for dim, ts in [(320, [0.0, 261.5, 999.0]), (256, [0.0, 1024.0])]:
        for shift in [0.0, 1.0]:
            for t in ts:
                emb = get_timestep_embedding(
                    torch.tensor([t], dtype=torch.float32), dim, flip_sin_to_cos=True, downscale_freq_shift=shift
                )
                out.append({"t": t, "dim": dim, "flip_sin_to_cos": True, "shift": shift, "values": rs(emb[0])})
    emb = get_timestep_embedding(torch.tensor([37.0]), 7, flip_sin_to_cos=False, downscale_freq_shift=1.0)
    out.append({"t": 37.0, "dim": 7, "flip_sin_to_cos": False, "shift": 1.0, "values": rs(emb[0])})
    return out


def main():
    goldens = {
        "generator": "tests/reference/make_scheduler_goldens.py",
        "diffusers": diffusers.__version__,
        "torch": torch.__version__,
        "len": LEN,
        "noise": {
            "gaussian_noise_7_8": gaussian_noise(7, 8),
            "step_noise_7_3_5": step_noise(7, 3, 5),
        },
        "embeddings": embeddings(),
        "cases": [run_case(i, c) for i, c in enumerate(cases())],
    }
    text = json.dumps(goldens, separators=(",", ":"))
    with open(OUT, "w") as f:
        f.write(text + "\n")
    print(f"wrote {OUT}: {len(goldens['cases'])} cases, {len(text) // 1024} KiB")


if __name__ == "__main__":
    main()
