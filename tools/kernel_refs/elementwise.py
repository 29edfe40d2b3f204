#!/usr/bin/env python3
"""Reference data for the elementwise ops (tests/ops/elementwise_test.cpp).

Writes tests/data/kernels/elementwise.safetensors. Each case <name> stores its operands as <name>.a, <name>.b
(second operand) and <name>.c (where's condition), and torch's result as <name>.expected. The file's metadata
maps each case name to a spec "op=...;k=v;..." that the C++ test interprets:
  op        kiln function: add, sub, ..., exp, gelu, gelu_tanh, clamp, where, pow_scalar, ...
  scalar    a double operand replacing b; scalar_first=1 puts it on the left (scalar - x)
  lo, hi    clamp bounds (either may be absent); exponent for pow_scalar
  a, b, c   name of an operand stored under another case (shared operands are stored once)
  a_view    how the C++ test views operand a before the call: "t" = transpose of the last two dims,
            "s2" = every second element of the last dim. Expected values are torch's on the same view.

Run from the repository root:  python3 tools/kernel_refs/elementwise.py
"""
import math
import os

import torch
from safetensors.torch import save_file

torch.manual_seed(20240611)

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "kernels", "elementwise.safetensors")

tensors = {}
specs = {}

FLOAT_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


keep = []  # holds every operand so that no id() below is reused
stored = {}  # id(operand) -> name it was stored under, so that cases sharing an operand store it once


def add_case(name, spec, expected, a, b=None, c=None):
    assert name not in specs, name
    keep.extend([a, b, c])
    for key, t in (("a", a), ("b", b), ("c", c)):
        if t is None:
            continue
        if id(t) in stored:
            spec += f";{key}={stored[id(t)]}"
        else:
            stored[id(t)] = f"{name}.{key}"
            tensors[f"{name}.{key}"] = t.contiguous()
    specs[name] = spec
    tensors[name + ".expected"] = expected.contiguous()


def uniform(shape, lo, hi):
    return torch.rand(shape, dtype=torch.float64) * (hi - lo) + lo


def with_specials(x, values):
    flat = x.flatten().clone()
    flat[: len(values)] = torch.tensor(values, dtype=flat.dtype)
    return flat.reshape(x.shape)


def quick_gelu(x):
    # Computed in float32 and rounded once, the contract of Kiln's quick_gelu.
    xf = x.float()
    return (xf * torch.sigmoid(1.702 * xf)).to(x.dtype)


