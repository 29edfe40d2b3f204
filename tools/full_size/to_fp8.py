#!/usr/bin/env python3
"""Copies a diffusers pipeline folder (tools/full_size/make_checkpoint.py's) with its transformer's Linear weights
(every 2-D tensor named *.weight) cast to float8_e4m3fn, as fp8 releases of FLUX and SD3.5 store them; every other
file is hard-linked (symlinked across file systems), so the copy costs only the fp8 transformer's bytes.

Usage: python3 tools/full_size/to_fp8.py /work/big/flux1-schnell-full /work/big/flux1-schnell-fp8
Needs torch and safetensors (pip).
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file


def link(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        os.symlink(os.path.abspath(src), dst)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    for root, _, files in os.walk(src):
        rel = os.path.relpath(root, src)
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for name in files:
            s, d = os.path.join(root, name), os.path.join(dst, rel, name)
            if os.path.exists(d):
                continue
            if rel == "transformer" and name.endswith(".safetensors"):
                tensors = load_file(s)
                kept = {k: (v.to(torch.float8_e4m3fn) if v.dim() == 2 and k.endswith(".weight") else v)
                        for k, v in tensors.items()}
                save_file(kept, d, metadata={"format": "pt"})
                print(f"{d}: {sum(v.dtype == torch.float8_e4m3fn for v in kept.values())} of {len(kept)} in fp8")
            else:
                link(s, d)


if __name__ == "__main__":
    main()
