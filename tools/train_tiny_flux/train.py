#!/usr/bin/env python3
"""Trains kiln-shapes-64: a small FLUX.1-architecture text-to-image pipeline (diffusers FluxPipeline layout) on the
procedural shapes of dataset.py, on CPU, reproducibly from a seed.

Stages (each checkpointed under --work, so an interrupted run resumes where it stopped):
  1. text encoders: CLIP and T5 built from transformers' classes with small configs and kept frozen at their
     seeded random initialisation; their outputs for every caption are cached.
  2. VAE: diffusers' AutoencoderKL (3 levels: 64x64 -> 16x16x4 latents), trained on reconstruction (L1 + MSE)
     with a tiny KL term; shift_factor / scaling_factor then set from the latent statistics; then the decoder
     alone is trained further with the encoder frozen (sharper pictures; the latents do not change).
  3. transformer: diffusers' FluxTransformer2DModel trained with FLUX's rectified-flow loss (predict
     velocity = noise - x0 at x_t = (1 - sigma) x0 + sigma noise) on the cached latents, with an EMA copy;
     then the shape-contrast stage (batches of pictures that differ only in the shape word) and the
     shape-focus stage (the same batches, the loss weighted onto the latent pixels around the shape).
  4. the decoder alone again (encoder frozen): sharpening (loss weighted onto the shapes), then crisp (trained
     on the latents' means, the weighted loss also on image gradients), so corners decode as corners.
  5. the EMA pipeline saved with save_pretrained (tokenizers in the real FLUX file formats) + a preview grid.

Usage: python tools/train_tiny_flux/train.py [--seed 0] [--work build-train-shapes] [--out models/kiln-shapes-64]
"""
import argparse
import copy
import math
import os
import shutil
import sys
import time

import numpy as np

# The build host is shared: with OpenMP's default spin-waiting, 2 threads on a loaded machine run 5-10x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "goldens"))
import dataset  # noqa: E402
from tiny_tokenizers import write_tiny_clip_tokenizer, write_tiny_t5_tokenizer  # noqa: E402

MAX_SEQ = 40  # T5 tokens: the longest caption has 38
CLIP_MERGES = 1500
# Lengths of the two constant-lr stages (decoder sharpening, transformer shape contrast): how far the shipped
# model's training went within its wall-time budget.
SHARPEN_STEPS = 1000
CONTRAST_STEPS = 600
FOCUS_STEPS = 2400
CRISP_STEPS = 2500


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def build_text_encoders(seed, clip_dir, t5_dir):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5TokenizerFast

    clip_tok = CLIPTokenizer.from_pretrained(clip_dir)
    t5_tok = T5TokenizerFast.from_pretrained(t5_dir)
    torch.manual_seed(seed + 1)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(clip_tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5, projection_dim=64,
        bos_token_id=0, eos_token_id=2, pad_token_id=1))  # eos_token_id=2: the legacy value of the real FLUX config
    torch.manual_seed(seed + 2)
    t5 = T5EncoderModel(T5Config(
        vocab_size=len(t5_tok), d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
        relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
        layer_norm_epsilon=1e-6, dropout_rate=0.0, is_encoder_decoder=False, use_cache=False,
        tie_word_embeddings=False))
    return clip_tok, clip.eval(), t5_tok, t5.eval()


def build_vae(seed):
    from diffusers import AutoencoderKL

    torch.manual_seed(seed + 3)
    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 32, 32), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3, norm_num_groups=8,
        act_fn="silu", use_quant_conv=False, use_post_quant_conv=False, scaling_factor=1.0, shift_factor=0.0,
        sample_size=64, mid_block_add_attention=False, force_upcast=True)


def build_transformer(seed):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed + 4)
    return FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=32,
        num_attention_heads=4, joint_attention_dim=64, pooled_projection_dim=64, guidance_embeds=False,
        axes_dims_rope=(8, 12, 12))


def build_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    # schnell-like: no dynamic shifting, shift 1 (sigmas 1, 0.75, 0.5, 0.25 for 4 steps)
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False,
                                           base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                           max_image_seq_len=4096)


