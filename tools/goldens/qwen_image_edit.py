#!/usr/bin/env python3
"""A tiny QwenImageEditPipeline of the real classes and the stages of its calls, for Kiln's parity tests
(tests/pipelines/qwen_image_edit_test.cpp).

The folder tests/data/models/qwen-image-edit-tiny puts together tools/goldens/qwen_image.py's tiny transformer, VAE,
scheduler and tokenizer and tools/goldens/qwen2_5_vl_vision.py's tiny Qwen2.5-VL (text hidden 48, a 3-block vision
tower of 4-pixel patches) and its Qwen2VLProcessor (min_pixels 256, max_pixels 4096).

Positions: diffusers 0.42.1 calls transformers 5's Qwen2.5-VL without mm_token_type_ids, so the image's tokens get
the text's sequential positions instead of the 3-D positions the model was trained with (and that transformers 4
always gave). These goldens pass mm_token_type_ids (image tokens 1, text 0), the model's own positions: Kiln gives
those.

Outputs (committed; CI never runs this): tests/data/goldens/qwen_image_edit/<case>.safetensors with
  ids_0 [1, n]                      the templated prompt with the image's tokens expanded, tokenized
  prompt_embeds(_mask), negative_prompt_embeds(_mask)   encode_prompt's output (the template's first 64 dropped)
  image_latents [B, L_img, 64]      the image encoded (the posterior's mode), normalised, packed
  latents_init [B, L, 64]           the noise, packed
  transformer_out_step0 [B, L, 64]  the first call's prediction for the noise's tokens (the image's cut off)
  latents_final, image, image_u8
  metadata: the call's arguments and calculated_width / calculated_height (the image's size at 1024 x 1024 area)

Usage: PYTHONPATH=/tmp/tvpkg python3 tools/goldens/qwen_image_edit.py   (torchvision for transformers' default
image processor, as users have it; diffusers 0.42.1, transformers 5)
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

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
MODEL = os.path.join(MODELS, "qwen-image-edit-tiny")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "qwen_image_edit")
IMAGES = os.path.join(ROOT, "tests", "data", "goldens", "flux2")

CASES = [
    # ref_a (72 x 88) is encoded at 928 x 1120 (its ratio at 1024 x 1024 area); the output at 64 x 64.
    ("edit_64x64_s0", dict(prompt="turn it into a cat", image="ref_a", height=64, width=64, num_inference_steps=2,
                           seed=0)),
    # True CFG (the negative prompt read with the image too), a non-square output.
    ("edit_cfg_48x80_s1", dict(prompt="make it snow", negative_prompt=" ", true_cfg_scale=4.0, image="ref_a",
                               height=48, width=80, num_inference_steps=3, seed=1)),
]


def make_folder():
    shutil.rmtree(MODEL, ignore_errors=True)
    os.makedirs(MODEL)
    for component in ("transformer", "vae", "scheduler", "tokenizer"):
        shutil.copytree(os.path.join(MODELS, "qwen-image-tiny", component), os.path.join(MODEL, component))
    for component in ("text_encoder", "processor"):
        shutil.copytree(os.path.join(MODELS, "qwen2_5_vl-tiny", component), os.path.join(MODEL, component))
    index = json.load(open(os.path.join(MODELS, "qwen-image-tiny", "model_index.json")))
    index["_class_name"] = "QwenImageEditPipeline"
    index["processor"] = ["transformers", "Qwen2VLProcessor"]
    json.dump(index, open(os.path.join(MODEL, "model_index.json"), "w"), indent=2)


def with_model_positions(pipe):
    """Passes mm_token_type_ids, which diffusers 0.42.1 drops, so that Qwen2.5-VL gives its image tokens their 3-D
    positions."""
    image_token = pipe.text_encoder.config.image_token_id
    forward = pipe.text_encoder.forward

    def patched(*a, **kw):
        if kw.get("pixel_values") is not None and "mm_token_type_ids" not in kw:
            kw["mm_token_type_ids"] = (kw["input_ids"] == image_token).long()
        return forward(*a, **kw)

    pipe.text_encoder.forward = patched


def run_case(pipe, name, args):
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

    args = dict(args)
    seed = args.pop("seed")
    image = Image.open(os.path.join(IMAGES, args["image"] + ".png")).convert("RGB")
    cw, ch, _ = calculate_dimensions(1024 * 1024, image.size[0] / image.size[1])
    resized = pipe.image_processor.resize(image, ch, cw)
    out = {}
    text = pipe.prompt_template_encode.format(args["prompt"])
    inputs = pipe.processor(text=[text], images=resized, padding=True, return_tensors="pt")
    assert torch.equal(inputs["mm_token_type_ids"], (inputs["input_ids"] == pipe.text_encoder.config.image_token_id)
                       .long())
    out["ids_0"] = inputs["input_ids"].to(torch.int64)
    with torch.no_grad():
        pe, pm = pipe.encode_prompt(prompt=args["prompt"], image=resized, device=torch.device("cpu"))
        out["prompt_embeds"] = pe
        if pm is not None:
            out["prompt_embeds_mask"] = pm.to(torch.int64)
        if "negative_prompt" in args:
            npe, npm = pipe.encode_prompt(prompt=args["negative_prompt"], image=resized, device=torch.device("cpu"))
            out["negative_prompt_embeds"] = npe
            if npm is not None:
                out["negative_prompt_embeds_mask"] = npm.to(torch.int64)
    calls, captured = [], {}

    def transformer_hook(module, a, kw, output):
        calls.append(dict(x=kw["hidden_states"].clone(), out=output[0].clone()))

    hook = pipe.transformer.register_forward_hook(transformer_hook, with_kwargs=True)
    prepare_latents = pipe.prepare_latents

    def record_prepare_latents(*a, **kw):
        latents, image_latents = prepare_latents(*a, **kw)
        captured.update(latents_init=latents.clone(), image_latents=image_latents.clone())
        return latents, image_latents

    pipe.prepare_latents = record_prepare_latents
    steps = []
    call = dict(args, image=image)
    with torch.no_grad():
        result = pipe(**call, generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                      callback_on_step_end=lambda p, i, t, kw: steps.append(kw["latents"].clone()) or kw)
    hook.remove()
    del pipe.prepare_latents
    images = result.images
    out["latents_init"] = captured["latents_init"]
    out["image_latents"] = captured["image_latents"]
    n = out["latents_init"].shape[1]
    assert torch.equal(calls[0]["x"], torch.cat([out["latents_init"], out["image_latents"]], 1))
    out["transformer_out_step0"] = calls[0]["out"][:, :n]
    out["latents_final"] = steps[-1]
    out["image"] = torch.from_numpy(np.ascontiguousarray(images)).float()
    out["image_u8"] = torch.from_numpy((images * 255).round().astype("uint8"))
    meta = dict(args, seed=seed, pipeline="QwenImageEditPipeline", model="qwen-image-edit-tiny", dtype="float32",
                calculated_width=cw, calculated_height=ch, template_prompt=text)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(GOLDENS, name + ".safetensors"),
              metadata=meta_of(meta))
    return out


def main():
    from diffusers import QwenImageEditPipeline

    make_folder()
    pipe = QwenImageEditPipeline.from_pretrained(MODEL, torch_dtype=torch.float32)
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
