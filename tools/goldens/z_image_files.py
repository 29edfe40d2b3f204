#!/usr/bin/env python3
"""Z-Image's transformer as the files people actually download (ComfyUI's single file, a community GGUF, LoRAs in
three layouts), each with diffusers' image from it, and the names and shapes of the real checkpoints.

Writes (pip install torch diffusers==0.42.1 transformers peft safetensors gguf; run tools/goldens/z_image.py first):
  tests/data/goldens/z_image/transformer_single_file.safetensors
      z-image-tiny's transformer (float32) in the layout of ComfyUI's z_image_turbo_bf16.safetensors, the layout
      diffusers' convert_z_image_transformer_checkpoint_to_diffusers converts FROM: x_embedder.* / final_layer.*
      (diffusers: all_x_embedder.2-1.* / all_final_layer.2-1.*), <block>.attention.qkv.weight (to_q, to_k, to_v
      concatenated on dim 0), <block>.attention.out.weight (to_out.0), <block>.attention.q_norm / k_norm (norm_q /
      norm_k); every other name as diffusers has it. No "model.diffusion_model." prefix and no norm_final.weight:
      Comfy-Org's file has neither (diffusers strips the prefix and drops a norm_final.weight for ComfyUI-saved
      fine-tunes, diffusers PR #12888: that tensor is an unused leftover of ComfyUI's Lumina2 NextDiT, junk in
      those files). Checked to map back to exactly the diffusers state dict (also with the prefix and a junk
      norm_final added) and to load back exactly through ZImageTransformer2DModel.from_single_file.
  tests/data/goldens/z_image/transformer_single_file-Q8_0.gguf
      that file with every 2-D weight whose rows are whole 32-blocks in Q8_0 and the rest F32, arch "lumina2" (what
      city96's ComfyUI-GGUF convert.py detects a Z-Image file as, and the community Z-Image GGUFs carry: its
      loader's list of image architectures has no Z-Image entry)
  tests/data/goldens/z_image/gguf_q8_0_turbo_cat_64x64_s0.safetensors
      diffusers' ZImagePipeline (z-image-tiny, float32) with that GGUF as transformer (from_single_file with
      GGUFQuantizationConfig(compute_dtype=float32)), called as z_image.py's turbo_cat_64x64_s0 case: its stages and
      image; metadata as z_image.py writes it plus transformer_file.
  tests/data/lora/z_image_diffusers.safetensors   rank 2, PEFT names: transformer.<module>.lora_A.weight [2, in] /
      lora_B.weight [out, 2], NO alpha (diffusers 0.42.1 cannot load a transformer.-prefixed Z-Image LoRA with
      .alpha keys: its converter adds a second "transformer." and the load fails), so scale 1.
  tests/data/lora/z_image_kohya.safetensors       rank 2, kohya names over Z-Image's original module tree:
      lora_unet_<module with _>.lora_down.weight / lora_up.weight / alpha (0-d float32), fused
      lora_unet_<block>_attention_qkv (up [3 * dim, 2]) and lora_unet_<block>_attention_out. diffusers splits the
      qkv into to_q / to_k / to_v, each with the WHOLE down and its third of up, renames out to to_out.0, and folds
      alpha / rank into the weights.
  tests/data/lora/z_image_comfy.safetensors       rank 2, ComfyUI names: diffusion_model.<module>.lora_down.weight /
      lora_up.weight / alpha, <block>.attention.out for to_out.0. No fused qkv: diffusers leaves
      diffusion_model.<block>.attention.qkv LoRA weights unsplit and drops them with an "unexpected keys" warning.
  tests/data/goldens/z_image/lora_<name>.safetensors   (name: diffusers, kohya, comfy, diffusers_fused_0.7)
      image_u8 and transformer_out_step0 of turbo_cat_64x64_s0's call with that LoRA loaded (adapter weight 1;
      diffusers_fused_0.7: the diffusers LoRA after pipe.fuse_lora(lora_scale=0.7)), and lora_delta_<module> for two
      modules (diffusers names): the delta weight diffusers applied, lora_B @ lora_A * scaling (* 0.7 fused).
      Metadata: z_image.py's, plus lora (the file name) and, fused, lora_scale.
  tests/data/goldens/z_image/real_layouts.json   the real Z-Image-Turbo transformer (diffusers and single-file names)
      and Qwen3-4B text encoder (Qwen3Model: names without "model."), {name: shape}, built on the meta device, with
      the configs they were built from.

Run from the repository root: python3 tools/goldens/z_image_files.py
"""
import json
import os
import sys

