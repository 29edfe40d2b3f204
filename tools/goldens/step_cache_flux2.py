#!/usr/bin/env python3
"""References for step caching on FLUX.2, made by diffusers 0.42.1's own hooks on the tiny pipelines of
tools/goldens/flux2.py (tests/data/models/flux2-tiny-dev, -dev-bf16 and flux2-tiny-klein, driven by prompt
embeddings: their text encoders are null): MagCache (`MagCacheConfig`) and TaylorSeer (`TaylorSeerCacheConfig`), on
Flux2Pipeline (with and without a reference image) and on Flux2KleinPipeline's classifier-free guidance (its "cond"
and "uncond" cache contexts).

What diffusers 0.42.1 does on FLUX.2, and so what these references hold:
  - MagCache runs on both pipelines. diffusers ships no magnitude ratios for FLUX.2 (hooks/mag_cache.py has
    FLUX.1-dev's FLUX_MAG_RATIOS only), so a calibration call (`MagCacheConfig(calibrate=True)`) measures them per
    tiny model and the cached calls use those. Flux2Pipeline enters no cache context; MagCache then runs in one
    context of its own ("inference"), recorded here as cond (0).
  - TaylorSeer needs a cache context, which Flux2KleinPipeline enters and Flux2Pipeline does not ("No cache context
    is set"): for Flux2Pipeline this script wraps the transformer's forward in
    `with pipe.transformer.cache_context("cond")`, as diffusers' FluxPipeline does around its own. Its hooks sit on
    diffusers' default identifiers: transformer_blocks.N.attn and single_transformer_blocks.N.attn (the whole
    Flux2ParallelSelfAttention: attention, SwiGLU and to_out).
  - First Block Cache fails on FLUX.2 even inside a context: the single-stream blocks return one tensor (text and
    image tokens concatenated) and its tail hook subtracts a list from it (`unsupported operand type(s) for -:
    'Tensor' and 'list'`). `check_first_block_cache_fails` shows it; Kiln refuses fbcache on FLUX.2 by name.

Outputs (committed; CI never runs this script):
  tests/data/goldens/step_cache_flux2/<case>.safetensors   the call's arguments and Kiln's spec of the cache
      (`cache`) in the metadata, the prompt embeddings (`prompt_embeds`, `negative_prompt_embeds`); per transformer
      evaluation, in order: its context (0 cond, 1 uncond), whether the blocks ran (`computed`: MagCache's blocks;
      TaylorSeer's first attention) and what decided it (`change`: MagCache's accumulated error; -1 where nothing
      was measured); the latents after the first step and at the end, the image (8-bit), and a calibration's
      ratios (`calibration_ratios`, the cond context's)

MagCache's thresholds are chosen away from every accumulated error the call measures (the script asserts a margin),
so that rounding cannot flip a decision.

Usage: python3 tools/goldens/step_cache_flux2.py [CASE...]  (torch, diffusers 0.42.1, safetensors from pip)
"""
import os
import sys

import numpy as np
import PIL.Image
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from edit import MODELS, call_tracking_latents  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "goldens", "step_cache_flux2")
REFS = os.path.join(ROOT, "tests", "data", "goldens", "flux2")

DEV = ("Flux2Pipeline", "flux2-tiny-dev", torch.float32)
DEV_BF16 = ("Flux2Pipeline", "flux2-tiny-dev-bf16", torch.bfloat16)
KLEIN = ("Flux2KleinPipeline", "flux2-tiny-klein", torch.float32)

SQUARE = dict(height=64, width=64, guidance_scale=4.0, text_len=12)
# A reference image (tools/goldens/flux2.py's ref_a): its latents follow the noise's in the transformer's input.
REF = dict(height=64, width=48, guidance_scale=4.0, text_len=12, image="ref_a")

# MagCache: name, pipeline, config arguments (`ratios_from`: the case whose calibration gives mag_ratios), call
# arguments. A model's calibration comes before the cases that use its ratios.
MAG_CASES = [
    ("mag_calibrate_64x64_s71", DEV, dict(calibrate=True), dict(SQUARE, num_inference_steps=10, seed=71)),
    ("mag_64x64_s72", DEV, dict(threshold=0.25, ratios_from="mag_calibrate_64x64_s71"),
     dict(SQUARE, num_inference_steps=10, seed=72)),
    ("mag_ref1_64x48_s74", DEV,
     dict(threshold=0.5, max_skip_steps=2, retention_ratio=0.1, ratios_from="mag_calibrate_64x64_s71"),
     dict(REF, num_inference_steps=10, seed=74)),
    ("mag_klein_calibrate_cfg_64x64_s75", KLEIN, dict(calibrate=True),
     dict(SQUARE, num_inference_steps=10, seed=75)),
    ("mag_klein_cfg_64x64_s76", KLEIN,
     dict(threshold=0.27, max_skip_steps=2, retention_ratio=0.1, ratios_from="mag_klein_calibrate_cfg_64x64_s75"),
     dict(SQUARE, num_inference_steps=10, seed=76)),
]

