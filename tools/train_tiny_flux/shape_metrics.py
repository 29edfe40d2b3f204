#!/usr/bin/env python3
"""The pixel analysis of tests/pipelines/shapes_model_test.cpp in Python, to measure a trained model on many
prompts (the C++ test checks a few): background and shape colour, centroid, area and the shape's class.

Shape class from the fill ratio of the bounding box: the shape's area over its box's area is pi/4 = 0.785 for a
circle, 1 for a square and 0.5 for the dataset's triangle. Membership is soft (0 at the background colour, 1 at
the shape colour) so blurred and anti-aliased edges count by how much of the shape they hold; the box's width
(height) is the sum over columns (rows) of the largest membership in that column (row), which measures a box
edge that falls inside a pixel by its fraction.

Usage: python tools/train_tiny_flux/shape_metrics.py [--model models/kiln-shapes-64] [--seeds 0 1] [--steps 4]
  prints, per group of prompts, how often colour, position and shape class are right.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import dataset  # noqa: E402

PALETTE = {k: np.array(v, float) for k, v in dataset.COLORS.items()}
# Fill-ratio boundaries between triangle (0.5), circle (0.785) and square (1.0).
TRIANGLE_BELOW = 0.65
SQUARE_ABOVE = 0.90


def nearest(rgb):
    return min(PALETTE, key=lambda k: np.linalg.norm(PALETTE[k] - rgb))


def analyse(img):
    """img: uint8 HWC. Returns dict(background, color, cx, cy, area, fill, shape)."""
    px = img.astype(float)
    border = np.concatenate([px[:2].reshape(-1, 3), px[-2:].reshape(-1, 3), px[2:-2, :2].reshape(-1, 3),
                             px[2:-2, -2:].reshape(-1, 3)]).mean(0)
    d = np.linalg.norm(px - border, axis=2)
    out = dict(background=nearest(border), color="", cx=0.0, cy=0.0, area=0.0, fill=0.0, shape="")
    far = d > 60  # the closest palette colours (orange, yellow) are 84 apart
    if not far.any():
        return out
    # shape colour: the mean of the quarter of the far pixels farthest from the background (the interior)
    order = np.sort(d[far])[::-1]
    core = far & (d >= order[(len(order) + 3) // 4 - 1])
    fg = px[core].mean(0)
    out["color"] = nearest(fg)
    m = np.clip(d / max(np.linalg.norm(fg - border), 1.0), 0.0, 1.0)
    m[m < 0.1] = 0.0  # background noise does not widen the box
    area = m.sum()
    ys, xs = np.mgrid[0:img.shape[0], 0:img.shape[1]] + 0.5
    out["cx"], out["cy"], out["area"] = (m * xs).sum() / area, (m * ys).sum() / area, area
    w, h = m.max(0).sum(), m.max(1).sum()
    out["fill"] = area / (w * h)
    out["shape"] = ("triangle" if out["fill"] < TRIANGLE_BELOW else
                    "square" if out["fill"] > SQUARE_ABOVE else "circle")
    return out


def check(combo, a):
    """Which properties of `combo` the analysis `a` gets right."""
    size, color, shape, position, background = combo
    x, y = dataset.POSITIONS[position]
    return dict(background=a["background"] == background, color=a["color"] == color,
                position=abs(a["cx"] - x) <= 7 and abs(a["cy"] - y) <= 7, shape=a["shape"] == shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "kiln-shapes-64"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--trained", type=int, default=60, help="how many trained combinations to sample")
    ap.add_argument("--dataset", action="store_true", help="analyse the training pictures instead of a model")
    args = ap.parse_args()
    combos = dataset.all_combinations()
    held = [c for c in combos if dataset.is_held_out(c)]
    rng = np.random.default_rng(0)
    trained = [c for c in combos if not dataset.is_held_out(c)]
    trained = [trained[i] for i in rng.choice(len(trained), args.trained, replace=False)]
    if args.dataset:
        def draw(combo, seed):
            return dataset.render(combo, np.random.default_rng(seed))
    else:
        import torch
        from diffusers import FluxPipeline

        torch.set_num_threads(2)
        pipe = FluxPipeline.from_pretrained(args.model)
        pipe.set_progress_bar_config(disable=True)

        def draw(combo, seed):
            g = torch.Generator("cpu").manual_seed(seed)
            return np.asarray(pipe(dataset.caption(*combo), height=64, width=64, num_inference_steps=args.steps,
                                   guidance_scale=0.0, generator=g, max_sequence_length=40).images[0])

    for name, group in (("held-out", held), ("trained", trained)):
        score = {k: 0 for k in ("background", "color", "position", "shape")}
        per_shape = {s: [0, 0] for s in dataset.SHAPES}
        per_size = {(z, s): [0, 0] for z in dataset.SIZES for s in dataset.SHAPES}
        fills = {s: [] for s in dataset.SHAPES}
        n = 0
        for combo in group:
            for seed in args.seeds:
                a = analyse(draw(combo, seed))
                ok = check(combo, a)
                for k in score:
                    score[k] += ok[k]
                per_shape[combo[2]][0] += ok["shape"]
                per_shape[combo[2]][1] += 1
                per_size[combo[0], combo[2]][0] += ok["shape"]
                per_size[combo[0], combo[2]][1] += 1
                fills[combo[2]].append(a["fill"])
                n += 1
        print(f"{name}: {n} pictures; right: " + ", ".join(f"{k} {v / n:.0%}" for k, v in score.items()))
        for s in dataset.SHAPES:
            f = np.array(fills[s])
            print(f"  {s}: class right {per_shape[s][0]}/{per_shape[s][1]}, fill ratio median {np.median(f):.2f} "
                  f"(10%-90%: {np.quantile(f, 0.1):.2f}-{np.quantile(f, 0.9):.2f}); "
                  + ", ".join(f"{z} {per_size[z, s][0]}/{per_size[z, s][1]}" for z in dataset.SIZES))


if __name__ == "__main__":
    main()
