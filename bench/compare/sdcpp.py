"""stable-diffusion.cpp (leejet/stable-diffusion.cpp on ggml) as one more engine of compare.py, for the UNets.

sd.cpp loads a whole pipeline from one file in Stability's original layout, so single_file() writes one next to
compare.py's UNet checkpoint (sdcpp.safetensors in the case folder, made once): the same UNet weights renamed
(model.diffusion_model.*, through tools/goldens/sd_single_file.py's mapping, the inverse of diffusers' single-file
loader, proven there on the tiny pipelines), plus a text encoder and a VAE at the real shapes with random weights
(seeded; they run once a generation, outside the timed steps): CLIP ViT-L/14's text tower
(cond_stage_model.transformer.*; SDXL: conditioner.embedders.0.transformer.* and OpenCLIP bigG's at
conditioner.embedders.1.model.*) and the SD VAE (first_stage_model.*), all bf16. sd.cpp keeps the Linear weights
in the file's type (bf16: AVX-512 BF16 vdpbf16ps in ggml's kernels, not AMX tiles, which ggml uses for quantized types)
and converts every convolution kernel to f16 when it loads (its Conv2d holds f16 kernels whatever the file has).

run() generates one image with sd-cli at the case's size: euler, cfg-scale 7 with an empty negative prompt (so
every step calls the UNet twice, prompt and unconditional, batch 1 each; 77 tokens), --steps timed steps plus one
warm-up. The sampler prints each step's time (ggml_time_us between progress reports); the first is dropped as
the warm-up (graph allocation), the median of the rest is the step. sd-cli is stopped once the last step's time
is printed (the VAE decode that follows is not timed, and would add minutes at 1024); no image is written.
"""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# transformers' CLIPTextConfig for openai/clip-vit-large-patch14 (SD1.5's text_encoder, SDXL's text_encoder) and
# for laion CLIP-ViT-bigG-14 (SDXL's text_encoder_2), as in those repositories' config.json.
CLIP_L = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
              num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768)
CLIP_BIGG = dict(vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                 num_attention_heads=20, max_position_embeddings=77, hidden_act="gelu", projection_dim=1280)
# AutoencoderKL of runwayml/stable-diffusion-v1-5's vae/config.json (SDXL's VAE has the same blocks).
SD_VAE = dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, norm_num_groups=32,
              block_out_channels=[128, 256, 512, 512], down_block_types=["DownEncoderBlock2D"] * 4,
              up_block_types=["UpDecoderBlock2D"] * 4, act_fn="silu")


def _unet_state_dict(folder):
    """The checkpoint's tensors, sharded (an index file) or not."""
    from safetensors.torch import load_file

    index = os.path.join(folder, "diffusion_pytorch_model.safetensors.index.json")
    if not os.path.exists(index):
        return load_file(os.path.join(folder, "diffusion_pytorch_model.safetensors"))
    with open(index) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for shard in shards:
        out.update(load_file(os.path.join(folder, shard)))
    return out


def single_file(model, folder):
    """Writes (once) and returns folder/sdcpp.safetensors: the UNet of `folder` with a random text encoder (two
    for SDXL) and VAE at the real shapes, bf16, in the original layout."""
    path = os.path.join(folder, "sdcpp.safetensors")
    if os.path.exists(path):
        return path
    import torch
    from diffusers import AutoencoderKL
    from safetensors.torch import save_file
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    sys.path.insert(0, os.path.join(REPO, "tools", "goldens"))
    import sd_single_file as layout  # the diffusers -> original names, checked against diffusers' loader there

    t0 = time.time()
    with open(os.path.join(folder, "config.json")) as f:
        unet_config = json.load(f)
    out = layout.prefixed("model.diffusion_model.", layout.unet_to_original(_unet_state_dict(folder), unet_config))
    n_unet = len(out)
    torch.manual_seed(1)
    bf16 = torch.bfloat16
    vae = AutoencoderKL(**SD_VAE).to(bf16)
    out.update(layout.prefixed("first_stage_model.", layout.vae_to_original(vae.state_dict(), SD_VAE)))
    clip = layout.clip_to_original(CLIPTextModel(CLIPTextConfig(**CLIP_L)).to(bf16).state_dict())
    clip["text_model.embeddings.position_ids"] = torch.arange(77, dtype=torch.int64)[None]  # as real files hold
    if model == "sd15":
        out.update(layout.prefixed("cond_stage_model.transformer.", clip))
    else:
        out.update(layout.prefixed("conditioner.embedders.0.transformer.", clip))
        big_g = CLIPTextModelWithProjection(CLIPTextConfig(**CLIP_BIGG)).to(bf16).state_dict()
        out.update(layout.prefixed("conditioner.embedders.1.model.", layout.open_clip_to_original(big_g)))
    out = {k: v.contiguous() for k, v in out.items()}
    save_file(out, path + ".tmp")
    os.rename(path + ".tmp", path)
    print(f"  made {path} ({n_unet} UNet tensors of {len(out)}, {time.time() - t0:.0f} s)")
    return path


