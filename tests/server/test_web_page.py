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


def test_a_page_cannot_make_triton_speak_or_change_its_settings(page, tts_server):
    """A page (here the gateway's, another origin than Triton's HTTP port) sends what any page may:
    a simple request (text/plain, no header of its own: no CORS preflight) to tts_offline's infer and
    to /v2/logging, and a request with the Triton key's header, which needs a preflight. None runs:
    the first two lack the header (403), and Triton refuses the preflight. Triton's own counts say so."""
    from client.triton import model_metric
    from triton_server import admin_key, simple_request

    def runs() -> float:
        return model_metric(tts_server.metrics(), "nv_inference_request_success", "tts_offline") + \
            model_metric(tts_server.metrics(), "nv_inference_request_failure", "tts_offline")

    before = runs()
    body = '{"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["From a page."]}]}'
    got = page.evaluate("""async ([base, body]) => {
        const simple = {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}};
        const out = {};
        for (const [name, path, b] of [["infer", "/v2/models/tts_offline/infer", body],
                                       ["logging", "/v2/logging", '{"log_verbose_level": 1}']]) {
            try { out[name] = (await fetch(base + path, {...simple, body: b})).type; }
            catch (e) { out[name] = "refused: " + e; }
        }
        try {
            const r = await fetch(base + "/v2/models/tts_offline/infer",
                                  {method: "POST", headers: {"velocity-key": "local"}, body});
            out.keyed = "status " + r.status;
        } catch (e) { out.keyed = "refused: " + e; }
        return out;
    }""", [f"http://127.0.0.1:{tts_server.http_port}", body])
    assert got["infer"] == got["logging"] == "opaque", got        # sent, its answer unreadable to the page
    assert got["keyed"].startswith("refused: TypeError"), got        # the preflight failed: never sent
    assert runs() == before, "a web page ran an inference on Triton's HTTP port"
    import json
    status, body = simple_request(f"http://{tts_server.http_url}/v2/logging",
                                  headers={"velocity-admin-key": admin_key(tts_server)})
    assert status == 200 and json.loads(body)["log_verbose_level"] == 0
