#!/usr/bin/env python3
"""Builds a tiny, randomly initialised Z-Image pipeline from diffusers' and transformers' real classes, saves it in
diffusers layout, and dumps reference tensors for every stage of ZImagePipeline, ZImageImg2ImgPipeline and
ZImageInpaintPipeline for Kiln's parity tests (tools/goldens/z_image_notes.md explains what each stage does and where
diffusers does it).

Outputs (committed; CI never runs this script):
  tests/data/models/z-image-tiny/        ZImagePipeline, float32: ZImageTransformer2DModel (dim 64, 2 heads of 32, 2
                                         main layers, 1 noise + 1 context refiner), a 3-layer Qwen3ForCausalLM (the
                                         pipeline reads hidden_states[-2]) with the tiny Qwen tokenizer of
                                         tests/data/models/flux2-tiny-text/klein/tokenizer, chroma.py's tiny
                                         AutoencoderKL (16 latent channels, FLUX.1's scaling/shift), and
                                         Z-Image-Turbo's FlowMatchEulerDiscreteScheduler (shift 3, no dynamic shift)
  tests/data/models/z-image-tiny-bf16/   the same weights stored in bfloat16
  tests/data/goldens/z_image/<case>.safetensors   the stages of one pipeline call; the call's arguments are in the
      metadata (strings as they are, every other value as JSON: a prompt list is '["...", "..."]'; `image` names a
      png of tests/data/goldens/flux2/, `mask_image` one of tests/data/goldens/edit/), plus `chat_prompt` (the first
      prompt as the chat template renders it) and, with guidance, `negative_chat_prompt`. Tensors:
        qwen_ids / qwen_mask [B, S]      the chat-templated prompts tokenized as _encode_prompt does (padding to
                                         max_sequence_length, truncation), one row per prompt; checked against what
                                         the text encoder received. negative_qwen_ids / negative_qwen_mask with CFG.
        prompt_embeds_<i> [len_i, H]     encode_prompt's list: hidden_states[-2] at the prompt's valid tokens, one
                                         per prompt (before the num_images_per_prompt repetition);
                                         negative_prompt_embeds_<i> with CFG
        latents_init [B, 16, h, w] f32   what prepare_latents returned: the noise (text-to-image), the noised image
                                         latents (img2img, inpaint)
        sigmas, timesteps                the scheduler's whole schedule after set_timesteps; timesteps_run: the t of
                                         each step the loop ran
        transformer_in_x [N,16,1,h,w]    the first transformer call's list of latents, stacked; transformer_in_t [N]
                                         its t ((1000 - timestep) / 1000); transformer_out_step0 [N,16,1,h,w] its
                                         returned list, stacked. With CFG N = 2B: the positive items, then the
                                         negative ones.
        t_embed_step0 [N, 64]            transformer.t_embedder's output in the first call
        cfg_applied [steps] int64        1 where the step ran guidance (cfg_truncation turns it off per step)
        noise_pred_step0 [B,16,h,w] f32  what the scheduler's first step got: -(pos + g * (pos - neg)), renormalised
                                         when cfg_normalization
        latents_step0, latents_final     the latents after the first and the last step (callback_on_step_end)
        vae_decoder_in                   the VAE decoder's input
        image [B, H, W, 3] float, image_u8 ((image * 255).round(), what the PIL path saves)
      img2img / inpaint add init_image (image_processor.preprocess(image): at the image's own size, rounded down to
      multiples of 16, NOT at height x width), image_latents (the VAE posterior sample, shifted and scaled, drawn
      from the call's generator before the noise), noise, latent_timestep (scale_noise's inputs); inpaint adds
      mask_condition (mask_processor.preprocess(mask_image, height, width), [B, 1, H, W] in {0, 1}), masked_image
      (init_image * (mask_condition < 0.5)), mask (mask_condition resized to the latent grid, nearest) and
      masked_image_latents (the masked image's posterior sample, drawn after the noise; diffusers computes it and
      never uses it).

Usage: python3 tools/goldens/z_image.py   (torch, diffusers 0.42.1, transformers 5, safetensors, pillow from pip)
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chroma import first_call, folder_size, meta_of, save_file  # noqa: E402  (the shared golden-writing helpers)
import flux2_text  # noqa: E402  (make_qwen: the tiny Qwen3)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "z_image")
QWEN_TOKENIZER = os.path.join(MODELS, "flux2-tiny-text", "klein", "tokenizer")
IMAGES = os.path.join(ROOT, "tests", "data", "goldens", "flux2")  # edit.py's input images
MASKS = os.path.join(ROOT, "tests", "data", "goldens", "edit")  # edit.py's masks

TEXT_HIDDEN = 48  # the tiny Qwen3's hidden size = the transformer's cap_feat_dim
# dim 64 = 2 heads of 32 = sum(axes_dims); the three RoPE axes have different sizes, so a mis-split shows.
TINY_TRANSFORMER = dict(
    all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=64, n_layers=2, n_refiner_layers=1, n_heads=2,
    n_kv_heads=2, norm_eps=1e-5, qk_norm=True, cap_feat_dim=TEXT_HIDDEN, rope_theta=256.0, t_scale=1000.0,
    axes_dims=[8, 12, 12], axes_lens=[256, 64, 64])
# Z-Image-Turbo's scheduler/scheduler_config.json (and Z-Image's): a static shift of 3, no resolution dependence (the
# pipeline computes a mu and passes it, and the scheduler ignores it).
SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)

# The real Z-Image-Turbo (Tongyi-MAI/Z-Image-Turbo, transformer/config.json): see z_image_notes.md.
REAL_TRANSFORMER = dict(
    _class_name="ZImageTransformer2DModel", all_patch_size=[2], all_f_patch_size=[1], in_channels=16, dim=3840,
    n_layers=30, n_refiner_layers=2, n_heads=30, n_kv_heads=30, norm_eps=1e-5, qk_norm=True, cap_feat_dim=2560,
    rope_theta=256.0, t_scale=1000.0, axes_dims=[32, 48, 48], axes_lens=[1536, 512, 512])


def tiny_components():
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImageTransformer2DModel
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    # flux2_text's tiny Qwen3 (seeded, its own large random init), 3 layers: hidden_states[-2] is then the second
    # layer's raw output and the third layer (and the final norm) never matter, as in the real 36-layer Qwen3-4B.
    qwen = flux2_text.make_qwen(len(tok), num_hidden_layers=3, hidden_size=TEXT_HIDDEN)
    torch.manual_seed(2)
    transformer = ZImageTransformer2DModel(**TINY_TRANSFORMER)
    torch.manual_seed(3)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(8, 16, 16, 16), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=4,
        act_fn="silu", use_quant_conv=False, use_post_quant_conv=False, scaling_factor=0.3611, shift_factor=0.1159,
        sample_size=64, mid_block_add_attention=True, force_upcast=True)
    # Random init leaves some weights at exactly zero/one (norm weights, biases, the pad tokens); perturb everything
    # so that a wrong wiring cannot hide behind an identity parameter.
    torch.manual_seed(4)
    for model in (qwen, transformer, vae):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    with torch.no_grad():
        # The pad tokens replace the padding rows of the image and caption sequences: large, so that padding with
        # zeros, with the last token repeated (what _pad_with_ids puts there first) or with the other pad token shows.
        transformer.x_pad_token.copy_(torch.randn_like(transformer.x_pad_token) * 0.5)
        transformer.cap_pad_token.copy_(torch.randn_like(transformer.cap_pad_token) * 0.5)
        # A random model barely listens to the prompt (two prompts: 6 levels of mean difference): the image tokens'
        # attention spreads evenly over the caption, and the attention's share of the residual is small. Sharpen
        # the attention (q/k RMSNorm weights x2), strengthen the caption (cap_embedder's Linear x3) and, in the main
        # layers where image and caption meet, the attention output (attention_norm2 x3) and the modulation (adaLN
        # x3: the tanh gates open): 17 levels. (q/k x4 in the main layers gives 21, but bf16 then strays 9 levels
        # from float32 instead of 2.)
        for name, p in transformer.named_parameters():
            main = name.startswith("layers.")
            if ".norm_q." in name or ".norm_k." in name:
                p.mul_(2)
            elif name.startswith("cap_embedder.1."):
                p.mul_(3)
            elif main and ".attention_norm2." in name:
                p.mul_(3)
            elif main and ".adaLN_modulation." in name:
                p.mul_(3)
    sched = FlowMatchEulerDiscreteScheduler(**SCHEDULER)
    return dict(scheduler=sched, text_encoder=qwen, tokenizer=tok, transformer=transformer, vae=vae)


def save_pipeline(pipe, path):
    shutil.rmtree(path, ignore_errors=True)
    pipe.save_pretrained(path, safe_serialization=True)
    # The tokenizer as the klein folder has it (tokenizer.json, and tokenizer_config.json with Qwen3's chat template
    # inside): what save_pretrained writes would double the tokenizer's size.
    shutil.rmtree(os.path.join(path, "tokenizer"))
    os.makedirs(os.path.join(path, "tokenizer"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(QWEN_TOKENIZER, name), os.path.join(path, "tokenizer", name))


def load_pipeline(cls_name, model, dtype):
    import diffusers

    pipe = getattr(diffusers, cls_name).from_pretrained(os.path.join(MODELS, model), torch_dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def chat(tokenizer, prompt):
    """_encode_prompt's template: one user message, the generation prompt, enable_thinking=True."""
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=True)


