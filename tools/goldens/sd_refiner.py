#!/usr/bin/env python3
"""Goldens for the SDXL refiner and SDXL's time ids, from diffusers 0.42.1 itself.

The refiner (stabilityai/stable-diffusion-xl-refiner-1.0) is an SDXL folder without the first text tower
(model_index.json: text_encoder and tokenizer null, requires_aesthetics_score true, force_zeros_for_empty_prompt
false) whose UNet takes 5 time ids: original size, crop corner and an aesthetic score in place of the target size
(projection_class_embeddings_input_dim = 5 * addition_time_embed_dim + projection_dim). diffusers runs it with
StableDiffusionXLImg2ImgPipeline and StableDiffusionXLInpaintPipeline; its text-to-image class fails on it.

Writes tests/data/models/sdxl-refiner-tiny (+ -bf16): a tiny refiner of diffusers' and transformers' real classes
(sd.py's OpenCLIP-like second tower and tokenizer_2, a UNet with the refiner's block layout: plain first and last
levels, cross-attention in the middle, linear projections; norms with non-trivial weights), and per case in
tests/data/goldens/sd_refiner/<case>.safetensors:

    prompt_embeds, pooled_prompt_embeds   what encode_prompt returned (the second tower alone: hidden_states[-2],
                                          text_embeds); negative_* with guidance
    add_time_ids [2B or B, 5 or 6]        added_cond_kwargs["time_ids"] of the first UNet call
    latents_step0, latents_final          after the first and the last step
    image_u8 [B, H, W, 3]                 the image as the PIL path saves it

Cases (base_*: sd.py's sdxl-tiny, the base's own time-id rules, which differ by class):
    refiner_img2img_*     the refiner's image-to-image: the default scores, then given scores, crop corners, a
                          negative prompt and two images; bf16
    refiner_inpaint_*     the refiner's inpainting (4-channel UNet)
    base_img2img_crops_*  the base's image-to-image with crops_coords_top_left and a different
                          negative_crops_coords_top_left: diffusers gives the negative side the POSITIVE corner
    base_txt2img_negcrop_* the base's text-to-image with both negative sizes and no negative corner: the negative
                          side takes (0, 0), not the positive corner
    base_txt2img_one_negative_size_*  only negative_original_size: the negative side takes the positive ids

Each case's image moves when the value it tests is changed (asserted), so a dropped or misread id shows.

Usage: python3 tools/goldens/sd_refiner.py   (torch, diffusers 0.42.1, transformers 5)
"""
import copy
import os
import shutil
import sys

import numpy as np
import torch
from diffusers.utils import logging as diffusers_logging
from PIL import Image
from transformers.utils import logging as transformers_logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chroma import folder_size, meta_of, save_file  # noqa: E402
from sd import (BF16, CHANNELS, F32, FOX, IMAGES, LIGHTHOUSE, MASKS, MODELS, NEGATIVE, ROOT, SDXL_SCHEDULER,  # noqa: E402
                TE2_PROJECTION, TE_HIDDEN, TIME_EMBED, TOKENIZERS, clip_config, load_pipeline as load, perturb,
                save_pipeline, tiny_vae)

GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "sd_refiner")
REFINER = "sdxl-refiner-tiny"
XLI, XLP, XL = "StableDiffusionXLImg2ImgPipeline", "StableDiffusionXLInpaintPipeline", "StableDiffusionXLPipeline"


def refiner_components():
    from diffusers import EulerDiscreteScheduler, UNet2DConditionModel
    from transformers import CLIPTextModelWithProjection, CLIPTokenizer

    tok2 = CLIPTokenizer.from_pretrained(os.path.join(TOKENIZERS, "tokenizer_2"))
    torch.manual_seed(40)
    te2 = CLIPTextModelWithProjection(clip_config(len(tok2), 2, "gelu", projection_dim=TE2_PROJECTION))
    torch.manual_seed(41)
    # The real refiner's layout, three levels instead of four: no attention at the outer levels.
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, flip_sin_to_cos=True, freq_shift=0,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=CHANNELS,
        layers_per_block=2, downsample_padding=1, mid_block_scale_factor=1, act_fn="silu", norm_num_groups=8,
        norm_eps=1e-5, cross_attention_dim=TE_HIDDEN, attention_head_dim=(2, 4, 4),
        transformer_layers_per_block=2, use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=TIME_EMBED, projection_class_embeddings_input_dim=5 * TIME_EMBED + TE2_PROJECTION)
    torch.manual_seed(42)
    vae = tiny_vae(0.13025, True)
    perturb((te2, unet, vae), 43)
    sched = EulerDiscreteScheduler.from_config({k: v for k, v in SDXL_SCHEDULER.items() if not k.startswith("_")})
    return dict(vae=vae, text_encoder=None, text_encoder_2=te2, tokenizer=None, tokenizer_2=tok2, unet=unet,
                scheduler=sched, requires_aesthetics_score=True, force_zeros_for_empty_prompt=False,
                add_watermarker=False)


