#!/usr/bin/env python3
"""Builds a tiny, randomly initialised QwenImageTransformer2DModel (diffusers' class, Qwen-Image's config flags:
zero_cond_t, use_additional_t_cond and use_layer3d_rope off), saves it in diffusers layout, and dumps its inputs
and outputs for Kiln's parity tests.

Outputs (committed; CI never runs this script):
  tests/data/models/qwen-image-transformer-tiny/            config.json + diffusion_pytorch_model.safetensors (f32)
  tests/data/goldens/qwen_image_transformer/<case>.safetensors   (zero_cond_*: the same weights with
                                                                  zero_cond_t=True in the config)
      hidden_states, encoder_hidden_states, encoder_hidden_states_mask (int64; absent: None), timestep,
      img_shapes (int64 [n, 3]: the entries every sample shares), output; and the RoPE tables diffusers builds
      (rope_image_cos/sin, rope_text_cos/sin [S, head_dim / 2] float32) to locate a mismatch.

Usage: python3 tools/goldens/qwen_image_transformer.py   (torch, diffusers 0.42.1, safetensors from pip)
"""
import copy
import os
import shutil
import sys

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "tests", "data", "models", "qwen-image-transformer-tiny")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "qwen_image_transformer")

sys.path.insert(0, os.path.dirname(__file__))
from chroma import meta_of, save_file  # noqa: E402  (the shared golden-writing helpers)

CONFIG = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=32,
              num_attention_heads=2, joint_attention_dim=24, axes_dims_rope=(8, 12, 12))

CASES = [
    # name, dtype, batch, text length, padded tokens of sample 1 (None: no mask), img_shapes, timesteps, seed
    # Batch 2, the second prompt padded; a non-square grid with odd sides (centred positions -1..1, -2..2).
    ("mask_3x5", torch.float32, 2, 7, 3, [(1, 3, 5)], [0.9, 0.35], 0),
    # The Edit pipelines' layout: the noise grid, then the input image's grid (frame index 1), no mask.
    ("edit_3x5_4x2", torch.float32, 2, 6, None, [(1, 3, 5), (1, 4, 2)], [0.6, 0.125], 1),
    # The same as mask_3x5 with bfloat16 weights and activations.
    ("bf16_mask_3x5", torch.bfloat16, 2, 7, 3, [(1, 3, 5)], [0.9, 0.35], 0),
    # A mask on one sample of batch 1, with all its tokens valid but two in the middle (any pattern is allowed).
    ("holes_4x4", torch.float32, 1, 8, "holes", [(1, 4, 4)], [0.5], 2),
    # Qwen-Image-Edit-2511's zero_cond_t (the same weights): the input image's tokens modulated by t = 0.
    ("zero_cond_3x5_4x2", torch.float32, 2, 7, 3, [(1, 3, 5), (1, 4, 2)], [0.6, 0.125], 3),
]


def build():
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(**CONFIG)
    # Random init leaves norm weights at one and many biases at zero: perturb every parameter so that a wrong
    # wiring cannot hide behind an identity parameter.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    shutil.rmtree(MODEL, ignore_errors=True)
    model.save_pretrained(MODEL, safe_serialization=True)
    return model


def rope_tables(model, img_shapes, text_len):
    image, text = model.pos_embed([img_shapes], max_txt_seq_len=text_len, device=torch.device("cpu"))
    return {"rope_image_cos": image.real.float(), "rope_image_sin": image.imag.float(),
            "rope_text_cos": text.real.float(), "rope_text_sin": text.imag.float()}


def zero_cond_model(model):
    from diffusers import QwenImageTransformer2DModel

    zero = QwenImageTransformer2DModel(**CONFIG, zero_cond_t=True)
    zero.load_state_dict(model.state_dict())
    return zero.eval()


def run_case(model, name, dtype, batch, text_len, padded, img_shapes, timesteps, seed):
    g = torch.Generator("cpu").manual_seed(seed)
    tokens = sum(f * h * w for f, h, w in img_shapes)
    hidden = torch.randn(batch, tokens, CONFIG["in_channels"], generator=g).to(dtype)
    encoder = torch.randn(batch, text_len, CONFIG["joint_attention_dim"], generator=g).to(dtype)
    mask = None
    if padded == "holes":
        mask = torch.ones(batch, text_len, dtype=torch.int64)
        mask[:, 2:4] = 0
    elif padded is not None:
        mask = torch.ones(batch, text_len, dtype=torch.int64)
        mask[1, text_len - padded:] = 0
    timestep = torch.tensor(timesteps, dtype=torch.float32)
    m = (zero_cond_model(model) if name.startswith("zero_cond") else copy.deepcopy(model)).to(dtype)
    with torch.no_grad():
        out = m(hidden_states=hidden, encoder_hidden_states=encoder, encoder_hidden_states_mask=mask,
                timestep=timestep, img_shapes=[list(img_shapes)] * batch, return_dict=False)[0]
    tensors = {"hidden_states": hidden, "encoder_hidden_states": encoder, "timestep": timestep,
               "img_shapes": torch.tensor(img_shapes, dtype=torch.int64), "output": out}
    if mask is not None:
        tensors["encoder_hidden_states_mask"] = mask
    tensors.update(rope_tables(m, list(img_shapes), text_len))
    os.makedirs(GOLDENS, exist_ok=True)
    save_file(tensors, os.path.join(GOLDENS, name + ".safetensors"),
              metadata=meta_of({"dtype": str(dtype), "img_shapes": img_shapes, "timesteps": timesteps}))
    print(name, tuple(out.shape), out.dtype, "max |out|", out.float().abs().max().item())


def main():
    model = build()
    for case in CASES:
        run_case(model, *case)


if __name__ == "__main__":
    main()
