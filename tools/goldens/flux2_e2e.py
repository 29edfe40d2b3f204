#!/usr/bin/env python3
"""Tiny FULL FLUX.2 pipelines of the real classes, run end to end from a prompt by diffusers, for Kiln's tests.

    PYTHONPATH=<dir with torchvision> python3 tools/goldens/flux2_e2e.py

(PixtralProcessor imports torchvision; `pip install --target DIR --no-deps torchvision` is enough for the text path.)
Run tools/goldens/flux2_tokenizers.py first: its tokenizer folders become these pipelines' tokenizer/.

The pieces are the ones the stage-by-stage goldens use, so nothing is built twice: the transformer, VAE and
scheduler of tools/goldens/flux2.py (TINY_TRANSFORMER, tiny_vae, flux2_scheduler), the text encoders of
tools/goldens/flux2_text.py (make_mistral, make_qwen) made deep enough for the pipelines' DEFAULT
text_encoder_out_layers ((10, 20, 30) for Mistral 3: 31 layers; (9, 18, 27) for Qwen3: 28 layers) at a tiny width,
and the tokenizers of tools/goldens/flux2_tokenizers.py. The folders are written by save_pretrained in bfloat16 (as
the real checkpoints are stored) and every reference below comes from reloading them with from_pretrained, in float32
and in bfloat16.

Writes, under tests/data/:
  models/flux2-tiny-dev-full/     Flux2Pipeline: Mistral3ForConditionalGeneration + PixtralProcessor, transformer,
                                  VAE, scheduler
  models/flux2-tiny-klein-full/   Flux2KleinPipeline (is_distilled=False: classifier-free guidance): Qwen3ForCausalLM +
                                  its tokenizer, transformer, VAE (decoder with its own block_out_channels), scheduler
  goldens/flux2_e2e/<case>.safetensors   one pipe(prompt=...) call each, captured inside the pipeline: the text
                                  encoder's input_ids / attention_mask, the prompt_embeds the transformer received
                                  (and, with guidance, the negative ones), and the image as PIL would save it
                                  (image_u8, [B, H, W, 3]); the call's arguments in the metadata
"""
import json
import os
import shutil
import sys

import numpy as np
import PIL.Image
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flux2  # noqa: E402  (the image side's tiny pieces)
import flux2_text  # noqa: E402  (the tiny text encoders)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
MODELS = os.path.join(DATA, "models")
GOLDENS = os.path.join(DATA, "goldens", "flux2_e2e")
TOKENIZERS = os.path.join(MODELS, "flux2-tiny-text")
REFERENCES = os.path.join(DATA, "goldens", "flux2")  # ref_a.png, ref_b.png (tools/goldens/flux2.py)

# Narrow decoders, deep enough for the default layers (grouped-query attention, 2 key/value heads so that two
# tensor-parallel ranks split them); 3 layers of 32 make joint_attention_dim 96.
E2E_DECODER = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
MISTRAL_LAYERS = 31  # hidden_states[30] is then a raw layer output, as in the real 40-layer model
QWEN_LAYERS = 28     # hidden_states[27] likewise (Qwen3-4B/8B have 36)
JOINT_DIM = 3 * E2E_DECODER["hidden_size"]

UNICODE_PROMPT = "Crème brûlée, 一只猫 🐶 [IMG] don't"
LONG_PROMPT = ("a lighthouse on a cliff above a stormy sea, waves crashing, dramatic clouds, volumetric light, film "
               "grain, highly detailed, cinematic composition, seagulls")

