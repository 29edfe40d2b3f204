"""The web page of kiln serve in a real browser (headless Chromium driven by Selenium): it loads, a prompt is
typed, Generate is clicked, the progress bar moves step by step, and the image that appears in the gallery has
the pixels `kiln generate` writes for the same parameters. A click on it puts its parameters back in the form;
Cancel stops a long job; the page fits a phone's width. An uploaded image is edited (image-to-image, or
inpainting with a mask painted on it with the mouse): the page sends what `kiln generate --init-image [--mask]`
reads and shows its pixels beside the input. With KILN_SCREENSHOT=path the first test also saves a screenshot
(docs/images/serve-page.png in the README); with KILN_EDIT_SCREENSHOT=path the inpainting test saves one of the
edit view (docs/images/serve-edit.png)."""

import base64
import os
import shutil

import numpy as np
import pytest

from conftest import LORAS, SHAPES, Z_IMAGE, Server, decode_png, kiln_binary, kiln_generate

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    # CI installs both (scripts/setup.sh); a machine without them skips, saying why.
    pytest.skip("the browser test needs Debian's chromium and chromium-driver (apt-get install chromium "
                "chromium-driver; scripts/setup.sh installs them)", allow_module_level=True)

from PIL import Image  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

PROMPT = "a big yellow triangle at the top, on a blue background"


@pytest.fixture(scope="module")
def server():
    s = Server("--model", SHAPES)
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1100,1000", "--force-device-scale-factor=1"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


def fill(driver, field, value):
    element = driver.find_element(By.ID, field)
    element.clear()
    element.send_keys(str(value))


def open_page(driver, server):
    driver.get(server.url + "/")
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.getElementById('model').options.length") == 1)


# Records every value the progress bar takes (the steps are quicker than a poll from the test).
WATCH_PROGRESS = """
window.progressSeen = [];
const bar = document.getElementById('progress');
// Several events may arrive in one task (a stream that connects after the job has finished gets its events
// replayed at once), and then one callback sees all their changes, the last "done" (1 of 1) among them. Each
// record holds the old value of the attribute it changed, so walking them back from the bar's final state
// gives every (value, max) the bar went through, in order.
new MutationObserver(records => {
  let value = bar.getAttribute('value'), max = bar.getAttribute('max');
  const states = [[Number(value), Number(max)]];
  for (let i = records.length - 1; i >= 0; --i) {
    const r = records[i];
    if (r.attributeName === 'value') value = r.oldValue; else max = r.oldValue;
    if (value !== null && max !== null) states.push([Number(value), Number(max)]);
  }
  window.progressSeen.push(...states.reverse());
}).observe(bar, {attributes: true, attributeOldValue: true, attributeFilter: ['value', 'max']});
"""

# The RGB pixels of the newest gallery image (or of the image arguments[0] selects), read through a canvas.
READ_PIXELS = """
const img = document.querySelector(arguments[0] || '#gallery .card img');
const canvas = document.createElement('canvas');
canvas.width = img.naturalWidth;
canvas.height = img.naturalHeight;
const ctx = canvas.getContext('2d');
ctx.drawImage(img, 0, 0);
const rgba = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
const rgb = [];
for (let i = 0; i < rgba.length; i += 4) rgb.push(rgba[i], rgba[i + 1], rgba[i + 2]);
return [canvas.width, canvas.height, rgb];
"""


