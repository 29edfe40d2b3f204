#!/usr/bin/env python3
"""LoRA files for the tiny pipelines in every layout Kiln reads, and diffusers' images with them loaded.

    python3 tools/goldens/lora.py      (torch, diffusers 0.42, peft, transformers, safetensors, gguf from pip)

Every file is random (fixed seeds) with the shapes of the tiny models of tools/goldens/{flux,sd3,flux2_e2e}.py:
  tests/data/lora/flux_diffusers.safetensors   diffusers/PEFT names (transformer.* and text_encoder.*), ranks 4 and
                                               2, `.alpha` keys on some modules (PEFT gives the others the most
                                               common alpha)
  tests/data/lora/flux_kohya.safetensors       sd-scripts names (lora_unet_double_blocks_0_img_attn_qkv, ..., and
                                               lora_te1_* for CLIP) with alphas, fused qkv / linear1 (one of them
                                               block-sparse, as sd-scripts' split-qkv training writes it)
  tests/data/lora/flux_bfl.safetensors         Black Forest Labs' names (diffusion_model.double_blocks.0.img_attn.qkv
                                               .lora_A.weight, ...)
  tests/data/lora/flux_bfl_down_up.safetensors the same tensors named lora_down / lora_up (ComfyUI's layout, the
                                               one diffusers converts for FLUX.1)
  tests/data/lora/flux_xlabs.safetensors       XLabs' names (double_blocks.0.processor.qkv_lora1.down.weight, ...)
  tests/data/lora/flux_kohya_globals.safetensors and flux_kohya_globals_as_diffusers.safetensors: kohya LoRA on
                                               img_in, txt_in, time_in, vector_in, guidance_in and the final layer
                                               (shift/scale halves swapped), and the same converted by hand to
                                               diffusers names. diffusers 0.42 drops these modules (its converter
                                               names them without the transformer. prefix); Kiln applies them, and
                                               its tests check the two files give the same image.
  tests/data/lora/sd3_diffusers.safetensors, sd3_second.safetensors   transformer.*, text_encoder.* (CLIP-L) and
                                               text_encoder_2.* (CLIP-G)
  tests/data/lora/flux2_diffusers.safetensors, flux2_kohya.safetensors, flux2_bfl.safetensors   FLUX.2's layouts
                                               (for the tiny klein pipeline)
  tests/data/goldens/lora/<case>.safetensors   image_u8 (and the first transformer output, f32 cases) of one
                                               pipeline call after a script of LoRA calls, kept in the metadata
                                               ("load FILE NAME; set NAME=W,...; fuse SCALE; unfuse"), which the C++
                                               tests replay.

diffusers' FLUX.1 converters hard-code the real model's widths (3072 / 12288 in the single blocks' linear1 split);
for the tiny model that one constant is replaced by the tiny widths (the converter is otherwise run as shipped).
"""
import inspect
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(ROOT, "tests", "data")
MODELS = os.path.join(DATA, "models")
LORA = os.path.join(DATA, "lora")
GOLDENS = os.path.join(DATA, "goldens", "lora")
GGUF = os.path.join(DATA, "gguf")


def pair(g, rank, fan_in, fan_out, scale=0.2):
    """A [rank, in] and B [out, rank]: random, so that B @ A moves the base weights by about a quarter."""
    return (torch.randn(rank, fan_in, generator=g) * scale).contiguous(), \
        (torch.randn(fan_out, rank, generator=g) * scale).contiguous()


