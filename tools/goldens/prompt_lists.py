#!/usr/bin/env python3
"""References for prompt lists (diffusers' `prompt=[...]`, one batch of images from several prompts) and generator
lists (`generator=[...]`, one per image), generators that have already drawn numbers, and prompt embeddings given
instead of prompts (`prompt_embeds=`, `pooled_prompt_embeds=`, weighted as prompt-weighting tools do), made by
diffusers' own FluxPipeline, StableDiffusion3Pipeline, Flux2Pipeline and Flux2KleinPipeline on the tiny test
models (tests/data/models, made by tools/goldens/flux.py, sd3.py and flux2_e2e.py), in float32.

Outputs (committed; CI never runs this script):
  tests/data/goldens/prompt_lists/<case>.safetensors   the call's arguments in the metadata (lists as JSON);
      the final latents and every image (8-bit), in diffusers' order: each prompt's num_images_per_prompt
      images, prompt after prompt

Usage: python tools/goldens/prompt_lists.py [CASE...]  (torch, diffusers, transformers, safetensors from pip)
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
import edit  # noqa: E402  (the images and masks of the editing goldens)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "goldens", "prompt_lists")

CASES = [
    # name, pipeline class, model, call arguments
    ("flux_dev_2x2_s31", "FluxPipeline", "flux-tiny-dev",
     dict(prompt=["a photo of a cat", "a red fox in the snow"], num_images_per_prompt=2, height=48, width=64,
          num_inference_steps=2, guidance_scale=3.5, max_sequence_length=32, seed=31)),
    # True CFG with one negative prompt per prompt.
    ("flux_dev_true_cfg_s32", "FluxPipeline", "flux-tiny-dev",
     dict(prompt=["a photo of a cat", "a blue square"], negative_prompt=["blurry", "a green triangle"],
          true_cfg_scale=3.0, height=64, width=64, num_inference_steps=2, guidance_scale=3.5,
          max_sequence_length=32, seed=32)),
    ("sd3_cfg_2x2_s33", "StableDiffusion3Pipeline", "sd3-tiny-medium",
     dict(prompt=["a photo of a cat", "a red fox"], negative_prompt=["blurry", "dark"], num_images_per_prompt=2,
          height=64, width=48, num_inference_steps=2, guidance_scale=4.5, max_sequence_length=32, seed=33)),
    ("klein_cfg_3x1_s34", "Flux2KleinPipeline", "flux2-tiny-klein-full",
     dict(prompt=["a photo of a cat", "a red fox", "a green triangle on a white background"], height=48,
          width=48, num_inference_steps=2, guidance_scale=3.5, max_sequence_length=32, seed=34)),
    ("flux2_dev_2x1_s35", "Flux2Pipeline", "flux2-tiny-dev-full",
     dict(prompt=["a golden retriever surfing a wave", "a red circle"], height=48, width=48,
          num_inference_steps=2, guidance_scale=4.0, max_sequence_length=32, seed=35)),
    # Generator lists: image i's noise from generator i (`seeds` instead of `seed`).
    ("flux_dev_generators_1x3", "FluxPipeline", "flux-tiny-dev",
     dict(prompt="a photo of a cat", num_images_per_prompt=3, height=32, width=48, num_inference_steps=2,
          guidance_scale=3.5, max_sequence_length=32, seeds=[36, 37, 38])),
    ("sd3_generators_2x1", "StableDiffusion3Pipeline", "sd3-tiny-medium",
     dict(prompt=["a photo of a cat", "a red fox"], height=32, width=32, num_inference_steps=2,
          guidance_scale=4.5, max_sequence_length=32, seeds=[40, 41])),
    ("flux2_dev_generators_1x2", "Flux2Pipeline", "flux2-tiny-dev-full",
     dict(prompt="a red circle", num_images_per_prompt=2, height=32, width=32, num_inference_steps=2,
          guidance_scale=4.0, max_sequence_length=32, seeds=[42, 43])),
    # A generator that has already drawn 7 numbers (`drawn`): the call continues its stream, and leaves it
    # where torch's generator is after the call (generator_state, generator_state_after).
    ("flux_dev_drawn_generator", "FluxPipeline", "flux-tiny-dev",
     dict(prompt="a photo of a cat", num_images_per_prompt=2, height=32, width=32, num_inference_steps=2,
          guidance_scale=3.5, max_sequence_length=32, seed=39, drawn=7)),
    # Embeddings given instead of prompts (`embed`: the prompts whose encode_prompt outputs are passed, the
    # first scaled by 1.3; `embed_negative`: the same for the negative embeddings).
    ("flux_dev_embeds_s44", "FluxPipeline", "flux-tiny-dev",
     dict(embed=["a photo of a cat", "a red fox"], embed_negative=["blurry", "dark"], true_cfg_scale=2.0,
          height=32, width=32, num_inference_steps=2, guidance_scale=3.5, max_sequence_length=32, seed=44)),
    ("sd3_embeds_s45", "StableDiffusion3Pipeline", "sd3-tiny-medium",
     dict(embed=["a photo of a cat"], negative_prompt="blurry", height=32, width=32, num_inference_steps=2,
          guidance_scale=4.5, max_sequence_length=32, seed=45)),
    # The editing pipelines (images and masks of tools/goldens/edit.py): prompt lists and generator lists, and
    # where the one generator stands after the call (`state`: generator_state_after), the masked image's
    # posterior sample of inpainting included.
    ("flux_img2img_lists", "FluxImg2ImgPipeline", "flux-tiny-dev",
     dict(prompt=["a photo of a cat", "a red fox"], image="ref_a", strength=0.7, height=32, width=32,
          num_inference_steps=3, guidance_scale=3.5, max_sequence_length=32, seeds=[50, 51])),
    ("flux_inpaint_lists", "FluxInpaintPipeline", "flux-tiny-dev",
     dict(prompt=["a red circle", "a blue square"], image="ref_b", mask_image="mask_box", strength=0.8,
          height=32, width=32, num_inference_steps=3, guidance_scale=3.5, max_sequence_length=32, seed=52,
          state=True)),
    ("kontext_lists", "FluxKontextPipeline", "flux-tiny-dev",
     dict(prompt=["make it a watercolour", "at night"], image="ref_a", _auto_resize=False, max_area=1024,
          height=32, width=32, num_inference_steps=2, guidance_scale=2.5, max_sequence_length=32, seed=53,
          state=True)),
    ("sd3_inpaint_lists", "StableDiffusion3InpaintPipeline", "sd3-tiny-medium",
     dict(prompt=["a photo of a cat", "a red fox"], negative_prompt=["blurry", "dark"], image="ref_a",
          mask_image="mask_box", strength=0.85, height=32, width=32, num_inference_steps=3, guidance_scale=4.5,
          max_sequence_length=32, seed=54, state=True)),
]


def given_embeddings(pipe, texts, max_len):
    """encode_prompt's embeddings of each text, stacked, the first one's scaled by 1.3: (embeds, pooled)."""
    embeds, pooled = [], []
    for i, text in enumerate(texts):
        if type(pipe).__name__ == "StableDiffusion3Pipeline":
            e, _, p, _ = pipe.encode_prompt(prompt=text, prompt_2=None, prompt_3=None, device="cpu",
                                            do_classifier_free_guidance=False, max_sequence_length=max_len)
        else:
            e, p, _ = pipe.encode_prompt(prompt=text, prompt_2=None, device="cpu", max_sequence_length=max_len)
        scale = 1.3 if i == 0 else 1.0
        embeds.append(e * scale)
        pooled.append(p * scale)
    return torch.cat(embeds), torch.cat(pooled)


def run_case(name, cls_name, model, args):
    pipe = edit.load_pipeline(cls_name, model, torch.float32)
    args = dict(args)
    seed, seeds, drawn = args.pop("seed", None), args.pop("seeds", None), args.pop("drawn", 0)
    keep_state = args.pop("state", False) or drawn > 0
    call_images = edit.input_images(args)
    embed, embed_negative = args.pop("embed", None), args.pop("embed_negative", None)
    given = {}
    with torch.no_grad():
        if embed is not None:
            given["prompt_embeds"], given["pooled_prompt_embeds"] = given_embeddings(pipe, embed, args["max_sequence_length"])
        if embed_negative is not None:
            given["negative_prompt_embeds"], given["negative_pooled_prompt_embeds"] = given_embeddings(
                pipe, embed_negative, args["max_sequence_length"])
    if seeds is not None:
        generator = [torch.Generator().manual_seed(s) for s in seeds]
    else:
        generator = torch.Generator().manual_seed(seed)
        torch.randn(drawn, generator=generator)
    state = None if seeds is not None else generator.get_state().clone()
    result, steps = edit.call_tracking_latents(
        pipe, dict(args, **call_images, **given, generator=generator, output_type="np"))
    images = result.images
    out = {"latents_final": steps[-1],
           "image_u8": torch.from_numpy(np.round(images * 255).astype(np.uint8))}
    out.update(given)
    if drawn:
        out["generator_state"] = state
    if keep_state:
        out["generator_state_after"] = generator.get_state().clone()
    meta = {k: json.dumps(v) if isinstance(v, list) else str(v) for k, v in args.items()}
    meta.update(pipeline=cls_name, model=model)
    if seeds is not None:
        meta["seeds"] = json.dumps(seeds)
    else:
        meta["seed"] = str(seed)
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, name + ".safetensors"), meta)
    print(f"{name}: images {tuple(out['image_u8'].shape)}")


def main(names):
    torch.set_num_threads(2)
    for case in CASES:
        if not names or case[0] in names:
            run_case(*case)


if __name__ == "__main__":
    main(sys.argv[1:])
