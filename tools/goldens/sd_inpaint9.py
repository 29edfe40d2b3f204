#!/usr/bin/env python3
"""Tiny SD1.5 and SDXL INPAINTING pipelines (a UNet of in_channels 9, as stable-diffusion-v1-5/
stable-diffusion-inpainting and diffusers/stable-diffusion-xl-1.0-inpainting-0.1) of diffusers' real classes, and
the stages of StableDiffusionInpaintPipeline / StableDiffusionXLInpaintPipeline running them, for Kiln's parity
tests (tests/pipelines/stable_diffusion_inpaint9_test.cpp). tools/goldens/sd_notes.md section 5 says what diffusers
does (the 9-channel path: prepare_latents skips the image at full strength, prepare_mask_latents' masked image
sample, the UNet input cat([scale_model_input(latents), mask, masked_image_latents]), no blend).

Outputs (committed; CI never runs this script):
  tests/data/models/sd15-inpaint-tiny/   StableDiffusionInpaintPipeline, float32: sd15-tiny's text encoder,
      tokenizer, VAE and scheduler (read back from tests/data/models/sd15-tiny, written by tools/goldens/sd.py) and
      a UNet of sd15-tiny's config but in_channels 9 (its own random weights, norms perturbed as sd.py's)
  tests/data/models/sdxl-inpaint-tiny/   StableDiffusionXLInpaintPipeline, float32: sdxl-tiny's components and a
      9-channel UNet of sdxl-tiny's config (requires_aesthetics_score false, as the real 0.1 model)
  tests/data/goldens/sd_single_file/sd15_inpaint_tiny_unet_only.safetensors   the SD1.5 inpainting UNet alone in
      the original layout (model.diffusion_model.*, conv_in = input_blocks.0.0 of [16, 9, 3, 3]), as inpainting
      finetunes' UNets ship; with sd15-tiny's (4-channel) config folder diffusers'
      UNet2DConditionModel.from_single_file(file, config=sd15-inpaint-tiny) gives the folder's UNet bit for bit
      (checked here), and Kiln loads it on sd15-tiny's configs taking in_channels 9 from the file
  tests/data/goldens/sd_inpaint9/<case>.safetensors   one call each; metadata as tools/goldens/sd.py's (the call's
      arguments, pipeline, model, dtype, seed, cfg, steps_run, scheduler). Tensors (B images; bf16 cases keep bf16):
        init_image [1, 3, H, W]        image_processor.preprocess(image, height, width[, crop, "fill"]), float32
        mask_condition [1, 1, H, W]    mask_processor.preprocess(mask_image, ...): binarized to {0, 1}
        masked_image [1, 3, H, W]      init_image * (mask_condition < 0.5)
        noise [B, 4, h, w]             prepare_latents' noise (drawn AFTER the image's posterior sample when
                                       strength < 1; the first draw at strength 1, where the image is not encoded)
        image_latents [1, 4, h, w]     strength < 1 only: scaling_factor * the image's posterior sample
        latents_init [B, 4, h, w]      prepare_latents' latents: noise * init_noise_sigma at strength 1, else
                                       scheduler.add_noise(image_latents, noise, t0)
        mask [B, 1, h, w]              prepare_mask_latents' mask (interpolate nearest to the latent grid), one
                                       half (the pipeline doubles it for CFG)
        masked_image_latents [B, 4, h, w]   scaling_factor * the masked image's posterior sample (drawn after the
                                       noise), one half
        unet_in_step0 [2B or B, 9, h, w]    the first UNet call's sample: cat([scale_model_input(latents) (doubled),
                                       mask, masked_image_latents], dim=1); unet_out_step0 its output,
                                       unet_encoder_hidden_states_step0 its context (SDXL: add_time_ids and
                                       unet_text_embeds_step0, its added conditions)
        noise_pred_step0, latents_step0, latents_final, timesteps_run   as sd.py's
        image [B, H, W, 3] float (not for padding_mask_crop cases), image_u8 [B, H', W', 3]: (image * 255).round(),
                                       or with padding_mask_crop the PIL output (pasted back into the original,
                                       the original's size)

One case runs sdxl-tiny's 4-channel UNet at SDXL inpainting's default strength 0.9999: the SD pipelines'
get_timesteps floors the steps a strength runs (int(n * strength)), which no case of tools/goldens/sd.py shows
(its tensors: those above without the UNet's; mask and masked_image_latents as the 4-channel path computes them).

Checked here: every tensor above is redrawn from a fresh generator in diffusers' order (image sample only when
strength < 1, noise, masked image sample); the UNet input is exactly that concatenation; an ancestral sampler's
per-step noise comes after the masked image's sample (the call matches only then); the saved folders reload to the
in-memory weights; another prompt moves the image; bf16 against float32.

Usage: python3 tools/goldens/sd_inpaint9.py   (after tools/goldens/sd.py has written sd15-tiny and sdxl-tiny)
"""
import copy
import functools
import os
import shutil
import sys