def linears(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


# ---------------------------------------------------------------------------------------------------- FLUX.1
FLUX_DIFFUSERS_MODULES = [
    # (module, rank, alpha or None)
    ("transformer_blocks.0.attn.to_q", 4, 8.0), ("transformer_blocks.0.attn.to_k", 4, None),
    ("transformer_blocks.0.attn.to_v", 4, 8.0), ("transformer_blocks.0.attn.to_out.0", 2, 2.0),
    ("transformer_blocks.0.attn.add_q_proj", 4, None), ("transformer_blocks.0.attn.to_add_out", 4, None),
    ("transformer_blocks.0.ff.net.0.proj", 4, 8.0), ("transformer_blocks.0.ff.net.2", 4, None),
    ("transformer_blocks.0.ff_context.net.2", 2, None), ("transformer_blocks.0.norm1.linear", 4, None),
    ("transformer_blocks.1.norm1_context.linear", 4, None), ("transformer_blocks.1.attn.add_v_proj", 4, None),
    ("single_transformer_blocks.0.attn.to_q", 4, None), ("single_transformer_blocks.0.proj_mlp", 4, None),
    ("single_transformer_blocks.1.proj_out", 4, None), ("single_transformer_blocks.1.norm.linear", 2, None),
    ("x_embedder", 4, None), ("context_embedder", 4, None), ("proj_out", 4, None), ("norm_out.linear", 4, None),
    ("time_text_embed.timestep_embedder.linear_1", 4, None),
]
CLIP_MODULES = ["encoder.layers.0.self_attn.q_proj", "encoder.layers.0.self_attn.v_proj",
                "encoder.layers.1.self_attn.out_proj", "encoder.layers.1.mlp.fc1"]


def flux_diffusers(pipe, seed):
    g = torch.Generator().manual_seed(seed)
    lin, out = linears(pipe.transformer), {}
    for name, rank, alpha in FLUX_DIFFUSERS_MODULES:
        a, b = pair(g, rank, lin[name].in_features, lin[name].out_features)
        out[f"transformer.{name}.lora_A.weight"], out[f"transformer.{name}.lora_B.weight"] = a, b
        if alpha is not None:
            out[f"transformer.{name}.alpha"] = torch.tensor(alpha)
    clip = linears(pipe.text_encoder)
    for name in CLIP_MODULES:
        a, b = pair(g, 4, clip[name].in_features, clip[name].out_features)
        out[f"text_encoder.text_model.{name}.lora_A.weight"], out[f"text_encoder.text_model.{name}.lora_B.weight"] = a, b
    return out


def flux_kohya(pipe, seed):
    """sd-scripts' FLUX.1 names: Black Forest Labs' modules with '_' for '.', qkv and linear1 fused."""
    g = torch.Generator().manual_seed(seed)
    dim = pipe.transformer.config.num_attention_heads * pipe.transformer.config.attention_head_dim
    mlp = 4 * dim
    out = {}

    def put(name, rank, fan_in, fan_out, alpha):
        a, b = pair(g, rank, fan_in, fan_out)
        out[f"{name}.lora_down.weight"], out[f"{name}.lora_up.weight"] = a, b
        if alpha is not None:
            out[f"{name}.alpha"] = torch.tensor(alpha)
        return b

    for i in range(2):
        p = f"lora_unet_double_blocks_{i}_"
        put(p + "img_attn_qkv", 4, dim, 3 * dim, 2.0)
        put(p + "img_attn_proj", 4, dim, dim, 8.0)
        put(p + "img_mlp_0", 4, dim, mlp, None)
        put(p + "img_mlp_2", 4, mlp, dim, 4.0)
        put(p + "txt_mod_lin", 4, dim, 6 * dim, 2.0)
    put("lora_unet_double_blocks_0_txt_attn_qkv", 6, dim, 3 * dim, 3.0)
    # sd-scripts' split-qkv LoRA: block-diagonal up (each of q, k, v reads its own 2 ranks).
    b = put("lora_unet_double_blocks_1_txt_attn_qkv", 6, dim, 3 * dim, 6.0)
    for j in range(3):
        for k in range(3):
            if j != k:
                b[j * dim:(j + 1) * dim, 2 * k:2 * k + 2] = 0
    for i in range(2):
        p = f"lora_unet_single_blocks_{i}_"
        put(p + "linear1", 4, dim, 3 * dim + mlp, 8.0)
        put(p + "linear2", 4, dim + mlp, dim, None)
    put("lora_unet_single_blocks_1_modulation_lin", 2, dim, 3 * dim, 1.0)
    # Attention layers only: diffusers 0.42 drops the attention part of a kohya text-encoder LoRA that also
    # holds MLP layers (its key conversion then sees the newer naming and leaves to_k_lora.* unconverted).
    for name in ("layers_1_self_attn_k_proj", "layers_0_self_attn_out_proj"):
        put(f"lora_te1_text_model_encoder_{name}", 4, 32, 32, 2.0)
    return out


def flux_kohya_globals(pipe, seed):
    """kohya LoRA on the layers outside the blocks, and the same by hand in diffusers names (alpha baked in)."""
    g = torch.Generator().manual_seed(seed)
    lin = linears(pipe.transformer)
    kohya, diffusers = {}, {}
    for kohya_name, module, alpha in (("img_in", "x_embedder", 2.0), ("txt_in", "context_embedder", None),
                                      ("time_in_in_layer", "time_text_embed.timestep_embedder.linear_1", 8.0),
                                      ("vector_in_out_layer", "time_text_embed.text_embedder.linear_2", None),
                                      ("guidance_in_in_layer", "time_text_embed.guidance_embedder.linear_1", 2.0),
                                      ("final_layer_linear", "proj_out", None),
                                      ("final_layer_adaLN_modulation_1", "norm_out.linear", 4.0)):
        a, b = pair(g, 4, lin[module].in_features, lin[module].out_features)
        kohya[f"lora_unet_{kohya_name}.lora_down.weight"], kohya[f"lora_unet_{kohya_name}.lora_up.weight"] = a, b
        scale = 1.0
        if alpha is not None:
            kohya[f"lora_unet_{kohya_name}.alpha"] = torch.tensor(alpha)
            scale = alpha / 4
        if module == "norm_out.linear":  # Black Forest Labs: (shift, scale); diffusers: (scale, shift)
            shift, sc = b.chunk(2, 0)
            b = torch.cat([sc, shift], 0)
        diffusers[f"transformer.{module}.lora_A.weight"] = (a * scale).contiguous()
        diffusers[f"transformer.{module}.lora_B.weight"] = b.contiguous()
    return kohya, diffusers


def flux_bfl(pipe, seed):
    g = torch.Generator().manual_seed(seed)
    dim = pipe.transformer.config.num_attention_heads * pipe.transformer.config.attention_head_dim
    mlp = 4 * dim
    out = {}
    for name, fan_in, fan_out in (("double_blocks.0.img_attn.qkv", dim, 3 * dim),
                                  ("double_blocks.0.txt_attn.proj", dim, dim),
                                  ("double_blocks.1.img_mlp.0", dim, mlp), ("double_blocks.1.txt_attn.qkv", dim, 3 * dim),
                                  ("double_blocks.1.img_mod.lin", dim, 6 * dim),
                                  ("single_blocks.0.linear1", dim, 3 * dim + mlp),
                                  ("single_blocks.1.linear2", dim + mlp, dim),
                                  ("single_blocks.1.modulation.lin", dim, 3 * dim)):
        a, b = pair(g, 4, fan_in, fan_out)
        out[f"diffusion_model.{name}.lora_A.weight"], out[f"diffusion_model.{name}.lora_B.weight"] = a, b
    down_up = {k.replace("lora_A", "lora_down").replace("lora_B", "lora_up"): v for k, v in out.items()}
    return out, down_up


def flux_xlabs(pipe, seed):
    g = torch.Generator().manual_seed(seed)
    dim = pipe.transformer.config.num_attention_heads * pipe.transformer.config.attention_head_dim
    out = {}
    for i in range(2):
        for name, fan_out in (("qkv_lora1", 3 * dim), ("qkv_lora2", 3 * dim), ("proj_lora1", dim),
                              ("proj_lora2", dim)):
            a, b = pair(g, 4, dim, fan_out)
            out[f"double_blocks.{i}.processor.{name}.down.weight"] = a
            out[f"double_blocks.{i}.processor.{name}.up.weight"] = b
    for name, fan_out in (("qkv_lora", 3 * dim), ("proj_lora", dim)):
        # XLabs' single-block proj_lora reads the attention output only: diffusers pads its down with zeros over
        # the MLP part of proj_out's input.
        a, b = pair(g, 4, dim, fan_out)
        out[f"single_blocks.1.processor.{name}.down.weight"] = a
        out[f"single_blocks.1.processor.{name}.up.weight"] = b
    return out


def patch_flux_kohya_widths(dim, mlp):
    """diffusers' sd-scripts converter splits linear1 by FLUX.1-dev's widths; give it the tiny ones."""
    import diffusers.loaders.lora_conversion_utils as lcu
    import diffusers.loaders.lora_pipeline as lp

    src = inspect.getsource(lcu._convert_kohya_flux_lora_to_diffusers)
    assert "dims=[3072, 3072, 3072, 12288]" in src
    src = src.replace("dims=[3072, 3072, 3072, 12288]", f"dims=[{dim}, {dim}, {dim}, {mlp}]")
    scope = dict(vars(lcu))
    exec(src, scope)
    lp._convert_kohya_flux_lora_to_diffusers = scope["_convert_kohya_flux_lora_to_diffusers"]


# ---------------------------------------------------------------------------------------------------- SD3
def sd3_lora(pipe, seed, transformer_modules, clip_modules):
    g = torch.Generator().manual_seed(seed)
    out = {}
    # CLIPTextModelWithProjection keeps its text_model. prefix in transformers 5.
    for comp, model, modules, prefix in (("transformer", pipe.transformer, transformer_modules, ""),
                                         ("text_encoder", pipe.text_encoder, clip_modules, "text_model."),
                                         ("text_encoder_2", pipe.text_encoder_2, clip_modules, "text_model.")):
        lin = linears(model)
        for name in modules:
            layer = lin[prefix + name]
            a, b = pair(g, 4, layer.in_features, layer.out_features)
            out[f"{comp}.{prefix}{name}.lora_A.weight"], out[f"{comp}.{prefix}{name}.lora_B.weight"] = a, b
    return out


SD3_MODULES = ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.add_k_proj",
               "transformer_blocks.0.attn2.to_v", "transformer_blocks.1.ff.net.0.proj",
               "transformer_blocks.1.norm1_context.linear", "transformer_blocks.2.attn.to_out.0",
               "transformer_blocks.2.ff.net.2", "context_embedder", "proj_out",
               "time_text_embed.text_embedder.linear_1"]
