#!/usr/bin/env python3
"""References for Kiln's image-editing pipelines, made by diffusers' own pipelines on the tiny test models:
FluxImg2ImgPipeline, StableDiffusion3Img2ImgPipeline, FluxInpaintPipeline, StableDiffusion3InpaintPipeline,
FluxFillPipeline and FluxKontextPipeline.

Outputs (committed; CI never runs this script):
  tests/data/models/flux-tiny-fill/          FluxFillPipeline: flux-tiny-dev's components, a 384-channel transformer
  tests/data/goldens/edit/mask_*.png         the masks the cases use (the images are tests/data/goldens/flux2/*.png)
  tests/data/goldens/edit/<case>.safetensors the stages of each case; the call's arguments are in the metadata

Each case keeps: the preprocessed image (and mask), the VAE's posterior sample of the image with a fresh
generator, the initial latents (`prepare_latents` with a fresh generator), the timesteps, the final latents and
the image (float and 8-bit), so that a difference can be traced to its stage.

Usage: python tools/goldens/edit.py [CASE...]  (torch, diffusers, transformers, safetensors, pillow from pip)
"""
import os
import shutil

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter
from safetensors.torch import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
IMAGES = os.path.join(ROOT, "tests", "data", "goldens", "flux2")
OUT = os.path.join(ROOT, "tests", "data", "goldens", "edit")


def write_masks():
    """A hard-edged mask and a soft one (its edges blurred, so the binarisation and the resize matter)."""
    os.makedirs(OUT, exist_ok=True)
    hard = Image.new("L", (72, 88), 0)
    ImageDraw.Draw(hard).rectangle([20, 24, 55, 70], fill=255)
    hard.save(os.path.join(OUT, "mask_box.png"))
    soft = Image.new("RGB", (100, 64), (0, 0, 0))
    ImageDraw.Draw(soft).ellipse([30, 10, 80, 56], fill=(255, 240, 230))
    soft = soft.filter(ImageFilter.GaussianBlur(3))
    soft.save(os.path.join(OUT, "mask_soft.png"))


def make_fill_model():
    """flux-tiny-dev with a FLUX.1 Fill transformer: in_channels = 64 latents + 64 masked-image latents + 256
    mask values, out_channels = 64."""
    from diffusers import FluxFillPipeline, FluxPipeline, FluxTransformer2DModel

    dev = FluxPipeline.from_pretrained(os.path.join(MODELS, "flux-tiny-dev"))
    torch.manual_seed(5)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=384, out_channels=64, num_layers=2, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
        axes_dims_rope=(4, 6, 6))
    with torch.no_grad():
        for p in transformer.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    fill = FluxFillPipeline(scheduler=dev.scheduler, vae=dev.vae, text_encoder=dev.text_encoder,
                            tokenizer=dev.tokenizer, text_encoder_2=dev.text_encoder_2, tokenizer_2=dev.tokenizer_2,
                            transformer=transformer)
    path = os.path.join(MODELS, "flux-tiny-fill")
    shutil.rmtree(path, ignore_errors=True)
    fill.save_pretrained(path, safe_serialization=True)
    # The tokenizers as the real repos ship them (the same files flux-tiny-dev has).
    for folder in ("tokenizer", "tokenizer_2"):
        shutil.rmtree(os.path.join(path, folder))
        shutil.copytree(os.path.join(MODELS, "flux-tiny-dev", folder), os.path.join(path, folder))


def image(name):
    return Image.open(os.path.join(IMAGES, name + ".png")).convert("RGB")


def mask(name):
    return Image.open(os.path.join(OUT, name + ".png"))


