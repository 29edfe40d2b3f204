"""Values between diffusers' Python types and Kiln's: dtypes, generators, images and arrays."""

import numpy as np


def torch_module():
    """torch when it is installed, else None (Kiln never needs it)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


_DTYPES = {"float32": "float32", "fp32": "float32", "f32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16"}


def dtype_name(dtype):
    """torch.bfloat16, "bfloat16", "bf16", numpy's float32, ... -> "bfloat16" / "float32" / "float16"."""
    if dtype is None:
        return "float32"  # diffusers loads in float32 unless told otherwise
    name = str(dtype)
    name = name.rsplit(".", 1)[-1]  # "torch.bfloat16" -> "bfloat16"
    if name not in _DTYPES:
        raise ValueError(f"dtype: Kiln runs float32, bfloat16 and float16 pipelines, got {dtype!r}")
    return _DTYPES[name]


def generator_value(generator):
    """An int seed, or a CPU torch.Generator's get_state() bytes (Kiln continues its stream where it is)."""
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool):
        if generator < 0:
            raise ValueError(f"generator: a seed must be >= 0, got {generator}")
        return int(generator)
    torch = torch_module()
    if torch is not None and isinstance(generator, torch.Generator):
        if generator.device.type != "cpu":
            raise ValueError(f"generator: Kiln draws torch's CPU noise; got a generator on {generator.device}")
        return generator.get_state().numpy().tobytes()
    raise TypeError(f"generator: expected an int seed or a torch.Generator, got {type(generator).__name__}")


def hand_back(generator, result):
    """Leaves the caller's torch.Generator objects where diffusers' call would have: after the call's draws."""
    torch = torch_module()
    if torch is None or generator is None:
        return
    pairs = []
    if isinstance(generator, (list, tuple)):
        if len(generator) == 1 and result.get("generator_state") is not None:
            pairs = [(generator[0], result["generator_state"])]
        else:
            pairs = list(zip(generator, result.get("generator_states", [])))
    elif result.get("generator_state") is not None:
        pairs = [(generator, result["generator_state"])]
    for g, state in pairs:
        if isinstance(g, torch.Generator):
            g.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))


def image_array(image):
    """A PIL image or an 8-bit array -> a C-contiguous uint8 [height, width, channels] array, as stored (Kiln
    converts gray and RGBA to RGB as PIL's convert("RGB") does)."""
    if hasattr(image, "mode") and hasattr(image, "size"):  # PIL.Image.Image without importing PIL
        if image.mode not in ("RGB", "RGBA", "L", "LA"):
            image = image.convert("RGB")
        image = np.asarray(image)
    array = np.asarray(image)
    if array.dtype != np.uint8:
        raise TypeError(f"image: expected a PIL image or a uint8 array, got an array of {array.dtype}")
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 2, 3, 4):
        raise ValueError(f"image: expected [height, width, channels], got shape {array.shape}")
    return np.ascontiguousarray(array)


class _Capsule:
    """A DLPack capsule from Kiln, as the object numpy.from_dlpack and torch.from_dlpack take (read once: the
    consumer takes ownership of the tensor)."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, stream=None, **kwargs):
        return self._capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU, device 0


def from_kiln(array, want_torch):
    """An array Kiln handed out (DLPack) as a torch tensor when `want_torch` (and torch is there), else numpy;
    numpy has no bfloat16, so bfloat16 arrays become float32 (through torch when it is there)."""
    torch = torch_module()
    if want_torch and torch is not None:
        return torch.from_dlpack(_Capsule(array))
    if torch is not None:
        tensor = torch.from_dlpack(_Capsule(array))
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    return np.from_dlpack(_Capsule(array))


def to_kiln(value):
    """A torch tensor or an array-like -> something Kiln reads through DLPack (a CPU, contiguous array)."""
    torch = torch_module()
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous()
    return np.ascontiguousarray(value)
