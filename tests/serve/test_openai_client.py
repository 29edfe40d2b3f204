"""kiln serve through the official `openai` Python client, unchanged: the image it returns is the one
`kiln generate` writes for the same parameters (pixels and text chunks), concurrent clients each get the image
their request gives alone, n images, URLs, and the model list."""

import base64
import concurrent.futures
import subprocess

import numpy as np
import openai
import pytest

from conftest import FLUX, SD3, TINY, decode_png, kiln_binary, kiln_generate


def client(server, key="no key needed"):
    # The client sends its key as a Bearer token even where none is needed; the server accepts any then.
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def generate(c, model, prompt, seed, **kiln_fields):
    result = c.images.generate(model=model, prompt=prompt, n=1, size=TINY["size"], response_format="b64_json",
                               extra_body={"seed": seed, "steps": TINY["steps"],
                                           "max_sequence_length": TINY["max_sequence_length"], **kiln_fields})
    assert len(result.data) == 1
    return base64.b64decode(result.data[0].b64_json)


@pytest.mark.parametrize("model,fields,cli", [
    (FLUX, {}, {}),
    (SD3, {"negative_prompt": "blurry", "guidance": 4.5}, {"negative_prompt": "blurry", "guidance": 4.5}),
    # FLUX.1's true classifier-free guidance (PNG text chunks true_cfg_scale and negative_prompt included).
    (FLUX, {"negative_prompt": "blurry", "true_cfg_scale": 3.5}, {"negative_prompt": "blurry", "true_cfg_scale": 3.5}),
    # A step cache asked for by the request (text chunks cache and cache_reused included).
    (FLUX, {"cache": "fbcache:0.6"}, {"cache": "fbcache:0.6"}),
])
def test_the_image_is_the_one_kiln_generate_makes(tiny_server, tmp_path, model, fields, cli):
    name = model.rstrip("/").split("/")[-1]
    served = generate(client(tiny_server), name, "a red circle", 7, **fields)
    written = kiln_generate(tmp_path, model, "a red circle", 7, size=TINY["size"], steps=TINY["steps"], **cli)
    served_pixels, served_text = decode_png(served)
    written_pixels, written_text = decode_png(written)
    assert served_pixels.shape == (32, 32, 3)
    np.testing.assert_array_equal(served_pixels, written_pixels)
    # The parameters travel in the same text chunks, the model as --model named it.
    assert served_text == written_text
    assert served_text["seed"] == "7" and served_text["model"] == model and served_text["prompt"] == "a red circle"


def test_concurrent_clients_each_get_their_single_run_image(tiny_server):
    c = client(tiny_server)
    requests = [("flux-tiny-schnell", seed) for seed in (11, 12, 13)] + [("sd3-tiny-medium", seed) for seed in (21, 22)]
    alone = {r: generate(c, *r[:1], "a blue square", r[1]) for r in requests}
    # Eight clients at once, each request twice, both models side by side.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = {pool.submit(generate, client(tiny_server), r[0], "a blue square", r[1]): r for r in requests * 2}
        together = [(futures[f], f.result()) for f in concurrent.futures.as_completed(futures)]
    assert len(together) == 2 * len(requests)
    for r, png in together:
        np.testing.assert_array_equal(decode_png(png)[0], decode_png(alone[r])[0], err_msg=f"{r}")
    # Different seeds, different images.
    assert len({decode_png(png)[0].tobytes() for png in alone.values()}) == len(requests)


def test_n_images_and_urls(tiny_server):
    c = client(tiny_server)
    result = c.images.generate(model="flux-tiny-schnell", prompt="two of them", n=2, size="32x32",
                               response_format="url", extra_body={"seed": 3, "steps": 2, "max_sequence_length": 16})
    assert len(result.data) == 2
    images = []
    for item in result.data:
        assert item.url.startswith(tiny_server.url + "/v1/jobs/job_")
        status, headers, png = tiny_server.request("GET", item.url[len(tiny_server.url):])
        assert status == 200 and headers["Content-Type"] == "image/png"
        images.append(decode_png(png)[0])
    assert not np.array_equal(images[0], images[1])  # one noise for the batch: two different images


def test_the_model_list_names_the_served_models(tiny_server):
    models = client(tiny_server).models.list()
    assert [m.id for m in models.data] == ["flux-tiny-schnell", "sd3-tiny-medium"]
    flux = models.data[0].model_dump()
    assert flux["kiln"]["pipeline"] == "FluxPipeline" and flux["kiln"]["loaded"] is True
    assert flux["kiln"]["model"] == FLUX


