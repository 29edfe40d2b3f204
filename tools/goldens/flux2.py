#!/usr/bin/env python3
"""Builds tiny, randomly initialised FLUX.2 pipelines (the image side: Flux2Transformer2DModel, AutoencoderKLFlux2,
FlowMatchEulerDiscreteScheduler) from diffusers' real classes, saves them in diffusers layout, and dumps reference
tensors for every stage of Flux2Pipeline / Flux2KleinPipeline driven by prompt embeddings, for Kiln's parity tests.
The text encoders are not part of these pipelines (model_index.json lists text_encoder and tokenizer as
[null, null]): every run passes `prompt_embeds` (and, for klein's classifier-free guidance,
`negative_prompt_embeds`) as diffusers' __call__ accepts them.

Outputs (committed; CI never runs this script):
  tests/data/models/flux2-tiny-dev/         Flux2Pipeline, guidance_embeds=True, float32
  tests/data/models/flux2-tiny-dev-bf16/    the same weights stored in bfloat16
  tests/data/models/flux2-tiny-klein/       Flux2KleinPipeline (is_distilled=False: CFG), guidance_embeds=False,
                                            transformer sharded into several files, a VAE whose decoder has its own
                                            block_out_channels
  tests/data/goldens/flux2/<case>.safetensors   per-stage tensors of one pipeline call; parameters in the metadata
  tests/data/goldens/flux2/ref_*.png            the reference images of the image-conditioned cases
  tests/data/goldens/flux2/vae_<pipeline>.safetensors   VAE encode (mean, logvar) of a random image
  tests/data/goldens/flux2/scheduler.json       compute_empirical_mu and the FLUX.2 schedules for many sizes/steps
  tests/data/goldens/flux2/real_layouts.json    names and shapes of the REAL FLUX.2-dev / klein 4B / klein 9B
                                                transformers and the FLUX.2 VAE (from flux2_real_configs.json)

Usage: python tools/goldens/flux2.py   (torch, diffusers, safetensors, numpy, pillow from pip)
"""
import json
import os
import shutil

import numpy as np
import PIL.Image
import torch
from safetensors.torch import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "flux2")

# The tiny transformer: 2 heads of 16 (width 32), RoPE axes of four different widths so that a mix-up of axes
# cannot cancel out (text tokens rotate on axis 3, image tokens on axes 1 and 2, reference images on axis 0).
TINY_TRANSFORMER = dict(patch_size=1, num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
                        timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=(2, 6, 4, 4), rope_theta=2000,
                        eps=1e-6)
LATENT_CHANNELS = 8  # in_channels = 4 * LATENT_CHANNELS after the 2x2 patchify
DEV_JOINT_DIM = 48   # 3 "text encoder layers" of 16
KLEIN_JOINT_DIM = 24


def perturb(model, scale=0.05):
    # Random init leaves some weights at exactly zero/one (norm weights); perturb everything so that a wrong wiring
    # cannot hide behind an identity parameter.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)


def tiny_vae(seed, decoder_block_out_channels=None):
    from diffusers import AutoencoderKLFlux2

    torch.manual_seed(seed)
    vae = AutoencoderKLFlux2(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 16, 16, 16),
        decoder_block_out_channels=decoder_block_out_channels, layers_per_block=1, act_fn="silu",
        latent_channels=LATENT_CHANNELS, norm_num_groups=4, sample_size=64, use_quant_conv=True,
        use_post_quant_conv=True, mid_block_add_attention=True, batch_norm_eps=1e-4, batch_norm_momentum=0.1,
        patch_size=(2, 2))
    perturb(vae)
    # The latent statistics: a fresh BatchNorm has mean 0 and variance 1, which would hide a swapped or missing
    # de-normalisation; give them values like a trained VAE's.
    with torch.no_grad():
        n = vae.bn.running_mean.numel()
        vae.bn.running_mean.copy_(torch.randn(n) * 0.3)
        vae.bn.running_var.copy_(torch.rand(n) * 2.0 + 0.25)
        vae.bn.num_batches_tracked.fill_(1000)
    vae.eval()
    return vae


