#!/usr/bin/env python3
"""Builds tiny, randomly initialised Chroma pipelines from diffusers' and transformers' real classes, saves them in
diffusers layout, and dumps reference tensors for every stage of ChromaPipeline and ChromaImg2ImgPipeline for
Kiln's parity tests (tools/goldens/chroma_notes.md explains what each stage does and where diffusers does it).

Outputs (committed; CI never runs this script):
  tests/data/models/chroma-tiny/        ChromaPipeline, float32 (T5EncoderModel, ChromaTransformer2DModel with 2 double
                                        + 2 single blocks and a 2-layer distilled guidance approximator, AutoencoderKL,
                                        FlowMatchEulerDiscreteScheduler with the real Chroma1 values)
  tests/data/models/chroma-tiny-bf16/   the same weights stored in bfloat16
  tests/data/goldens/chroma/<case>.safetensors   the stages of one pipeline call; the call's arguments are in the
      metadata (strings as they are, every other value as JSON: a prompt list is '["...", "..."]'). Every case has
      t5_ids / t5_mask (the tokenizer's ids and mask, one row per prompt), prompt_embeds and prompt_attention_mask
      (encode_prompt's: rows repeated num_images_per_prompt times; the mask keeps one padding token after the
      prompt's EOS), text_ids, latent_image_ids, latents_init (the transformer's first input), timesteps / sigmas (the
      scheduler's whole schedule), timesteps_run (the ones the loop ran), transformer_in_timestep (timestep / 1000 as
      passed at step 0; transformer_in_timesteps: every step's, [steps, B]), attention_mask (what the transformer
      gets: the prompt mask with ones appended for the image tokens), approximator_in_step0 / approximator_out_step0
      (time_text_embed's output and the distilled guidance layer's, positive call of step 0), transformer_out_step0,
      latents_step0, latents_final, vae_decoder_in, image (float, [B, H, W, 3] in [0, 1], output_type "np") and
      image_u8 ((image * 255).round(), what the PIL path saves). With classifier-free guidance (guidance_scale > 1)
      also negative_t5_ids / negative_t5_mask, negative_prompt_embeds, negative_prompt_attention_mask,
      negative_attention_mask and transformer_out_step0_negative. img2img cases add init_image (the preprocessed
      image), image_latents (the VAE posterior sample, shifted and scaled, drawn from the call's generator before the
      noise), noise and latent_timestep (scale_noise's inputs). cfg_cat_64x64_s0 adds
      transformer_out_step0_bool_mask: the same first call with the mask made boolean (the masking the original
      Chroma code means), which diffusers 0.42.1 does NOT do: it adds the 0/1 mask to the attention scores (see
      chroma_notes.md, "Attention mask").
  tests/data/goldens/chroma/transformer_single_file.safetensors   chroma-tiny's transformer in the original
      single-file layout (distilled_guidance_layer.*, double_blocks.N.*, single_blocks.N.*, img_in, txt_in,
      final_layer.linear), checked to load back to exactly the same tensors through diffusers' converter
  tests/data/lora/chroma_diffusers.safetensors     a rank-2 LoRA in diffusers/PEFT names (transformer.*) on
      chroma-tiny's transformer, approximator layers included, alpha 4 on every module
  tests/data/goldens/chroma/lora_diffusers.safetensors   image_u8 and transformer_out_step0 of cfg_cat_64x64_s0's call
      with that LoRA loaded (lora.py's metadata: "script" is the LoRA calls to replay); fused and unfused agree
  tests/data/goldens/chroma/real_layouts.json   names and shapes of the REAL Chroma1-HD transformer (diffusers and
      single-file layouts) and of the T5-XXL encoder, with the configs they were built from

Usage: python tools/goldens/chroma.py   (torch, diffusers 0.42.1, transformers, sentencepiece, protobuf, peft,
safetensors, pillow from pip)
"""
import inspect
import json
import os
import shutil

import numpy as np
import torch
from PIL import Image
from safetensors import safe_open

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "chroma")
TOKENIZERS = os.path.join(ROOT, "tests", "data", "tokenizers")
IMAGES = os.path.join(ROOT, "tests", "data", "goldens", "flux2")  # edit.py's input images
LORA = os.path.join(ROOT, "tests", "data", "lora")