def test_the_client_reads_errors(tiny_server):
    c = client(tiny_server)
    with pytest.raises(openai.BadRequestError) as e:
        c.images.generate(model="flux-tiny-schnell", prompt="x", size="30x32")
    assert e.value.body["param"] == "size" and "multiples of 16" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError) as e:
        c.images.generate(model="dall-e-3", prompt="x")
    assert e.value.body["code"] == "model_not_found"


def test_a_family_added_later_is_served_with_no_code_of_its_own(tmp_path):
    """Chroma through the OpenAI endpoint: the image kiln generate writes, and its fields (negative prompt and
    guidance, no true_cfg_scale) in the model list the web page builds its form from."""
    from conftest import CHROMA, Server

    server = Server("--model", CHROMA)
    try:
        fields = {"negative_prompt": "blurry", "guidance": 4}
        served = generate(client(server), "chroma-tiny", "a red circle", 3, **fields)
        written = kiln_generate(tmp_path, CHROMA, "a red circle", 3, size=TINY["size"], steps=TINY["steps"], **fields)
        np.testing.assert_array_equal(decode_png(served)[0], decode_png(written)[0])
        model = client(server).models.list().data[0].model_dump()["kiln"]
        assert model["pipeline"] == "ChromaPipeline"
        names = [f["json"] for f in model["fields"]]
        assert "negative_prompt" in names and "guidance" in names and "true_cfg_scale" not in names
        steps = next(f for f in model["fields"] if f["json"] == "steps")
        assert steps["default"] == 35  # ChromaPipeline's, once loaded
    finally:
        assert server.stop() == 0, server.log()


def test_z_image_and_its_own_fields_are_served_with_no_code_of_their_own(tmp_path):
    """Z-Image, guided, with its own request fields (cfg_truncation, cfg_normalization: declared once, in the
    request's table): the image kiln generate writes, and the fields in the model list."""
    from conftest import Z_IMAGE, Server

    server = Server("--model", Z_IMAGE)
    try:
        fields = {"negative_prompt": "blurry", "guidance": 3, "cfg_truncation": 0.5, "cfg_normalization": 1}
        served = generate(client(server), "z-image-tiny", "a red circle", 3, **fields)
        written = kiln_generate(tmp_path, Z_IMAGE, "a red circle", 3, size=TINY["size"], steps=TINY["steps"],
                                **fields)
        np.testing.assert_array_equal(decode_png(served)[0], decode_png(written)[0])
        model = client(server).models.list().data[0].model_dump()["kiln"]
        assert model["pipeline"] == "ZImagePipeline"
        names = [f["json"] for f in model["fields"]]
        assert "cfg_truncation" in names and "cfg_normalization" in names and "true_cfg_scale" not in names
        steps = next(f for f in model["fields"] if f["json"] == "steps")
        assert steps["default"] == 50  # ZImagePipeline's, once loaded
        # Out of range: refused naming the field, before any work.
        with pytest.raises(Exception, match="cfg_truncation"):
            generate(client(server), "z-image-tiny", "a red circle", 3, cfg_truncation=2)
    finally:
        assert server.stop() == 0, server.log()


def test_qwen_image_is_served_with_no_code_of_its_own(tmp_path):
    """Qwen-Image with true CFG (a negative prompt and true_cfg_scale): the image kiln generate writes, and its
    fields in the model list."""
    from conftest import QWEN_IMAGE, Server

    server = Server("--model", QWEN_IMAGE)
    try:
        # 128 tokens: the tiny tokenizer spells the template's system message in more than the 34 tokens the
        # pipeline drops (the real one in exactly 34), so the prompt starts further in.
        fields = {"negative_prompt": "blurry", "true_cfg_scale": 3, "max_sequence_length": 128}
        served = generate(client(server), "qwen-image-tiny", "a red circle", 3, **fields)
        written = kiln_generate(tmp_path, QWEN_IMAGE, "a red circle", 3, size=TINY["size"], steps=TINY["steps"],
                                **fields)
        np.testing.assert_array_equal(decode_png(served)[0], decode_png(written)[0])
        unguided = generate(client(server), "qwen-image-tiny", "a red circle", 3, max_sequence_length=128)
        assert not np.array_equal(decode_png(served)[0], decode_png(unguided)[0])
        model = client(server).models.list().data[0].model_dump()["kiln"]
        assert model["pipeline"] == "QwenImagePipeline"
        names = [f["json"] for f in model["fields"]]
        assert "true_cfg_scale" in names and "negative_prompt" in names and "cfg_truncation" not in names
        steps = next(f for f in model["fields"] if f["json"] == "steps")
        assert steps["default"] == 50  # QwenImagePipeline's, once loaded
        with pytest.raises(Exception, match="max_sequence_length"):
            generate(client(server), "qwen-image-tiny", "a red circle", 3, max_sequence_length=2000)
    finally:
        assert server.stop() == 0, server.log()


