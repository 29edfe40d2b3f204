#!/usr/bin/env python3
"""Qwen-Image LoRAs in the layouts they ship in, each with diffusers' image from QwenImagePipeline.load_lora_weights
(QwenImageLoraLoaderMixin: the transformer only; every layout but diffusers' own goes through
_convert_non_diffusers_qwen_lora_to_diffusers, which folds alpha / rank into the weights).

Writes (pip install torch diffusers==0.42.1 transformers peft safetensors gguf; run tools/goldens/qwen_image.py and
qwen_image_files.py first).
Every file is random (fixed seed) on the tiny transformer of qwen_image.py (2 blocks, width 64, text 48):
  tests/data/lora/qwen_image_diffusers.safetensors   PEFT names: transformer.<module>.lora_A.weight [r, in] /
      .lora_B.weight [out, r], NO alpha (with .alpha keys diffusers 0.42.1 runs its converter, which prefixes a
      second "transformer." and loads nothing), so scale 1; ranks 2 and 4, block and top-level modules.
  tests/data/lora/qwen_image_kohya.safetensors   sd-scripts / musubi-tuner names: lora_unet_<module, '.' -> '_'>
      .lora_down.weight / .lora_up.weight / .alpha (0-d), e.g. lora_unet_transformer_blocks_0_attn_to_k,
      lora_unet_transformer_blocks_1_txt_mod_1, lora_unet_norm_out_linear.
  tests/data/lora/qwen_image_comfy.safetensors   diffusion_model.<module>.lora_A.weight / .lora_B.weight, .alpha on
      some modules only (the others: scale 1), as ai-toolkit and ComfyUI-side trainers write them.
  tests/data/lora/qwen_image_lightning.safetensors   lightx2v's Qwen-Image-Lightning key style: bare diffusers
      module names, <module>.lora_down.weight / .lora_up.weight / .alpha, on every Linear of every block.
  tests/data/goldens/qwen_image_files/lora_<name>.safetensors   image_u8 and transformer_out_step0 of
      qwen_image.py's cat_64x64_s0 call with the LoRA loaded (adapter "a", weight 1), for name in diffusers, kohya,
      comfy, lightning; diffusers_fused_0.7: the diffusers LoRA after pipe.fuse_lora(lora_scale=0.7);
      kohya_weight_0.6: the kohya LoRA unfused at pipe.set_adapters(["a"], [0.6]); lightning_gguf_q8_0: the
      Lightning-style LoRA on the Q8_0 GGUF transformer of qwen_image_files.py (from_single_file with
      GGUFQuantizationConfig(compute_dtype=float32); PEFT wraps the GGUF layers, unfused), how small machines run
      Qwen-Image. Metadata: qwen_image.py's, plus lora (the file), layers (how many Linear layers it reaches) and
      lora_scale / adapter_weight / transformer_file.
alpha / rank is a power of two everywhere, so diffusers' folding of it into the weights is exact.

Run from the repository root: python3 tools/goldens/qwen_image_lora.py
"""
import os
import sys

import torch
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen_image  # noqa: E402
from chroma import LORA, save_file  # noqa: E402

TINY = os.path.join(qwen_image.MODELS, "qwen-image-tiny")
OUT = os.path.join(qwen_image.ROOT, "tests", "data", "goldens", "qwen_image_files")
BASE_GOLDENS = qwen_image.GOLDENS
BASE_CASE = qwen_image.CASES[0]
assert BASE_CASE[0] == "cat_64x64_s0"

BLOCK_LINEARS = ["img_mod.1", "txt_mod.1", "attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj",
                 "attn.add_k_proj", "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out", "img_mlp.net.0.proj",
                 "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2"]
# (module, rank)
DIFFUSERS_MODULES = [
    ("transformer_blocks.0.attn.to_q", 2), ("transformer_blocks.1.attn.add_k_proj", 4),
    ("transformer_blocks.0.attn.to_out.0", 2), ("transformer_blocks.1.attn.to_add_out", 2),
    ("transformer_blocks.0.img_mod.1", 4), ("transformer_blocks.1.txt_mlp.net.0.proj", 2),
    ("transformer_blocks.0.img_mlp.net.2", 2), ("img_in", 2), ("txt_in", 4), ("proj_out", 2), ("norm_out.linear", 2),
    ("time_text_embed.timestep_embedder.linear_1", 2)]
