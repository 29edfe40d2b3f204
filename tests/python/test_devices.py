"""pipe.to("xla-cpu"): the whole pipeline on a PJRT device (XLA's CPU compiler, the plugin scripts/setup.sh --pjrt
installs), giving the CPU backend's image; pipe.vae.to moves one component. Skipped only when Kiln was built
without PJRT support."""

import numpy as np
import pytest

import kiln
from conftest import data_path, small_call


def to_xla_cpu_or_skip(pipe):
    try:
        pipe.to("xla-cpu")
    except kiln.KilnError as e:
        if "has no PJRT support" in str(e):
            pytest.skip("this build of Kiln has no PJRT support")
        raise


def test_pipeline_on_xla_cpu_gives_the_cpu_image():
    pipe = kiln.FluxPipeline.from_pretrained(data_path("models", "flux-tiny-dev"))
    pipe.set_progress_bar_config(disable=True)
    on_cpu = np.asarray(pipe(**small_call(generator=5)).images[0]).astype(int)
    assert pipe.device == "cpu"
    to_xla_cpu_or_skip(pipe)
    assert pipe.device == "xla-cpu:0"
    on_device = np.asarray(pipe(**small_call(generator=5)).images[0]).astype(int)
    assert on_device.shape == on_cpu.shape
    assert np.abs(on_device - on_cpu).max() <= 1
    # Arrays and latents come back to the host; the callback reads the device's latents.
    seen = []

    def record(p, step, timestep, kwargs):
        seen.append(float(kwargs["latents"].abs().sum()))
        return kwargs

    array = pipe(**small_call(generator=5), output_type="np", callback_on_step_end=record).images
    assert array.shape == (1, 32, 32, 3) and len(seen) == 2 and all(v > 0 for v in seen)
    assert np.abs(np.rint(array[0] * 255).astype(int) - on_cpu).max() <= 1


def test_vae_alone_moves_to_xla_cpu():
    pipe = kiln.FluxPipeline.from_pretrained(data_path("models", "flux-tiny-schnell"))
    pipe.set_progress_bar_config(disable=True)
    on_cpu = np.asarray(pipe(**small_call(generator=3)).images[0]).astype(int)
    try:
        pipe.vae.to("xla-cpu")
    except kiln.KilnError as e:
        if "has no PJRT support" in str(e):
            pytest.skip("this build of Kiln has no PJRT support")
        raise
    assert pipe.device == "cpu"  # the transformer stays
    split = np.asarray(pipe(**small_call(generator=3)).images[0]).astype(int)
    assert np.abs(split - on_cpu).max() <= 1


def test_offload_onto_xla_cpu_through_the_python_api():
    """diffusers' enable_group_offload(onload_device=...) and a memory budget on the device: the weights stay on
    the host and are copied in as they run; the image is the resident one."""
    pipe = kiln.FluxPipeline.from_pretrained(data_path("models", "flux-tiny-schnell"))
    pipe.set_progress_bar_config(disable=True)
    to_xla_cpu_or_skip(pipe)
    resident = np.asarray(pipe(**small_call(generator=4)).images[0]).astype(int)
    pipe.to("cpu")
    pipe.enable_group_offload(onload_device="xla-cpu", num_blocks_per_group=1)
    assert pipe.device == "xla-cpu:0"
    grouped = np.asarray(pipe(**small_call(generator=4)).images[0]).astype(int)
    assert np.abs(grouped - resident).max() == 0
    said = pipe.set_memory_budget(8 << 30, device="xla-cpu")
    assert "of it kept for activations" in said and "no offload" in said
    assert np.abs(np.asarray(pipe(**small_call(generator=4)).images[0]).astype(int) - resident).max() == 0
    with pytest.raises(kiln.KilnError, match="is below the largest weight"):
        pipe.set_memory_budget(1024, device="xla-cpu")
    lines = pipe.configure(offload="model", device="xla-cpu")
    assert any("model offload" in line and "xla-cpu:0" in line for line in lines)
    assert np.abs(np.asarray(pipe(**small_call(generator=4)).images[0]).astype(int) - resident).max() == 0


def test_memory_stats_and_devices():
    """torch.cuda.memory_stats' counterpart on any device: what Kiln holds there now and at most, its limit, and
    what the plugin reports of the device (nothing, for the CPU plugin)."""
    assert "cpu" in kiln.devices()
    cpu = kiln.memory_stats()
    assert cpu["current_bytes"] >= 0 and cpu["peak_bytes"] >= cpu["current_bytes"]
    assert cpu["device_total_bytes"] is None and cpu["limit_bytes"] is None
    assert 0 <= cpu["system_allocations"] <= cpu["allocations"], "the rest came from the allocator's cache"
    with pytest.raises(kiln.KilnError, match="no-such-device"):
        kiln.memory_stats("no-such-device")
    pipe = kiln.FluxPipeline.from_pretrained(data_path("models", "flux-tiny-schnell"))
    pipe.set_progress_bar_config(disable=True)
    before = kiln.memory_stats("xla-cpu:0")["current_bytes"] if "xla-cpu:0" in kiln.devices() else 0
    to_xla_cpu_or_skip(pipe)
    assert "xla-cpu:0" in kiln.devices()
    # pipe.to returns once the weights are on the device.
    held = kiln.memory_stats("xla-cpu:0")["current_bytes"]
    assert held > before, "the weights are on the device"
    kiln.reset_peak_memory_stats("xla-cpu:0")
    pipe(**small_call(generator=2))
    stats = kiln.memory_stats("xla-cpu:0")
    assert stats["peak_bytes"] > held, "the call's activations came on top of the weights"
    assert stats["device_total_bytes"] is None and stats["device_in_use_bytes"] is None
    pipe.set_memory_budget(8 << 30, device="xla-cpu")
    assert kiln.memory_stats("xla-cpu:0")["limit_bytes"] == 8 << 30
    kiln.reset_peak_memory_stats("xla-cpu:0")
    assert kiln.memory_stats("xla-cpu:0")["peak_bytes"] == kiln.memory_stats("xla-cpu:0")["current_bytes"]
    pipe.to("cpu")
    assert kiln.memory_stats("xla-cpu:0")["limit_bytes"] is None, "pipe.to lifts the budget's limit"
