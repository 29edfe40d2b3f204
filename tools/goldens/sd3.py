#!/usr/bin/env python3
"""Builds tiny, randomly initialised Stable Diffusion 3.5 pipelines from diffusers' and transformers' real classes,
saves them in diffusers layout, and dumps reference tensors for every stage of StableDiffusion3Pipeline for Kiln's
parity tests.

Outputs (committed; CI never runs this script):
  tests/data/models/sd3-tiny-medium/   MMDiT-X like 3.5 Medium: dual attention in blocks 0 and 1, QK RMSNorm
  tests/data/models/sd3-tiny-large/    like 3.5 Large / Large Turbo: no dual attention, QK RMSNorm
  tests/data/goldens/sd3/<case>.safetensors   per-stage tensors; the case parameters are in the metadata
  tests/data/goldens/sd3/real_layouts.json    configs, names and shapes of the REAL 3.5 Medium / Large components

Each pipeline has three real-format tokenizers: tokenizer/ (CLIP-L, pads with <|endoftext|>), tokenizer_2/ (CLIP-G,
pads with "!" = id 0, as the real SD3 repos do) and tokenizer_3/ (T5 SentencePiece). The bfloat16 cases run the
float32 pipelines converted with .to(torch.bfloat16), as from_pretrained(torch_dtype=torch.bfloat16) would.

Usage: python tools/goldens/sd3.py   (torch, diffusers, transformers, sentencepiece, safetensors from pip)
"""
import copy
import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "sd3")
TOKENIZERS = os.path.join(ROOT, "tests", "data", "tokenizers")

sys.path.insert(0, os.path.dirname(__file__))
from tiny_tokenizers import write_tiny_clip_tokenizer, write_tiny_t5_tokenizer  # noqa: E402

NUM_MERGES = 1000


def write_tiny_clip_g_tokenizer(clip_l_dir, dst):
    """CLIP-G's tokenizer: CLIP-L's vocabulary and merges with SD3's tokenizer_2 configuration (pad "!")."""
    shutil.copytree(clip_l_dir, dst, dirs_exist_ok=True)
    vocab = json.load(open(os.path.join(dst, "vocab.json"), encoding="utf-8"))
    assert vocab["!"] == 0, "the pad token of CLIP-G must be id 0"
    n = len(vocab)
    src = os.path.join(TOKENIZERS, "clip_g")
    cfg = json.load(open(os.path.join(src, "tokenizer_config.json")))
    decoder = cfg["added_tokens_decoder"]
    cfg["added_tokens_decoder"] = {"0": decoder["0"], str(n - 2): decoder["49406"], str(n - 1): decoder["49407"]}
    json.dump(cfg, open(os.path.join(dst, "tokenizer_config.json"), "w"), indent=2)
    shutil.copy(os.path.join(src, "special_tokens_map.json"), dst)


def tiny_components(variant, tok_dirs):
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import (CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer, T5Config, T5EncoderModel,
                              T5TokenizerFast)

    tok_l = CLIPTokenizer.from_pretrained(tok_dirs["clip_l"])
    tok_g = CLIPTokenizer.from_pretrained(tok_dirs["clip_g"])
    tok_t5 = T5TokenizerFast.from_pretrained(tok_dirs["t5"])
    assert tok_g.pad_token_id == 0 and tok_l.pad_token_id == len(tok_l) - 1
    seed = 0 if variant == "medium" else 100
    torch.manual_seed(seed)
    # eos_token_id=2: the legacy value of the real SD3 text encoder configs (the pooled token is found by argmax).
    clip_l = CLIPTextModelWithProjection(CLIPTextConfig(
        vocab_size=len(tok_l), hidden_size=24, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
        max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5, projection_dim=24,
        bos_token_id=0, eos_token_id=2, pad_token_id=1))
    torch.manual_seed(seed + 1)
    clip_g = CLIPTextModelWithProjection(CLIPTextConfig(
        vocab_size=len(tok_g), hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        max_position_embeddings=77, hidden_act="gelu", layer_norm_eps=1e-5, projection_dim=32,
        bos_token_id=0, eos_token_id=2, pad_token_id=1))
    torch.manual_seed(seed + 2)
    t5 = T5EncoderModel(T5Config(
        vocab_size=len(tok_t5), d_model=64, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
        relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
        layer_norm_epsilon=1e-6, dropout_rate=0.0, is_encoder_decoder=False, use_cache=False,
        tie_word_embeddings=False))
    torch.manual_seed(seed + 3)
    if variant == "medium":
        transformer = SD3Transformer2DModel(
            sample_size=8, patch_size=2, in_channels=16, num_layers=3, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=64, caption_projection_dim=32, pooled_projection_dim=56, out_channels=16,
            pos_embed_max_size=16, dual_attention_layers=(0, 1), qk_norm="rms_norm")
    else:
        transformer = SD3Transformer2DModel(
            sample_size=8, patch_size=2, in_channels=16, num_layers=3, attention_head_dim=8, num_attention_heads=3,
            joint_attention_dim=64, caption_projection_dim=24, pooled_projection_dim=56, out_channels=16,
            pos_embed_max_size=12, qk_norm="rms_norm")
    torch.manual_seed(seed + 4)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(8, 16, 16, 16), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=4,
        act_fn="silu", use_quant_conv=False, use_post_quant_conv=False, scaling_factor=1.5305, shift_factor=0.0609,
        sample_size=64, mid_block_add_attention=True, force_upcast=True)
    # Random init leaves some weights at exactly zero/one (norm weights, biases, the adaLN projections); perturb
    # everything so that a wrong wiring cannot hide behind an identity parameter. The position table is a buffer
    # and keeps its sin/cos values.
    for model in (clip_l, clip_g, t5, transformer, vae):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    return dict(transformer=transformer, scheduler=sched, vae=vae, text_encoder=clip_l, tokenizer=tok_l,
                text_encoder_2=clip_g, tokenizer_2=tok_g, text_encoder_3=t5, tokenizer_3=tok_t5)