# ---- unary ops: odd sizes (7 x 37 = 259, not a multiple of 16), specials at the front
INF, NAN = math.inf, math.nan
unary = {
    # op: (lo, hi, specials, torch function)
    "neg": (-5, 5, [0.0, -0.0, INF, NAN], torch.neg),
    "abs": (-5, 5, [-0.0, -INF, NAN], torch.abs),
    "square": (-20, 20, [INF, NAN], torch.square),
    "exp": (-20, 20, [0.0, -100.0, 100.0, 88.0, -87.0, INF, -INF, NAN, 1e-3], torch.exp),
    "log": (1e-4, 1e3, [0.0, -1.0, INF, NAN, 1.0, 1e-30, 1e30, 0.999, 1.001], torch.log),
    "sqrt": (0, 100, [0.0, -1.0, INF, NAN, 2.0, 1e-30], torch.sqrt),
    "rsqrt": (1e-3, 100, [0.0, INF, NAN, 4.0], torch.rsqrt),
    "sin": (-10, 10, [0.0, NAN, 1e-4, 3.14159], torch.sin),
    "cos": (-10, 10, [0.0, NAN, 1e-4, 3.14159], torch.cos),
    "tanh": (-6, 6, [0.0, 1e-5, -1e-3, 0.3, 0.62, 0.63, 10.0, -30.0, INF, -INF, NAN], torch.tanh),
    "sigmoid": (-12, 12, [0.0, -100.0, 100.0, INF, -INF, NAN], torch.sigmoid),
    "silu": (-12, 12, [0.0, -100.0, 100.0, NAN], torch.nn.functional.silu),
    # No infinities for the x * g(x) activations: torch returns NaN at -inf (and at +inf for exact gelu) where
    # Kiln returns the limits -0 and +inf (checked in the C++ test).
    "gelu": (-6, 6, [0.0, 1e-4, -0.9, 0.9, 1.5, -1.5, 5.0, -5.0, -10.0, 10.0, NAN],
             lambda x: torch.nn.functional.gelu(x)),
    "gelu_tanh": (-6, 6, [0.0, 1e-4, -3.0, 3.0, -10.0, 10.0, NAN],
                  lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
    "quick_gelu": (-8, 8, [0.0, -50.0, 50.0, NAN], quick_gelu),
}
for op, (lo, hi, specials, fn) in unary.items():
    base = with_specials(uniform((7, 37), lo, hi), specials)
    for tag, dt in FLOAT_DTYPES.items():
        x = base.to(dt)
        add_case(f"unary.{op}.{tag}", f"op={op}", fn(x), x)

# Integer inputs of floating unary ops compute in float32.
xi = torch.randint(-5, 6, (3, 11), dtype=torch.int32)
add_case("unary.exp.i32", "op=exp", torch.exp(xi), xi)
add_case("unary.sigmoid.i64", "op=sigmoid", torch.sigmoid(xi.long()), xi.long())
for op, fn in [("neg", torch.neg), ("abs", torch.abs), ("square", torch.square)]:
    add_case(f"unary.{op}.i32", f"op={op}", fn(xi), xi)
    add_case(f"unary.{op}.i64", f"op={op}", fn(xi.long()), xi.long())
x64 = uniform((5, 9), -4, 4)
for op in ["exp", "tanh", "gelu", "sigmoid", "neg", "sqrt"]:
    fn = unary[op][3]
    add_case(f"unary.{op}.f64", f"op={op}", fn(x64.abs() if op == "sqrt" else x64), x64.abs() if op == "sqrt" else x64)

# ---- clamp
for tag, dt in FLOAT_DTYPES.items():
    x = with_specials(uniform((5, 19), -3, 3), [NAN, INF, -INF]).to(dt)
    add_case(f"clamp.both.{tag}", "op=clamp;lo=-1.3;hi=0.7", torch.clamp(x, min=-1.3, max=0.7), x)
    add_case(f"clamp.lo.{tag}", "op=clamp;lo=0.25", torch.clamp(x, min=0.25), x)
    add_case(f"clamp.hi.{tag}", "op=clamp;hi=-0.5", torch.clamp(x, max=-0.5), x)
xi = torch.randint(-50, 50, (4, 9), dtype=torch.int64)
add_case("clamp.both.i64", "op=clamp;lo=-10;hi=20", torch.clamp(xi, min=-10, max=20), xi)
add_case("clamp.frac.i64", "op=clamp;lo=-10.5", torch.clamp(xi, min=-10.5), xi)

# ---- pow with a scalar exponent (torch's shortcuts for 2, 3, 0.5, -0.5, -1, -2 and the general case)
for tag, dt in FLOAT_DTYPES.items():
    x = uniform((3, 21), 0.05, 4).to(dt)
    for e in [2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.7, 0.0]:
        add_case(f"pow_scalar.{e}.{tag}", f"op=pow_scalar;exponent={e!r}", torch.pow(x, e), x)
xi = torch.randint(0, 5, (2, 7), dtype=torch.int32)
add_case("pow_scalar.int.i32", "op=pow_scalar;exponent=2.0", torch.pow(xi, 2.0), xi)

# ---- binary ops with broadcasting: [5, 1, 33] with [4, 33] -> [5, 4, 33]
binary = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
    "minimum": torch.minimum, "pow": torch.pow, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge,
}
for op, fn in binary.items():
    for tag, dt in FLOAT_DTYPES.items():
        if op == "pow":
            a = uniform((5, 1, 33), 0.1, 3).to(dt)
            b = uniform((4, 33), -2, 2).to(dt)
        else:
            a = with_specials(uniform((5, 1, 33), -3, 3), [NAN, 1.0, INF]).to(dt)
            b = with_specials(uniform((4, 33), -3, 3), [1.0, NAN, 1.0, INF]).to(dt)
            if op in ("eq", "ne", "le", "ge"):
                b[1, 5:20] = a[0, 0, 5:20]  # some equal pairs
        add_case(f"binary.{op}.{tag}", f"op={op}", fn(a, b), a, b)
    # integers (div promotes to float32)
    a = torch.randint(-20, 20, (5, 1, 13), dtype=torch.int32)
    b = torch.randint(-20, 20, (4, 13), dtype=torch.int32)
    if op == "div":
        b[b == 0] = 3
    if op == "pow":
        a = torch.randint(-3, 4, (5, 1, 13), dtype=torch.int32)
        b = torch.randint(0, 6, (4, 13), dtype=torch.int32)
    add_case(f"binary.{op}.i32", f"op={op}", fn(a, b), a, b)
    add_case(f"binary.{op}.i64", f"op={op}", fn(a.long(), b.long()), a.long(), b.long())

