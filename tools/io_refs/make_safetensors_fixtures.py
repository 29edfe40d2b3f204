#!/usr/bin/env python3
"""Writes the safetensors fixtures that tests/io/safetensors_test.cpp reads.

tests/data/io/dtypes.safetensors   one or more tensors of every dtype Python's safetensors can write,
                                   written by safetensors itself (safetensors.torch.save_file), with metadata.
tests/data/io/expected.safetensors the same tensors' values as F64 (floating types) or I64 (integer types),
                                   under the same names, for an element-by-element comparison.

Small-float formats cover all 256 byte patterns (NaN, -0, subnormals, extremes); their expected values come
from torch's own conversion, except F4, which torch cannot convert: its values come from the OCP MX table.
Run from the repository root: python3 tools/io_refs/make_safetensors_fixtures.py
"""
import os

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "io")

# E2M1 code -> value (OCP Microscaling Formats v1.0, section 5.3.3); the sign is bit 3.
F4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def f4_decode(code):
    v = F4_VALUES[code & 7]
    return -v if code & 8 else v


def main():
    torch.manual_seed(0)
    data, expected = {}, {}

    def add(name, tensor, reference):
        data[name] = tensor.contiguous()
        expected[name] = reference.contiguous()

    # Native floating types, odd shapes.
    for name, dt in [("f64", torch.float64), ("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16)]:
        t = (torch.randn(5, 7, dtype=torch.float64) * 3).to(dt)
        add(name, t, t.double())
    # A 3-D tensor for column slices along the last dimension.
    t = torch.randn(4, 3, 9).to(torch.float16)
    add("f16_3d", t, t.double())

    # Integer types, including their extremes.
    for name, dt in [("i64", torch.int64), ("i32", torch.int32), ("i16", torch.int16), ("i8", torch.int8),
                     ("u8", torch.uint8)]:
        info = torch.iinfo(dt)
        vals = torch.randint(info.min, info.max, (3, 11), dtype=torch.int64)
        vals[0, 0], vals[0, 1] = info.min, info.max
        add(name, vals.to(dt), vals)
    # Unsigned types Kiln widens; values above the signed range of the same width.
    u16 = torch.tensor([[0, 1, 32767, 32768, 65535], [7, 40000, 50000, 60000, 12345]], dtype=torch.int64)
    add("u16", u16.to(torch.uint16), u16)
    u32 = torch.tensor([[0, 1, 2**31 - 1, 2**31, 2**32 - 1, 3000000000]], dtype=torch.int64)
    add("u32", u32.to(torch.uint32), u32)
    u64 = torch.tensor([[0, 1, 2**62, 2**63 - 1], [5, 6, 7, 8], [2**40, 2**50, 3, 4]], dtype=torch.int64)
    add("u64", u64.to(torch.uint64), u64)
    # Row 2 holds a value no int64 can hold: reading rows 0..2 must work, reading row 2 must fail.
    big = torch.tensor([[1, 2, 3], [4, 5, 6], [0, 0, 0]], dtype=torch.int64).to(torch.uint64)
    big[2, 1] = torch.tensor(2**64 - 1, dtype=torch.uint64)
    data["u64_big"] = big
    expected["u64_big"] = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int64)  # the readable rows

    b = torch.rand(3, 5) > 0.5
    add("bool", b, b.to(torch.int64))

    # Every byte pattern of each 8-bit float format, as a 16x16 table.
    every_byte = torch.arange(256, dtype=torch.int64).to(torch.uint8).reshape(16, 16)
    for name, dt in [("f8_e4m3", torch.float8_e4m3fn), ("f8_e5m2", torch.float8_e5m2),
                     ("f8_e4m3fnuz", torch.float8_e4m3fnuz), ("f8_e5m2fnuz", torch.float8_e5m2fnuz),
                     ("f8_e8m0", torch.float8_e8m0fnu)]:
        t = every_byte.clone().view(dt)
        add(name, t, t.double())
    # F4: two elements per byte, the first in the low nibble. 16 bytes hold all 16 codes twice, as [4, 8].
    packed = torch.tensor([lo | (hi << 4) for lo, hi in zip(range(16), reversed(range(16)))], dtype=torch.uint8)
    codes = [c for byte in packed.tolist() for c in (byte & 0xF, byte >> 4)]
    data["f4"] = packed.reshape(4, 4).view(torch.float4_e2m1fn_x2)
    expected["f4"] = torch.tensor([f4_decode(c) for c in codes], dtype=torch.float64).reshape(4, 8)

    # Scalars and zero-size tensors.
    add("scalar_f32", torch.tensor(2.5, dtype=torch.float32), torch.tensor(2.5, dtype=torch.float64))
    add("scalar_i64", torch.tensor(-7, dtype=torch.int64), torch.tensor(-7, dtype=torch.int64))
    add("empty_f32", torch.zeros(0, dtype=torch.float32), torch.zeros(0, dtype=torch.float64))
    add("empty_bf16", torch.zeros(3, 0, dtype=torch.bfloat16), torch.zeros(3, 0, dtype=torch.float64))
    add("empty_f8", torch.zeros(0, 4).to(torch.float8_e4m3fn), torch.zeros(0, 4, dtype=torch.float64))

    os.makedirs(OUT, exist_ok=True)
    save_file(data, os.path.join(OUT, "dtypes.safetensors"), metadata={"format": "pt", "source": "kiln fixtures"})
    save_file(expected, os.path.join(OUT, "expected.safetensors"))


if __name__ == "__main__":
    main()