# (module, rank, alpha or None)
KOHYA_MODULES = [
    ("transformer_blocks.0.attn.to_k", 2, 4.0), ("transformer_blocks.1.attn.add_q_proj", 2, 1.0),
    ("transformer_blocks.0.attn.to_add_out", 2, 2.0), ("transformer_blocks.1.txt_mod.1", 4, 2.0),
    ("transformer_blocks.0.img_mlp.net.0.proj", 2, 8.0), ("transformer_blocks.1.txt_mlp.net.2", 2, 1.0),
    ("img_in", 2, 2.0), ("norm_out.linear", 2, 4.0), ("time_text_embed.timestep_embedder.linear_2", 2, 2.0),
    ("proj_out", 2, 1.0)]
COMFY_MODULES = [
    ("transformer_blocks.1.attn.to_v", 2, 4.0), ("transformer_blocks.0.attn.add_v_proj", 2, None),
    ("transformer_blocks.1.attn.to_out.0", 4, 2.0), ("transformer_blocks.0.txt_mod.1", 2, None),
    ("transformer_blocks.1.img_mlp.net.2", 2, 8.0), ("txt_in", 2, 1.0), ("proj_out", 2, None)]
LIGHTNING_MODULES = [(f"transformer_blocks.{b}.{m}", 2, 4.0 if (b + i) % 3 == 0 else 2.0)
                     for b in range(2) for i, m in enumerate(BLOCK_LINEARS)]


def write_loras():
    """The four files. Returns {name: (file, {diffusers module: (lora_A with alpha / rank folded in, lora_B)})}."""
    from diffusers import QwenImagePipeline, QwenImageTransformer2DModel

    t = QwenImageTransformer2DModel.from_pretrained(TINY, subfolder="transformer", torch_dtype=torch.float32)
    lin = {n: m for n, m in t.named_modules() if isinstance(m, torch.nn.Linear)}
    g = torch.Generator().manual_seed(31)

    def pair(module, rank, magnitude):
        m = lin[module]
        return (torch.randn(rank, m.in_features, generator=g) * magnitude,
                torch.randn(m.out_features, rank, generator=g) * magnitude)

    def layout(modules, key, down, up, magnitude):
        tensors, want = {}, {}
        for module, rank, alpha in modules:
            a, b = pair(module, rank, magnitude)
            k = key(module)
            tensors[f"{k}.{down}"], tensors[f"{k}.{up}"] = a, b
            if alpha is not None:
                tensors[f"{k}.alpha"] = torch.tensor(alpha)
            want[module] = (a * (alpha / rank if alpha is not None else 1.0), b)
        return tensors, want

    files = {
        "diffusers": layout([(m, r, None) for m, r in DIFFUSERS_MODULES], lambda m: "transformer." + m,
                            "lora_A.weight", "lora_B.weight", 0.3),
        "kohya": layout(KOHYA_MODULES, lambda m: "lora_unet_" + m.replace(".", "_"), "lora_down.weight",
                        "lora_up.weight", 0.3),
        "comfy": layout(COMFY_MODULES, lambda m: "diffusion_model." + m, "lora_A.weight", "lora_B.weight", 0.3),
        "lightning": layout(LIGHTNING_MODULES, lambda m: m, "lora_down.weight", "lora_up.weight", 0.15),
    }
    out = {}
    os.makedirs(LORA, exist_ok=True)
    for name, (tensors, want) in files.items():
        file = f"qwen_image_{name}.safetensors"
        path = os.path.join(LORA, file)
        save_file({k: v.contiguous() for k, v in tensors.items()}, path)
        # diffusers' conversion gives exactly the diffusers-layout LoRA with alpha / rank folded into lora_A.
        converted = QwenImagePipeline.lora_state_dict(path)
        equivalent = {}
        for m, (a, b) in want.items():
            equivalent[f"transformer.{m}.lora_A.weight"], equivalent[f"transformer.{m}.lora_B.weight"] = a, b
        assert set(converted) == set(equivalent), set(converted) ^ set(equivalent)
        assert all(torch.equal(converted[k], equivalent[k]) for k in equivalent), name
        print(f"wrote {file}: {len(tensors)} tensors, e.g. {sorted(tensors)[:2]}")
        out[name] = (file, want)
    return out


