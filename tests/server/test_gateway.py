"""The OpenAI-compatible speech API (velocity.gateway) in front of a real server, with the
official `openai` client: every format decodes (PyAV) to the audio `tts` streams, streamed and
not; SSE events; errors in OpenAI's shape."""
from __future__ import annotations

import base64
import contextlib
import io
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest

from client.triton import stream_grpc
from triton_server import ROOT, assert_same_audio, assert_same_pcm, wait_for

pytestmark = pytest.mark.server
# decoded duration against the samples streamed: mp3 and aac add their encoder's priming and
# last-frame padding (LAME ~1105 samples + a frame; AAC 1024 + a frame), at most 0.15 s here
SLACK_S = {"mp3": 0.15, "aac": 0.15, "opus": 0.025, "flac": 0.0, "wav": 0.0, "pcm": 0.0}


@pytest.fixture(scope="module")
def gateway(tts_server):
    """The gateway serve.sh started beside the server (GATEWAY_PORT)."""
    # the whole log: log() is its last 20,000 characters, and serve.sh names the gateway first
    assert f"[serve] OpenAI  http://localhost:{tts_server.gateway_port}/v1/audio/speech" in tts_server.log_path.read_text()
    assert wait_for(lambda: gateway_healthy(tts_server.gateway_url), 60), tts_server.log()
    return tts_server.gateway_url


def gateway_healthy(url: str) -> bool:
    try:
        return urllib.request.urlopen(f"{url}/health", timeout=2).status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def openai_client(gateway):
    import openai
    return openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0)


def decoded_seconds(data: bytes, fmt: str) -> float:
    if fmt == "pcm":
        return len(data) / 2 / 24000
    import av
    c = av.open(io.BytesIO(data))
    n = sum(f.samples for f in c.decode(audio=0))
    return n / c.streams.audio[0].rate


def ffprobe_seconds(data: bytes, fmt: str, tmp_path) -> float:
    """The audio's length as Debian's ffprobe reads it: the sum of its packets' durations."""
    import shutil
    assert shutil.which("ffprobe"), "ffprobe missing: scripts/setup.sh installs Debian's ffmpeg"
    f = tmp_path / f"speech.{fmt}"
    f.write_bytes(data)
    raw = ["-f", "s16le", "-sample_rate", "24000", "-ch_layout", "mono"] if fmt == "pcm" else []
    out = subprocess.run(["ffprobe", "-v", "error", *raw, "-select_streams", "a:0", "-show_entries",
                          "packet=duration_time", "-of", "csv=p=0", str(f)], capture_output=True, text=True, check=True)
    return sum(float(line.split(",")[0]) for line in out.stdout.split())


# max_new_tokens: frames enough for the formats; the length is not what they test
REQ = {"input": "Hello from the gateway.", "seed": 3, "temperature": 0.5, "max_new_tokens": 60}


def served_seconds(tts_server, voice: str = "amber") -> float:
    values = {"TEXT": REQ["input"], "SEED": REQ["seed"], "TEMPERATURE": REQ["temperature"], "VOICE": voice,
              "MAX_NEW_TOKENS": REQ["max_new_tokens"], "PROMPT": "[speed_5]"}
    audio = np.concatenate([a for _, a in stream_grpc(tts_server.grpc_url, values, timeout=120)])
    return len(audio) / 24000


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_every_format_decodes_to_the_streamed_audio(openai_client, tts_server, fmt, tmp_path):
    """Decoded by PyAV and measured by ffprobe: both the length `tts` streamed."""
    want = served_seconds(tts_server)
    extra = {k: v for k, v in REQ.items() if k != "input"}
    data = openai_client.audio.speech.create(model="tts-1", voice="amber", response_format=fmt, input=REQ["input"],
                                             extra_body=extra).read()
    for got in (decoded_seconds(data, fmt), ffprobe_seconds(data, fmt, tmp_path)):
        assert want - 0.001 <= got <= want + SLACK_S[fmt] + 0.001, (fmt, got, want)
    if fmt == "wav":
        assert data[:4] == b"RIFF" and data[4:8] == b"\xff\xff\xff\xff"      # streamed: size unknown


