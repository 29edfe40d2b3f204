"""kiln serve --tp 2 under `kiln launch`: rank 0 serves and announces each job to rank 1, which makes the same
call; the image is the one `mpirun -np 2 kiln generate --tp 2` writes, a DELETE cancels on both ranks, and
SIGTERM stops both."""

import base64
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import FLUX, LONG, TINY, Server, decode_png, kiln_binary

MPIRUN = shutil.which("mpirun")
if MPIRUN is None:
    pytest.skip("needs OpenMPI's mpirun (apt-get install openmpi-bin)", allow_module_level=True)

# OpenMPI refuses to start as root without these (CI runs as root); two ranks share CI's two cores.
MPI_ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def test_two_ranks_serve_the_image_of_two_ranks(tmp_path):
    server = Server("--model", FLUX, launch=["-n", "2", "--oversubscribe"], env=MPI_ENV)
    try:
        status, answer = server.json("POST", "/v1/images/generations", {"prompt": "a red circle", "seed": 1, **TINY})
        assert status == 200, answer
        served = decode_png(base64.b64decode(answer["data"][0]["b64_json"]))[0]
        out = tmp_path / "tp2.png"
        subprocess.run([MPIRUN, "-np", "2", "--oversubscribe", kiln_binary(), "generate", "--tp", "2", "--model", FLUX,
                        "--prompt", "a red circle", "--seed", "1", "--height", "32", "--width", "32", "--steps", "2",
                        "--dtype", "f32", "--max-sequence-length", "16", "--output", str(out)],
                       check=True, capture_output=True, env=MPI_ENV, timeout=120)
        np.testing.assert_array_equal(served, decode_png(out.read_bytes())[0])

        # A cancelled job stops on both ranks: the next job still runs (rank 1 is not stuck in the old one).
        _, job = server.json("POST", "/v1/generate", {**LONG, "seed": 2})
        server.wait_for(lambda: server.json("GET", f"/v1/jobs/{job['id']}")[1].get("progress"), "a first step")
        assert server.json("DELETE", f"/v1/jobs/{job['id']}")[0] == 200
        server.wait_for(lambda: server.json("GET", f"/v1/jobs/{job['id']}")[1]["status"] == "cancelled", "the cancel")
        status, again = server.json("POST", "/v1/images/generations", {"prompt": "a red circle", "seed": 1, **TINY})
        assert status == 200
        np.testing.assert_array_equal(decode_png(base64.b64decode(again["data"][0]["b64_json"]))[0], served)
    finally:
        assert server.stop() == 0, server.log()
