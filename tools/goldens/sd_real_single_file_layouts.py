#!/usr/bin/env python3
"""Records the tensor names and shapes of the real single files finetunes ship as, in Stability's original layout:
Stable Diffusion 1.5 (v1-5-pruned.safetensors), Stable Diffusion 2.1 (v2-1_768-ema-pruned.safetensors), SDXL base
(sd_xl_base_1.0.safetensors) and the SDXL refiner (sd_xl_refiner_1.0.safetensors), for Kiln's strict full-size single-file test (tests/models/
sd_real_single_file_test.cpp). No weights are made or downloaded: the components are built on the meta device from
the real configs (tools/goldens/sd_real_layouts.py's, and the refiner's UNet below) with diffusers' and transformers'
classes, renamed to the original layout by tools/goldens/sd_single_file.py's mapping, and then read back through
diffusers' own single-file conversion (diffusers/loaders/single_file_utils.py: convert_ldm_unet_checkpoint,
convert_ldm_vae_checkpoint, convert_ldm_clip_checkpoint, convert_open_clip_checkpoint), which must give every
component's names and shapes exactly, and diffusers' infer_diffusers_model_type must name each file's kind (v1,
v2, xl_base, xl_refiner). SD 2.1's file holds OpenCLIP-H whole (24 layers, its text_projection) where its
CLIPTextModel has 23 layers and no projection: diffusers' conversion skips both (SD_2_TEXT_ENCODER_KEYS_TO_IGNORE),
which is checked too. So the layout is diffusers', not only this repository's idea of it.

Output (committed; CI never runs this): tests/data/goldens/sd_single_file/real_layouts.json
  {"<model>": {"kind": "v1" | "v2" | "xl_base" | "xl_refiner", "tensors": {original name: shape},
               "configs": {component: its config.json}}}

Usage: python3 tools/goldens/sd_real_single_file_layouts.py   (torch, diffusers 0.42.1, transformers 5)
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sd_real_layouts as real  # noqa: E402
import sd_single_file as single  # noqa: E402
from diffusers import AutoencoderKL, UNet2DConditionModel  # noqa: E402
from diffusers.loaders import single_file_utils as sfu  # noqa: E402
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection  # noqa: E402

OUT = os.path.join(real.ROOT, "tests", "data", "goldens", "sd_single_file", "real_layouts.json")

# stabilityai/stable-diffusion-xl-refiner-1.0's unet/config.json (sgm's sd_xl_refiner.yaml: model_channels 384,
# channel_mult [1, 2, 4, 4], attention at the middle two levels, transformer_depth 4, context_dim 1280,
# adm_in_channels 2560, 64-wide heads).
REFINER_UNET = dict(
    real.SDXL_UNET, attention_head_dim=[6, 12, 24, 24], block_out_channels=[384, 768, 1536, 1536],
    cross_attention_dim=1280, projection_class_embeddings_input_dim=2560, transformer_layers_per_block=4,
    down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"])


# stabilityai/stable-diffusion-2-1's unet/ and text_encoder/config.json (OpenCLIP ViT-H/14's text tower without its
# last layer: SD2 reads the penultimate one).
SD21_UNET = dict(
    real.SD15_UNET, attention_head_dim=[5, 10, 20, 20], cross_attention_dim=1024, use_linear_projection=True,
    upcast_attention=True, sample_size=96)
SD21_CLIP = dict(
    real.CLIP_L, architectures=["CLIPTextModel"], hidden_act="gelu", hidden_size=1024, intermediate_size=4096,
    num_attention_heads=16, num_hidden_layers=23, projection_dim=512)


def diffusers_config(config):
    return {k: v for k, v in config.items() if not k.startswith("_")}


def meta_unet(config):
    with torch.device("meta"):
        return UNet2DConditionModel.from_config(diffusers_config(config))


def meta_vae(config):
    with torch.device("meta"):
        return AutoencoderKL.from_config(diffusers_config(config))


def meta_clip(config):
    cls = CLIPTextModelWithProjection if config["architectures"][0].endswith("Projection") else CLIPTextModel
    with torch.device("meta"):
        return cls(CLIPTextConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")}))


def clip_state_of(tensors):
    """A text encoder's tensors under the repos' names (text_model.*; transformers 5 saves CLIPTextModel without
    the prefix, the repos' files and single files have it), without the position_ids buffer."""
    return {(k if k.startswith(("text_model.", "text_projection.")) else "text_model." + k): v
            for k, v in tensors.items() if not k.endswith("position_ids")}


def clip_state(model):
    return clip_state_of(model.state_dict())


def same_layout(what, got, want):
    got = {k: list(v.shape) for k, v in got.items()}
    want = {k: list(v.shape) for k, v in want.items()}
    assert set(got) == set(want), f"{what}: names differ: {sorted(set(got) ^ set(want))[:8]}"
    bad = [k for k in want if got[k] != want[k]]
    assert not bad, f"{what}: shapes differ at {bad[:8]}"
    return len(want)


def single_file(model):
    """The original-layout file of `model` ("sd15", "sd21", "sdxl", "refiner"), its kind, the per-component check
    and the components' configs."""
    unet_cfg = {"sd15": real.SD15_UNET, "sd21": SD21_UNET, "sdxl": real.SDXL_UNET, "refiner": REFINER_UNET}[model]
    vae_cfg = dict(real.VAE, scaling_factor=0.18215) if model in ("sd15", "sd21") else real.SDXL_VAE
    unet, vae = meta_unet(unet_cfg), meta_vae(vae_cfg)
    out = single.prefixed("model.diffusion_model.", single.unet_to_original(unet.state_dict(), unet_cfg))
    out.update(single.prefixed("first_stage_model.", single.vae_to_original(vae.state_dict(), vae_cfg)))
    # Each text encoder: where the file holds it and its config.
    towers = {
        "sd15": {"text_encoder": ("cond_stage_model.transformer.", real.CLIP_L)},
        "sd21": {"text_encoder": ("cond_stage_model.model.", SD21_CLIP)},  # OpenCLIP-H
        "sdxl": {"text_encoder": ("conditioner.embedders.0.transformer.", real.CLIP_L),
                 "text_encoder_2": ("conditioner.embedders.1.model.", real.CLIP_G)},
        "refiner": {"text_encoder_2": ("conditioner.embedders.0.model.", real.CLIP_G)},  # bigG alone
    }[model]
    # HF CLIP-L under its wrapper, or OpenCLIP's tower (SD 2.1's whole: 24 layers and the projection).
    hf_clip = {name for name, (prefix, _) in towers.items() if prefix.endswith(".transformer.")}
    for name, (prefix, cfg) in towers.items():
        if name in hf_clip:
            te = single.clip_to_original(clip_state(meta_clip(cfg)))
            te["text_model.embeddings.position_ids"] = torch.arange(77, dtype=torch.int64)[None]
        elif model == "sd21":
            te = single.open_clip_to_original(clip_state(meta_clip(dict(cfg, num_hidden_layers=24))))
            with torch.device("meta"):
                te["text_projection"] = torch.empty(1024, 1024)
        else:
            te = single.open_clip_to_original(clip_state(meta_clip(cfg)))
        out.update(single.prefixed(prefix, te))

    # diffusers reads it back: the file's kind, and every component's names and shapes (for SD 2.1's text
    # encoder it skips the 24th layer and the projection: SD_2_TEXT_ENCODER_KEYS_TO_IGNORE).
    kind = sfu.infer_diffusers_model_type(out)
    assert kind == {"sd15": "v1", "sd21": "v2", "sdxl": "xl_base", "refiner": "xl_refiner"}[model], (model, kind)
    counts = {
        "unet": same_layout(f"{model} unet", sfu.convert_ldm_unet_checkpoint(dict(out), diffusers_config(unet_cfg)),
                            unet.state_dict()),
        "vae": same_layout(f"{model} vae", sfu.convert_ldm_vae_checkpoint(dict(out), diffusers_config(vae_cfg)),
                           vae.state_dict()),
    }
    for name, (prefix, cfg) in towers.items():
        clip = meta_clip(cfg)
        got = (sfu.convert_ldm_clip_checkpoint(dict(out), remove_prefix=prefix) if name in hf_clip
               else sfu.convert_open_clip_checkpoint(clip, dict(out), prefix=prefix))
        counts[name] = same_layout(f"{model} {name}", clip_state_of(got), clip_state(clip))
    configs = {"unet": unet_cfg, "vae": vae_cfg, **{name: cfg for name, (_, cfg) in towers.items()}}
    return kind, {k: list(v.shape) for k, v in out.items()}, counts, configs


def main():
    out = {}
    for model in ("sd15", "sd21", "sdxl", "refiner"):
        kind, tensors, counts, configs = single_file(model)
        out[model] = {"kind": kind, "tensors": tensors, "configs": configs}
        params = sum(math.prod(s) for k, s in tensors.items() if k.startswith("model.diffusion_model."))
        print(model, kind, len(tensors), "tensors;", "diffusers' conversion gives", counts, "; UNet parameters",
              params)
    with open(OUT, "w") as f:
        json.dump(out, f, separators=(",", ":"), sort_keys=True)
    print("->", OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
