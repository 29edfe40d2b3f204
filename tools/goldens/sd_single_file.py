#!/usr/bin/env python3
"""Writes the tiny Stable Diffusion 1.5 and SDXL pipelines of tests/data/models/sd15-tiny and sdxl-tiny (made by
tools/goldens/sd.py) as ONE .safetensors each in the original Stability layout, the way almost every finetune
ships, and proves the diffusers -> original mapping written here is the inverse of diffusers' own
(diffusers/loaders/single_file_utils.py): StableDiffusionPipeline.from_single_file(file, config=folder) (and the
XL one) must give back exactly the folder's weights, every state_dict tensor bit for bit.

Outputs (committed; CI never runs this script), in tests/data/goldens/sd_single_file/:
  sd15_tiny.safetensors       model.diffusion_model.* (the UNet: input_blocks / middle_block / output_blocks /
                              time_embed / out), cond_stage_model.transformer.text_model.* (CLIP-L's naming, its
                              position_ids buffer included as in real SD1.x files), first_stage_model.* (the VAE:
                              encoder/decoder down/up/mid, mid attention q/k/v/proj_out as 1x1 convs, decoder up
                              blocks in reverse order), plus what real files carry beside the weights and nothing
                              reads: DDPM buffers at the top level (betas, alphas_cumprod, ...) and model_ema's
                              decay / num_updates
  sdxl_tiny.safetensors       model.diffusion_model.* (label_emb too), conditioner.embedders.0.transformer.
                              text_model.* (CLIP-L), conditioner.embedders.1.model.* (OpenCLIP bigG: resblocks
                              with fused attn.in_proj_weight/bias, ln_1/ln_2, mlp.c_fc/c_proj, token_embedding,
                              positional_embedding, ln_final, text_projection stored transposed, logit_scale),
                              first_stage_model.*
  sd15_tiny_unet_only.safetensors   the SD1.5 UNet alone (model.diffusion_model.*), as UNet-only finetunes ship
  sd2_tiny.safetensors        tests/data/models/sd2-tiny (tools/goldens/sd2.py: SD 2.1's layout, linear projections,
                              v-prediction) as v2-1_768-ema-pruned.safetensors is laid out: model.diffusion_model.*,
                              OpenCLIP-H's text tower at cond_stage_model.model.* (fused attn.in_proj, with the
                              text_projection and logit_scale real SD2 files carry and SD2's CLIPTextModel has no
                              parameter for), first_stage_model.*; from_single_file(file, config=folder) gives the
                              folder's UNet, text encoder and VAE
  sdxl_refiner_tiny.safetensors     tests/data/models/sdxl-refiner-tiny (tools/goldens/sd_refiner.py) as
                              sd_xl_refiner_1.0.safetensors is laid out: model.diffusion_model.*, OpenCLIP bigG
                              ALONE at conditioner.embedders.0.model.* (no CLIP-L, no embedders.1),
                              first_stage_model.*; StableDiffusionXLImg2ImgPipeline.from_single_file(file,
                              config=folder) gives the folder's UNet, text_encoder_2 and VAE (the refiner's
                              OpenCLIP is found by its text_projection key, so the tiny widths do not mislead it)

One quirk of diffusers bites the tiny SDXL: create_diffusers_clip_model_from_ldm tells CLIP-L from bigG for
text_encoder_2 by the position embedding's width (768 vs 1280 in the real models), and the tiny encoders are both
32 wide, so from_single_file would load CLIP-L's tensors into text_encoder_2. The script checks text_encoder_2
through diffusers' own convert_open_clip_checkpoint on the file instead (what from_single_file calls for a real
SDXL file), and everything else through from_single_file.
"""

import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "data", "models")
OUT = os.path.join(ROOT, "tests", "data", "goldens", "sd_single_file")


def read(path):
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def config(folder, component):
    import json

    with open(os.path.join(folder, component, "config.json")) as f:
        return json.load(f)


# ldm's ResBlock names for diffusers' ResnetBlock2D parts.
UNET_RESNET = [
    ("norm1.", "in_layers.0."),
    ("conv1.", "in_layers.2."),
    ("time_emb_proj.", "emb_layers.1."),
    ("norm2.", "out_layers.0."),
    ("conv2.", "out_layers.3."),
    ("conv_shortcut.", "skip_connection."),
]


def resnet_rest(rest):
    for new, old in UNET_RESNET:
        if rest.startswith(new):
            return old + rest[len(new) :]
    raise ValueError("unknown resnet tensor " + rest)