# TaylorSeer: name, pipeline, config arguments, call arguments.
TAYLOR_CASES = [
    ("taylor_64x64_s81", DEV, dict(), dict(SQUARE, num_inference_steps=12, seed=81)),
    ("taylor_klein_cfg_64x64_s82", KLEIN,
     dict(cache_interval=3, disable_cache_before_step=2, max_order=2, taylor_factors_dtype=torch.float32,
          disable_cache_after_step=9),
     dict(SQUARE, num_inference_steps=11, seed=82)),
    ("taylor_ref1_64x48_s84", DEV, dict(cache_interval=3, taylor_factors_dtype=torch.float32),
     dict(REF, num_inference_steps=10, seed=84)),
    ("taylor_bf16_64x64_s83", DEV_BF16, dict(cache_interval=3), dict(SQUARE, num_inference_steps=10, seed=83)),
]


# Pyramid Attention Broadcast and FasterCache (guidance-distilled): name, pipeline, cache, Kiln's config (skip,
# range, weight), call arguments; recorded per attention as tools/goldens/step_cache_attention.py records them.
ATTENTION_CASES = [
    ("pab_64x64_s91", DEV, "pab", dict(skip=2, range=(100, 800)), dict(SQUARE, num_inference_steps=12, seed=91)),
    ("pab_ref1_64x48_s92", DEV, "pab", dict(skip=3, range=(50, 900)), dict(REF, num_inference_steps=12, seed=92)),
    ("faster_w03_64x64_s95", DEV, "fastercache", dict(skip=2, range=(-1, 950), weight=0.3),
     dict(SQUARE, num_inference_steps=12, seed=95)),
    ("faster_bf16_64x64_s97", DEV_BF16, "fastercache", dict(skip=2, range=(-1, 681), weight=0.5),
     dict(SQUARE, num_inference_steps=12, seed=97)),
]


def load_pipeline(cls_name, model, dtype):
    """diffusers' `cls_name` from tests/data/models/`model` in `dtype`, without its (null) text encoder, its
    progress bar off."""
    import diffusers

    pipe = getattr(diffusers, cls_name).from_pretrained(os.path.join(MODELS, model), torch_dtype=dtype,
                                                        text_encoder=None, tokenizer=None)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def embeddings(pipe, args):
    """Random prompt embeddings (and, for klein's guidance, other negative ones of another length), as
    tools/goldens/flux2.py draws them, in the pipeline's dtype."""
    dtype = pipe.transformer.dtype
    joint = pipe.transformer.config.joint_attention_dim
    g = torch.Generator("cpu").manual_seed(1000 + args["seed"])
    out = {"prompt_embeds": torch.randn(1, args["text_len"], joint, generator=g).to(dtype)}
    if type(pipe).__name__ == "Flux2KleinPipeline" and args["guidance_scale"] > 1.0:
        out["negative_prompt_embeds"] = torch.randn(1, args["text_len"] + 3, joint, generator=g).to(dtype)
    return out


def entering_cond_context(pipe):
    """Flux2Pipeline enters no cache context: each transformer call is wrapped in cache_context("cond"), as
    diffusers' FluxPipeline wraps its own."""
    transformer = pipe.transformer
    forward = transformer.forward

    def forward_in_cond(*args, **kwargs):
        with transformer.cache_context("cond"):
            return forward(*args, **kwargs)

    transformer.forward = forward_in_cond


def call(pipe, args, embeds):
    """The call (its seed a torch CPU generator, its reference image read as the pipeline reads it), and the
    latents after each step."""
    kwargs = {k: v for k, v in args.items() if k not in ("seed", "text_len", "image")}
    kwargs.update(embeds)
    if "image" in args:
        kwargs["image"] = PIL.Image.open(os.path.join(REFS, args["image"] + ".png")).convert("RGB")
    return call_tracking_latents(
        pipe, dict(kwargs, generator=torch.Generator("cpu").manual_seed(args["seed"]), output_type="np"))