def test_generate_shows_progress_and_the_image(server, browser, tmp_path):
    open_page(browser, server)
    assert browser.title == "Kiln"
    assert "kiln-shapes-64 (FluxPipeline)" in browser.find_element(By.ID, "model").text
    # FLUX.1 takes a negative prompt with its true CFG scale (the call below leaves both empty: off): rows the
    # page made from the model's fields (GET /v1/models), as it makes every row but the prompt, size and seed.
    assert browser.find_element(By.ID, "row-negative_prompt").is_displayed()
    assert browser.find_element(By.ID, "row-true_cfg_scale").is_displayed()
    assert not browser.find_element(By.ID, "api-key-row").is_displayed()  # the server asks for no key
    fill(browser, "prompt", PROMPT)
    fill(browser, "width", 64)
    fill(browser, "height", 64)
    fill(browser, "field-steps", 8)
    fill(browser, "field-guidance", 0)
    fill(browser, "field-max_sequence_length", 40)  # what kiln-shapes-64 was trained with
    browser.find_element(By.ID, "random-seed").click()
    fill(browser, "seed", 0)
    browser.execute_script(WATCH_PROGRESS)
    browser.find_element(By.ID, "generate").click()
    WebDriverWait(browser, 120).until(
        lambda d: d.execute_script("const i = document.querySelector('#gallery .card img');"
                                   "return i !== null && i.complete && i.naturalWidth > 0"))

    # The bar went through the steps: 1 of 8, 2 of 8, ... then full.
    seen = browser.execute_script("return window.progressSeen")
    steps = sorted({value for value, maximum in seen if maximum == 8 and value >= 1})
    assert steps[:8] == [1, 2, 3, 4, 5, 6, 7, 8], seen
    assert browser.find_element(By.ID, "status").text.startswith("done in")

    width, height, rgb = browser.execute_script(READ_PIXELS)
    shown = np.array(rgb, dtype=np.uint8).reshape(height, width, 3)
    reference, _ = decode_png(kiln_generate(tmp_path, SHAPES, PROMPT, 0, size="64x64", steps=8, guidance=0,
                                           max_sequence_length=40))
    np.testing.assert_array_equal(shown, reference)
    caption = browser.find_element(By.CSS_SELECTOR, "#gallery .card figcaption").text
    assert PROMPT in caption and "64x64" in caption and "seed 0" in caption

    if os.environ.get("KILN_SCREENSHOT"):
        browser.save_screenshot(os.environ["KILN_SCREENSHOT"])

    # A click on the card puts its parameters back.
    fill(browser, "prompt", "something else")
    fill(browser, "field-steps", 3)
    browser.find_element(By.CSS_SELECTOR, "#gallery .card").click()
    value = lambda field: browser.find_element(By.ID, field).get_attribute("value")  # noqa: E731
    assert (value("prompt"), value("field-steps"), value("seed"), value("width"), value("field-guidance"),
            value("field-max_sequence_length")) == (PROMPT, "8", "0", "64", "0", "40")
    assert not browser.find_element(By.ID, "random-seed").is_selected()


def test_true_cfg_from_the_page(server, browser, tmp_path):
    """FLUX.1's negative prompt and true CFG scale travel from the form: the image is kiln generate's with
    --negative-prompt and --true-cfg-scale, the caption names the scale, and a click puts both back."""
    open_page(browser, server)
    fill(browser, "prompt", PROMPT)
    fill(browser, "field-negative_prompt", "a red circle")
    fill(browser, "field-true_cfg_scale", 3.5)
    fill(browser, "width", 64)
    fill(browser, "height", 64)
    fill(browser, "field-steps", 2)
    fill(browser, "field-max_sequence_length", 40)
    browser.find_element(By.ID, "random-seed").click()
    fill(browser, "seed", 3)
    browser.find_element(By.ID, "generate").click()
    WebDriverWait(browser, 120).until(
        lambda d: d.execute_script("const i = document.querySelector('#gallery .card img');"
                                   "return i !== null && i.complete && i.naturalWidth > 0"))
    width, height, rgb = browser.execute_script(READ_PIXELS)
    shown = np.array(rgb, dtype=np.uint8).reshape(height, width, 3)
    reference, text = decode_png(kiln_generate(tmp_path, SHAPES, PROMPT, 3, size="64x64", steps=2,
                                               negative_prompt="a red circle", true_cfg_scale=3.5,
                                               max_sequence_length=40))
    assert text["true_cfg_scale"].startswith("3.5")
    np.testing.assert_array_equal(shown, reference)
    assert "True CFG scale 3.5" in browser.find_element(By.CSS_SELECTOR, "#gallery .card figcaption").text
    fill(browser, "field-negative_prompt", "x")
    fill(browser, "field-true_cfg_scale", 1)
    browser.find_element(By.CSS_SELECTOR, "#gallery .card").click()
    value = lambda field: browser.find_element(By.ID, field).get_attribute("value")  # noqa: E731
    assert (value("field-negative_prompt"), value("field-true_cfg_scale")) == ("a red circle", "3.5")


def test_cancel_stops_the_job(server, browser):
    open_page(browser, server)
    fill(browser, "prompt", PROMPT)
    fill(browser, "width", 64)
    fill(browser, "height", 64)
    fill(browser, "field-steps", 1000)
    browser.find_element(By.ID, "generate").click()
    WebDriverWait(browser, 60).until(lambda d: d.find_element(By.ID, "status").text.startswith("step "))
    browser.find_element(By.ID, "cancel").click()
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "status").text == "cancelled")
    assert browser.find_element(By.ID, "generate").is_enabled()
    assert browser.find_elements(By.CSS_SELECTOR, "#gallery .card") == []
    server.wait_for(lambda: server.metric("kiln_jobs_running") == 0, "the job to stop")


def test_the_page_fits_a_phone(server, browser):
    browser.set_window_size(390, 844)
    open_page(browser, server)
    overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0
    generate = browser.find_element(By.ID, "generate").rect
    assert generate["x"] >= 0 and generate["x"] + generate["width"] <= 390


