#!/usr/bin/env python3
"""Reference schedules and Euler steps of diffusers' FlowMatchEulerDiscreteScheduler for Kiln.

    python3 tools/refs/scheduler.py
        writes tests/data/refs/scheduler.json          (configs, set_timesteps arguments, sigmas, timesteps, mu)
               tests/data/refs/scheduler.safetensors   (step() inputs and outputs)

The scheduler is driven exactly the way the pipelines drive it:
  FluxPipeline   sigmas = np.linspace(1.0, 1/N, N) (float64), mu = calculate_shift(image_seq_len, ...)
  Flux2Pipeline  the same sigmas, mu = compute_empirical_mu(image_seq_len, N)
  SD3 pipeline   set_timesteps(N) with no sigmas and no mu
plus the less common options (linear time shift, shift_terminal, invert_sigmas, dynamic shifting without
custom sigmas). Floats are written with repr(), so float32 values and Python doubles round-trip exactly.
"""
import json
import os
import sys

# tools/refs/tokenizers.py would shadow the `tokenizers` package that transformers (imported by diffusers) needs.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux.pipeline_flux import calculate_shift
from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_JSON = os.path.join(ROOT, "tests", "data", "refs", "scheduler.json")
OUT_ST = os.path.join(ROOT, "tests", "data", "refs", "scheduler.safetensors")

# scheduler_config.json of the public checkpoints (FLUX.2-dev ships FLUX.1-dev's scheduler).
SCHNELL = {"base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
           "num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": False}
DEV = dict(SCHNELL, shift=3.0, use_dynamic_shifting=True)
SD3 = {"num_train_timesteps": 1000, "shift": 3.0}

cases = {}


def floats(x):
    return [float(v) for v in np.asarray(x, dtype=np.float64).tolist()]


def add(name, config, n, sigmas_mode, mu=None):
    s = FlowMatchEulerDiscreteScheduler(**config)
    sigmas = None
    if sigmas_mode == "flux":
        sigmas = np.linspace(1.0, 1 / n, n)
    s.set_timesteps(n, sigmas=sigmas, mu=mu)
    case = {"config": config, "num_inference_steps": n, "sigmas_mode": sigmas_mode,
            "sigmas": floats(s.sigmas.numpy()), "timesteps": floats(s.timesteps.numpy()),
            "sigma_min": float(FlowMatchEulerDiscreteScheduler(**config).sigma_min),
            "sigma_max": float(FlowMatchEulerDiscreteScheduler(**config).sigma_max)}
    assert s.sigmas.dtype == torch.float32 and s.timesteps.dtype == torch.float32
    if mu is not None:
        case["mu"] = float(mu)
    if sigmas is not None:
        case["input_sigmas"] = floats(sigmas)
    cases[name] = case
    return s


