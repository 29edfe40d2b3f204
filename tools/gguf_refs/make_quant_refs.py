"""Reference data for Kiln's GGUF reader and dequantization (tests/quant, tests/io).

Writes, with the `gguf` package (pip install gguf numpy safetensors):
  tests/data/gguf/quant_types.gguf          one tensor per supported storage type and shape, as GGUFWriter
                                            lays them out (odd row counts, 3-d shapes, several blocks per row)
  tests/data/gguf/quant_types_expected.safetensors
                                            the same tensors as float32 from gguf.quants.dequantize: Kiln must
                                            reproduce these bits exactly

Formats gguf-py can quantize (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) are quantized from random floats; the
K-quants (which gguf-py only dequantizes) are random block bytes with finite float16 scales, which reach
every packed bit of those formats. Run from the repository root: python tools/gguf_refs/make_quant_refs.py
"""

import os

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from safetensors.numpy import save_file

OUT = os.path.join("tests", "data", "gguf")

# (type, shape in numpy/torch order). Rows are any length that is a whole number of blocks.
CASES = [
    (T.F32, (3, 5)),
    (T.F16, (2, 7)),
    (T.BF16, (3, 33)),
    (T.Q4_0, (3, 64)),
    (T.Q4_1, (5, 32)),
    (T.Q5_0, (3, 96)),
    (T.Q5_1, (2, 64)),
    (T.Q8_0, (7, 96)),
    (T.Q8_0, (2, 3, 32)),
    (T.Q2_K, (3, 256)),
    (T.Q3_K, (2, 512)),
    (T.Q4_K, (3, 256)),
    (T.Q4_K, (2, 2, 512)),
    (T.Q5_K, (3, 256)),
    (T.Q6_K, (2, 512)),
]

# Byte offsets of the float16 scales in each K-quant block (the rest is packed integers).
K_HALVES = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def random_k_blocks(rng, qtype, shape):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = int(np.prod(shape)) // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in K_HALVES[qtype]:
        # Normal and subnormal magnitudes of both signs, never inf/NaN (whose payloads numpy and C++ may
        # propagate differently).
        halves = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        halves[::5] = np.float16(3e-6)  # a subnormal scale
        raw[:, off:off + 2] = halves.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(*shape[:-1], shape[-1] // block * size)


def main():
    rng = np.random.default_rng(17)
    os.makedirs(OUT, exist_ok=True)
    writer = gguf.GGUFWriter(os.path.join(OUT, "quant_types.gguf"), arch="kiln-test")
    writer.add_string("kiln.note", "quantization references")
    expected = {}
    for i, (qtype, shape) in enumerate(CASES):
        name = f"t{i}.{qtype.name}"
        if qtype in K_HALVES:
            data = random_k_blocks(rng, qtype, shape)
        else:
            values = rng.standard_normal(shape).astype(np.float32) * 3
            values.reshape(-1)[:4] = [0.0, -0.0, 1e-30, -7.5]  # zero, signed zero, tiny, exact
            data = gguf.quants.quantize(values, qtype)
        writer.add_tensor(name, data, raw_dtype=qtype)
        expected[name] = np.ascontiguousarray(gguf.quants.dequantize(data, qtype).astype(np.float32))
        assert expected[name].shape == shape, (name, expected[name].shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    save_file(expected, os.path.join(OUT, "quant_types_expected.safetensors"))


if __name__ == "__main__":
    main()
