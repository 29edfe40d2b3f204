"""OpenAI's POST /v1/images/edits through the official `openai` client, unchanged: the image is the one
`kiln generate --init-image [--mask] / --image` writes with the same parameters, on the class kiln generate
picks (a text-to-image folder's image-to-image or inpainting sibling, made from the loaded pipeline; Fill's own
class); OpenAI's mask convention (transparent = edited) beside Kiln's (white = repainted); images in JSON
bodies too (POST /v1/generate); bad uploads answered 400 naming the field, and the server keeps serving."""

import base64
import io
import json

import numpy as np
import openai
import pytest
from PIL import Image

from conftest import CHROMA, FLUX, SD3, MODELS, Server, decode_png, kiln_generate

FILL = str(MODELS / "flux-tiny-fill")
SIZE = "32x32"
STEPS = 4  # with strength 0.5 the edit starts at step 2 of 4: the image shows through


def png_bytes(array, mode=None):
    out = io.BytesIO()
    Image.fromarray(array, mode).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """The image to edit, a Kiln mask (white = repaint the right half) and OpenAI's form of the same mask (the
    image with its right half transparent), as files."""
    folder = tmp_path_factory.mktemp("pictures")
    rng = np.random.RandomState(0)
    image = (rng.rand(32, 32, 3) * 255).astype(np.uint8)
    kiln_mask = np.zeros((32, 32), np.uint8)
    kiln_mask[:, 16:] = 255
    openai_mask = np.dstack([image, 255 - kiln_mask])  # alpha 0 where it is edited
    paths = {"image": folder / "image.png", "mask": folder / "mask.png", "openai_mask": folder / "openai_mask.png"}
    paths["image"].write_bytes(png_bytes(image))
    paths["mask"].write_bytes(png_bytes(kiln_mask, "L"))
    paths["openai_mask"].write_bytes(png_bytes(openai_mask, "RGBA"))
    return paths


@pytest.fixture(scope="module")
def server():
    s = Server("--model", FLUX, "--model", SD3, "--model", CHROMA, "--model", FILL)
    yield s
    assert s.stop() == 0, s.log()


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="no key needed", max_retries=0)


def edit(server, model, prompt, seed, image, mask=None, **kiln_fields):
    """The PNG of one edit through the openai client (files as (name, bytes, type), as it sends them)."""
    files = {"image": image if isinstance(image, list) else ("image.png", image.read_bytes(), "image/png")}
    if mask is not None:
        files["mask"] = ("mask.png", mask.read_bytes(), "image/png")
    result = client(server).images.edit(
        model=model, prompt=prompt, n=1, size=SIZE, response_format="b64_json", **files,
        extra_body={"seed": seed, "steps": STEPS, "max_sequence_length": 16, **kiln_fields})
    assert len(result.data) == 1
    return base64.b64decode(result.data[0].b64_json)


def assert_same_png(served, written):
    served_pixels, served_text = decode_png(served)
    written_pixels, written_text = decode_png(written)
    np.testing.assert_array_equal(served_pixels, written_pixels)
    assert served_text == written_text
    return served_text


@pytest.mark.parametrize("model,mask,pipeline", [
    (FLUX, None, "FluxImg2ImgPipeline"),
    (FLUX, "mask", "FluxInpaintPipeline"),
    (FLUX, "openai_mask", "FluxInpaintPipeline"),
    (SD3, "mask", "StableDiffusion3InpaintPipeline"),
    (CHROMA, None, "ChromaImg2ImgPipeline"),
    (FILL, "openai_mask", "FluxFillPipeline"),
])
def test_an_edit_is_the_image_kiln_generate_makes(server, pictures, tmp_path, model, mask, pipeline):
    name = model.rstrip("/").split("/")[-1]
    strength = None if pipeline == "FluxFillPipeline" else 0.5
    fields = {} if strength is None else {"strength": strength}
    served = edit(server, name, "a red circle", 5, pictures["image"], pictures[mask] if mask else None, **fields)
    flags = {"init_image": pictures["image"], **fields}
    if mask:
        flags["mask"] = pictures["mask"]  # Kiln's convention: OpenAI's transparent pixels are its white ones
    written = kiln_generate(tmp_path, model, "a red circle", 5, size=SIZE, steps=STEPS, **flags)
    text = assert_same_png(served, written)
    assert text["pipeline"] == pipeline