SD3_SECOND = ["transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn2.to_out.0",
              "transformer_blocks.2.norm1.linear", "norm_out.linear"]


# ---------------------------------------------------------------------------------------------------- FLUX.2
FLUX2_MODULES = ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.add_v_proj",
                 "transformer_blocks.0.ff.linear_in", "transformer_blocks.1.ff_context.linear_out",
                 "transformer_blocks.1.attn.to_out.0", "single_transformer_blocks.0.attn.to_qkv_mlp_proj",
                 "single_transformer_blocks.1.attn.to_out", "double_stream_modulation_img.linear",
                 "single_stream_modulation.linear", "x_embedder", "context_embedder", "proj_out"]


def flux2_diffusers(pipe, seed):
    g = torch.Generator().manual_seed(seed)
    lin, out = linears(pipe.transformer), {}
    for name in FLUX2_MODULES:
        a, b = pair(g, 4, lin[name].in_features, lin[name].out_features)
        out[f"transformer.{name}.lora_A.weight"], out[f"transformer.{name}.lora_B.weight"] = a, b
    return out


def flux2_bfl_shapes(pipe):
    lin = linears(pipe.transformer)
    dim = lin["transformer_blocks.0.attn.to_q"].out_features
    return [("double_blocks.0.img_attn.qkv", dim, 3 * dim), ("double_blocks.0.txt_attn.proj", dim, dim),
            ("double_blocks.1.img_mlp.0", dim, lin["transformer_blocks.1.ff.linear_in"].out_features),
            ("double_blocks.1.txt_attn.qkv", dim, 3 * dim),
            ("single_blocks.0.linear1", dim, lin["single_transformer_blocks.0.attn.to_qkv_mlp_proj"].out_features),
            ("single_blocks.1.linear2", lin["single_transformer_blocks.1.attn.to_out"].in_features, dim),
            ("img_in", lin["x_embedder"].in_features, dim)]


