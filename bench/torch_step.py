"""PyTorch's side of scripts/device_check.sh: one transformer step of the shapes bench/device_step.cpp times in
Kiln, in plain torch modules (the GPU machines have torch but not diffusers), eager and under torch.compile.

  flux  FLUX.1-shaped: width 3072 = 24 heads x 128, 1 double-stream + 1 single-stream block, guidance
        embedding, bf16, size x size pixels ((size/16)^2 image tokens), 512 text tokens, batch 1
  sd3   SD3.5-Medium-shaped: width 1536 = 24 heads x 64, 2 joint blocks (block 0 with the second attention,
        the last one context-pre-only), QK RMSNorm, bf16, size x size, 333 text tokens, CFG batch 2

The layers and their widths follow diffusers' FluxTransformer2DModel and SD3Transformer2DModel (the matmuls,
norms, modulation, RoPE and attention a step runs); the weights are random, as Kiln's. Prints
  DEVICE <name>
  RESULT torch <model> <eager|compile> <best ms over reps> first=<ms of the first call>
  MEMORY torch <model> <eager|compile> activations=<the most torch allocated during the timed calls, above
         what it held before them> (CUDA only: torch.cuda.max_memory_allocated)
Usage: python3 bench/torch_step.py <flux|sd3> [--device cuda] [--reps 5] [--size 1024] [--modes eager,compile]
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import nn


def rms(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * weight


def layer_norm(x):
    return F.layer_norm(x, x.shape[-1:], eps=1e-6)


def timestep_embedding(t, dim=256):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def mlp(d_in, d):
    return nn.Sequential(nn.Linear(d_in, d), nn.SiLU(), nn.Linear(d, d))


class Attention(nn.Module):
    """q, k, v projections with RMSNorm on q and k; `added` adds the text stream's own projections."""

    def __init__(self, d, heads, added, out=True, added_out=True):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.norm_q = nn.Parameter(torch.ones(d // heads))
        self.norm_k = nn.Parameter(torch.ones(d // heads))
        self.out = nn.Linear(d, d) if out else None
        if added:
            self.aq, self.ak, self.av = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
            self.norm_aq = nn.Parameter(torch.ones(d // heads))
            self.norm_ak = nn.Parameter(torch.ones(d // heads))
            self.aout = nn.Linear(d, d) if added_out else None
        self.added = added

    def split(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, -1).transpose(1, 2)

    def forward(self, x, ctx=None, rope=None):
        q, k, v = rms(self.split(self.q(x)), self.norm_q), rms(self.split(self.k(x)), self.norm_k), self.split(self.v(x))
        if self.added:
            aq = rms(self.split(self.aq(ctx)), self.norm_aq)
            ak = rms(self.split(self.ak(ctx)), self.norm_ak)
            q, k, v = torch.cat([aq, q], 2), torch.cat([ak, k], 2), torch.cat([self.split(self.av(ctx)), v], 2)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        if not self.added:
            return self.out(o) if self.out is not None else o
        L = ctx.shape[1]
        c, x = o[:, :L], o[:, L:]
        return self.out(x), (self.aout(c) if self.aout is not None else c)


def flux_rope(ids, dims=(16, 56, 56), theta=10000.0):
    cos, sin = [], []
    for i, d in enumerate(dims):
        freqs = 1.0 / theta ** (torch.arange(0, d, 2, device=ids.device, dtype=torch.float64) / d)
        angles = ids[:, i].double()[:, None] * freqs[None]
        cos.append(angles.cos().repeat_interleave(2, -1))
        sin.append(angles.sin().repeat_interleave(2, -1))
    return torch.cat(cos, -1).float(), torch.cat(sin, -1).float()


def apply_rope(x, rope):
    cos, sin = rope
    pairs = x.float().unflatten(-1, (-1, 2))
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2)
    return (x.float() * cos + rotated * sin).to(x.dtype)


def feed_forward(d):
    return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))


class FluxDouble(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.norm1, self.norm1_ctx = nn.Linear(d, 6 * d), nn.Linear(d, 6 * d)
        self.attn = Attention(d, heads, added=True)
        self.ff, self.ff_ctx = feed_forward(d), feed_forward(d)

    def forward(self, x, ctx, temb, rope):
        e = self.norm1(F.silu(temb))[:, None].chunk(6, -1)
        c = self.norm1_ctx(F.silu(temb))[:, None].chunk(6, -1)
        a, ca = self.attn(layer_norm(x) * (1 + e[1]) + e[0], layer_norm(ctx) * (1 + c[1]) + c[0], rope)
        x = x + e[2] * a
        x = x + e[5] * self.ff(layer_norm(x) * (1 + e[4]) + e[3])
        ctx = ctx + c[2] * ca
        ctx = ctx + c[5] * self.ff_ctx(layer_norm(ctx) * (1 + c[4]) + c[3])
        return x, ctx


class FluxSingle(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.norm = nn.Linear(d, 3 * d)
        self.proj_mlp = nn.Linear(d, 4 * d)
        self.attn = Attention(d, heads, added=False, out=False)
        self.proj_out = nn.Linear(5 * d, d)

    def forward(self, x, temb, rope):
        shift, scale, gate = self.norm(F.silu(temb))[:, None].chunk(3, -1)
        h = layer_norm(x) * (1 + scale) + shift
        out = self.proj_out(torch.cat([self.attn(h, rope=rope), F.gelu(self.proj_mlp(h), approximate="tanh")], -1))
        return x + gate * out


class Flux(nn.Module):
    def __init__(self, d=3072, heads=24):
        super().__init__()
        self.x_embedder, self.context_embedder = nn.Linear(64, d), nn.Linear(4096, d)
        self.time, self.guidance, self.text = mlp(256, d), mlp(256, d), mlp(768, d)
        self.double_block, self.single_block = FluxDouble(d, heads), FluxSingle(d, heads)
        self.norm_out, self.proj_out = nn.Linear(d, 2 * d), nn.Linear(d, 64)

    def forward(self, hidden, text, pooled, t, guidance, ids):
        temb = self.time(timestep_embedding(t * 1000).to(hidden.dtype))
        temb = temb + self.guidance(timestep_embedding(guidance * 1000).to(hidden.dtype)) + self.text(pooled)
        rope = flux_rope(ids)
        x, ctx = self.x_embedder(hidden), self.context_embedder(text)
        x, ctx = self.double_block(x, ctx, temb, rope)
        x = self.single_block(torch.cat([ctx, x], 1), temb, rope)[:, ctx.shape[1]:]
        scale, shift = self.norm_out(F.silu(temb))[:, None].chunk(2, -1)
        return self.proj_out(layer_norm(x) * (1 + scale) + shift)


class SD3Joint(nn.Module):
    def __init__(self, d, heads, dual, pre_only):
        super().__init__()
        self.dual, self.pre_only = dual, pre_only
        self.norm1 = nn.Linear(d, (9 if dual else 6) * d)
        self.norm1_ctx = nn.Linear(d, (2 if pre_only else 6) * d)
        self.attn = Attention(d, heads, added=True, added_out=not pre_only)
        self.attn2 = Attention(d, heads, added=False) if dual else None
        self.ff = feed_forward(d)
        self.ff_ctx = None if pre_only else feed_forward(d)

    def forward(self, x, ctx, temb):
        e = self.norm1(F.silu(temb))[:, None].chunk(9 if self.dual else 6, -1)
        c = self.norm1_ctx(F.silu(temb))[:, None].chunk(2 if self.pre_only else 6, -1)
        nx = layer_norm(x)
        nc = layer_norm(ctx) * (1 + c[1]) + c[0] if not self.pre_only else layer_norm(ctx) * (1 + c[0]) + c[1]
        a, ca = self.attn(nx * (1 + e[1]) + e[0], nc)
        x = x + e[2] * a
        if self.dual:
            x = x + e[8] * self.attn2(nx * (1 + e[7]) + e[6])
        x = x + e[5] * self.ff(layer_norm(x) * (1 + e[4]) + e[3])
        if self.pre_only:
            return x, None
        ctx = ctx + c[2] * ca
        ctx = ctx + c[5] * self.ff_ctx(layer_norm(ctx) * (1 + c[4]) + c[3])
        return x, ctx


class SD3(nn.Module):
    def __init__(self, d=1536, heads=24, layers=2, max_patches=384):
        super().__init__()
        self.patch = nn.Conv2d(16, d, 2, stride=2)
        self.pos = nn.Parameter(torch.zeros(1, max_patches, max_patches, d))
        self.context_embedder = nn.Linear(4096, d)
        self.time, self.text = mlp(256, d), mlp(2048, d)
        self.blocks = nn.ModuleList(SD3Joint(d, heads, i == 0, i == layers - 1) for i in range(layers))
        self.norm_out, self.proj_out = nn.Linear(d, 2 * d), nn.Linear(d, 2 * 2 * 16)

    def forward(self, latents, text, pooled, t):
        b, _, h, w = latents.shape
        gh, gw = h // 2, w // 2
        top, left = (self.pos.shape[1] - gh) // 2, (self.pos.shape[2] - gw) // 2
        x = self.patch(latents).flatten(2).transpose(1, 2) + self.pos[:, top:top + gh, left:left + gw].flatten(1, 2)
        temb = self.time(timestep_embedding(t).to(latents.dtype)) + self.text(pooled)
        ctx = self.context_embedder(text)
        for block in self.blocks:
            x, ctx = block(x, ctx, temb)
        scale, shift = self.norm_out(F.silu(temb))[:, None].chunk(2, -1)
        x = self.proj_out(layer_norm(x) * (1 + scale) + shift)
        return x.view(b, gh, gw, 2, 2, 16).permute(0, 5, 1, 3, 2, 4).reshape(b, 16, h, w)


def inputs(model, size, device, dtype):
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g).to(device, dtype)
    if model == "flux":
        n, grid = (size // 16) ** 2, size // 16
        img = torch.stack(torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij"), -1).flatten(0, 1)
        ids = torch.cat([torch.zeros(512, 3), torch.cat([torch.zeros(n, 1), img.float()], -1)]).to(device)
        return (rnd(1, n, 64), rnd(1, 512, 4096), rnd(1, 768), torch.full((1,), 0.5, device=device, dtype=dtype),
                torch.full((1,), 3.5, device=device), ids)
    h = size // 8
    return rnd(2, 16, h, h), rnd(2, 333, 4096), rnd(2, 2048), torch.full((2,), 500.0, device=device)


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model", choices=["flux", "sd3"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--modes", default="eager,compile")
    a = p.parse_args()
    dtype = torch.bfloat16
    torch.manual_seed(0)
    name = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    print(f"DEVICE {name}", flush=True)
    with torch.device(a.device):
        module = (Flux() if a.model == "flux" else SD3()).to(dtype).eval()
    args = inputs(a.model, a.size, a.device, dtype)
    for mode in a.modes.split(","):
        fn = torch.compile(module) if mode == "compile" else module
        with torch.inference_mode():
            t0 = time.perf_counter()
            fn(*args)
            sync(a.device)
            first = time.perf_counter() - t0
            cuda = a.device.startswith("cuda")
            if cuda:
                held = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            best = float("inf")
            for _ in range(a.reps):
                t0 = time.perf_counter()
                fn(*args)
                sync(a.device)
                best = min(best, time.perf_counter() - t0)
        print(f"RESULT torch {a.model} {mode} {best * 1e3:.3f} first={first * 1e3:.1f}", flush=True)
        if cuda:
            print(f"MEMORY torch {a.model} {mode} activations={torch.cuda.max_memory_allocated() - held}", flush=True)


if __name__ == "__main__":
    main()
