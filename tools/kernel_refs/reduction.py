"""Reference data for kiln's reductions, softmax/norms and layout ops (tests/ops/{reduction,norm,layout}_test.cpp).

Writes tests/data/kernels/reduction.safetensors, norm.safetensors and layout.safetensors. Every case `<case>`
stores its operands (`<case>.input`, and where the op takes them `<case>.weight`, `.bias`, `.cos`, `.sin`,
`.ids`, `<case>.input0`, `.input1`, ...) and torch's result `<case>.expected`. The file metadata describes each
case: metadata["cases"] lists them (comma separated) and metadata[<case>] is a space-separated list of
key=value pairs: op=<name> plus the op's arguments (dims=0,2 keepdim=1 correction=1 dim=-1 eps=1e-6 ...).
`transpose=a,b` means the C++ test applies .transpose(a, b) to the stored input before the op, as torch did, to
exercise non-contiguous inputs (the stored tensor is contiguous).

The references come from the modules the ops mirror: torch.nn.functional, diffusers' RMSNorm and
apply_rotary_emb, transformers' T5LayerNorm and Mistral rotate_half.

Run from the repository root: python3 tools/kernel_refs/reduction.py
"""
import os

import torch
import torch.nn.functional as F
from diffusers.models.embeddings import apply_rotary_emb, get_1d_rotary_pos_embed
from diffusers.models.normalization import RMSNorm
from safetensors.torch import save_file
from transformers.models.mistral.modeling_mistral import MistralRMSNorm, rotate_half
from transformers.models.t5.modeling_t5 import T5LayerNorm

torch.manual_seed(20261201)
OUT = "tests/data/kernels"
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


class Writer:
    def __init__(self, name):
        self.name = name
        self.tensors = {}
        self.meta = {}
        self.cases = []

    def case(self, name, desc, expected, **operands):
        assert name not in self.meta, name
        self.cases.append(name)
        self.meta[name] = desc
        for key, t in operands.items():
            self.tensors[f"{name}.{key}"] = t.contiguous().clone()
        self.tensors[f"{name}.expected"] = expected.contiguous()

    def save(self):
        self.meta["cases"] = ",".join(self.cases)
        path = os.path.join(OUT, f"{self.name}.safetensors")
        save_file(self.tensors, path, metadata=self.meta)
        print(f"{path}: {len(self.cases)} cases, {os.path.getsize(path)} bytes")


def ints(values):
    return ",".join(str(v) for v in values)


# ---------------------------------------------------------------- reductions
red = Writer("reduction")
shapes = [
    # name, shape, dims, keepdim, transpose (applied to the stored tensor first)
    ("rows", (4, 37), [-1], False, None),
    ("rows_keep", (3, 5, 19), [2], True, None),
    ("cols", (70, 33), [0], True, None),
    ("middle", (3, 41, 5), [1], False, None),
    ("split_dims", (5, 3, 7), [0, 2], False, None),
    ("all", (3, 1, 515), [], False, None),
    ("size1", (1, 17, 1), [1], True, None),
    ("size1_reduced", (6, 1, 9), [1], False, None),
    ("transposed", (21, 9), [-1], False, (0, 1)),
    ("transposed_cols", (13, 18), [0], False, (0, 1)),
]
for sname, shape, dims, keepdim, tr in shapes:
    base = torch.randn(*shape) * 3 + 0.5
    for dname, dt in DTYPES.items():
        x = base.to(dt)
        xv = x.transpose(*tr) if tr else x
        d = dims if dims else list(range(xv.dim()))
        for op in ["sum", "mean", "max", "var"]:
            if op == "max":
                exp = xv.amax(dim=d, keepdim=keepdim)
            elif op == "var":
                exp = torch.var(xv, dim=d, keepdim=keepdim)
            else:
                exp = getattr(torch, op)(xv, dim=d, keepdim=keepdim)
            desc = f"op={op} dims={ints(dims)} keepdim={int(keepdim)} dtype={dname}"
            if tr:
                desc += f" transpose={ints(tr)}"
            red.case(f"{op}.{sname}.{dname}", desc, exp, input=x)
