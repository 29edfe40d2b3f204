"""FLUX and SD3 transformers as single files, the way people download them, with diffusers' outputs on them.

Writes (pip install torch diffusers transformers safetensors gguf):
  tests/data/gguf/flux-tiny-dev-bfl.safetensors   the tiny bf16 FLUX.1-dev transformer of tools/goldens/flux.py
                                                  (tests/data/models/flux-tiny-dev-bf16) in Black Forest Labs'
                                                  layout (flux1-dev.safetensors' names, fused qkv, shift/scale)
  tests/data/gguf/flux-tiny-dev-Q8_0.gguf         the same in GGUF: Linear weights Q8_0, the rest F32, BFL names
                                                  (as city96's FLUX GGUF files are laid out)
  tests/data/gguf/flux-256/transformer/config.json, flux-256-Q4_K.gguf
                                                  a 256-wide, 128-per-head tiny FLUX (1 double, 1 single block) so
                                                  that K-quants apply: weights whose rows are whole 256-blocks in
                                                  Q4_K, the others Q8_0 (a mixed file, like *_K_S ones)
  tests/data/gguf/sd3-tiny-medium-sai.safetensors, sd3-tiny-medium-Q8_0.gguf
                                                  the tiny SD3.5-Medium-like transformer of tools/goldens/sd3.py
                                                  (tests/data/models/sd3-tiny-medium, in bf16) in Stability AI's
                                                  layout (sd3.5_medium.safetensors' names), and in GGUF Q8_0
  tests/data/gguf/single_file_goldens.safetensors
                                                  per case the transformer's inputs and diffusers' output from
                                                  FluxTransformer2DModel.from_single_file(..., quantization_config=
                                                  GGUFQuantizationConfig(compute_dtype=torch.bfloat16))

diffusers' converter (convert_flux_transformer_checkpoint_to_diffusers) hard-codes FLUX.1's width 3072 when it
splits the single blocks' fused linear1; for these tiny models the tool runs that same function with the width
read from the checkpoint (the only change), registered where from_single_file looks it up.
Run from the repository root: python tools/gguf_refs/single_files.py
"""

import inspect
import json
import os

import gguf
import numpy as np
import torch
from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig, SD3Transformer2DModel
from diffusers.loaders import single_file_model, single_file_utils
from safetensors import safe_open
from safetensors.torch import save_file

OUT = os.path.join("tests", "data", "gguf")
TINY = os.path.join("tests", "data", "models", "flux-tiny-dev-bf16")


def patch_diffusers_width():
    src = inspect.getsource(single_file_utils.convert_flux_transformer_checkpoint_to_diffusers)
    assert "inner_dim = 3072" in src
    src = src.replace("inner_dim = 3072",
                      "inner_dim = checkpoint['img_in.weight'].shape[0] if 'img_in.weight' in checkpoint else 3072")
    scope = dict(vars(single_file_utils))
    exec(src, scope)
    fn = scope["convert_flux_transformer_checkpoint_to_diffusers"]
    single_file_model.SINGLE_FILE_LOADABLE_CLASSES["FluxTransformer2DModel"]["checkpoint_mapping_fn"] = fn


