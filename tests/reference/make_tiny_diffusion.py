#!/usr/bin/env python3
"""Build tiny random Stable Diffusion pipelines (diffusers folder layout) and golden outputs from
diffusers, for testing Backpack's image-generation code without downloading a real model.

What it makes (no arguments; CPU only, no network; needs torch, transformers 5, diffusers, regex,
safetensors, numpy):

    tests/fixtures/models/
        tiny-sd/            SD 1.x shaped: CLIPTextModel (quick_gelu), UNet with conv 1x1 proj_in/out
                            and attention_head_dim 8, AutoencoderKL (scaling 0.18215), EulerDiscrete
                            with SD 1.5's betas, "leading" spacing, steps_offset 1, epsilon
        tiny-sd-fp16/       the same weights rounded to float16, saved only as *.fp16.safetensors
                            (diffusers' variant="fp16" files), for testing variant loading
        tiny-sd-turbo/      SD 2.x / SD-Turbo shaped: CLIPTextModel (gelu, last hidden state), linear
                            proj_in/out, attention_head_dim [2, 4], tokenizer pad "!", EulerDiscrete
                            "trailing" epsilon
        tiny-sd2-v/         the same weights as tiny-sd-turbo with a v_prediction, "leading",
                            steps_offset 1 scheduler (SD 2.1 768-v style); only model_index.json
                            and scheduler/ are kept, the rest is tiny-sd-turbo's
        tiny-sdxl/          SDXL shaped: text_encoder (CLIP, quick_gelu) + text_encoder_2
                            (CLIPTextModelWithProjection, gelu, projection 32), tokenizer_2 pad "!",
                            UNet with addition_embed_type "text_time", transformer depth [1, 2],
                            VAE scaling 0.13025, EulerAncestral "trailing", force_zeros_for_empty_prompt
        tiny-taesd/         AutoencoderTiny (madebyollin/taesd layout: config.json +
                            diffusion_pytorch_model.safetensors at the folder root)
        tiny-sd.safetensors     tiny-sd as one original-layout (LDM) checkpoint, float32
        tiny-sdxl.safetensors   tiny-sdxl as one original-layout (SGM) checkpoint, float16
                                (both written and verified by diffusers_to_single_file.py)
    tests/fixtures/goldens/
        tiny-sd.safetensors, tiny-sd-turbo.safetensors, tiny-sd2-v.safetensors, tiny-sdxl.safetensors,
        tiny-taesd.safetensors      float32 tensors, diffusers' own layouts (NCHW; images from
                                    output_type="np" are NHWC floats in 0..1)
        diffusion.json              what every golden tensor is and how it was made (see below)
        schedulers.json             scheduler-only goldens (timesteps, sigmas, step-by-step updates)
        single_file_keys.json       original <-> diffusers key pairs of the single-file checkpoints
                                    and the general mapping rules
    tests/reference/configs/{sd-turbo,sdxl-turbo}/tokenizer*/   copies of the tiny tokenizer for the
                                    real-architecture config folders (bench_diffusers.py)

Sizes: the architectures keep every structural feature of the real models (block types, attention
layouts, transformer depths, added conditioning, 4-level VAE with 1/8 latents) but with few channels
(UNet block_out_channels (16, 32) ((32, 32) for SD 1.x's eight heads), VAE (8, 16, 16, 16), text encoders hidden 64 with one 64-wide
head as in CLIP) so the fixtures stay small.

Tokenizer: a real CLIP byte-level BPE with a small vocabulary (clip_bpe.py: 256 byte symbols, their
"</w>" forms, 400 merges learnt from an embedded English corpus, <|startoftext|>, <|endoftext|>;
914 entries). Each tokenizer folder holds only the classic files (vocab.json, merges.txt,
tokenizer_config.json, special_tokens_map.json; no tokenizer.json). Token ids from transformers'
CLIPTokenizer loaded from each folder are checked against a port of OpenAI's reference tokenizer.

Weights: drawn from seeded generators, with matrices at std gain/sqrt(fan_in), norm scales 1 + 0.1 N,
biases 0.05 N and embeddings 0.5 N, so activations stay O(1) through every block and the images are
neither constant nor saturated (checked: pixel std > 0.05, at most 20% of pixels clipped). Text
encoder weights are stored with the "text_model." key prefix every published checkpoint has
(transformers >= 5.6 writes CLIPTextModel without it and reads both).

Golden conventions (per pipeline, see diffusion.json "pipelines.<name>.tensors" for the full list):
    prompt.ids / negative.ids        [1,77] token ids as diffusers pads them (f32); SDXL adds *.ids_2
    text.*                           pipe.encode_prompt(...) outputs, exactly what the UNet receives
    unet.latents, unet.out.<t>       one UNet call at timestep t (999 and 501) on text.prompt_embeds
    vae.latents -> vae.image         vae.decode(latents / scaling_factor).sample (raw, about -1..1)
    vae.encode_input -> vae.encode_mean / vae.encode_std     latent_dist before scaling
    image.init_latents               the latents= passed to the pipeline (unscaled: the pipeline
                                     multiplies them by scheduler.init_noise_sigma)
    image.<scheduler>.<steps>        pipeline output, output_type="np" [1,64,64,3]
    image.<scheduler>.<steps>.latents   the same run with output_type="latent" (before the VAE)
    img2img.*                        img2img pipeline with every random draw stored (tiny-sd, tiny-sdxl)

Run from anywhere:

    python3 tests/reference/make_tiny_diffusion.py

Running it again regenerates identical files (torch runs single-threaded for that).
"""

import contextlib
import copy
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import clip_bpe  # noqa: E402
import diffusers_to_single_file as d2s  # noqa: E402

import diffusers  # noqa: E402
import safetensors  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from diffusers import (  # noqa: E402
    AutoencoderKL,
    AutoencoderTiny,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    LCMScheduler,
    StableDiffusionImg2ImgPipeline,
    StableDiffusionPipeline,
    StableDiffusionXLImg2ImgPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer  # noqa: E402

ROOT = HERE.parents[1]
MODELS = ROOT / "tests" / "fixtures" / "models"
GOLDENS = ROOT / "tests" / "fixtures" / "goldens"

PROMPT = "a red fox in the snow, highly detailed"
NEGATIVE = "blurry"
HEIGHT = WIDTH = 64
N_MERGES = 400
SD15_BETAS = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000)

# seeds: weights
SEED_TE, SEED_TE2, SEED_UNET, SEED_VAE, SEED_TAESD = 11, 12, 13, 14, 15
# seeds: golden inputs
SEED_UNET_LATENTS, SEED_VAE_LATENTS, SEED_INIT_LATENTS, SEED_GEN, SEED_TAESD_LATENTS = 101, 102, 103, 104, 105

TOKENIZER_CASES = [
    PROMPT,
    NEGATIVE,
    "",
    "A photograph of an astronaut riding a horse on Mars, 4k, trending on artstation",
    "Café  über 42 cats!!  :-) 東京 🦊",
    "?! wow!!! a!b it's the CAT's toy",
    "tab\tnew\nline   UPPER lower",
    "a castle " * 40 + "at dawn",
]


