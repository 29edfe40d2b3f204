"""Kiln's job API: POST /v1/generate queues a job, GET /v1/jobs/{id}/events follows it (queued, running, each
step, done with the image's URL), the image is the one the OpenAI endpoint gives, DELETE cancels, and a client
that reconnects with Last-Event-ID gets only what it missed."""

import base64
import json
import time
import urllib.request

import numpy as np

from conftest import LONG, TINY, decode_png


def events(server, job_id, last_event_id=None, timeout=120):
    """Every (name, data) of the job's event stream, read to its end."""
    req = urllib.request.Request(f"{server.url}/v1/jobs/{job_id}/events")
    if last_event_id is not None:
        req.add_header("Last-Event-ID", str(last_event_id))
    with urllib.request.urlopen(req, timeout=timeout) as res:
        assert res.headers["Content-Type"].startswith("text/event-stream")
        text = res.read().decode()
    out = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":"))
        if "event" in fields:
            out.append((fields["event"], json.loads(fields["data"]), int(fields["id"])))
    return out


def test_a_job_reports_each_step_and_its_image(tiny_server):
    body = {"model": "flux-tiny-schnell", "prompt": "a green triangle", "seed": 5, **TINY, "steps": 4}
    status, job = tiny_server.json("POST", "/v1/generate", body)
    assert status == 202 and job["status"] in ("queued", "running") and job["id"].startswith("job_")
    stream = events(tiny_server, job["id"])
    names = [name for name, _, _ in stream]
    assert names[0] == "queued" and names[1] == "running" and names[-1] == "done", names
    steps = [data for name, data, _ in stream if name == "step"]
    assert [(s["step"], s["steps"]) for s in steps] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert [i for _, _, i in stream] == list(range(1, len(stream) + 1))
    done = stream[-1][1]
    assert done["seed"] == 5 and len(done["images"]) == 1

    status, headers, png = tiny_server.request("GET", done["images"][0])
    assert status == 200 and headers["Content-Type"] == "image/png"
    status, finished = tiny_server.json("GET", f"/v1/jobs/{job['id']}")
    assert finished["status"] == "succeeded" and finished["images"] == done["images"]
    assert finished["params"] == {"model": "flux-tiny-schnell", "prompt": "a green triangle", "seed": 5, "n": 1,
                                  "size": "32x32", "steps": 4, "max_sequence_length": 16}
    # The same parameters through the OpenAI endpoint: the same image.
    status, sync = tiny_server.json("POST", "/v1/images/generations", body)
    np.testing.assert_array_equal(decode_png(png)[0], decode_png(base64.b64decode(sync["data"][0]["b64_json"]))[0])

    # A client that reconnects after the third event gets the rest only.
    rest = events(tiny_server, job["id"], last_event_id=3)
    assert [i for _, _, i in rest] == list(range(4, len(stream) + 1))


def test_delete_cancels_a_running_job_at_its_next_step(tiny_server):
    cancelled_before = tiny_server.metric('kiln_jobs_total{status="cancelled"}')
    _, job = tiny_server.json("POST", "/v1/generate", {**LONG, "seed": 1})
    tiny_server.wait_for(lambda: tiny_server.json("GET", f"/v1/jobs/{job['id']}")[1].get("progress"), "a first step")
    start = time.monotonic()
    status, answer = tiny_server.json("DELETE", f"/v1/jobs/{job['id']}")
    assert status == 200
    stream = events(tiny_server, job["id"])
    assert stream[-1][0] == "cancelled" and "DELETE" in stream[-1][1]["error"]["message"]
    assert time.monotonic() - start < 5  # within a step, not after the 1000
    _, ended = tiny_server.json("GET", f"/v1/jobs/{job['id']}")
    assert ended["status"] == "cancelled" and ended["progress"]["step"] < 1000 and ended["images"] == []
    # The queue counts a job's end just after the job publishes it (the worker thread, once the pipeline call
    # has returned): wait for the count rather than race it.
    counted = lambda: tiny_server.metric('kiln_jobs_total{status="cancelled"}') == cancelled_before + 1
    tiny_server.wait_for(counted, "the cancelled job to be counted", timeout=10)
    assert tiny_server.metric('kiln_jobs_total{status="cancelled"}') == cancelled_before + 1
    # Cancelling again is a no-op answer; an ended job cannot be cancelled.
    status, again = tiny_server.json("DELETE", f"/v1/jobs/{job['id']}")
    assert status == 200 and again["status"] == "cancelled"


def test_a_finished_job_cannot_be_cancelled_and_unknown_jobs_are_404(tiny_server):
    _, job = tiny_server.json("POST", "/v1/generate", {"prompt": "x", "seed": 1, **TINY})
    events(tiny_server, job["id"])
    status, error = tiny_server.json("DELETE", f"/v1/jobs/{job['id']}")
    assert status == 409 and error["error"]["code"] == "job_ended"
    for method, path in [("GET", "/v1/jobs/job_0123456789abcdef"), ("DELETE", "/v1/jobs/job_0123456789abcdef"),
                         ("GET", "/v1/jobs/job_0123456789abcdef/events"), ("GET", f"/v1/jobs/{job['id']}/images/1.png")]:
        status, error = tiny_server.json(method, path)
        assert status == 404 and error["error"]["type"] == "not_found_error", (method, path)


def test_health_and_metrics(tiny_server):
    status, health = tiny_server.json("GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["models"] == 2 and health["models_loaded"] == 2
    assert health["api_key_required"] is False
    _, headers, text = tiny_server.request("GET", "/metrics")
    assert headers["Content-Type"].startswith("text/plain")
    text = text.decode()
    for name in ("kiln_queue_length", "kiln_jobs_running", "kiln_images_total", "kiln_step_seconds_count",
                 "kiln_queue_wait_seconds_bucket", "kiln_errors_total", "kiln_resident_memory_bytes",
                 'kiln_http_responses_total{code="200"}'):
        assert f"\n{name}" in text, name
    assert tiny_server.metric("kiln_images_total") >= 1
    assert tiny_server.metric("kiln_resident_memory_bytes") > 1e6