import numpy as np
import torch
from diffusers.utils import logging as diffusers_logging
from PIL import Image
from transformers.utils import logging as transformers_logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chroma import first_call, folder_size, meta_of, save_file  # noqa: E402
from sd import (CAT, FOX, IMAGES, LIGHTHOUSE, MASKS, MODELS, NEGATIVE, ROOT, SD15_SCHEDULER,  # noqa: E402
                SDXL_SCHEDULER, perturb, save_pipeline, swap_scheduler)
from sd_single_file import unet_to_original  # noqa: E402

GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "sd_inpaint9")
SINGLE_FILES = os.path.join(ROOT, "tests", "data", "goldens", "sd_single_file")
F32, BF16 = torch.float32, torch.bfloat16
SDP, XLP = "StableDiffusionInpaintPipeline", "StableDiffusionXLInpaintPipeline"


def inpainting_unet(base, seed):
    """`base`'s UNet config with in_channels 9, its own random weights, norms perturbed as sd.py's."""
    from diffusers import UNet2DConditionModel

    config = {k: v for k, v in base.unet.config.items() if not k.startswith("_")}
    config["in_channels"] = 9
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(**config)
    perturb((unet,), seed + 1)
    return unet


def build(models):
    """The two inpainting folders from sd.py's tiny ones (their text encoders, tokenizers, VAE, scheduler)."""
    from diffusers import (StableDiffusionInpaintPipeline, StableDiffusionPipeline, StableDiffusionXLInpaintPipeline,
                           StableDiffusionXLPipeline)

    built = {}
    base = StableDiffusionPipeline.from_pretrained(os.path.join(models, "sd15-tiny"), safety_checker=None)
    pipe = StableDiffusionInpaintPipeline(
        vae=base.vae, text_encoder=base.text_encoder, tokenizer=base.tokenizer, unet=inpainting_unet(base, 40),
        scheduler=base.scheduler, safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    save_pipeline(pipe, os.path.join(models, "sd15-inpaint-tiny"), SD15_SCHEDULER)
    built["sd15-inpaint-tiny"] = pipe
    base = StableDiffusionXLPipeline.from_pretrained(os.path.join(models, "sdxl-tiny"), add_watermarker=False)
    pipe = StableDiffusionXLInpaintPipeline(
        vae=base.vae, text_encoder=base.text_encoder, text_encoder_2=base.text_encoder_2, tokenizer=base.tokenizer,
        tokenizer_2=base.tokenizer_2, unet=inpainting_unet(base, 42), scheduler=base.scheduler,
        requires_aesthetics_score=False, force_zeros_for_empty_prompt=True, add_watermarker=False)
    save_pipeline(pipe, os.path.join(models, "sdxl-inpaint-tiny"), SDXL_SCHEDULER)
    built["sdxl-inpaint-tiny"] = pipe
    return built


def load_pipeline(cls_name, model, dtype):
    import diffusers

    kwargs = dict(add_watermarker=False) if cls_name == XLP else dict(safety_checker=None)
    pipe = getattr(diffusers, cls_name).from_pretrained(os.path.join(MODELS, model), torch_dtype=dtype, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.unet.config.in_channels == (4 if model == "sdxl-tiny" else 9)
    return pipe


CASES = [
    # name, pipeline class, model folder, dtype, call arguments (+ seed; scheduler: a class swapped in with
    # from_config)
    # SD1.5 inpainting's defaults: strength 1 (the noise itself, the image never encoded: the masked image's sample
    # is the generator's draw after the noise), PNDM, CFG 7.5 with a negative prompt; a box mask.
    ("sd15_inpaint9_ref_a_s40", SDP, "sd15-inpaint-tiny", F32,
     dict(prompt=CAT, negative_prompt=NEGATIVE, image="ref_a", mask_image="mask_box", height=88, width=72,
          num_inference_steps=4, guidance_scale=7.5, seed=40)),
    # strength < 1: the image's sample first, then the noise, then the masked image's; Euler ancestral draws each
    # step's noise after those; two images (mask and masked image latents repeated for the batch).
    ("sd15_inpaint9_euler_a_s41", SDP, "sd15-inpaint-tiny", F32,
     dict(prompt=FOX, image="ref_a", mask_image="mask_box", height=48, width=64, strength=0.7,
          num_inference_steps=6, guidance_scale=7.5, num_images_per_prompt=2,
          scheduler="EulerAncestralDiscreteScheduler", seed=41)),
    # padding_mask_crop: the image and mask cropped around the mask (a tall region widened to 64 x 48), the
    # result pasted back into the 72 x 88 original (PIL output).
    ("sd15_inpaint9_crop_s42", SDP, "sd15-inpaint-tiny", F32,
     dict(prompt=LIGHTHOUSE, negative_prompt=NEGATIVE, image="ref_a", mask_image="mask_box", height=48, width=64,
          strength=0.9, num_inference_steps=4, guidance_scale=7.5, padding_mask_crop=4, seed=42)),
    # The same folder in bfloat16 (diffusers' torch_dtype, Kiln's dtype: the weights rounded on load).
    ("sd15_inpaint9_bf16_s40", SDP, "sd15-inpaint-tiny", BF16,
     dict(prompt=CAT, negative_prompt=NEGATIVE, image="ref_a", mask_image="mask_box", height=88, width=72,
          num_inference_steps=4, guidance_scale=7.5, seed=40)),
    # SDXL inpainting's default strength 0.9999 (the image encoded and noised), Euler, CFG 5, zero negatives.
    ("sdxl_inpaint9_ref_a_s44", XLP, "sdxl-inpaint-tiny", F32,
     dict(prompt=FOX, image="ref_a", mask_image="mask_box", height=88, width=72, strength=0.9999,
          num_inference_steps=5, guidance_scale=5.0, seed=44)),
    # strength 1 with Euler (init_noise_sigma > 1) and no guidance (the UNet batch is B, not doubled).
    ("sdxl_inpaint9_nocfg_s45", XLP, "sdxl-inpaint-tiny", F32,
     dict(prompt=CAT, negative_prompt=NEGATIVE, image="ref_a", mask_image="mask_box", height=64, width=64,
          strength=1.0, num_inference_steps=4, guidance_scale=1.0, seed=45)),
    # The 4-channel SDXL UNet (sdxl-tiny, the blend after each step) at SDXL inpainting's default strength
    # 0.9999 of 5 steps: get_timesteps runs int(5 * 0.9999) = 4 steps, not 5 (the SD pipelines floor the steps
    # where the flow-matching ones do not).
    ("sdxl_inpaint4_strength_s46", XLP, "sdxl-tiny", F32,
     dict(prompt=FOX, image="ref_a", mask_image="mask_box", height=88, width=72, strength=0.9999,
          num_inference_steps=5, guidance_scale=5.0, seed=46)),
]


def run_case(name, cls_name, model, dtype, args, pipe=None):
    pipe = pipe or load_pipeline(cls_name, model, dtype)
    args = dict(args)
    seed = args.pop("seed")
    if "scheduler" in args:
        swap_scheduler(pipe, args["scheduler"], None)
    call = {k: v for k, v in args.items() if k != "scheduler"}
    call["image"] = Image.open(os.path.join(IMAGES, args["image"] + ".png")).convert("RGB")
    call["mask_image"] = Image.open(os.path.join(MASKS, args["mask_image"] + ".png"))
    batch = args.get("num_images_per_prompt", 1)
    cfg = args["guidance_scale"] > 1
    strength = args.get("strength", 1.0)
    crop = "padding_mask_crop" in args
    sched = pipe.scheduler
    captured, steps, ts = {}, [], []

    def unet_hook(module, a, kw, output):
        if not ts:
            captured.update(unet_in_step0=a[0].clone(), unet_out_step0=output[0].clone(),
                            unet_encoder_hidden_states_step0=kw["encoder_hidden_states"].clone())
            extra = kw.get("added_cond_kwargs") or {}
            if "time_ids" in extra:
                captured.update(add_time_ids=extra["time_ids"].clone(),
                                unet_text_embeds_step0=extra["text_embeds"].clone())
        ts.append(a[1].clone().reshape(()))

    hook = pipe.unet.register_forward_hook(unet_hook, with_kwargs=True)
    prepare_latents, prepare_mask_latents, step = pipe.prepare_latents, pipe.prepare_mask_latents, sched.step

    def record_prepare_latents(*a, **kw):
        result = prepare_latents(*a, **kw)
        captured["prepared"] = [r.clone() for r in result]
        return result

    def record_prepare_mask_latents(*a, **kw):
        mask, masked = prepare_mask_latents(*a, **kw)
        captured["mask_latents"] = (mask.clone(), masked.clone())
        return mask, masked

    @functools.wraps(step)
    def record_step(model_output, *a, **kw):
        first_call(captured, "noise_pred_step0", model_output)
        return step(model_output, *a, **kw)

    pipe.prepare_latents, pipe.prepare_mask_latents, sched.step = record_prepare_latents, \
        record_prepare_mask_latents, record_step

    def on_step(p, i, t, kwargs):
        steps.append(kwargs["latents"].clone())
        return {}

    with torch.no_grad():
        result = pipe(**call, generator=torch.Generator("cpu").manual_seed(seed),
                      output_type="pil" if crop else "np", callback_on_step_end=on_step)
    hook.remove()
    for attr in ("prepare_latents", "prepare_mask_latents"):
        pipe.__dict__.pop(attr, None)
    del sched.step

    out = {}
    h, w = args["height"], args["width"]
    crops = pipe.mask_processor.get_crop_region(call["mask_image"], w, h, pad=args["padding_mask_crop"]) \
        if crop else None
    mode = "fill" if crop else "default"
    out["init_image"] = pipe.image_processor.preprocess(call["image"], height=h, width=w, crops_coords=crops,
                                                        resize_mode=mode).float()
    out["mask_condition"] = pipe.mask_processor.preprocess(call["mask_image"], height=h, width=w,
                                                           crops_coords=crops, resize_mode=mode)
    assert set(out["mask_condition"].unique().tolist()) == {0.0, 1.0}, "a mask of both values"
    out["masked_image"] = out["init_image"] * (out["mask_condition"] < 0.5)
    nine = pipe.unet.config.in_channels == 9
    latents_init, noise = captured["prepared"][:2]  # a 9-channel UNet: no image latents returned
    out["latents_init"], out["noise"] = latents_init, noise
    mask, masked = captured["mask_latents"]
    n = mask.shape[0] // 2 if cfg else mask.shape[0]
    assert n == batch and (not cfg or (torch.equal(mask[n:], mask[:n]) and torch.equal(masked[n:], masked[:n])))
    out["mask"], out["masked_image_latents"] = mask[:n], masked[:n]
    for k in ("unet_in_step0", "unet_out_step0", "unet_encoder_hidden_states_step0", "noise_pred_step0",
              "add_time_ids", "unet_text_embeds_step0"):
        if k in captured:
            out[k] = captured[k]
    out["timesteps_run"] = torch.stack(ts)
    out["latents_step0"], out["latents_final"] = steps[0], steps[-1]
    if crop:
        out["image_u8"] = torch.from_numpy(np.stack([np.asarray(im.convert("RGB")) for im in result.images]))
    else:
        out["image"] = torch.from_numpy(np.ascontiguousarray(result.images)).float()
        out["image_u8"] = torch.from_numpy((result.images * 255).round().astype("uint8"))

    # diffusers' draws, redone from a fresh generator: the image's sample only below full strength, the noise,
    # the masked image's sample.
    g = torch.Generator("cpu").manual_seed(seed)
    scaling = pipe.vae.config.scaling_factor

    def encode(x):
        vae = pipe.vae
        if cls_name == XLP and vae.config.force_upcast:  # XL's _encode_vae_image encodes in float32
            vae = copy.deepcopy(vae).float()
        sample = vae.encode(x.to(dtype).to(vae.dtype)).latent_dist.sample(g)
        return (scaling * sample.to(dtype)).to(dtype)

    with torch.no_grad():
        if strength < 1:
            out["image_latents"] = encode(out["init_image"])
        assert torch.equal(torch.randn(noise.shape, generator=g, dtype=dtype), noise), name
        masked_latents = encode(out["masked_image"])
    assert torch.equal(masked_latents.repeat(batch, 1, 1, 1), out["masked_image_latents"]), name
    lh, lw = noise.shape[-2:]
    nearest = torch.nn.functional.interpolate(out["mask_condition"], size=(lh, lw))
    assert torch.equal(nearest.repeat(batch, 1, 1, 1).to(dtype), out["mask"]), name
    if strength == 1:
        assert torch.equal(latents_init, noise * sched.init_noise_sigma), name
    if not nine:
        assert len(captured["prepared"]) == 3 and torch.equal(captured["prepared"][2][:1], out["image_latents"])
        assert len(ts) == int(args["num_inference_steps"] * strength), (len(ts), name)
        meta = dict(args, seed=seed, pipeline=cls_name, model=model, dtype=str(dtype).split(".")[-1], cfg=cfg,
                    steps_run=len(steps), scheduler=type(sched).__name__)
        return {k: v.contiguous() for k, v in out.items()}, meta_of(meta), pipe
    # The UNet's input: the scaled latents (doubled under CFG), then the mask and the masked image's latents.
    x0 = torch.cat([latents_init] * 2) if cfg else latents_init
    if type(sched).__name__.startswith("Euler"):  # scale_model_input: x / sqrt(sigma^2 + 1)
        sigma = sched.sigmas[sched.timesteps.tolist().index(ts[0].item())]
        x0 = x0 / ((sigma ** 2 + 1) ** 0.5)
    rest = torch.cat([out["mask"], out["masked_image_latents"]], 1)
    got = out["unet_in_step0"]
    assert got.shape[1] == 9 and torch.equal(got[:, 4:], torch.cat([rest] * 2) if cfg else rest), name
    assert torch.allclose(got[:, :4].float(), x0.float(), rtol=1e-5, atol=1e-6), name

    meta = dict(args, seed=seed, pipeline=cls_name, model=model, dtype=str(dtype).split(".")[-1], cfg=cfg,
                steps_run=len(steps), scheduler=type(sched).__name__)
    return {k: v.contiguous() for k, v in out.items()}, meta_of(meta), pipe


def write_unet_single_file(built):
    """The SD1.5 inpainting UNet alone in the original layout, checked against diffusers' from_single_file."""
    from diffusers import UNet2DConditionModel
    from safetensors.torch import save_file as save_plain

    unet = built["sd15-inpaint-tiny"].unet
    tensors = {"model.diffusion_model." + k: v.contiguous()
               for k, v in unet_to_original(unet.state_dict(), dict(unet.config)).items()}
    path = os.path.join(SINGLE_FILES, "sd15_inpaint_tiny_unet_only.safetensors")
    save_plain(tensors, path)
    assert tuple(tensors["model.diffusion_model.input_blocks.0.0.weight"].shape) == (16, 9, 3, 3)
    got = UNet2DConditionModel.from_single_file(path, config=os.path.join(MODELS, "sd15-inpaint-tiny"),
                                                subfolder="unet", local_files_only=True)
    want = unet.state_dict()
    assert set(got.state_dict()) == set(want)
    assert all(torch.equal(got.state_dict()[k], want[k]) for k in want)
    print("sd15_inpaint_tiny_unet_only: from_single_file gives the folder's UNet,", len(want), "tensors")


def main():
    import diffusers

    assert diffusers.__version__ == "0.42.1", diffusers.__version__
    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    shutil.rmtree(GOLDENS, ignore_errors=True)
    os.makedirs(GOLDENS)

    built = build(MODELS)
    for name, mem in built.items():
        reloaded = load_pipeline(SDP if name.startswith("sd15") else XLP, name, F32)
        for comp in ("unet", "vae", "text_encoder", "text_encoder_2"):
            if getattr(mem, comp, None) is None:
                continue
            a, b = getattr(mem, comp).state_dict(), getattr(reloaded, comp).state_dict()
            assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a), (name, comp)
        print(f"{name}: {folder_size(os.path.join(MODELS, name)) / 1e6:.2f} MB")
    write_unet_single_file(built)

    images = {}
    for case in CASES:
        tensors, meta, _ = run_case(*case)
        images[case[0]] = tensors["image_u8"]
        save_file(tensors, os.path.join(GOLDENS, case[0] + ".safetensors"), metadata=meta)
        print("wrote", case[0], {k: tuple(v.shape) for k, v in tensors.items()})

    # The prompt changes the image (same seed, same call, another prompt), in both pipelines; bf16 vs float32.
    for case in (CASES[0], CASES[4]):
        other, _, _ = run_case(case[0], case[1], case[2], case[3], dict(case[4], prompt=LIGHTHOUSE))
        d = (images[case[0]].float() - other["image_u8"].float()).abs().mean().item()
        print(f"{case[0]}: another prompt moves the image by {d:.1f} levels on average")
        assert d > 2, "the prompt barely changes the image"
    d = (images["sd15_inpaint9_ref_a_s40"].float() - images["sd15_inpaint9_bf16_s40"].float()).abs().mean().item()
    print(f"bf16 vs f32: mean level difference {d:.2f}")
    print(f"goldens {folder_size(GOLDENS) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
