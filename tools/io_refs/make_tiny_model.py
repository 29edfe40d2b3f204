#!/usr/bin/env python3
"""Writes tests/data/models/tiny-dit: a real diffusers pipeline folder, tiny enough to commit (a few KB).

A FluxPipeline saved by diffusers' own save_pretrained, holding a randomly initialised FluxTransformer2DModel
with tiny sizes (transformer/config.json + diffusion_pytorch_model.safetensors, bf16) and a
FlowMatchEulerDiscreteScheduler (scheduler/scheduler_config.json). The text encoders, tokenizers and VAE are
left out, so model_index.json records them as [null, null]. `kiln info tests/data/models/tiny-dit` reads it.
Also writes tests/data/io/sharded-transformer: the same transformer saved in 8 KB shards with its index.
Run from the repository root: python3 tools/io_refs/make_tiny_model.py
"""
import json
import os
import shutil

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data")
OUT = os.path.join(DATA, "models", "tiny-dit")
# The same transformer saved in shards, for the sharded-checkpoint tests (diffusers' own index and shard names).
SHARDED = os.path.join(DATA, "io", "sharded-transformer")


def main():
    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=1,
        joint_attention_dim=4,
        pooled_projection_dim=4,
        guidance_embeds=False,
        axes_dims_rope=(2, 2, 4),
    ).to(torch.bfloat16)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False)
    pipe = FluxPipeline(scheduler=scheduler, vae=None, text_encoder=None, tokenizer=None, text_encoder_2=None,
                        tokenizer_2=None, transformer=transformer)
    shutil.rmtree(OUT, ignore_errors=True)
    pipe.save_pretrained(OUT, safe_serialization=True)
    with open(os.path.join(OUT, "model_index.json")) as f:
        print(json.dumps(json.load(f), indent=1))
    shutil.rmtree(SHARDED, ignore_errors=True)
    transformer.save_pretrained(SHARDED, safe_serialization=True, max_shard_size="8KB")
    print(sorted(os.listdir(SHARDED)))
    n = sum(p.numel() for p in transformer.parameters())
    print(f"transformer: {n} parameters, {len(transformer.state_dict())} tensors")


if __name__ == "__main__":
    main()
