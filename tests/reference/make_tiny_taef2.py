#!/usr/bin/env python3
"""Build a tiny random TAEF2-shaped tiny autoencoder (madebyollin/taef2's published layout: one
`taef2.safetensors` with encoder and decoder, no config.json) and golden decoder outputs, for
testing Backpack's tiny-decoder previews of FLUX.2 latents.

What it makes (no arguments; CPU only, no network; needs torch, safetensors, numpy):

    tests/fixtures/models/tiny-taef2/taef2.safetensors
        float16 tensors under diffusers' AutoencoderTiny names ("decoder.layers.N.…", the
        decoder's Clamp not counted, as the published file names them). Decoder: 6 latent
        channels (tiny-flux2's VAE), three levels of 8 channels (1/4 latents, as that VAE),
        blocks [2, 1, 1]; the first level's blocks carry TAEF2's pooled branch (1×1 widening
        to 4× the channels, GroupNorm of 4 groups, ReLU, 1×1 back, added to the block input).
        A small encoder of the same style rides along, as in the published file.
    tests/fixtures/goldens/tiny-taef2.safetensors
        taef2.latents   [1, 6, 8, 8] unpacked latents, normalised as the FLUX.2 transformer
                        sees them (TAEF2 reads them without the VAE's batch-norm statistics)
        taef2.image     [1, 3, 32, 32] the decoder's output mapped to -1..1 (x·2 − 1), float32
                        from the float16-rounded weights

The reference network is the architecture madebyollin/taesd's taesd.py describes for the
"flux_2" variant: tanh(x/3)·3, conv, ReLU, then per level its blocks
(relu(conv(relu(conv(relu(conv(x))))) + x), x first plus the pooled branch where present),
a 2× nearest upsample and a bias-free conv between levels, and a conv to RGB at the end.
"""

from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "tests" / "fixtures" / "models" / "tiny-taef2"
GOLDEN = ROOT / "tests" / "fixtures" / "goldens" / "tiny-taef2.safetensors"

LATENT, WIDTH, BLOCKS = 6, 8, [2, 1, 1]
SEED_WEIGHTS, SEED_LATENTS = 31, 131


def conv3(n_in, n_out, bias=True):
    return nn.Conv2d(n_in, n_out, 3, padding=1, bias=bias)


class Pool(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.pool = nn.Sequential(
            nn.Conv2d(c, 4 * c, 1, bias=False),
            nn.GroupNorm(4, 4 * c),
            nn.ReLU(),
            nn.Conv2d(4 * c, c, 1, bias=False),
        )

    def forward(self, x):
        return x + self.pool(x)


class Block(nn.Module):
    def __init__(self, c, pooled):
        super().__init__()
        self.conv = nn.Sequential(conv3(c, c), nn.ReLU(), conv3(c, c), nn.ReLU(), conv3(c, c))
        if pooled:
            self.pool = Pool(c).pool
        else:
            self.pool = None

    def forward(self, x):
        if self.pool is not None:
            x = x + self.pool(x)
        return torch.relu(self.conv(x) + x)


class Decoder(nn.Module):
    """diffusers' numbering: layers[0] is the first conv (the Clamp is applied in forward)."""

    def __init__(self):
        super().__init__()
        layers = [conv3(LATENT, WIDTH), nn.ReLU()]
        for level, n in enumerate(BLOCKS):
            layers += [Block(WIDTH, pooled=level == 0) for _ in range(n)]
            last = level + 1 == len(BLOCKS)
            if not last:
                layers += [nn.Upsample(scale_factor=2), conv3(WIDTH, WIDTH, bias=False)]
            else:
                layers += [conv3(WIDTH, 3)]
        self.layers = nn.Sequential(*layers)

    def forward(self, z):
        return self.layers(torch.tanh(z / 3) * 3)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            conv3(3, WIDTH), Block(WIDTH, False),
            nn.Conv2d(WIDTH, WIDTH, 3, stride=2, padding=1, bias=False), Block(WIDTH, True),
            nn.Conv2d(WIDTH, WIDTH, 3, stride=2, padding=1, bias=False), Block(WIDTH, True),
            conv3(WIDTH, LATENT),
        )


def randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            n = torch.randn(p.shape, generator=g)
            if p.ndim == 1 and name.endswith("1.weight") and ".pool." in name:
                p.copy_(1.0 + 0.1 * n)  # GroupNorm scale
            elif p.ndim >= 2:
                p.copy_(0.8 * n / p[0].numel() ** 0.5)
            else:
                p.copy_(0.1 * n)
        # The last conv draws 0..1 images: centre it there, as trained decoders do.
        decoder_out = getattr(module, "layers")[-1]
        if decoder_out.out_channels == 3:
            decoder_out.bias.add_(0.5)


def main():
    torch.manual_seed(0)
    decoder, encoder = Decoder(), Encoder()
    randomize(decoder, SEED_WEIGHTS)
    randomize(encoder, SEED_WEIGHTS + 1)
    # Stored as float16 (as published); the golden runs on the rounded values.
    tensors = {}
    for prefix, net in (("decoder", decoder), ("encoder", encoder)):
        for name, value in net.state_dict().items():
            tensors[f"{prefix}.{name}"] = value.to(torch.float16).contiguous()
    with torch.no_grad():
        for name, p in decoder.state_dict().items():
            p.copy_(tensors[f"decoder.{name}"].float())
    FOLDER.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(FOLDER / "taef2.safetensors"), metadata={"format": "pt"})

    g = torch.Generator().manual_seed(SEED_LATENTS)
    latents = torch.randn(1, LATENT, 8, 8, generator=g) * 1.5
    with torch.no_grad():
        image = decoder(latents) * 2 - 1
    save_file(
        {"taef2.latents": latents.contiguous(), "taef2.image": image.contiguous()},
        str(GOLDEN),
    )
    print("image range", float(image.min()), float(image.max()), "std", float(image.std()))
    print("wrote", FOLDER / "taef2.safetensors", "and", GOLDEN)


if __name__ == "__main__":
    main()