def test_streamed_response_arrives_in_pieces_and_equals_the_whole(openai_client):
    kw = dict(model="chattts", voice="basil", input="One. Two. Three.", response_format="pcm",
              extra_body={"seed": 1, "max_new_tokens": 40})     # 3 sentences of 40 frames: several chunks
    whole = openai_client.audio.speech.create(**kw).read()
    with openai_client.audio.speech.with_streaming_response.create(**kw) as r:
        parts = [p for p in r.iter_bytes() if p]
    assert len(parts) > 1 and b"".join(parts) == whole


def test_concurrent_requests_each_get_their_own_audio(openai_client):
    """Four streams at once through one gateway: each is the audio it gets alone (the same
    frames; see triton_server.assert_same_pcm for the rounding)."""
    from concurrent.futures import ThreadPoolExecutor

    def speak(seed: int) -> bytes:
        return openai_client.audio.speech.create(model="tts-1", voice="amber", input=f"Stream number {seed}.",
                                                 response_format="pcm", extra_body={"seed": seed, "max_new_tokens": 60}).read()

    alone = [speak(s) for s in range(4)]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(speak, range(4)))
    for got, want in zip(together, alone):
        assert_same_pcm(got, want)


def test_sse_events(gateway):
    body = json.dumps({"model": "tts-1", "voice": "amber", "input": "Events.", "response_format": "pcm",
                       "stream_format": "sse", "seed": 2}).encode()
    req = urllib.request.Request(gateway + "/v1/audio/speech", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done" and all(e["type"] == "speech.audio.delta" for e in events[:-1])
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(pcm) > 0 and len(pcm) % 2 == 0


def sse_events(gateway: str, **body) -> list[dict]:
    body = {"model": "tts-1", "voice": "amber", "response_format": "pcm", "stream_format": "sse"} | body
    req = urllib.request.Request(gateway + "/v1/audio/speech", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: ")]


def test_sse_marks_say_which_text_each_stretch_of_audio_speaks(gateway, tts_server):
    """"marks": true adds a speech.sentence event per sentence, once its audio is all out: its
    text (the server's sentence, normalised) and its start and end samples, which tile the
    audio; the audio is the same as without marks, and without marks there are no such events."""
    from velocity.tts.frontend import TextFrontend

    text = "The first one. And the 2nd one, longer. The last."
    kw = dict(input=text, seed=4, max_new_tokens=30)
    events = sse_events(gateway, marks=True, **kw)
    plain = sse_events(gateway, **kw)
    assert {e["type"] for e in plain} == {"speech.audio.delta", "speech.audio.done"}
    pcm = lambda evs: b"".join(base64.b64decode(e["audio"]) for e in evs if e["type"] == "speech.audio.delta")  # noqa: E731
    samples = len(pcm(events)) // 2
    assert_same_pcm(pcm(events), pcm(plain))
    marks = [e for e in events if e["type"] == "speech.sentence"]
    sentences, _ = TextFrontend(tts_server.env["VELOCITY_WEIGHTS"]).encode(text, speaker=True)
    assert [m["text"] for m in marks] == [s.text for s in sentences] and len(marks) == 3
    assert [m["index"] for m in marks] == [0, 1, 2] and all(m["sample_rate"] == 24000 for m in marks)
    assert marks[0]["start"] == 0 and marks[-1]["end"] == samples
    assert all(a["end"] == b["start"] and a["start"] < a["end"] for a, b in zip(marks, marks[1:]))
    # each mark comes after its sentence's audio: the deltas before it hold at least `end` samples
    for m in marks:
        before = events[:events.index(m)]
        assert len(pcm(before)) // 2 >= m["end"]


@pytest.mark.parametrize("name,event", [("marks", "speech.sentence"), ("words", "speech.words")])
def test_marks_and_words_need_the_sse_stream(openai_client, name, event):
    import openai
    with pytest.raises(openai.BadRequestError, match=f"{name} come as {event} events"):
        openai_client.audio.speech.create(model="tts-1", voice="amber", input="Hi.", response_format="pcm",
                                          extra_body={name: True}).read()


WORDS_TEXT = "The first one. And the 2nd one, longer. The last."


def test_sse_words_come_before_the_audio_they_start_in(gateway):
    """"words": true adds a speech.words event before each audio delta that words start in: the
    text's words, in order, each starting within that delta's samples (or at the audio's end),
    none past the audio; the audio is the same as without them."""
    from velocity.tts.word_timing import client_words

    kw = dict(input=WORDS_TEXT, seed=4, max_new_tokens=30)
    events, plain = sse_events(gateway, words=True, **kw), sse_events(gateway, **kw)
    pcm = lambda evs: b"".join(base64.b64decode(e["audio"]) for e in evs if e["type"] == "speech.audio.delta")  # noqa: E731
    assert_same_pcm(pcm(events), pcm(plain))
    total = len(pcm(events)) // 2
    said, at = [], 0
    for k, e in enumerate(events):
        if e["type"] == "speech.audio.delta":
            at += len(base64.b64decode(e["audio"])) // 2
        elif e["type"] == "speech.words":
            assert e["sample_rate"] == 24000
            nxt = next(x for x in events[k:] if x["type"] == "speech.audio.delta")
            for w in e["words"]:
                assert at <= w["start"] <= at + len(base64.b64decode(nxt["audio"])) // 2 and w["end"] <= total, (w, at)
                said.append(w["word"])
    assert said == client_words(WORDS_TEXT)


def test_captioned_speech_is_the_audio_with_its_words(openai_client, gateway):
    """POST /v1/audio/captioned_speech: the same audio as /v1/audio/speech, whole, with each word's
    start and end in seconds (rising, inside the audio); a stream_format of sse is refused."""
    from velocity.tts.word_timing import client_words

    body = {"model": "tts-1", "voice": "amber", "input": WORDS_TEXT, "response_format": "wav", "seed": 4,
            "max_new_tokens": 30}
    req = urllib.request.Request(gateway + "/v1/audio/captioned_speech", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        got = json.loads(r.read())
    audio = base64.b64decode(got["audio"])
    want = openai_client.audio.speech.create(**{k: v for k, v in body.items() if k in ("model", "voice", "input")},
                                             response_format="wav", extra_body={"seed": 4, "max_new_tokens": 30}).read()
    assert got["response_format"] == "wav" and audio == want
    seconds = (len(audio) - 44) / 2 / 24000
    assert [w["word"] for w in got["words"]] == client_words(WORDS_TEXT)
    starts = [w["start"] for w in got["words"]]
    assert starts == sorted(starts) and all(0 <= w["start"] <= w["end"] <= seconds + 1e-3 for w in got["words"])
    req = urllib.request.Request(gateway + "/v1/audio/captioned_speech", data=json.dumps(body | {"stream_format": "sse"}).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=120)
    assert e.value.code == 400 and 'stream_format must be "audio"' in json.loads(e.value.read())["error"]["message"]


@pytest.mark.parametrize("kw,status,param,match", [
    (dict(voice="nobody"), 400, "voice", "voice 'nobody' is not a voice here; voices: amber, basil"),
    (dict(response_format="ogg"), 400, "response_format", "response_format must be one of mp3, opus"),
    (dict(speed=5.0), 400, "speed", r"speed must be a number in \[0.25, 4.0\]"),
    (dict(model="gpt-4"), 400, "model", "model must be a speech model"),
    (dict(extra_body={"timeout": 0}), 400, "timeout", r"timeout must be seconds in \(0, 3600\]"),
    (dict(instructions=3), 400, "instructions", "instructions must be a string"),
    (dict(input="x" * 2001), 400, "input", "TEXT has 2001 characters; the limit is 2000"),
    (dict(extra_body={"temperature": -1}), 400, "temperature", "temperature must be >= 0"),
    (dict(extra_body={"lexicon": 5}), 400, "lexicon", r"lexicon must be a JSON object \(or its text\), got 5"),
    (dict(extra_body={"lexicon": {"SQL": 1}}), 400, "lexicon", "LEXICON: the replacement of 'SQL' must be a string"),
])
def test_errors_have_openais_shape(openai_client, kw, status, param, match):
    import openai
    args = dict(model="tts-1", voice="amber", input="Hi.", response_format="wav") | kw
    with pytest.raises(openai.APIStatusError) as e:
        openai_client.audio.speech.create(**args).read()
    err = e.value.body if isinstance(e.value.body, dict) and "message" in e.value.body else e.value.body["error"]
    assert e.value.status_code == status and err["param"] == param and re.search(match, err["message"]), err


def test_models_voices_and_health(gateway, openai_client):
    assert {m.id for m in openai_client.models.list()} == {"tts-1", "tts-1-hd", "gpt-4o-mini-tts", "chattts"}
    voices = json.loads(urllib.request.urlopen(gateway + "/v1/audio/voices", timeout=10).read())
    assert voices["default"] == "amber" and {"amber", "basil", "clone"} <= set(voices["voices"])
    assert urllib.request.urlopen(gateway + "/health", timeout=10).status == 200


def test_the_api_page_shows_every_body_field_with_its_range_and_help(gateway):
    """FastAPI's /docs (Swagger UI) over /openapi.json, whose speech body is the gateway's body
    model: every field of the request table, with its help and its range (the server's limits)."""
    from velocity.serving.wire.input_table import INPUTS

    with urllib.request.urlopen(gateway + "/docs", timeout=10) as r:
        assert r.status == 200 and "/openapi.json" in r.read().decode()
    spec = json.loads(urllib.request.urlopen(gateway + "/openapi.json", timeout=10).read())
    body = spec["paths"]["/v1/audio/speech"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["required"]) == {"model", "input", "voice"}
    for i in INPUTS:
        if i.api_field:
            assert body["properties"][i.api_field]["description"] == i.describe(), i.name
    assert body["properties"]["max_new_tokens"]["anyOf"][0]["maximum"] == 200     # the server's VELOCITY_MAX_NEW_TOKENS
    assert body["properties"]["response_format"]["enum"] == ["mp3", "opus", "aac", "flac", "wav", "pcm"]


def test_the_readmes_gateway_examples(gateway, tmp_path):
    """The README's curl body and openai snippet, as written (the port and the file moved)."""
    import re
    readme = (ROOT / "README.md").read_text()
    body = re.search(r"curl -s localhost:8080/v1/audio/speech [^']*-d '(.*?)' > hello.mp3", readme, re.S)[1]
    req = urllib.request.Request(gateway + "/v1/audio/speech", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    assert decoded_seconds(urllib.request.urlopen(req, timeout=120).read(), "mp3") > 0.1
    part = readme.split("With the official `openai` package")[1].split("\n#")[0]
    code = "\n".join(line[4:] for line in part.splitlines() if line.startswith("    "))
    code = code.replace("http://localhost:8080", gateway).replace('"hello.wav"', repr(str(tmp_path / "hello.wav")))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=tmp_path)
    assert decoded_seconds((tmp_path / "hello.wav").read_bytes(), "wav") > 0.1


def disconnects(gateway: str) -> float:
    from client.triton import fetch_metrics, parse_metric
    return parse_metric(fetch_metrics(gateway + "/metrics"), "velocity_gateway_disconnects_total")


@pytest.mark.parametrize("stream_format,when", [("audio", "mid-stream"), ("sse", "mid-stream"),
                                                ("audio", "before the first chunk")])
def test_a_client_that_hangs_up_stops_the_servers_work(gateway, tts_server, stream_format, when):
    """The gateway cancels its Triton stream when the HTTP client goes, and the server's work on
    it stops within 2 s (Triton 2.51 does not pass that cancel through the ensemble: the vocoder
    sees it and tells the llm); the gateway counts the hang-up."""
    import http.client
    import socket
    import time

    from triton_server import LONG_TEXT, assert_work_stops
    assert wait_for(lambda: tts_server.metric("velocity_active_requests") == 0, 60)
    before = disconnects(gateway)
    host, port = gateway.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", "/v1/audio/speech", body=json.dumps({"model": "tts-1", "voice": "amber", "input": LONG_TEXT,
                                                              "response_format": "pcm", "seed": 1,
                                                              "stream_format": stream_format}),
                 headers={"Content-Type": "application/json"})
    if when == "mid-stream":
        r = conn.getresponse()
        assert r.status == 200 and r.read1(1024)             # audio flows
    conn.sock.shutdown(socket.SHUT_RDWR)                      # hang up
    left = time.monotonic()
    conn.close()
    assert_work_stops(tts_server, left)
    assert wait_for(lambda: disconnects(gateway) == before + 1, 5)
    again = urllib.request.urlopen(urllib.request.Request(
        gateway + "/v1/audio/speech", data=json.dumps({"model": "tts-1", "voice": "amber", "input": "Still here.",
                                                       "response_format": "pcm"}).encode(),
        headers={"Content-Type": "application/json"}), timeout=120).read()
    assert len(again) > 0