def unet_to_original(sd, cfg):
    """diffusers UNet2DConditionModel names -> the ldm UNetModel's (without model.diffusion_model.)."""
    per = cfg["layers_per_block"] + 1  # ldm input/output blocks per level: the resnets (+ down/upsampler)
    top = {
        "conv_in.": "input_blocks.0.0.",
        "time_embedding.linear_1.": "time_embed.0.",
        "time_embedding.linear_2.": "time_embed.2.",
        "add_embedding.linear_1.": "label_emb.0.0.",
        "add_embedding.linear_2.": "label_emb.0.2.",
        "conv_norm_out.": "out.0.",
        "conv_out.": "out.2.",
    }
    up_has_attention = ["CrossAttn" in t for t in cfg["up_block_types"]]
    out = {}
    for name, t in sd.items():
        parts = name.split(".")
        new = None
        for d, o in top.items():
            if name.startswith(d):
                new = o + name[len(d) :]
        if new is None and parts[0] == "down_blocks":
            b, kind = int(parts[1]), parts[2]
            if kind == "resnets":
                new = f"input_blocks.{1 + b * per + int(parts[3])}.0." + resnet_rest(".".join(parts[4:]))
            elif kind == "attentions":
                new = f"input_blocks.{1 + b * per + int(parts[3])}.1." + ".".join(parts[4:])
            elif kind == "downsamplers":  # downsamplers.0.conv.* -> the level's last input block, .0.op.*
                new = f"input_blocks.{1 + b * per + per - 1}.0.op." + ".".join(parts[5:])
        elif new is None and parts[0] == "mid_block":
            kind, i = parts[1], int(parts[2])
            rest = ".".join(parts[3:])
            if kind == "resnets":
                new = f"middle_block.{2 * i}." + resnet_rest(rest)
            else:
                new = "middle_block.1." + rest
        elif new is None and parts[0] == "up_blocks":
            b, kind = int(parts[1]), parts[2]
            if kind == "resnets":
                new = f"output_blocks.{b * per + int(parts[3])}.0." + resnet_rest(".".join(parts[4:]))
            elif kind == "attentions":
                new = f"output_blocks.{b * per + int(parts[3])}.1." + ".".join(parts[4:])
            elif kind == "upsamplers":  # after the resnet (and the attention, when the level has them)
                new = f"output_blocks.{b * per + per - 1}.{2 if up_has_attention[b] else 1}." + ".".join(parts[4:])
        if new is None:
            raise ValueError("no original name for UNet tensor " + name)
        out[new] = t
    return out


def vae_to_original(sd, cfg):
    """diffusers AutoencoderKL names -> the ldm AutoencoderKL's (without first_stage_model.)."""
    n_up = len(cfg["up_block_types"])
    attention = {"group_norm.": "norm.", "to_q.": "q.", "to_k.": "k.", "to_v.": "v.", "to_out.0.": "proj_out."}
    out = {}
    for name, t in sd.items():
        parts = name.split(".")
        side, rest = parts[0], parts[1:]
        new = None
        if rest[0] in ("conv_in", "conv_out") or side in ("quant_conv", "post_quant_conv"):
            new = name
        elif rest[0] == "conv_norm_out":
            new = f"{side}.norm_out." + ".".join(rest[1:])
        elif rest[0] in ("down_blocks", "up_blocks"):
            i = int(rest[1])
            level, word = (i, "down") if rest[0] == "down_blocks" else (n_up - 1 - i, "up")
            if rest[2] == "resnets":
                tail = ".".join(rest[4:]).replace("conv_shortcut.", "nin_shortcut.")
                new = f"{side}.{word}.{level}.block.{rest[3]}." + tail
            else:  # downsamplers.0.conv / upsamplers.0.conv
                new = f"{side}.{word}.{level}.{'downsample' if word == 'down' else 'upsample'}.conv." + rest[-1]
        elif rest[0] == "mid_block":
            if rest[1] == "resnets":
                tail = ".".join(rest[3:]).replace("conv_shortcut.", "nin_shortcut.")
                new = f"{side}.mid.block_{int(rest[2]) + 1}." + tail
            else:
                tail = ".".join(rest[3:])
                for d, o in attention.items():
                    if tail.startswith(d):
                        tail = o + tail[len(d) :]
                new = f"{side}.mid.attn_1." + tail
                if t.dim() == 2:  # ldm's AttnBlock holds q/k/v/proj_out as 1x1 convolutions
                    t = t[:, :, None, None]
        if new is None:
            raise ValueError("no original name for VAE tensor " + name)
        out[new] = t
    return out


def clip_to_original(sd):
    """transformers CLIPTextModel names (saved with or without text_model.) -> HF CLIP's under the wrapper."""
    return {(k if k.startswith("text_model.") else "text_model." + k): v for k, v in sd.items()}


