#!/usr/bin/env python3
"""SD1.5 and SDXL single files with quantized UNets, as people download finetunes, and diffusers' images on them.

Writes, from the tiny single files of tools/goldens/sd_single_file.py (tests/data/goldens/sd_single_file/
sd15_tiny.safetensors, sdxl_tiny.safetensors), into tests/data/goldens/sd_quantized/:
  sd15_tiny_fp8.safetensors, sdxl_tiny_fp8.safetensors
        ComfyUI's fp8 checkpoints: every model.diffusion_model.* tensor of 2 or more dims (Linear weights AND
        convolutions) cast to float8_e4m3fn; biases, norms, the text encoders and the VAE in float16.
  sd15_tiny_q8_0.gguf, sdxl_tiny_q4_0.gguf
        stable-diffusion.cpp's `sd -M convert --type q8_0 / q4_0` output on an fp16 checkpoint: the names its
        loader gives (src/name_conversion.cpp: the UNet and VAE keep the original names; SDXL's CLIP-L moves
        from conditioner.embedders.0.transformer. to cond_stage_model.transformer., OpenCLIP bigG from
        conditioner.embedders.1.model. to cond_stage_model.1.transformer.text_model.* in transformers' names
        with q/k/v still fused as self_attn.in_proj and text_projection untransposed), the buffers it drops
        (position_ids, DDPM schedule, EMA) gone, and its rule for which tensors it quantizes
        (ModelLoader::tensor_should_be_converted): every tensor whose innermost (ggml ne[0]) dimension is a whole
        number of blocks except biases, time_embed.*, label_emb.* and embeddings. So 3x3 and 1x1 convolutions
        (innermost dim 3 or 1) stay F16 and Linear weights and most norm weights are quantized; all the rest
        F16, as converting an fp16 file leaves it.
  sdxl_tiny_unet_q4_k.gguf, sd15_tiny_unet_q8_0.gguf
        a UNet-only GGUF as city96's ComfyUI-GGUF tools write SDXL ones (tools/convert.py then llama.cpp's
        quantize): the original names WITHOUT model.diffusion_model., general.architecture "sdxl", 1-d and tiny
        (<= 1024 values) tensors F32, and the "shape fix": a tensor of 2+ dims whose values are a whole number of
        256-blocks but whose innermost dim is not is stored reshaped to [n / 256, 256] with its real shape in
        the metadata key comfy.gguf.orig_shape.<name>; every tensor whose rows are whole blocks is then
        quantized (convolutions too), the rest F16. In the Q4_K file no Linear row is a multiple of 256 wide,
        so Kiln dequantizes every Q4_K tensor at load (what it does for any quantized tensor it cannot
        multiply in place); in the Q8_0 one the reshaped Linear weights' real rows are whole 32-blocks and
        stay Q8_0.
  <case>.safetensors
        per file, sd.py's run_case (the same recording as tests/data/goldens/sd/, keeping the image and the
        final latents) of sd15_cat_64x64_s0 / sdxl_cat_64x64_s0 on diffusers' pipeline holding those weights,
        float32:
          fp8: StableDiffusion(XL)Pipeline.from_single_file(fp8 file, config=the tiny folder, torch_dtype=
               float32) itself (diffusers loads the fp8 tensors and casts them to float32: exact, checked here).
          GGUF: the file dequantized by the gguf package (gguf.quants.dequantize, which Kiln's reader matches bit
               for bit), written back in the original layout and read by from_single_file. diffusers 0.42.1's
               own GGUF path (from_single_file(..., quantization_config=GGUFQuantizationConfig)) is tried on the
               UNet alone and reported; it is not the reference (see the printout).
        The tiny SDXL's text_encoder_2 is given to from_single_file (sd_single_file.py explains why).

Run from anywhere: python3 tools/goldens/sd_quantized.py   (torch, diffusers 0.42.1, transformers 5, gguf)
Rerun, it reproduces the weight files byte for byte and every golden tensor and metadata value (the goldens'
header order may differ: safetensors keeps metadata in a hash map).
"""

import json
import os
import sys
import tempfile

import gguf
import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "gguf_refs"))
from sd import CASES, MODELS, ROOT, run_case  # noqa: E402
from single_files import quantize_q4_k  # noqa: E402

SINGLE = os.path.join(ROOT, "tests", "data", "goldens", "sd_single_file")
OUT = os.path.join(ROOT, "tests", "data", "goldens", "sd_quantized")
Q = gguf.GGMLQuantizationType
UNET = "model.diffusion_model."


