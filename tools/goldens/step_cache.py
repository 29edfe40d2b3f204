#!/usr/bin/env python3
"""References for step caching, made by diffusers' own hooks on the tiny test models: First Block Cache
(`transformer.enable_cache(FirstBlockCacheConfig(threshold))`, diffusers/hooks/first_block_cache.py) on
FluxPipeline, with and without true classifier-free guidance (its "cond" and "uncond" cache contexts), in float32
and bfloat16; and MagCache (`MagCacheConfig`, hooks/mag_cache.py) with diffusers' FLUX_MAG_RATIOS, and its
calibration run.

Outputs (committed; CI never runs this script):
  tests/data/goldens/step_cache/<case>.safetensors   the call's arguments and the cache in the metadata; per
      transformer call, in order: its context (0 cond, 1 uncond), whether the blocks after the first ran
      (`computed`) and the first block's relative residual change that decided it (`change`, -1 for a first
      call); the latents after the first step and at the end, and the image (8-bit)

The thresholds are chosen away from every change the call measures (printed), so that float32's rounding
cannot flip a decision: the tiny random models change far more between steps than trained ones do.

Usage: python tools/goldens/step_cache.py [CASE...]  (torch, diffusers, transformers, safetensors from pip)
"""
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from edit import call_tracking_latents, load_pipeline  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "goldens", "step_cache")

CASES = [
    # name, pipeline class, model, dtype, threshold, call arguments
    ("fbc_flux_dev_64x64_s31", "FluxPipeline", "flux-tiny-dev", torch.float32, 0.45,
     dict(prompt="a photo of a cat", height=64, width=64, num_inference_steps=12, guidance_scale=3.5,
          max_sequence_length=32, seed=31)),
    ("fbc_flux_schnell_48x80_s32", "FluxPipeline", "flux-tiny-schnell", torch.float32, 0.42,
     dict(prompt="a red fox in the snow", height=48, width=80, num_inference_steps=10, guidance_scale=0.0,
          max_sequence_length=24, seed=32)),
    # True CFG: two transformer calls per step, each context its own cache.
    ("fbc_flux_dev_true_cfg_64x64_s33", "FluxPipeline", "flux-tiny-dev", torch.float32, 0.45,
     dict(prompt="a photo of a cat", negative_prompt="blurry", true_cfg_scale=3.0, height=64, width=64,
          num_inference_steps=10, guidance_scale=3.5, max_sequence_length=32, seed=33)),
    ("fbc_flux_dev_bf16_64x64_s34", "FluxPipeline", "flux-tiny-dev-bf16", torch.bfloat16, 0.41,
     dict(prompt="a photo of a cat", height=64, width=64, num_inference_steps=12, guidance_scale=3.5,
          max_sequence_length=32, seed=34)),
]


# MagCache cases: name, model, dtype, config arguments (mag_ratios: diffusers' FLUX_MAG_RATIOS unless given;
# num_inference_steps: the call's), call arguments. The decisions follow from the ratios alone; the image checks
# the residual that is reused.
MAG_CASES = [
    ("mag_flux_dev_64x64_s41", "flux-tiny-dev", torch.float32, dict(threshold=0.06),
     dict(prompt="a photo of a cat", height=64, width=64, num_inference_steps=20, guidance_scale=3.5,
          max_sequence_length=32, seed=41)),
    ("mag_flux_dev_true_cfg_64x64_s42", "flux-tiny-dev", torch.float32,
     dict(threshold=0.12, max_skip_steps=2, retention_ratio=0.1),
     dict(prompt="a photo of a cat", negative_prompt="blurry", true_cfg_scale=3.0, height=64, width=64,
          num_inference_steps=14, guidance_scale=3.5, max_sequence_length=32, seed=42)),
    # Calibration: nothing skipped; the ratios of the residuals' norms, step to step.
    ("mag_calibrate_flux_schnell_48x80_s43", "flux-tiny-schnell", torch.float32, dict(calibrate=True),
     dict(prompt="a red fox in the snow", height=48, width=80, num_inference_steps=8, guidance_scale=0.0,
          max_sequence_length=24, seed=43)),
]