CASES = [
    # name, class, model, dtype, call (+ seed)
    # No negative prompt: force_zeros_for_empty_prompt is false in the refiner, so "" is encoded. Default scores.
    ("refiner_img2img_ref_a_s0", XLI, REFINER, F32,
     dict(prompt=FOX, image="ref_a", strength=0.5, num_inference_steps=6, guidance_scale=5.0, seed=0)),
    # Given scores, crop corners (the negative's own), a negative prompt, prompt_2 (unread: one tower), 2 images.
    ("refiner_img2img_scores_ref_b_s1", XLI, REFINER, F32,
     dict(prompt=LIGHTHOUSE, prompt_2="unread", negative_prompt=NEGATIVE, image="ref_b", strength=0.6,
          num_inference_steps=5, guidance_scale=6.0, aesthetic_score=8.5, negative_aesthetic_score=1.0,
          original_size=[128, 96], crops_coords_top_left=[8, 4], negative_crops_coords_top_left=[16, 0],
          num_images_per_prompt=2, seed=1)),
    ("refiner_img2img_bf16_ref_a_s0", XLI, REFINER + "-bf16", BF16,
     dict(prompt=FOX, image="ref_a", strength=0.5, num_inference_steps=6, guidance_scale=5.0, seed=0)),
    ("refiner_inpaint_ref_a_s2", XLP, REFINER, F32,
     dict(prompt=FOX, negative_prompt=NEGATIVE, image="ref_a", mask_image="mask_box", height=88, width=72,
          strength=0.7, num_inference_steps=5, guidance_scale=5.0, aesthetic_score=7.0, seed=2)),
    ("base_img2img_crops_ref_a_s3", XLI, "sdxl-tiny", F32,
     dict(prompt=FOX, negative_prompt=NEGATIVE, image="ref_a", strength=0.6, num_inference_steps=5,
          guidance_scale=5.0, crops_coords_top_left=[16, 8], negative_crops_coords_top_left=[0, 24],
          negative_original_size=[40, 40], seed=3)),
    ("base_txt2img_negcrop_32x32_s4", XL, "sdxl-tiny", F32,
     dict(prompt=LIGHTHOUSE, negative_prompt=NEGATIVE, height=32, width=32, num_inference_steps=4,
          guidance_scale=5.0, crops_coords_top_left=[16, 8], negative_original_size=[64, 48],
          negative_target_size=[32, 32], seed=4)),
    ("base_txt2img_one_negative_size_32x32_s5", XL, "sdxl-tiny", F32,
     dict(prompt=LIGHTHOUSE, negative_prompt=NEGATIVE, height=32, width=32, num_inference_steps=4,
          guidance_scale=5.0, negative_original_size=[64, 48], seed=5)),
]

# Per case: a change to the value it tests, which must move the image.
MOVES = {
    "refiner_img2img_ref_a_s0": dict(aesthetic_score=2.0),
    "refiner_img2img_scores_ref_b_s1": dict(negative_crops_coords_top_left=[0, 0]),
    "refiner_inpaint_ref_a_s2": dict(negative_aesthetic_score=6.0),
    "base_img2img_crops_ref_a_s3": dict(crops_coords_top_left=[0, 0]),
    "base_txt2img_negcrop_32x32_s4": dict(negative_crops_coords_top_left=[16, 8]),
    "base_txt2img_one_negative_size_32x32_s5": dict(negative_target_size=[32, 32]),
}


def run(pipe, args):
    args = dict(args)
    seed = args.pop("seed")
    call = {k: (tuple(v) if isinstance(v, list) and k.endswith(("_size", "_top_left")) else v)
            for k, v in args.items()}
    if "image" in call:
        call["image"] = Image.open(os.path.join(IMAGES, call["image"] + ".png")).convert("RGB")
    if "mask_image" in call:
        call["mask_image"] = Image.open(os.path.join(MASKS, call["mask_image"] + ".png"))
    captured, steps = {}, []

    def unet_hook(module, a, kw):
        if "add_time_ids" not in captured:
            captured["add_time_ids"] = kw["added_cond_kwargs"]["time_ids"].clone()

    encode_prompt = pipe.encode_prompt

    def record_encode_prompt(*a, **kw):
        result = encode_prompt(*a, **kw)
        captured["encoded"] = [None if r is None else r.clone() for r in result]
        return result

    hook = pipe.unet.register_forward_pre_hook(unet_hook, with_kwargs=True)
    pipe.encode_prompt = record_encode_prompt
    with torch.no_grad():
        result = pipe(**call, generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                      callback_on_step_end=lambda p, i, t, kw: steps.append(kw["latents"].clone()) or {},
                      callback_on_step_end_tensor_inputs=["latents"])
    hook.remove()
    del pipe.encode_prompt
    images = result.images
    enc = captured["encoded"]
    out = dict(prompt_embeds=enc[0], pooled_prompt_embeds=enc[2], add_time_ids=captured["add_time_ids"],
               latents_step0=steps[0], latents_final=steps[-1],
               image_u8=torch.from_numpy((images * 255).round().astype("uint8")))
    if args["guidance_scale"] > 1:
        out["negative_prompt_embeds"], out["negative_pooled_prompt_embeds"] = enc[1], enc[3]
    return {k: v.contiguous() for k, v in out.items()}, seed


