#!/usr/bin/env python3
"""A tiny QwenImageEditPlusPipeline of the real classes and the stages of its calls, for Kiln's parity tests
(tests/pipelines/qwen_image_edit_plus_test.cpp).

The folder tests/data/models/qwen-image-edit-plus-tiny holds tests/data/models/qwen-image-edit-tiny's components
(tools/goldens/qwen_image_edit.py) under a model_index.json naming QwenImageEditPlusPipeline.

Positions: as tools/goldens/qwen_image_edit.py, these goldens pass mm_token_type_ids (image tokens 1, text 0), which
diffusers 0.42.1 drops under transformers 5, so that Qwen2.5-VL gives every image's tokens their 3-D positions:
Kiln gives those.

Outputs (committed; CI never runs this): tests/data/goldens/qwen_image_edit_plus/<case>.safetensors with
  ids_0 [1, n]              the templated prompt ("Picture N: " and each image's tokens expanded), tokenized
  prompt_embeds(_mask), negative_prompt_embeds(_mask)   encode_prompt's output (the template's first 64 dropped)
  image, image_u8           the output
  metadata: the call's arguments, images (the names of the goldens/flux2/ pngs, comma-separated, in order),
  condition_sizes / vae_sizes (each image's width x height at 384 x 384 and 1024 x 1024 area), the
  image latents' token count, template_prompt

Usage: PYTHONPATH=/tmp/tvpkg python3 tools/goldens/qwen_image_edit_plus.py   (torchvision for transformers'
default image processor, as users have it; diffusers 0.42.1, transformers 5)
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chroma import meta_of, save_file  # noqa: E402
from qwen_image_edit import with_model_positions  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
SOURCE = os.path.join(MODELS, "qwen-image-edit-tiny")
MODEL = os.path.join(MODELS, "qwen-image-edit-plus-tiny")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "qwen_image_edit_plus")
IMAGES = os.path.join(ROOT, "tests", "data", "goldens", "flux2")

CASES = [
    # ref_a (72 x 88) then ref_b (100 x 64): the output takes the last image's ratio at 1024 x 1024 area
    # (1280 x 832); here it is asked at 64 x 64.
    ("plus_2img_64x64_s0", dict(prompt="put the two together", images="ref_a,ref_b", height=64, width=64,
                                num_inference_steps=2, seed=0)),
    # True CFG (the negative prompt read with both images too), a non-square output, the other order.
    ("plus_2img_cfg_48x80_s1", dict(prompt="make it snow", negative_prompt=" ", true_cfg_scale=4.0,
                                    images="ref_b,ref_a", height=48, width=80, num_inference_steps=3, seed=1)),
]


def make_folder():
    shutil.rmtree(MODEL, ignore_errors=True)
    os.makedirs(MODEL)
    for component in ("transformer", "vae", "scheduler", "tokenizer", "text_encoder", "processor"):
        shutil.copytree(os.path.join(SOURCE, component), os.path.join(MODEL, component))
    index = json.load(open(os.path.join(SOURCE, "model_index.json")))
    index["_class_name"] = "QwenImageEditPlusPipeline"
    json.dump(index, open(os.path.join(MODEL, "model_index.json"), "w"), indent=2)


def run_case(pipe, name, args):
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (
        CONDITION_IMAGE_SIZE, VAE_IMAGE_SIZE, calculate_dimensions)

    args = dict(args)
    seed = args.pop("seed")
    names = args.pop("images").split(",")
    images = [Image.open(os.path.join(IMAGES, n + ".png")).convert("RGB") for n in names]
    condition_sizes, vae_sizes, condition_images = [], [], []
    for image in images:
        cw, ch = calculate_dimensions(CONDITION_IMAGE_SIZE, image.size[0] / image.size[1])
        vw, vh = calculate_dimensions(VAE_IMAGE_SIZE, image.size[0] / image.size[1])
        condition_sizes.append(f"{cw}x{ch}")
        vae_sizes.append(f"{vw}x{vh}")
        condition_images.append(pipe.image_processor.resize(image, ch, cw))
    out = {}
    pictures = "".join(f"Picture {k + 1}: <|vision_start|><|image_pad|><|vision_end|>" for k in range(len(images)))
    text = pipe.prompt_template_encode.format(pictures + args["prompt"])
    inputs = pipe.processor(text=[text], images=condition_images, padding=True, return_tensors="pt")
    assert torch.equal(inputs["mm_token_type_ids"], (inputs["input_ids"] == pipe.text_encoder.config.image_token_id)
                       .long())
    out["ids_0"] = inputs["input_ids"].to(torch.int64)
    with torch.no_grad():
        pe, pm = pipe.encode_prompt(prompt=args["prompt"], image=condition_images, device=torch.device("cpu"))
        out["prompt_embeds"] = pe
        if pm is not None:
            out["prompt_embeds_mask"] = pm.to(torch.int64)
        if "negative_prompt" in args:
            npe, npm = pipe.encode_prompt(prompt=args["negative_prompt"], image=condition_images,
                                          device=torch.device("cpu"))
            out["negative_prompt_embeds"] = npe
            if npm is not None:
                out["negative_prompt_embeds_mask"] = npm.to(torch.int64)
    calls = []

    def transformer_hook(module, a, kw, output):
        calls.append(dict(x=kw["hidden_states"].shape, img_shapes=kw["img_shapes"]))

    hook = pipe.transformer.register_forward_hook(transformer_hook, with_kwargs=True)
    with torch.no_grad():
        result = pipe(**args, image=images, generator=torch.Generator("cpu").manual_seed(seed), output_type="np")
    hook.remove()
    print(name, "transformer input", tuple(calls[0]["x"]), "img_shapes", calls[0]["img_shapes"][0])
    out["image"] = torch.from_numpy(np.ascontiguousarray(result.images)).float()
    out["image_u8"] = torch.from_numpy((result.images * 255).round().astype("uint8"))
    meta = dict(args, seed=seed, images=",".join(names), pipeline="QwenImageEditPlusPipeline",
                model="qwen-image-edit-plus-tiny", dtype="float32", condition_sizes=",".join(condition_sizes),
                vae_sizes=",".join(vae_sizes), transformer_tokens=int(calls[0]["x"][1]), template_prompt=text)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(GOLDENS, name + ".safetensors"),
              metadata=meta_of(meta))


def main():
    from diffusers import QwenImageEditPlusPipeline

    make_folder()
    pipe = QwenImageEditPlusPipeline.from_pretrained(MODEL, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    print("image processor:", type(pipe.processor.image_processor).__name__)
    with_model_positions(pipe)
    shutil.rmtree(GOLDENS, ignore_errors=True)
    os.makedirs(GOLDENS)
    for name, args in CASES:
        run_case(pipe, name, args)
        print(name, "done")


if __name__ == "__main__":
    main()
