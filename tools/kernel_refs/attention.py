"""Reference data for kiln's scaled_dot_product_attention (tests/ops/attention_test.cpp).

Writes tests/data/kernels/attention.safetensors. Input sets `<set>.q`, `<set>.k`, `<set>.v` hold values on
the bfloat16 grid (stored as bfloat16), so one set serves every dtype exactly: converted to float32 or float16
it is the same numbers. Biases are stored as `bias.<name>`. Each case `<case>` stores
  <case>.f32   torch's output for the inputs in float32 (also the high-precision reference for bf16/f16),
  <case>.bf16  torch's output for the inputs in bfloat16,
and the file metadata describes the case: metadata["cases"] lists them, metadata[<case>] is
"inputs=<set of q> kv=<set of k and v> scale=<float or default> causal=<0|1> bias=<name or none> f16=<0|1>"; f16=1 cases also
store <case>.f16, torch's float16 output.

Layout variants (heads split out of a [B, S, H, D] buffer, q/k/v sliced from a fused qkv buffer) are built by
the C++ test from the stored tensors, since layout does not change values.

Run from the repository root: python3 tools/kernel_refs/attention.py
"""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(20261130)
tensors = {}
metadata = {}
cases = []


def bf16_grid(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).to(torch.bfloat16)


def input_set(name, q_shape, k_shape=None, v_shape=None, q_scale=1.0):
    tensors[f"{name}.q"] = bf16_grid(*q_shape, scale=q_scale)
    if k_shape:
        tensors[f"{name}.k"] = bf16_grid(*k_shape)
        tensors[f"{name}.v"] = bf16_grid(*v_shape)


def bias(name, t):
    tensors[f"bias.{name}"] = t.contiguous()


def case(name, inputs, kv=None, scale=None, causal=False, bias_name=None, f16=False):
    kv = kv or inputs
    q, k, v = tensors[f"{inputs}.q"], tensors[f"{kv}.k"], tensors[f"{kv}.v"]
    m = tensors[f"bias.{bias_name}"] if bias_name else None

    def run(dtype):
        mask = None
        if m is not None:
            # torch takes a float mask in any float dtype; a bool mask stays bool.
            mask = m if m.dtype == torch.bool else m.to(dtype if m.dtype != torch.float32 else torch.float32)
        is_causal = causal
        if mask is not None and causal:
            # torch refuses a mask together with is_causal; kiln applies both, so fold the causal mask
            # (query i sees keys j <= i) into the additive one.
            keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
            mask = mask.masked_fill(~keep, float("-inf"))
            is_causal = False
        return F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=mask,
                                              is_causal=is_causal, scale=scale)

    tensors[f"{name}.f32"] = run(torch.float32).contiguous()
    tensors[f"{name}.bf16"] = run(torch.bfloat16).contiguous()
    if f16:
        tensors[f"{name}.f16"] = run(torch.float16).contiguous()
    metadata[name] = (f"inputs={inputs} kv={kv} scale={'default' if scale is None else repr(float(scale))} "
                      f"causal={int(causal)} bias={bias_name or 'none'} f16={int(f16)}")
    cases.append(name)


# Single query and key; a single query against 77 keys (decoder-like).
input_set("one", (1, 2, 1, 64), (1, 2, 1, 64), (1, 2, 1, 64))
input_set("q1", (1, 1, 1, 64))
# CLIP-like 77 tokens, D = 64.
input_set("clip", (1, 1, 77, 64), (1, 1, 77, 64), (1, 1, 77, 64))
# D = 128 with Sq != Skv.
input_set("d128", (1, 1, 20, 128), (1, 1, 33, 128), (1, 1, 33, 128))
# Several query tiles (64 rows by default; the test also runs smaller query and key tiles), Sq = 260 !=
# Skv = 300, D = 40 (not a multiple of 16), Dv = 24 != D.
# Queries scaled up so the row max moves between key tiles and the online rescale matters.
input_set("long", (1, 1, 260, 40), (1, 1, 300, 40), (1, 1, 300, 24), q_scale=2.0)
# An odd D = 5 (bfloat16 pairs need padding) and Dv = 3.
input_set("odd", (1, 1, 9, 5), (1, 1, 11, 5), (1, 1, 11, 3))
# Biases and masks: B = 2, H = 2, Sq = 33, Skv = 45, Dv = 16.
input_set("masked", (2, 2, 33, 64), (2, 2, 45, 64), (2, 2, 45, 16))

# T5-like position bias shared by the batch: [1, H, Sq, Skv], float32.
bias("position", torch.randn(1, 2, 33, 45) * 2.0)
# Key padding as an additive float mask [B, 1, 1, Skv] with -inf on the padded keys of batch 1.
pad = torch.zeros(2, 1, 1, 45)
pad[1, :, :, 30:] = float("-inf")
bias("padding", pad)
# The same padding as a bool mask (true = attend).
bias("keep", torch.isfinite(pad))
# A 2-d bfloat16 bias [Sq, Skv] broadcast over batch and heads, with one row fully masked (gives zeros).
b2 = torch.randn(33, 45).to(torch.bfloat16)
b2[5, :] = float("-inf")
bias("rows", b2)

case("one", "one")
case("q1", "q1", kv="clip")
case("clip", "clip", f16=True)
case("clip_causal", "clip", causal=True)
case("d128", "d128")
case("d128_causal_scale", "d128", causal=True, scale=0.3)
case("odd", "odd")
case("long", "long")
case("long_causal", "long", causal=True)
case("position", "masked", scale=1.0, bias_name="position")
case("padding", "masked", bias_name="padding")
case("keep", "masked", bias_name="keep")
case("rows_causal", "masked", causal=True, bias_name="rows", scale=0.2)

metadata["cases"] = ",".join(cases)
path = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "kernels", "attention.safetensors")
save_file(tensors, os.path.normpath(path), metadata=metadata)
print(f"wrote {os.path.normpath(path)}: {len(cases)} cases, {os.path.getsize(path)} bytes")
