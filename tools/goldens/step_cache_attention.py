#!/usr/bin/env python3
"""References for the attention step caches, made by diffusers 0.42.1's own hooks on the tiny test pipelines:
Pyramid Attention Broadcast (`pipe.transformer.enable_cache(PyramidAttentionBroadcastConfig(...))`,
diffusers/hooks/pyramid_attention_broadcast.py) and FasterCache in its guidance-distilled form
(`FasterCacheConfig(is_guidance_distilled=True, ...)`, hooks/faster_cache.py), on FluxPipeline
(tests/data/models/flux-tiny-dev and -bf16) and QwenImagePipeline (qwen-image-tiny), without true
classifier-free guidance (diffusers' hooks keep one state per attention for both branches, and mix them).

Both hooks ask the pipeline for its current timestep (`pipe.current_timestep`, the scheduler's t: sigma * 1000)
and compute an attention or reuse (PAB: its last output; FasterCache: t + (t - t_2) * weight from its last two)
by their schedule, per attention module (FLUX.1: transformer_blocks.N.attn and single_transformer_blocks.N.attn;
Qwen-Image: transformer_blocks.N.attn).

Outputs (committed; CI never runs this script):
  tests/data/goldens/step_cache_attention/<case>.safetensors   the call's arguments and Kiln's spec of the cache
      (`cache`) in the metadata; per transformer evaluation: its context (always 0, cond), whether its first
      attention ran (`computed`), whether each hooked attention ran (`modules_computed`, evaluations x modules,
      in the order they run) and the timestep the hooks saw (`timestep`); the latents after the first step and
      at the end, and the image (8-bit)

The step counts are picked so that some timesteps fall inside the cases' ranges and some outside (printed).

Usage: cd tools/goldens && python3 step_cache_attention.py [CASE...]  (torch, diffusers 0.42.1, transformers,
safetensors from pip)
"""
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from edit import call_tracking_latents, load_pipeline  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "goldens", "step_cache_attention")

FLUX = dict(prompt="a photo of a cat", height=64, width=64, guidance_scale=3.5, max_sequence_length=32)
QWEN = dict(prompt="a photo of a cat", height=64, width=64, max_sequence_length=64)

# name, pipeline class, model, dtype, cache ("pab" or "fastercache"), Kiln's config (skip, range, weight), call
# arguments.
CASES = [
    ("pab_flux_dev_64x64_s91", "FluxPipeline", "flux-tiny-dev", torch.float32, "pab",
     dict(skip=2, range=(100, 800)), dict(FLUX, num_inference_steps=12, seed=91)),
    ("pab_flux_dev_skip3_64x64_s92", "FluxPipeline", "flux-tiny-dev", torch.float32, "pab",
     dict(skip=3, range=(50, 900)), dict(FLUX, num_inference_steps=14, seed=92)),
    ("pab_flux_dev_bf16_64x64_s93", "FluxPipeline", "flux-tiny-dev-bf16", torch.bfloat16, "pab",
     dict(skip=2, range=(100, 800)), dict(FLUX, num_inference_steps=12, seed=93)),
    ("pab_qwen_image_64x64_s94", "QwenImagePipeline", "qwen-image-tiny", torch.float32, "pab",
     dict(skip=2, range=(100, 800)), dict(QWEN, num_inference_steps=12, seed=94)),
    ("faster_flux_dev_64x64_s95", "FluxPipeline", "flux-tiny-dev", torch.float32, "fastercache",
     dict(skip=2, range=(-1, 681), weight=0.5), dict(FLUX, num_inference_steps=12, seed=95)),
    ("faster_flux_dev_w03_64x64_s96", "FluxPipeline", "flux-tiny-dev", torch.float32, "fastercache",
     dict(skip=3, range=(200, 900), weight=0.3), dict(FLUX, num_inference_steps=14, seed=96)),
    ("faster_flux_dev_bf16_64x64_s97", "FluxPipeline", "flux-tiny-dev-bf16", torch.bfloat16, "fastercache",
     dict(skip=2, range=(-1, 681), weight=0.5), dict(FLUX, num_inference_steps=12, seed=97)),
    ("faster_qwen_image_64x64_s98", "QwenImagePipeline", "qwen-image-tiny", torch.float32, "fastercache",
     dict(skip=2, range=(-1, 681), weight=0.5), dict(QWEN, num_inference_steps=12, seed=98)),
]


def spec_of(cache, config):
    """Kiln's spec, as step_cache_spec writes it."""
    lo, hi = config["range"]
    spec = f"{cache}:skip={config['skip']}:range={lo},{hi}"
    return spec + (f":weight={config['weight']}" if cache == "fastercache" else "")


