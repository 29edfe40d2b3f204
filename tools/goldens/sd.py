#!/usr/bin/env python3
"""Builds tiny, randomly initialised Stable Diffusion 1.5 and SDXL pipelines from diffusers' and transformers' real
classes, saves them in diffusers layout, and dumps reference tensors for every stage of StableDiffusionPipeline,
StableDiffusionImg2ImgPipeline, StableDiffusionInpaintPipeline, StableDiffusionXLPipeline,
StableDiffusionXLImg2ImgPipeline and StableDiffusionXLInpaintPipeline for Kiln's parity tests
(tools/goldens/sd_notes.md says where diffusers does each stage and lists the quirks to reproduce).

Outputs (committed; CI never runs this script):
  tests/data/models/sd15-tiny/       StableDiffusionPipeline, float32 (safety_checker / feature_extractor None):
      unet          UNet2DConditionModel as SD1.5's: down CrossAttn, CrossAttn, Down; up Up, CrossAttn, CrossAttn;
                    block_out_channels (16, 24, 32) (see SIZE below), layers_per_block 2, norm_num_groups 8,
                    attention_head_dim 4 (diffusers' legacy meaning: 4 HEADS per block, head dims 4 / 6 / 8),
                    cross_attention_dim 32, use_linear_projection False (1x1 conv proj_in/proj_out), sample_size 16
      text_encoder  CLIPTextModel: hidden 32, 3 layers, 4 heads, intermediate 48, quick_gelu, 77 positions
      tokenizer     the tiny CLIP BPE of tests/data/models/sd3-tiny-medium/tokenizer (1514 ids, pads with
                    <|endoftext|> as SD1.5's does)
      vae           AutoencoderKL: latent 4, block_out_channels (8, 16) (vae_scale_factor 2), layers_per_block 1,
                    norm_num_groups 4, quant_conv / post_quant_conv (as SD's VAE), scaling_factor 0.18215
      scheduler     PNDMScheduler; scheduler_config.json is SD1.5's file, key for key
  tests/data/models/sdxl-tiny/       StableDiffusionXLPipeline, float32, force_zeros_for_empty_prompt true:
      unet          as SDXL base's: down Down, CrossAttn, CrossAttn; up CrossAttn, CrossAttn, Up; (16, 24, 32),
                    layers_per_block 2, norm_num_groups 8, attention_head_dim (2, 4, 4) (heads per block; the mid
                    block takes the last), transformer_layers_per_block (1, 2, 2) (mid block: 2),
                    use_linear_projection True, cross_attention_dim 64 (te1 32 + te2 32), addition_embed_type
                    "text_time", addition_time_embed_dim 8, projection_class_embeddings_input_dim 6 * 8 + 24 = 72
      text_encoder    CLIPTextModel (hidden 32, 3 layers, quick_gelu: CLIP-L's role)
      text_encoder_2  CLIPTextModelWithProjection (hidden 32, 2 layers, gelu, projection_dim 24: bigG's role)
      tokenizer / tokenizer_2   sd3-tiny-medium's tokenizer (pad <|endoftext|>) / tokenizer_2 (pad "!" = id 0)
      vae           as sd15-tiny's with scaling_factor 0.13025, force_upcast true
      scheduler     EulerDiscreteScheduler; scheduler_config.json is SDXL base's file, key for key
  tests/data/models/sd15-tiny-bf16/, sdxl-tiny-bf16/   the same weights stored in bfloat16
  SIZE: UNet channels (32, 48, 64) and a (16, 32) VAE would make the four folders ~30 MB (the SDXL UNet alone
  2.85M parameters). Channels (16, 24, 32) and a (8, 16) VAE keep every block type, layer
  count, head count and transformer depth and the distinct widths per level, at a third of the size.
  Every GroupNorm / LayerNorm has weight 1 + 0.2 * randn and bias 0.1 * randn, and every parameter got 0.05 * randn
  more (a wrong wiring cannot hide behind an identity norm or a zero bias).

  tests/data/goldens/sd/<case>.safetensors   the stages of one pipeline call. The call's arguments are in the
      metadata (strings as they are, every other value as JSON: a prompt list is '["...", "..."]', a size
      '[96, 128]'; `image` names a png of tests/data/goldens/flux2/, `mask_image` one of tests/data/goldens/edit/),
      plus pipeline, model, dtype, seed (the call's generator: torch.Generator("cpu").manual_seed(seed)), cfg,
      steps_run (UNet calls), scheduler (the class that ran) and scheduler_config (its whole config as JSON, the
      private "_" keys left out: for a swapped sampler what from_config made of the folder's config). Tensors
      (B = prompts * num_images_per_prompt; with CFG the UNet batch is 2B: the B negatives first, then the B
      positives; bf16 cases keep bf16 tensors):
        text_input_ids [P, 77] int64     the prompts tokenized by `tokenizer` (padding max_length 77, truncation),
                                         checked against what text_encoder received; SDXL adds text_input_ids_2
                                         (tokenizer_2, prompt_2 or prompt); negative_text_input_ids(_2) [P, 77]
                                         when negatives were encoded (not for SDXL's zeros)
        prompt_embeds [B, 77, D]         encode_prompt's output (already repeated num_images_per_prompt times,
                                         prompt-major); negative_prompt_embeds with CFG. SD1.5: last_hidden_state
                                         (final LayerNorm applied), D 32; clip_skip k: hidden_states[-(k+1)] then
                                         final_layer_norm, for the POSITIVE prompt only. SDXL: concat(te1
                                         hidden_states[-2], te2 hidden_states[-2]) (no final norm), D 64
        pooled_prompt_embeds [B, 24]     SDXL: te2's text_embeds (projection of the final-normed eos token);
                                         negative_pooled_prompt_embeds with CFG (zeros when negative_prompt is None)
        add_time_ids [2B or B, 6]        SDXL: added_cond_kwargs["time_ids"] as the UNet got it (first call)
        unet_text_embeds_step0           SDXL: added_cond_kwargs["text_embeds"] as the UNet got it
        timesteps                        scheduler.timesteps after set_timesteps (the whole schedule; PNDM repeats
                                         one); sigmas where the scheduler has them; timesteps_run: the t of every
                                         UNet call the loop made
        latents_init [B, 4, h, w]        what prepare_latents returned (noise * init_noise_sigma; img2img / inpaint
                                         with strength < 1: the noised image latents)
        unet_in_step0 [2B or B, 4, h, w] the first UNet call's sample (after the CFG concat and scale_model_input);
                                         unet_t_step0 [1] its timestep (the scheduler's dtype: int64 for PNDM /
                                         DDIM / DPM, float32 for Euler); unet_encoder_hidden_states_step0 its context;
                                         unet_out_step0 its raw output
        temb_step0 [2B or B, 64]         the emb every resnet gets: time_embedding(time_proj(t)) (+ SDXL's
                                         add_embedding(concat(text_embeds, add_time_proj(time_ids)))), before the
                                         resnets' own SiLU (the UNet's time_embed_act is None)
        down_block_res_samples_step0_<i> the skip tensors of the first UNet call in the order the UNet stores them
                                         (conv_in's output, then each down block's resnet/attention outputs and
                                         its downsampler's); mid_block_out_step0 the mid block's output. Only in
                                         the cases marked INTERNALS (they are large).
        noise_pred_step0                 what the scheduler's first step got (after CFG and guidance_rescale)
        latents_step0, latents_final     the latents after the first and the last step (callback_on_step_end;
                                         inpaint: after the step's blend with the noised image)
        vae_decoder_in                   what vae.decode got (latents_final / scaling_factor)
        image [B, H, W, 3] float, image_u8 ((image * 255).round(), what the PIL path saves)
      img2img adds init_image (image_processor.preprocess(image): the image at its own size rounded down to a
      multiple of vae_scale_factor, in [-1, 1]), image_latents (scaling_factor * the VAE posterior's sample, drawn
      from the call's generator BEFORE the noise), noise, latent_timestep (add_noise's inputs). Inpaint adds
      init_image (preprocess(image, height, width)), mask_condition (mask_processor.preprocess(mask_image, height,
      width): [1, 1, H, W] binarized to {0, 1}), masked_image (init_image * (mask_condition < 0.5)), image_latents,
      noise (drawn after image_latents), latent_timestep, mask ([B, 1, h, w]: mask_condition resized to the latent
      grid, nearest; the pipeline doubles it for CFG) and masked_image_latents ([B, 4, h, w]: the masked image's
      posterior sample, drawn AFTER the noise; the 4-channel UNet never uses it).

Cases: CASES below, each with a comment on what it covers (sd15_*: sd15-tiny / StableDiffusion*Pipeline, sdxl_*:
sdxl-tiny / StableDiffusionXL*Pipeline). The two default cases are rerun in memory with another prompt: the image
must move. `python3 tools/goldens/sd.py <case> ...` writes only the cases named.

Usage: python3 tools/goldens/sd.py   (torch, diffusers 0.42.1, transformers 5, safetensors, pillow from pip)
"""
import copy
import functools
import json
import os
import shutil
import sys