def save_pipeline(pipe, path, tok_dirs):
    shutil.rmtree(path, ignore_errors=True)
    pipe.save_pretrained(path, safe_serialization=True)
    # Ship the tokenizers in the files the real SD3 repos have (vocab.json + merges.txt for CLIP; spiece.model +
    # tokenizer.json for T5), not only the tokenizer.json that save_pretrained writes.
    for folder, key in (("tokenizer", "clip_l"), ("tokenizer_2", "clip_g"), ("tokenizer_3", "t5")):
        shutil.rmtree(os.path.join(path, folder))
        shutil.copytree(tok_dirs[key], os.path.join(path, folder))


PROMPTS = {
    "cat": "a photo of a cat",
    "unicode": "Wow! Ein Café in Zürich — 東京の夜景 🌃, naïve façade!!",
    "long": " ".join(["a very long prompt about red circles and blue squares"] * 12),
    "blurry": "blurry, low quality",
    "none": None,
}

# name, pipeline, dtype, prompt, negative prompt, height, width, steps, guidance, seed, max_sequence_length,
# skip-layer guidance (layers, scale, start, stop) or None
CASES = [
    ("medium_cat_64x64_s0", "sd3-tiny-medium", "float32", "cat", "blurry", 64, 64, 3, 7.0, 0, 32, None),
    ("medium_nocfg_64x48_s3", "sd3-tiny-medium", "float32", "cat", "none", 64, 48, 2, 1.0, 3, 24, None),
    ("medium_slg_48x64_s5", "sd3-tiny-medium", "float32", "unicode", "blurry", 48, 64, 5, 4.5, 5, 32,
     ([1], 2.8, 0.01, 0.6)),
    ("large_unicode_80x48_s7", "sd3-tiny-large", "float32", "unicode", "none", 80, 48, 3, 5.0, 7, 40, None),
    ("large_long_64x64_s11", "sd3-tiny-large", "float32", "long", "blurry", 64, 64, 2, 3.0, 11, 24, None),
    ("mediumbf16_cat_64x64_s0", "sd3-tiny-medium", "bfloat16", "cat", "blurry", 64, 64, 3, 7.0, 0, 32, None),
    ("largebf16_unicode_80x48_s7", "sd3-tiny-large", "bfloat16", "unicode", "none", 80, 48, 3, 5.0, 7, 40, None),
]