for n in (1, 4, 28, 50):
    add(f"schnell_n{n}", SCHNELL, n, "flux", calculate_shift(1024 * 1024 // 256))
    for seq in (256, 1024, 4096, 4080, 6400):
        add(f"dev_seq{seq}_n{n}", DEV, n, "flux", calculate_shift(seq))
    add(f"flux2_seq4096_n{n}", DEV, n, "flux", compute_empirical_mu(4096, n))
    add(f"flux2_seq16384_n{n}", DEV, n, "flux", compute_empirical_mu(16384, n))
    add(f"sd3_n{n}", SD3, n, "none")
add("sd3_shift1_n28", {"shift": 1.0}, 28, "none")
add("linear_dev_n28", dict(DEV, time_shift_type="linear"), 28, "flux", calculate_shift(4096))
add("linear_none_n20", dict(DEV, time_shift_type="linear"), 20, "none", 0.8)
add("dynamic_none_n30", DEV, 30, "none", calculate_shift(4096))
add("terminal_dev_n28", dict(DEV, shift_terminal=0.1), 28, "flux", calculate_shift(4096))
add("terminal_sd3_n25", dict(SD3, shift_terminal=0.05), 25, "none")
add("invert_sd3_n10", dict(SD3, invert_sigmas=True), 10, "none")
add("train500_n7", {"num_train_timesteps": 500, "shift": 2.0}, 7, "none")
add("explicit_dev_n5", DEV, 5, "explicit", 0.7)  # user-given sigmas, see below
# Custom sigmas given by a user rather than the pipeline's linspace (not monotone, odd values).
s = FlowMatchEulerDiscreteScheduler(**DEV)
custom = [0.97, 0.8125, 0.5, 0.333, 0.01]
s.set_timesteps(5, sigmas=custom, mu=0.7)
cases["explicit_dev_n5"].update(input_sigmas=custom, sigmas=floats(s.sigmas.numpy()),
                                timesteps=floats(s.timesteps.numpy()))

# The mu helpers themselves, as Python doubles.
shift_refs = {str(seq): float(calculate_shift(seq)) for seq in (1, 256, 1024, 4080, 4096, 6400, 16384)}
shift_refs_custom = float(calculate_shift(3000, 128, 8192, 0.25, 1.5))
empirical_refs = {f"{seq}_{n}": float(compute_empirical_mu(seq, n))
                  for seq in (256, 1024, 4096, 4300, 4301, 16384) for n in (1, 4, 28, 50)}
linspace_refs = {f"{n}": floats(np.linspace(1.0, 1 / n, n)) for n in (1, 2, 3, 4, 7, 28, 50)}

# step(): one denoising update at several step indices, f32/bf16/f16 model outputs, mixed sample dtype.
tensors = {}
torch.manual_seed(0)
step_cases = []
for cname, cfg, mu in (("dev28", DEV, calculate_shift(4096)), ("schnell4", SCHNELL, None), ("sd3_28", SD3, None)):
    n = 28 if cname != "schnell4" else 4
    for out_dtype, sample_dtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                    (torch.float16, torch.float16), (torch.bfloat16, torch.float32),
                                    (torch.float32, torch.bfloat16)):
        for i in sorted({0, n // 2, n - 1}):
            s = FlowMatchEulerDiscreteScheduler(**cfg)
            sig = np.linspace(1.0, 1 / n, n) if cname != "sd3_28" else None
            s.set_timesteps(n, sigmas=sig, mu=mu if cname == "dev28" else (None if sig is None else 0.0))
            s.set_begin_index(0)
            s._step_index = i
            model_output = (torch.randn(2, 7, 19) * 1.5).to(out_dtype)
            sample = torch.randn(2, 7, 19).to(sample_dtype)
            prev = s.step(model_output, s.timesteps[i], sample, return_dict=False)[0]
            assert s.step_index == i + 1
            key = f"{cname}.{str(out_dtype)[6:]}.{str(sample_dtype)[6:]}.i{i}"
            tensors[f"{key}.model_output"] = model_output
            tensors[f"{key}.sample"] = sample
            tensors[f"{key}.expected"] = prev.contiguous()
            step_cases.append({"key": key, "case": cname, "index": i})

# scale_noise(): the forward process image-to-image starts from and inpainting blends with, at several step
# indices (begin_index set, as the img2img pipelines do), f32/bf16/f16.
noise_cases = []
for cname, cfg, mu in (("dev28", DEV, calculate_shift(4096)), ("sd3_28", SD3, None)):
    n = 28
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for i in (0, 9, n - 1):
            s = FlowMatchEulerDiscreteScheduler(**cfg)
            sig = np.linspace(1.0, 1 / n, n) if cname != "sd3_28" else None
            s.set_timesteps(n, sigmas=sig, mu=mu if cname == "dev28" else None)
            s.set_begin_index(i)
            sample = torch.randn(2, 5, 11).to(dtype)
            noise = torch.randn(2, 5, 11).to(dtype)
            noised = s.scale_noise(sample, s.timesteps[i:i + 1].repeat(2), noise)
            key = f"noise.{cname}.{str(dtype)[6:]}.i{i}"
            tensors[f"{key}.sample"] = sample
            tensors[f"{key}.noise"] = noise
            tensors[f"{key}.expected"] = noised.contiguous()
            noise_cases.append({"key": key, "case": cname, "index": i})

# The schedules the step cases use, by name.
step_schedules = {"dev28": "dev_seq4096_n28", "schnell4": "schnell_n4", "sd3_28": "sd3_n28"}

doc = {
    "generated_by": "tools/refs/scheduler.py",
    "versions": {"diffusers": __import__("diffusers").__version__, "torch": torch.__version__,
                 "numpy": np.__version__},
    "cases": cases,
    "calculate_shift": shift_refs,
    "calculate_shift_custom": shift_refs_custom,
    "compute_empirical_mu": empirical_refs,
    "flux_sigmas": linspace_refs,
    "step_cases": {c["key"]: {"schedule": step_schedules[c["case"]], "index": c["index"]} for c in step_cases},
    "scale_noise_cases": {c["key"]: {"schedule": step_schedules[c["case"]], "index": c["index"]}
                          for c in noise_cases},
}
os.makedirs(os.path.dirname(OUT_JSON), exist_ok=True)
with open(OUT_JSON, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
save_file(tensors, OUT_ST)
print(f"wrote {OUT_JSON} ({os.path.getsize(OUT_JSON)} bytes, {len(cases)} schedules) and {OUT_ST} "
      f"({os.path.getsize(OUT_ST)} bytes, {len(step_cases)} steps)")