def to_pixels(images_u8):
    return torch.from_numpy(images_u8).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def save_ckpt(path, **state):
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def resume(ckpt, stage, **parts):
    """Loads a stage's checkpoint (written by save_ckpt) into `parts` (checkpoint key -> object with
    load_state_dict); returns the step to resume at, 0 when there is none yet."""
    if not os.path.exists(ckpt):
        return 0
    s = torch.load(ckpt)
    for key, part in parts.items():
        part.load_state_dict(s[key])
    log(f"{stage}: resuming at step {s['step']}")
    return s["step"]


def train_vae(vae, images, steps, batch, seed, ckpt):
    opt = torch.optim.AdamW(vae.parameters(), lr=2e-3, weight_decay=0.0)
    start = resume(ckpt, "vae", model=vae, opt=opt)
    g = torch.Generator().manual_seed(seed + 10)
    for _ in range(start):  # keep the batch order identical to an uninterrupted run
        torch.randint(0, len(images), (batch,), generator=g)
        torch.randn(batch, 4, 16, 16, generator=g)
    vae.train()
    t0 = time.time()
    for step in range(start, steps):
        lr = 2e-3 * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(0, len(images), (batch,), generator=g)
        x = to_pixels(images[idx.numpy()])
        eps = torch.randn(batch, 4, 16, 16, generator=g)
        dist = vae.encode(x).latent_dist
        z = dist.mean + dist.std * eps
        rec = vae.decode(z).sample
        kl = dist.kl().mean() / (16 * 16 * 4)
        loss = F.l1_loss(rec, x) + F.mse_loss(rec, x) + 1e-4 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 25 == 0 or step == steps - 1:
            log(f"vae step {step}/{steps} loss {loss.item():.4f} kl {kl.item():.2f} "
                f"({(time.time() - t0) / (step - start + 1):.2f}s/step)")
        if (step + 1) % 100 == 0 or step == steps - 1:
            save_ckpt(ckpt, model=vae.state_dict(), opt=opt.state_dict(), step=step + 1)
    vae.eval()


def train_decoder(vae, images, steps, batch, seed, ckpt, name, lr_at, loss_of, latent_means=None):
    """Trains the decoder alone, the encoder frozen: the latents the transformer learns do not change, so the
    decoder stages sharpen the pictures without touching anything upstream. Each step decodes `batch` training
    pictures from latents sampled from the encoder's posterior or, given `latent_means`, from its means (what
    the decoder sees at inference); lr_at(step) is the learning rate, loss_of(decoded, pictures) the loss."""
    opt = torch.optim.AdamW(vae.decoder.parameters(), lr=lr_at(0), weight_decay=0.0)
    start = resume(ckpt, name, model=vae.decoder, opt=opt)
    if start >= steps:
        return
    g = torch.Generator().manual_seed(seed)

    def draw():
        idx = torch.randint(0, len(images), (batch,), generator=g)
        eps = torch.randn(batch, 4, 16, 16, generator=g) if latent_means is None else None
        return idx, eps

    for _ in range(start):  # keep the batch order identical to an uninterrupted run
        draw()
    vae.decoder.train()
    t0 = time.time()
    for step in range(start, steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        idx, eps = draw()
        x = to_pixels(images[idx.numpy()])
        if latent_means is None:
            with torch.no_grad():
                dist = vae.encode(x).latent_dist
                z = dist.mean + dist.std * eps
        else:
            z = latent_means[idx]
        loss = loss_of(vae.decode(z).sample, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 25 == 0 or step == steps - 1:
            log(f"{name} step {step}/{steps} loss {loss.item():.4f} "
                f"({(time.time() - t0) / (step - start + 1):.2f}s/step)")
        if (step + 1) % 100 == 0 or step == steps - 1:
            save_ckpt(ckpt, model=vae.decoder.state_dict(), opt=opt.state_dict(), step=step + 1)
    vae.eval()


def finetune_decoder(vae, images, steps, batch, seed, ckpt):
    """After the joint VAE stage, which leaves edges soft: plain reconstruction loss, lr 1e-3 cosine."""
    train_decoder(vae, images, steps, batch, seed + 30, ckpt, "decoder",
                  lambda step: 1e-3 * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps)),
                  lambda rec, x: F.l1_loss(rec, x) + F.mse_loss(rec, x))


