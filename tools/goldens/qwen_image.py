#!/usr/bin/env python3
"""Builds a tiny, randomly initialised Qwen-Image pipeline from diffusers' and transformers' real classes, saves it
in diffusers layout, and dumps reference tensors for the stages of QwenImagePipeline calls, for Kiln's parity tests.

Outputs (committed; CI never runs this script):
  tests/data/models/qwen-image-tiny/        QwenImagePipeline, float32: QwenImageTransformer2DModel (2 blocks, 2 heads
                                            of 32, RoPE axes 8/12/12, joint_attention_dim 48), a 2-layer
                                            Qwen2_5_VLForConditionalGeneration (hidden 48; a 1-block vision tower
                                            the text path never reads) with the tiny Qwen tokenizer of
                                            tests/data/models/flux2-tiny-text/klein/tokenizer, a tiny
                                            AutoencoderKLQwenImage (base_dim 8, 16 latent channels, 8x down) and
                                            Qwen-Image's FlowMatchEulerDiscreteScheduler (dynamic exponential shift,
                                            shift_terminal 0.02)
  tests/data/models/qwen-image-tiny-bf16/   the same weights stored in bfloat16
  tests/data/goldens/qwen_image/<case>.safetensors   one call's stages; its arguments in the metadata (strings as
      they are, other values as JSON), plus `template_prompt` (the first prompt in the pipeline's template).
      Tensors:
        ids_<i> [1, n_i]                   the templated prompt i tokenized alone (no padding); negative_ids_<i>
        prompt_embeds [B, S, 48]           encode_prompt's output: hidden_states[-1] at each prompt's tokens, the
                                           template's first 34 dropped, cut at max_sequence_length, zero-padded to
                                           the longest, each row repeated num_images_per_prompt times;
                                           prompt_embeds_mask [B, S] int64 (absent when every token is valid);
                                           negative_prompt_embeds(_mask) with true CFG
        latents_init [B, L, 64]            prepare_latents' packed noise (drawn as [B, 1, 16, h, w])
        sigmas, timesteps                  the schedule after set_timesteps (mu from the image's token count)
        transformer_in_t [B]               the first call's timestep (t / 1000)
        transformer_out_step0 [B, L, 64]   the first (cond) call's output; negative_transformer_out_step0 with CFG
        noise_pred_step0 [B, L, 64]        what the scheduler's first step got (true CFG norm-rescaled)
        latents_step0, latents_final       after the first and the last step
        vae_decoder_in [B, 16, 1, h, w]    the latents un-normalised (x * std + mean), what vae.decode got
        image [B, H, W, 3] float, image_u8 ((image * 255).round())

Usage: python3 tools/goldens/qwen_image.py   (torch, diffusers 0.42.1, transformers 5, safetensors from pip)
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chroma import meta_of, save_file  # noqa: E402  (the shared golden-writing helpers)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "qwen_image")
QWEN_TOKENIZER = os.path.join(MODELS, "flux2-tiny-text", "klein", "tokenizer")

TEXT_HIDDEN = 48
# 2 heads of 32 = sum(axes_dims_rope); the three axes differ, so a mis-split shows.
TINY_TRANSFORMER = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=32,
                        num_attention_heads=2, joint_attention_dim=TEXT_HIDDEN, axes_dims_rope=(8, 12, 12))
TINY_VAE = dict(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
                temperal_downsample=[False, True, True])
# Qwen/Qwen-Image scheduler/scheduler_config.json.
SCHEDULER = dict(base_image_seq_len=256, base_shift=0.5, invert_sigmas=False, max_image_seq_len=8192, max_shift=0.9,
                 num_train_timesteps=1000, shift=1.0, shift_terminal=0.02, stochastic_sampling=False,
                 time_shift_type="exponential", use_beta_sigmas=False, use_dynamic_shifting=True,
                 use_exponential_sigmas=False, use_karras_sigmas=False)


def tiny_components():
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=TEXT_HIDDEN, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6,
                         max_position_embeddings=2048, rope_scaling={"type": "mrope", "mrope_section": [2, 2, 2]}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=TEXT_HIDDEN,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[0],
                           window_size=112),
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"))
    torch.manual_seed(1)
    qwen = Qwen2_5_VLForConditionalGeneration(config).eval()
    torch.manual_seed(2)
    transformer = QwenImageTransformer2DModel(**TINY_TRANSFORMER)
    torch.manual_seed(3)
    vae = AutoencoderKLQwenImage(**TINY_VAE, latents_mean=torch.linspace(-0.8, 0.9, 16).tolist(),
                                 latents_std=torch.linspace(1.1, 2.9, 16).tolist())
    # Random init leaves norm weights at one and biases at zero: perturb everything, so that a dropped term shows.
    torch.manual_seed(4)
    for model in (qwen, transformer, vae):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    with torch.no_grad():
        # The text encoder's own init is small (std 0.02): its states would barely depend on the prompt. Widen it.
        for p in qwen.model.language_model.parameters():
            if p.dim() == 2:
                p.mul_(5)
        # Sharpen the joint attention (q/k RMSNorm weights) and open the modulation gates, so that the text steers
        # the image.
        for name, p in transformer.named_parameters():
            if ".norm_q." in name or ".norm_k." in name or ".norm_added_q." in name or ".norm_added_k." in name:
                p.mul_(2)
            elif "_mod." in name or name.startswith("txt_in."):
                p.mul_(3)
    sched = FlowMatchEulerDiscreteScheduler(**SCHEDULER)
    return dict(scheduler=sched, text_encoder=qwen, tokenizer=tok, transformer=transformer, vae=vae)


def save_pipeline(pipe, path):
    shutil.rmtree(path, ignore_errors=True)
    pipe.save_pretrained(path, safe_serialization=True)
    # The tokenizer as the klein folder has it: what save_pretrained writes would double its size.
    shutil.rmtree(os.path.join(path, "tokenizer"))
    os.makedirs(os.path.join(path, "tokenizer"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(QWEN_TOKENIZER, name), os.path.join(path, "tokenizer", name))


def load_pipeline(cls_name, model, dtype):
    import diffusers

    pipe = getattr(diffusers, cls_name).from_pretrained(os.path.join(MODELS, model), torch_dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


CAT = "a photo of a cat"
FOX = "a red fox in the snow"
LIGHTHOUSE = "a lighthouse on a cliff above a stormy sea, waves crashing, dramatic clouds"
NEGATIVE = "blurry, low quality"

CASES = [
    # name, pipeline class, model, dtype, call arguments
    # No negative prompt: no true CFG (one transformer call a step), whatever true_cfg_scale says.
    ("cat_64x64_s0", "QwenImagePipeline", "qwen-image-tiny", torch.float32,
     dict(prompt=CAT, height=64, width=64, num_inference_steps=3, max_sequence_length=64, seed=0)),
    # The same call with another prompt: the prompt must change the image.
    ("fox_64x64_s0", "QwenImagePipeline", "qwen-image-tiny", torch.float32,
     dict(prompt=FOX, height=64, width=64, num_inference_steps=3, max_sequence_length=64, seed=0)),
    # True CFG: neg + s * (cond - neg), rescaled per token to the cond prediction's norm; non-square.
    # Two images of the prompt.
    ("cfg_48x80_s1", "QwenImagePipeline", "qwen-image-tiny", torch.float32,
     dict(prompt=FOX, negative_prompt=NEGATIVE, true_cfg_scale=4.0, height=48, width=80, num_inference_steps=4,
          num_images_per_prompt=2, max_sequence_length=64, seed=1)),
    # Two prompts of different lengths (the shorter padded, with a mask), the second cut at max_sequence_length
    # (counted after the template's first 34 tokens are dropped), with true CFG. (diffusers 0.42.1 takes one
    # negative prompt per prompt here, not one string for all; and with num_images_per_prompt > 1 it repeats the
    # mask in another order than the embeddings, [m0, m1, m0, m1] against [e0, e0, e1, e1]: Kiln keeps each
    # prompt's mask with its embeddings, so no case combines the two.)
    ("list_cfg_64x64_s2", "QwenImagePipeline", "qwen-image-tiny", torch.float32,
     dict(prompt=[CAT, LIGHTHOUSE], negative_prompt=[" ", "blurry"], true_cfg_scale=2.5, height=64, width=64,
          num_inference_steps=2, max_sequence_length=80, seed=2)),
    ("bf16_cfg_64x64_s1", "QwenImagePipeline", "qwen-image-tiny-bf16", torch.bfloat16,
     dict(prompt=CAT, negative_prompt=NEGATIVE, true_cfg_scale=4.0, height=64, width=64, num_inference_steps=3,
          max_sequence_length=64, seed=1)),
    # QwenImageImg2ImgPipeline resizes the image (ref_a: 72 x 88) to height x width (1024 x 1024 unless given).
    # strength 0.6 of 4 steps: t_start = int(4 - 2.4) = 1, three steps run.
    ("img2img_80x64_s4", "QwenImageImg2ImgPipeline", "qwen-image-tiny", torch.float32,
     dict(prompt=CAT, negative_prompt=NEGATIVE, true_cfg_scale=3.0, image="ref_a", height=80, width=64,
          strength=0.6, num_inference_steps=4, max_sequence_length=64, seed=4)),
    # QwenImageInpaintPipeline: edit.py's hard-edged box mask; strength 0.8 of 4 steps: all four run; after each
    # the kept region is reset to the image latents noised to the next step.
    ("inpaint_80x64_s5", "QwenImageInpaintPipeline", "qwen-image-tiny", torch.float32,
     dict(prompt=FOX, image="ref_a", mask_image="mask_box", height=80, width=64, strength=0.8,
          num_inference_steps=4, max_sequence_length=64, seed=5)),
]
IMAGES = os.path.join(ROOT, "tests", "data", "goldens", "flux2")  # edit.py's input images
MASKS = os.path.join(ROOT, "tests", "data", "goldens", "edit")  # edit.py's masks


def run_case(name, cls_name, model, dtype, args, pipe=None):
    pipe = pipe or load_pipeline(cls_name, model, dtype)
    args = dict(args)
    seed = args.pop("seed")
    prompts = [args["prompt"]] if isinstance(args["prompt"], str) else list(args["prompt"])
    negatives = args.get("negative_prompt")
    cfg = args.get("true_cfg_scale", 4.0) > 1 and negatives is not None
    if negatives is not None:
        negatives = len(prompts) * [negatives] if isinstance(negatives, str) else list(negatives)
    out = {}
    template = pipe.prompt_template_encode
    for i, p in enumerate(prompts):
        out[f"ids_{i}"] = pipe.tokenizer(template.format(p), return_tensors="pt").input_ids.to(torch.int64)
    if cfg:
        for i, p in enumerate(negatives):
            out[f"negative_ids_{i}"] = pipe.tokenizer(template.format(p), return_tensors="pt").input_ids.to(
                torch.int64)
    n = args.get("num_images_per_prompt", 1)
    with torch.no_grad():
        pe, pm = pipe.encode_prompt(prompt=prompts, device=torch.device("cpu"), num_images_per_prompt=n,
                                    max_sequence_length=args["max_sequence_length"])
        out["prompt_embeds"] = pe
        if pm is not None:
            out["prompt_embeds_mask"] = pm.to(torch.int64)
        if cfg:
            npe, npm = pipe.encode_prompt(prompt=negatives, device=torch.device("cpu"), num_images_per_prompt=n,
                                          max_sequence_length=args["max_sequence_length"])
            out["negative_prompt_embeds"] = npe
            if npm is not None:
                out["negative_prompt_embeds_mask"] = npm.to(torch.int64)

    calls, captured = [], {}

    def transformer_hook(module, a, kw, output):
        calls.append(dict(x=kw["hidden_states"].clone(), t=kw["timestep"].clone(),
                          ctx=kw["encoder_hidden_states"].clone(), out=output[0].clone()))

    hooks = [pipe.transformer.register_forward_hook(transformer_hook, with_kwargs=True),
             pipe.vae.decoder.register_forward_hook(lambda m, a, o: captured.update(vae_decoder_in=a[0].clone()))]
    prepare_latents, step = pipe.prepare_latents, pipe.scheduler.step

    def record_prepare_latents(*a, **kw):
        result = prepare_latents(*a, **kw)
        captured["latents_init"] = (result[0] if isinstance(result, tuple) else result).clone()
        return result

    def record_step(model_output, *a, **kw):
        if "noise_pred_step0" not in captured:
            captured["noise_pred_step0"] = model_output.clone()
        return step(model_output, *a, **kw)

    pipe.prepare_latents, pipe.scheduler.step = record_prepare_latents, record_step
    steps = []

    def on_step(p, i, t, kwargs):
        steps.append(kwargs["latents"].clone())
        return kwargs

    call = {k: list(v) if isinstance(v, list) else v for k, v in args.items()}
    if "image" in args:
        call["image"] = Image.open(os.path.join(IMAGES, args["image"] + ".png")).convert("RGB")
    if "mask_image" in args:
        call["mask_image"] = Image.open(os.path.join(MASKS, args["mask_image"] + ".png"))
    with torch.no_grad():
        result = pipe(**call, generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                      callback_on_step_end=on_step)
    for h in hooks:
        h.remove()
    del pipe.prepare_latents, pipe.scheduler.step
    images = result.images

    per_step = 2 if cfg else 1
    assert len(calls) == per_step * len(steps), (len(calls), len(steps))
    out["latents_init"] = captured["latents_init"]
    assert torch.equal(calls[0]["x"], out["latents_init"])
    assert torch.equal(calls[0]["ctx"], out["prompt_embeds"])
    out["transformer_in_t"] = calls[0]["t"]
    out["transformer_out_step0"] = calls[0]["out"]
    if cfg:
        assert torch.equal(calls[1]["ctx"], out["negative_prompt_embeds"])
        out["negative_transformer_out_step0"] = calls[1]["out"]
        pos, neg = calls[0]["out"], calls[1]["out"]
        comb = neg + args["true_cfg_scale"] * (pos - neg)
        expected = comb * (torch.norm(pos, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))
        assert torch.allclose(expected, captured["noise_pred_step0"])
    else:
        assert torch.equal(calls[0]["out"], captured["noise_pred_step0"])
    out["noise_pred_step0"] = captured["noise_pred_step0"]
    out["timesteps"] = pipe.scheduler.timesteps.clone()
    out["sigmas"] = pipe.scheduler.sigmas.clone()
    out["latents_step0"] = steps[0]
    out["latents_final"] = steps[-1]
    out["vae_decoder_in"] = captured["vae_decoder_in"]
    out["image"] = torch.from_numpy(np.ascontiguousarray(images)).float()
    out["image_u8"] = torch.from_numpy((images * 255).round().astype("uint8"))
    meta = dict(args, seed=seed, pipeline=cls_name, model=model, dtype=str(dtype).split(".")[-1], cfg=cfg,
                steps_run=len(steps), template_prompt=template.format(prompts[0]))
    os.makedirs(GOLDENS, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(GOLDENS, name + ".safetensors"),
              metadata=meta_of(meta))
    return out


def main():
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline(**tiny_components())
    save_pipeline(pipe, os.path.join(MODELS, "qwen-image-tiny"))
    pipe.to(torch.bfloat16)
    save_pipeline(pipe, os.path.join(MODELS, "qwen-image-tiny-bf16"))
    shutil.rmtree(GOLDENS, ignore_errors=True)
    results = {}
    for name, cls_name, model, dtype, args in CASES:
        results[name] = run_case(name, cls_name, model, dtype, args)
        print(name, "done")
    a, b = results["cat_64x64_s0"]["image_u8"].float(), results["fox_64x64_s0"]["image_u8"].float()
    print("prompt changes the image by", (a - b).abs().mean().item(), "levels on average")
    assert (a - b).abs().mean() > 3, "the tiny model barely listens to the prompt"
    json.dump({"prompt_sensitivity_levels": round((a - b).abs().mean().item(), 2)},
              open(os.path.join(GOLDENS, "summary.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
