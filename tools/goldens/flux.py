#!/usr/bin/env python3
"""Builds tiny, randomly initialised FLUX.1 pipelines from diffusers' and transformers' real classes, saves them
in diffusers layout, and dumps reference tensors for every stage of FluxPipeline for Kiln's parity tests.

Outputs (committed; CI never runs this script):
  tests/data/models/flux-tiny-schnell/   guidance_embeds=False, float32
  tests/data/models/flux-tiny-dev/       guidance_embeds=True, float32, transformer sharded into several files
  tests/data/models/flux-tiny-dev-bf16/  the dev pipeline stored in bfloat16
  tests/data/goldens/flux/<case>.safetensors   per-stage tensors; the case parameters are in the metadata
  tests/data/goldens/flux/real_layouts.json    names and shapes of the REAL FLUX.1 schnell/dev components

Usage: python tools/goldens/flux.py   (torch, diffusers, transformers, sentencepiece, safetensors from pip)
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "flux")
TOKENIZERS = os.path.join(ROOT, "tests", "data", "tokenizers")

sys.path.insert(0, os.path.dirname(__file__))
from tiny_tokenizers import write_tiny_clip_tokenizer, write_tiny_t5_tokenizer  # noqa: E402


def tiny_components(guidance_embeds, clip_dir, t5_dir):
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5TokenizerFast

    clip_tok = CLIPTokenizer.from_pretrained(clip_dir)
    t5_tok = T5TokenizerFast.from_pretrained(t5_dir)
    torch.manual_seed(0)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(clip_tok), hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5, projection_dim=32,
        bos_token_id=0, eos_token_id=2, pad_token_id=1))  # eos_token_id=2: the legacy value of the real FLUX config
    torch.manual_seed(1)
    t5 = T5EncoderModel(T5Config(
        vocab_size=len(t5_tok), d_model=32, d_kv=8, d_ff=40, num_layers=2, num_heads=4,
        relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
        layer_norm_epsilon=1e-6, dropout_rate=0.0, is_encoder_decoder=False, use_cache=False,
        tie_word_embeddings=False))
    torch.manual_seed(2)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=2, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=guidance_embeds,
        axes_dims_rope=(4, 6, 6))
    torch.manual_seed(3)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(8, 16, 16, 16), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=4,
        act_fn="silu", use_quant_conv=False, use_post_quant_conv=False, scaling_factor=0.3611, shift_factor=0.1159,
        sample_size=64, mid_block_add_attention=True, force_upcast=True)
    # Random init leaves some weights at exactly zero/one (norm weights, biases); perturb everything so that a
    # wrong wiring cannot hide behind an identity parameter.
    for model in (clip, t5, transformer, vae):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    if guidance_embeds:
        sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                                                base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                                max_image_seq_len=4096)
    else:
        sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False,
                                                base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                                max_image_seq_len=4096)
    return dict(scheduler=sched, text_encoder=clip, tokenizer=clip_tok, text_encoder_2=t5, tokenizer_2=t5_tok,
                transformer=transformer, vae=vae)


def save_pipeline(pipe, path, clip_dir, t5_dir, shard_transformer=False):
    shutil.rmtree(path, ignore_errors=True)
    pipe.save_pretrained(path, safe_serialization=True)
    # Ship the tokenizers in the files the real FLUX repos have (tokenizer/: vocab.json + merges.txt;
    # tokenizer_2/: spiece.model + tokenizer.json), not only the tokenizer.json that save_pretrained writes.
    for folder, src in (("tokenizer", clip_dir), ("tokenizer_2", t5_dir)):
        shutil.rmtree(os.path.join(path, folder))
        shutil.copytree(src, os.path.join(path, folder))
    if shard_transformer:
        shutil.rmtree(os.path.join(path, "transformer"))
        pipe.transformer.save_pretrained(os.path.join(path, "transformer"), safe_serialization=True,
                                         max_shard_size="100KB")


PROMPTS = {
    "cat": "a photo of a cat",
    "unicode": "Ein Café in Zürich — 東京の夜景 🌃, naïve façade",
    "long": " ".join(["a very long prompt about red circles and blue squares"] * 12),
}

CASES = [
    # name, pipeline, prompt, height, width, steps, guidance, seed, max_sequence_length
    ("schnell_cat_64x64_s0", "flux-tiny-schnell", "cat", 64, 64, 4, 0.0, 0, 32),
    ("schnell_unicode_64x96_s42", "flux-tiny-schnell", "unicode", 64, 96, 4, 0.0, 42, 48),
    ("schnell_long_96x64_s7", "flux-tiny-schnell", "long", 96, 64, 2, 0.0, 7, 24),
    ("dev_cat_64x64_s0", "flux-tiny-dev", "cat", 64, 64, 3, 3.5, 0, 32),
    ("dev_unicode_80x48_s1234", "flux-tiny-dev", "unicode", 80, 48, 3, 4.0, 1234, 40),
    ("devbf16_cat_64x64_s0", "flux-tiny-dev-bf16", "cat", 64, 64, 3, 3.5, 0, 32),
]


def run_case(pipe, name, prompt_key, height, width, steps, guidance, seed, max_seq):
    prompt = PROMPTS[prompt_key]
    out = {}
    out["clip_ids"] = pipe.tokenizer(prompt, padding="max_length", max_length=77, truncation=True,
                                     return_tensors="pt").input_ids.to(torch.int64)
    out["t5_ids"] = pipe.tokenizer_2(prompt, padding="max_length", max_length=max_seq, truncation=True,
                                     return_tensors="pt").input_ids.to(torch.int64)
    with torch.no_grad():
        prompt_embeds, pooled, text_ids = pipe.encode_prompt(prompt, prompt_2=None, max_sequence_length=max_seq)
    out["prompt_embeds"] = prompt_embeds
    out["pooled_prompt_embeds"] = pooled

    captured = {}

    def transformer_hook(module, args, kwargs, output):
        if "transformer_out_step0" not in captured:
            captured["transformer_in_hidden"] = kwargs["hidden_states"].clone()
            captured["transformer_in_timestep"] = kwargs["timestep"].clone()
            if kwargs.get("guidance") is not None:
                captured["transformer_in_guidance"] = kwargs["guidance"].clone()
            captured["transformer_in_img_ids"] = kwargs["img_ids"].clone()
            captured["transformer_out_step0"] = output[0].clone()

    def vae_hook(module, args, kwargs, output):
        captured["vae_in"] = args[0].clone()
        captured["vae_out"] = output[0].clone()

    h1 = pipe.transformer.register_forward_hook(transformer_hook, with_kwargs=True)
    h2 = pipe.vae.decoder.register_forward_hook(
        lambda m, a, o: captured.update(vae_decoder_in=a[0].clone(), vae_decoder_out=o.clone()))

    def on_step_end(p, i, t, kw):
        captured.setdefault("latents_steps", []).append(kw["latents"].clone())
        return {}

    generator = torch.Generator("cpu").manual_seed(seed)
    with torch.no_grad():
        # The initial noise, drawn exactly as the pipeline draws it.
        g2 = torch.Generator("cpu").manual_seed(seed)
        c = pipe.transformer.config.in_channels // 4
        init, _ = pipe.prepare_latents(1, c, height, width, prompt_embeds.dtype, "cpu", g2)
        out["latents_init"] = init
        images = pipe(prompt, height=height, width=width, num_inference_steps=steps, guidance_scale=guidance,
                      generator=generator, max_sequence_length=max_seq, output_type="np",
                      callback_on_step_end=on_step_end).images
    h1.remove()
    h2.remove()
    assert torch.equal(captured["transformer_in_hidden"], init), "pipeline noise differs from prepare_latents"
    out["transformer_out_step0"] = captured["transformer_out_step0"]
    out["transformer_in_timestep"] = captured["transformer_in_timestep"]
    if "transformer_in_guidance" in captured:
        out["transformer_in_guidance"] = captured["transformer_in_guidance"]
    out["latents_final"] = captured["latents_steps"][-1]
    out["vae_decoder_in"] = captured["vae_decoder_in"]
    out["vae_decoder_out"] = captured["vae_decoder_out"]
    out["image"] = torch.from_numpy(np.ascontiguousarray(images[0])).float()  # HWC in [0, 1]
    out["image_u8"] = torch.from_numpy((images[0] * 255).round().astype("uint8"))  # what the PIL path saves
    meta = dict(pipeline=name, prompt=prompt, height=str(height), width=str(width), steps=str(steps),
                guidance=repr(guidance), seed=str(seed), max_sequence_length=str(max_seq),
                dtype=str(pipe.transformer.dtype).replace("torch.", ""))
    return {k: v.contiguous() for k, v in out.items()}, meta


def real_layouts():
    """Names and shapes of the real FLUX.1 components, built on the meta device (no memory)."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    configs = json.load(open(os.path.join(os.path.dirname(__file__), "flux_real_configs.json")))
    layouts = {"configs": configs}
    with torch.device("meta"):
        for variant in ("schnell", "dev"):
            t = FluxTransformer2DModel(**{k: v for k, v in configs[f"transformer_{variant}"].items()
                                          if not k.startswith("_")})
            layouts[f"transformer_{variant}"] = {k: list(v.shape) for k, v in t.state_dict().items()}
        vae = AutoencoderKL(**{k: v for k, v in configs["vae"].items() if not k.startswith("_")})
        layouts["vae"] = {k: list(v.shape) for k, v in vae.state_dict().items()}
        clip = CLIPTextModel(CLIPTextConfig(**configs["text_encoder"]))
        # transformers >= 5 drops the "text_model." prefix when saving, but the real FLUX repos were written
        # by older versions and keep it: record the names as they are in the real files.
        layouts["text_encoder"] = {("" if k.startswith("text_model.") else "text_model.") + k: list(v.shape)
                                   for k, v in clip.state_dict().items()}
        t5 = T5EncoderModel(T5Config(**configs["text_encoder_2"]))
        # The real file stores the embedding once, as shared.weight (encoder.embed_tokens.weight is tied to it).
        layouts["text_encoder_2"] = {k: list(v.shape) for k, v in t5.state_dict().items()
                                     if k != "encoder.embed_tokens.weight"}
    return layouts