def read(path):
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


# ---- fp8 ----

def fp8_file(tensors):
    def cast(k, v):
        if k.startswith(UNET) and v.dim() >= 2:
            return v.to(torch.float8_e4m3fn)
        return v.half() if v.is_floating_point() else v
    return {k: cast(k, v) for k, v in tensors.items()}


# ---- stable-diffusion.cpp's layout and rule ----

DROPPED = ("betas", "alphas_cumprod", "model_ema.", "logit_scale")


def sdcpp_names(tensors, xl):
    """original name -> the name stable-diffusion.cpp's loader gives it (what `sd -M convert` writes)."""
    out = {}
    for k in tensors:
        if k.startswith(DROPPED) or k.endswith("position_ids") or k.endswith(".logit_scale"):
            continue
        if not xl or k.startswith((UNET, "first_stage_model.")):
            out[k] = k
            continue
        if k.startswith("conditioner.embedders.0.transformer."):
            out[k] = "cond_stage_model.transformer." + k[len("conditioner.embedders.0.transformer."):]
            continue
        rest = k[len("conditioner.embedders.1.model."):]
        top = {"ln_final.weight": "final_layer_norm.weight", "ln_final.bias": "final_layer_norm.bias",
               "positional_embedding": "embeddings.position_embedding.weight",
               "token_embedding.weight": "embeddings.token_embedding.weight", "text_projection": "text_projection"}
        if rest in top:
            new = top[rest]
        else:
            p = rest.split(".")
            assert p[:2] == ["transformer", "resblocks"], k
            tail = ".".join(p[3:])
            block = {"attn.in_proj_weight": "self_attn.in_proj.weight", "attn.in_proj_bias": "self_attn.in_proj.bias",
                     "attn.out_proj.weight": "self_attn.out_proj.weight", "attn.out_proj.bias": "self_attn.out_proj.bias",
                     "ln_1.weight": "layer_norm1.weight", "ln_1.bias": "layer_norm1.bias",
                     "ln_2.weight": "layer_norm2.weight", "ln_2.bias": "layer_norm2.bias",
                     "mlp.c_fc.weight": "mlp.fc1.weight", "mlp.c_fc.bias": "mlp.fc1.bias",
                     "mlp.c_proj.weight": "mlp.fc2.weight", "mlp.c_proj.bias": "mlp.fc2.bias"}[tail]
            new = f"encoder.layers.{p[2]}.{block}"
        out[k] = "cond_stage_model.1.transformer.text_model." + new
    return out


def sdcpp_converts(name, shape, qtype):
    """ModelLoader::tensor_should_be_converted for a quantized type."""
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if shape[-1] % block != 0 or name.endswith(".bias"):
        return False
    return not any(s in name for s in ("time_embed.", "label_emb.", "embedding"))


def quantize(a, qtype):
    if qtype == Q.Q4_K:
        return quantize_q4_k(a)
    return gguf.quants.quantize(a, qtype)