def test_the_unet_family_and_its_samplers_are_served_with_no_code_of_their_own(tmp_path):
    """SD1.5 and SDXL (the UNet family), each with a sampler the request names and its own fields (clip_skip,
    SDXL's micro-conditioning): the image kiln generate writes; the sampler in the image's text chunks."""
    from conftest import MODELS, Server

    sd15, sdxl = str(MODELS / "sd15-tiny"), str(MODELS / "sdxl-tiny")
    server = Server("--model", sd15, "--model", sdxl)
    try:
        for model, fields, cli in [
            (sd15, {"scheduler": "euler_a", "clip_skip": 1, "negative_prompt": "blurry"},
             {"scheduler": "euler_a", "clip_skip": 1, "negative_prompt": "blurry"}),
            (sdxl, {"scheduler": "dpmpp_2m", "use_karras_sigmas": True, "original_size": [64, 64]},
             {"scheduler": "dpmpp_2m", "karras": "true", "original_size": "64,64"}),
        ]:
            name = model.rstrip("/").split("/")[-1]
            result = client(server).images.generate(
                model=name, prompt="a red circle", n=1, size=TINY["size"], response_format="b64_json",
                extra_body={"seed": 3, "steps": TINY["steps"], **fields})
            served = base64.b64decode(result.data[0].b64_json)
            written = kiln_generate(tmp_path, model, "a red circle", 3, size=TINY["size"], steps=TINY["steps"],
                                    max_sequence_length=None, **cli)
            np.testing.assert_array_equal(decode_png(served)[0], decode_png(written)[0])
            assert decode_png(served)[1]["scheduler"] == decode_png(written)[1]["scheduler"]
        assert decode_png(served)[1]["scheduler"] == "DPMSolverMultistepScheduler, karras"
        # A sampler Kiln does not have: refused naming the field and the names it has.
        with pytest.raises(openai.BadRequestError, match="dpmpp_2m_karras"):
            client(server).images.generate(model="sd15-tiny", prompt="a red circle", size=TINY["size"],
                                           extra_body={"scheduler": "lms"})
    finally:
        assert server.stop() == 0, server.log()


def test_a_model_folders_recommended_call_is_what_requests_start_from(tmp_path):
    """models/kiln-shapes-64 carries recommended_call.json (64x64, 4 steps, guidance 0, 40 tokens): a request that
    leaves those out gets them, the image kiln generate makes without flags, and GET /v1/models says where the
    defaults come from (the page's placeholders)."""
    from conftest import SHAPES, Server

    server = Server("--model", SHAPES)
    try:
        c = client(server)
        result = c.images.generate(model="kiln-shapes-64", prompt="a big white circle on the right, on a black "
                                   "background", n=1, response_format="b64_json", extra_body={"seed": 0})
        served = base64.b64decode(result.data[0].b64_json)
        pixels, text = decode_png(served)
        assert pixels.shape == (64, 64, 3)
        written = tmp_path / "cli.png"
        subprocess.run([kiln_binary(), "generate", "--model", SHAPES, "--prompt",
                        "a big white circle on the right, on a black background", "--seed", "0", "--dtype", "f32",
                        "--output", str(written)], check=True, capture_output=True, timeout=120)
        np.testing.assert_array_equal(pixels, decode_png(written.read_bytes())[0])
        model = c.models.list().data[0].model_dump()["kiln"]
        assert model["defaults"] == {"size": "64x64", "steps": 4, "guidance": 0.0, "max_sequence_length": 40,
                                     "source": "recommended_call.json"}
        steps = next(f for f in model["fields"] if f["json"] == "steps")
        assert steps["default"] == 4
    finally:
        assert server.stop() == 0, server.log()