def test_a_ticked_lora_runs_at_its_scale(browser, tmp_path):
    """With --lora-dir the page offers the server's adapters for a model whose family takes them; a ticked one at
    a scale gives kiln generate --lora's image, and the card says so."""
    import subprocess

    lora_server = Server("--model", Z_IMAGE, "--lora-dir", LORAS)
    try:
        open_page(browser, lora_server)
        assert browser.find_element(By.ID, "loras").is_displayed()
        fill(browser, "prompt", "a red circle")
        fill(browser, "width", 32)
        fill(browser, "height", 32)
        fill(browser, "field-steps", 2)
        fill(browser, "field-guidance", 0)
        fill(browser, "field-max_sequence_length", 16)
        browser.find_element(By.ID, "lora-z_image_kohya").click()
        fill(browser, "lora-scale-z_image_kohya", 0.8)
        browser.find_element(By.ID, "random-seed").click()
        fill(browser, "seed", 3)
        browser.find_element(By.ID, "generate").click()
        WebDriverWait(browser, 120).until(
            lambda d: d.execute_script("const i = document.querySelector('#gallery .card img');"
                                       "return i !== null && i.complete && i.naturalWidth > 0"))
        width, height, rgb = browser.execute_script(READ_PIXELS)
        shown = np.array(rgb, dtype=np.uint8).reshape(height, width, 3)
        out = tmp_path / "lora.png"
        subprocess.run([kiln_binary(), "generate", "--model", Z_IMAGE, "--prompt", "a red circle", "--seed", "3",
                        "--width", "32", "--height", "32", "--steps", "2", "--guidance", "0",
                        "--max-sequence-length", "16", "--dtype", "f32",
                        "--lora", f"{LORAS}/z_image_kohya.safetensors:0.8", "--output", str(out)],
                       check=True, capture_output=True, timeout=120)
        np.testing.assert_array_equal(shown, decode_png(out.read_bytes())[0])
        caption = browser.find_element(By.CSS_SELECTOR, "#gallery .card figcaption").text
        assert "LoRA z_image_kohya 0.8" in caption
    finally:
        assert lora_server.stop() == 0, lora_server.log()


# Records the JSON body of each POST /v1/generate the page sends (the page's fetch, wrapped from outside).
RECORD_REQUESTS = """
window.sentRequests = [];
const fetch = window.fetch;
window.fetch = function (url, options) {
  if (String(url).endsWith('/v1/generate') && options && options.method === 'POST')
    window.sentRequests.push(JSON.parse(options.body));
  return fetch.apply(this, arguments);
};
"""


def input_image(path):
    """A 64x64 picture in kiln-shapes-64's style (a yellow square on blue), written as a PNG; its pixels."""
    pixels = np.zeros((64, 64, 3), dtype=np.uint8)
    pixels[:] = (30, 60, 200)
    pixels[:, :, 0] += np.arange(64, dtype=np.uint8)[None, :]  # a gradient: every column differs
    pixels[36:56, 8:28] = (240, 220, 20)
    Image.fromarray(pixels).save(path)
    return pixels


def upload(browser, server, path):
    """Opens the page and chooses the file in the edit area; returns once the image is on its canvas."""
    open_page(browser, server)
    assert browser.find_element(By.ID, "edit").is_displayed()  # kiln-shapes-64 has FluxImg2ImgPipeline
    assert browser.find_elements(By.ID, "row-strength") == []  # text-to-image: no strength
    browser.find_element(By.ID, "edit-file").send_keys(str(path))
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "edit-view").is_displayed())


def fill_edit(browser, seed, strength, steps):
    fill(browser, "prompt", PROMPT)
    fill(browser, "field-steps", steps)
    fill(browser, "field-guidance", 0)
    fill(browser, "field-max_sequence_length", 40)
    fill(browser, "field-strength", strength)
    browser.find_element(By.ID, "random-seed").click()
    fill(browser, "seed", seed)


def generate_edit(browser):
    """Clicks Generate, waits for the result beside the input; the request the page sent."""
    browser.execute_script(RECORD_REQUESTS)
    browser.find_element(By.ID, "generate").click()
    WebDriverWait(browser, 120).until(
        lambda d: d.execute_script("const i = document.getElementById('edit-result');"
                                   "return !i.hidden && i.complete && i.naturalWidth > 0"))
    sent = browser.execute_script("return window.sentRequests")
    assert len(sent) == 1
    return sent[0]


def shown_pixels(browser, selector):
    width, height, rgb = browser.execute_script(READ_PIXELS, selector)
    return np.array(rgb, dtype=np.uint8).reshape(height, width, 3)


def sent_png(data_url):
    """The PNG bytes of a data URL the page sent."""
    prefix = "data:image/png;base64,"
    assert data_url.startswith(prefix)
    return base64.b64decode(data_url[len(prefix):])


