#!/usr/bin/env python3
"""Kiln vs PyTorch, side by side, on the same randomly initialised checkpoints and the same inputs.

Models (real widths from tools/goldens/*_real_configs.json, the UNets' from their config.json copied below;
cut-down depth where said):
  flux  FluxTransformer2DModel, FLUX.1-dev config, --flux-layers double + single blocks (default 1 + 1)
  flux2 Flux2Transformer2DModel, FLUX.2-dev config (width 6144, 48 heads), --flux2-layers double + single
        blocks (default 1 + 1), 512 text tokens of 15360 (three Mistral layers)
  sd3   SD3Transformer2DModel, SD3.5-Medium config, --sd3-layers blocks (default 2; block 0 has the MMDiT-X
        dual attention), classifier-free guidance as one batch of 2, 333 text tokens (77 CLIP + 256 T5)
  zimage ZImageTransformer2DModel, Z-Image-Turbo config (width 3840, 30 heads), --zimage-layers main layers (default
        2) after one noise and one context refiner block, a 160-token caption of Qwen3's 2560 (padded to 160)
  qwenimage QwenImageTransformer2DModel at its defaults (Qwen-Image: width 3072, 24 heads of 128), --qwenimage-layers
        dual-stream blocks (default 2) of the real 60, 200 text tokens of Qwen2.5-VL's 3584 (no padding, no mask);
        one call of the transformer (QwenImagePipeline with true classifier-free guidance makes two a step, the
        prompt's and the negative prompt's, each this shape). As for sdxl, a line below the table extrapolates
        each engine's call to the 60 blocks by FLOPs (an estimate).
  t5    T5EncoderModel, T5 v1.1 XXL config, --t5-layers layers (default 2), --t5-tokens tokens (default 512)
  sd15  UNet2DConditionModel, Stable Diffusion 1.5's config (block_out_channels 320/640/1280/1280, 8 heads,
        cross-attention 768) at its full depth (860 M parameters), a guided batch of 2, 77 text tokens
  sdxl  UNet2DConditionModel, SDXL base's config (320/640/1280, heads 5/10/20, cross-attention 2048, linear
        projections, text_time conditioning) cut to --sdxl-layers transformer blocks (default 2) in each spatial
        transformer of the deepest level and of the middle block, of the real 10 (transformer_layers_per_block
        [1, 2, 2]: 12 of the 60 blocks at width 1280 are kept, 22 of 70 in all; about 0.9 of 2.6 B parameters);
        a guided batch of 2, 77 text tokens, the pooled prompt and the six time ids. The table's ratios are
        those of the cut model, measured; a line below it extrapolates each engine's step to the full depth by
        FLOPs (an estimate: the dropped blocks are assumed to run at the cut model's average FLOP rate).
  sdxl-full  the same at SDXL's real depth (transformer_layers_per_block [1, 2, 10], 2.6 B parameters, 5.1 GB)
at --sizes (image side in pixels, default 512,1024; t5 runs once), bf16.
--tiny (sd15, sdxl): checkpoints of the same blocks at tiny widths (channels 32/64, ...), kept apart under
--cache; for checking that Kiln and PyTorch agree in a minute, not for timing. The UNets run at any size that
is a multiple of 8 (64: an 8x8 latent).

For each case the checkpoint is made once with diffusers/transformers (fixed seed, save_pretrained under
--cache, reused when present), the inputs are drawn once with a fixed torch seed and saved next to it, and then
each engine runs in its own process (so that VmHWM, the peak resident memory, is that engine's):
  torch eager, torch.compile (inductor; the first call, which compiles, is timed separately), and
  bench_compare_driver --mode eager|fuse|compile|compile-blocks (Kiln; compile s is its first call minus a
  step), which also measures the machine's bf16 peak now and the
  time of the step's matmuls alone, and compares its output with PyTorch eager's (saved into the inputs file).
Without torch the PyTorch side is skipped and Kiln runs on its own random weights (--random).

Every line is tagged with the host (/proc/cpuinfo's model name and its bf16 instructions).

Example (from the repository root, after building bench_compare_driver):
  python3 bench/compare/compare.py --driver build/bench/bench_compare_driver --models flux,flux2,sd3,t5 --sizes 512,1024

The UNets, full measurement (every engine: PyTorch eager and torch.compile, Kiln eager, compile and
compile-blocks; add fuse to --kiln-modes if wanted). Run them in a quiet window, one at a time. The times are
estimates for this 2-core Sapphire Rapids (AMX) host with 24 GiB, from the FLOPs a step (sd15 at 512: 1.6 TFLOP,
sdxl [1, 2, 2] at 1024: 7.1, sdxl-full: 13.5) at 0.3-1 TFLOP/s, plus torch.compile's first call (2 min on the
tiny UNets; more at these widths) and Kiln's compiles (kernels cached on disk after the first run); the
checkpoint is made the first time:
  python3 bench/compare/compare.py --models sd15 --sizes 512 --kiln-modes eager,compile,compile-blocks \
      --json sd15-512.json                                          # ~10-15 min
  python3 bench/compare/compare.py --models sdxl --sizes 1024 --kiln-modes eager,compile,compile-blocks \
      --json sdxl-1024.json                                         # ~15-25 min
  python3 bench/compare/compare.py --models sdxl-full --sizes 1024 --steps 2 \
      --kiln-modes eager,compile,compile-blocks --json sdxl-full-1024.json   # ~20-35 min
--prepare-only makes the checkpoints and inputs first (sd15: 1.7 GB, sdxl: 1.8 GB, sdxl-full: 5.1 GB of disk).
Check that everything runs and agrees first, in about 5 minutes (torch.compile's first calls most of it):
  python3 bench/compare/compare.py --models sd15,sdxl --tiny --sizes 64 --steps 1

stable-diffusion.cpp beside them (--sdcpp PATH_TO_sd-cli; bench/compare/sdcpp.py): sd15 and sdxl-full only, its
SDXL UNet having SDXL's fixed depth [1, 2, 10] (it refuses the cut sdxl model's missing blocks). The checkpoint's
UNet is written once into a single file in the original layout (sdcpp.safetensors beside it, with a random CLIP
text encoder, SDXL's two, and VAE at the real shapes, bf16; sdxl-full's is 7 GB); sd-cli samples one image at
the size (euler, cfg 7, empty negative prompt: two UNet calls of batch 1 a step, 77 tokens, -t --threads), is
stopped once the last step is out (before the VAE decode), and the row is the median of its sampler's per-step
times after the first; VmHWM is its peak resident memory (text encoders and UNet). --sdcpp-modes fa,default:
with and without --diffusion-fa (ggml's flash attention, which has a CPU path; 3x slower than without at sd15
512 here). sd.cpp keeps Linear weights bf16 (AVX-512 BF16 vdpbf16ps in ggml's kernels; ggml's AMX code is for
quantized types) and converts every conv kernel to f16 on loading (bf16 is its faster choice here: --type f16
measured slower at 256). Its step is slow here (sd15 512: ~35 s, ~100 s with fa; sdxl-full 1024: ~175 s, and
its first step also loads the UNet), hence the run times below.
Built here from leejet/stable-diffusion.cpp 97d2990807fe6d558e395f8764198d7c7e7b411c (2026-08-19) with its
submodule ggml-org/ggml at the commit it pins, 8e800cef2948046cc47f9db6090491c6128ca42c, outside the repository:
  git clone https://github.com/leejet/stable-diffusion.cpp /work/sdcpp && cd /work/sdcpp
  git checkout 97d2990807fe6d558e395f8764198d7c7e7b411c && git submodule update --init ggml
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON      # -march=native: AVX-512 BF16, AMX-INT8
  cmake --build build -j2 --target sd-cli                              # ~7 min on 2 cores
(here from a mirror without the large tokenizer vocabularies of gemma, mistral, qwen, gpt-oss and T5: those
src/tokenizers/vocab/*.hpp were stubbed with one-byte arrays; SD1.5 and SDXL use only CLIP's, which was there.)
  python3 bench/compare/compare.py --models sd15 --sizes 512 --kiln-modes eager \
      --sdcpp /work/sdcpp/build/bin/sd-cli --sdcpp-modes fa,default --json sd15-512-sdcpp.json    # ~15-20 min
  python3 bench/compare/compare.py --models sdxl-full --sizes 1024 --steps 2 --torch-modes eager \
      --kiln-modes eager --sdcpp /work/sdcpp/build/bin/sd-cli --sdcpp-modes default \
      --json sdxl-full-1024-sdcpp.json                                                          # ~15-20 min
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import sdcpp  # noqa: E402 (bench/compare/sdcpp.py, beside this file)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def vmhwm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return 1024.0 * float(line.split()[1])
    return float("nan")


def host():
    """The CPU's model name and the bf16 instructions it has (as lscpu reports them), and the CPU count."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return f"{os.uname().machine}, {os.cpu_count()} CPUs"
    name, flags = "?", []
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and name == "?":
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = value.split()
    isa = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    return f"{name} ({', '.join(isa) or 'no bf16 instructions'}), {os.cpu_count()} CPUs"


