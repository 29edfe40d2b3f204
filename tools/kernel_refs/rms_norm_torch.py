"""Reference data for rms_norm's RmsNormStyle::Torch (tests/ops/rms_norm_torch_test.cpp): torch.nn.RMSNorm,
which FLUX.1's attention uses for its QK norms, computes x * rsqrt(mean(x^2) + eps) * weight in float32 and
rounds once to x's dtype.

Writes tests/data/kernels/rms_norm_torch.safetensors: for each case `<case>.input`, `<case>.weight` and torch's
`<case>.expected`; metadata["cases"] lists the cases and metadata[<case>] holds "eps=<eps>".

Run from the repository root: python3 tools/kernel_refs/rms_norm_torch.py
"""
import os

import torch
from safetensors.torch import save_file

torch.manual_seed(20261130)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}

tensors, meta, cases = {}, {}, []
# (shape, x dtype, weight dtype, eps): FLUX's head dim 128 with a bf16 weight, odd widths (vector tails), a
# single row, a float32 weight on bf16 input, and float16.
for shape, xd, wd, eps in [
    ((2, 5, 3, 128), "bf16", "bf16", 1e-6),
    ((1, 7, 2, 37), "bf16", "bf16", 1e-6),
    ((1, 1, 1, 16), "bf16", "f32", 1e-5),
    ((3, 129), "f16", "f16", 1e-6),
    ((4, 33), "f16", "bf16", 1e-6),
    ((6, 131), "f32", "bf16", 1e-6),
    ((2, 3, 64), "f32", "f32", 1e-5),
]:
    name = f"rms_{xd}_w{wd}_{'x'.join(map(str, shape))}"
    x = (torch.randn(shape) * 3 + 0.5).to(DTYPES[xd])
    norm = torch.nn.RMSNorm(shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape[-1]) * 0.5 + 1)
    norm = norm.to(DTYPES[wd])
    with torch.no_grad():
        y = norm(x)
    assert y.dtype == x.dtype, (y.dtype, x.dtype)
    cases.append(name)
    meta[name] = f"eps={eps}"
    tensors[f"{name}.input"] = x.contiguous()
    tensors[f"{name}.weight"] = norm.weight.detach().contiguous()
    tensors[f"{name}.expected"] = y.contiguous()

meta["cases"] = ",".join(cases)
path = "tests/data/kernels/rms_norm_torch.safetensors"
save_file(tensors, path, metadata=meta)
print(f"{path}: {len(cases)} cases, {os.path.getsize(path)} bytes")