def main():
    os.makedirs(GOLDENS, exist_ok=True)
    from diffusers import FluxPipeline

    tok_dir = os.path.join(ROOT, "build-goldens-tokenizers")
    clip_dir, t5_dir = os.path.join(tok_dir, "clip"), os.path.join(tok_dir, "t5")
    write_tiny_clip_tokenizer(os.path.join(TOKENIZERS, "clip"), clip_dir, num_merges=1500)
    write_tiny_t5_tokenizer(os.path.join(TOKENIZERS, "t5"), t5_dir)

    pipes = {}
    schnell = FluxPipeline(**tiny_components(False, clip_dir, t5_dir))
    save_pipeline(schnell, os.path.join(MODELS, "flux-tiny-schnell"), clip_dir, t5_dir)
    pipes["flux-tiny-schnell"] = schnell
    dev = FluxPipeline(**tiny_components(True, clip_dir, t5_dir))
    save_pipeline(dev, os.path.join(MODELS, "flux-tiny-dev"), clip_dir, t5_dir, shard_transformer=True)
    pipes["flux-tiny-dev"] = dev
    dev_bf16 = FluxPipeline(**tiny_components(True, clip_dir, t5_dir)).to(torch.bfloat16)
    save_pipeline(dev_bf16, os.path.join(MODELS, "flux-tiny-dev-bf16"), clip_dir, t5_dir)
    pipes["flux-tiny-dev-bf16"] = dev_bf16
    shutil.rmtree(tok_dir)
    # The saved folders must reproduce the in-memory pipelines exactly: reload one and compare.
    reloaded = FluxPipeline.from_pretrained(os.path.join(MODELS, "flux-tiny-dev"))
    a, _ = run_case(dev, "flux-tiny-dev", "unicode", 64, 64, 2, 3.5, 5, 32)
    b, _ = run_case(reloaded, "flux-tiny-dev", "unicode", 64, 64, 2, 3.5, 5, 32)
    # Bitwise equality is too strict: torch's CPU kernels round differently for mmap'ed vs allocated weights.
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), rtol=1e-5, atol=1e-5), f"reloaded pipeline differs: {k}"

    for name, pipe_name, prompt_key, h, w, steps, g, seed, max_seq in CASES:
        tensors, meta = run_case(pipes[pipe_name], pipe_name, prompt_key, h, w, steps, g, seed, max_seq)
        save_file(tensors, os.path.join(GOLDENS, name + ".safetensors"), metadata=meta)
        print("wrote", name, {k: tuple(v.shape) for k, v in tensors.items()})

    # The VAE encoder (image-to-image needs it; text-to-image never runs it).
    for pipe_name in ("flux-tiny-schnell", "flux-tiny-dev-bf16"):
        pipe = pipes[pipe_name]
        g = torch.Generator("cpu").manual_seed(11)
        image = (torch.rand(1, 3, 64, 48, generator=g) * 2 - 1).to(pipe.vae.dtype)
        with torch.no_grad():
            dist = pipe.vae.encode(image).latent_dist
        save_file({"image": image.contiguous(), "mean": dist.mean.contiguous(), "logvar": dist.logvar.contiguous()},
                  os.path.join(GOLDENS, f"vae_encode_{pipe_name}.safetensors"))

    with open(os.path.join(GOLDENS, "real_layouts.json"), "w") as f:
        json.dump(real_layouts(), f, indent=0, sort_keys=True)


if __name__ == "__main__":
    main()
