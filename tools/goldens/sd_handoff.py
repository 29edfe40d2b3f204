#!/usr/bin/env python3
"""Goldens for SDXL's base -> refiner hand-off in latents ("ensemble of expert denoisers"), from diffusers 0.42.1.

diffusers' documented workflow runs the base for the first part of the schedule and hands its latents to the
refiner, which runs the rest:

    latents = base(prompt, num_inference_steps=n, denoising_end=f, output_type="latent", generator=g(0)).images
    image = refiner(prompt, num_inference_steps=n, denoising_start=f, image=latents, generator=g(0)).images[0]

The base stops at the discrete cutoff int(round(T - f * T)) (the timesteps >= it run); the refiner's get_timesteps
runs the timesteps below the same cutoff (strength ignored) and its prepare_latents takes a 4-channel `image` as the
latents themselves (no VAE encode) and adds no noise (add_noise = denoising_start is None). The inpainting class
does the same with a mask: no masked image latents are drawn for a latent image, the kept region is blended back
from the latents given, clean after the last step.

The models are sd.py's sdxl-tiny (base) and sd_refiner.py's sdxl-refiner-tiny, whose one text tower is as wide as
the base's text_encoder_2 (32), as the real refiner's is. Per case, tests/data/goldens/sd_handoff/<case>.safetensors:

    base_latents [B, 4, h, w]    the base's output_type="latent" output (unscaled: as its loop leaves them)
    base_steps                   [timesteps the base ran] (float)
    refiner_step0                the refiner's latents after its first step
    refiner_steps                [timesteps the refiner ran]
    refiner_latents_final        after its last step
    image_u8 [B, H, W, 3]        the refiner's image as the PIL path saves it
    base_latents_earlier         the base's latents at another denoising_end (must differ: a dropped cutoff shows)

Cases:
    handoff_euler_*      text-to-image base -> image-to-image refiner, the folders' EulerDiscreteScheduler
    handoff_dpmpp2m_*    the same with DPMSolverMultistepScheduler (multistep: its history starts fresh in the
                         refiner, as diffusers' set_begin_index does)
    handoff_inpaint_*    inpainting base -> inpainting refiner, one mask
    bad_latents_3_channels  latents of 3 channels (kiln generate --init-latents refuses them naming the VAE's 4)
    refine_image_*       the refiner's image-to-image with denoising_start and an image (not latents): the image
                         encoded (its posterior sampled) and taken without noise, strength ignored; recorded as
                         refiner_step0, refiner_steps, refiner_latents_final and image_u8 only

Usage: python3 tools/goldens/sd_handoff.py   (torch, diffusers 0.42.1, transformers 5)
"""
import os
import shutil
import sys

import torch
from diffusers.utils import logging as diffusers_logging
from PIL import Image
from transformers.utils import logging as transformers_logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chroma import folder_size, meta_of, save_file  # noqa: E402
from sd import F32, FOX, IMAGES, LIGHTHOUSE, MASKS, NEGATIVE, ROOT, load_pipeline as load  # noqa: E402

GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "sd_handoff")
BASE, REFINER = "sdxl-tiny", "sdxl-refiner-tiny"
XL, XLI, XLP = "StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline", "StableDiffusionXLInpaintPipeline"

CASES = [
    # name, base class, refiner class, call shared by both stages, denoising fraction, another fraction, scheduler
    ("handoff_euler_48x40_s0", XL, XLI,
     dict(prompt=FOX, negative_prompt=NEGATIVE, height=48, width=40, num_inference_steps=10, guidance_scale=5.0,
          seed=0), 0.8, 0.6, None),
    ("handoff_dpmpp2m_32x32_s1", XL, XLI,
     dict(prompt=LIGHTHOUSE, height=32, width=32, num_inference_steps=8, guidance_scale=6.0, seed=1), 0.7, 0.5,
     "DPMSolverMultistepScheduler"),
    ("handoff_inpaint_ref_a_40x48_s2", XLP, XLP,
     dict(prompt=FOX, image="ref_a", mask_image="mask_box", height=40, width=48, num_inference_steps=8,
          guidance_scale=5.0, seed=2), 0.75, 0.5, None),
]


def with_scheduler(pipe, scheduler):
    if scheduler:
        import diffusers

        pipe.scheduler = getattr(diffusers, scheduler).from_config(pipe.scheduler.config)
    return pipe


def call_args(args):
    call = dict(args)
    seed = call.pop("seed")
    if "image" in call:
        call["image"] = Image.open(os.path.join(IMAGES, call["image"] + ".png")).convert("RGB")
    if "mask_image" in call:
        call["mask_image"] = Image.open(os.path.join(MASKS, call["mask_image"] + ".png"))
    return call, seed


