#!/usr/bin/env python3
"""A tiny Stable Diffusion 2.x pipeline (StableDiffusionPipeline on SD 2.1's layout: a gelu CLIP read at its last
layer, the UNet's linear projections, per-block head counts and upcast_attention, and SD 2.1's DDIM scheduler with
v-prediction) and two goldens, with tools/goldens/sd.py's builders and recorder.

Outputs (committed; CI never runs this):
  tests/data/models/sd2-tiny/                      the pipeline, float32 (scheduler_config.json is SD 2.1's, key for
                                                   key)
  tests/data/goldens/sd/sd2_vpred_32x32_s30.safetensors    DDIM (the folder's), guided, 5 steps
  tests/data/goldens/sd/sd2_euler_48x32_s31.safetensors    Euler from the folder's config (v-prediction carried over)

Usage: python3 tools/goldens/sd2.py   (after tools/goldens/sd.py; torch, diffusers 0.42.1, transformers 5)
"""
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sd  # noqa: E402  the tiny SD builders, save_pipeline and run_case

# stabilityai/stable-diffusion-2-1 scheduler/scheduler_config.json, key for key.
SD21_SCHEDULER = {
    "_class_name": "DDIMScheduler", "_diffusers_version": "0.8.0", "beta_end": 0.012,
    "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False, "num_train_timesteps": 1000,
    "prediction_type": "v_prediction", "set_alpha_to_one": False, "skip_prk_steps": True, "steps_offset": 1,
    "trained_betas": None}


def sd2_components():
    from diffusers import DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    tok = CLIPTokenizer.from_pretrained(os.path.join(sd.TOKENIZERS, "tokenizer"))
    torch.manual_seed(40)
    te = CLIPTextModel(sd.clip_config(len(tok), 3, "gelu"))
    torch.manual_seed(41)
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, flip_sin_to_cos=True, freq_shift=0,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), block_out_channels=sd.CHANNELS,
        layers_per_block=2, downsample_padding=1, mid_block_scale_factor=1, act_fn="silu", norm_num_groups=8,
        norm_eps=1e-5, cross_attention_dim=sd.TE_HIDDEN, attention_head_dim=(2, 4, 4), use_linear_projection=True,
        upcast_attention=True)
    torch.manual_seed(42)
    vae = sd.tiny_vae(0.18215, False)
    sd.perturb((te, unet, vae), 43)
    sched = DDIMScheduler.from_config({k: v for k, v in SD21_SCHEDULER.items() if not k.startswith("_")})
    return dict(vae=vae, text_encoder=te, tokenizer=tok, unet=unet, scheduler=sched, safety_checker=None,
                feature_extractor=None, requires_safety_checker=False)


def main():
    from diffusers import StableDiffusionPipeline

    torch.set_num_threads(2)
    pipe = StableDiffusionPipeline(**sd2_components())
    sd.save_pipeline(pipe, os.path.join(sd.MODELS, "sd2-tiny"), SD21_SCHEDULER)
    cases = [("sd2_vpred_32x32_s30", dict(prompt=sd.CAT, negative_prompt=sd.NEGATIVE, height=32, width=32,
                                          num_inference_steps=5, guidance_scale=7.5, seed=30)),
             ("sd2_euler_48x32_s31", dict(prompt=sd.FOX, height=48, width=32, num_inference_steps=5,
                                          guidance_scale=7.5, scheduler="EulerDiscreteScheduler", seed=31))]
    for name, args in cases:
        tensors, meta, _ = sd.run_case(name, sd.SD, "sd2-tiny", sd.F32, args, internals=False)
        save_file(tensors, os.path.join(sd.GOLDENS, name + ".safetensors"), metadata=meta)
        print("wrote", name, meta.get("scheduler"), [round(float(t), 1) for t in tensors["timesteps_run"]])
    print(f"sd2-tiny: {sd.folder_size(os.path.join(sd.MODELS, 'sd2-tiny')) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