import gguf
import torch
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chroma import LORA, save_file  # noqa: E402  (the byte-reproducible writer)
from z_image import CASES, GOLDENS, MODELS, REAL_TRANSFORMER, load_pipeline, run_case  # noqa: E402

TINY = os.path.join(MODELS, "z-image-tiny")
SINGLE_FILE = os.path.join(GOLDENS, "transformer_single_file.safetensors")
GGUF = os.path.join(GOLDENS, "transformer_single_file-Q8_0.gguf")
BASE_CASE = CASES[0]
assert BASE_CASE[0] == "turbo_cat_64x64_s0"


def base_image():
    with safe_open(os.path.join(GOLDENS, BASE_CASE[0] + ".safetensors"), "pt") as f:
        return f.get_tensor("image_u8")


# ---------------------------------------------------------------------------------------------------- single file
def to_single_file(sd):
    """diffusers' ZImageTransformer2DModel state dict in ComfyUI's names: the inverse of diffusers'
    convert_z_image_transformer_checkpoint_to_diffusers (loaders/single_file_utils.py)."""
    out = {}
    for k, v in sd.items():
        if ".attention.to_k.weight" in k or ".attention.to_v.weight" in k:
            continue
        if ".attention.to_q.weight" in k:
            out[k.replace(".to_q.", ".qkv.")] = torch.cat([sd[k.replace(".to_q.", f".to_{x}.")] for x in "qkv"])
            continue
        n = k
        for src, dst in (("all_final_layer.2-1.", "final_layer."), ("all_x_embedder.2-1.", "x_embedder."),
                         (".attention.to_out.0.", ".attention.out."), (".attention.norm_q.", ".attention.q_norm."),
                         (".attention.norm_k.", ".attention.k_norm.")):
            n = n.replace(src, dst)
        assert n not in out, n
        out[n] = v
    assert not any(".to_q." in k or ".to_k." in k or ".to_v." in k or "to_out" in k or "all_" in k for k in out)
    return out


def write_single_file():
    from diffusers import ZImageTransformer2DModel
    from diffusers.loaders.single_file_utils import convert_z_image_transformer_checkpoint_to_diffusers as convert

    sd = {k: v.detach().clone() for k, v in ZImageTransformer2DModel.from_pretrained(
        TINY, subfolder="transformer", torch_dtype=torch.float32).state_dict().items()}
    original = to_single_file(sd)
    save_file({k: v.contiguous() for k, v in original.items()}, SINGLE_FILE)

    def same(back):
        return set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)

    assert same(convert({k: v.clone() for k, v in original.items()}))
    # The converter also takes what ComfyUI itself saves (fine-tunes): the prefix, and a junk norm_final.weight.
    comfy_saved = {"model.diffusion_model." + k: v.clone() for k, v in original.items()}
    comfy_saved["model.diffusion_model.norm_final.weight"] = torch.full((sd["cap_pad_token"].shape[-1],), float("nan"))
    assert same(convert(comfy_saved))
    loaded = ZImageTransformer2DModel.from_single_file(SINGLE_FILE, config=TINY, subfolder="transformer",
                                                       torch_dtype=torch.float32)
    assert same(loaded.state_dict())
    print(f"wrote transformer_single_file: {len(original)} tensors ({len(sd)} in diffusers' names), "
          f"{os.path.getsize(SINGLE_FILE)} bytes; loads back exactly")
    return sd


# ---------------------------------------------------------------------------------------------------- GGUF
def write_gguf():
    w = gguf.GGUFWriter(GGUF, arch="lumina2")
    w.add_uint32("general.quantization_version", 2)
    quantized = []
    with safe_open(SINGLE_FILE, "pt") as f:
        for name in f.keys():
            a = f.get_tensor(name).float().numpy()
            if a.ndim == 2 and name.endswith(".weight") and a.shape[1] % 32 == 0:
                w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                             raw_dtype=gguf.GGMLQuantizationType.Q8_0)
                quantized.append(name)
            else:
                w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {os.path.basename(GGUF)}: {len(quantized)} Q8_0 weights, {os.path.getsize(GGUF)} bytes")
    return quantized