# correction 0 (population variance) and a large offset that a one-pass formula would lose.
x = torch.randn(6, 50) + 1000.0
red.case("var.offset.correction0.f32", "op=var dims=1 keepdim=0 correction=0 dtype=f32", torch.var(x, dim=1, correction=0), input=x)
x = torch.randn(4, 300) * 0.01 + 50.0
red.case("var.offset.cols.f32", "op=var dims=0 keepdim=0 correction=1 dtype=f32", torch.var(x, dim=0), input=x)
# NaN propagates through max; integers sum to int64.
x = torch.randn(3, 20)
x[1, 7] = float("nan")
red.case("max.nan.f32", "op=max dims=1 keepdim=0 dtype=f32", x.amax(dim=1), input=x)
x = torch.randint(-50, 50, (4, 9), dtype=torch.int32)
red.case("sum.int32", "op=sum dims=1 keepdim=0 dtype=i32", torch.sum(x, dim=1), input=x)
red.case("max.int32", "op=max dims=0 keepdim=0 dtype=i32", x.amax(dim=0), input=x)
red.save()

# ---------------------------------------------------------------- softmax and norms
norm = Writer("norm")
for dname, dt in DTYPES.items():
    x = (torch.randn(7, 77) * 4).to(dt)
    norm.case(f"softmax.rows.{dname}", f"op=softmax dim=-1 dtype={dname}", torch.softmax(x, -1), input=x)
    x = (torch.randn(3, 5, 9) * 2).to(dt)
    norm.case(f"softmax.dim1.{dname}", f"op=softmax dim=1 dtype={dname}", torch.softmax(x, 1), input=x)
    x = torch.randn(11, 6).to(dt)
    norm.case(f"softmax.transposed.{dname}", f"op=softmax dim=-1 transpose=0,1 dtype={dname}",
              torch.softmax(x.t(), -1), input=x)
x = torch.randn(4, 33) * 30
x[0, :5] = float("-inf")
x[2, 10:] = float("-inf")
norm.case("softmax.masked_large.f32", "op=softmax dim=-1 dtype=f32", torch.softmax(x, -1), input=x)
x = (torch.randn(33, 500) * 3).to(torch.bfloat16)  # above the parallel threshold
norm.case("softmax.parallel.bf16", "op=softmax dim=-1 dtype=bf16", torch.softmax(x, -1), input=x)

for dname, dt in DTYPES.items():
    x = (torch.randn(6, 130) * 2 + 1).to(dt)
    w = (torch.randn(130) * 0.5 + 1).to(dt)
    b = (torch.randn(130) * 0.1).to(dt)
    norm.case(f"layer_norm.affine.{dname}", f"op=layer_norm normalized_dims=1 eps=1e-5 dtype={dname}",
              F.layer_norm(x, (130,), w, b, 1e-5), input=x, weight=w, bias=b)
    norm.case(f"layer_norm.plain.{dname}", f"op=layer_norm normalized_dims=1 eps=1e-6 dtype={dname}",
              F.layer_norm(x, (130,), None, None, 1e-6), input=x)
x = torch.randn(4, 3, 20) + 300.0  # two normalised dims, and a mean far from zero
w = torch.randn(3, 20)
# float32 x near 300 carries ~1.5e-5 of rounding into x - mean in any float32 implementation (torch's own result
# is 6e-5 from float64's), hence the wider atol for this case.
norm.case("layer_norm.two_dims_offset.f32", "op=layer_norm normalized_dims=2 eps=1e-5 dtype=f32 atol=2e-4",
          F.layer_norm(x, (3, 20), w, None, 1e-5), input=x, weight=w)
x = torch.randn(5, 1, 48).to(torch.bfloat16)
w = torch.randn(48) * 0.3 + 1
b = torch.randn(48) * 0.2
norm.case("layer_norm.mixed_params.bf16", "op=layer_norm normalized_dims=1 eps=1e-6 dtype=bf16",
          F.layer_norm(x, (48,), w, b, 1e-6), input=x, weight=w, bias=b)
x = torch.randn(20, 9).to(torch.bfloat16)
norm.case("layer_norm.transposed.bf16", "op=layer_norm normalized_dims=1 eps=1e-6 transpose=0,1 dtype=bf16",
          F.layer_norm(x.t(), (20,), None, None, 1e-6), input=x)