def test_each_job_runs_with_the_adapters_it_asks_for(tmp_path):
    """--lora-dir offers a folder's LoRA files by name; a request's "loras" applies them to its job only (unfused,
    at its scales), next to jobs with other adapters or none, each the image kiln generate --lora makes."""
    from conftest import LORAS, Z_IMAGE, Server

    lora_dir = LORAS
    server = Server("--model", Z_IMAGE, "--lora-dir", lora_dir)
    prompt = "a red circle"

    def cli(name, *loras):
        out = tmp_path / name
        args = [kiln_binary(), "generate", "--model", Z_IMAGE, "--prompt", prompt, "--seed", "3", "--width", "32",
                "--height", "32", "--steps", "2", "--max-sequence-length", "16", "--dtype", "f32",
                "--output", str(out)]
        for file, scale in loras:
            args += ["--lora", f"{lora_dir}/{file}.safetensors:{scale}"]
        subprocess.run(args, check=True, capture_output=True, timeout=120)
        return decode_png(out.read_bytes())[0]

    def served(loras):
        return decode_png(generate(client(server), "z-image-tiny", prompt, 3, loras=loras))[0]

    try:
        calls = {"plain": [], "diffusers": [{"name": "z_image_diffusers", "scale": 0.8}],
                 "both": [{"name": "z_image_kohya", "scale": 1.0}, {"name": "z_image_diffusers", "scale": -0.5}]}
        expected = {"plain": cli("plain.png"), "diffusers": cli("diffusers.png", ("z_image_diffusers", 0.8)),
                    "both": cli("both.png", ("z_image_kohya", 1.0), ("z_image_diffusers", -0.5))}
        assert np.abs(expected["plain"].astype(int) - expected["diffusers"].astype(int)).mean() > 1
        # One after the other, in an order where each job must drop the last one's adapters.
        for name in ("diffusers", "plain", "both", "diffusers"):
            np.testing.assert_array_equal(served(calls[name]), expected[name], err_msg=name)
        # At once: each job its own image.
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            futures = {name: pool.submit(served, loras) for name, loras in calls.items()}
            for name, future in futures.items():
                np.testing.assert_array_equal(future.result(), expected[name], err_msg=name + " (concurrent)")
        listed = client(server).models.list().model_dump()
        assert "z_image_diffusers" in listed["kiln"]["loras"]
        # Refused naming the field: an adapter the folder does not hold, and one made for another family.
        with pytest.raises(openai.BadRequestError, match="no adapter named 'missing'"):
            served([{"name": "missing"}])
        with pytest.raises(openai.BadRequestError, match="loras"):
            served([{"name": "chroma_diffusers"}])
        with pytest.raises(openai.BadRequestError, match="loras"):
            served([{"name": "../lora/z_image_kohya"}])
        # The server keeps serving, with no adapter left active.
        np.testing.assert_array_equal(served([]), expected["plain"])
    finally:
        assert server.stop() == 0, server.log()


def test_a_models_dir_serves_every_folder_loaded_when_asked_for(tmp_path):
    """--models-dir lists its model folders (unloaded, a folder Kiln cannot run skipped and said so); a job for one
    loads it; an operator loads and unloads by name."""
    import json
    import os
    import urllib.error
    import urllib.request

    from conftest import CHROMA, Z_IMAGE, Server

    models = tmp_path / "models"
    models.mkdir()
    os.symlink(Z_IMAGE, models / "z-image-tiny")
    os.symlink(CHROMA, models / "chroma-tiny")
    (models / "notes").mkdir()  # no model_index.json: skipped
    server = Server("--models-dir", str(models))

    def post(path):
        request = urllib.request.Request(server.url + path, method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)

    def loaded():
        return {m.id: m.model_dump()["kiln"]["loaded"] for m in client(server).models.list().data}

    try:
        assert loaded() == {"chroma-tiny": False, "z-image-tiny": False}
        written = kiln_generate(tmp_path, Z_IMAGE, "a red circle", 3, size=TINY["size"], steps=TINY["steps"],
                                guidance=0)
        served = generate(client(server), "z-image-tiny", "a red circle", 3, guidance=0)
        np.testing.assert_array_equal(decode_png(served)[0], decode_png(written)[0])
        assert loaded() == {"chroma-tiny": False, "z-image-tiny": True}
        assert post("/v1/models/chroma-tiny/load")["loaded"] is True
        assert loaded() == {"chroma-tiny": True, "z-image-tiny": True}
        assert post("/v1/models/z-image-tiny/unload") == {"id": "z-image-tiny", "loaded": False, "was_loaded": True}
        assert loaded() == {"chroma-tiny": True, "z-image-tiny": False}
        with pytest.raises(urllib.error.HTTPError) as missing:
            post("/v1/models/missing/load")
        assert missing.value.code == 404
    finally:
        assert server.stop() == 0, server.log()
    assert "skipped" in server.log() and "notes" in server.log()


