#!/usr/bin/env python3
"""torch.Generator("cpu") states (get_state()'s 5056 bytes) part-way through their streams, the draws that follow
each, and the state after those draws: Kiln's Generator::from_torch_state / torch_state against torch's own.

    python3 tools/refs/generator_states.py      # writes tests/data/refs/generator_states.safetensors
"""
import os

import torch
from safetensors.torch import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "refs", "generator_states.safetensors")

# name: (seed, the draws before the state is taken (sizes, dtypes), the draws after it)
CASES = {
    "fresh": (5, [], [(20, torch.float32)]),
    "cached_normal": (5, [(3, torch.float32)], [(5, torch.float32), (40, torch.float32)]),
    "mid_stream": (42, [(1000, torch.float32), (2, torch.bfloat16)], [(17, torch.float32), (1, torch.float32)]),
    "after_twists": (2**40 + 7, [(5000, torch.float32), (33, torch.float16)], [(64, torch.bfloat16), (3, torch.float32)]),
}


def main():
    out = {}
    for name, (seed, before, after) in CASES.items():
        g = torch.Generator().manual_seed(seed)
        for n, dtype in before:
            torch.randn(n, generator=g, dtype=dtype)
        out[f"state_{name}"] = g.get_state().clone()
        for i, (n, dtype) in enumerate(after):
            out[f"draws_{name}_{i}"] = torch.randn(n, generator=g, dtype=dtype)
        out[f"state_after_{name}"] = g.get_state().clone()
    save_file(out, OUT)
    print(OUT, len(out), "tensors")


if __name__ == "__main__":
    main()
