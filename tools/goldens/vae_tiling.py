#!/usr/bin/env python3
"""Reference tensors for Kiln's tiled VAE decode/encode (diffusers' AutoencoderKL.enable_tiling).

A tiny, randomly initialised AutoencoderKL of the FLUX layout (four blocks, scale factor 8) with sample_size=64, so
that diffusers' tiles are 64x64 pixels / 8x8 latents, overlap 48 pixels / 6 latents and blend over 16 pixels / 2
latents: a 128x128 image spans 3x3 tiles. The latent is smooth (a coarse random field, bilinearly upsampled, plus
a little noise), like a denoised latent rather than white noise, so that a seam would stand out against the
small differences between neighbouring pixels elsewhere.

Outputs (committed; CI never runs this script), in tests/data/goldens/vae_tiling/:
  vae/                       the model in diffusers layout (config.json + safetensors)
  decode.safetensors         latent [1, 16, 16, 16]; diffusers' untiled and tiled decode (float32);
                             the tiled encode of the untiled image (moments = mean and logvar before clamping)

Usage: python tools/goldens/vae_tiling.py   (torch, diffusers, safetensors from pip)
"""
import os
import shutil

import torch
from safetensors.torch import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "goldens", "vae_tiling")


def main():
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(8, 16, 16, 16), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=4,
        act_fn="silu", use_quant_conv=True, use_post_quant_conv=True, scaling_factor=0.3611, shift_factor=0.1159,
        sample_size=64, mid_block_add_attention=True, force_upcast=True)
    # Perturb every parameter so that no norm weight or bias sits at exactly one or zero.
    with torch.no_grad():
        for p in vae.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    vae.eval()
    assert vae.tile_sample_min_size == 64 and vae.tile_latent_min_size == 8

    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    vae.save_pretrained(os.path.join(OUT, "vae"), safe_serialization=True)

    g = torch.Generator().manual_seed(1)
    coarse = torch.randn(1, 16, 4, 4, generator=g)
    latent = torch.nn.functional.interpolate(coarse, size=(16, 16), mode="bilinear", align_corners=False)
    latent = (latent + 0.2 * torch.randn(1, 16, 16, 16, generator=g)).contiguous()

    with torch.no_grad():
        vae.disable_tiling()
        untiled = vae.decode(latent).sample
        vae.enable_tiling()
        tiled = vae.decode(latent).sample
        moments = vae._encode(untiled)  # tiled: 128 > tile_sample_min_size
    mean, logvar = torch.chunk(moments, 2, dim=1)
    save_file({"latent": latent, "untiled": untiled.contiguous(), "tiled": tiled.contiguous(),
               "encode_tiled_mean": mean.contiguous(), "encode_tiled_logvar": logvar.contiguous()},
              os.path.join(OUT, "decode.safetensors"),
              metadata={"tile_sample_min_size": "64", "tile_latent_min_size": "8", "tile_overlap_factor": "0.25"})
    print("tiled vs untiled max abs diff", (tiled - untiled).abs().max().item(),
          "range", untiled.abs().max().item())


if __name__ == "__main__":
    main()
