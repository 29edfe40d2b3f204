#!/usr/bin/env python3
"""kohya (sd-scripts) LoRA files for the tiny SD1.5 and SDXL pipelines, and diffusers' images with them loaded
(StableDiffusionLoraLoaderMixin / StableDiffusionXLLoraLoaderMixin.load_lora_weights, which converts them with
_maybe_map_sgm_blocks_to_diffusers and _convert_non_diffusers_lora_to_diffusers).

    python3 tools/goldens/sd_kohya_lora.py   (torch, diffusers 0.42, peft, transformers, safetensors from pip;
                                              after tools/goldens/sd_lora.py, whose random pairs it renames)

Outputs (committed; CI never runs this):
  tests/data/lora/sd15_kohya.safetensors   sd15_diffusers.safetensors' pairs as kohya names them for SD1.x:
                                           lora_unet_<diffusers module, '_' for '.'> and lora_te_<CLIP module>,
                                           lora_down / lora_up, plus 4-D [rank, C, 1, 1] / [C, rank, 1, 1]
                                           pairs for every proj_in / proj_out (1x1 convolutions in SD1.5)
  tests/data/lora/sdxl_kohya.safetensors   sdxl_diffusers.safetensors' pairs under SGM's UNet names
                                           (lora_unet_input_blocks_4_1_..., middle_block_1_..., output_blocks_
                                           0_1_...) and lora_te1_ (CLIP-L) / lora_te2_ (OpenCLIP bigG)
  Every pair has an .alpha different from its rank 4 (UNet 2, CLIP-L 6, bigG 1), so alpha / rank is tested.
  tests/data/goldens/sd/lora_kohya_<model>_<unfused|fused>.safetensors   image_u8 of one call after
                                           load_lora_weights, then set_adapters weight 0.7 (unfused) or
                                           fuse_lora(lora_scale=0.8) (fused), the call in the metadata
"""
import json
import os

import torch
from safetensors.torch import load_file, save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
LORA = os.path.join(ROOT, "tests", "data", "lora")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "sd")
# One alpha per component, none equal to the rank (4). Within a component diffusers 0.42 scales every pair by
# its own alpha only outside the attention layers: their converted alpha names keep ".processor", match no
# module, and those layers take the component's most common alpha. kohya writes one network_alpha for all.
ALPHAS = {"lora_unet": 2.0, "lora_te": 6.0, "lora_te1": 6.0, "lora_te2": 1.0}


def sgm_module(module, layers_per_block):
    """A diffusers UNet module (down_blocks.L.attentions.J...) under SGM's original name."""
    parts = module.split(".")
    per = layers_per_block + 1
    if parts[0] == "down_blocks" and parts[2] == "attentions":
        return ".".join(["input_blocks", str(1 + int(parts[1]) * per + int(parts[3])), "1"] + parts[4:])
    if parts[0] == "mid_block" and parts[1] == "attentions":
        return ".".join(["middle_block", "1"] + parts[3:])
    if parts[0] == "up_blocks" and parts[2] == "attentions":
        return ".".join(["output_blocks", str(int(parts[1]) * per + int(parts[3])), "1"] + parts[4:])
    raise ValueError(module)


def kohya_file(pipe, model):
    peft = load_file(os.path.join(LORA, f"{model}_diffusers.safetensors"))
    g = torch.Generator().manual_seed(11 if model == "sd15" else 12)
    lpb = pipe.unet.config.layers_per_block
    out = {}
    for key in sorted(k for k in peft if k.endswith(".lora_A.weight")):
        module = key[: -len(".lora_A.weight")]
        comp, rest = module.split(".", 1)
        if comp == "unet":
            name = "lora_unet_" + (rest if model == "sd15" else sgm_module(rest, lpb)).replace(".", "_")
        else:
            prefix = {"text_encoder": "lora_te_" if model == "sd15" else "lora_te1_",
                      "text_encoder_2": "lora_te2_"}[comp]
            name = prefix + rest.replace(".", "_")
        out[name + ".lora_down.weight"] = peft[key]
        out[name + ".lora_up.weight"] = peft[module + ".lora_B.weight"]
    if model == "sd15":  # proj_in / proj_out: 1x1 convolutions, 4-D pairs
        for name, m in pipe.unet.named_modules():
            if name.endswith(("proj_in", "proj_out")) and isinstance(m, torch.nn.Conv2d):
                flat = "lora_unet_" + name.replace(".", "_")
                out[flat + ".lora_down.weight"] = torch.randn(4, m.in_channels, 1, 1, generator=g) * 0.3
                out[flat + ".lora_up.weight"] = torch.randn(m.out_channels, 4, 1, 1, generator=g) * 0.3
    names = sorted({k.split(".")[0] for k in out})
    for name in names:
        out[name + ".alpha"] = torch.tensor(ALPHAS["_".join(name.split("_")[:2])])
    return out, len(names)


def main():
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline
    from peft.tuners.tuners_utils import BaseTunerLayer

    cases = [("sd15", StableDiffusionPipeline, ["unet", "text_encoder"], dict(guidance_scale=7.5)),
             ("sdxl", StableDiffusionXLPipeline, ["unet", "text_encoder", "text_encoder_2"], dict(guidance_scale=5.0))]
    for model, cls, components, call in cases:
        folder = os.path.join(MODELS, model + "-tiny")
        kwargs = dict(safety_checker=None) if model == "sd15" else {}
        args = dict(prompt="a cat", height=32, width=32, num_inference_steps=3, seed=4, **call)

        def run(pipe):
            with torch.no_grad():
                return pipe(**{k: v for k, v in args.items() if k != "seed"}, output_type="np",
                            generator=torch.Generator("cpu").manual_seed(args["seed"])).images[0]

        plain = cls.from_pretrained(folder, **kwargs)
        plain.set_progress_bar_config(disable=True)
        base = run(plain)
        path = os.path.join(LORA, f"{model}_kohya.safetensors")
        tensors, pairs = None, None
        for then in ("set sd=0.7", "fuse 0.8"):
            pipe = cls.from_pretrained(folder, **kwargs)
            pipe.set_progress_bar_config(disable=True)
            if tensors is None:
                tensors, pairs = kohya_file(pipe, model)
                save_file({k: v.contiguous() for k, v in tensors.items()}, path)
            pipe.load_lora_weights(path, adapter_name="sd")
            # Every pair converted and loaded: diffusers adapted as many layers as the file has pairs.
            adapted = sum(isinstance(m, BaseTunerLayer) for comp in components for m in getattr(pipe, comp).modules())
            assert adapted == pairs, (model, adapted, pairs)
            if then.startswith("set"):
                pipe.set_adapters(["sd"], [float(then.split("=")[1])])
            else:
                pipe.fuse_lora(lora_scale=float(then.split()[1]))
            image = run(pipe)
            moved = float(abs(image * 255 - base * 255).mean())
            assert moved > 2.0, (model, then, moved)  # the adapters change the image
            kind = "unfused" if then.startswith("set") else "fused"
            meta = {"pipeline": cls.__name__, "model": model + "-tiny", "dtype": "float32",
                    "script": f"load {model}_kohya.safetensors sd; {then}",
                    **{k: (v if isinstance(v, str) else json.dumps(v)) for k, v in args.items()}}
            save_file({"image_u8": torch.from_numpy((image * 255).round().astype("uint8"))[None].contiguous()},
                      os.path.join(GOLDENS, f"lora_kohya_{model}_{kind}.safetensors"), metadata=meta)
            print(model, kind, "pairs", pairs, "mean level change from the LoRA", round(moved, 2))


if __name__ == "__main__":
    main()
