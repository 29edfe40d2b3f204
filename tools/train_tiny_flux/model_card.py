#!/usr/bin/env python3
"""Writes models/kiln-shapes-64/README.md (the model card) from the saved configs and dataset.py's vocabulary.

Usage: python tools/train_tiny_flux/model_card.py [--out models/kiln-shapes-64]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import dataset  # noqa: E402
import train  # noqa: E402  (the stage lengths the shipped model was trained with)

# Measured on the shipped model with `shape_metrics.py` (seeds 0 and 1, 4 steps) and by the C++ test; update
# both after re-training.
HOW_WELL = """## How well it draws (measured by tests/pipelines/shapes_model_test.cpp and shape_metrics.py)

- The shape is classified by the fill ratio of its bounding box (circle 0.785, square 1, triangle 0.5;
  below 0.65 a triangle, above 0.90 a square; exact renderings of all three are classified right).
- Held-out combinations (`shape_metrics.py`, all 60 held-out prompts x seeds 0 and 1, 4 steps, 120 pictures):
  background 100%, shape colour 100%, position 100%, shape class 73%:
  - big shapes 58 of 60: circles 20/20, squares 18/20, triangles 20/20;
  - small shapes 30 of 60: circles 20/20, triangles 10/20 (the others dome-shaped, fill 0.65-0.70),
    squares 0/20: a small square keeps rounded corners (fill 0.81-0.89), visibly squarer than a circle but
    under the 0.90 line.
- Trained combinations (60 prompts x 2 seeds): shape class 77%, with the same pattern (small squares 0/18).
- The C++ test on its 6 held-out prompts x 2 seeds: 9 of 12 right (floor 8); with the same prompt and
  seed, the square word gives a fuller shape than the circle word and the triangle word a less full one on
  all 6.
- What limits the small shapes: the 16x16x4 latent. A small square is 14 pixels wide, 3.5 latent pixels; even
  its own latent, encoded and decoded by this VAE, comes back with a fill of 0.92 (25 of 40 small squares
  classified right), so the decoder, not the transformer, sets the ceiling there.
- The previous version of this model (before the shape-focus and crisp-decoder stages) drew every square as a
  round blob: 38% shape class on the same 120 held-out pictures (squares 0/40, triangles 6/40)."""

# How long the shipped model's training took, stage by stage, on this project's shared 2-core build host.
WALL_TIME = """Measured wall time of the shipped model, in several resumed runs (2 threads, nice 5, on a host shared with
C++ builds and benchmarks): about 45 min for the VAE, decoder and the first 3000 transformer steps; 57 min for
the 1000 sharpening steps (1 thread, in a second process); 36 min for the 600 shape-contrast steps (load 8-19);
32 min for the 2400 shape-focus steps (0.5-0.85 s/step, sharing the CPU); 12 min for the 2500 crisp-decoder
steps (1 thread, in a second process at the same time). About 2 h 40 min in all, well over the issue's
one-hour budget. Not measured: one uninterrupted run on an idle host; from the per-step times seen on a quiet
host (transformer stages about 0.5 s/step at batch 64, VAE and decoder stages 0.3-0.6 s/step at batch 16) it
would take about 90 minutes."""


def count_params(folder):
    import math

    from safetensors import safe_open

    total = 0
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(folder, f), "np") as s:
                total += sum(math.prod(s.get_slice(k).get_shape()) for k in s.keys())
    return total


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "kiln-shapes-64"))
    args = ap.parse_args()
    cfg = {c: json.load(open(os.path.join(args.out, c, "config.json"))) for c in
           ("transformer", "vae", "text_encoder", "text_encoder_2")}
    params = {c: count_params(os.path.join(args.out, c)) for c in cfg}
    t, v, clip, t5 = cfg["transformer"], cfg["vae"], cfg["text_encoder"], cfg["text_encoder_2"]
    held = "\n".join(f"- {c} {s} on {b}" for s, c, b in dataset.HELD_OUT)
    card = f"""# kiln-shapes-64

A small text-to-image model with the **FLUX.1 architecture** (diffusers `FluxPipeline` layout, schnell-like:
no guidance embedding), trained from scratch on CPU so that Kiln can ship a model that draws what it is told
without any download. It draws **one coloured shape on a coloured background at 64x64**.

| component | class | size |
|---|---|---|
| transformer | `FluxTransformer2DModel`: {t['num_layers']} double + {t['num_single_layers']} single blocks, width {t['num_attention_heads'] * t['attention_head_dim']} ({t['num_attention_heads']} heads x {t['attention_head_dim']}), rope axes {t['axes_dims_rope']} | {params['transformer'] / 1e6:.2f} M params |
| vae | `AutoencoderKL`: channels {v['block_out_channels']}, {v['latent_channels']} latent channels, 64x64 -> 16x16 | {params['vae'] / 1e6:.2f} M params |
| text_encoder | `CLIPTextModel`: hidden {clip['hidden_size']}, {clip['num_hidden_layers']} layers; tokenizer: CLIP BPE (vocab.json + merges.txt) cut to its first 1500 merges | {params['text_encoder'] / 1e6:.2f} M params |
| text_encoder_2 | `T5EncoderModel`: d_model {t5['d_model']}, {t5['num_layers']} layers; tokenizer: SentencePiece (spiece.model + tokenizer.json) | {params['text_encoder_2'] / 1e6:.2f} M params |

