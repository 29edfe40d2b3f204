#!/usr/bin/env python3
"""Load test of `kiln serve` (not part of the tests): starts a server on a free loopback port, sends it a
bounded number of OpenAI image requests (POST /v1/images/generations) from several clients at once, and reports
throughput, latency and queue-wait percentiles, the answers by status (every request must be answered: 200, or
503 with Retry-After when the queue was full; a refused request is not sent again, but its client waits the
Retry-After before its next one, as OpenAI's clients do), and the server's resident memory after loading, after a
warm-up, at each tenth of the requests and at the end (no growth).

  python3 bench/serve_load.py --model tests/data/models/flux-tiny-schnell --model tests/data/models/sd3-tiny-medium \\
      --clients 8 --requests 200 --size 32x32 --steps 2 --max-sequence-length 16 --queue 4 --dtype f32

With `--lora-dir DIR --loras a,b`, requests rotate through no adapter, then each named one (`"loras": [{"name": a,
"scale": 0.8}]`), on the models that the names fit (`--lora-model M` per name when several models are served):

  python3 bench/serve_load.py --model tests/data/models/z-image-tiny --clients 4 --requests 60 --size 32x32 \\
      --steps 2 --max-sequence-length 16 --dtype f32 --lora-dir tests/data/lora --loras z_image_diffusers,z_image_kohya

With `--edits K`, every K-th request is an edit (POST /v1/images/edits, the image and on every other one a mask in
base64, strength 0.6) on the models that take an image (GET /v1/models: kiln.edits), mixed with the generations:

  python3 bench/serve_load.py --model tests/data/models/flux-tiny-schnell --model tests/data/models/z-image-tiny \
      --clients 6 --requests 300 --size 32x32 --steps 2 --max-sequence-length 16 --dtype f32 --edits 3 \
      --lora-dir tests/data/lora --loras z_image_diffusers --lora-model z-image-tiny -- --max-memory 1GiB

Serve flags after `--` go to `kiln serve` unchanged (e.g. `-- --mode fuse --max-memory 8GiB`). Loopback only.
Needs only the Python standard library.
"""

import argparse
import base64
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


class Server:
    def __init__(self, kiln, args):
        self.process = subprocess.Popen([kiln, "serve", "--port", "0", *args], stderr=subprocess.PIPE, text=True)
        self.lines = []
        ready = threading.Event()
        self.url = None

        def read():
            for line in self.process.stderr:
                self.lines.append(line.rstrip())
                m = re.search(r"serving .* on (http://127\.0\.0\.1:\d+)/.*pid (\d+)", line)
                if m:
                    self.url, self.pid = m.group(1), int(m.group(2))
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        ready.wait(3600)  # a full-size model may take long to load
        if self.url is None:
            raise SystemExit("kiln serve did not start:\n" + "\n".join(self.lines))

    def metrics(self):
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as res:
            values = {}
            for line in res.read().decode().splitlines():
                if line and not line.startswith("#"):
                    name, value = line.rsplit(" ", 1)
                    values[name] = float(value)
            return values

    def stop(self):
        os.kill(self.pid, signal.SIGTERM)
        return self.process.wait(120)


def png(width, height, pixel):
    """A PNG file (8-bit RGB) whose pixel (x, y) is pixel(x, y) -> (r, g, b): the standard library's zlib only."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\0" + bytes(v for x in range(width) for v in pixel(x, y)) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def one_request(url, body, timeout):
    """(status, seconds, answer JSON or None, Retry-After or None); an edit's body goes to /v1/images/edits."""
    path = "/v1/images/edits" if "image" in body else "/v1/images/generations"
    data = json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data,
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            answer = json.loads(res.read())
            return res.status, time.monotonic() - start, answer, None
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, time.monotonic() - start, None, e.headers.get("Retry-After")
    except Exception as e:  # a connection that failed is an unanswered request
        return f"no answer ({type(e).__name__}: {e})", time.monotonic() - start, None, None