CASES = [
    # name, pipeline class, model, dtype, call arguments
    ("flux_img2img_64x64_s3", "FluxImg2ImgPipeline", "flux-tiny-dev", torch.float32,
     dict(prompt="a photo of a cat", image="ref_a", height=64, width=64, strength=0.6, num_inference_steps=4,
          guidance_scale=3.5, max_sequence_length=32, seed=3)),
    ("flux_img2img_schnell_48x80_s7", "FluxImg2ImgPipeline", "flux-tiny-schnell", torch.float32,
     dict(prompt="a red fox", image="ref_b", height=48, width=80, strength=0.9, num_inference_steps=3,
          guidance_scale=0.0, max_sequence_length=24, seed=7)),
    ("flux_img2img_bf16_64x64_s2", "FluxImg2ImgPipeline", "flux-tiny-dev-bf16", torch.bfloat16,
     dict(prompt="a photo of a cat", image="ref_a", height=64, width=64, strength=0.75, num_inference_steps=4,
          max_sequence_length=32, seed=2)),
    ("sd3_img2img_64x64_s5", "StableDiffusion3Img2ImgPipeline", "sd3-tiny-medium", torch.float32,
     dict(prompt="a photo of a cat", negative_prompt="blurry", image="ref_b", height=64, width=64, strength=0.7,
          num_inference_steps=5, guidance_scale=4.5, max_sequence_length=32, seed=5)),
    ("flux_inpaint_64x64_s4", "FluxInpaintPipeline", "flux-tiny-dev", torch.float32,
     dict(prompt="a red circle", image="ref_a", mask_image="mask_box", height=64, width=64, strength=0.8,
          num_inference_steps=4, guidance_scale=3.5, max_sequence_length=32, seed=4)),
    ("flux_inpaint_crop_64x64_s6", "FluxInpaintPipeline", "flux-tiny-dev", torch.float32,
     dict(prompt="a blue square", image="ref_b", mask_image="mask_soft", height=64, width=64, strength=0.7,
          num_inference_steps=3, guidance_scale=3.5, max_sequence_length=32, padding_mask_crop=8, seed=6)),
    ("sd3_inpaint_64x64_s8", "StableDiffusion3InpaintPipeline", "sd3-tiny-medium", torch.float32,
     dict(prompt="a photo of a cat", negative_prompt="blurry", image="ref_a", mask_image="mask_box", height=64,
          width=64, strength=0.85, num_inference_steps=4, guidance_scale=4.5, max_sequence_length=32, seed=8)),
    # The other orientation: a tall crop region widened to the call's aspect ratio (and shifted back inside the
    # image), filled left and right; a hard-edged mask.
    ("sd3_inpaint_crop_64x48_s12", "StableDiffusion3InpaintPipeline", "sd3-tiny-medium", torch.float32,
     dict(prompt="a photo of a cat", negative_prompt="blurry", image="ref_a", mask_image="mask_box", height=48,
          width=64, strength=0.9, num_inference_steps=3, guidance_scale=4.5, max_sequence_length=32,
          padding_mask_crop=4, seed=12)),
    ("flux_fill_64x64_s9", "FluxFillPipeline", "flux-tiny-fill", torch.float32,
     dict(prompt="a green triangle", image="ref_a", mask_image="mask_box", height=64, width=64,
          num_inference_steps=3, guidance_scale=30.0, max_sequence_length=32, seed=9)),
    # Kontext: the image auto-resized to the preferred resolution nearest its aspect ratio (944 x 1104 for
    # ref_a), the output at max_area; and without the resize, the image at its own size floored to 16.
    ("kontext_auto_s10", "FluxKontextPipeline", "flux-tiny-dev", torch.float32,
     dict(prompt="make it a watercolour", image="ref_a", height=64, width=64, max_area=4096, num_inference_steps=3,
          guidance_scale=2.5, max_sequence_length=32, seed=10)),
    ("kontext_own_size_48x80_s11", "FluxKontextPipeline", "flux-tiny-dev", torch.float32,
     dict(prompt="at night", image="ref_b", height=48, width=80, max_area=4096, _auto_resize=False,
          num_inference_steps=2, max_sequence_length=32, seed=11)),
]