import numpy as np
import torch
from diffusers.utils import logging as diffusers_logging
from transformers.utils import logging as transformers_logging
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chroma import first_call, folder_size, meta_of, save_file  # noqa: E402  (the shared golden-writing helpers)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "sd")
TOKENIZERS = os.path.join(MODELS, "sd3-tiny-medium")  # tokenizer (CLIP-L, pad <|endoftext|>), tokenizer_2 (pad "!")
IMAGES = os.path.join(ROOT, "tests", "data", "goldens", "flux2")  # edit.py's input images
MASKS = os.path.join(ROOT, "tests", "data", "goldens", "edit")  # edit.py's masks

CHANNELS = (16, 24, 32)
TE_HIDDEN = 32
TE2_PROJECTION = 24
TIME_EMBED = 8

# runwayml/stable-diffusion-v1-5 scheduler/scheduler_config.json and stabilityai/stable-diffusion-xl-base-1.0
# scheduler/scheduler_config.json, key for key (written over what save_pretrained writes).
SD15_SCHEDULER = {
    "_class_name": "PNDMScheduler", "_diffusers_version": "0.6.0", "beta_end": 0.012,
    "beta_schedule": "scaled_linear", "beta_start": 0.00085, "num_train_timesteps": 1000, "set_alpha_to_one": False,
    "skip_prk_steps": True, "steps_offset": 1, "trained_betas": None, "clip_sample": False}
SDXL_SCHEDULER = {
    "_class_name": "EulerDiscreteScheduler", "_diffusers_version": "0.19.0.dev0", "beta_end": 0.012,
    "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False, "interpolation_type": "linear",
    "num_train_timesteps": 1000, "prediction_type": "epsilon", "sample_max_value": 1.0, "set_alpha_to_one": False,
    "skip_prk_steps": True, "steps_offset": 1, "timestep_spacing": "leading", "trained_betas": None,
    "use_karras_sigmas": False}


def clip_config(vocab, layers, act, projection_dim=None):
    from transformers import CLIPTextConfig

    # bos 0 / eos 2 / pad 1: the legacy values of the real SD1.5 / SDXL text encoder configs (the pooled token is
    # then found by argmax over the ids: the first <|endoftext|>, the largest id).
    extra = {} if projection_dim is None else dict(projection_dim=projection_dim)
    return CLIPTextConfig(vocab_size=vocab, hidden_size=TE_HIDDEN, intermediate_size=48, num_hidden_layers=layers,
                          num_attention_heads=4, max_position_embeddings=77, hidden_act=act, layer_norm_eps=1e-5,
                          bos_token_id=0, eos_token_id=2, pad_token_id=1, **extra)


def tiny_vae(scaling_factor, force_upcast):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=4,
        act_fn="silu", sample_size=32, scaling_factor=scaling_factor, force_upcast=force_upcast)