def gguf_golden(quantized):
    from diffusers import GGUFQuantizationConfig, ZImageTransformer2DModel

    transformer = ZImageTransformer2DModel.from_single_file(
        GGUF, config=TINY, subfolder="transformer", torch_dtype=torch.float32,
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32))
    held = sorted(n for n, p in transformer.named_parameters() if type(p).__name__ == "GGUFParameter")
    n_qkv = sum(".attention.qkv." in n for n in quantized)
    # Every Q8_0 weight stays quantized; each fused qkv becomes three (torch.chunk of the Q8_0 rows).
    assert len(held) == len(quantized) + 2 * n_qkv, (len(held), len(quantized))
    print(f"diffusers holds {len(held)} GGUFParameter weights ({len(quantized)} Q8_0 tensors, {n_qkv} of them qkv "
          f"split in 3)")
    pipe = load_pipeline(BASE_CASE[1], BASE_CASE[2], BASE_CASE[3])
    pipe.transformer = transformer
    name = "gguf_q8_0_" + BASE_CASE[0]
    tensors, meta, _ = run_case(name, *BASE_CASE[1:], pipe=pipe)
    meta["transformer_file"] = os.path.basename(GGUF)
    save_file(tensors, os.path.join(GOLDENS, name + ".safetensors"), metadata=meta)
    d = (tensors["image_u8"].float() - base_image().float()).abs()
    print(f"Q8_0 vs the f32 transformer's image: mean {d.mean():.3f} max {d.max():.0f} levels")
    assert d.max() > 0, "the quantized weights left no trace"
    return len(held)


# ---------------------------------------------------------------------------------------------------- LoRA
# diffusers' names. Every Linear kind the model has: attention q / out, the three FFN weights, the modulation, the
# caption and patch embedders, the final projection, in the main layers and both refiners.
DIFFUSERS_MODULES = [
    "layers.0.attention.to_q", "layers.1.attention.to_out.0", "layers.0.feed_forward.w1", "layers.1.feed_forward.w2",
    "noise_refiner.0.attention.to_k", "context_refiner.0.feed_forward.w3", "layers.0.adaLN_modulation.0",
    "cap_embedder.1", "all_x_embedder.2-1", "all_final_layer.2-1.linear"]
# kohya: Z-Image's original module names (fused qkv, out), with their alpha: alpha / rank = 2, 0.5, 1, 4 (powers of
# two: diffusers folds the scale into lora_down exactly). No x_embedder / final_layer: diffusers turns
# lora_unet_x_embedder into "x.embedder" and cannot load it.
KOHYA_MODULES = [
    ("layers.0.attention.qkv", 4.0), ("layers.1.attention.out", 1.0), ("layers.0.feed_forward.w1", 2.0),
    ("layers.1.feed_forward.w2", 2.0), ("noise_refiner.0.attention.qkv", 1.0), ("noise_refiner.0.attention.out", 4.0),
    ("context_refiner.0.attention.qkv", 2.0), ("context_refiner.0.feed_forward.w3", 8.0),
    ("layers.0.adaLN_modulation.0", 1.0)]
# ComfyUI: diffusion_model.<ComfyUI name>, lora_down / lora_up / alpha.
COMFY_MODULES = [
    ("layers.1.attention.out", 4.0), ("noise_refiner.0.attention.out", 1.0), ("layers.0.feed_forward.w1", 2.0),
    ("context_refiner.0.feed_forward.w2", 2.0), ("layers.1.adaLN_modulation.0", 8.0), ("cap_embedder.1", 1.0),
    ("t_embedder.mlp.2", 2.0)]
# The modules each golden records the applied delta of.
DELTAS = {
    "diffusers": ["layers.0.attention.to_q", "all_x_embedder.2-1"],
    "kohya": ["layers.0.attention.to_k", "layers.1.attention.to_out.0"],
    "comfy": ["layers.1.attention.to_out.0", "layers.0.feed_forward.w1"],
}
RANK = 2


def diffusers_name(module):
    return module.replace(".attention.out", ".attention.to_out.0")