def kontext_image(pipe, img, auto_resize):
    """FluxKontextPipeline's step 3: the image at the preferred resolution nearest its aspect ratio."""
    from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS

    h, w = pipe.image_processor.get_default_height_width(img)
    if auto_resize:
        _, w, h = min((abs(w / h - pw / ph), pw, ph) for pw, ph in PREFERRED_KONTEXT_RESOLUTIONS)
    w, h = w // 16 * 16, h // 16 * 16
    return pipe.image_processor.preprocess(pipe.image_processor.resize(img, h, w), h, w)


def flat(metadata):
    return {k: str(v) for k, v in metadata.items()}


# What the golden scripts of the editing, true-CFG and list cases share (true_cfg.py and prompt_lists.py
# import them).
def load_pipeline(cls_name, model, dtype):
    """diffusers' `cls_name` from tests/data/models/`model` in `dtype`, its progress bar off."""
    import diffusers

    pipe = getattr(diffusers, cls_name).from_pretrained(os.path.join(MODELS, model), torch_dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def input_images(args):
    """The call's `image` and `mask_image`, named in `args`, as PIL images."""
    out = {}
    if "image" in args:
        out["image"] = image(args["image"])
    if "mask_image" in args:
        out["mask_image"] = mask(args["mask_image"])
    return out


def call_tracking_latents(pipe, call):
    """pipe(**call) without gradients, and the latents after each step (diffusers' callback_on_step_end)."""
    steps = []

    def on_step(p, i, t, kwargs):
        steps.append(kwargs["latents"].clone())
        return kwargs

    with torch.no_grad():
        result = pipe(**call, callback_on_step_end=on_step)
    return result, steps


def run_case(name, cls_name, model, dtype, args):
    pipe = load_pipeline(cls_name, model, dtype)
    args = dict(args)
    seed = args.pop("seed")
    meta = dict(args, seed=seed, pipeline=cls_name, model=model, dtype=str(dtype).split(".")[-1])
    call = dict(args, **input_images(args))
    out = {}
    height, width = args["height"], args["width"]
    crops = None
    if "padding_mask_crop" in args:
        crops = pipe.mask_processor.get_crop_region(call["mask_image"], width, height, pad=args["padding_mask_crop"])
        meta["crops_coords"] = ",".join(str(int(c)) for c in crops)
    resize_mode = "fill" if crops is not None else "default"
    if cls_name == "FluxKontextPipeline":
        out["init_image"] = kontext_image(pipe, call["image"], args.get("_auto_resize", True))
    else:
        out["init_image"] = pipe.image_processor.preprocess(call["image"], height=height, width=width,
                                                            crops_coords=crops, resize_mode=resize_mode)
    if "mask_image" in args:
        out["mask_condition"] = pipe.mask_processor.preprocess(call["mask_image"], height=height, width=width,
                                                               crops_coords=crops, resize_mode=resize_mode)
    with torch.no_grad():
        posterior = pipe.vae.encode(out["init_image"].to(dtype)).latent_dist
        g = torch.Generator().manual_seed(seed)
        out["image_latents_sample"] = posterior.sample(g)
        out["image_latents_mean"] = posterior.mean

    # diffusers pastes a cropped inpainting back onto the original only for PIL output.
    output_type = "pil" if crops is not None else "np"
    result, steps = call_tracking_latents(
        pipe, dict(call, generator=torch.Generator().manual_seed(seed), output_type=output_type))
    out["timesteps"] = pipe.scheduler.timesteps.clone()
    out["latents_step0"] = steps[0]
    out["latents_final"] = steps[-1]
    if output_type == "np":
        out["image"] = torch.from_numpy(result.images[0])
        out["image_u8"] = torch.from_numpy(np.round(result.images[0] * 255).astype(np.uint8))
    else:
        out["image_u8"] = torch.from_numpy(np.asarray(result.images[0]).copy())
    img = out["image_u8"]
    meta["steps_run"] = len(steps)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, name + ".safetensors"), flat(meta))
    print(f"{name}: {len(steps)} steps, image {tuple(img.shape)}")


def main(names):
    """Every case, or only those named on the command line (the masks and the Fill model are then kept)."""
    if not names:
        write_masks()
        make_fill_model()
    for case in CASES:
        if not names or case[0] in names:
            run_case(*case)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