def test_a_timeout_ends_the_request_with_504(gateway, tts_server):
    """A deadline in the body (or X-Request-Timeout) becomes Triton's request timeout: past it
    the server stops the request, and before the first byte the client gets 504."""
    import time

    from triton_server import LONG_TEXT, assert_work_stops
    # a millisecond: less than the first audio takes on the fastest machine (prefill and 8 steps)
    for extra, headers in (({"timeout": 0.001}, {}), ({}, {"X-Request-Timeout": "0.001"})):
        body = {"model": "tts-1", "voice": "amber", "input": LONG_TEXT, "response_format": "pcm"} | extra
        req = urllib.request.Request(gateway + "/v1/audio/speech", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"} | headers)
        t0 = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=120)
        assert e.value.code == 504 and json.loads(e.value.read())["error"]["param"] == "timeout"
        assert_work_stops(tts_server, t0)


def test_openais_own_example_runs_unchanged(gateway, tmp_path):
    """OpenAI's text-to-speech example as their guide gives it (gpt-4o-mini-tts, voice coral,
    free-form instructions), pointed here by the client's OPENAI_BASE_URL alone."""
    example = """
from pathlib import Path
from openai import OpenAI

client = OpenAI()
speech_file_path = Path(__file__).parent / "speech.mp3"

with client.audio.speech.with_streaming_response.create(
    model="gpt-4o-mini-tts",
    voice="coral",
    input="Today is a wonderful day to build something people love!",
    instructions="Speak in a cheerful and positive tone.",
) as response:
    response.stream_to_file(speech_file_path)
"""
    (tmp_path / "example.py").write_text(example)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OPENAI_")}
    subprocess.run([sys.executable, "example.py"], cwd=tmp_path, check=True, timeout=120,
                   env=env | {"OPENAI_BASE_URL": gateway + "/v1", "OPENAI_API_KEY": "unused"})
    assert decoded_seconds((tmp_path / "speech.mp3").read_bytes(), "mp3") > 0.5