def to_bfl(sd, num_layers, num_single_layers):
    """diffusers FluxTransformer2DModel state dict -> Black Forest Labs' names and fused tensors."""
    out = {}

    def lin(bfl, diff):
        out[bfl + ".weight"] = sd[diff + ".weight"]
        out[bfl + ".bias"] = sd[diff + ".bias"]

    def fused(bfl, diffs):
        for p in ("weight", "bias"):
            out[f"{bfl}.{p}"] = torch.cat([sd[f"{d}.{p}"] for d in diffs], 0)

    lin("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1")
    lin("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2")
    lin("vector_in.in_layer", "time_text_embed.text_embedder.linear_1")
    lin("vector_in.out_layer", "time_text_embed.text_embedder.linear_2")
    if "time_text_embed.guidance_embedder.linear_1.weight" in sd:
        lin("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1")
        lin("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2")
    lin("txt_in", "context_embedder")
    lin("img_in", "x_embedder")
    for i in range(num_layers):
        b, d = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        lin(b + "img_mod.lin", d + "norm1.linear")
        lin(b + "txt_mod.lin", d + "norm1_context.linear")
        fused(b + "img_attn.qkv", [d + "attn.to_q", d + "attn.to_k", d + "attn.to_v"])
        fused(b + "txt_attn.qkv", [d + "attn.add_q_proj", d + "attn.add_k_proj", d + "attn.add_v_proj"])
        out[b + "img_attn.norm.query_norm.scale"] = sd[d + "attn.norm_q.weight"]
        out[b + "img_attn.norm.key_norm.scale"] = sd[d + "attn.norm_k.weight"]
        out[b + "txt_attn.norm.query_norm.scale"] = sd[d + "attn.norm_added_q.weight"]
        out[b + "txt_attn.norm.key_norm.scale"] = sd[d + "attn.norm_added_k.weight"]
        lin(b + "img_mlp.0", d + "ff.net.0.proj")
        lin(b + "img_mlp.2", d + "ff.net.2")
        lin(b + "txt_mlp.0", d + "ff_context.net.0.proj")
        lin(b + "txt_mlp.2", d + "ff_context.net.2")
        lin(b + "img_attn.proj", d + "attn.to_out.0")
        lin(b + "txt_attn.proj", d + "attn.to_add_out")
    for i in range(num_single_layers):
        b, d = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        lin(b + "modulation.lin", d + "norm.linear")
        fused(b + "linear1", [d + "attn.to_q", d + "attn.to_k", d + "attn.to_v", d + "proj_mlp"])
        out[b + "norm.query_norm.scale"] = sd[d + "attn.norm_q.weight"]
        out[b + "norm.key_norm.scale"] = sd[d + "attn.norm_k.weight"]
        lin(b + "linear2", d + "proj_out")
    lin("final_layer.linear", "proj_out")
    for p in ("weight", "bias"):
        scale, shift = sd[f"norm_out.linear.{p}"].chunk(2, 0)  # diffusers: (scale, shift); BFL: (shift, scale)
        out[f"final_layer.adaLN_modulation.1.{p}"] = torch.cat([shift, scale], 0)
    assert len(set(id(v) for v in out.values())) == len(out)
    return {k: v.contiguous() for k, v in out.items()}


def to_sai(sd, num_layers, dual_layers):
    """diffusers SD3Transformer2DModel state dict -> Stability AI's names and fused tensors."""
    out = {}

    def lin(sai, diff):
        out[sai + ".weight"] = sd[diff + ".weight"]
        out[sai + ".bias"] = sd[diff + ".bias"]

    def fused(sai, diffs):
        for p in ("weight", "bias"):
            out[f"{sai}.{p}"] = torch.cat([sd[f"{d}.{p}"] for d in diffs], 0)

    def unswap(sai, diff):  # diffusers (scale, shift) -> SAI (shift, scale)
        for p in ("weight", "bias"):
            scale, shift = sd[f"{diff}.{p}"].chunk(2, 0)
            out[f"{sai}.{p}"] = torch.cat([shift, scale], 0)

    out["pos_embed"] = sd["pos_embed.pos_embed"]
    lin("x_embedder.proj", "pos_embed.proj")
    lin("t_embedder.mlp.0", "time_text_embed.timestep_embedder.linear_1")
    lin("t_embedder.mlp.2", "time_text_embed.timestep_embedder.linear_2")
    lin("y_embedder.mlp.0", "time_text_embed.text_embedder.linear_1")
    lin("y_embedder.mlp.2", "time_text_embed.text_embedder.linear_2")
    lin("context_embedder", "context_embedder")
    for i in range(num_layers):
        d, x, c = f"transformer_blocks.{i}.", f"joint_blocks.{i}.x_block.", f"joint_blocks.{i}.context_block."
        last = i == num_layers - 1
        fused(x + "attn.qkv", [d + "attn.to_q", d + "attn.to_k", d + "attn.to_v"])
        fused(c + "attn.qkv", [d + "attn.add_q_proj", d + "attn.add_k_proj", d + "attn.add_v_proj"])
        for sai, diff in (("attn.ln_q", "attn.norm_q"), ("attn.ln_k", "attn.norm_k")):
            out[x + sai + ".weight"] = sd[d + diff + ".weight"]
        out[c + "attn.ln_q.weight"] = sd[d + "attn.norm_added_q.weight"]
        out[c + "attn.ln_k.weight"] = sd[d + "attn.norm_added_k.weight"]
        lin(x + "attn.proj", d + "attn.to_out.0")
        if not last:
            lin(c + "attn.proj", d + "attn.to_add_out")
        if i in dual_layers:
            fused(x + "attn2.qkv", [d + "attn2.to_q", d + "attn2.to_k", d + "attn2.to_v"])
            out[x + "attn2.ln_q.weight"] = sd[d + "attn2.norm_q.weight"]
            out[x + "attn2.ln_k.weight"] = sd[d + "attn2.norm_k.weight"]
            lin(x + "attn2.proj", d + "attn2.to_out.0")
        lin(x + "adaLN_modulation.1", d + "norm1.linear")
        if last:
            unswap(c + "adaLN_modulation.1", d + "norm1_context.linear")
        else:
            lin(c + "adaLN_modulation.1", d + "norm1_context.linear")
        lin(x + "mlp.fc1", d + "ff.net.0.proj")
        lin(x + "mlp.fc2", d + "ff.net.2")
        if not last:
            lin(c + "mlp.fc1", d + "ff_context.net.0.proj")
            lin(c + "mlp.fc2", d + "ff_context.net.2")
    lin("final_layer.linear", "proj_out")
    unswap("final_layer.adaLN_modulation.1", "norm_out.linear")
    return {k: v.contiguous() for k, v in out.items()}


