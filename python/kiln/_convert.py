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


def seed_of(generator):
    """An int seed from `generator`: None (torch's default seed), an int, a fresh torch.Generator (or a list
    of one). A torch.Generator that has already drawn numbers cannot be continued by Kiln, and is refused."""
    if generator is None:
        return None
    if isinstance(generator, (list, tuple)):
        if len(generator) != 1:
            raise ValueError(f"generator: Kiln takes one generator per call, got a list of {len(generator)}")
        generator = generator[0]
    if isinstance(generator, (int, np.integer)):
        if generator < 0:
            raise ValueError(f"generator: a seed must be >= 0, got {generator}")
        return int(generator)
    torch = torch_module()
    if torch is not None and isinstance(generator, torch.Generator):
        if generator.device.type != "cpu":
            raise ValueError(f"generator: Kiln draws torch's CPU noise; got a generator on {generator.device}")
        seed = generator.initial_seed()
        fresh = torch.Generator().manual_seed(seed)
        if not torch.equal(generator.get_state(), fresh.get_state()):
            raise ValueError("generator: this torch.Generator has already drawn numbers; pass a fresh one "
                             "(torch.Generator().manual_seed(seed)) or an int seed")
        return seed
    raise TypeError(f"generator: expected an int seed or a torch.Generator, got {type(generator).__name__}")


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