def open_clip_to_original(sd):
    """transformers CLIPTextModelWithProjection -> OpenCLIP's text tower (without conditioner.embedders.1.model.)."""
    out = {}
    layer = [
        ("layer_norm1.", "ln_1."),
        ("layer_norm2.", "ln_2."),
        ("mlp.fc1.", "mlp.c_fc."),
        ("mlp.fc2.", "mlp.c_proj."),
        ("self_attn.out_proj.", "attn.out_proj."),
    ]
    fused = {}
    for name, t in sd.items():
        if name == "text_projection.weight":
            out["text_projection"] = t.T.contiguous()  # OpenCLIP computes x @ text_projection
            continue
        name = name.removeprefix("text_model.")
        if name == "embeddings.token_embedding.weight":
            out["token_embedding.weight"] = t
        elif name == "embeddings.position_embedding.weight":
            out["positional_embedding"] = t
        elif name.startswith("final_layer_norm."):
            out["ln_final." + name.split(".")[-1]] = t
        elif name.startswith("encoder.layers."):
            parts = name.split(".")
            i, rest = int(parts[2]), ".".join(parts[3:])
            block = f"transformer.resblocks.{i}."
            if rest.startswith("self_attn.") and rest.split(".")[1] in ("q_proj", "k_proj", "v_proj"):
                kind = rest.split(".")[-1]  # weight / bias
                fused.setdefault((block, kind), {})[rest.split(".")[1]] = t
                continue
            for d, o in layer:
                if rest.startswith(d):
                    rest = o + rest[len(d) :]
                    break
            else:
                raise ValueError("no original name for OpenCLIP tensor " + name)
            out[block + rest] = t
        else:
            raise ValueError("no original name for OpenCLIP tensor " + name)
    for (block, kind), qkv in fused.items():
        out[block + "attn.in_proj_" + kind] = torch.cat([qkv["q_proj"], qkv["k_proj"], qkv["v_proj"]], 0)
    out["logit_scale"] = torch.tensor(4.6052)  # OpenCLIP's log(1 / 0.01); nothing reads it at inference
    return out


def prefixed(prefix, sd):
    return {prefix + k: v for k, v in sd.items()}


def ddpm_buffers():
    """The buffers ldm's LatentDiffusion saves beside the weights (SD1.x files carry them; nothing reads them)."""
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    alphas_cumprod = torch.cumprod(1 - betas, 0)
    return {"betas": betas.float(), "alphas_cumprod": alphas_cumprod.float(), "model_ema.decay": torch.tensor(0.9999)}


def build(name):
    folder = os.path.join(MODELS, name)
    xl = name.startswith("sdxl")
    refiner = "refiner" in name
    unet = unet_to_original(read(os.path.join(folder, "unet", "diffusion_pytorch_model.safetensors")),
                            config(folder, "unet"))
    vae = vae_to_original(read(os.path.join(folder, "vae", "diffusion_pytorch_model.safetensors")),
                          config(folder, "vae"))
    out = prefixed("model.diffusion_model.", unet)
    out.update(prefixed("first_stage_model.", vae))
    if refiner:  # one tower, bigG, as the refiner's sgm conditioner holds it: embedder 0, OpenCLIP's names
        te2 = read(os.path.join(folder, "text_encoder_2", "model.safetensors"))
        out.update(prefixed("conditioner.embedders.0.model.", open_clip_to_original(te2)))
        return out, prefixed("model.diffusion_model.", unet)
    if name.startswith("sd2"):  # OpenCLIP-H under ldm's FrozenOpenCLIPEmbedder
        te = read(os.path.join(folder, "text_encoder", "model.safetensors"))
        clip = open_clip_to_original(te)
        width = clip["token_embedding.weight"].shape[1]
        # OpenCLIP's projection ([width, embed]): real SD2 files carry it; nothing in SD2 reads it.
        clip["text_projection"] = torch.randn(width, width, generator=torch.Generator().manual_seed(2)) * 0.1
        out.update(prefixed("cond_stage_model.model.", clip))
        out.update(ddpm_buffers())
        return out, prefixed("model.diffusion_model.", unet)
    te = clip_to_original(read(os.path.join(folder, "text_encoder", "model.safetensors")))
    # The position ids buffer old transformers saved and SD1.x / SDXL files still hold.
    te["text_model.embeddings.position_ids"] = torch.arange(77, dtype=torch.int64)[None]
    if xl:
        out.update(prefixed("conditioner.embedders.0.transformer.", te))
        te2 = read(os.path.join(folder, "text_encoder_2", "model.safetensors"))
        out.update(prefixed("conditioner.embedders.1.model.", open_clip_to_original(te2)))
    else:
        out.update(prefixed("cond_stage_model.transformer.", te))
        out.update(ddpm_buffers())
    return out, prefixed("model.diffusion_model.", unet)