# --------------------------------------------------------------------------------------------------
# small helpers


def randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def f32(t):
    return t.detach().to(torch.float32).contiguous().clone()


def rm(path):
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def to_json(obj, indent=0):
    """JSON with short containers and every list of plain numbers / strings on one line."""
    flat = json.dumps(obj, ensure_ascii=False, allow_nan=False)
    scalars = isinstance(obj, list) and all(not isinstance(x, (list, dict)) for x in obj)
    if not isinstance(obj, (list, dict)) or scalars or len(flat) <= 120:
        return flat
    pad = " " * (indent + 1)
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {to_json(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    return "[\n" + ",\n".join(pad + to_json(v, indent + 1) for v in obj) + "\n" + " " * indent + "]"


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_json(obj) + "\n")


def flist(t):
    """Numbers of a tensor as a list; float32 values in their shortest float32 spelling (they parse back
    to the identical float32)."""
    t = torch.as_tensor(t).detach().flatten()
    if t.dtype == torch.float32:
        return [float(str(np.float32(x))) for x in t.tolist()]
    return [float(x) for x in t.to(torch.float64).tolist()]


@contextlib.contextmanager
def patched_randn(replay=None, strict=True):
    """Record (or, with `replay`, supply) every diffusers randn_tensor call: the VAE posterior sample,
    the img2img noise, scheduler noise. diffusers modules import randn_tensor by name, so the name is
    replaced in each loaded diffusers module. With `strict`, every replayed tensor must be used."""
    from diffusers.utils import torch_utils

    orig = torch_utils.randn_tensor
    calls = []
    queue = list(replay) if replay is not None else None

    def fake(shape, generator=None, device=None, dtype=None, layout=None):
        if queue is not None:
            t = queue.pop(0)
            assert tuple(t.shape) == tuple(shape), (t.shape, shape)
            t = t.to(dtype=dtype or torch.float32)
        else:
            t = orig(shape, generator=generator, device=device, dtype=dtype, layout=layout)
        calls.append(t.clone())
        return t

    mods = [m for n, m in sys.modules.items() if n.startswith("diffusers") and getattr(m, "randn_tensor", None) is orig]
    for m in mods:
        m.randn_tensor = fake
    try:
        yield calls
    finally:
        for m in mods:
            m.randn_tensor = orig
        if queue is not None and strict:
            assert not queue, "not every replayed tensor was used"


# --------------------------------------------------------------------------------------------------
# weights


def init_weights(model, seed, gains=()):
    """Seeded init that keeps activations O(1): matrices std gain/sqrt(fan_in); norm scales
    1 + 0.1 N, norm shifts 0.1 N; embeddings 0.5 N; other biases 0.05 N. `gains` is a list of
    (name substring, gain) pairs; the first match wins (default gain 1)."""
    gen = torch.Generator().manual_seed(seed)
    norm_ids, emb_ids = set(), set()
    for mod in model.modules():
        if isinstance(mod, (nn.LayerNorm, nn.GroupNorm)):
            norm_ids |= {id(p) for p in mod.parameters(recurse=False)}
        if isinstance(mod, nn.Embedding):
            emb_ids |= {id(p) for p in mod.parameters(recurse=False)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=gen)
            if id(p) in norm_ids:
                v = 1.0 + 0.1 * z if name.endswith("weight") else 0.1 * z
            elif id(p) in emb_ids:
                v = 0.5 * z
            elif p.ndim >= 2:
                gain = next((g for s, g in gains if s in name), 1.0)
                v = z * gain / math.sqrt(p[0].numel())
            else:
                v = 0.05 * z
            p.copy_(v)
    return model.eval()


def clip_config(vocab_size, act, projection_dim=64):
    # bos/eos/pad ids as in the published SD configs (0/2/1): eos_token_id 2 selects transformers'
    # legacy pooled-output rule "position of the largest token id", i.e. the first <|endoftext|>.
    return CLIPTextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
        max_position_embeddings=77, hidden_act=act, layer_norm_eps=1e-5, projection_dim=projection_dim,
        bos_token_id=0, eos_token_id=2, pad_token_id=1, attention_dropout=0.0, dropout=0.0,
    )


def make_vae(scaling_factor):
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, sample_size=HEIGHT,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 16, 16), layers_per_block=1, norm_num_groups=8, act_fn="silu",
        scaling_factor=scaling_factor,
    )
    init_weights(vae, SEED_VAE, gains=[("decoder.conv_out", 0.8)])
    with torch.no_grad():
        # quant_conv outputs the posterior's mean (channels 0..3) and log-variance (4..7): scale the mean
        # up to a real VAE's spread (std ~4, ~0.7 after scaling_factor) and make the posterior narrow
        # (std ~exp(-2.5)), as trained VAEs have it, so img2img latents are mostly image, little noise.
        vae.quant_conv.weight[:4] *= 10.0
        vae.quant_conv.weight[4:] *= 0.1
        vae.quant_conv.bias[4:] -= 5.0
    return vae


def make_unet(kind):
    # SD 1.x reads attention_head_dim as 8 heads: 32 channels keep each head 4 wide, the smallest a
    # real model's heads could be (they are 40 to 160).
    # A single-file checkpoint does not say its GroupNorm group count; the converter assumes SD's 32
    # wherever the channels allow, so the SD 1.x model (the one converted) uses 32 groups.
    channels = (32, 32) if kind == "sd1" else (16, 32)
    groups = 32 if kind == "sd1" else 8
    common = dict(sample_size=HEIGHT // 8, in_channels=4, out_channels=4, block_out_channels=channels,
                  layers_per_block=1, norm_num_groups=groups)
    if kind == "sd1":
        unet = UNet2DConditionModel(
            **common, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=64, attention_head_dim=8,
            use_linear_projection=False)
    elif kind == "sd2":
        unet = UNet2DConditionModel(
            **common, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=64, attention_head_dim=(2, 4),
            use_linear_projection=True)
    else:
        unet = UNet2DConditionModel(
            **common, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=128, attention_head_dim=(2, 4),
            transformer_layers_per_block=(1, 2), use_linear_projection=True, addition_embed_type="text_time",
            addition_time_embed_dim=8, projection_class_embeddings_input_dim=6 * 8 + 32)
    return init_weights(unet, SEED_UNET, gains=[("conv_out", 0.7), ("attn2.to_out", 2.0)])


# --------------------------------------------------------------------------------------------------
# tokenizer