# name, pipeline, dtype, prompt, negative prompt (klein: its embeddings passed as negative_prompt_embeds, as
# pipe.encode_prompt makes them; None: the pipeline's own ""), height, width (None: the first reference image's),
# steps, guidance, seed, max_sequence_length, reference images, num_images_per_prompt
CASES = [
    ("dev_retriever_64x64_s0", "dev", "f32", "a golden retriever surfing a wave at sunset", None, 64, 64, 3, 4.0, 0,
     512, [], 1),
    ("dev_unicode_80x48_s1234", "dev", "f32", UNICODE_PROMPT, None, 80, 48, 2, 2.5, 1234, 48, [], 1),
    ("dev_empty_64x48_s7_n2", "dev", "f32", "", None, 64, 48, 2, 4.0, 7, 32, [], 2),
    ("dev_long_truncated_48x48_s5", "dev", "f32", LONG_PROMPT, None, 48, 48, 2, 4.0, 5, 24, [], 1),
    ("dev_ref1_64x48_s3", "dev", "f32", "the same scene as a watercolour", None, 64, 48, 2, 4.0, 3, 64, ["ref_a"], 1),
    ("dev_ref2_auto_s11", "dev", "f32", "both pictures in one", None, None, None, 2, 3.0, 11, 40, ["ref_b", "ref_a"],
     1),
    ("devbf16_retriever_64x64_s0", "dev", "bf16", "a golden retriever surfing a wave at sunset", None, 64, 64, 3,
     4.0, 0, 64, [], 1),
    ("devbf16_ref1_64x48_s3", "dev", "bf16", "the same scene as a watercolour", None, 64, 48, 2, 4.0, 3, 64,
     ["ref_a"], 1),
    ("klein_cfg_fox_64x64_s0", "klein", "f32", "a red fox in the snow", None, 64, 64, 3, 4.0, 0, 512, [], 1),
    ("klein_nocfg_unicode_48x80_s9", "klein", "f32", UNICODE_PROMPT, None, 48, 80, 2, 1.0, 9, 48, [], 1),
    ("klein_cfg_ref1_64x64_s2", "klein", "f32", "the fox, at night", None, 64, 64, 2, 3.5, 2, 64, ["ref_a"], 1),
    ("klein_cfg_negative_64x48_s4", "klein", "f32", "a lighthouse", "blurry, low quality", 64, 48, 2, 5.0, 4, 40, [],
     1),
    ("klein_cfg_empty_48x48_s6_n2", "klein", "f32", "", None, 48, 48, 2, 3.0, 6, 32, [], 2),
    ("kleinbf16_cfg_fox_64x64_s0", "klein", "bf16", "a red fox in the snow", None, 64, 64, 3, 4.0, 0, 64, [], 1),
]

FOLDERS = {"dev": os.path.join(MODELS, "flux2-tiny-dev-full"), "klein": os.path.join(MODELS, "flux2-tiny-klein-full")}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def build(kind):
    from diffusers import Flux2KleinPipeline, Flux2Pipeline
    from transformers import AutoProcessor, AutoTokenizer

    if kind == "dev":
        tokenizer = AutoProcessor.from_pretrained(os.path.join(TOKENIZERS, "dev", "tokenizer"))
        text_encoder = flux2_text.make_mistral(len(tokenizer.tokenizer), num_hidden_layers=MISTRAL_LAYERS,
                                               **E2E_DECODER)
        return Flux2Pipeline(scheduler=flux2.flux2_scheduler(), vae=flux2.tiny_vae(3), text_encoder=text_encoder,
                             tokenizer=tokenizer, transformer=flux2.tiny_transformer(2, True, JOINT_DIM))
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(TOKENIZERS, "klein", "tokenizer"))
    text_encoder = flux2_text.make_qwen(len(tokenizer), num_hidden_layers=QWEN_LAYERS, **E2E_DECODER)
    return Flux2KleinPipeline(scheduler=flux2.flux2_scheduler(),
                              vae=flux2.tiny_vae(5, decoder_block_out_channels=(8, 8, 16, 24)),
                              text_encoder=text_encoder, tokenizer=tokenizer,
                              transformer=flux2.tiny_transformer(4, False, JOINT_DIM), is_distilled=False)


def save(kind):
    path = FOLDERS[kind]
    shutil.rmtree(path, ignore_errors=True)
    build(kind).to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    return path


def load(kind, dtype):
    from diffusers import Flux2KleinPipeline, Flux2Pipeline

    cls = Flux2Pipeline if kind == "dev" else Flux2KleinPipeline
    return cls.from_pretrained(FOLDERS[kind], torch_dtype=DTYPES[dtype])


