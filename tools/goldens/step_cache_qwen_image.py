#!/usr/bin/env python3
"""References for step caching on Qwen-Image, made by diffusers 0.42.1's own hooks on the tiny QwenImagePipeline of
tools/goldens/qwen_image.py (tests/data/models/qwen-image-tiny and -bf16): First Block Cache
(`pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold))`), MagCache (`MagCacheConfig`) and TaylorSeer
(`TaylorSeerCacheConfig`), with and without true classifier-free guidance (a negative prompt: the pipeline's
"uncond" cache context).

diffusers ships no magnitude ratios for Qwen-Image (hooks/mag_cache.py has FLUX_MAG_RATIOS only), so MagCache runs
as its docstring says: a calibration call (`MagCacheConfig(calibrate=True)`) measures the ratios, and the cached
calls use those ratios.

Outputs (committed; CI never runs this script):
  tests/data/goldens/step_cache_qwen_image/<case>.safetensors   the call's arguments and Kiln's spec of the cache
      (`cache`) in the metadata; per transformer evaluation, in order: its context (0 cond, 1 uncond), whether the
      blocks ran (`computed`: First Block Cache's blocks after the first; MagCache's blocks; TaylorSeer's first
      attention) and what decided it (`change`: First Block Cache's relative change of the first block's residual,
      MagCache's accumulated error; -1 where nothing was measured); the latents after the first step and at the
      end, the image (8-bit), and a calibration's ratios (`calibration_ratios`)

Thresholds are chosen away from every change the call measures (the script asserts a margin), so that rounding
cannot flip a decision: the tiny random model's first block changes by 0.7-1.3 between steps, far more than a
trained one's.

Usage: python3 tools/goldens/step_cache_qwen_image.py [CASE...]  (torch, diffusers 0.42.1, transformers 5,
safetensors from pip)
"""
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from edit import call_tracking_latents, load_pipeline  # noqa: E402
from step_cache import recording_decisions  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "goldens", "step_cache_qwen_image")
PIPELINE = "QwenImagePipeline"

CAT = dict(prompt="a photo of a cat", height=64, width=64, max_sequence_length=64)
CFG = dict(CAT, negative_prompt="blurry", true_cfg_scale=3.0)

# First Block Cache: name, model, dtype, threshold, call arguments.
FBC_CASES = [
    ("fbc_64x64_s61", "qwen-image-tiny", torch.float32, 0.85, dict(CAT, num_inference_steps=10, seed=61)),
    # Non-square, more steps.
    ("fbc_48x80_s62", "qwen-image-tiny", torch.float32, 0.8,
     dict(CAT, height=48, width=80, num_inference_steps=12, seed=62)),
    ("fbc_true_cfg_64x64_s63", "qwen-image-tiny", torch.float32, 0.87,
     dict(CFG, num_inference_steps=10, seed=63)),
    ("fbc_bf16_64x64_s64", "qwen-image-tiny-bf16", torch.bfloat16, 0.9,
     dict(CAT, num_inference_steps=10, seed=64)),
]

# MagCache: name, model, dtype, config arguments (`ratios_from`: the case whose calibration gives mag_ratios),
# call arguments. The calibration cases come first.
MAG_CASES = [
    ("mag_calibrate_64x64_s71", "qwen-image-tiny", torch.float32, dict(calibrate=True),
     dict(CAT, num_inference_steps=10, seed=71)),
    ("mag_64x64_s72", "qwen-image-tiny", torch.float32, dict(threshold=0.3, ratios_from="mag_calibrate_64x64_s71"),
     dict(CAT, num_inference_steps=10, seed=72)),
    ("mag_true_cfg_64x64_s73", "qwen-image-tiny", torch.float32,
     dict(threshold=0.5, max_skip_steps=2, retention_ratio=0.1, ratios_from="mag_calibrate_64x64_s71"),
     dict(CFG, num_inference_steps=10, seed=73)),
]