class Vocab:
    def __init__(self):
        self.merges = clip_bpe.learn_merges(clip_bpe.CORPUS, N_MERGES)
        assert len(self.merges) == N_MERGES
        self.vocab = clip_bpe.build_vocab(self.merges)

    def write(self, folder, pad_token):
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "vocab.json", "w", encoding="utf-8") as f:
            json.dump(self.vocab, f, ensure_ascii=False)
        with open(folder / "merges.txt", "w", encoding="utf-8") as f:
            f.write(clip_bpe.merges_text(self.merges))
        specials = {"bos_token": clip_bpe.BOS, "eos_token": clip_bpe.EOS, "pad_token": pad_token, "unk_token": clip_bpe.EOS}
        write_json(folder / "special_tokens_map.json", specials)
        write_json(folder / "tokenizer_config.json", {
            "add_prefix_space": False, "do_lower_case": True, "errors": "replace", "model_max_length": 77,
            "tokenizer_class": "CLIPTokenizer", **specials})

    def check(self, folder, pad_token):
        """transformers' tokenizer from `folder` against the reference port; returns the cases."""
        tok = CLIPTokenizer.from_pretrained(folder)
        ref = clip_bpe.ReferenceClipTokenizer(self.vocab, self.merges, [pad_token])
        assert tok.pad_token == pad_token and tok.model_max_length == 77
        cases = []
        for text in TOKENIZER_CASES:
            got = tok(text, padding="max_length", max_length=77, truncation=True).input_ids
            want = ref.pipeline_ids(text, self.vocab[pad_token])
            assert got == want, (folder, text, got, want)
            cases.append({"text": text, "ids": ref.encode(text), "pipeline_ids": got})
        return cases


def write_tokenizers(folder, vocab, pads):
    for sub, pad in pads.items():
        rm(folder / sub)
        vocab.write(folder / sub, pad)


# --------------------------------------------------------------------------------------------------
# pipelines


def sd_scheduler(spacing, prediction, cls=EulerDiscreteScheduler):
    return cls(**SD15_BETAS, steps_offset=1, timestep_spacing=spacing, prediction_type=prediction)