x = (torch.randn(33, 500) * 2).to(torch.bfloat16)
norm.case("layer_norm.parallel.bf16", "op=layer_norm normalized_dims=1 eps=1e-6 dtype=bf16",
          F.layer_norm(x, (500,), None, None, 1e-6), input=x)


def diffusers_rms(x, w, eps):
    m = RMSNorm(x.shape[-1], eps=eps, elementwise_affine=w is not None)
    if w is not None:
        m.weight = torch.nn.Parameter(w, requires_grad=False)
    with torch.no_grad():
        return m(x)


def mistral_rms(x, w, eps):
    m = MistralRMSNorm(x.shape[-1], eps=eps)
    m.weight = torch.nn.Parameter(w, requires_grad=False)
    with torch.no_grad():
        return m(x)


for xn in DTYPES:
    for wn in list(DTYPES) + ["none"]:
        x = (torch.randn(5, 70) * 3).to(DTYPES[xn])
        w = None if wn == "none" else (torch.randn(70) * 0.5 + 1).to(DTYPES[wn])
        ops = {"input": x} if w is None else {"input": x, "weight": w}
        norm.case(f"rms_norm.diffusers.x{xn}.w{wn}", f"op=rms_norm style=diffusers eps=1e-6 dtype={xn}",
                  diffusers_rms(x, w, 1e-6), **ops)
        if w is not None:
            norm.case(f"rms_norm.llama.x{xn}.w{wn}", f"op=rms_norm style=llama eps=1e-5 dtype={xn}",
                      mistral_rms(x, w, 1e-5), **ops)
# T5LayerNorm is the diffusers rule: check kiln's Diffusers style against transformers' own module.
x = (torch.randn(6, 64) * 2).to(torch.bfloat16)
w = (torch.randn(64) * 0.3 + 1).to(torch.bfloat16)
t5 = T5LayerNorm(64, eps=1e-6)
t5.weight = torch.nn.Parameter(w, requires_grad=False)
with torch.no_grad():
    norm.case("rms_norm.t5.bf16", "op=rms_norm style=diffusers eps=1e-6 dtype=bf16", t5(x), input=x, weight=w)
x = (torch.randn(2, 2, 33, 128)).to(torch.bfloat16)  # qk-norm shape: many 128-wide rows, parallel path
w = (torch.randn(128) * 0.2 + 1).to(torch.bfloat16)
norm.case("rms_norm.heads.bf16", "op=rms_norm style=diffusers eps=1e-6 dtype=bf16", diffusers_rms(x, w, 1e-6),
          input=x, weight=w)
x = torch.randn(10, 3, 24)
w = torch.randn(10) * 0.3 + 1
norm.case("rms_norm.transposed.f32", "op=rms_norm style=diffusers eps=1e-6 transpose=0,2 dtype=f32",
          diffusers_rms(x.transpose(0, 2), w, 1e-6), input=x, weight=w)

for dname, dt in DTYPES.items():
    x = (torch.randn(2, 8, 5, 7) * 2 + 0.5).to(dt)
    w = (torch.randn(8) * 0.5 + 1).to(dt)
    b = (torch.randn(8) * 0.1).to(dt)
    norm.case(f"group_norm.affine.{dname}", f"op=group_norm groups=4 eps=1e-6 dtype={dname}",
              F.group_norm(x, 4, w, b, 1e-6), input=x, weight=w, bias=b)
x = torch.randn(1, 6, 3) + 20.0
norm.case("group_norm.plain_rank3.f32", "op=group_norm groups=3 eps=1e-5 dtype=f32", F.group_norm(x, 3, None, None, 1e-5),
          input=x)
x = torch.randn(2, 32, 12, 13).to(torch.bfloat16)  # VAE-like: 32 groups, parallel path
w = torch.randn(32) * 0.5 + 1
b = torch.randn(32) * 0.1
norm.case("group_norm.vae.bf16", "op=group_norm groups=32 eps=1e-6 dtype=bf16", F.group_norm(x, 32, w, b, 1e-6),
          input=x, weight=w, bias=b)
norm.save()

# ---------------------------------------------------------------- layout
lay = Writer("layout")
for dname, dt in DTYPES.items():
    a, b, c = (torch.randn(2, 3, 4).to(dt), torch.randn(2, 5, 4).to(dt), torch.randn(2, 1, 4).to(dt))
    lay.case(f"concat.dim1.{dname}", f"op=concat dim=1 count=3 dtype={dname}", torch.cat([a, b, c], 1),
             input0=a, input1=b, input2=c)
