"""kiln serve --device: the pipelines on a PJRT device (xla-cpu, the CPU plugin CI has), and --tp N there as N
threads of the one process, one device each (rank 0 serves; its jobs run on the queue's worker acting as rank
0). The images are the ones `kiln generate` writes with the same flags; a device without its plugin, or a name
no backend knows, fails before serving."""

import base64
import subprocess

import numpy as np
import pytest

from conftest import FLUX, LONG, TINY, Server, decode_png, kiln_binary


def xla_cpu_devices():
    info = subprocess.run([kiln_binary(), "info", "--devices"], capture_output=True, text=True, timeout=60)
    for line in info.stdout.splitlines():
        if line.startswith("xla-cpu: ") and line.split()[1].isdigit():
            return int(line.split()[1])
    return 0


if xla_cpu_devices() < 2:
    pytest.skip("needs the xla-cpu PJRT plugin (./scripts/setup.sh --pjrt)", allow_module_level=True)


def generate(tmp_path, *flags):
    out = tmp_path / "reference.png"
    subprocess.run([kiln_binary(), "generate", "--model", FLUX, "--prompt", "a red circle", "--seed", "1",
                    "--height", "32", "--width", "32", "--steps", "2", "--dtype", "f32", "--max-sequence-length",
                    "16", *flags, "--output", str(out)], check=True, capture_output=True, timeout=300)
    return decode_png(out.read_bytes())[0]


def served_image(server):
    status, answer = server.json("POST", "/v1/images/generations", {"prompt": "a red circle", "seed": 1, **TINY})
    assert status == 200, answer
    return decode_png(base64.b64decode(answer["data"][0]["b64_json"]))[0]


def test_serves_on_a_device(tmp_path):
    server = Server("--model", FLUX, "--device", "xla-cpu:1")
    try:
        assert "every component on xla-cpu:1" in server.log()
        assert "packed copies" not in server.log()  # the cpu's packed weights are never made on a device
        np.testing.assert_array_equal(served_image(server), generate(tmp_path, "--device", "xla-cpu:1"))
        # /metrics reports what Kiln holds on the device: the weights now, the weights and a call's activations
        # at most. The CPU plugin reports nothing of the device itself, and no budget limits it.
        held = server.metric('kiln_device_allocated_bytes{device="xla-cpu:1"}')
        assert held > 0
        assert server.metric('kiln_device_allocated_peak_bytes{device="xla-cpu:1"}') > held
        _, _, text = server.request("GET", "/metrics")
        assert b"kiln_device_memory_total_bytes" not in text and b"kiln_device_memory_limit_bytes" not in text
        assert b'device="xla-cpu:0"' not in text
    finally:
        assert server.stop() == 0, server.log()


def test_two_in_process_ranks_serve_the_image_of_two_ranks(tmp_path):
    server = Server("--model", FLUX, "--device", "xla-cpu", "--tp", "2")
    try:
        assert "every component on xla-cpu:0, split over 2 devices to xla-cpu:1 (one thread each)" in server.log()
        served = served_image(server)
        np.testing.assert_array_equal(served, generate(tmp_path, "--device", "xla-cpu", "--tp", "2"))
        for device in ("xla-cpu:0", "xla-cpu:1"):  # each rank's shards
            assert server.metric(f'kiln_device_allocated_bytes{{device="{device}"}}') > 0, device

        # A cancelled job stops on both ranks: the next job still runs (rank 1 is not stuck in the old one).
        _, job = server.json("POST", "/v1/generate", {**LONG, "seed": 2})
        server.wait_for(lambda: server.json("GET", f"/v1/jobs/{job['id']}")[1].get("progress"), "a first step", 120)
        assert server.json("DELETE", f"/v1/jobs/{job['id']}")[0] == 200
        server.wait_for(lambda: server.json("GET", f"/v1/jobs/{job['id']}")[1]["status"] == "cancelled", "the cancel")
        np.testing.assert_array_equal(served_image(server), served)
    finally:
        assert server.stop() == 0, server.log()  # SIGTERM: rank 0 drains and tells rank 1 to stop


@pytest.mark.parametrize("device, message", [
    ("tpu", "no tpu plugin found. Install it"),            # libtpu is never installed off a TPU VM
    ("gpu", "--device gpu: "),                            # no backend by that name
    ("xla-cpu:4096", "xla-cpu:4096"),                     # past the plugin's devices
])
def test_a_device_that_cannot_serve_fails_before_serving(device, message):
    run = subprocess.run([kiln_binary(), "serve", "--model", FLUX, "--port", "0", "--device", device],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert message in run.stderr, run.stderr
    assert "serving" not in run.stderr
