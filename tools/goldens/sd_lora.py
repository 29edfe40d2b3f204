#!/usr/bin/env python3
"""diffusers/PEFT-format LoRA files for the tiny SD1.5 and SDXL pipelines of tools/goldens/sd.py, and diffusers' images
with them loaded (StableDiffusionLoraLoaderMixin / StableDiffusionXLLoraLoaderMixin.load_lora_weights).

    python3 tools/goldens/sd_lora.py      (torch, diffusers 0.42, peft, transformers, safetensors from pip)

Outputs (committed; CI never runs this):
  tests/data/lora/sd15_diffusers.safetensors   unet.* (every Linear of the transformer blocks: attn1/attn2 to_q, to_k,
                                               to_v, to_out.0, ff.net.0.proj, ff.net.2) and text_encoder.* (CLIP's
                                               q/k/v/out_proj), rank 4, random (fixed seed)
  tests/data/lora/sdxl_diffusers.safetensors   the same for SDXL's UNet (its linear proj_in / proj_out too) and
                                               text_encoder.* / text_encoder_2.*
  tests/data/lora/sd15_metadata.safetensors    SD1.5's pairs again (another seed) with the lora_adapter_metadata
                                               header diffusers' save_lora_weights writes (PEFT's LoraConfig per
                                               component: unet.lora_alpha 8 over rank 4, one module at alpha 2 by
                                               unet.alpha_pattern; text_encoder.lora_alpha 1), which load_lora_weights
                                               turns into the adapters' scales in place of alpha = rank
  tests/data/goldens/sd/lora_<model>.safetensors   image_u8 of one call after load_lora_weights (+ set_adapters
                                               weight, or fuse_lora scale, in the metadata "script", as
                                               tools/goldens/lora.py writes it), the call in the metadata
"""
import json
import os

import torch
from safetensors.torch import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
LORA = os.path.join(ROOT, "tests", "data", "lora")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "sd")
UNET_LINEARS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k", "attn2.to_v",
                "attn2.to_out.0", "ff.net.0.proj", "ff.net.2")
CLIP_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj")