def run_case(pipe, name, prompt_key, negative_key, height, width, steps, guidance, seed, max_seq, slg):
    prompt, negative = PROMPTS[prompt_key], PROMPTS[negative_key]
    do_cfg = guidance > 1
    out = {}

    def ids(tokenizer, text, max_length):
        return tokenizer(text, padding="max_length", max_length=max_length, truncation=True,
                         return_tensors="pt").input_ids.to(torch.int64)

    out["clip_l_ids"] = ids(pipe.tokenizer, prompt, 77)
    out["clip_g_ids"] = ids(pipe.tokenizer_2, prompt, 77)
    out["t5_ids"] = ids(pipe.tokenizer_3, prompt, max_seq)
    if do_cfg:
        neg = negative or ""
        out["negative_clip_l_ids"] = ids(pipe.tokenizer, neg, 77)
        out["negative_clip_g_ids"] = ids(pipe.tokenizer_2, neg, 77)
        out["negative_t5_ids"] = ids(pipe.tokenizer_3, neg, max_seq)
    with torch.no_grad():
        out["clip_l_hidden"], out["clip_l_pooled"] = pipe._get_clip_prompt_embeds(prompt, clip_model_index=0)
        out["clip_g_hidden"], out["clip_g_pooled"] = pipe._get_clip_prompt_embeds(prompt, clip_model_index=1)
        out["t5_hidden"] = pipe._get_t5_prompt_embeds(prompt, max_sequence_length=max_seq)
        pe, npe, ppe, nppe = pipe.encode_prompt(prompt, None, None, negative_prompt=negative,
                                                do_classifier_free_guidance=do_cfg, max_sequence_length=max_seq)
    out["prompt_embeds"], out["pooled_prompt_embeds"] = pe, ppe
    if do_cfg:
        out["negative_prompt_embeds"], out["negative_pooled_prompt_embeds"] = npe, nppe

    captured = {}
    calls = []

    def transformer_hook(module, args, kwargs, output):
        calls.append(kwargs.get("skip_layers"))
        if kwargs.get("skip_layers") is not None:
            if "transformer_skip_out" not in captured:
                captured["transformer_skip_step"] = torch.tensor([len([c for c in calls if c is None]) - 1])
                captured["transformer_skip_in_hidden"] = kwargs["hidden_states"].clone()
                captured["transformer_skip_out"] = output[0].clone()
        elif "transformer_out_step0" not in captured:
            captured["transformer_in_hidden"] = kwargs["hidden_states"].clone()
            captured["transformer_in_timestep"] = kwargs["timestep"].clone()
            captured["transformer_in_encoder_hidden"] = kwargs["encoder_hidden_states"].clone()
            captured["transformer_in_pooled"] = kwargs["pooled_projections"].clone()
            captured["transformer_out_step0"] = output[0].clone()

    original_step = pipe.scheduler.step

    def step(model_output, timestep, sample, **kw):
        captured.setdefault("guided_velocity", []).append(model_output.clone())
        return original_step(model_output, timestep, sample, **kw)

    pipe.scheduler.step = step
    h1 = pipe.transformer.register_forward_hook(transformer_hook, with_kwargs=True)
    h2 = pipe.vae.decoder.register_forward_hook(
        lambda m, a, o: captured.update(vae_decoder_in=a[0].clone(), vae_decoder_out=o.clone()))

    def on_step_end(p, i, t, kw):
        captured.setdefault("latents_steps", []).append(kw["latents"].clone())
        return {}

    generator = torch.Generator("cpu").manual_seed(seed)
    extra = {}
    if slg is not None:
        extra = dict(skip_guidance_layers=slg[0], skip_layer_guidance_scale=slg[1], skip_layer_guidance_start=slg[2],
                     skip_layer_guidance_stop=slg[3])
    with torch.no_grad():
        g2 = torch.Generator("cpu").manual_seed(seed)
        init = pipe.prepare_latents(1, pipe.transformer.config.in_channels, height, width, pe.dtype, "cpu", g2)
        out["latents_init"] = init
        images = pipe(prompt, negative_prompt=negative, height=height, width=width, num_inference_steps=steps,
                      guidance_scale=guidance, generator=generator, max_sequence_length=max_seq, output_type="np",
                      callback_on_step_end=on_step_end, **extra).images
    h1.remove()
    h2.remove()
    del pipe.scheduler.step
    expected_in = torch.cat([init] * 2) if do_cfg else init
    assert torch.equal(captured["transformer_in_hidden"], expected_in), "pipeline noise differs from prepare_latents"
    for k in ("transformer_in_timestep", "transformer_out_step0", "transformer_skip_step", "transformer_skip_in_hidden",
              "transformer_skip_out", "vae_decoder_in", "vae_decoder_out"):
        if k in captured:
            out[k] = captured[k]
    if do_cfg:
        assert torch.equal(captured["transformer_in_encoder_hidden"], torch.cat([npe, pe]))
        assert torch.equal(captured["transformer_in_pooled"], torch.cat([nppe, ppe]))
    out["guided_velocity_step0"] = captured["guided_velocity"][0]
    out["latents_step0"] = captured["latents_steps"][0]
    out["latents_final"] = captured["latents_steps"][-1]
    out["sigmas"] = pipe.scheduler.sigmas.float()
    out["image"] = torch.from_numpy(np.ascontiguousarray(images[0])).float()  # HWC in [0, 1]
    out["image_u8"] = torch.from_numpy((images[0] * 255).round().astype("uint8"))  # what the PIL path saves
    meta = dict(pipeline=name, prompt=prompt, height=str(height), width=str(width), steps=str(steps),
                guidance=repr(guidance), seed=str(seed), max_sequence_length=str(max_seq),
                dtype=str(pipe.transformer.dtype).replace("torch.", ""), cfg=str(do_cfg).lower())
    if negative is not None:
        meta["negative_prompt"] = negative
    if slg is not None:
        meta.update(skip_guidance_layers=",".join(str(i) for i in slg[0]), skip_layer_guidance_scale=repr(slg[1]),
                    skip_layer_guidance_start=repr(slg[2]), skip_layer_guidance_stop=repr(slg[3]))
    return {k: v.contiguous() for k, v in out.items()}, meta