# TaylorSeer: name, model, dtype, config arguments, call arguments. Every attention of the blocks (diffusers'
# default identifiers: transformer_blocks.N.attn) is computed or forecast; the schedule is the config's.
TAYLOR_CASES = [
    ("taylor_64x64_s81", "qwen-image-tiny", torch.float32, dict(), dict(CAT, num_inference_steps=12, seed=81)),
    ("taylor_true_cfg_64x64_s82", "qwen-image-tiny", torch.float32,
     dict(cache_interval=3, disable_cache_before_step=2, max_order=2, taylor_factors_dtype=torch.float32,
          disable_cache_after_step=9),
     dict(CFG, num_inference_steps=11, seed=82)),
    ("taylor_bf16_64x64_s83", "qwen-image-tiny-bf16", torch.bfloat16, dict(cache_interval=3),
     dict(CAT, num_inference_steps=10, seed=83)),
]


def call(pipe, args):
    """The call (its seed a torch CPU generator), and the latents after each step."""
    args = dict(args)
    seed = args.pop("seed")
    return call_tracking_latents(pipe, dict(args, generator=torch.Generator().manual_seed(seed), output_type="np"))


def save(name, meta, record, result, steps, extra=None):
    """record: (context, computed, change) per evaluation."""
    out = {
        "context": torch.tensor([0 if ctx == "cond" else 1 for ctx, _, _ in record], dtype=torch.int64),
        "computed": torch.tensor([int(c) for _, c, _ in record], dtype=torch.int64),
        "change": torch.tensor([float(d) for _, _, d in record], dtype=torch.float64),
        "latents_step0": steps[0],
        "latents_final": steps[-1],
        "image_u8": torch.from_numpy(np.round(result.images[0] * 255).astype(np.uint8)),
    }
    out.update(extra or {})
    meta = dict(meta, steps_run=len(steps))
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, name + ".safetensors"),
              {k: str(v) for k, v in meta.items()})
    reused = [i for i, (_, c, _) in enumerate(record) if not c]
    print(f"{name}: {len(record)} evaluations, not computed at {reused}, decided by "
          f"{[round(float(d), 4) for _, _, d in record]}")


def meta_of(args, model, dtype, spec):
    return dict(args, pipeline=PIPELINE, model=model, dtype=str(dtype).split(".")[-1], cache=spec)


def check_margin(name, threshold, changes, margin):
    measured = [c for c in changes if c >= 0]
    closest = min(abs(c - threshold) for c in measured)
    assert closest > margin, f"{name}: a change {closest:.4f} from the threshold: pick another " \
                             f"({[round(c, 4) for c in measured]})"


def run_fbc_case(name, model, dtype, threshold, args):
    from diffusers.hooks import FirstBlockCacheConfig

    pipe = load_pipeline(PIPELINE, model, dtype)
    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    record = recording_decisions()  # (context, change, computed), from step_cache.py
    result, steps = call(pipe, args)
    check_margin(name, threshold, [c for _, c, _ in record], 0.02 if dtype == torch.bfloat16 else 0.005)
    save(name, meta_of(args, model, dtype, f"fbcache:{threshold}"), [(x, c, d) for x, d, c in record], result,
         steps)