def write_loras():
    """The three files. Returns, per file, {diffusers module: (lora_A, lora_B)} with alpha / rank folded into lora_A
    (what diffusers' loader must end up with) and the file's name."""
    from diffusers import ZImageTransformer2DModel

    t = ZImageTransformer2DModel.from_pretrained(TINY, subfolder="transformer", torch_dtype=torch.float32)
    lin = {n: m for n, m in t.named_modules() if isinstance(m, torch.nn.Linear)}
    dim = t.config.dim

    def shape(module):  # (in, out) of a module in either naming; qkv: the three projections together
        if module.endswith(".attention.qkv"):
            return dim, 3 * dim
        m = lin[diffusers_name(module)]
        return m.in_features, m.out_features

    g = torch.Generator().manual_seed(21)

    def pair(module, magnitude):
        n_in, n_out = shape(module)
        return (torch.randn(RANK, n_in, generator=g) * magnitude, torch.randn(n_out, RANK, generator=g) * magnitude)

    os.makedirs(LORA, exist_ok=True)
    files = {}
    # (a) PEFT / diffusers
    tensors, want = {}, {}
    for m in DIFFUSERS_MODULES:
        a, b = pair(m, 0.3)
        tensors[f"transformer.{m}.lora_A.weight"], tensors[f"transformer.{m}.lora_B.weight"] = a, b
        want[m] = (a, b)
    files["diffusers"] = ("z_image_diffusers.safetensors", tensors, want)
    # (b) kohya
    tensors, want = {}, {}
    for m, alpha in KOHYA_MODULES:
        down, up = pair(m, 0.3)
        k = "lora_unet_" + m.replace(".", "_")
        tensors[f"{k}.lora_down.weight"], tensors[f"{k}.lora_up.weight"] = down, up
        tensors[f"{k}.alpha"] = torch.tensor(alpha)
        scaled = down * (alpha / RANK)
        if m.endswith(".qkv"):
            for x, chunk in zip("qkv", up.chunk(3, dim=0)):
                want[m.replace(".qkv", f".to_{x}")] = (scaled, chunk)
        else:
            want[diffusers_name(m)] = (scaled, up)
    files["kohya"] = ("z_image_kohya.safetensors", tensors, want)
    # (c) ComfyUI
    tensors, want = {}, {}
    for m, alpha in COMFY_MODULES:
        down, up = pair(m, 0.3)
        k = "diffusion_model." + m
        tensors[f"{k}.lora_down.weight"], tensors[f"{k}.lora_up.weight"] = down, up
        tensors[f"{k}.alpha"] = torch.tensor(alpha)
        want[diffusers_name(m)] = (down * (alpha / RANK), up)
    files["comfy"] = ("z_image_comfy.safetensors", tensors, want)

    from diffusers import ZImagePipeline

    for name, (file, tensors, want) in files.items():
        path = os.path.join(LORA, file)
        save_file({k: v.contiguous() for k, v in tensors.items()}, path)
        # diffusers' conversion gives exactly the diffusers-layout LoRA with alpha / rank folded into lora_A.
        converted = ZImagePipeline.lora_state_dict(path)
        equivalent = {}
        for m, (a, b) in want.items():
            equivalent[f"transformer.{m}.lora_A.weight"], equivalent[f"transformer.{m}.lora_B.weight"] = a, b
        assert set(converted) == set(equivalent), set(converted) ^ set(equivalent)
        assert all(torch.equal(converted[k], equivalent[k]) for k in equivalent), name
        print(f"wrote {file}: {len(tensors)} tensors; e.g. {sorted(tensors)[:3]}")
        print(f"   diffusers converts it to {len(converted)} tensors; e.g. {sorted(converted)[:3]}")
    return files


def adapted_modules(transformer):
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {n: m for n, m in transformer.named_modules() if isinstance(m, BaseTunerLayer)}


def lora_golden(name, file, want, baseline, fuse_scale=None):
    """The base case with `file` loaded (adapter weight 1), optionally fused at fuse_scale. Returns the image."""
    pipe = load_pipeline(*BASE_CASE[1:4])
    pipe.load_lora_weights(os.path.join(LORA, file), adapter_name="a")
    adapted = adapted_modules(pipe.transformer)
    assert set(adapted) == set(want), set(adapted) ^ set(want)
    deltas = {}
    for m, (a, b) in want.items():
        layer = adapted[m]
        got = layer.lora_B["a"].weight @ layer.lora_A["a"].weight * layer.scaling["a"]
        assert layer.scaling["a"] == 1.0, (m, layer.scaling)  # the alphas were folded into lora_A
        assert torch.allclose(got, b @ a, rtol=1e-6, atol=1e-7), m
        deltas[m] = got.detach().clone()
    if fuse_scale is not None:
        base = {m: adapted[m].base_layer.weight.detach().clone() for m in want}
        pipe.fuse_lora(lora_scale=fuse_scale)
        for m in want:
            deltas[m] = deltas[m] * fuse_scale
            applied = adapted[m].base_layer.weight.detach() - base[m]
            assert torch.allclose(applied, deltas[m], rtol=1e-5, atol=1e-6), m
    tensors, meta, _ = run_case(name, *BASE_CASE[1:], pipe=pipe)
    meta["lora"] = file
    if fuse_scale is not None:
        meta["lora_scale"] = repr(fuse_scale)
    out = {"image_u8": tensors["image_u8"], "transformer_out_step0": tensors["transformer_out_step0"]}
    for m in DELTAS[name.split("_")[0]]:
        out[f"lora_delta_{m}"] = deltas[m]
    golden = "lora_" + name
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(GOLDENS, golden + ".safetensors"),
              metadata=meta)
    effect = (tensors["image_u8"].float() - baseline.float()).abs().mean().item()
    print(f"wrote {golden}: {len(adapted)} adapted layers; mean level difference from the image without LoRA "
          f"{effect:.1f}")
    assert effect > 2, f"the LoRA barely changes the image ({effect:.2f} levels)"
    return tensors["image_u8"]


