"""The gateway's web page (velocity/gateway/page.html) in real headless Chromium (Debian's
`chromium`, driven by Playwright at that path): Speak plays audio as it arrives, shows the time
to first audio and offers the download; docs/clients.md's screenshot comes from here (VELOCITY_SCREENSHOT=1)."""
from __future__ import annotations

import os
import re
import shutil

import pytest

from triton_server import ROOT

pytestmark = pytest.mark.server
CHROMIUM = "/usr/bin/chromium"
# as root on a machine without a network: no sandbox, no GPU, no background connections
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required"]
# three sentences: seconds of audio, which reach the page in several reads however fast the server
TEXT = "The page speaks as the audio streams in. It plays each piece as it comes. Then it offers the download."
# docs/clients.md's picture of the page, taken anew by `VELOCITY_SCREENSHOT=1 make test` (a plain
# run leaves the checkout as it was: the picture's timings differ at every run)
SCREENSHOT = ROOT / "docs" / "web-page.png"


@pytest.fixture(scope="module")
def page(tts_server):
    from playwright.sync_api import sync_playwright

    assert shutil.which(CHROMIUM), "Debian's chromium is missing: scripts/setup.sh --test-tools installs it"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        pg = browser.new_page(viewport={"width": 1000, "height": 620})
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(tts_server.gateway_url + "/")
        pg.wait_for_function("document.querySelectorAll('#voice option').length > 0", timeout=30_000)
        yield pg
        assert not errors, errors
        browser.close()


def speak(page, fmt: str, seed: int) -> dict:
    page.fill("#text", TEXT)
    page.select_option("#format", fmt)
    page.fill("#seed", str(seed))
    page.click("#speak")
    page.wait_for_function("['done', 'error'].includes(window.speech.state)", timeout=120_000)
    got = page.evaluate("window.speech")
    assert got["state"] == "done", got
    return got


def same_request(tts_server, fmt: str, seed: int) -> bytes:
    import openai
    client = openai.OpenAI(base_url=tts_server.gateway_url + "/v1", api_key="unused", max_retries=0)
    return client.audio.speech.create(model="chattts", voice="amber", input=TEXT, response_format=fmt,
                                      speed=1, extra_body={"seed": seed}).read()


def test_the_voice_picker_lists_the_servers_voices(page, tts_server):
    import json
    import urllib.request
    listing = json.loads(urllib.request.urlopen(tts_server.gateway_url + "/v1/audio/voices", timeout=10).read())
    assert page.eval_on_selector_all("#voice option", "os => os.map(o => o.value)") == listing["voices"]
    assert page.input_value("#voice") == listing["default"]


def test_speak_plays_pcm_as_it_arrives_and_offers_the_download(page, tts_server, tmp_path):
    got = speak(page, "pcm", seed=5)
    # the bytes the page received are the API's for the same request (seeded: the same audio)
    assert got["bytes"] == len(same_request(tts_server, "pcm", 5)) > 0
    assert got["chunks"] > 1 and got["scheduled"] == pytest.approx(got["bytes"] / 2 / 24000)
    # Web Audio's clock moves through the scheduled audio: it is being played
    page.wait_for_function("window.playedSeconds() > 0.2", timeout=30_000)
    assert re.fullmatch(r"\d+ ms", page.text_content("#ttfa")) and got["ttfaMs"] > 0
    link = page.locator("#download")
    assert link.is_visible() and link.get_attribute("download") == "speech.pcm"
    size = page.evaluate("async () => (await (await fetch(document.getElementById('download').href)).blob()).size")
    assert size == got["bytes"]
    shot = SCREENSHOT if os.environ.get("VELOCITY_SCREENSHOT") == "1" else tmp_path / SCREENSHOT.name
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 0


def test_mp3_plays_through_media_source_while_streaming(page, tts_server):
    assert page.evaluate("MediaSource.isTypeSupported('audio/mpeg')")
    got = speak(page, "mp3", seed=6)
    assert got["bytes"] == len(same_request(tts_server, "mp3", 6)) > 0
    page.wait_for_function("window.playedSeconds() > 0.2", timeout=30_000)    # the <audio> element plays
    assert re.fullmatch(r"\d+ ms", page.text_content("#ttfa"))


def test_an_error_is_shown_not_swallowed(page):
    page.fill("#text", "x" * 2001)
    page.click("#speak")
    page.wait_for_function("['done', 'error'].includes(window.speech.state)", timeout=60_000)
    assert page.evaluate("window.speech.state") == "error"
    assert "TEXT has 2001 characters; the limit is 2000" in page.text_content("#status")
    assert page.is_enabled("#speak")