def test_each_edit_depends_on_its_image_and_the_folder_still_makes_images_from_text(server, pictures, tmp_path):
    """Another image (or mask) gives another result; text-to-image still runs on the folder whose components the
    edits share. (What inpainting keeps is checked against diffusers in tests/pipelines/edit_pipelines_test.cpp:
    the tiny models' VAE does not reproduce its input, so the kept half is not the source's pixels here.)"""
    source = np.asarray(Image.open(pictures["image"]))
    inpainted = decode_png(edit(server, "flux-tiny-schnell", "a red circle", 5, pictures["image"],
                                pictures["mask"], strength=0.5))[0]
    flipped = tmp_path / "flipped.png"
    flipped.write_bytes(png_bytes(np.ascontiguousarray(source[::-1])))
    a = decode_png(edit(server, "flux-tiny-schnell", "a red circle", 5, pictures["image"], strength=0.5))[0]
    b = decode_png(edit(server, "flux-tiny-schnell", "a red circle", 5, flipped, strength=0.5))[0]
    assert np.abs(a.astype(int) - b.astype(int)).mean() > 5
    assert np.abs(a.astype(int) - inpainted.astype(int)).mean() > 1
    text = client(server).images.generate(model="flux-tiny-schnell", prompt="a red circle", size=SIZE,
                                          response_format="b64_json",
                                          extra_body={"seed": 5, "steps": STEPS, "max_sequence_length": 16})
    assert decode_png(base64.b64decode(text.data[0].b64_json))[1]["pipeline"] == "FluxPipeline"


def test_images_in_a_json_body_are_the_same_edit(server, pictures):
    """POST /v1/generate (Kiln's jobs) and /v1/images/edits with the image and mask in base64."""
    b64 = {k: base64.b64encode(pictures[k].read_bytes()).decode() for k in ("image", "mask")}
    body = {"model": "flux-tiny-schnell", "prompt": "a red circle", "size": SIZE, "seed": 5, "steps": STEPS,
            "max_sequence_length": 16, "strength": 0.5, "image": "data:image/png;base64," + b64["image"],
            "mask_image": b64["mask"]}
    status, answer = server.json("POST", "/v1/images/edits", body)
    assert status == 200, answer
    from_json = base64.b64decode(answer["data"][0]["b64_json"])
    from_form = edit(server, "flux-tiny-schnell", "a red circle", 5, pictures["image"], pictures["mask"],
                     strength=0.5)
    np.testing.assert_array_equal(decode_png(from_json)[0], decode_png(from_form)[0])
    status, job = server.json("POST", "/v1/generate", body)
    assert status == 202 or status == 200, job
    server.wait_for(lambda: server.json("GET", f"/v1/jobs/{job['id']}")[1]["status"] == "succeeded", "the job")
    _, _, png = server.request("GET", f"/v1/jobs/{job['id']}/images/0.png")
    np.testing.assert_array_equal(decode_png(png)[0], decode_png(from_form)[0])
    # The job's parameters leave the images out (the client sent them).
    params = server.json("GET", f"/v1/jobs/{job['id']}")[1]["params"]
    assert "image" not in params and params["strength"] == 0.5