def padded(n):
    """A caption of n tokens in the transformer: padded to a multiple of 32 (SEQ_MULTI_OF)."""
    return n + (-n) % 32


CAT = "a photo of a cat"
FOX = "a red fox in the snow"
# 37 tokens once templated: cut at 32, inside the template's "<|im_start|>assistant\n" tail.
LIGHTHOUSE = "a lighthouse on a cliff above a stormy sea, waves crashing, dramatic clouds"
NEGATIVE = "blurry, low quality"  # 33 tokens once templated (the tiny vocabulary spells most words in pieces)

CASES = [
    # name, pipeline class, model, dtype, call arguments
    # Z-Image-Turbo's way: guidance_scale 0 (no CFG: one transformer call a step, no negative prompt encoded).
    ("turbo_cat_64x64_s0", "ZImagePipeline", "z-image-tiny", torch.float32,
     dict(prompt=CAT, height=64, width=64, num_inference_steps=3, guidance_scale=0.0, max_sequence_length=32,
          seed=0)),
    # The same call with another prompt: the prompt must change the image.
    ("turbo_fox_64x64_s0", "ZImagePipeline", "z-image-tiny", torch.float32,
     dict(prompt=FOX, height=64, width=64, num_inference_steps=3, guidance_scale=0.0, max_sequence_length=32,
          seed=0)),
    # Guidance (any guidance_scale > 0 in Z-Image): pos + g * (pos - neg). max_sequence_length 64 so that the
    # negative prompt (33 tokens: 64 once padded) and the positive one (22: 32 once padded) differ in padded length:
    # only then does the transformer build its batch-level key mask (context refiner and main layers).
    ("cfg_cat_64x64_s1", "ZImagePipeline", "z-image-tiny", torch.float32,
     dict(prompt=CAT, negative_prompt=NEGATIVE, height=64, width=64, num_inference_steps=3, guidance_scale=4.0,
          max_sequence_length=64, seed=1)),
    # Non-square, 3 x 5 = 15 image tokens padded to 32; cfg_normalization clamps |pred| to |pos|; cfg_truncation
    # 0.2 turns guidance off where (1000 - t) / 1000 > 0.2: t = 1000, 900, 750, 500 gives 0, 0.1, 0.25, 0.5, so
    # steps 0-1 run two transformer items per image and steps 2-3 one.
    ("cfg_norm_trunc_48x80_s2", "ZImagePipeline", "z-image-tiny", torch.float32,
     dict(prompt=FOX, negative_prompt="blurry", height=48, width=80, num_inference_steps=4, guidance_scale=3.0,
          cfg_normalization=True, cfg_truncation=0.2, max_sequence_length=32, seed=2)),
    # Two prompts of different lengths, the second one cut at max_sequence_length, two images each.
    ("list_64x64_s3", "ZImagePipeline", "z-image-tiny", torch.float32,
     dict(prompt=[CAT, LIGHTHOUSE], height=64, width=64, num_inference_steps=3, guidance_scale=0.0,
          num_images_per_prompt=2, max_sequence_length=32, seed=3)),
    ("bf16_cat_64x64_s0", "ZImagePipeline", "z-image-tiny-bf16", torch.bfloat16,
     dict(prompt=CAT, height=64, width=64, num_inference_steps=3, guidance_scale=0.0, max_sequence_length=32,
          seed=0)),
    # ZImageImg2ImgPipeline preprocesses the image at ITS OWN size (ref_a: 72 x 88 -> 64 x 80), so height x width
    # must be that size (another one fails in scale_noise). strength 0.6 of 4 steps: t_start = int(4 - 2.4) = 1,
    # three steps run.
    ("img2img_80x64_s4", "ZImageImg2ImgPipeline", "z-image-tiny", torch.float32,
     dict(prompt=CAT, image="ref_a", height=80, width=64, strength=0.6, num_inference_steps=4, guidance_scale=0.0,
          max_sequence_length=32, seed=4)),
    # ZImageInpaintPipeline: edit.py's hard-edged box mask (72 x 88, as ref_a), with guidance. strength 0.8 of 4
    # steps: t_start = int(4 - 3.2) = 0, all four steps run (the first from pure noise); after every step the kept
    # region is reset to the image latents noised to the next step's sigma (clean after the last step).
    ("inpaint_80x64_s5", "ZImageInpaintPipeline", "z-image-tiny", torch.float32,
     dict(prompt=FOX, negative_prompt="blurry", image="ref_a", mask_image="mask_box", height=80, width=64,
          strength=0.8, num_inference_steps=4, guidance_scale=2.0, max_sequence_length=32, seed=5)),
]