# int64 pow with overflow wraps around like torch.
a = torch.tensor([3, -7, 2, 10], dtype=torch.int64)
b = torch.tensor([40, 31, 63, 25], dtype=torch.int64)
add_case("binary.pow.wrap_i64", "op=pow", torch.pow(a, b), a, b)
# f64
a64, b64 = uniform((3, 1, 5), -2, 2), uniform((4, 5), -2, 2)
for op in ["add", "sub", "mul", "div", "maximum", "lt"]:
    add_case(f"binary.{op}.f64", f"op={op}", binary[op](a64, b64), a64, b64)

# promotion
a = uniform((3, 17), -2, 2)
mixed = {
    "bf16_f16": (a.bfloat16(), uniform((17,), -2, 2).half()),             # -> float32
    "bf16_f32": (a.bfloat16(), uniform((3, 1), -2, 2).float()),           # -> float32
    "i32_f32": (torch.randint(-9, 9, (3, 17), dtype=torch.int32), a.float()),  # -> float32
    "i64_bf16": (torch.randint(-9, 9, (17,), dtype=torch.int64), a.bfloat16()),  # -> bfloat16
    "bool_f16": (torch.rand(3, 17) > 0.5, a.half()),                      # -> float16
    "i32_i64": (torch.randint(-9, 9, (3, 17), dtype=torch.int32), torch.randint(-9, 9, (17,), dtype=torch.int64)),
    "u8_i8": (torch.randint(0, 200, (3, 17), dtype=torch.uint8), torch.randint(-100, 100, (17,), dtype=torch.int8)),
    "f32_f64": (a.float(), uniform((17,), -2, 2)),
}
for tag, (x, y) in mixed.items():
    for op in ["add", "mul", "sub", "lt", "maximum"]:
        if op == "sub" and x.dtype == torch.bool:
            continue
        add_case(f"promote.{op}.{tag}", f"op={op}", binary[op](x, y), x, y)
    add_case(f"promote.div.{tag}", "op=div", torch.div(x, y), x, y)
ba, bb = torch.rand(4, 6) > 0.5, torch.rand(6) > 0.5
for op in ["add", "mul", "maximum", "minimum", "eq", "lt"]:
    add_case(f"promote.{op}.bool", f"op={op}", binary[op](ba, bb), ba, bb)
add_case("promote.div.bool", "op=div", torch.div(ba, bb), ba, bb)