# TaylorSeer cases: name, model, dtype, config arguments, call arguments. Every attention module of the blocks
# (diffusers' default identifiers) is computed or forecast by its Taylor series; the schedule is the config's.
TAYLOR_CASES = [
    ("taylor_flux_dev_64x64_s51", "flux-tiny-dev", torch.float32, dict(),
     dict(prompt="a photo of a cat", height=64, width=64, num_inference_steps=14, guidance_scale=3.5,
          max_sequence_length=32, seed=51)),
    ("taylor_flux_dev_true_cfg_64x64_s52", "flux-tiny-dev", torch.float32,
     dict(cache_interval=3, disable_cache_before_step=2, max_order=2, taylor_factors_dtype=torch.float32,
          disable_cache_after_step=10),
     dict(prompt="a photo of a cat", negative_prompt="blurry", true_cfg_scale=3.0, height=64, width=64,
          num_inference_steps=12, guidance_scale=3.5, max_sequence_length=32, seed=52)),
]


def run_taylor_case(name, model, dtype, config_args, args):
    """TaylorSeer: each evaluation's decision (the first hooked module's), the image."""
    from diffusers.hooks import TaylorSeerCacheConfig
    from diffusers.hooks import taylorseer_cache as ts

    pipe = load_pipeline("FluxPipeline", model, dtype)
    record = []
    measure = ts.TaylorSeerCacheHook._measure_should_compute
    first = []

    def spy(self):
        should, state = measure(self)
        if not first:
            first.append(self)
        if self is first[0]:
            record.append((self.state_manager.context.name, bool(should)))
        return should, state

    ts.TaylorSeerCacheHook._measure_should_compute = spy
    try:
        pipe.transformer.enable_cache(TaylorSeerCacheConfig(**config_args))
        args = dict(args)
        seed = args.pop("seed")
        c = TaylorSeerCacheConfig(**config_args)
        spec = (f"taylorseer:interval={c.cache_interval}:warmup={c.disable_cache_before_step}:order={c.max_order}"
                + (f":until={c.disable_cache_after_step}" if c.disable_cache_after_step is not None else "")
                + (":factors=f32" if c.taylor_factors_dtype == torch.float32 else ""))
        meta = dict(args, seed=seed, pipeline="FluxPipeline", model=model, dtype=str(dtype).split(".")[-1],
                    cache=spec)
        result, steps = call_tracking_latents(
            pipe, dict(args, generator=torch.Generator().manual_seed(seed), output_type="np"))
    finally:
        ts.TaylorSeerCacheHook._measure_should_compute = measure
    out = {
        "context": torch.tensor([0 if ctx == "cond" else 1 for ctx, _ in record], dtype=torch.int64),
        "computed": torch.tensor([int(c) for _, c in record], dtype=torch.int64),
        "latents_final": steps[-1],
        "image_u8": torch.from_numpy(np.round(result.images[0] * 255).astype(np.uint8)),
    }
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, name + ".safetensors"),
              {k: str(v) for k, v in meta.items()})
    print(f"{name}: {len(record)} evaluations, forecast at {[i for i, (_, c) in enumerate(record) if not c]}, "
          f"spec {spec}")


def recording_decisions():
    """Wraps FBCHeadBlockHook's decision so that each call's context, change and decision are recorded."""
    from diffusers.hooks import first_block_cache as fbc

    record = []
    decide = fbc.FBCHeadBlockHook._should_compute_remaining_blocks

    def spy(self, residual):
        state = self.state_manager.get_state()
        context = self.state_manager.context.name
        change = -1.0
        if state.head_block_residual is not None:
            previous = state.head_block_residual
            change = ((residual - previous).abs().mean() / previous.abs().mean()).item()
        computed = decide(self, residual)
        record.append((context, change, computed))
        return computed

    fbc.FBCHeadBlockHook._should_compute_remaining_blocks = spy
    return record