# approximator_num_channels 24 (time 6 + guidance 6 + mod index 12), hidden 48, 32 modulation vectors (3 * 2 + 12 * 2 +
# 2), inner dim 32: the approximator's dimensions all differ, so that a transposed or mis-sliced tensor shows.
TINY_TRANSFORMER = dict(
    patch_size=1, in_channels=64, out_channels=None, num_layers=2, num_single_layers=2, attention_head_dim=16,
    num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 6, 6), approximator_num_channels=24,
    approximator_hidden_dim=48, approximator_layers=2)

# The real models. Chroma1-HD / Chroma1-Base / Chroma1-Flash share one architecture: the transformer's values are
# ChromaTransformer2DModel's defaults (diffusers/models/transformers/transformer_chroma.py:401-415), which is what
# from_single_file builds from (DIFFUSERS_DEFAULT_PIPELINE_PATHS["chroma"] = lodestones/Chroma1-HD); the shapes they
# give are checked below against the real single-file names by diffusers' own converter (which hard-codes 3072).
# The text encoder is T5-v1.1-XXL's encoder, the same as FLUX.1's text_encoder_2 (flux_real_configs.json).
# The scheduler: FLUX.1-dev's resolution-dependent shift (base 0.5 at 256 tokens, max 1.15 at 4096), the schedule
# of the original Chroma sampler (lodestone-rock/flow: get_schedule(..., shift=True)); the Hugging Face repos could
# not be read from here, see chroma_notes.md.
REAL_TRANSFORMER = dict(
    _class_name="ChromaTransformer2DModel", patch_size=1, in_channels=64, out_channels=None, num_layers=19,
    num_single_layers=38, attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
    axes_dims_rope=[16, 56, 56], approximator_num_channels=64, approximator_hidden_dim=5120, approximator_layers=5)
SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                 base_image_seq_len=256, max_image_seq_len=4096)


DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64", torch.uint8: "U8",
          torch.bool: "BOOL"}


def save_file(tensors, path, metadata=None):
    """safetensors' format, byte-for-byte reproducible: safetensors' own writer (0.8) orders the metadata as a hash
    map does, so the same content gives different bytes from run to run. Tensors and metadata sorted by name."""
    import struct

    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: metadata[k] for k in sorted(metadata)}
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    with safe_open(path, "pt") as f:  # what safetensors reads back
        assert (f.metadata() or {}) == (metadata or {}) and set(f.keys()) == set(tensors)
        assert all(torch.equal(f.get_tensor(k), tensors[k].detach().cpu()) for k in tensors)


def tiny_components(t5_dir):
    from diffusers import AutoencoderKL, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler
    from transformers import T5Config, T5EncoderModel, T5TokenizerFast

    tok = T5TokenizerFast.from_pretrained(t5_dir)
    torch.manual_seed(1)
    t5 = T5EncoderModel(T5Config(
        vocab_size=len(tok), d_model=32, d_kv=8, d_ff=40, num_layers=2, num_heads=4,
        relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
        layer_norm_epsilon=1e-6, dropout_rate=0.0, is_encoder_decoder=False, use_cache=False,
        tie_word_embeddings=False))
    torch.manual_seed(2)
    transformer = ChromaTransformer2DModel(**TINY_TRANSFORMER)
    torch.manual_seed(3)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(8, 16, 16, 16), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=4,
        act_fn="silu", use_quant_conv=False, use_post_quant_conv=False, scaling_factor=0.3611, shift_factor=0.1159,
        sample_size=64, mid_block_add_attention=True, force_upcast=True)
    # Random init leaves some weights at exactly zero/one (norm weights, biases); perturb everything so that a
    # wrong wiring cannot hide behind an identity parameter.
    torch.manual_seed(4)
    for model in (t5, transformer, vae):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    # A random model barely listens to the prompt: the image tokens' attention spreads evenly over the text tokens
    # (two prompts gave 8 levels of mean difference). Sharpen the attention (q/k RMSNorm weights x2) and strengthen
    # the text's keys (x2) and values (x4): two prompts then give visibly different images (about 24 levels).
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if ".norm_q." in name or ".norm_k." in name or ".norm_added_" in name or ".add_k_proj." in name:
                p.mul_(2)
            elif ".add_v_proj." in name:
                p.mul_(4)
    sched = FlowMatchEulerDiscreteScheduler(**SCHEDULER)
    return dict(scheduler=sched, text_encoder=t5, tokenizer=tok, transformer=transformer, vae=vae)