def post_raw(server, body, content_type):
    """(status, answer) of a POST /v1/images/edits with this body and Content-Type, as it is."""
    import urllib.error
    import urllib.request
    request = urllib.request.Request(server.url + "/v1/images/edits", data=body, method="POST",
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def refused(server, field, match, *, files=None, body=None, raw=None, content_type=None):
    """A 400 naming `field`, whose message matches `match`."""
    if raw is not None:
        status, data = post_raw(server, raw, content_type)
        answer = json.loads(data)
    elif body is not None:
        status, answer = server.json("POST", "/v1/images/edits", body)
    else:
        with pytest.raises(openai.BadRequestError) as e:
            client(server).images.edit(model="flux-tiny-schnell", prompt="a red circle", size=SIZE, **files,
                                       extra_body={"steps": STEPS, "max_sequence_length": 16})
        status, answer = 400, e.value.body if "error" in (e.value.body or {}) else {"error": e.value.body}
    assert status == 400, answer
    assert answer["error"]["param"] == field, answer
    assert match in answer["error"]["message"], answer


def test_bad_uploads_are_refused_naming_the_field(server, pictures, tmp_path):
    image = ("image.png", pictures["image"].read_bytes(), "image/png")
    small_mask = ("mask.png", png_bytes(np.zeros((16, 16), np.uint8), "L"), "image/png")
    refused(server, "mask", "16x16, the image is 32x32", files={"image": image, "mask": small_mask})
    refused(server, "image", "expected a PNG image: not a PNG file",
            files={"image": ("image.png", b"GIF89a not a png", "image/png")})
    truncated = pictures["image"].read_bytes()[:60]
    refused(server, "image", "expected a PNG image", files={"image": ("image.png", truncated, "image/png")})
    huge = png_bytes(np.zeros((4100, 4100), np.uint8), "L")  # 16.8 million pixels, a few kilobytes
    refused(server, "image", "4100x4100 pixels is more than", files={"image": ("huge.png", huge, "image/png")})
    refused(server, "mask_image", "ChromaPipeline has no inpainting pipeline (FLUX.1, SD3, Z-Image, Stable Diffusion and Qwen-Image folders have)",
            body={"model": "chroma-tiny", "prompt": "x", "image": base64.b64encode(pictures["image"].read_bytes())
                  .decode(), "mask_image": base64.b64encode(pictures["mask"].read_bytes()).decode()})
    refused(server, "image", "required: the image to edit", body={"model": "flux-tiny-schnell", "prompt": "x"})
    refused(server, "image", "not base64", body={"model": "flux-tiny-schnell", "prompt": "x", "image": "@@@"})
    refused(server, "steps", "expected an integer",
            raw=b"--b\r\nContent-Disposition: form-data; name=\"image\"; filename=\"i.png\"\r\n"
                b"Content-Type: image/png\r\n\r\n" + pictures["image"].read_bytes() +
                b"\r\n--b\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nx\r\n"
                b"--b\r\nContent-Disposition: form-data; name=\"steps\"\r\n\r\nfour\r\n--b--\r\n",
            content_type="multipart/form-data; boundary=b")
    # A body that is not a multipart form at all, though it says so: answered, not crashed on.
    for body, content_type in ((b"--x\r\nnonsense", "multipart/form-data; boundary=b"),
                               (b"--b\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\nabc",
                                "multipart/form-data; boundary=b"),
                               (b"--b--\r\n", "multipart/form-data")):
        status, answer = post_raw(server, body, content_type)
        assert status == 400 and b"the multipart form could not be read" in answer, (body, status, answer)
    # The server keeps serving.
    assert decode_png(edit(server, "flux-tiny-schnell", "a red circle", 5, pictures["image"], strength=0.5))[0].shape \
        == (32, 32, 3)


def test_a1111_img2img_is_served_as_front_ends_send_it(server, pictures, tmp_path):
    """AUTOMATIC1111's POST /sdapi/v1/img2img with a front-end's usual body: the image kiln generate makes with
    --init-image/--mask/--strength (inpaint_full_res: --padding-mask-crop; inpainting_mask_invert: the mask
    turned round); what Kiln does not do refused naming the A1111 field."""
    b64 = {k: base64.b64encode(pictures[k].read_bytes()).decode() for k in ("image", "mask")}
    body = {"prompt": "a red circle", "negative_prompt": "", "seed": 5, "steps": STEPS, "cfg_scale": 0,
            "width": 32, "height": 32, "batch_size": 1, "n_iter": 1, "sampler_name": "Euler",
            "init_images": ["data:image/png;base64," + b64["image"]], "mask": b64["mask"],
            "denoising_strength": 0.5, "mask_blur": 4, "inpainting_fill": 1, "inpaint_full_res": False,
            "inpaint_full_res_padding": 32, "inpainting_mask_invert": 0, "resize_mode": 0,
            "override_settings": {"sd_model_checkpoint": "flux-tiny-schnell"}}

    def post(changes):
        status, answer = server.json("POST", "/sdapi/v1/img2img", dict(body, **changes))
        return status, answer

    def served(changes):
        status, answer = post(changes)
        assert status == 200, answer
        return decode_png(base64.b64decode(answer["images"][0]))[0]

    def written(name, **flags):
        return decode_png(kiln_generate(tmp_path, FLUX, "a red circle", 5, size=SIZE, steps=STEPS, guidance=0,
                                        max_sequence_length=None, init_image=pictures["image"], strength=0.5,
                                        name=name, **flags))[0]

    inverted = tmp_path / "inverted.png"
    inverted.write_bytes(png_bytes(255 - np.asarray(Image.open(pictures["mask"])), "L"))
    np.testing.assert_array_equal(served({}), written("inpaint.png", mask=pictures["mask"]))
    np.testing.assert_array_equal(served({"mask": None}), written("img2img.png"))
    np.testing.assert_array_equal(served({"inpaint_full_res": True, "inpaint_full_res_padding": 8}),
                                  written("crop.png", mask=pictures["mask"], padding_mask_crop=8))
    np.testing.assert_array_equal(served({"inpainting_mask_invert": 1}), written("inverted.png", mask=inverted))
    for field, value in (("resize_mode", 2), ("mask_blur", 12), ("init_images", []), ("denoising_strength", 2)):
        status, answer = post({field: value})
        assert status == 400 and answer["error"]["param"] == field, (field, answer)
    status, answer = post({"init_images": None})
    assert status == 400 and answer["error"]["param"] == "init_images", answer


def test_qwen_image_edit_takes_the_uploaded_image_as_the_image_to_edit(pictures, tmp_path):
    """An editing class of its own checkpoint (Qwen-Image-Edit): the upload is its `image`, read by Qwen2.5-VL and
    the VAE, and the edit is the one `kiln generate --image` makes, and depends on the image."""
    model = str(MODELS / "qwen-image-edit-tiny")
    server = Server("--model", model)
    try:
        fields = {"negative_prompt": " ", "true_cfg_scale": 3, "max_sequence_length": 512}
        served = edit(server, "qwen-image-edit-tiny", "make it snow", 5, pictures["image"], **fields)
        written = kiln_generate(tmp_path, model, "make it snow", 5, size=SIZE, steps=STEPS, image=pictures["image"],
                                **fields)
        assert assert_same_png(served, written)["pipeline"] == "QwenImageEditPipeline"
        other = np.array(Image.open(pictures["image"]))[::-1].copy()
        (tmp_path / "flipped.png").write_bytes(png_bytes(other))
        flipped = edit(server, "qwen-image-edit-tiny", "make it snow", 5, tmp_path / "flipped.png", **fields)
        assert not np.array_equal(decode_png(flipped)[0], decode_png(served)[0])
    finally:
        assert server.stop() == 0, server.log()
