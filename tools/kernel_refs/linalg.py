"""Reference data for kiln's linear, matmul and conv2d (tests/ops/linalg_test.cpp).

Writes tests/data/kernels/linalg.safetensors: for each case `<case>.<input>` tensors and `<case>.expected`,
computed by PyTorch on CPU in the case's dtype. bf16 linear cases also store `<case>.exact`: the product of
the same bf16 inputs computed in float64 and rounded once to bf16, which a kernel that accumulates and adds
the bias in float32 must match to within one bf16 ulp.

Layout variants (transposed, permuted, sliced, expanded) are built by the C++ test from the stored tensors,
so each case stores the tensors as laid out in memory and says in its name what view the test takes.

Run from the repository root: python3 tools/kernel_refs/linalg.py
"""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(20261129)
out = {}


def rnd(*shape, scale=1.0):
    return torch.randn(*shape, dtype=torch.float64) * scale


def put(case, **tensors):
    for name, t in tensors.items():
        out[f"{case}.{name}"] = t.contiguous().clone()


# ---- linear: x [..., K] @ weight[N, K]^T + bias
def linear_case(case, x_shape, n, dtype, bias=True, bias_dtype=None):
    k = x_shape[-1]
    x = rnd(*x_shape).to(dtype)
    w = rnd(n, k, scale=k ** -0.5).to(dtype)
    b = rnd(n).to(bias_dtype or dtype) if bias else None
    if b is not None and b.dtype != dtype:
        # torch refuses mixed dtypes; the reference adds the float32 bias to the float32 accumulation.
        expected = (F.linear(x.float(), w.float()) + b.float()).to(dtype)
    else:
        expected = F.linear(x, w, b)
    tensors = dict(x=x, weight=w, expected=expected)
    if b is not None:
        tensors["bias"] = b
    if dtype == torch.bfloat16:
        exact = F.linear(x.double(), w.double(), None if b is None else b.double())
        tensors["exact"] = exact.to(dtype)
    put(case, **tensors)


for dt, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16"), (torch.float16, "f16")]:
    linear_case(f"linear_{tag}_m7", (7, 40), 23, dt)
    linear_case(f"linear_{tag}_m1_nobias", (1, 33), 17, dt, bias=False)
    linear_case(f"linear_{tag}_3d", (3, 11, 40), 23, dt)
    linear_case(f"linear_{tag}_1d", (40,), 23, dt)
    linear_case(f"linear_{tag}_m11_k200", (11, 200), 37, dt)
linear_case("linear_bf16_f32bias", (33, 40), 23, torch.bfloat16, bias_dtype=torch.float32)
# K large enough for the kernels to split K into several blocks, N not a multiple of 16.
linear_case("linear_bf16_k600", (3, 600), 9, torch.bfloat16)
linear_case("linear_f32_k600", (3, 600), 9, torch.float32)

# Non-contiguous x / weight: stored transposed or wider; the test takes the view named in the case.
for dt, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
    xt = rnd(40, 33).to(dt)  # test uses x = xt.transpose(0, 1): column-major [33, 40]
    w = rnd(23, 40, scale=40 ** -0.5).to(dt)
    put(f"linear_{tag}_xT", xt=xt, weight=w, expected=F.linear(xt.t(), w))
    xw = rnd(33, 60).to(dt)  # test uses x = xw[:, 10:50]: row stride 60
    put(f"linear_{tag}_xslice", xw=xw, weight=w, expected=F.linear(xw[:, 10:50], w))
    wt = rnd(40, 23, scale=40 ** -0.5).to(dt)  # test uses weight = wt.transpose(0, 1)
    x = rnd(7, 40).to(dt)
    b = rnd(23).to(dt)
    put(f"linear_{tag}_wT", x=x, wt=wt, bias=b, expected=F.linear(x, wt.t(), b))
    x4 = rnd(3, 5, 2, 40).to(dt)  # test uses x = x4.permute(1, 0, 2, 3): not viewable as [M, K]
    put(f"linear_{tag}_xperm", x4=x4, weight=w, expected=F.linear(x4.permute(1, 0, 2, 3), w))


