#!/usr/bin/env python3
"""Writes a full-size diffusers pipeline folder with random weights: every component's real config, tensor
names and shapes, from diffusers' and transformers' own classes, for memory and speed measurements on real
sizes (issues #13 and #18). Nothing of a real checkpoint is needed or downloaded.

The models are built on the meta device (no memory), then their tensors are drawn and written shard by shard
(at most --shard-gb per file, with diffusers' / transformers' *.safetensors.index.json), so a model larger
than the machine's memory can be written. Tokenizers are the small ones of the committed test pipelines (their
ids are valid for the real vocabularies); the scheduler config is the real one.

Usage: python tools/full_size/make_checkpoint.py --model flux-schnell --out /tmp/flux1-schnell-full
       (--model flux-schnell | flux-dev | sd35-large | sd35-medium; about 33 / 33 / 28 / 16 GB of disk)
       --blocks D,S and --t5-layers N keep every width and shape but fewer FLUX transformer blocks (D double,
       S single; SD3: --blocks N) and T5 layers: a FLUX-shaped pipeline that fits a small machine, e.g.
       --blocks 2,4 --t5-layers 2 (about 4 GB) for the load test of kiln serve (bench/serve_load.py).
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
    """Weights a forward pass stays finite on: norm scales near 1, biases near 0, the rest N(0, 0.02)."""
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name and leaf in ("weight", "scale"):
        return (1 + 0.02 * torch.randn(shape, generator=generator)).to(torch.bfloat16)
    if leaf == "bias":
        return (0.02 * torch.randn(shape, generator=generator)).to(torch.bfloat16)
    return (0.02 * torch.randn(shape, generator=generator)).to(torch.bfloat16)


def write_weights(model, folder, stem, shard_bytes, seed):
    """Draws every tensor of `model` (on the meta device) and writes `stem`[-0000i-of-0000n].safetensors."""
    os.makedirs(folder, exist_ok=True)
    shapes = [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
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
    else:  # transformers
        model.config.torch_dtype = torch.bfloat16
        model.config.save_pretrained(folder)


def shallower(config, layers):
    """`config` with the given layer counts ({key: count}) where they are set."""
    return {**config, **{k: v for k, v in layers.items() if v is not None}}


def components(kind, blocks=None, t5_layers=None):
    """(name, model on the meta device, weights file stem) of each component with weights; `blocks` (FLUX:
    (double, single), SD3: (joint,)) and `t5_layers` make the transformer and T5 shallower."""
    blocks = blocks or ()
    t5 = {"num_layers": t5_layers}
    from diffusers import AutoencoderKL, FluxTransformer2DModel, SD3Transformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    if kind.startswith("flux"):
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
    for name, make, stem in makers:
        with torch.device("meta"):  # only while building: the weights are drawn on the CPU
            model = make()
        yield name, model, stem


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, choices=["flux-schnell", "flux-dev", "sd35-large", "sd35-medium"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--blocks", help="transformer blocks: D,S (FLUX: double, single) or N (SD3); default: the real ones")
    ap.add_argument("--t5-layers", type=int, help="T5 encoder layers (default: the real 24)")
    args = ap.parse_args()
    blocks = tuple(int(b) for b in args.blocks.split(",")) if args.blocks else None
    if blocks and len(blocks) != (2 if args.model.startswith("flux") else 1):
        ap.error("--blocks: FLUX takes D,S (double and single blocks), SD3 one count")

    # Everything that is not weights comes from a committed tiny pipeline of the same class: model_index.json,
    # tokenizers, scheduler config (FLUX.1-schnell's has shift 1.0 without dynamic shifting, dev's and SD3.5's
    # their own).
    tiny = {"flux-schnell": "flux-tiny-schnell", "flux-dev": "flux-tiny-dev", "sd35-large": "sd3-tiny-large",
            "sd35-medium": "sd3-tiny-medium"}[args.model]
    shutil.rmtree(args.out, ignore_errors=True)
    shutil.copytree(os.path.join(TINY, tiny), args.out,
                    ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json", "config.json"))
    total = 0
    for i, (name, model, stem) in enumerate(components(args.model, blocks, args.t5_layers)):
        folder = os.path.join(args.out, name)
        save_config(model, folder)
        total += write_weights(model, folder, stem, int(args.shard_gb * 1e9), args.seed + i)
    print(f"wrote {args.out}: {total / 1e9:.1f} GB of bf16 weights", flush=True)


if __name__ == "__main__":
    sys.exit(main())