def same_state_dict(what, got, want):
    got, want = got.state_dict(), want.state_dict()
    assert set(got) == set(want), f"{what}: keys differ: {sorted(set(got) ^ set(want))[:10]}"
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), f"{what}: {k} differs"
    return len(want)


def verify(name, path):
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline
    from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint

    folder = os.path.join(MODELS, name)
    cls = StableDiffusionXLPipeline if name.startswith("sdxl") else StableDiffusionPipeline
    want = cls.from_pretrained(folder, torch_dtype=torch.float32)
    components = ["unet", "vae", "text_encoder"]
    kwargs = {}
    if cls is StableDiffusionXLPipeline:
        # See the docstring: the tiny widths make from_single_file mistake CLIP-L for bigG here.
        kwargs["text_encoder_2"] = want.text_encoder_2
    got = cls.from_single_file(path, config=folder, torch_dtype=torch.float32, local_files_only=True, **kwargs)
    counts = {c: same_state_dict(f"{name} {c}", getattr(got, c), getattr(want, c)) for c in components}
    if cls is StableDiffusionXLPipeline:
        converted = convert_open_clip_checkpoint(want.text_encoder_2, read(path),
                                                 prefix="conditioner.embedders.1.model.")
        sd = want.text_encoder_2.state_dict()
        assert set(converted) == set(sd), f"text_encoder_2 keys differ: {sorted(set(converted) ^ set(sd))}"
        for k in sd:
            assert torch.equal(converted[k], sd[k]), f"text_encoder_2: {k} differs"
        counts["text_encoder_2"] = len(sd)
    print(name, "from_single_file gives the folder's weights:", counts)


def verify_refiner(name, path):
    """The refiner's file through from_single_file on the refiner's folder, every component; diffusers infers
    the file's kind as Kiln does (no CLIP-L, bigG at embedders.0)."""
    from diffusers import StableDiffusionXLImg2ImgPipeline
    from diffusers.loaders.single_file_utils import infer_diffusers_model_type, is_open_clip_sdxl_refiner_model

    folder = os.path.join(MODELS, name)
    tensors = read(path)
    assert is_open_clip_sdxl_refiner_model(tensors)
    assert not any(k.startswith(("conditioner.embedders.1.", "conditioner.embedders.0.transformer.")) for k in tensors)
    # The real refiner's telltale is bigG's 10th layer (resblocks.9); the tiny tower has 2, so diffusers' kind
    # inference (used only without config=) is checked on a copy that has one.
    probe = dict(tensors)
    probe["conditioner.embedders.0.model.transformer.resblocks.9.mlp.c_proj.bias"] = torch.zeros(1)
    assert infer_diffusers_model_type(probe) == "xl_refiner", infer_diffusers_model_type(probe)
    want = StableDiffusionXLImg2ImgPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    got = StableDiffusionXLImg2ImgPipeline.from_single_file(path, config=folder, torch_dtype=torch.float32,
                                                            local_files_only=True)
    assert got.text_encoder is None and got.tokenizer is None and got.config.requires_aesthetics_score
    counts = {c: same_state_dict(f"{name} {c}", getattr(got, c), getattr(want, c))
              for c in ("unet", "vae", "text_encoder_2")}
    print(name, "from_single_file gives the folder's weights:", counts)


def verify_unet_only(name, path):
    from diffusers import UNet2DConditionModel

    folder = os.path.join(MODELS, name)
    got = UNet2DConditionModel.from_single_file(path, config=folder, subfolder="unet", local_files_only=True)
    want = UNet2DConditionModel.from_pretrained(folder, subfolder="unet")
    print(name, "unet-only from_single_file:", same_state_dict("unet only", got, want), "tensors equal")


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, file in (("sd15-tiny", "sd15_tiny"), ("sdxl-tiny", "sdxl_tiny"), ("sd2-tiny", "sd2_tiny")):
        tensors, unet = build(name)
        path = os.path.join(OUT, file + ".safetensors")
        save_file({k: v.contiguous() for k, v in tensors.items()}, path)
        verify(name, path)
        if name == "sd15-tiny":
            unet_path = os.path.join(OUT, file + "_unet_only.safetensors")
            save_file({k: v.contiguous() for k, v in unet.items()}, unet_path)
            verify_unet_only(name, unet_path)
    name, file = "sdxl-refiner-tiny", "sdxl_refiner_tiny"
    tensors, _ = build(name)
    path = os.path.join(OUT, file + ".safetensors")
    save_file({k: v.contiguous() for k, v in tensors.items()}, path)
    verify_refiner(name, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