a, b = torch.randn(3, 7), torch.randn(2, 7).to(torch.bfloat16)
lay.case("concat.promote.dim0", "op=concat dim=0 count=2", torch.cat([a, b], 0), input0=a, input1=b)
a, b = torch.randn(4, 2, 3).to(torch.bfloat16), torch.randn(4, 2, 5).to(torch.bfloat16)
lay.case("concat.last.bf16", "op=concat dim=-1 count=2", torch.cat([a, b], -1), input0=a, input1=b)
a, b = torch.randn(6, 5), torch.randn(6, 5)
lay.case("stack.dim1", "op=stack dim=1 count=2", torch.stack([a, b], 1), input0=a, input1=b)
lay.case("stack.last", "op=stack dim=-1 count=2", torch.stack([a, b], -1), input0=a, input1=b)

w = torch.randn(50, 12).to(torch.bfloat16)
ids = torch.randint(0, 50, (3, 7))
lay.case("embedding.int64.bf16", "op=embedding", F.embedding(ids, w), weight=w, ids=ids)
w = torch.randn(9, 5)
ids = torch.tensor([0, 8, 3, 3], dtype=torch.int32)
lay.case("embedding.int32.f32", "op=embedding", F.embedding(ids, w), weight=w, ids=ids)

x = torch.randn(2, 3, 5, 7)
for s in [2, 3]:
    lay.case(f"upsample.scale{s}", f"op=upsample scale={s}", F.interpolate(x, scale_factor=float(s), mode="nearest"),
             input=x)
for (h, wd) in [(11, 13), (4, 3), (5, 14)]:
    lay.case(f"upsample.size{h}x{wd}", f"op=upsample size={h},{wd}", F.interpolate(x, size=(h, wd), mode="nearest"),
             input=x)
xb = torch.randn(1, 4, 6, 6).to(torch.bfloat16)
lay.case("upsample.scale2.bf16", "op=upsample scale=2", F.interpolate(xb, scale_factor=2.0, mode="nearest"), input=xb)


def flux_freqs(positions, dim, theta=10000):
    # FluxPosEmbed for one axis: interleaved (repeat_interleave_real=True) float32 cos/sin [S, dim].
    cos, sin = get_1d_rotary_pos_embed(dim, positions, theta=theta, repeat_interleave_real=True, use_real=True,
                                       freqs_dtype=torch.float64)
    return cos.float(), sin.float()


def half_freqs(seq, dim, theta=1000000.0):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    f = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


for dname, dt in DTYPES.items():
    for d in [24, 128]:
        s = 10
        cos, sin = flux_freqs(torch.arange(s, dtype=torch.float64) * 1.5, d)
        x = torch.randn(2, 3, s, d).to(dt) if d < 100 else torch.randn(1, 2, s, d).to(dt)
        lay.case(f"rope.interleaved.d{d}.{dname}", f"op=rope style=interleaved dtype={dname}",
                 apply_rotary_emb(x, (cos, sin)), input=x, cos=cos, sin=sin)
        cos, sin = half_freqs(s, d)
        ref = (x.float() * cos + rotate_half(x.float()) * sin).to(dt)
        lay.case(f"rope.rotate_half.d{d}.{dname}", f"op=rope style=rotate_half dtype={dname}", ref, input=x, cos=cos,
                 sin=sin)
# x split out of a [B, S, H, D] projection: the kernel reads the strided view directly.
s, d = 9, 40
cos, sin = flux_freqs(torch.arange(s, dtype=torch.float64), d)
x = torch.randn(2, s, 3, d).to(torch.bfloat16)
lay.case("rope.interleaved.strided.bf16", "op=rope style=interleaved transpose=1,2",
         apply_rotary_emb(x.transpose(1, 2), (cos, sin)), input=x, cos=cos, sin=sin)
x = torch.randn(s, d)
lay.case("rope.rotate_half.rank2.f32", "op=rope style=rotate_half",
         x * half_freqs(s, d)[0] + rotate_half(x) * half_freqs(s, d)[1], input=x, cos=half_freqs(s, d)[0],
         sin=half_freqs(s, d)[1])
lay.save()