def run(pipe, call, seed, **kw):
    """The call's output and, per step, the timestep and the latents after it."""
    steps = []

    def record(p, i, t, k):
        steps.append((float(t), k["latents"].clone()))
        return {}

    with torch.no_grad():
        out = pipe(**call, **kw, generator=torch.Generator("cpu").manual_seed(seed), callback_on_step_end=record,
                   callback_on_step_end_tensor_inputs=["latents"])
    return out, steps


def handoff(base, refiner, args, fraction):
    call, seed = call_args(args)
    latents, base_steps = run(base, call, seed, denoising_end=fraction, output_type="latent")
    latents = latents.images
    refined_call = dict(call, image=latents)
    out, steps = run(refiner, refined_call, seed, denoising_start=fraction, output_type="np")
    return latents, base_steps, out.images, steps


def main():
    import diffusers

    assert diffusers.__version__ == "0.42.1", diffusers.__version__
    diffusers_logging.set_verbosity_error()
    transformers_logging.set_verbosity_error()
    torch.set_num_threads(2)
    shutil.rmtree(GOLDENS, ignore_errors=True)
    os.makedirs(GOLDENS)
    for name, base_cls, refiner_cls, args, fraction, other, scheduler in CASES:
        base = with_scheduler(load(base_cls, BASE, F32), scheduler)
        refiner = with_scheduler(load(refiner_cls, REFINER, F32), scheduler)
        assert refiner.unet.config.cross_attention_dim == base.text_encoder_2.config.hidden_size
        latents, base_steps, images, steps = handoff(base, refiner, args, fraction)
        n = args["num_inference_steps"]
        cutoff = int(round(1000 - fraction * 1000))
        # The base ran the timesteps >= the cutoff, the refiner the rest: together the whole schedule (inpainting's
        # base starts where its default strength 0.9999 does, one step in).
        assert all(t >= cutoff for t, _ in base_steps) and all(t < cutoff for t, _ in steps), (base_steps, steps)
        whole = n - 1 if base_cls == XLP else n
        assert len(base_steps) + len(steps) == whole and len(steps) > 0, (len(base_steps), len(steps))
        assert torch.equal(latents, base_steps[-1][1])  # "latent": the loop's last latents, unscaled
        earlier, earlier_steps, earlier_images, _ = handoff(base, refiner, args, other)
        assert len(earlier_steps) < len(base_steps)
        d = (torch.from_numpy(images) - torch.from_numpy(earlier_images)).abs().mean().item() * 255
        print(f"{name}: denoising_end {fraction} -> {other} moves the image by {d:.2f} levels on average")
        assert d > 0.3, name
        tensors = dict(base_latents=latents, base_steps=torch.tensor([t for t, _ in base_steps]),
                       refiner_step0=steps[0][1], refiner_steps=torch.tensor([t for t, _ in steps]),
                       refiner_latents_final=steps[-1][1], base_latents_earlier=earlier,
                       image_u8=torch.from_numpy((images * 255).round().astype("uint8")))
        meta = dict(args, denoising_end=fraction, other_denoising_end=other, base_pipeline=base_cls,
                    pipeline=refiner_cls, base_model=BASE, model=REFINER, dtype="float32",
                    **({"scheduler": scheduler} if scheduler else {}))
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(GOLDENS, name + ".safetensors"),
                  metadata=meta_of(meta))
        print("wrote", name, {k: tuple(v.shape) for k, v in tensors.items()}, "base ran", len(base_steps),
              "refiner", len(steps))
    # An image, not latents, with denoising_start: encoded, no noise added, strength ignored (another strength
    # must not move the image).
    name, args = "refine_image_ref_a_s3", dict(prompt=FOX, image="ref_a", num_inference_steps=6, guidance_scale=5.0,
                                               strength=0.3, seed=3)
    refiner = load(XLI, REFINER, F32)
    call, seed = call_args(args)
    out, steps = run(refiner, call, seed, denoising_start=0.6, output_type="np")
    same, _ = run(refiner, dict(call, strength=0.9), seed, denoising_start=0.6, output_type="np")
    assert (out.images == same.images).all()
    assert len(steps) == sum(t < 400 for t in refiner.scheduler.timesteps.tolist()), steps
    tensors = dict(refiner_step0=steps[0][1], refiner_steps=torch.tensor([t for t, _ in steps]),
                   refiner_latents_final=steps[-1][1],
                   image_u8=torch.from_numpy((out.images * 255).round().astype("uint8")))
    meta = dict(args, denoising_start=0.6, pipeline=XLI, model=REFINER, dtype="float32")
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(GOLDENS, name + ".safetensors"),
              metadata=meta_of(meta))
    print("wrote", name, {k: tuple(v.shape) for k, v in tensors.items()}, "refiner", len(steps))
    # For the command line's refusal: a file of latents of 3 channels where the VAE has 4.
    save_file({"latents": torch.zeros(1, 3, 24, 20)}, os.path.join(GOLDENS, "bad_latents_3_channels.safetensors"))
    print(f"goldens {folder_size(GOLDENS) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