def tiny_transformer(seed, guidance_embeds, joint_dim):
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(seed)
    t = Flux2Transformer2DModel(in_channels=4 * LATENT_CHANNELS, joint_attention_dim=joint_dim,
                                guidance_embeds=guidance_embeds, **TINY_TRANSFORMER)
    perturb(t)
    return t


def flux2_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    # FLUX.2-dev's scheduler is FLUX.1-dev's (scripts/convert_flux2_to_diffusers.py copies it).
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                                           base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                           max_image_seq_len=4096)


def build_pipelines():
    from diffusers import Flux2KleinPipeline, Flux2Pipeline

    dev = Flux2Pipeline(scheduler=flux2_scheduler(), vae=tiny_vae(3), text_encoder=None, tokenizer=None,
                        transformer=tiny_transformer(2, True, DEV_JOINT_DIM))
    dev_bf16 = Flux2Pipeline(scheduler=flux2_scheduler(), vae=tiny_vae(3), text_encoder=None, tokenizer=None,
                             transformer=tiny_transformer(2, True, DEV_JOINT_DIM)).to(torch.bfloat16)
    klein = Flux2KleinPipeline(scheduler=flux2_scheduler(), vae=tiny_vae(5, decoder_block_out_channels=(8, 8, 16, 24)),
                               text_encoder=None, tokenizer=None,
                               transformer=tiny_transformer(4, False, KLEIN_JOINT_DIM), is_distilled=False)
    return {"flux2-tiny-dev": dev, "flux2-tiny-dev-bf16": dev_bf16, "flux2-tiny-klein": klein}


def save_pipeline(pipe, path, shard_transformer=False):
    shutil.rmtree(path, ignore_errors=True)
    pipe.save_pretrained(path, safe_serialization=True)
    if shard_transformer:
        shutil.rmtree(os.path.join(path, "transformer"))
        pipe.transformer.save_pretrained(os.path.join(path, "transformer"), safe_serialization=True,
                                         max_shard_size="200KB")


