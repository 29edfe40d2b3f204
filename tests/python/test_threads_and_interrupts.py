"""Calls release the GIL: two Python threads calling one pipeline each get their single-run image; Ctrl-C
cancels a call within one denoising step and the pipeline serves the next call unchanged."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import kiln
from conftest import small_call


def test_two_threads_calling_one_pipeline(tiny_flux):
    alone = [np.asarray(tiny_flux(**small_call(generator=s)).images[0]) for s in (11, 12)]
    assert not np.array_equal(alone[0], alone[1])
    got = [None, None]
    start = threading.Barrier(2)

    def call(i):
        start.wait()
        got[i] = np.asarray(tiny_flux(**small_call(generator=11 + i)).images[0])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert np.array_equal(got[0], alone[0]) and np.array_equal(got[1], alone[1])


def test_the_gil_is_released_during_a_call(tiny_flux):
    def timed_call(steps):
        """Runs a call of `steps` steps while another thread ticks; returns its seconds and the ticks inside."""
        ticks = []
        stop = threading.Event()

        def tick():
            while not stop.is_set():
                ticks.append(time.monotonic())
                time.sleep(0.002)

        t = threading.Thread(target=tick)
        t.start()
        start = time.monotonic()
        try:
            # No callback and no progress bar: no Python runs inside the call.
            tiny_flux(**small_call(generator=3, num_inference_steps=steps, height=128, width=128))
        finally:
            took = time.monotonic() - start
            stop.set()
            t.join()
        return took, [x for x in ticks if start + 0.05 < x < start + took - 0.05]

    # One call long enough to tell on any machine: more steps until it takes half a second.
    steps = 8
    took, during = timed_call(steps)
    while took < 0.5 and steps < 3200:
        steps *= 4
        took, during = timed_call(steps)
    # A call holding the GIL would let the other thread run no Python at all until it returned.
    assert took > 0.2, f"the call took {took:.3f} s at {steps} steps, too short to tell"
    assert len(during) >= 5, f"another Python thread ran {len(during)} times during a {took:.2f} s call"


def test_ctrl_c_cancels_within_one_step(tiny_flux):
    steps = []
    plain = np.asarray(tiny_flux(**small_call(generator=9, num_inference_steps=8)).images[0])

    def on_step(pipe, step, timestep, kwargs):
        steps.append(time.monotonic())
        if step == 1:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends
            time.sleep(0.3)  # the interrupt is seen while the call runs
        return kwargs

    # Python turns SIGINT into KeyboardInterrupt only where it was not ignored when the interpreter started (a
    # process started in the background by a non-interactive shell inherits SIGINT ignored): install it here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            tiny_flux(**small_call(generator=9, num_inference_steps=8), callback_on_step_end=on_step)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert 2 <= len(steps) <= 3, f"{len(steps)} steps ran; the call must stop within one step of the interrupt"
    assert np.array_equal(np.asarray(tiny_flux(**small_call(generator=9, num_inference_steps=8)).images[0]), plain)
