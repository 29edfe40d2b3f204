#!/usr/bin/env python3
"""Qwen-Image's transformer as the single files people download (ComfyUI's qwen_image_bf16.safetensors, city96's and
QuantStack's GGUFs), each with diffusers' image from it.

Writes (pip install torch diffusers==0.42.1 transformers safetensors gguf; run tools/goldens/qwen_image.py first):
  tests/data/goldens/qwen_image_files/transformer_single_file.safetensors
      qwen-image-tiny's transformer (float32) as one file. Qwen-Image's original layout IS diffusers' (ComfyUI's
      comfy/ldm/qwen_image model keeps diffusers' module names, and diffusers' from_single_file maps a
      QwenImageTransformer2DModel checkpoint through the identity): img_in, txt_norm, txt_in, time_text_embed.*,
      transformer_blocks.N.{img_mod.1, txt_mod.1, attn.*, img_mlp.*, txt_mlp.*}, norm_out.linear, proj_out; no
      "model.diffusion_model." prefix (Comfy-Org's split_files/diffusion_models files have none; ComfyUI's own
      checkpoint saves add it, which Kiln strips and the C++ test checks on a copy). Checked to load back exactly
      through QwenImageTransformer2DModel.from_single_file.
  tests/data/goldens/qwen_image_files/transformer_single_file-Q8_0.gguf, -Q4_0.gguf
      that file as city96's ComfyUI-GGUF convert.py writes it: arch "qwen_image", the 1-D tensors (norms, biases)
      and img_in / txt_in (its list of keys kept at full precision: "img_in.", "txt_in.", ...) in F32, every other
      2-D weight whose rows are whole 32-blocks in Q8_0 (Q4_0); rows that are not (none here but txt_in's 48) F32.
      The K-quants people also run (Q4_K_M, Q5_K_M: 256-blocks) cannot be written by the gguf package (0.19:
      quantize raises NotImplementedError for them), so no file of them here.
  tests/data/goldens/qwen_image_files/gguf_<q8_0|q4_0>_cat_64x64_s0.safetensors
      diffusers' QwenImagePipeline (qwen-image-tiny, float32) with that GGUF as transformer (from_single_file with
      GGUFQuantizationConfig(compute_dtype=float32)), called as qwen_image.py's cat_64x64_s0: its stages and image;
      metadata as qwen_image.py writes it plus transformer_file.

Run from the repository root: python3 tools/goldens/qwen_image_files.py
"""
import os
import sys

import gguf
import torch
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen_image  # noqa: E402
from chroma import save_file  # noqa: E402  (the byte-reproducible writer)

TINY = os.path.join(qwen_image.MODELS, "qwen-image-tiny")
OUT = os.path.join(qwen_image.ROOT, "tests", "data", "goldens", "qwen_image_files")
SINGLE_FILE = os.path.join(OUT, "transformer_single_file.safetensors")
BASE_GOLDENS = qwen_image.GOLDENS
BASE_CASE = qwen_image.CASES[0]
assert BASE_CASE[0] == "cat_64x64_s0"
# city96's convert.py keeps these at full precision (its blacklist; they match Qwen-Image's embedders).
FULL_PRECISION = ("img_in.", "txt_in.")


def base_image():
    with safe_open(os.path.join(BASE_GOLDENS, BASE_CASE[0] + ".safetensors"), "pt") as f:
        return f.get_tensor("image_u8")


def write_single_file():
    from diffusers import QwenImageTransformer2DModel

    sd = {k: v.detach().clone().contiguous() for k, v in QwenImageTransformer2DModel.from_pretrained(
        TINY, subfolder="transformer", torch_dtype=torch.float32).state_dict().items()}
    os.makedirs(OUT, exist_ok=True)
    save_file(sd, SINGLE_FILE)
    loaded = QwenImageTransformer2DModel.from_single_file(SINGLE_FILE, config=TINY, subfolder="transformer",
                                                          torch_dtype=torch.float32).state_dict()
    assert set(loaded) == set(sd) and all(torch.equal(loaded[k], sd[k]) for k in sd)
    print(f"wrote {os.path.basename(SINGLE_FILE)}: {len(sd)} tensors, {os.path.getsize(SINGLE_FILE)} bytes; "
          f"loads back exactly")


def write_gguf(qtype):
    path = os.path.join(OUT, f"transformer_single_file-{qtype.name}.gguf")
    w = gguf.GGUFWriter(path, arch="qwen_image")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_file_type(qtype)
    quantized = []
    with safe_open(SINGLE_FILE, "pt") as f:
        for name in f.keys():
            a = f.get_tensor(name).float().numpy()
            if a.ndim == 2 and a.shape[1] % 32 == 0 and not name.startswith(FULL_PRECISION):
                w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
                quantized.append(name)
            else:
                w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {os.path.basename(path)}: {len(quantized)} {qtype.name} weights, {os.path.getsize(path)} bytes")
    return path, quantized


def gguf_golden(path, quantized, qtype):
    from diffusers import GGUFQuantizationConfig, QwenImageTransformer2DModel

    transformer = QwenImageTransformer2DModel.from_single_file(
        path, config=TINY, subfolder="transformer", torch_dtype=torch.float32,
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32))
    held = sorted(n for n, p in transformer.named_parameters() if type(p).__name__ == "GGUFParameter")
    assert held == sorted(quantized), set(held) ^ set(quantized)
    pipe = qwen_image.load_pipeline(*BASE_CASE[1:4])
    pipe.transformer = transformer
    name = f"gguf_{qtype.name.lower()}_{BASE_CASE[0]}"
    tensors = qwen_image.run_case(name, *BASE_CASE[1:], pipe=pipe)
    golden = os.path.join(OUT, name + ".safetensors")
    with safe_open(golden, "pt") as f:
        meta = dict(f.metadata())
    meta["transformer_file"] = os.path.basename(path)
    save_file({k: v.contiguous() for k, v in tensors.items()}, golden, metadata=meta)
    d = (tensors["image_u8"].float() - base_image().float()).abs()
    print(f"{qtype.name} ({len(held)} quantized weights in diffusers) vs the f32 transformer's image: "
          f"mean {d.mean():.3f} max {d.max():.0f} levels")
    assert d.max() > 0, "the quantized weights left no trace"


def main():
    import diffusers

    assert diffusers.__version__ == "0.42.1", diffusers.__version__
    torch.set_num_threads(2)
    write_single_file()
    qwen_image.GOLDENS = OUT  # where run_case writes a call's stages
    for qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0):
        gguf_golden(*write_gguf(qtype), qtype)
    for name in sorted(os.listdir(OUT)):
        print(f"  {name}: {os.path.getsize(os.path.join(OUT, name))} bytes")


if __name__ == "__main__":
    main()