def run_case(name, cls_name, model, dtype, args, pipe=None):
    """One pipeline call and its stages. `pipe`: an already loaded pipeline."""
    pipe = pipe or load_pipeline(cls_name, model, dtype)
    args = dict(args)
    seed = args.pop("seed")
    # _encode_prompt writes the templated strings INTO the list it is given: give the pipeline copies.
    call = {k: list(v) if isinstance(v, list) else v for k, v in args.items()}
    if "image" in args:
        call["image"] = Image.open(os.path.join(IMAGES, args["image"] + ".png")).convert("RGB")
    if "mask_image" in args:
        call["mask_image"] = Image.open(os.path.join(MASKS, args["mask_image"] + ".png"))
    prompts = [args["prompt"]] if isinstance(args["prompt"], str) else list(args["prompt"])
    n = args.get("num_images_per_prompt", 1)
    batch = len(prompts) * n
    max_seq = args["max_sequence_length"]
    cfg = args["guidance_scale"] > 0  # ZImagePipeline.do_classifier_free_guidance
    inpaint = "mask_image" in args
    out = {}

    def tokenize(texts):
        t = pipe.tokenizer([chat(pipe.tokenizer, p) for p in texts], padding="max_length", max_length=max_seq,
                           truncation=True, return_tensors="pt")
        return t.input_ids.to(torch.int64), t.attention_mask.to(torch.int64)

    out["qwen_ids"], out["qwen_mask"] = tokenize(prompts)
    negatives = None
    if cfg:
        negatives = args.get("negative_prompt")
        negatives = [""] * len(prompts) if negatives is None else negatives
        negatives = len(prompts) * [negatives] if isinstance(negatives, str) else list(negatives)
        out["negative_qwen_ids"], out["negative_qwen_mask"] = tokenize(negatives)
    with torch.no_grad():
        pe, npe = pipe.encode_prompt(prompt=list(prompts), device=torch.device("cpu"), do_classifier_free_guidance=cfg,
                                     negative_prompt=None if negatives is None else list(negatives),
                                     max_sequence_length=max_seq)
    assert len(pe) == len(prompts)
    for i, e in enumerate(pe):
        assert e.shape[0] == int(out["qwen_mask"][i].sum())
        out[f"prompt_embeds_{i}"] = e
    if cfg:
        for i, e in enumerate(npe):
            assert e.shape[0] == int(out["negative_qwen_mask"][i].sum())
            out[f"negative_prompt_embeds_{i}"] = e

    calls, encoder_inputs, captured = [], [], {}

    def transformer_hook(module, a, kw, output):
        x, t, caps = a if len(a) == 3 else (kw["x"], kw["t"], kw["cap_feats"])
        calls.append(dict(x=torch.stack([xi.clone() for xi in x]), t=t.clone(), caps=[c.clone() for c in caps],
                          out=torch.stack([o.clone() for o in output[0]])))

    def encoder_hook(module, a, kw):
        encoder_inputs.append((kw["input_ids"].clone(), kw["attention_mask"].clone()))

    hooks = [
        pipe.transformer.register_forward_hook(transformer_hook, with_kwargs=True),
        pipe.text_encoder.register_forward_pre_hook(encoder_hook, with_kwargs=True),
        # A forward hook's return value replaces the module's output: these must return None.
        pipe.transformer.t_embedder.register_forward_hook(lambda m, a, o: first_call(captured, "t_embed_step0", o)),
        pipe.vae.decoder.register_forward_hook(lambda m, a, o: captured.update(vae_decoder_in=a[0].clone())),
    ]
    prepare_latents, scale_noise, step = pipe.prepare_latents, pipe.scheduler.scale_noise, pipe.scheduler.step

    def record_prepare_latents(*a, **kw):
        result = prepare_latents(*a, **kw)
        captured["latents_init"] = (result[0] if isinstance(result, tuple) else result).clone()
        return result

    def record_scale_noise(sample, timestep, noise):
        if "image_latents" not in captured:  # inpaint calls it again after every step (the blend)
            captured.update(image_latents=sample.clone(), latent_timestep=timestep.clone(), noise=noise.clone())
        return scale_noise(sample, timestep, noise)

    def record_step(model_output, *a, **kw):
        if "noise_pred_step0" not in captured:
            captured["noise_pred_step0"] = model_output.clone()
        return step(model_output, *a, **kw)

    pipe.prepare_latents, pipe.scheduler.scale_noise, pipe.scheduler.step = (
        record_prepare_latents, record_scale_noise, record_step)
    steps, ts, masks = [], [], []

    def on_step(p, i, t, kwargs):
        steps.append(kwargs["latents"].clone())
        ts.append(t.clone())
        if inpaint:
            masks.append((kwargs["mask"].clone(), kwargs["masked_image_latents"].clone()))
        return kwargs

    inputs = ["latents", "mask", "masked_image_latents"] if inpaint else ["latents"]
    with torch.no_grad():
        result = pipe(**call, generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                      callback_on_step_end=on_step, callback_on_step_end_tensor_inputs=inputs)
    for h in hooks:
        h.remove()
    del pipe.prepare_latents, pipe.scheduler.scale_noise, pipe.scheduler.step
    images = result.images

    # The text encoder saw exactly the ids and masks recorded: the prompts', then (with guidance) the negatives'.
    assert len(encoder_inputs) == (2 if cfg else 1), len(encoder_inputs)
    assert torch.equal(encoder_inputs[0][0], out["qwen_ids"])
    assert torch.equal(encoder_inputs[0][1].long(), out["qwen_mask"])
    if cfg:
        assert torch.equal(encoder_inputs[1][0], out["negative_qwen_ids"])
        assert torch.equal(encoder_inputs[1][1].long(), out["negative_qwen_mask"])

    assert len(calls) == len(steps), (len(calls), len(steps))
    cfg_applied = [int(c["x"].shape[0] == 2 * batch) for c in calls]
    assert all(c["x"].shape[0] in (batch, 2 * batch) for c in calls)
    if not cfg:
        assert not any(cfg_applied)
    first = calls[0]
    # The first call's captions: each prompt's embeddings, repeated num_images_per_prompt times, then the negatives.
    expected = [e for e in pe for _ in range(n)] + ([e for e in npe for _ in range(n)] if cfg_applied[0] else [])
    assert len(first["caps"]) == len(expected) and all(torch.equal(a, b) for a, b in zip(first["caps"], expected))
    out["latents_init"] = captured["latents_init"]
    assert out["latents_init"].dtype == torch.float32 or dtype != torch.float32
    x0 = out["latents_init"].to(first["x"].dtype).unsqueeze(2)
    assert torch.equal(first["x"], torch.cat([x0, x0]) if cfg_applied[0] else x0)
    out["transformer_in_x"] = first["x"]
    out["transformer_in_t"] = first["t"]
    out["transformer_out_step0"] = first["out"]
    out["t_embed_step0"] = captured["t_embed_step0"]
    out["cfg_applied"] = torch.tensor(cfg_applied, dtype=torch.int64)
    out["noise_pred_step0"] = captured["noise_pred_step0"]
    out["timesteps"] = pipe.scheduler.timesteps.clone()
    out["sigmas"] = pipe.scheduler.sigmas.clone()
    out["timesteps_run"] = torch.stack(ts)
    assert torch.allclose(first["t"], (1000 - out["timesteps_run"][0]) / 1000 * torch.ones_like(first["t"]))
    out["latents_step0"] = steps[0]
    out["latents_final"] = steps[-1]
    out["vae_decoder_in"] = captured["vae_decoder_in"]
    out["image"] = torch.from_numpy(np.ascontiguousarray(images)).float()
    out["image_u8"] = torch.from_numpy((images * 255).round().astype("uint8"))

    # The guidance as the pipeline applies it, from the first call's outputs.
    pos = first["out"][:batch].float().squeeze(2)
    if cfg_applied[0]:
        neg = first["out"][batch:].float().squeeze(2)
        pred = pos + args["guidance_scale"] * (pos - neg)
        renormed = []
        if args.get("cfg_normalization"):
            for j in range(batch):
                limit = torch.linalg.vector_norm(pos[j]) * float(args["cfg_normalization"])
                norm = torch.linalg.vector_norm(pred[j])
                renormed.append(bool(norm > limit))
                if norm > limit:
                    pred[j] = pred[j] * (limit / norm)
            assert all(renormed), "cfg_normalization did not clamp the first step's prediction"
    else:
        pred = pos
    assert torch.allclose(-pred, out["noise_pred_step0"], rtol=1e-5, atol=1e-5)

    meta = dict(args, seed=seed, pipeline=cls_name, model=model, dtype=str(dtype).split(".")[-1], cfg=cfg,
                steps_run=len(steps), chat_prompt=chat(pipe.tokenizer, prompts[0]))
    if cfg:
        meta["negative_chat_prompt"] = chat(pipe.tokenizer, negatives[0])
    h, w = args["height"], args["width"]
    if "image" in args:
        out["init_image"] = pipe.image_processor.preprocess(call["image"]).float()
        assert tuple(out["init_image"].shape[-2:]) == (h, w), "img2img/inpaint preprocess at the image's own size"
        out["image_latents"] = captured["image_latents"]
        out["noise"] = captured["noise"]
        out["latent_timestep"] = captured["latent_timestep"]
        # The generator draws the VAE's posterior sample first, then the noise (then, inpaint, the masked image's
        # posterior sample).
        g = torch.Generator("cpu").manual_seed(seed)
        with torch.no_grad():
            sample = pipe.vae.encode(out["init_image"].to(dtype)).latent_dist.sample(g)
        vae = pipe.vae.config
        assert torch.equal((sample - vae.shift_factor) * vae.scaling_factor, out["image_latents"])
        noise = torch.randn(out["noise"].shape, generator=g, dtype=out["noise"].dtype)
        assert torch.equal(noise, out["noise"])
        t_start = out["timesteps"].tolist().index(out["timesteps_run"][0].item())
        sigma = out["sigmas"][t_start]
        assert torch.allclose(sigma * noise + (1 - sigma) * out["image_latents"], out["latents_init"], atol=1e-6)
        if inpaint:
            out["mask_condition"] = pipe.mask_processor.preprocess(call["mask_image"], height=h, width=w)
            out["masked_image"] = out["init_image"] * (out["mask_condition"] < 0.5)
            out["mask"], out["masked_image_latents"] = masks[0]
            assert all(torch.equal(m, out["mask"]) for m, _ in masks)
            with torch.no_grad():
                sample = pipe.vae.encode(out["masked_image"].to(dtype)).latent_dist.sample(g)
            assert torch.equal((sample - vae.shift_factor) * vae.scaling_factor, out["masked_image_latents"])
            lh, lw = out["latents_init"].shape[-2:]
            nearest = torch.nn.functional.interpolate(out["mask_condition"], size=(lh, lw), mode="nearest")
            assert torch.equal(nearest.repeat(batch, 1, 1, 1), out["mask"])
    else:
        # The initial noise, drawn exactly as the pipeline draws it.
        g = torch.Generator("cpu").manual_seed(seed)
        init = pipe.prepare_latents(batch, pipe.transformer.in_channels, h, w, torch.float32, torch.device("cpu"), g)
        assert torch.equal(init, out["latents_init"])
    return {k: v.contiguous() for k, v in out.items()}, meta_of(meta), pipe


