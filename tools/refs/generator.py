#!/usr/bin/env python3
"""Reference draws of torch's CPU generator for Kiln's Generator / randn / randn_tensor.

    python3 tools/refs/generator.py      # writes tests/data/refs/generator.safetensors

Every case seeds `torch.Generator("cpu").manual_seed(seed)` and makes one or more draws in a row from it
(torch.randn or torch.rand, any dtype, any shape), so the file pins both the values and how successive calls
continue the stream (the cached Box-Muller spare of the scalar path, the extra draws of tail blocks).

Layout (all names start with the case name):
  <case>.seed            int64 [2]: the 64-bit seed as [high 32 bits, low 32 bits]
  <case>.<k>.spec        int64: [kind (0 randn, 1 rand), ndim, dims...] of draw k
  <case>.<k>.expected    the draw's values in its dtype: all of them, or (for large draws) the values at
  <case>.<k>.index       int64 flat indices (present only when sampled)
  <case>.<k>.hash        int64 [1]: FNV-1a 64 of the whole draw's raw little-endian bytes, so that even a
                         sampled draw is compared bit for bit everywhere
  list.seeds / list.shape / list.expected / list.hash: diffusers' randn_tensor with a list of generators.

The torch version is recorded in the file metadata. x86 torch builds run the AVX2 Box-Muller for float32
(also on AVX-512 machines); an ARM build would give different float32 values.
"""
import os
import sys

# tools/refs/tokenizers.py would shadow the `tokenizers` package that transformers (imported by diffusers) needs.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import numpy as np
import torch
from diffusers.utils.torch_utils import randn_tensor
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "refs", "generator.safetensors")

FULL_LIMIT = 1024  # draws up to this many values are stored whole; larger ones are sampled + hashed
SAMPLES = 512

tensors = {}


def fnv1a64(t):
    data = t.contiguous().flatten().view(torch.uint8).numpy().tobytes() if t.numel() else b""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def as_int64(u):
    return u - (1 << 64) if u >= (1 << 63) else u


def add_case(name, seed, draws):
    """draws: list of (kind, dtype, shape)."""
    g = torch.Generator("cpu").manual_seed(seed)
    assert g.initial_seed() == seed
    tensors[f"{name}.seed"] = torch.tensor([seed >> 32, seed & 0xFFFFFFFF], dtype=torch.int64)
    for k, (kind, dtype, shape) in enumerate(draws):
        if kind == "randn":
            x = torch.randn(shape, generator=g, dtype=dtype)
        else:
            x = torch.rand(shape, generator=g, dtype=dtype)
        spec = [0 if kind == "randn" else 1, len(shape), *shape]
        tensors[f"{name}.{k}.spec"] = torch.tensor(spec, dtype=torch.int64)
        flat = x.flatten()
        if flat.numel() <= FULL_LIMIT:
            tensors[f"{name}.{k}.expected"] = flat.clone()
        else:
            # First and last 64 values (block boundaries and the tail) and a fixed random sample in between.
            rng = np.random.default_rng(1234 + k)
            mid = rng.choice(np.arange(64, flat.numel() - 64), SAMPLES - 128, replace=False)
            idx = np.unique(np.concatenate([np.arange(64), mid, np.arange(flat.numel() - 64, flat.numel())]))
            idx_t = torch.from_numpy(idx.astype(np.int64))
            tensors[f"{name}.{k}.index"] = idx_t
            tensors[f"{name}.{k}.expected"] = flat[idx_t].clone()
        tensors[f"{name}.{k}.hash"] = torch.tensor([as_int64(fnv1a64(x))], dtype=torch.int64)


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}
SEEDS = {"s0": 0, "s42": 42, "s2p32p5": 2**32 + 5, "smax": 2**64 - 1, "s1234567890123": 1234567890123}

# One draw per case: sizes around the 16-element block (serial path below 16, tail re-draw above).
for sname, seed in SEEDS.items():
    for dname in ("f32", "bf16", "f16"):
        for n in (1, 15, 16, 17, 255, 1000, 65536):
            add_case(f"randn_{sname}_{dname}_n{n}", seed, [("randn", DTYPES[dname], (n,))])
for sname in ("s0", "s42"):
    for n in (1, 15, 16, 17, 1000):
        add_case(f"randn_{sname}_f64_n{n}", SEEDS[sname], [("randn", torch.float64, (n,))])

# Latent shapes: FLUX.1 at 512^2 and 1024^2, FLUX.2 at 1024^2, a small odd latent.
for sname in ("s0", "s42"):
    for dname in ("f32", "bf16"):
        for shape in ((1, 16, 64, 64), (1, 16, 128, 128), (1, 128, 64, 64), (2, 16, 5, 7)):
            tag = "x".join(map(str, shape))
            add_case(f"latent_{sname}_{dname}_{tag}", SEEDS[sname], [("randn", DTYPES[dname], shape)])

# Draws in a row from one generator.
add_case("seq_spare", 7, [("randn", torch.float32, (3,)), ("randn", torch.float32, (3,)),
                          ("randn", torch.float32, (1,))])
add_case("seq_mixed", 123, [
    ("randn", torch.float32, (3,)),           # leaves a cached spare
    ("randn", torch.bfloat16, (17,)),         # block path: the spare survives
    ("randn", torch.float16, (5,)),           # serial path: starts with the spare
    ("randn", torch.float32, (20,)),          # tail re-draw: n + 16 uniforms
    ("randn", torch.float64, ()),             # 0-dim
    ("rand", torch.float32, (33,)),
    ("rand", torch.float64, (9,)),
    ("randn", torch.bfloat16, (2, 3, 5)),     # 30 values: tail block in 16-bit
    ("randn", torch.float32, (4, 4)),
    ("randn", torch.float64, (31,)),
])
add_case("seq_latents_bf16", 0, [("randn", torch.bfloat16, (1, 16, 64, 64)),
                                 ("randn", torch.bfloat16, (1, 16, 64, 64))])
add_case("seq_latents_f32", 42, [("randn", torch.float32, (1, 16, 64, 64)),
                                 ("randn", torch.float32, (1, 16, 64, 64))])
add_case("seq_crossing_twist", 5, [("rand", torch.float32, (700,)), ("randn", torch.float32, (1000,)),
                                   ("randn", torch.float32, (7,))])

# diffusers randn_tensor with one generator per batch element.
list_seeds = [1, 2, 2**40 + 3]
list_shape = (3, 16, 8, 8)
gens = [torch.Generator("cpu").manual_seed(s) for s in list_seeds]
lt = randn_tensor(list_shape, generator=gens, dtype=torch.bfloat16)
tensors["list.seeds"] = torch.tensor([[s >> 32, s & 0xFFFFFFFF] for s in list_seeds], dtype=torch.int64)
tensors["list.shape"] = torch.tensor(list_shape, dtype=torch.int64)
tensors["list.expected"] = lt.contiguous()
# The same generators continue: a second call gives the next values of each stream.
lt2 = randn_tensor(list_shape, generator=gens, dtype=torch.bfloat16)
tensors["list.expected_second"] = lt2.contiguous()

os.makedirs(os.path.dirname(OUT), exist_ok=True)
save_file(tensors, OUT, metadata={"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()})
print(f"wrote {OUT}: {len(tensors)} tensors, {os.path.getsize(OUT)} bytes (torch {torch.__version__})")