def run_mag_case(name, model, dtype, config_args, args, calibrated):
    """MagCache: the head hook's decision, the error it accumulated (the first value the state's accumulated_err
    takes in the head hook: it is reset to 0 when the blocks run), and a calibration's ratios."""
    from diffusers.hooks import MagCacheConfig
    from diffusers.hooks import mag_cache as mc

    config_args = dict(config_args)
    ratios_from = config_args.pop("ratios_from", None)
    if ratios_from is not None:
        config_args["mag_ratios"] = calibrated[ratios_from]
    config = MagCacheConfig(num_inference_steps=args["num_inference_steps"], **config_args)
    pipe = load_pipeline(PIPELINE, model, dtype)
    record, ratios, errors = [], [], []
    head = mc.MagCacheHeadHook.new_forward
    advance = mc.MagCacheBlockHook._advance_step
    setattr_ = mc.MagCacheState.__setattr__

    def spy_setattr(state, key, value):
        # The head hook adds to accumulated_err right after counting the step in accumulated_steps; the other
        # assignments (the state's creation, the resets) are not a measurement.
        if key == "accumulated_steps" and value > 0 and errors:
            errors[-1] = "armed"
        elif key == "accumulated_err" and errors and errors[-1] == "armed":
            errors[-1] = float(value)
        setattr_(state, key, value)

    def spy_head(self, module, *a, **k):
        errors.append(None)
        out = head(self, module, *a, **k)
        state = self.state_manager.get_state()
        err = errors[-1]
        record.append((self.state_manager.context.name, bool(state.should_compute),
                       err if isinstance(err, float) else -1.0))
        errors[-1] = -1.0
        return out

    def spy_advance(self, state):
        if state.step_index + 1 >= self.config.num_inference_steps and self.config.calibrate:
            ratios.append((self.state_manager.context.name, list(state.calibration_ratios)))
        return advance(self, state)

    mc.MagCacheHeadHook.new_forward = spy_head  # before enable_cache: the registry binds new_forward then
    mc.MagCacheBlockHook._advance_step = spy_advance
    mc.MagCacheState.__setattr__ = spy_setattr
    try:
        pipe.transformer.enable_cache(config)
        result, steps = call(pipe, args)
    finally:
        mc.MagCacheHeadHook.new_forward = head
        mc.MagCacheBlockHook._advance_step = advance
        mc.MagCacheState.__setattr__ = setattr_
    if config.calibrate:
        spec = "magcache:calibrate"
    else:
        check_margin(name, config.threshold, [d for _, _, d in record], 0.005)
        spec = (f"magcache:{config.threshold}:max_skip={config.max_skip_steps}:retention={config.retention_ratio}"
                f":ratios={','.join(repr(r) for r in config_args['mag_ratios'])}")
    extra = {}
    if ratios:
        cond = [r for ctx, r in ratios if ctx == "cond"][0]
        calibrated[name] = cond
        extra["calibration_ratios"] = torch.tensor(cond, dtype=torch.float64)
        print(f"{name}: calibration ratios {cond}")
    save(name, meta_of(args, model, dtype, spec), record, result, steps, extra)


def run_taylor_case(name, model, dtype, config_args, args):
    """TaylorSeer: each evaluation's decision, the first hooked module's (every attention follows the same
    schedule)."""
    from diffusers.hooks import TaylorSeerCacheConfig
    from diffusers.hooks import taylorseer_cache as ts

    pipe = load_pipeline(PIPELINE, model, dtype)
    record, first = [], []
    measure = ts.TaylorSeerCacheHook._measure_should_compute

    def spy(self):
        should, state = measure(self)
        if not first:
            first.append(self)
        if self is first[0]:
            record.append((self.state_manager.context.name, bool(should), -1.0))
        return should, state

    c = TaylorSeerCacheConfig(**config_args)
    ts.TaylorSeerCacheHook._measure_should_compute = spy
    try:
        pipe.transformer.enable_cache(c)
        result, steps = call(pipe, args)
    finally:
        ts.TaylorSeerCacheHook._measure_should_compute = measure
    spec = (f"taylorseer:interval={c.cache_interval}:warmup={c.disable_cache_before_step}:order={c.max_order}"
            + (f":until={c.disable_cache_after_step}" if c.disable_cache_after_step is not None else "")
            + (":factors=f32" if c.taylor_factors_dtype == torch.float32 else ""))
    save(name, meta_of(args, model, dtype, spec), record, result, steps)


def main():
    wanted = set(sys.argv[1:])
    for case in FBC_CASES:
        if not wanted or case[0] in wanted:
            run_fbc_case(*case)
    calibrated = {}
    # A wanted case's calibration runs too, before it (MAG_CASES lists the calibrations first).
    sources = {c[3].get("ratios_from") for c in MAG_CASES if not wanted or c[0] in wanted}
    for case in MAG_CASES:
        if not wanted or case[0] in wanted or case[0] in sources:
            run_mag_case(*case, calibrated)
    for case in TAYLOR_CASES:
        if not wanted or case[0] in wanted:
            run_taylor_case(*case)


if __name__ == "__main__":
    main()