def save(name, meta, record, result, steps, embeds, extra=None):
    """record: (context, computed, change) per evaluation."""
    out = {
        "context": torch.tensor([1 if ctx == "uncond" else 0 for ctx, _, _ in record], dtype=torch.int64),
        "computed": torch.tensor([int(c) for _, c, _ in record], dtype=torch.int64),
        "change": torch.tensor([float(d) for _, _, d in record], dtype=torch.float64),
        "latents_step0": steps[0],
        "latents_final": steps[-1],
        "image_u8": torch.from_numpy(np.round(result.images[0] * 255).astype(np.uint8)),
    }
    out.update(embeds)
    out.update(extra or {})
    meta = dict(meta, steps_run=len(steps))
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(OUT, name + ".safetensors"),
              {k: str(v) for k, v in meta.items()})
    skipped = [i for i, (_, c, _) in enumerate(record) if not c]
    print(f"{name}: {len(record)} evaluations, not computed at {skipped}, decided by "
          f"{[round(float(d), 4) for _, _, d in record]}")


def meta_of(args, pipeline, spec):
    cls_name, model, dtype = pipeline
    meta = {k: v for k, v in args.items() if k != "text_len"}
    return dict(meta, pipeline=cls_name, model=model, dtype=str(dtype).split(".")[-1], cache=spec)


def check_margin(name, threshold, changes, margin):
    measured = [c for c in changes if c >= 0]
    closest = min(abs(c - threshold) for c in measured)
    assert closest > margin, f"{name}: an error {closest:.4f} from the threshold: pick another " \
                             f"({[round(c, 4) for c in measured]})"


def run_mag_case(name, pipeline, config_args, args, calibrated):
    """MagCache: the head hook's decision, the error it accumulated (the value accumulated_err takes in the head
    hook right after the step is counted; -1 where it is not, the retained steps), and a calibration's ratios."""
    from diffusers.hooks import MagCacheConfig
    from diffusers.hooks import mag_cache as mc

    config_args = dict(config_args)
    ratios_from = config_args.pop("ratios_from", None)
    if ratios_from is not None:
        config_args["mag_ratios"] = calibrated[ratios_from]
    config = MagCacheConfig(num_inference_steps=args["num_inference_steps"], **config_args)
    pipe = load_pipeline(*pipeline)
    embeds = embeddings(pipe, args)
    record, ratios, errors = [], [], []
    head = mc.MagCacheHeadHook.new_forward
    advance = mc.MagCacheBlockHook._advance_step
    setattr_ = mc.MagCacheState.__setattr__

    def spy_setattr(state, key, value):
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
        record.append((self.state_manager._context.name, bool(state.should_compute),
                       err if isinstance(err, float) else -1.0))
        errors[-1] = -1.0
        return out

    def spy_advance(self, state):
        if state.step_index + 1 >= self.config.num_inference_steps and self.config.calibrate:
            ratios.append((self.state_manager._context.name, list(state.calibration_ratios)))
        return advance(self, state)

    mc.MagCacheHeadHook.new_forward = spy_head  # before enable_cache: the registry binds new_forward then
    mc.MagCacheBlockHook._advance_step = spy_advance
    mc.MagCacheState.__setattr__ = spy_setattr
    try:
        pipe.transformer.enable_cache(config)
        result, steps = call(pipe, args, embeds)
    finally:
        mc.MagCacheHeadHook.new_forward = head
        mc.MagCacheBlockHook._advance_step = advance
        mc.MagCacheState.__setattr__ = setattr_
    if config.calibrate:
        spec = "magcache:calibrate"
        assert all(c for _, c, _ in record), f"{name}: a calibration skipped blocks"
    else:
        check_margin(name, config.threshold, [d for _, _, d in record], 0.005)
        assert not all(c for _, c, _ in record), f"{name}: nothing skipped: pick another threshold"
        spec = (f"magcache:{config.threshold}:max_skip={config.max_skip_steps}:retention={config.retention_ratio}"
                f":ratios={','.join(repr(r) for r in config_args['mag_ratios'])}")
    extra = {}
    if ratios:
        cond = [r for ctx, r in ratios if ctx != "uncond"][0]
        calibrated[name] = cond
        extra["calibration_ratios"] = torch.tensor(cond, dtype=torch.float64)
        print(f"{name}: calibration ratios {cond}")
    save(name, meta_of(args, pipeline, spec), record, result, steps, embeds, extra)