def run_case(pipe, case):
    name, kind, dtype, prompt, negative, height, width, steps, guidance, seed, max_len, refs, n = case
    klein = kind == "klein"
    cfg = klein and guidance > 1.0
    images = [PIL.Image.open(os.path.join(REFERENCES, r + ".png")).convert("RGB") for r in refs]
    kwargs = dict(prompt=prompt, height=height, width=width, num_inference_steps=steps, guidance_scale=guidance,
                  num_images_per_prompt=n, max_sequence_length=max_len, output_type="np")
    if images:
        kwargs["image"] = images if len(images) > 1 else images[0]
    # What the pipeline feeds its text encoder and its transformer, captured inside the calls.
    encoder_inputs, transformer_texts = [], []

    def text_encoder_pre(module, args, kw):
        encoder_inputs.append((kw["input_ids"].clone(), kw["attention_mask"].clone()))

    def transformer_pre(module, args, kw):
        if len(transformer_texts) < (2 if cfg else 1):
            transformer_texts.append(kw["encoder_hidden_states"].clone())

    hooks = [pipe.text_encoder.register_forward_pre_hook(text_encoder_pre, with_kwargs=True),
             pipe.transformer.register_forward_pre_hook(transformer_pre, with_kwargs=True)]
    with torch.no_grad():
        if negative is not None:
            kwargs["negative_prompt_embeds"] = pipe.encode_prompt(prompt=negative, max_sequence_length=max_len)[0]
        result = pipe(generator=torch.Generator("cpu").manual_seed(seed), **kwargs).images
    for h in hooks:
        h.remove()
    # In order: the custom negative prompt, the prompt, and (with guidance and no negative embeddings) the "".
    if negative is not None:
        negative_inputs = encoder_inputs.pop(0)
    elif cfg:
        negative_inputs = encoder_inputs.pop(1)
    assert len(encoder_inputs) == 1, (name, len(encoder_inputs))
    out = {"input_ids": encoder_inputs[0][0], "attention_mask": encoder_inputs[0][1],
           "prompt_embeds": transformer_texts[0],
           "image_u8": torch.from_numpy((result * 255).round().astype("uint8"))}
    if cfg:
        out["negative_prompt_embeds"] = transformer_texts[1]
        out["negative_input_ids"], out["negative_attention_mask"] = negative_inputs
    meta = dict(pipeline=os.path.basename(FOLDERS[kind]), dtype=dtype, prompt=prompt,
                negative_prompt="" if negative is None else negative, height=str(height or 0),
                width=str(width or 0), steps=str(steps), guidance=repr(guidance), seed=str(seed),
                max_sequence_length=str(max_len), num_images_per_prompt=str(n), references=",".join(refs),
                cfg="true" if cfg else "false")
    return {k: v.contiguous() for k, v in out.items()}, meta


def main():
    torch.set_num_threads(2)
    os.makedirs(GOLDENS, exist_ok=True)
    for kind in FOLDERS:
        save(kind)
    pipes = {}
    summary = {}
    for case in CASES:
        name, kind, dtype = case[0], case[1], case[2]
        if (kind, dtype) not in pipes:
            pipes[(kind, dtype)] = load(kind, dtype)
        tensors, meta = run_case(pipes[(kind, dtype)], case)
        save_file(tensors, os.path.join(GOLDENS, name + ".safetensors"), metadata=meta)
        summary[name] = {k: list(v.shape) for k, v in tensors.items()}
        embeds = tensors["prompt_embeds"].float()
        print("wrote", name, summary[name], "max |prompt_embeds|", float(embeds.abs().max()),
              "image mean", float(tensors["image_u8"].float().mean()))
    # Which classes the saved folders name (Kiln's loader accepts exactly these).
    for kind, path in FOLDERS.items():
        with open(os.path.join(path, "model_index.json")) as f:
            index = json.load(f)
        print(kind, {k: v for k, v in index.items() if isinstance(v, list)})
        print(kind, "tokenizer files:", sorted(os.listdir(os.path.join(path, "tokenizer"))))


if __name__ == "__main__":
    main()