def save_pipeline(pipe, path):
    shutil.rmtree(path, ignore_errors=True)
    pipe.save_pretrained(path, safe_serialization=True)
    # The T5 tokenizer as its SentencePiece model (the tiny one of tests/data/tokenizers/t5) and its config only:
    # the tokenizer.json that save_pretrained writes would double the folder's size.
    shutil.rmtree(os.path.join(path, "tokenizer"))
    os.makedirs(os.path.join(path, "tokenizer"))
    for name in ("spiece.model", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZERS, "t5", name), os.path.join(path, "tokenizer", name))


def folder_size(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def load_pipeline(cls_name, model, dtype):
    import diffusers

    pipe = getattr(diffusers, cls_name).from_pretrained(os.path.join(MODELS, model), torch_dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


CAT = "a photo of a cat"
FOX = "a red fox in the snow"
LONG = " ".join(["a very long prompt about red circles and blue squares"] * 4)
UNICODE = "Ein Café in Zürich — 東京の夜景 🌃, naïve façade"

CASES = [
    # name, pipeline class, model, dtype, call arguments
    # Real classifier-free guidance: two transformer calls a step, neg + g * (pos - neg).
    ("cfg_cat_64x64_s0", "ChromaPipeline", "chroma-tiny", torch.float32,
     dict(prompt=CAT, negative_prompt="blurry, low quality", height=64, width=64, num_inference_steps=3,
          guidance_scale=4.0, max_sequence_length=32, seed=0)),
    # The same call with another prompt: the prompt must change the image.
    ("cfg_fox_64x64_s0", "ChromaPipeline", "chroma-tiny", torch.float32,
     dict(prompt=FOX, negative_prompt="blurry, low quality", height=64, width=64, num_inference_steps=3,
          guidance_scale=4.0, max_sequence_length=32, seed=0)),
    # guidance_scale <= 1: no guidance at all (one call a step, the negative prompt is never encoded, the scale is
    # not applied to anything).
    ("nocfg_cat_64x64_s0", "ChromaPipeline", "chroma-tiny", torch.float32,
     dict(prompt=CAT, negative_prompt="blurry, low quality", height=64, width=64, num_inference_steps=3,
          guidance_scale=1.0, max_sequence_length=32, seed=0)),
    # Two images of one prompt: one noise batch, prompt rows repeated; the negative prompt defaults to "".
    ("images2_unicode_64x64_s42", "ChromaPipeline", "chroma-tiny", torch.float32,
     dict(prompt=UNICODE, height=64, width=64, num_inference_steps=2, guidance_scale=3.0, num_images_per_prompt=2,
          max_sequence_length=40, seed=42)),
    # A prompt list with a negative prompt list.
    ("list_64x64_s5", "ChromaPipeline", "chroma-tiny", torch.float32,
     dict(prompt=[CAT, FOX], negative_prompt=["blurry", "a dog"], height=64, width=64, num_inference_steps=2,
          guidance_scale=3.5, max_sequence_length=32, seed=5)),
    # Non-square, and a prompt cut at max_sequence_length (no padding: the mask is all ones, no extra token).
    ("long_48x80_s7", "ChromaPipeline", "chroma-tiny", torch.float32,
     dict(prompt=LONG, negative_prompt="", height=48, width=80, num_inference_steps=3, guidance_scale=5.0,
          max_sequence_length=24, seed=7)),
    ("bf16_cat_64x64_s0", "ChromaPipeline", "chroma-tiny-bf16", torch.bfloat16,
     dict(prompt=CAT, negative_prompt="blurry, low quality", height=64, width=64, num_inference_steps=3,
          guidance_scale=4.0, max_sequence_length=32, seed=0)),
    # strength 0.6 of 4 steps: t_start = int(4 - 2.4) = 1, three steps run.
    ("img2img_64x64_s3", "ChromaImg2ImgPipeline", "chroma-tiny", torch.float32,
     dict(prompt=CAT, negative_prompt="blurry", image="ref_a", height=64, width=64, strength=0.6,
          num_inference_steps=4, guidance_scale=4.0, max_sequence_length=32, seed=3)),
]


def meta_of(args):
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in args.items()}


def first_call(captured, key, output):
    """Keeps a module's output of its first call; returns None, so that the hook leaves every output as it is."""
    if key not in captured:
        captured[key] = output.clone()


def run_case(name, cls_name, model, dtype, args, pipe=None):
    """One pipeline call and its stages. `pipe`: an already loaded pipeline (LoRA goldens)."""
    from diffusers.pipelines.chroma.pipeline_chroma import calculate_shift

    pipe = pipe or load_pipeline(cls_name, model, dtype)
    args = dict(args)
    seed = args.pop("seed")
    call = dict(args)
    if "image" in args:
        call["image"] = Image.open(os.path.join(IMAGES, args["image"] + ".png")).convert("RGB")
    prompts = [args["prompt"]] if isinstance(args["prompt"], str) else args["prompt"]
    n = args.get("num_images_per_prompt", 1)
    max_seq = args["max_sequence_length"]
    cfg = args["guidance_scale"] > 1
    out = {}

    def tokenize(texts):
        t = pipe.tokenizer(texts, padding="max_length", max_length=max_seq, truncation=True, return_tensors="pt")
        return t.input_ids.to(torch.int64), t.attention_mask.to(torch.int64)

    out["t5_ids"], out["t5_mask"] = tokenize(prompts)
    negatives = None
    if cfg:
        negatives = args.get("negative_prompt") or ""
        negatives = len(prompts) * [negatives] if isinstance(negatives, str) else negatives
        out["negative_t5_ids"], out["negative_t5_mask"] = tokenize(negatives)
    with torch.no_grad():
        pe, text_ids, pmask, npe, ntext_ids, nmask = pipe.encode_prompt(
            prompt=args["prompt"], negative_prompt=args.get("negative_prompt"), device=torch.device("cpu"),
            num_images_per_prompt=n, do_classifier_free_guidance=cfg, max_sequence_length=max_seq)
    out["prompt_embeds"], out["prompt_attention_mask"], out["text_ids"] = pe, pmask, text_ids
    if cfg:
        out["negative_prompt_embeds"], out["negative_prompt_attention_mask"] = npe, nmask
        assert torch.equal(ntext_ids, text_ids)

    calls, captured = [], {}

    def transformer_hook(module, a, kw, output):
        calls.append(dict(hidden=kw["hidden_states"].clone(), timestep=kw["timestep"].clone(),
                          embeds=kw["encoder_hidden_states"].clone(), img_ids=kw["img_ids"].clone(),
                          txt_ids=kw["txt_ids"].clone(),
                          mask=None if kw["attention_mask"] is None else kw["attention_mask"].clone(),
                          out=output[0].clone()))

    hooks = [
        pipe.transformer.register_forward_hook(transformer_hook, with_kwargs=True),
        # A forward hook's return value replaces the module's output: these must return None (setdefault would
        # return the first step's tensor and feed it to every later step).
        pipe.transformer.time_text_embed.register_forward_hook(
            lambda m, a, o: first_call(captured, "approximator_in_step0", o)),
        pipe.transformer.distilled_guidance_layer.register_forward_hook(
            lambda m, a, o: first_call(captured, "approximator_out_step0", o)),
        pipe.vae.decoder.register_forward_hook(lambda m, a, o: captured.update(vae_decoder_in=a[0].clone())),
    ]
    if "image" in args:
        scale_noise = pipe.scheduler.scale_noise

        def record_scale_noise(sample, timestep, noise):
            captured.update(image_latents=sample.clone(), latent_timestep=timestep.clone(), noise=noise.clone())
            return scale_noise(sample, timestep, noise)

        pipe.scheduler.scale_noise = record_scale_noise
    steps, ts = [], []

    def on_step(p, i, t, kwargs):
        steps.append(kwargs["latents"].clone())
        ts.append(t.clone())
        return kwargs

    with torch.no_grad():
        result = pipe(**call, generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                      callback_on_step_end=on_step)
    for h in hooks:
        h.remove()
    if "image" in args:
        del pipe.scheduler.scale_noise
    images = result.images
    per_step = 2 if cfg else 1
    assert len(calls) == per_step * len(steps), (len(calls), len(steps))
    pos = calls[0]
    assert torch.equal(pos["embeds"], pe)
    out["latent_image_ids"] = pos["img_ids"]
    assert torch.equal(pos["txt_ids"], text_ids)
    out["latents_init"] = pos["hidden"]
    out["transformer_in_timestep"] = pos["timestep"]
    out["transformer_in_timesteps"] = torch.stack([c["timestep"] for c in calls[::per_step]])
    out["attention_mask"] = pos["mask"]
    out["transformer_out_step0"] = pos["out"]
    if cfg:
        neg = calls[1]
        assert torch.equal(neg["embeds"], npe) and torch.equal(neg["hidden"], pos["hidden"])
        out["negative_attention_mask"] = neg["mask"]
        out["transformer_out_step0_negative"] = neg["out"]
    out["approximator_in_step0"] = captured["approximator_in_step0"]
    out["approximator_out_step0"] = captured["approximator_out_step0"]
    out["timesteps"] = pipe.scheduler.timesteps.clone()
    out["sigmas"] = pipe.scheduler.sigmas.clone()
    out["timesteps_run"] = torch.stack(ts)
    out["latents_step0"] = steps[0]
    out["latents_final"] = steps[-1]
    out["vae_decoder_in"] = captured["vae_decoder_in"]
    out["image"] = torch.from_numpy(np.ascontiguousarray(images)).float()
    out["image_u8"] = torch.from_numpy((images * 255).round().astype("uint8"))

    h, w = args["height"], args["width"]
    image_seq_len = (h // 16) * (w // 16)
    meta = dict(args, seed=seed, pipeline=cls_name, model=model, dtype=str(dtype).split(".")[-1],
                cfg=cfg, steps_run=len(steps), image_seq_len=image_seq_len,
                mu=calculate_shift(image_seq_len, SCHEDULER["base_image_seq_len"], SCHEDULER["max_image_seq_len"],
                                   SCHEDULER["base_shift"], SCHEDULER["max_shift"]))
    if "image" in args:
        out["init_image"] = pipe.image_processor.preprocess(call["image"], height=h, width=w).float()
        out["image_latents"] = captured["image_latents"]
        out["noise"] = captured["noise"]
        out["latent_timestep"] = captured["latent_timestep"]
        # The generator draws the VAE's posterior sample first, then the noise.
        g = torch.Generator("cpu").manual_seed(seed)
        with torch.no_grad():
            post = pipe.vae.encode(out["init_image"].to(dtype)).latent_dist
            sample = post.sample(g)
        assert torch.equal((sample - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor,
                           out["image_latents"])
    else:
        # The initial noise, drawn exactly as the pipeline draws it.
        g = torch.Generator("cpu").manual_seed(seed)
        init, ids = pipe.prepare_latents(len(prompts) * n, pipe.transformer.config.in_channels // 4, h, w,
                                         pe.dtype, torch.device("cpu"), g)
        assert torch.equal(init, out["latents_init"]) and torch.equal(ids, out["latent_image_ids"])
    return {k: v.contiguous() for k, v in out.items()}, meta_of(meta), pipe


def bool_mask_output(pipe, tensors):
    """The first positive transformer call with the mask as a boolean keep-mask (the original Chroma masking)."""
    with torch.no_grad():
        return pipe.transformer(
            hidden_states=tensors["latents_init"], timestep=tensors["transformer_in_timestep"],
            encoder_hidden_states=tensors["prompt_embeds"], txt_ids=tensors["text_ids"],
            img_ids=tensors["latent_image_ids"], attention_mask=tensors["attention_mask"].bool(),
            return_dict=False)[0]


# ---------------------------------------------------------------------------------------------------- single file
def to_single_file(sd, num_layers, num_single_layers, approximator_layers):
    """diffusers' ChromaTransformer2DModel state dict in the original Chroma names: the inverse of diffusers'
    convert_chroma_transformer_checkpoint_to_diffusers (loaders/single_file_utils.py)."""
    used = set()

    def take(key):
        used.add(key)
        return sd[key]

    out = {}
    g = "distilled_guidance_layer."
    for p in ("in_proj", "out_proj"):
        for t in ("weight", "bias"):
            out[f"{g}{p}.{t}"] = take(f"{g}{p}.{t}")
    for i in range(approximator_layers):
        for src, dst in (("linear_1", "in_layer"), ("linear_2", "out_layer")):
            for t in ("weight", "bias"):
                out[f"{g}layers.{i}.{dst}.{t}"] = take(f"{g}layers.{i}.{src}.{t}")
        out[f"{g}norms.{i}.scale"] = take(f"{g}norms.{i}.weight")
    for src, dst in (("context_embedder", "txt_in"), ("x_embedder", "img_in"), ("proj_out", "final_layer.linear")):
        for t in ("weight", "bias"):
            out[f"{dst}.{t}"] = take(f"{src}.{t}")
    for i in range(num_layers):
        s, d = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for t in ("weight", "bias"):
            out[f"{d}img_attn.qkv.{t}"] = torch.cat([take(f"{s}attn.to_{x}.{t}") for x in "qkv"])
            out[f"{d}txt_attn.qkv.{t}"] = torch.cat([take(f"{s}attn.add_{x}_proj.{t}") for x in "qkv"])
            for src, dst in (("attn.to_out.0", "img_attn.proj"), ("attn.to_add_out", "txt_attn.proj"),
                             ("ff.net.0.proj", "img_mlp.0"), ("ff.net.2", "img_mlp.2"),
                             ("ff_context.net.0.proj", "txt_mlp.0"), ("ff_context.net.2", "txt_mlp.2")):
                out[f"{d}{dst}.{t}"] = take(f"{s}{src}.{t}")
        for src, dst in (("norm_q", "img_attn.norm.query_norm"), ("norm_k", "img_attn.norm.key_norm"),
                         ("norm_added_q", "txt_attn.norm.query_norm"), ("norm_added_k", "txt_attn.norm.key_norm")):
            out[f"{d}{dst}.scale"] = take(f"{s}attn.{src}.weight")
    for i in range(num_single_layers):
        s, d = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        for t in ("weight", "bias"):
            out[f"{d}linear1.{t}"] = torch.cat([take(f"{s}attn.to_{x}.{t}") for x in "qkv"] +
                                               [take(f"{s}proj_mlp.{t}")])
            out[f"{d}linear2.{t}"] = take(f"{s}proj_out.{t}")
        out[f"{d}norm.query_norm.scale"] = take(f"{s}attn.norm_q.weight")
        out[f"{d}norm.key_norm.scale"] = take(f"{s}attn.norm_k.weight")
    assert used == set(sd), f"parameters without a single-file name: {set(sd) - used}"
    return out


def chroma_converter(inner_dim):
    """diffusers' converter as shipped, with its hard-coded FLUX.1 width (inner_dim = 3072, which splits the single
    blocks' linear1) replaced by `inner_dim` for the tiny model."""
    import diffusers.loaders.single_file_utils as sfu

    src = inspect.getsource(sfu.convert_chroma_transformer_checkpoint_to_diffusers)
    assert src.count("inner_dim = 3072") == 1
    src = src.replace("inner_dim = 3072", f"inner_dim = {inner_dim}")
    scope = dict(vars(sfu))
    exec(src, scope)
    return scope["convert_chroma_transformer_checkpoint_to_diffusers"]


def write_single_file(transformer):
    from diffusers import ChromaTransformer2DModel
    from diffusers.loaders import single_file_model

    cfg = transformer.config
    sd = {k: v.detach().clone() for k, v in transformer.state_dict().items()}
    original = to_single_file(sd, cfg.num_layers, cfg.num_single_layers, cfg.approximator_layers)
    path = os.path.join(GOLDENS, "transformer_single_file.safetensors")
    save_file({k: v.contiguous() for k, v in original.items()}, path)
    inner = cfg.num_attention_heads * cfg.attention_head_dim
    converter = chroma_converter(inner)
    back = converter({k: v.clone() for k, v in original.items()})
    assert set(back) == set(sd), set(back) ^ set(sd)
    assert all(torch.equal(back[k], sd[k]) for k in sd)
    # And through diffusers' loader (checkpoint type detected from distilled_guidance_layer.in_proj.bias).
    entry = single_file_model.SINGLE_FILE_LOADABLE_CLASSES["ChromaTransformer2DModel"]
    shipped = entry["checkpoint_mapping_fn"]
    entry["checkpoint_mapping_fn"] = converter
    try:
        loaded = ChromaTransformer2DModel.from_single_file(path, config=os.path.join(MODELS, "chroma-tiny"),
                                                           subfolder="transformer", torch_dtype=torch.float32)
    finally:
        entry["checkpoint_mapping_fn"] = shipped
    lsd = loaded.state_dict()
    assert set(lsd) == set(sd) and all(torch.equal(lsd[k], sd[k]) for k in sd)
    print("wrote transformer_single_file:", len(original), "tensors, loads back exactly")


# ---------------------------------------------------------------------------------------------------- LoRA
LORA_MODULES = [
    "transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.add_k_proj", "transformer_blocks.0.attn.to_add_out",
    "transformer_blocks.0.ff_context.net.2", "transformer_blocks.1.attn.to_out.0", "transformer_blocks.1.ff.net.0.proj",
    "single_transformer_blocks.0.attn.to_v", "single_transformer_blocks.0.proj_out",
    "single_transformer_blocks.1.proj_mlp", "distilled_guidance_layer.in_proj",
    "distilled_guidance_layer.layers.1.linear_2", "distilled_guidance_layer.out_proj", "x_embedder",
    "context_embedder", "proj_out",
]


def write_lora(transformer):
    g = torch.Generator().manual_seed(11)
    lin = {n: m for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)}
    out = {}
    for name in LORA_MODULES:
        a = torch.randn(2, lin[name].in_features, generator=g) * 0.2
        b = torch.randn(lin[name].out_features, 2, generator=g) * 0.2
        out[f"transformer.{name}.lora_A.weight"], out[f"transformer.{name}.lora_B.weight"] = a, b
        out[f"transformer.{name}.alpha"] = torch.tensor(4.0)
    os.makedirs(LORA, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(LORA, "chroma_diffusers.safetensors"))


def lora_golden(base_case, baseline):
    from peft.tuners.tuners_utils import BaseTunerLayer

    name, cls_name, model, dtype, args = base_case
    pipe = load_pipeline(cls_name, model, dtype)
    script = "load chroma_diffusers.safetensors a"
    pipe.load_lora_weights(os.path.join(LORA, "chroma_diffusers.safetensors"), adapter_name="a")
    adapted = sum(isinstance(m, BaseTunerLayer) for m in pipe.transformer.modules())
    assert adapted == len(LORA_MODULES), f"diffusers adapted {adapted} layers, the file has {len(LORA_MODULES)}"
    unfused, _, _ = run_case(name, cls_name, model, dtype, args, pipe=pipe)
    pipe.fuse_lora()
    fused, _, _ = run_case(name, cls_name, model, dtype, args, pipe=pipe)
    d = (unfused["image_u8"].float() - fused["image_u8"].float()).abs()
    assert d.max() <= 1, f"fused and unfused LoRA images differ by up to {d.max()} levels"
    effect = (unfused["image_u8"].float() - baseline.float()).abs().mean().item()
    assert effect > 2, f"the LoRA barely changes the image ({effect:.2f} levels)"
    a = dict(args)
    meta = dict(pipeline=model, prompt=a["prompt"], negative_prompt=a.get("negative_prompt", ""),
                height=a["height"], width=a["width"], steps=a["num_inference_steps"], guidance=a["guidance_scale"],
                seed=a["seed"], max_sequence_length=a["max_sequence_length"], script=script,
                dtype=str(dtype).split(".")[-1], transformer_file="", base_case=name)
    tensors = {"image_u8": unfused["image_u8"][0], "transformer_out_step0": unfused["transformer_out_step0"]}
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(GOLDENS, "lora_diffusers.safetensors"),
              metadata={k: str(v) for k, v in meta.items()})
    print(f"wrote lora_diffusers: {adapted} adapted layers; fused vs unfused max {d.max():.0f} levels "
          f"(mean {d.mean():.3f}); mean level difference from the image without LoRA {effect:.1f}")


# ---------------------------------------------------------------------------------------------------- real layouts
def real_layouts():
    """Names and shapes of the real Chroma1 transformer (diffusers and original single-file names) and of T5-XXL,
    built on the meta device (no memory)."""
    from diffusers import ChromaTransformer2DModel
    from diffusers.loaders.single_file_utils import convert_chroma_transformer_checkpoint_to_diffusers
    from transformers import T5Config, T5EncoderModel

    flux_configs = json.load(open(os.path.join(os.path.dirname(__file__), "flux_real_configs.json")))
    configs = {"transformer": REAL_TRANSFORMER, "text_encoder": flux_configs["text_encoder_2"],
               "scheduler": dict(SCHEDULER, _class_name="FlowMatchEulerDiscreteScheduler")}
    layouts = {"configs": configs}
    with torch.device("meta"):
        t = ChromaTransformer2DModel(**{k: v for k, v in REAL_TRANSFORMER.items() if not k.startswith("_")})
        sd = t.state_dict()
        layouts["transformer"] = {k: list(v.shape) for k, v in sd.items()}
        original = to_single_file(sd, t.config.num_layers, t.config.num_single_layers, t.config.approximator_layers)
        layouts["transformer_single_file"] = {k: list(v.shape) for k, v in original.items()}
        # diffusers' own converter (its 3072 is the real width) maps the single-file names back to these shapes.
        back = convert_chroma_transformer_checkpoint_to_diffusers(dict(original))
        assert {k: list(v.shape) for k, v in back.items()} == layouts["transformer"]
        t5 = T5EncoderModel(T5Config(**configs["text_encoder"]))
        # The real file stores the embedding once, as shared.weight (encoder.embed_tokens.weight is tied to it).
        layouts["text_encoder"] = {k: list(v.shape) for k, v in t5.state_dict().items()
                                   if k != "encoder.embed_tokens.weight"}
    return layouts


def main():
    import diffusers
    from diffusers import ChromaPipeline

    assert diffusers.__version__ == "0.42.1", diffusers.__version__
    torch.set_num_threads(2)
    os.makedirs(GOLDENS, exist_ok=True)
    t5_dir = os.path.join(TOKENIZERS, "t5")

    f32 = ChromaPipeline(**tiny_components(t5_dir))
    save_pipeline(f32, os.path.join(MODELS, "chroma-tiny"))
    bf16 = ChromaPipeline(**tiny_components(t5_dir)).to(torch.bfloat16)
    save_pipeline(bf16, os.path.join(MODELS, "chroma-tiny-bf16"))
    for folder in ("chroma-tiny", "chroma-tiny-bf16"):
        size = folder_size(os.path.join(MODELS, folder))
        print(f"{folder}: {size / 1e6:.2f} MB")
        assert size < 1.5e6

    # The saved folders must reproduce the in-memory pipeline (Bitwise equality is too strict: torch's CPU kernels
    # round differently for mmap'ed vs allocated weights) and tokenize as the in-memory tokenizer (which read
    # tokenizer.json; the folder has only spiece.model).
    reloaded = load_pipeline("ChromaPipeline", "chroma-tiny", torch.float32)
    for p in (CAT, FOX, LONG, UNICODE, "blurry, low quality", ""):
        assert f32.tokenizer(p).input_ids == reloaded.tokenizer(p).input_ids, p
    f32.set_progress_bar_config(disable=True)
    probe = dict(prompt=UNICODE, negative_prompt="blurry", height=64, width=48, num_inference_steps=2,
                 guidance_scale=3.0, max_sequence_length=32, seed=5)
    a, _, _ = run_case("probe", "ChromaPipeline", "chroma-tiny", torch.float32, probe, pipe=f32)
    b, _, _ = run_case("probe", "ChromaPipeline", "chroma-tiny", torch.float32, probe, pipe=reloaded)
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), rtol=1e-5, atol=1e-5), f"reloaded pipeline differs: {k}"
    # from_pretrained rebuilds the non-persistent mod_proj buffer; it must equal the in-memory one.
    assert torch.equal(reloaded.transformer.time_text_embed.mod_proj, f32.transformer.time_text_embed.mod_proj)

    images = {}
    for case in CASES:
        name = case[0]
        tensors, meta, pipe = run_case(*case)
        if name == "cfg_cat_64x64_s0":
            tensors["transformer_out_step0_bool_mask"] = bool_mask_output(pipe, tensors)
            d = (tensors["transformer_out_step0_bool_mask"] - tensors["transformer_out_step0"]).abs().max().item()
            meta["bool_mask_max_abs_difference"] = repr(d)
            print(f"  boolean vs diffusers' float mask, first transformer output: max |difference| {d:.4f}")
        images[name] = tensors["image_u8"]
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(GOLDENS, name + ".safetensors"),
                  metadata=meta)
        print("wrote", name, {k: tuple(v.shape) for k, v in tensors.items()})
    cat, fox = images["cfg_cat_64x64_s0"].float(), images["cfg_fox_64x64_s0"].float()
    two = (cat - fox).abs().mean().item()
    print(f"two prompts, same seed: mean level difference {two:.1f}")
    assert two > 5, "the prompt barely changes the image"
    nocfg = (cat - images["nocfg_cat_64x64_s0"].float()).abs().mean().item()
    print(f"guidance 4 vs guidance 1, same prompt and seed: mean level difference {nocfg:.1f}")
    bf = (cat - images["bf16_cat_64x64_s0"].float()).abs().mean().item()
    print(f"bf16 vs f32, same call: mean level difference {bf:.2f}")

    write_single_file(reloaded.transformer)
    write_lora(reloaded.transformer)
    lora_golden(CASES[0], images["cfg_cat_64x64_s0"][0])

    with open(os.path.join(GOLDENS, "real_layouts.json"), "w") as f:
        json.dump(real_layouts(), f, indent=0, sort_keys=True)
    for name in sorted(os.listdir(GOLDENS)):
        print(f"  {name}: {os.path.getsize(os.path.join(GOLDENS, name))} bytes")


if __name__ == "__main__":
    main()