def run_case(name, cls_name, model, dtype, threshold, args):
    from diffusers.hooks import FirstBlockCacheConfig

    pipe = load_pipeline(cls_name, model, dtype)
    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    record = recording_decisions()
    args = dict(args)
    seed = args.pop("seed")
    meta = dict(args, seed=seed, pipeline=cls_name, model=model, dtype=str(dtype).split(".")[-1],
                cache=f"fbcache:{threshold}")
    result, steps = call_tracking_latents(
        pipe, dict(args, generator=torch.Generator().manual_seed(seed), output_type="np"))
    changes = [c for _, c, _ in record if c >= 0]
    margin = min(abs(c - threshold) for c in changes)
    assert margin > 0.005, f"{name}: a change {margin} from the threshold: pick another ({[round(c, 4) for c in changes]})"
    out = {
        "context": torch.tensor([0 if ctx == "cond" else 1 for ctx, _, _ in record], dtype=torch.int64),
        "computed": torch.tensor([int(c) for _, _, c in record], dtype=torch.int64),
        "change": torch.tensor([c for _, c, _ in record], dtype=torch.float64),
        "latents_step0": steps[0],
        "latents_final": steps[-1],
        "image_u8": torch.from_numpy(np.round(result.images[0] * 255).astype(np.uint8)),
    }
    meta["steps_run"] = len(steps)
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, name + ".safetensors"),
              {k: str(v) for k, v in meta.items()})
    reused = [i for i, (_, _, c) in enumerate(record) if not c]
    print(f"{name}: {len(record)} transformer calls, reused {reused}, changes "
          f"{[round(c, 3) for _, c, _ in record]}, margin {margin:.4f}")


def run_mag_case(name, model, dtype, config_args, args):
    """MagCache: each evaluation's decision (the head hook's state.should_compute), and with calibrate the
    ratios it measured."""
    from diffusers.hooks import MagCacheConfig
    from diffusers.hooks import mag_cache as mc

    pipe = load_pipeline("FluxPipeline", model, dtype)
    config_args = dict(config_args)
    if not config_args.get("calibrate"):
        config_args.setdefault("mag_ratios", mc.FLUX_MAG_RATIOS)
    config = MagCacheConfig(num_inference_steps=args["num_inference_steps"], **config_args)
    record, ratios = [], []
    head = mc.MagCacheHeadHook.new_forward
    advance = mc.MagCacheBlockHook._advance_step

    def spy_head(self, module, *a, **k):
        out = head(self, module, *a, **k)
        state = self.state_manager.get_state()
        record.append((self.state_manager.context.name, bool(state.should_compute)))
        return out

    def spy_advance(self, state):
        if state.step_index + 1 >= self.config.num_inference_steps and self.config.calibrate:
            ratios.append(list(state.calibration_ratios))
        return advance(self, state)

    mc.MagCacheHeadHook.new_forward = spy_head  # before enable_cache: the registry binds new_forward then
    mc.MagCacheBlockHook._advance_step = spy_advance
    try:
        pipe.transformer.enable_cache(config)
        args = dict(args)
        seed = args.pop("seed")
        spec = "magcache:calibrate" if config_args.get("calibrate") else (
            f"magcache:{config_args['threshold']}"
            + (f":max_skip={config_args['max_skip_steps']}" if "max_skip_steps" in config_args else "")
            + (f":retention={config_args['retention_ratio']}" if "retention_ratio" in config_args else ""))
        meta = dict(args, seed=seed, pipeline="FluxPipeline", model=model, dtype=str(dtype).split(".")[-1],
                    cache=spec)
        result, steps = call_tracking_latents(
            pipe, dict(args, generator=torch.Generator().manual_seed(seed), output_type="np"))
    finally:
        mc.MagCacheHeadHook.new_forward = head
        mc.MagCacheBlockHook._advance_step = advance
    out = {
        "context": torch.tensor([0 if ctx == "cond" else 1 for ctx, _ in record], dtype=torch.int64),
        "computed": torch.tensor([int(c) for _, c in record], dtype=torch.int64),
        "latents_final": steps[-1],
        "image_u8": torch.from_numpy(np.round(result.images[0] * 255).astype(np.uint8)),
    }
    if ratios:
        out["calibration_ratios"] = torch.tensor(ratios[0], dtype=torch.float64)
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, name + ".safetensors"),
              {k: str(v) for k, v in meta.items()})
    reused = [i for i, (_, c) in enumerate(record) if not c]
    print(f"{name}: {len(record)} evaluations, reused {reused}"
          + (f", calibration ratios {[round(r, 4) for r in ratios[0]]}" if ratios else ""))


def main():
    wanted = set(sys.argv[1:])
    for case in CASES:
        if not wanted or case[0] in wanted:
            run_case(*case)
    for case in MAG_CASES:
        if not wanted or case[0] in wanted:
            run_mag_case(*case)
    for case in TAYLOR_CASES:
        if not wanted or case[0] in wanted:
            run_taylor_case(*case)


if __name__ == "__main__":
    main()