def run_taylor_case(name, pipeline, config_args, args):
    """TaylorSeer: each evaluation's decision, the first hooked attention's (every one follows the same
    schedule)."""
    from diffusers.hooks import TaylorSeerCacheConfig
    from diffusers.hooks import taylorseer_cache as ts

    pipe = load_pipeline(*pipeline)
    if pipeline[0] == "Flux2Pipeline":
        entering_cond_context(pipe)
    embeds = embeddings(pipe, args)
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
        result, steps = call(pipe, args, embeds)
    finally:
        ts.TaylorSeerCacheHook._measure_should_compute = measure
    assert hooked == [f"transformer_blocks.{i}.attn" for i in range(len(pipe.transformer.transformer_blocks))] + \
        [f"single_transformer_blocks.{i}.attn" for i in range(len(pipe.transformer.single_transformer_blocks))], \
        f"{name}: hooked {hooked}"
    spec = (f"taylorseer:interval={c.cache_interval}:warmup={c.disable_cache_before_step}:order={c.max_order}"
            + (f":until={c.disable_cache_after_step}" if c.disable_cache_after_step is not None else "")
            + (":factors=f32" if c.taylor_factors_dtype == torch.float32 else ""))
    save(name, meta_of(args, pipeline, spec), record, result, steps, embeds)


def run_attention_case(name, pipeline, cache, config, args):
    """Pyramid Attention Broadcast or FasterCache: whether each hooked attention ran at each evaluation (and the
    timestep the hooks read from the pipeline, `pipe.current_timestep`). Flux2Pipeline's cache context does not
    matter here: these hooks keep one state per attention whatever the context."""
    from step_cache_attention import hooked_call, spec_of

    pipe = load_pipeline(*pipeline)
    embeds = embeddings(pipe, args)
    (result, steps), modules, computed, timesteps = hooked_call(
        pipe, cache, config, lambda: call(pipe, args, embeds), args["num_inference_steps"])
    assert modules == [f"transformer_blocks.{i}.attn" for i in range(len(pipe.transformer.transformer_blocks))] + \
        [f"single_transformer_blocks.{i}.attn" for i in range(len(pipe.transformer.single_transformer_blocks))], \
        f"{name}: hooked {modules}"
    evaluations = len(computed)
    lo, hi = config["range"]
    inside = [i for i, t in enumerate(timesteps) if lo < t < hi]
    assert inside and len(inside) < evaluations, f"{name}: pick steps with timesteps inside and outside the range"
    extra = {"modules_computed": torch.tensor([[int(c) for c in row] for row in computed], dtype=torch.int64),
             "timestep": torch.tensor(timesteps, dtype=torch.float64)}
    save(name, meta_of(args, pipeline, spec_of(cache, config)), [("cond", row[0], -1.0) for row in computed],
         result, steps, embeds, extra)


def check_first_block_cache_fails():
    """diffusers 0.42.1's First Block Cache on Flux2Pipeline, inside a "cond" context: its tail hook fails on the
    single-stream blocks' one output tensor."""
    from diffusers.hooks import FirstBlockCacheConfig

    pipe = load_pipeline(*DEV)
    entering_cond_context(pipe)
    args = dict(SQUARE, num_inference_steps=3, seed=1)
    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.1))
    try:
        call(pipe, args, embeddings(pipe, args))
    except TypeError as e:
        assert "unsupported operand" in str(e), e
        print(f"First Block Cache on FLUX.2 fails in diffusers, as expected: {e}")
        return
    raise AssertionError("diffusers' First Block Cache ran on FLUX.2: Kiln refuses it; revisit the refusal")


def main():
    wanted = set(sys.argv[1:])
    if not wanted or "fbcache" in wanted:
        check_first_block_cache_fails()
    calibrated = {}
    # A wanted case's calibration runs too, before it (MAG_CASES lists each calibration first).
    sources = {c[2].get("ratios_from") for c in MAG_CASES if not wanted or c[0] in wanted}
    for case in MAG_CASES:
        if not wanted or case[0] in wanted or case[0] in sources:
            run_mag_case(*case, calibrated)
    for case in TAYLOR_CASES:
        if not wanted or case[0] in wanted:
            run_taylor_case(*case)
    for case in ATTENTION_CASES:
        if not wanted or case[0] in wanted:
            run_attention_case(*case)


if __name__ == "__main__":
    main()