def build(name, vocab, tokdir):
    if name in ("tiny-sd", "tiny-sd-turbo", "tiny-sd2-v"):
        kind = "sd1" if name == "tiny-sd" else "sd2"
        te = init_weights(CLIPTextModel(clip_config(len(vocab.vocab), "quick_gelu" if kind == "sd1" else "gelu")), SEED_TE)
        sched = {"tiny-sd": sd_scheduler("leading", "epsilon"), "tiny-sd-turbo": sd_scheduler("trailing", "epsilon"),
                 "tiny-sd2-v": sd_scheduler("leading", "v_prediction")}[name]
        tok = CLIPTokenizer.from_pretrained(tokdir / ("eot" if kind == "sd1" else "bang"))
        return StableDiffusionPipeline(
            vae=make_vae(0.18215), text_encoder=te, tokenizer=tok, unet=make_unet(kind), scheduler=sched,
            safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    te = init_weights(CLIPTextModel(clip_config(len(vocab.vocab), "quick_gelu")), SEED_TE)
    te2 = init_weights(CLIPTextModelWithProjection(clip_config(len(vocab.vocab), "gelu", projection_dim=32)), SEED_TE2)
    return StableDiffusionXLPipeline(
        vae=make_vae(0.13025), text_encoder=te, text_encoder_2=te2,
        tokenizer=CLIPTokenizer.from_pretrained(tokdir / "eot"), tokenizer_2=CLIPTokenizer.from_pretrained(tokdir / "bang"),
        unet=make_unet("sdxl"), scheduler=sd_scheduler("trailing", "epsilon", EulerAncestralDiscreteScheduler),
        force_zeros_for_empty_prompt=True, add_watermarker=False)


def restore_text_model_prefix(folder):
    """Write CLIPTextModel weights with the "text_model." prefix (the published layout)."""
    for sub in ("text_encoder", "text_encoder_2"):
        for path in sorted((folder / sub).glob("*.safetensors")) if (folder / sub).is_dir() else []:
            with safe_open(path, "pt") as f:
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            if any(k.startswith("text_model.") for k in tensors):
                continue
            save_file({"text_model." + k: v for k, v in tensors.items()}, path, metadata={"format": "pt"})


def state(model):
    sd = model.state_dict()
    return {(k if k.startswith(("text_model.", "text_projection")) or not isinstance(model, CLIPTextModel) else "text_model." + k): v
            for k, v in sd.items() if not k.endswith("position_ids")}


def assert_same_weights(a, b, cast=None):
    sa, sb = state(a), state(b)
    assert set(sa) == set(sb), (set(sa) ^ set(sb))
    for k in sa:
        want = sa[k] if cast is None else sa[k].to(cast)
        assert torch.equal(want, sb[k]), k


def save_pipeline(pipe, name, vocab, pads, variant=None):
    folder = MODELS / name
    rm(folder)
    if variant:
        copy.deepcopy(pipe).to(torch.float16).save_pretrained(folder, safe_serialization=True, variant=variant)
    else:
        pipe.save_pretrained(folder, safe_serialization=True)
    write_tokenizers(folder, vocab, pads)
    restore_text_model_prefix(folder)
    return folder


def load_pipeline(name, variant=None):
    cls = StableDiffusionXLPipeline if "xl" in name else StableDiffusionPipeline
    kw = dict(variant=variant, dtype=torch.float16) if variant else {}
    if "xl" in name:
        kw["add_watermarker"] = False
    pipe = cls.from_pretrained(MODELS / name, local_files_only=True, **kw)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# --------------------------------------------------------------------------------------------------
# golden inputs


def init_image01():
    """A smooth 64x64 RGB test picture in 0..1 (NCHW float32): gradients, a disc and stripes."""
    y, x = torch.meshgrid(torch.linspace(0, 1, HEIGHT), torch.linspace(0, 1, WIDTH), indexing="ij")
    disc = torch.sigmoid((0.22 - ((x - 0.62) ** 2 + (y - 0.4) ** 2).sqrt()) * 40)
    r = 0.15 + 0.7 * disc + 0.1 * torch.sin(6 * math.pi * y)
    g = 0.2 + 0.5 * y * (1 - disc) + 0.15 * torch.cos(4 * math.pi * x)
    b = 0.75 - 0.55 * x + 0.1 * disc
    return torch.stack([r, g, b])[None].clamp(0, 1).to(torch.float32)


def image_check(name, img):
    img = np.asarray(img, dtype=np.float64)
    assert np.isfinite(img).all(), name
    clipped = float(np.mean((img <= 0.0) | (img >= 1.0)))
    std = float(img.std())
    assert std > 0.05, f"{name}: pixel std {std:.4f}"
    assert clipped < 0.2, f"{name}: {clipped:.1%} of the pixels clipped"
    return {"std": round(std, 4), "clipped": round(clipped, 4)}


IMAGE_CASES = [
    # name, scheduler class, extra from_config kwargs, steps, guidance, negative prompt used
    ("euler", EulerDiscreteScheduler, {}, 1, 0.0, False),
    ("euler", EulerDiscreteScheduler, {}, 2, 3.0, True),
    ("dpmpp_2m_karras", DPMSolverMultistepScheduler,
     {"use_karras_sigmas": True, "algorithm_type": "dpmsolver++", "solver_order": 2}, 2, 3.0, True),
    ("lcm", LCMScheduler, {}, 1, 0.0, False),
    ("euler_a", EulerAncestralDiscreteScheduler, {}, 1, 0.0, False),
]


class Goldens:
    def __init__(self):
        self.tensors = {}
        self.meta = {}

    def put(self, name, t, desc):
        assert name not in self.tensors, name
        t = f32(torch.as_tensor(t))
        assert torch.isfinite(t).all(), name
        self.tensors[name] = t
        self.meta[name] = {"shape": list(t.shape), "desc": desc}

    def save(self, path):
        save_file(self.tensors, path, metadata={"format": "pt"})


@torch.no_grad()
def pipeline_goldens(name, pipe, default_sched_config):
    xl = isinstance(pipe, StableDiffusionXLPipeline)
    g = Goldens()
    info = {"folder": f"tests/fixtures/models/{name}", "golden": f"tests/fixtures/goldens/{name}.safetensors"}

    def ids(tok, text):
        return tok(text, padding="max_length", max_length=tok.model_max_length, truncation=True,
                   return_tensors="pt").input_ids

    g.put("prompt.ids", ids(pipe.tokenizer, PROMPT), "tokenizer ids of the prompt, padded to 77 as diffusers does")
    g.put("negative.ids", ids(pipe.tokenizer, NEGATIVE), "tokenizer ids of the negative prompt")
    if xl:
        g.put("prompt.ids_2", ids(pipe.tokenizer_2, PROMPT), "tokenizer_2 ids (pad '!' = id 0)")
        g.put("negative.ids_2", ids(pipe.tokenizer_2, NEGATIVE), "tokenizer_2 ids of the negative prompt")

    # text conditioning
    added = None
    if xl:
        pe, ne, pooled, npooled = pipe.encode_prompt(
            prompt=PROMPT, device="cpu", num_images_per_prompt=1, do_classifier_free_guidance=True,
            negative_prompt=NEGATIVE)
        g.put("text.prompt_embeds", pe, "encode_prompt: concat(text_encoder hidden_states[-2], "
              "text_encoder_2 hidden_states[-2]) on the last axis (penultimate layer, no final_layer_norm)")
        g.put("text.negative_prompt_embeds", ne, "the same for the negative prompt")
        g.put("text.pooled", pooled, "text_encoder_2 text_embeds: text_projection(final_layer_norm(last hidden)) "
              "at the first <|endoftext|> (position of the largest id)")
        g.put("text.negative_pooled", npooled, "the same for the negative prompt")
        time_ids = pipe._get_add_time_ids((HEIGHT, WIDTH), (0, 0), (HEIGHT, WIDTH), dtype=torch.float32,
                                          text_encoder_projection_dim=pipe.text_encoder_2.config.projection_dim)
        g.put("unet.add_time_ids", time_ids, "original_size (h, w) + crops_coords_top_left (top, left) + "
              "target_size (h, w) for a 64x64 image")
        added = {"text_embeds": pooled, "time_ids": time_ids}
    else:
        pe, ne = pipe.encode_prompt(PROMPT, "cpu", 1, True, NEGATIVE)
        g.put("text.prompt_embeds", pe, "encode_prompt: text encoder last_hidden_state (after final_layer_norm)")
        g.put("text.negative_prompt_embeds", ne, "the same for the negative prompt")

    # one UNet call
    unet = pipe.unet
    lat = randn(SEED_UNET_LATENTS, 1, 4, HEIGHT // 8, WIDTH // 8)
    g.put("unet.latents", lat, "UNet input sample (seeded randn)")
    g.put("unet.timesteps", torch.tensor([999.0, 501.0]), "the timesteps of unet.out.<t>")
    for t in (999, 501):
        tt = torch.tensor([float(t)])
        out = unet(lat, tt, encoder_hidden_states=pe, added_cond_kwargs=added).sample
        g.put(f"unet.out.{t}", out, f"unet(unet.latents, {t}, text.prompt_embeds"
              + (", text_embeds=text.pooled, time_ids=unet.add_time_ids" if xl else "") + ").sample")
        temb = unet.time_embedding(unet.time_proj(tt).to(torch.float32))
        g.put(f"unet.temb.{t}", temb, "time_embedding(time_proj(t)): sinusoidal (flip_sin_to_cos, shift 0) "
              "then linear-silu-linear")
    if name == "tiny-sd-turbo":
        # A 512x512 image's latent: 4096 tokens in the first level's attention, where the
        # engine computes attention head by head through matrix products.
        big = randn(SEED_UNET_LATENTS + 1, 1, 4, 64, 64)
        g.put("unet.latents_64", big, "a 64x64 UNet input (a 512x512 image's latent)")
        g.put("unet.out_64.999", unet(big, torch.tensor([999.0]), encoder_hidden_states=pe).sample,
              "unet(unet.latents_64, 999, text.prompt_embeds).sample")
    if xl:
        tid = unet.add_time_proj(time_ids.flatten()).reshape(1, -1)
        aug = unet.add_embedding(torch.cat([pooled, tid], dim=-1))
        g.put("unet.aug_emb", aug, "add_embedding(concat(text.pooled, add_time_proj(each time id) flattened)); "
              "added to the time embedding")

    # VAE
    vae = pipe.vae
    sf = vae.config.scaling_factor
    vl = randn(SEED_VAE_LATENTS, 1, 4, HEIGHT // 8, WIDTH // 8)
    g.put("vae.latents", vl, "latents in UNet space (scaled)")
    g.put("vae.image", vae.decode(vl / sf).sample, f"vae.decode(vae.latents / {sf}).sample, raw (not clamped)")
    init01 = init_image01()
    enc_in = 2.0 * init01 - 1.0
    dist = vae.encode(enc_in).latent_dist
    g.put("vae.encode_input", enc_in, "VAE encoder input, -1..1 (= 2 * img2img.init - 1)")
    g.put("vae.encode_mean", dist.mean, "vae.encode(vae.encode_input).latent_dist.mean (unscaled)")
    g.put("vae.encode_std", dist.std, "latent_dist.std = exp(0.5 * clamp(logvar, -30, 20))")

    # whole images
    init = randn(SEED_INIT_LATENTS, 1, 4, HEIGHT // 8, WIDTH // 8)
    g.put("image.init_latents", init, "latents= given to the pipeline (it multiplies them by "
          "scheduler.init_noise_sigma)")
    default_sched = pipe.scheduler
    images = []
    for sname, cls, kw, steps, guidance, use_neg in IMAGE_CASES:
        tname = f"image.{sname}.{steps}"
        results = {}
        for output_type in ("np", "latent"):
            pipe.scheduler = cls.from_config(default_sched.config, **kw)
            results[output_type] = pipe(
                prompt=PROMPT, negative_prompt=NEGATIVE if use_neg else None, height=HEIGHT, width=WIDTH,
                num_inference_steps=steps, guidance_scale=guidance, latents=init.clone(),
                generator=torch.Generator().manual_seed(SEED_GEN), output_type=output_type).images
        stats = image_check(f"{name} {tname}", results["np"])
        g.put(tname, torch.from_numpy(np.ascontiguousarray(results["np"])), "pipeline output, output_type np (NHWC, 0..1)")
        g.put(tname + ".latents", results["latent"], "the same run with output_type latent (final latents, "
              "UNet space)")
        sch = pipe.scheduler
        images.append({
            "tensor": tname, "latents_tensor": tname + ".latents", "pipeline": name, "scheduler": sname,
            "scheduler_class": cls.__name__, "scheduler_kwargs": kw, "scheduler_config": clean_config(sch.config),
            "steps": steps, "guidance": guidance, "prompt": PROMPT, "negative_prompt": NEGATIVE if use_neg else None,
            "cfg": guidance > 1.0, "width": WIDTH, "height": HEIGHT, "init_latents": "image.init_latents",
            "init_noise_sigma": float(sch.init_noise_sigma), "timesteps": flist(sch.timesteps),
            "sigmas": flist(sch.sigmas) if hasattr(sch, "sigmas") and cls is not LCMScheduler else None,
            "pixel_stats": stats,
        })
    pipe.scheduler = default_sched
    info["images"] = images

    # img2img
    if name in ("tiny-sd", "tiny-sdxl"):
        info["img2img"] = img2img_goldens(pipe, g, init01, xl)

    info["tensors"] = g.meta
    return g, info


@torch.no_grad()
def img2img_goldens(pipe, g, init01, xl):
    comps = dict(pipe.components)
    if xl:
        i2i = StableDiffusionXLImg2ImgPipeline(**comps, add_watermarker=False)
    else:
        i2i = StableDiffusionImg2ImgPipeline(**comps, requires_safety_checker=False)
    i2i.set_progress_bar_config(disable=True)
    steps, strength = 4, 0.5
    captured = {}

    def run(replay=None):
        i2i.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
        orig_add_noise = i2i.scheduler.add_noise

        def add_noise(x, noise, t):
            out = orig_add_noise(x, noise, t)
            captured.update(init_latents=x.clone(), noised=out.clone(), t=t.clone())
            return out

        i2i.scheduler.add_noise = add_noise
        with patched_randn(replay) as calls:
            img = i2i(prompt=PROMPT, image=init01.clone(), strength=strength, num_inference_steps=steps,
                      guidance_scale=0.0, generator=None if replay else torch.Generator().manual_seed(SEED_GEN),
                      output_type="np").images
        return img, calls

    img, calls = run()
    assert len(calls) == 2, len(calls)
    img2, _ = run(replay=calls)
    assert np.array_equal(img, img2), "stored img2img noise does not reproduce the pipeline output"
    stats = image_check("img2img", img)
    sch = i2i.scheduler
    g.put("img2img.init", init01, "init image, NCHW in 0..1, passed as a torch tensor (the image processor maps it "
          "to 2x-1)")
    g.put("img2img.posterior_noise", calls[0], "first randn draw: latent_dist.sample() = mean + std * this")
    g.put("img2img.noise", calls[1], "second randn draw: scheduler.add_noise(init_latents, this, timesteps[0])")
    g.put("img2img.init_latents", captured["init_latents"], "scaling_factor * (encode_mean + encode_std * "
          "posterior_noise) of img2img.init")
    g.put("img2img.noised_latents", captured["noised"], "add_noise result: init_latents + noise * sigmas[t_start] "
          "(Euler); the first UNet input before scale_model_input")
    g.put("img2img.image", torch.from_numpy(np.ascontiguousarray(img)), "img2img output, output_type np (NHWC, 0..1)")
    # The same run with a zero posterior draw starts from the encoder's mean latent (diffusers'
    # sample_mode "argmax"), which is what Backpack's image-to-image uses.
    img_mean, _ = run(replay=[torch.zeros_like(calls[0]), calls[1]])
    g.put("img2img.image_mean", torch.from_numpy(np.ascontiguousarray(img_mean)), "img2img output when the "
          "posterior draw is zero: the latent distribution's mean, then img2img.noise")
    n_run = int(min(int(steps * strength), steps))
    t_start = max(steps - n_run, 0)
    return {
        "pipeline_class": type(i2i).__name__, "scheduler_class": "EulerDiscreteScheduler",
        "scheduler_config": clean_config(sch.config), "num_inference_steps": steps, "strength": strength,
        "guidance": 0.0, "prompt": PROMPT, "negative_prompt": None, "width": WIDTH, "height": HEIGHT,
        "t_start_rule": "init_timestep = min(int(num_inference_steps * strength), num_inference_steps); "
                        "t_start = max(num_inference_steps - init_timestep, 0); timesteps = "
                        "scheduler.timesteps[t_start * order:]; scheduler.set_begin_index(t_start * order)",
        "t_start": t_start, "all_timesteps": flist(sch.timesteps), "timesteps_run": flist(sch.timesteps[t_start:]),
        "sigmas": flist(sch.sigmas), "noise_timestep": flist(captured["t"]),
        "random_draws": ["img2img.posterior_noise", "img2img.noise"],
        "image_input": "img2img.init as a float tensor in 0..1 (NCHW); VaeImageProcessor.preprocess normalizes it "
                       "to 2x-1 (= vae.encode_input) and does not resize 64x64",
        "add_time_ids": "original_size = target_size = (64, 64) of the input image, crops (0, 0); "
                        "requires_aesthetics_score false" if xl else None,
        "tensor": "img2img.image", "pixel_stats": stats,
    }


# --------------------------------------------------------------------------------------------------
# TAESD


@torch.no_grad()
def taesd():
    folder = MODELS / "tiny-taesd"
    rm(folder)
    model = AutoencoderTiny(
        in_channels=3, out_channels=3, latent_channels=4, act_fn="relu", upsample_fn="nearest",
        upsampling_scaling_factor=2, encoder_block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8), num_encoder_blocks=(1, 3, 3, 3), num_decoder_blocks=(3, 3, 3, 1),
        latent_magnitude=3, latent_shift=0.5, scaling_factor=1.0, force_upcast=False)
    # ReLU blocks: He gain on the first two convs of each block, a damped third conv (residual add);
    # the encoder's last conv brings latents to UNet-space spread (std ~1); the decoder's last conv
    # gets a +0.5 bias because TAESD's decoder weights produce 0..1 images (diffusers maps them to -1..1).
    init_weights(model, SEED_TAESD, gains=[("conv.0", 1.41), ("conv.2", 1.41), ("conv.4", 0.5),
                                           ("decoder.layers.18", 0.5), ("encoder.layers.14", 6.0)])
    with torch.no_grad():
        model.decoder.layers[-1].bias += 0.5
    model.save_pretrained(folder, safe_serialization=True)
    model = AutoencoderTiny.from_pretrained(folder, local_files_only=True).eval()
    g = Goldens()
    lat = randn(SEED_TAESD_LATENTS, 1, 4, HEIGHT // 8, WIDTH // 8)
    g.put("taesd.latents", lat, "latents in UNet space (already multiplied by the SD VAE's scaling_factor); "
          "TAESD's own scaling_factor is 1.0 so a pipeline passes them unchanged")
    img = model.decode(lat).sample
    g.put("taesd.image", img, "AutoencoderTiny.decode(taesd.latents).sample: tanh(x/3)*3 clamp, decoder layers, "
          "then x*2-1 (raw, not clamped)")
    stats = image_check("taesd", ((img + 1) / 2).permute(0, 2, 3, 1).numpy())
    enc_in = 2.0 * init_image01() - 1.0
    g.put("taesd.encode_input", enc_in, "-1..1 image; the encoder first maps it to 0..1 ((x+1)/2)")
    g.put("taesd.encode_latents", model.encode(enc_in).latents, "AutoencoderTiny.encode(...).latents (UNet space)")
    g.save(GOLDENS / "tiny-taesd.safetensors")
    return {
        "folder": "tests/fixtures/models/tiny-taesd", "golden": "tests/fixtures/goldens/tiny-taesd.safetensors",
        "layout": "madebyollin/taesd: config.json + diffusion_pytorch_model.safetensors at the folder root",
        "latent_scaling": "TAESD works on UNet-space latents (the SD VAE's latents already multiplied by its "
                          "scaling_factor): AutoencoderTiny.config.scaling_factor is 1.0, pipelines compute "
                          "decode(latents / 1.0). Do not divide by 0.18215 / 0.13025 before TAESD. "
                          "latent_magnitude 3 / latent_shift 0.5 are only for storing latents as 8-bit images "
                          "(scale_latents / unscale_latents) and are not applied by encode/decode.",
        "decoder": "input clamp tanh(x/3)*3; output x*2-1 (the weights produce 0..1 images); no clamp after",
        "encoder": "input (x+1)/2 (weights expect 0..1 images)",
        "pixel_stats": stats, "tensors": g.meta,
    }


# --------------------------------------------------------------------------------------------------
# schedulers alone

SCHED_CASES = [
    ("euler_linspace_epsilon", EulerDiscreteScheduler, {"timestep_spacing": "linspace", "prediction_type": "epsilon"}),
    ("euler_leading_epsilon", EulerDiscreteScheduler, {"timestep_spacing": "leading", "prediction_type": "epsilon"}),
    ("euler_trailing_epsilon", EulerDiscreteScheduler, {"timestep_spacing": "trailing", "prediction_type": "epsilon"}),
    ("euler_linspace_v", EulerDiscreteScheduler, {"timestep_spacing": "linspace", "prediction_type": "v_prediction"}),
    ("euler_leading_v", EulerDiscreteScheduler, {"timestep_spacing": "leading", "prediction_type": "v_prediction"}),
    ("euler_trailing_v", EulerDiscreteScheduler, {"timestep_spacing": "trailing", "prediction_type": "v_prediction"}),
    ("euler_a_trailing_epsilon", EulerAncestralDiscreteScheduler,
     {"timestep_spacing": "trailing", "prediction_type": "epsilon"}),
    ("euler_a_trailing_v", EulerAncestralDiscreteScheduler,
     {"timestep_spacing": "trailing", "prediction_type": "v_prediction"}),
    ("dpmpp_2m_karras_epsilon", DPMSolverMultistepScheduler,
     {"use_karras_sigmas": True, "algorithm_type": "dpmsolver++", "solver_order": 2, "prediction_type": "epsilon"}),
    ("dpmpp_2m_karras_v", DPMSolverMultistepScheduler,
     {"use_karras_sigmas": True, "algorithm_type": "dpmsolver++", "solver_order": 2, "prediction_type": "v_prediction"}),
    ("lcm_epsilon", LCMScheduler, {"prediction_type": "epsilon"}),
    ("lcm_v", LCMScheduler, {"prediction_type": "v_prediction"}),
]
SCHED_STEPS = (1, 2, 4, 25)
SCHED_BASE = dict(**SD15_BETAS, steps_offset=1, timestep_spacing="leading", prediction_type="epsilon",
                  clip_sample=False, set_alpha_to_one=False, interpolation_type="linear")


def make_sched(cls, over):
    cfg = dict(SCHED_BASE, **over)
    return cls.from_config(cfg)


def sched_run(cls, over, steps, seed):
    s = make_sched(cls, over)
    s.set_timesteps(steps)
    entry = {"timesteps": flist(s.timesteps), "init_noise_sigma": float(s.init_noise_sigma), "order": s.order}
    if cls is not LCMScheduler:
        entry["sigmas"] = flist(s.sigmas)
    x = randn(seed, 1, 2, 2, 2) * float(s.init_noise_sigma)
    outs = randn(seed + 1, steps, 1, 2, 2, 2)
    noise_gen = torch.Generator().manual_seed(seed + 2)
    entry["x"] = flist(x)
    per = []
    for i, t in enumerate(s.timesteps):
        scale = float(s.scale_model_input(torch.ones_like(x), t).flatten()[0])
        st = {"t": float(t), "scale_model_input": scale, "model_output": flist(outs[i])}
        if cls is LCMScheduler:
            c_skip, c_out = s.get_scalings_for_boundary_condition_discrete(t)
            st["c_skip"], st["c_out"] = float(c_skip), float(c_out)
            st["alpha_prod_t"] = float(s.alphas_cumprod[t])
        draw = torch.randn(x.shape, generator=noise_gen)
        with patched_randn(replay=[draw], strict=False) as used:
            out = s.step(outs[i], t, x, return_dict=True)
        prev = out.prev_sample
        if cls is LCMScheduler:
            den = out.denoised
        elif cls is DPMSolverMultistepScheduler:
            den = s.model_outputs[-1]  # convert_model_output: the x0 prediction dpmsolver++ works with
        else:
            den = out.pred_original_sample
        st["noise"] = flist(draw) if used else None
        st["prev_sample"] = flist(prev)
        st["denoised"] = flist(den)
        per.append(st)
        x = prev
    entry["steps"] = per
    return entry


def schedulers_json():
    doc = {
        "generator": "tests/reference/make_tiny_diffusion.py",
        "versions": versions(),
        "base_config": SCHED_BASE,
        "conventions": {
            "x": "initial sample = seeded randn(8) * init_noise_sigma (shape [1,2,2,2] flattened)",
            "scale_model_input": "factor scale_model_input applies at that step (sample * factor); "
                                 "Euler: 1/sqrt(sigma^2+1), DPM-Solver and LCM: 1",
            "model_output": "seeded stand-in for the UNet output at that step",
            "noise": "the randn tensor the scheduler drew in step() (null when it drew none); Euler-ancestral "
                     "multiplies it by sigma_up (0 at the last step), LCM by sqrt(1-alpha_prod_prev) and draws "
                     "none at the last step",
            "prev_sample": "step(...).prev_sample, the next x",
            "denoised": "x0 estimate: pred_original_sample (Euler / Euler-a), denoised (LCM, after the c_skip/c_out "
                        "boundary condition), model_outputs[-1] after convert_model_output (DPM-Solver++)",
            "timesteps": "scheduler.timesteps as floats (DPM-Solver and LCM keep int64 timesteps)",
            "img2img": "runs false: no timestep is left (the img2img pipelines raise an error); noised = x0",
            "dpmpp_2m": "lower_order_final: with fewer than 15 steps the last step is first order, and the first "
                        "step is always first order; so 1- and 2-step runs are first order only",
        },
        "alphas_cumprod": flist(make_sched(EulerDiscreteScheduler, {}).alphas_cumprod),
        "cases": {},
        "img2img": [],
    }
    for ci, (name, cls, over) in enumerate(SCHED_CASES):
        case = {"class": cls.__name__, "config": over, "runs": {}}
        for n in SCHED_STEPS:
            case["runs"][str(n)] = sched_run(cls, over, n, 1000 + 100 * ci + n)
        doc["cases"][name] = case
    for ci, (name, cls, over) in enumerate(SCHED_CASES):
        if not name.startswith(("euler_leading_eps", "euler_trailing_eps", "euler_a", "dpmpp_2m_karras_eps")):
            continue
        for n in (2, 4, 25):
            for strength in (0.3, 0.5, 0.75):
                s = make_sched(cls, over)
                s.set_timesteps(n)
                init_timestep = min(int(n * strength), n)
                t_start = max(n - init_timestep, 0)
                ts = s.timesteps[t_start * s.order:]
                s.set_begin_index(t_start * s.order)
                seed = 5000 + 100 * ci + n + int(strength * 10)
                x0 = randn(seed, 1, 2, 2, 2)
                noise = randn(seed + 1, 1, 2, 2, 2)
                noisy = s.add_noise(x0, noise, ts[:1]) if len(ts) else x0
                doc["img2img"].append({
                    "case": name, "num_inference_steps": n, "strength": strength, "init_timestep": init_timestep,
                    "runs": len(ts) > 0,
                    "t_start": t_start, "begin_index": t_start * s.order, "timesteps": flist(ts),
                    "x0": flist(x0), "noise": flist(noise), "noised": flist(noisy),
                    "add_noise": "Euler / Euler-a: x0 + noise * sigmas[begin_index]; DPM-Solver: "
                                 "alpha_t * x0 + sigma_t * noise with alpha_t = 1/sqrt(1+sigma^2), "
                                 "sigma_t = sigma * alpha_t",
                })
    return doc


# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def check_from_single_file(name, path, dtype):
    """Second check of a single-file checkpoint: diffusers' from_single_file (offline, with the folder
    as config) must load the folder's weights. Not for SDXL's text_encoder_2: from_single_file tells the
    two SDXL text encoders apart by width (768 vs 1280) and, with both tiny ones 64 wide, loads
    embedders.0 into text_encoder_2 (verify() covers that encoder through convert_open_clip_checkpoint)."""
    cls = StableDiffusionXLPipeline if "xl" in name else StableDiffusionPipeline
    single = cls.from_single_file(str(path), config=str(MODELS / name), local_files_only=True, torch_dtype=dtype)
    folder = cls.from_pretrained(MODELS / name, local_files_only=True, dtype=dtype)
    for comp in ("unet", "vae", "text_encoder"):
        assert_same_weights(getattr(folder, comp), getattr(single, comp))


def check_rules_on_real_configs():
    """The UNet / VAE key rules on the real architectures (configs/sd-turbo, configs/sdxl-turbo: 4 and 3
    levels, layers_per_block 2, transformer depth up to 10): every diffusers key of a meta-device model
    is mapped to its original name and back through diffusers' own converters. Returns key counts."""
    from diffusers.loaders import single_file_utils as sfu

    counts = {}
    for name in ("sd-turbo", "sdxl-turbo"):
        folder = HERE / "configs" / name
        for comp, cls, fn in (("unet", UNet2DConditionModel, sfu.convert_ldm_unet_checkpoint),
                              ("vae", AutoencoderKL, sfu.convert_ldm_vae_checkpoint)):
            cfg = cls.load_config(folder / comp)
            with torch.device("meta"):
                keys = list(cls.from_config(cfg).state_dict().keys())
            ckpt, want = {}, {}
            for i, k in enumerate(keys):
                if comp == "unet":
                    ok, shape = d2s.UNET_PREFIX + d2s.unet_key(k, cfg), (1,)
                else:
                    o, reshape = d2s.vae_key(k, cfg)
                    ok, shape = d2s.VAE_PREFIX + o, ((1, 1, 1, 1) if reshape else (1,))
                ckpt[ok] = torch.full(shape, float(i))
                want[k] = i
            got = fn(ckpt, cfg)
            assert set(got) == set(want), (name, comp, sorted(set(got) ^ set(want))[:4])
            assert all(int(got[k].flatten()[0]) == want[k] for k in want), (name, comp)
            counts[f"{name}/{comp}"] = len(keys)
    return counts


def versions():
    return {"diffusers": diffusers.__version__, "transformers": transformers.__version__,
            "torch": torch.__version__, "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__}


def clean_config(cfg):
    """A scheduler config as a plain dict, without diffusers' private bookkeeping keys; infinite
    values (DPM's lambda_min_clipped = -inf) as strings, since JSON has no infinity."""
    def plain(v):
        if isinstance(v, tuple):
            return list(v)
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        return v
    return {k: plain(v) for k, v in sorted(dict(cfg).items()) if not k.startswith("_")}


def folder_size(path):
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main():
    torch.set_num_threads(1)
    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    MODELS.mkdir(parents=True, exist_ok=True)
    GOLDENS.mkdir(parents=True, exist_ok=True)

    vocab = Vocab()
    pads_sd1 = {"tokenizer": clip_bpe.EOS}
    pads_sd2 = {"tokenizer": "!"}
    pads_xl = {"tokenizer": clip_bpe.EOS, "tokenizer_2": "!"}
    doc = {
        "generator": "tests/reference/make_tiny_diffusion.py",
        "versions": versions(),
        "prompt": PROMPT, "negative_prompt": NEGATIVE, "width": WIDTH, "height": HEIGHT,
        "dtype": "float32 (every golden tensor); token ids are stored as float32 too",
        "layouts": "NCHW for latents and VAE images; output_type np images are NHWC floats 0..1",
    }

    with tempfile.TemporaryDirectory() as tmp:
        tokdir = Path(tmp)
        vocab.write(tokdir / "eot", clip_bpe.EOS)
        vocab.write(tokdir / "bang", "!")
        doc["tokenizer"] = {
            "vocab_size": len(vocab.vocab), "merges": len(vocab.merges), "bos_id": vocab.vocab[clip_bpe.BOS],
            "eos_id": vocab.vocab[clip_bpe.EOS], "bang_id": vocab.vocab["!"], "model_max_length": 77,
            "layout": "ids 0..255 byte symbols (GPT-2 byte-to-unicode order), 256..511 the same + '</w>', then one "
                      "id per merge in merges.txt order, then <|startoftext|>, <|endoftext|>",
            "pipeline_ids": "[bos] + first 75 tokens + [eos], then the pad id up to 77",
            "cases_eot_pad": vocab.check(tokdir / "eot", clip_bpe.EOS),
            "cases_bang_pad": vocab.check(tokdir / "bang", "!"),
            "bang_pad_note": "with pad_token '!' transformers treats '!' as a special token and cuts it out before "
                             "BPE: every '!' in a prompt becomes id 0 ('!'), never '!</w>' (256)",
        }

        pipelines = {}
        built = {}
        for name, pads in (("tiny-sd", pads_sd1), ("tiny-sd-turbo", pads_sd2), ("tiny-sd2-v", pads_sd2),
                           ("tiny-sdxl", pads_xl)):
            pipe = build(name, vocab, tokdir)
            built[name] = pipe
            save_pipeline(pipe, name, vocab, pads)
            for sub, pad in pads.items():
                vocab.check(MODELS / name / sub, pad)
        save_pipeline(built["tiny-sd"], "tiny-sd-fp16", vocab, pads_sd1, variant="fp16")

    # reload each folder and compute the goldens from what was written
    for name in ("tiny-sd", "tiny-sd-turbo", "tiny-sd2-v", "tiny-sdxl"):
        pipe = load_pipeline(name)
        for comp in ("unet", "vae", "text_encoder", "text_encoder_2"):
            if getattr(pipe, comp, None) is not None:
                assert_same_weights(getattr(built[name], comp), getattr(pipe, comp))
        g, info = pipeline_goldens(name, pipe, pipe.scheduler.config)
        info["kind"] = {"tiny-sd": "sd1", "tiny-sd-turbo": "sd2", "tiny-sd2-v": "sd2", "tiny-sdxl": "sdxl"}[name]
        info["scheduler_config"] = clean_config(pipe.scheduler.config)
        info["vae_scaling_factor"] = pipe.vae.config.scaling_factor
        g.save(GOLDENS / f"{name}.safetensors")
        pipelines[name] = info
    # tiny-sd2-v has tiny-sd-turbo's weights and only its own scheduler: keep just what differs
    # (the tests put the two together).
    for path in sorted((MODELS / "tiny-sd2-v").iterdir()):
        if path.name not in ("model_index.json", "scheduler"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    fp16 = load_pipeline("tiny-sd-fp16", variant="fp16")
    for comp in ("unet", "vae", "text_encoder"):
        assert_same_weights(getattr(built["tiny-sd"], comp), getattr(fp16, comp), cast=torch.float16)
    assert not [p for p in (MODELS / "tiny-sd-fp16").rglob("*.safetensors") if ".fp16." not in p.name]
    pipelines["tiny-sd-fp16"] = {"folder": "tests/fixtures/models/tiny-sd-fp16", "kind": "sd1",
                                 "note": "tiny-sd's weights rounded to float16, only *.fp16.safetensors files "
                                         "(load with variant='fp16'); no goldens of its own"}
    doc["pipelines"] = pipelines
    # the real-architecture config folders used by bench_diffusers.py carry the same tokenizer files
    configs = HERE / "configs"
    write_tokenizers(configs / "sd-turbo", vocab, pads_sd2)
    write_tokenizers(configs / "sdxl-turbo", vocab, pads_xl)
    doc["taesd"] = taesd()
    doc["notes"] = {
        "sd1_text": "SD 1.x conditioning = last_hidden_state (after final_layer_norm) of the CLIP text model.",
        "sd2_text": "SD 2.x conditioning = last_hidden_state of a CLIPTextModel with num_hidden_layers = OpenCLIP "
                    "layers - 1 (23 of 24 for OpenCLIP-H): the penultimate layer, then final_layer_norm. The tiny "
                    "SD 2 models simply have 2 layers.",
        "sdxl_text": "SDXL conditioning = concat(text_encoder.hidden_states[-2], text_encoder_2.hidden_states[-2]) "
                     "(penultimate layer output, no final_layer_norm); pooled = text_encoder_2 text_embeds "
                     "(final_layer_norm -> pick the EOS position -> text_projection, no bias).",
        "pooled_index": "eos_token_id 2 in the text encoder configs (as in the published ones) selects "
                        "transformers' legacy rule: pooled position = argmax of the input ids. <|endoftext|> has "
                        "the largest id, so this is the first <|endoftext|> (pad '!' is id 0).",
        "sdxl_time_ids": "add_time_ids = [orig_h, orig_w, crop_top, crop_left, target_h, target_w]; each id goes "
                         "through a 256-style sinusoidal embedding of addition_time_embed_dim (flip_sin_to_cos, "
                         "shift 0), flattened, concatenated after the pooled text embedding.",
        "sdxl_empty_negative": "force_zeros_for_empty_prompt: with CFG and no negative prompt SDXL uses zeros for "
                               "both negative embeddings (not the encoding of ''). The goldens pass 'blurry'.",
        "cfg": "guidance_scale > 1 enables CFG: the UNet runs on [negative, positive]; noise = uncond + g * (text - "
               "uncond). guidance 0 or 1: one UNet call on the prompt only, negative prompt ignored.",
        "attention_head_dim": "for SD 1.x / 2.x / SDXL diffusers reads attention_head_dim as the number of heads "
                              "(num_attention_heads is null): SD 1.5's 8 means 8 heads of channels/8.",
        "euler_init_noise_sigma": "Euler / Euler-a: init_noise_sigma = max sigma for linspace/trailing, "
                                  "sqrt(max sigma^2 + 1) for leading.",
        "euler_a_final": "Euler-a draws noise every step (randn_tensor) but multiplies it by sigma_up, which is 0 at "
                         "the last step, so 1-step Euler-a is deterministic.",
        "lcm_from_config": "LCMScheduler.from_config(euler config): original_inference_steps 50, timesteps "
                           "999 - k*20 picked evenly; a 1-step run uses t=999 and draws no noise.",
    }
    write_json(GOLDENS / "diffusion.json", doc)
    write_json(GOLDENS / "schedulers.json", schedulers_json())

    # single-file checkpoints
    keys = {"rules": d2s.mapping_rules(), "checkpoints": {}}
    for name, dtype, dname in (("tiny-sd", torch.float32, "fp32"), ("tiny-sdxl", torch.float16, "fp16")):
        out = MODELS / f"{name}.safetensors"
        kind, entries = d2s.convert(MODELS / name, dtype=dtype)
        d2s.write(entries, out)
        n = d2s.verify(out, MODELS / name, dtype=dtype)
        keys["checkpoints"][name] = d2s.keys_listing(kind, entries, f"tests/fixtures/models/{out.name}", dname)
        keys["checkpoints"][name]["verified_tensors"] = n
        check_from_single_file(name, out, dtype)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tiny-sd-turbo.safetensors"
        kind, entries = d2s.convert(MODELS / "tiny-sd-turbo")
        d2s.write(entries, out)
        n = d2s.verify(out, MODELS / "tiny-sd-turbo")
        listing = d2s.keys_listing(kind, entries, None, "fp32")
        listing["verified_tensors"] = n
        listing["note"] = "SD 2.x layout of tiny-sd-turbo (OpenCLIP text encoder names); no file is written"
        keys["checkpoints"]["tiny-sd-turbo"] = listing
    keys["rules_checked_on_real_architectures"] = check_rules_on_real_configs()
    write_json(GOLDENS / "single_file_keys.json", keys)

    total = 0
    for p in sorted(list(MODELS.glob("tiny-sd*")) + list(MODELS.glob("tiny-taesd*"))
                    + [GOLDENS / f for f in ("diffusion.json", "schedulers.json", "single_file_keys.json")]
                    + sorted(GOLDENS.glob("tiny-sd*.safetensors")) + [GOLDENS / "tiny-taesd.safetensors"]):
        size = folder_size(p)
        total += size
        print(f"{size / 1e6:8.3f} MB  {p.relative_to(ROOT)}")
    print(f"{total / 1e6:8.3f} MB  total")


if __name__ == "__main__":
    main()