STEP = re.compile(r"\|\s*(\d+)/(\d+) - ([0-9.]+)(s/it|it/s)")
LOADED = re.compile(r"\|\s*(\d+)/(\d+) - [0-9.]+[MG]B/s")


def unet_tensors(file):
    """How many model.diffusion_model.* tensors the single file holds (from its safetensors header)."""
    with open(file, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return sum(1 for k in header if k.startswith("model.diffusion_model."))


def run(binary, file, size, steps, threads, flash_attention=True, env=None):
    """Runs sd-cli in its own process; returns (the result or None, its log lines, notes on what went wrong)."""
    out_png = os.path.join(os.path.dirname(file), f"sdcpp-{size}.png")  # never written: stopped before decoding
    cmd = [binary, "-m", file, "-p", "a photograph of an astronaut riding a horse", "-n", "", "--cfg-scale", "7",
           "--sampling-method", "euler", "--steps", str(steps + 1), "-W", str(size), "-H", str(size),
           "--seed", "42", "-t", str(threads), "-o", out_png, "-v"] + (["--diffusion-fa"] if flash_attention else [])
    print(f"  $ {' '.join(cmd)}", flush=True)
    t0 = time.time()
    # Read as it runs: once the last step's time is out, what follows (the VAE decode, the PNG) is not measured,
    # so sd-cli is stopped there; its peak resident memory (ru_maxrss of the child) is then the sampling's.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    last = re.compile(rf"\|\s*{steps + 1}/{steps + 1} - [0-9.]+(s/it|it/s)".encode())
    out, stopped = b"", False
    while True:
        chunk = os.read(p.stdout.fileno(), 1 << 16)
        if not chunk:
            break
        out += chunk
        if not stopped and last.search(out, max(0, len(out) - len(chunk) - 256)):
            p.send_signal(signal.SIGTERM)
            stopped = True
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = 0 if stopped else os.waitstatus_to_exitcode(status)
    wall = time.time() - t0
    rss = 1024.0 * usage.ru_maxrss
    # The progress bar rewrites its line with \r; every rewrite is one step's time.
    text = out.decode(errors="replace")
    lines = [part for line in text.splitlines() for part in line.split("\r") if part.strip()]
    times = {}
    for line in lines:
        m = STEP.search(line)
        if m and int(m.group(2)) == steps + 1:
            value = float(m.group(3))
            times[int(m.group(1))] = value if m.group(4) == "s/it" else 1.0 / value
    # sd.cpp loads the UNet when the sampler first needs it, every tensor its graph names (a missing one is an
    # error, "not in model metadata"), with a progress bar of the count; that count equal to the file's UNet
    # tensors means every one of them is used (a tensor it does not name would be left out of the count).
    n_unet = unet_tensors(file)
    loaded = {int(m.group(2)) for m in map(LOADED.search, lines) if m and m.group(1) == m.group(2)}
    unknown_unet = [line for line in lines if "unknown tensor" in line and "model.diffusion_model." in line]
    missing = [line for line in lines if "not in model" in line or "not found" in line]
    result = None
    if p.returncode == 0 and len(times) == steps + 1 and not unknown_unet and n_unet in loaded:
        timed = [times[i] for i in range(2, steps + 2)]  # step 1 is the warm-up
        result = dict(engine="sdcpp", mode="fa" if flash_attention else "default", median_s=statistics.median(timed),
                      min_s=min(timed), max_s=max(timed), steps=steps, first_step_s=times[1], vmhwm_bytes=rss,
                      wall_s=wall, threads=threads, unet_tensors_loaded=n_unet)
    notes = [f"exit status {p.returncode}"] if p.returncode else []
    notes += [f"{len(unknown_unet)} UNet tensors unknown to sd.cpp"] if unknown_unet else []
    notes += [f"{len(missing)} tensors missing"] if missing else []
    if n_unet not in loaded:
        notes.append(f"sd.cpp did not load the file's {n_unet} UNet tensors (its loading counts: {sorted(loaded)})")
    return result, lines, notes
