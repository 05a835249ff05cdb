"""The README's commands and snippets, as written, against a real server (tts_server: the tiny
demo checkpoint). Only the address changes: localhost:8000/8001 become the test server's ports."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from triton_server import ROOT
from velocity.serving.wire.input_table import BY_NAME, INPUTS

pytestmark = pytest.mark.server
README = (ROOT / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}


def python_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) == 1, "the README's one Python snippet"
    return blocks[0]


def curl_commands() -> list[tuple[str, dict, dict]]:
    """(path, JSON body, headers) of each `curl ... -d '<body>' localhost:8000/<path>` in the README
    and docs/ (its headers: each -H 'name: value')."""
    found = re.findall(r"curl ((?:[^'\n]|'[^']*'|\\\n)*?)localhost:8000(/\S+)", README + "".join(DOCS.values()))
    return [(path, json.loads(re.search(r"-d '([^']*)'", args)[1]),
             dict(h.split(": ", 1) for h in re.findall(r"""-H ["']([^"']+)["']""", args))) for args, path in found]


def example_values(weights: Path) -> dict:
    """A value for each input (SPEAKER_SAMPLE: the voices file's sample that conftest writes)."""
    from velocity.tts.speaker import encode_speaker, random_speaker
    sample = json.loads((weights / "voices.json").read_text())["clone"]["sample"]
    return {"TEXT": "Hello world.", "PROMPT": "[speed_3]", "SPEAKER": encode_speaker(random_speaker(1, 64)),
            "SPEAKER_SEED": 5, "TEMPERATURE": 0.5, "TOP_P": 0.9, "TOP_K": 10, "REPETITION_PENALTY": 1.1,
            "MAX_NEW_TOKENS": 16, "SEED": 7, "DECODER": "codes", "VOICE": "basil", "SPEAKER_SAMPLE": sample,
            "SAMPLE_TEXT": "the sample text", "REFINE_TEXT": True, "REFINE_PROMPT": "[oral_2]",
            "REFINE_TEMPERATURE": 0.5, "REFINE_TOP_P": 0.9, "REFINE_TOP_K": 10, "REFINE_REPETITION_PENALTY": 1.1,
            "REFINE_MAX_NEW_TOKENS": 8, "LEXICON": '{"Hello": "hi"}', "VOICE_CARRY_OVER": True,
            "CLIENT": "a client", "SSML": True}


def run_snippet(code: str, server) -> np.ndarray:
    code = code.replace("localhost:8001", server.grpc_url)
    code += "\nimport sys; np.save(sys.stdout.buffer, audio)\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=180)   # a hang fails
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    import io
    return np.load(io.BytesIO(p.stdout))


def test_the_python_snippet(tts_server):
    code = python_snippet()
    audio = run_snippet(code, tts_server)
    assert audio.dtype == np.float32 and len(audio) > 0 and len(audio) % 512 == 256   # one sentence: 512 T - 256
    assert np.array_equal(run_snippet(code, tts_server), audio)          # SEED 7: the same audio again
    line = next(x for x in code.splitlines() if x.startswith("inputs = ["))
    values = example_values(Path(tts_server.env["VELOCITY_WEIGHTS"]))
    variants = {}
    for i in INPUTS:                     # each input of docs/api.md, with the one it needs
        if i.name == "TEXT":
            continue
        text = "<speak>Hello world.</speak>" if i.name == "SSML" else "Hello world."
        one = f'inputs = [inp("TEXT", {text!r}, "BYTES"), inp({i.name!r}, {values[i.name]!r}, {i.dtype!r})'
        if i.requires:
            partner = BY_NAME[i.requires[0]]
            one += f', inp({partner.name!r}, {values[partner.name]!r}, {partner.dtype!r})'
        for short in ("MAX_NEW_TOKENS", "REFINE_MAX_NEW_TOKENS"):   # a few frames (and refine tokens) do
            if short != i.name and (short == "MAX_NEW_TOKENS" or "REFINE" in one):
                one += f', inp({short!r}, {values[short]!r}, "INT32")'
        variants[i.name] = code.replace(line, one + "]").replace("localhost:8001", tts_server.grpc_url)
    # one process runs every variant, each in a fresh namespace (a process each was slow), and
    # ends at once when they are done: its teardown with the variants' gRPC channels once hung
    # past the timeout after every variant had its audio (a clean-clone CI run). The
    # snippet as a user runs it, one stream and a normal exit, is run_snippet's, which a hang fails.
    driver = ("import json, os, sys\nout = {}\nfor name, src in json.load(sys.stdin).items():\n"
              "    ns = {}\n    exec(src, ns)\n    out[name] = len(ns['audio'])\nprint(json.dumps(out), flush=True)\n"
              "os._exit(0)")
    p = subprocess.run([sys.executable, "-c", driver], input=json.dumps(variants), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    lengths = json.loads(p.stdout.splitlines()[-1])
    assert set(lengths) == set(variants)
    for name, n in lengths.items():
        assert n > 0 and n % 512 == 256, name


def test_the_curl_commands(tts_server):
    from triton_server import admin_key

    cmds = {path: (body, headers) for path, body, headers in curl_commands()}
    assert set(cmds) == {"/v2/models/tts/generate_stream", "/v2/models/tts_offline/infer", "/v2/logging"}, cmds

    def post(path: str, headers: dict | None = None, body: dict | None = None) -> bytes:
        """The docs' command for `path`, with its headers (or these instead)."""
        req = urllib.request.Request(f"http://{tts_server.http_url}{path}", data=json.dumps(body or cmds[path][0]).encode(),
                                     headers=cmds[path][1] if headers is None else headers)
        with urllib.request.urlopen(req, timeout=180) as r:
            return r.read()

    for path in cmds:                            # each needs the header the docs give it
        with pytest.raises(urllib.error.HTTPError, match="403"):
            post(path, {})
    assert cmds["/v2/logging"][1] == {"velocity-admin-key": "$(cat /tmp/velocity-serve.XXXXXX/admin_key)"}
    key = {"velocity-admin-key": admin_key(tts_server)}
    assert json.loads(post("/v2/logging", key))["log_verbose_level"] == 1
    post("/v2/logging", key, {"log_verbose_level": 0})

    events = [json.loads(x[6:]) for x in post("/v2/models/tts/generate_stream").splitlines() if x.startswith(b"data: ")]
    streamed = np.concatenate([np.asarray(e["WAVEFORM"], np.float32).reshape(-1) for e in events])
    assert [e["CHUNK_INDEX"] for e in events] == list(range(len(events)))
    whole = json.loads(post("/v2/models/tts_offline/infer"))
    out = whole["outputs"][0]
    assert whole["model_name"] == "tts_offline" and out["name"] == "WAVEFORM" and out["datatype"] == "FP32"
    assert out["shape"] == [1, len(streamed)]
    np.testing.assert_allclose(np.asarray(out["data"], np.float32), streamed, rtol=0, atol=1e-6)   # JSON floats
    # "about 5x the size of the float32 audio"
    size = sum(len(json.dumps(e["WAVEFORM"])) for e in events) / (4 * len(streamed))
    assert 3 < size < 7, size


def test_the_configuration_table_is_the_settings():
    """Every VELOCITY_* variable in docs/configuration.md's table, with Settings' default, and no other."""
    from dataclasses import fields

    from velocity.serving.settings import Settings

    rows = dict(re.findall(r"^\| `VELOCITY_([A-Z_]+)` \| ([^|]+) \|", DOCS["configuration.md"], re.M))
    want = {f.name.upper(): str(f.default).lower() if isinstance(f.default, bool) else str(f.default)
            for f in fields(Settings)}
    got = {k: v.strip().strip("`").replace("(empty)", "") for k, v in rows.items()}
    assert got == want


def test_the_metrics_table_is_the_metrics():
    """Every velocity_* metric in docs/operations.md's table, with its kind and model, and no other."""
    from velocity.serving.metrics import LLM, VOCODER

    rows = re.findall(r"^\| `(velocity_[a-z_]+)` \| (counter|gauge|histogram) \| (llm|vocoder) \|", DOCS["operations.md"], re.M)
    want = [(name, kind.lower(), model) for model, specs in (("llm", LLM), ("vocoder", VOCODER))
            for name, _, kind, _ in specs.values()]
    assert sorted(rows) == sorted(want)


# What the README's status may name as missing, and how to tell the code has it: (a path under the
# repository, a pattern its text matches; a folder: any file in it). A status item that matches
# no entry fails too: add one saying where the feature would live.
FEATURES = {
    r"named voices": ("velocity/tts/voices.py", r"class Voices\b"),
    r"OpenAI": ("velocity/gateway/speech_api.py", r'"/v1/audio/speech"'),
    r"web page": ("velocity/gateway/page.html", r"<html"),
    r"Wyoming": ("velocity/gateway/wyoming_server.py", r"class SpeechHandler\b"),
    r"Kubernetes": ("deploy/kubernetes", r"kind: Deployment"),
    r"first sentence's voice|carry-over": ("velocity/tts/carry_over.py", r"class VoiceCarrier\b"),
    r"traditional Chinese": ("tests/unit/tts/test_conformance.py", r"def test_traditional_chinese"),
    r"Pipecat|LiveKit|agent frameworks": ("tests", r"^\s*(from|import) (pipecat|livekit)\b"),
}


def has(path: str, pattern: str) -> bool:
    p = ROOT / path
    files = [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p] if p.is_file() else []
    return any(re.search(pattern, f.read_text(errors="replace")) for f in files)


def test_the_status_names_as_missing_only_what_the_code_lacks():
    status = re.search(r"^> Status: (.*?)(?=\n\n)", README, re.S | re.M)[1].replace("\n> ", " ")
    if "Not yet:" not in status:
        return                                          # nothing named as missing
    missing = [m.strip() for m in re.split(r",|\band\b", status.split("Not yet:", 1)[1]) if m.strip(" .")]
    assert missing, status
    for item in missing:
        found = [k for k in FEATURES if re.search(k, item)]
        assert found, f"the status names {item!r} as missing: say in FEATURES where the code would have it"
        for k in found:
            assert not has(*FEATURES[k]), f"the README's status says {item!r} is missing, but {FEATURES[k][0]} has it"


def test_the_readme_fits_on_a_screen_and_every_link_resolves():
    """The README stays short (the rest is in docs/), and every relative link in it and in docs/
    points at a file that exists."""
    assert len(README.splitlines()) < 200, "README.md grew past 200 lines: move the detail to docs/"
    links = [(ROOT, t) for t in re.findall(r"\]\(([^)#:]+)\)", README)]
    links += [(ROOT / "docs", t) for text in DOCS.values() for t in re.findall(r"\]\(([^)#:]+)\)", text)]
    assert links
    missing = [str(base / t) for base, t in links if not (base / t).exists()]
    assert not missing, missing