def run_clients(url, bodies, clients, timeout, deadline, on_progress=None):
    results = []
    lock = threading.Lock()
    next_index = [0]

    def client():
        while time.monotonic() < deadline:
            with lock:
                i = next_index[0]
                if i >= len(bodies):
                    return
                next_index[0] += 1
            status, seconds, answer, retry_after = one_request(url, bodies[i], timeout)
            with lock:
                results.append({"status": status, "seconds": seconds, "answer": answer, "retry_after": retry_after,
                                "body": bodies[i]})
                done = len(results)
            if on_progress:
                on_progress(done)
            if status == 503 and retry_after:
                time.sleep(min(float(retry_after), 60))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--model", action="append", required=True, help="repeat for several; requests alternate")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--max-seconds", type=float, default=1800, help="stop sending after this long")
    ap.add_argument("--size", default="32x32")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--guidance", type=float)
    ap.add_argument("--max-sequence-length", type=int)
    ap.add_argument("--queue", type=int, default=4, help="kiln serve --queue")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds one request may take")
    ap.add_argument("--warmup", type=int, help="requests before the measured ones (default: one per client)")
    ap.add_argument("--lora-dir", help="kiln serve --lora-dir: the adapters requests may name")
    ap.add_argument("--loras", default="", help="comma-separated adapter names the requests rotate through")
    ap.add_argument("--lora-model", help="the model the adapters fit (default: the first --model)")
    ap.add_argument("--edits", type=int, default=0,
                    help="every K-th request an edit (image, and a mask on every other one) where the model takes one")
    ap.add_argument("serve_args", nargs="*", help="after --: more kiln serve flags")
    args = ap.parse_args()
    if not 1 <= args.clients <= 64 or not 1 <= args.requests <= 10000:
        ap.error("--clients 1..64, --requests 1..10000: this is a bounded test")

    loras = [n for n in args.loras.split(",") if n]
    if loras and not args.lora_dir:
        ap.error("--loras needs --lora-dir")
    server = Server(args.kiln, [arg for m in args.model for arg in ("--model", m)] +
                    ["--queue", str(args.queue), "--dtype", args.dtype, *args.serve_args] +
                    (["--lora-dir", args.lora_dir] if args.lora_dir else []))
    names = [m.rstrip("/").split("/")[-1] for m in args.model]
    lora_model = (args.lora_model or args.model[0]).rstrip("/").split("/")[-1]
    with urllib.request.urlopen(server.url + "/v1/models", timeout=60) as res:
        edits = {m["id"]: m["kiln"].get("edits", {}) for m in json.loads(res.read())["data"]}
    width, height = (int(v) for v in args.size.split("x"))
    picture = base64.b64encode(png(width, height, lambda x, y: (x * 255 // width, y * 255 // height, 128))).decode()
    mask = base64.b64encode(png(width, height, lambda x, y: (255,) * 3 if x >= width // 2 else (0,) * 3)).decode()

    def body(i):
        b = {"model": names[i % len(names)], "prompt": f"request {i}: a red circle", "size": args.size,
             "steps": args.steps, "seed": i}
        if args.guidance is not None:
            b["guidance"] = args.guidance
        if args.max_sequence_length is not None:
            b["max_sequence_length"] = args.max_sequence_length
        # On the adapters' model: no adapter, then each named one in turn.
        if loras and b["model"] == lora_model:
            choice = (i // len(names)) % (len(loras) + 1)
            if choice:
                b["loras"] = [{"name": loras[choice - 1], "scale": 0.8}]
        # Every K-th request an edit, on a model that takes an image; with a mask on every other one.
        can = edits.get(b["model"], {})
        if args.edits and i % args.edits == 0 and can.get("image"):
            b["image"] = picture
            if "strength" in {f["json"] for f in can.get("image_fields", [])}:
                b["strength"] = 0.6
            if can.get("mask") and (i // args.edits) % 2:
                b["mask_image"] = mask
        return b

    try:
        rss_loaded = server.metrics()["kiln_resident_memory_bytes"]
        # Warm-up, one request at a time (--warmup, default a request per model and per client), so that every
        # buffer and cache a request needs exists.
        warmup = args.warmup if args.warmup is not None else max(args.clients, len(names))
        warm = run_clients(server.url, [body(args.requests + i) for i in range(warmup)], 1, args.timeout,
                           time.monotonic() + args.max_seconds)
        rss_warm = server.metrics()["kiln_resident_memory_bytes"]
        rss_series = []
        tenth = max(1, args.requests // 10)

        def sample(done):
            if done % tenth == 0:
                rss_series.append(round(server.metrics()["kiln_resident_memory_bytes"] / 2**20, 1))

        start = time.monotonic()
        bodies = [body(i) for i in range(args.requests)]
        results = run_clients(server.url, bodies, args.clients, args.timeout, start + args.max_seconds, sample)
        wall = time.monotonic() - start
        metrics = server.metrics()
    finally:
        code = server.stop()

    by_status, edit_status = {}, {}
    for r in results:
        by_status[str(r["status"])] = by_status.get(str(r["status"]), 0) + 1
        if "image" in r["body"]:
            kind = "inpaint" if "mask_image" in r["body"] else "img2img"
            edit_status.setdefault(kind, {})
            edit_status[kind][str(r["status"])] = edit_status[kind].get(str(r["status"]), 0) + 1
    ok = [r for r in results if r["status"] == 200]
    full = [r for r in results if r["status"] == 503]
    images = sum(len(r["answer"]["data"]) for r in ok)
    latency = [r["seconds"] for r in ok]
    queue_wait = [r["answer"]["kiln"]["queue_seconds"] for r in ok]
    run = [r["answer"]["kiln"]["run_seconds"] for r in ok]
    unanswered = [r for r in results if r["status"] not in (200, 503)]
    report = {
        "models": names, "loras": loras, "clients": args.clients, "requests": len(results), "of": args.requests,
        "size": args.size, "steps": args.steps, "queue": args.queue, "dtype": args.dtype,
        "answers": by_status, "edit_answers": edit_status, "wall_seconds": round(wall, 2), "images_per_second": round(images / wall, 3),
        "latency_p50": round(percentile(latency, 50), 3), "latency_p99": round(percentile(latency, 99), 3),
        "queue_wait_p50": round(percentile(queue_wait, 50), 3), "queue_wait_p99": round(percentile(queue_wait, 99), 3),
        "run_p50": round(percentile(run, 50), 3),
        "retry_after_p50": percentile([int(r["retry_after"]) for r in full if r["retry_after"]], 50) if full else None,
        "step_seconds_mean": round(metrics["kiln_step_seconds_sum"] / max(1, metrics["kiln_step_seconds_count"]), 4),
        "rss_loaded_mib": round(rss_loaded / 2**20, 1), "rss_after_warmup_mib": round(rss_warm / 2**20, 1),
        "rss_end_mib": round(metrics["kiln_resident_memory_bytes"] / 2**20, 1), "rss_series_mib": rss_series,
        "warmup_answers": sorted({str(r["status"]) for r in warm}), "server_exit": code,
    }
    print(f"kiln serve load test: {', '.join(names)}{'; LoRA ' + ', '.join(loras) if loras else ''}; {args.clients} clients, {len(results)} requests "
          f"({args.size}, {args.steps} steps, --queue {args.queue}, {args.dtype})")
    print(f"  answers: {by_status}; unanswered or unexpected: {len(unanswered)}"
          + (f"; of them edits: {edit_status}" if edit_status else ""))
    print(f"  throughput: {report['images_per_second']} images/s over {report['wall_seconds']} s")
    print(f"  latency (200s): p50 {report['latency_p50']} s, p99 {report['latency_p99']} s; "
          f"queue wait p50 {report['queue_wait_p50']} s, p99 {report['queue_wait_p99']} s; "
          f"run p50 {report['run_p50']} s; mean step {report['step_seconds_mean']} s")
    print(f"  resident memory: {report['rss_loaded_mib']} MiB loaded, {report['rss_after_warmup_mib']} MiB after "
          f"warm-up, {report['rss_series_mib']} MiB at each tenth, {report['rss_end_mib']} MiB at the end; "
          f"server exit status {code}")
    print("RESULT " + json.dumps(report))
    for r in unanswered[:5]:
        print(f"  unexpected: {r['status']}", file=sys.stderr)
    failed_warmup = [r for r in warm if r["status"] != 200]
    if failed_warmup:
        print(f"  the warm-up was not answered with 200: {failed_warmup[0]['status']}", file=sys.stderr)
    return 1 if unanswered or failed_warmup or code != 0 or len(results) < args.requests else 0


if __name__ == "__main__":
    sys.exit(main())
