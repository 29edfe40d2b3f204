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

LoCon (the same script, after the files above; `python3 tools/goldens/sd_kohya_lora.py locon` writes only these):
  tests/data/lora/<model>_locon.safetensors   kohya/LyCORIS LoCon pairs on every convolution of the UNet outside its
                                           attentions (conv_in, the ResNets' conv1 / conv2 / conv_shortcut, the
                                           down- and upsamplers' conv, conv_out): lora_down [rank, in, kh, kw],
                                           lora_up [out, rank, 1, 1]; and Linear pairs on the time embedding, every
                                           time_emb_proj (and SDXL's add_embedding). SD1.5 in diffusers' flat names,
                                           SDXL in SGM's (input_blocks_1_0_in_layers_2, ..._out_layers_3,
                                           ..._skip_connection, ..._emb_layers_1, input_blocks_3_0_op,
                                           output_blocks_2_2_conv, middle_block_0_..., input_blocks_0_0 for conv_in,
                                           out_2 for conv_out, time_embed_0, label_emb_0_0). Ranks 2, 4 and 6 and
                                           alphas 1.5 to 7 vary by pair (each differs from its rank); the script
                                           checks that PEFT scaled every adapted layer by the pair's alpha / rank.
  tests/data/lora/sd15_locon_peft.safetensors the SD1.5 pairs in diffusers' (PEFT) layout, unet.<module>.lora_A /
                                           lora_B.weight, no alphas (scale 1)
  tests/data/goldens/sd/lora_locon_<model>_<unfused|fused>.safetensors, lora_locon_peft_sd15.safetensors
                                           image_u8 after load_lora_weights then set_adapters weight 0.7 (unfused),
                                           fuse_lora(lora_scale=0.8) (fused), set_adapters weight 0.6 (PEFT)
"""
import json
import os
import sys

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


# LoCon: each pair's rank and alpha by its index in the UNet's module order, no alpha equal to its rank.
LOCON_RANKS = (4, 2, 6)
LOCON_ALPHAS = (1.5, 3.0, 5.0, 7.0, 2.5)
SGM_RESNET = {"conv1": "in_layers.2", "conv2": "out_layers.3", "conv_shortcut": "skip_connection",
              "time_emb_proj": "emb_layers.1"}
SGM_TOP = {"conv_in": "input_blocks.0.0", "conv_out": "out.2", "time_embedding.linear_1": "time_embed.0",
           "time_embedding.linear_2": "time_embed.2", "add_embedding.linear_1": "label_emb.0.0",
           "add_embedding.linear_2": "label_emb.0.2"}


def sgm_locon_module(module, unet):
    """A diffusers UNet module outside the attentions (ResNets, samplers, conv_in / conv_out, embeddings) under SGM's
    name: input_blocks.i.0 is level (i-1)//(lpb+1)'s ResNet (i-1)%(lpb+1), its last one the level's downsampler
    (.0.op); middle_block.0 / .2 the mid ResNets; output_blocks.i.0 level i//(lpb+1)'s ResNet i%(lpb+1), the last
    one's upsampler after the attention (.2.conv) or, on a level without attentions, after the ResNet (.1.conv)."""
    if module in SGM_TOP:
        return SGM_TOP[module]
    per = unet.config.layers_per_block + 1
    p = module.split(".")
    level = int(p[1]) if p[0] in ("down_blocks", "up_blocks") else 0
    if p[0] == "down_blocks" and p[2] == "resnets":
        return f"input_blocks.{1 + level * per + int(p[3])}.0.{SGM_RESNET[p[4]]}"
    if p[0] == "down_blocks" and p[2] == "downsamplers":
        return f"input_blocks.{level * per + per}.0.op"
    if p[0] == "mid_block" and p[1] == "resnets":
        return f"middle_block.{2 * int(p[2])}.{SGM_RESNET[p[3]]}"
    if p[0] == "up_blocks" and p[2] == "resnets":
        return f"output_blocks.{level * per + int(p[3])}.0.{SGM_RESNET[p[4]]}"
    if p[0] == "up_blocks" and p[2] == "upsamplers":
        part = 2 if hasattr(unet.up_blocks[level], "attentions") else 1
        return f"output_blocks.{level * per + per - 1}.{part}.conv"
    raise ValueError(module)


def locon_pairs(unet, seed):
    """{module: (down, up, alpha)} for every convolution outside the attentions (down [rank, in, kh, kw], up
    [out, rank, 1, 1]) and every Linear of the time / added embeddings and the ResNets' time_emb_proj."""
    g = torch.Generator().manual_seed(seed)
    pairs = {}
    for name, m in unet.named_modules():
        conv = isinstance(m, torch.nn.Conv2d) and "attentions" not in name
        linear = isinstance(m, torch.nn.Linear) and (name.endswith("time_emb_proj") or
                                                      name.startswith(("time_embedding.", "add_embedding.")))
        if not (conv or linear):
            continue
        i = len(pairs)
        rank, alpha = LOCON_RANKS[i % len(LOCON_RANKS)], LOCON_ALPHAS[i % len(LOCON_ALPHAS)]
        if conv:
            down = torch.randn(rank, m.in_channels, *m.kernel_size, generator=g) * 0.15
            up = torch.randn(m.out_channels, rank, 1, 1, generator=g) * 0.15
        else:
            down = torch.randn(rank, m.in_features, generator=g) * 0.15
            up = torch.randn(m.out_features, rank, generator=g) * 0.15
        pairs[name] = (down, up, alpha)
    return pairs


def locon_main():
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline
    from peft.tuners.tuners_utils import BaseTunerLayer

    args = dict(prompt="a cat", height=32, width=32, num_inference_steps=3, seed=4)
    cases = [("sd15", StableDiffusionPipeline, dict(guidance_scale=7.5)),
             ("sdxl", StableDiffusionXLPipeline, dict(guidance_scale=5.0))]
    for model, cls, call in cases:
        folder = os.path.join(MODELS, model + "-tiny")
        kwargs = dict(safety_checker=None) if model == "sd15" else {}
        margs = dict(args, **call)

        def load():
            pipe = cls.from_pretrained(folder, **kwargs)
            pipe.set_progress_bar_config(disable=True)
            return pipe

        def run(pipe):
            with torch.no_grad():
                return pipe(**{k: v for k, v in margs.items() if k != "seed"}, output_type="np",
                            generator=torch.Generator("cpu").manual_seed(margs["seed"])).images[0]

        base = run(load())
        pairs = locon_pairs(load().unet, 21 if model == "sd15" else 22)
        kohya = {}
        for module, (down, up, alpha) in pairs.items():
            flat = "lora_unet_" + (module if model == "sd15" else sgm_locon_module(module, load().unet)).replace(".", "_")
            kohya[flat + ".lora_down.weight"], kohya[flat + ".lora_up.weight"] = down, up
            kohya[flat + ".alpha"] = torch.tensor(alpha)
        files = {"kohya": (os.path.join(LORA, f"{model}_locon.safetensors"), kohya, lambda d, u, a: a / d.shape[0])}
        if model == "sd15":
            peft = {}
            for module, (down, up, _) in pairs.items():
                peft[f"unet.{module}.lora_A.weight"], peft[f"unet.{module}.lora_B.weight"] = down, up
            files["peft"] = (os.path.join(LORA, "sd15_locon_peft.safetensors"), peft, lambda d, u, a: 1.0)
        for layout, (path, tensors, scale) in files.items():
            save_file({k: v.contiguous() for k, v in tensors.items()}, path)
            runs = ("set sd=0.7", "fuse 0.8") if layout == "kohya" else ("set sd=0.6",)
            for then in runs:
                pipe = load()
                pipe.load_lora_weights(path, adapter_name="sd")
                # Every pair loaded, on its module, scaled by its own alpha / rank.
                adapted = {n: m for n, m in pipe.unet.named_modules() if isinstance(m, BaseTunerLayer)}
                assert sorted(adapted) == sorted(pairs), (model, layout, sorted(set(adapted) ^ set(pairs)))
                for n, m in adapted.items():
                    want = scale(*pairs[n])
                    assert abs(m.scaling["sd"] - want) < 1e-9, (n, m.scaling["sd"], want)
                if then.startswith("set"):
                    pipe.set_adapters(["sd"], [float(then.split("=")[1])])
                else:
                    pipe.fuse_lora(lora_scale=float(then.split()[1]))
                image = run(pipe)
                moved = float(abs(image * 255 - base * 255).mean())
                assert moved > 2.0, (model, layout, then, moved)  # the adapters change the image
                kind = "unfused" if then.startswith("set") else "fused"
                golden = f"lora_locon_{model}_{kind}" if layout == "kohya" else f"lora_locon_peft_{model}"
                meta = {"pipeline": cls.__name__, "model": model + "-tiny", "dtype": "float32",
                        "script": f"load {os.path.basename(path)} sd; {then}",
                        **{k: (v if isinstance(v, str) else json.dumps(v)) for k, v in margs.items()}}
                save_file({"image_u8": torch.from_numpy((image * 255).round().astype("uint8"))[None].contiguous()},
                          os.path.join(GOLDENS, golden + ".safetensors"), metadata=meta)
                print(golden, "pairs", len(pairs), "mean level change from the LoRA", round(moved, 2))


if __name__ == "__main__":
    if sys.argv[1:] != ["locon"]:
        main()
    locon_main()
