#!/usr/bin/env python3
"""Writes a full-size diffusers pipeline folder with random weights: every component's real config, tensor
names and shapes, from diffusers' and transformers' own classes, for memory and speed measurements on real
sizes (issues #13 and #18). Nothing of a real checkpoint is needed or downloaded.

The models are built on the meta device (no memory), then their tensors are drawn and written shard by shard
(at most --shard-gb per file, with diffusers' / transformers' *.safetensors.index.json), so a model larger
than the machine's memory can be written. Tokenizers are the small ones of the committed test pipelines (their
ids are valid for the real vocabularies); the scheduler config is the real one.

Usage: python tools/full_size/make_checkpoint.py --model flux-schnell --out /tmp/flux1-schnell-full
       (--model flux-schnell | flux-dev | flux2-dev | sd35-large | sd35-medium | qwen-image; about 33 / 33 /
       67 / 28 / 16 / 57 GB of disk)
       --blocks D,S and --t5-layers N keep every width and shape but fewer FLUX transformer blocks (D double,
       S single; SD3: --blocks N) and T5 layers: a FLUX-shaped pipeline that fits a small machine, e.g.
       --blocks 2,4 --t5-layers 2 (about 4 GB) for the load test of kiln serve (bench/serve_load.py).
       qwen-image: QwenImagePipeline with diffusers' QwenImageTransformer2DModel and AutoencoderKLQwenImage at
       their defaults (Qwen-Image's: 60 dual-stream blocks of width 3072, 20.4 B parameters; the 16-channel
       causal VAE) and Qwen2.5-VL-7B-Instruct's language model (hidden 3584, 28 layers, 28 heads, 4 kv heads,
       intermediate 18944, vocab 152064, mrope_section 16/24/24, rope_theta 1e6, lm_head untied) with a
       one-block vision tower of width 32 (Qwen-Image's text path never reads it; the real one is 0.67 B
       parameters more). --blocks N and --text-layers N cut the transformer's blocks and the text encoder's
       layers, every width kept: e.g. --blocks 8 --text-layers 4 (about 10 GB). The tokenizer is the tiny
       Qwen2 BPE of tests/data/models/qwen-image-tiny (its special tokens at other ids than the real
       vocabulary's, all valid in it).
       flux2-dev: Flux2Pipeline with FLUX.2-dev's transformer (Flux2Transformer2DModel: width 6144, 48 heads,
       SwiGLU 18432, 8 double and 48 single blocks; --blocks D,S cuts them) and VAE (AutoencoderKLFlux2) at their
       real configs (tools/goldens/flux2_real_configs.json). Its text encoder is the committed tiny Mistral of
       tests/data/models/flux2-tiny-dev-full (31 layers of width 32, its tokenizer), not Mistral Small 3.x's 24 B
       parameters, so the transformer's joint_attention_dim is that encoder's 3 x 32 = 96 instead of 15360: only
       context_embedder is narrower; the text tokens the blocks see are full width. E.g. --blocks 1,3 (about
       5 GB) for bench/step_cache.py.
Needs torch, diffusers, transformers, safetensors (pip).
"""
import argparse
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDENS = os.path.join(ROOT, "tools", "goldens")
TINY = os.path.join(ROOT, "tests", "data", "models")


def real(file, key):
    with open(os.path.join(GOLDENS, file)) as f:
        cfg = dict(json.load(f)[key])
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def draw(name, shape, generator):
    """Weights a forward pass stays finite on: norm scales and batch-norm variances (FLUX.2's VAE: a negative one
    would make its latents NaN) near 1, biases near 0, the rest N(0, 0.02)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "running_var":
        return (1 + 0.02 * torch.randn(shape, generator=generator)).to(torch.bfloat16)
    if leaf == "num_batches_tracked":
        return torch.zeros(shape, dtype=torch.int64)
    if "norm" in name and leaf in ("weight", "scale"):
        return (1 + 0.02 * torch.randn(shape, generator=generator)).to(torch.bfloat16)
    if leaf == "bias":
        return (0.02 * torch.randn(shape, generator=generator)).to(torch.bfloat16)
    return (0.02 * torch.randn(shape, generator=generator)).to(torch.bfloat16)


def write_weights(model, folder, stem, shard_bytes, seed, rename=None):
    """Draws every tensor of `model` (on the meta device) and writes `stem`[-0000i-of-0000n].safetensors, each
    under rename(its name in the module tree) when given (the name save_pretrained writes)."""
    os.makedirs(folder, exist_ok=True)
    rename = rename or (lambda name: name)
    shapes = [(rename(n), tuple(t.shape)) for n, t in model.state_dict().items()]
    groups, current, size = [], [], 0
    for name, shape in shapes:
        nbytes = 2 * max(1, int(torch.Size(shape).numel()))
        if current and size + nbytes > shard_bytes:
            groups.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += nbytes
    groups.append(current)
    generator = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        file = f"{stem}.safetensors" if len(groups) == 1 else f"{stem}-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {name: draw(name, shape, generator) for name, shape in group}
        total += sum(t.numel() * 2 for t in tensors.values())
        save_file(tensors, os.path.join(folder, file), metadata={"format": "pt"})
        del tensors
        for name, _ in group:
            weight_map[name] = file
        print(f"  {os.path.basename(folder)}/{file}: {len(group)} tensors", flush=True)
    if len(groups) > 1:
        with open(os.path.join(folder, f"{stem}.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return total


def save_config(model, folder):
    """The component's config.json as its class writes it (diffusers or transformers)."""
    os.makedirs(folder, exist_ok=True)
    if hasattr(model, "save_config"):  # diffusers
        model.save_config(folder)
    else:  # transformers; save_pretrained names the class, as loaders read it
        model.config.torch_dtype = torch.bfloat16
        model.config.architectures = [type(model).__name__]
        model.config.save_pretrained(folder)


