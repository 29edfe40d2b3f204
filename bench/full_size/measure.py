#!/usr/bin/env python3
"""Kiln and diffusers side by side on one full-size pipeline folder (tools/full_size/make_checkpoint.py): peak
anonymous memory (RssAnon), peak resident set (VmHWM), what was read from disk or page cache, load time and
seconds per denoising step, each engine in its own process, one after the other (issue #18).

  python3 bench/full_size/measure.py --model /work/big/flux1-schnell-full --size 256 --steps 1 \
      --engines kiln,kiln:--packed-weights=8GiB,diffusers

Engines: `kiln` runs `kiln generate` with no memory flags; `kiln:FLAG[,FLAG...]` adds flags (write `=` for the
space); `diffusers` runs the pipeline class of model_index.json with torch_dtype=torch.bfloat16 and no offload
call; `diffusers:model` / `diffusers:sequential` call enable_model_cpu_offload / enable_sequential_cpu_offload
with device="cpu" (without it they refuse to run on a host with no accelerator), `diffusers:group-disk` calls
enable_group_offload(onload_device=cpu, block_level, 1 block per group, offload_to_disk_path under --out). Memory is sampled from /proc every 50 ms (RssAnon has no kernel-kept peak); VmHWM is the kernel's peak.
--drop-caches empties the page cache before each engine (root), so each starts from disk.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def status_kb(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def read_bytes(pid):
    """Bytes the process read through read() and page faults on mapped files are not in rchar; read_bytes counts
    what came from the block device. Both are reported."""
    out = {}
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                k, v = line.split(":")
                out[k] = int(v)
    except OSError:
        pass
    return out


class Sampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak_anon, self.peak_rss, self.hwm, self.io, self.done = pid, 0, 0, 0, {}, False

    def run(self):
        while not self.done:
            anon, rss, hwm = (status_kb(self.pid, k) for k in ("RssAnon", "VmRSS", "VmHWM"))
            if anon is None:
                break
            self.peak_anon, self.peak_rss = max(self.peak_anon, anon), max(self.peak_rss, rss or 0)
            self.hwm = max(self.hwm, hwm or 0)
            self.io = read_bytes(self.pid) or self.io
            time.sleep(0.05)


def run_engine(cmd, env, label):
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    sampler = Sampler(proc.pid)
    sampler.start()
    lines = []
    for line in proc.stdout:
        lines.append((time.time() - t0, line.rstrip()))
        print(f"  [{label} {time.time() - t0:7.1f}s] {line.rstrip()}", flush=True)
    proc.wait()
    sampler.done = True
    sampler.join()
    return proc.returncode, time.time() - t0, lines, sampler


def kiln_timings(lines):
    """Load time: until the line that states how the weights are held (printed once loading ends); step times
    from the denoising progress lines ("12.3s/step")."""
    load = next((t for t, l in lines if l.startswith("kiln: weights")), None)
    steps = [float(m.group(1)) for _, l in lines for m in [re.search(r"\] \d+/\d+ ([0-9.]+)s/step", l)] if m]
    return load, steps


DIFFUSERS_CHILD = r"""
import json, sys, time
import torch, diffusers
model, size, steps, seq, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
t0 = time.time()
index = json.load(open(model + "/model_index.json"))
pipe = getattr(diffusers, index["_class_name"]).from_pretrained(model, torch_dtype=torch.bfloat16)
offload = sys.argv[7]
# Without an accelerator diffusers' model and sequential offload refuse to run unless given device="cpu", where
# they move nothing; group offload to disk (offload_to_disk_path) is the one that saves memory on a CPU host.
if offload == "model":
    pipe.enable_model_cpu_offload(device="cpu")
elif offload == "sequential":
    pipe.enable_sequential_cpu_offload(device="cpu")
elif offload == "group-disk":
    import tempfile
    pipe._kiln_offload_dir = tempfile.mkdtemp(dir=sys.argv[8])
    pipe.enable_group_offload(onload_device=torch.device("cpu"), offload_device=torch.device("cpu"),
                              offload_type="block_level", num_blocks_per_group=1,
                              offload_to_disk_path=pipe._kiln_offload_dir)
load = time.time() - t0
stamps = []
def on_step(p, i, t, kw):
    stamps.append(time.time())
    return kw