# ---- matmul
def matmul_case(case, a_shape, b_shape, dtype):
    a = rnd(*a_shape).to(dtype)
    b = rnd(*b_shape, scale=a_shape[-1] ** -0.5).to(dtype)
    put(case, a=a, b=b, expected=torch.matmul(a, b))


for dt, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16"), (torch.float16, "f16")]:
    matmul_case(f"matmul_{tag}_2d", (7, 70), (70, 45), dt)
    matmul_case(f"matmul_{tag}_bcast", (2, 1, 7, 33), (3, 33, 20), dt)
    matmul_case(f"matmul_{tag}_vec_mat", (33,), (2, 33, 5), dt)
    matmul_case(f"matmul_{tag}_mat_vec", (4, 7, 33), (33,), dt)
    matmul_case(f"matmul_{tag}_dot", (33,), (33,), dt)
matmul_case("matmul_f32_m1", (1, 129), (129, 19), torch.float32)

# Attention-shaped: q, k, v stored as [B, S, H, D]; test permutes to [B, H, S, D] and uses k^T views.
for dt, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
    q = rnd(2, 17, 2, 16).to(dt)
    k = rnd(2, 19, 2, 16).to(dt)
    v = rnd(2, 19, 2, 24).to(dt)
    qh, kh, vh = (t.permute(0, 2, 1, 3) for t in (q, k, v))
    scores = torch.matmul(qh, kh.transpose(-1, -2))
    put(f"attn_{tag}", q=q, k=k, v=v, scores=scores, pv=torch.matmul(scores, vh))
    # b expanded (stride 0) over the batch: the test expands b [33, 20] to [4, 33, 20].
    a = rnd(4, 7, 33).to(dt)
    b = rnd(33, 20, scale=33 ** -0.5).to(dt)
    put(f"matmul_{tag}_expanded", a=a, b=b, expected=torch.matmul(a, b.expand(4, 33, 20)))


# ---- conv2d
def conv_case(case, x_shape, w_shape, dtype, bias=True, stride=1, padding=0, dilation=1, groups=1):
    x = rnd(*x_shape).to(dtype)
    fan_in = w_shape[1] * w_shape[2] * w_shape[3]
    w = rnd(*w_shape, scale=fan_in ** -0.5).to(dtype)
    b = rnd(w_shape[0]).to(dtype) if bias else None
    y = F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    tensors = dict(x=x, weight=w, expected=y)
    if b is not None:
        tensors["bias"] = b
    put(case, **tensors)


for dt, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16"), (torch.float16, "f16")]:
    conv_case(f"conv_{tag}_3x3", (2, 5, 9, 11), (7, 5, 3, 3), dt, padding=1)
    conv_case(f"conv_{tag}_1x1_nobias", (1, 8, 6, 7), (4, 8, 1, 1), dt, bias=False)
    conv_case(f"conv_{tag}_stride2", (1, 4, 9, 10), (6, 4, 3, 3), dt, stride=2, padding=1)
    conv_case(f"conv_{tag}_groups", (1, 6, 8, 8), (4, 3, 3, 3), dt, padding=1, groups=2)
conv_case("conv_f32_dilation", (1, 3, 10, 10), (2, 3, 3, 3), torch.float32, padding=2, dilation=2)
conv_case("conv_f32_asym", (1, 3, 7, 12), (5, 3, 3, 1), torch.float32, stride=(2, 3), padding=(1, 0))
conv_case("conv_f32_depthwise", (1, 8, 7, 7), (8, 1, 3, 3), torch.float32, padding=1, groups=8)
# Non-contiguous x: stored NHWC, the test permutes it to NCHW.
xh = rnd(2, 8, 8, 5)
w = rnd(6, 5, 3, 3, scale=45 ** -0.5)
b = rnd(6)
put("conv_f32_nhwc", x_nhwc=xh.float(), weight=w.float(), bias=b.float(),
    expected=F.conv2d(xh.float().permute(0, 3, 1, 2), w.float(), b.float(), padding=1))

path = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "kernels", "linalg.safetensors")
os.makedirs(os.path.dirname(path), exist_ok=True)
save_file(out, path)
print(f"wrote {len(out)} tensors, {os.path.getsize(path)} bytes to {os.path.normpath(path)}")