def shape_weight(x):
    """Per-pixel loss weight: 10 on the shape and a 2-pixel rim around it, 1 on the flat background (which the
    decoder already gets right and which would otherwise dominate the loss)."""
    background = x[:, :, :1, :1]
    on_shape = ((x - background).abs().sum(1, keepdim=True) > 0.05).float()
    return 1.0 + 9.0 * F.max_pool2d(on_shape, 5, stride=1, padding=2)


def shape_focus_weights(images_u8, focus):
    """Loss weights for the shape-focus stage, one per latent value in FluxPipeline's packed layout
    ([N, 64 tokens, 16]): `focus` on the latent pixels that see the shape (a 4x4 pixel cell touching it) and
    their 8 neighbours, 1 elsewhere. Without it the flat background, which the model already draws right,
    outweighs the few latent values where a square's corners differ from a circle's."""
    from diffusers import FluxPipeline

    x = to_pixels(images_u8)
    on_shape = ((x - x[:, :, :1, :1]).abs().sum(1, keepdim=True) > 0.05).float()
    cells = F.max_pool2d(F.max_pool2d(on_shape, 4), 3, stride=1, padding=1)  # [N, 1, 16, 16]
    w = 1.0 + (focus - 1.0) * cells.expand(-1, 4, -1, -1)
    return FluxPipeline._pack_latents(w, len(w), 4, 16, 16)


def weighted_reconstruction_loss(rec, x):
    """L1 + MSE with the `shape_weight` weighting."""
    w = shape_weight(x)
    return ((rec - x).abs() * w).mean() + ((rec - x) ** 2 * w).mean()


def sharpen_decoder(vae, images, steps, batch, seed, ckpt):
    """The loss weighted onto the shapes, lr 5e-4 constant after warm-up (the stage can be stopped at any
    checkpoint): after `finetune_decoder` small squares and triangles still decode as rounded blobs."""
    train_decoder(vae, images, steps, batch, seed + 40, ckpt, "sharpen",
                  lambda step: 5e-4 * min(1.0, (step + 1) / 50), weighted_reconstruction_loss)


def crisp_decoder(vae, images, latent_means, steps, batch, seed, ckpt):
    """The last decoder stage: trained on the posterior means, which is what it decodes at inference (the
    transformer's output), instead of sampled latents, whose noise it learned to average out into rounded
    corners; loss weighted onto the shapes as in `sharpen_decoder`, plus the same weighting on the image
    gradients, which is where a square's corner and a circle's rim differ. lr 5e-4 cosine to 5e-5. After
    `sharpen_decoder` a small square's own latent still decoded with a bounding-box fill of 0.86 (the test
    reads above 0.9 as a square)."""

    def loss_of(rec, x):
        w = shape_weight(x)
        err = rec - x  # its horizontal and vertical differences: the image gradients' error
        return weighted_reconstruction_loss(rec, x) \
            + ((err[..., :, 1:] - err[..., :, :-1]).abs() * w[..., :, 1:]).mean() \
            + ((err[..., 1:, :] - err[..., :-1, :]).abs() * w[..., 1:, :]).mean()

    def lr_at(step):
        return 5e-4 * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))

    train_decoder(vae, images, steps, batch, seed + 70, ckpt, "crisp decoder", lr_at, loss_of,
                  latent_means=latent_means)