All weights are float32 ({folder_bytes(args.out) / 1e6:.1f} MB on disk in all).

## Use

```
./build/kiln generate --model models/kiln-shapes-64 --prompt "a big yellow triangle at the top, on a blue background" \\
    --height 64 --width 64 --steps 4 --guidance 0 --max-sequence-length 40 --seed 0 --output output.png
```

Always pass `--max-sequence-length 40` (the T5 length it was trained with; FLUX does not mask padding, so
another length changes the conditioning), 64x64, guidance 0. 4 steps is the trained-for setting (8 works too).
diffusers: `FluxPipeline.from_pretrained("models/kiln-shapes-64")(prompt, height=64, width=64,
num_inference_steps=4, guidance_scale=0.0, max_sequence_length=40)`.

## Prompts it understands

`a <size> <colour> <shape> <position>, on a <background> background`, exactly in this form:

- size: {", ".join(dataset.SIZES)}
- colour and background (must differ): {", ".join(dataset.COLORS)}
- shape: {", ".join(dataset.SHAPES)}
- position: {", ".join(dataset.POSITIONS)}

That is {len(dataset.all_combinations())} captions. These (colour shape, background) combinations were **held
out of training** in every position and size; Kiln's tests check that the model still draws them as asked:

{held}

{HOW_WELL}

## What it cannot do

Anything outside that grammar: other words, other colours or shapes, several shapes, relations between
shapes ("above"), text, photographs, other resolutions. Prompts off the grammar give a plausible shape picture
unrelated to the words.

## Training (reproducible from the seed)

```
python tools/train_tiny_flux/train.py --seed 0      # resumable checkpoints in build-train-shapes/; wall time below
python tools/train_tiny_flux/model_card.py          # this card
python tools/train_tiny_flux/goldens.py             # diffusers references for Kiln's tests
python tools/train_tiny_flux/shape_metrics.py       # the test's pixel analysis on many more prompts
```

{WALL_TIME}

- Data (`tools/train_tiny_flux/dataset.py`): every non-held-out caption rendered 4 times with a small random
  jitter of position (+-2.5 px) and size (+-10%), anti-aliased (4x supersampling): 6480 pictures.
- Text encoders: kept **frozen at their seeded random initialisation** (not trained). A random CLIP/T5 still
  maps each caption to distinct embeddings; the transformer learns to read them. Their outputs for every
  caption are computed once.
- VAE: 800 AdamW steps, batch 16, lr 2e-3 cosine, L1 + MSE reconstruction + 1e-4 KL, on sampled latents;
  then 800 more steps (lr 1e-3 cosine) on the decoder alone with the encoder frozen, which sharpens the
  pictures without changing the latents the transformer learns.
  `shift_factor` / `scaling_factor` are then the mean and 1/std of the latents ({v['shift_factor']}, {v['scaling_factor']}).
  Then {train.SHARPEN_STEPS} more decoder-only steps (lr 5e-4 constant) with the loss weighted 10x on the shape and a 2-pixel
  rim around it: before, small squares and triangles decoded as rounded blobs even from their own latents.
  Last, {train.CRISP_STEPS} crisp-decoder steps (lr 5e-4 cosine to 5e-5): the decoder is fed the latents' means (what it
  decodes at inference) instead of sampled latents, with the same shape weighting on the pixels and on the image
  gradients. A small square's own latent then decodes with a fill of 0.92 instead of 0.86.
- Transformer: AdamW, batch 64, grad clip 1: 1200 steps at lr 1e-3 (warm-up, cosine to 1e-4) with EMA 0.999,
  then three cycles of 600 steps, each cosine from lr 3e-4, with EMA 0.995. FLUX's rectified-flow objective:
  x_t = (1 - sigma) x0 + sigma noise, predict noise - x0; sigma half uniform, half logit-normal; timestep =
  sigma; scheduler shift 1.0, no dynamic shifting. This much gave the right colours, positions and sizes but
  one round blob for every shape.
- Transformer, shape-contrast stage ({train.CONTRAST_STEPS} steps, lr 4e-4 constant, EMA 0.997 continued): each batch is 22
  groups of pictures that differ only in the shape (the same caption but for the shape word, canonical
  pictures without jitter), the group sharing one noise and one sigma; half the sigmas are the 4-step sampler's
  (1, 0.75, 0.5, 0.25), half uniform. The shape word is then the only thing telling group members apart, and
  each caption names one picture that can be drawn sharply.
- Transformer, shape-focus stage ({train.FOCUS_STEPS} steps, lr 3e-4 constant, EMA 0.997 continued): the contrast
  batches again, with the loss weighted 10x on the latent pixels that see the shape and their neighbours, where
  a square's corners differ from a circle's; the flat background otherwise outweighs them. Held-out shape class
  went from 38% to 73% with this stage and the crisp decoder. The EMA weights are saved.
- The shipped model was trained by this script in several resumed runs (stage checkpoints carry the optimiser,
  EMA and random-stream position, so a resumed run follows the same path as an uninterrupted one; bitwise
  equality with a single run was not verified).
- torch {__import__("torch").__version__}, diffusers {__import__("diffusers").__version__}, transformers {__import__("transformers").__version__}, 2 threads.
"""
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(card)
    print(card)


if __name__ == "__main__":
    main()