def have_torch():
    try:
        import torch  # noqa: F401
        import diffusers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return str(e)
    return None


# ---- checkpoints and inputs (PyTorch side)


def real_config(file, key):
    with open(os.path.join(REPO, "tools", "goldens", file)) as f:
        return {k: v for k, v in json.load(f)[key].items() if not k.startswith("_")}


UNETS = ("sd15", "sdxl", "sdxl-full")

# unet/config.json of runwayml/stable-diffusion-v1-5 and stabilityai/stable-diffusion-xl-base-1.0 (the keys that
# differ from UNet2DConditionModel's defaults, and the ones that define the blocks).
SD15_UNET = dict(
    sample_size=64, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=[320, 640, 1280, 1280],
    down_block_types=["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    attention_head_dim=8, cross_attention_dim=768, norm_num_groups=32, norm_eps=1e-5, flip_sin_to_cos=True,
    freq_shift=0, downsample_padding=1, mid_block_scale_factor=1, act_fn="silu", center_input_sample=False)
SDXL_UNET = dict(
    sample_size=128, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=[320, 640, 1280],
    down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    transformer_layers_per_block=[1, 2, 10], attention_head_dim=[5, 10, 20], cross_attention_dim=2048,
    use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
    addition_embed_type_num_heads=64, projection_class_embeddings_input_dim=2816, norm_num_groups=32,
    norm_eps=1e-5, flip_sin_to_cos=True, freq_shift=0, downsample_padding=1, mid_block_scale_factor=1,
    act_fn="silu", upcast_attention=None, center_input_sample=False)


def sdxl_layers(args, model):
    """Transformer blocks per spatial transformer at SDXL's deepest level and in its middle block."""
    return 10 if model == "sdxl-full" else args.sdxl_layers


def unet_config(args, model):
    """The real config, SDXL's depth cut as asked; --tiny: the same blocks at tiny widths."""
    if model == "sd15":
        config = dict(SD15_UNET)
        if args.tiny:
            config.update(block_out_channels=[32, 64, 64, 64], norm_num_groups=8, attention_head_dim=2,
                          cross_attention_dim=32)
    else:
        config = dict(SDXL_UNET, transformer_layers_per_block=[1, 2, sdxl_layers(args, model)])
        if args.tiny:
            config.update(block_out_channels=[32, 64, 64], norm_num_groups=8, attention_head_dim=[2, 2, 4],
                          cross_attention_dim=64, addition_time_embed_dim=8,
                          projection_class_embeddings_input_dim=32 + 6 * 8)
    return config


def case_dir(args, model):
    depth = {"flux": f"{args.flux_layers}+{args.flux_layers}", "flux2": f"{args.flux2_layers}+{args.flux2_layers}",
             "sd3": str(args.sd3_layers), "t5": str(args.t5_layers), "zimage": f"1+{args.zimage_layers}",
             "qwenimage": str(args.qwenimage_layers)}
    if model in UNETS:
        name = "sd15" if model == "sd15" else f"sdxl-1+2+{sdxl_layers(args, model)}"
        return os.path.join(os.path.expanduser(args.cache), name + ("-tiny" if args.tiny else ""))
    return os.path.join(os.path.expanduser(args.cache), f"{model}-{depth[model]}")


def make_checkpoint(args, model, folder):
    """Random init of the real classes (fixed seed), bf16, save_pretrained into `folder` unless present."""
    if os.path.exists(os.path.join(folder, "config.json")):
        return
    import torch

    torch.manual_seed(0)
    t0 = time.time()
    if model == "flux":
        from diffusers import FluxTransformer2DModel

        config = real_config("flux_real_configs.json", "transformer_dev")
        config.update(num_layers=args.flux_layers, num_single_layers=args.flux_layers)
        net = FluxTransformer2DModel(**config)
    elif model == "flux2":
        from diffusers import Flux2Transformer2DModel

        config = real_config("flux2_real_configs.json", "transformer_dev")
        config.update(num_layers=args.flux2_layers, num_single_layers=args.flux2_layers)
        net = Flux2Transformer2DModel(**config)
    elif model == "sd3":
        from diffusers import SD3Transformer2DModel

        config = real_config("sd3_real_configs.json", "transformer_medium")
        config.update(num_layers=args.sd3_layers, dual_attention_layers=(0,))
        net = SD3Transformer2DModel(**config)
    elif model == "zimage":
        from diffusers import ZImageTransformer2DModel

        with open(os.path.join(REPO, "tests", "data", "goldens", "z_image", "real_layouts.json")) as f:
            config = {k: v for k, v in json.load(f)["transformer_config"].items() if not k.startswith("_")}
        config.update(n_layers=args.zimage_layers, n_refiner_layers=1)
        net = ZImageTransformer2DModel(**config)
    elif model == "qwenimage":
        from diffusers import QwenImageTransformer2DModel

        net = QwenImageTransformer2DModel(num_layers=args.qwenimage_layers)  # the defaults are Qwen-Image's
    elif model in UNETS:
        from diffusers import UNet2DConditionModel

        net = UNet2DConditionModel(**unet_config(args, model))
    else:
        from transformers import T5Config, T5EncoderModel

        config = real_config("sd3_real_configs.json", "text_encoder_3")
        config.update(num_layers=args.t5_layers, dropout_rate=0.0)
        net = T5EncoderModel(T5Config(**config))
    net = net.to(torch.bfloat16).eval()
    tmp = folder + ".tmp"
    net.save_pretrained(tmp)
    os.rename(tmp, folder)
    print(f"  made {folder} ({sum(p.numel() for p in net.parameters()) / 1e6:.0f} M parameters, {time.time() - t0:.0f} s)")


def inputs_path(folder, model, size):
    return os.path.join(folder, f"inputs-{size}.safetensors")


def make_inputs(args, model, folder, size):
    """The same initial latents and conditioning for every engine: torch.randn with a fixed seed, bf16, the
    dtypes FluxPipeline / StableDiffusion3Pipeline pass to the transformer."""
    path = inputs_path(folder, model, size)
    if os.path.exists(path):
        return path
    import torch
    from safetensors.torch import save_file

    g = torch.Generator("cpu").manual_seed(size)
    bf16 = torch.bfloat16
    if model == "flux":
        grid, text = size // 16, 512
        t = {
            "hidden_states": torch.randn(1, grid * grid, 64, generator=g, dtype=bf16),
            "encoder_hidden_states": torch.randn(1, text, 4096, generator=g, dtype=bf16),
            "pooled_projections": torch.randn(1, 768, generator=g, dtype=bf16),
            "timestep": torch.full([1], 1.0, dtype=bf16),  # sigma 1 (the first step), t / 1000 as the pipeline passes it
            "guidance": torch.full([1], 3.5, dtype=torch.float32),
            "txt_ids": torch.zeros(text, 3, dtype=bf16),
        }
        ids = torch.zeros(grid, grid, 3)
        ids[..., 1] += torch.arange(grid)[:, None]
        ids[..., 2] += torch.arange(grid)[None, :]
        t["img_ids"] = ids.reshape(grid * grid, 3).to(bf16)
    elif model == "flux2":
        grid, text = size // 16, 512
        t = {
            "hidden_states": torch.randn(1, grid * grid, 128, generator=g, dtype=bf16),
            "encoder_hidden_states": torch.randn(1, text, 15360, generator=g, dtype=bf16),
            "timestep": torch.full([1], 1.0, dtype=bf16),  # sigma 1, t / 1000 as Flux2Pipeline passes it
            "guidance": torch.full([1], 4.0, dtype=torch.float32),
        }
        txt = torch.zeros(text, 4)
        txt[:, 3] = torch.arange(text)
        ids = torch.zeros(grid, grid, 4)
        ids[..., 1] += torch.arange(grid)[:, None]
        ids[..., 2] += torch.arange(grid)[None, :]
        t["txt_ids"], t["img_ids"] = txt, ids.reshape(grid * grid, 4)
    elif model == "sd3":
        h, text = size // 8, 333
        t = {
            "hidden_states": torch.randn(2, 16, h, h, generator=g, dtype=bf16),
            "encoder_hidden_states": torch.randn(2, text, 4096, generator=g, dtype=bf16),
            "pooled_projections": torch.randn(2, 2048, generator=g, dtype=bf16),
            "timestep": torch.full([2], 1000.0, dtype=torch.float32),
        }
    elif model in UNETS:
        # StableDiffusion(XL)Pipeline's call of the UNet with classifier-free guidance: the latents twice (the
        # unconditional and the prompted halves), the first step's t, 77 CLIP tokens (SDXL: both encoders'
        # hidden states concatenated, 768 + 1280), and SDXL's pooled prompt and time ids (original size, crop
        # corner, target size) in the prompt's dtype, as the pipeline passes them.
        h, config = size // 8, unet_config(args, model)
        t = {
            "sample": torch.randn(1, 4, h, h, generator=g, dtype=bf16).repeat(2, 1, 1, 1),
            "timestep": torch.full([2], 999.0, dtype=torch.float32),
            "encoder_hidden_states": torch.randn(2, 77, config["cross_attention_dim"], generator=g, dtype=bf16),
        }
        if model != "sd15":
            pooled = config["projection_class_embeddings_input_dim"] - 6 * config["addition_time_embed_dim"]
            t["text_embeds"] = torch.randn(2, pooled, generator=g, dtype=bf16)
            t["time_ids"] = torch.tensor([[size, size, 0, 0, size, size]] * 2, dtype=bf16)
    elif model == "zimage":
        # One image's latents [C, F, H, W] and its caption's features, as ZImagePipeline passes them (lists of one);
        # the model's time (1000 - t) / 1000 of the first Turbo step.
        h = size // 8
        t = {
            "x": torch.randn(16, 1, h, h, generator=g, dtype=bf16),
            "cap_feats": torch.randn(160, 2560, generator=g, dtype=bf16),
            "t": torch.full([1], 0.0, dtype=torch.float32),
        }
    elif model == "qwenimage":
        # QwenImagePipeline's call: the packed latents (a grid of 2x2 patches of 16 channels), the prompt's
        # Qwen2.5-VL features, t / 1000 of the first step in the latents' dtype; img_shapes follow from the size.
        grid = size // 16
        t = {
            "hidden_states": torch.randn(1, grid * grid, 64, generator=g, dtype=bf16),
            "encoder_hidden_states": torch.randn(1, 200, 3584, generator=g, dtype=bf16),
            "timestep": torch.full([1], 1.0, dtype=bf16),
        }
    else:
        t = {"input_ids": torch.randint(0, 32128, (1, size), generator=g, dtype=torch.int64)}
    save_file(t, path + ".tmp")
    os.rename(path + ".tmp", path)
    return path


# ---- one engine in its own process


def torch_worker(args):
    """Runs in a child process: loads the checkpoint, times --steps calls, prints one JSON line."""
    import torch
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(args.threads)
    t_load = time.time()
    if args.model == "flux":
        from diffusers import FluxTransformer2DModel as Cls
    elif args.model == "flux2":
        from diffusers import Flux2Transformer2DModel as Cls
    elif args.model == "sd3":
        from diffusers import SD3Transformer2DModel as Cls
    elif args.model == "zimage":
        from diffusers import ZImageTransformer2DModel as Cls
    elif args.model == "qwenimage":
        from diffusers import QwenImageTransformer2DModel as Cls
    elif args.model in UNETS:
        from diffusers import UNet2DConditionModel as Cls
    else:
        from transformers import T5EncoderModel as Cls
    net = Cls.from_pretrained(args.checkpoint, torch_dtype=torch.bfloat16).eval()
    load_s = time.time() - t_load
    inputs = load_file(args.inputs)
    expected = inputs.pop("expected", None)
    if args.model == "t5":
        def call(m):
            return m(input_ids=inputs["input_ids"]).last_hidden_state
    elif args.model == "zimage":
        def call(m):
            return m([inputs["x"]], inputs["t"], [inputs["cap_feats"]], return_dict=False)[0][0]
    elif args.model == "qwenimage":
        grid = round(inputs["hidden_states"].shape[1] ** 0.5)

        def call(m):
            return m(inputs["hidden_states"], inputs["encoder_hidden_states"], None, inputs["timestep"],
                     img_shapes=[[(1, grid, grid)]], return_dict=False)[0]
    elif args.model in UNETS:
        added = {k: inputs[k] for k in ("text_embeds", "time_ids") if k in inputs} or None

        def call(m):
            return m(inputs["sample"], inputs["timestep"], inputs["encoder_hidden_states"],
                     added_cond_kwargs=added, return_dict=False)[0]
    else:
        def call(m):
            return m(**inputs, return_dict=False)[0]

    fn = net
    result = {"engine": "torch", "mode": args.mode, "threads": torch.get_num_threads(), "load_s": load_s}
    with torch.inference_mode():
        if args.mode == "compile":
            import torch._inductor.config as inductor_config

            inductor_config.freezing = args.torch_freezing
            fn = torch.compile(net)
            result["mode"] = "compile+freezing" if args.torch_freezing else "compile"
        t0 = time.perf_counter()
        out = call(fn)  # warm-up; for torch.compile this traces and compiles
        result["first_call_s"] = time.perf_counter() - t0
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            out = call(fn)
            times.append(time.perf_counter() - t0)
    result.update(median_s=statistics.median(times), min_s=min(times), max_s=max(times), steps=args.steps)
    result["vmhwm_bytes"] = vmhwm_bytes()
    if expected is not None:
        o, e = out.float(), expected.float()
        result["max_rel_error"] = ((o - e).abs().max() / e.abs().max().clamp_min(1e-30)).item()
    elif args.mode == "eager":
        # PyTorch eager's output becomes the reference the other engines are compared with.
        inputs["expected"] = out.contiguous()
        save_file(inputs, args.inputs + ".tmp")
        os.replace(args.inputs + ".tmp", args.inputs)
    print("TORCH_RESULT " + json.dumps(result), flush=True)


# --mask-amx: every library of both engines kept off AMX tiles. PyTorch multiplies through oneDNN (linear) and
# through oneMKL (its CPU flash attention's blocks); ONEDNN_MAX_CPU_ISA alone left the attention on tiles, and
# AVX512_E3 is AVX-512 with the bf16 instructions but without AMX. Kiln runs as on a CPU without AMX
# (KILN_CPU_ISA=avx512): its probe picks the path among the other instructions, and the MFU is against the
# best of those.
MASK_AMX_ENV = {"KILN_CPU_ISA": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
                "MKL_ENABLE_INSTRUCTIONS": "AVX512_E3"}
MASK_AMX_HELP = ", ".join(f"{k}={v}" for k, v in MASK_AMX_ENV.items()) + " for every engine"


def run_child(cmd, tag, env=None):
    """Runs one engine; echoes its output; returns the parsed result line (or None, with the reason)."""
    print(f"  $ {' '.join(cmd)}", flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    result, lines = None, []
    for line in p.stdout.splitlines():
        if line.startswith(tag + " "):
            result = json.loads(line[len(tag) + 1:])
        else:
            lines.append(line)
    for line in lines:
        print("    " + line)
    if p.returncode != 0:
        print(f"    (exit status {p.returncode})")
        return None
    return result if result is not None else {}  # exit 0 without a result: the mode is not available


# ---- the table


def fmt(v, spec, missing="-"):
    return missing if v is None or v != v else format(v, spec)


def print_table(rows, header_note):
    print()
    print(header_note)
    cols = ["case", "engine", "step s (median)", "range s", "Kiln/eager", "Kiln/compile", "GFLOP", "GFLOP/s",
            "MFU", "matmul share", "VmHWM GB", "weights GB", "max rel err", "compile s"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(r) + " |")


def sdcpp_skip(args, model, missing):
    """Why stable-diffusion.cpp cannot run this case (None: it can)."""
    if model not in UNETS:
        return "it is run on the UNets only"
    if missing:
        return f"its single file is made with PyTorch: {missing}"
    if args.tiny:
        return "not with --tiny"
    if model != "sd15" and sdxl_layers(args, model) != 10:
        return ("its SDXL UNet has SDXL's fixed depth [1, 2, 10] and refuses the cut model's missing blocks; "
                "--models sdxl-full runs it")
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="flux,flux2,sd3,t5")
    ap.add_argument("--sizes", default="512,1024", help="image sides in pixels (flux, sd3)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per engine, after one warm-up")
    ap.add_argument("--flux-layers", type=int, default=1)
    ap.add_argument("--flux2-layers", type=int, default=1)
    ap.add_argument("--sd3-layers", type=int, default=2)
    ap.add_argument("--zimage-layers", type=int, default=2)
    ap.add_argument("--qwenimage-layers", type=int, default=2, help="qwenimage: dual-stream blocks (the real 60)")
    ap.add_argument("--t5-layers", type=int, default=2)
    ap.add_argument("--t5-tokens", type=int, default=512)
    ap.add_argument("--sdxl-layers", type=int, default=2,
                    help="sdxl: transformer blocks per spatial transformer at the deepest level and in the middle "
                         "block (SDXL's real depth: 10, what sdxl-full runs)")
    ap.add_argument("--tiny", action="store_true",
                    help="sd15, sdxl: tiny widths, to check agreement quickly (the timings mean nothing); without "
                         "PyTorch, every model's tiny random Kiln model")
    ap.add_argument("--kiln-modes", default="eager,fuse,compile,compile-blocks")
    ap.add_argument("--torch-modes", default="eager,compile")
    ap.add_argument("--torch-freezing", action="store_true", help="inductor freezing (prepacked weights) for torch.compile")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch side")
    ap.add_argument("--sdcpp", metavar="SD_CLI",
                    help="sd15, sdxl-full (sdxl: see the docstring): also run stable-diffusion.cpp's sd-cli (this "
                         "path) on the same UNet weights (a single file it loads, made once) at the same shape")
    ap.add_argument("--sdcpp-modes", default="default",
                    help="default (its plain attention, its faster path on this CPU) and/or fa (--diffusion-fa: "
                         "ggml's flash attention, which has a CPU path, 3x slower at SD1.5's 4096 tokens)")
    ap.add_argument("--matmul-reps", type=int, default=1, help="repetitions of each Linear timed alone (0: skip)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--cache", default="~/.cache/kiln-bench")
    ap.add_argument("--driver", default=os.path.join(REPO, "build", "bench", "bench_compare_driver"))
    ap.add_argument("--json", help="also write every result to this file")
    ap.add_argument("--mask-amx", action="store_true",
                    help="stand in for an Intel host without AMX on one with it: " + MASK_AMX_HELP)
    ap.add_argument("--prepare-only", action="store_true", help="make the checkpoints and inputs, run nothing")
    # internal: one PyTorch engine in this process
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return torch_worker(args)
    if args.sdxl_layers < 1:
        sys.exit("compare.py: --sdxl-layers must be at least 1")
    if args.sdcpp and not args.prepare_only and not os.access(args.sdcpp, os.X_OK):
        sys.exit(f"compare.py: --sdcpp {args.sdcpp} is not an executable (stable-diffusion.cpp's sd-cli)")
    if args.sdcpp and any(m not in ("fa", "default") for m in args.sdcpp_modes.split(",")):
        sys.exit(f"compare.py: --sdcpp-modes takes fa and/or default, not '{args.sdcpp_modes}'")

    if not args.prepare_only and not os.access(args.driver, os.X_OK):
        sys.exit(f"compare.py: no Kiln driver at {args.driver} (build bench_compare_driver, or pass --driver)")
    missing = "--no-torch given" if args.no_torch else have_torch()
    if missing:
        print(f"PyTorch side skipped ({missing}); Kiln runs on its own random weights (--random).")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if args.mask_amx:
        env.update(MASK_AMX_ENV)
        print("AMX masked: " + " ".join(f"{k}={v}" for k, v in MASK_AMX_ENV.items()))
    load = os.getloadavg()
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    machine = host()
    print(f"host {machine}")
    print(f"commit {commit}, {args.threads} threads, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")

    cases = []
    for model in args.models.split(","):
        if model not in ("flux", "flux2", "sd3", "zimage", "qwenimage", "t5") + UNETS:
            sys.exit(f"compare.py: unknown model '{model}' (flux, flux2, sd3, zimage, qwenimage, t5, "
                     f"{', '.join(UNETS)})")
        if args.tiny and not missing and model not in UNETS:
            sys.exit(f"compare.py: --tiny makes checkpoints for {', '.join(UNETS)} only, not {model} (its tiny "
                     f"model runs without PyTorch: --no-torch --tiny)")
        sizes = [args.t5_tokens] if model == "t5" else [int(s) for s in args.sizes.split(",")]
        if model in UNETS and any(size % 8 for size in sizes):
            sys.exit(f"compare.py: {model} needs sizes that are multiples of 8 (the latent is 1/8 of the image)")
        cases += [(model, size) for size in sizes]

    rows, results, extrapolated, versus = [], [], [], []
    for model, size in cases:
        label = f"{model} {size}" + ("px" if model != "t5" else " tok")
        if model in UNETS and model != "sd15":
            label = f"sdxl[1,2,{sdxl_layers(args, model)}]{'-tiny' if args.tiny else ''} {size}px"
        elif args.tiny:
            label = label.replace(" ", "-tiny ", 1)
        driver_model = "sdxl" if model == "sdxl-full" else model
        print(f"\n== {label}", flush=True)
        if args.prepare_only and missing:
            sys.exit(f"compare.py: --prepare-only needs PyTorch ({missing})")
        layers = {"flux": args.flux_layers, "flux2": args.flux2_layers, "sd3": args.sd3_layers,
                  "t5": args.t5_layers, "zimage": args.zimage_layers, "qwenimage": args.qwenimage_layers, "sd15": 0,
                  "sdxl": args.sdxl_layers, "sdxl-full": 10}[model]
        torch_res, failed = {}, []
        if not missing:
            folder = case_dir(args, model)
            make_checkpoint(args, model, folder)
            inputs = make_inputs(args, model, folder, size)
            sdcpp_file = sdcpp.single_file(model, folder) if args.sdcpp and not sdcpp_skip(args, model, None) else None
            if args.prepare_only:
                continue
            for mode in args.torch_modes.split(","):
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model, "--mode", mode,
                       "--checkpoint", folder, "--inputs", inputs, "--steps", str(args.steps),
                       "--threads", str(args.threads)] + (["--torch-freezing"] if args.torch_freezing else [])
                r = run_child(cmd, "TORCH_RESULT", env)
                if r:
                    torch_res[mode] = r
                else:
                    failed.append(f"torch {mode}")
            source = ["--checkpoint", folder, "--inputs", inputs]
        else:
            source = ["--random", "--size", str(size), "--layers", str(layers)] + (["--tiny"] if args.tiny else [])
        kiln_res = {}
        for i, mode in enumerate(args.kiln_modes.split(",")):
            if model == "t5" and mode.startswith("compile"):
                print(f"  kiln {mode}: skipped (Kiln compiles the denoising transformers, not the text encoders)")
                continue
            reps = args.matmul_reps if i == 0 else 0  # the matmul share does not depend on the mode
            cmd = [args.driver, "--model", driver_model, "--mode", mode, "--steps", str(args.steps),
                   "--matmul-reps", str(reps)] + source
            r = run_child(cmd, "KILN_RESULT", env)
            if r:
                kiln_res[mode] = r
            elif r is None:
                failed.append(f"kiln {mode}")
        sdcpp_res = {}
        if args.sdcpp and sdcpp_skip(args, model, missing):
            print(f"  sd.cpp: skipped ({sdcpp_skip(args, model, missing)})")
        elif args.sdcpp:
            for mode in args.sdcpp_modes.split(","):
                r, log, notes = sdcpp.run(args.sdcpp, sdcpp_file, size, args.steps, args.threads, mode == "fa", env)
                for line in log:  # its INFO, WARN and ERROR lines and the step times (not its DEBUG lines, its
                    if line.startswith(("[INFO", "[WARN", "[ERROR")) or sdcpp.STEP.search(line):  # settings dump)
                        print("    " + line)
                if r:
                    sdcpp_res[mode] = r
                else:
                    failed.append(f"sdcpp {mode} ({'; '.join(notes) or 'no step times in its output'})")
        first = next(iter(kiln_res.values()), None)
        flops = first["flops"] if first else float("nan")
        peak = first["measured_peak_gflops"] if first else float("nan")
        matmul = first["matmul_s"] if first else None
        for mode, r in torch_res.items():
            gf = flops / r["median_s"] / 1e9
            compile_s = r["first_call_s"] - r["median_s"] if "compile" in r["mode"] else None
            rows.append([label, f"torch {r['mode']}", fmt(r["median_s"], ".3f"),
                         f"{r['min_s']:.3f}-{r['max_s']:.3f}", "", "", fmt(flops / 1e9, ".1f"), fmt(gf, ".0f"),
                         fmt(100 * gf / peak if peak else None, ".1f", "-") + "%",
                         "", fmt(r["vmhwm_bytes"] / 1e9, ".2f"), "", "ref" if r["mode"] == "eager" else fmt(r.get("max_rel_error"), ".2e"),
                         fmt(compile_s, ".1f")])
            results.append(dict(r, case=label, flops=flops, host=machine))
        for mode, r in kiln_res.items():
            gf = r["flops"] / r["median_s"] / 1e9
            ratio = {m: r["median_s"] / t["median_s"] for m, t in torch_res.items()}
            share = f"{100 * matmul / r['median_s']:.0f}%" if matmul else ""
            rows.append([label, f"kiln {mode}", fmt(r["median_s"], ".3f"), f"{r['min_s']:.3f}-{r['max_s']:.3f}",
                         fmt(ratio.get("eager"), ".2f"), fmt(ratio.get("compile"), ".2f"), fmt(r["flops"] / 1e9, ".1f"),
                         fmt(gf, ".0f"), f"{100 * gf / r['measured_peak_gflops']:.1f}%" if r["measured_peak_gflops"] else "-",
                         share, fmt(r["vmhwm_bytes"] / 1e9, ".2f"),
                         fmt(r["weight_bytes"] / 1e9, ".2f"), fmt(r.get("max_rel_error"), ".2e"),
                         fmt(r["first_call_s"] - r["median_s"], ".1f") if mode.startswith("compile") else ""])
            results.append(dict(r, case=label, host=machine))
        for mode, r in sdcpp_res.items():
            gf = flops / r["median_s"] / 1e9
            ratio = {m: r["median_s"] / t["median_s"] for m, t in torch_res.items()}
            rows.append([label, f"sd.cpp {mode}", fmt(r["median_s"], ".3f"), f"{r['min_s']:.3f}-{r['max_s']:.3f}",
                         fmt(ratio.get("eager"), ".2f"), fmt(ratio.get("compile"), ".2f"), fmt(flops / 1e9, ".1f"),
                         fmt(gf, ".0f"), fmt(100 * gf / peak if peak else None, ".1f", "-") + "%", "",
                         fmt(r["vmhwm_bytes"] / 1e9, ".2f"), "", "", ""])
            results.append(dict(r, case=label, flops=flops, host=machine))
            for kmode, k in kiln_res.items():
                versus.append(f"{label}: sd.cpp {mode} {r['median_s']:.3f} s / Kiln {kmode} {k['median_s']:.3f} s "
                              f"= {r['median_s'] / k['median_s']:.2f}")
        for engine in failed:
            rows.append([label, engine, "failed (see the log above)"] + [""] * 11)
        full = first.get("full_depth_flops") if first else None
        if full and full == full:
            est = [f"{e} {m} ~{r['median_s'] * full / flops:.2f} s"
                   for e, res in (("torch", torch_res), ("kiln", kiln_res), ("sd.cpp", sdcpp_res))
                   for m, r in res.items()]
            cut = (f"cut to {layers} of Qwen-Image's 60 dual-stream blocks" if model == "qwenimage" else
                   f"cut to {layers} of SDXL's 10 transformer blocks at the deepest level and in the middle")
            extrapolated.append(f"{label}: {cut}; {flops / 1e9:.4g} of the real depth's {full / 1e9:.4g} GFLOP a step. "
                                f"Estimated full-depth step (x{full / flops:.2f}, at the cut model's FLOP rate): "
                                + ", ".join(est))
        if first:
            print(f"  measured bf16 ceiling now: {peak:.0f} GFLOP/s with {first.get('peak_instruction', '?')}; "
                  f"Kiln's bf16 products on the {first.get('bf16_path', '?')} path; "
                  f"Kiln's matmuls alone: {fmt(matmul, '.3f')} s")

    if args.prepare_only:
        return
    paths = sorted({r["bf16_path"] for r in results if r.get("engine") == "kiln" and "bf16_path" in r})
    load = os.getloadavg()
    note = (f"Kiln vs PyTorch on {machine}; bf16, {args.threads} threads, {args.steps} timed steps per engine "
            f"after a warm-up; "
            f"commit {commit}; load average at the end {load[0]:.2f}; Kiln's bf16 products on the "
            f"{', '.join(paths) or '?'} path. Kiln/eager and Kiln/compile: Kiln's step time "
            f"over PyTorch's (< 1: Kiln faster). MFU: model FLOPs per step / step time / bf16 ceiling (the fastest "
            f"instruction a bf16 product can use on this host, measured by the driver in this run). matmul share: "
            f"the step's Linear shapes timed alone (kiln::linear) / step time. max rel err: max|out - torch eager| / max|torch eager|."
            + (" sd.cpp rows: stable-diffusion.cpp's guided step (two UNet calls of batch 1) from its sampler's "
               "per-step times, its ratios to PyTorch in the Kiln/eager and Kiln/compile columns, GFLOP the same "
               "step's; its output is not compared (its own sampler and text encoder run around the UNet)."
               if any(r.get("engine") == "sdcpp" for r in results) else ""))
    print_table(rows, note)
    if versus:
        print()
        print("stable-diffusion.cpp over Kiln, step time (> 1: Kiln faster):")
        for line in versus:
            print("  " + line)
    if extrapolated:
        print()
        print("Not measured, extrapolated (the ratios above are the cut model's, measured):")
        for line in extrapolated:
            print("  " + line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