def save_reconstruction(vae, images, path):
    from PIL import Image

    with torch.no_grad():
        rec = vae.decode(vae.encode(to_pixels(images)).latent_dist.mean).sample
    both = torch.cat([to_pixels(images), rec]).clamp(-1, 1)
    both = ((both + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
    n = len(images)
    Image.fromarray(np.concatenate([np.concatenate(both[:n], 1), np.concatenate(both[n:], 1)], 0)).save(path)
    return (rec - to_pixels(images)).abs().mean().item() * 127.5


@torch.no_grad()
def encode_captions(captions, clip_tok, clip, t5_tok, t5):
    out = {}
    for i in range(0, len(captions), 128):
        chunk = captions[i:i + 128]
        cid = clip_tok(chunk, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
        pooled = clip(cid, output_hidden_states=False).pooler_output
        tid = t5_tok(chunk, padding="max_length", max_length=MAX_SEQ, truncation=True, return_tensors="pt").input_ids
        emb = t5(tid, output_hidden_states=False)[0]
        for c, p, e in zip(chunk, pooled, emb):
            out[c] = (e.clone(), p.clone())
    return out


def train_transformer(transformer, latents, caption_idx, text_embeds, pooled, steps, extra_steps, batch, seed, ckpt):
    """`steps` with lr 1e-3 (cosine to 1e-4) and EMA 0.999, then one more cosine cycle from 3e-4 with EMA 0.995
    per entry of `extra_steps` (warm restarts, which also let the EMA catch up with the weights)."""
    from diffusers import FluxPipeline

    ema = copy.deepcopy(transformer).requires_grad_(False)
    opt = torch.optim.AdamW(transformer.parameters(), lr=1e-3, weight_decay=0.0)
    start = resume(ckpt, "transformer", model=transformer, ema=ema, opt=opt)
    n, c, h, w = latents.shape
    img_ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, w // 2, "cpu", torch.float32)
    txt_ids = torch.zeros(MAX_SEQ, 3)
    g = torch.Generator().manual_seed(seed + 20)

    def draw():
        idx = torch.randint(0, n, (batch,), generator=g)
        noise = torch.randn(batch, c, h, w, generator=g)
        # sigmas: half uniform, half logit-normal (FLUX's density, more weight mid-trajectory)
        u = torch.rand(batch, generator=g)
        ln = torch.sigmoid(torch.randn(batch, generator=g))
        sig = torch.where(torch.arange(batch) % 2 == 0, u, ln).clamp(1e-3, 1.0)
        return idx, noise, sig

    for _ in range(start):
        draw()
    transformer.train()
    t0 = time.time()
    total = steps + sum(extra_steps)
    cycle_starts = [steps + sum(extra_steps[:i]) for i in range(len(extra_steps))]
    for step in range(start, total):
        if step < steps:
            lr = 1e-3 * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        else:
            i = max(j for j, c in enumerate(cycle_starts) if c <= step)
            k = (step - cycle_starts[i]) / extra_steps[i]
            lr = 3e-4 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k)))
        for group in opt.param_groups:
            group["lr"] = lr
        idx, noise, sig = draw()
        x0 = latents[idx]
        s4 = sig.view(-1, 1, 1, 1)
        xt = (1 - s4) * x0 + s4 * noise
        target = noise - x0
        packed = FluxPipeline._pack_latents(xt, batch, c, h, w)
        ci = caption_idx[idx]
        pred = transformer(hidden_states=packed, timestep=sig, guidance=None, pooled_projections=pooled[ci],
                           encoder_hidden_states=text_embeds[ci], txt_ids=txt_ids, img_ids=img_ids,
                           return_dict=False)[0]
        loss = F.mse_loss(pred, FluxPipeline._pack_latents(target, batch, c, h, w))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), 1.0)
        opt.step()
        decay = min(0.999, (1 + step) / (10 + step)) if step < steps else 0.995
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), transformer.parameters()):
                pe.lerp_(p, 1 - decay)
        if step % 25 == 0 or step == total - 1:
            log(f"transformer step {step}/{total} loss {loss.item():.4f} "
                f"({(time.time() - t0) / (step - start + 1):.2f}s/step)")
        if (step + 1) % 100 == 0 or step == total - 1:
            save_ckpt(ckpt, model=transformer.state_dict(), ema=ema.state_dict(), opt=opt.state_dict(),
                      step=step + 1)
    return ema.eval()


