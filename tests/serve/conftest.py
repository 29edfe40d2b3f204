"""What the tests of `kiln serve` share: a server started on a free loopback port (--port 0, the port read from
its first lines), `kiln generate` for reference images, and PNG decoding. The kiln binary comes from $KILN_BIN
(ctest passes the one it built); the tiny models from tests/data/models."""

import io
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "data" / "models"
FLUX = str(MODELS / "flux-tiny-schnell")
SD3 = str(MODELS / "sd3-tiny-medium")
CHROMA = str(MODELS / "chroma-tiny")
Z_IMAGE = str(MODELS / "z-image-tiny")
QWEN_IMAGE = str(MODELS / "qwen-image-tiny")
SHAPES = str(ROOT / "models" / "kiln-shapes-64")
LORAS = str(ROOT / "tests" / "data" / "lora")
# A request of the tiny models that runs in a fraction of a second.
TINY = {"size": "32x32", "steps": 2, "max_sequence_length": 16}
# One that runs for seconds (1000 steps at 256x256): long enough to cancel, queue behind or disconnect from.
LONG = {"prompt": "a long job", "size": "256x256", "steps": 1000, "max_sequence_length": 16}


def kiln_binary():
    path = os.environ.get("KILN_BIN", str(ROOT / "build" / "kiln"))
    if not os.access(path, os.X_OK):
        pytest.fail(f"no kiln binary at {path} (set KILN_BIN, as ctest does)")
    return path


class Server:
    """`kiln serve ARGS --port 0` in the background; .url once it listens, .stop() sends SIGTERM."""

    def __init__(self, *args, env=None, timeout=120, launch=()):
        # launch: `kiln launch` flags (["-n", "2"]) to start the server as several ranks under mpirun.
        launcher = [kiln_binary(), "launch", *launch, "--"] if launch else [kiln_binary()]
        self.args = [*launcher, "serve", "--port", "0", "--dtype", "f32", *args]
        self.process = subprocess.Popen(self.args, stderr=subprocess.PIPE, text=True, env=env)
        self.lines = []
        listening = threading.Event()
        self.url = None

        def read():
            for line in self.process.stderr:
                self.lines.append(line.rstrip("\n"))
                found = re.search(r"serving .* on (http://[^/]+)/.*pid (\d+)", line)
                if found:
                    self.url = found.group(1)
                    self.pid = int(found.group(2))  # rank 0's under `kiln launch`
                    listening.set()
            listening.set()  # it exited

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        listening.wait(timeout)
        if self.url is None:
            self.process.kill()
            raise RuntimeError(f"kiln serve did not start: {self.log()}")

    def log(self):
        return "\n".join(self.lines)

    def stop(self, timeout=60):
        """SIGTERM to the server (rank 0 under mpirun), then the exit status (the server drains first)."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        self.reader.join(10)
        return code

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, headers, body bytes) of one request; errors are answers, not exceptions."""
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as res:
                return res.status, res.headers, res.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def json(self, method, path, body=None, headers=None, timeout=120):
        status, _, raw = self.request(method, path, body, headers, timeout)
        return status, json.loads(raw)

    def metric(self, name):
        """The value of one line of GET /metrics (`name` with its labels)."""
        _, _, text = self.request("GET", "/metrics")
        for line in text.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise KeyError(f"no metric {name}")

    def wait_for(self, condition, what, timeout=30):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if condition():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; server log:\n{self.log()}")


@pytest.fixture(scope="module")
def tiny_server():
    server = Server("--model", FLUX, "--model", SD3)
    yield server
    assert server.stop() == 0, server.log()


def kiln_generate(tmp_path, model, prompt, seed, size="32x32", steps=2, guidance=None, negative_prompt=None,
                  true_cfg_scale=None, max_sequence_length=16, name="reference.png", **flags):
    """The PNG `kiln generate` writes for these parameters, as bytes; `flags` are more request fields, by their
    names (cfg_truncation=0.5: --cfg-truncation 0.5)."""
    width, height = size.split("x")
    out = tmp_path / name
    args = [kiln_binary(), "generate", "--model", model, "--prompt", prompt, "--seed", str(seed), "--width", width,
            "--height", height, "--steps", str(steps), "--dtype", "f32", "--output", str(out)]
    if max_sequence_length is not None:
        args += ["--max-sequence-length", str(max_sequence_length)]
    if guidance is not None:
        args += ["--guidance", str(guidance)]
    if negative_prompt is not None:
        args += ["--negative-prompt", negative_prompt]
    if true_cfg_scale is not None:
        args += ["--true-cfg-scale", str(true_cfg_scale)]
    for field, value in flags.items():
        args += ["--" + field.replace("_", "-"), str(value)]
    subprocess.run(args, check=True, capture_output=True, timeout=120)
    return out.read_bytes()


def decode_png(data):
    """(pixels as a uint8 array, the PNG's text chunks)."""
    image = Image.open(io.BytesIO(data))
    image.load()
    return np.asarray(image), dict(image.text)