def adapted_modules(transformer):
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {n: m for n, m in transformer.named_modules() if isinstance(m, BaseTunerLayer)}


def lora_golden(case, file, want, baseline, fuse_scale=None, adapter_weight=None, transformer_file=None):
    pipe = qwen_image.load_pipeline(*BASE_CASE[1:4])
    if transformer_file is not None:
        from diffusers import GGUFQuantizationConfig, QwenImageTransformer2DModel

        pipe.transformer = QwenImageTransformer2DModel.from_single_file(
            os.path.join(OUT, transformer_file), config=TINY, subfolder="transformer", torch_dtype=torch.float32,
            quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32))
    pipe.load_lora_weights(os.path.join(LORA, file), adapter_name="a")
    adapted = adapted_modules(pipe.transformer)
    assert set(adapted) == set(want), set(adapted) ^ set(want)
    for m, (a, b) in want.items():
        layer = adapted[m]
        got = layer.lora_B["a"].weight @ layer.lora_A["a"].weight * layer.scaling["a"]
        assert torch.allclose(got, b @ a, rtol=1e-6, atol=1e-7), m
    if fuse_scale is not None:
        pipe.fuse_lora(lora_scale=fuse_scale)
    if adapter_weight is not None:
        pipe.set_adapters(["a"], [adapter_weight])
    tensors = qwen_image.run_case("lora_" + case, *BASE_CASE[1:], pipe=pipe)
    golden = os.path.join(OUT, "lora_" + case + ".safetensors")
    with safe_open(golden, "pt") as f:
        meta = dict(f.metadata())
    meta["lora"] = file
    meta["layers"] = str(len(adapted))
    if fuse_scale is not None:
        meta["lora_scale"] = repr(fuse_scale)
    if adapter_weight is not None:
        meta["adapter_weight"] = repr(adapter_weight)
    if transformer_file is not None:
        meta["transformer_file"] = transformer_file
    save_file({k: tensors[k].contiguous() for k in ("image_u8", "transformer_out_step0")}, golden, metadata=meta)
    effect = (tensors["image_u8"].float() - baseline.float()).abs().mean().item()
    print(f"wrote lora_{case}: {len(adapted)} adapted layers; mean level difference from the image without LoRA "
          f"{effect:.1f}")
    assert effect > 2, f"the LoRA barely changes the image ({effect:.2f} levels)"
    return tensors["image_u8"]


def main():
    import diffusers

    assert diffusers.__version__ == "0.42.1", diffusers.__version__
    torch.set_num_threads(2)
    with safe_open(os.path.join(BASE_GOLDENS, BASE_CASE[0] + ".safetensors"), "pt") as f:
        baseline = f.get_tensor("image_u8")
    files = write_loras()
    os.makedirs(OUT, exist_ok=True)
    qwen_image.GOLDENS = OUT  # where run_case writes a call's stages
    for name, (file, want) in files.items():
        lora_golden(name, file, want, baseline)
    file, want = files["diffusers"]
    lora_golden("diffusers_fused_0.7", file, want, baseline, fuse_scale=0.7)
    file, want = files["kohya"]
    lora_golden("kohya_weight_0.6", file, want, baseline, adapter_weight=0.6)
    # Run after qwen_image_files.py, which writes the GGUF.
    file, want = files["lightning"]
    lora_golden("lightning_gguf_q8_0", file, want, baseline, transformer_file="transformer_single_file-Q8_0.gguf")


if __name__ == "__main__":
    main()
