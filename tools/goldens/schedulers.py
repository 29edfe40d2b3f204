#!/usr/bin/env python3
"""Reference runs of the Stable Diffusion 1.5 / SDXL samplers of diffusers (EulerDiscreteScheduler,
EulerAncestralDiscreteScheduler, DPMSolverMultistepScheduler, DDIMScheduler, PNDMScheduler) for Kiln's
discrete-schedule tests (tests/schedulers/discrete_schedulers_test.cpp).

Outputs (committed; CI never runs this script):
  tests/data/goldens/schedulers/<case>.safetensors, one per case, holding
    timesteps         float32 [n]   as the pipeline passes them to the UNet (int64 timesteps converted)
    sigmas            float32 [n+1] for the classes that have them
    alphas_cumprod    float32 [num_train_timesteps]
    init_noise_sigma  float32 [1] (a float32 tensor in diffusers, or 1.0)
    sample.{i}        the sample given to step i (sample.0 = the starting noise scaled by init_noise_sigma)
    scaled.{i}        scale_model_input(sample.{i}, t_i); absent where it is sample.{i} itself
    model_output.{i}  a deterministic "model": 0.3 * scaled + table * cos(t_i * pi / 1000), table fixed
    sample.{n}        the sample after the last step
    add_noise.{sample,noise,out}  add_noise at step index `add_noise_index` (image-to-image's begin index)
    img2img_timesteps the timesteps an image-to-image call with `strength` runs
  The metadata holds the case's arguments as JSON strings: class, base_config (a scheduler_config.json, loaded
  by its own class as a pipeline loads it), overrides (the keyword arguments of class.from_config(base, ...)),
  num_inference_steps, seed (ancestral sampling: the torch.Generator
  given to every step), add_noise_index, strength, img2img_start (t_start * order).

Each step is recorded with the sample it was given, so that a test can feed every step diffusers' own input
and errors do not accumulate across steps.

Usage: python tools/goldens/schedulers.py   (torch, diffusers 0.42.1, safetensors from pip)
"""
import json
import math
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from chroma import save_file  # noqa: E402  (the byte-for-byte reproducible writer)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "goldens", "schedulers")

# The scheduler_config.json of runwayml/stable-diffusion-v1-5 and of stabilityai/stable-diffusion-xl-base-1.0.
SD15 = {"_class_name": "PNDMScheduler", "_diffusers_version": "0.6.0", "beta_end": 0.012,
        "beta_schedule": "scaled_linear", "beta_start": 0.00085, "num_train_timesteps": 1000,
        "set_alpha_to_one": False, "skip_prk_steps": True, "steps_offset": 1, "trained_betas": None,
        "clip_sample": False}
SDXL = {"_class_name": "EulerDiscreteScheduler", "_diffusers_version": "0.19.0.dev0", "beta_end": 0.012,
        "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False, "interpolation_type": "linear",
        "num_train_timesteps": 1000, "prediction_type": "epsilon", "sample_max_value": 1.0, "set_alpha_to_one": False,
        "skip_prk_steps": True, "steps_offset": 1, "timestep_spacing": "leading", "trained_betas": None,
        "use_karras_sigmas": False}
SHAPE = (2, 4, 8, 8)


def loaded(config):
    """The scheduler config as a pipeline holds it: the file loaded by its own class (pipe.scheduler.config)."""
    import diffusers
    cls = getattr(diffusers, config["_class_name"])
    with tempfile.TemporaryDirectory() as d:
        json.dump(config, open(os.path.join(d, "scheduler_config.json"), "w"))
        return cls.from_pretrained(d).config


