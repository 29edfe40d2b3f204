"""A FLUX transformer as an fp8 single file, the way flux1-dev-fp8 files are downloaded, with diffusers' output on it.

Writes (pip install torch diffusers transformers safetensors gguf):
  tests/data/gguf/flux-tiny-dev-bfl-fp8.safetensors
      the tiny bf16 FLUX.1-dev transformer of tools/goldens/flux.py (tests/data/models/flux-tiny-dev-bf16) in Black
      Forest Labs' layout (as tools/gguf_refs/single_files.py writes it), every Linear weight in 8-bit floats: the
      single blocks' in float8_e5m2, all others in float8_e4m3fn; biases and norm scales stay bf16
  tests/data/gguf/fp8_single_file_goldens.safetensors
      fp8_out: diffusers' FluxTransformer2DModel.from_single_file(..., torch_dtype=torch.bfloat16) on that file (which
      widens the fp8 weights to bf16 as it loads them), run on the inputs of single_file_goldens.safetensors
      (tiny_*); fp8_widened_out: the same model built from the file's values widened by torch outside diffusers,
      which must be the same bits (the file holds nothing diffusers reads differently); fp8_f32_out: diffusers with
      torch_dtype=torch.float32 on the same inputs in float32
  tests/data/gguf/flux-tiny-dev-fp8-transformer/config.json, diffusion_pytorch_model.safetensors
      the same transformer as a diffusers component folder, its Linear weights in float8_e4m3fn (as fp8 diffusers
      folders are published), to replace the transformer/ of a copy of tests/data/models/flux-tiny-dev-bf16
  fp8_pipeline_image_u8 (in fp8_single_file_goldens.safetensors): diffusers' FluxPipeline on that copy at
      torch_dtype=torch.bfloat16, the devbf16_cat_64x64_s0 call of tools/goldens/flux.py ("cat", 64x64, 3 steps,
      guidance 3.5, seed 0, max_sequence_length 32), as the 8-bit image PIL would save
Run from the repository root after tools/gguf_refs/single_files.py: python tools/gguf_refs/fp8_single_file.py
"""

import os
import shutil
import tempfile

import torch
from diffusers import FluxPipeline, FluxTransformer2DModel
from diffusers.loaders import single_file_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from single_files import OUT, TINY, patch_diffusers_width, run, to_bfl


def main():
    patch_diffusers_width()
    ref = FluxTransformer2DModel.from_pretrained(TINY, subfolder="transformer", torch_dtype=torch.bfloat16)
    bfl = to_bfl(ref.state_dict(), ref.config.num_layers, ref.config.num_single_layers)
    fp8 = {}
    for name, t in bfl.items():
        if t.dim() == 2 and name.endswith(".weight"):
            fp8[name] = t.to(torch.float8_e5m2 if name.startswith("single_blocks.") else torch.float8_e4m3fn)
        else:
            fp8[name] = t
    path = os.path.join(OUT, "flux-tiny-dev-bfl-fp8.safetensors")
    save_file(fp8, path)

    g = safe_open(os.path.join(OUT, "single_file_goldens.safetensors"), "pt")
    inputs = {k: g.get_tensor("tiny_" + k) for k in ("hidden", "encoder_hidden", "pooled", "timestep", "guidance",
                                                     "txt_ids", "img_ids")}
    single = FluxTransformer2DModel.from_single_file(path, config=TINY, subfolder="transformer",
                                                     torch_dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in single.parameters())
    goldens = {"fp8_out": run(single, inputs)}

    convert = single_file_model.SINGLE_FILE_LOADABLE_CLASSES["FluxTransformer2DModel"]["checkpoint_mapping_fn"]
    widened = {k: v.to(torch.bfloat16) for k, v in load_file(path).items()}
    plain = FluxTransformer2DModel.from_config(ref.config)
    plain.load_state_dict(convert(widened))
    goldens["fp8_widened_out"] = run(plain.to(torch.bfloat16), inputs)
    assert torch.equal(goldens["fp8_out"], goldens["fp8_widened_out"])
    single32 = FluxTransformer2DModel.from_single_file(path, config=TINY, subfolder="transformer",
                                                       torch_dtype=torch.float32)
    goldens["fp8_f32_out"] = run(single32, {k: v.float() for k, v in inputs.items()})
    # fp8 moves the output away from the bf16 model's (how far, for the record).
    err = (goldens["fp8_out"].float() - g.get_tensor("bfl_out").float()).abs().max() / g.get_tensor("bfl_out").float().abs().max()
    print(f"fp8 vs bf16 weights: relative max difference {err:.4f}")

    # The transformer as a diffusers folder in fp8, and the whole pipeline on it.
    folder = os.path.join(OUT, "flux-tiny-dev-fp8-transformer")
    os.makedirs(folder, exist_ok=True)
    shutil.copy(os.path.join(TINY, "transformer", "config.json"), folder)
    state = {k: (v.to(torch.float8_e4m3fn) if v.dim() == 2 and k.endswith(".weight") else v).contiguous()
             for k, v in ref.state_dict().items()}
    save_file(state, os.path.join(folder, "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
    with tempfile.TemporaryDirectory() as tmp:
        pipe_dir = os.path.join(tmp, "flux-tiny-dev-fp8")
        shutil.copytree(TINY, pipe_dir)
        shutil.rmtree(os.path.join(pipe_dir, "transformer"))
        shutil.copytree(folder, os.path.join(pipe_dir, "transformer"))
        pipe = FluxPipeline.from_pretrained(pipe_dir, torch_dtype=torch.bfloat16)
        assert all(p.dtype == torch.bfloat16 for p in pipe.transformer.parameters())
        with torch.no_grad():
            image = pipe("cat", height=64, width=64, num_inference_steps=3, guidance_scale=3.5,
                         generator=torch.Generator("cpu").manual_seed(0), max_sequence_length=32,
                         output_type="np").images[0]
    goldens["fp8_pipeline_image_u8"] = torch.from_numpy((image * 255).round().astype("uint8"))
    save_file({k: v.contiguous() for k, v in goldens.items()}, os.path.join(OUT, "fp8_single_file_goldens.safetensors"))


if __name__ == "__main__":
    main()