def test_inpaint_a_painted_mask(server, browser, tmp_path):
    """An uploaded image and a stroke painted on it: the page sends the image at its size and a mask white under
    the stroke, black elsewhere; the result beside the input (and in the gallery) is `kiln generate --init-image
    --mask --strength`'s image."""
    source = tmp_path / "in.png"
    pixels = input_image(source)
    upload(browser, server, source)
    value = lambda field: browser.find_element(By.ID, field).get_attribute("value")  # noqa: E731
    assert (value("width"), value("height")) == ("64", "64")  # the image's size
    assert browser.find_element(By.ID, "row-strength").is_displayed()  # FluxImg2ImgPipeline's field
    assert browser.find_elements(By.ID, "row-padding_mask_crop") == []  # FluxInpaintPipeline's, not yet

    # A stroke across the upper part: from 15% to 85% of the width, a quarter of the way down (y = 16 of 64).
    browser.execute_script("document.getElementById('brush-size').value = 8")
    canvas = browser.find_element(By.ID, "edit-mask")
    w, h = canvas.rect["width"], canvas.rect["height"]
    ActionChains(browser).move_to_element_with_offset(canvas, int(-0.35 * w), int(-0.25 * h)).click_and_hold() \
        .move_by_offset(int(0.35 * w), 0).move_by_offset(int(0.35 * w), 0).release().perform()
    # A mask makes the job an inpainting one: that class's fields join the form.
    assert browser.find_element(By.ID, "row-padding_mask_crop").is_displayed()

    fill_edit(browser, seed=5, strength=0.7, steps=4)
    sent = generate_edit(browser)
    assert sent["size"] == "64x64" and sent["strength"] == 0.7 and "padding_mask_crop" not in sent
    image, _ = decode_png(sent_png(sent["image"]))
    np.testing.assert_array_equal(image[:, :, :3], pixels)  # the file's pixels, at its size
    assert (image.shape[2] == 3 or (image[:, :, 3] == 255).all())
    mask_png = sent_png(sent["mask_image"])
    mask, _ = decode_png(mask_png)
    mask = mask[:, :, 0]
    assert mask.shape == (64, 64)
    assert set(np.unique(mask)) <= {0, 255}
    assert (mask[14:19, 14:50] == 255).all(), mask  # under the stroke
    assert (mask[28:, :] == 0).all() and (mask[:8, :] == 0).all() and (mask[:, :5] == 0).all()  # far from it
    (tmp_path / "mask.png").write_bytes(mask_png)

    reference, _ = decode_png(kiln_generate(tmp_path, SHAPES, PROMPT, 5, size="64x64", steps=4, guidance=0,
                                               max_sequence_length=40, init_image=source,
                                               mask=tmp_path / "mask.png", strength=0.7))
    np.testing.assert_array_equal(shown_pixels(browser, "#edit-result"), reference)
    np.testing.assert_array_equal(shown_pixels(browser, "#gallery .card img"), reference)
    assert "Strength 0.7" in browser.find_element(By.CSS_SELECTOR, "#gallery .card figcaption").text

    # Input left, result right.
    left, right = canvas.rect, browser.find_element(By.ID, "edit-result").rect
    assert right["x"] >= left["x"] + left["width"] and abs(right["y"] - left["y"]) < 2
    if os.environ.get("KILN_EDIT_SCREENSHOT"):
        browser.set_window_size(760, 1000)
        browser.execute_script("document.getElementById('edit').scrollIntoView()")
        browser.find_element(By.ID, "edit").screenshot(os.environ["KILN_EDIT_SCREENSHOT"])

    # Clear: no mask, image-to-image again; Remove: text-to-image.
    browser.find_element(By.ID, "mask-clear").click()
    assert browser.find_elements(By.ID, "row-padding_mask_crop") == []
    browser.find_element(By.ID, "edit-remove").click()
    assert not browser.find_element(By.ID, "edit-view").is_displayed()
    assert browser.find_elements(By.ID, "row-strength") == []


def test_image_to_image_without_a_mask(server, browser, tmp_path):
    """An image and no stroke: no mask is sent, and the result is `kiln generate --init-image --strength`'s; on a
    phone's width the result comes below the input."""
    browser.set_window_size(390, 844)
    source = tmp_path / "in.png"
    input_image(source)
    upload(browser, server, source)
    fill_edit(browser, seed=2, strength=0.6, steps=2)
    sent = generate_edit(browser)
    assert "mask_image" not in sent and sent["size"] == "64x64" and sent["strength"] == 0.6
    reference, _ = decode_png(kiln_generate(tmp_path, SHAPES, PROMPT, 2, size="64x64", steps=2, guidance=0,
                                            max_sequence_length=40, init_image=source, strength=0.6))
    np.testing.assert_array_equal(shown_pixels(browser, "#edit-result"), reference)
    left = browser.find_element(By.ID, "edit-image").rect
    below = browser.find_element(By.ID, "edit-result").rect
    assert below["y"] >= left["y"] + left["height"]
    assert browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth") <= 0
