#!/usr/bin/env python3
"""diffusers FluxPipeline references for models/kiln-shapes-64, for tests/pipelines/shapes_model_test.cpp.

Writes tests/data/goldens/shapes/<case>.safetensors with the 8-bit image diffusers' PIL path would save
(image_u8, HWC) and the float image (image, HWC in [0, 1]); the call's parameters are in the metadata.
Usage: python tools/train_tiny_flux/goldens.py   (after train.py)
"""
import os

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MODEL = os.path.join(ROOT, "models", "kiln-shapes-64")
OUT = os.path.join(ROOT, "tests", "data", "goldens", "shapes")
MAX_SEQ = 40

CASES = [
    # name, prompt, seed, steps
    ("default_s0", "a big yellow triangle at the top, on a blue background", 0, 4),
    ("seen_s42", "a small blue triangle at the top, on a white background", 42, 4),
    ("square_s7_8steps", "a big green square in the center, on a black background", 7, 8),
]


def main():
    from diffusers import FluxPipeline

    torch.set_num_threads(2)
    os.makedirs(OUT, exist_ok=True)
    pipe = FluxPipeline.from_pretrained(MODEL)
    for name, prompt, seed, steps in CASES:
        g = torch.Generator("cpu").manual_seed(seed)
        with torch.no_grad():
            image = pipe(prompt, height=64, width=64, num_inference_steps=steps, guidance_scale=0.0, generator=g,
                         max_sequence_length=MAX_SEQ, output_type="np").images[0]
        tensors = {"image": torch.from_numpy(np.ascontiguousarray(image)).float(),
                   "image_u8": torch.from_numpy(np.ascontiguousarray((image * 255).round().astype("uint8")))}
        meta = dict(prompt=prompt, seed=str(seed), steps=str(steps), height="64", width="64",
                    max_sequence_length=str(MAX_SEQ))
        save_file(tensors, os.path.join(OUT, name + ".safetensors"), metadata=meta)
        print("wrote", name)


if __name__ == "__main__":
    main()