def train_shape_contrast(transformer, ema, latents, caption_idx, groups, text_embeds, pooled, steps, batch_groups,
                         seed, ckpt, weights=None, lr=4e-4, stage="shape contrast"):
    """Continues the transformer (and its EMA) on batches of shape groups: pictures that differ only in the shape
    (same colours, position, size and jitter), with the same noise and sigma inside a group. The only thing that
    tells the group members apart is then the shape word, so every batch pushes the model to read it; with
    independent samples the shape difference (a few latent values at the corners) drowns in everything else.
    By default the pictures are the canonical ones (no jitter): each caption then names one picture, which the
    model can draw sharply, where with jitter its first steps can only draw the blurred average over positions
    and sizes and the later ones must find the shape's edge in the noise (the first model's round blobs).
    sigma: half the time one of the 4-step sampler's sigmas (1, 0.75, 0.5, 0.25), else uniform.
    Constant lr after warm-up, EMA 0.997: the stage can be stopped at any checkpoint.
    weights: optional per-picture loss weights in the packed latent layout ([N, tokens, 16]; see
    `shape_focus_weights`), which the shape-focus stage uses to put the loss where the shapes differ."""
    from diffusers import FluxPipeline

    opt = torch.optim.AdamW(transformer.parameters(), lr=lr, weight_decay=0.0)
    start = resume(ckpt, stage, model=transformer, ema=ema, opt=opt)
    n_groups = int(groups.max()) + 1
    members = [torch.nonzero(groups == i).flatten() for i in range(n_groups)]
    n, c, h, w = latents.shape
    img_ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, w // 2, "cpu", torch.float32)
    txt_ids = torch.zeros(MAX_SEQ, 3)
    g = torch.Generator().manual_seed(seed + 50)
    sampler_sigmas = torch.tensor([1.0, 0.75, 0.5, 0.25])

    def draw():
        gi = torch.randint(0, n_groups, (batch_groups,), generator=g)
        noise = torch.randn(batch_groups, c, h, w, generator=g)
        u = torch.rand(batch_groups, generator=g)
        pick = sampler_sigmas[torch.randint(0, 4, (batch_groups,), generator=g)]
        sig = torch.where(torch.arange(batch_groups) % 2 == 0, pick, u).clamp(1e-3, 1.0)
        idx = torch.cat([members[i] for i in gi.tolist()])
        rep = torch.tensor([len(members[i]) for i in gi.tolist()])
        return idx, noise.repeat_interleave(rep, 0), sig.repeat_interleave(rep, 0)

    for _ in range(start):
        draw()
    transformer.train()
    t0 = time.time()
    for step in range(start, steps):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 50)
        idx, noise, sig = draw()
        b = len(idx)
        x0 = latents[idx]
        s4 = sig.view(-1, 1, 1, 1)
        xt = (1 - s4) * x0 + s4 * noise
        ci = caption_idx[idx]
        pred = transformer(hidden_states=FluxPipeline._pack_latents(xt, b, c, h, w), timestep=sig, guidance=None,
                           pooled_projections=pooled[ci], encoder_hidden_states=text_embeds[ci], txt_ids=txt_ids,
                           img_ids=img_ids, return_dict=False)[0]
        err = (pred - FluxPipeline._pack_latents(noise - x0, b, c, h, w)) ** 2
        loss = err.mean() if weights is None else (err * weights[idx]).sum() / weights[idx].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), transformer.parameters()):
                pe.lerp_(p, 1 - 0.997)
        if step % 25 == 0 or step == steps - 1:
            log(f"{stage} step {step}/{steps} loss {loss.item():.4f} "
                f"({(time.time() - t0) / (step - start + 1):.2f}s/step)")
        if (step + 1) % 50 == 0 or step == steps - 1:
            save_ckpt(ckpt, model=transformer.state_dict(), ema=ema.state_dict(), opt=opt.state_dict(),
                      step=step + 1)
    return ema.eval()


def preview(pipe, prompts, path, seed=0, steps=4):
    from PIL import Image

    tiles = []
    for p in prompts:
        g = torch.Generator("cpu").manual_seed(seed)
        tiles.append(np.asarray(pipe(p, height=64, width=64, num_inference_steps=steps, guidance_scale=0.0,
                                     generator=g, max_sequence_length=MAX_SEQ).images[0]))
    cols = 4
    while len(tiles) % cols:
        tiles.append(np.zeros_like(tiles[0]))
    grid = np.concatenate([np.concatenate(tiles[i:i + cols], axis=1) for i in range(0, len(tiles), cols)], axis=0)
    Image.fromarray(grid).resize((grid.shape[1] * 3, grid.shape[0] * 3), Image.NEAREST).save(path)