def shallower(config, layers):
    """`config` with the given layer counts ({key: count}) where they are set."""
    return {**config, **{k: v for k, v in layers.items() if v is not None}}


# Qwen/Qwen-Image text_encoder/config.json: Qwen2.5-VL-7B-Instruct; the vision tower cut to one block of
# width 32 (its real config: depth 32, width 1280), as the text path never reads it.
QWEN25_VL_7B_TEXT = dict(
    vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
    num_key_value_heads=4, hidden_act="silu", max_position_embeddings=128000, rms_norm_eps=1e-6, rope_theta=1e6,
    rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}, use_sliding_window=False, sliding_window=32768,
    max_window_layers=28, attention_dropout=0.0, bos_token_id=151643, eos_token_id=151645)
QWEN25_VL_TINY_VISION = dict(
    depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=3584, patch_size=14,
    spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[0], window_size=112)


def qwen25_vl_saved_name(name):
    """Qwen2.5-VL's module-tree name -> the one save_pretrained writes (and the real checkpoint holds)."""
    for tree, saved in (("model.language_model.", "model."), ("model.visual.", "visual.")):
        if name.startswith(tree):
            return saved + name[len(tree):]
    return name


def qwen_image_makers(blocks, text_layers):
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    def text_encoder():
        text = shallower(QWEN25_VL_7B_TEXT, {"num_hidden_layers": text_layers})
        return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
            text_config=text, vision_config=QWEN25_VL_TINY_VISION, image_token_id=151655, video_token_id=151656,
            vision_start_token_id=151652, vision_end_token_id=151653, tie_word_embeddings=False))

    return [
        ("text_encoder", text_encoder, "model", qwen25_vl_saved_name),
        ("transformer", lambda: QwenImageTransformer2DModel(**shallower({}, {"num_layers": blocks[0] if blocks else None})),
         "diffusion_pytorch_model", None),
        ("vae", lambda: AutoencoderKLQwenImage(), "diffusion_pytorch_model", None),
    ]


