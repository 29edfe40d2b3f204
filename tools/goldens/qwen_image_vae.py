#!/usr/bin/env python3
"""Builds a tiny, randomly initialised AutoencoderKLQwenImage (diffusers' class, the Wan 2.1 causal 3-D VAE that
Qwen-Image uses on single frames), saves it in diffusers layout, and dumps reference tensors for Kiln's parity test
(tests/models/qwen_image_vae_test.cpp).

The tiny model keeps the real model's structure: four levels (scale factor 8), temperal_downsample [False, True, True]
as the real one (so the encoder runs downsample2d then downsample3d twice and the decoder upsample3d twice then
upsample2d), num_res_blocks 2, the mid attention block. Channel multipliers [1, 2, 3, 2] make every level's width
differ from its neighbours' (and the decoder's upsamplers halve odd-looking widths), so a mis-wired level shows.
Every RMS_norm gamma is random (they are ones by default, which would hide a dropped gamma), every conv bias is
random (torch's default init), the decoder's conv_out is scaled up so that part of the output lies outside [-1, 1]
and the decode's clamp acts, and latents_mean / latents_std are random and non-trivial.

Outputs (committed; CI never runs this script):
  tests/data/models/qwen-image-vae-tiny/   config.json + diffusion_pytorch_model.safetensors (float32)
  tests/data/goldens/qwen_image_vae/f32.safetensors
      image [2, 3, 32, 48] in [-1, 1]; mean / logvar: encode(image[:, :, None]).latent_dist's, frame axis dropped
      [2, 4, 4, 6]; z [2, 4, 4, 6] and decoded = decode(z[:, :, None]).sample[:, :, 0] (clamped, as diffusers does)
      and decoded_unclamped (the decoder's own output, for the record); to_latents = (mean - latents_mean) *
      (1 / latents_std) (QwenImageImg2ImgPipeline's normalisation), from_latents = z / (1 / latents_std) +
      latents_mean (QwenImagePipeline's, before decode).
  tests/data/goldens/qwen_image_vae/bf16.safetensors
      the same with the model cast to bfloat16 (vae.to(torch.bfloat16): what loading the float32 folder in bfloat16
      gives) and the inputs rounded to bfloat16: image, mean, logvar, z, decoded, to_latents, from_latents; and
      decoded_f32, the float32 model's decode of the same z: bfloat16's noise in this decoder (whose conv_out is
      scaled up) reaches 0.46 of the [-1, 1] range at single pixels in torch itself, so the test bounds Kiln's
      bfloat16 decode by torch's own distance to this float32 result.
  tests/data/goldens/qwen_image_vae/tiled.safetensors
      mean, logvar, decoded of f32's image and z with vae.enable_tiling(**TILING) (the metadata holds TILING); the
      tiled decode is not clamped (diffusers' _decode returns tiled_decode's result before its clamp).
  tests/data/goldens/qwen_image_vae/real_layout.json
      the real Qwen-Image VAE's config (the class's defaults) and its tensors' names and shapes, built on the meta
      device: Kiln's model of that config must have exactly these and load strictly from them.

Usage: python tools/goldens/qwen_image_vae.py   (torch, diffusers 0.42.1, safetensors from pip)
"""
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chroma import folder_size, meta_of, save_file  # noqa: E402  (the shared golden-writing helpers)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "tests", "data", "models", "qwen-image-vae-tiny")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "qwen_image_vae")

Z_DIM = 4
TILING = dict(tile_sample_min_height=24, tile_sample_min_width=24, tile_sample_stride_height=16,
              tile_sample_stride_width=16)
TINY = dict(base_dim=4, z_dim=Z_DIM, dim_mult=[1, 2, 3, 2], num_res_blocks=2, attn_scales=[],
            temperal_downsample=[False, True, True], dropout=0.0)


def build():
    from diffusers import AutoencoderKLQwenImage

    torch.manual_seed(0)
    mean = [round(v, 4) for v in (torch.rand(Z_DIM) * 2 - 1).tolist()]
    std = [round(v, 4) for v in (torch.rand(Z_DIM) * 2 + 0.5).tolist()]
    vae = AutoencoderKLQwenImage(**TINY, latents_mean=mean, latents_std=std).eval()
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith(".gamma"):
                p.copy_(torch.rand_like(p) + 0.5)
        vae.decoder.conv_out.weight.mul_(8.0)
        vae.decoder.conv_out.bias.mul_(4.0)
    return vae


