#!/usr/bin/env python3
"""References for FLUX.1's true classifier-free guidance (`true_cfg_scale` with `negative_prompt`), made by
diffusers' own FluxPipeline, FluxImg2ImgPipeline, FluxInpaintPipeline and FluxKontextPipeline on the tiny test
models (tests/data/models/flux-tiny-*, made by tools/goldens/flux.py).

Outputs (committed; CI never runs this script):
  tests/data/goldens/true_cfg/<case>.safetensors   the call's arguments in the metadata; the negative prompt's
      embeddings (encode_prompt), the latents after the first step and at the end, and the image (8-bit, and
      float for the cases without a crop)

The images and masks are edit.py's (tests/data/goldens/flux2/ref_*.png, tests/data/goldens/edit/mask_*.png).

Usage: python tools/goldens/true_cfg.py [CASE...]  (torch, diffusers, transformers, safetensors, pillow from pip)
"""
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from edit import call_tracking_latents, input_images, load_pipeline  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "goldens", "true_cfg")

CASES = [
    # name, pipeline class, model, dtype, call arguments
    ("flux_dev_64x64_s21", "FluxPipeline", "flux-tiny-dev", torch.float32,
     dict(prompt="a photo of a cat", negative_prompt="blurry, low quality", true_cfg_scale=4.0, height=64,
          width=64, num_inference_steps=3, guidance_scale=3.5, max_sequence_length=32, seed=21)),
    # negative_prompt_2 is T5's negative prompt (prompt_2 T5's prompt); schnell has no guidance embedding.
    ("flux_schnell_prompt2_48x80_s22", "FluxPipeline", "flux-tiny-schnell", torch.float32,
     dict(prompt="a red fox", prompt_2="a red fox in the snow", negative_prompt="blurry",
          negative_prompt_2="a dog", true_cfg_scale=2.5, height=48, width=80, num_inference_steps=2,
          guidance_scale=0.0, max_sequence_length=24, seed=22)),
    ("flux_dev_bf16_64x64_s23", "FluxPipeline", "flux-tiny-dev-bf16", torch.bfloat16,
     dict(prompt="a photo of a cat", negative_prompt="blurry", true_cfg_scale=3.0, height=64, width=64,
          num_inference_steps=3, guidance_scale=3.5, max_sequence_length=32, seed=23)),
    ("flux_img2img_64x64_s24", "FluxImg2ImgPipeline", "flux-tiny-dev", torch.float32,
     dict(prompt="a photo of a cat", negative_prompt="blurry", true_cfg_scale=3.0, image="ref_a", height=64,
          width=64, strength=0.7, num_inference_steps=4, guidance_scale=3.5, max_sequence_length=32, seed=24)),
    ("flux_inpaint_64x64_s25", "FluxInpaintPipeline", "flux-tiny-dev", torch.float32,
     dict(prompt="a red circle", negative_prompt="a blue square", true_cfg_scale=2.0, image="ref_b",
          mask_image="mask_box", height=64, width=64, strength=0.8, num_inference_steps=3, guidance_scale=3.5,
          max_sequence_length=32, seed=25)),
    ("kontext_s26", "FluxKontextPipeline", "flux-tiny-dev", torch.float32,
     dict(prompt="make it a watercolour", negative_prompt="a photo", true_cfg_scale=2.5, image="ref_a",
          height=64, width=64, max_area=4096, num_inference_steps=3, guidance_scale=2.5, max_sequence_length=32,
          seed=26)),
]


def run_case(name, cls_name, model, dtype, args):
    pipe = load_pipeline(cls_name, model, dtype)
    args = dict(args)
    seed = args.pop("seed")
    meta = dict(args, seed=seed, pipeline=cls_name, model=model, dtype=str(dtype).split(".")[-1])
    call = dict(args, **input_images(args))
    out = {}
    with torch.no_grad():
        negative, negative_pooled, _ = pipe.encode_prompt(
            prompt=args["negative_prompt"], prompt_2=args.get("negative_prompt_2"), device="cpu",
            num_images_per_prompt=1, max_sequence_length=args["max_sequence_length"])
    out["negative_prompt_embeds"] = negative
    out["negative_pooled_prompt_embeds"] = negative_pooled

    result, steps = call_tracking_latents(
        pipe, dict(call, generator=torch.Generator().manual_seed(seed), output_type="np"))
    out["latents_step0"] = steps[0]
    out["latents_final"] = steps[-1]
    out["image"] = torch.from_numpy(result.images[0])
    out["image_u8"] = torch.from_numpy(np.round(result.images[0] * 255).astype(np.uint8))
    meta["steps_run"] = len(steps)
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, name + ".safetensors"),
              {k: str(v) for k, v in meta.items()})
    print(f"{name}: {len(steps)} steps, image {tuple(out['image_u8'].shape)}")


def main(names):
    for case in CASES:
        if not names or case[0] in names:
            run_case(*case)


if __name__ == "__main__":
    main(sys.argv[1:])