def write_sdcpp_gguf(path, tensors, xl, qtype):
    """Writes the file; returns {original name: the dequantized values the file holds} and the type counts."""
    names = sdcpp_names(tensors, xl)
    w = gguf.GGUFWriter(path, arch="sdxl" if xl else "sd1")  # sd.cpp writes no architecture key; harmless here
    held, counts = {}, {}
    for orig, new in names.items():
        a = tensors[orig].float().numpy()
        if sdcpp_converts(new, a.shape, qtype):
            data, t = quantize(a, qtype), qtype
        else:
            data, t = a.astype(np.float16), Q.F16
        w.add_tensor(new, data, raw_dtype=t if t != Q.F16 else None)
        held[orig] = torch.from_numpy(gguf.quants.dequantize(data, t).reshape(a.shape).astype(np.float32))
        counts[t.name] = counts.get(t.name, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held, counts


def write_city96_gguf(path, unet, qtype, arch):
    """A UNet-only GGUF in ComfyUI-GGUF's layout; returns {original name: dequantized values} and type counts."""
    w = gguf.GGUFWriter(path, arch=arch)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    held, counts = {}, {}
    for orig, t in unet.items():
        key = orig[len(UNET):]
        a = t.float().numpy()
        n = a.size
        if a.ndim == 1 or n <= 1024:
            data, ty = a, Q.F32
        else:
            if a.shape[-1] % 256 != 0 and n % 256 == 0 and n >= 512:
                w.add_array(f"comfy.gguf.orig_shape.{key}", [int(d) for d in a.shape])
                a2 = a.reshape(n // 256, 256)
            else:
                a2 = a
            if a2.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0:
                data, ty = quantize(a2, qtype), qtype
            else:
                data, ty = a2.astype(np.float16), Q.F16
        w.add_tensor(key, data, raw_dtype=ty if ty not in (Q.F16, Q.F32) else None)
        held[orig] = torch.from_numpy(gguf.quants.dequantize(data, ty).reshape(t.shape).astype(np.float32))
        counts[ty.name] = counts.get(ty.name, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held, counts


# ---- diffusers on the weights ----

def load_single(cls_name, model, path):
    import diffusers

    folder = os.path.join(MODELS, model)
    cls = getattr(diffusers, cls_name)
    kwargs = {}
    if "XL" in cls_name:
        kwargs["add_watermarker"] = False
        # The tiny towers are both 32 wide, so from_single_file would load CLIP-L into text_encoder_2
        # (sd_single_file.py): bigG goes through diffusers' own OpenCLIP conversion instead.
        from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint

        te2 = cls.from_pretrained(folder, torch_dtype=torch.float32).text_encoder_2
        te2.load_state_dict(convert_open_clip_checkpoint(te2, read(path), prefix="conditioner.embedders.1.model."))
        kwargs["text_encoder_2"] = te2
    else:
        kwargs["safety_checker"] = None
    pipe = cls.from_single_file(path, config=folder, torch_dtype=torch.float32, local_files_only=True, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def unet_original(pipe_unet, cfg_folder):
    """The pipeline UNet's weights by original name (sd_single_file's unet_to_original)."""
    from sd_single_file import config, unet_to_original

    return {UNET + k: v for k, v in unet_to_original(pipe_unet.state_dict(), config(cfg_folder, "unet")).items()}


def check_weights(what, pipe, model, want):
    """diffusers' UNet holds exactly `want` (original names -> float32 values)."""
    got = unet_original(pipe.unet, os.path.join(MODELS, model))
    bad = [k for k in want if k.startswith(UNET) and not torch.equal(got[k], want[k].float())]
    assert not bad, f"{what}: diffusers' UNet differs at {bad[:5]}"
    print(f"{what}: diffusers' UNet holds the file's values exactly ({sum(k.startswith(UNET) for k in want)} tensors)")


def try_diffusers_gguf(path, model, reference_unet):
    """diffusers' own GGUF loading of the UNet (for the record, not the reference)."""
    from diffusers import GGUFQuantizationConfig, UNet2DConditionModel

    try:
        unet = UNet2DConditionModel.from_single_file(
            path, config=os.path.join(MODELS, model), subfolder="unet", local_files_only=True,
            quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32), torch_dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 (reported, then the dequantized reference is used)
        print(f"  diffusers' GGUF loading of {os.path.basename(path)}: {type(e).__name__}: {str(e)[:200]}")
        return
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 8, 8, generator=g)
    ctx = torch.randn(1, 77, reference_unet.config.cross_attention_dim, generator=g)
    kw = {}
    if reference_unet.config.addition_embed_type == "text_time":
        kw["added_cond_kwargs"] = {"text_embeds": torch.randn(1, 24, generator=g), "time_ids": torch.randn(1, 6)}
    with torch.no_grad():
        b = reference_unet(x, 500, ctx, **kw).sample
        try:
            a = unet(x, 500, ctx, **kw).sample
        except Exception as e:  # noqa: BLE001
            print(f"  diffusers' GGUF UNet of {os.path.basename(path)} loads but fails to run: {str(e)[:160]}")
            return
    print(f"  diffusers' GGUF UNet vs the dequantized one: max |diff| {(a - b).abs().max().item():.2e}")


def record(case_name, out_name, pipe, file, extra_meta):
    case = next(c for c in CASES if c[0] == case_name)
    tensors, meta, _ = run_case(out_name, case[1], case[2], case[3], case[4], pipe=pipe, internals=False)
    # What the test compares (the stages are sd.py's goldens' business; these differ only in the weights).
    tensors = {k: tensors[k] for k in ("image", "image_u8", "latents_final")}
    meta = dict(meta, file=file, **extra_meta)
    path = os.path.join(OUT, out_name + ".safetensors")
    save_file(tensors, path, metadata=meta)
    base = read(os.path.join(ROOT, "tests", "data", "goldens", "sd", case_name + ".safetensors"))["image_u8"]
    moved = (tensors["image_u8"].float() - base.float()).abs().mean().item()
    print(f"wrote {out_name} ({os.path.getsize(path)} bytes); the quantization moves the image by {moved:.2f} "
          f"levels on average from the float32 model's")
    return tensors


def main():
    import diffusers
    from diffusers.utils import logging as diffusers_logging

    assert diffusers.__version__ == "0.42.1", diffusers.__version__
    diffusers_logging.set_verbosity_error()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    os.makedirs(OUT, exist_ok=True)
    tmp = tempfile.mkdtemp()
    files = {}

    for model, single, case, cls_name, xl in (
            ("sd15-tiny", "sd15_tiny", "sd15_cat_64x64_s0", "StableDiffusionPipeline", False),
            ("sdxl-tiny", "sdxl_tiny", "sdxl_cat_64x64_s0", "StableDiffusionXLPipeline", True)):
        tensors = read(os.path.join(SINGLE, single + ".safetensors"))
        prefix = "sdxl" if xl else "sd15"

        # fp8: diffusers' from_single_file on the file itself.
        fp8 = fp8_file(tensors)
        path = os.path.join(OUT, f"{prefix}_tiny_fp8.safetensors")
        save_file(fp8, path)
        pipe = load_single(cls_name, model, path)
        check_weights(os.path.basename(path), pipe, model, fp8)
        record(case, f"{prefix}_fp8_cat_64x64_s0", pipe, os.path.basename(path), {"weights": "fp8"})
        files[os.path.basename(path)] = os.path.getsize(path)

        # GGUF in stable-diffusion.cpp's layout: diffusers on the dequantized values.
        qtype = Q.Q4_0 if xl else Q.Q8_0
        path = os.path.join(OUT, f"{prefix}_tiny_{qtype.name.lower()}.gguf")
        held, counts = write_sdcpp_gguf(path, tensors, xl, qtype)
        print(os.path.basename(path), counts)
        dense = {k: v for k, v in tensors.items() if k not in held}
        dense.update(held)
        back = os.path.join(tmp, single + "_dequantized.safetensors")
        save_file({k: v.contiguous() for k, v in dense.items()}, back)
        pipe = load_single(cls_name, model, back)
        check_weights(os.path.basename(path), pipe, model, held)
        try_diffusers_gguf(path, model, pipe.unet)
        record(case, f"{prefix}_{qtype.name.lower()}_cat_64x64_s0", pipe, os.path.basename(path),
               {"weights": qtype.name})
        files[os.path.basename(path)] = os.path.getsize(path)

    # UNet-only GGUFs in ComfyUI-GGUF's layout, on the tiny folders' text encoders and VAE: SDXL in Q4_K (every
    # Q4_K tensor reshaped to 256-rows), SD1.5 in Q8_0 (reshaped Linear weights whose real rows are whole
    # 32-blocks, which Kiln keeps quantized).
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline, UNet2DConditionModel

    for model, single, case, cls, qtype, arch in (
            ("sdxl-tiny", "sdxl_tiny", "sdxl_cat_64x64_s0", StableDiffusionXLPipeline, Q.Q4_K, "sdxl"),
            ("sd15-tiny", "sd15_tiny", "sd15_cat_64x64_s0", StableDiffusionPipeline, Q.Q8_0, "sd1")):
        tensors = read(os.path.join(SINGLE, single + ".safetensors"))
        unet = {k: v for k, v in tensors.items() if k.startswith(UNET)}
        path = os.path.join(OUT, f"{single}_unet_{qtype.name.lower()}.gguf")
        held, counts = write_city96_gguf(path, unet, qtype, arch)
        print(os.path.basename(path), counts)
        back = os.path.join(tmp, single + "_unet_dequantized.safetensors")
        save_file({k: v.contiguous() for k, v in held.items()}, back)
        folder = os.path.join(MODELS, model)
        kwargs = dict(add_watermarker=False) if arch == "sdxl" else dict(safety_checker=None)
        pipe = cls.from_pretrained(folder, torch_dtype=torch.float32, **kwargs)
        pipe.unet = UNet2DConditionModel.from_single_file(back, config=folder, subfolder="unet",
                                                          local_files_only=True, torch_dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        check_weights(os.path.basename(path), pipe, model, held)
        record(case, f"{single.split('_')[0]}_unet_{qtype.name.lower()}_cat_64x64_s0", pipe,
               os.path.basename(path), {"weights": qtype.name})
        files[os.path.basename(path)] = os.path.getsize(path)
    print("files:", json.dumps(files))


if __name__ == "__main__":
    main()