def lora_file(pipe, components, seed, rank=4):
    """Random A/B pairs in PEFT's diffusers names for every Linear these components' LoRAs usually touch."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for comp in components:
        model = getattr(pipe, comp)
        for name, m in model.named_modules():
            if not isinstance(m, torch.nn.Linear):
                continue
            wanted = UNET_LINEARS + ("proj_in", "proj_out") if comp == "unet" else CLIP_LINEARS
            if not any(name.endswith(w) for w in wanted) or (comp == "unet" and "transformer_blocks" not in name
                                                             and not name.endswith(("proj_in", "proj_out"))):
                continue
            prefix = f"{comp}.{name}" if comp == "unet" else f"{comp}.text_model.{name.removeprefix('text_model.')}"
            tensors[prefix + ".lora_A.weight"] = torch.randn(rank, m.in_features, generator=g) * 0.3
            tensors[prefix + ".lora_B.weight"] = torch.randn(m.out_features, rank, generator=g) * 0.3
    return tensors


# PEFT LoraConfig fields per component, as diffusers' save_lora_weights(..., unet_lora_adapter_metadata=...) stores
# them in the file's header.
ALPHA_PATTERN_MODULE = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"


def adapter_metadata(tensors):
    meta = {}
    for comp, alpha in (("unet", 8.0), ("text_encoder", 1.0)):
        modules = sorted({k[len(comp) + 1:].rsplit(".lora_", 1)[0] for k in tensors if k.startswith(comp + ".")})
        if comp == "text_encoder":
            modules = [m.removeprefix("text_model.") for m in modules]
        meta.update({f"{comp}.r": 4, f"{comp}.lora_alpha": alpha, f"{comp}.target_modules": modules,
                     f"{comp}.init_lora_weights": "gaussian"})
    meta["unet.alpha_pattern"] = {ALPHA_PATTERN_MODULE: 2.0}
    return {"lora_adapter_metadata": json.dumps(meta), "format": "pt"}


def main():
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    os.makedirs(LORA, exist_ok=True)
    cases = [("sd15", StableDiffusionPipeline, ["unet", "text_encoder"], "set sd=0.7", dict(guidance_scale=7.5)),
             ("sdxl", StableDiffusionXLPipeline, ["unet", "text_encoder", "text_encoder_2"], "fuse 0.8",
              dict(guidance_scale=5.0)),
             ("sd15_metadata", StableDiffusionPipeline, ["unet", "text_encoder"], "set sd=1.0",
              dict(guidance_scale=7.5))]
    for name, cls, components, then, call in cases:
        model = name.split("_")[0]
        folder = os.path.join(MODELS, model + "-tiny")
        kwargs = dict(safety_checker=None) if model == "sd15" else {}
        pipe = cls.from_pretrained(folder, **kwargs)
        pipe.set_progress_bar_config(disable=True)
        file = f"{model}_diffusers" if name == model else name
        path = os.path.join(LORA, f"{file}.safetensors")
        tensors = lora_file(pipe, components, seed={"sd15": 5, "sdxl": 6, "sd15_metadata": 7}[name])
        save_file({k: v.contiguous() for k, v in tensors.items()}, path,
                  metadata=adapter_metadata(tensors) if name.endswith("metadata") else None)
        pipe.load_lora_weights(path, adapter_name="sd")
        if then.startswith("set"):
            pipe.set_adapters(["sd"], [float(then.split("=")[1])])
        else:
            pipe.fuse_lora(lora_scale=float(then.split()[1]))
        # Every pair loaded: diffusers adapted as many layers as the file has pairs.
        from peft.tuners.tuners_utils import BaseTunerLayer
        adapted = sum(isinstance(m, BaseTunerLayer) for comp in components
                      for m in getattr(pipe, comp).modules())
        assert adapted == len(tensors) // 2, (model, adapted, len(tensors) // 2)
        if name.endswith("metadata"):  # diffusers took the header's alphas: 8 / 4, the pattern's 2 / 4, CLIP 1 / 4
            unet_scale = pipe.unet.get_submodule("down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_k").scaling
            pattern_scale = pipe.unet.get_submodule(ALPHA_PATTERN_MODULE).scaling
            clip_scale = next(m for n, m in pipe.text_encoder.named_modules()
                              if n.endswith("layers.0.self_attn.q_proj")).scaling
            assert (unet_scale["sd"], pattern_scale["sd"], clip_scale["sd"]) == (2.0, 0.5, 0.25), \
                (unet_scale, pattern_scale, clip_scale)
        args = dict(prompt="a cat", height=32, width=32, num_inference_steps=3, seed=3, **call)
        with torch.no_grad():
            image = pipe(**{k: v for k, v in args.items() if k != "seed"}, output_type="np",
                         generator=torch.Generator("cpu").manual_seed(args["seed"])).images[0]
        plain = cls.from_pretrained(folder, **kwargs)
        plain.set_progress_bar_config(disable=True)
        with torch.no_grad():
            base = plain(**{k: v for k, v in args.items() if k != "seed"}, output_type="np",
                         generator=torch.Generator("cpu").manual_seed(args["seed"])).images[0]
        moved = float(abs(image * 255 - base * 255).mean())
        assert moved > 2.0, (model, moved)  # the adapters change the image
        meta = {"pipeline": cls.__name__, "model": model + "-tiny", "dtype": "float32",
                "script": f"load {file}.safetensors sd; {then}",
                **{k: (v if isinstance(v, str) else json.dumps(v)) for k, v in args.items()}}
        save_file({"image_u8": torch.from_numpy((image * 255).round().astype("uint8"))[None].contiguous()},
                  os.path.join(GOLDENS, f"lora_{name}.safetensors"), metadata=meta)
        print(name, "pairs", len(tensors) // 2, "mean level change from the LoRA", round(moved, 2))


if __name__ == "__main__":
    main()
