#!/usr/bin/env python3
"""The screenshot of kiln serve's web page in the README (docs/images/serve-page.png): starts `kiln serve` with
models/kiln-shapes-64 on a free loopback port, makes a few pictures through the page in headless Chromium
(typing each prompt and clicking Generate, as a person would), and saves the page.

  python3 tools/serve_screenshot.py [--kiln build/kiln] [--out docs/images/serve-page.png]

Needs Debian's chromium and chromium-driver, and selenium (tests/serve/requirements.txt).
"""

import argparse
import os
import re
import signal
import subprocess
import threading

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PROMPTS = [
    "a small red square in the center, on an orange background",
    "a big blue square on the right, on a yellow background",
    "a big white circle on the right, on a black background",
    "a big green circle at the bottom, on a purple background",
    "a big yellow triangle at the top, on a blue background",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "images", "serve-page.png"))
    args = ap.parse_args()

    server = subprocess.Popen([args.kiln, "serve", "--model", os.path.join(ROOT, "models", "kiln-shapes-64"),
                               "--port", "0", "--dtype", "f32"], stderr=subprocess.PIPE, text=True)
    found = {}
    ready = threading.Event()

    def read():
        for line in server.stderr:
            m = re.search(r"on (http://[^/]+)/.*pid (\d+)", line)
            if m:
                found["url"], found["pid"] = m.group(1), int(m.group(2))
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(120)
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,900",
                 "--force-device-scale-factor=1"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService("/usr/bin/chromedriver"))
    try:
        driver.get(found["url"] + "/")
        WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "model").text)
        for field, value in (("width", 64), ("height", 64), ("steps", 4), ("guidance", 0),
                             ("max-sequence-length", 40)):
            driver.find_element(By.ID, field).send_keys(str(value))
        driver.find_element(By.ID, "random-seed").click()
        driver.find_element(By.ID, "seed").send_keys("0")
        for i, prompt in enumerate(PROMPTS):
            driver.find_element(By.ID, "prompt").clear()
            driver.find_element(By.ID, "prompt").send_keys(prompt)
            driver.find_element(By.ID, "generate").click()
            WebDriverWait(driver, 120).until(
                lambda d: len(d.find_elements(By.CSS_SELECTOR, "#gallery .card img")) == i + 1 and
                d.execute_script("return [...document.querySelectorAll('#gallery img')].every(i => i.complete)"))
        driver.save_screenshot(args.out)
        print(f"wrote {args.out}")
    finally:
        driver.quit()
        os.kill(found["pid"], signal.SIGTERM)
        server.wait(60)


if __name__ == "__main__":
    main()