def lora_goldens(files):
    baseline = base_image()
    for name in ("diffusers", "kohya", "comfy"):
        file, _, want = files[name]
        lora_golden(name, file, want, baseline)
    file, _, want = files["diffusers"]
    fused = lora_golden("diffusers_fused_0.7", file, want, baseline, fuse_scale=0.7)
    # Fused at 0.7 = the unfused adapter at weight 0.7.
    pipe = load_pipeline(*BASE_CASE[1:4])
    pipe.load_lora_weights(os.path.join(LORA, file), adapter_name="a")
    pipe.set_adapters(["a"], [0.7])
    unfused, _, _ = run_case("check", *BASE_CASE[1:], pipe=pipe)
    d = (unfused["image_u8"].float() - fused.float()).abs()
    print(f"fused at 0.7 vs adapter weight 0.7: max {d.max():.0f} levels (mean {d.mean():.3f})")
    assert d.max() <= 1


# ---------------------------------------------------------------------------------------------------- real layouts
def real_layouts():
    from diffusers import ZImageTransformer2DModel
    from diffusers.loaders.single_file_utils import convert_z_image_transformer_checkpoint_to_diffusers
    from transformers import Qwen3Config, Qwen3Model

    # Qwen3-4B's config.json (flux2_text_real_configs.json: FLUX.2 klein 4B uses the same text encoder), as
    # Z-Image-Turbo's text_encoder folder holds it: saved from Qwen3Model (the weights have no "model." prefix).
    qwen = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                       "flux2_text_real_configs.json")))["klein_4b_text_encoder"]
    qwen = dict(qwen, architectures=["Qwen3Model"])
    layouts = {"transformer_config": REAL_TRANSFORMER, "text_encoder_config": qwen}
    with torch.device("meta"):
        t = ZImageTransformer2DModel(**{k: v for k, v in REAL_TRANSFORMER.items() if not k.startswith("_")})
        sd = t.state_dict()
        layouts["transformer"] = {k: list(v.shape) for k, v in sd.items()}
        original = to_single_file(sd)
        layouts["transformer_single_file"] = {k: list(v.shape) for k, v in original.items()}
        back = convert_z_image_transformer_checkpoint_to_diffusers(dict(original))
        assert {k: list(v.shape) for k, v in back.items()} == layouts["transformer"]
        config = Qwen3Config(**{k: v for k, v in qwen.items() if k not in ("architectures", "torch_dtype")})
        te = Qwen3Model(config)
        layouts["text_encoder"] = {k: list(v.shape) for k, v in te.state_dict().items()}
    assert "embed_tokens.weight" in layouts["text_encoder"] and len(layouts["text_encoder"]) == 2 + 36 * 11
    for part in ("transformer", "transformer_single_file", "text_encoder"):
        n = sum(torch.Size(s).numel() for s in layouts[part].values())
        print(f"real {part}: {len(layouts[part])} tensors, {n / 1e9:.3f} B parameters")
    return layouts


def main():
    import diffusers

    assert diffusers.__version__ == "0.42.1", diffusers.__version__
    torch.set_num_threads(2)
    write_single_file()
    quantized = write_gguf()
    gguf_golden(quantized)
    files = write_loras()
    lora_goldens(files)
    with open(os.path.join(GOLDENS, "real_layouts.json"), "w") as f:
        json.dump(real_layouts(), f, separators=(",", ":"), sort_keys=True)
    for folder, names in ((GOLDENS, None), (LORA, "z_image_")):
        for name in sorted(os.listdir(folder)):
            if names is None or name.startswith(names):
                print(f"  {name}: {os.path.getsize(os.path.join(folder, name))} bytes")


if __name__ == "__main__":
    main()
