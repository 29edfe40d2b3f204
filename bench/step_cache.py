#!/usr/bin/env python3
"""Step caching side by side (not part of the tests): `kiln generate` on one model folder without a cache and
with each cache asked for (`--cache SPEC`, repeatable), the runs interleaved and repeated (`--repeat`), and per
cache: the steps whose blocks were computed, the wall time's ratio to the uncached run's (min / median / max over
the repeats), and the image's distance to the uncached image (mean and max 8-bit levels, PSNR).

  python3 tools/full_size/make_checkpoint.py --model flux-dev --out /tmp/flux-dev-shaped --blocks 4,8 --t5-layers 2
  python3 bench/step_cache.py --model /tmp/flux-dev-shaped --size 512 --steps 28 \\
      --cache fbcache:0.12 --cache fbcache:0.3 --repeat 2 -- --dtype bf16 --max-sequence-length 64

Kiln's own timing: the "denoising" seconds kiln generate reports are not used; the wall time of the whole
command is (loading included, the same in every run), so the ratio understates the denoising's own speed-up.
A model with random weights changes far more between steps than a trained one: its reuse is no guide to a real
checkpoint's. Standard library only (bench/image_diff.py reads the PNGs).
"""

import argparse
import math
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from image_diff import read_png  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def host():
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        name = re.search(r"model name\s*:\s*(.*)", text).group(1).strip()
        flags = re.search(r"flags\s*:\s*(.*)", text).group(1).split()
        isa = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
        return f"{name} ({', '.join(isa) or 'no bf16 ISA'}), {os.cpu_count()} CPUs"
    except (OSError, AttributeError):
        return platform.processor() or platform.machine()


def run(kiln, model, size, steps, cache, extra, out):
    args = [kiln, "generate", "--model", model, "--prompt", "a photo of a cat on a windowsill, golden hour",
            "--width", str(size), "--height", str(size), "--steps", str(steps), "--seed", "0",
            "--cache", cache, "--output", out, *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True)
    seconds = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds (user + system) of the command: on a host shared with other work they move far less than the
    # wall time does, so their ratio is the steadier one there.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        sys.exit(f"kiln generate failed ({' '.join(args)}):\n{done.stderr[-2000:]}")
    reused = re.search(r"(?:reused|forecast|extrapolated) at steps (\S+)", done.stderr)
    return seconds, cpu, (reused.group(1) if reused else "")


def count_steps(listed):
    """How many steps a list such as "4,6-9,11" names."""
    if not listed or listed == "none":
        return 0
    total = 0
    for part in listed.split(","):
        low, _, high = part.partition("-")
        total += int(high) - int(low) + 1 if high else 1
    return total


def distance(a, b):
    (sa, pa), (sb, pb) = read_png(a), read_png(b)
    assert sa == sb, "images of different sizes"
    diffs = [abs(x - y) for x, y in zip(pa, pb)]
    mse = sum(d * d for d in diffs) / len(diffs)
    psnr = float("inf") if mse == 0 else 10 * math.log10(255 * 255 / mse)
    return sum(diffs) / len(diffs), max(diffs), psnr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--steps", type=int, default=28)
    ap.add_argument("--cache", action="append", required=True, help="a --cache spec; repeat for several")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("extra", nargs="*", help="after --: more kiln generate flags")
    args = ap.parse_args()

    specs = ["none", *args.cache]
    times = {s: [] for s in specs}
    cpu_times = {s: [] for s in specs}
    reused = {}
    with tempfile.TemporaryDirectory() as tmp:
        images = {s: os.path.join(tmp, f"{i}.png") for i, s in enumerate(specs)}
        for r in range(args.repeat):
            # Interleaved, in an order that turns each repeat, so that drift on a shared host spreads evenly.
            order = specs[r % len(specs):] + specs[:r % len(specs)]
            for s in order:
                seconds, cpu, reused[s] = run(args.kiln, args.model, args.size, args.steps, s, args.extra,
                                              images[s])
                times[s].append(seconds)
                cpu_times[s].append(cpu)
        print(f"step caching, {os.path.basename(args.model.rstrip('/'))} at {args.size}x{args.size}, {args.steps} "
              f"steps, {' '.join(args.extra)}; host: {host()}; {args.repeat} runs each")
        print("| cache | steps computed | wall time (s) min / median / max | ratio to uncached (median) | "
              "CPU time (s, median) | CPU-time ratio | distance to uncached: mean / max levels, PSNR |")
        print("|---|---|---|---|---|---|---|")
        base = statistics.median(times["none"])
        cpu_base = statistics.median(cpu_times["none"])
        for s in specs:
            skipped = count_steps(reused.get(s))
            mean, peak, psnr = distance(images[s], images["none"])
            t, c = times[s], statistics.median(cpu_times[s])
            print(f"| {s} | {args.steps - skipped} of {args.steps}"
                  f"{' (reused ' + reused[s] + ')' if skipped else ''} | {min(t):.1f} / {statistics.median(t):.1f} / "
                  f"{max(t):.1f} | {base / statistics.median(t):.2f}x | {c:.1f} | {cpu_base / c:.2f}x | "
                  f"{mean:.2f} / {peak} / {'inf' if psnr == float('inf') else f'{psnr:.1f} dB'} |")


if __name__ == "__main__":
    main()