def test_openais_voice_names_are_our_voices(openai_client):
    """Every OpenAI voice name is taken; each is one of the built-in voices by default (alloy is
    amber), so the same seed gives the same audio."""
    from velocity.tts.voices import OPENAI_ALIASES

    def speak(voice: str, model: str = "tts-1") -> bytes:
        return openai_client.audio.speech.create(model=model, voice=voice, input="Which voice is this?",
                                                 response_format="pcm", extra_body={"seed": 5, "max_new_tokens": 12}).read()

    assert set(OPENAI_ALIASES) == {"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage",
                                   "shimmer", "verse"}
    assert_same_pcm(speak("alloy", "gpt-4o-mini-tts"), speak("amber"))
    assert_same_pcm(speak("ash", "gpt-4o-mini-tts-2025-03-20"), speak("basil"))
    for voice in OPENAI_ALIASES:
        assert len(speak(voice)) > 0


def test_a_lexicon_object_in_the_body_says_the_words_its_way(openai_client):
    def speak(text: str, **extra) -> bytes:
        return openai_client.audio.speech.create(model="tts-1", voice="amber", input=text, response_format="pcm",
                                                 extra_body={"seed": 5, "max_new_tokens": 16, **extra}).read()

    assert_same_pcm(speak("Our SQL.", lexicon={"sql": "sequel"}), speak("Our sequel."))