def recording_hook(hook_class, names, pipe, record):
    """Wraps hook_class.new_forward (before enable_cache: the registry binds new_forward then) so that each hooked
    attention's call records its name, whether its original forward ran, and the timestep."""
    new_forward = hook_class.new_forward

    def spy(self, module, *args, **kwargs):
        ran = []
        original = self.fn_ref.original_forward

        def counted(*a, **k):
            ran.append(True)
            return original(*a, **k)

        self.fn_ref.original_forward = counted
        try:
            out = new_forward(self, module, *args, **kwargs)
        finally:
            self.fn_ref.original_forward = original
        record.append((names[id(module)], bool(ran), float(pipe.current_timestep)))
        return out

    hook_class.new_forward = spy
    return new_forward


def hooked_call(pipe, cache, config, run, evaluations):
    """diffusers' own PAB or FasterCache (guidance-distilled) hook with Kiln's config on pipe.transformer, reading
    the pipeline's current timestep; run() makes the call. Returns run()'s result, the hooked attentions in the
    order they run, whether each ran at each of the `evaluations`, and the timestep each evaluation saw."""
    from diffusers import FasterCacheConfig, PyramidAttentionBroadcastConfig
    from diffusers.hooks import faster_cache as fc
    from diffusers.hooks import pyramid_attention_broadcast as pab

    names = {id(m): n for n, m in pipe.transformer.named_modules()}
    record = []
    hook_class = pab.PyramidAttentionBroadcastHook if cache == "pab" else fc.FasterCacheBlockHook
    saved = recording_hook(hook_class, names, pipe, record)
    try:
        if cache == "pab":
            pipe.transformer.enable_cache(PyramidAttentionBroadcastConfig(
                spatial_attention_block_skip_range=config["skip"],
                spatial_attention_timestep_skip_range=config["range"],
                current_timestep_callback=lambda: pipe.current_timestep))
        else:
            weight = config["weight"]
            pipe.transformer.enable_cache(FasterCacheConfig(
                spatial_attention_block_skip_range=config["skip"],
                spatial_attention_timestep_skip_range=config["range"],
                attention_weight_callback=lambda _: weight,
                is_guidance_distilled=True,
                current_timestep_callback=lambda: pipe.current_timestep))
        result = run()
    finally:
        hook_class.new_forward = saved

    modules = []
    for module, _, _ in record:
        if module in modules:
            break
        modules.append(module)
    assert len(record) == evaluations * len(modules), f"{len(record)} attention calls, {len(modules)} modules"
    computed = [[record[e * len(modules) + m][1] for m in range(len(modules))] for e in range(evaluations)]
    for e in range(evaluations):
        assert [record[e * len(modules) + m][0] for m in range(len(modules))] == modules, "module order"
    timesteps = [record[e * len(modules)][2] for e in range(evaluations)]
    return result, modules, computed, timesteps


def run_case(name, cls_name, model, dtype, cache, config, args):
    pipe = load_pipeline(cls_name, model, dtype)
    call = dict(args)
    seed = call.pop("seed")
    evaluations = args["num_inference_steps"]
    (result, steps), modules, computed, timesteps = hooked_call(
        pipe, cache, config, lambda: call_tracking_latents(
            pipe, dict(call, generator=torch.Generator().manual_seed(seed), output_type="np")), evaluations)

    meta = dict(args, pipeline=cls_name, model=model, dtype=str(dtype).split(".")[-1], cache=spec_of(cache, config),
                modules=",".join(modules), steps_run=len(steps))
    out = {
        "context": torch.zeros(evaluations, dtype=torch.int64),
        "computed": torch.tensor([int(row[0]) for row in computed], dtype=torch.int64),
        "modules_computed": torch.tensor([[int(c) for c in row] for row in computed], dtype=torch.int64),
        "timestep": torch.tensor(timesteps, dtype=torch.float64),
        "latents_step0": steps[0],
        "latents_final": steps[-1],
        "image_u8": torch.from_numpy(np.round(result.images[0] * 255).astype(np.uint8)),
    }
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, name + ".safetensors"),
              {k: str(v) for k, v in meta.items()})
    lo, hi = config["range"]
    inside = [i for i, t in enumerate(timesteps) if lo < t < hi]
    print(f"{name}: {len(modules)} attentions ({modules[0]} .. {modules[-1]}), timesteps "
          f"{[round(t, 1) for t in timesteps]}, inside the range at {inside}, reused at "
          f"{[i for i, row in enumerate(computed) if not row[0]]}, per-module rows equal: "
          f"{all(len(set(row)) == 1 for row in computed)}")
    assert inside and len(inside) < evaluations, f"{name}: pick steps with timesteps inside and outside the range"


def main():
    wanted = set(sys.argv[1:])
    for case in CASES:
        if not wanted or case[0] in wanted:
            run_case(*case)


if __name__ == "__main__":
    main()
