#!/usr/bin/env python3
"""Records the real Stable Diffusion 1.5 and SDXL base components' tensor names and shapes, built on the meta device
from their real configs (stable-diffusion-v1-5/stable-diffusion-v1-5 and stabilityai/stable-diffusion-xl-base-1.0,
key for key as the repos ship them) with diffusers' and transformers' own classes, for Kiln's strict-load test of
the full-size models (tests/models/sd_real_layouts_test.cpp). No weights are made or downloaded.

Output (committed; CI never runs this): tests/data/goldens/sd/real_layouts.json
  {"<model>": {"<component>": {"config": {...config.json...}, "tensors": {name: shape}}}}
  for model sd15 (unet, text_encoder, vae) and sdxl (unet, text_encoder, text_encoder_2, vae).

Usage: python3 tools/goldens/sd_real_layouts.py   (torch, diffusers 0.42.1, transformers 5)
"""
import json
import os

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "goldens", "sd", "real_layouts.json")

SD15_UNET = {
    "_class_name": "UNet2DConditionModel", "_diffusers_version": "0.6.0", "act_fn": "silu", "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280], "center_input_sample": False, "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 4, "layers_per_block": 2,
    "mid_block_scale_factor": 1, "norm_eps": 1e-05, "norm_num_groups": 32, "out_channels": 4, "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"]}
SDXL_UNET = {
    "_class_name": "UNet2DConditionModel", "_diffusers_version": "0.19.0.dev0", "act_fn": "silu",
    "addition_embed_type": "text_time", "addition_embed_type_num_heads": 64, "addition_time_embed_dim": 256,
    "attention_head_dim": [5, 10, 20], "block_out_channels": [320, 640, 1280], "center_input_sample": False,
    "class_embed_type": None, "class_embeddings_concat": False, "conv_in_kernel": 3, "conv_out_kernel": 3,
    "cross_attention_dim": 2048, "cross_attention_norm": None,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"], "downsample_padding": 1,
    "dual_cross_attention": False, "encoder_hid_dim": None, "encoder_hid_dim_type": None, "flip_sin_to_cos": True,
    "freq_shift": 0, "in_channels": 4, "layers_per_block": 2, "mid_block_only_cross_attention": None,
    "mid_block_scale_factor": 1, "mid_block_type": "UNetMidBlock2DCrossAttn", "norm_eps": 1e-05,
    "norm_num_groups": 32, "num_attention_heads": None, "num_class_embeds": None, "only_cross_attention": False,
    "out_channels": 4, "projection_class_embeddings_input_dim": 2816, "resnet_out_scale_factor": 1.0,
    "resnet_skip_time_act": False, "resnet_time_scale_shift": "default", "sample_size": 128,
    "time_cond_proj_dim": None, "time_embedding_act_fn": None, "time_embedding_dim": None,
    "time_embedding_type": "positional", "timestep_post_act": None, "transformer_layers_per_block": [1, 2, 10],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"], "upcast_attention": None,
    "use_linear_projection": True}
VAE = {
    "_class_name": "AutoencoderKL", "act_fn": "silu", "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4, "in_channels": 3, "latent_channels": 4, "layers_per_block": 2,
    "norm_num_groups": 32, "out_channels": 3, "sample_size": 512, "up_block_types": ["UpDecoderBlock2D"] * 4}
SDXL_VAE = dict(VAE, sample_size=1024, scaling_factor=0.13025, force_upcast=True)
CLIP_L = {
    "architectures": ["CLIPTextModel"], "attention_dropout": 0.0, "bos_token_id": 0, "dropout": 0.0,
    "eos_token_id": 2, "hidden_act": "quick_gelu", "hidden_size": 768, "initializer_factor": 1.0,
    "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 77,
    "model_type": "clip_text_model", "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1,
    "projection_dim": 768, "vocab_size": 49408}
CLIP_G = {
    "architectures": ["CLIPTextModelWithProjection"], "attention_dropout": 0.0, "bos_token_id": 0, "dropout": 0.0,
    "eos_token_id": 2, "hidden_act": "gelu", "hidden_size": 1280, "initializer_factor": 1.0,
    "initializer_range": 0.02, "intermediate_size": 5120, "layer_norm_eps": 1e-05, "max_position_embeddings": 77,
    "model_type": "clip_text_model", "num_attention_heads": 20, "num_hidden_layers": 32, "pad_token_id": 1,
    "projection_dim": 1280, "vocab_size": 49408}


def shapes(module):
    return {name: list(t.shape) for name, t in module.state_dict().items()}


def unet(config):
    with torch.device("meta"):
        return shapes(UNet2DConditionModel.from_config({k: v for k, v in config.items() if not k.startswith("_")}))


def vae(config):
    with torch.device("meta"):
        return shapes(AutoencoderKL.from_config({k: v for k, v in config.items() if not k.startswith("_")}))


def clip(config):
    cls = CLIPTextModelWithProjection if config["architectures"][0].endswith("Projection") else CLIPTextModel
    keys = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    with torch.device("meta"):
        model = cls(CLIPTextConfig(**keys))
    # The repos' files name the text model "text_model.*" (transformers 5's state_dict leaves the prefix out).
    def repo_name(name):
        return name if name.startswith(("text_model.", "text_projection.")) else "text_model." + name
    return {repo_name(name): shape for name, shape in shapes(model).items() if not name.endswith("position_ids")}


def main():
    out = {
        "sd15": {"unet": {"config": SD15_UNET, "tensors": unet(SD15_UNET)},
                 "text_encoder": {"config": CLIP_L, "tensors": clip(CLIP_L)},
                 "vae": {"config": dict(VAE, scaling_factor=0.18215), "tensors": vae(VAE)}},
        "sdxl": {"unet": {"config": SDXL_UNET, "tensors": unet(SDXL_UNET)},
                 "text_encoder": {"config": CLIP_L, "tensors": clip(CLIP_L)},
                 "text_encoder_2": {"config": CLIP_G, "tensors": clip(CLIP_G)},
                 "vae": {"config": SDXL_VAE, "tensors": vae(SDXL_VAE)}},
    }
    counts = {m: sum(len(c["tensors"]) for c in comps.values()) for m, comps in out.items()}
    params = {m: {c: sum(int(torch.tensor(s).prod()) for s in v["tensors"].values()) for c, v in comps.items()}
              for m, comps in out.items()}
    assert params["sd15"]["unet"] == 859520964, params  # SD1.5's UNet: 859.5M parameters
    assert params["sdxl"]["unet"] == 2567463684, params  # SDXL's: 2.57B
    with open(OUT, "w") as f:
        json.dump(out, f, separators=(",", ":"), sort_keys=True)
    print("tensors", counts, "parameters", params, "->", OUT)


if __name__ == "__main__":
    main()
