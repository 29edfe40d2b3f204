"""Kiln from Python: diffusers' text-to-image pipelines, run by Kiln's C++ engine.

A diffusers script runs by changing its import line::

    import torch
    from kiln import FluxPipeline   # was: from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained("black-forest-labs/FLUX.1-schnell", torch_dtype=torch.bfloat16)
    image = pipe("a golden retriever surfing a wave", num_inference_steps=4, guidance_scale=0.0,
                 generator=torch.Generator().manual_seed(0)).images[0]
    image.save("output.png")

torch is optional: dtypes may be strings ("bfloat16") and seeds ints. numpy is required; Pillow for PIL
images (the default output_type); tqdm, when installed, shows the denoising progress as diffusers does.
"""

from ._kiln import (
    Cancelled,
    KilnError,
    RequestError,
    devices,
    memory_stats,
    pipeline_classes,
    reset_peak_memory_stats,
)
from . import pipelines as _pipelines
from .pipelines import *  # noqa: F401,F403  DiffusionPipeline, PipelineOutput and one class per pipeline class
from ._kiln import pipeline_class_info
from .schedulers import (  # noqa: F401  the UNet family's samplers, as diffusers names them
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    PNDMScheduler,
)

__version__ = "0.1.0"

__all__ = [
    "Cancelled",
    "DDIMScheduler",
    "DPMSolverMultistepScheduler",
    "EulerAncestralDiscreteScheduler",
    "EulerDiscreteScheduler",
    "PNDMScheduler",
    "KilnError",
    "RequestError",
    "devices",
    "memory_stats",
    "pipeline_class_info",
    "pipeline_classes",
    "reset_peak_memory_stats",
    *_pipelines.__all__,
]
