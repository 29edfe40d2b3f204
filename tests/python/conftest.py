"""The Python package's tests (pytest): kiln as installed by `pip install .` (scripts/test.sh), against the same
tiny pipelines and diffusers goldens as the C++ tests."""

import os

import numpy as np
import pytest
from safetensors import safe_open

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")


def data_path(*parts):
    return os.path.join(DATA, *parts)


def golden(*parts):
    """A golden file's tensors (numpy) and its metadata."""
    with safe_open(data_path("goldens", *parts), "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def max_level_difference(image, expected_u8):
    """The largest difference between two 8-bit images, in levels."""
    a = np.asarray(image, dtype=np.int32)
    b = np.asarray(expected_u8, dtype=np.int32)
    assert a.shape == b.shape, f"{a.shape} vs {b.shape}"
    return int(np.abs(a - b).max())


@pytest.fixture(scope="session")
def tiny_flux():
    import kiln

    pipe = kiln.FluxPipeline.from_pretrained(data_path("models", "flux-tiny-dev"))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def small_call(**kwargs):
    call = dict(prompt="a red circle", height=32, width=32, num_inference_steps=2, max_sequence_length=16)
    call.update(kwargs)
    return call