def flux2_bfl(pipe, seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, fan_in, fan_out in flux2_bfl_shapes(pipe):
        a, b = pair(g, 4, fan_in, fan_out)
        out[f"diffusion_model.{name}.lora_A.weight"], out[f"diffusion_model.{name}.lora_B.weight"] = a, b
    return out


def flux2_kohya(pipe, seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, fan_in, fan_out in flux2_bfl_shapes(pipe):
        a, b = pair(g, 4, fan_in, fan_out)
        key = "lora_unet_" + name.replace(".", "_")
        out[f"{key}.lora_down.weight"], out[f"{key}.lora_up.weight"] = a, b
        out[f"{key}.alpha"] = torch.tensor(2.0)
    return out


# ---------------------------------------------------------------------------------------------------- running
def run_script(pipe, script):
    """Replays "load FILE NAME; set NAME=W,...; fuse SCALE; unfuse" on a diffusers pipeline."""
    for step in [s.strip() for s in script.split(";") if s.strip()]:
        words = step.split()
        if words[0] == "load":
            pipe.load_lora_weights(os.path.join(LORA, words[1]), adapter_name=words[2])
        elif words[0] == "set":
            pairs = [w.split("=") for w in words[1].split(",")]
            pipe.set_adapters([n for n, _ in pairs], [float(v) for _, v in pairs])
        elif words[0] == "fuse":
            pipe.fuse_lora(lora_scale=float(words[1]))
        elif words[0] == "unfuse":
            pipe.unfuse_lora()
        else:
            raise ValueError(step)


def adapted_layers(pipe):
    """{component: {adapter: layers}}: what diffusers really loaded (a converter that drops keys shows here)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    out = {}
    for comp in ("transformer", "text_encoder", "text_encoder_2"):
        model = getattr(pipe, comp, None)
        if model is None:
            continue
        for m in model.modules():
            if isinstance(m, BaseTunerLayer):
                for adapter in m.lora_A.keys():
                    out.setdefault(comp, {}).setdefault(adapter, 0)
                    out[comp][adapter] += 1
    return out


def call(pipe, case, capture):
    kwargs = dict(prompt=case["prompt"], height=case["height"], width=case["width"],
                  num_inference_steps=case["steps"], guidance_scale=case["guidance"],
                  max_sequence_length=case["max_sequence_length"], output_type="np")
    if case.get("negative_prompt") is not None:
        kwargs["negative_prompt"] = case["negative_prompt"]
    captured = {}

    def hook(module, args, kw, output):
        captured.setdefault("transformer_out_step0", output[0].clone())

    handle = pipe.transformer.register_forward_hook(hook, with_kwargs=True) if capture else None
    with torch.no_grad():
        images = pipe(generator=torch.Generator("cpu").manual_seed(case["seed"]), **kwargs).images
    if handle:
        handle.remove()
    out = {"image_u8": torch.from_numpy((images[0] * 255).round().astype("uint8"))}
    out.update(captured)
    return out


def flux_pipe(folder, dtype, transformer_file=None):
    from diffusers import FluxPipeline

    kwargs = {}
    if transformer_file:
        sys.path.insert(0, os.path.join(ROOT, "tools", "gguf_refs"))
        from single_files import patch_diffusers_width
        from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig

        patch_diffusers_width()
        kwargs["transformer"] = FluxTransformer2DModel.from_single_file(
            os.path.join(GGUF, transformer_file), config=os.path.join(MODELS, folder), subfolder="transformer",
            quantization_config=GGUFQuantizationConfig(compute_dtype=dtype), torch_dtype=dtype)
    return FluxPipeline.from_pretrained(os.path.join(MODELS, folder), torch_dtype=dtype, **kwargs)


def sd3_pipe(folder, dtype):
    from diffusers import StableDiffusion3Pipeline

    return StableDiffusion3Pipeline.from_pretrained(os.path.join(MODELS, folder), torch_dtype=dtype)


def flux2_pipe(folder, dtype):
    from diffusers import Flux2KleinPipeline

    return Flux2KleinPipeline.from_pretrained(os.path.join(MODELS, folder), torch_dtype=dtype)


FLUX = dict(pipeline="flux-tiny-dev", prompt="a photo of a cat", height=48, width=64, steps=3, guidance=3.5, seed=0,
            max_sequence_length=32)
FLUX_BF16 = dict(FLUX, pipeline="flux-tiny-dev-bf16")
SD3 = dict(pipeline="sd3-tiny-medium", prompt="a photo of a cat", negative_prompt="blurry", height=48, width=64,
           steps=3, guidance=4.5, seed=5, max_sequence_length=32)
# Flux2KleinPipeline with classifier-free guidance (its negative prompt ""); Flux2Pipeline's Mistral processor needs
# torchvision, which this tool does without.
FLUX2 = dict(pipeline="flux2-tiny-klein-full", prompt="a red fox in the snow", height=48, width=48, steps=2,
             guidance=4.0, seed=3, max_sequence_length=32)

TWO = "load flux_diffusers.safetensors style; load flux_kohya.safetensors detail; set style=0.8,detail=-0.6"
CASES = [
    # name, family, base case, dtype, script, transformer file
    ("flux_none", "flux", FLUX, torch.float32, "", None),
    ("flux_diffusers", "flux", FLUX, torch.float32, "load flux_diffusers.safetensors a", None),
    ("flux_kohya", "flux", FLUX, torch.float32, "load flux_kohya.safetensors a", None),
    ("flux_bfl", "flux", FLUX, torch.float32, "load flux_bfl_down_up.safetensors a", None),
    ("flux_xlabs", "flux", FLUX, torch.float32, "load flux_xlabs.safetensors a", None),
    ("flux_two_adapters", "flux", FLUX, torch.float32, TWO, None),
    ("flux_two_adapters_fused", "flux", FLUX, torch.float32, TWO + "; fuse 0.7", None),
    ("flux_two_adapters_unfused", "flux", FLUX, torch.float32, TWO + "; fuse 0.7; unfuse", None),
    ("flux_second_only", "flux", FLUX, torch.float32, TWO + "; set detail=1.3", None),
    ("fluxbf16_two_adapters", "flux", FLUX_BF16, torch.bfloat16, TWO, None),
    ("fluxbf16_two_adapters_fused", "flux", FLUX_BF16, torch.bfloat16, TWO + "; fuse 0.7", None),
    ("fluxq8_two_adapters", "flux", FLUX_BF16, torch.bfloat16, TWO, "flux-tiny-dev-Q8_0.gguf"),
    ("sd3_none", "sd3", SD3, torch.float32, "", None),
    ("sd3_diffusers", "sd3", SD3, torch.float32, "load sd3_diffusers.safetensors a", None),
    ("sd3_two_adapters_fused", "sd3", SD3, torch.float32,
     "load sd3_diffusers.safetensors a; load sd3_second.safetensors b; set a=0.5,b=1.2; fuse 0.9", None),
    ("flux2_none", "flux2", FLUX2, torch.float32, "", None),
    ("flux2_diffusers", "flux2", FLUX2, torch.float32, "load flux2_diffusers.safetensors a", None),
    ("flux2_kohya", "flux2", FLUX2, torch.float32, "load flux2_kohya.safetensors a", None),
    ("flux2_bfl", "flux2", FLUX2, torch.float32, "load flux2_bfl.safetensors a", None),
    ("flux2_two_adapters_fused", "flux2", FLUX2, torch.float32,
     "load flux2_diffusers.safetensors a; load flux2_bfl.safetensors b; set a=0.6,b=0.9; fuse 1.1", None),
]


def write_lora_files():
    os.makedirs(LORA, exist_ok=True)
    flux = flux_pipe("flux-tiny-dev", torch.float32)
    save_file(flux_diffusers(flux, 1), os.path.join(LORA, "flux_diffusers.safetensors"))
    save_file(flux_kohya(flux, 2), os.path.join(LORA, "flux_kohya.safetensors"))
    bfl, down_up = flux_bfl(flux, 3)
    save_file(bfl, os.path.join(LORA, "flux_bfl.safetensors"))
    save_file(down_up, os.path.join(LORA, "flux_bfl_down_up.safetensors"))
    save_file(flux_xlabs(flux, 4), os.path.join(LORA, "flux_xlabs.safetensors"))
    kohya, diffusers = flux_kohya_globals(flux, 5)
    save_file(kohya, os.path.join(LORA, "flux_kohya_globals.safetensors"))
    save_file(diffusers, os.path.join(LORA, "flux_kohya_globals_as_diffusers.safetensors"))
    sd3 = sd3_pipe("sd3-tiny-medium", torch.float32)
    save_file(sd3_lora(sd3, 6, SD3_MODULES, CLIP_MODULES), os.path.join(LORA, "sd3_diffusers.safetensors"))
    save_file(sd3_lora(sd3, 7, SD3_SECOND, CLIP_MODULES[1:3]), os.path.join(LORA, "sd3_second.safetensors"))
    flux2 = flux2_pipe("flux2-tiny-klein-full", torch.float32)
    save_file(flux2_diffusers(flux2, 8), os.path.join(LORA, "flux2_diffusers.safetensors"))
    save_file(flux2_kohya(flux2, 9), os.path.join(LORA, "flux2_kohya.safetensors"))
    save_file(flux2_bfl(flux2, 10), os.path.join(LORA, "flux2_bfl.safetensors"))
    dim = flux.transformer.config.num_attention_heads * flux.transformer.config.attention_head_dim
    return dim


def main():
    torch.set_num_threads(2)
    dim = write_lora_files()
    patch_flux_kohya_widths(dim, 4 * dim)
    os.makedirs(GOLDENS, exist_ok=True)
    makers = {"flux": flux_pipe, "sd3": sd3_pipe, "flux2": flux2_pipe}
    images = {}
    for name, family, base, dtype, script, transformer_file in CASES:
        if transformer_file:
            pipe = flux_pipe(base["pipeline"], dtype, transformer_file)
        else:
            pipe = makers[family](base["pipeline"], dtype)
        run_script(pipe, script)
        print(name, "adapted layers:", adapted_layers(pipe))
        out = call(pipe, base, capture=dtype == torch.float32)
        if not script:
            images[family] = out["image_u8"]
        meta = {k: ("" if v is None else str(v)) for k, v in base.items()}
        meta.update(script=script, dtype=str(dtype).replace("torch.", ""), transformer_file=transformer_file or "")
        save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(GOLDENS, name + ".safetensors"),
                  metadata=meta)
        print("wrote", name, {k: tuple(v.shape) for k, v in out.items()},
              "mean levels from the image without LoRA: %.1f" % (
                  (out["image_u8"].float() - images[family].float()).abs().mean() if family in images and
                  images[family].shape == out["image_u8"].shape else float("nan")))


if __name__ == "__main__":
    main()