def real_layouts():
    """Names and shapes of the real SD3.5 Medium / Large components, built on the meta device (no memory)."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    configs = json.load(open(os.path.join(os.path.dirname(__file__), "sd3_real_configs.json")))
    layouts = {"configs": configs}
    with torch.device("meta"):
        for variant in ("medium", "large"):
            t = SD3Transformer2DModel(**{k: v for k, v in configs[f"transformer_{variant}"].items()
                                         if not k.startswith("_")})
            layouts[f"transformer_{variant}"] = {k: list(v.shape) for k, v in t.state_dict().items()}
        vae = AutoencoderKL(**{k: v for k, v in configs["vae"].items() if not k.startswith("_")})
        layouts["vae"] = {k: list(v.shape) for k, v in vae.state_dict().items()}
        for key in ("text_encoder", "text_encoder_2"):
            clip = CLIPTextModelWithProjection(CLIPTextConfig(**configs[key]))
            # transformers >= 5 drops the "text_model." prefix when saving, but the real SD3 repos were written by
            # older versions and keep it: record the names as they are in the real files.
            layouts[key] = {(k if k.startswith("text_model.") or k.startswith("text_projection") else "text_model." + k):
                            list(v.shape) for k, v in clip.state_dict().items()}
        t5 = T5EncoderModel(T5Config(**configs["text_encoder_3"]))
        layouts["text_encoder_3"] = {k: list(v.shape) for k, v in t5.state_dict().items()
                                     if k != "encoder.embed_tokens.weight"}
    return layouts


def main():
    from diffusers import StableDiffusion3Pipeline

    shutil.rmtree(GOLDENS, ignore_errors=True)
    os.makedirs(GOLDENS)
    tok_root = os.path.join(ROOT, "build-goldens-sd3-tokenizers")
    tok_dirs = {k: os.path.join(tok_root, k) for k in ("clip_l", "clip_g", "t5")}
    write_tiny_clip_tokenizer(os.path.join(TOKENIZERS, "clip"), tok_dirs["clip_l"], num_merges=NUM_MERGES)
    write_tiny_clip_g_tokenizer(tok_dirs["clip_l"], tok_dirs["clip_g"])
    write_tiny_t5_tokenizer(os.path.join(TOKENIZERS, "t5"), tok_dirs["t5"])

    pipes = {}
    for variant in ("medium", "large"):
        name = f"sd3-tiny-{variant}"
        pipe = StableDiffusion3Pipeline(**tiny_components(variant, tok_dirs))
        save_pipeline(pipe, os.path.join(MODELS, name), tok_dirs)
        # The saved folder must reproduce the in-memory pipeline: reload it and use the reloaded one.
        reloaded = StableDiffusion3Pipeline.from_pretrained(os.path.join(MODELS, name))
        for (k, a), b in zip(pipe.transformer.state_dict().items(), reloaded.transformer.state_dict().values()):
            assert torch.equal(a, b), f"{name}: reloaded transformer differs at {k}"
        assert reloaded.tokenizer_2.pad_token_id == 0
        pipes[(name, "float32")] = reloaded
        pipes[(name, "bfloat16")] = copy.deepcopy(reloaded).to(torch.bfloat16)
    shutil.rmtree(tok_root)

    for name, pipe_name, dtype, prompt_key, negative_key, h, w, steps, g, seed, max_seq, slg in CASES:
        tensors, meta = run_case(pipes[(pipe_name, dtype)], pipe_name, prompt_key, negative_key, h, w, steps, g,
                                 seed, max_seq, slg)
        save_file(tensors, os.path.join(GOLDENS, name + ".safetensors"), metadata=meta)
        print("wrote", name, {k: tuple(v.shape) for k, v in tensors.items()})

    with open(os.path.join(GOLDENS, "real_layouts.json"), "w") as f:
        json.dump(real_layouts(), f, indent=0, sort_keys=True)


if __name__ == "__main__":
    main()
