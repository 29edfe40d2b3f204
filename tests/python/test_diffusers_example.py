"""The seed page's first example (diffusers' "Google TPU" page, the eager FLUX.1-schnell one), changed only in
its import line and its model path, runs unchanged and writes its image."""

import os
import subprocess
import sys

from conftest import data_path

EXAMPLE = '''\
import torch
from kiln import FluxPipeline
pipe = FluxPipeline.from_pretrained("{model}", dtype=torch.bfloat16)
pipe.enable_model_cpu_offload()
image = pipe(
    prompt="a golden retriever surfing a wave, photorealistic",
    height=1024,
    width=1024,
    num_inference_steps=4,
    guidance_scale=0.0,
).images[0]
image.save("output.png")
'''


def test_the_seed_page_example_runs(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(EXAMPLE.format(model=data_path("models", "flux-tiny-schnell")))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    from PIL import Image

    image = Image.open(tmp_path / "output.png")
    assert image.size == (1024, 1024) and image.mode == "RGB"
    assert os.path.getsize(tmp_path / "output.png") > 10000