def main():
    import diffusers

    assert diffusers.__version__ == "0.42.1", diffusers.__version__
    diffusers_logging.set_verbosity_error()
    transformers_logging.set_verbosity_error()
    torch.set_num_threads(2)
    shutil.rmtree(GOLDENS, ignore_errors=True)
    os.makedirs(GOLDENS)

    pipe = diffusers.StableDiffusionXLImg2ImgPipeline(**refiner_components())
    save_pipeline(pipe, os.path.join(MODELS, REFINER), SDXL_SCHEDULER)
    save_pipeline(copy.deepcopy(pipe).to(torch.bfloat16), os.path.join(MODELS, REFINER + "-bf16"), SDXL_SCHEDULER)
    for folder in (REFINER, REFINER + "-bf16"):
        print(f"{folder}: {folder_size(os.path.join(MODELS, folder)) / 1e6:.2f} MB")
        assert not os.path.exists(os.path.join(MODELS, folder, "text_encoder"))
    reloaded = load(XLI, REFINER, F32)
    assert reloaded.text_encoder is None and reloaded.tokenizer is None
    assert reloaded.config.requires_aesthetics_score and not reloaded.config.force_zeros_for_empty_prompt
    for k, v in pipe.unet.state_dict().items():
        assert torch.equal(v, reloaded.unet.state_dict()[k]), k
    # diffusers' text-to-image class fails on the refiner (it passes 6 time ids to a UNet that takes 5).
    try:
        load(XL, REFINER, F32)(prompt=FOX, height=32, width=32, num_inference_steps=1)
        raise AssertionError("StableDiffusionXLPipeline ran the refiner")
    except ValueError as e:
        assert "added time embedding vector" in str(e), e

    for name, cls_name, model, dtype, args in CASES:
        pipe = load(cls_name, model, dtype)
        tensors, seed = run(pipe, args)
        ids = tensors["add_time_ids"].float()
        rows = ids.shape[0] // 2
        if model.startswith(REFINER):
            assert ids.shape[1] == 5
            assert ids[rows:, 4].eq(args.get("aesthetic_score", 6.0)).all(), ids
            assert ids[:rows, 4].eq(args.get("negative_aesthetic_score", 2.5)).all(), ids
            # One tower: the context is the second tower's penultimate layer alone.
            assert tensors["prompt_embeds"].shape[-1] == TE_HIDDEN
        elif cls_name == XLI:
            assert ids[:rows, 2:4].eq(torch.tensor(args["crops_coords_top_left"]).float()).all(), ids
        elif "negcrop" in name:
            assert ids[0, 2:4].eq(0).all() and ids[1, 2:4].eq(torch.tensor([16.0, 8.0])).all(), ids
        else:
            assert torch.equal(ids[0], ids[1]), ids
        moved, _ = run(pipe, dict(args, **MOVES[name])) if name in MOVES else (None, None)
        if moved is not None:
            d = (tensors["image_u8"].float() - moved["image_u8"].float()).abs().mean().item()
            print(f"{name}: {MOVES[name]} moves the image by {d:.2f} levels on average")
            assert d > 0.3, name
        meta = dict(args, seed=seed, pipeline=cls_name, model=model, dtype=str(dtype).split(".")[-1])
        save_file(tensors, os.path.join(GOLDENS, name + ".safetensors"), metadata=meta_of(meta))
        print("wrote", name, {k: tuple(v.shape) for k, v in tensors.items()})
    # Another prompt moves the refiner's image.
    other, _ = run(load(XLI, REFINER, F32), dict(CASES[0][4], prompt=LIGHTHOUSE))
    first = load_file_image(os.path.join(GOLDENS, CASES[0][0] + ".safetensors"))
    d = (first.float() - other["image_u8"].float()).abs().mean().item()
    print(f"another prompt moves the refiner's image by {d:.2f} levels on average")
    assert d > 0.3
    print(f"goldens {folder_size(GOLDENS) / 1e6:.2f} MB")


def load_file_image(path):
    from safetensors.torch import load_file

    return load_file(path)["image_u8"]


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