def stages(vae, dtype):
    torch.manual_seed(1)
    image = (torch.rand(2, 3, 32, 48) * 2 - 1).to(dtype)
    z = torch.randn(2, Z_DIM, 4, 6).to(dtype)
    cfg = vae.config
    latents_mean = torch.tensor(cfg.latents_mean).view(1, Z_DIM, 1, 1).to(dtype)
    inv_std = (1.0 / torch.tensor(cfg.latents_std).view(1, Z_DIM, 1, 1)).to(dtype)
    with torch.no_grad():
        dist = vae.encode(image[:, :, None]).latent_dist
        mean, logvar = dist.mean[:, :, 0], dist.logvar[:, :, 0]
        decoded = vae.decode(z[:, :, None]).sample[:, :, 0]
        # The decoder's output before decode()'s clamp.
        x = vae.post_quant_conv(z[:, :, None])
        vae.clear_cache()
        unclamped = vae.decoder(x, feat_cache=vae._feat_map, feat_idx=[0])[:, :, 0]
        vae.clear_cache()
    assert torch.equal(decoded, unclamped.clamp(-1, 1))
    out = dict(image=image, mean=mean, logvar=logvar, z=z, decoded=decoded,
               to_latents=(mean - latents_mean) * inv_std, from_latents=z / inv_std + latents_mean)
    if dtype == torch.float32:
        out["decoded_unclamped"] = unclamped
        share = (unclamped.abs() > 1).float().mean().item()
        assert 0.05 < share < 0.95, f"the clamp acts on {share:.0%} of the decoded values"
    return out


def real_layout():
    """AutoencoderKLQwenImage's defaults are Qwen-Image's VAE (base_dim 96, dim_mult [1, 2, 4, 4], num_res_blocks 2,
    z_dim 16, its latent statistics): built on the meta device, its config and every tensor's name and shape."""
    from diffusers import AutoencoderKLQwenImage

    with torch.device("meta"):
        vae = AutoencoderKLQwenImage()
    config = {k: v for k, v in dict(vae.config).items() if not k.startswith("_")}
    config["_class_name"] = "AutoencoderKLQwenImage"
    return {"config": config, "vae": {k: list(v.shape) for k, v in vae.state_dict().items()}}


def main():
    with open(os.path.join(GOLDENS, "real_layout.json"), "w") as f:
        json.dump(real_layout(), f, indent=1, sort_keys=True)
        f.write("\n")
    vae = build()
    shutil.rmtree(MODEL, ignore_errors=True)
    vae.save_pretrained(MODEL, safe_serialization=True)
    os.makedirs(GOLDENS, exist_ok=True)
    meta = meta_of(dict(model="qwen-image-vae-tiny", config=TINY))
    f32 = stages(vae, torch.float32)
    save_file(f32, os.path.join(GOLDENS, "f32.safetensors"), meta)
    # Tiled (diffusers' enable_tiling with 24-pixel tiles every 16 pixels: 3-latent tiles every 2 latents, blended
    # over 8 pixels when decoding and 1 latent when encoding), on f32's image and z.
    vae.enable_tiling(**TILING)
    with torch.no_grad():
        dist = vae.encode(f32["image"][:, :, None]).latent_dist
        tiled = dict(mean=dist.mean[:, :, 0], logvar=dist.logvar[:, :, 0],
                     decoded=vae.decode(f32["z"][:, :, None]).sample[:, :, 0])
    vae.disable_tiling()
    assert tiled["decoded"].abs().max() > 1, "diffusers clamps a tiled decode now: the golden's premise changed"
    assert not torch.allclose(tiled["decoded"].clamp(-1, 1), f32["decoded"], atol=1e-3), "no tiling happened"
    save_file(tiled, os.path.join(GOLDENS, "tiled.safetensors"), meta_of(dict(model="qwen-image-vae-tiny", **TILING)))

    # bfloat16's own noise: the float32 model's decode of the same (bfloat16-rounded) latents, to measure how far
    # torch's bfloat16 decode lies from it.
    torch.manual_seed(1)
    torch.rand(2, 3, 32, 48)
    z = torch.randn(2, Z_DIM, 4, 6).to(torch.bfloat16)
    with torch.no_grad():
        decoded_f32 = vae.decode(z.float()[:, :, None]).sample[:, :, 0]
    bf16 = stages(vae.to(torch.bfloat16), torch.bfloat16)
    assert torch.equal(bf16["z"], z)
    bf16["decoded_f32"] = decoded_f32
    save_file(bf16, os.path.join(GOLDENS, "bf16.safetensors"), meta)
    print(json.dumps({"model_bytes": folder_size(MODEL), "golden_bytes": folder_size(GOLDENS)}))


if __name__ == "__main__":
    main()