def test_a_chunked_body_over_the_limit_is_refused_while_it_is_read(gateway, tts_server):
    """A body without Content-Length (Transfer-Encoding: chunked) is refused with 413 once it
    passes the limit (4 MiB by default): the gateway does not hold the 40 MB a client sends. Its
    peak resident memory grows by less than twice the limit (it holds the body up to the limit
    while reading; holding all of it grew it by 91 MB)."""
    import socket
    from pathlib import Path

    pid = next(p for p in tts_server.processes()
               if b"velocity.gateway.app" in Path(f"/proc/{p}/cmdline").read_bytes())

    def peak_rss() -> int:
        return int(re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())[1]) << 10

    before = peak_rss()
    host, port = gateway.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        part = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
        with contextlib.suppress(OSError):       # the gateway may close before it all went
            for _ in range(40):
                sock.sendall(part)
            sock.sendall(b"0\r\n\r\n")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"VELOCITY_GATEWAY_MAX_BODY_BYTES" in reply
    assert peak_rss() - before < 2 * (4 << 20), (before, peak_rss())


def test_api_keys_body_limit_and_cors(tmp_path):
    """No server needed: the guard answers before Triton is asked."""
    from fastapi.testclient import TestClient

    from velocity.gateway.app import create_app
    from velocity.serving.settings import Settings

    (tmp_path / "keys").write_text("from-file\n\n")
    app = create_app("127.0.0.1:1", Settings(gateway_api_keys="k1, k2", gateway_api_keys_file=str(tmp_path / "keys"),
                                             gateway_max_body_bytes=100, gateway_cors_origins="https://a.example"))
    with TestClient(app) as c:           # the context runs the app's lifespan: its gRPC channel is closed
        check_guard(c)
    with TestClient(create_app("127.0.0.1:1", Settings())) as open_app:
        assert open_app.get("/v1/models").status_code == 200         # no keys: open
        assert "access-control-allow-origin" not in open_app.get(
            "/v1/models", headers={"Origin": "https://a.example"}).headers  # CORS off by default


