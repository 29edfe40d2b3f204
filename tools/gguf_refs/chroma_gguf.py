"""Chroma's transformer as a GGUF file, the way the community quantizes lodestones' single file, with diffusers'
image from it.

Writes (pip install torch diffusers transformers safetensors gguf; run tools/goldens/chroma.py first):
  tests/data/goldens/chroma/transformer_single_file-Q8_0.gguf
      tests/data/goldens/chroma/transformer_single_file.safetensors (chroma-tiny's transformer in the original
      layout) with every 2-D weight whose rows are whole 32-blocks in Q8_0 and the rest F32 (the approximator's
      24-wide input stays F32, as converters leave rows they cannot block)
  tests/data/goldens/chroma/gguf_q8_0_cat_64x64_s0.safetensors
      diffusers' ChromaPipeline (chroma-tiny, float32) with that transformer loaded by
      ChromaTransformer2DModel.from_single_file(..., quantization_config=GGUFQuantizationConfig(compute_dtype=
      torch.float32)), called as chroma.py's cfg_cat_64x64_s0 case: its stages and image.

diffusers' Chroma converter hard-codes FLUX.1's width; chroma.py's chroma_converter gives it the tiny model's.
Run from the repository root: python tools/gguf_refs/chroma_gguf.py
"""

import os
import sys

import gguf
import numpy as np
import torch
from safetensors import safe_open

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "goldens"))
import chroma  # noqa: E402  (the tiny pipeline's cases, loader and converter)

SOURCE = os.path.join(chroma.GOLDENS, "transformer_single_file.safetensors")
GGUF = os.path.join(chroma.GOLDENS, "transformer_single_file-Q8_0.gguf")
GOLDEN = "gguf_q8_0_cat_64x64_s0"


def write_gguf():
    w = gguf.GGUFWriter(GGUF, arch="flux")
    w.add_uint32("general.quantization_version", 2)
    quantized = 0
    with safe_open(SOURCE, "pt") as f:
        for name in f.keys():
            a = f.get_tensor(name).float().numpy()
            if a.ndim == 2 and name.endswith(".weight") and a.shape[1] % 32 == 0:
                w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                             raw_dtype=gguf.GGMLQuantizationType.Q8_0)
                quantized += 1
            else:
                w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {GGUF}: {quantized} Q8_0 weights, {os.path.getsize(GGUF)} bytes")
    return quantized


def main():
    from diffusers import ChromaTransformer2DModel, GGUFQuantizationConfig
    from diffusers.loaders import single_file_model

    torch.set_num_threads(2)
    quantized = write_gguf()
    entry = single_file_model.SINGLE_FILE_LOADABLE_CLASSES["ChromaTransformer2DModel"]
    shipped = entry["checkpoint_mapping_fn"]
    entry["checkpoint_mapping_fn"] = chroma.chroma_converter(inner_dim=32)
    try:
        transformer = ChromaTransformer2DModel.from_single_file(
            GGUF, config=os.path.join(chroma.MODELS, "chroma-tiny"), subfolder="transformer",
            quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32), torch_dtype=torch.float32)
    finally:
        entry["checkpoint_mapping_fn"] = shipped
    held = sum(type(p).__name__ == "GGUFParameter" for p in transformer.parameters())
    # diffusers kept each Q8_0 weight quantized, the 4 fused qkv split in 3 and the 2 single blocks' linear1 in 4.
    assert held == quantized + 4 * 2 + 2 * 3, (held, quantized)

    pipe = chroma.load_pipeline("ChromaPipeline", "chroma-tiny", torch.float32)
    pipe.transformer = transformer
    case = chroma.CASES[0]
    assert case[0] == "cfg_cat_64x64_s0"
    tensors, meta, _ = chroma.run_case(GOLDEN, case[1], case[2], case[3], case[4], pipe=pipe)
    meta["transformer_file"] = os.path.basename(GGUF)
    chroma.save_file({k: v.contiguous() for k, v in tensors.items()},
                     os.path.join(chroma.GOLDENS, GOLDEN + ".safetensors"), metadata=meta)
    with safe_open(os.path.join(chroma.GOLDENS, case[0] + ".safetensors"), "pt") as f:
        unquantized = f.get_tensor("image_u8").float()
    d = (tensors["image_u8"].float() - unquantized).abs()
    print(f"Q8_0 vs the f32 transformer's image: mean {d.mean():.2f} max {d.max():.0f} levels")
    assert d.max() > 0, "the quantized weights left no trace"


if __name__ == "__main__":
    main()