def reference_image(path, width, height, seed):
    """A smooth RGB picture (gradients and a disc), saved as PNG and read back as PIL does for the pipeline."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    c = rng.uniform(0.2, 0.8, size=(3, 3))
    img = np.stack([c[i, 0] + c[i, 1] * x / width - c[i, 2] * y / height for i in range(3)], axis=-1)
    cy, cx, r = rng.uniform(0.3, 0.7) * height, rng.uniform(0.3, 0.7) * width, 0.25 * min(width, height)
    disc = ((x - cx) ** 2 + (y - cy) ** 2) < r * r
    img[disc] = rng.uniform(0, 1, size=3)
    img = np.clip(img + rng.normal(0, 0.02, size=img.shape), 0, 1)
    PIL.Image.fromarray((img * 255).round().astype(np.uint8), "RGB").save(path)
    return PIL.Image.open(path).convert("RGB")


# name, pipeline, text length, height, width, steps, guidance, seed, reference images, num_images_per_prompt
# height = width = None: the pipeline takes the first reference image's size (as diffusers does).
CASES = [
    ("dev_64x64_s0", "flux2-tiny-dev", 12, 64, 64, 3, 4.0, 0, [], 1),
    ("dev_80x48_s1234", "flux2-tiny-dev", 20, 80, 48, 3, 2.5, 1234, [], 1),
    ("dev_96x64_s7_n2", "flux2-tiny-dev", 9, 96, 64, 2, 4.0, 7, [], 2),
    ("dev_ref1_64x48_s3", "flux2-tiny-dev", 12, 64, 48, 3, 4.0, 3, ["ref_a"], 1),
    ("dev_ref2_auto_s11", "flux2-tiny-dev", 16, None, None, 2, 3.0, 11, ["ref_b", "ref_a"], 1),
    ("dev_ref1_48x64_s5_n2", "flux2-tiny-dev", 8, 48, 64, 2, 4.0, 5, ["ref_b"], 2),
    ("devbf16_64x64_s0", "flux2-tiny-dev-bf16", 12, 64, 64, 3, 4.0, 0, [], 1),
    ("devbf16_ref1_64x48_s3", "flux2-tiny-dev-bf16", 12, 64, 48, 3, 4.0, 3, ["ref_a"], 1),
    ("klein_cfg_64x64_s0", "flux2-tiny-klein", 10, 64, 64, 3, 4.0, 0, [], 1),
    ("klein_nocfg_48x80_s9", "flux2-tiny-klein", 14, 48, 80, 3, 1.0, 9, [], 1),
    ("klein_cfg_ref1_64x64_s2", "flux2-tiny-klein", 10, 64, 64, 2, 3.5, 2, ["ref_a"], 1),
]

# (file name, width, height, seed): sizes that are not multiples of 16, so the centre crop matters.
REFERENCE_IMAGES = [("ref_a", 72, 88, 21), ("ref_b", 100, 64, 22)]


def run_case(pipe, name, text_len, height, width, steps, guidance, seed, refs, n_images, images):
    from diffusers import Flux2KleinPipeline

    klein = isinstance(pipe, Flux2KleinPipeline)
    dtype = pipe.transformer.dtype
    joint = pipe.transformer.config.joint_attention_dim
    g = torch.Generator("cpu").manual_seed(1000 + seed)
    prompt_embeds = torch.randn(1, text_len, joint, generator=g).to(dtype)
    negative = None
    cfg = klein and guidance > 1.0
    if cfg:
        # The negative prompt ("") gets other embeddings and another length, as a real encoder gives.
        negative = torch.randn(1, text_len + 3, joint, generator=g).to(dtype)

    captured = {"calls": 0}

    def transformer_pre(module, args, kwargs):
        captured["calls"] += 1
        k = captured["calls"]
        if k == 1:
            captured["transformer_in_hidden"] = kwargs["hidden_states"].clone()
            captured["transformer_in_timestep"] = kwargs["timestep"].clone()
            if kwargs.get("guidance") is not None:
                captured["transformer_in_guidance"] = kwargs["guidance"].clone()
            captured["transformer_in_img_ids"] = kwargs["img_ids"].clone()
            captured["transformer_in_txt_ids"] = kwargs["txt_ids"].clone()

    def transformer_post(module, args, kwargs, output):
        k = captured["calls"]
        if k == 1:
            captured["transformer_out_step0"] = output[0].clone()
        if k == 2 and cfg:
            captured["transformer_out_step0_uncond"] = output[0].clone()
            captured["transformer_in_txt_ids_uncond"] = kwargs["txt_ids"].clone()

    hooks = [pipe.transformer.register_forward_pre_hook(transformer_pre, with_kwargs=True),
             pipe.transformer.register_forward_hook(transformer_post, with_kwargs=True)]

    # The stages inside the transformer at the first call: embeddings, shared modulations, every block's output.
    def first_call_hook(key, pick=lambda o: o):
        def hook(module, args, output):
            if captured["calls"] == 1 and key not in captured:
                captured[key] = pick(output).clone()
        return hook

    t = pipe.transformer
    hooks.append(t.time_guidance_embed.register_forward_hook(first_call_hook("stage_temb")))
    hooks.append(t.double_stream_modulation_img.register_forward_hook(first_call_hook("stage_mod_img")))
    hooks.append(t.double_stream_modulation_txt.register_forward_hook(first_call_hook("stage_mod_txt")))
    hooks.append(t.single_stream_modulation.register_forward_hook(first_call_hook("stage_mod_single")))
    hooks.append(t.x_embedder.register_forward_hook(first_call_hook("stage_x_embedded")))
    hooks.append(t.context_embedder.register_forward_hook(first_call_hook("stage_context_embedded")))
    for i, block in enumerate(t.transformer_blocks):
        hooks.append(block.register_forward_hook(first_call_hook(f"stage_double{i}_context", lambda o: o[0])))
        hooks.append(block.register_forward_hook(first_call_hook(f"stage_double{i}_hidden", lambda o: o[1])))
    for i, block in enumerate(t.single_transformer_blocks):
        hooks.append(block.register_forward_hook(first_call_hook(f"stage_single{i}")))
    hooks.append(t.norm_out.register_forward_hook(first_call_hook("stage_norm_out")))

    def vae_decode_pre(module, args, kwargs):
        captured["vae_decode_in"] = args[0].clone()
    hooks.append(pipe.vae.decoder.register_forward_hook(
        lambda m, a, o: captured.update(vae_decoder_in=a[0].clone(), vae_decoder_out=o.clone())))

    def on_step_end(p, i, t_, kw):
        captured.setdefault("latents_steps", []).append(kw["latents"].clone())
        return {}

    ref_images = [images[r] for r in refs]
    kwargs = dict(prompt_embeds=prompt_embeds, height=height, width=width, num_inference_steps=steps,
                  guidance_scale=guidance, num_images_per_prompt=n_images, output_type="np",
                  callback_on_step_end=on_step_end)
    if cfg:
        kwargs["negative_prompt_embeds"] = negative
    if ref_images:
        kwargs["image"] = ref_images if len(ref_images) > 1 else ref_images[0]
    with torch.no_grad():
        # The initial noise and ids, and the reference images' latents, as the pipeline's own helpers make them.
        if height is None:
            w0, h0 = ref_images[0].size
            height, width = (h0 // 16) * 16, (w0 // 16) * 16
        g2 = torch.Generator("cpu").manual_seed(seed)
        c = pipe.transformer.config.in_channels // 4
        init, latent_ids = pipe.prepare_latents(n_images, c, height, width, prompt_embeds.dtype, "cpu", g2)
        out = {"prompt_embeds": prompt_embeds, "latents_init": init, "latent_ids": latent_ids[0]}
        if cfg:
            out["negative_prompt_embeds"] = negative
        if ref_images:
            conds = []
            for k, img in enumerate(ref_images):
                w_i, h_i = img.size
                w_i, h_i = (w_i // 16) * 16, (h_i // 16) * 16
                cond = pipe.image_processor.preprocess(img, height=h_i, width=w_i, resize_mode="crop")
                out[f"ref{k}_pixels"] = cond  # [1, 3, h, w] in [-1, 1], float32
                conds.append(cond)
            image_latents, image_ids = pipe.prepare_image_latents(conds, n_images, None, "cpu", pipe.vae.dtype)
            out["image_latents"] = image_latents
            out["image_latent_ids"] = image_ids[0]
        generator = torch.Generator("cpu").manual_seed(seed)
        result = pipe(generator=generator, **kwargs).images
    for h in hooks:
        h.remove()
    hidden0 = captured["transformer_in_hidden"]
    assert torch.equal(hidden0[:, : init.shape[1]], init.to(dtype)), "pipeline noise differs from prepare_latents"
    if ref_images:
        assert torch.equal(hidden0[:, init.shape[1]:], out["image_latents"].to(dtype)), "reference latents differ"
    for k, v in captured.items():
        if k in ("calls", "latents_steps", "transformer_in_hidden"):
            continue
        out[k] = v
    out["transformer_in_hidden"] = hidden0
    out["latents_final"] = captured["latents_steps"][-1]
    out["latents_step0"] = captured["latents_steps"][0]
    out["image"] = torch.from_numpy(np.ascontiguousarray(result)).float()  # [B, H, W, 3] in [0, 1]
    out["image_u8"] = torch.from_numpy((result * 255).round().astype("uint8"))  # what the PIL path saves
    meta = dict(pipeline=name, height=str(height), width=str(width), steps=str(steps), guidance=repr(guidance),
                seed=str(seed), num_images_per_prompt=str(n_images), references=",".join(refs),
                auto_size="true" if kwargs["height"] is None else "false",
                cfg="true" if cfg else "false", dtype=str(dtype).replace("torch.", ""))
    return {k: v.contiguous() for k, v in out.items()}, meta


def lanczos_refs(pipe):
    """PIL's LANCZOS resize (what Flux2Pipeline shrinks reference images larger than 1024^2 with) on small random
    images, both pass orders and up/down scaling, and the whole preprocessing of a large reference image."""
    rng = np.random.default_rng(31)
    tensors = {}
    cases = [("rgb_40x30_to_17x25", 40, 30, 17, 25, "RGB"), ("rgb_23x41_to_64x48", 23, 41, 64, 48, "RGB"),
             ("rgb_200x60_to_150x10", 200, 60, 150, 10, "RGB"), ("rgb_97x131_to_31x29", 97, 131, 31, 29, "RGB"),
             ("gray_50x40_to_33x21", 50, 40, 33, 21, "L")]
    for name, w, h, ow, oh, mode in cases:
        channels = 3 if mode == "RGB" else 1
        pixels = rng.integers(0, 256, size=(h, w, channels), dtype=np.uint8)
        img = PIL.Image.fromarray(pixels if channels == 3 else pixels[..., 0], mode)
        out = np.asarray(img.resize((ow, oh), PIL.Image.Resampling.LANCZOS))
        tensors[name + ".in"] = torch.from_numpy(pixels.copy())
        tensors[name + ".out"] = torch.from_numpy(out.reshape(oh, ow, channels).copy())
    # A reference image over the area cap: 1100 x 1000 pixels -> 1075 x 977 (sqrt(1024^2 / 1.1e6)), cropped to
    # 1072 x 976. Striped so that the filter's lobes show.
    path = os.path.join(GOLDENS, "ref_large.png")
    y, x = np.mgrid[0:1000, 0:1100]
    img = np.stack([(x * 7 + y) % 256, ((x // 9) % 2) * 200 + 20, (np.hypot(x - 500, y - 420) < 300) * 180 + 40],
                   axis=-1).astype(np.uint8)
    PIL.Image.fromarray(img, "RGB").save(path)
    large = PIL.Image.open(path).convert("RGB")
    resized = pipe.image_processor._resize_to_target_area(large, 1024 * 1024)
    w, h = resized.size
    pixels = pipe.image_processor.preprocess(resized, height=(h // 16) * 16, width=(w // 16) * 16, resize_mode="crop")
    # Committed as the 8-bit picture the pipeline saw (a PNG: the float tensor would take 12 MB); the pixels are
    # exactly 2 * (u8 / 255) - 1.
    u8 = ((pixels[0].permute(1, 2, 0) + 1) / 2 * 255).round().to(torch.uint8)
    assert torch.equal(2.0 * (u8.float() / 255.0) - 1.0, pixels[0].permute(1, 2, 0))
    PIL.Image.fromarray(u8.numpy(), "RGB").save(os.path.join(GOLDENS, "ref_large_preprocessed.png"))
    save_file(tensors, os.path.join(GOLDENS, "lanczos.safetensors"))


def scheduler_refs():
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    mu = {}
    for seq in (1, 16, 64, 100, 256, 1000, 1024, 2048, 3000, 4095, 4096, 4299, 4300, 4301, 5000, 6400, 9216, 16384,
                65536):
        for n in (1, 2, 3, 4, 8, 10, 20, 28, 50, 100, 200, 250, 1000):
            mu[f"{seq}_{n}"] = float(compute_empirical_mu(seq, n))
    schedules = {}
    for h, w in ((64, 64), (48, 80), (512, 512), (1024, 1024), (768, 1360), (2048, 2048)):
        for n in (1, 3, 4, 28, 50):
            seq = (h // 16) * (w // 16)
            s = flux2_scheduler()
            m = compute_empirical_mu(seq, n)
            s.set_timesteps(n, sigmas=np.linspace(1.0, 1 / n, n), mu=m)
            schedules[f"{h}x{w}_n{n}"] = dict(image_seq_len=seq, steps=n, mu=float(m),
                                              sigmas=[float(x) for x in s.sigmas.numpy()],
                                              timesteps=[float(x) for x in s.timesteps.numpy()])
    return {"generated_by": "tools/goldens/flux2.py", "compute_empirical_mu": mu, "schedules": schedules}


def real_layouts():
    """Names and shapes of the real FLUX.2 transformers and VAE, built on the meta device (no memory)."""
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel

    configs = json.load(open(os.path.join(os.path.dirname(__file__), "flux2_real_configs.json")))
    layouts = {"configs": configs}
    with torch.device("meta"):
        for key in ("transformer_dev", "transformer_klein_4b", "transformer_klein_9b"):
            t = Flux2Transformer2DModel(**{k: v for k, v in configs[key].items() if not k.startswith("_")})
            layouts[key] = {k: list(v.shape) for k, v in t.state_dict().items()}
        vae = AutoencoderKLFlux2(**{k: v for k, v in configs["vae"].items() if not k.startswith("_")})
        layouts["vae"] = {k: list(v.shape) for k, v in vae.state_dict().items()}
    return layouts


def main():
    os.makedirs(GOLDENS, exist_ok=True)
    pipes = build_pipelines()
    save_pipeline(pipes["flux2-tiny-dev"], os.path.join(MODELS, "flux2-tiny-dev"))
    save_pipeline(pipes["flux2-tiny-dev-bf16"], os.path.join(MODELS, "flux2-tiny-dev-bf16"))
    save_pipeline(pipes["flux2-tiny-klein"], os.path.join(MODELS, "flux2-tiny-klein"), shard_transformer=True)

    images = {name: reference_image(os.path.join(GOLDENS, name + ".png"), w, h, seed)
              for name, w, h, seed in REFERENCE_IMAGES}

    # The saved folders must reproduce the in-memory pipelines: reload one and compare a run.
    from diffusers import Flux2KleinPipeline
    reloaded = Flux2KleinPipeline.from_pretrained(os.path.join(MODELS, "flux2-tiny-klein"), text_encoder=None,
                                                  tokenizer=None)
    a, _ = run_case(pipes["flux2-tiny-klein"], "flux2-tiny-klein", 6, 48, 48, 2, 3.0, 5, ["ref_a"], 1, images)
    b, _ = run_case(reloaded, "flux2-tiny-klein", 6, 48, 48, 2, 3.0, 5, ["ref_a"], 1, images)
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), rtol=1e-5, atol=1e-5), f"reloaded pipeline differs: {k}"

    for name, pipe_name, text_len, h, w, steps, guidance, seed, refs, n in CASES:
        tensors, meta = run_case(pipes[pipe_name], pipe_name, text_len, h, w, steps, guidance, seed, refs, n, images)
        save_file(tensors, os.path.join(GOLDENS, name + ".safetensors"), metadata=meta)
        print("wrote", name, {k: tuple(v.shape) for k, v in tensors.items() if not k.startswith("stage_")})

    # The VAE alone: encode of a random image (the reference-image path needs the encoder) and decode.
    for pipe_name, pipe in pipes.items():
        g = torch.Generator("cpu").manual_seed(11)
        image = (torch.rand(1, 3, 64, 48, generator=g) * 2 - 1).to(pipe.vae.dtype)
        z = torch.randn(1, LATENT_CHANNELS, 6, 10, generator=g).to(pipe.vae.dtype)
        with torch.no_grad():
            dist = pipe.vae.encode(image).latent_dist
            decoded = pipe.vae.decode(z).sample
        save_file({"image": image.contiguous(), "mean": dist.mean.contiguous(), "logvar": dist.logvar.contiguous(),
                   "z": z.contiguous(), "decoded": decoded.contiguous()},
                  os.path.join(GOLDENS, f"vae_{pipe_name}.safetensors"))

    lanczos_refs(pipes["flux2-tiny-dev"])
    with open(os.path.join(GOLDENS, "scheduler.json"), "w") as f:
        json.dump(scheduler_refs(), f, indent=0, sort_keys=True)
    with open(os.path.join(GOLDENS, "real_layouts.json"), "w") as f:
        json.dump(real_layouts(), f, indent=0, sort_keys=True)


if __name__ == "__main__":
    main()