def perturb(models, seed):
    """Norms: weight 1 + 0.2 randn, bias 0.1 randn; every parameter + 0.05 randn."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for model in models:
            for m in model.modules():
                if isinstance(m, (torch.nn.GroupNorm, torch.nn.LayerNorm)) and m.weight is not None:
                    m.weight.copy_(1 + 0.2 * torch.randn_like(m.weight))
                    m.bias.copy_(0.1 * torch.randn_like(m.bias))
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)


def sd15_components():
    from diffusers import PNDMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    tok = CLIPTokenizer.from_pretrained(os.path.join(TOKENIZERS, "tokenizer"))
    assert tok.pad_token == "<|endoftext|>" and tok.model_max_length == 77
    torch.manual_seed(10)
    te = CLIPTextModel(clip_config(len(tok), 3, "quick_gelu"))
    torch.manual_seed(11)
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, flip_sin_to_cos=True, freq_shift=0,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), block_out_channels=CHANNELS,
        layers_per_block=2, downsample_padding=1, mid_block_scale_factor=1, act_fn="silu", norm_num_groups=8,
        norm_eps=1e-5, cross_attention_dim=TE_HIDDEN, attention_head_dim=4, use_linear_projection=False)
    torch.manual_seed(12)
    vae = tiny_vae(0.18215, False)
    perturb((te, unet, vae), 13)
    sched = PNDMScheduler.from_config({k: v for k, v in SD15_SCHEDULER.items() if not k.startswith("_")})
    return dict(vae=vae, text_encoder=te, tokenizer=tok, unet=unet, scheduler=sched, safety_checker=None,
                feature_extractor=None, requires_safety_checker=False)


def sdxl_components():
    from diffusers import EulerDiscreteScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    tok = CLIPTokenizer.from_pretrained(os.path.join(TOKENIZERS, "tokenizer"))
    tok2 = CLIPTokenizer.from_pretrained(os.path.join(TOKENIZERS, "tokenizer_2"))
    assert tok.pad_token == "<|endoftext|>" and tok2.pad_token == "!" and tok2.pad_token_id == 0
    torch.manual_seed(20)
    te = CLIPTextModel(clip_config(len(tok), 3, "quick_gelu"))
    torch.manual_seed(21)
    te2 = CLIPTextModelWithProjection(clip_config(len(tok2), 2, "gelu", projection_dim=TE2_PROJECTION))
    torch.manual_seed(22)
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, flip_sin_to_cos=True, freq_shift=0,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=CHANNELS,
        layers_per_block=2, downsample_padding=1, mid_block_scale_factor=1, act_fn="silu", norm_num_groups=8,
        norm_eps=1e-5, cross_attention_dim=2 * TE_HIDDEN, attention_head_dim=(2, 4, 4),
        transformer_layers_per_block=(1, 2, 2), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=TIME_EMBED, projection_class_embeddings_input_dim=6 * TIME_EMBED + TE2_PROJECTION)
    torch.manual_seed(23)
    vae = tiny_vae(0.13025, True)
    perturb((te, te2, unet, vae), 24)
    sched = EulerDiscreteScheduler.from_config({k: v for k, v in SDXL_SCHEDULER.items() if not k.startswith("_")})
    return dict(vae=vae, text_encoder=te, text_encoder_2=te2, tokenizer=tok, tokenizer_2=tok2, unet=unet,
                scheduler=sched, force_zeros_for_empty_prompt=True, add_watermarker=False)


def save_pipeline(pipe, path, scheduler_config):
    shutil.rmtree(path, ignore_errors=True)
    pipe.save_pretrained(path, safe_serialization=True)
    # The tokenizers in the files the real repos have (vocab.json + merges.txt + the two configs), and the real
    # scheduler_config.json.
    for folder in ("tokenizer", "tokenizer_2"):
        if os.path.isdir(os.path.join(path, folder)):
            shutil.rmtree(os.path.join(path, folder))
            shutil.copytree(os.path.join(TOKENIZERS, folder), os.path.join(path, folder))
    with open(os.path.join(path, "scheduler", "scheduler_config.json"), "w") as f:
        json.dump(scheduler_config, f, indent=2)
        f.write("\n")


def load_pipeline(cls_name, model, dtype):
    import diffusers

    kwargs = {} if cls_name.startswith("StableDiffusionXL") else dict(safety_checker=None)
    if cls_name.startswith("StableDiffusionXL"):
        kwargs["add_watermarker"] = False
    pipe = getattr(diffusers, cls_name).from_pretrained(os.path.join(MODELS, model), torch_dtype=dtype, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


CAT = "a cat"
FOX = "a red fox sitting in the snow at night"
LIGHTHOUSE = "a lighthouse on a cliff above a stormy sea, dramatic clouds"
NEGATIVE = "blurry, low quality"
STYLE = "oil painting, thick brush strokes"

F32, BF16 = torch.float32, torch.bfloat16
SD, SDI, SDP = "StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline", "StableDiffusionInpaintPipeline"
XL, XLI, XLP = "StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline", "StableDiffusionXLInpaintPipeline"
# Cases that also record the UNet's skip tensors and mid block output.
# (the skips of a 64 x 64 CFG call are 0.6 MB; these cases have small latents)
INTERNALS = {"sd15_nocfg_32x48_s3", "sd15_oddlatent_36x28_s5", "sdxl_empty_negative_32x32_s2"}

CASES = [
    # name, pipeline class, model, dtype, call arguments (+ seed; scheduler: a class swapped in with from_config,
    # scheduler_kwargs its overrides; relax_size_check: see sd15_oddlatent)
    # SD1.5's defaults: PNDM (4 steps = 5 UNet calls: PNDM repeats its second timestep), CFG 7.5, negative "".
    ("sd15_cat_64x64_s0", SD, "sd15-tiny", F32,
     dict(prompt=CAT, height=64, width=64, num_inference_steps=4, guidance_scale=7.5, seed=0)),
    # A negative prompt, non-square.
    ("sd15_negative_48x80_s1", SD, "sd15-tiny", F32,
     dict(prompt=FOX, negative_prompt=NEGATIVE, height=48, width=80, num_inference_steps=4, guidance_scale=7.5,
          seed=1)),
    # clip_skip 1: the positive prompt takes hidden_states[-2] + final_layer_norm; the negative one is encoded
    # WITHOUT clip_skip (diffusers' encode_prompt ignores it there).
    ("sd15_clipskip1_32x32_s2", SD, "sd15-tiny", F32,
     dict(prompt=LIGHTHOUSE, negative_prompt=NEGATIVE, height=32, width=32, num_inference_steps=4,
          guidance_scale=6.0, clip_skip=1, seed=2)),
    # guidance_scale 1.0: no CFG (do_classifier_free_guidance is guidance_scale > 1), one UNet item per image.
    ("sd15_nocfg_32x48_s3", SD, "sd15-tiny", F32,
     dict(prompt=FOX, height=32, width=48, num_inference_steps=4, guidance_scale=1.0, seed=3)),
    # Two prompts, two images each: B = 4, the UNet batch 8 ([neg0, neg0, neg1, neg1, pos0, pos0, pos1, pos1]).
    ("sd15_batch_32x32_s4", SD, "sd15-tiny", F32,
     dict(prompt=[CAT, FOX], height=32, width=32, num_inference_steps=4, guidance_scale=7.5,
          num_images_per_prompt=2, seed=4)),
    # A latent (18 x 14) that the UNet's downsamplers floor (9 x 7 -> 5 x 4): the up blocks are given the skip's
    # size (forward_upsample_size). diffusers' check_inputs wants multiples of 8, and with the tiny VAE's
    # factor 2 every such size has a latent divisible by 4 = the UNet's 2 downsamplers, so this call skips that
    # check (the real SD1.5, factor 8 and 3 downsamplers, meets the path at any size not a multiple of 64).
    ("sd15_oddlatent_36x28_s5", SD, "sd15-tiny", F32,
     dict(prompt=CAT, height=36, width=28, num_inference_steps=3, guidance_scale=7.5, relax_size_check=True,
          seed=5)),
    # The samplers, swapped with from_config from the folder's PNDM config (timestep_spacing "leading",
    # steps_offset 1 carry over).
    ("sd15_euler_32x32_s6", SD, "sd15-tiny", F32,
     dict(prompt=CAT, height=32, width=32, num_inference_steps=6, guidance_scale=7.5,
          scheduler="EulerDiscreteScheduler", seed=6)),
    # Euler ancestral: every step draws fresh noise from the call's generator (after the initial latents).
    ("sd15_euler_a_32x32_s7", SD, "sd15-tiny", F32,
     dict(prompt=CAT, height=32, width=32, num_inference_steps=6, guidance_scale=7.5,
          scheduler="EulerAncestralDiscreteScheduler", seed=7)),
    # DPM++ 2M (dpmsolver++, order 2, lower_order_final).
    ("sd15_dpmpp2m_32x32_s8", SD, "sd15-tiny", F32,
     dict(prompt=FOX, height=32, width=32, num_inference_steps=6, guidance_scale=7.5,
          scheduler="DPMSolverMultistepScheduler", seed=8)),
    ("sd15_dpmpp2m_karras_32x32_s9", SD, "sd15-tiny", F32,
     dict(prompt=FOX, height=32, width=32, num_inference_steps=6, guidance_scale=7.5,
          scheduler="DPMSolverMultistepScheduler", scheduler_kwargs=dict(use_karras_sigmas=True), seed=9)),
    ("sd15_ddim_32x32_s10", SD, "sd15-tiny", F32,
     dict(prompt=LIGHTHOUSE, height=32, width=32, num_inference_steps=5, guidance_scale=7.5,
          scheduler="DDIMScheduler", seed=10)),
    ("sd15_bf16_cat_64x64_s0", SD, "sd15-tiny-bf16", BF16,
     dict(prompt=CAT, height=64, width=64, num_inference_steps=4, guidance_scale=7.5, seed=0)),
    # Img2img at the image's own size (ref_b: 64 x 100, a 32 x 50 latent: 50 -> 25 -> 13 at the deepest level, so
    # forward_upsample_size again, legitimately). PNDM, 5 steps = timesteps [801 601 601 401 201 1]; strength 0.6:
    # t_start = 5 - int(3.0) = 2, so the loop runs [601 401 201 1] (starting at the repeated timestep).
    ("sd15_img2img_ref_b_s11", SDI, "sd15-tiny", F32,
     dict(prompt=FOX, negative_prompt=NEGATIVE, image="ref_b", strength=0.6, num_inference_steps=5,
          guidance_scale=7.5, seed=11)),
    # Inpaint with the 4-channel UNet: after every step the kept region is reset to the image latents noised to
    # the next timestep (clean after the last). strength 0.75 of 4 steps.
    ("sd15_inpaint_ref_a_s12", SDP, "sd15-tiny", F32,
     dict(prompt=CAT, negative_prompt=NEGATIVE, image="ref_a", mask_image="mask_box", height=88, width=72,
          strength=0.75, num_inference_steps=4, guidance_scale=7.5, seed=12)),

    # SDXL base's defaults: Euler (leading, steps_offset 1), CFG 5; no negative prompt + force_zeros_for_empty_prompt
    # = zero negative embeddings and pooled embeddings (no text encoder call for them).
    ("sdxl_cat_64x64_s0", XL, "sdxl-tiny", F32,
     dict(prompt=CAT, height=64, width=64, num_inference_steps=4, guidance_scale=5.0, seed=0)),
    # prompt_2 feeds tokenizer_2 / text_encoder_2 (the pooled embedding too); negative_prompt feeds both encoders.
    ("sdxl_prompt2_negative_48x64_s1", XL, "sdxl-tiny", F32,
     dict(prompt=FOX, prompt_2=STYLE, negative_prompt=NEGATIVE, height=48, width=64, num_inference_steps=4,
          guidance_scale=5.0, seed=1)),
    # negative_prompt "" is NOT None: it is encoded (tokenizer_2 pads it with "!"), no zeros.
    ("sdxl_empty_negative_32x32_s2", XL, "sdxl-tiny", F32,
     dict(prompt=CAT, negative_prompt="", height=32, width=32, num_inference_steps=4, guidance_scale=5.0,
          seed=2)),
    # Micro-conditioning set explicitly, with different negative sizes, two images: add_time_ids =
    # cat([neg_ids, pos_ids]).repeat(2, 1) = [neg, pos, neg, pos] while the batch is [neg, neg, pos, pos] (the
    # txt2img pipeline's order; img2img / inpaint repeat each half instead).
    ("sdxl_micro_cond_32x48_s3", XL, "sdxl-tiny", F32,
     dict(prompt=LIGHTHOUSE, height=32, width=48, num_inference_steps=4, guidance_scale=5.0,
          original_size=[96, 128], crops_coords_top_left=[8, 16], target_size=[64, 80],
          negative_original_size=[48, 48], negative_crops_coords_top_left=[0, 0], negative_target_size=[32, 48],
          num_images_per_prompt=2, seed=3)),
    # guidance_rescale 0.7 (rescale_noise_cfg: std over all dims but the batch, of the text prediction).
    ("sdxl_rescale_32x32_s4", XL, "sdxl-tiny", F32,
     dict(prompt=FOX, negative_prompt=NEGATIVE, height=32, width=32, num_inference_steps=4, guidance_scale=5.0,
          guidance_rescale=0.7, seed=4)),
    ("sdxl_dpmpp2m_karras_32x32_s5", XL, "sdxl-tiny", F32,
     dict(prompt=CAT, height=32, width=32, num_inference_steps=6, guidance_scale=5.0,
          scheduler="DPMSolverMultistepScheduler", scheduler_kwargs=dict(use_karras_sigmas=True), seed=5)),
    ("sdxl_bf16_cat_64x64_s0", XL, "sdxl-tiny-bf16", BF16,
     dict(prompt=CAT, height=64, width=64, num_inference_steps=4, guidance_scale=5.0, seed=0)),
    # Img2img (ref_a: 72 x 88 at its own size), Euler, strength 0.6 of 5 steps: t_start 2, three steps.
    # original_size / target_size default to the image's size (from the latents).
    ("sdxl_img2img_ref_a_s6", XLI, "sdxl-tiny", F32,
     dict(prompt=FOX, image="ref_a", strength=0.6, num_inference_steps=5, guidance_scale=5.0, seed=6)),
    ("sdxl_inpaint_ref_a_s7", XLP, "sdxl-tiny", F32,
     dict(prompt=CAT, negative_prompt=NEGATIVE, image="ref_a", mask_image="mask_box", height=88, width=72,
          strength=0.8, num_inference_steps=5, guidance_scale=5.0, seed=7)),
]


def swap_scheduler(pipe, name, overrides):
    import diffusers

    pipe.scheduler = getattr(diffusers, name).from_config(pipe.scheduler.config, **(overrides or {}))


def run_case(name, cls_name, model, dtype, args, pipe=None, internals=None):
    """One pipeline call and its stages. `pipe`: an already loaded pipeline."""
    pipe = pipe or load_pipeline(cls_name, model, dtype)
    args = dict(args)
    seed = args.pop("seed")
    if args.get("clip_skip") and not hasattr(pipe.text_encoder, "text_model"):
        # diffusers 0.42.1 applies clip_skip's final LayerNorm as text_encoder.text_model.final_layer_norm, which
        # transformers 5 no longer has (CLIPTextModel is flat there): point text_model at the model itself, outside
        # the module tree (what transformers 4's nesting gave).
        object.__setattr__(pipe.text_encoder, "text_model", pipe.text_encoder)
    if "scheduler" in args:
        swap_scheduler(pipe, args["scheduler"], args.get("scheduler_kwargs"))
    call = {k: v for k, v in args.items() if k not in ("scheduler", "scheduler_kwargs", "relax_size_check")}
    for k in ("original_size", "crops_coords_top_left", "target_size", "negative_original_size",
              "negative_crops_coords_top_left", "negative_target_size"):
        if k in call:
            call[k] = tuple(call[k])
    if "image" in args:
        call["image"] = Image.open(os.path.join(IMAGES, args["image"] + ".png")).convert("RGB")
    if "mask_image" in args:
        call["mask_image"] = Image.open(os.path.join(MASKS, args["mask_image"] + ".png"))
    xl = cls_name.startswith("StableDiffusionXL")
    img2img = "image" in args and "mask_image" not in args
    inpaint = "mask_image" in args
    internals = name in INTERNALS if internals is None else internals
    prompts = [args["prompt"]] if isinstance(args["prompt"], str) else list(args["prompt"])
    n = args.get("num_images_per_prompt", 1)
    batch = len(prompts) * n
    cfg = args["guidance_scale"] > 1
    out, captured = {}, {}

    def tokenize(tokenizer, texts):
        return tokenizer(texts, padding="max_length", max_length=77, truncation=True,
                         return_tensors="pt").input_ids.to(torch.int64)

    out["text_input_ids"] = tokenize(pipe.tokenizer, prompts)
    negatives = args.get("negative_prompt")
    zero_negatives = xl and negatives is None  # force_zeros_for_empty_prompt
    if cfg and not zero_negatives:
        neg = [negatives or ""] * len(prompts) if not isinstance(negatives, list) else negatives
        out["negative_text_input_ids"] = tokenize(pipe.tokenizer, neg)
    if xl:
        p2 = args.get("prompt_2") or args["prompt"]
        out["text_input_ids_2"] = tokenize(pipe.tokenizer_2, [p2] if isinstance(p2, str) else p2)
        if cfg and not zero_negatives:
            n2 = args.get("negative_prompt_2") or negatives or ""
            out["negative_text_input_ids_2"] = tokenize(pipe.tokenizer_2, [n2] * len(prompts))

    encoder_inputs = {"text_encoder": [], "text_encoder_2": []}
    unet_calls = []

    def unet_pre(module, a, kw):
        unet_calls.append(None)

    def unet_hook(module, a, kw, output):
        if len(unet_calls) == 1:
            extra = kw.get("added_cond_kwargs") or {}
            captured.update(
                unet_in_step0=a[0].clone(), unet_t_step0=a[1].clone().reshape(1),
                unet_encoder_hidden_states_step0=kw["encoder_hidden_states"].clone(),
                unet_out_step0=output[0].clone())
            if xl:
                captured["add_time_ids"] = extra["time_ids"].clone()
                captured["unet_text_embeds_step0"] = extra["text_embeds"].clone()
        captured.setdefault("ts", []).append(a[1].clone().reshape(()))

    skips = []

    def skip_hook(index):
        def hook(module, a, output):
            if len(unet_calls) == 1:
                skips.extend(o.clone() for o in ((output,) if index < 0 else output[1]))
        return hook

    unet = pipe.unet
    hooks = [unet.register_forward_pre_hook(unet_pre, with_kwargs=True),
             unet.register_forward_hook(unet_hook, with_kwargs=True),
             unet.down_blocks[0].resnets[0].register_forward_pre_hook(
                 lambda m, a, kw: first_call(captured, "temb_step0", a[1] if len(a) > 1 else kw["temb"]),
                 with_kwargs=True)]
    for te in ("text_encoder", "text_encoder_2"):
        if getattr(pipe, te, None) is not None:
            hooks.append(getattr(pipe, te).register_forward_pre_hook(
                lambda m, a, kw, te=te: encoder_inputs[te].append((a[0] if a else kw["input_ids"]).clone()),
                with_kwargs=True))
    if internals:
        hooks.append(unet.conv_in.register_forward_hook(skip_hook(-1)))
        for i, block in enumerate(unet.down_blocks):
            hooks.append(block.register_forward_hook(skip_hook(i)))
        hooks.append(unet.mid_block.register_forward_hook(
            lambda m, a, o: first_call(captured, "mid_block_out_step0", o)))

    encode_prompt, prepare_latents = pipe.encode_prompt, pipe.prepare_latents
    sched = pipe.scheduler
    step, add_noise, set_timesteps = sched.step, sched.add_noise, sched.set_timesteps
    vae_decode, check_inputs = pipe.vae.decode, pipe.check_inputs

    def record_encode_prompt(*a, **kw):
        result = encode_prompt(*a, **kw)
        captured["encoded"] = [None if r is None else r.clone() for r in result]
        return result

    def record_prepare_latents(*a, **kw):
        result = prepare_latents(*a, **kw)
        captured["prepared"] = [r.clone() for r in result] if isinstance(result, tuple) else [result.clone()]
        return result

    def record_set_timesteps(*a, **kw):
        result = set_timesteps(*a, **kw)
        captured["timesteps"] = sched.timesteps.clone()
        if hasattr(sched, "sigmas") and sched.sigmas is not None:
            captured["sigmas"] = torch.as_tensor(sched.sigmas).clone()
        return result

    def record_add_noise(original, noise, timesteps):
        if "add_noise" not in captured:
            captured["add_noise"] = (original.clone(), noise.clone(), timesteps.clone())
        return add_noise(original, noise, timesteps)

    # functools.wraps keeps step's signature: the pipelines pass `generator` only to a step() whose signature
    # names it (prepare_extra_step_kwargs), and Euler ancestral draws its fresh noise from it.
    @functools.wraps(step)
    def record_step(model_output, *a, **kw):
        first_call(captured, "noise_pred_step0", model_output)
        return step(model_output, *a, **kw)

    def record_decode(z, *a, **kw):
        captured["vae_decoder_in"] = z.clone()
        return vae_decode(z, *a, **kw)

    def relaxed_check_inputs(*a, **kw):
        a = list(a)
        a[1], a[2] = a[1] + (-a[1]) % 8, a[2] + (-a[2]) % 8  # prompt, height, width, ...
        return check_inputs(*a, **kw)

    pipe.encode_prompt, pipe.prepare_latents, pipe.vae.decode = record_encode_prompt, record_prepare_latents, \
        record_decode
    sched.step, sched.add_noise, sched.set_timesteps = record_step, record_add_noise, record_set_timesteps
    if args.get("relax_size_check"):
        pipe.check_inputs = relaxed_check_inputs
    steps, masks = [], []

    def on_step(p, i, t, kwargs):
        steps.append(kwargs["latents"].clone())
        if inpaint:
            masks.append((kwargs["mask"].clone(), kwargs["masked_image_latents"].clone()))
        return {}

    inputs = ["latents", "mask", "masked_image_latents"] if inpaint else ["latents"]
    with torch.no_grad():
        result = pipe(**call, generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                      callback_on_step_end=on_step, callback_on_step_end_tensor_inputs=inputs)
    for h in hooks:
        h.remove()
    for attr in ("encode_prompt", "prepare_latents", "check_inputs"):
        pipe.__dict__.pop(attr, None)
    del pipe.vae.decode, sched.step, sched.add_noise, sched.set_timesteps
    images = result.images

    # The text encoders saw exactly the ids recorded: the prompts', then the negatives'.
    want = [out["text_input_ids"]] + ([out["negative_text_input_ids"]] if "negative_text_input_ids" in out else [])
    got = encoder_inputs["text_encoder"]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want)), name
    if xl:
        want = [out["text_input_ids_2"]] + ([out["negative_text_input_ids_2"]]
                                            if "negative_text_input_ids_2" in out else [])
        got = encoder_inputs["text_encoder_2"]
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want)), name

    enc = captured["encoded"]
    out["prompt_embeds"] = enc[0]
    if cfg:
        out["negative_prompt_embeds"] = enc[1]
    if xl:
        out["pooled_prompt_embeds"] = enc[2]
        if cfg:
            out["negative_pooled_prompt_embeds"] = enc[3]
            if zero_negatives:
                assert not enc[1].any() and not enc[3].any()
        out["add_time_ids"] = captured["add_time_ids"]
        out["unet_text_embeds_step0"] = captured["unet_text_embeds_step0"]
        pooled = torch.cat([enc[3], enc[2]]) if cfg else enc[2]
        assert torch.equal(out["unet_text_embeds_step0"], pooled)
    ctx = torch.cat([enc[1], enc[0]]) if cfg else enc[0]
    assert torch.equal(captured["unet_encoder_hidden_states_step0"], ctx), name
    assert enc[0].shape[0] == batch

    prepared = captured["prepared"]
    out["latents_init"] = prepared[0]
    out["timesteps"] = captured["timesteps"]
    if "sigmas" in captured:
        out["sigmas"] = captured["sigmas"].float()
    out["timesteps_run"] = torch.stack(captured["ts"])
    for k in ("unet_in_step0", "unet_t_step0", "unet_encoder_hidden_states_step0", "unet_out_step0", "temb_step0",
              "noise_pred_step0", "vae_decoder_in"):
        out[k] = captured[k]
    assert len(steps) == len(captured["ts"]), (len(steps), len(captured["ts"]))
    out["latents_step0"] = steps[0]
    out["latents_final"] = steps[-1]
    out["image"] = torch.from_numpy(np.ascontiguousarray(images)).float()
    out["image_u8"] = torch.from_numpy((images * 255).round().astype("uint8"))
    if internals:
        for i, s in enumerate(skips):
            out[f"down_block_res_samples_step0_{i}"] = s
        out["mid_block_out_step0"] = captured["mid_block_out_step0"]
        expected = 1 + sum(len(b.resnets) + (1 if b.downsamplers else 0) for b in unet.down_blocks)
        assert len(skips) == expected, (len(skips), expected)
        assert sum(len(b.resnets) for b in unet.up_blocks) == expected

    # Checks: the first UNet input is the CFG-doubled, scaled initial latents; the guidance; the VAE input.
    x0 = torch.cat([out["latents_init"]] * 2) if cfg else out["latents_init"]
    sigma = None
    if type(sched).__name__.startswith("Euler"):
        sigma = out["sigmas"][out["timesteps"].tolist().index(out["timesteps_run"][0].item())]
        x0 = x0 / ((sigma ** 2 + 1) ** 0.5)
    assert torch.allclose(out["unet_in_step0"].float(), x0.float(), rtol=1e-5, atol=1e-6), name
    raw = out["unet_out_step0"]
    if cfg:
        uncond, text = raw.chunk(2)
        pred = uncond + args["guidance_scale"] * (text - uncond)
        if args.get("guidance_rescale", 0) > 0:
            dims = list(range(1, text.ndim))
            rescaled = pred * (text.std(dim=dims, keepdim=True) / pred.std(dim=dims, keepdim=True))
            pred = args["guidance_rescale"] * rescaled + (1 - args["guidance_rescale"]) * pred
    else:
        pred = raw
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(pred.float(), out["noise_pred_step0"].float(), rtol=tol, atol=tol), name
    assert torch.equal(out["vae_decoder_in"], out["latents_final"] / pipe.vae.config.scaling_factor), name

    if args.get("clip_skip"):
        # Only the positive prompt is clip-skipped (hidden_states[-(k+1)], then the final LayerNorm); the negative
        # one is the plain last_hidden_state.
        te = pipe.text_encoder
        with torch.no_grad():
            hs = te(out["text_input_ids"], output_hidden_states=True).hidden_states[-(args["clip_skip"] + 1)]
            assert torch.equal(te.final_layer_norm(hs), out["prompt_embeds"]), name
            assert torch.equal(te(out["negative_text_input_ids"])[0], out["negative_prompt_embeds"]), name
    if xl and cls_name == XL:
        def ids(prefix, default):
            return [float(v) for part in ("original_size", "crops_coords_top_left", "target_size")
                    for v in args.get(prefix + part, args.get(part, default[part]))]
        size = dict(original_size=(args["height"], args["width"]), crops_coords_top_left=(0, 0),
                    target_size=(args["height"], args["width"]))
        pos = torch.tensor([ids("", size)])
        neg = torch.tensor([ids("negative_", size)]) if "negative_original_size" in args else pos
        want = (torch.cat([neg, pos]) if cfg else pos).repeat(batch, 1)  # [neg, pos, neg, pos, ...] with CFG
        assert torch.equal(out["add_time_ids"].float(), want), (name, out["add_time_ids"], want)
    if name == "sd15_oddlatent_36x28_s5":
        assert [tuple(t.shape[-2:]) for t in skips][-1] == (5, 4), [tuple(t.shape[-2:]) for t in skips]

    h, w = args.get("height"), args.get("width")
    if img2img:
        out["init_image"] = pipe.image_processor.preprocess(call["image"]).float()
        original, noise, timestep = captured["add_noise"]
        out["image_latents"], out["noise"], out["latent_timestep"] = original, noise, timestep
        assert torch.equal(timestep, out["timesteps_run"][:1].repeat(batch).to(timestep.dtype))
        # The generator draws the VAE's posterior sample first, then the noise.
        g = torch.Generator("cpu").manual_seed(seed)
        with torch.no_grad():
            vae = pipe.vae
            if xl and vae.config.force_upcast:
                vae = copy.deepcopy(vae).float()
            sample = vae.encode(out["init_image"].to(dtype).to(vae.dtype)).latent_dist.sample(g)
        assert torch.equal((pipe.vae.config.scaling_factor * sample.to(dtype)).repeat(batch, 1, 1, 1),
                           out["image_latents"]), name
        assert torch.equal(torch.randn(noise.shape, generator=g, dtype=noise.dtype), noise), name
    elif inpaint:
        out["init_image"] = pipe.image_processor.preprocess(call["image"], height=h, width=w).float()
        out["mask_condition"] = pipe.mask_processor.preprocess(call["mask_image"], height=h, width=w)
        out["masked_image"] = out["init_image"] * (out["mask_condition"] < 0.5)
        out["latents_init"], out["noise"], out["image_latents"] = prepared
        mask, masked_latents = masks[0]
        assert all(torch.equal(m, mask) for m, _ in masks)
        out["mask"], out["masked_image_latents"] = mask[:batch], masked_latents[:batch]
        if cfg:
            assert torch.equal(mask[batch:], mask[:batch])
            assert torch.equal(masked_latents[batch:], masked_latents[:batch])
        lh, lw = out["latents_init"].shape[-2:]
        nearest = torch.nn.functional.interpolate(out["mask_condition"], size=(lh, lw))
        assert torch.equal(nearest.repeat(batch, 1, 1, 1).to(dtype), out["mask"]), name
        if "add_noise" in captured:
            out["latent_timestep"] = captured["add_noise"][2]
            assert torch.equal(captured["add_noise"][0], out["image_latents"])
        g = torch.Generator("cpu").manual_seed(seed)
        with torch.no_grad():
            sample = pipe.vae.encode(out["init_image"].to(dtype)).latent_dist.sample(g)
            assert torch.equal(pipe.vae.config.scaling_factor * sample, out["image_latents"][:1]), name
            assert torch.equal(torch.randn(out["noise"].shape, generator=g, dtype=dtype), out["noise"]), name
            sample = pipe.vae.encode(out["masked_image"].to(dtype)).latent_dist.sample(g)
            assert torch.equal(pipe.vae.config.scaling_factor * sample, out["masked_image_latents"][:1]), name
    else:
        # The initial noise, drawn exactly as the pipeline draws it.
        g = torch.Generator("cpu").manual_seed(seed)
        init = torch.randn(out["latents_init"].shape, generator=g, dtype=dtype) * sched.init_noise_sigma
        assert torch.equal(init, out["latents_init"]), name
        assert (h // 2, w // 2) == tuple(out["latents_init"].shape[-2:])

    meta = dict(args, seed=seed, pipeline=cls_name, model=model, dtype=str(dtype).split(".")[-1], cfg=cfg,
                steps_run=len(steps), scheduler=type(sched).__name__,
                scheduler_config={k: sched.config[k] for k in sorted(sched.config) if not k.startswith("_")})
    return {k: v.contiguous() for k, v in out.items()}, meta_of(meta), pipe


def main():
    import diffusers
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    assert diffusers.__version__ == "0.42.1", diffusers.__version__
    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    shutil.rmtree(GOLDENS, ignore_errors=True)
    os.makedirs(GOLDENS)

    built = {}
    for cls, components, name, sched_cfg in (
            (StableDiffusionPipeline, sd15_components, "sd15-tiny", SD15_SCHEDULER),
            (StableDiffusionXLPipeline, sdxl_components, "sdxl-tiny", SDXL_SCHEDULER)):
        pipe = cls(**components())
        save_pipeline(pipe, os.path.join(MODELS, name), sched_cfg)
        save_pipeline(copy.deepcopy(pipe).to(torch.bfloat16), os.path.join(MODELS, name + "-bf16"), sched_cfg)
        built[name] = pipe
    for folder in ("sd15-tiny", "sd15-tiny-bf16", "sdxl-tiny", "sdxl-tiny-bf16"):
        print(f"{folder}: {folder_size(os.path.join(MODELS, folder)) / 1e6:.2f} MB")

    # The saved folders reproduce the in-memory pipelines (and the bf16 ones are their rounding).
    for name, cls_name in (("sd15-tiny", SD), ("sdxl-tiny", XL)):
        mem = built[name]
        for dtype, folder in ((F32, name), (BF16, name + "-bf16")):
            reloaded = load_pipeline(cls_name, folder, dtype)
            for comp in ("unet", "vae", "text_encoder", "text_encoder_2"):
                if getattr(mem, comp, None) is None:
                    continue
                a, b = getattr(mem, comp).state_dict(), getattr(reloaded, comp).state_dict()
                assert set(a) == set(b), (folder, comp)
                for k in a:
                    assert torch.equal(a[k].to(dtype), b[k]), (folder, comp, k)
            want = SD15_SCHEDULER if name == "sd15-tiny" else SDXL_SCHEDULER
            assert type(reloaded.scheduler).__name__ == want["_class_name"], folder
            assert reloaded.tokenizer("a cat").input_ids == mem.tokenizer("a cat").input_ids
        if name == "sdxl-tiny":
            assert reloaded.config.force_zeros_for_empty_prompt and reloaded.watermark is None
            assert reloaded.tokenizer_2("", padding="max_length", max_length=77).input_ids[2] == 0

    images = {}
    only = set(sys.argv[1:])
    for case in CASES:
        name = case[0]
        if only and name not in only:
            continue
        tensors, meta, _ = run_case(*case)
        images[name] = tensors["image_u8"]
        save_file(tensors, os.path.join(GOLDENS, name + ".safetensors"), metadata=meta)
        print("wrote", name, os.path.getsize(os.path.join(GOLDENS, name + ".safetensors")), "bytes",
              {k: tuple(v.shape) for k, v in tensors.items() if not k.startswith("down_block")})
        print("   timesteps_run", [round(float(t), 3) for t in tensors["timesteps_run"]])

    # The prompt changes the image (same seed, same call, another prompt), in both pipelines.
    for case in (CASES[0], next(c for c in CASES if c[0] == "sdxl_cat_64x64_s0")):
        if case[0] not in images:
            continue
        other = dict(case[4], prompt=FOX)
        fox, _, _ = run_case(case[0], case[1], case[2], case[3], other, internals=False)
        d = (images[case[0]].float() - fox["image_u8"].float()).abs().mean().item()
        print(f"{case[0]}: another prompt moves the image by {d:.1f} levels on average")
        assert d > 2, "the prompt barely changes the image"
    for a, b in (("sd15_cat_64x64_s0", "sd15_bf16_cat_64x64_s0"), ("sdxl_cat_64x64_s0", "sdxl_bf16_cat_64x64_s0")):
        if a in images and b in images:
            print(f"bf16 vs f32 ({a}): mean level difference "
                  f"{(images[a].float() - images[b].float()).abs().mean().item():.2f}")
    total = sum(folder_size(os.path.join(MODELS, f)) for f in ("sd15-tiny", "sd15-tiny-bf16", "sdxl-tiny",
                                                                  "sdxl-tiny-bf16"))
    print(f"models {total / 1e6:.2f} MB, goldens {folder_size(GOLDENS) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