def components(kind, blocks=None, t5_layers=None, text_layers=None):
    """(name, model on the meta device, weights file stem, tensor renaming or None) of each component with
    weights; `blocks` (FLUX: (double, single), SD3 and Qwen-Image: (blocks,)), `t5_layers` and `text_layers`
    (Qwen2.5-VL) make the transformer and the text encoders shallower."""
    blocks = blocks or ()
    t5 = {"num_layers": t5_layers}
    from diffusers import AutoencoderKL, FluxTransformer2DModel, SD3Transformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    if kind == "qwen-image":
        makers = qwen_image_makers(blocks, text_layers)
    elif kind == "flux2-dev":
        from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel

        # The tiny Mistral's three hidden states (text_encoder_out_layers 10, 20, 30) of width 32.
        config = shallower(real("flux2_real_configs.json", "transformer_dev"),
                           {"num_layers": blocks[0] if blocks else None,
                            "num_single_layers": blocks[1] if blocks else None, "joint_attention_dim": 3 * 32})
        makers = [
            ("transformer", lambda: Flux2Transformer2DModel(**config), "diffusion_pytorch_model"),
            ("vae", lambda: AutoencoderKLFlux2(**real("flux2_real_configs.json", "vae")), "diffusion_pytorch_model"),
        ]
    elif kind.startswith("flux"):
        key = "transformer_schnell" if kind == "flux-schnell" else "transformer_dev"
        makers = [
            ("text_encoder", lambda: CLIPTextModel(CLIPTextConfig(**real("flux_real_configs.json", "text_encoder"))),
             "model"),
            ("text_encoder_2",
             lambda: T5EncoderModel(T5Config(**shallower(real("flux_real_configs.json", "text_encoder_2"), t5))),
             "model"),
            ("transformer",
             lambda: FluxTransformer2DModel(**shallower(real("flux_real_configs.json", key),
                                                        {"num_layers": blocks[0] if blocks else None,
                                                         "num_single_layers": blocks[1] if blocks else None})),
             "diffusion_pytorch_model"),
            ("vae", lambda: AutoencoderKL(**real("flux_real_configs.json", "vae")), "diffusion_pytorch_model"),
        ]
    else:
        key = "transformer_large" if kind == "sd35-large" else "transformer_medium"
        clip = lambda name: lambda: CLIPTextModelWithProjection(CLIPTextConfig(**real("sd3_real_configs.json", name)))
        makers = [
            ("text_encoder", clip("text_encoder"), "model"),
            ("text_encoder_2", clip("text_encoder_2"), "model"),
            ("text_encoder_3",
             lambda: T5EncoderModel(T5Config(**shallower(real("sd3_real_configs.json", "text_encoder_3"), t5))),
             "model"),
            ("transformer",
             lambda: SD3Transformer2DModel(**shallower(real("sd3_real_configs.json", key),
                                                       {"num_layers": blocks[0] if blocks else None})),
             "diffusion_pytorch_model"),
            ("vae", lambda: AutoencoderKL(**real("sd3_real_configs.json", "vae")), "diffusion_pytorch_model"),
        ]
    for name, make, stem, *rename in makers:
        with torch.device("meta"):  # only while building: the weights are drawn on the CPU
            model = make()
        yield name, model, stem, rename[0] if rename else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True,
                    choices=["flux-schnell", "flux-dev", "flux2-dev", "sd35-large", "sd35-medium", "qwen-image"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--blocks",
                    help="transformer blocks: D,S (FLUX: double, single) or N (SD3, Qwen-Image); default: the real ones")
    ap.add_argument("--t5-layers", type=int, help="T5 encoder layers (default: the real 24)")
    ap.add_argument("--text-layers", type=int, help="qwen-image: Qwen2.5-VL layers (default: the real 28)")
    args = ap.parse_args()
    blocks = tuple(int(b) for b in args.blocks.split(",")) if args.blocks else None
    if blocks and len(blocks) != (2 if args.model.startswith("flux") else 1):
        ap.error("--blocks: FLUX takes D,S (double and single blocks), SD3 and Qwen-Image one count")
    if blocks and min(blocks) < 1 or args.text_layers is not None and args.text_layers < 1:
        ap.error("--blocks and --text-layers must be at least 1")
    if args.text_layers is not None and args.model != "qwen-image":
        ap.error("--text-layers cuts Qwen-Image's text encoder; the other models' T5: --t5-layers")
    if args.t5_layers is not None and args.model == "qwen-image":
        ap.error("qwen-image has no T5; its text encoder's depth: --text-layers")

    # Everything that is not weights comes from a committed tiny pipeline of the same class: model_index.json,
    # tokenizers, scheduler config (FLUX.1-schnell's has shift 1.0 without dynamic shifting, dev's and SD3.5's
    # their own; Qwen-Image's is Qwen/Qwen-Image's, tools/goldens/qwen_image.py's SCHEDULER).
    tiny = {"flux-schnell": "flux-tiny-schnell", "flux-dev": "flux-tiny-dev", "sd35-large": "sd3-tiny-large",
            "sd35-medium": "sd3-tiny-medium", "qwen-image": "qwen-image-tiny",
            "flux2-dev": "flux2-tiny-dev-full"}[args.model]
    shutil.rmtree(args.out, ignore_errors=True)
    shutil.copytree(os.path.join(TINY, tiny), args.out,
                    ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json", "config.json"))
    if args.model == "flux2-dev":  # the tiny text encoder, weights and all
        shutil.copytree(os.path.join(TINY, tiny, "text_encoder"), os.path.join(args.out, "text_encoder"),
                        dirs_exist_ok=True)
    total = 0
    for i, (name, model, stem, rename) in enumerate(components(args.model, blocks, args.t5_layers, args.text_layers)):
        folder = os.path.join(args.out, name)
        save_config(model, folder)
        total += write_weights(model, folder, stem, int(args.shard_gb * 1e9), args.seed + i, rename)
    print(f"wrote {args.out}: {total / 1e9:.1f} GB of bf16 weights", flush=True)


if __name__ == "__main__":
    sys.exit(main())
