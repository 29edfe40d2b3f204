#!/usr/bin/env python3
"""References for step caching on Chroma, made by diffusers 0.42.1's own hooks on the tiny ChromaPipeline of
tools/goldens/chroma.py (tests/data/models/chroma-tiny and chroma-tiny-bf16, prompts through its tiny T5):
TaylorSeer (`TaylorSeerCacheConfig`), Pyramid Attention Broadcast (`PyramidAttentionBroadcastConfig`) and FasterCache
(`FasterCacheConfig(is_guidance_distilled=True)`).

What diffusers 0.42.1 does on Chroma, and so what these references hold:
  - ChromaTransformer2DModel has enable_cache (CacheMixin), but its blocks are not in hooks/_helpers.py's
    TransformerBlockRegistry: First Block Cache and MagCache fail in enable_cache ("Model class ... ChromaTransformerBlock
    not registered"). `check_block_caches_fail` shows it; Kiln refuses both on Chroma by name.
  - TaylorSeer, PAB and FasterCache hook the attentions, diffusers' default identifiers: transformer_blocks.N.attn and
    single_transformer_blocks.N.attn (the script checks which modules were hooked).
  - ChromaPipeline sets `_current_timestep` (which PAB and FasterCache read) but enters no cache context, so TaylorSeer
    fails there ("No cache context is set"). This script wraps each transformer call in
    `with pipe.transformer.cache_context(...)`: "cond", and with classifier-free guidance (guidance_scale > 1: the
    negative prompt in a transformer call of its own, after the positive one) "uncond" for every second call, as
    Kiln's pipelines enter them.
  - PAB and FasterCache keep one state per attention for both guidance branches; Kiln refuses them with Chroma's
    guidance, and their references run without it (guidance_scale 1).

Outputs (committed; CI never runs this script):
  tests/data/goldens/step_cache_chroma/<case>.safetensors   the call's arguments and Kiln's spec of the cache (`cache`)
      in the metadata; per transformer evaluation, in order: its context (0 cond, 1 uncond) and whether its first
      attention ran (`computed`; `change` is -1 throughout); PAB and FasterCache add whether each hooked attention
      ran (`modules_computed`, evaluations x modules) and the timestep the hooks saw (`timestep`); the latents after
      the first step and at the end, and the image (8-bit)

Usage: python3 tools/goldens/step_cache_chroma.py [CASE...]  (torch, diffusers 0.42.1, transformers, sentencepiece,
safetensors from pip)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_cache_flux2  # noqa: E402
from edit import MODELS, call_tracking_latents  # noqa: E402
from step_cache_attention import hooked_call, spec_of  # noqa: E402
from step_cache_flux2 import meta_of, save  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "goldens", "step_cache_chroma")
step_cache_flux2.OUT = OUT  # save() writes there

TINY = ("ChromaPipeline", "chroma-tiny", torch.float32)
TINY_BF16 = ("ChromaPipeline", "chroma-tiny-bf16", torch.bfloat16)

CAT = "a photo of a cat"
GUIDED = dict(prompt=CAT, negative_prompt="blurry, low quality", height=64, width=64, guidance_scale=4.0,
              max_sequence_length=32)
UNGUIDED = dict(prompt=CAT, height=64, width=64, guidance_scale=1.0, max_sequence_length=32)

# TaylorSeer: name, pipeline, config arguments, call arguments.
TAYLOR_CASES = [
    ("taylor_cfg_64x64_s101", TINY, dict(), dict(GUIDED, num_inference_steps=12, seed=101)),
    ("taylor_i3_o2_64x64_s102", TINY, dict(cache_interval=3, max_order=2, taylor_factors_dtype=torch.float32),
     dict(UNGUIDED, num_inference_steps=10, seed=102)),
    # The defaults' bfloat16 factors round differently from Kiln's now and then, which guidance (scale 4) amplifies in
    # the latents (5e-4 relative at the end): this case, float32 factors with guidance and a cool-down, agrees within
    # 2e-4.
    ("taylor_cfg_f32_64x64_s106", TINY,
     dict(cache_interval=4, taylor_factors_dtype=torch.float32, disable_cache_after_step=10),
     dict(GUIDED, num_inference_steps=12, seed=106)),
    ("taylor_bf16_cfg_64x64_s105", TINY_BF16, dict(cache_interval=3), dict(GUIDED, num_inference_steps=10, seed=105)),
]

# Pyramid Attention Broadcast and FasterCache (guidance-distilled): name, pipeline, cache, Kiln's config (skip, range,
# weight), call arguments (no guidance).
ATTENTION_CASES = [
    ("pab_64x64_s103", TINY, "pab", dict(skip=2, range=(100, 800)), dict(UNGUIDED, num_inference_steps=12, seed=103)),
    ("faster_w03_64x64_s104", TINY, "fastercache", dict(skip=2, range=(-1, 950), weight=0.3),
     dict(UNGUIDED, num_inference_steps=12, seed=104)),
]


def load_pipeline(cls_name, model, dtype):
    import diffusers

    pipe = getattr(diffusers, cls_name).from_pretrained(os.path.join(MODELS, model), torch_dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def entering_contexts(pipe, guided):
    """ChromaPipeline enters no cache context: each transformer call is wrapped in one, "cond", and with guidance
    "uncond" for the second call of each step (the negative prompt's, which follows the positive one)."""
    transformer = pipe.transformer
    forward = transformer.forward
    calls = [0]

    def forward_in_context(*args, **kwargs):
        name = "uncond" if guided and calls[0] % 2 == 1 else "cond"
        calls[0] += 1
        with transformer.cache_context(name):
            return forward(*args, **kwargs)

    transformer.forward = forward_in_context


def call(pipe, args):
    kwargs = {k: v for k, v in args.items() if k != "seed"}
    return call_tracking_latents(
        pipe, dict(kwargs, generator=torch.Generator("cpu").manual_seed(args["seed"]), output_type="np"))


def attentions(pipe):
    t = pipe.transformer
    return [f"transformer_blocks.{i}.attn" for i in range(len(t.transformer_blocks))] + \
        [f"single_transformer_blocks.{i}.attn" for i in range(len(t.single_transformer_blocks))]


def run_taylor_case(name, pipeline, config_args, args):
    """TaylorSeer: each evaluation's context and decision, the first hooked attention's (every one follows the same
    schedule)."""
    from diffusers.hooks import TaylorSeerCacheConfig
    from diffusers.hooks import taylorseer_cache as ts

    pipe = load_pipeline(*pipeline)
    guided = args["guidance_scale"] > 1.0
    entering_contexts(pipe, guided)
    record, first = [], []
    measure = ts.TaylorSeerCacheHook._measure_should_compute

    def spy(self):
        should, state = measure(self)
        if not first:
            first.append(self)
        if self is first[0]:
            record.append((self.state_manager._context.name, bool(should), -1.0))
        return should, state

    c = TaylorSeerCacheConfig(**config_args)
    ts.TaylorSeerCacheHook._measure_should_compute = spy
    try:
        pipe.transformer.enable_cache(c)
        hooked = [n for n, m in pipe.transformer.named_modules() if hasattr(m, "_diffusers_hook")
                  and m._diffusers_hook.get_hook("taylorseer_cache") is not None]
        result, steps = call(pipe, args)
    finally:
        ts.TaylorSeerCacheHook._measure_should_compute = measure
    assert hooked == attentions(pipe), f"{name}: hooked {hooked}"
    evaluations = args["num_inference_steps"] * (2 if guided else 1)
    assert len(record) == evaluations, f"{name}: {len(record)} evaluations"
    assert [ctx for ctx, _, _ in record] == (["cond", "uncond"] * args["num_inference_steps"] if guided
                                             else ["cond"] * evaluations), f"{name}: contexts {record}"
    assert not all(c for _, c, _ in record), f"{name}: nothing forecast: pick more steps"
    spec = (f"taylorseer:interval={c.cache_interval}:warmup={c.disable_cache_before_step}:order={c.max_order}"
            + (f":until={c.disable_cache_after_step}" if c.disable_cache_after_step is not None else "")
            + (":factors=f32" if c.taylor_factors_dtype == torch.float32 else ""))
    save(name, meta_of(args, pipeline, spec), record, result, steps, {})


def run_attention_case(name, pipeline, cache, config, args):
    """Pyramid Attention Broadcast or FasterCache, without guidance: whether each hooked attention ran at each
    evaluation, and the timestep the hooks read from the pipeline (`pipe.current_timestep`)."""
    assert args["guidance_scale"] <= 1.0, f"{name}: these caches mix the guidance branches"
    pipe = load_pipeline(*pipeline)
    (result, steps), modules, computed, timesteps = hooked_call(
        pipe, cache, config, lambda: call(pipe, args), args["num_inference_steps"])
    assert modules == attentions(pipe), f"{name}: hooked {modules}"
    evaluations = len(computed)
    lo, hi = config["range"]
    inside = [i for i, t in enumerate(timesteps) if lo < t < hi]
    assert inside and len(inside) < evaluations, \
        f"{name}: pick steps with timesteps inside and outside the range ({timesteps})"
    assert not all(all(row) for row in computed), f"{name}: nothing reused"
    extra = {"modules_computed": torch.tensor([[int(c) for c in row] for row in computed], dtype=torch.int64),
             "timestep": torch.tensor(timesteps, dtype=torch.float64)}
    save(name, meta_of(args, pipeline, spec_of(cache, config)), [("cond", row[0], -1.0) for row in computed],
         result, steps, {}, extra)
    print(f"{name}: timesteps {[round(t, 1) for t in timesteps]}, inside the range at {inside}")


def check_block_caches_fail():
    """diffusers 0.42.1's First Block Cache and MagCache on ChromaPipeline: enable_cache fails, Chroma's blocks are
    not in the hook registry."""
    from diffusers.hooks import FirstBlockCacheConfig, MagCacheConfig

    for config in (FirstBlockCacheConfig(threshold=0.1), MagCacheConfig(num_inference_steps=4, mag_ratios=[1.0] * 4)):
        pipe = load_pipeline(*TINY)
        entering_contexts(pipe, False)
        try:
            pipe.transformer.enable_cache(config)
            call(pipe, dict(UNGUIDED, num_inference_steps=4, seed=1))
        except ValueError as e:
            assert "not registered" in str(e), e
            print(f"{type(config).__name__} on Chroma fails in diffusers, as expected: {e}")
            continue
        raise AssertionError(f"diffusers' {type(config).__name__} ran on Chroma: Kiln refuses it; revisit the refusal")


def main():
    wanted = set(sys.argv[1:])
    if not wanted or "block_caches" in wanted:
        check_block_caches_fail()
    for case in TAYLOR_CASES:
        if not wanted or case[0] in wanted:
            run_taylor_case(*case)
    for case in ATTENTION_CASES:
        if not wanted or case[0] in wanted:
            run_attention_case(*case)


if __name__ == "__main__":
    main()
