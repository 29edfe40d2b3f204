"""Procedurally generated, captioned pictures of one coloured shape on a coloured background (64x64).

Vocabulary: 8 colours x 3 shapes x 5 positions x 2 sizes, background any colour but the shape's.
Caption: "a big red circle on the left, on a blue background". Some (shape, colour, background) triples are
held out of training in every position and size; the C++ tests prompt for exactly those.
Pictures are rendered at 4x and box-filtered down, so edges are anti-aliased; position and size get a small
random jitter so that each caption is a small distribution, not a single picture.
"""
import itertools

import numpy as np

SIZE = 64
COLORS = {
    "red": (220, 30, 30),
    "orange": (245, 140, 20),
    "yellow": (240, 220, 30),
    "green": (40, 170, 60),
    "blue": (30, 70, 220),
    "purple": (140, 50, 180),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle")
# phrase -> shape centre (x, y) in pixels
POSITIONS = {
    "in the center": (32, 32),
    "on the left": (16, 32),
    "on the right": (48, 32),
    "at the top": (32, 16),
    "at the bottom": (32, 48),
}
SIZES = {"small": 7.0, "big": 12.0}  # half extent in pixels

# (shape, colour, background) never shown in training, in any position or size.
HELD_OUT = (
    ("circle", "red", "yellow"),
    ("square", "blue", "white"),
    ("triangle", "green", "purple"),
    ("circle", "white", "black"),
    ("square", "orange", "green"),
    ("triangle", "yellow", "blue"),
)


def caption(size, color, shape, position, background):
    article = "an" if background[0] in "aeiou" else "a"
    return f"a {size} {color} {shape} {position}, on {article} {background} background"


def all_combinations():
    """Every (size, colour, shape, position, background) tuple, in a fixed order."""
    out = []
    for size, color, shape, position, background in itertools.product(SIZES, COLORS, SHAPES, POSITIONS, COLORS):
        if background != color:
            out.append((size, color, shape, position, background))
    return out


def is_held_out(combo):
    size, color, shape, position, background = combo
    return (shape, color, background) in HELD_OUT


def draw_jitter(rng):
    """(dx, dy, size factor) of one jittered rendering."""
    return rng.uniform(-2.5, 2.5), rng.uniform(-2.5, 2.5), rng.uniform(0.9, 1.1)


def render(combo, rng=None, supersample=4, jitter=None):
    """uint8 HWC image of one combination; rng adds jitter (None: the canonical picture), or pass the jitter."""
    size, color, shape, position, background = combo
    cx, cy = POSITIONS[position]
    r = SIZES[size]
    if rng is not None and jitter is None:
        jitter = draw_jitter(rng)
    if jitter is not None:
        cx += jitter[0]
        cy += jitter[1]
        r *= jitter[2]
    n = SIZE * supersample
    coords = (np.arange(n) + 0.5) / supersample
    x, y = np.meshgrid(coords, coords)
    if shape == "circle":
        mask = (x - cx) ** 2 + (y - cy) ** 2 <= r * r
    elif shape == "square":
        mask = (np.abs(x - cx) <= r) & (np.abs(y - cy) <= r)
    else:  # triangle pointing up, apex at the top, base at the bottom of the r-box
        top, bottom = cy - r, cy + r
        frac = (y - top) / (2 * r)
        mask = (y >= top) & (y <= bottom) & (np.abs(x - cx) <= frac * r * 1.1)
    img = np.empty((n, n, 3), np.float32)
    img[:] = COLORS[background]
    img[mask] = COLORS[color]
    img = img.reshape(SIZE, supersample, SIZE, supersample, 3).mean(axis=(1, 3))
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def make_training_set(samples_per_caption, seed):
    """(images uint8 [N,64,64,3], caption strings [N]) for all non-held-out combinations, jittered."""
    rng = np.random.default_rng(seed)
    combos = [c for c in all_combinations() if not is_held_out(c)]
    images, captions = [], []
    for c in combos:
        for _ in range(samples_per_caption):
            images.append(render(c, rng))
            captions.append(caption(*c))
    return np.stack(images), captions


def make_shape_groups(samples_per_group, seed, jitter=True):
    """Pictures that differ only in the shape: for every (size, colour, position, background) and each of
    `samples_per_group` jitters, that jitter rendered as circle, square and triangle (held-out members left out).
    jitter=False: one group of canonical pictures (no jitter) per (size, colour, position, background).
    Returns (images uint8 [N,64,64,3], captions [N], group id per image [N]); a group holds 2 or 3 pictures."""
    rng = np.random.default_rng(seed + 1000)
    if not jitter:
        samples_per_group = 1
    images, captions, groups = [], [], []
    g = 0
    for size, color, position, background in itertools.product(SIZES, COLORS, POSITIONS, COLORS):
        if background == color:
            continue
        for _ in range(samples_per_group):
            offsets = draw_jitter(rng) if jitter else (0.0, 0.0, 1.0)
            for shape in SHAPES:
                combo = (size, color, shape, position, background)
                if is_held_out(combo):
                    continue
                images.append(render(combo, jitter=offsets))
                captions.append(caption(*combo))
                groups.append(g)
            g += 1
    return np.stack(images), captions, np.array(groups)


if __name__ == "__main__":
    from PIL import Image

    combos = all_combinations()
    print(len(combos), "combinations,", sum(is_held_out(c) for c in combos), "held out")
    rng = np.random.default_rng(0)
    tiles = [render(combos[i], rng) for i in rng.choice(len(combos), 16, replace=False)]
    grid = np.concatenate([np.concatenate(tiles[i * 4:(i + 1) * 4], axis=1) for i in range(4)], axis=0)
    Image.fromarray(grid).resize((512, 512), Image.NEAREST).save("/tmp/shapes_grid.png")