def decoder_stages(vae, images, latent_means, sample, args):
    """The decoder-only stages after the transformer's latents are fixed: sharpening, then crisp."""
    sharpen_decoder(vae, images, args.sharpen_steps, args.vae_batch, args.seed, os.path.join(args.work, "sharpen.pt"))
    log("sharpen: reconstruction L1 "
        f"{save_reconstruction(vae, sample, os.path.join(args.work, 'sharpen_reconstruction.png')):.2f} levels")
    crisp_decoder(vae, images, latent_means, args.crisp_steps, args.vae_batch, args.seed,
                  os.path.join(args.work, "crisp.pt"))
    log("crisp: reconstruction L1 "
        f"{save_reconstruction(vae, sample, os.path.join(args.work, 'crisp_reconstruction.png')):.2f} levels")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=os.path.join(ROOT, "build-train-shapes"))
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "kiln-shapes-64"))
    ap.add_argument("--samples-per-caption", type=int, default=4)
    ap.add_argument("--vae-steps", type=int, default=800)
    ap.add_argument("--decoder-steps", type=int, default=800)
    ap.add_argument("--vae-batch", type=int, default=16)
    ap.add_argument("--transformer-steps", type=int, default=1200)
    ap.add_argument("--transformer-extra-steps", type=int, nargs="*", default=[600, 600, 600])
    ap.add_argument("--transformer-batch", type=int, default=64)
    ap.add_argument("--sharpen-steps", type=int, default=SHARPEN_STEPS)
    ap.add_argument("--contrast-samples-per-group", type=int, default=2, help="with --contrast-jitter")
    ap.add_argument("--contrast-jitter", action="store_true",
                    help="shape-contrast stage on jittered pictures (default: the canonical, unjittered ones)")
    ap.add_argument("--contrast-steps", type=int, default=CONTRAST_STEPS)
    ap.add_argument("--contrast-batch-groups", type=int, default=22)
    ap.add_argument("--focus-steps", type=int, default=FOCUS_STEPS,
                    help="shape-focus stage: the contrast batches again, loss weighted onto the shapes")
    ap.add_argument("--focus-weight", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--stop-after", choices=["vae", "decoder", "sharpen", "focus", "all"], default="all")
    ap.add_argument("--crisp-steps", type=int, default=CRISP_STEPS)
    ap.add_argument("--only-decoder", action="store_true",
                    help="run only the last decoder stages (sharpening, crisp): independent of the transformer "
                         "stages, so they can run in a second process; the main run then finds them complete")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.work, exist_ok=True)
    from diffusers import FluxPipeline

    clip_dir, t5_dir = os.path.join(args.work, "tok_clip"), os.path.join(args.work, "tok_t5")
    write_tiny_clip_tokenizer(os.path.join(ROOT, "tests/data/tokenizers/clip"), clip_dir, num_merges=CLIP_MERGES)
    write_tiny_t5_tokenizer(os.path.join(ROOT, "tests/data/tokenizers/t5"), t5_dir)
    clip_tok, clip, t5_tok, t5 = build_text_encoders(args.seed, clip_dir, t5_dir)

    log("rendering the dataset")
    images, captions = dataset.make_training_set(args.samples_per_caption, args.seed)
    log(f"{len(images)} training images, {len(set(captions))} captions")

    vae = build_vae(args.seed)
    train_vae(vae, images, args.vae_steps, args.vae_batch, args.seed, os.path.join(args.work, "vae.pt"))
    with torch.no_grad():
        mean = torch.cat([vae.encode(to_pixels(images[i:i + 256])).latent_dist.mean
                          for i in range(0, len(images), 256)])
    shift, scale = mean.mean().item(), 1.0 / mean.std().item()
    vae.register_to_config(shift_factor=round(shift, 4), scaling_factor=round(scale, 4))
    sample = images[:: len(images) // 8][:8]
    log(f"vae: latent shift {shift:.4f} scale {scale:.4f}, reconstruction L1 "
        f"{save_reconstruction(vae, sample, os.path.join(args.work, 'vae_reconstruction.png')):.2f} levels")
    if args.stop_after == "vae":
        return
    finetune_decoder(vae, images, args.decoder_steps, args.vae_batch, args.seed, os.path.join(args.work, "decoder.pt"))
    log("decoder: reconstruction L1 "
        f"{save_reconstruction(vae, sample, os.path.join(args.work, 'decoder_reconstruction.png')):.2f} levels")
    if args.stop_after == "decoder":
        return
    latents = (mean - vae.config.shift_factor) * vae.config.scaling_factor
    group_images, group_captions, groups = dataset.make_shape_groups(args.contrast_samples_per_group, args.seed,
                                                                        jitter=args.contrast_jitter)
    small = group_images[np.asarray(groups) % 97 == 0][:8]
    if args.only_decoder or args.stop_after == "sharpen":
        decoder_stages(vae, images, mean, small, args)
        return

    unique = sorted(set(captions) | set(group_captions))
    enc = encode_captions(unique, clip_tok, clip, t5_tok, t5)
    text_embeds = torch.stack([enc[c][0] for c in unique])
    pooled = torch.stack([enc[c][1] for c in unique])
    pos = {c: i for i, c in enumerate(unique)}
    caption_idx = torch.tensor([pos[c] for c in captions])

    transformer = build_transformer(args.seed)
    ema = train_transformer(transformer, latents, caption_idx, text_embeds, pooled, args.transformer_steps, args.transformer_extra_steps,
                            args.transformer_batch, args.seed, os.path.join(args.work, "transformer.pt"))
    with torch.no_grad():
        group_latents = torch.cat([vae.encode(to_pixels(group_images[i:i + 256])).latent_dist.mean
                                   for i in range(0, len(group_images), 256)])
    group_latents = (group_latents - vae.config.shift_factor) * vae.config.scaling_factor
    log(f"shape contrast: {len(group_images)} pictures in {int(groups.max()) + 1} groups")
    ema = train_shape_contrast(transformer, ema, group_latents, torch.tensor([pos[c] for c in group_captions]),
                               torch.from_numpy(groups), text_embeds, pooled, args.contrast_steps,
                               args.contrast_batch_groups, args.seed, os.path.join(args.work, "contrast.pt"))
    ema = train_shape_contrast(transformer, ema, group_latents, torch.tensor([pos[c] for c in group_captions]),
                               torch.from_numpy(groups), text_embeds, pooled, args.focus_steps,
                               args.contrast_batch_groups, args.seed + 10, os.path.join(args.work, "focus.pt"),
                               weights=shape_focus_weights(group_images, args.focus_weight), lr=3e-4,
                               stage="shape focus")
    if args.stop_after == "focus":
        return
    decoder_stages(vae, images, mean, small, args)

    pipe = FluxPipeline(scheduler=build_scheduler(), text_encoder=clip, tokenizer=clip_tok, text_encoder_2=t5,
                        tokenizer_2=t5_tok, transformer=ema, vae=vae)
    shutil.rmtree(args.out, ignore_errors=True)
    pipe.save_pretrained(args.out, safe_serialization=True)
    # Ship the tokenizers in the files the real FLUX repos have (tokenizer/: vocab.json + merges.txt;
    # tokenizer_2/: spiece.model + tokenizer.json), not only the tokenizer.json that save_pretrained writes.
    for folder, src in (("tokenizer", clip_dir), ("tokenizer_2", t5_dir)):
        shutil.rmtree(os.path.join(args.out, folder))
        shutil.copytree(src, os.path.join(args.out, folder))
    log("saved", args.out)
    held = [dataset.caption(s, c, sh, p, b) for (sh, c, b), s, p in
            zip(dataset.HELD_OUT, ["big", "small", "big", "big", "small", "big"],
                ["on the left", "at the top", "in the center", "on the right", "at the bottom", "at the top"])]
    seen = [captions[i] for i in range(0, len(captions), len(captions) // 6)][:6]
    preview(FluxPipeline.from_pretrained(args.out), held + seen, os.path.join(args.work, "preview.png"))
    log("preview written")


if __name__ == "__main__":
    main()
