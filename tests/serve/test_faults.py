"""kiln serve under faults: bad requests of every kind get a 4xx naming the field (never a crash), a full queue
answers 503 with Retry-After, a client that disconnects cancels its job, the API key is required and a wrong
one refused, a failure inside a job fails that job only, and SIGTERM drains the server and exits 0."""

import base64
import json
import shutil
import socket
import subprocess
import threading
import time

import openai
import pytest

from conftest import FLUX, LONG, SD3, TINY, Server, decode_png, kiln_binary


@pytest.mark.parametrize("body,status,param,words", [
    (b'{"prompt": "x",', 400, None, "not valid JSON"),
    (b"\xff\xfe", 400, None, "not valid JSON"),
    (b"[1, 2]", 400, None, "expected a JSON object"),
    (b"[" * 100000, 400, None, "nests deeper"),
    ({"model": "flux-tiny-schnell"}, 400, "prompt", "required"),
    ({"prompt": 3}, 400, "prompt", "expected a string"),
    ({"prompt": "x", "seed": "one"}, 400, "seed", "expected an integer"),
    ({"prompt": "x", "steps": 1.5}, 400, "steps", "expected an integer"),
    ({"prompt": "x", "n": 0}, 400, "n", "below the minimum 1"),
    ({"prompt": "x", "n": 65}, 400, "n", "exceeds the maximum 64"),
    ({"prompt": "x", "steps": 1001}, 400, "steps", "exceeds the maximum 1000"),
    ({"prompt": "x", "size": "16400x16"}, 400, "size", "exceeds the maximum 16384"),
    ({"prompt": "x", "size": "big"}, 400, "size", "WIDTHxHEIGHT"),
    ({"prompt": "x" * 65537}, 400, "prompt", "more than the maximum 65536"),
    ({"prompt": "x", "max_sequence_length": 513}, 400, "max_sequence_length", "exceeds the maximum 512"),
    ({"prompt": "x", "sead": 1}, 400, "sead", "unknown field"),
    ({"prompt": "x", "size": "40x32"}, 400, "size", "multiples of 16"),  # the pipeline's own check
    ({"prompt": "x", "true_cfg_scale": -1}, 400, "true_cfg_scale", "expected a finite number >= 0"),
    ({"prompt": "x", "true_cfg_scale": "4"}, 400, "true_cfg_scale", "expected a number >= 0"),
    ({"prompt": "x", "model": "sdxl"}, 404, "model", "not served here"),
])
def test_bad_requests_get_a_4xx_naming_the_field(tiny_server, body, status, param, words):
    for path in ("/v1/images/generations", "/v1/generate"):
        got, headers, raw = tiny_server.request("POST", path, body)
        error = json.loads(raw)["error"]
        assert got == status and error["param"] == param and words in error["message"], (path, error)
    assert tiny_server.json("GET", "/health")[1]["status"] == "ok"


def test_oversized_bodies_and_unknown_routes(tiny_server):
    big = json.dumps({"prompt": "x" * (49 << 20)}).encode()  # past the 48 MiB an edit's images may take
    try:
        status, _, raw = tiny_server.request("POST", "/v1/generate", big)
        assert status == 413 and "larger than the maximum 50331648" in json.loads(raw)["error"]["message"]
    except (ConnectionError, OSError):
        pass  # the server may close the connection before the client has sent everything: also a refusal
    status, error = tiny_server.json("GET", "/v1/nothing")
    assert status == 404 and error["error"]["type"] == "not_found_error"
    status, error = tiny_server.json("PUT", "/v1/generate", {"prompt": "x"})
    assert status == 404
    assert tiny_server.json("GET", "/health")[0] == 200


def test_a_full_queue_answers_503_with_retry_after():
    server = Server("--model", FLUX, "--queue", "1")
    try:
        _, running = server.json("POST", "/v1/generate", {**LONG, "seed": 1})
        server.wait_for(lambda: server.metric("kiln_jobs_running") == 1, "the first job to run")
        status, waiting = server.json("POST", "/v1/generate", {**LONG, "seed": 2})
        assert status == 202 and waiting["status"] == "queued" and waiting["position"] == 0
        for path in ("/v1/generate", "/v1/images/generations"):
            status, headers, raw = server.request("POST", path, {**LONG, "seed": 3})
            error = json.loads(raw)["error"]
            assert status == 503 and error["code"] == "queue_full" and "--queue 1" in error["message"]
            assert 1 <= int(headers["Retry-After"]) <= 3600
        assert server.metric("kiln_jobs_refused_total") == 2
        assert server.metric("kiln_queue_length") == 1
        for job in (waiting, running):
            assert server.json("DELETE", f"/v1/jobs/{job['id']}")[0] == 200
        server.wait_for(lambda: server.metric("kiln_jobs_running") == 0, "the jobs to end")
        status, _ = server.json("POST", "/v1/generate", {"prompt": "x", **TINY})
        assert status == 202  # room again
    finally:
        assert server.stop() == 0, server.log()