def pad_token_effects(transformer):
    """The first transformer call of cfg_cat_64x64_s1 again from its recorded inputs (it must reproduce), then with
    each pad token zeroed: both must change the output (16 image pad rows; 10 and 31 caption pad rows)."""
    from safetensors.torch import load_file

    g = load_file(os.path.join(GOLDENS, "cfg_cat_64x64_s1.safetensors"))
    caps = [g["prompt_embeds_0"], g["negative_prompt_embeds_0"]]

    def first_call_out():
        with torch.no_grad():
            out = transformer(list(g["transformer_in_x"].unbind(0)), g["transformer_in_t"], caps, return_dict=False)[0]
        return torch.stack(out)

    want = g["transformer_out_step0"]
    assert torch.allclose(first_call_out(), want, rtol=1e-5, atol=1e-5)
    for name in ("x_pad_token", "cap_pad_token"):
        token = getattr(transformer, name)
        kept = token.detach().clone()
        with torch.no_grad():
            token.zero_()
            d = (first_call_out() - want).abs().max().item()
            token.copy_(kept)
        print(f"{name} zeroed: the first transformer output moves by up to {d:.3f} (max |out| {want.abs().max():.2f})")
        assert d > 0.05, name


def main():
    import diffusers
    from diffusers import ZImagePipeline

    assert diffusers.__version__ == "0.42.1", diffusers.__version__
    torch.set_num_threads(2)
    os.makedirs(GOLDENS, exist_ok=True)

    f32 = ZImagePipeline(**tiny_components())
    save_pipeline(f32, os.path.join(MODELS, "z-image-tiny"))
    bf16 = ZImagePipeline(**tiny_components()).to(torch.bfloat16)
    save_pipeline(bf16, os.path.join(MODELS, "z-image-tiny-bf16"))
    for folder in ("z-image-tiny", "z-image-tiny-bf16"):
        size = folder_size(os.path.join(MODELS, folder))
        print(f"{folder}: {size / 1e6:.2f} MB")
    # The transformer's timestep MLP alone is 256 x 1024 + 1024 x 64 weights (mid_size 1024 is hard-coded,
    # transformer_z_image.py:440): 1.3 MB in float32, whatever the model's width.
    assert folder_size(os.path.join(MODELS, "z-image-tiny")) < 3.3e6
    assert folder_size(os.path.join(MODELS, "z-image-tiny-bf16")) < 1.7e6

    # The saved folder must reproduce the in-memory pipeline and tokenize (chat template included) as the klein
    # tokenizer does.
    reloaded = load_pipeline("ZImagePipeline", "z-image-tiny", torch.float32)
    for p in (CAT, FOX, LIGHTHOUSE, NEGATIVE, ""):
        assert chat(f32.tokenizer, p) == chat(reloaded.tokenizer, p), p
        assert f32.tokenizer(chat(f32.tokenizer, p)).input_ids == reloaded.tokenizer(chat(f32.tokenizer, p)).input_ids
    f32.set_progress_bar_config(disable=True)
    probe = dict(prompt=FOX, negative_prompt=NEGATIVE, height=48, width=64, num_inference_steps=2,
                 guidance_scale=3.0, max_sequence_length=40, seed=5)
    a, _, _ = run_case("probe", "ZImagePipeline", "z-image-tiny", torch.float32, probe, pipe=f32)
    b, _, _ = run_case("probe", "ZImagePipeline", "z-image-tiny", torch.float32, probe, pipe=reloaded)
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), rtol=1e-5, atol=1e-5), f"reloaded pipeline differs: {k}"

    images, shapes = {}, {}
    for case in CASES:
        name = case[0]
        tensors, meta, _ = run_case(*case)
        images[name] = tensors["image_u8"]
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(GOLDENS, name + ".safetensors"),
                  metadata=meta)
        shapes[name] = {k: (str(v.dtype).split(".")[-1], tuple(v.shape)) for k, v in tensors.items()}
        print("wrote", name, {k: tuple(v.shape) for k, v in tensors.items()})
        print("   cfg_applied", tensors["cfg_applied"].tolist(), "timesteps_run", tensors["timesteps_run"].tolist())

    # The cases exercise what they say they do.
    meta3 = dict(CASES[2][4])
    with torch.no_grad():
        tok = reloaded.tokenizer
        n_pos = len(tok(chat(tok, CAT)).input_ids)
        n_neg = len(tok(chat(tok, NEGATIVE)).input_ids)
        n_long = len(tok(chat(tok, LIGHTHOUSE)).input_ids)
    assert padded(n_pos) != padded(min(n_neg, meta3["max_sequence_length"])), "cfg case: no batch-level mask"
    assert n_long > 32, "list case: the long prompt is not truncated"
    print(f"tokens: cat {n_pos}, negative {n_neg}, lighthouse {n_long} (max_sequence_length 32 cuts it)")

    pad_token_effects(reloaded.transformer)

    cat, fox = images["turbo_cat_64x64_s0"].float(), images["turbo_fox_64x64_s0"].float()
    two = (cat - fox).abs().mean().item()
    print(f"two prompts, same seed: mean level difference {two:.1f}")
    assert two > 5, "the prompt barely changes the image"
    bf = (cat - images["bf16_cat_64x64_s0"].float()).abs().mean().item()
    print(f"bf16 vs f32, same call: mean level difference {bf:.2f}")
    cfg = (cat - images["cfg_cat_64x64_s1"].float()).abs().mean().item()
    print(f"cfg (seed 1) vs turbo (seed 0), same prompt: mean level difference {cfg:.1f}")
    for name in sorted(os.listdir(GOLDENS)):
        print(f"  {name}: {os.path.getsize(os.path.join(GOLDENS, name))} bytes")


if __name__ == "__main__":
    main()