def test_a1111_txt2img_is_served_as_front_ends_send_it(tmp_path):
    """AUTOMATIC1111's POST /sdapi/v1/txt2img, with a front-end's usual body: the image kiln generate makes with the
    same parameters; what Kiln does not do refused naming the A1111 field."""
    import json
    import urllib.error
    import urllib.request

    from conftest import SHAPES, Server

    server = Server("--model", SHAPES)
    prompt = "a big white circle on the right, on a black background"

    def post(body):
        request = urllib.request.Request(server.url.rstrip("/") + "/sdapi/v1/txt2img", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)

    try:
        body = {"prompt": prompt, "negative_prompt": "", "seed": 5, "steps": 4, "cfg_scale": 0, "width": 64,
                "height": 64, "batch_size": 1, "n_iter": 1, "sampler_name": "Euler", "restore_faces": False,
                "enable_hr": False, "denoising_strength": 0, "styles": [], "override_settings": {}}
        answer = post(body)
        assert len(answer["images"]) == 1 and answer["parameters"] == body
        assert json.loads(answer["info"])["seed"] == 5
        served = decode_png(base64.b64decode(answer["images"][0]))[0]
        written = kiln_generate(tmp_path, SHAPES, prompt, 5, size="64x64", steps=4, guidance=0,
                                max_sequence_length=None)
        np.testing.assert_array_equal(served, decode_png(written)[0])
        for field, value in (("enable_hr", True), ("sampler_name", "DPM++ 2M Karras"), ("cfg_scale", -1)):
            with pytest.raises(urllib.error.HTTPError) as refused:
                post(dict(body, **{field: value}))
            assert refused.value.code == 400
            assert json.load(refused.value)["error"]["param"] == field
    finally:
        assert server.stop() == 0, server.log()


def test_under_max_memory_models_share_the_budget_least_recently_used_out_first(tmp_path):
    """--max-memory holds as many models as fit (each counted by the weights it reads, as kiln info counts them);
    a job for one that does not fit unloads the least recently used first. f32 weights: chroma-tiny 1.0 MiB,
    flux-tiny-schnell 1.4 MiB, z-image-tiny 3.0 MiB, under 4.5 MiB."""
    from conftest import CHROMA, FLUX, Z_IMAGE, Server

    server = Server("--model", CHROMA, "--model", FLUX, "--model", Z_IMAGE, "--max-memory", "4.5MiB")

    def loaded():
        return sorted(m.id for m in client(server).models.list().data if m.model_dump()["kiln"]["loaded"])

    def job(model):
        generate(client(server), model, "a red circle", 1, guidance=0)

    try:
        assert loaded() == []
        job("chroma-tiny")
        job("flux-tiny-schnell")
        assert loaded() == ["chroma-tiny", "flux-tiny-schnell"]  # 2.4 MiB: both fit
        job("z-image-tiny")  # 3.0 more: the least recently used (chroma) goes
        assert loaded() == ["flux-tiny-schnell", "z-image-tiny"]
        job("flux-tiny-schnell")  # loaded: nothing moves
        assert loaded() == ["flux-tiny-schnell", "z-image-tiny"]
        job("chroma-tiny")  # now z-image is the least recently used
        assert loaded() == ["chroma-tiny", "flux-tiny-schnell"]
        # And the image is the one kiln generate makes with the same budget.
        served = generate(client(server), "z-image-tiny", "a red circle", 4, guidance=0)
        written = kiln_generate(tmp_path, Z_IMAGE, "a red circle", 4, size=TINY["size"], steps=TINY["steps"], guidance=0)
        np.testing.assert_array_equal(decode_png(served)[0], decode_png(written)[0])
    finally:
        assert server.stop() == 0, server.log()