def test_a_client_that_disconnects_cancels_its_job(tiny_server):
    cancelled = tiny_server.metric('kiln_jobs_total{status="cancelled"}')
    body = json.dumps({**LONG, "seed": 4}).encode()
    host, port = tiny_server.url[len("http://"):].split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        tiny_server.wait_for(lambda: tiny_server.metric("kiln_jobs_running") == 1, "the job to run")
    start = time.monotonic()
    tiny_server.wait_for(lambda: tiny_server.metric('kiln_jobs_total{status="cancelled"}') == cancelled + 1,
                         "the job to be cancelled", timeout=10)
    assert time.monotonic() - start < 5
    assert any("cancelled after" in line and "the client closed its connection" in line for line in tiny_server.lines)


def test_the_api_key_is_required_and_a_wrong_one_refused():
    server = Server("--model", FLUX, "--api-key", "s3cret-key")
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic czNjcmV0LWtleQ=="}):
            for method, path in (("POST", "/v1/images/generations"), ("POST", "/v1/generate"), ("GET", "/v1/models"),
                                 ("GET", "/metrics"), ("GET", "/v1/jobs/job_0123456789abcdef")):
                status, answer_headers, raw = server.request(method, path, {"prompt": "x"} if method == "POST" else None,
                                                             headers)
                assert status == 401 and json.loads(raw)["error"]["code"] == "invalid_api_key", (headers, path)
                assert answer_headers["WWW-Authenticate"] == "Bearer"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
        # The right key; the page and the health check need none.
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret-key", max_retries=0)
        result = c.images.generate(model="flux-tiny-schnell", prompt="x", size="32x32",
                                   extra_body={"seed": 1, "steps": 2, "max_sequence_length": 16})
        assert decode_png(base64.b64decode(result.data[0].b64_json))[0].shape == (32, 32, 3)
        assert server.json("GET", "/health")[1]["api_key_required"] is True
        assert server.request("GET", "/")[0] == 200
        assert server.request("GET", "/metrics", headers={"Authorization": "Bearer s3cret-key"})[0] == 200
    finally:
        assert server.stop() == 0, server.log()


def test_beyond_loopback_a_key_is_required_to_start():
    result = subprocess.run([kiln_binary(), "serve", "--model", FLUX, "--host", "0.0.0.0", "--port", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "--host 0.0.0.0 serves beyond this machine: give an --api-key" in result.stderr


def test_a_failure_inside_a_job_fails_that_job_only(tmp_path):
    # A copy of the tiny model whose transformer file was cut short: it fails when a job loads it (models are
    # loaded on first use under --max-memory), and only that job fails.
    broken = tmp_path / "flux-broken"
    shutil.copytree(FLUX, broken)
    weights = broken / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100000])
    server = Server("--model", FLUX, "--model", str(broken), "--max-memory", "1GiB")
    try:
        assert server.json("GET", "/health")[1]["models_loaded"] == 0
        for _ in range(2):
            status, error = server.json("POST", "/v1/images/generations", {"model": "flux-broken", "prompt": "x", **TINY})
            assert status == 500 and error["error"]["type"] == "server_error"
            assert "diffusion_pytorch_model.safetensors" in error["error"]["message"], error
            status, ok = server.json("POST", "/v1/images/generations", {"model": "flux-tiny-schnell", "prompt": "x",
                                                                        "seed": 1, **TINY})
            assert status == 200 and len(ok["data"]) == 1
        assert server.metric('kiln_jobs_total{status="failed"}') == 2
        assert server.metric("kiln_errors_total") == 2 + 2  # the failed jobs and their 500 answers
        assert server.json("GET", "/health")[1]["models_loaded"] == 1  # one model at a time under --max-memory
    finally:
        assert server.stop() == 0, server.log()


def test_sigterm_drains_and_exits_0():
    server = Server("--model", FLUX, "--model", SD3)
    answers = []
    sync = threading.Thread(target=lambda: answers.append(server.json("POST", "/v1/images/generations",
                                                                      {**LONG, "seed": 8})))
    sync.start()
    server.wait_for(lambda: server.metric("kiln_jobs_running") == 1, "the job to run")
    _, queued = server.json("POST", "/v1/generate", {**LONG, "seed": 9})
    start = time.monotonic()
    assert server.stop(timeout=30) == 0, server.log()
    assert time.monotonic() - start < 10  # the running job stopped at its next step, not after 1000
    sync.join(10)
    status, error = answers[0]
    assert status == 503 and "shutting down" in error["error"]["message"]
    log = server.log()
    assert "stopping: cancelling 1 waiting and 1 running job(s)" in log and "kiln: stopped" in log
    assert f"{queued['id']} flux-tiny-schnell 256x256, seed 9: cancelled after 0 step(s)" in log