t1 = time.time()
kwargs = dict(prompt="a golden retriever surfing a wave", height=size, width=size, num_inference_steps=steps,
              max_sequence_length=seq, generator=torch.Generator("cpu").manual_seed(seed),
              callback_on_step_end=on_step)
kwargs["guidance_scale"] = 0.0  # as Kiln's --guidance 0: SD3 without classifier-free guidance (one batch)
image = pipe(**kwargs).images[0]
image.save(sys.argv[6])
print("RESULT " + json.dumps({"load_s": load, "stamps": [s - t1 for s in stamps], "total_s": time.time() - t1}))
if offload == "group-disk":
    import shutil
    shutil.rmtree(pipe._kiln_offload_dir, ignore_errors=True)  # the groups' copies: as large as the model
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--engines", default="kiln,diffusers")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--max-sequence-length", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--out", default="/tmp/full_size_measure")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    rows = []
    for engine in args.engines.split(","):
        if args.drop_caches:
            subprocess.run(["sync"])
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        png = os.path.join(args.out, engine.replace(":", "_").replace("=", "_").replace("-", "") + ".png")
        if engine.startswith("kiln"):
            flags = [f for part in engine.split(":")[1:] for f in part.split(",")]
            flags = [x for f in flags for x in f.split("=", 1)]
            cmd = [args.kiln, "generate", "--model", args.model, "--prompt", "a golden retriever surfing a wave",
                   "--height", str(args.size), "--width", str(args.size), "--steps", str(args.steps),
                   "--guidance", "0", "--max-sequence-length", str(args.max_sequence_length), "--seed",
                   str(args.seed), "--dtype", "bf16", "--output", png] + flags
        else:
            offload = engine.split(":", 1)[1] if ":" in engine else "none"
            cmd = [sys.executable, "-c", DIFFUSERS_CHILD, args.model, str(args.size), str(args.steps),
                   str(args.max_sequence_length), str(args.seed), png, offload, args.out]
        rc, wall, lines, s = run_engine(cmd, env, engine)
        if engine.startswith("kiln"):
            load, steps = kiln_timings(lines)
        else:
            res = next((json.loads(l[len("RESULT "):]) for _, l in lines if l.startswith("RESULT ")), None)
            load = res["load_s"] if res else None
            stamps = res["stamps"] if res else []
            # The first interval includes the prompt encoding, as Kiln's first step line does not: report the
            # steps after the first when there are several.
            steps = [b - a for a, b in zip(stamps, stamps[1:])] or ([stamps[0]] if stamps else [])
        rows.append(dict(engine=engine, rc=rc, wall_s=wall, load_s=load, steps_s=steps,
                         peak_rss_anon_gb=s.peak_anon * 1024 / 1e9, peak_rss_gb=max(s.peak_rss, s.hwm) * 1024 / 1e9,
                         read_gb=s.io.get("read_bytes", 0) / 1e9, rchar_gb=s.io.get("rchar", 0) / 1e9))
    print("\n| engine | exit | peak RssAnon GB | peak RSS (VmHWM) GB | read from disk GB | read GB/s | load s | s/step "
          "| wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        step = "/".join(f"{x:.1f}" for x in r["steps_s"]) or "-"
        load = f"{r['load_s']:.1f}" if r["load_s"] is not None else "-"
        rate = r["read_gb"] / r["wall_s"] if r["wall_s"] > 0 else 0
        print(f"| {r['engine']} | {r['rc']} | {r['peak_rss_anon_gb']:.2f} | {r['peak_rss_gb']:.2f} | "
              f"{r['read_gb']:.1f} | {rate:.2f} | {load} | {step} | {r['wall_s']:.0f} |")
    # Steady-state steps (after the first, which reads the weights from disk) against the first engine's: the
    # cost of an offload mode where both fit (issue #13's <= 1.3x target for group offload).
    def steady(r):
        xs = sorted(r["steps_s"][1:] or r["steps_s"])
        return xs[len(xs) // 2] if xs else None
    base = steady(rows[0]) if rows else None
    if base:
        print(f"\nmedian steady step / {rows[0]['engine']}'s ({base:.1f} s):")
        for r in rows:
            m = steady(r)
            print(f"  {r['engine']}: " + (f"{m:.1f} s, {m / base:.2f}x" if m else "-"))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