# ---- scalar operands: the scalar rounds like torch's (add/sub in the tensor's dtype; mul/div exact in float32)
for tag, dt in {**FLOAT_DTYPES, "f64": torch.float64, "i32": torch.int32, "bool": torch.bool}.items():
    if dt == torch.int32:
        x = torch.randint(-10, 10, (6, 23), dtype=dt)
    elif dt == torch.bool:
        x = torch.rand(6, 23) > 0.5
    else:
        x = with_specials(uniform((6, 23), -4, 4), [0.0, 0.30078125]).to(dt)
    for op, s in [("add", 0.1), ("sub", 1.7), ("mul", 1.7), ("div", 3.3), ("lt", 0.301), ("ge", -0.7), ("eq", 0.3),
                  ("ne", 0.3), ("gt", 0.301), ("le", -0.7)]:
        if op == "sub" and dt == torch.bool:
            continue
        add_case(f"scalar.{op}.{tag}", f"op={op};scalar={s!r}", binary[op](x, s), x)
    if dt != torch.bool:
        add_case(f"scalar.rsub.{tag}", "op=sub;scalar=2.5;scalar_first=1", 2.5 - x, x)
    xs = x if dt == torch.bool else torch.where(x == 0, torch.ones_like(x), x)
    # torch computes s / x as reciprocal(x) * s (two roundings); Kiln divides once (tolerance in the test).
    add_case(f"scalar.rdiv.{tag}", "op=div;scalar=3.0;scalar_first=1",
             (3.0 / xs.double()).to(torch.result_type(xs, 3.0)), xs)
    add_case(f"scalar.radd.{tag}", "op=add;scalar=0.1;scalar_first=1", 0.1 + x, x)
    add_case(f"scalar.rmul.{tag}", "op=mul;scalar=-2.25;scalar_first=1", -2.25 * x, x)

# ---- where with three-way broadcasting and promotion
cond = torch.rand(4, 1, 9) > 0.4
for tag, (x, y) in {
    "f32": (uniform((3, 9), -1, 1).float(), uniform((4, 3, 1), -1, 1).float()),
    "bf16": (uniform((3, 9), -1, 1).bfloat16(), uniform((4, 3, 1), -1, 1).bfloat16()),
    "f16": (uniform((3, 9), -1, 1).half(), uniform((4, 3, 1), -1, 1).half()),
    "bf16_f32": (uniform((3, 9), -1, 1).bfloat16(), uniform((4, 3, 1), -1, 1).float()),
    "i64": (torch.randint(-9, 9, (3, 9)), torch.randint(-9, 9, (4, 3, 1))),
    "bool": (torch.rand(3, 9) > 0.5, torch.rand(4, 3, 1) > 0.5),
}.items():
    add_case(f"where.{tag}", "op=where", torch.where(cond, x, y), x, y, cond)

# ---- non-contiguous operands: transposed and strided views of a
for tag, dt in FLOAT_DTYPES.items():
    a = uniform((37, 20), -3, 3).to(dt)  # viewed as a.t(): [20, 37]
    b = uniform((37,), -1, 1).to(dt)
    add_case(f"view.add_t.{tag}", "op=add;a_view=t", a.t() + b, a, b)
    add_case(f"view.gelu_tanh_t.{tag}", "op=gelu_tanh;a_view=t",
             torch.nn.functional.gelu(a.t(), approximate="tanh"), a)
    s = uniform((9, 66), -3, 3).to(dt)  # viewed as s[:, ::2]: [9, 33]
    scale = uniform((9, 1), -2, 2).to(dt)
    add_case(f"view.mul_s2.{tag}", "op=mul;a_view=s2", s[:, ::2] * scale, s, scale)
    add_case(f"view.silu_s2.{tag}", "op=silu;a_view=s2", torch.nn.functional.silu(s[:, ::2]), s)

os.makedirs(os.path.dirname(OUT), exist_ok=True)
save_file(tensors, OUT, metadata=specs)
print(f"wrote {len(specs)} cases, {sum(t.numel() * t.element_size() for t in tensors.values())} bytes to {OUT}")
