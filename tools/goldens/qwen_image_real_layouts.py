#!/usr/bin/env python3
"""Records the real Qwen-Image transformer's and text encoder's tensor names and shapes, built on the meta device
from their real configs (Qwen/Qwen-Image's transformer/config.json and text_encoder/config.json, the latter in the
top-level layout transformers 4 wrote it in) with diffusers' and transformers' own classes, for Kiln's strict-load
test of the full-size models (tests/models/qwen_image_real_layouts_test.cpp). The VAE's:
tools/goldens/qwen_image_vae.py. No weights are made or downloaded.

Output (committed; CI never runs this): tests/data/goldens/qwen_image/real_layouts.json
  {"<component>": {"config": {...config.json...}, "tensors": {name: shape}}} for transformer and text_encoder; the
  text encoder's names as the repo's safetensors name them (model.layers.*, visual.*, lm_head.weight).

Usage: python3 tools/goldens/qwen_image_real_layouts.py   (torch, diffusers 0.42.1, transformers 5)
"""
import json
import os

import torch
from diffusers import QwenImageTransformer2DModel
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "goldens", "qwen_image", "real_layouts.json")

TRANSFORMER = {"_class_name": "QwenImageTransformer2DModel", "_diffusers_version": "0.35.0.dev0",
               "attention_head_dim": 128, "axes_dims_rope": [16, 56, 56], "guidance_embeds": False,
               "in_channels": 64, "joint_attention_dim": 3584, "num_attention_heads": 24, "num_layers": 60,
               "out_channels": 16, "patch_size": 2}
VISION = {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
          "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
          "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
          "temporal_patch_size": 2}
TEXT_ENCODER = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0,
                "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584,
                "image_token_id": 151655, "initializer_range": 0.02, "intermediate_size": 18944,
                "max_position_embeddings": 128000, "max_window_layers": 28, "model_type": "qwen2_5_vl",
                "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
                "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
                "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False,
                "torch_dtype": "bfloat16", "transformers_version": "4.53.1", "use_cache": True,
                "use_sliding_window": False, "video_token_id": 151656, "vision_config": VISION,
                "vision_end_token_id": 151653, "vision_start_token_id": 151652, "vision_token_id": 151654,
                "vocab_size": 152064}


def shapes(module):
    return {name: list(t.shape) for name, t in module.state_dict().items()}


def repo_name(name):
    """The module tree's names as the repo's files hold them (transformers' legacy checkpoint layout)."""
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    if name.startswith("model.visual."):
        return name[len("model."):]
    return name


def main():
    with torch.device("meta"):
        transformer = QwenImageTransformer2DModel.from_config(
            {k: v for k, v in TRANSFORMER.items() if not k.startswith("_")})
        config = Qwen2_5_VLConfig.from_dict(dict(TEXT_ENCODER))
        text_encoder = Qwen2_5_VLForConditionalGeneration(config)
    out = {"transformer": {"config": TRANSFORMER, "tensors": shapes(transformer)},
           "text_encoder": {"config": TEXT_ENCODER,
                            "tensors": {repo_name(n): s for n, s in shapes(text_encoder).items()}}}
    params = {c: sum(int(torch.tensor(s).prod()) for s in v["tensors"].values()) for c, v in out.items()}
    assert 20.0e9 < params["transformer"] < 20.6e9, params  # "a 20B MMDiT"
    assert 8.2e9 < params["text_encoder"] < 8.4e9, params  # Qwen2.5-VL-7B: 8.29B with its vision tower
    with open(OUT, "w") as f:
        json.dump(out, f, separators=(",", ":"), sort_keys=True)
    print("parameters", params, "->", OUT)


if __name__ == "__main__":
    main()