def check_guard(c) -> None:
    r = c.get("/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    for key in ("k1", "k2", "from-file"):
        assert c.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    r = c.post("/v1/audio/speech", content=b"x" * 200, headers={"Authorization": "Bearer k1"})
    assert r.status_code == 413 and "the limit is 100" in r.json()["error"]["message"]
    pre = c.options("/v1/models", headers={"Origin": "https://a.example", "Access-Control-Request-Method": "GET"})
    assert pre.headers.get("access-control-allow-origin") == "https://a.example"
    assert c.get("/health").status_code == 503                      # no Triton at 127.0.0.1:1


def test_gateway_metrics_count_requests_and_time_to_first_byte(gateway, openai_client):
    import openai
    openai_client.audio.speech.create(model="tts-1", voice="amber", input="Count me.", response_format="flac").read()
    with pytest.raises(openai.BadRequestError):
        openai_client.audio.speech.create(model="tts-1", voice="nobody", input="Hi.", response_format="flac").read()
    text = urllib.request.urlopen(gateway + "/metrics", timeout=10).read().decode()
    assert 'velocity_gateway_requests_total{format="flac",status="200"}' in text
    assert 'velocity_gateway_requests_total{format="flac",status="400"}' in text
    assert 'velocity_gateway_time_to_first_byte_seconds_count{format="flac"}' in text


def test_instructions_pass_through_only_as_control_tokens():
    """No server: OpenAI's `instructions` become text refine's prompt (and the speed) when they
    hold only ChatTTS's control tokens, and are ignored otherwise."""
    from velocity.gateway.speech_request import triton_values
    from velocity.gateway.speech_schema import speech_model

    model = speech_model()

    def values(instructions: str) -> dict:
        body = {"model": "gpt-4o-mini-tts", "voice": "alloy", "input": "Hi.", "instructions": instructions}
        return triton_values(model, body, {"amber": "speaker", "alloy": "alias"})[0]

    plain = values("")
    assert plain == {"TEXT": "Hi.", "PROMPT": "[speed_5]", "VOICE": "alloy"}
    assert values("Speak in a cheerful and positive tone.") == plain
    assert values("[oral_2] and be cheerful") == plain                      # not only tokens: ignored
    assert values("[oral_2][laugh_0][break_6]") == plain | {"REFINE_TEXT": True,
                                                             "REFINE_PROMPT": "[oral_2][laugh_0][break_6]"}
    assert values(" [speed_3] ") == plain | {"PROMPT": "[speed_3]"}


def test_one_retry_policy_for_the_gateway_and_the_client():
    """No server: upstream.Retry decides for both the gateway's async streams and the client's
    sync ones. Only before the first chunk, only busy, draining or unreachable, only so often."""
    from velocity.gateway.upstream import Retry

    r = Retry(2, 0.5)
    assert r.again(0, False, "server busy: 64 requests in flight") and r.again(1, False, "shutting down")
    assert r.again(0, False, "connection refused", unreachable=True)
    stopping = ("in ensemble 'tts', [request id: <id_unknown>] Server is stopping, scheduler for model has "
                "stopped accepting new inference requests")       # Triton's own, once the drain is over
    assert r.again(0, False, stopping)
    assert r.again(0, False, "Request for unknown model: 'tts' has no available versions")   # unloaded by the stop
    assert not r.again(2, False, "server busy")                     # out of tries
    assert not r.again(0, True, "server busy")                      # the client already has audio
    assert not r.again(0, False, "TEXT is required")                # the request's own fault
    assert [r.wait(a) for a in range(3)] == [0.5, 1.0, 1.5]
    assert not Retry().again(0, False, "server busy")                # by default, never


def test_a_servers_error_names_the_body_field_of_the_input_it_names():
    """No server: text_frontend's INVALID_ARG messages become 400s whose `param` is the body field
    of the input the message names first, as a whole word (REFINE_TOP_P is refine_top_p, not top_p)."""
    from velocity.gateway.upstream import triton_error

    for message, param in [("TEXT has 2001 characters; the limit is 2000", "input"),
                           ("REFINE_TOP_P must be in (0, 1], got 2.0", "refine_top_p"),
                           ("SAMPLE_TEXT is the transcript of SPEAKER_SAMPLE: send it with one", "sample_text"),
                           ("give SPEAKER or SPEAKER_SEED, not both", "voice"),
                           ("REFINE_PROMPT must hold only control tokens", "instructions"),
                           ("REPETITION_PENALTY must be > 0, got 0.0", "repetition_penalty"),
                           ("the llm says no", None)]:
        e = triton_error(message)
        assert (e.status, e.param) == (400, param), message
    # Triton refusing a request once its stop began (after serve.sh's drain) is no fault of the request's
    e = triton_error("in ensemble 'tts', [request id: <id_unknown>] Server is stopping, scheduler for model has "
                     "stopped accepting new inference requests")
    assert (e.status, e.code) == (503, "server_busy") and "shutting down" in e.message, e.message
    e = triton_error("Request for unknown model: 'tts' has no available versions")   # unloaded by the stop
    assert (e.status, e.code) == (503, "server_busy") and "shutting down" in e.message, e.message


def test_a_check_goes_to_the_next_upstream_when_one_is_down(tts_server):
    """Gateway.check (a WebSocket's setup, an ElevenLabs connect) with the first upstream down: the
    next one checks it; a bad request is still the 400 naming its field; none up is a 503 (a
    server that restarts after a failure: retry) naming the address."""
    import asyncio

    from triton_server import free_port
    from velocity.gateway.upstream import ApiError, Gateway

    down = f"127.0.0.1:{free_port()}"

    async def check(urls: str, values: dict):
        gw = Gateway(urls)
        try:
            await gw.check(values)
        except ApiError as e:
            return e
        finally:
            await gw.close()

    assert asyncio.run(check(f"{down},{tts_server.grpc_url}", {"TEXT": "Hi.", "VOICE": "amber"})) is None
    bad = asyncio.run(check(f"{down},{tts_server.grpc_url}", {"TEXT": "Hi.", "TEMPERATURE": -1.0}))
    assert bad.status == 400 and bad.param == "temperature", bad
    none = asyncio.run(check(down, {"TEXT": "Hi."}))
    assert none.status == 503 and none.code == "server_unavailable" and down in none.message, none


def test_a_blend_of_voices_speaks_on_every_api(openai_client, tts_server):
    """voice "amber(2)+amber(1)" is amber, to the sample (the OpenAI API and Triton's VOICE alike);
    "amber(1)+basil(1)" is another voice; a cloned voice or an unknown name in a blend is a 400
    naming the voice field."""
    import openai

    def speak(voice: str) -> bytes:
        return openai_client.audio.speech.create(model="tts-1", voice=voice, input="Blend me.", response_format="pcm",
                                                 extra_body={"seed": 5, "max_new_tokens": 24}).read()

    amber = speak("amber")
    assert_same_pcm(speak("amber(2)+amber(1)"), amber)
    assert speak("amber(1)+basil(1)") != amber
    def triton(voice: str) -> np.ndarray:
        values = {"TEXT": "Blend me.", "VOICE": voice, "SEED": 5, "MAX_NEW_TOKENS": 24}
        return np.concatenate([a for _, a in stream_grpc(tts_server.grpc_url, values)])

    assert_same_audio(triton("alloy(2)+nova(1)"), triton("amber"))
    for voice, says in (("clone+amber", "'clone' is a voice cloned from a recording"),
                        ("amber+zed", "'zed' is not a voice here"), ("amber(0)", "the weight of 'amber'")):
        with pytest.raises(openai.BadRequestError, match=says) as e:
            speak(voice)
        assert e.value.body["param"] == "voice"