# name: (class, base config, overrides for from_config, steps, seed of the ancestral noise or None)
CASES = {
    "pndm_sd15_n7": ("PNDMScheduler", SD15, {}, 7, None),
    "pndm_sd15_n25": ("PNDMScheduler", SD15, {}, 25, None),
    "pndm_vpred_linspace_n4": ("PNDMScheduler", SD15, {"prediction_type": "v_prediction",
                                                       "timestep_spacing": "linspace"}, 4, None),
    "pndm_trailing_n7": ("PNDMScheduler", SD15, {"timestep_spacing": "trailing"}, 7, None),
    "euler_sdxl_n7": ("EulerDiscreteScheduler", SDXL, {}, 7, None),
    "euler_sdxl_n25": ("EulerDiscreteScheduler", SDXL, {}, 25, None),
    "euler_from_sd15_n7": ("EulerDiscreteScheduler", SD15, {}, 7, None),
    "euler_trailing_vpred_n4": ("EulerDiscreteScheduler", SDXL, {"timestep_spacing": "trailing",
                                                                 "prediction_type": "v_prediction"}, 4, None),
    "euler_karras_n7": ("EulerDiscreteScheduler", SDXL, {"use_karras_sigmas": True}, 7, None),
    "euler_karras_linspace_n25": ("EulerDiscreteScheduler", SD15, {"use_karras_sigmas": True}, 25, None),
    "euler_sigma_min_sample_n4": ("EulerDiscreteScheduler", SDXL, {"final_sigmas_type": "sigma_min",
                                                                   "prediction_type": "sample"}, 4, None),
    "euler_a_sdxl_n7": ("EulerAncestralDiscreteScheduler", SDXL, {}, 7, 1234),
    "euler_a_sd15_n25": ("EulerAncestralDiscreteScheduler", SD15, {}, 25, 42),
    "euler_a_trailing_vpred_n4": ("EulerAncestralDiscreteScheduler", SDXL, {"timestep_spacing": "trailing",
                                                                            "prediction_type": "v_prediction"}, 4, 7),
    "dpmpp_2m_sd15_n7": ("DPMSolverMultistepScheduler", SD15, {}, 7, None),
    "dpmpp_2m_sdxl_n25": ("DPMSolverMultistepScheduler", SDXL, {}, 25, None),
    "dpmpp_2m_karras_n7": ("DPMSolverMultistepScheduler", SDXL, {"use_karras_sigmas": True}, 7, None),
    "dpmpp_2m_karras_n25": ("DPMSolverMultistepScheduler", SD15, {"use_karras_sigmas": True}, 25, None),
    "dpmpp_2m_trailing_vpred_n4": ("DPMSolverMultistepScheduler", SDXL, {"timestep_spacing": "trailing",
                                                                         "prediction_type": "v_prediction"}, 4, None),
    "dpmpp_2m_heun_sigma_min_n7": ("DPMSolverMultistepScheduler", SD15, {"solver_type": "heun",
                                                                         "final_sigmas_type": "sigma_min"}, 7, None),
    "dpmpp_1s_linspace_n4": ("DPMSolverMultistepScheduler", SD15, {"solver_order": 1,
                                                                   "timestep_spacing": "linspace"}, 4, None),
    "ddim_sd15_n7": ("DDIMScheduler", SD15, {}, 7, None),
    "ddim_sd15_n25": ("DDIMScheduler", SD15, {}, 25, None),
    "ddim_trailing_vpred_n4": ("DDIMScheduler", SD15, {"timestep_spacing": "trailing",
                                                       "prediction_type": "v_prediction"}, 4, None),
    "ddim_linspace_clip_n7": ("DDIMScheduler", SD15, {"timestep_spacing": "linspace", "clip_sample": True,
                                                      "clip_sample_range": 0.5, "set_alpha_to_one": True}, 7, None),
    "ddim_linear_cos_n4": ("DDIMScheduler", {"_class_name": "DDIMScheduler", "beta_schedule": "squaredcos_cap_v2",
                                             "clip_sample": False}, {}, 4, None),
    "euler_linear_betas_n4": ("EulerDiscreteScheduler", {"_class_name": "EulerDiscreteScheduler",
                                                         "beta_schedule": "linear"}, {}, 4, None),
}
STRENGTH = 0.6


def to_f32(t):
    return torch.as_tensor(t).to(torch.float32).reshape(-1)


def run_case(name, cls_name, base, overrides, steps, seed):
    import diffusers
    cls = getattr(diffusers, cls_name)
    sched = cls.from_config(loaded(base), **overrides)
    sched.set_timesteps(steps)
    timesteps = sched.timesteps
    table = torch.randn(SHAPE, generator=torch.Generator("cpu").manual_seed(11))
    noise = torch.randn(SHAPE, generator=torch.Generator("cpu").manual_seed(5))
    init = sched.init_noise_sigma
    init = float(init.item()) if torch.is_tensor(init) else float(init)
    out = {"timesteps": to_f32(timesteps), "alphas_cumprod": to_f32(sched.alphas_cumprod),
           "init_noise_sigma": torch.tensor([init], dtype=torch.float32)}
    if hasattr(sched, "sigmas") and cls_name in ("EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler",
                                                  "DPMSolverMultistepScheduler"):
        out["sigmas"] = to_f32(sched.sigmas)
    generator = torch.Generator("cpu").manual_seed(seed) if seed is not None else None
    sample = noise * sched.init_noise_sigma
    for i, t in enumerate(timesteps):
        out[f"sample.{i}"] = sample
        scaled = sched.scale_model_input(sample, t)
        model_output = 0.3 * scaled + table * math.cos(float(t) * math.pi / 1000.0)
        if not torch.equal(scaled, sample):  # left out where scale_model_input is the identity
            out[f"scaled.{i}"] = scaled
        out[f"model_output.{i}"] = model_output
        kwargs = {"generator": generator} if generator is not None else {}
        sample = sched.step(model_output, t, sample, **kwargs).prev_sample
    out[f"sample.{len(timesteps)}"] = sample

    # Image-to-image as StableDiffusionImg2ImgPipeline.get_timesteps and prepare_latents do it.
    fresh = cls.from_config(loaded(base), **overrides)
    fresh.set_timesteps(steps)
    init_timestep = min(int(steps * STRENGTH), steps)
    t_start = max(steps - init_timestep, 0) * fresh.order
    out["img2img_timesteps"] = to_f32(fresh.timesteps[t_start:])
    if hasattr(fresh, "set_begin_index"):
        fresh.set_begin_index(t_start)
    clean = torch.randn(SHAPE, generator=torch.Generator("cpu").manual_seed(3))
    out["add_noise.sample"] = clean
    out["add_noise.noise"] = noise
    out["add_noise.out"] = fresh.add_noise(clean, noise, fresh.timesteps[t_start:t_start + 1].repeat(SHAPE[0]))

    meta = {"class": cls_name, "base_config": json.dumps(base), "overrides": json.dumps(overrides), "num_inference_steps": json.dumps(steps),
            "seed": json.dumps(seed), "add_noise_index": json.dumps(t_start), "strength": json.dumps(STRENGTH),
            "img2img_start": json.dumps(t_start), "diffusers": diffusers.__version__}
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, name + ".safetensors"), meta)


def main():
    import diffusers
    assert diffusers.__version__ == "0.42.1", f"expected diffusers 0.42.1, got {diffusers.__version__}"
    os.makedirs(OUT, exist_ok=True)
    for name, args in CASES.items():
        run_case(name, *args)
        print("wrote", name)


if __name__ == "__main__":
    main()