def quantize_q4_k(values):
    """Our own Q4_K quantizer (gguf-py only dequantizes K-quants): per 32-element sub-block a 6-bit scale and
    min under float16 super-scales, 4-bit values, packed as ggml's block_q4_K."""
    x = values.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(x.min(-1), 0)
    hi = x.max(-1)
    sc = (hi - lo) / 15
    mn = -lo
    d = (sc.max(-1) / 63).astype(np.float16)
    dmin = (mn.max(-1) / 63).astype(np.float16)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        qsc = np.clip(np.where(df > 0, np.round(sc / df), 0), 0, 63).astype(np.uint8)
        qmn = np.clip(np.where(dminf > 0, np.round(mn / dminf), 0), 0, 63).astype(np.uint8)
        step = (df * qsc)[..., None]
        q = np.where(step > 0, np.round((x + (dminf * qmn)[..., None]) / step), 0)
    q = np.clip(q, 0, 15).astype(np.uint8)
    n = x.shape[0]
    scales = np.zeros((n, 12), np.uint8)
    for j in range(4):
        scales[:, j] = (qsc[:, j] & 63) | ((qsc[:, j + 4] >> 4) << 6)
        scales[:, j + 4] = (qmn[:, j] & 63) | ((qmn[:, j + 4] >> 4) << 6)
        scales[:, j + 8] = (qsc[:, j + 4] & 15) | ((qmn[:, j + 4] & 15) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(n, 128)
    blocks = np.concatenate([d.view(np.uint8).reshape(n, 2), dmin.view(np.uint8).reshape(n, 2), scales, qs], 1)
    return blocks.reshape(*values.shape[:-1], values.shape[-1] // 256 * 144)


def write_gguf(path, bfl, kquant):
    w = gguf.GGUFWriter(path, arch="flux")
    w.add_uint32("general.quantization_version", 2)
    for name, t in bfl.items():
        a = t.float().numpy()
        k = a.shape[-1]
        if a.ndim == 2 and name.endswith(".weight") and kquant and k % 256 == 0:
            q = quantize_q4_k(a)
            err = np.abs(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q4_K) - a).max() / np.abs(a).max()
            assert err < 0.1, (name, err)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        elif a.ndim == 2 and name.endswith(".weight") and k % 32 == 0:
            w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def image_ids(h, w):
    ids = torch.zeros(h, w, 3)
    ids[..., 1] += torch.arange(h)[:, None]
    ids[..., 2] += torch.arange(w)[None, :]
    return ids.reshape(h * w, 3)


def run(model, inputs):
    with torch.no_grad():
        return model(hidden_states=inputs["hidden"], encoder_hidden_states=inputs["encoder_hidden"],
                     pooled_projections=inputs["pooled"], timestep=inputs["timestep"],
                     guidance=inputs.get("guidance"), txt_ids=inputs["txt_ids"], img_ids=inputs["img_ids"],
                     return_dict=False)[0]


def main():
    patch_diffusers_width()
    goldens = {}
    q = GGUFQuantizationConfig(compute_dtype=torch.bfloat16)

    # 1. The tiny dev transformer (32 wide) as a BFL safetensors file and as Q8_0 GGUF.
    ref = FluxTransformer2DModel.from_pretrained(TINY, subfolder="transformer", torch_dtype=torch.bfloat16)
    bfl = to_bfl(ref.state_dict(), ref.config.num_layers, ref.config.num_single_layers)
    save_file(bfl, os.path.join(OUT, "flux-tiny-dev-bfl.safetensors"))
    write_gguf(os.path.join(OUT, "flux-tiny-dev-Q8_0.gguf"), bfl, kquant=False)
    g = safe_open(os.path.join("tests", "data", "goldens", "flux", "devbf16_cat_64x64_s0.safetensors"), "pt")
    enc = g.get_tensor("prompt_embeds")
    inputs = dict(hidden=g.get_tensor("latents_init"), encoder_hidden=enc, pooled=g.get_tensor("pooled_prompt_embeds"),
                  timestep=g.get_tensor("transformer_in_timestep"), guidance=g.get_tensor("transformer_in_guidance"),
                  txt_ids=torch.zeros(enc.shape[1], 3, dtype=enc.dtype), img_ids=image_ids(4, 4).to(enc.dtype))
    expected_plain = run(ref, inputs)
    assert torch.equal(expected_plain, g.get_tensor("transformer_out_step0"))
    single = FluxTransformer2DModel.from_single_file(os.path.join(OUT, "flux-tiny-dev-bfl.safetensors"), config=TINY,
                                                     subfolder="transformer", torch_dtype=torch.bfloat16)
    goldens["bfl_out"] = run(single, inputs)
    assert torch.equal(goldens["bfl_out"], expected_plain), "the BFL file must load to the same model"
    q8 = FluxTransformer2DModel.from_single_file(os.path.join(OUT, "flux-tiny-dev-Q8_0.gguf"), config=TINY,
                                                 subfolder="transformer", quantization_config=q,
                                                 torch_dtype=torch.bfloat16)
    goldens["q8_0_out"] = run(q8, inputs)
    for k, v in inputs.items():
        goldens["tiny_" + k] = v

    # 2. A 256-wide FLUX (two 128-wide heads, FLUX.1's RoPE axes) in a mixed Q4_K / Q8_0 GGUF.
    cfg = dict(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=128,
               num_attention_heads=2, joint_attention_dim=256, pooled_projection_dim=256, guidance_embeds=False,
               axes_dims_rope=[16, 56, 56])
    torch.manual_seed(4)
    wide = FluxTransformer2DModel(**cfg)
    with torch.no_grad():
        for p in wide.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    wide = wide.to(torch.bfloat16)
    cfg_dir = os.path.join(OUT, "flux-256", "transformer")
    os.makedirs(cfg_dir, exist_ok=True)
    wide.save_config(cfg_dir)
    write_gguf(os.path.join(OUT, "flux-256-Q4_K.gguf"), to_bfl(wide.state_dict(), 1, 1), kquant=True)
    torch.manual_seed(5)
    text, grid = 8, 4
    wide_in = dict(hidden=torch.randn(1, grid * grid, 64).to(torch.bfloat16),
                   encoder_hidden=torch.randn(1, text, 256).to(torch.bfloat16),
                   pooled=torch.randn(1, 256).to(torch.bfloat16), timestep=torch.tensor([0.75]).to(torch.bfloat16),
                   txt_ids=torch.zeros(text, 3, dtype=torch.bfloat16),
                   img_ids=image_ids(grid, grid).to(torch.bfloat16))
    q4 = FluxTransformer2DModel.from_single_file(os.path.join(OUT, "flux-256-Q4_K.gguf"),
                                                 config=os.path.join(OUT, "flux-256"), subfolder="transformer",
                                                 quantization_config=q, torch_dtype=torch.bfloat16)
    goldens["q4_k_out"] = run(q4, wide_in)
    # diffusers dequantizes K-quants in float16 (d * scale, d * q - dmin * min each rounded to float16) before
    # the bf16 cast; the gguf package (and Kiln) compute those in float32. The same model with the gguf
    # package's weights shows how much of the difference is that float16 arithmetic.
    exact = {t.name: torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).reshape(
        [int(d) for d in reversed(t.shape)]) for t in gguf.GGUFReader(os.path.join(OUT, "flux-256-Q4_K.gguf")).tensors}
    convert = single_file_model.SINGLE_FILE_LOADABLE_CLASSES["FluxTransformer2DModel"]["checkpoint_mapping_fn"]
    plain = FluxTransformer2DModel(**cfg)
    plain.load_state_dict(convert(exact))
    goldens["q4_k_exact_weights_out"] = run(plain.to(torch.bfloat16), wide_in)
    for k, v in wide_in.items():
        goldens["wide_" + k] = v
    # 3. The tiny SD3.5-Medium-like transformer (MMDiT-X blocks, qk norm) of tools/goldens/sd3.py in Stability
    #    AI's layout, as bf16 safetensors and Q8_0 GGUF, on the CFG batch of the mediumbf16 golden's first step.
    sd3_dir = os.path.join("tests", "data", "models", "sd3-tiny-medium")
    sd3 = SD3Transformer2DModel.from_pretrained(sd3_dir, subfolder="transformer").to(torch.bfloat16)
    sai = to_sai(sd3.state_dict(), sd3.config.num_layers, list(sd3.config.dual_attention_layers))
    assert len(sai) == len(sd3.state_dict()) - 2 * 2 * (2 * sd3.config.num_layers + len(sd3.config.dual_attention_layers)), len(sai)
    save_file(sai, os.path.join(OUT, "sd3-tiny-medium-sai.safetensors"))
    write_gguf(os.path.join(OUT, "sd3-tiny-medium-Q8_0.gguf"), sai, kquant=False)
    g = safe_open(os.path.join("tests", "data", "goldens", "sd3", "mediumbf16_cat_64x64_s0.safetensors"), "pt")
    sd3_in = dict(hidden=torch.cat([g.get_tensor("latents_init")] * 2),
                  encoder_hidden=torch.cat([g.get_tensor("negative_prompt_embeds"), g.get_tensor("prompt_embeds")]),
                  pooled=torch.cat([g.get_tensor("negative_pooled_prompt_embeds"), g.get_tensor("pooled_prompt_embeds")]),
                  timestep=g.get_tensor("transformer_in_timestep"))

    def run_sd3(model):
        with torch.no_grad():
            return model(hidden_states=sd3_in["hidden"], encoder_hidden_states=sd3_in["encoder_hidden"],
                         pooled_projections=sd3_in["pooled"], timestep=sd3_in["timestep"], return_dict=False)[0]

    assert torch.equal(run_sd3(sd3), g.get_tensor("transformer_out_step0"))
    single = SD3Transformer2DModel.from_single_file(os.path.join(OUT, "sd3-tiny-medium-sai.safetensors"),
                                                    config=sd3_dir, subfolder="transformer", torch_dtype=torch.bfloat16)
    goldens["sd3_sai_out"] = run_sd3(single)
    assert torch.equal(goldens["sd3_sai_out"], g.get_tensor("transformer_out_step0"))
    q8 = SD3Transformer2DModel.from_single_file(os.path.join(OUT, "sd3-tiny-medium-Q8_0.gguf"), config=sd3_dir,
                                                subfolder="transformer", quantization_config=q,
                                                torch_dtype=torch.bfloat16)
    goldens["sd3_q8_0_out"] = run_sd3(q8)
    # As for Q4_K above: diffusers expands Q8_0 in float16 (d * q rounded to float16), the gguf package in
    # float32; the same model on the gguf package's weights separates that from Kiln's own differences.
    exact = {t.name: torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).reshape(
        [int(d) for d in reversed(t.shape)])
        for t in gguf.GGUFReader(os.path.join(OUT, "sd3-tiny-medium-Q8_0.gguf")).tensors}
    convert_sd3 = single_file_model.SINGLE_FILE_LOADABLE_CLASSES["SD3Transformer2DModel"]["checkpoint_mapping_fn"]
    plain = SD3Transformer2DModel.from_config(sd3.config)
    plain.load_state_dict(convert_sd3(exact))
    goldens["sd3_q8_0_exact_weights_out"] = run_sd3(plain.to(torch.bfloat16))
    for k, v in sd3_in.items():
        goldens["sd3_" + k] = v
    save_file({k: v.contiguous() for k, v in goldens.items()},
              os.path.join(OUT, "single_file_goldens.safetensors"))


if __name__ == "__main__":
    main()
